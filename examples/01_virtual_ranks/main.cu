/* 01_virtual_ranks — a whole 8-rank EP team on ONE GPU: route, dispatch, experts, combine.
 *
 * Learning objectives
 *   - Plan a window with host.h (epf_plan_compute) and give every virtual rank its own slice of
 *     one cudaMalloc: epf_team_virtual(window, plan.total_bytes, 0, R).
 *   - Run one high-throughput (HT, --mode ht, the default) round with the ready-made launchers:
 *     epf_route_update (count exchange, slots, offsets) -> epf_ht_dispatch (rows into their final
 *     slots, quantized on the way for MXFP8 / FP8) -> [epf_ht_expand for rank-major] -> your
 *     experts -> epf_ht_combine (weighted FP32 reduction in k order, BF16 out).
 *   - Or one low-latency (LL, --mode ll) round, the decode-time path (ll/kernels.cuh): no route
 *     update (every (expert, source) pair has fixed receive slots, so nothing is exchanged before
 *     the rows move): epf_ll_dispatch (send + receive fused, all R ranks in one launch; rows stay
 *     in the window, zero copy) -> your experts (they find the round's parity in the dispatch's
 *     `round` output, on the device) -> epf_ll_combine (k-order FP32 reduction, BF16 out; with the
 *     BF16 payload the experts overwrite their inputs and the sources PULL the outputs,
 *     EPF_LL_Y_IN_PLACE_PULL; quantized payloads write y to a caller buffer, EPF_LL_Y_FIXED: with
 *     --payload mxfp8 the combine carries MXFP8 too and the sources PULL it (the expert side
 *     quantizes y into its own window), --push makes it push; per-128 FP8 pushes BF16 rows).
 *   - Check the result bit for bit against a CPU reference (examples/common/ex_common.h): the
 *     same reference and the same checks for both modes.
 *   - --backward (HT, BF16): the training direction on the forward's route, no route update:
 *     epf_ht_combine_backward (dy into the very receive rows) -> [epf_ht_expand] -> the experts'
 *     backward (dx rows and each row's router-weight gradient dot(dy, y)) ->
 *     epf_ht_dispatch_backward (dx per token, unit weights; topk_weights_grad), checked bit for bit.
 *   - --mode ll --backward: then the training direction for the same routing (run_ll_backward):
 *     epf_ll_combine_backward (a dispatch of dy; each row's metadata weight is its combine weight)
 *     -> the experts' backward -> epf_ll_dispatch_backward (unit weights, repeats add nothing).
 *     BF16; both layouts (--layout rm: a rank-major dispatch of dy expanded into the view, the
 *     experts' backward over the view, a unit-weight pre-reduce per (token, rank)).
 * Key concepts: virtual ranks (docs/concepts.md), the plan's regions (docs/layouts.md), epochs
 *   (every launch reads its epoch on the device, so a round is graph-capturable), caller-owned
 *   state (epf_ht_state_t zeroed once; epf_ll_state_t set by epf_ll_state_reset), the error record
 *   (host-mapped, read without a sync). LL: fixed slots [2 parity][local expert][source][T]
 *   (expert-major), or with --layout rm one copy per (token, rank) in [2 parity][source][T] rows,
 *   expanded by the receive half into the same expert-major view the experts read, and a
 *   pre-reduced partial per (token, rank) on the way back (docs/low-latency.md).
 * When to use it: to develop and test MoE kernels with every protocol path exercised but no
 *   cluster; to measure the kernels' HBM efficiency (every "link" byte is an HBM byte here).
 * Performance notes: with virtual ranks all traffic is HBM traffic on one GPU, so the table
 *   compares each stage's bytes with a device-to-device copy measured in the same run; the numbers
 *   are not NVLink numbers. Timed iterations run the round without the expert stage (HT: route +
 *   dispatch + combine, like tests/bench/bench_ht.cu; LL: dispatch + combine, each one captured
 *   CUDA graph, like tests/bench/bench_ll.cu), enqueued back to back with an event between every
 *   two stages; the bytes follow the HT convention of docs/performance.md in both modes.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epfuse/epfuse.cuh"
#include "epfuse/ht/kernels.cuh"
#include "epfuse/ll/kernels.cuh"
#include "ex_common.h"

#define EX_WARMUP 3 /* timed iterations that do not count */

typedef struct {
  int mode, R, T, H, K, E, layout, payload, iters, verify_all, samples, ctest, push;
  uint64_t seed;
  int backward; /* --backward: the training direction after the forward round */
} opts_t;

static void usage(const char* argv0) {
  printf("usage: %s [--mode ht|ll] [--ranks 8] [--tokens 4096 (ht) | 128 (ll)] [--hidden 7168]\n"
         "          [--topk 8] [--experts 256] [--layout em|rm] [--payload bf16|mxfp8|fp8] [--iters 20]\n"
         "          [--samples 512 | --verify-all] [--seed N] [--push] [--backward] [--ctest]\n"
         "  An R-rank EP team as virtual ranks on one GPU: dispatch -> experts (a per-expert scale) ->\n"
         "  combine, checked bit for bit against a CPU reference on --samples tokens (all tokens with\n"
         "  --verify-all), then timed.\n"
         "  --mode ht: high-throughput (default): route update, dispatch, experts, combine; 4096 tokens.\n"
         "  --mode ll: low-latency (decode): fixed-slot dispatch, experts, combine; 128 tokens per rank;\n"
         "             --layout rm: one copy per (token, rank) + expand, pre-reduced combine; prints the\n"
         "             bytes it saves against expert-major. --payload mxfp8: MXFP8 both ways; expert-major\n"
         "             pulls the combine (the default) or, with --push, pushes; rank-major pushes it.\n"
         "  --ctest: exit 77 instead of 1 also when a GPU is there but unusable (a driver too old); with no\n"
         "           CUDA driver or no GPU at all the exit code is 77 either way (CTest reports \"Not Run\").\n"
         "  --backward (BF16): after the forward round, the training direction on the same routing:\n"
         "             ht: epf_ht_combine_backward (dy into the receive rows) -> [expand] -> the experts'\n"
         "             backward -> epf_ht_dispatch_backward (dx and the router-weight gradient);\n"
         "             ll (both layouts): epf_ll_combine_backward -> experts' backward ->\n"
         "             epf_ll_dispatch_backward; checked bit for bit like the forward.\n",
         argv0);
}

