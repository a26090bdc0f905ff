/* 10_stage_timing — each stage of one round of an 8-rank EP team on ONE GPU (virtual ranks) timed,
 * and set against a device-to-device copy measured in the same run: a table of microseconds, bytes
 * moved, GB/s and the fraction of the copy ceiling. The round is first run once with the expert
 * stage and its output checked bit for bit (as in 01_virtual_ranks / 07_low_latency).
 *
 * Learning objectives
 *   - Time communication stages without a host gap: every iteration's stages are enqueued back to
 *     back with an event before the first stage and after every stage, one sync at the end; medians
 *     after EX_WARMUP iterations.
 *   - HT (--mode ht, the default): route update, dispatch (+ expand for rank-major), combine, the
 *     way tests/bench/bench_ht.cu runs them (no expert stage in the timed loop: the combine reads
 *     the expert outputs of the checked round). Every update advances the epochs on the device.
 *   - LL (--mode ll): dispatch and combine, each one captured CUDA graph replayed (the way a decode
 *     step runs them; tests/bench/bench_ll.cu), one combine per dispatch so the halves stay in
 *     lockstep.
 *   - The byte convention of docs/performance.md (the HT convention in both modes): what a stage
 *     must read and write once; the combine counts the expert-output pass only when the outputs
 *     travel (HT, LL push).
 * Performance notes: with virtual ranks all traffic is HBM traffic on one GPU, so the numbers are
 *   HBM numbers, not NVLink numbers; the copy ceiling of the same run is their yardstick. For the
 *   library's benchmarks (shapes, sweeps, CSV) see tests/bench (EPF_BUILD_BENCHMARKS=ON).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epfuse/epfuse.cuh"
#include "epfuse/ht/kernels.cuh"
#include "epfuse/ll/kernels.cuh"
#include "ex_ll.h"

#define EX_WARMUP 3 /* timed iterations that do not count */

static const char* usage =
    "[--mode ht|ll] [--ranks 8] [--tokens 4096 (ht) | 128 (ll)] [--hidden 7168] [--topk 8]\n"
    "          [--experts 256] [--layout em|rm] [--payload bf16|mxfp8|fp8] [--push] [--iters 20]\n"
    "          [--samples 512 | --verify-all] [--seed N] [--ctest]\n"
    "  One round of an R-rank EP team as virtual ranks on one GPU, checked bit for bit against a CPU\n"
    "  reference on --samples tokens, then --iters rounds without the expert stage timed stage by\n"
    "  stage against a 1 GiB device-to-device copy measured in the same run.\n"
    "  --mode ht: route update, dispatch, combine (4096 tokens per rank); --mode ll: dispatch and\n"
    "  combine as CUDA graphs (128 tokens per rank; --push: the MXFP8 expert-major combine pushes).\n"
    "  --ctest: exit 77 instead of 1 also when a GPU is there but unusable (a driver too old); with no\n"
    "           CUDA driver or no GPU at all the exit code is 77 either way (CTest reports \"Not Run\").\n";

/* ---- timing: stages back to back, medians, the copy ceiling, the table ------------------------ */

/* One timed stage of a mode: enqueue stage `stage` of the round on stream s. */
typedef void (*stage_fn_t)(void* ctx, int stage, cudaStream_t s);

/* time_stages — `it` iterations of stages 0 .. nst-1, enqueued back to back on s with an event
 * before the first stage and after every stage (no host gap inside the timed region), one sync at
 * the end. t[stage * it + i]: milliseconds of `stage` in iteration i. */
