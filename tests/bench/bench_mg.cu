/* bench_mg — HT and LL dispatch / combine over a real NCCL team, one thread per GPU, with NCCL's own
 * all-to-all of the same bytes as the baseline in the same run (issue #8; a program, not a test).
 *
 *   bench_mg [--ep 2,4,8] [--iters 20] [--reps 200] [--tokens 4096] [--ll-tokens 1,128]
 *            [--hidden 7168] [--topk 8] [--experts 256] [--blocks 0] [--no-baseline]
 *
 * EP size: every visible GPU (at most 8), or EPF_MG_GPUS=k; --ep runs several sizes in one go
 * (rank r on GPU r, sizes above the GPUs found are skipped). Fewer than 2 GPUs: "SKIP", exit 77;
 * EPF_MG_GPUS=1 allows a 1-rank smoke run on one GPU (no byte crosses a link there).
 *
 * Per EP size, on the standard shape (hidden 7168, top-8 of 256 experts; K distinct uniform experts
 * per token, expert-major layout), with the ready-made launchers (route/kernels.cuh,
 * ht/kernels.cuh, ll/kernels.cuh) and the team of tests/common/epf_mg.h (NCCL window + devComm):
 *   HT  T = 4096 per rank: route update, dispatch (send + receive), combine (pull); BF16, then an
 *       MXFP8 dispatch (quantized on the way) with its BF16 combine.
 *   LL  T = 1 and 128 per rank, BF16 both ways: dispatch, combine push (EPF_LL_Y_IN_PLACE) and
 *       combine pull (EPF_LL_Y_IN_PLACE_PULL); each operation is one captured CUDA graph (fused send +
 *       receive kernel), timed per replay.
 *   NCCL ncclAlltoAll and grouped ncclSend/ncclRecv (one pair per peer, self included) of the same
 *       bytes: each rank's mean received-logical dispatch bytes, split evenly over the R peers.
 * Experts are the identity in place (no expert kernel runs), so combine returns sum_k w_k x; the BF16
 * cases check that on sampled tokens of every rank (tolerance: a BF16 ulp or so), LL also the
 * number of rows received.
 *
 * Timing: every timed operation (each stage of every iteration) starts after an NCCL allreduce of
 * one int on all ranks (a device-side barrier in the stream), then CUDA events around the operation
 * alone. The time of an iteration is the SLOWEST rank's; a row prints the median over the timed
 * iterations (warm-up excluded), and the spread of the per-rank medians.
 *
 * Bytes (notes/ANCHORS.md), per rank = the mean over ranks of what one rank receives:
 *   received-logical  every row a rank receives, its own included, x row bytes (DeepEP normal)
 *   topk-logical      T x top-k x row bytes (DeepEP LL, NCCL EP, pplx)
 *   link              only the rows that cross to another GPU x row bytes; this is what the NVLink
 *                     limit bounds: H200 NVLink 4 = 18 x 25 GB/s = 450 GB/s per direction per GPU
 * Row bytes: dispatch payload + its scales (BF16 14336; MXFP8 7168 + 224), combine BF16 14336.
 * Combine moves the same rows back: its conventions use the dispatch's rows and the combine row.
 * Targets of issue #8, printed next to the rows (EP 8): HT dispatch and combine >= 380 GB/s
 * received-logical; LL 128 tokens BF16 dispatch <= 40 us, combine <= 45 us. Never asserted:
 * the exit status is 1 only for errors (error record, checks), 0 otherwise, 77 for too few GPUs.
 * NCCL_NVLS_ENABLE=0 is set (epf_mg_gpus): epfuse needs no NVLink multicast. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "epf_bench.h"
#include "epf_mg.h"
#include "epfuse/epfuse.cuh"
#include "epfuse/ht/kernels.cuh"
#include "epfuse/ll/kernels.cuh"
#include "epfuse/route/kernels.cuh"

#define MG_NVLINK_GBS 450.0        /* H200 NVLink 4, per direction per GPU */
#define MG_HT_TARGET_GBS 380.0     /* issue #8: HT dispatch / combine, received-logical, EP 8 */
#define MG_LL_DISPATCH_TARGET_US 40.0
#define MG_LL_COMBINE_TARGET_US 45.0
#define MG_TARGET_EP 8
#define MG_TARGET_LL_T 128
#define MG_HT_WARMUP 3
#define MG_LL_WARMUP 10
#define MG_BASE_WARMUP 3
#define MG_CHECK_TOKENS 64
#define MG_MAX_CASES 8
#define MG_MAX_STAGES 5
#define MG_MAX_LL_T 4

enum { MG_HT = 0, MG_LL = 1 };
enum { MG_BYTES_NONE = 0, MG_BYTES_DISPATCH, MG_BYTES_COMBINE, MG_BYTES_BASELINE };
enum { MG_TGT_NONE = 0, MG_TGT_HT, MG_TGT_LL_DISPATCH, MG_TGT_LL_COMBINE };

typedef struct mg_stage {
  const char* name;
  int bytes;   /* MG_BYTES_* */
  int target;  /* MG_TGT_* */
  int samples; /* timed samples per rank */
  float* t;    /* [R][samples] ms, each rank thread writes its own row */
} mg_stage_t;

typedef struct mg_case {
  char name[32];
  int kind, payload, T;
  epf_plan_t plan;
  int32_t* topk;                    /* [R][T][K], every rank's routing */
  float* w;                         /* [R][T][K] */
  int64_t recv_rows[EPF_MG_MAX];    /* rows each rank receives, its own included */
  int64_t link_rows[EPF_MG_MAX];    /* of them, rows from other ranks */
  uint64_t a2a_bytes;               /* baseline: bytes per (source, destination) pair */
  int nstages;
  mg_stage_t st[MG_MAX_STAGES];
  /* per-rank results */
  int checked[EPF_MG_MAX], bad[EPF_MG_MAX];
  int64_t got_rows[EPF_MG_MAX];     /* LL: sum of recv_counts of the last round, -1 when not read */
  epf_error_record_t rec[EPF_MG_MAX];
} mg_case_t;

typedef struct mg_run {
  int R, H, K, E, iters, reps, blocks, baseline;
  ncclUniqueId id;
  uint64_t window_bytes;
  int ncases;
  mg_case_t cases[MG_MAX_CASES];
  pthread_barrier_t bar;
} mg_run_t;

