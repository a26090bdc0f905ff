/* bench_ll — low-latency dispatch and combine over virtual ranks on one GPU (a program, not a test).
 *
 * Default: 8 virtual ranks, hidden 7168, top-8 of 256 experts (DeepSeek-V3 decode shape), tokens
 * per rank 1, 128 and 256; BF16 dispatch + BF16 combine, then MXFP8 and per-128 FP8 dispatch, and
 * the MXFP8 combine pulling (the default: the expert side quantizes into its own EXPERT_OUT, the
 * sources read it) and pushing (EPF_FLAG_COMBINE_PUSH); each in the EXPERT_MAJOR layout (EM) and
 * right after it the RANK_MAJOR layout (RM: one copy per (token, rank), the receive half expands
 * into the expert-major view, the combine pre-reduces on the expert side; y in a buffer in the
 * view's order; its MXFP8 combine always pushes), with the link bytes both layouts move on the
 * same routing. Routing: K distinct uniform experts per token (no -1).
 *
 * Timing: each operation is ONE captured CUDA graph (the ready-made fused kernel: send + receive in
 * one launch, all 8 ranks in it); --reps iterations of [dispatch graph, combine graph] are enqueued
 * back to back with an event between every two launches, and the median event time of each
 * operation is reported. So a time includes the graph launch gap in the stream, the slot scan,
 * the copies, the signalling and the waits: everything a decode step would pay. Combine uses
 * identity experts in place (y = the received rows), so each combine follows its dispatch; the
 * BF16 case runs twice: combine pushing (EPF_LL_Y_IN_PLACE) and pulling (EPF_LL_Y_IN_PLACE_PULL);
 * so does the MXFP8 combine (y in place, EPF_LL_Y_IN_PLACE: pull by the plan's default, push with
 * EPF_FLAG_COMBINE_PUSH). The two MXFP8 transports move the same bytes (y read, the quantized row
 * written and read back once); on NVLink the push's writes and the pull's reads cross the link.
 *
 * Bytes, all three conventions of notes/ANCHORS.md plus the copy convention (aggregate over the 8
 * virtual ranks, i.e. what the one GPU moved):
 *   copy       : every delivered row written once and read once, as a D2D copy of exactly those
 *                rows would (2 x delivered rows x (row + scale bytes)); this one is divided by the
 *                copy ceiling measured in the same run (cudaMemcpyAsync D2D of 1 GiB, read + write
 *                counted) -> "% of copy ceiling" (launch and signalling included in the time);
 *   topk-logical: tokens x top-k x row bytes per rank (DeepEP LL, NCCL EP, pplx);
 *   received-logical: every row a rank receives (its own included) x row bytes;
 *   link       : rows that went to another rank x row bytes (virtual ranks: no NVLink involved);
 *   issued     : what the kernels themselves read and write in HBM (dispatch: x once per token,
 *                every copy + metadata; combine: y, landing rows written and read back, out),
 *                also divided by the ceiling.
 * The copy convention credits a read AND a write per delivered row while the dispatch reads each
 * token once and writes it K times, so it can exceed 100 %: that then means "faster than a D2D copy
 * of exactly the delivered rows".
 *
 * First line: the latency floor of the T = 1 grid (an empty kernel and one .sys signal exchange
 * among the virtual ranks, both graph replays), the part of a T = 1 stage no kernel change removes.
 *
 * Usage: bench_ll [--ranks 8] [--hidden 7168] [--topk 8] [--experts 256] [--tokens 1,128,256]
 *                 [--reps 200] [--bpr 0] [--threads 512] [--case i (only the i-th payload/layout row of a
 *                 token count, 0-10, in the order printed)]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epf_bench.h"
#include "epf_bench_floor.cuh"
#include "epfuse/ll/kernels.cuh"


static uint64_t bl_rng = 0x5eed5eed12345678ull;

/* BF16 values in about [-2, 2] */
__global__ void bl_fill(uint16_t* x, int64_t n, uint32_t salt) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 0x9e3779b1u ^ salt;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    x[i] = (uint16_t)(0x3f80u | ((h >> 8) & 0x807fu)) - (uint16_t)((h & 1u) << 7);
  }
}

