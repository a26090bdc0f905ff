/* epfuse/route.cuh — routing layout blocks: counts, deterministic slots, count exchange, offsets — part of epfuse v0.1
 *
 * What it is: the device side of the route (the handle): from topk_idx [T, K] (int32 or int64,
 * -1 = not routed) one rank's blocks compute
 *   - tokens per expert [E] ((token, k) pairs) and per destination rank [R] (deduplicated),
 *     is_token_in_rank [T, R], and for every (token, k) its destination rank and its SLOT: its
 *     rank within its (source, expert) group in (token, k) order — warp match + prefix, never an
 *     atomic, so the result is the same bits on every run, for any number of blocks or warps;
 *   - RANK_MAJOR: for every (token, destination rank) its slot in token order;
 *   - the count exchange: per-expert and per-rank counts into every peer's COUNTS region
 *     (parity = epoch & 1, row = this rank), a .sys release signal SIG_COUNT[rank] per peer, and
 *     bounded waits for every peer's signal;
 *   - then, on the device, with no host sync: send offsets (the row of the destination's receive
 *     region where this rank's group of expert e, or its rank-major block, starts), this rank's
 *     receive segments (per local expert begin / count / padded count, aligned to
 *     plan.expert_alignment), per-(local expert, source) starts, rank-major per-source starts, the
 *     total receive rows (also stored to host-mapped memory) and the pad rows' metadata.
 * epf_route_update_block composes all of it; the phases are public for fused kernels. Expert ids
 * outside [-1, E) are dropped: treated as -1, counted (route header and the error record's
 * dropped_routes), never used as an index. A token that names one expert twice sends two copies
 * in EXPERT_MAJOR (slots in k order) and one row per destination rank in RANK_MAJOR.
 *
 * What it does NOT do: allocate, launch kernels (kernels_route.cuh does), move token rows
 * (dispatch.cuh), or include nccl_device.h. CUB is used inside function bodies only (warp scans
 * and reductions); the API is template-free. cub::BlockScan / BlockHistogram are not used because
 * they fix the block size and bin count at compile time, and these blocks take both at run time.
 *
 * Usage (kernels_route.cuh has it whole):
 *   extern __shared__ uint4 smem[];                  // epf_route_smem_bytes(&route.layout, blockDim.x)
 *   epf_team_t me = epf_team_for_block(team, virtual_ranks, blocks_per_rank);
 *   epf_route_update_block(&route, virtual_ranks ? me.rank : 0, me, &plan, topk_idx, num_tokens,
 *                          blockIdx.x % blocks_per_rank, blocks_per_rank, wait, recv_total_mapped, smem);
 *   // HT dispatch of the same step, EXPERT_MAJOR, copy (t, k) with expert e >= 0:
 *   //   row = send_offset[e] + slot[t * K + k] on rank dst_rank[t * K + k]; drop if row >= capacity
 *   // RANK_MAJOR, token t to rank d with token_in_rank[t * R + d]:
 *   //   row = send_rm_offset[d] + rm_slot[t * R + d]
 *
 * COMPILE-TIME OPTIONS: none of its own (config.h limits; EPF_MAX_RANKS sets the register mask
 * width, (EPF_MAX_RANKS + 31) / 32 words per token).
 *
 * Contents:
 *   epf_route_ctx_t                                  one rank-block's view of an update
 *   size_t epf_route_smem_bytes(const epf_route_layout_t*, int block_threads)            [EPF_HD]
 *   epf_route_ctx_t epf_route_ctx_make(const epf_route_t*, int index, int rank, const void* topk_idx,
 *                       int num_tokens, int block_index, int num_blocks, int64_t* recv_total_mapped,
 *                       void* smem)                                                       [device]
 *   void epf_route_count_block(epf_route_ctx_t*)                      pass 1: histograms   [collective:block]
 *   epf_status_t epf_route_merge_block(epf_route_ctx_t*, epf_wait_t)  blocks of a rank    [collective:block]
 *   void epf_route_publish_block(const epf_route_ctx_t*, epf_team_t, const epf_plan_t*)   [collective:block]
 *   void epf_route_slots_block(epf_route_ctx_t*)                      pass 2: slots        [collective:block]
 *   epf_status_t epf_route_wait_counts_block(const epf_route_ctx_t*, epf_team_t, const epf_plan_t*, epf_wait_t)
 *   void epf_route_offsets_block(epf_route_ctx_t*, epf_team_t, const epf_plan_t*)        [collective:block]
 *   void epf_route_mark_pad_rows_block(epf_team_t, const epf_plan_t*, const epf_route_segment_t*, int num_local)
 *   void epf_route_finish_block(const epf_route_ctx_t*, epf_status_t)                   [collective:block]
 *   epf_status_t epf_route_update_block(const epf_route_t*, int index, epf_team_t, const epf_plan_t*,
 *                       const void* topk_idx, int num_tokens, int block_index, int num_blocks,
 *                       epf_wait_t, int64_t* recv_total_mapped, void* smem)              [collective:block]
 *   int  epf_route_rows_em(const epf_route_segment_t*, int num_local)  (host/device helper)
 *
 * Requirements: CUDA, sm_70+ (__match_any_sync); sm_90 / sm_100 compiled. blockDim.x a multiple
 * of 32, at most 1024. CUB from the CUDA toolkit (CCCL).
 */
#ifndef EPF_ROUTE_CUH
#define EPF_ROUTE_CUH

#include "config.h"

#if !EPF_IS_CUDA
#error "epfuse/route.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

#include <cub/warp/warp_reduce.cuh>
#include <cub/warp/warp_scan.cuh>

#include "host.h"
#include "ptx.cuh"
#include "signal.cuh"
#include "team.cuh"

EPF_BEGIN_DECLS

/* Words of a per-token destination-rank bit mask held in registers. */
#define EPF__ROUTE_MASK_WORDS ((EPF_MAX_RANKS + 31) / 32)
/* misc shared-memory slots (int32) */
#define EPF__ROUTE_MISC_WARP_SUMS 0 /* [33]: per-warp sums, [32] = block total */
#define EPF__ROUTE_MISC_DROPPED 40
#define EPF__ROUTE_MISC_INTS 64
#define EPF__ROUTE_CUB_BYTES_PER_WARP 16
/* independent loads in flight per lane: 32-entry steps batched per warp, ids per token batch,
 * and scratch / count rows per batch (latency hiding; results do not depend on them) */
#define EPF__ROUTE_STEPS 4
#define EPF__ROUTE_IDS 8
#define EPF__ROUTE_ROWS 8        /* count rows (sources) per batch: R <= 8 is one L2 round trip */
#define EPF__ROUTE_MERGE_ROWS 16 /* scratch rows (blocks) per batch in the merge: B <= 16 is one */

