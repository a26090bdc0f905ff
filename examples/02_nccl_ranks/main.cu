/* 02_nccl_ranks — the demo's HT round over a real NCCL team: one thread per visible GPU.
 *
 * Learning objectives
 *   - Set up a rank the epfuse way: epf_nccl_comm_init_rank (every thread, one ncclUniqueId, like
 *     ncclCommInitAll), epf_nccl_window_create (a zeroed symmetric window of plan.total_bytes),
 *     epf_nccl_devcomm_create (the device communicator), epf_nccl_team_query (the epf_team_t
 *     view: LSA peer pointers), then the setup handshake (epf_handshake_block in a tiny kernel:
 *     every rank must hold the same plan, else EPF_ERR_CONFIG_MISMATCH on every rank).
 *   - The same launchers as 01_virtual_ranks with route.count = 1: the kernels find the peers
 *     through the team, not through virtual-rank arithmetic.
 * Key concepts: symmetric window, LSA peer, team, devComm (NCCL's vocabulary); the handshake;
 *   epochs (start at zero on the zeroed window; the route update advances them).
 * When to use it: as the skeleton of a real engine's setup; on 1 GPU it is a smoke test of the
 *   NCCL path (a 1-rank team), on N GPUs of one host it exchanges over NVLink.
 * Performance notes: the multi-GPU numbers are NOT measured by the project yet; the table this
 *   prints per rank is for orientation only. NCCL_NVLS_ENABLE=0 is set before NCCL starts:
 *   epfuse uses only LSA load/store pointers, never NVLink SHARP multicast, so NCCL need not build
 *   multicast objects (memory, setup time), and on shared hosts multicast can put the GPUs out of
 *   service; leave it off.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epfuse/epfuse.cuh"
#include "epfuse/host_nccl.h"
#include "epfuse/ht/kernels.cuh"
#include "epfuse/core/nccl.cuh"
#include "ex_common.h"

typedef struct {
  int rank, nranks, T, H, K, E, layout, payload, iters, samples;
  uint64_t seed;
  ncclUniqueId id;
  /* results */
  int ok;
  int64_t verified, bad;
  double us_route, us_dispatch, us_combine;
  char msg[256];
} rank_args_t;

/* every rank's routing is derived from (seed, source rank), so each thread can size its receive
 * region exactly without a host exchange; x is generated only by its own rank */
static void make_topk(const rank_args_t* a, int src, int32_t* topk, float* w) {
  uint64_t s = a->seed * 1000003ull + (uint64_t)src * 7919ull;
  for (int64_t t = 0; t < a->T; ++t)
    for (int k = 0; k < a->K; ++k) {
      int e, dup;
      do {
        e = (int)(ex_rand(&s) % (uint64_t)a->E);
        dup = 0;
        for (int j = 0; j < k; ++j) dup |= topk[t * a->K + j] == e;
      } while (dup && a->K <= a->E);
      topk[t * a->K + k] = e;
      w[t * a->K + k] = (float)(ex_rand(&s) % 1000) / 997.0f;
    }
}

__global__ void handshake_kernel(epf_team_t team, epf_plan_t plan, epf_wait_t w, int* out_status) {
  const epf_status_t st = epf_handshake_block(team, &plan, 1u, w); /* epoch 1 on a fresh window */
  if (threadIdx.x == 0) *out_status = (int)st;
}

static int cmp_f(const void* a, const void* b) {
  const float x = *(const float*)a, y = *(const float*)b;
  return x < y ? -1 : x > y;
}

#define FAIL(...)                                    \
  do {                                               \
    snprintf(a->msg, sizeof(a->msg), __VA_ARGS__);   \
    return NULL;                                     \
  } while (0)