typedef struct {
  int R, T, H, K, E, payload, cpayload, reps, bpr, threads;
  int pull; /* the sources read the outputs: BF16 combine: EPF_LL_Y_IN_PLACE_PULL (BF16 dispatch;
               rank-major: EPF_LL_Y_PACKED_PULL, the sources read the partials); MXFP8 combine: the
               plan's default (0: EPF_FLAG_COMBINE_PUSH; rank-major pushes either way) */
  int rm;   /* RANK_MAJOR plan: one copy per (token, rank), expand in the receive half, pre-reduce */
} bl_case_t;

/* The latency floor of one LL stage on this GPU (printed before the cases): an empty kernel of the
 * same grid, and one signal exchange among the virtual ranks (epf_bench_floor.cuh). */
static void bl_floor(int R, int bpr, int threads, int reps) {
  double us_e, us_s;
  const int failed = epf_bench_latency_floor(R, bpr, threads, reps, &us_e, &us_s);
  printf("latency floor (%d ranks x %d blocks of %d threads, graph replays): empty kernel %.2f us; one .sys signal "
         "exchange among the ranks %.2f us%s\n",
         R, bpr, threads, us_e, us_s, failed ? " (!! a wait failed)" : "");
}

static const char* bl_payload(int p) {
  return p == EPF_PAYLOAD_MXFP8 ? "mxfp8" : p == EPF_PAYLOAD_FP8_128 ? "fp8x128" : "bf16";
}