/* One rank-block's view of an update: this rank's arrays, the shapes, this update's epoch and the
 * caller's shared memory carved up. Built by epf_route_ctx_make; passed by pointer to the phases.
 * Uniform over the block. */
typedef struct epf_route_ctx {
  epf_route_header_t* header;
  int32_t* expert_count;      /* [E] */
  int32_t* rank_count;        /* [R] */
  uint8_t* token_in_rank;     /* [T_max][R] */
  int32_t* dst_rank;          /* [T_max][K] */
  int32_t* slot;              /* [T_max][K] */
  int32_t* rm_slot;           /* [T_max][R] or NULL */
  int32_t* send_offset;       /* [E] or NULL */
  int32_t* send_rm_offset;    /* [R] or NULL */
  epf_route_segment_t* recv_segment; /* [EL] or NULL */
  int32_t* recv_src_offset;   /* [EL][R + 1] or NULL */
  int32_t* recv_rm_offset;    /* [R + 1] or NULL */
  int32_t* scratch;           /* [max_blocks][E + R + 1] */
  uint32_t* epoch_word;       /* the route's epoch word for this rank */
  const void* topk_idx;       /* [num_tokens][K] */
  int64_t* recv_total_mapped; /* host-mapped int64 or NULL */
  int32_t num_tokens, top_k, num_experts, nranks, experts_per_rank, index64;
  int32_t rank_major, exchange, alignment, mark_pads;
  int32_t rank;               /* team rank this block plays */
  int32_t block_index, num_blocks, num_warps;
  uint32_t epoch;             /* this update's epoch: the route's epoch word + 1 */
  int32_t status;             /* set by the phases: EPF_OK or the first failure */
  int64_t recv_capacity;
  int32_t* hist;              /* smem [num_warps][E + R]: per-warp counts, then running slots */
  int32_t* tot;               /* smem [E + R + 1]: this rank's totals (+ dropped) */
  int32_t* misc;              /* smem [EPF__ROUTE_MISC_INTS] */
  void* cub_temp;             /* smem [32][EPF__ROUTE_CUB_BYTES_PER_WARP] */
  int32_t ids_cached;         /* 1: this warp's range is one batch and ids[] holds this lane's
                                 entries (set by epf_route_count_block, read by _slots_block) */
  int32_t ids[EPF__ROUTE_STEPS];
} epf_route_ctx_t;

EPF_HD size_t epf__route_align4(size_t n) { return (n + 3u) & ~(size_t)3u; }

/* epf_route_smem_bytes — dynamic shared memory the route blocks need for a block of
 *   `block_threads` threads: 4 * (max(W * (E + R), 2 * E) + (E + R + 1) + 64) + 512 bytes (rounded),
 *   W = block_threads / 32. Scope: any thread, host or device. Pure. */
EPF_HD size_t epf_route_smem_bytes(const epf_route_layout_t* layout, int block_threads) {
  const size_t W = (size_t)(block_threads / 32);
  const size_t row = (size_t)layout->num_experts + (size_t)layout->nranks;
  size_t hist = W * row;
  if (hist < 2u * (size_t)layout->num_experts) hist = 2u * (size_t)layout->num_experts;
  return 4u * (epf__route_align4(hist) + epf__route_align4(row + 1u) + EPF__ROUTE_MISC_INTS) +
         32u * EPF__ROUTE_CUB_BYTES_PER_WARP;
}

/* epf_route_rows_em — rows of an expert-major receive layout: end of the last segment. */
EPF_HD int epf_route_rows_em(const epf_route_segment_t* seg, int num_local) {
  return num_local > 0 ? seg[num_local - 1].begin + seg[num_local - 1].padded_count : 0;
}

/* epf_route_ctx_make — this block's view of one rank's update.
 *   Scope: any thread (every thread of the block calls it with uniform arguments).
 *   index: the buffer of the route group (0 for a real rank, the virtual rank otherwise); rank:
 *   the team rank the block plays; topk_idx: this rank's [num_tokens][K] ids; block_index in
 *   [0, num_blocks), num_blocks <= route->layout.max_blocks; smem: epf_route_smem_bytes bytes,
 *   16-byte aligned. Reads the epoch word (a plain load: call it before the rank's blocks meet in
 *   epf_route_merge_block, which is what makes block 0's later epoch store safe). */
EPF_DEVICE_INLINE epf_route_ctx_t epf_route_ctx_make(const epf_route_t* route, int index, int rank,
                                                     const void* topk_idx, int num_tokens, int block_index,
                                                     int num_blocks, int64_t* recv_total_mapped, void* smem) {
  epf_route_ctx_t c;
  const epf_route_layout_t* L = &route->layout;
  const size_t row = (size_t)L->num_experts + (size_t)L->nranks;
  size_t hist;
  c.header = (epf_route_header_t*)epf_route_ptr(route, index, EPF_ROUTE_HEADER);
  c.expert_count = (int32_t*)epf_route_ptr(route, index, EPF_ROUTE_EXPERT_COUNT);
  c.rank_count = (int32_t*)epf_route_ptr(route, index, EPF_ROUTE_RANK_COUNT);
  c.token_in_rank = (uint8_t*)epf_route_ptr(route, index, EPF_ROUTE_TOKEN_IN_RANK);
  c.dst_rank = (int32_t*)epf_route_ptr(route, index, EPF_ROUTE_DST_RANK);
  c.slot = (int32_t*)epf_route_ptr(route, index, EPF_ROUTE_SLOT);
  c.rm_slot = (int32_t*)epf_route_ptr(route, index, EPF_ROUTE_RM_SLOT);
  c.send_offset = (int32_t*)epf_route_ptr(route, index, EPF_ROUTE_SEND_OFFSET);
  c.send_rm_offset = (int32_t*)epf_route_ptr(route, index, EPF_ROUTE_SEND_RM_OFFSET);
  c.recv_segment = (epf_route_segment_t*)epf_route_ptr(route, index, EPF_ROUTE_RECV_SEGMENT);
  c.recv_src_offset = (int32_t*)epf_route_ptr(route, index, EPF_ROUTE_RECV_SRC_OFFSET);
  c.recv_rm_offset = (int32_t*)epf_route_ptr(route, index, EPF_ROUTE_RECV_RM_OFFSET);
  c.scratch = (int32_t*)epf_route_ptr(route, index, EPF_ROUTE_SCRATCH);
  c.epoch_word = epf_route_epoch_ptr(route, index);
  c.topk_idx = topk_idx;
  c.recv_total_mapped = recv_total_mapped;
  c.num_tokens = num_tokens;
  c.top_k = L->top_k;
  c.num_experts = L->num_experts;
  c.nranks = L->nranks;
  c.experts_per_rank = L->experts_per_rank;
  c.index64 = L->index_type == EPF_INDEX_INT64;
  c.rank_major = L->plan_layout == EPF_LAYOUT_RANK_MAJOR;
  c.exchange = L->exchange;
  c.alignment = L->expert_alignment;
  c.mark_pads = L->plan_layout == EPF_LAYOUT_EXPERT_MAJOR && L->expert_alignment > 1 &&
                (L->flags & EPF_ROUTE_FLAG_NO_PAD_MARK) == 0u;
  c.rank = rank;
  c.block_index = block_index;
  c.num_blocks = num_blocks;
  c.num_warps = (int32_t)(blockDim.x >> 5);
  c.epoch = *c.epoch_word + 1u;
  c.status = EPF_OK;
  c.recv_capacity = L->recv_capacity;
  hist = (size_t)c.num_warps * row;
  if (hist < 2u * (size_t)L->num_experts) hist = 2u * (size_t)L->num_experts;
  c.hist = (int32_t*)smem;
  c.tot = c.hist + epf__route_align4(hist);
  c.misc = c.tot + epf__route_align4(row + 1u);
  c.cub_temp = (void*)(c.misc + EPF__ROUTE_MISC_INTS);
  c.ids_cached = 0;
  return c;
}