typedef struct mg_rank_arg {
  mg_run_t* run;
  int rank;
} mg_rank_arg_t;

/* ---- failure in a rank thread: say where, end the process (peers would wait on it forever) ---- */

static void mg_die(int rank, int line, const char* what, const char* why) {
  fprintf(stderr, "bench_mg: rank %d: %s:%d: %s -> %s\n", rank, __FILE__, line, what, why);
  fflush(stdout);
  fflush(stderr);
  _exit(1);
}

#define MG_CUDA(rank, call)                                               \
  do {                                                                    \
    cudaError_t e_ = (call);                                              \
    if (e_ != cudaSuccess) mg_die(rank, __LINE__, #call, cudaGetErrorString(e_)); \
  } while (0)

#define MG_OK(rank, call)                                                 \
  do {                                                                    \
    epf_status_t s_ = (call);                                             \
    if (s_ != EPF_OK) mg_die(rank, __LINE__, #call, epf_status_name(s_)); \
  } while (0)

/* an NCCL call on the (non-blocking) communicator of epf_mg.h, finished against the deadline */
#define MG_NCCL(m, call)                                                                          \
  do {                                                                                            \
    ncclResult_t r_ = (call);                                                                     \
    if (epf_nccl_wait((m)->comm, r_, EPF_MG_TIMEOUT_S) != EPF_OK)                                 \
      mg_die((m)->rank, __LINE__, #call, epf_nccl_last_message((m)->comm, r_ == ncclSuccess ? ncclInternalError : r_)); \
  } while (0)

/* ---- device helpers --------------------------------------------------------------------------- */

/* BF16 values of about +-[0.5, 2) */
__global__ void mg_fill_bf16(uint16_t* x, int64_t n, uint32_t salt) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 0x9e3779b1u ^ salt;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    x[i] = (uint16_t)((uint16_t)(0x3f80u | ((h >> 8) & 0x807fu)) - (uint16_t)((h & 1u) << 7));
  }
}

/* the setup handshake: every rank holds the same plan (epoch 1 on the freshly zeroed window) */
__global__ void mg_handshake_kernel(epf_team_t team, epf_plan_t plan, epf_wait_t w, int* out_status) {
  const epf_status_t st = epf_handshake_block(team, &plan, 1u, w);
  if (threadIdx.x == 0) *out_status = (int)st;
}

/* ---- host helpers ----------------------------------------------------------------------------- */

static float mg_bf16_to_f(uint16_t b) {
  const uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t mg_f_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* all ranks meet in the stream: an allreduce (max) of one int */
static void mg_sync(epf_mg_rank_t* m, int* d_flag, cudaStream_t s) {
  MG_NCCL(m, ncclAllReduce(d_flag, d_flag, 1, ncclInt32, ncclMax, m->comm, s));
}

static float mg_elapsed(int rank, cudaEvent_t a, cudaEvent_t b) {
  float ms = 0.f;
  MG_CUDA(rank, cudaEventElapsedTime(&ms, a, b));
  return ms;
}

static cudaEvent_t* mg_events(int rank, int n) {
  cudaEvent_t* ev = (cudaEvent_t*)malloc(sizeof(cudaEvent_t) * (size_t)n);
  if (ev == NULL) mg_die(rank, __LINE__, "malloc", "out of memory");
  for (int i = 0; i < n; ++i) MG_CUDA(rank, cudaEventCreate(&ev[i]));
  return ev;
}

static void mg_events_free(int rank, cudaEvent_t* ev, int n) {
  for (int i = 0; i < n; ++i) MG_CUDA(rank, cudaEventDestroy(ev[i]));
  free(ev);
}

/* Stop at the first error the kernels reported (a wait that timed out would make every later
 * iteration wait out its deadline too). */
static void mg_check_record(const epf_mg_rank_t* m, const mg_case_t* c, const char* when) {
  epf_error_record_t rec;
  epf_error_read(m->rec_h, &rec);
  if (rec.status != 0 || rec.recv_overflow != 0 || rec.dropped_routes != 0) {
    char why[256];
    snprintf(why, sizeof(why), "%s: %s (%u errors), waiter rank %d, peer %d, overflow %u, dropped %u", c->name,
             epf_status_name((epf_status_t)rec.status), rec.count, rec.waiter_rank, rec.peer, rec.recv_overflow,
             rec.dropped_routes);
    mg_die(m->rank, __LINE__, when, why);
  }
}

/* Identity experts in place: out[t] must be BF16(sum_k w[t][k] * x[t]) (FP32 sum in k order). Checks
 * up to MG_CHECK_TOKENS tokens spread over T; a BF16 ulp of slack (the kernels' FMA order). */
static void mg_check_identity(int rank, const mg_case_t* c, int H, int K, const void* d_x, const void* d_out,
                              int* checked, int* bad) {
  const int T = c->T, n = T < MG_CHECK_TOKENS ? T : MG_CHECK_TOKENS;
  const int32_t* topk = c->topk + (size_t)rank * T * K;
  const float* w = c->w + (size_t)rank * T * K;
  uint16_t* x = (uint16_t*)malloc((size_t)H * 2);
  uint16_t* o = (uint16_t*)malloc((size_t)H * 2);
  if (x == NULL || o == NULL) mg_die(rank, __LINE__, "malloc", "out of memory");
  for (int i = 0; i < n; ++i) {
    const int64_t t = (int64_t)i * T / n;
    int wrong = 0;
    MG_CUDA(rank, cudaMemcpy(x, (const char*)d_x + (size_t)t * H * 2, (size_t)H * 2, cudaMemcpyDeviceToHost));
    MG_CUDA(rank, cudaMemcpy(o, (const char*)d_out + (size_t)t * H * 2, (size_t)H * 2, cudaMemcpyDeviceToHost));
    for (int j = 0; j < H && !wrong; ++j) {
      const float xv = mg_bf16_to_f(x[j]);
      float acc = 0.f;
      for (int k = 0; k < K; ++k)
        if (topk[t * K + k] >= 0) acc = fmaf(w[t * K + k], xv, acc);
      {
        const float want = mg_bf16_to_f(mg_f_to_bf16(acc)), got = mg_bf16_to_f(o[j]);
        const float d = got > want ? got - want : want - got;
        const float a = want < 0.f ? -want : want;
        wrong = !(d <= a * (1.0f / 128.0f) + 1e-6f); /* also catches NaN */
      }
    }
    *bad += wrong;
  }
  *checked += n;
  free(x);
  free(o);
}

/* ---- HT: route update, dispatch, combine ------------------------------------------------------ */

static void mg_run_ht(mg_run_t* run, mg_case_t* c, epf_mg_rank_t* m, cudaStream_t s, int* d_flag) {
  const int r = m->rank, T = c->T, H = run->H, K = run->K, EL = run->E / run->R;
  const epf_plan_t* plan = &c->plan;
  const int W = MG_HT_WARMUP, N = run->iters;
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  uint64_t rbytes = 0;
  void* rbuf = NULL;
  epf_route_t route;
  void *d_topk, *d_x, *d_out, *d_eo = NULL;
  float* d_w;
  epf_ht_state_t* d_state;
  const int64_t expert_rows = plan->recv_capacity + EL;
  cudaEvent_t* ev;

  rc.index_type = EPF_INDEX_INT32;
  MG_OK(r, epf_route_size(plan, &rc, &rbytes));
  MG_CUDA(r, cudaMalloc(&rbuf, rbytes));
  MG_OK(r, epf_route_init(plan, &rc, rbuf, rbytes, 1, 1u, s, &route)); /* count 1: a real rank */
  MG_CUDA(r, cudaMalloc(&d_topk, (size_t)T * K * 4));
  MG_CUDA(r, cudaMalloc(&d_w, (size_t)T * K * 4));
  MG_CUDA(r, cudaMalloc(&d_x, (size_t)T * H * 2));
  MG_CUDA(r, cudaMalloc(&d_out, (size_t)T * H * 2));
  MG_CUDA(r, cudaMalloc(&d_state, sizeof(epf_ht_state_t)));
  MG_CUDA(r, cudaMemsetAsync(d_state, 0, sizeof(epf_ht_state_t), s));
  MG_CUDA(r, cudaMemcpyAsync(d_topk, c->topk + (size_t)r * T * K, (size_t)T * K * 4, cudaMemcpyHostToDevice, s));
  MG_CUDA(r, cudaMemcpyAsync(d_w, c->w + (size_t)r * T * K, (size_t)T * K * 4, cudaMemcpyHostToDevice, s));
  mg_fill_bf16<<<1024, 256, 0, s>>>((uint16_t*)d_x, (int64_t)T * H, 0x1000u + (uint32_t)r);
  MG_CUDA(r, cudaGetLastError());
  if (plan->payload != EPF_PAYLOAD_BF16) { /* the combine reads BF16 expert outputs from a buffer */
    MG_CUDA(r, cudaMalloc(&d_eo, (size_t)expert_rows * H * 2));
    mg_fill_bf16<<<1024, 256, 0, s>>>((uint16_t*)d_eo, expert_rows * H, 0x2000u + (uint32_t)r);
    MG_CUDA(r, cudaGetLastError());
  }
  MG_CUDA(r, cudaStreamSynchronize(s));

  epf_route_step_t rs = epf_route_step_make(d_topk, T, epf_wait_make(plan->timeout_ns, m->rec_d, NULL, r));
  epf_ht_step_t hs = EPF_HT_STEP_INIT;
  hs.x = d_x;
  hs.topk_weights = d_w;
  hs.out = d_out;
  hs.expert_out = d_eo; /* NULL: BF16 both ways, outputs in place over the received rows (pull) */
  hs.state = d_state;
  hs.expert_rows = expert_rows;
  hs.blocks_per_rank = run->blocks;
  hs.wait = epf_wait_make(plan->timeout_ns, m->rec_d, NULL, r);

  ev = mg_events(r, 6 * (W + N));
  for (int i = 0; i < W + N; ++i) {
    if (i == W) { /* warm-up done: stop here on an error rather than wait out every deadline */
      MG_CUDA(r, cudaStreamSynchronize(s));
      mg_check_record(m, c, "HT warm-up");
    }
    cudaEvent_t* e = ev + 6 * i;
    mg_sync(m, d_flag, s);
    MG_CUDA(r, cudaEventRecord(e[0], s));
    MG_OK(r, epf_route_update(&route, m->team, plan, &rs, s));
    MG_CUDA(r, cudaEventRecord(e[1], s));
    mg_sync(m, d_flag, s);
    MG_CUDA(r, cudaEventRecord(e[2], s));
    MG_OK(r, epf_ht_dispatch(&route, m->team, plan, &hs, d_topk, EPF_HT_BOTH, s));
    MG_CUDA(r, cudaEventRecord(e[3], s));
    mg_sync(m, d_flag, s);
    MG_CUDA(r, cudaEventRecord(e[4], s));
    MG_OK(r, epf_ht_combine(&route, m->team, plan, &hs, d_topk, s));
    MG_CUDA(r, cudaEventRecord(e[5], s));
  }
  MG_CUDA(r, cudaStreamSynchronize(s));
  mg_check_record(m, c, "HT timed iterations");
  for (int i = 0; i < N; ++i) {
    const cudaEvent_t* e = ev + 6 * (W + i);
    c->st[0].t[(size_t)r * N + i] = mg_elapsed(r, e[0], e[1]);
    c->st[1].t[(size_t)r * N + i] = mg_elapsed(r, e[2], e[3]);
    c->st[2].t[(size_t)r * N + i] = mg_elapsed(r, e[4], e[5]);
  }
  mg_events_free(r, ev, 6 * (W + N));
  if (plan->payload == EPF_PAYLOAD_BF16) mg_check_identity(r, c, H, K, d_x, d_out, &c->checked[r], &c->bad[r]);
  epf_error_read(m->rec_h, &c->rec[r]);

  MG_CUDA(r, cudaFree(rbuf));
  MG_CUDA(r, cudaFree(d_topk));
  MG_CUDA(r, cudaFree(d_w));
  MG_CUDA(r, cudaFree(d_x));
  MG_CUDA(r, cudaFree(d_out));
  MG_CUDA(r, cudaFree(d_state));
  if (d_eo != NULL) MG_CUDA(r, cudaFree(d_eo));
}

/* ---- LL: dispatch, combine push, combine pull, one CUDA graph each ---------------------------- */

static void mg_run_ll(mg_run_t* run, mg_case_t* c, epf_mg_rank_t* m, cudaStream_t s, int* d_flag) {
  const int r = m->rank, T = c->T, H = run->H, K = run->K, N = run->reps;
  const epf_plan_t* plan = &c->plan;
  epf_ll_state_t* d_state;
  uint16_t *d_x, *d_out;
  int32_t *d_topk, *d_counts;
  float* d_w;
  uint32_t* d_round;
  epf_ll_dispatch_args_t da;
  epf_ll_combine_args_t ca[2];
  cudaGraph_t g[3];
  cudaGraphExec_t x[3];
  const int64_t ncounts = (int64_t)plan->experts_per_rank * plan->nranks;

  MG_CUDA(r, cudaMalloc(&d_state, sizeof(epf_ll_state_t)));
  MG_CUDA(r, cudaMalloc(&d_x, epf_ll_buffer_bytes(plan, EPF_LL_BUF_X, EPF_INDEX_DEFAULT)));
  MG_CUDA(r, cudaMalloc(&d_out, epf_ll_buffer_bytes(plan, EPF_LL_BUF_X, EPF_INDEX_DEFAULT)));
  MG_CUDA(r, cudaMalloc(&d_topk, epf_ll_buffer_bytes(plan, EPF_LL_BUF_TOPK_IDX, EPF_INDEX_INT32)));
  MG_CUDA(r, cudaMalloc(&d_w, epf_ll_buffer_bytes(plan, EPF_LL_BUF_TOPK_WEIGHTS, EPF_INDEX_DEFAULT)));
  MG_CUDA(r, cudaMalloc(&d_counts, epf_ll_buffer_bytes(plan, EPF_LL_BUF_RECV_COUNTS, EPF_INDEX_DEFAULT)));
  MG_CUDA(r, cudaMalloc(&d_round, epf_ll_buffer_bytes(plan, EPF_LL_BUF_ROUND, EPF_INDEX_DEFAULT)));
  MG_CUDA(r, cudaMemcpyAsync(d_topk, c->topk + (size_t)r * T * K, (size_t)T * K * 4, cudaMemcpyHostToDevice, s));
  MG_CUDA(r, cudaMemcpyAsync(d_w, c->w + (size_t)r * T * K, (size_t)T * K * 4, cudaMemcpyHostToDevice, s));
  mg_fill_bf16<<<256, 256, 0, s>>>(d_x, (int64_t)T * H, 0x3000u + (uint32_t)r);
  MG_CUDA(r, cudaGetLastError());

  epf_ll_launch_t L = epf_ll_launch_make(plan, m->team, d_state, m->rec_d, 0); /* a real rank */
  MG_OK(r, epf_ll_state_reset(&L, s));
  memset(&da, 0, sizeof(da));
  da.x = d_x;
  da.topk_idx = d_topk;
  da.index_type = EPF_INDEX_INT32;
  da.topk_weights = d_w;
  da.num_tokens = T;
  da.recv_counts = d_counts;
  da.round = d_round;
  for (int p = 0; p < 2; ++p) {
    memset(&ca[p], 0, sizeof(ca[p]));
    ca[p].y_layout = p == 0 ? EPF_LL_Y_IN_PLACE : EPF_LL_Y_IN_PLACE_PULL; /* identity experts in place */
    ca[p].recv_counts = d_counts;
    ca[p].topk_idx = d_topk;
    ca[p].index_type = EPF_INDEX_INT32;
    ca[p].topk_weights = d_w;
    ca[p].out = d_out;
    ca[p].num_tokens = T;
  }
  MG_CUDA(r, cudaStreamSynchronize(s));
  /* thread-local capture: the other ranks' threads keep making CUDA calls meanwhile */
  for (int i = 0; i < 3; ++i) {
    MG_CUDA(r, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    if (i == 0)
      MG_OK(r, epf_ll_dispatch(&L, &da, EPF_LL_BOTH, s));
    else
      MG_OK(r, epf_ll_combine(&L, &ca[i - 1], EPF_LL_BOTH, s));
    MG_CUDA(r, cudaStreamEndCapture(s, &g[i]));
    MG_CUDA(r, cudaGraphInstantiate(&x[i], g[i], 0));
  }

  cudaEvent_t* ev = mg_events(r, 4 * N);
  for (int p = 0; p < 2; ++p) { /* p = 0: combine push, p = 1: combine pull */
    for (int i = 0; i < MG_LL_WARMUP; ++i) {
      MG_CUDA(r, cudaGraphLaunch(x[0], s));
      MG_CUDA(r, cudaGraphLaunch(x[1 + p], s));
    }
    MG_CUDA(r, cudaStreamSynchronize(s));
    mg_check_record(m, c, p == 0 ? "LL warm-up (combine push)" : "LL warm-up (combine pull)");
    for (int i = 0; i < N; ++i) {
      cudaEvent_t* e = ev + 4 * i;
      mg_sync(m, d_flag, s);
      MG_CUDA(r, cudaEventRecord(e[0], s));
      MG_CUDA(r, cudaGraphLaunch(x[0], s));
      MG_CUDA(r, cudaEventRecord(e[1], s));
      mg_sync(m, d_flag, s);
      MG_CUDA(r, cudaEventRecord(e[2], s));
      MG_CUDA(r, cudaGraphLaunch(x[1 + p], s));
      MG_CUDA(r, cudaEventRecord(e[3], s));
    }
    MG_CUDA(r, cudaStreamSynchronize(s));
    mg_check_record(m, c, "LL timed replays");
    for (int i = 0; i < N; ++i) {
      const cudaEvent_t* e = ev + 4 * i;
      c->st[0].t[(size_t)r * 2 * N + (size_t)p * N + i] = mg_elapsed(r, e[0], e[1]); /* dispatch: both loops */
      c->st[1 + p].t[(size_t)r * N + i] = mg_elapsed(r, e[2], e[3]);
    }
    mg_check_identity(r, c, H, K, d_x, d_out, &c->checked[r], &c->bad[r]);
  }
  mg_events_free(r, ev, 4 * N);
  {
    int32_t* hc = (int32_t*)malloc((size_t)ncounts * 4);
    int64_t got = 0;
    if (hc == NULL) mg_die(r, __LINE__, "malloc", "out of memory");
    MG_CUDA(r, cudaMemcpy(hc, d_counts, (size_t)ncounts * 4, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < ncounts; ++i) got += hc[i];
    c->got_rows[r] = got;
    free(hc);
  }
  epf_error_read(m->rec_h, &c->rec[r]);

  for (int i = 0; i < 3; ++i) {
    MG_CUDA(r, cudaGraphExecDestroy(x[i]));
    MG_CUDA(r, cudaGraphDestroy(g[i]));
  }
  MG_CUDA(r, cudaFree(d_state));
  MG_CUDA(r, cudaFree(d_x));
  MG_CUDA(r, cudaFree(d_out));
  MG_CUDA(r, cudaFree(d_topk));
  MG_CUDA(r, cudaFree(d_w));
  MG_CUDA(r, cudaFree(d_counts));
  MG_CUDA(r, cudaFree(d_round));
}

/* ---- NCCL baseline: ncclAlltoAll, then grouped ncclSend/ncclRecv, of the same bytes ----------- */

static void mg_run_baseline(mg_run_t* run, mg_case_t* c, epf_mg_rank_t* m, cudaStream_t s, int* d_flag,
                            int stage, int N) {
  const int r = m->rank, R = run->R;
  const size_t cnt = (size_t)c->a2a_bytes;
  char *sb, *rb;
  cudaEvent_t* ev = mg_events(r, 2 * N);
  MG_CUDA(r, cudaMalloc(&sb, cnt * R));
  MG_CUDA(r, cudaMalloc(&rb, cnt * R));
  MG_CUDA(r, cudaMemsetAsync(sb, r + 1, cnt * R, s));
  for (int op = 0; op < 2; ++op) {
    for (int i = -MG_BASE_WARMUP; i < N; ++i) {
      mg_sync(m, d_flag, s);
      if (i >= 0) MG_CUDA(r, cudaEventRecord(ev[2 * i], s));
      if (op == 0) {
        MG_NCCL(m, ncclAlltoAll(sb, rb, cnt, ncclUint8, m->comm, s));
      } else {
        ncclResult_t e = ncclGroupStart();
        for (int p = 0; p < R && (e == ncclSuccess || e == ncclInProgress); ++p) {
          e = ncclSend(sb + (size_t)p * cnt, cnt, ncclUint8, p, m->comm, s);
          if (e == ncclSuccess || e == ncclInProgress) e = ncclRecv(rb + (size_t)p * cnt, cnt, ncclUint8, p, m->comm, s);
        }
        if (e != ncclSuccess && e != ncclInProgress) mg_die(r, __LINE__, "ncclSend/ncclRecv", ncclGetErrorString(e));
        MG_NCCL(m, ncclGroupEnd());
      }
      if (i >= 0) MG_CUDA(r, cudaEventRecord(ev[2 * i + 1], s));
    }
    MG_CUDA(r, cudaStreamSynchronize(s));
    for (int i = 0; i < N; ++i) c->st[stage + op].t[(size_t)r * N + i] = mg_elapsed(r, ev[2 * i], ev[2 * i + 1]);
  }
  mg_events_free(r, ev, 2 * N);
  MG_CUDA(r, cudaFree(sb));
  MG_CUDA(r, cudaFree(rb));
}

/* ---- one rank (thread r on GPU r) ------------------------------------------------------------ */

static void* mg_rank_main(void* arg) {
  mg_rank_arg_t* a = (mg_rank_arg_t*)arg;
  mg_run_t* run = a->run;
  const int r = a->rank;
  epf_mg_rank_t m;
  cudaStream_t s;
  int *d_flag, *d_hs, hs = -1;
  if (epf_mg_rank_open(&m, r, run->R, run->id, run->window_bytes) != EPF_OK) mg_die(r, __LINE__, "epf_mg_rank_open", m.msg);
  MG_CUDA(r, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  MG_CUDA(r, cudaMalloc(&d_flag, sizeof(int)));
  MG_CUDA(r, cudaMalloc(&d_hs, sizeof(int)));
  MG_CUDA(r, cudaMemset(d_flag, 0, sizeof(int)));
  for (int ci = 0; ci < run->ncases; ++ci) {
    mg_case_t* c = &run->cases[ci];
    /* every rank is done with the previous case (its stream drained) before any window is zeroed,
     * and every window is zero before any rank starts this one: the plans differ between cases */
    MG_CUDA(r, cudaDeviceSynchronize());
    pthread_barrier_wait(&run->bar);
    MG_CUDA(r, cudaMemsetAsync(m.win.ptr, 0, m.win.bytes, s));
    MG_CUDA(r, cudaStreamSynchronize(s));
    epf_error_clear(m.rec_h);
    pthread_barrier_wait(&run->bar);
    mg_handshake_kernel<<<1, 128, 0, s>>>(m.team, c->plan, epf_wait_make(c->plan.timeout_ns, m.rec_d, NULL, r), d_hs);
    MG_CUDA(r, cudaGetLastError());
    MG_CUDA(r, cudaMemcpyAsync(&hs, d_hs, sizeof(int), cudaMemcpyDeviceToHost, s));
    MG_CUDA(r, cudaStreamSynchronize(s));
    if (hs != EPF_OK) mg_die(r, __LINE__, "handshake", epf_status_name((epf_status_t)hs));
    if (c->kind == MG_HT)
      mg_run_ht(run, c, &m, s, d_flag);
    else
      mg_run_ll(run, c, &m, s, d_flag);
    if (run->baseline) mg_run_baseline(run, c, &m, s, d_flag, c->nstages - 2, c->st[c->nstages - 1].samples);
  }
  MG_CUDA(r, cudaDeviceSynchronize());
  pthread_barrier_wait(&run->bar);
  MG_CUDA(r, cudaFree(d_flag));
  MG_CUDA(r, cudaFree(d_hs));
  MG_CUDA(r, cudaStreamDestroy(s));
  epf_mg_rank_close(&m);
  return NULL;
}

/* ---- setup of one EP size: routing, plans, stages -------------------------------------------- */

static void mg_stage(mg_case_t* c, const char* name, int bytes, int target, int samples, int R) {
  mg_stage_t* st = &c->st[c->nstages++];
  st->name = name;
  st->bytes = bytes;
  st->target = target;
  st->samples = samples;
  st->t = (float*)calloc((size_t)R * samples, sizeof(float));
  if (st->t == NULL) {
    fprintf(stderr, "bench_mg: out of memory\n");
    exit(1);
  }
}

/* K distinct uniform experts per token, weights in [0, 1); rows received per rank */
static void mg_case_init(mg_run_t* run, mg_case_t* c, int kind, int payload, int T, uint64_t seed) {
  const int R = run->R, K = run->K, E = run->E, EL = E / R;
  int64_t max_rows = 0;
  epf_config_t cfg = EPF_CONFIG_INIT;
  memset(c, 0, sizeof(*c));
  c->kind = kind;
  c->payload = payload;
  c->T = T;
  snprintf(c->name, sizeof(c->name), "%s %s", kind == MG_HT ? "HT" : "LL", payload == EPF_PAYLOAD_MXFP8 ? "MXFP8" : "BF16");
  c->topk = (int32_t*)malloc((size_t)R * T * K * 4);
  c->w = (float*)malloc((size_t)R * T * K * 4);
  if (c->topk == NULL || c->w == NULL) {
    fprintf(stderr, "bench_mg: out of memory\n");
    exit(1);
  }
  for (int src = 0; src < R; ++src)
    for (int64_t t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) {
        const int64_t i = ((int64_t)src * T + t) * K + k;
        int e, dup;
        do {
          e = (int)(epf_bench_splitmix(&seed) % (uint64_t)E);
          dup = 0;
          for (int j = 0; j < k; ++j) dup |= c->topk[i - k + j] == e;
        } while (dup && K <= E);
        c->topk[i] = e;
        c->w[i] = (float)(epf_bench_splitmix(&seed) % 1000) / 1000.0f;
        ++c->recv_rows[e / EL];
        c->link_rows[e / EL] += e / EL != src;
      }
  for (int d = 0; d < R; ++d) max_rows = c->recv_rows[d] > max_rows ? c->recv_rows[d] : max_rows;
  cfg.nranks = R;
  cfg.num_experts = E;
  cfg.top_k = K;
  cfg.hidden = run->H;
  cfg.max_tokens_per_rank = T;
  cfg.mode = kind == MG_HT ? EPF_MODE_HT : EPF_MODE_LL;
  cfg.layout = EPF_LAYOUT_EXPERT_MAJOR;
  cfg.payload = payload;
  cfg.combine_payload = EPF_PAYLOAD_BF16;
  if (kind == MG_HT) cfg.recv_capacity = max_rows + 64; /* every rank computes the same plan */
  EPF_BENCH_OK(epf_plan_compute(&cfg, &c->plan));
  if (c->plan.total_bytes > run->window_bytes) run->window_bytes = c->plan.total_bytes;
  {
    /* baseline: the mean received-logical dispatch bytes of a rank, split evenly over R peers */
    int64_t all = 0;
    for (int d = 0; d < R; ++d) all += c->recv_rows[d];
    const double per_rank = (double)all / R * (double)(c->plan.row_bytes + c->plan.scale_bytes_per_row);
    c->a2a_bytes = (uint64_t)(per_rank / R) / 16u * 16u;
    if (c->a2a_bytes < 16u) c->a2a_bytes = 16u;
  }
  if (kind == MG_HT) {
    const int tgt = payload == EPF_PAYLOAD_BF16 ? MG_TGT_HT : MG_TGT_NONE;
    mg_stage(c, "route update", MG_BYTES_NONE, MG_TGT_NONE, run->iters, R);
    mg_stage(c, payload == EPF_PAYLOAD_BF16 ? "dispatch" : "dispatch (quantize on the way)", MG_BYTES_DISPATCH, tgt,
             run->iters, R);
    mg_stage(c, "combine BF16 (pull)", MG_BYTES_COMBINE, tgt, run->iters, R);
  } else {
    const int ll = T == MG_TARGET_LL_T;
    mg_stage(c, "dispatch (graph)", MG_BYTES_DISPATCH, ll ? MG_TGT_LL_DISPATCH : MG_TGT_NONE, 2 * run->reps, R);
    mg_stage(c, "combine push (graph)", MG_BYTES_COMBINE, ll ? MG_TGT_LL_COMBINE : MG_TGT_NONE, run->reps, R);
    mg_stage(c, "combine pull (graph)", MG_BYTES_COMBINE, ll ? MG_TGT_LL_COMBINE : MG_TGT_NONE, run->reps, R);
  }
  if (run->baseline) {
    const int n = kind == MG_HT ? run->iters : run->reps;
    mg_stage(c, "NCCL ncclAlltoAll, same bytes", MG_BYTES_BASELINE, MG_TGT_NONE, n, R);
    mg_stage(c, "NCCL grouped ncclSend/ncclRecv", MG_BYTES_BASELINE, MG_TGT_NONE, n, R);
  }
  for (int d = 0; d < R; ++d) c->got_rows[d] = -1;
}

static void mg_case_free(mg_case_t* c) {
  for (int i = 0; i < c->nstages; ++i) free(c->st[i].t);
  free(c->topk);
  free(c->w);
}

/* ---- report ---------------------------------------------------------------------------------- */

typedef struct mg_target_line {
  char text[160];
} mg_target_line_t;

static mg_target_line_t g_targets[32];
static int g_ntargets = 0;

/* median over iterations of the slowest rank; per-rank medians' spread */
static double mg_stage_us(const mg_stage_t* st, int R, double* rank_min_us, double* rank_max_us) {
  float* v = (float*)malloc(sizeof(float) * (size_t)st->samples);
  double med;
  *rank_min_us = 1e30;
  *rank_max_us = 0.0;
  for (int r = 0; r < R; ++r) {
    double m;
    memcpy(v, st->t + (size_t)r * st->samples, sizeof(float) * (size_t)st->samples);
    m = epf_bench_median(v, st->samples) * 1e3;
    if (m < *rank_min_us) *rank_min_us = m;
    if (m > *rank_max_us) *rank_max_us = m;
  }
  for (int i = 0; i < st->samples; ++i) {
    float mx = 0.f;
    for (int r = 0; r < R; ++r) mx = st->t[(size_t)r * st->samples + i] > mx ? st->t[(size_t)r * st->samples + i] : mx;
    v[i] = mx;
  }
  med = epf_bench_median(v, st->samples) * 1e3;
  free(v);
  return med;
}

static int mg_report(const mg_run_t* run) {
  const int R = run->R, K = run->K;
  int failed = 0;
  printf("\n| EP | case | T/rank | stage | us (slowest rank) | per-rank medians us | received-logical GB/s | "
         "topk-logical GB/s | link GB/s | link / 450 GB/s | target (issue #8, EP 8) |\n");
  printf("| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
  for (int ci = 0; ci < run->ncases; ++ci) {
    const mg_case_t* c = &run->cases[ci];
    const double drow = (double)c->plan.row_bytes + c->plan.scale_bytes_per_row, crow = c->plan.combine_row_bytes;
    double recv_rows = 0, link_rows = 0;
    for (int d = 0; d < R; ++d) {
      recv_rows += (double)c->recv_rows[d] / R;
      link_rows += (double)c->link_rows[d] / R;
    }
    for (int si = 0; si < c->nstages; ++si) {
      const mg_stage_t* st = &c->st[si];
      double lo, hi;
      const double us = mg_stage_us(st, R, &lo, &hi);
      double recv = 0, topk = 0, link = 0;
      char tgt[128] = "";
      if (st->bytes == MG_BYTES_DISPATCH || st->bytes == MG_BYTES_COMBINE) {
        const double row = st->bytes == MG_BYTES_DISPATCH ? drow : crow;
        recv = recv_rows * row;
        topk = (double)c->T * K * row;
        link = link_rows * row;
      } else if (st->bytes == MG_BYTES_BASELINE) {
        recv = (double)R * (double)c->a2a_bytes;
        topk = (double)c->T * K * drow;
        link = (double)(R - 1) * (double)c->a2a_bytes;
      }
      if (st->target != MG_TGT_NONE) {
        const int at_ep = R == MG_TARGET_EP;
        int met;
        if (st->target == MG_TGT_HT) {
          const double gbs = recv / (us * 1e3);
          met = gbs >= MG_HT_TARGET_GBS;
          snprintf(tgt, sizeof(tgt), ">= %.0f GB/s received-logical: %s", MG_HT_TARGET_GBS,
                   !at_ep ? "(EP 8 only)" : met ? "met" : "MISSED");
          if (at_ep && g_ntargets < 32)
            snprintf(g_targets[g_ntargets++].text, sizeof(g_targets[0].text), "%s %s: %.0f GB/s received-logical, target >= %.0f: %s",
                     c->name, st->name, gbs, MG_HT_TARGET_GBS, met ? "met" : "MISSED");
        } else {
          const double lim = st->target == MG_TGT_LL_DISPATCH ? MG_LL_DISPATCH_TARGET_US : MG_LL_COMBINE_TARGET_US;
          met = us <= lim;
          snprintf(tgt, sizeof(tgt), "<= %.0f us: %s", lim, !at_ep ? "(EP 8 only)" : met ? "met" : "MISSED");
          if (at_ep && g_ntargets < 32)
            snprintf(g_targets[g_ntargets++].text, sizeof(g_targets[0].text), "%s T=%d %s: %.2f us, target <= %.0f us: %s",
                     c->name, c->T, st->name, us, lim, met ? "met" : "MISSED");
        }
      }
      if (st->bytes == MG_BYTES_NONE)
        printf("| %d | %s | %d | %s | %.2f | %.2f..%.2f | | | | | |\n", R, c->name, c->T, st->name, us, lo, hi);
      else
        printf("| %d | %s | %d | %s | %.2f | %.2f..%.2f | %.1f | %.1f | %.1f | %.1f %% | %s |\n", R, c->name, c->T, st->name,
               us, lo, hi, recv / (us * 1e3), topk / (us * 1e3), link / (us * 1e3),
               100.0 * link / (us * 1e3) / MG_NVLINK_GBS, tgt);
    }
  }
  printf("\n");
  for (int ci = 0; ci < run->ncases; ++ci) {
    const mg_case_t* c = &run->cases[ci];
    int64_t lo = INT64_MAX, hi = 0, all = 0, link = 0;
    int checked = 0, bad = 0, rows_ok = 1, errs = 0;
    for (int d = 0; d < R; ++d) {
      lo = c->recv_rows[d] < lo ? c->recv_rows[d] : lo;
      hi = c->recv_rows[d] > hi ? c->recv_rows[d] : hi;
      all += c->recv_rows[d];
      link += c->link_rows[d];
      checked += c->checked[d];
      bad += c->bad[d];
      if (c->got_rows[d] >= 0 && c->got_rows[d] != c->recv_rows[d]) rows_ok = 0;
      if (c->rec[d].status != 0 || c->rec[d].recv_overflow != 0 || c->rec[d].dropped_routes != 0) {
        ++errs;
        printf("  !! %s T=%d rank %d: %s (%u errors), overflow %u, dropped %u\n", c->name, c->T, d,
               epf_status_name((epf_status_t)c->rec[d].status), c->rec[d].count, c->rec[d].recv_overflow,
               c->rec[d].dropped_routes);
      }
    }
    printf("%s T=%d: rows received per rank min/mean/max %lld/%.0f/%lld (%.0f from other ranks), row %u+%u B, "
           "window %.1f MB; NCCL baseline %llu B per peer; error records: %s; ",
           c->name, c->T, (long long)lo, (double)all / R, (long long)hi, (double)link / R, c->plan.row_bytes,
           c->plan.scale_bytes_per_row, c->plan.total_bytes / 1e6, (unsigned long long)c->a2a_bytes,
           errs ? "ERRORS" : "clean");
    if (checked > 0)
      printf("combine = sum_k w_k x on %d sampled tokens: %s", checked, bad ? "MISMATCH" : "OK");
    else
      printf("combine not checked (synthetic expert outputs)");
    if (c->kind == MG_LL) printf("; LL rows received %s", rows_ok ? "as routed" : "WRONG");
    printf("\n");
    failed |= errs != 0 || bad != 0 || !rows_ok;
  }
  return failed;
}

/* ---- main ------------------------------------------------------------------------------------- */

static int mg_parse_list(const char* s, int* out, int most) {
  int n = 0;
  char* p = (char*)s;
  while (*p && n < most) {
    out[n++] = (int)strtol(p, &p, 10);
    if (*p == ',') ++p;
    else if (*p) return -1;
  }
  return n;
}

int main(int argc, char** argv) {
  int H = 7168, K = 8, E = 256, T = 4096, iters = 20, reps = 200, blocks = 0, baseline = 1;
  int ll_t[MG_MAX_LL_T] = {1, 128}, n_ll = 2, ep[EPF_MG_MAX], n_ep = 0, failed = 0, ran = 0;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (!strcmp(a, "--hidden")) H = atoi(v), ++i;
    else if (!strcmp(a, "--topk")) K = atoi(v), ++i;
    else if (!strcmp(a, "--experts")) E = atoi(v), ++i;
    else if (!strcmp(a, "--tokens")) T = atoi(v), ++i;
    else if (!strcmp(a, "--iters")) iters = atoi(v), ++i;
    else if (!strcmp(a, "--reps")) reps = atoi(v), ++i;
    else if (!strcmp(a, "--blocks")) blocks = atoi(v), ++i;
    else if (!strcmp(a, "--no-baseline")) baseline = 0;
    else if (!strcmp(a, "--ll-tokens")) n_ll = mg_parse_list(v, ll_t, MG_MAX_LL_T), ++i;
    else if (!strcmp(a, "--ep")) n_ep = mg_parse_list(v, ep, EPF_MG_MAX), ++i;
    else {
      printf("usage: %s [--ep 2,4,8 (default: all GPUs)] [--iters 20] [--reps 200] [--tokens 4096]\n"
             "          [--ll-tokens 1,128] [--hidden 7168] [--topk 8] [--experts 256] [--blocks 0 (HT blocks)]\n"
             "          [--no-baseline]\n"
             "  HT and LL dispatch / combine over real NCCL ranks (one thread per GPU) and NCCL's all-to-all\n"
             "  of the same bytes. Exit 77 with fewer than 2 GPUs (EPF_MG_GPUS=1: a 1-GPU smoke run).\n",
             argv[0]);
      return strcmp(a, "--help") ? 2 : 0;
    }
  }
  if (n_ll < 0 || n_ep < 0 || iters < 1 || reps < 1 || T < 1 || H < 1 || K < 1 || E < 1 || blocks < 0) {
    fprintf(stderr, "bench_mg: bad arguments (see --help)\n");
    return 2;
  }
  const int n = epf_mg_gpus(2); /* prints "SKIP: needs 2 GPU(s), found N" */
  if (n == 77) return 77;
  if (n_ep == 0) ep[n_ep++] = n;
  {
    cudaDeviceProp prop;
    int v = 0;
    EPF_BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
    if (ncclGetVersion(&v) != ncclSuccess) v = 0;
    printf("bench_mg: %d GPU(s) (%s, %d SMs), NCCL %d.%d.%d, one thread per GPU; H=%d top-%d of %d experts; "
           "HT T=%d, %d iterations; LL %d graph replays\n",
           n, prop.name, prop.multiProcessorCount, v / 10000, (v % 10000) / 100, v % 100, H, K, E, T, iters, reps);
    printf("times: median over iterations of the slowest rank (CUDA events), every operation started after an "
           "NCCL allreduce barrier; GB/s per rank = the mean over ranks of the bytes one rank receives / time\n");
    printf("conventions (notes/ANCHORS.md): received-logical = rows received incl. own x row bytes; topk-logical = "
           "T x K x row bytes; link = rows from other GPUs x row bytes, vs the NVLink limit %.0f GB/s per direction "
           "per GPU\n",
           MG_NVLINK_GBS);
  }
  for (int ei = 0; ei < n_ep; ++ei) {
    const int R = ep[ei];
    mg_run_t* run;
    mg_rank_arg_t args[EPF_MG_MAX];
    if (R < 1 || R > n) {
      printf("EP %d skipped: %d GPU(s) in use\n", R, n);
      continue;
    }
    if (E % R != 0) {
      printf("EP %d skipped: %d experts are not a multiple of %d ranks\n", R, E, R);
      continue;
    }
    run = (mg_run_t*)calloc(1, sizeof(mg_run_t));
    if (run == NULL) return 1;
    run->R = R;
    run->H = H;
    run->K = K;
    run->E = E;
    run->iters = iters;
    run->reps = reps;
    run->blocks = blocks;
    run->baseline = baseline;
    mg_case_init(run, &run->cases[run->ncases++], MG_HT, EPF_PAYLOAD_BF16, T, 0x5eed0001ull * (uint64_t)R);
    if (H % 32 == 0) mg_case_init(run, &run->cases[run->ncases++], MG_HT, EPF_PAYLOAD_MXFP8, T, 0x5eed0001ull * (uint64_t)R);
    for (int i = 0; i < n_ll && run->ncases < MG_MAX_CASES; ++i)
      if (ll_t[i] >= 1) mg_case_init(run, &run->cases[run->ncases++], MG_LL, EPF_PAYLOAD_BF16, ll_t[i], 0x5eed1000ull + (uint64_t)ll_t[i] * 131u + (uint64_t)R);
    printf("\nEP %d: %d rank(s) on GPUs 0..%d, symmetric window %.1f MB per rank\n", R, R, R - 1, run->window_bytes / 1e6);
    fflush(stdout);
    if (ncclGetUniqueId(&run->id) != ncclSuccess) {
      fprintf(stderr, "bench_mg: ncclGetUniqueId failed\n");
      return 1;
    }
    if (pthread_barrier_init(&run->bar, NULL, (unsigned)R) != 0) {
      fprintf(stderr, "bench_mg: pthread_barrier_init failed\n");
      return 1;
    }
    for (int r = 0; r < R; ++r) {
      args[r].run = run;
      args[r].rank = r;
    }
    if (epf_mg_run(R, mg_rank_main, args, sizeof(args[0])) != 0) {
      fprintf(stderr, "bench_mg: could not start the rank threads\n");
      return 1;
    }
    pthread_barrier_destroy(&run->bar);
    failed |= mg_report(run);
    ++ran;
    for (int ci = 0; ci < run->ncases; ++ci) mg_case_free(&run->cases[ci]);
    free(run);
  }
  printf("\ntargets of issue #8 (EP %d):%s\n", MG_TARGET_EP, g_ntargets ? "" : " not measured in this run (no EP 8)");
  for (int i = 0; i < g_ntargets; ++i) printf("  %s\n", g_targets[i].text);
  if (ran == 0) return 1;
  return failed ? 1 : 0;
}