static int parse(int argc, char** argv, opts_t* o) {
  o->mode = EPF_MODE_HT; o->R = 8; o->T = -1; o->H = 7168; o->K = 8; o->E = 256;
  o->layout = EPF_LAYOUT_EXPERT_MAJOR; o->payload = EPF_PAYLOAD_BF16;
  o->iters = 20; o->verify_all = 0; o->samples = 512; o->ctest = 0; o->seed = 12345; o->backward = 0; o->push = 0;
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
    if (!strcmp(a, "--backward")) { o->backward = 1; continue; }
    if (!strcmp(a, "--push")) { o->push = 1; continue; }
    if (!strcmp(a, "--mode") && v) {
      ++i;
      if (!strcmp(v, "ht")) o->mode = EPF_MODE_HT;
      else if (!strcmp(v, "ll")) o->mode = EPF_MODE_LL;
      else {
        fprintf(stderr, "--mode %s: ht (high-throughput) or ll (low-latency)\n", v);
        return 2;
      }
      continue;
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
  if (o->T == -1) o->T = o->mode == EPF_MODE_LL ? 128 : 4096; /* decode vs prefill batch per rank */
  if (o->R < 1 || o->T < 1 || o->K < 1 || o->E < o->R || o->E % o->R || o->iters < 1) return 2;
  return 0;
}

/* ============================================================================================ */
/* Shared by both modes: inputs, error record, verification, timing, the table                   */
/* ============================================================================================ */

static const char* payload_name(int p) {
  return p == EPF_PAYLOAD_BF16 ? "bf16" : p == EPF_PAYLOAD_MXFP8 ? "mxfp8" : "fp8-128";
}

/* host inputs, packed per virtual rank: x [R][T][H] BF16, topk [R][T][K] int32, w [R][T][K] */
typedef struct {
  uint16_t* x;
  int32_t* topk;
  float* w;
} inputs_t;

/* BF16 rows, K distinct random experts per token (repeats only if K > E), weights; from *seed */
static void make_inputs(const opts_t* o, uint64_t* seed, inputs_t* in) {
  const int H = o->H, K = o->K, E = o->E;
  const int64_t n = (int64_t)o->R * o->T;
  in->x = (uint16_t*)malloc((size_t)n * H * 2);
  in->topk = (int32_t*)malloc((size_t)n * K * 4);
  in->w = (float*)malloc((size_t)n * K * 4);
  if (!in->x || !in->topk || !in->w) {
    fprintf(stderr, "out of host memory for the inputs\n");
    exit(1);
  }
  for (int64_t i = 0; i < n * H; ++i) {
    const uint64_t r = ex_rand(seed);
    in->x[i] = ex_bf16_rne((float)((int64_t)(r % 20001) - 10000) / 1000.0f);
  }
  for (int64_t t = 0; t < n; ++t)
    for (int k = 0; k < K; ++k) {
      int e, dup;
      do {
        e = (int)(ex_rand(seed) % (uint64_t)E);
        dup = 0;
        for (int j = 0; j < k; ++j) dup |= in->topk[t * K + j] == e;
      } while (dup && K <= E);
      in->topk[t * K + k] = e;
      in->w[t * K + k] = (float)(ex_rand(seed) % 1000) / 997.0f;
    }
}

/* copy the inputs into fresh device buffers of the same [R][T][...] layout */
static void upload_inputs(const opts_t* o, const inputs_t* in, void** d_x, void** d_topk, float** d_w) {
  const int64_t n = (int64_t)o->R * o->T;
  EX_CK(cudaMalloc(d_topk, (size_t)n * o->K * 4));
  EX_CK(cudaMalloc((void**)d_w, (size_t)n * o->K * 4));
  EX_CK(cudaMalloc(d_x, (size_t)n * o->H * 2));
  EX_CK(cudaMemcpy(*d_topk, in->topk, (size_t)n * o->K * 4, cudaMemcpyHostToDevice));
  EX_CK(cudaMemcpy(*d_w, in->w, (size_t)n * o->K * 4, cudaMemcpyHostToDevice));
  EX_CK(cudaMemcpy(*d_x, in->x, (size_t)n * o->H * 2, cudaMemcpyHostToDevice));
}

/* the host-mapped error record: the device writes it, the host reads it without a sync */
static void record_make(epf_error_record_t** rec_h, epf_error_record_t** rec_d) {
  EX_CK(cudaHostAlloc((void**)rec_h, sizeof(**rec_h), cudaHostAllocMapped));
  EX_CK(cudaHostGetDevicePointer((void**)rec_d, *rec_h, 0));
  epf_error_clear(*rec_h);
}

/* 0 when the record is clean; else print it and return 1 */
static int record_check(const epf_error_record_t* rec_h) {
  epf_error_record_t rec;
  epf_error_read(rec_h, &rec);
  if (rec.status != 0 || rec.recv_overflow != 0 || rec.dropped_routes != 0) {
    fprintf(stderr, "error record: %s, peer %d, overflow %u, dropped routes %u\n",
            epf_status_name((epf_status_t)rec.status), rec.peer, rec.recv_overflow, rec.dropped_routes);
    return 1;
  }
  return 0;
}

/* Compare the combine output d_out ([R][T][H] BF16) with ex_ref_combine on --samples tokens (all
 * with --verify-all; sampled tokens drawn from *seed). Prints the banner and the verdict; returns
 * the number of tokens that differ. */
static int64_t verify_out(const opts_t* o, const epf_plan_t* plan, const inputs_t* in, const void* d_out,
                          uint64_t* seed, const char* what) {
  const int T = o->T, H = o->H, K = o->K;
  const int64_t n = (int64_t)o->R * T;
  uint16_t* out = (uint16_t*)malloc((size_t)n * H * 2);
  float* scratch = (float*)malloc((size_t)3 * H * 4);
  uint16_t* want = (uint16_t*)malloc((size_t)H * 2);
  EX_CK(cudaMemcpy(out, d_out, (size_t)n * H * 2, cudaMemcpyDeviceToHost));
  const int64_t nver = o->verify_all || o->samples >= n ? n : o->samples;
  int64_t bad = 0;
  for (int64_t i = 0; i < nver; ++i) {
    const int64_t t = o->verify_all || o->samples >= n ? i : (int64_t)(ex_rand(seed) % (uint64_t)n);
    ex_ref_combine(plan, in->x + t * H, in->topk + t * K, in->w + t * K, scratch, want);
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
  printf("epfuse demo: %d virtual ranks on one GPU, T=%d H=%d top-%d of %d experts, %s, payload %s\n", o->R, T, H, K,
         o->E, what, payload_name(o->payload));
  printf("verify: %lld of %lld tokens bit-exact vs CPU reference%s: %s\n", (long long)(nver - bad), (long long)nver,
         nver < n ? " (sample; --verify-all for all)" : "", bad ? "FAILED" : "OK");
  free(out);
  free(scratch);
  free(want);
  return bad;
}

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

/* ============================================================================================ */
/* --mode ht                                                                                     */
/* ============================================================================================ */

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

/* ---- --backward: the training direction on the forward's route --------------------------------- */

/* ex_experts_backward_kernel — the demo experts' backward, over the rows ex_experts_kernel covers
 * (EXPERT_MAJOR: the receive region, where the backward of combine put dy; RANK_MAJOR: the expand
 * view of dy): dx = bf16(dy * f(le, rank)) (the expert is y = f * x; a real layer also scales dy by
 * the row's combine weight, the EXPERT_MAJOR metadata weight) into dx_rows, and the router-weight
 * gradient of the row, dot(dy, y) over the forward's output row y (expert_out, the same row
 * index), as one FP32 fma chain in h order, into wgrad. Grid (any, R). BF16 plans. */
// example-begin ht_experts_backward
__global__ void ex_experts_backward_kernel(epf_route_t route, epf_plan_t plan, const char* window, const uint16_t* view,
                                           const uint16_t* expert_out, int64_t expert_rows, uint16_t* dx_rows,
                                           float* wgrad) {
  const int rank = (int)blockIdx.y;
  const epf_route_segment_t* seg = (const epf_route_segment_t*)epf_route_ptr(&route, rank, EPF_ROUTE_RECV_SEGMENT);
  const char* base = window + (uint64_t)rank * plan.total_bytes;
  const int gw = (int)(blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)), nw = (int)(gridDim.x * (blockDim.x >> 5));
  for (int le = 0; le < plan.experts_per_rank; ++le) {
    const int64_t cap = plan.layout == EPF_LAYOUT_EXPERT_MAJOR ? plan.recv_capacity : expert_rows;
    int64_t end = seg[le].begin + seg[le].count;
    if (end > cap) end = cap;
    for (int64_t r = seg[le].begin + gw; r < end; r += nw) {
      const uint64_t i = (uint64_t)rank * expert_rows + r;
      const uint16_t* dy = plan.layout == EPF_LAYOUT_EXPERT_MAJOR
                               ? (const uint16_t*)(base + epf_plan_recv_token_offset(&plan, r))
                               : view + i * plan.hidden;
      ex_expert_row_warp(&plan, (const uint8_t*)dy, NULL, ex_expert_factor(le, rank), dx_rows + i * plan.hidden);
      if (epf_lane_id() == 0) { /* d w = dot(dy, y): one chain, h ascending (the reference's order) */
        const uint16_t* y = expert_out + i * plan.hidden;
        float acc = 0.f;
        for (int h = 0; h < plan.hidden; ++h) acc = __fmaf_rn(epf_bf16_to_float(dy[h]), epf_bf16_to_float(y[h]), acc);
        wgrad[i] = acc;
      }
    }
  }
}
// example-end ht_experts_backward

/* the CPU reference of one token's backward (BF16 plan): dx[H] and its K router-weight gradients
 * (the token's ids distinct, nothing dropped: every k has its own row). EXPERT_MAJOR: dx =
 * bf16(sum over k ascending of fma(1, bf16(dy * f_k), acc)); RANK_MAJOR: per rank in first-
 * occurrence order the same chain over its k, rounded to BF16, then summed with weight 1 in that
 * order. wg[k] = dot(dy, y_k), y_k = bf16(x * f_k), one fma chain in h order. Scratch 2 * H. */
static void ex_ref_backward(const epf_plan_t* p, const uint16_t* x, const uint16_t* dy, const int32_t* topk,
                            float* scratch, uint16_t* dx, float* wg) {
  const int H = p->hidden, K = p->top_k, EL = p->experts_per_rank;
  float* acc = scratch;
  float* part = scratch + H;
  int first[64], order[64], nd = 0;
  for (int h = 0; h < H; ++h) acc[h] = 0.f;
  for (int k = 0; k < K; ++k) {
    const int e = topk[k];
    const float f = ex_expert_factor(e % EL, e / EL);
    float a = 0.f;
    int seen = 0;
    first[k] = 1; /* a repeated id (K > E) adds nothing to dx; its d w equals its first occurrence's */
    for (int j = 0; j < k; ++j) first[k] &= topk[j] != e;
    for (int h = 0; h < H; ++h) a = fmaf(ex_bf16_f(dy[h]), ex_bf16_f(ex_bf16_rne(ex_bf16_f(x[h]) * f)), a);
    wg[k] = a;
    for (int j = 0; j < nd; ++j) seen |= order[j] == e / EL;
    if (!seen) order[nd++] = e / EL;
  }
  if (p->layout == EPF_LAYOUT_EXPERT_MAJOR) {
    for (int k = 0; k < K; ++k) {
      const float f = ex_expert_factor(topk[k] % EL, topk[k] / EL);
      if (first[k])
        for (int h = 0; h < H; ++h) acc[h] = fmaf(1.0f, ex_bf16_f(ex_bf16_rne(ex_bf16_f(dy[h]) * f)), acc[h]);
    }
  } else {
    for (int j = 0; j < nd; ++j) {
      for (int h = 0; h < H; ++h) part[h] = 0.f;
      for (int k = 0; k < K; ++k) {
        const float f = ex_expert_factor(topk[k] % EL, order[j]);
        if (first[k] && topk[k] / EL == order[j])
          for (int h = 0; h < H; ++h) part[h] = fmaf(1.0f, ex_bf16_f(ex_bf16_rne(ex_bf16_f(dy[h]) * f)), part[h]);
      }
      for (int h = 0; h < H; ++h) acc[h] = fmaf(1.0f, ex_bf16_f(ex_bf16_rne(part[h])), acc[h]);
    }
  }
  for (int h = 0; h < H; ++h) dx[h] = ex_bf16_rne(acc[h]);
}

/* run_ht_backward — after the forward round of run_ht (same route, no update in between): dy in,
 * the backward of combine, [expand], the experts' backward, the backward of dispatch; then dx and
 * topk_weights_grad checked on --samples tokens (all with --verify-all). 0 when they match. */
static int run_ht_backward(const opts_t* o, const inputs_t* in, uint64_t* seed, const epf_route_t* route, epf_team_t team,
                           const epf_plan_t* plan, const epf_ht_step_t* fwd, const void* d_topk, const char* window,
                           const epf_error_record_t* rec_h) {
  const int T = o->T, H = o->H, K = o->K, R = o->R;
  const int64_t n = (int64_t)R * T, xr = fwd->expert_rows;
  uint16_t* dy = (uint16_t*)malloc((size_t)n * H * 2);
  for (int64_t i = 0; i < n * H; ++i) {
    const uint64_t r = ex_rand(seed);
    dy[i] = ex_bf16_rne((float)((int64_t)(r % 20001) - 10000) / 4000.0f);
  }
  void *d_dy, *d_dx;
  uint16_t* d_dxr;
  float *d_wg, *d_twg;
  EX_CK(cudaMalloc(&d_dy, (size_t)n * H * 2));
  EX_CK(cudaMalloc(&d_dx, (size_t)n * H * 2));
  EX_CK(cudaMalloc(&d_dxr, (size_t)R * xr * H * 2));
  EX_CK(cudaMalloc(&d_wg, (size_t)R * xr * 4));
  EX_CK(cudaMalloc(&d_twg, (size_t)n * K * 4));
  EX_CK(cudaMemcpy(d_dy, dy, (size_t)n * H * 2, cudaMemcpyHostToDevice));
  EX_CK(cudaMemset(d_dx, 0xA7, (size_t)n * H * 2));
  EX_CK(cudaMemset(d_twg, 0xA7, (size_t)n * K * 4));

  // example-begin ht_backward
  epf_ht_step_t bs = *fwd;          /* the forward's step: weights, state, view, expert_rows, wait */
  bs.x = d_dy;                      /* [R][T][H] BF16: the gradient of the combine output */
  bs.topk_idx = d_topk;             /* the forward's ids (the backward launchers read them here) */
  bs.out = d_dx;                    /* [R][T][H] BF16: the gradient of the dispatch input */
  bs.expert_out = d_dxr;            /* the experts' dx rows, in the forward's expert_out order */
  bs.weight_grad = d_wg;            /* one FP32 per expert_out row: d w of that row */
  bs.topk_weights_grad = d_twg;     /* [R][T][K] FP32 out */
  EX_CS(epf_ht_combine_backward(route, team, plan, &bs, EPF_HT_BOTH, 0));
  if (plan->layout == EPF_LAYOUT_RANK_MAJOR) EX_CS(epf_ht_expand(route, team, plan, &bs, 0)); /* view of dy */
  ex_experts_backward_kernel<<<dim3(64, (unsigned)R), 256>>>(*route, *plan, window, (const uint16_t*)bs.em_view,
                                                              (const uint16_t*)fwd->expert_out, xr, d_dxr, d_wg);
  EX_CK(cudaGetLastError());
  EX_CS(epf_ht_dispatch_backward(route, team, plan, &bs, 0));
  // example-end ht_backward
  EX_CK(cudaDeviceSynchronize());
  if (record_check(rec_h)) return 1;

  uint16_t* dx = (uint16_t*)malloc((size_t)n * H * 2);
  float* twg = (float*)malloc((size_t)n * K * 4);
  float* scratch = (float*)malloc((size_t)2 * H * 4);
  uint16_t* want = (uint16_t*)malloc((size_t)H * 2);
  float wg[64];
  EX_CK(cudaMemcpy(dx, d_dx, (size_t)n * H * 2, cudaMemcpyDeviceToHost));
  EX_CK(cudaMemcpy(twg, d_twg, (size_t)n * K * 4, cudaMemcpyDeviceToHost));
  const int64_t nver = o->verify_all || o->samples >= n ? n : o->samples;
  int64_t bad = 0;
  for (int64_t i = 0; i < nver; ++i) {
    const int64_t t = o->verify_all || o->samples >= n ? i : (int64_t)(ex_rand(seed) % (uint64_t)n);
    ex_ref_backward(plan, in->x + t * H, dy + t * H, in->topk + t * K, scratch, want, wg);
    if (memcmp(want, dx + t * H, (size_t)H * 2) != 0 || memcmp(wg, twg + t * K, (size_t)K * 4) != 0) {
      if (bad < 5) fprintf(stderr, "BACKWARD MISMATCH rank %lld token %lld\n", (long long)(t / T), (long long)(t % T));
      ++bad;
    }
  }
  printf("backward: epf_ht_combine_backward -> %sexperts' backward -> epf_ht_dispatch_backward\n",
         plan->layout == EPF_LAYOUT_RANK_MAJOR ? "expand -> " : "");
  printf("verify backward: %lld of %lld tokens bit-exact (dx and router-weight gradients)%s: %s\n", (long long)(nver - bad),
         (long long)nver, nver < n ? " (sample; --verify-all for all)" : "", bad ? "FAILED" : "OK");
  free(dy);
  free(dx);
  free(twg);
  free(scratch);
  free(want);
  EX_CK(cudaFree(d_dy));
  EX_CK(cudaFree(d_dx));
  EX_CK(cudaFree(d_dxr));
  EX_CK(cudaFree(d_wg));
  EX_CK(cudaFree(d_twg));
  return bad != 0;
}

static int run_ht(opts_t o, const inputs_t* in, uint64_t* seed) {
  const int R = o.R, T = o.T, H = o.H, K = o.K, E = o.E, EL = E / R;
  const int64_t n = (int64_t)R * T;
  const int32_t* topk = in->topk;

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
  upload_inputs(&o, in, &d_x, &d_topk, &d_w);
  EX_CK(cudaMalloc(&d_out, (size_t)n * H * 2));
  EX_CK(cudaMalloc(&d_eo, (size_t)R * expert_rows * H * 2));
  if (o.layout == EPF_LAYOUT_RANK_MAJOR) {
    EX_CK(cudaMalloc(&d_view, (size_t)R * expert_rows * plan.row_bytes));
    if (plan.scale_bytes_per_row) EX_CK(cudaMalloc(&d_view_scales, (size_t)R * expert_rows * plan.scale_bytes_per_row));
  }
  EX_CK(cudaMalloc(&d_state, R * sizeof(epf_ht_state_t)));
  EX_CK(cudaMemset(d_state, 0, R * sizeof(epf_ht_state_t)));
  EX_CK(cudaMemset(d_out, 0xA7, (size_t)n * H * 2)); /* poison: a missed row cannot pass */
  epf_error_record_t *rec_h, *rec_d;
  record_make(&rec_h, &rec_d);

  // example-begin ht_round
  epf_route_step_t rs = epf_route_step_make(d_topk, T, epf_wait_make(plan.timeout_ns, rec_d, NULL, 0));
  epf_ht_step_t hs = EPF_HT_STEP_INIT;
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
  EX_CS(epf_ht_dispatch(&route, team, &plan, &hs, d_topk, EPF_HT_BOTH, 0));
  if (plan.layout == EPF_LAYOUT_RANK_MAJOR) EX_CS(epf_ht_expand(&route, team, &plan, &hs, 0));
  ex_experts_kernel<<<dim3(64, (unsigned)R), 256>>>(route, plan, window, 0, d_view, d_view_scales, expert_rows, d_eo);
  EX_CK(cudaGetLastError());
  EX_CS(epf_ht_combine(&route, team, &plan, &hs, d_topk, 0));
  // example-end ht_round
  EX_CK(cudaDeviceSynchronize());

  /* ---- verify against the CPU reference ----------------------------------------------------- */
  if (record_check(rec_h)) return 1;
  if (verify_out(&o, &plan, in, d_out, seed, o.layout == EPF_LAYOUT_RANK_MAJOR ? "rank-major" : "expert-major"))
    return 1;
  if (o.backward && run_ht_backward(&o, in, seed, &route, team, &plan, &hs, d_topk, window, rec_h)) return 1;

  /* ---- timing: copy ceiling, then route + dispatch + combine back to back --------------------- */
  const int it = o.iters + EX_WARMUP;
  const double us_copy = copy_ceiling_us(o.iters, 0);
  float* t = (float*)malloc(sizeof(float) * (size_t)it * 3);
  ht_ctx_t ctx = {&route, team, &plan, &rs, &hs, d_topk};
  time_stages(it, 3, ht_stage, &ctx, 0, t);
  double d_moved, c_moved;
  stage_bytes(&plan, n, all_rows, 1, &d_moved, &c_moved);
  const row_t table[3] = {
      {"route update", median_us(t, o.iters), -1.0},
      {plan.layout == EPF_LAYOUT_RANK_MAJOR ? "dispatch + expand" : "dispatch", median_us(t + it, o.iters), d_moved},
      {"combine", median_us(t + 2 * it, o.iters), c_moved}};
  print_table(us_copy, table, 3, o.iters, "", rec_h);
  free(t);
  return record_check(rec_h);
}

/* ============================================================================================ */
/* --mode ll                                                                                     */
/* ============================================================================================ */

/* The LL plan of the options. Nothing to budget: every (local expert, source) pair owns T fixed
 * receive slots per parity ([2][EL][R][T] rows per rank; recv_capacity stays 0 = one parity), or
 * with --layout rm every source T rows ([2][R][T]). --payload mxfp8 quantizes both ways: an
 * expert-major combine then pulls by default (the plan gets an EXPERT_OUT region, where the expert
 * side quantizes y), or pushes with --push (EPF_FLAG_COMBINE_PUSH, no EXPERT_OUT); a rank-major
 * one pushes its pre-reduced partials either way. Checked with epf_ll_plan_check. Host only,
 * pure: runs before the GPU check. */
static epf_status_t ll_plan_make(const opts_t* o, epf_plan_t* plan) {
  epf_config_t cfg = EPF_CONFIG_INIT;
  cfg.nranks = o->R;
  cfg.num_experts = o->E;
  cfg.top_k = o->K;
  cfg.hidden = o->H;
  cfg.max_tokens_per_rank = o->T;
  cfg.mode = EPF_MODE_LL;
  cfg.layout = o->layout;
  cfg.payload = o->payload; /* quantized by the sender, once per token, for MXFP8 / FP8 */
  cfg.combine_payload = o->payload == EPF_PAYLOAD_MXFP8 ? EPF_PAYLOAD_MXFP8 : EPF_PAYLOAD_BF16;
  cfg.flags = o->push ? EPF_FLAG_COMBINE_PUSH : 0u;
  epf_status_t st = epf_plan_compute(&cfg, plan);
  if (st == EPF_OK) st = epf_ll_plan_check(plan);
  return st;
}

/* ex_ll_experts_kernel — the LL expert stage (no communication), every virtual rank in one grid
 * (blockIdx.y = rank): for each row the dispatch receive counted (fixed slot (le, src, j),
 * j < recv_counts[rank][le][src]), y = bf16(dequant(row) * f(le, rank)), one warp per row.
 * The rows stay in the window (zero copy) at epf_ll_recv_row(plan, round, le, src, j); the round
 * (its parity) is the dispatch's `round` output, read here on the device. y == NULL: y overwrites
 * the BF16 row in place (EPF_LL_Y_IN_PLACE / _PULL); else y is [R][recv_capacity][H] BF16 in the
 * fixed order (EPF_LL_Y_FIXED: row epf_ll_fixed_row(plan, le, src, j)). */
// example-begin ll_experts
__global__ void ex_ll_experts_kernel(epf_plan_t plan, char* window, const uint32_t* round, const int32_t* recv_counts,
                                     uint16_t* y) {
  const int R = plan.nranks, EL = plan.experts_per_rank;
  const int rank = (int)blockIdx.y;
  const int64_t rows = plan.recv_capacity; /* EL * R * T: one parity */
  const uint32_t epoch = round[rank];
  const int32_t* cnt = recv_counts + (int64_t)rank * EL * R;
  char* base = window + (uint64_t)rank * plan.total_bytes;
  const int64_t gw = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int64_t nw = (int64_t)gridDim.x * (blockDim.x >> 5);
  for (int64_t fr = gw; fr < rows; fr += nw) { /* warp-uniform; fr = epf_ll_fixed_row(&plan, le, src, j) */
    int le, src, j;
    epf_ll_fixed_row_split(&plan, fr, &le, &src, &j);
    if (j >= cnt[le * R + src]) continue;
    const int64_t wrow = epf_ll_recv_row(&plan, epoch, le, src, j);
    uint8_t* q = (uint8_t*)base + epf_plan_recv_token_offset(&plan, wrow);
    const uint8_t* s = plan.scale_bytes_per_row ? (const uint8_t*)base + epf_plan_recv_scale_offset(&plan, wrow) : NULL;
    uint16_t* out = y != NULL ? y + ((uint64_t)rank * rows + fr) * plan.hidden : (uint16_t*)q;
    ex_expert_row_warp(&plan, q, s, ex_expert_factor(le, rank), out);
  }
}
// example-end ll_experts

/* ex_ll_rm_experts_kernel — the same experts for a RANK_MAJOR LL plan: the receive half expanded
 * the rank-major rows into the expert-major view (packed_x / packed_scales: [R][EL * R * T] rows,
 * expert le's copies from source 0, then 1, ..., epf_ll_packed_row), exactly the view an
 * expert-major receive's packed output is; y goes to [R][EL * R * T][H] in the same (PACKED)
 * order. One warp per view row. */
__global__ void ex_ll_rm_experts_kernel(epf_plan_t plan, const uint8_t* view, const uint8_t* view_scales,
                                        const int32_t* recv_counts, uint16_t* y) {
  const int R = plan.nranks, EL = plan.experts_per_rank;
  const int rank = (int)blockIdx.y;
  const int64_t rows = (int64_t)EL * R * plan.max_tokens_per_rank; /* the view's rows per rank */
  const int32_t* cnt = recv_counts + (int64_t)rank * EL * R;
  const int64_t gw = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int64_t nw = (int64_t)gridDim.x * (blockDim.x >> 5);
  for (int64_t fr = gw; fr < rows; fr += nw) { /* fr = epf_ll_fixed_row(&plan, le, src, j) */
    int le, src, j, pos;
    epf_ll_fixed_row_split(&plan, fr, &le, &src, &j);
    if (j >= cnt[le * R + src]) continue;
    pos = j;
    for (int q = 0; q < src; ++q) pos += cnt[le * R + q]; /* copies of the sources before */
    const int64_t vr = (int64_t)rank * rows + epf_ll_packed_row(&plan, le, pos);
    ex_expert_row_warp(&plan, view + vr * plan.row_bytes,
                       view_scales ? view_scales + vr * plan.scale_bytes_per_row : NULL, ex_expert_factor(le, rank),
                       y + vr * plan.hidden);
  }
}

/* poison every data row of the window (receive rows, scales, metadata, combine landing rows, the
 * MXFP8 pull's EXPERT_OUT rows) of every rank; the signal words stay zero */
static void ll_poison_window(const epf_plan_t* plan, char* window, int R) {
  static const int ids[] = {EPF_REGION_RECV_TOKENS, EPF_REGION_RECV_SCALES, EPF_REGION_RECV_META, EPF_REGION_COMBINE,
                            EPF_REGION_EXPERT_OUT};
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < 5; ++i)
      if (plan->region[ids[i]].bytes != 0)
        EX_CK(cudaMemset(window + (uint64_t)r * plan->total_bytes + plan->region[ids[i]].offset, 0xA5,
                         (size_t)plan->region[ids[i]].bytes));
}