/* ---- private helpers ------------------------------------------------------------------------ */

/* entry i of topk_idx as an expert id in [-1, E); ids outside [-1, E) give -1 and count into
 * *dropped (when not NULL) */
EPF_DEVICE_INLINE int epf__route_expert(const epf_route_ctx_t* c, int64_t i, uint32_t* dropped) {
  const int64_t v = c->index64 ? ((const int64_t*)c->topk_idx)[i] : (int64_t)((const int32_t*)c->topk_idx)[i];
  if (v >= -1 && v < (int64_t)c->num_experts) return (int)v;
  if (dropped != NULL) *dropped += 1u;
  return -1;
}

/* this warp's tokens [*t0, *t1): the block's share of [0, T), split again over the warps, in order */
EPF_DEVICE_INLINE void epf__route_warp_range(const epf_route_ctx_t* c, int64_t* t0, int64_t* t1) {
  const int64_t T = c->num_tokens;
  const int64_t b0 = T * c->block_index / c->num_blocks, b1 = T * (c->block_index + 1) / c->num_blocks;
  const int64_t n = b1 - b0, w = epf_warp_id(), W = c->num_warps;
  *t0 = b0 + n * w / W;
  *t1 = b0 + n * (w + 1) / W;
}

/* destination-rank bit mask of token t (all zero when !valid) */
EPF_DEVICE_INLINE void epf__route_token_mask(const epf_route_ctx_t* c, int64_t t, bool valid, uint32_t* m) {
  int q, k;
#pragma unroll
  for (q = 0; q < EPF__ROUTE_MASK_WORDS; ++q) m[q] = 0u;
  if (!valid) return;
  for (k = 0; k < c->top_k; k += EPF__ROUTE_IDS) {
    int ev[EPF__ROUTE_IDS], u;
#pragma unroll
    for (u = 0; u < EPF__ROUTE_IDS; ++u) ev[u] = k + u < c->top_k ? epf__route_expert(c, t * c->top_k + k + u, NULL) : -1;
#pragma unroll
    for (u = 0; u < EPF__ROUTE_IDS; ++u) {
      if (ev[u] >= 0) {
        const int d = ev[u] / c->experts_per_rank;
#pragma unroll
        for (q = 0; q < EPF__ROUTE_MASK_WORDS; ++q)
          if (q == (d >> 5)) m[q] |= 1u << (d & 31);
      }
    }
  }
}

EPF_DEVICE_INLINE uint32_t epf__route_mask_bit(const uint32_t* m, int r) {
  uint32_t word = 0u;
  int q;
#pragma unroll
  for (q = 0; q < EPF__ROUTE_MASK_WORDS; ++q)
    if (q == (r >> 5)) word = m[q];
  return (word >> (r & 31)) & 1u;
}

/* epf__route_block_status — epf__block_status with one barrier in the common case: when no
 * thread of the block failed (one __syncthreads_or) the answer is EPF_OK, exactly what
 * epf__block_status returns then; otherwise epf__block_status folds the failures by priority.
 * [collective:block] */
EPF_DEVICE_INLINE epf_status_t epf__route_block_status(epf_status_t mine) {
  if (!__syncthreads_or(mine != EPF_OK)) return EPF_OK;
  return epf__block_status(mine);
}

/* epf__route_block_exclusive_sum — exclusive prefix sum of x over the block in threadIdx order,
 * the block total in *out_total (all threads). [collective:block]; every lane of every warp.
 * Built from cub::WarpScan (cub::BlockScan needs the block size at compile time). Ends with a
 * __syncthreads, so it may be called again at once. */
EPF_DEVICE_INLINE int epf__route_block_exclusive_sum(int x, int* out_total, int* misc, void* cub_temp) {
  typedef cub::WarpScan<int> epf__warp_scan_t;
  typedef epf__warp_scan_t::TempStorage epf__warp_scan_temp_t;
  const int lane = epf_lane_id(), warp = epf_warp_id(), nwarps = (int)(blockDim.x >> 5);
  int* sums = misc + EPF__ROUTE_MISC_WARP_SUMS;
  int incl = 0, r;
  EPF_STATIC_ASSERT(sizeof(epf__warp_scan_temp_t) <= EPF__ROUTE_CUB_BYTES_PER_WARP, "cub temp storage");
  epf__warp_scan_t(*(epf__warp_scan_temp_t*)((char*)cub_temp + warp * EPF__ROUTE_CUB_BYTES_PER_WARP))
      .InclusiveSum(x, incl);
  if (lane == 31) sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int v = lane < nwarps ? sums[lane] : 0;
    int vin = 0;
    epf__warp_scan_t(*(epf__warp_scan_temp_t*)cub_temp).InclusiveSum(v, vin);
    __syncwarp();
    if (lane < nwarps) sums[lane] = vin - v;
    if (lane == 31) sums[32] = vin;
  }
  __syncthreads();
  *out_total = sums[32];
  r = incl - x + sums[warp];
  __syncthreads();
  return r;
}

/* ---- pass 1 ----------------------------------------------------------------------------------- */

