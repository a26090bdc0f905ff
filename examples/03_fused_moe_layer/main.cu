/* 03_fused_moe_layer — a whole MoE layer as a user fuses it: ONE kernel for router + route update +
 * dispatch (MXFP8 on the way) -> experts (epilogue writes straight into the window) -> combine
 * fused with the residual.
 *
 * Learning objectives
 *   - Write your own kernels around the library: a router (logits on tensor cores, softmax top-k,
 *     router.cuh) that writes topk_idx / topk_weights, runs the route update and dispatches its
 *     tokens quantized to MXFP8 in the SAME kernel; an expert kernel that reads the receive region
 *     IN PLACE (MXFP8 rows + E8M0 scales) and whose epilogue stores its BF16 outputs where the
 *     combine will pull them (epf_plan_expert_out_offset); a combine kernel built from the public
 *     blocks (epf_combine_signal_block, epf_combine_wait_block, epf_combine_reduce_rows_warp) that
 *     adds the residual inside the same FP32 fma chain.
 *   - Where the fusion boundaries are, and what a fusion can and cannot save (README.md).
 * Key concepts: expert-major receive rows (docs/layouts.md), rank rendezvous between phases of a
 *   fused kernel (epf_rank_barrier_block), the route's SPLIT arrangement once the ids are complete,
 *   the pull combine protocol (expert side signals SIG_COMBINE with the route epoch once outputs
 *   are in place; source side waits, then loads peers' rows through LSA pointers),
 *   [collective:block] / [collective:warp] contracts, co-residency of virtual-rank grids
 *   (epf_virtual_grid_check).
 * When to use it: as the template of a production MoE layer: replace the scale "expert" with a
 *   grouped GEMM over the expert-major segments, keep the router and combine kernels.
 * Performance notes: the router is a BF16 GEMM on mma.sync (64-token tiles, Wr read once per tile);
 *   the fused kernel's grid fills the GPU (occupancy API) and balances the router over every block.
 *   Fusion saves the launch boundaries and the router -> route gap; it cannot overlap the router
 *   with the sends, because the send rows need the global count exchange (fused >= router +
 *   exchange + sends; README.md and docs/dev/perf-log/moe-layer.md have the numbers). The residual
 *   costs no extra pass: it is lane K of the reduction (weight 1), so out = BF16(sum_k w_k y_k +
 *   residual) with ONE rounding. The expert stage is a scalar dequant-scale loop, not tuned.
 *
 * Fusion boundaries (README.md, "Fusion boundaries, honestly"): four launches — the fused router +
 * route update + dispatch (R x bpr blocks, co-resident, checked with epf_virtual_grid_check; else
 * the example says so and runs --unfused), the experts, combine + residual; the expert epilogue ->
 * combine boundary stays a launch boundary (every output complete before the combine signal).
 * --unfused runs five launches (router_kernel, epf_route_update, epf_ht_dispatch, experts,
 * combine); --both runs the two in one process. The router is checked against a double-precision
 * CPU router within a tolerance (a valid top-k), the rest of the layer bit-exact against the CPU
 * reference on the GPU's own ids and weights.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epfuse/epfuse.cuh"
#include "epfuse/ht/kernels.cuh"
#include "ex_common.h"
#include "router.cuh" /* router_tile_block: the tensor-core router both paths share */

#define COMBINE_THREADS 512
#define ROUNDS 5 /* timed rounds per path (after one warm-up round); the tables print medians */

/* ---- router (--unfused): one block per 64-token tile of one rank (grid: tiles x R), the same tiles
 * and the same device function as the fused kernel, so both paths produce the same bits ---------- */
__global__ void __launch_bounds__(ROUTER_THREADS, 2)
    router_kernel(const uint16_t* x, const uint16_t* wr, int T, int H, int E, int K, int32_t* out_idx, float* out_w) {
  extern __shared__ uint4 router_smem[];
  const int64_t t0 = (int64_t)blockIdx.y * T + (int64_t)blockIdx.x * ROUTER_TILE_TOKENS; /* packed [R][T] */
  const int left = T - (int)blockIdx.x * ROUTER_TILE_TOKENS;
  router_tile_block(x + t0 * H, wr, H, E, K, left < ROUTER_TILE_TOKENS ? left : ROUTER_TILE_TOKENS, out_idx + t0 * K,
                    out_w + t0 * K, router_smem);
}