static void* rank_main(void* arg) {
  rank_args_t* a = (rank_args_t*)arg;
  const int R = a->nranks, T = a->T, H = a->H, K = a->K, E = a->E, EL = E / R, me = a->rank;
  EX_CK(cudaSetDevice(me));

  /* copies this rank receives (the rank-major expand view's rows), from every source's routing */
  int32_t* topk = (int32_t*)malloc((size_t)T * K * 4);
  float* w = (float*)malloc((size_t)T * K * 4);
  int64_t copies = 0;
  for (int s = 0; s < R; ++s) {
    make_topk(a, s, topk, w);
    for (int i = 0; i < T * K; ++i) copies += topk[i] / EL == me;
  }
  /* every rank must compute the same plan (the handshake checks): budget the largest rank */
  int64_t cap = 0;
  {
    /* the same sum for every destination, so every rank agrees on recv_capacity */
    int64_t* per = (int64_t*)calloc((size_t)R, 8);
    for (int s = 0; s < R; ++s) {
      make_topk(a, s, topk, w);
      for (int t = 0; t < T; ++t)
        for (int d = 0; d < R; ++d) {
          int n = 0, any = 0;
          for (int k = 0; k < K; ++k) n += topk[t * K + k] / EL == d;
          any = n > 0;
          per[d] += a->layout == EPF_LAYOUT_RANK_MAJOR ? any : n;
        }
    }
    for (int d = 0; d < R; ++d) cap = per[d] > cap ? per[d] : cap;
    free(per);
  }
  make_topk(a, me, topk, w); /* this rank's own routing */
  uint16_t* x = (uint16_t*)malloc((size_t)T * H * 2);
  {
    uint64_t s = a->seed * 31ull + (uint64_t)me * 104729ull + 17ull;
    for (int64_t i = 0; i < (int64_t)T * H; ++i)
      x[i] = ex_bf16_rne((float)((int64_t)(ex_rand(&s) % 20001) - 10000) / 1000.0f);
  }

  epf_config_t cfg = EPF_CONFIG_INIT;
  cfg.nranks = R;
  cfg.num_experts = E;
  cfg.top_k = K;
  cfg.hidden = H;
  cfg.max_tokens_per_rank = T;
  cfg.layout = a->layout;
  cfg.payload = a->payload;
  cfg.expert_alignment = 1;
  cfg.recv_capacity = cap + 64;
  epf_plan_t plan;
  EX_CS(epf_plan_compute(&cfg, &plan));

  // example-begin nccl_setup
  ncclComm_t comm;
  epf_nccl_window_t win;
  ncclDevComm_t dev;
  epf_team_t team;
  epf_status_t st;
  if ((st = epf_nccl_comm_init_rank(&comm, R, a->id, me, 60.0)) != EPF_OK) /* every rank, its own thread */
    FAIL("comm init: %s", epf_status_name(st));
  if ((st = epf_nccl_window_create(comm, plan.total_bytes, 60.0, &win)) != EPF_OK || /* zeroed */
      (st = epf_nccl_devcomm_create(comm, 1, 60.0, &dev)) != EPF_OK ||
      (st = epf_nccl_team_query(&dev, win.window, 0, &team)) != EPF_OK)
    FAIL("setup: %s (%s)", epf_status_name(st), epf_nccl_last_message(comm, ncclInternalError));
  // example-end nccl_setup

  epf_error_record_t *rec_h, *rec_d;
  EX_CK(cudaHostAlloc(&rec_h, sizeof(*rec_h), cudaHostAllocMapped));
  EX_CK(cudaHostGetDevicePointer(&rec_d, rec_h, 0));
  epf_error_clear(rec_h);
  int *d_hs, hs_status = -1;
  EX_CK(cudaMalloc(&d_hs, sizeof(int)));
  handshake_kernel<<<1, 128>>>(team, plan, epf_wait_make(plan.timeout_ns, rec_d, NULL, me), d_hs);
  EX_CK(cudaMemcpy(&hs_status, d_hs, sizeof(int), cudaMemcpyDeviceToHost));
  if (hs_status != EPF_OK) FAIL("handshake: %s", epf_status_name((epf_status_t)hs_status));

  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  rc.index_type = EPF_INDEX_INT32;
  uint64_t rbytes = 0;
  EX_CS(epf_route_size(&plan, &rc, &rbytes));
  void* route_buf;
  EX_CK(cudaMalloc(&route_buf, rbytes));
  epf_route_t route;
  EX_CS(epf_route_init(&plan, &rc, route_buf, rbytes, 1, 1u, 0, &route)); /* count 1: a real rank */

  const int64_t expert_rows = (a->layout == EPF_LAYOUT_RANK_MAJOR ? copies : plan.recv_capacity) + EL + 64;
  void *d_topk, *d_x, *d_out;
  float* d_w;
  uint16_t* d_eo;
  uint8_t *d_view = NULL, *d_view_scales = NULL;
  epf_ht_state_t* d_state;
  EX_CK(cudaMalloc(&d_topk, (size_t)T * K * 4));
  EX_CK(cudaMalloc(&d_w, (size_t)T * K * 4));
  EX_CK(cudaMalloc(&d_x, (size_t)T * H * 2));
  EX_CK(cudaMalloc(&d_out, (size_t)T * H * 2));
  EX_CK(cudaMalloc(&d_eo, (size_t)expert_rows * H * 2));
  if (a->layout == EPF_LAYOUT_RANK_MAJOR) {
    EX_CK(cudaMalloc(&d_view, (size_t)expert_rows * plan.row_bytes));
    if (plan.scale_bytes_per_row) EX_CK(cudaMalloc(&d_view_scales, (size_t)expert_rows * plan.scale_bytes_per_row));
  }
  EX_CK(cudaMalloc(&d_state, sizeof(epf_ht_state_t)));
  EX_CK(cudaMemset(d_state, 0, sizeof(epf_ht_state_t)));
  EX_CK(cudaMemcpy(d_topk, topk, (size_t)T * K * 4, cudaMemcpyHostToDevice));
  EX_CK(cudaMemcpy(d_w, w, (size_t)T * K * 4, cudaMemcpyHostToDevice));
  EX_CK(cudaMemcpy(d_x, x, (size_t)T * H * 2, cudaMemcpyHostToDevice));
  EX_CK(cudaMemset(d_out, 0xA7, (size_t)T * H * 2));

  epf_route_step_t rs = epf_route_step_make(d_topk, T, epf_wait_make(plan.timeout_ns, rec_d, NULL, me));
  epf_ht_step_t hs = EPF_HT_STEP_INIT;
  hs.x = d_x;
  hs.topk_weights = d_w;
  hs.out = d_out;
  hs.expert_out = d_eo;
  hs.em_view = d_view;
  hs.em_view_scales = d_view_scales;
  hs.state = d_state;
  hs.expert_rows = expert_rows;
  hs.wait = epf_wait_make(plan.timeout_ns, rec_d, NULL, me);

  EX_CS(epf_route_update(&route, team, &plan, &rs, 0));
  EX_CS(epf_ht_dispatch(&route, team, &plan, &hs, d_topk, EPF_HT_BOTH, 0));
  if (plan.layout == EPF_LAYOUT_RANK_MAJOR) EX_CS(epf_ht_expand(&route, team, &plan, &hs, 0));
  /* the expert stage reads this rank's own window slice (win.ptr), as in 01 with one rank */
  ex_experts_kernel<<<dim3(128, 1), 256>>>(route, plan, (const char*)win.ptr, me, d_view, d_view_scales, expert_rows, d_eo);
  EX_CK(cudaGetLastError());
  EX_CS(epf_ht_combine(&route, team, &plan, &hs, d_topk, 0));
  EX_CK(cudaDeviceSynchronize());

  epf_error_record_t rec;
  epf_error_read(rec_h, &rec);
  if (rec.status != 0 || rec.recv_overflow != 0)
    FAIL("error record: %s peer %d overflow %u", epf_status_name((epf_status_t)rec.status), rec.peer, rec.recv_overflow);
  {
    uint16_t* out = (uint16_t*)malloc((size_t)T * H * 2);
    float* scratch = (float*)malloc((size_t)3 * H * 4);
    uint16_t* want = (uint16_t*)malloc((size_t)H * 2);
    uint64_t s = a->seed + (uint64_t)me;
    EX_CK(cudaMemcpy(out, d_out, (size_t)T * H * 2, cudaMemcpyDeviceToHost));
    const int64_t nver = a->samples >= T || a->samples <= 0 ? T : a->samples;
    for (int64_t i = 0; i < nver; ++i) {
      const int64_t t = nver == T ? i : (int64_t)(ex_rand(&s) % (uint64_t)T);
      ex_ref_combine(&plan, x + t * H, topk + t * K, w + t * K, scratch, want);
      a->bad += memcmp(want, out + t * H, (size_t)H * 2) != 0;
    }
    a->verified = nver;
    free(out);
    free(scratch);
    free(want);
  }

  /* timing: route + dispatch + combine back to back (all ranks run the same count of rounds) */
  cudaEvent_t ev[4];
  for (int i = 0; i < 4; ++i) EX_CK(cudaEventCreate(&ev[i]));
  const int it = a->iters + 2;
  float* tt = (float*)malloc(sizeof(float) * 3 * it);
  for (int i = 0; i < it; ++i) {
    EX_CK(cudaEventRecord(ev[0]));
    EX_CS(epf_route_update(&route, team, &plan, &rs, 0));
    EX_CK(cudaEventRecord(ev[1]));
    EX_CS(epf_ht_dispatch(&route, team, &plan, &hs, d_topk, EPF_HT_BOTH, 0));
    if (plan.layout == EPF_LAYOUT_RANK_MAJOR) EX_CS(epf_ht_expand(&route, team, &plan, &hs, 0));
    EX_CK(cudaEventRecord(ev[2]));
    EX_CS(epf_ht_combine(&route, team, &plan, &hs, d_topk, 0));
    EX_CK(cudaEventRecord(ev[3]));
    EX_CK(cudaEventSynchronize(ev[3]));
    EX_CK(cudaEventElapsedTime(&tt[i], ev[0], ev[1]));
    EX_CK(cudaEventElapsedTime(&tt[it + i], ev[1], ev[2]));
    EX_CK(cudaEventElapsedTime(&tt[2 * it + i], ev[2], ev[3]));
  }
  for (int j = 0; j < 3; ++j) qsort(tt + j * it + 2, a->iters, 4, cmp_f);
  a->us_route = tt[2 + a->iters / 2] * 1e3;
  a->us_dispatch = tt[it + 2 + a->iters / 2] * 1e3;
  a->us_combine = tt[2 * it + 2 + a->iters / 2] * 1e3;
  epf_error_read(rec_h, &rec);
  a->ok = rec.status == 0 && a->bad == 0;

  EX_CK(cudaDeviceSynchronize());
  epf_nccl_devcomm_destroy(comm, &dev);
  epf_nccl_window_destroy(comm, &win, 60.0);
  epf_nccl_comm_destroy(comm, 60.0);
  return NULL;
}