static void time_stages(int it, int nst, stage_fn_t run, void* ctx, cudaStream_t s, float* t) {
  const int nev = it * (nst + 1);
  cudaEvent_t* ev = (cudaEvent_t*)malloc(sizeof(cudaEvent_t) * (size_t)nev);
  for (int i = 0; i < nev; ++i) EX_CK(cudaEventCreate(&ev[i]));
  for (int i = 0; i < it; ++i) {
    EX_CK(cudaEventRecord(ev[i * (nst + 1)], s));
    for (int st = 0; st < nst; ++st) {
      run(ctx, st, s);
      EX_CK(cudaEventRecord(ev[i * (nst + 1) + st + 1], s));
    }
  }
  EX_CK(cudaStreamSynchronize(s));
  for (int i = 0; i < it; ++i)
    for (int st = 0; st < nst; ++st)
      EX_CK(cudaEventElapsedTime(&t[st * it + i], ev[i * (nst + 1) + st], ev[i * (nst + 1) + st + 1]));
  for (int i = 0; i < nev; ++i) EX_CK(cudaEventDestroy(ev[i]));
  free(ev);
}

static int cmp_f(const void* a, const void* b) {
  const float x = *(const float*)a, y = *(const float*)b;
  return x < y ? -1 : x > y;
}

/* median of the timed iterations t[EX_WARMUP .. EX_WARMUP + iters), in microseconds */
static double median_us(float* t, int iters) {
  qsort(t + EX_WARMUP, (size_t)iters, sizeof(float), cmp_f);
  return t[EX_WARMUP + iters / 2] * 1e3;
}

/* the copy ceiling: a D2D copy of EX_COPY_BYTES, timed like the stages */
#define EX_COPY_BYTES ((size_t)1 << 30)
typedef struct {
  void *a, *b;
} copy_ctx_t;
static void copy_stage(void* ctx, int stage, cudaStream_t s) {
  const copy_ctx_t* c = (const copy_ctx_t*)ctx;
  (void)stage;
  EX_CK(cudaMemcpyAsync(c->b, c->a, EX_COPY_BYTES, cudaMemcpyDeviceToDevice, s));
}
static double copy_ceiling_us(int iters, cudaStream_t s) {
  const int it = iters + EX_WARMUP;
  copy_ctx_t c;
  float* t = (float*)malloc(sizeof(float) * (size_t)it);
  EX_CK(cudaMalloc(&c.a, EX_COPY_BYTES));
  EX_CK(cudaMalloc(&c.b, EX_COPY_BYTES));
  EX_CK(cudaMemset(c.a, 1, EX_COPY_BYTES));
  EX_CK(cudaDeviceSynchronize()); /* the memset runs on the legacy stream, the timed copies on s */
  time_stages(it, 1, copy_stage, &c, s, t);
  const double us = median_us(t, iters);
  EX_CK(cudaFree(c.a));
  EX_CK(cudaFree(c.b));
  free(t);
  return us;
}

/* HBM bytes each stage must move at least (read once + write once), as in bench_ht: dispatch
 * reads x once per token and writes every received row (+ scales, metadata); combine reads every
 * returned row and writes one BF16 row per token, and when the expert outputs travel (an
 * expert-output buffer that the combine copies: HT here, LL push) also reads every expert output
 * and writes the travelling row. rows: received rows (copies) over all ranks; n: tokens. */
static void stage_bytes(const epf_plan_t* plan, int64_t n, int64_t rows, int travels, double* d_moved,
                        double* c_moved) {
  const double H = plan->hidden;
  *d_moved = (double)n * H * 2 + (double)rows * (plan->row_bytes + plan->scale_bytes_per_row + plan->meta_bytes_per_row);
  *c_moved = (double)rows * plan->combine_row_bytes + (double)n * H * 2 +
             (travels ? (double)rows * (2.0 * H + plan->combine_row_bytes) : 0.0);
}