/* ---- the fused kernel: router + route update + MXFP8 dispatch in ONE launch ----------------------
 * Grid: R * bpr blocks of ROUTER_THREADS (block b plays rank b / bpr), bpr from the occupancy API so
 * the grid fills the GPU, all co-resident (epf_virtual_grid_check); dynamic smem = fused_smem_bytes.
 * The phases, and why each boundary is where it is:
 *   1. router: the rank's 64-token tiles round-robin over ALL bpr blocks (balanced; the route's
 *      token partition, which leaves block 0 idle, does not constrain it because of step 2);
 *   2. rank rendezvous A: every topk_idx / topk_weights store of the rank before any route read;
 *   3. route update in the first nrb blocks only (epf_route_blocks_per_rank, what the ready-made
 *      update uses): after rendezvous A the whole topk_idx is written, so the SPLIT arrangement is
 *      allowed (epf_route_update_split_block); the other blocks go straight to step 4;
 *   4. rank rendezvous B: block 0's send offsets, the route blocks' slots / destination ranks before
 *      any send (they are read with ld.relaxed.gpu after the barrier's acq_rel fence);
 *   5. sends: a warp per token over all bpr * 8 warps of the rank, MXFP8 on the way; the last block
 *      signals every peer, block 0 waits for every peer's rows.
 * The step's epoch is the route's epoch word + 1, read at the start (block 0 of the route stores
 * the new epoch only after rendezvous A, which every block reaches after its read). */
static size_t fused_smem_bytes(const epf_route_t* route, int E) {
  const size_t route_smem = epf_route_smem_bytes(&route->layout, ROUTER_THREADS);
  const size_t router_smem = router_smem_bytes(E);
  return route_smem > router_smem ? route_smem : router_smem;
}

// example-begin fused_router_dispatch
__global__ void __launch_bounds__(ROUTER_THREADS, 2)
    fused_router_dispatch_kernel(epf_route_t route, epf_team_t team, epf_plan_t plan, const uint16_t* x,
                                 const uint16_t* wr, int T, int bpr, int nrb, int32_t* topk_idx, float* topk_w,
                                 epf_ht_state_t* state, uint64_t* rank_barrier, epf_wait_t w) {
  extern __shared__ uint4 fused_smem[]; /* the router's stages and logits, then the route's state */
  const epf_team_t me = epf_team_for_block(team, 1, bpr);
  const int rank = me.rank, block = (int)(blockIdx.x % (unsigned)bpr), lane = epf_lane_id();
  const int K = plan.top_k, E = plan.num_experts, H = plan.hidden, EL = plan.experts_per_rank;
  const uint64_t rank_tok = (uint64_t)rank * (uint64_t)plan.max_tokens_per_rank; /* packed inputs */
  int32_t* idx = topk_idx + rank_tok * K; /* this rank's [T][K] */
  float* wts = topk_w + rank_tok * K;
  const uint32_t epoch = *epf_route_epoch_ptr(&route, rank) + 1u; /* before rendezvous A */
  w.rank = rank;

  /* 1. router: tiles block, block + bpr, ... (the same tiles as router_kernel) */
  for (int t0 = block * ROUTER_TILE_TOKENS; t0 < T; t0 += bpr * ROUTER_TILE_TOKENS)
    router_tile_block(x + (rank_tok + (uint64_t)t0) * H, wr, H, E, K,
                      T - t0 < ROUTER_TILE_TOKENS ? T - t0 : ROUTER_TILE_TOKENS, idx + (int64_t)t0 * K,
                      wts + (int64_t)t0 * K, fused_smem);

  /* 2. rendezvous A: the rank's ids and weights are complete */
  epf_status_t st = epf_rank_barrier_block(rank_barrier + 2 * rank, (uint32_t)bpr, epoch, w);

  /* 3. the route update of this rank in its first nrb blocks (count exchange with every peer inside) */
  if (block < nrb) {
    const epf_status_t rs =
        epf_route_update_split_block(&route, rank, me, &plan, idx, T, block, nrb, w, NULL, fused_smem);
    if (st == EPF_OK) st = rs;
  }

  /* 4. rendezvous B: send offsets, slots and destination ranks before any send */
  const epf_status_t bst = epf_rank_barrier_block(rank_barrier + 2 * rank + 1, (uint32_t)bpr, epoch, w); /* bounded */
  const bool send = !__syncthreads_or(st != EPF_OK || bst != EPF_OK);

  /* 5. send: a warp per token over all the rank's warps, MXFP8 on the way, into the final rows */
  const uint32_t* send_off = (const uint32_t*)epf_route_ptr(&route, rank, EPF_ROUTE_SEND_OFFSET); /* [E] */
  const uint32_t* dst_rank = (const uint32_t*)epf_route_ptr(&route, rank, EPF_ROUTE_DST_RANK);    /* [T][K] */
  const uint32_t* slot = (const uint32_t*)epf_route_ptr(&route, rank, EPF_ROUTE_SLOT);            /* [T][K] */
  const int nwarps = bpr * (ROUTER_THREADS / 32);
  uint32_t dropped = 0;
  for (int64_t t = (int64_t)block * (ROUTER_THREADS / 32) + epf_warp_id(); send && t < T; t += nwarps) {
    const int e = lane < K ? idx[t * K + lane] : -1;
    const int d = lane < K ? (int32_t)epf_ld_relaxed_gpu_u32(dst_rank + t * K + lane) : -1;
    const int64_t row = d >= 0 ? (int64_t)(int32_t)epf_ld_relaxed_gpu_u32(send_off + e) +
                                     (int32_t)epf_ld_relaxed_gpu_u32(slot + t * K + lane)
                               : -1;
    if (lane < K && d >= 0) epf_dispatch_meta_em(me, &plan, d, row, (int)t, lane, e - d * EL, wts[t * K + lane]);
    dropped += epf_dispatch_send_row_quant_warp(me, &plan, x + (rank_tok + (uint64_t)t) * H, d, row, K);
  }
  if (lane == 0 && dropped != 0u && w.record != NULL) epf_error_count_add(&w.record->recv_overflow, dropped);
  if (epf_arrive_last_block(&state[rank].arrive[0], (uint32_t)bpr, 1u)) {
    epf_dispatch_signal_block(me, &plan, epoch); /* .sys release, after every block's rows */
    if (threadIdx.x == 0) state[rank].arrive[0] = 0u;
  }
  /* 6. receive half: every peer's rows are in this rank's window */
  if (block == 0) (void)epf_dispatch_wait_block(me, &plan, epoch, w); /* failures land in w.record */
}
// example-end fused_router_dispatch