int main(int argc, char** argv) {
  int ctest = 0, T = 4096, H = 7168, K = 8, E = 0, layout = EPF_LAYOUT_EXPERT_MAJOR, payload = EPF_PAYLOAD_BF16;
  int iters = 10, samples = 256, ngpus = 0;
  for (int i = 1; i < argc; ++i) {
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (!strcmp(argv[i], "--ctest")) ctest = 1;
    else if (!strcmp(argv[i], "--tokens")) T = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--hidden")) H = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--topk")) K = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--experts")) E = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--gpus")) ngpus = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--samples")) samples = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--layout")) layout = !strcmp(argv[++i], "rm") ? EPF_LAYOUT_RANK_MAJOR : EPF_LAYOUT_EXPERT_MAJOR;
    else if (!strcmp(argv[i], "--payload")) {
      ++i;
      payload = !strcmp(v, "mxfp8") ? EPF_PAYLOAD_MXFP8 : !strcmp(v, "fp8") ? EPF_PAYLOAD_FP8_128 : EPF_PAYLOAD_BF16;
    } else {
      printf("usage: %s [--gpus N (default: all visible)] [--tokens 4096] [--hidden 7168] [--topk 8]\n"
             "          [--experts 32*N] [--layout em|rm] [--payload bf16|mxfp8|fp8] [--iters 10]\n"
             "          [--samples 256 (0: all)] [--ctest]\n"
             "  One thread per GPU, one NCCL rank per GPU: setup, handshake, HT route/dispatch/experts/\n"
             "  combine, verified bit for bit per rank. --ctest: exit 77 without a GPU.\n", argv[0]);
      return strcmp(argv[i], "--help") ? 2 : 0;
    }
  }
  ex_gpu_or_exit(1, ctest);
  int visible = 0;
  EX_CK(cudaGetDeviceCount(&visible));
  if (ngpus <= 0 || ngpus > visible) ngpus = visible;
  if (ngpus > 8) ngpus = 8;
  if (E <= 0) E = 32 * ngpus;
  if (E % ngpus) {
    fprintf(stderr, "--experts %d is not a multiple of %d ranks\n", E, ngpus);
    return 2;
  }
  /* before any NCCL call: epfuse needs no NVLink SHARP multicast (see the header comment) */
  setenv("NCCL_NVLS_ENABLE", "0", 1);

  rank_args_t* args = (rank_args_t*)calloc((size_t)ngpus, sizeof(rank_args_t));
  pthread_t th[8];
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) {
    fprintf(stderr, "ncclGetUniqueId failed\n");
    return 1;
  }
  for (int r = 0; r < ngpus; ++r) {
    rank_args_t* a = &args[r];
    a->rank = r; a->nranks = ngpus; a->T = T; a->H = H; a->K = K; a->E = E;
    a->layout = layout; a->payload = payload; a->iters = iters < 1 ? 1 : iters; a->samples = samples;
    a->seed = 2026; a->id = id;
    pthread_create(&th[r], NULL, rank_main, a);
  }
  for (int r = 0; r < ngpus; ++r) pthread_join(th[r], NULL);
  printf("epfuse over NCCL: %d rank(s), one GPU each, T=%d H=%d top-%d of %d experts, %s, payload %s\n", ngpus, T, H,
         K, E, layout == EPF_LAYOUT_RANK_MAJOR ? "rank-major" : "expert-major",
         payload == EPF_PAYLOAD_BF16 ? "bf16" : payload == EPF_PAYLOAD_MXFP8 ? "mxfp8" : "fp8-128");
  printf("| rank | verified tokens | route us | dispatch us | combine us | result |\n| ---: | ---: | ---: | ---: | ---: | --- |\n");
  int all_ok = 1;
  for (int r = 0; r < ngpus; ++r) {
    const rank_args_t* a = &args[r];
    all_ok &= a->ok;
    printf("| %d | %lld/%lld | %.1f | %.1f | %.1f | %s |\n", r, (long long)(a->verified - a->bad), (long long)a->verified,
           a->us_route, a->us_dispatch, a->us_combine, a->ok ? "OK" : (a->msg[0] ? a->msg : "MISMATCH"));
  }
  printf("%s\n", all_ok ? "all ranks bit-exact vs CPU reference: OK" : "FAILED");
  free(args);
  return all_ok ? 0 : 1;
}