/* the table: copy ceiling, then each stage (moved < 0: a stage without a byte count) */
typedef struct {
  const char* name;
  double us, moved;
} row_t;
static void print_table(double us_copy, const row_t* rows, int nrows, int iters, const char* how,
                        const epf_error_record_t* rec_h) {
  epf_error_record_t rec;
  const double copy_bw = 2.0 * (double)EX_COPY_BYTES / (us_copy * 1e3); /* GB/s, read + write */
  epf_error_read(rec_h, &rec);
  printf("| stage | us | GB moved | GB/s | of copy ceiling |\n");
  printf("| --- | ---: | ---: | ---: | ---: |\n");
  printf("| copy ceiling (D2D, 1 GiB) | %.1f | %.2f | %.0f | 100%% |\n", us_copy, 2.0 * EX_COPY_BYTES / 1e9, copy_bw);
  for (int i = 0; i < nrows; ++i) {
    if (rows[i].moved < 0) {
      printf("| %s | %.1f | | | |\n", rows[i].name, rows[i].us);
      continue;
    }
    printf("| %s | %.1f | %.2f | %.0f | %.0f%% |\n", rows[i].name, rows[i].us, rows[i].moved / 1e9,
           rows[i].moved / (rows[i].us * 1e3), 100.0 * rows[i].moved / (rows[i].us * 1e3) / copy_bw);
  }
  printf("(median of %d%s; virtual ranks: every byte is an HBM byte of this GPU; errors: %s)\n", iters, how,
         epf_status_name((epf_status_t)rec.status));
}

/* ---- --mode ht ------------------------------------------------------------------------------ */

typedef struct {
  const epf_route_t* route;
  epf_team_t team;
  const epf_plan_t* plan;
  const epf_route_step_t* rs;
  const epf_ht_step_t* hs;
  const void* topk;
} ht_ctx_t;

static void ht_stage(void* ctx, int stage, cudaStream_t s) {
  const ht_ctx_t* c = (const ht_ctx_t*)ctx;
  if (stage == 0) {
    EX_CS(epf_route_update(c->route, c->team, c->plan, c->rs, s));
  } else if (stage == 1) {
    EX_CS(epf_ht_dispatch(c->route, c->team, c->plan, c->hs, c->topk, EPF_HT_BOTH, s));
    if (c->plan->layout == EPF_LAYOUT_RANK_MAJOR) EX_CS(epf_ht_expand(c->route, c->team, c->plan, c->hs, s));
  } else {
    EX_CS(epf_ht_combine(c->route, c->team, c->plan, c->hs, c->topk, s));
  }
}

static int run_ht(const ex_opts_t* o, const ex_inputs_t* in, uint64_t* seed) {
  const int R = o->R, T = o->T;
  const int64_t n = (int64_t)R * T;
  int64_t all_rows, max_rows, max_copies;
  ex_ht_rows(o, in, &all_rows, &max_rows, &max_copies);
  epf_plan_t plan; /* the plan, team, buffers and step of 01_virtual_ranks (ex_vranks.h, ex_common.h) */
  ex_ht_plan_make(o, max_rows, &plan);
  ex_vteam_t v;
  ex_vteam_make(&plan, &v);
  ex_ht_bufs_t b;
  ex_ht_bufs_make(o, in, &plan, max_copies, &b);
  epf_route_step_t rs = epf_route_step_make(b.topk, T, epf_wait_make(plan.timeout_ns, b.rec_d, NULL, 0));
  epf_ht_step_t hs = ex_ht_step_make(&plan, &b);

  /* ---- one round with the expert stage, checked ------------------------------------------------ */
  EX_CS(epf_route_update(&v.route, v.team, &plan, &rs, 0));
  EX_CS(epf_ht_dispatch(&v.route, v.team, &plan, &hs, b.topk, EPF_HT_BOTH, 0));
  if (plan.layout == EPF_LAYOUT_RANK_MAJOR) EX_CS(epf_ht_expand(&v.route, v.team, &plan, &hs, 0));
  ex_experts_kernel<<<dim3(64, (unsigned)R), 256>>>(v.route, plan, v.window, 0, b.view, b.view_scales, b.expert_rows, b.eo);
  EX_CK(cudaGetLastError());
  EX_CS(epf_ht_combine(&v.route, v.team, &plan, &hs, b.topk, 0));
  EX_CK(cudaDeviceSynchronize());
  if (ex_record_check(b.rec_h)) return 1;
  if (ex_verify_out(o, &plan, in, b.out, seed, o->layout == EPF_LAYOUT_RANK_MAJOR ? "rank-major" : "expert-major"))
    return 1;

  /* ---- timing: copy ceiling, then route + dispatch + combine back to back --------------------- */
  const int it = o->iters + EX_WARMUP;
  const double us_copy = copy_ceiling_us(o->iters, 0);
  float* t = (float*)malloc(sizeof(float) * (size_t)it * 3);
  ht_ctx_t ctx = {&v.route, v.team, &plan, &rs, &hs, b.topk};
  time_stages(it, 3, ht_stage, &ctx, 0, t);
  double d_moved, c_moved;
  stage_bytes(&plan, n, all_rows, 1, &d_moved, &c_moved);
  const row_t table[3] = {
      {"route update", median_us(t, o->iters), -1.0},
      {plan.layout == EPF_LAYOUT_RANK_MAJOR ? "dispatch + expand" : "dispatch", median_us(t + it, o->iters), d_moved},
      {"combine", median_us(t + 2 * it, o->iters), c_moved}};
  print_table(us_copy, table, 3, o->iters, "", b.rec_h);
  free(t);
  return ex_record_check(b.rec_h);
}