/* ---- experts: y = bf16(dequant(MXFP8 row) * f(le, rank)), read in place, written into EXPERT_OUT -- */
__global__ void experts_kernel(epf_route_t route, epf_plan_t plan, char* window) {
  const int rank = (int)blockIdx.y; /* virtual rank */
  const epf_route_segment_t* seg = (const epf_route_segment_t*)epf_route_ptr(&route, rank, EPF_ROUTE_RECV_SEGMENT);
  char* base = window + (uint64_t)rank * plan.total_bytes; /* this rank's slice */
  const int lane = epf_lane_id();
  const int gw = (int)(blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)), nw = (int)(gridDim.x * (blockDim.x >> 5));
  for (int le = 0; le < plan.experts_per_rank; ++le) {
    const float f = ex_expert_factor(le, rank);
    int64_t end = seg[le].begin + seg[le].count;
    if (end > plan.recv_capacity) end = plan.recv_capacity;
    // example-begin expert_epilogue
    for (int64_t r = seg[le].begin + gw; r < end; r += nw) {
      const uint8_t* q = (const uint8_t*)base + epf_plan_recv_token_offset(&plan, r); /* E4M3 [H] */
      const uint8_t* s = (const uint8_t*)base + epf_plan_recv_scale_offset(&plan, r); /* E8M0 [H/32] */
      uint16_t* y = (uint16_t*)(base + epf_plan_expert_out_offset(&plan, r));          /* BF16 [H] */
      for (int h = lane; h < plan.hidden; h += 32) {
        const float v = epf_mxfp8_dequantize_ref(q[h], s[h / 32]);
        y[h] = __bfloat16_as_ushort(__float2bfloat16_rn(__fmul_rn(v, f)));
      }
    }
    // example-end expert_epilogue
  }
}

/* ---- combine + residual: pull every copy's output from its expert rank, reduce in k order, then
 * the residual (lane K, weight 1) in the same FP32 chain. Grid: R * bpr blocks (co-resident). ---- */