/* epf_route_count_block — pass 1 over this block's tokens: per-warp counts per expert and per
 *   destination rank, is_token_in_rank rows, dropped ids; then this block's totals into its
 *   scratch row.
 *   Scope:    [collective:block] [uniform-args] every thread, converged; exactly one block per
 *             (rank, block_index) of an update.
 *   Does:     warp w of the block owns a contiguous token range (blocks in order, warps in order
 *             inside). Entries (t, k) are visited 32 at a time in (t, k) order; __match_any_sync
 *             groups equal experts and the group's highest lane adds the group size into the
 *             warp's own row of c->hist (no atomics). Destination-rank masks: with K a power of
 *             two <= 32 and R <= 32 an OR over each token's K lanes of the same step (no second
 *             load of the ids); otherwise tokens are visited again, one per lane. Then c->hist columns become exclusive prefixes over warps
 *             and the block totals [E counts, R counts, dropped] go to scratch[block_index]
 *             (with num_blocks == 1 also to c->tot: they are the rank's totals).
 *             Block 0 also resets header->status.
 *   Memory:   reads topk_idx; writes token_in_rank rows [0, T) of its tokens and its scratch row
 *             (plain stores, published by epf_route_merge_block). Smem: c->hist, c->misc.
 *   [smem-reuse] starts with a __syncthreads. */
EPF_DEVICE_INLINE void epf_route_count_block(epf_route_ctx_t* c) {
  typedef cub::WarpReduce<int> epf__warp_reduce_t;
  typedef epf__warp_reduce_t::TempStorage epf__warp_reduce_temp_t;
  EPF_STATIC_ASSERT(sizeof(epf__warp_reduce_temp_t) <= EPF__ROUTE_CUB_BYTES_PER_WARP, "cub temp storage");
  const int lane = epf_lane_id(), warp = epf_warp_id(), W = c->num_warps;
  const int E = c->num_experts, R = c->nranks, K = c->top_k, row = E + R;
  int32_t* H = c->hist + (int64_t)warp * row;
  uint32_t dropped = 0u, cnt[EPF__ROUTE_MASK_WORDS];
  int64_t t0, t1, i0, tb;
  int x, q;
  __syncthreads();
  if (threadIdx.x == 0) {
    c->misc[EPF__ROUTE_MISC_DROPPED] = 0;
    if (c->block_index == 0) c->header->status = EPF_OK;
  }
  __syncthreads();
  for (x = lane; x < row; x += 32) H[x] = 0;
  __syncwarp();
  epf__route_warp_range(c, &t0, &t1);

  /* (token, k) entries in order: per-expert counts. Fused (K a power of two <= 32, R <= 32): a
   * token's K entries are K aligned lanes of one 32-entry step, so an OR over those lanes gives
   * its destination-rank mask in its first lane, and is_token_in_rank / the per-rank counts come
   * from the ids already loaded (no second pass over the ids). */
  const bool fused = K <= 32 && (K & (K - 1)) == 0 && R <= 32;
  const int kshift = __ffs(K) - 1;
  uint32_t rcnt = 0u; /* fused: lane r < R keeps the count of rank r */
  c->ids_cached = (t1 - t0) * K <= 32 * EPF__ROUTE_STEPS;
  for (i0 = t0 * K; i0 < t1 * K; i0 += 32 * EPF__ROUTE_STEPS) {
    int ev[EPF__ROUTE_STEPS], u;
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) {
      const int64_t i = i0 + 32 * u + lane;
      ev[u] = i < t1 * K ? epf__route_expert(c, i, &dropped) : -1;
      c->ids[u] = ev[u];
    }
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) {
      const int e = ev[u];
      const uint32_t peers = __match_any_sync(0xffffffffu, e);
      if (e >= 0 && lane == 31 - __clz((int)peers)) H[e] += __popc(peers);
      __syncwarp();
      if (fused) {
        const int64_t i = i0 + 32 * u + lane;
        uint32_t m = e >= 0 ? 1u << (e / c->experts_per_rank) : 0u;
        int o, r;
        for (o = 1; o < K; o <<= 1) m |= __shfl_xor_sync(0xffffffffu, m, o);
        /* lane % K == 0 starts a token (the warp's range starts at a token, K divides 32) */
        const bool lead = (lane & (K - 1)) == 0 && i < t1 * K;
        if (lead) {
          uint8_t* dst = c->token_in_rank + (i >> kshift) * R;
          if ((R & 3) == 0) {
            for (r = 0; r < R; r += 4)
              *(uint32_t*)(dst + r) = ((m >> r) & 1u) | (((m >> (r + 1)) & 1u) << 8) | (((m >> (r + 2)) & 1u) << 16) |
                                      (((m >> (r + 3)) & 1u) << 24);
          } else {
            for (r = 0; r < R; ++r) dst[r] = (uint8_t)((m >> r) & 1u);
          }
        }
        for (r = 0; r < R; ++r) {
          const uint32_t bal = __ballot_sync(0xffffffffu, lead && ((m >> r) & 1u));
          if (lane == r) rcnt += (uint32_t)__popc(bal);
        }
      }
    }
  }
  if (fused) {
    if (lane < R) H[E + lane] = (int32_t)rcnt;
  } else {
    /* tokens, one per lane: destination masks, is_token_in_rank, per-rank counts (lane-held:
     * lane l keeps the count of rank 32 q + l in cnt[q]) */
#pragma unroll
    for (q = 0; q < EPF__ROUTE_MASK_WORDS; ++q) cnt[q] = 0u;
    for (tb = t0; tb < t1; tb += 32) {
      const int64_t t = tb + lane;
      const bool valid = t < t1;
      uint32_t m[EPF__ROUTE_MASK_WORDS];
      int r;
      epf__route_token_mask(c, t, valid, m);
      if (valid) {
        uint8_t* dst = c->token_in_rank + t * R;
        if ((R & 3) == 0) {
          for (r = 0; r < R; r += 4) {
            const uint32_t v = epf__route_mask_bit(m, r) | (epf__route_mask_bit(m, r + 1) << 8) |
                               (epf__route_mask_bit(m, r + 2) << 16) | (epf__route_mask_bit(m, r + 3) << 24);
            *(uint32_t*)(dst + r) = v;
          }
        } else {
          for (r = 0; r < R; ++r) dst[r] = (uint8_t)epf__route_mask_bit(m, r);
        }
      }
#pragma unroll
      for (q = 0; q < EPF__ROUTE_MASK_WORDS; ++q) {
        int b;
        for (b = 0; b < 32 && q * 32 + b < R; ++b) {
          const uint32_t bal = __ballot_sync(0xffffffffu, (m[q] >> b) & 1u);
          if (lane == b) cnt[q] += (uint32_t)__popc(bal);
        }
      }
    }
#pragma unroll
    for (q = 0; q < EPF__ROUTE_MASK_WORDS; ++q)
      if (q * 32 + lane < R) H[E + q * 32 + lane] = (int32_t)cnt[q];
  }
  {
    const int n = epf__warp_reduce_t(*(epf__warp_reduce_temp_t*)((char*)c->cub_temp + warp * EPF__ROUTE_CUB_BYTES_PER_WARP))
                      .Sum((int)dropped);
    if (lane == 0 && n != 0) atomicAdd(&c->misc[EPF__ROUTE_MISC_DROPPED], n);
  }
  __syncthreads();

  /* per-warp counts -> exclusive prefixes over warps; block totals -> scratch row (and, with one
   * block per rank, straight into c->tot: they are the rank's totals, no merge needed) */
  {
    int32_t* part = c->scratch + (int64_t)c->block_index * (row + 1);
    const bool single = c->num_blocks == 1;
    for (x = (int)threadIdx.x; x < row; x += (int)blockDim.x) {
      int32_t run = 0;
      int w;
      for (w = 0; w < W; ++w) {
        const int32_t v = c->hist[(int64_t)w * row + x];
        c->hist[(int64_t)w * row + x] = run;
        run += v;
      }
      part[x] = run;
      if (single) c->tot[x] = run;
    }
    if (threadIdx.x == 0) {
      part[row] = c->misc[EPF__ROUTE_MISC_DROPPED];
      if (single) c->tot[row] = c->misc[EPF__ROUTE_MISC_DROPPED];
    }
  }
}