/* ---- --mode ll ------------------------------------------------------------------------------ */

typedef struct {
  cudaGraphExec_t g[2]; /* dispatch, combine */
} ll_ctx_t;

static void ll_stage(void* ctx, int stage, cudaStream_t s) {
  EX_CK(cudaGraphLaunch(((const ll_ctx_t*)ctx)->g[stage], s));
}

static int run_ll(const ex_opts_t* o, const epf_plan_t* ll_plan, const ex_inputs_t* in, uint64_t* seed) {
  const int R = o->R, T = o->T;
  const int64_t n = (int64_t)R * T;
  const epf_plan_t plan = *ll_plan;
  int64_t all_rows, rm_rows;
  int32_t* want_counts = ex_ll_want_counts(o, in, &all_rows, &rm_rows); /* the copies of this routing */
  char* window; /* the window, team, buffers and arguments of 07_low_latency (ex_ll.h) */
  const epf_team_t team = ex_ll_window_make(&plan, &window);
  const int rm = plan.layout == EPF_LAYOUT_RANK_MAJOR;
  const int in_place = !rm && plan.payload == EPF_PAYLOAD_BF16;
  const int y_layout = ex_ll_y_layout(&plan);
  const int pulls = epf_ll_combine_pulls(&plan, y_layout);
  ex_ll_bufs_t b;
  ex_ll_bufs_make(o, in, &plan, !in_place, &b);
  epf_ll_launch_t L = epf_ll_launch_make(&plan, team, b.state, b.rec_d, /*virtual_ranks=*/1);
  EX_CS(epf_ll_state_reset(&L, 0));
  epf_ll_dispatch_args_t da;
  epf_ll_combine_args_t ca;
  ex_ll_args_make(o, &b, y_layout, &da, &ca);

  /* ---- one round with the expert stage, checked ------------------------------------------------ */
  EX_CS(epf_ll_dispatch(&L, &da, EPF_LL_BOTH, 0));
  if (!rm)
    ex_ll_experts_kernel<<<dim3(64, (unsigned)R), 256>>>(plan, window, b.round, b.counts, b.y);
  else
    ex_ll_rm_experts_kernel<<<dim3(64, (unsigned)R), 256>>>(plan, b.view, b.view_scales, b.counts, b.y);
  EX_CK(cudaGetLastError());
  EX_CS(epf_ll_combine(&L, &ca, EPF_LL_BOTH, 0));
  EX_CK(cudaDeviceSynchronize());
  if (ex_record_check(b.rec_h) || ex_ll_check_counts(&plan, &b, want_counts, 1u)) return 1;
  free(want_counts);
  if (ex_verify_out(o, &plan, in, b.out, seed,
                    rm ? (pulls ? "low-latency rank-major (expand, pre-reduce, pull combine)"
                                : "low-latency rank-major (expand, pre-reduce, push combine)")
                    : in_place ? "low-latency expert-major (y in place, pull combine)"
                    : plan.combine_payload == EPF_PAYLOAD_MXFP8
                        ? (pulls ? "low-latency expert-major (y fixed buffer, MXFP8 pull combine)"
                                 : "low-latency expert-major (y fixed buffer, MXFP8 push combine)")
                        : "low-latency expert-major (y fixed buffer, push combine)"))
    return 1;

  /* ---- timing: copy ceiling, then dispatch + combine, each one captured CUDA graph ------------ */
  cudaStream_t s;
  EX_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g[2];
  ll_ctx_t ctx;
  EX_CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  EX_CS(epf_ll_dispatch(&L, &da, EPF_LL_BOTH, s));
  EX_CK(cudaStreamEndCapture(s, &g[0]));
  EX_CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  EX_CS(epf_ll_combine(&L, &ca, EPF_LL_BOTH, s));
  EX_CK(cudaStreamEndCapture(s, &g[1]));
  for (int i = 0; i < 2; ++i) EX_CK(cudaGraphInstantiate(&ctx.g[i], g[i], 0));
  const int it = o->iters + EX_WARMUP;
  const double us_copy = copy_ceiling_us(o->iters, s);
  float* t = (float*)malloc(sizeof(float) * (size_t)it * 2);
  time_stages(it, 2, ll_stage, &ctx, s, t); /* one combine per dispatch: the halves stay in lockstep */
  double d_moved, c_moved;
  stage_bytes(&plan, n, rm ? rm_rows : all_rows, !in_place, &d_moved, &c_moved);
  if (rm) { /* the expand reads each rank-major row and writes each view row (+ scales); the
             * pre-reduce reads every expert output once */
    d_moved += (double)rm_rows * (plan.row_bytes + plan.meta_bytes_per_row) + (double)all_rows * (plan.row_bytes + plan.scale_bytes_per_row);
    c_moved = (double)all_rows * 2.0 * plan.hidden + (double)rm_rows * 2.0 * plan.combine_row_bytes + (double)n * plan.hidden * 2;
  }
  const row_t table[2] = {{rm ? "dispatch + expand" : "dispatch", median_us(t, o->iters), d_moved},
                          {rm ? "combine (pre-reduce + sum)" : "combine", median_us(t + it, o->iters), c_moved}};
  print_table(us_copy, table, 2, o->iters, " CUDA-graph replays", b.rec_h);
  free(t);
  for (int i = 0; i < 2; ++i) {
    EX_CK(cudaGraphExecDestroy(ctx.g[i]));
    EX_CK(cudaGraphDestroy(g[i]));
  }
  EX_CK(cudaStreamDestroy(s));
  return ex_record_check(b.rec_h);
}

int main(int argc, char** argv) {
  ex_opts_t o;
  if (ex_opts_parse(argc, argv, EPF_MODE_HT, EX_OPT_MODE | EX_OPT_PUSH | EX_OPT_ITERS, usage, &o)) return 2;
  epf_plan_t ll_plan;
  if (o.mode == EPF_MODE_LL) { /* refuse what LL cannot run before touching the GPU */
    const epf_status_t st = ex_ll_plan_make(&o, &ll_plan);
    if (st != EPF_OK) {
      fprintf(stderr, "--mode ll%s: %s: %s\n", o.layout == EPF_LAYOUT_RANK_MAJOR ? " --layout rm" : "",
              epf_status_name(st), epf_status_message(st));
      return 2;
    }
  }
  ex_gpu_or_exit(1, o.ctest);
  uint64_t seed = o.seed;
  ex_inputs_t in;
  ex_make_inputs(&o, &seed, &in);
  return o.mode == EPF_MODE_LL ? run_ll(&o, &ll_plan, &in, &seed) : run_ht(&o, &in, &seed);
}