// example-begin combine_residual
__global__ void combine_residual_kernel(epf_route_t route, epf_team_t team, epf_plan_t plan, const int32_t* topk_idx,
                                        const float* topk_w, const uint16_t* residual, int bpr, epf_wait_t w,
                                        uint16_t* out) {
  const epf_team_t me = epf_team_for_block(team, 1, bpr); /* virtual rank of this block */
  const int rank = me.rank, block = (int)(blockIdx.x % (unsigned)bpr);
  const int K = plan.top_k, T = plan.max_tokens_per_rank, H = plan.hidden, lane = epf_lane_id();
  const uint32_t epoch = *epf_route_epoch_ptr(&route, rank); /* this step's epoch (device-side) */
  const epf_route_header_t* hdr = (const epf_route_header_t*)epf_route_ptr(&route, rank, EPF_ROUTE_HEADER);
  const int32_t* dst_rank = (const int32_t*)epf_route_ptr(&route, rank, EPF_ROUTE_DST_RANK);   /* [T][K] */
  const int32_t* slot = (const int32_t*)epf_route_ptr(&route, rank, EPF_ROUTE_SLOT);           /* [T][K] */
  const int32_t* send_off = (const int32_t*)epf_route_ptr(&route, rank, EPF_ROUTE_SEND_OFFSET); /* [E] */
  const int32_t* topk = topk_idx + (uint64_t)rank * T * K;                                        /* [T][K] */
  w.rank = rank;
  /* expert side: this rank's outputs are complete (previous launch) -> tell every peer */
  if (block == 0) epf_combine_signal_block(me, &plan, epoch);
  /* source side: wait until every peer's outputs are in place */
  (void)epf_combine_wait_block(me, &plan, epoch, w); /* a timeout lands in w.record */
  const int nw = bpr * (int)(blockDim.x >> 5);
  for (int t = block * (int)(blockDim.x >> 5) + epf_warp_id(); t < hdr->num_tokens; t += nw) {
    const uint64_t tok = (uint64_t)rank * T + (uint64_t)t;
    const void* my_row = NULL;
    float my_w = 0.f;
    if (lane < K) {
      const int d = dst_rank[(int64_t)t * K + lane];
      if (d >= 0) {
        const int64_t row = (int64_t)send_off[topk[(int64_t)t * K + lane]] + slot[(int64_t)t * K + lane];
        if (row < plan.recv_capacity) my_row = epf_peer_ptr(me, epf_plan_expert_out_offset(&plan, row), d);
        my_w = topk_w[tok * K + lane];
      }
    } else if (lane == K) {
      my_row = residual + tok * H; /* the residual: one more row, weight 1, after the K experts */
      my_w = 1.0f;
    }
    epf_combine_reduce_rows_warp(my_row, my_w, __ballot_sync(0xffffffffu, my_row != NULL), H, 0, out + tok * H);
  }
}
// example-end combine_residual

/* ---- the CPU check of the router ------------------------------------------------------------------
 * The tensor cores' FP32 accumulation order is not reproducible on the CPU, so the check is "a valid
 * top-k within a tolerance": the CPU computes the logits in double (BF16 products are exact, the
 * double sum of H <= 2^16 of them is within 2^-40 relative); a GPU logit is an FP32 sum of the same
 * products in at most n = H/16 + 32 rounded additions (H/16 k-steps into the accumulator, up to 16
 * inside an mma, 3 to add the k-step groups' partials), so |gpu - cpu| <= n 2^-22 sum_h |x_h w_h|
 * (the usual gamma_n bound with u = 2^-23, doubled for the tensor cores' truncating adder).
 * A chosen expert passes if its CPU logit >= the CPU's K-th largest - tol, tol = twice the largest
 * bound of the token's experts (both logits of a comparison may be off). The weights must match the
 * softmax of the CPU logits at the GPU's ids within 1e-3 absolute: dw <= 2 max |dlogit|, and the
 * logit error is ~sqrt(n) 2^-24 |logit| in practice (~1e-5 here), so 1e-3 fails a wrong softmax or
 * a wrong logit well below the selection tolerance, not rounding. Returns 1 if the token fails. */
static int router_check_token(const uint16_t* xt, const uint16_t* wr, int H, int E, int K, const int32_t* gidx,
                              const float* gw, double* logit, int* near_tie, double* max_w_err) {
  double amax = 0.0, kth, next = -1e300;
  int bad = 0;
  for (int e = 0; e < E; ++e) {
    double acc = 0.0, a = 0.0;
    for (int h = 0; h < H; ++h) {
      const double p = (double)ex_bf16_f(xt[h]) * (double)ex_bf16_f(wr[(int64_t)e * H + h]);
      acc += p;
      a += fabs(p);
    }
    logit[e] = acc;
    amax = a > amax ? a : amax;
  }
  const double tol = 2.0 * (H / 16 + 32) * ldexp(1.0, -22) * amax;
  { /* the K-th and (K+1)-th largest CPU logits */
    double top[33] = {0}; /* entries [0, min(E, K + 1)) are written before any is read */
    int n = 0;
    for (int e = 0; e < E; ++e) { /* insertion into a sorted list of K + 1 */
      int i = n < K + 1 ? n++ : K + 1;
      if (i == K + 1 && logit[e] <= top[K]) continue;
      if (i == K + 1) i = K;
      while (i > 0 && top[i - 1] < logit[e]) {
        top[i] = top[i - 1];
        --i;
      }
      top[i] = logit[e];
    }
    kth = top[K - 1];
    if (K < E) next = top[K];
  }
  *near_tie += K < E && kth - next <= tol;
  double mx = -1e300, sum = 0.0;
  for (int k = 0; k < K; ++k) {
    const int e = gidx[k];
    if (e < 0 || e >= E) return 1;
    for (int j = 0; j < k; ++j) bad |= gidx[j] == e;
    bad |= logit[e] < kth - tol;
    mx = logit[e] > mx ? logit[e] : mx;
  }
  if (bad) return 1;
  for (int k = 0; k < K; ++k) sum += exp(logit[gidx[k]] - mx);
  for (int k = 0; k < K; ++k) {
    const double err = fabs(exp(logit[gidx[k]] - mx) / sum - (double)gw[k]);
    *max_w_err = err > *max_w_err ? err : *max_w_err;
    bad |= err > 1e-3;
  }
  return bad;
}