/* ---- the rank's blocks meet ------------------------------------------------------------------- */

/* epf_route_merge_block — the rank's blocks meet (when num_blocks > 1), then every block adds
 *   the counts of the blocks before it to its warps' prefixes and gets the rank's totals. With
 *   num_blocks == 1 there is nothing to meet or merge (no barrier, no scratch read back): the
 *   totals epf_route_count_block left in c->tot are the rank's.
 *   Scope:    [collective:block] [uniform-args] after epf_route_count_block, in every block of the
 *             rank; the rank's num_blocks blocks must be co-resident [needs-co-residency] [blocking].
 *   Does:     barrier on header->barrier (epoch << 32 | arrivals; the last block to arrive stores
 *             epoch << 32, the others wait for it, bounded by w); then c->hist[w][x] += the
 *             scratch counts of blocks < block_index; c->tot = the rank's totals [E + R + 1].
 *             Block 0 writes expert_count, rank_count, header rank / num_tokens / dropped_routes
 *             and adds dropped ids to w.record->dropped_routes.
 *   Result:   [result:all] EPF_OK, or the barrier's failure (also kept in c->status).
 *   Memory:   .gpu acq_rel atomic / release store / acquire wait on the barrier word (cumulative
 *             over the block's scratch stores through __syncthreads); scratch read with
 *             ld.relaxed.gpu. */
EPF_DEVICE_INLINE epf_status_t epf_route_merge_block(epf_route_ctx_t* c, epf_wait_t w) {
  const int E = c->num_experts, R = c->nranks, row = E + R, W = c->num_warps, B = c->num_blocks;
  epf_status_t st = EPF_OK;
  int x;
  __syncthreads();
  if (B > 1) {
    if (threadIdx.x == 0) {
      uint64_t* word = &c->header->barrier;
      const uint64_t old = epf_atom_add_acq_rel_gpu_u64(word, 1ull);
      if ((uint32_t)old == (uint32_t)(B - 1))
        epf_st_release_gpu_u64(word, (uint64_t)c->epoch << 32);
      else
        st = epf_signal_wait_sys(word, c->epoch, w, -1, NULL);
      epf_fence_acq_rel_gpu();
    }
    st = epf__route_block_status(st);
    if (st != EPF_OK) {
      c->status = st;
      return st;
    }
    for (x = (int)threadIdx.x; x <= row; x += (int)blockDim.x) {
      int32_t base = 0, total = 0;
      int b, u, wi;
      for (b = 0; b < B; b += EPF__ROUTE_MERGE_ROWS) {
        int32_t v[EPF__ROUTE_MERGE_ROWS];
#pragma unroll
        for (u = 0; u < EPF__ROUTE_MERGE_ROWS; ++u)
          v[u] = b + u < B ? (int32_t)epf_ld_relaxed_gpu_u32((const uint32_t*)c->scratch + (int64_t)(b + u) * (row + 1) + x) : 0;
#pragma unroll
        for (u = 0; u < EPF__ROUTE_MERGE_ROWS; ++u) {
          if (b + u < c->block_index) base += v[u];
          total += v[u];
        }
      }
      if (x < row && base != 0)
        for (wi = 0; wi < W; ++wi) c->hist[(int64_t)wi * row + x] += base;
      c->tot[x] = total;
    }
  }
  /* B == 1: epf_route_count_block left the totals in c->tot and the prefixes need no base */
  __syncthreads();
  if (c->block_index == 0) {
    for (x = (int)threadIdx.x; x < E; x += (int)blockDim.x) c->expert_count[x] = c->tot[x];
    for (x = (int)threadIdx.x; x < R; x += (int)blockDim.x) c->rank_count[x] = c->tot[E + x];
    if (threadIdx.x == 0) {
      c->header->rank = c->rank;
      c->header->num_tokens = c->num_tokens;
      c->header->dropped_routes = (uint32_t)c->tot[row];
      if (w.record != NULL) epf_error_count_add(&w.record->dropped_routes, (uint32_t)c->tot[row]);
    }
  }
  return EPF_OK;
}

/* ---- count exchange --------------------------------------------------------------------------- */

/* epf_route_publish_block — publish this rank's totals to its share of the peers and signal them.
 *   Scope:    [collective:block] [uniform-args] after epf_route_merge_block returned EPF_OK.
 *             Block b of the rank serves peers p = b, b + num_blocks, ... (so every peer is
 *             served once per update by exactly one block; this rank is its own peer).
 *   Does:     COUNTS[parity = epoch & 1][src = rank][0 .. E + R) of peer p = c->tot (uint32),
 *             __syncthreads, then SIG_COUNT[rank] of peer p = (epoch, tokens rank -> p) with a
 *             .sys release store (epf_signal_set_sys).
 *   Memory:   plain stores to peers, then .sys release (cumulative over the block through
 *             __syncthreads). Parity: a rank writes parity P of a peer again only at epoch + 2,
 *             which it reaches only after that peer has signalled epoch + 1, i.e. after the peer's
 *             update of this epoch (a separate kernel, or a later phase in a fused kernel) has
 *             finished reading parity P. A fused persistent kernel must keep that order. */