typedef struct {
  cudaGraphExec_t g[2]; /* dispatch, combine */
} ll_ctx_t;

static void ll_stage(void* ctx, int stage, cudaStream_t s) {
  EX_CK(cudaGraphLaunch(((const ll_ctx_t*)ctx)->g[stage], s));
}

/* --mode ll --backward (defined below, after run_ll) */
static int run_ll_backward(const opts_t* o, const epf_plan_t* plan, const epf_ll_launch_t* L,
                           epf_ll_dispatch_args_t da, epf_ll_combine_args_t ca, const inputs_t* in, char* window,
                           const int32_t* d_counts, const uint32_t* d_round, uint16_t* d_y,
                           const epf_error_record_t* rec_h, uint64_t* seed);

static int run_ll(opts_t o, const epf_plan_t* ll_plan, const inputs_t* in, uint64_t* seed) {
  const int R = o.R, T = o.T, K = o.K, E = o.E, EL = E / R;
  const int64_t n = (int64_t)R * T;
  const epf_plan_t plan = *ll_plan;

  /* what every rank must receive: one copy per (token, distinct expert), counted per
   * (destination rank, local expert, source) as recv_counts holds them (both layouts: the
   * rank-major receive gives its expert-major view the same counts); rm_rows: one copy per
   * (token, distinct destination rank), what a rank-major dispatch moves */
  const int rm = plan.layout == EPF_LAYOUT_RANK_MAJOR;
  int32_t* want_counts = (int32_t*)calloc((size_t)R * EL * R, 4);
  int64_t all_rows = 0, rm_rows = 0;
  for (int s = 0; s < R; ++s)
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) {
        const int32_t* row = in->topk + ((int64_t)s * T + t) * K;
        int dup = 0, rdup = 0;
        for (int j = 0; j < k; ++j) {
          dup |= row[j] == row[k];
          rdup |= row[j] / EL == row[k] / EL;
        }
        rm_rows += !rdup;
        if (dup) continue; /* LL sends a repeated expert once; the combine reuses that output */
        ++want_counts[(int64_t)row[k] * R + s]; /* (d * EL + le) * R + s with e = d * EL + le */
        ++all_rows;
      }

  /* ---- window, team, per-rank buffers; everything the round writes is poisoned first ---------- */
  char* window; /* R slices of plan.total_bytes: virtual rank r owns slice r */
  EX_CK(cudaMalloc(&window, (size_t)R * plan.total_bytes));
  EX_CK(cudaMemset(window, 0, (size_t)R * plan.total_bytes)); /* signal words (epochs) start at zero */
  ll_poison_window(&plan, window, R);
  epf_team_t team = epf_team_virtual(window, plan.total_bytes, 0, R);

  /* BF16: the experts overwrite their inputs and the sources pull; FP8 rows are too narrow for
   * BF16 outputs, so y goes to a caller buffer: the MXFP8 combine pulls it quantized (the expert
   * side writes it into its own window; --push: into the sources'), per-128 FP8 pushes BF16.
   * Rank-major: the experts read the expanded view and write y in its (PACKED) order; the expert
   * side pre-reduces and, with BF16, leaves the partials in its window for the sources to pull
   * (PACKED_PULL); otherwise it pushes them. */
  const int in_place = !rm && plan.payload == EPF_PAYLOAD_BF16;
  const int y_layout = rm ? (plan.payload == EPF_PAYLOAD_BF16 ? EPF_LL_Y_PACKED_PULL : EPF_LL_Y_PACKED)
                          : in_place ? EPF_LL_Y_IN_PLACE_PULL : EPF_LL_Y_FIXED;
  const int pulls = epf_ll_combine_pulls(&plan, y_layout); /* the transport this plan and layout select */
  uint8_t *d_view = NULL, *d_view_scales = NULL; /* rank-major: the expert-major view */
  void *d_x, *d_topk, *d_out;
  float* d_w;
  int32_t* d_counts;
  uint32_t* d_round;
  uint16_t* d_y = NULL;
  epf_ll_state_t* d_state;
  upload_inputs(&o, in, &d_x, &d_topk, &d_w); /* [R][T][...]: the epf_ll_buffer_bytes strides */
  EX_CK(cudaMalloc(&d_out, (size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_X, EPF_INDEX_DEFAULT)));
  EX_CK(cudaMalloc(&d_counts, (size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_RECV_COUNTS, EPF_INDEX_DEFAULT)));
  EX_CK(cudaMalloc(&d_round, (size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_ROUND, EPF_INDEX_DEFAULT)));
  if (!in_place) {
    EX_CK(cudaMalloc(&d_y, (size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_Y, EPF_INDEX_DEFAULT)));
    EX_CK(cudaMemset(d_y, 0xEE, (size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_Y, EPF_INDEX_DEFAULT)));
  }
  if (rm) {
    EX_CK(cudaMalloc(&d_view, (size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_PACKED_X, EPF_INDEX_DEFAULT)));
    EX_CK(cudaMemset(d_view, 0xEE, (size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_PACKED_X, EPF_INDEX_DEFAULT)));
    if (plan.scale_bytes_per_row)
      EX_CK(cudaMalloc(&d_view_scales, (size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_PACKED_SCALES, EPF_INDEX_DEFAULT)));
  }
  EX_CK(cudaMalloc(&d_state, R * sizeof(epf_ll_state_t)));
  EX_CK(cudaMemset(d_out, 0xA7, (size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_X, EPF_INDEX_DEFAULT))); /* poison */
  EX_CK(cudaMemset(d_counts, 0xEE, (size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_RECV_COUNTS, EPF_INDEX_DEFAULT)));
  EX_CK(cudaMemset(d_round, 0xEE, (size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_ROUND, EPF_INDEX_DEFAULT)));
  epf_error_record_t *rec_h, *rec_d;
  record_make(&rec_h, &rec_d);

  // example-begin ll_round
  epf_ll_launch_t L = epf_ll_launch_make(&plan, team, d_state, rec_d, /*virtual_ranks=*/1);
  EX_CS(epf_ll_state_reset(&L, 0)); /* epochs 0, everyone active (with the zeroed window) */
  epf_ll_dispatch_args_t da;
  memset(&da, 0, sizeof(da));
  da.x = d_x;                  /* [R][T][H] BF16: per-rank buffers, epf_ll_buffer_bytes apart */
  da.topk_idx = d_topk;        /* [R][T][K] int32 */
  da.index_type = EPF_INDEX_INT32; /* the ids' type (0 would mean int64, as for the route) */
  da.topk_weights = d_w;       /* [R][T][K], carried in the metadata rows */
  da.num_tokens = T;
  da.recv_counts = d_counts;   /* out: [R][EL][R] rows per (local expert, source) */
  da.round = d_round;          /* out: [R] epoch of the round; its parity picks the rows */
  da.packed_x = d_view;        /* rank-major: the receive half expands into this view (NULL: EM) */
  da.packed_scales = d_view_scales;
  epf_ll_combine_args_t ca;
  memset(&ca, 0, sizeof(ca));
  ca.y = d_y;                  /* FIXED / PACKED: [R][EL * R * T][H] BF16; NULL in place */
  ca.y_layout = y_layout;      /* EM: IN_PLACE_PULL (BF16) or FIXED (MXFP8: pull by the plan);
                                  RM: PACKED_PULL (BF16) or PACKED */
  ca.recv_counts = d_counts;
  ca.topk_idx = d_topk;
  ca.index_type = EPF_INDEX_INT32;
  ca.topk_weights = d_w;
  ca.out = d_out;              /* [R][T][H] BF16 combine output */
  ca.num_tokens = T;

  EX_CS(epf_ll_dispatch(&L, &da, EPF_LL_BOTH, 0)); /* send + receive fused, all R ranks */
  if (!rm)
    ex_ll_experts_kernel<<<dim3(64, (unsigned)R), 256>>>(plan, window, d_round, d_counts, d_y);
  else
    ex_ll_rm_experts_kernel<<<dim3(64, (unsigned)R), 256>>>(plan, d_view, d_view_scales, d_counts, d_y);
  EX_CK(cudaGetLastError());
  EX_CS(epf_ll_combine(&L, &ca, EPF_LL_BOTH, 0));
  // example-end ll_round
  EX_CK(cudaDeviceSynchronize());

  /* ---- verify: error record, counts and round, then the same CPU reference as HT ------------- */
  if (record_check(rec_h)) return 1;
  {
    const size_t cbytes = (size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_RECV_COUNTS, EPF_INDEX_DEFAULT);
    int32_t* counts = (int32_t*)malloc(cbytes);
    uint32_t* rounds = (uint32_t*)malloc((size_t)R * 4);
    EX_CK(cudaMemcpy(counts, d_counts, cbytes, cudaMemcpyDeviceToHost));
    EX_CK(cudaMemcpy(rounds, d_round, (size_t)R * 4, cudaMemcpyDeviceToHost));
    for (int i = 0; i < R * EL * R; ++i)
      if (counts[i] != want_counts[i]) {
        fprintf(stderr, "MISMATCH recv_counts rank %d expert %d source %d: got %d want %d\n", i / (EL * R),
                i / R % EL, i % R, counts[i], want_counts[i]);
        return 1;
      }
    for (int r = 0; r < R; ++r)
      if (rounds[r] != 1u) { /* the first round after epf_ll_state_reset is epoch 1 */
        fprintf(stderr, "MISMATCH round of rank %d: got %u want 1\n", r, rounds[r]);
        return 1;
      }
    free(counts);
    free(rounds);
  }
  if (verify_out(&o, &plan, in, d_out, seed,
                 rm ? (pulls ? "low-latency rank-major (expand, pre-reduce, pull combine)"
                             : "low-latency rank-major (expand, pre-reduce, push combine)")
                 : in_place ? "low-latency expert-major (y in place, pull combine)"
                 : plan.combine_payload == EPF_PAYLOAD_MXFP8
                     ? (pulls ? "low-latency expert-major (y fixed buffer, MXFP8 pull combine)"
                              : "low-latency expert-major (y fixed buffer, MXFP8 push combine)")
                     : "low-latency expert-major (y fixed buffer, push combine)"))
    return 1;
  {
    /* the link bytes of the two layouts on this routing: a row (payload + scales + metadata) per
     * copy there, a combine row per copy back (expert-major: per (token, expert); rank-major: per
     * (token, rank), the partial) */
    const double em_meta = (double)sizeof(epf_recv_meta_em_t), rm_meta = (double)epf_recv_meta_rm_bytes(K);
    const double rowb = (double)plan.row_bytes + plan.scale_bytes_per_row, cb = plan.combine_row_bytes;
    const double em_bytes = (double)all_rows * (rowb + em_meta + cb), rm_bytes = (double)rm_rows * (rowb + rm_meta + cb);
    printf("copies: expert-major %lld (token, expert) rows, rank-major %lld (token, rank) rows; link bytes "
           "(dispatch + combine) %.2f MB vs %.2f MB: rank-major saves %.1f%%\n",
           (long long)all_rows, (long long)rm_rows, em_bytes / 1e6, rm_bytes / 1e6, 100.0 * (1.0 - rm_bytes / em_bytes));
  }
  /* --backward: the training direction for the same routing (run_ll_backward, below) */
  if (o.backward && run_ll_backward(&o, &plan, &L, da, ca, in, window, d_counts, d_round, d_y, rec_h, seed)) return 1;

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
  const int it = o.iters + EX_WARMUP;
  const double us_copy = copy_ceiling_us(o.iters, s);
  float* t = (float*)malloc(sizeof(float) * (size_t)it * 2);
  time_stages(it, 2, ll_stage, &ctx, s, t); /* one combine per dispatch: the halves stay in lockstep */
  double d_moved, c_moved;
  stage_bytes(&plan, n, rm ? rm_rows : all_rows, !in_place, &d_moved, &c_moved);
  if (rm) { /* the expand reads each rank-major row and writes each view row (+ scales); the
             * pre-reduce reads every expert output once */
    d_moved += (double)rm_rows * (plan.row_bytes + plan.meta_bytes_per_row) + (double)all_rows * (plan.row_bytes + plan.scale_bytes_per_row);
    c_moved = (double)all_rows * 2.0 * plan.hidden + (double)rm_rows * 2.0 * plan.combine_row_bytes + (double)n * plan.hidden * 2;
  }
  const row_t table[2] = {{rm ? "dispatch + expand" : "dispatch", median_us(t, o.iters), d_moved},
                          {rm ? "combine (pre-reduce + sum)" : "combine", median_us(t + it, o.iters), c_moved}};
  print_table(us_copy, table, 2, o.iters, " CUDA-graph replays", rec_h);
  free(t);
  for (int i = 0; i < 2; ++i) {
    EX_CK(cudaGraphExecDestroy(ctx.g[i]));
    EX_CK(cudaGraphDestroy(g[i]));
  }
  EX_CK(cudaStreamDestroy(s));
  return record_check(rec_h);
}