/* ---- one path, warm-up + ROUNDS timed rounds, then its check ------------------------------------- */
typedef struct {
  int R, T, H, K, E, bpr, fbpr, nrb, check_tokens;
  size_t fsmem, rsmem;
  epf_plan_t plan;
  epf_route_t route;
  epf_team_t team;
  char* window;
  const uint16_t *x, *wr; /* host */
  uint16_t *d_x, *d_wr, *d_out;
  int32_t* d_topk;
  float* d_w;
  epf_ht_state_t *d_state, *d_fstate;
  uint64_t* d_rank_barrier;
  epf_wait_t wt;
  epf_error_record_t* rec_h;
  float stage_us[4]; /* medians: router (or fused), route + dispatch, experts, combine */
} layer_t;

static int cmp_float(const void* a, const void* b) {
  const float x = *(const float*)a, y = *(const float*)b;
  return x < y ? -1 : x > y;
}

static void run_path(layer_t* L, int fused) {
  const int R = L->R, T = L->T, H = L->H, K = L->K, E = L->E;
  const int64_t n = (int64_t)R * T;
  epf_route_step_t rs = epf_route_step_make(L->d_topk, T, L->wt);
  epf_ht_step_t hs = EPF_HT_STEP_INIT;
  hs.x = L->d_x;
  hs.topk_weights = L->d_w;
  hs.state = L->d_state;
  hs.wait = L->wt;
  cudaEvent_t ev[5];
  float ms[ROUNDS][4];
  for (int i = 0; i < 5; ++i) EX_CK(cudaEventCreate(&ev[i]));
  for (int round = -1; round < ROUNDS; ++round) { /* round -1: warm-up; epochs advance, nothing is reset */
    EX_CK(cudaMemset(L->d_out, 0xA7, (size_t)n * H * 2));
    EX_CK(cudaEventRecord(ev[0]));
    if (fused) { /* ONE launch: router + route update + MXFP8 dispatch (+ receive wait) */
      fused_router_dispatch_kernel<<<(unsigned)(R * L->fbpr), ROUTER_THREADS, L->fsmem>>>(
          L->route, L->team, L->plan, L->d_x, L->d_wr, T, L->fbpr, L->nrb, L->d_topk, L->d_w, L->d_fstate,
          L->d_rank_barrier, L->wt);
      EX_CK(cudaGetLastError());
      EX_CK(cudaEventRecord(ev[1]));
    } else { /* three launches */
      router_kernel<<<dim3((unsigned)((T + ROUTER_TILE_TOKENS - 1) / ROUTER_TILE_TOKENS), (unsigned)R), ROUTER_THREADS,
                      L->rsmem>>>(L->d_x, L->d_wr, T, H, E, K, L->d_topk, L->d_w);
      EX_CK(cudaGetLastError());
      EX_CK(cudaEventRecord(ev[1]));
      EX_CS(epf_route_update(&L->route, L->team, &L->plan, &rs, 0));
      EX_CS(epf_ht_dispatch(&L->route, L->team, &L->plan, &hs, L->d_topk, EPF_HT_BOTH, 0));
    }
    EX_CK(cudaEventRecord(ev[2]));
    experts_kernel<<<dim3(64, (unsigned)R), 256>>>(L->route, L->plan, L->window);
    EX_CK(cudaGetLastError());
    EX_CK(cudaEventRecord(ev[3]));
    combine_residual_kernel<<<(unsigned)(R * L->bpr), COMBINE_THREADS>>>(L->route, L->team, L->plan, L->d_topk, L->d_w,
                                                                         L->d_x, L->bpr, L->wt, L->d_out);
    EX_CK(cudaGetLastError());
    EX_CK(cudaEventRecord(ev[4]));
    EX_CK(cudaDeviceSynchronize());
    if (round >= 0)
      for (int i = 0; i < 4; ++i) EX_CK(cudaEventElapsedTime(&ms[round][i], ev[i], ev[i + 1]));
  }
  for (int i = 0; i < 5; ++i) EX_CK(cudaEventDestroy(ev[i]));
  for (int i = 0; i < 4; ++i) {
    float v[ROUNDS];
    for (int r = 0; r < ROUNDS; ++r) v[r] = ms[r][i];
    qsort(v, ROUNDS, sizeof(float), cmp_float);
    L->stage_us[i] = v[ROUNDS / 2] * 1e3f;
  }
}