EPF_DEVICE_INLINE void epf_route_publish_block(const epf_route_ctx_t* c, epf_team_t team, const epf_plan_t* plan) {
  const int E = c->num_experts, R = c->nranks, row = E + R, B = c->num_blocks, bi = c->block_index;
  const int parity = (int)(c->epoch & 1u);
  const int np = bi < R ? (R - bi + B - 1) / B : 0;
  const uint64_t counts_off = epf_plan_counts_offset(plan, parity, team.rank, 0);
  const uint64_t sig_off = epf_plan_signal_offset(plan, EPF_REGION_SIG_COUNT, team.rank);
  int64_t qi;
  int i;
  for (qi = threadIdx.x; qi < (int64_t)np * row; qi += blockDim.x) {
    const int pi = (int)(qi / row), x = (int)(qi - (int64_t)pi * row), p = bi + pi * B;
    ((uint32_t*)epf_peer_ptr(team, counts_off, p))[x] = (uint32_t)c->tot[x];
  }
  __syncthreads();
  for (i = (int)threadIdx.x; i < np; i += (int)blockDim.x) {
    const int p = bi + i * B;
    epf_signal_set_sys((uint64_t*)epf_peer_ptr(team, sig_off, p), c->epoch, (uint32_t)c->tot[E + p]);
  }
}

/* ---- pass 2 ----------------------------------------------------------------------------------- */

/* epf_route_slots_block — pass 2: slot and destination rank of every (t, k) of this block's
 *   tokens, and (RANK_MAJOR) the rank-major slot of every (t, destination).
 *   Scope:    [collective:block] [uniform-args] after epf_route_merge_block returned EPF_OK.
 *   Does:     the same walk as pass 1 (when a warp's range is one batch of 32 x
 *             EPF__ROUTE_STEPS entries, on the ids epf_route_count_block left in c->ids, not
 *             loaded again: call both with the same ctx); slot(t, k) = c->hist[warp][e] (blocks
 *             and warps before) + the number of equal experts in lower lanes of the same 32-entry
 *             step; the group's highest lane then advances c->hist[warp][e]. slot = dst = -1 for
 *             -1 and dropped ids. Rank-major: per destination r a ballot over the lanes' tokens.
 *   Memory:   plain coalesced stores to slot / dst_rank / rm_slot rows [0, T). No peer access. */
EPF_DEVICE_INLINE void epf_route_slots_block(epf_route_ctx_t* c) {
  const int lane = epf_lane_id(), warp = epf_warp_id();
  const int E = c->num_experts, R = c->nranks, K = c->top_k, row = E + R;
  const uint32_t lt = (1u << lane) - 1u;
  int32_t* H = c->hist + (int64_t)warp * row;
  int64_t t0, t1, i0, tb;
  epf__route_warp_range(c, &t0, &t1);
  for (i0 = t0 * K; i0 < t1 * K; i0 += 32 * EPF__ROUTE_STEPS) {
    int ev[EPF__ROUTE_STEPS], u;
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) {
      const int64_t i = i0 + 32 * u + lane;
      ev[u] = c->ids_cached ? c->ids[u] : i < t1 * K ? epf__route_expert(c, i, NULL) : -1;
    }
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) {
      const int64_t i = i0 + 32 * u + lane;
      const int e = ev[u];
      const uint32_t peers = __match_any_sync(0xffffffffu, e);
      int32_t base = 0, slot = -1, dst = -1;
      if (e >= 0) {
        base = H[e];
        slot = base + __popc(peers & lt);
        dst = e / c->experts_per_rank;
      }
      __syncwarp();
      if (e >= 0 && lane == 31 - __clz((int)peers)) H[e] = base + __popc(peers);
      __syncwarp();
      if (i < t1 * K) {
        c->slot[i] = slot;
        c->dst_rank[i] = dst;
      }
    }
  }
  if (c->rank_major && c->rm_slot != NULL) {
    int32_t run[EPF__ROUTE_MASK_WORDS];
    int q;
#pragma unroll
    for (q = 0; q < EPF__ROUTE_MASK_WORDS; ++q) run[q] = q * 32 + lane < R ? H[E + q * 32 + lane] : 0;
    for (tb = t0; tb < t1; tb += 32) {
      const int64_t t = tb + lane;
      const bool valid = t < t1;
      uint32_t m[EPF__ROUTE_MASK_WORDS];
      epf__route_token_mask(c, t, valid, m);
#pragma unroll
      for (q = 0; q < EPF__ROUTE_MASK_WORDS; ++q) {
        int b;
        for (b = 0; b < 32 && q * 32 + b < R; ++b) {
          const uint32_t bit = (m[q] >> b) & 1u;
          const uint32_t bal = __ballot_sync(0xffffffffu, bit);
          const int32_t base = __shfl_sync(0xffffffffu, run[q], b);
          if (valid) c->rm_slot[t * R + q * 32 + b] = bit ? base + __popc(bal & lt) : -1;
          if (lane == b) run[q] += __popc(bal);
        }
      }
    }
  }
}

/* epf_route_wait_counts_block — wait for every peer's count signal of this epoch.
 *   Scope:    [collective:block] [uniform-args] [blocking] any block of the rank that reads the
 *             exchanged counts (epf_route_offsets_block) calls it first.
 *   Does:     thread s (strided) waits for SIG_COUNT[s] of this rank's own window to reach the
 *             epoch (epf_signal_wait_sys: bounded, recorded in w.record on expiry, abort word).
 *   Result:   [result:all] EPF_OK, or the failure by priority (TIMEOUT > ABORTED > PEER_MASKED);
 *             also kept in c->status by the caller (epf_route_update_block).
 *   Memory:   .sys acquire per source, then fence.acq_rel.sys in the waiting threads, then
 *             __syncthreads: the block may read every source's COUNTS row of this parity. */
EPF_DEVICE_INLINE epf_status_t epf_route_wait_counts_block(const epf_route_ctx_t* c, epf_team_t team,
                                                           const epf_plan_t* plan, epf_wait_t w) {
  epf_status_t st = EPF_OK;
  int s;
  for (s = (int)threadIdx.x; s < c->nranks; s += (int)blockDim.x) {
    const uint64_t off = epf_plan_signal_offset(plan, EPF_REGION_SIG_COUNT, s);
    const epf_status_t x = epf_signal_wait_sys((const uint64_t*)epf_local_ptr(team, off), c->epoch, w, s, NULL);
    if (x != EPF_OK && st == EPF_OK) st = x;
  }
  if ((int)threadIdx.x < c->nranks) epf_fence_acq_rel_sys();
  return epf__route_block_status(st);
}