static void bl_run(const bl_case_t* c, double ceiling_gbs) {
  epf_config_t cfg = EPF_CONFIG_INIT;
  epf_plan_t plan;
  epf_ll_launch_t L;
  epf_ll_state_t* state;
  epf_error_record_t *rec_h, *rec_d;
  char* win;
  uint16_t *x, *y = NULL, *out;
  void *view = NULL, *view_scales = NULL; /* rank-major: the expert-major view the receive half writes */
  int32_t *topk, *recv_counts;
  float* w;
  uint32_t* round;
  cudaStream_t s;
  cudaGraph_t gd, gc;
  cudaGraphExec_t xd, xc;
  cudaEvent_t* ev;
  float *td, *tc;
  epf_ll_dispatch_args_t da;
  epf_ll_combine_args_t ca;
  const int R = c->R, T = c->T, H = c->H, K = c->K, E = c->E, EL = E / R;
  int64_t delivered = 0, local_rows = 0, rm_rows = 0, rm_local = 0;
  int bpr_d, bpr_c;

  cfg.nranks = R;
  cfg.num_experts = E;
  cfg.top_k = K;
  cfg.hidden = H;
  cfg.max_tokens_per_rank = T;
  cfg.mode = EPF_MODE_LL;
  cfg.payload = c->payload;
  cfg.combine_payload = c->cpayload;
  cfg.layout = c->rm ? EPF_LAYOUT_RANK_MAJOR : EPF_LAYOUT_EXPERT_MAJOR;
  cfg.flags = c->cpayload == EPF_PAYLOAD_MXFP8 && !c->pull ? EPF_FLAG_COMBINE_PUSH : 0u;
  EPF_BENCH_OK(epf_plan_compute(&cfg, &plan));

  EPF_BENCH_CUDA(cudaMalloc(&win, (size_t)R * plan.total_bytes));
  EPF_BENCH_CUDA(cudaMemset(win, 0, (size_t)R * plan.total_bytes));
  EPF_BENCH_CUDA(cudaMalloc(&state, (size_t)R * sizeof(epf_ll_state_t)));
  EPF_BENCH_CUDA(cudaHostAlloc(&rec_h, sizeof(*rec_h), cudaHostAllocMapped));
  EPF_BENCH_CUDA(cudaHostGetDevicePointer(&rec_d, rec_h, 0));
  epf_error_clear(rec_h);
  EPF_BENCH_CUDA(cudaMalloc(&x, (size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_X, EPF_INDEX_DEFAULT)));
  EPF_BENCH_CUDA(cudaMalloc(&out, (size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_X, EPF_INDEX_DEFAULT)));
  EPF_BENCH_CUDA(cudaMalloc(&topk, (size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_TOPK_IDX, EPF_INDEX_INT32)));
  EPF_BENCH_CUDA(cudaMalloc(&w, (size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_TOPK_WEIGHTS, EPF_INDEX_DEFAULT)));
  EPF_BENCH_CUDA(cudaMalloc(&recv_counts, (size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_RECV_COUNTS, EPF_INDEX_DEFAULT)));
  EPF_BENCH_CUDA(cudaMalloc(&round, (size_t)R * 4));
  /* quantized rows cannot be overwritten in place by BF16 y; rank-major: y in the view's order */
  if (c->payload != EPF_PAYLOAD_BF16 || c->rm)
    EPF_BENCH_CUDA(cudaMalloc(&y, (size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_Y, EPF_INDEX_DEFAULT)));
  if (c->rm) {
    EPF_BENCH_CUDA(cudaMalloc(&view, (size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_PACKED_X, EPF_INDEX_DEFAULT)));
    if (plan.scale_bytes_per_row)
      EPF_BENCH_CUDA(cudaMalloc(&view_scales, (size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_PACKED_SCALES, EPF_INDEX_DEFAULT)));
  }
  bl_fill<<<1024, 256>>>(x, (int64_t)R * T * H, 12345u);
  if (y != NULL) bl_fill<<<1024, 256>>>(y, (int64_t)R * E / R * R * T * H, 777u);
  EPF_BENCH_CUDA(cudaGetLastError());
  { /* routing: K distinct uniform experts per token; weights 1/K */
    int32_t* ht = (int32_t*)malloc((size_t)R * T * K * 4);
    float* hw = (float*)malloc((size_t)R * T * K * 4);
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k) {
          int e, dup;
          do {
            e = (int)(epf_bench_splitmix(&bl_rng) % (uint64_t)E);
            dup = 0;
            for (int q = 0; q < k; ++q) dup |= ht[((size_t)r * T + t) * K + q] == e;
          } while (dup);
          ht[((size_t)r * T + t) * K + k] = e;
          hw[((size_t)r * T + t) * K + k] = 1.0f / (float)K;
          ++delivered;
          local_rows += e / EL == r;
        }
    for (int r = 0; r < R; ++r) /* one copy per (token, distinct destination rank) */
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k) {
          const int32_t* row = ht + ((size_t)r * T + t) * K;
          int first = 1;
          for (int q = 0; q < k; ++q) first &= row[q] / EL != row[k] / EL;
          rm_rows += first;
          rm_local += first && row[k] / EL == r;
        }
    EPF_BENCH_CUDA(cudaMemcpy(topk, ht, (size_t)R * T * K * 4, cudaMemcpyHostToDevice));
    EPF_BENCH_CUDA(cudaMemcpy(w, hw, (size_t)R * T * K * 4, cudaMemcpyHostToDevice));
    free(ht);
    free(hw);
  }

  L = epf_ll_launch_make(&plan, epf_team_virtual(win, plan.total_bytes, 0, R), state, rec_d, 1);
  L.blocks_per_rank = c->bpr;
  L.threads = c->threads;
  EPF_BENCH_OK(epf_ll_state_reset(&L, 0));
  memset(&da, 0, sizeof(da));
  da.x = x;
  da.topk_idx = topk;
  da.index_type = EPF_INDEX_INT32;
  da.topk_weights = w;
  da.num_tokens = T;
  da.recv_counts = recv_counts;
  da.round = round;
  da.packed_x = view; /* rank-major: the receive half expands into the view */
  da.packed_scales = view_scales;
  memset(&ca, 0, sizeof(ca));
  ca.y = y;
  ca.y_layout = c->rm                                              ? (c->pull ? EPF_LL_Y_PACKED_PULL : EPF_LL_Y_PACKED)
                : y != NULL                                      ? EPF_LL_Y_FIXED
                : c->pull && c->cpayload == EPF_PAYLOAD_BF16 ? EPF_LL_Y_IN_PLACE_PULL
                                                             : EPF_LL_Y_IN_PLACE;
  ca.recv_counts = recv_counts;
  ca.topk_idx = topk;
  ca.index_type = EPF_INDEX_INT32;
  ca.topk_weights = w;
  ca.out = out;
  ca.num_tokens = T;
  bpr_d = epf_ll_blocks_per_rank(&L, T, 0);
  bpr_c = epf_ll_blocks_per_rank(&L, T,
                                 !c->rm && epf_ll_combine_pulls(&plan, ca.y_layout) && c->cpayload == EPF_PAYLOAD_BF16
                                     ? EPF_LL_BPR_COMBINE_PULL
                                     : EPF_LL_BPR_COMBINE);

  EPF_BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  EPF_BENCH_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  EPF_BENCH_OK(epf_ll_dispatch(&L, &da, EPF_LL_BOTH, s));
  EPF_BENCH_CUDA(cudaStreamEndCapture(s, &gd));
  EPF_BENCH_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  EPF_BENCH_OK(epf_ll_combine(&L, &ca, EPF_LL_BOTH, s));
  EPF_BENCH_CUDA(cudaStreamEndCapture(s, &gc));
  EPF_BENCH_CUDA(cudaGraphInstantiate(&xd, gd, 0));
  EPF_BENCH_CUDA(cudaGraphInstantiate(&xc, gc, 0));

  ev = (cudaEvent_t*)malloc(sizeof(cudaEvent_t) * (size_t)(2 * c->reps + 1));
  td = (float*)malloc(sizeof(float) * (size_t)c->reps);
  tc = (float*)malloc(sizeof(float) * (size_t)c->reps);
  for (int i = 0; i < 2 * c->reps + 1; ++i) EPF_BENCH_CUDA(cudaEventCreate(&ev[i]));
  for (int i = 0; i < 10; ++i) { /* warm-up */
    EPF_BENCH_CUDA(cudaGraphLaunch(xd, s));
    EPF_BENCH_CUDA(cudaGraphLaunch(xc, s));
  }
  EPF_BENCH_CUDA(cudaStreamSynchronize(s));
  EPF_BENCH_CUDA(cudaEventRecord(ev[0], s));
  for (int i = 0; i < c->reps; ++i) {
    EPF_BENCH_CUDA(cudaGraphLaunch(xd, s));
    EPF_BENCH_CUDA(cudaEventRecord(ev[2 * i + 1], s));
    EPF_BENCH_CUDA(cudaGraphLaunch(xc, s));
    EPF_BENCH_CUDA(cudaEventRecord(ev[2 * i + 2], s));
  }
  EPF_BENCH_CUDA(cudaStreamSynchronize(s));
  for (int i = 0; i < c->reps; ++i) {
    EPF_BENCH_CUDA(cudaEventElapsedTime(&td[i], ev[2 * i], ev[2 * i + 1]));
    EPF_BENCH_CUDA(cudaEventElapsedTime(&tc[i], ev[2 * i + 1], ev[2 * i + 2]));
  }
  {
    int64_t got = 0;
    int32_t* hc = (int32_t*)malloc((size_t)R * E * 4);
    EPF_BENCH_CUDA(cudaMemcpy(hc, recv_counts, (size_t)R * E * 4, cudaMemcpyDeviceToHost));
    for (int i = 0; i < R * E; ++i) got += hc[i];
    free(hc);
    if (got != delivered || rec_h->count != 0)
      printf("  !! check failed: %lld rows received, want %lld; %u errors (%s)\n", (long long)got,
             (long long)delivered, rec_h->count, epf_status_name((epf_status_t)rec_h->status));
  }
  {
    const double us_d = epf_bench_median(td, c->reps) * 1e3, us_c = epf_bench_median(tc, c->reps) * 1e3;
    const double row = (double)plan.row_bytes + plan.scale_bytes_per_row;
    const double bf16_row = (double)H * 2.0;
    const double copy_d = 2.0 * (double)delivered * row, copy_c = 2.0 * (double)delivered * plan.combine_row_bytes;
    const double topk_d = (double)R * T * K * row, recv_d = (double)delivered * row;
    /* what the kernels themselves read and write in HBM: dispatch reads x once per token and
     * writes every copy + metadata; combine reads y, writes and re-reads the landing rows, writes out */
    const int pulled = epf_ll_combine_pulls(&plan, ca.y_layout) && c->cpayload == EPF_PAYLOAD_BF16;
    const int mx_pulled = epf_ll_combine_pulls(&plan, ca.y_layout) && c->cpayload == EPF_PAYLOAD_MXFP8;
    /* rank-major: one row (+ its rank-major metadata) per (token, rank) written, read back by the
     * expand, which writes every (token, expert) view row (+ scales); the combine reads every
     * output row once, writes and reads one partial per (token, rank), writes out */
    const double rm_meta = (double)plan.meta_bytes_per_row;
    const double issued_d = c->rm ? (double)rm_rows * 2.0 * (row + rm_meta) + (double)delivered * row + (double)R * T * bf16_row
                                  : (double)delivered * (row + 16.0) + (double)R * T * bf16_row;
    /* BF16 pull: every output row read once where the expert left it, out written; no landing
     * rows. MXFP8 pull: the same bytes as the push (the quantized row is written into the expert
     * rank's EXPERT_OUT instead of the source's COMBINE, and read back from there) */
    const double issued_c = c->rm ? (double)delivered * bf16_row + 2.0 * (double)rm_rows * plan.combine_row_bytes + (double)R * T * bf16_row
                            : pulled ? (double)delivered * bf16_row + (double)R * T * bf16_row
                                     : (double)delivered * (bf16_row + 2.0 * plan.combine_row_bytes + 16.0) +
                                           (double)R * T * bf16_row;
    /* link bytes: rows that leave their rank, both directions (payload + scales + metadata there,
     * combine rows back) */
    const double link_em = (double)(delivered - local_rows) * (row + 16.0 + plan.combine_row_bytes);
    const double link_rm = (double)(rm_rows - rm_local) * (row + rm_meta + plan.combine_row_bytes);
    /* the dispatch's own link bytes: its rows (rank-major: one per (token, rank), with metadata)
     * that leave their rank */
    const double link_d = c->rm ? (double)(rm_rows - rm_local) * (row + rm_meta) : (double)(delivered - local_rows) * row;
    const double link_c = c->rm ? (double)(rm_rows - rm_local) * plan.combine_row_bytes
                                : (double)(delivered - local_rows) * (pulled ? bf16_row : (double)plan.combine_row_bytes);
    printf("%-7s->%-7s %s R=%d T=%-4d H=%d K=%d E=%d bpr %d/%d%s\n", bl_payload(c->payload), bl_payload(c->cpayload),
           c->rm ? "RM" : "EM", R, T, H, K, E, bpr_d, bpr_c,
           pulled      ? (c->rm ? "  combine: PULL (EPF_LL_Y_PACKED_PULL)" : "  combine: PULL (EPF_LL_Y_IN_PLACE_PULL)")
           : mx_pulled ? "  combine: PULL (MXFP8, quantized into EXPERT_OUT)"
           : c->cpayload == EPF_PAYLOAD_MXFP8 ? (c->rm ? "  combine: PUSH (MXFP8, rank-major)"
                                                       : "  combine: PUSH (MXFP8, EPF_FLAG_COMBINE_PUSH)")
                                              : "");
    printf("   link bytes (dispatch + combine, rows leaving their rank): %.3f MB %s",
           (c->rm ? link_rm : link_em) / 1e6, c->rm ? "" : "\n");
    if (c->rm)
      printf("vs %.3f MB expert-major (%lld vs %lld copies): %.1f%% saved\n", link_em / 1e6, (long long)rm_rows,
             (long long)delivered, 100.0 * (1.0 - link_rm / link_em));
    printf("   window %.1f MB per rank, combine bytes per call (all ranks): %.1f MB issued, %.1f MB over the link\n",
           (double)plan.total_bytes * 1e-6, issued_c * 1e-6, link_c * 1e-6);
    printf("   dispatch %8.2f us | copy-conv %7.1f GB/s = %5.1f%% of ceiling | issued %7.1f GB/s = %5.1f%% | "
           "topk-logical %7.1f GB/s | recv-logical %7.1f GB/s | link %7.1f GB/s\n",
           us_d, copy_d / us_d * 1e-3, 100.0 * copy_d / us_d * 1e-3 / ceiling_gbs, issued_d / us_d * 1e-3,
           100.0 * issued_d / us_d * 1e-3 / ceiling_gbs, topk_d / us_d * 1e-3, recv_d / us_d * 1e-3,
           link_d / us_d * 1e-3);
    printf("   combine  %8.2f us | copy-conv %7.1f GB/s = %5.1f%% of ceiling | issued %7.1f GB/s = %5.1f%% | "
           "topk-logical (BF16 rows) %7.1f GB/s\n",
           us_c, copy_c / us_c * 1e-3, 100.0 * copy_c / us_c * 1e-3 / ceiling_gbs, issued_c / us_c * 1e-3,
           100.0 * issued_c / us_c * 1e-3 / ceiling_gbs, (double)R * T * K * bf16_row / us_c * 1e-3);
  }
  for (int i = 0; i < 2 * c->reps + 1; ++i) EPF_BENCH_CUDA(cudaEventDestroy(ev[i]));
  free(ev);
  free(td);
  free(tc);
  EPF_BENCH_CUDA(cudaGraphExecDestroy(xd));
  EPF_BENCH_CUDA(cudaGraphExecDestroy(xc));
  EPF_BENCH_CUDA(cudaGraphDestroy(gd));
  EPF_BENCH_CUDA(cudaGraphDestroy(gc));
  EPF_BENCH_CUDA(cudaStreamDestroy(s));
  EPF_BENCH_CUDA(cudaFree(win));
  EPF_BENCH_CUDA(cudaFree(state));
  EPF_BENCH_CUDA(cudaFreeHost(rec_h));
  EPF_BENCH_CUDA(cudaFree(x));
  EPF_BENCH_CUDA(cudaFree(out));
  EPF_BENCH_CUDA(cudaFree(topk));
  EPF_BENCH_CUDA(cudaFree(w));
  EPF_BENCH_CUDA(cudaFree(recv_counts));
  EPF_BENCH_CUDA(cudaFree(round));
  if (y != NULL) EPF_BENCH_CUDA(cudaFree(y));
  if (view != NULL) EPF_BENCH_CUDA(cudaFree(view));
  if (view_scales != NULL) EPF_BENCH_CUDA(cudaFree(view_scales));
}