/* the CPU reference of the last round, on check_tokens tokens per rank (all if <= 0 or >= T): token
 * i of the sample is i (T - 1) / (N - 1), so the first and last token of every rank are in it. The
 * layer of a checked token is exact whatever the others do: it uses the GPU's ids and weights. */
static int check_path(const layer_t* L, const char* name) {
  const int R = L->R, T = L->T, H = L->H, K = L->K, E = L->E;
  const int64_t n = (int64_t)R * T;
  const int N = L->check_tokens <= 0 || L->check_tokens >= T ? T : L->check_tokens;
  if (ex_record_check(L->rec_h)) return 1; /* status, overflow, dropped routes */
  int32_t* g_idx = (int32_t*)malloc((size_t)n * K * 4);
  float* g_w = (float*)malloc((size_t)n * K * 4);
  uint16_t* out = (uint16_t*)malloc((size_t)n * H * 2);
  EX_CK(cudaMemcpy(g_idx, L->d_topk, (size_t)n * K * 4, cudaMemcpyDeviceToHost));
  EX_CK(cudaMemcpy(g_w, L->d_w, (size_t)n * K * 4, cudaMemcpyDeviceToHost));
  EX_CK(cudaMemcpy(out, L->d_out, (size_t)n * H * 2, cudaMemcpyDeviceToHost));
  double* logit = (double*)malloc((size_t)E * sizeof(double));
  float* scratch = (float*)malloc((size_t)3 * H * 4);
  uint16_t* want = (uint16_t*)malloc((size_t)H * 2);
  int64_t router_bad = 0, layer_bad = 0, checked = 0;
  int near_tie = 0;
  double max_w_err = 0.0;
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < N; ++i) {
      const int64_t t = (int64_t)r * T + (N == T ? i : N == 1 ? 0 : (int64_t)i * (T - 1) / (N - 1));
      const int rb = router_check_token(L->x + t * H, L->wr, H, E, K, g_idx + t * K, g_w + t * K, logit, &near_tie,
                                        &max_w_err);
      if (rb && router_bad < 3)
        fprintf(stderr, "%s: ROUTER MISMATCH: rank %d token %lld\n", name, r, (long long)(t % T));
      router_bad += rb;
      /* dispatch (MXFP8) -> expert scale -> combine in k order -> + residual (x itself), one rounding */
      ex_ref_combine_residual(&L->plan, L->x + t * H, g_idx + t * K, g_w + t * K, L->x + t * H, scratch, want);
      const int bad = memcmp(out + t * H, want, (size_t)H * 2) != 0;
      if (bad && layer_bad < 3) fprintf(stderr, "%s: MISMATCH: rank %d token %lld\n", name, r, (long long)(t % T));
      layer_bad += bad;
      ++checked;
    }
  printf("router: %lld of %lld checked tokens are a valid top-%d (tolerance bound; %d near-ties), max weight diff "
         "%.2e\n",
         (long long)(checked - router_bad), (long long)checked, K, near_tie, max_w_err);
  printf("layer: %lld of %lld checked tokens bit-exact vs CPU reference: %s\n", (long long)(checked - layer_bad),
         (long long)checked, layer_bad || router_bad ? "FAILED" : "OK");
  free(g_idx), free(g_w), free(out), free(logit), free(scratch), free(want);
  return layer_bad || router_bad ? 1 : 0;
}

static void print_table(const layer_t* L, int fused) {
  const float* s = L->stage_us;
  printf("path: %s\n", fused ? "fused (router + route update + dispatch in one kernel, 4 launches)"
                             : "unfused (5 launches)");
  printf("| stage | kernel(s) | us (median of %d) |\n| --- | --- | ---: |\n", ROUNDS);
  if (fused) {
    printf("| router + route + dispatch (MXFP8) | fused_router_dispatch_kernel | %.1f |\n", s[0] + s[1]);
  } else {
    printf("| router (softmax top-k) | router_kernel | %.1f |\n", s[0]);
    printf("| route + dispatch (MXFP8) | epf_route_update, epf_ht_dispatch | %.1f |\n", s[1]);
    printf("| router + route + dispatch (sum) | | %.1f |\n", s[0] + s[1]);
  }
  printf("| experts (in place -> EXPERT_OUT) | experts_kernel | %.1f |\n", s[2]);
  printf("| combine + residual | combine_residual_kernel | %.1f |\n", s[3]);
}