/* epf_route_mark_pad_rows_block — write the metadata of every pad row of an expert-major receive
 *   layout: rows [begin + count, begin + padded_count) of each local expert j (those below
 *   plan->recv_capacity) get epf_recv_meta_em_t {src_token -1, src_rank -1, k -1,
 *   local_expert j, weight 0}. Rows received from sources are not touched.
 *   Scope:    [collective:block] [uniform-args]. seg: [num_local] segments (global or shared).
 *   Memory:   one 16-byte plain store per pad row into this rank's RECV_META (local window). */
EPF_DEVICE_INLINE void epf_route_mark_pad_rows_block(epf_team_t team, const epf_plan_t* plan,
                                                     const epf_route_segment_t* seg, int num_local) {
  const int A = plan->expert_alignment, lane = epf_lane_id();
  const int nwarps = (int)(blockDim.x >> 5);
  const int64_t cap = plan->recv_capacity;
  int j;
  if (A <= 1 || plan->meta_bytes_per_row != (uint32_t)sizeof(epf_recv_meta_em_t)) return;
  /* warp w marks the pad rows of local experts w, w + nwarps, ...: only the rows that exist
   * (padded_count - count, at most A - 1 of them), no division */
  for (j = epf_warp_id(); j < num_local; j += nwarps) {
    const epf_route_segment_t s = seg[j];
    const int npad = s.padded_count - s.count < A - 1 ? s.padded_count - s.count : A - 1;
    int xpad;
    for (xpad = lane; xpad < npad; xpad += 32) {
      const int64_t r = (int64_t)s.begin + s.count + xpad;
      if (r < cap) {
        uint4 v;
        v.x = 0xffffffffu;
        v.y = 0xffffffffu;
        v.z = (uint32_t)j;
        v.w = 0u;
        epf_st_v4_u32(epf_local_ptr(team, epf_plan_recv_meta_offset(plan, r)), v);
      }
    }
  }
}

/* sum over sources s of C[s][x] (*tot) and over s < me (*pre); C rows of `row` uint32 */
EPF_DEVICE_INLINE void epf__route_column_sums(const uint32_t* C, int row, int x, int R, int me, int* tot, int* pre) {
  int s, u, a = 0, p = 0;
  for (s = 0; s < R; s += EPF__ROUTE_ROWS) {
    int v[EPF__ROUTE_ROWS];
#pragma unroll
    for (u = 0; u < EPF__ROUTE_ROWS; ++u) v[u] = s + u < R ? (int)epf_ld_relaxed_sys_u32(C + (int64_t)(s + u) * row + x) : 0;
#pragma unroll
    for (u = 0; u < EPF__ROUTE_ROWS; ++u) {
      a += v[u];
      if (s + u < me) p += v[u];
    }
  }
  *tot = a;
  *pre = p;
}

/* epf_route_offsets_block — offsets from the exchanged counts (C[s][x] = COUNTS[parity][s][x]).
 *   Scope:    [collective:block] [uniform-args] after epf_route_wait_counts_block returned EPF_OK
 *             (and after pass 2: it reuses c->hist). Block b of the rank serves destinations
 *             d = b, b + num_blocks, ...; block rank % num_blocks is the RECEIVER block.
 *   Does:     for each served d and local expert j (e = d * EL + j):
 *               count_d[j] = sum_s C[s][e], padded_d[j] = roundup(count_d[j], alignment),
 *               begin_d[j] = sum_{j' < j} padded_d[j'] (block scan),
 *               send_offset[e] = begin_d[j] + sum_{s < rank} C[s][e].
 *             RANK_MAJOR, block 0: send_rm_offset[d] = sum_{s < rank} C[s][E + d] for every d.
 *             Receiver block: recv_segment[j] = {begin, count, padded, 0}, recv_src_offset[j][s] =
 *             begin + sum_{s' < s} C[s'][e] (s = 0..R), RANK_MAJOR recv_rm_offset[s] =
 *             sum_{s' < s} C[s'][E + rank] (s = 0..R); header recv_rows (plan layout), recv_rows_em,
 *             recv_overflow = max(0, recv_rows - recv_capacity); *c->recv_total_mapped =
 *             recv_rows (.sys store); then the pad rows' metadata (epf_route_mark_pad_rows_block)
 *             unless EPF_ROUTE_FLAG_NO_PAD_MARK.
 *   Memory:   ld.relaxed.sys of the own window's COUNTS; plain stores to the route buffer. */
