/* 01_virtual_ranks — a whole 8-rank EP team on ONE GPU: route, dispatch, experts, combine.
 *
 * Learning objectives
 *   - Plan a window with host.h (epf_plan_compute) and give every virtual rank its own slice of
 *     one cudaMalloc: epf_team_virtual(window, plan.total_bytes, 0, R).
 *   - Run one high-throughput (HT) round with the ready-made launchers: epf_route_update (count
 *     exchange, slots, offsets) -> epf_ht_dispatch (rows into their final slots, quantized on the
 *     way for MXFP8 / FP8) -> [epf_ht_expand for rank-major] -> your experts -> epf_ht_combine
 *     (weighted FP32 reduction in k order, BF16 out).
 *   - Check the result bit for bit against a CPU reference (examples/common/ex_common.h).
 * Key concepts: virtual ranks (docs/concepts.md), the plan's regions (docs/layouts.md), route
 *   epochs (every launch reads its epoch on the device, so a round is graph-capturable), caller-
 *   owned state (epf_ht_state_t, zeroed once), the error record (host-mapped, read without a sync).
 * When to use it: to develop and test MoE kernels with every protocol path exercised but no
 *   cluster; to measure the kernels' HBM efficiency (every "link" byte is an HBM byte here).
 * Performance notes: with virtual ranks all traffic is HBM traffic on one GPU, so the table
 *   compares each stage's bytes with a device-to-device copy measured in the same run; the numbers
 *   are not NVLink numbers. Timed iterations run route + dispatch + combine back to back (no
 *   expert stage), like tests/bench/bench_ht.cu; see docs/performance.md for the conventions.
 *
 * Low-latency mode (--mode ll) is not wired into this demo yet: see tests/gpu/test_ll.cu and
 * docs/low-latency.md for the LL launchers (kernels_ll.cuh).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epfuse/epfuse.cuh"
#include "epfuse/kernels_ht.cuh"
#include "ex_common.h"

typedef struct {
  int R, T, H, K, E, layout, payload, iters, verify_all, samples, ctest;
  uint64_t seed;
} opts_t;

static void usage(const char* argv0) {
  printf("usage: %s [--ranks 8] [--tokens 4096] [--hidden 7168] [--topk 8] [--experts 256]\n"
         "          [--mode ht] [--layout em|rm] [--payload bf16|mxfp8|fp8] [--iters 20]\n"
         "          [--samples 512 | --verify-all] [--seed N] [--ctest]\n"
         "  An R-rank EP team as virtual ranks on one GPU: route -> dispatch -> experts (a per-expert\n"
         "  scale) -> combine, checked bit for bit against a CPU reference on --samples tokens (all\n"
         "  tokens with --verify-all), then timed.\n"
         "  --mode: only ht (high-throughput) is supported by this demo today; ll (low-latency) is\n"
         "          not wired in yet (see tests/gpu/test_ll.cu).\n"
         "  --ctest: exit 77 instead of 1 when no GPU is present (CTest reports \"Not Run\").\n",
         argv0);
}

static int parse(int argc, char** argv, opts_t* o) {
  o->R = 8; o->T = 4096; o->H = 7168; o->K = 8; o->E = 256;
  o->layout = EPF_LAYOUT_EXPERT_MAJOR; o->payload = EPF_PAYLOAD_BF16;
  o->iters = 20; o->verify_all = 0; o->samples = 512; o->ctest = 0; o->seed = 12345;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
#define EX_INT(name, field) if (!strcmp(a, name) && v) { o->field = atoi(v); ++i; continue; }
    EX_INT("--ranks", R) EX_INT("--tokens", T) EX_INT("--hidden", H) EX_INT("--topk", K) EX_INT("--experts", E)
    EX_INT("--iters", iters) EX_INT("--samples", samples)
#undef EX_INT
    if (!strcmp(a, "--seed") && v) { o->seed = strtoull(v, NULL, 0); ++i; continue; }
    if (!strcmp(a, "--verify-all")) { o->verify_all = 1; continue; }
    if (!strcmp(a, "--ctest")) { o->ctest = 1; continue; }
    if (!strcmp(a, "--mode") && v) {
      ++i;
      if (!strcmp(v, "ht")) continue;
      fprintf(stderr, "--mode %s: this demo supports only ht today (LL: tests/gpu/test_ll.cu)\n", v);
      return 2;
    }
    if (!strcmp(a, "--layout") && v) {
      ++i;
      if (!strcmp(v, "em")) o->layout = EPF_LAYOUT_EXPERT_MAJOR;
      else if (!strcmp(v, "rm")) o->layout = EPF_LAYOUT_RANK_MAJOR;
      else return 2;
      continue;
    }
    if (!strcmp(a, "--payload") && v) {
      ++i;
      if (!strcmp(v, "bf16")) o->payload = EPF_PAYLOAD_BF16;
      else if (!strcmp(v, "mxfp8")) o->payload = EPF_PAYLOAD_MXFP8;
      else if (!strcmp(v, "fp8")) o->payload = EPF_PAYLOAD_FP8_128;
      else return 2;
      continue;
    }
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(argv[0]); exit(0); }
    fprintf(stderr, "unknown argument %s\n", a);
    return 2;
  }
  if (o->R < 1 || o->T < 1 || o->K < 1 || o->E < o->R || o->E % o->R || o->iters < 1) return 2;
  return 0;
}

static int cmp_f(const void* a, const void* b) {
  const float x = *(const float*)a, y = *(const float*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  opts_t o;
  if (parse(argc, argv, &o)) {
    usage(argv[0]);
    return 2;
  }
  ex_gpu_or_exit(1, o.ctest);
  const int R = o.R, T = o.T, H = o.H, K = o.K, E = o.E, EL = E / R;
  const int64_t n = (int64_t)R * T;

  /* ---- inputs on the host: BF16 rows, distinct random experts per token, weights ------------- */
  uint64_t seed = o.seed;
  uint16_t* x = (uint16_t*)malloc((size_t)n * H * 2);
  int32_t* topk = (int32_t*)malloc((size_t)n * K * 4);
  float* w = (float*)malloc((size_t)n * K * 4);
  for (int64_t i = 0; i < n * H; ++i) {
    const uint64_t r = ex_rand(&seed);
    x[i] = ex_bf16_rne((float)((int64_t)(r % 20001) - 10000) / 1000.0f);
  }
  for (int64_t t = 0; t < n; ++t)
    for (int k = 0; k < K; ++k) {
      int e, dup;
      do {
        e = (int)(ex_rand(&seed) % (uint64_t)E);
        dup = 0;
        for (int j = 0; j < k; ++j) dup |= topk[t * K + j] == e;
      } while (dup && K <= E);
      topk[t * K + k] = e;
      w[t * K + k] = (float)(ex_rand(&seed) % 1000) / 997.0f;
    }
  /* rows each rank receives: budget the receive region from the routing (no overflow) */
  int64_t* rows = (int64_t*)calloc((size_t)R, 8);
  int64_t* copies = (int64_t*)calloc((size_t)R, 8);
  int64_t all_rows = 0, max_rows = 0, max_copies = 0;
  for (int64_t t = 0; t < n; ++t)
    for (int k = 0; k < K; ++k) {
      const int d = topk[t * K + k] / EL;
      int first = 1; /* rank-major: one row per (token, destination rank) */
      for (int j = 0; j < k; ++j) first &= topk[t * K + j] / EL != d;
      ++copies[d];
      rows[d] += first;
    }
  for (int d = 0; d < R; ++d) {
    if (o.layout == EPF_LAYOUT_EXPERT_MAJOR) rows[d] = copies[d];
    all_rows += rows[d];
    max_rows = rows[d] > max_rows ? rows[d] : max_rows;
    max_copies = copies[d] > max_copies ? copies[d] : max_copies;
  }

  /* ---- plan, window, team, route ------------------------------------------------------------- */
  // example-begin plan_and_team
  epf_config_t cfg = EPF_CONFIG_INIT; /* zero = default */
  cfg.nranks = R;
  cfg.num_experts = E;
  cfg.top_k = K;
  cfg.hidden = H;
  cfg.max_tokens_per_rank = T;
  cfg.mode = EPF_MODE_HT;
  cfg.layout = o.layout;
  cfg.payload = o.payload;           /* quantized on the way for MXFP8 / FP8 */
  cfg.combine_payload = EPF_PAYLOAD_BF16;
  cfg.expert_alignment = 1;
  cfg.recv_capacity = max_rows + 64; /* budgeted rows; anything past it is dropped and counted */
  epf_plan_t plan;
  EX_CS(epf_plan_compute(&cfg, &plan));

  char* window; /* R slices of plan.total_bytes: virtual rank r owns slice r */
  EX_CK(cudaMalloc(&window, (size_t)R * plan.total_bytes));
  EX_CK(cudaMemset(window, 0, (size_t)R * plan.total_bytes)); /* epochs start at zero */
  epf_team_t team = epf_team_virtual(window, plan.total_bytes, 0, R);

  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  rc.index_type = EPF_INDEX_INT32;
  uint64_t rbytes = 0;
  EX_CS(epf_route_size(&plan, &rc, &rbytes));
  void* route_buf;
  EX_CK(cudaMalloc(&route_buf, (size_t)rbytes * R)); /* one route buffer per virtual rank */
  epf_route_t route;
  EX_CS(epf_route_init(&plan, &rc, route_buf, rbytes * R, R, 1u, 0, &route));
  // example-end plan_and_team

  const int64_t expert_rows = (o.layout == EPF_LAYOUT_RANK_MAJOR ? max_copies : plan.recv_capacity) + EL + 64;
  void *d_topk, *d_x, *d_out;
  float* d_w;
  uint16_t* d_eo;
  uint8_t *d_view = NULL, *d_view_scales = NULL;
  epf_ht_state_t* d_state;
  EX_CK(cudaMalloc(&d_topk, (size_t)n * K * 4));
  EX_CK(cudaMalloc(&d_w, (size_t)n * K * 4));
  EX_CK(cudaMalloc(&d_x, (size_t)n * H * 2));
  EX_CK(cudaMalloc(&d_out, (size_t)n * H * 2));
  EX_CK(cudaMalloc(&d_eo, (size_t)R * expert_rows * H * 2));
  if (o.layout == EPF_LAYOUT_RANK_MAJOR) {
    EX_CK(cudaMalloc(&d_view, (size_t)R * expert_rows * plan.row_bytes));
    if (plan.scale_bytes_per_row) EX_CK(cudaMalloc(&d_view_scales, (size_t)R * expert_rows * plan.scale_bytes_per_row));
  }
  EX_CK(cudaMalloc(&d_state, R * sizeof(epf_ht_state_t)));
  EX_CK(cudaMemset(d_state, 0, R * sizeof(epf_ht_state_t)));
  EX_CK(cudaMemcpy(d_topk, topk, (size_t)n * K * 4, cudaMemcpyHostToDevice));
  EX_CK(cudaMemcpy(d_w, w, (size_t)n * K * 4, cudaMemcpyHostToDevice));
  EX_CK(cudaMemcpy(d_x, x, (size_t)n * H * 2, cudaMemcpyHostToDevice));
  EX_CK(cudaMemset(d_out, 0xA7, (size_t)n * H * 2)); /* poison: a missed row cannot pass */
  epf_error_record_t *rec_h, *rec_d;
  EX_CK(cudaHostAlloc(&rec_h, sizeof(*rec_h), cudaHostAllocMapped));
  EX_CK(cudaHostGetDevicePointer(&rec_d, rec_h, 0));
  epf_error_clear(rec_h);

  // example-begin ht_round
  epf_route_step_t rs = epf_route_step_make(d_topk, T, epf_wait_make(plan.timeout_ns, rec_d, NULL, 0));
  epf_ht_step_t hs;
  memset(&hs, 0, sizeof(hs));
  hs.x = d_x;                  /* [R][T][H] BF16, packed per virtual rank */
  hs.topk_weights = d_w;       /* [R][T][K] */
  hs.out = d_out;              /* [R][T][H] BF16 combine output */
  hs.expert_out = d_eo;        /* [R][expert_rows][H] BF16, written by the experts */
  hs.em_view = d_view;         /* rank-major only: the expert-major view */
  hs.em_view_scales = d_view_scales;
  hs.state = d_state;          /* zeroed once */
  hs.expert_rows = expert_rows;
  hs.wait = epf_wait_make(plan.timeout_ns, rec_d, NULL, 0);

  EX_CS(epf_route_update(&route, team, &plan, &rs, 0));
  EX_CS(epf_ht_dispatch(&route, team, &plan, &hs, d_topk, EPF_HT_SEND | EPF_HT_RECV, 0));
  if (plan.layout == EPF_LAYOUT_RANK_MAJOR) EX_CS(epf_ht_expand(&route, team, &plan, &hs, 0));
  ex_experts_kernel<<<dim3(64, (unsigned)R), 256>>>(route, plan, window, 0, d_view, d_view_scales, expert_rows, d_eo);
  EX_CK(cudaGetLastError());
  EX_CS(epf_ht_combine(&route, team, &plan, &hs, d_topk, 0));
  // example-end ht_round
  EX_CK(cudaDeviceSynchronize());

  /* ---- verify against the CPU reference ----------------------------------------------------- */
  epf_error_record_t rec;
  epf_error_read(rec_h, &rec);
  if (rec.status != 0 || rec.recv_overflow != 0) {
    fprintf(stderr, "error record: %s, peer %d, overflow %u\n", epf_status_name((epf_status_t)rec.status), rec.peer,
            rec.recv_overflow);
    return 1;
  }
  uint16_t* out = (uint16_t*)malloc((size_t)n * H * 2);
  EX_CK(cudaMemcpy(out, d_out, (size_t)n * H * 2, cudaMemcpyDeviceToHost));
  float* scratch = (float*)malloc((size_t)3 * H * 4);
  uint16_t* want = (uint16_t*)malloc((size_t)H * 2);
  const int64_t nver = o.verify_all || o.samples >= n ? n : o.samples;
  int64_t bad = 0;
  for (int64_t i = 0; i < nver; ++i) {
    const int64_t t = o.verify_all || o.samples >= n ? i : (int64_t)(ex_rand(&seed) % (uint64_t)n);
    ex_ref_combine(&plan, x + t * H, topk + t * K, w + t * K, scratch, want);
    if (memcmp(want, out + t * H, (size_t)H * 2) != 0) {
      if (bad < 5) {
        int h = 0;
        while (want[h] == out[t * H + h]) ++h;
        fprintf(stderr, "MISMATCH rank %lld token %lld h %d: got %04x want %04x\n", (long long)(t / T),
                (long long)(t % T), h, out[t * H + h], want[h]);
      }
      ++bad;
    }
  }
  printf("epfuse demo: %d virtual ranks on one GPU, T=%d H=%d top-%d of %d experts, %s, payload %s\n", R, T, H, K, E,
         o.layout == EPF_LAYOUT_RANK_MAJOR ? "rank-major" : "expert-major",
         o.payload == EPF_PAYLOAD_BF16 ? "bf16" : o.payload == EPF_PAYLOAD_MXFP8 ? "mxfp8" : "fp8-128");
  printf("verify: %lld of %lld tokens bit-exact vs CPU reference%s: %s\n", (long long)(nver - bad), (long long)nver,
         nver < n ? " (sample; --verify-all for all)" : "", bad ? "FAILED" : "OK");
  if (bad) return 1;

  /* ---- timing: copy ceiling, then route + dispatch + combine back to back --------------------- */
  const size_t cbytes = (size_t)1 << 30;
  void *ca, *cb;
  EX_CK(cudaMalloc(&ca, cbytes));
  EX_CK(cudaMalloc(&cb, cbytes));
  EX_CK(cudaMemset(ca, 1, cbytes));
  cudaEvent_t ev[4];
  for (int i = 0; i < 4; ++i) EX_CK(cudaEventCreate(&ev[i]));
  const int it = o.iters + 3;
  float* tc = (float*)malloc(sizeof(float) * it * 4);
  float *tr = tc + it, *td = tc + 2 * it, *tx = tc + 3 * it;
  for (int i = 0; i < it; ++i) {
    EX_CK(cudaEventRecord(ev[0]));
    EX_CK(cudaMemcpyAsync(cb, ca, cbytes, cudaMemcpyDeviceToDevice));
    EX_CK(cudaEventRecord(ev[1]));
    EX_CK(cudaEventSynchronize(ev[1]));
    EX_CK(cudaEventElapsedTime(&tc[i], ev[0], ev[1]));
  }
  for (int i = 0; i < it; ++i) {
    EX_CK(cudaEventRecord(ev[0]));
    EX_CS(epf_route_update(&route, team, &plan, &rs, 0));
    EX_CK(cudaEventRecord(ev[1]));
    EX_CS(epf_ht_dispatch(&route, team, &plan, &hs, d_topk, EPF_HT_SEND | EPF_HT_RECV, 0));
    if (plan.layout == EPF_LAYOUT_RANK_MAJOR) EX_CS(epf_ht_expand(&route, team, &plan, &hs, 0));
    EX_CK(cudaEventRecord(ev[2]));
    EX_CS(epf_ht_combine(&route, team, &plan, &hs, d_topk, 0));
    EX_CK(cudaEventRecord(ev[3]));
    EX_CK(cudaEventSynchronize(ev[3]));
    EX_CK(cudaEventElapsedTime(&tr[i], ev[0], ev[1]));
    EX_CK(cudaEventElapsedTime(&td[i], ev[1], ev[2]));
    EX_CK(cudaEventElapsedTime(&tx[i], ev[2], ev[3]));
  }
  epf_error_read(rec_h, &rec);
  qsort(tc + 3, o.iters, 4, cmp_f);
  qsort(tr + 3, o.iters, 4, cmp_f);
  qsort(td + 3, o.iters, 4, cmp_f);
  qsort(tx + 3, o.iters, 4, cmp_f);
  const int mid = 3 + o.iters / 2;
  const double us_copy = tc[mid] * 1e3, us_r = tr[mid] * 1e3, us_d = td[mid] * 1e3, us_c = tx[mid] * 1e3;
  const double copy_bw = 2.0 * (double)cbytes / (us_copy * 1e3); /* GB/s, read + write */
  /* HBM bytes each stage must move at least (read once + write once), as in bench_ht:
   * dispatch reads x and writes every received row (+ scales, metadata); combine reads every
   * expert output, writes the travelling row, reads it back and writes one BF16 row per token. */
  const double d_moved = (double)n * H * 2 + (double)all_rows * (plan.row_bytes + plan.scale_bytes_per_row + plan.meta_bytes_per_row);
  const double c_moved = (double)all_rows * plan.combine_row_bytes + (double)n * H * 2 + (double)all_rows * (2.0 * H + plan.combine_row_bytes);
  printf("| stage | us | GB moved | GB/s | of copy ceiling |\n");
  printf("| --- | ---: | ---: | ---: | ---: |\n");
  printf("| copy ceiling (D2D, 1 GiB) | %.1f | %.2f | %.0f | 100%% |\n", us_copy, 2.0 * cbytes / 1e9, copy_bw);
  printf("| route update | %.1f | | | |\n", us_r);
  printf("| dispatch%s | %.1f | %.2f | %.0f | %.0f%% |\n", plan.layout == EPF_LAYOUT_RANK_MAJOR ? " + expand" : "", us_d,
         d_moved / 1e9, d_moved / (us_d * 1e3), 100.0 * d_moved / (us_d * 1e3) / copy_bw);
  printf("| combine | %.1f | %.2f | %.0f | %.0f%% |\n", us_c, c_moved / 1e9, c_moved / (us_c * 1e3),
         100.0 * c_moved / (us_c * 1e3) / copy_bw);
  printf("(median of %d; virtual ranks: every byte is an HBM byte of this GPU; errors: %s)\n", o.iters,
         epf_status_name((epf_status_t)rec.status));
  return rec.status == 0 ? 0 : 1;
}