/* ---- --mode ll --backward: the training direction (kept apart from run_ll: one hook there) ---- */

/* run_ll_backward — after the forward round of run_ll (same routing, same launch and state):
 *   1. backward of the combine: epf_ll_combine_backward with x = dy (fresh BF16 [R][T][H]): the
 *      rows land in the forward's (local expert, source, slot); each row's metadata weight is its
 *      combine weight (the sum of the token's weights over the k that read the row);
 *   2. the experts' backward: dx_row = bf16(dy_row * f(le, rank)) (the examples' expert is
 *      y = bf16(x * f); a real layer would use the row's weight here), in place or FIXED;
 *   3. backward of the dispatch: epf_ll_dispatch_backward, unit weights, repeats contribute
 *      nothing: dx[t] = sum over the token's distinct experts, k order, FP32, BF16 out.
 *   Checks: counts, the round, every row's metadata weight, and dx of every token bit for bit. */
static int run_ll_backward(const opts_t* o, const epf_plan_t* plan, const epf_ll_launch_t* L,
                           epf_ll_dispatch_args_t da, epf_ll_combine_args_t ca, const inputs_t* in, char* window,
                           const int32_t* d_counts, const uint32_t* d_round, uint16_t* d_y,
                           const epf_error_record_t* rec_h, uint64_t* seed) {
  const int R = o->R, T = o->T, H = o->H, K = o->K, EL = o->E / R;
  const int64_t n = (int64_t)R * T;
  uint16_t* dy = (uint16_t*)malloc((size_t)n * H * 2);
  uint16_t* got = (uint16_t*)malloc((size_t)n * H * 2);
  float* acc = (float*)malloc((size_t)H * 4);
  void *d_dy, *d_dx;
  int bad = 0;
  epf_status_t st = epf_ll_backward_check(plan);
  if (st != EPF_OK) {
    fprintf(stderr, "--backward: %s: %s (the training direction is BF16 both ways)\n", epf_status_name(st),
            epf_status_message(st));
    return 2;
  }
  for (int64_t i = 0; i < n * H; ++i) dy[i] = ex_bf16_rne((float)((int64_t)(ex_rand(seed) % 2001) - 1000) / 1000.0f);
  EX_CK(cudaMalloc(&d_dy, (size_t)n * H * 2));
  EX_CK(cudaMalloc(&d_dx, (size_t)n * H * 2));
  EX_CK(cudaMemcpy(d_dy, dy, (size_t)n * H * 2, cudaMemcpyHostToDevice));
  EX_CK(cudaMemset(d_dx, 0xA7, (size_t)n * H * 2)); /* poison */
  da.x = d_dy;                 /* backward of the combine: a dispatch of dy, same routing */
  EX_CS(epf_ll_combine_backward(L, &da, EPF_LL_BOTH, 0));
  if (plan->layout == EPF_LAYOUT_RANK_MAJOR) /* dx rows over the view of dy the receive half expanded */
    ex_ll_rm_experts_kernel<<<dim3(64, (unsigned)R), 256>>>(*plan, (const uint8_t*)da.packed_x,
                                                            (const uint8_t*)da.packed_scales, d_counts, d_y);
  else
    ex_ll_experts_kernel<<<dim3(64, (unsigned)R), 256>>>(*plan, window, d_round, d_counts, d_y); /* dx rows */
  EX_CK(cudaGetLastError());
  ca.out = d_dx;               /* backward of the dispatch: unit weights, repeats add nothing */
  ca.topk_weights = NULL;      /* not read */
  EX_CS(epf_ll_dispatch_backward(L, &ca, EPF_LL_BOTH, 0));
  EX_CK(cudaDeviceSynchronize());
  if (record_check(rec_h)) return 1;
  /* the rows' metadata weights: the combine weight of each row (round 2: parity 0); rank-major
   * rows carry per-k entries with the forward's weights (the library's tests check them) */
  if (plan->layout == EPF_LAYOUT_EXPERT_MAJOR) {
    int32_t* counts = (int32_t*)malloc((size_t)R * EL * R * 4);
    uint32_t* rounds = (uint32_t*)malloc((size_t)R * 4);
    epf_recv_meta_em_t* meta = (epf_recv_meta_em_t*)malloc((size_t)plan->recv_capacity * sizeof(epf_recv_meta_em_t));
    EX_CK(cudaMemcpy(counts, d_counts, (size_t)R * EL * R * 4, cudaMemcpyDeviceToHost));
    EX_CK(cudaMemcpy(rounds, d_round, (size_t)R * 4, cudaMemcpyDeviceToHost));
    for (int d = 0; d < R && !bad; ++d) {
      const int64_t row0 = epf_ll_recv_row(plan, rounds[d], 0, 0, 0);
      if (rounds[d] != 2u) {
        fprintf(stderr, "MISMATCH backward round of rank %d: got %u want 2\n", d, rounds[d]);
        return 1;
      }
      EX_CK(cudaMemcpy(meta, window + (uint64_t)d * plan->total_bytes + epf_plan_recv_meta_offset(plan, row0),
                       (size_t)plan->recv_capacity * sizeof(epf_recv_meta_em_t), cudaMemcpyDeviceToHost));
      for (int le = 0; le < EL && !bad; ++le)
        for (int s = 0; s < R && !bad; ++s)
          for (int j = 0; j < counts[((int64_t)d * EL + le) * R + s]; ++j) {
            const epf_recv_meta_em_t* m = meta + epf_ll_fixed_row(plan, le, s, j);
            const int64_t tk = ((int64_t)s * T + m->src_token) * K;
            float cw = 0.0f; /* the sum of the token's weights over the k reading this row */
            for (int k = m->k; k < K; ++k)
              if (in->topk[tk + k] == in->topk[tk + m->k]) cw = cw + in->w[tk + k];
            if (memcmp(&cw, &m->weight, 4) != 0) {
              fprintf(stderr, "MISMATCH backward meta weight rank %d expert %d source %d slot %d: %g want %g\n", d,
                      le, s, j, (double)m->weight, (double)cw);
              bad = 1;
              break;
            }
          }
    }
    free(counts);
    free(rounds);
    free(meta);
  }
  /* dx of every token */
  EX_CK(cudaMemcpy(got, d_dx, (size_t)n * H * 2, cudaMemcpyDeviceToHost));
  for (int64_t t = 0; t < n && !bad; ++t) {
    const int32_t* topk = in->topk + t * K;
    for (int h = 0; h < H; ++h) acc[h] = 0.0f;
    if (plan->layout == EPF_LAYOUT_RANK_MAJOR) {
      /* per destination rank, in the order of its first occurrence in k: the BF16 partial of the
       * token's distinct experts there (unit weights), then acc = fma(1, partial, acc) */
      for (int k = 0; k < K; ++k) {
        int seen = 0;
        if (topk[k] < 0) continue;
        for (int j = 0; j < k; ++j) seen |= topk[j] >= 0 && topk[j] / EL == topk[k] / EL;
        if (seen) continue;
        for (int h = 0; h < H; ++h) {
          float p = 0.0f;
          for (int q = k; q < K; ++q) {
            int dup = 0;
            if (topk[q] < 0 || topk[q] / EL != topk[k] / EL) continue;
            for (int j = 0; j < q; ++j) dup |= topk[j] == topk[q];
            if (dup) continue;
            p = fmaf(1.0f, ex_bf16_f(ex_bf16_rne(ex_bf16_f(dy[t * H + h]) * ex_expert_factor(topk[q] % EL, topk[q] / EL))), p);
          }
          acc[h] = fmaf(1.0f, ex_bf16_f(ex_bf16_rne(p)), acc[h]);
        }
      }
    } else {
      for (int k = 0; k < K; ++k) {
        int dup = 0;
        for (int j = 0; j < k; ++j) dup |= topk[j] == topk[k];
        if (dup) continue;
        const float f = ex_expert_factor(topk[k] % EL, topk[k] / EL);
        for (int h = 0; h < H; ++h) acc[h] = fmaf(1.0f, ex_bf16_f(ex_bf16_rne(ex_bf16_f(dy[t * H + h]) * f)), acc[h]);
      }
    }
    for (int h = 0; h < H; ++h)
      if (got[t * H + h] != ex_bf16_rne(acc[h])) {
        fprintf(stderr, "MISMATCH backward dx rank %lld token %lld h %d: 0x%04x want 0x%04x\n", (long long)(t / T),
                (long long)(t % T), h, got[t * H + h], ex_bf16_rne(acc[h]));
        bad = 1;
        break;
      }
  }
  printf("backward (--mode ll): combine backward (dy -> rows, combine weights) + dispatch backward (dx, unit weights) "
         "of %lld tokens: %s\n", (long long)n, bad ? "FAILED" : "OK (bit-exact)");
  EX_CK(cudaFree(d_dy));
  EX_CK(cudaFree(d_dx));
  free(dy);
  free(got);
  free(acc);
  return bad;
}