EPF_DEVICE_INLINE void epf_route_offsets_block(epf_route_ctx_t* c, epf_team_t team, const epf_plan_t* plan) {
  const int E = c->num_experts, R = c->nranks, EL = c->experts_per_rank, row = E + R;
  const int me = team.rank, B = c->num_blocks, bi = c->block_index, A = c->alignment;
  const uint32_t* C = (const uint32_t*)epf_local_ptr(team, epf_plan_counts_offset(plan, (int)(c->epoch & 1u), 0, 0));
  const bool receiver = bi == me % B;
  const bool few = R <= EPF__ROUTE_ROWS; /* one batch of loads covers every source */
  int64_t rows_em = 0, rows_rm = 0;
  int d, s;
  for (d = bi; d < R; d += B) {
    int carry = 0, j0;
    for (j0 = 0; j0 < EL; j0 += (int)blockDim.x) {
      const int j = j0 + (int)threadIdx.x, e = d * EL + j;
      const bool valid = j < EL;
      int tot = 0, pre = 0, padded, excl, agg, u;
      int v[EPF__ROUTE_ROWS]; /* few: every source's count of e, kept for recv_src_offset */
#pragma unroll
      for (u = 0; u < EPF__ROUTE_ROWS; ++u) v[u] = 0;
      if (valid) {
        if (few) {
#pragma unroll
          for (u = 0; u < EPF__ROUTE_ROWS; ++u)
            v[u] = u < R ? (int)epf_ld_relaxed_sys_u32(C + (int64_t)u * row + e) : 0;
#pragma unroll
          for (u = 0; u < EPF__ROUTE_ROWS; ++u) {
            tot += v[u];
            if (u < me) pre += v[u];
          }
        } else {
          epf__route_column_sums(C, row, e, R, me, &tot, &pre);
        }
      }
      padded = (tot + A - 1) / A * A;
      excl = carry + epf__route_block_exclusive_sum(padded, &agg, c->misc, c->cub_temp);
      carry += agg;
      if (valid) {
        c->send_offset[e] = excl + pre;
        if (d == me) {
          epf_route_segment_t sg;
          int run = excl;
          sg.begin = excl;
          sg.count = tot;
          sg.padded_count = padded;
          sg.reserved = 0;
          c->recv_segment[j] = sg;
          if (few) {
#pragma unroll
            for (u = 0; u < EPF__ROUTE_ROWS; ++u) {
              if (u < R) c->recv_src_offset[(int64_t)j * (R + 1) + u] = run;
              run += v[u];
            }
          } else {
            for (s = 0; s < R; s += EPF__ROUTE_ROWS) {
              int w[EPF__ROUTE_ROWS];
#pragma unroll
              for (u = 0; u < EPF__ROUTE_ROWS; ++u)
                w[u] = s + u < R ? (int)epf_ld_relaxed_sys_u32(C + (int64_t)(s + u) * row + e) : 0;
#pragma unroll
              for (u = 0; u < EPF__ROUTE_ROWS; ++u) {
                if (s + u < R) c->recv_src_offset[(int64_t)j * (R + 1) + s + u] = run;
                run += w[u];
              }
            }
          }
          c->recv_src_offset[(int64_t)j * (R + 1) + R] = run;
        }
      }
    }
    if (d == me) rows_em = carry;
  }
  if (c->rank_major && bi == 0) {
    for (d = (int)threadIdx.x; d < R; d += (int)blockDim.x) {
      int tot, pre;
      epf__route_column_sums(C, row, E + d, me, me, &tot, &pre); /* sources s < me only */
      c->send_rm_offset[d] = tot;
    }
  }
  if (!receiver) return;
  if (c->rank_major) {
    int carry = 0, s0;
    for (s0 = 0; s0 < R; s0 += (int)blockDim.x) {
      const int si = s0 + (int)threadIdx.x;
      const int v = si < R ? (int)epf_ld_relaxed_sys_u32(C + (int64_t)si * row + E + me) : 0;
      int agg;
      const int excl = carry + epf__route_block_exclusive_sum(v, &agg, c->misc, c->cub_temp);
      carry += agg;
      if (si < R) c->recv_rm_offset[si] = excl;
    }
    if (threadIdx.x == 0) c->recv_rm_offset[R] = carry;
    rows_rm = carry;
  }
  if (threadIdx.x == 0) {
    const int64_t rows = c->rank_major ? rows_rm : rows_em;
    c->header->recv_rows = rows;
    c->header->recv_rows_em = rows_em;
    c->header->recv_overflow = rows > c->recv_capacity ? rows - c->recv_capacity : 0;
    if (c->recv_total_mapped != NULL) epf_st_relaxed_sys_u64((uint64_t*)c->recv_total_mapped, (uint64_t)rows);
  }
  if (c->mark_pads) {
    __syncthreads(); /* this block's recv_segment stores are visible to the whole block */
    epf_route_mark_pad_rows_block(team, plan, c->recv_segment, EL);
  }
}

/* epf_route_finish_block — end of an update: the receiver block records a failure (header
 *   status, recv_rows = -1, *recv_total_mapped = -status); block 0 stores the new epoch.
 *   Scope:    [collective:block] [uniform-args] last phase, in every block of the rank.
 *   Memory:   plain stores; the epoch store needs no ordering inside the update (the rank's blocks
 *             read the epoch before epf_route_merge_block, and the next update is a later kernel
 *             on the same stream). */
EPF_DEVICE_INLINE void epf_route_finish_block(const epf_route_ctx_t* c, epf_status_t st) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  if (st != EPF_OK) {
    atomicCAS(&c->header->status, (uint32_t)EPF_OK, (uint32_t)st);
    if (c->exchange && c->block_index == c->rank % c->num_blocks) {
      c->header->recv_rows = -1;
      if (c->recv_total_mapped != NULL) epf_st_relaxed_sys_u64((uint64_t*)c->recv_total_mapped, (uint64_t)-(int64_t)st);
    }
  }
  if (c->block_index == 0) {
    *c->epoch_word = c->epoch;
    c->header->epoch = c->epoch;
  }
}

/* epf_route_update_block — one rank's whole route update: count, merge, publish, slots, wait,
 *   offsets, finish (the phases above, in that order).
 *   Scope:    [collective:block] [uniform-args] every thread of each of the rank's num_blocks
 *             blocks (block_index 0 .. num_blocks - 1), converged; with virtual ranks every rank's
 *             blocks in one grid, all co-resident [needs-co-residency] [blocking].
 *   Input:    route: the group (route->layout matches plan); index: buffer of the group (0 for a
 *             real rank, the virtual rank otherwise); team: the view this block plays (rank =
 *             team.rank, team.nranks == plan->nranks); topk_idx: [num_tokens][K] of
 *             route->layout.index_type; num_tokens in [0, route->layout.max_tokens];
 *             recv_total_mapped: host-mapped int64 (device address) or NULL; smem:
 *             epf_route_smem_bytes(&route->layout, blockDim.x) bytes, 16-byte aligned.
 *   Result:   [result:all] EPF_OK, or the first failure (a wait's TIMEOUT / ABORTED / PEER_MASKED),
 *             also in header->status. On failure slots and counts are still valid; offsets are not
 *             (recv_rows = -1, *recv_total_mapped = -status).
 *   Epoch:    the route's epoch word + 1; stored back by block 0 at the end, so every update (and
 *             every CUDA graph replay) advances it with no host work. All ranks of a team must
 *             start from the same epoch (epf_route_init's first_epoch) and update in lockstep.
 *   Memory:   see the phases; the route buffer must not be read by other kernels while the
 *             update runs. */
EPF_DEVICE_INLINE epf_status_t epf_route_update_block(const epf_route_t* route, int index, epf_team_t team,
                                                      const epf_plan_t* plan, const void* topk_idx, int num_tokens,
                                                      int block_index, int num_blocks, epf_wait_t w,
                                                      int64_t* recv_total_mapped, void* smem) {
  epf_route_ctx_t c = epf_route_ctx_make(route, index, team.rank, topk_idx, num_tokens, block_index, num_blocks,
                                         recv_total_mapped, smem);
  epf_status_t st;
  w.rank = team.rank;
  epf_route_count_block(&c);
  st = epf_route_merge_block(&c, w);
  if (st == EPF_OK) {
    if (c.exchange) epf_route_publish_block(&c, team, plan);
    epf_route_slots_block(&c);
    /* blocks that serve a destination (block 0 always does) read the exchanged counts */
    if (c.exchange && block_index < c.nranks) {
      st = epf_route_wait_counts_block(&c, team, plan, w);
      if (st == EPF_OK) epf_route_offsets_block(&c, team, plan);
    }
  }
  c.status = st;
  epf_route_finish_block(&c, st);
  return st;
}

EPF_END_DECLS

#endif /* EPF_ROUTE_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