int main(int argc, char** argv) {
  bl_case_t c;
  int tokens[8] = {1, 128, 256}, ntok = 3;
  double ceiling;
  int n = 0, only = -1;
  memset(&c, 0, sizeof(c));
  c.R = 8;
  c.H = 7168;
  c.K = 8;
  c.E = 256;
  c.reps = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--ranks")) c.R = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--hidden")) c.H = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--topk")) c.K = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--experts")) c.E = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--reps")) c.reps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--bpr")) c.bpr = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--threads")) c.threads = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--case")) only = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--tokens")) {
      char* p = argv[i + 1];
      ntok = 0;
      while (*p && ntok < 8) {
        tokens[ntok++] = (int)strtol(p, &p, 10);
        if (*p == ',') ++p;
      }
    } else {
      fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
    printf("SKIP: no GPU\n");
    return 0;
  }
  {
    cudaDeviceProp prop;
    EPF_BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
    printf("bench_ll on %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
  }
  ceiling = epf_bench_copy_ceiling_gbs((size_t)1 << 30, 20);
  printf("copy ceiling: %.0f GB/s (cudaMemcpyAsync D2D of 1 GiB, read + write counted)\n", ceiling);
  printf("times: median of %d CUDA-graph replays, fused send+receive kernel per op, all %d virtual ranks "
         "in one launch\n",
         c.reps, c.R);
  bl_floor(c.R, 2, c.threads > 0 ? c.threads : 512, c.reps); /* the T = 1 grid */
  for (int ti = 0; ti < ntok; ++ti) {
    /* {dispatch payload, combine payload, pull combine, rank-major}: each rank-major row right
     * after its expert-major twin (the MXFP8 combine pull: expert-major only) */
    static const int pl[][4] = {{EPF_PAYLOAD_BF16, EPF_PAYLOAD_BF16, 0, 0},  {EPF_PAYLOAD_BF16, EPF_PAYLOAD_BF16, 0, 1},
                                {EPF_PAYLOAD_BF16, EPF_PAYLOAD_BF16, 1, 0},  {EPF_PAYLOAD_BF16, EPF_PAYLOAD_BF16, 1, 1},
                                {EPF_PAYLOAD_MXFP8, EPF_PAYLOAD_BF16, 0, 0}, {EPF_PAYLOAD_MXFP8, EPF_PAYLOAD_BF16, 0, 1},
                                {EPF_PAYLOAD_FP8_128, EPF_PAYLOAD_BF16, 0, 0}, {EPF_PAYLOAD_FP8_128, EPF_PAYLOAD_BF16, 0, 1},
                                {EPF_PAYLOAD_BF16, EPF_PAYLOAD_MXFP8, 0, 0}, {EPF_PAYLOAD_BF16, EPF_PAYLOAD_MXFP8, 0, 1},
                                {EPF_PAYLOAD_BF16, EPF_PAYLOAD_MXFP8, 1, 0}};
    for (int pi = 0; pi < (int)(sizeof(pl) / sizeof(pl[0])); ++pi) {
      if (only >= 0 && pi != only) continue;
      c.T = tokens[ti];
      c.payload = pl[pi][0];
      c.cpayload = pl[pi][1];
      c.pull = pl[pi][2];
      c.rm = pl[pi][3];
      if (epf_payload_vector_width(c.payload) == 0 || c.H % epf_payload_vector_width(c.payload) != 0) continue;
      bl_run(&c, ceiling);
    }
  }
  return 0;
}