int main(int argc, char** argv) {
  int R = 8, T = 512, H = 2048, K = 4, E = 64, ctest = 0, fused = 1, both = 0, check_tokens = -1;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--ctest")) ctest = 1;
    else if (!strcmp(argv[i], "--unfused")) fused = 0;
    else if (!strcmp(argv[i], "--both")) both = 1;
    else if (!strcmp(argv[i], "--shape") && i + 1 < argc && !strcmp(argv[i + 1], "dsv3")) {
      ++i; /* DeepSeek-V3: 8 ranks, 4096 tokens per rank, hidden 7168, top-8 of 256 experts */
      R = 8, T = 4096, H = 7168, K = 8, E = 256;
      if (check_tokens < 0) check_tokens = 64;
    } else if (!strcmp(argv[i], "--ranks") && i + 1 < argc) R = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) T = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--hidden") && i + 1 < argc) H = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--topk") && i + 1 < argc) K = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--experts") && i + 1 < argc) E = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--check-tokens") && i + 1 < argc) check_tokens = atoi(argv[++i]);
    else {
      printf("usage: %s [--shape dsv3] [--ranks 8] [--tokens 512] [--hidden 2048] [--topk 4] [--experts 64]\n"
             "          [--unfused | --both] [--check-tokens N] [--ctest]\n"
             "  router + route + dispatch (MXFP8) in one kernel -> experts -> combine + residual on R virtual\n"
             "  ranks, checked against a CPU reference of the whole layer. --unfused: router, route update\n"
             "  and dispatch as three launches (five in all); --both: the unfused path, then the fused one,\n"
             "  on the same inputs, and the ratio. --shape dsv3: R 8, T 4096, H 7168, top-8 of 256.\n"
             "  --check-tokens N: check N tokens per rank (default: all; 64 with --shape dsv3).\n"
             "  E <= 256, K < 32, K <= E, E %% R == 0, H %% 32 == 0.\n", argv[0]);
      return strcmp(argv[i], "--help") ? 2 : 0;
    }
  }
  if (R < 1 || T < 1 || E < 1 || E > 256 || K < 1 || K >= 32 || K > E || E % R || H < 32 || H % 32) {
    fprintf(stderr, "unsupported shape (E <= 256, K < 32, K <= E, E %% R == 0, H %% 32 == 0)\n");
    return 2;
  }
  const int EL = E / R;
  const int64_t n = (int64_t)R * T;

  epf_config_t cfg = EPF_CONFIG_INIT;
  cfg.nranks = R;
  cfg.num_experts = E;
  cfg.top_k = K;
  cfg.hidden = H;
  cfg.max_tokens_per_rank = T;
  cfg.layout = EPF_LAYOUT_EXPERT_MAJOR;
  cfg.payload = EPF_PAYLOAD_MXFP8; /* quantized on the way by the dispatch */
  cfg.combine_payload = EPF_PAYLOAD_BF16;
  cfg.expert_alignment = 1;
  cfg.recv_capacity = (int64_t)R * T * (K < EL ? K : EL); /* the worst case: never overflows */
  layer_t L;
  memset(&L, 0, sizeof(L));
  EX_CS(epf_plan_compute(&cfg, &L.plan));
  printf("fused MoE layer: %d virtual ranks, T=%d H=%d top-%d of %d experts, dispatch MXFP8, combine BF16 + residual\n",
         R, T, H, K, E);
  printf("window: %d x %.1f MiB = %.2f GiB (recv_capacity %lld rows per rank, the worst case)\n", R,
         (double)L.plan.total_bytes / (1 << 20), (double)L.plan.total_bytes * R / (1 << 30),
         (long long)L.plan.recv_capacity);
  ex_gpu_or_exit(1, ctest);
  {
    int dev = 0, major = 0;
    EX_CK(cudaGetDevice(&dev));
    EX_CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major < 8) { /* the router's BF16 mma and cp.async (router.cuh) */
      fprintf(stderr, "this example needs a GPU of compute capability 8.0 or newer (this one: %d.x)\n", major);
      exit(ctest ? 77 : 1);
    }
  }

  L.R = R, L.T = T, L.H = H, L.K = K, L.E = E, L.bpr = 8, L.check_tokens = check_tokens;
  uint64_t seed = 7;
  uint16_t* x = (uint16_t*)malloc((size_t)n * H * 2);
  uint16_t* wr = (uint16_t*)malloc((size_t)E * H * 2);
  for (int64_t i = 0; i < n * H; ++i) x[i] = ex_bf16_rne((float)((int64_t)(ex_rand(&seed) % 2001) - 1000) / 500.0f);
  for (int64_t i = 0; i < (int64_t)E * H; ++i) wr[i] = ex_bf16_rne((float)((int64_t)(ex_rand(&seed) % 2001) - 1000) / 20000.0f);
  L.x = x, L.wr = wr;

  ex_vteam_t vt; /* ex_common.h: R window slices (zeroed), the team, R route buffers (int32 ids) */
  ex_vteam_make(&L.plan, &vt);
  L.window = vt.window, L.team = vt.team, L.route = vt.route;
  L.d_x = (uint16_t*)ex_dev_copy(x, (size_t)n * H * 2);
  L.d_wr = (uint16_t*)ex_dev_copy(wr, (size_t)E * H * 2);
  L.d_state = (epf_ht_state_t*)ex_dev_zeroed(R * sizeof(epf_ht_state_t));  /* epf_ht_dispatch's */
  L.d_fstate = (epf_ht_state_t*)ex_dev_zeroed(R * sizeof(epf_ht_state_t)); /* the fused kernel's arrivals */
  L.d_rank_barrier = (uint64_t*)ex_dev_zeroed(2 * R * sizeof(uint64_t)); /* fused kernel: 2 rendezvous words per rank */
  EX_CK(cudaMalloc(&L.d_out, (size_t)n * H * 2));
  EX_CK(cudaMalloc(&L.d_topk, (size_t)n * K * 4));
  EX_CK(cudaMalloc(&L.d_w, (size_t)n * K * 4));
  epf_error_record_t* rec_d;
  ex_record_make(&L.rec_h, &rec_d);
  L.wt = epf_wait_make(L.plan.timeout_ns, rec_d, NULL, 0);

  int dev = 0, sms = 0, per_sm = 0;
  EX_CK(cudaGetDevice(&dev));
  EX_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  EX_CS(epf_virtual_grid_check((const void*)combine_residual_kernel, COMBINE_THREADS, 0, R * L.bpr, dev));
  /* the router's stages take more than the default 48 KiB at large E */
  L.rsmem = router_smem_bytes(E);
  L.fsmem = fused_smem_bytes(&L.route, E);
  EX_CK(cudaFuncSetAttribute(router_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)L.rsmem));
  EX_CK(cudaFuncSetAttribute(fused_router_dispatch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)L.fsmem));
  /* the fused kernel fills the GPU: bpr from the occupancy API, within the route's max_blocks; its
   * R * bpr blocks spin on each other (rendezvous, count exchange, dispatch signals), so all of
   * them must be resident at once (epf_virtual_grid_check); otherwise run the unfused launches */
  EX_CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fused_router_dispatch_kernel, ROUTER_THREADS, L.fsmem));
  L.fbpr = per_sm * sms / R;
  if (L.fbpr > L.route.layout.max_blocks) L.fbpr = L.route.layout.max_blocks;
  L.nrb = epf_route_blocks_per_rank(&L.route, T); /* the route's own choice of update blocks */
  if (L.nrb > L.fbpr) L.nrb = L.fbpr;
  if ((fused || both) &&
      (L.fbpr < 1 || epf_virtual_grid_check((const void*)fused_router_dispatch_kernel, ROUTER_THREADS, L.fsmem,
                                            R * L.fbpr, dev) != EPF_OK)) {
    fprintf(stderr, "fused kernel: %d blocks per SM x %d SMs cannot hold %d ranks co-resident; running --unfused\n",
            per_sm, sms, R);
    fused = 0, both = 0;
  }
  if (fused || both)
    printf("fused kernel: %d ranks x %d blocks of %d threads (%d per SM, %zu B shared), route update in %d of them\n",
           R, L.fbpr, ROUTER_THREADS, per_sm, L.fsmem, L.nrb);

  int bad = 0;
  if (both) {
    run_path(&L, 0);
    const float split = L.stage_us[0] + L.stage_us[1];
    print_table(&L, 0);
    bad |= check_path(&L, "unfused");
    run_path(&L, 1);
    print_table(&L, 1);
    bad |= check_path(&L, "fused");
    printf("router + route + dispatch: unfused %.1f us, fused %.1f us, unfused / fused = %.2fx\n", split,
           L.stage_us[0] + L.stage_us[1], split / (L.stage_us[0] + L.stage_us[1]));
  } else {
    run_path(&L, fused);
    print_table(&L, fused);
    bad |= check_path(&L, fused ? "fused" : "unfused");
  }
  ex_vteam_free(&vt);
  return bad;
}