int main(int argc, char** argv) {
  opts_t o;
  if (parse(argc, argv, &o)) {
    usage(argv[0]);
    return 2;
  }
  epf_plan_t ll_plan;
  if (o.mode == EPF_MODE_LL) { /* refuse what LL cannot run before touching the GPU */
    const epf_status_t st = ll_plan_make(&o, &ll_plan);
    epf_status_t st2;
    if (st != EPF_OK) {
      fprintf(stderr, "--mode ll%s: %s: %s\n", o.layout == EPF_LAYOUT_RANK_MAJOR ? " --layout rm" : "",
              epf_status_name(st), epf_status_message(st));
      return 2;
    }
    /* --backward: the training direction is BF16 both ways (both layouts), refused here
     * otherwise, before any GPU work */
    if (o.backward && (st2 = epf_ll_backward_check(&ll_plan)) != EPF_OK) {
      fprintf(stderr, "--mode ll%s --backward: %s: %s\n", o.layout == EPF_LAYOUT_RANK_MAJOR ? " --layout rm" : "",
              epf_status_name(st2), epf_status_message(st2));
      return 2;
    }
  }
  if (o.backward && o.mode == EPF_MODE_HT && o.payload != EPF_PAYLOAD_BF16) { /* before the GPU check */
    fprintf(stderr, "--backward: the HT training direction moves BF16 gradients: use --payload bf16 "
                    "(epf_ht_combine_backward / epf_ht_dispatch_backward refuse other payloads with %s)\n",
            epf_status_name(EPF_ERR_NOT_SUPPORTED));
    return 2;
  }
  ex_gpu_or_exit(1, o.ctest);
  uint64_t seed = o.seed;
  inputs_t in;
  make_inputs(&o, &seed, &in);
  return o.mode == EPF_MODE_LL ? run_ll(o, &ll_plan, &in, &seed) : run_ht(o, &in, &seed);
}
