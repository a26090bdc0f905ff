/* epfuse/route.cuh — routing layout blocks: counts, deterministic slots, count exchange, offsets — part of epfuse v0.1
 *
 * What it is: the device side of the route (the handle): from topk_idx [T, K] (int32 or int64,
 * -1 = not routed) one rank's blocks compute
 *   - tokens per expert [E] ((token, k) pairs) and per destination rank [R] (deduplicated),
 *     is_token_in_rank [T, R], and for every (token, k) its destination rank and its SLOT: its
 *     rank within its (source, expert) group in (token, k) order — warp votes + prefix, never an
 *     atomic, so the result is the same bits on every run, for any number of blocks or warps;
 *   - RANK_MAJOR: for every (token, destination rank) its slot in token order;
 *   - the count exchange: per-expert and per-rank counts into every peer's COUNTS region
 *     (parity = epoch & 1, row = this rank) as count words that carry the epoch (signal.cuh), which
 *     the reader validates one by one with bounded waits — no signal, no fence;
 *   - then, on the device, with no host sync: send offsets (the row of the destination's receive
 *     region where this rank's group of expert e, or its rank-major block, starts), this rank's
 *     receive segments (per local expert begin / count / padded count, aligned to
 *     plan.expert_alignment), per-(local expert, source) starts, rank-major per-source starts, the
 *     total receive rows (also stored to host-mapped memory) and the pad rows' metadata.
 * epf_route_update_block composes all of it; the phases are public for fused kernels. Expert ids
 * outside [-1, E) are dropped: treated as -1, counted (route header and the error record's
 * dropped_routes), never used as an index. A token that names one expert more than once is
 * routed to it once: the first occurrence (lowest k) gets the slot, later ones (REPEATS) are
 * treated like -1 here (DST_RANK = SLOT = -1, not counted, not dropped) and reuse the first
 * occurrence's output in the combine (dispatch.cuh: epf_topk_first_lane_warp).
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
 *   epf_status_t epf_route_offsets_block(epf_route_ctx_t*, epf_team_t, const epf_plan_t*, epf_wait_t) [collective:block]
 *   void epf_route_mark_pad_rows_block(epf_team_t, const epf_plan_t*, const epf_route_segment_t*, int num_local)
 *   epf_status_t epf_route_epoch_ack_wait_block(const epf_route_ctx_t*, epf_wait_t)      [collective:block]
 *   void epf_route_finish_block(const epf_route_ctx_t*, epf_status_t)                   [collective:block]
 *   epf_status_t epf_route_update_block(const epf_route_t*, int index, epf_team_t, const epf_plan_t*,
 *                       const void* topk_idx, int num_tokens, int block_index, int num_blocks,
 *                       epf_wait_t, int64_t* recv_total_mapped, void* smem)              [collective:block]
 *   int  epf_route_rows_em(const epf_route_segment_t*, int num_local)  (host/device helper)
 *
 * Requirements: CUDA, sm_70+ (warp votes and shuffles with masks); sm_90 / sm_100 compiled. blockDim.x a multiple
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

/* EPF__ROUTE_PROBE(i): private instrumentation hook (bench_route defines it to stamp clock64 at
 * points inside the phases); empty by default. */
#ifndef EPF__ROUTE_PROBE
#define EPF__ROUTE_PROBE(i) ((void)0)
#endif

/* misc shared-memory slots (int32) */
#define EPF__ROUTE_MISC_SINK 0 /* [32]: per-lane target of the count pass's branch-free atomics */
#define EPF__ROUTE_MISC_DROPPED 40
#define EPF__ROUTE_MISC_ROWS_EM 41 /* offsets: rows of this rank's expert-major segment */
#define EPF__ROUTE_MISC_ROWS_RM 42 /* offsets: rows of this rank's rank-major region */
#define EPF__ROUTE_MISC_INTS 64
#define EPF__ROUTE_CUB_BYTES_PER_WARP 16
/* A warp walks its tokens in BATCHES of whole tokens, at most EPF__ROUTE_BATCH (token, k) entries
 * (EPF__ROUTE_STEPS 32-entry steps, loads in flight per lane); rows of counts per batch of loads
 * (latency hiding; results do not depend on these). */
#define EPF__ROUTE_STEPS 5
#define EPF__ROUTE_BATCH (32 * EPF__ROUTE_STEPS)
#define EPF__ROUTE_ROWS 16 /* count words (blocks or sources) loaded per batch: <= 16 is one round trip */
#define EPF__ROUTE_KEEP 8  /* per-source counts the offsets keep in registers (more ranks: loaded again) */
#define EPF__ROUTE_QUICK_SPINS 64 /* batch reloads before a late count word goes to the bounded wait */
/* SPLIT update: with 2 or 3 blocks per rank and at most this many (token, k) entries, every
 * block walks all the tokens itself and none waits for another's counts: the control block
 * (0) counts, writes the is_token_in_rank rows and publishes; block 1 counts per warp and writes
 * the slots; with 3 blocks, block 2 counts the expert columns and computes the offsets (with 2,
 * block 0 does). No scratch rows, no merge wait. */
#define EPF_ROUTE_SPLIT_ENTRIES 2304

/* One rank-block's view of an update: this rank's arrays, the shapes, this update's epoch and the
 * caller's shared memory carved up. Built by epf_route_ctx_make; passed by pointer to the phases.
 * Uniform over the block except the warp's token range and the lane's cached ids. */
typedef struct epf_route_ctx {
  /* this rank's route buffer and its layout (route->layout: with epf_route_update's kernel, the
   * kernel's by-value parameter, so the array offsets are constant-bank operands). The arrays'
   * addresses are formed where a phase uses them (EPF__ROUTE_ARR), not held in the ctx: pointers
   * computed in every warp's setup and kept live through every phase cost more than forming them
   * where used (docs/performance.md, Routing v5) */
  char* buf;
  const epf_route_layout_t* layout;
  uint32_t* epoch_word;       /* the route's epoch word for this rank */
  const void* topk_idx;       /* [num_tokens][K] */
  int64_t* recv_total_mapped; /* host-mapped int64 or NULL */
  int32_t num_tokens, top_k, num_experts, nranks, experts_per_rank, index64;
  int32_t rank_major, exchange, alignment, mark_pads;
  int32_t rank;               /* team rank this block plays */
  int32_t block_index, num_blocks, num_warps;
  int32_t split;              /* a SPLIT update (num_blocks 2 or 3, T K <= EPF_ROUTE_SPLIT_ENTRIES):
                                 no scratch; block 0 counts [0, T), writes the rows and publishes,
                                 block 1 does the slots of [0, T), block 2 (3 blocks) the offsets */
  int32_t offsets_block;      /* the block that computes the offsets: 2 in a 3-block SPLIT, else 0 */
  int32_t batch_tokens;       /* whole tokens per warp batch: EPF__ROUTE_BATCH / K */
  uint32_t el_inv;            /* destination rank of expert e = __umulhi(e, el_inv) (0: EL == 1) */
  int32_t ebits, rbits;       /* bits of E - 1 and of R - 1: ballots per equality mask (epf__route_match) */
  int32_t shfl_first;         /* K a power of two <= 32 and R <= 32: first entries by warp ballots */
  int32_t t0, t1;             /* this warp's tokens [t0, t1) */
  uint32_t epoch;             /* this update's epoch: the route's epoch word + 1 */
  int32_t status;             /* set by the phases: EPF_OK or the first failure */
  int64_t recv_capacity;
  int32_t* hist;              /* smem [W][E + R]: per-warp counts, then running slots */
  int32_t* tot;               /* smem [E + R + 1]: this rank's totals (+ dropped) */
  int32_t* misc;              /* smem [EPF__ROUTE_MISC_INTS] */
  int32_t* stage;             /* smem [num_warps][EPF__ROUTE_BATCH]: a batch's destination ranks */
  void* cub_temp;             /* smem [32][EPF__ROUTE_CUB_BYTES_PER_WARP] */
  int32_t* tags;              /* smem [num_warps][E]: the slot pass's expert tags, or NULL (ballots) */
  int32_t ids_cached;         /* 1: this warp's tokens are one batch and ids[] / first hold this
                                 lane's entries (set by epf_route_count_block, read by _slots_block) */
  uint32_t first;             /* bit u: the lane's entry of step u is its token's first to its rank */
  int32_t ids[EPF__ROUTE_STEPS];
} epf_route_ctx_t;

/* EPF__ROUTE_ARR(c, id, type) — device address of array `id` of the ctx's route buffer, as a
 * `type*` (array ids: host.h epf_route_array_id_t). Arrays a layout leaves out have 0 bytes and
 * are only formed where their flag says they exist (RM_SLOT: tested with EPF__ROUTE_HAS). */
#define EPF__ROUTE_ARR(c, id, type) ((type*)((c)->buf + (c)->layout->array[(id)].offset))
#define EPF__ROUTE_HAS(c, id) ((c)->layout->array[(id)].bytes != 0u)

EPF_HD size_t epf__route_align4(size_t n) { return (n + 3u) & ~(size_t)3u; }

/* ints of the hist region for W warps: the count and slot passes' per-warp rows [W][E + R]
 * (the offsets reuse its first R), rounded up to 4 (16 bytes) */
EPF_HD size_t epf__route_hist_ints(const epf_route_layout_t* layout, size_t W) {
  return epf__route_align4(W * ((size_t)layout->num_experts + (size_t)layout->nranks));
}

/* bytes of everything but the tag rows: hist, totals, misc, stage, cub temp storage */
EPF_HD size_t epf__route_smem_core(const epf_route_layout_t* layout, size_t W) {
  const size_t row = (size_t)layout->num_experts + (size_t)layout->nranks;
  return 4u * (epf__route_hist_ints(layout, W) + epf__route_align4(row + 1u) + EPF__ROUTE_MISC_INTS +
               W * EPF__ROUTE_BATCH) +
         32u * EPF__ROUTE_CUB_BYTES_PER_WARP;
}

/* whether the slot pass's per-warp expert tag rows [W][E] (epf__route_match_tags) fit beside the
 * rest within EPF__ROUTE_TAGS_SMEM_LIMIT; when they do not, the slot pass matches by ballots */
#define EPF__ROUTE_TAGS_SMEM_LIMIT (48u * 1024u)
EPF_HD int epf__route_tags_fit(const epf_route_layout_t* layout, size_t W) {
  return epf__route_smem_core(layout, W) + 4u * W * (size_t)layout->num_experts <= EPF__ROUTE_TAGS_SMEM_LIMIT;
}

/* epf_route_smem_bytes — dynamic shared memory the route blocks need for a block of
 *   `block_threads` threads: 4 * (W * (E + R) + (E + R + 1) + 64 + W * 160) + 512 bytes (rounded),
 *   W = block_threads / 32, plus 4 W E for the slot pass's tag rows when the total stays within
 *   48 KiB (E = 256: up to 16 warps). Scope: any thread, host or device. Pure. */
EPF_HD size_t epf_route_smem_bytes(const epf_route_layout_t* layout, int block_threads) {
  const size_t W = (size_t)(block_threads / 32);
  return epf__route_smem_core(layout, W) +
         (epf__route_tags_fit(layout, W) ? 4u * W * (size_t)layout->num_experts : 0u);
}

/* epf_route_rows_em — rows of an expert-major receive layout: end of the last segment. */
EPF_HD int epf_route_rows_em(const epf_route_segment_t* seg, int num_local) {
  return num_local > 0 ? seg[num_local - 1].begin + seg[num_local - 1].padded_count : 0;
}

/* x / d for x >= 0, d >= 1 on the device: a shift when d is a power of two (the common K, W and
 * block counts), else the 32-bit division (a chain of ~15 dependent instructions, which every
 * warp of every block would otherwise run in its setup) */
EPF_DEVICE_INLINE int epf__route_div(int x, int d) {
  return (d & (d - 1)) == 0 ? x >> (__ffs(d) - 1) : x / d;
}

/* epf_route_block_tokens — the tokens [*out_t0, *out_t1) block b of B owns in an update (count
 *   and slot passes; a fused kernel that produces topk_idx per block uses the same partition,
 *   examples/03_fused_moe_layer). B == 1: all of [0, T). B > 1: block 0 is the rank's CONTROL
 *   block and owns no tokens (it merges the counts, publishes them and computes the offsets while
 *   the others walk the tokens); block b >= 1 owns [T (b - 1) / (B - 1), T b / (B - 1)).
 *   On the device T * B must stay below 2^31 (what the route's limits give: T <= 2^24,
 *   B <= EPF_ROUTE_MAX_BLOCKS), which keeps the arithmetic in 32 bits (a 64-bit division here was
 *   if-converted into every update's path); on the host any int. Scope: any thread, host or
 *   device. Pure. */
EPF_HD void epf_route_block_tokens(int num_tokens, int block_index, int num_blocks, int* out_t0, int* out_t1) {
  const int W = num_blocks > 1 ? num_blocks - 1 : 1, b = num_blocks > 1 ? block_index - 1 : block_index;
  if (b < 0) {
    *out_t0 = *out_t1 = 0;
    return;
  }
#if defined(__CUDA_ARCH__)
  *out_t0 = epf__route_div(num_tokens * b, W); /* the SPLIT update's 1, 16 + 1 blocks: shifts */
  *out_t1 = epf__route_div(num_tokens * (b + 1), W);
#else
  *out_t0 = (int)((int64_t)num_tokens * b / W);
  *out_t1 = (int)((int64_t)num_tokens * (b + 1) / W);
#endif
}

/* epf_route_ctx_make — this block's view of one rank's update.
 *   Scope: any thread (every thread of the block calls it with uniform arguments).
 *   index: the buffer of the route group (0 for a real rank, the virtual rank otherwise); rank:
 *   the team rank the block plays; topk_idx: this rank's [num_tokens][K] ids; block_index in
 *   [0, num_blocks), num_blocks <= route->layout.max_blocks; smem: epf_route_smem_bytes bytes,
 *   16-byte aligned. Reads the epoch word (a plain load: call it before the block's counts reach
 *   the scratch in epf_route_count_block; block 0 stores the next epoch only after it has read
 *   every block's scratch row, which is what makes that store safe; in a SPLIT update block 1
 *   uses no epoch and block 2 acknowledges reading it: epf_route_epoch_ack_wait_block).
 *   Token partition: epf_route_block_tokens (block 0 owns none when B > 1), split again over the
 *   block's warps in order; a fused kernel may rely on it (examples/03_fused_moe_layer) except
 *   in a SPLIT update (B == 2 or 3, T K <= EPF_ROUTE_SPLIT_ENTRIES): there EVERY block walks
 *   all of [0, T) (block 1 writes every slot), so a kernel that produces topk_idx per block
 *   must make all of it visible to the rank's blocks first (a rank rendezvous), or use B >= 4. */
EPF_DEVICE_INLINE epf_route_ctx_t epf_route_ctx_make(const epf_route_t* route, int index, int rank,
                                                     const void* topk_idx, int num_tokens, int block_index,
                                                     int num_blocks, int64_t* recv_total_mapped, void* smem) {
  epf_route_ctx_t c;
  const epf_route_layout_t* L = &route->layout;
  const size_t row = (size_t)L->num_experts + (size_t)L->nranks;
  /* epf_route_ptr's arithmetic with the buffer's base computed once (block-uniform) */
  c.buf = (char*)route->base + (uint64_t)index * L->total_bytes;
  c.layout = L;
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
  {
    const int K = L->top_k > 0 ? L->top_k : 1, EL = L->experts_per_rank;
    c.batch_tokens = epf__route_div(EPF__ROUTE_BATCH, K);
    c.el_inv = EL <= 1 ? 0u : (EL & (EL - 1)) == 0 ? 1u << (33 - __ffs(EL)) : 0xffffffffu / (uint32_t)EL + 1u;
  }
  c.ebits = L->num_experts > 1 ? 32 - __clz(L->num_experts - 1) : 0;
  c.rbits = L->nranks > 1 ? 32 - __clz(L->nranks - 1) : 0;
  c.shfl_first = L->top_k <= 32 && (L->top_k & (L->top_k - 1)) == 0 && L->nranks <= 32;
  c.split = (num_blocks == 2 || num_blocks == 3) && num_tokens * L->top_k <= EPF_ROUTE_SPLIT_ENTRIES;
  c.offsets_block = c.split && num_blocks == 3 ? 2 : 0;
  epf_route_block_tokens(num_tokens, c.split ? 1 : block_index, c.split ? 2 : num_blocks, &c.t0, &c.t1);
  {
    /* warp w of W: [n w / W, n (w + 1) / W) of the block's n tokens (n W < 2^31: n <= 2^24,
     * W <= 32); W a power of two by shifts, else x / W as __umulhi(x, 2^32 / W rounded up), exact
     * for x W < 2^32, i.e. n W^2 < 2^32 (n < 4M at W = 32), else by 32-bit divisions */
    const int n = c.t1 - c.t0, w = epf_warp_id(), W = c.num_warps;
    int w0, w1;
    if ((W & (W - 1)) != 0 && (int64_t)n * W * W < (int64_t)0xffffffff) {
      const uint32_t winv = 0xffffffffu / (uint32_t)W + 1u;
      w0 = (int)__umulhi((uint32_t)(n * w), winv);
      w1 = (int)__umulhi((uint32_t)(n * (w + 1)), winv);
    } else {
      w0 = epf__route_div(n * w, W);
      w1 = epf__route_div(n * (w + 1), W);
    }
    c.t1 = c.t0 + w1;
    c.t0 = c.t0 + w0;
  }
  c.epoch = *c.epoch_word + 1u;
  c.status = EPF_OK;
  c.recv_capacity = L->recv_capacity;
  c.hist = (int32_t*)smem;
  c.tot = c.hist + epf__route_hist_ints(L, (size_t)c.num_warps);
  c.misc = c.tot + epf__route_align4(row + 1u);
  c.stage = c.misc + EPF__ROUTE_MISC_INTS;
  c.cub_temp = (void*)(c.stage + (size_t)c.num_warps * EPF__ROUTE_BATCH);
  c.tags = epf__route_tags_fit(L, (size_t)c.num_warps)
               ? (int32_t*)((char*)c.cub_temp + 32u * EPF__ROUTE_CUB_BYTES_PER_WARP)
               : NULL;
  c.ids_cached = 0;
  c.first = 0u;
  return c;
}

/* ---- private helpers ------------------------------------------------------------------------ */

/* epf__route_block_status — epf__block_status with one barrier in the common case: when no
 * thread of the block failed (one __syncthreads_or) the answer is EPF_OK, exactly what
 * epf__block_status returns then; otherwise epf__block_status folds the failures by priority.
 * [collective:block] */
EPF_DEVICE_INLINE epf_status_t epf__route_block_status(epf_status_t mine) {
  if (!__syncthreads_or(mine != EPF_OK)) return EPF_OK;
  return epf__block_status(mine);
}

/* epf__route_warp_exclusive_sum — exclusive prefix sum of x over the warp's lanes in lane order,
 * the warp's total in *out_total (every lane). [collective:warp] every lane, converged. Built from
 * cub::WarpScan (shuffles; cub_temp: the warp's EPF__ROUTE_CUB_BYTES_PER_WARP bytes). */
EPF_DEVICE_INLINE int epf__route_warp_exclusive_sum(int x, int* out_total, void* cub_temp) {
  typedef cub::WarpScan<int> epf__warp_scan_t;
  typedef epf__warp_scan_t::TempStorage epf__warp_scan_temp_t;
  int incl = 0;
  EPF_STATIC_ASSERT(sizeof(epf__warp_scan_temp_t) <= EPF__ROUTE_CUB_BYTES_PER_WARP, "cub temp storage");
  epf__warp_scan_t(*(epf__warp_scan_temp_t*)((char*)cub_temp + epf_warp_id() * EPF__ROUTE_CUB_BYTES_PER_WARP))
      .InclusiveSum(x, incl);
  *out_total = __shfl_sync(0xffffffffu, incl, 31);
  return incl - x;
}

/* destination rank of expert e >= 0: e / EL without a division (exact for e * EL < 2^32, which
 * EPF_MAX_EXPERTS <= 65535 guarantees) */
EPF_DEVICE_INLINE int epf__route_dest(const epf_route_ctx_t* c, int e) {
  return c->el_inv == 0u ? e : (int)__umulhi((uint32_t)e, c->el_inv);
}

/* the offsets block's epoch acknowledgement in a 3-block SPLIT update: word 0 of scratch row 2
 * (no scratch row is used otherwise in a SPLIT update), a count word carrying the epoch it read */
EPF_DEVICE_INLINE uint64_t* epf__route_epoch_ack(const epf_route_ctx_t* c) {
  return EPF__ROUTE_ARR(c, EPF_ROUTE_SCRATCH, uint64_t) + 2 * (int64_t)(c->num_experts + c->nranks + 1);
}

/* epf__route_batch_dedup — the duplicate rule (dispatch.cuh: epf_topk_first_lane_warp): an entry
 * whose expert an earlier k of its token already names is a REPEAT and becomes -1 here — no copy,
 * no count, no slot, not a dropped id (the combine gives it its first occurrence's output). A
 * batch starts at a token boundary, so entry j = 32 u + lane has k = j % K. K a power of two:
 * a token's K entries are K aligned lanes of one step, compared by K - 1 shuffles per two steps
 * (ids + 1 packed 16 bits each); other K: through the warp's stage row, at most K - 1
 * shared-memory reads per entry. K == 1: nothing to do. [collective:warp] */
EPF_DEVICE_INLINE void epf__route_batch_dedup(const epf_route_ctx_t* c, int* ev) {
  const int K = c->top_k, lane = epf_lane_id();
  int u;
  if (K == 1) return;
  if ((K & (K - 1)) == 0) {
    enum { P = (EPF__ROUTE_STEPS + 1) / 2 };
    const int kl = lane & (K - 1);
    uint32_t pk[P], rep[P];
    int o, p;
#pragma unroll
    for (p = 0; p < P; ++p) {
      const uint32_t hi = 2 * p + 1 < EPF__ROUTE_STEPS ? (uint32_t)(ev[2 * p + 1] + 1) : 0u;
      pk[p] = (uint32_t)(ev[2 * p] + 1) | (hi << 16);
      rep[p] = 0u;
    }
#pragma unroll 1
    for (o = 1; o < K; ++o) {
#pragma unroll
      for (p = 0; p < P; ++p) {
        const uint32_t eq = __shfl_up_sync(0xffffffffu, pk[p], (unsigned)o, K) ^ pk[p];
        if (kl >= o) rep[p] |= ((eq & 0xffffu) == 0u ? 1u : 0u) | ((eq >> 16) == 0u ? 2u : 0u);
      }
    }
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u)
      if ((rep[u >> 1] >> (u & 1)) & 1u) ev[u] = -1; /* an entry of -1 equal to -1 stays -1 */
  } else {
    int32_t* S = c->stage + epf_warp_id() * EPF__ROUTE_BATCH;
    const int step_k = 32 % K;
    int kk = lane % K; /* k of entry 32 u + lane */
    __syncwarp(); /* earlier reads of the stage row are done */
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) S[32 * u + lane] = ev[u];
    __syncwarp();
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) {
      const int j = 32 * u + lane, e = ev[u];
      if (e >= 0) {
        int q;
        for (q = j - kk; q < j; ++q) /* no collective inside: lanes may differ in trips */
          if (S[q] == e) {
            ev[u] = -1;
            break;
          }
      }
      kk += step_k;
      if (kk >= K) kk -= K;
    }
  }
}

/* epf__route_batch_load — this lane's entries of one batch: entry 32 u + lane of the batch that
 * starts at (token, k) entry i0 and holds nb entries, as an expert id in [-1, E) (ev[u] = -1 past
 * the batch). Ids outside [-1, E) give -1 and count into *dropped (when not NULL); repeats of an
 * expert within a token give -1 without counting (epf__route_batch_dedup). [collective:warp] */
EPF_DEVICE_INLINE void epf__route_batch_load(const epf_route_ctx_t* c, int64_t i0, int nb, int* ev, uint32_t* dropped) {
  const int lane = epf_lane_id();
  const uint32_t E = (uint32_t)c->num_experts;
  uint32_t bad = 0u;
  int u;
  /* one loop per index type (not a select per step): each step is one predicated load at an
   * immediate offset from the lane's base, then an unsigned compare (-1 <= v < E) */
  if (c->index64) {
    const int64_t* p = (const int64_t*)c->topk_idx + i0 + lane;
    int64_t v[EPF__ROUTE_STEPS];
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) v[u] = 32 * u + lane < nb ? p[32 * u] : -1;
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) {
      const bool ok = (uint64_t)v[u] + 1u <= (uint64_t)E;
      bad += ok ? 0u : 1u;
      ev[u] = ok ? (int)v[u] : -1;
    }
  } else {
    const int32_t* p = (const int32_t*)c->topk_idx + i0 + lane;
    int32_t v[EPF__ROUTE_STEPS];
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) v[u] = 32 * u + lane < nb ? p[32 * u] : -1;
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) {
      const bool ok = (uint32_t)v[u] + 1u <= E;
      bad += ok ? 0u : 1u;
      ev[u] = ok ? v[u] : -1;
    }
  }
  if (dropped != NULL) *dropped += bad;
  epf__route_batch_dedup(c, ev); /* repeats of an expert within a token: -1 (after the dropped count) */
}

/* epf__route_batch_first — which of this lane's entries are their token's FIRST entry (lowest k)
 * to their destination rank: bit u of the result for entry 32 u + lane. The batch's destination
 * ranks go through the warp's c->stage row; each entry compares with its token's earlier entries
 * (at most K - 1 shared-memory reads). Works for any K and R. [collective:warp] */
EPF_DEVICE_INLINE uint32_t epf__route_batch_first(const epf_route_ctx_t* c, const int* ev) {
  const int lane = epf_lane_id(), K = c->top_k;
  int32_t* S = c->stage + epf_warp_id() * EPF__ROUTE_BATCH;
  uint32_t first = 0u;
  int u;
  __syncwarp(); /* the previous batch's reads of S are done */
#pragma unroll
  for (u = 0; u < EPF__ROUTE_STEPS; ++u) S[32 * u + lane] = ev[u] >= 0 ? epf__route_dest(c, ev[u]) : -1;
  __syncwarp();
#pragma unroll
  for (u = 0; u < EPF__ROUTE_STEPS; ++u) {
    const int j = 32 * u + lane;
    const int d = S[j];
    if (d >= 0) {
      int q = j - j % K;
      while (q < j && S[q] != d) ++q;
      if (q == j) first |= 1u << u;
    }
  }
  return first;
}

/* epf__route_match — for each step u, the mask of the warp's lanes whose v[u] equals this lane's
 * (among lanes with v[u] >= 0; meaningless for a lane with v[u] < 0): one ballot of the valid lanes,
 * then one ballot per bit of v (v < 2^nbits), ANDed as equal / complemented. Deterministic, and
 * plain votes: __match_any_sync is a MIO instruction whose queue throttled the slot pass
 * (docs/performance.md, Routing). [collective:warp] */
EPF_DEVICE_INLINE void epf__route_match(const int* v, int nbits, uint32_t* m) {
  int u, bit;
#pragma unroll
  for (u = 0; u < EPF__ROUTE_STEPS; ++u) m[u] = __ballot_sync(0xffffffffu, v[u] >= 0);
#pragma unroll 1
  for (bit = 0; bit < nbits; ++bit) {
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) {
      const bool one = ((v[u] >> bit) & 1) != 0;
      const uint32_t b = __ballot_sync(0xffffffffu, one);
      m[u] &= one ? b : ~b;
    }
  }
}

/* epf__route_match_tags — epf__route_match for ids v in [-1, E) by shared-memory tags, a handful
 * of instructions per step instead of one vote per bit: in each step every lane with v >= 0
 * stores its lane id at tags[v] (one of the equal lanes wins), reads the winner back — the same
 * lane for all equal lanes — and ORs its bit into the winner's word of the step, grp[32 u +
 * winner]; those words are the masks. Which lane wins changes no mask: the result is the same
 * set of lanes as epf__route_match's, on every run. A lane with v < 0 ORs into its own word
 * (it wins no tag, so no valid lane reads that word) and gets mask 0.
 * tags: the warp's [E] row (no initial value needed); grp: the warp's EPF__ROUTE_BATCH-word stage
 * row, zeroed here first. [collective:warp] */
EPF_DEVICE_INLINE void epf__route_match_tags(const int* v, int32_t* tags, uint32_t* grp, uint32_t* m) {
  const int lane = epf_lane_id();
  int lead[EPF__ROUTE_STEPS], u;
  __syncwarp(); /* earlier reads of grp (another use of the stage row) are done */
#pragma unroll
  for (u = 0; u < EPF__ROUTE_STEPS; ++u) grp[32 * u + lane] = 0u;
#pragma unroll
  for (u = 0; u < EPF__ROUTE_STEPS; ++u) {
    if (v[u] >= 0) tags[v[u]] = lane;
    __syncwarp();
    lead[u] = v[u] >= 0 ? tags[v[u]] : lane;
    __syncwarp(); /* every read of this step's tags before the next step's stores */
    atomicOr(&grp[32 * u + lead[u]], 1u << lane);
  }
  __syncwarp();
#pragma unroll
  for (u = 0; u < EPF__ROUTE_STEPS; ++u) m[u] = v[u] >= 0 ? grp[32 * u + lead[u]] : 0u;
}

/* epf__route_batch_first_shfl — epf__route_batch_first for K a power of two <= 32 and R <= 32
 * (c->shfl_first): a token's K entries are K aligned lanes of one step, so an entry is its token's
 * first to rank d when no lower lane of its group has d (epf__route_match over the ranks' bits).
 * With rows != NULL the token's R-byte is_token_in_rank row is written too: the group ORs (1 << d)
 * by log2 K xor-shuffles and lane k of the group writes bytes k, k + K, ... (batch of nb entries
 * starting at token tb). [collective:warp] */
EPF_DEVICE_INLINE uint32_t epf__route_batch_first_shfl(const epf_route_ctx_t* c, const int* ev, uint8_t* rows, int tb, int nb) {
  const int lane = epf_lane_id(), K = c->top_k, R = c->nranks, kl = lane & (K - 1);
  const int kshift = __ffs(K) - 1;
  const uint32_t grp = K == 32 ? 0xffffffffu : ((1u << K) - 1u) << (lane & ~(K - 1));
  const uint32_t lt = (1u << lane) - 1u;
  uint32_t first = 0u, m[EPF__ROUTE_STEPS];
  int d[EPF__ROUTE_STEPS], u;
#pragma unroll
  for (u = 0; u < EPF__ROUTE_STEPS; ++u) d[u] = ev[u] >= 0 ? epf__route_dest(c, ev[u]) : -1;
  epf__route_match(d, c->rbits, m);
#pragma unroll
  for (u = 0; u < EPF__ROUTE_STEPS; ++u)
    if (d[u] >= 0 && (m[u] & grp & lt) == 0u) first |= 1u << u;
  if (rows != NULL) {
    uint32_t bits[EPF__ROUTE_STEPS];
    int o;
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) /* one rank: m[u] is the ballot of valid entries */
      bits[u] = R == 1 ? (m[u] & grp) != 0u : d[u] >= 0 ? 1u << d[u] : 0u;
#pragma unroll 1
    for (o = R == 1 ? K : 1; o < K; o <<= 1) {
#pragma unroll
      for (u = 0; u < EPF__ROUTE_STEPS; ++u) bits[u] |= __shfl_xor_sync(0xffffffffu, bits[u], o);
    }
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) {
      const int j = 32 * u + lane;
      if (j < nb && kl < R) {
        uint8_t* row = rows + (int64_t)(tb + (j >> kshift)) * R;
        int r = kl;
        do { /* R <= K (the common case): one byte per lane */
          row[r] = (uint8_t)((bits[u] >> r) & 1u);
          r += K;
        } while (r < R);
      }
    }
  }
  return first;
}

/* epf__route_fill_warp — the warp stores `n` bytes of value `byte` at p (4-byte stores where p and
 * n allow). [collective:warp]; ends with __syncwarp (the stores are ordered before the warp's
 * later stores to the same bytes). */
EPF_DEVICE_INLINE void epf__route_fill_warp(void* p, int64_t n, uint8_t byte) {
  const int lane = epf_lane_id();
  int64_t x;
  if (((uintptr_t)p & 3u) == 0u && (n & 3) == 0) {
    const uint32_t w = 0x01010101u * byte;
#pragma unroll 1
    for (x = lane; x < (n >> 2); x += 32) ((uint32_t*)p)[x] = w;
  } else {
#pragma unroll 1
    for (x = lane; x < n; x += 32) ((uint8_t*)p)[x] = byte;
  }
  __syncwarp();
}

/* epf__route_wait_word — slow path of epf__route_sum_words: wait (bounded by w) until the word at p
 * carries `epoch` (epf_count_word_wait_sys; peer for the diagnostic, -1 for none). Out of line:
 * one copy of the spin loop and its diagnostics, whatever the number of call sites. */
EPF__DEVICE_NOINLINE epf_status_t epf__route_wait_word(const uint64_t* p, uint32_t epoch, int peer, epf_wait_t w) {
  return epf_count_word_wait_sys(p, epoch, w, peer, NULL);
}

/* epf__route_sum_words_rows — epf__route_sum_words with `rows` words per round trip (a literal
 * at each call site: the loops unroll, v[] stays in registers; rows <= EPF__ROUTE_ROWS). */
EPF_DEVICE_INLINE void epf__route_sum_words_rows(const uint64_t* p, int64_t stride, int n, int split, uint32_t epoch,
                                                 int peer0, int self, int self_count, epf_wait_t w, epf_status_t* st,
                                                 int* tot, int* pre, int* keep, const int rows) {
  int i0, u, a = 0, b = 0;
  for (i0 = 0; i0 < n; i0 += rows) {
    uint64_t v[EPF__ROUTE_ROWS];
    int spins = 0;
    for (;;) { /* bounded: after EPF__ROUTE_QUICK_SPINS reloads, the bounded wait (signal.cuh) */
      int late = -1; /* the first word of the batch without the epoch */
#pragma unroll
      for (u = 0; u < rows; ++u)
        v[u] = i0 + u < n && i0 + u != self ? epf_ld_relaxed_sys_u64(p + (int64_t)(i0 + u) * stride)
                                            : epf_count_word_pack(epoch, i0 + u == self ? (uint32_t)self_count : 0u);
#pragma unroll
      for (u = rows - 1; u >= 0; --u)
        if (!epf_count_word_valid(v[u], epoch)) late = u;
      if (late < 0 || *st != EPF_OK) break;
      /* the first EPF__ROUTE_QUICK_SPINS times: load the whole batch again at once (relaxed, every
       * word checked in one round trip); then the bounded wait (deadline, abort word, diagnostic)
       * for that one word, and the batch again */
      if (++spins > EPF__ROUTE_QUICK_SPINS)
        *st = epf__route_wait_word(p + (int64_t)(i0 + late) * stride, epoch, peer0 < 0 ? -1 : peer0 + i0 + late, w);
    }
#pragma unroll
    for (u = 0; u < rows; ++u) {
      const int cnt = epf_count_word_valid(v[u], epoch) ? (int)epf_count_word_count(v[u]) : 0;
      if (keep != NULL && i0 == 0 && u < EPF__ROUTE_KEEP) keep[u] = cnt;
      a += cnt;
      if (i0 + u < split) b += cnt;
    }
  }
  *tot = a;
  *pre = b;
}

/* epf__route_sum_words — sum of the counts of n words p[i * stride] (i < n), each an
 * count word (epf_count_word_pack) that must carry `epoch`: *tot = all, *pre = those with i < split;
 * keep (may be NULL): the first min(n, EPF__ROUTE_KEEP) counts. Word `self` (-1: none) is not
 * loaded: its count is self_count (the rank's own published word, which the caller holds in
 * shared memory: one memory round trip less). n == 1 with self == 0 (a team of one) returns
 * self_count at once: no load, no check, none of the batch loop's code to fetch (the offsets'
 * time is mostly instruction fetch: docs/performance.md, v5). Loads up to EPF__ROUTE_ROWS words
 * per round trip (4 when n <= 4: the common one- to four-rank case does not execute 16 predicated
 * loads and checks per word) with ld.relaxed.sys (peers' words, or the rank's own scratch); while
 * a word does not carry the epoch yet, loads the whole batch again (up to EPF__ROUTE_QUICK_SPINS
 * times, a few tens of us), then waits for that word with the bounded wait (epf__route_wait_word:
 * deadline, abort, diagnostic) and loads the batch again. After a failure (kept in *st; later
 * batches do not wait) words without the epoch count 0. */
EPF_DEVICE_INLINE void epf__route_sum_words(const uint64_t* p, int64_t stride, int n, int split, uint32_t epoch,
                                            int peer0, int self, int self_count, epf_wait_t w, epf_status_t* st,
                                            int* tot, int* pre, int* keep) {
  if (n == 1 && self == 0) { /* the rank's own word only (a team of one): nothing to load or check */
    *tot = self_count;
    *pre = split > 0 ? self_count : 0;
    if (keep != NULL) keep[0] = self_count;
  } else if (n <= 4)
    epf__route_sum_words_rows(p, stride, n, split, epoch, peer0, self, self_count, w, st, tot, pre, keep, 4);
  else
    epf__route_sum_words_rows(p, stride, n, split, epoch, peer0, self, self_count, w, st, tot, pre, keep,
                              EPF__ROUTE_ROWS);
}

/* ---- pass 1 ----------------------------------------------------------------------------------- */

/* epf_route_count_block — pass 1 over this block's tokens: per-warp counts per expert and per
 *   destination rank, is_token_in_rank rows, dropped ids; then this block's totals into its
 *   scratch row.
 *   Scope:    [collective:block] [uniform-args] every thread, converged; exactly one block per
 *             (rank, block_index) of an update.
 *   Does:     warp w of the block owns a contiguous token range (blocks in order, warps in order
 *             inside) and walks it in batches of whole tokens (at most 160 entries). Entries
 *             (t, k) are visited 32 at a time in (t, k) order; each valid entry adds 1 to its
 *             expert's column of the warp's own row of c->hist (shared-memory atomics: a sum,
 *             the same whatever their order). An entry that is its token's first to its
 *             destination rank (epf__route_batch_first / _first_shfl) adds 1 to that rank's column;
 *             the batch's is_token_in_rank rows are written whole. Then c->hist columns
 *             become exclusive prefixes over warps and the block totals [E counts, R counts,
 *             dropped] go to scratch[block_index] as count words (epf_count_word_pack; with
 *             num_blocks == 1 to c->tot instead: they are the rank's totals). SPLIT update: the
 *             control block counts every entry into c->tot (the rank's totals) and writes every
 *             is_token_in_rank row; the token block counts only what its slots need (expert
 *             columns, and rank columns for RANK_MAJOR). Block 0 also resets header->status.
 *   Memory:   reads topk_idx; writes token_in_rank rows of its tokens (plain stores) and its
 *             scratch row (st.relaxed.gpu, each word carries the epoch: no fence, no flag).
 *             Smem: c->hist, c->stage, c->misc.
 *   [smem-reuse] starts with a __syncthreads. */
EPF_DEVICE_INLINE void epf_route_count_block(epf_route_ctx_t* c) {
  typedef cub::WarpReduce<int> epf__warp_reduce_t;
  typedef epf__warp_reduce_t::TempStorage epf__warp_reduce_temp_t;
  EPF_STATIC_ASSERT(sizeof(epf__warp_reduce_temp_t) <= EPF__ROUTE_CUB_BYTES_PER_WARP, "cub temp storage");
  const int lane = epf_lane_id(), warp = epf_warp_id(), W = c->num_warps;
  const int E = c->num_experts, R = c->nranks, K = c->top_k, row = E + R;
  /* SPLIT update: the control block's warps add into the block's totals c->tot directly (no
   * per-warp rows to zero and prefix: nothing reads them) and it writes the is_token_in_rank
   * rows; so do the offsets block's (block 2 of 3: expert columns; rank columns for RANK_MAJOR's
   * own receive count). The token block's totals are not the rank's, so it needs no first-entry
   * test (unless RANK_MAJOR: its rank columns give the rank-major slots) and no dropped count —
   * the blocks' paths are balanced that way (v5) */
  const bool ctrl = c->split && c->block_index == 0, offs = c->split && c->block_index == 2;
  const bool rows = !(ctrl || offs), totals = !c->split || ctrl, rank_cols = totals || c->rank_major;
  int32_t* H = rows ? c->hist + warp * row : c->tot;
  uint8_t* const tir = totals ? EPF__ROUTE_ARR(c, EPF_ROUTE_TOKEN_IN_RANK, uint8_t) : NULL;
  int32_t* const sink = c->misc + EPF__ROUTE_MISC_SINK + lane; /* never read */
  uint32_t dropped = 0u;
  int x, tb;
  int ev[EPF__ROUTE_STEPS], u;
  /* the first batch's ids are loaded before the block's setup barrier: their latency overlaps it */
  if (c->t0 < c->t1)
    epf__route_batch_load(c, (int64_t)c->t0 * K, (c->t1 - c->t0 < c->batch_tokens ? c->t1 - c->t0 : c->batch_tokens) * K,
                          ev, &dropped);
  __syncthreads();
  if (threadIdx.x == 0) {
    c->misc[EPF__ROUTE_MISC_DROPPED] = 0;
    if (c->block_index == 0) EPF__ROUTE_ARR(c, EPF_ROUTE_HEADER, epf_route_header_t)->status = EPF_OK;
    /* the offsets block has read the epoch: block 0 may store the next one (epf_route_finish_block) */
    if (offs) epf_st_relaxed_gpu_u64(epf__route_epoch_ack(c), epf_count_word_pack(c->epoch, 0u));
  }
  /* strided loops stay rolled (#pragma unroll 1) here and below: unrolled, each needs its trip
   * count, a 32-bit division (~20 instructions per warp) before the first iteration */
  if (rows) {
#pragma unroll 1
    for (x = lane; x < row; x += 32) H[x] = 0;
  } else {
#pragma unroll 1
    for (x = (int)threadIdx.x; x < row; x += (int)blockDim.x) H[x] = 0;
  }
  c->ids_cached = c->t1 - c->t0 <= c->batch_tokens;
  __syncthreads();
  EPF__ROUTE_PROBE(0);

  for (tb = c->t0; tb < c->t1; tb += c->batch_tokens) {
    const int nt = c->t1 - tb < c->batch_tokens ? c->t1 - tb : c->batch_tokens;
    uint32_t first;
    if (tb != c->t0) epf__route_batch_load(c, (int64_t)tb * K, nt * K, ev, &dropped);
    EPF__ROUTE_PROBE(1);
    if (!rank_cols) {
      first = 0u;
      EPF__ROUTE_PROBE(2);
    } else if (c->shfl_first) {
      first = epf__route_batch_first_shfl(c, ev, tir, tb, nt * K); /* rows written too */
      EPF__ROUTE_PROBE(2);
    } else {
      first = epf__route_batch_first(c, ev);
      EPF__ROUTE_PROBE(2);
      if (tir != NULL) {
        epf__route_fill_warp(tir + (int64_t)tb * R, (int64_t)nt * R, 0); /* ends with __syncwarp */
#pragma unroll
        for (u = 0; u < EPF__ROUTE_STEPS; ++u)
          if ((first >> u) & 1u) tir[(int64_t)(tb + (32 * u + lane) / K) * R + epf__route_dest(c, ev[u])] = 1;
      }
    }
    EPF__ROUTE_PROBE(3);
    /* counts: shared-memory atomics on the warp's own row (the totals do not depend on the order
     * of the adds; the slots pass, which needs an order, uses epf__route_match) */
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) { /* branch-free: a lane with nothing to add adds to its sink */
      const int e = ev[u], d = epf__route_dest(c, e); /* d: meaningless for e < 0, then unused */
      atomicAdd(e >= 0 ? &H[e] : sink, 1);
      atomicAdd((first >> u) & 1u ? &H[E + d] : sink, 1);
    }
    EPF__ROUTE_PROBE(4);
    if (c->ids_cached) {
#pragma unroll
      for (u = 0; u < EPF__ROUTE_STEPS; ++u) c->ids[u] = ev[u];
      c->first = first;
    }
  }
  if (totals) {
    const int n = epf__warp_reduce_t(*(epf__warp_reduce_temp_t*)((char*)c->cub_temp + warp * EPF__ROUTE_CUB_BYTES_PER_WARP))
                      .Sum((int)dropped);
    if (lane == 0 && n != 0) atomicAdd(&c->misc[EPF__ROUTE_MISC_DROPPED], n);
  }
  __syncthreads();
  EPF__ROUTE_PROBE(5);

  /* per-warp counts -> exclusive prefixes over warps; block totals -> scratch row, or with one
   * block per rank straight into c->tot (they are the rank's totals, no merge needed) */
  if (!rows) {
    if (threadIdx.x == 0) c->tot[row] = c->misc[EPF__ROUTE_MISC_DROPPED]; /* the counts are in place */
  } else {
    uint64_t* part = EPF__ROUTE_ARR(c, EPF_ROUTE_SCRATCH, uint64_t) + (int64_t)c->block_index * (row + 1);
    const bool single = c->num_blocks == 1 || c->split;
#pragma unroll 1
    for (x = (int)threadIdx.x; x <= row; x += (int)blockDim.x) {
      int32_t run = 0;
      int w0, w;
      if (x < row) {
        /* 8 warps' counts loaded at once, then their exclusive prefix stored: one shared-memory
         * round trip per 8 warps instead of one per warp (the loads do not wait for the stores) */
        for (w0 = 0; w0 < W; w0 += 8) {
          int32_t v[8];
#pragma unroll
          for (w = 0; w < 8; ++w) v[w] = w0 + w < W ? c->hist[(w0 + w) * row + x] : 0;
#pragma unroll
          for (w = 0; w < 8; ++w) {
            if (w0 + w < W) c->hist[(w0 + w) * row + x] = run;
            run += v[w];
          }
        }
      } else {
        run = c->misc[EPF__ROUTE_MISC_DROPPED];
      }
      if (single)
        c->tot[x] = run;
      else
        epf_st_relaxed_gpu_u64(part + x, epf_count_word_pack(c->epoch, (uint32_t)run));
    }
  }
}

/* ---- the rank's blocks meet ------------------------------------------------------------------- */

/* epf_route_merge_block — every block of the rank gets the counts of the blocks before it (added
 *   to its warps' prefixes); block 0 gets the rank's totals. With num_blocks == 1 there is nothing
 *   to merge (the totals epf_route_count_block left in c->tot are the rank's).
 *   Scope:    [collective:block] [uniform-args] after epf_route_count_block, in every block of the
 *             rank; the rank's num_blocks blocks must be co-resident [needs-co-residency] [blocking].
 *   Does:     thread x loads word x of the scratch rows it needs (block b: rows < b; block 0:
 *             every row; ld.relaxed.sys, 16 rows per round trip); a word whose epoch is not this
 *             update's is waited for (bounded by w: epf_count_word_wait_sys, the diagnostic names
 *             the word). No barrier word, no fence: each count carries its epoch. Then
 *             c->hist[w][x] += counts of blocks < block_index; block 0: c->tot = the rank's totals
 *             [E + R + 1] (block 0 reading every row is also what makes its epoch store at the end
 *             safe: every block has read the epoch by then). Block 0 writes expert_count, rank_count,
 *             header rank / num_tokens / dropped_routes and adds dropped ids to
 *             w.record->dropped_routes.
 *   Result:   [result:all] EPF_OK, or a wait's failure (also kept in c->status). */
EPF_DEVICE_INLINE epf_status_t epf_route_merge_block(epf_route_ctx_t* c, epf_wait_t w) {
  const int E = c->num_experts, R = c->nranks, row = E + R, W = c->num_warps, B = c->num_blocks;
  epf_status_t st = EPF_OK;
  int x;
  __syncthreads();
  if (B > 1 && !c->split) {
#pragma unroll 1
    for (x = (int)threadIdx.x; x <= row; x += (int)blockDim.x) {
      int base, total, wi;
      /* block 0 (no tokens of its own when B > 1) needs every row for the totals; block b only
       * the rows before it for its base */
      const int n = c->block_index == 0 ? B : c->block_index;
      epf__route_sum_words(EPF__ROUTE_ARR(c, EPF_ROUTE_SCRATCH, uint64_t) + x, row + 1, n, c->block_index, c->epoch, -1, -1, 0, w, &st, &total, &base, NULL);
      if (x < row && base != 0)
        for (wi = 0; wi < W; ++wi) c->hist[wi * row + x] += base;
      if (c->block_index == 0) c->tot[x] = total;
    }
    st = epf__route_block_status(st);
    if (st != EPF_OK) {
      c->status = st;
      return st;
    }
  }
  /* B == 1 or SPLIT: the __syncthreads above made epf_route_count_block's c->tot visible (in a
   * SPLIT update both blocks counted every token: block 0's totals are the rank's) */
  if (c->block_index == 0) {
    int32_t* const expert_count = EPF__ROUTE_ARR(c, EPF_ROUTE_EXPERT_COUNT, int32_t);
    int32_t* const rank_count = EPF__ROUTE_ARR(c, EPF_ROUTE_RANK_COUNT, int32_t);
#pragma unroll 1
    for (x = (int)threadIdx.x; x < E; x += (int)blockDim.x) expert_count[x] = c->tot[x];
#pragma unroll 1
    for (x = (int)threadIdx.x; x < R; x += (int)blockDim.x) rank_count[x] = c->tot[E + x];
    if (threadIdx.x == 0) {
      epf_route_header_t* const hdr = EPF__ROUTE_ARR(c, EPF_ROUTE_HEADER, epf_route_header_t);
      hdr->rank = c->rank;
      hdr->num_tokens = c->num_tokens;
      hdr->dropped_routes = (uint32_t)c->tot[row];
      if (w.record != NULL) epf_error_count_add(&w.record->dropped_routes, (uint32_t)c->tot[row]);
    }
  }
  return EPF_OK;
}

/* ---- count exchange --------------------------------------------------------------------------- */

/* epf_route_publish_block — publish this rank's totals into every peer's window.
 *   Scope:    [collective:block] [uniform-args] after epf_route_merge_block returned EPF_OK, in
 *             every block of the rank; block 0 (which holds the totals) does the stores, the
 *             others return at once. This rank is its own peer.
 *   Does:     COUNTS[parity = epoch & 1][src = rank][0 .. E + R) of peer p =
 *             epf_count_word_pack(epoch, c->tot[x]) with .sys relaxed 8-byte stores. No signal, no fence: every word carries
 *             its epoch (NCCL's LL idea), so the reader (epf_route_offsets_block) validates each
 *             word it loads and the exchange costs one store and one load round trip.
 *   Memory:   st.relaxed.sys u64 to peers (single-copy atomic: aligned 8-byte words).
 *             Parity: a rank writes parity P of a peer again only at epoch + 2, which it reaches
 *             only after that peer has published epoch + 1, i.e. after the peer's update of this
 *             epoch (a separate kernel, or a later phase in a fused kernel) has finished reading
 *             parity P. A fused persistent kernel must keep that order. */
EPF_DEVICE_INLINE void epf_route_publish_block(const epf_route_ctx_t* c, epf_team_t team, const epf_plan_t* plan) {
  const int E = c->num_experts, R = c->nranks, row = E + R;
  const int parity = (int)(c->epoch & 1u);
  const uint64_t counts_off = epf_plan_counts_offset(plan, parity, team.rank, 0);
  int p, x;
  if (c->block_index != 0) return;
#pragma unroll 1
  for (x = (int)threadIdx.x; x < row; x += (int)blockDim.x) {
    const uint64_t word = epf_count_word_pack(c->epoch, (uint32_t)c->tot[x]);
    for (p = 0; p < R; ++p) epf_st_relaxed_sys_u64((uint64_t*)epf_peer_ptr(team, counts_off, p) + x, word);
  }
}

/* ---- pass 2 ----------------------------------------------------------------------------------- */

/* epf_route_slots_block — pass 2: slot and destination rank of every (t, k) of this block's
 *   tokens, and (RANK_MAJOR) the rank-major slot of every (t, destination).
 *   Scope:    [collective:block] [uniform-args] after epf_route_merge_block returned EPF_OK.
 *   Does:     the same walk as pass 1 (when a warp's tokens are one batch, on the ids
 *             epf_route_count_block left in the ctx, not loaded again: call both with the same
 *             ctx); slot(t, k) = c->hist[warp][e] (blocks and warps before) + the number of equal
 *             experts in lower lanes of the same 32-entry step; the group's highest lane then
 *             advances c->hist[warp][e]. slot = dst = -1 for -1 and dropped ids. Rank-major: the
 *             batch's rm_slot rows are set to -1, then each token's first entry to rank d takes
 *             the next slot of column E + d the same way.
 *   Memory:   plain coalesced stores to slot / dst_rank / rm_slot rows. No peer access. */
EPF_DEVICE_INLINE void epf_route_slots_block(epf_route_ctx_t* c) {
  const int lane = epf_lane_id(), warp = epf_warp_id();
  const int E = c->num_experts, R = c->nranks, K = c->top_k, row = E + R;
  const uint32_t lt = (1u << lane) - 1u;
  const bool rm = c->rank_major && EPF__ROUTE_HAS(c, EPF_ROUTE_RM_SLOT);
  int32_t* const slot_out = EPF__ROUTE_ARR(c, EPF_ROUTE_SLOT, int32_t);
  int32_t* const dst_out = EPF__ROUTE_ARR(c, EPF_ROUTE_DST_RANK, int32_t);
  int32_t* const rm_slot = EPF__ROUTE_ARR(c, EPF_ROUTE_RM_SLOT, int32_t); /* used only when rm */
  int32_t* H = c->hist + warp * row;
  int tb;
  for (tb = c->t0; tb < c->t1; tb += c->batch_tokens) {
    const int nt = c->t1 - tb < c->batch_tokens ? c->t1 - tb : c->batch_tokens;
    const int64_t i0 = (int64_t)tb * K;
    int ev[EPF__ROUTE_STEPS], u;
    uint32_t first = 0u;
    if (c->ids_cached) {
#pragma unroll
      for (u = 0; u < EPF__ROUTE_STEPS; ++u) ev[u] = c->ids[u];
      first = c->first;
    } else {
      epf__route_batch_load(c, i0, nt * K, ev, NULL);
      if (rm) first = c->shfl_first ? epf__route_batch_first_shfl(c, ev, NULL, tb, nt * K) : epf__route_batch_first(c, ev);
    }
    if (rm) epf__route_fill_warp(rm_slot + (int64_t)tb * R, (int64_t)nt * R * 4, 0xff);
    {
      /* the steps' matches first (independent), then the running counts in step order */
      uint32_t pe[EPF__ROUTE_STEPS];
      if (c->tags != NULL)
        epf__route_match_tags(ev, c->tags + (size_t)warp * (size_t)E, (uint32_t*)c->stage + warp * EPF__ROUTE_BATCH, pe);
      else
        epf__route_match(ev, c->ebits, pe);
#pragma unroll
      for (u = 0; u < EPF__ROUTE_STEPS; ++u) {
        const int j = 32 * u + lane, e = ev[u];
        int32_t base = 0, slot = -1, dst = -1;
        if (e >= 0) {
          base = H[e];
          slot = base + __popc(pe[u] & lt);
          dst = epf__route_dest(c, e);
        }
        __syncwarp();
        if (e >= 0 && lane == 31 - __clz((int)pe[u])) H[e] = base + __popc(pe[u]);
        __syncwarp();
        if (j < nt * K) {
          slot_out[i0 + j] = slot;
          dst_out[i0 + j] = dst;
        }
      }
    }
    if (rm) {
      uint32_t pd[EPF__ROUTE_STEPS];
      int dd[EPF__ROUTE_STEPS];
#pragma unroll
      for (u = 0; u < EPF__ROUTE_STEPS; ++u) dd[u] = (first >> u) & 1u ? epf__route_dest(c, ev[u]) : -1;
      epf__route_match(dd, c->rbits, pd);
#pragma unroll
      for (u = 0; u < EPF__ROUTE_STEPS; ++u) {
        const int j = 32 * u + lane, d = dd[u];
        int32_t rbase = 0;
        if (d >= 0) {
          rbase = H[E + d];
          rm_slot[(int64_t)(tb + j / K) * R + d] = rbase + __popc(pd[u] & lt);
        }
        __syncwarp();
        if (d >= 0 && lane == 31 - __clz((int)pd[u])) H[E + d] = rbase + __popc(pd[u]);
        __syncwarp();
      }
    }
  }
}

/* epf_route_wait_counts_block — wait until every peer's count words of this epoch have arrived.
 *   Scope:    [collective:block] [uniform-args] [blocking]. Optional: epf_route_offsets_block
 *             waits for each word it reads by itself; a fused kernel that reads the COUNTS region
 *             directly calls this first.
 *   Does:     thread x (strided over the R x (E + R) words of this parity) loads each word and
 *             waits (bounded, w) until it carries this epoch.
 *   Result:   [result:all] EPF_OK, or the failure by priority (TIMEOUT > ABORTED > PEER_MASKED).
 *   Memory:   ld.relaxed.sys / ld.acquire.sys of the own window's COUNTS. */
EPF_DEVICE_INLINE epf_status_t epf_route_wait_counts_block(const epf_route_ctx_t* c, epf_team_t team,
                                                           const epf_plan_t* plan, epf_wait_t w) {
  const int row = c->num_experts + c->nranks;
  const uint64_t* C = (const uint64_t*)epf_local_ptr(team, epf_plan_counts_offset(plan, (int)(c->epoch & 1u), 0, 0));
  epf_status_t st = EPF_OK;
  int q;
#pragma unroll 1
  for (q = (int)threadIdx.x; q < row; q += (int)blockDim.x) {
    int tot, pre;
    epf__route_sum_words(C + q, row, c->nranks, 0, c->epoch, 0, -1, 0, w, &st, &tot, &pre, NULL);
  }
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
#pragma unroll 1
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

/* epf_route_offsets_block — offsets from the exchanged counts (C[s][x] = COUNTS[parity][s][x]).
 *   Scope:    [collective:block] [uniform-args] [blocking] after pass 2 (it reuses c->hist), in
 *             block c->offsets_block of the rank (one block computes every destination: block 0,
 *             or block 2 of a 3-block SPLIT update).
 *   Does:     thread e (strided over [0, E)) loads C[s][e] of every source s, waiting for words
 *             that do not carry this epoch yet (bounded by w); d = e / EL, j = e % EL:
 *               count_d[j] = sum_s C[s][e], padded_d[j] = roundup(count_d[j], alignment),
 *               begin_d[j] = sum_{j' < j} padded_d[j'] (one block scan over all e: warp scans and
 *               two barriers per blockDim experts, restarted at each destination by subtracting
 *               the scan's value at its first expert), send_offset[e] = begin_d[j] + sum_{s < rank} C[s][e].
 *             This rank's segment: recv_segment[j] = {begin, count, padded, 0}, recv_src_offset[j][s]
 *             = begin + sum_{s' < s} C[s'][e] (s = 0..R). RANK_MAJOR (the block's last warp, warp
 *             scans over the sources): send_rm_offset[d] = sum_{s < rank} C[s][E + d],
 *             recv_rm_offset[s] = sum_{s' < s} C[s'][E + rank] (s = 0..R). Then header recv_rows
 *             (plan layout), recv_rows_em, recv_overflow = max(0, recv_rows - recv_capacity);
 *             *c->recv_total_mapped = recv_rows (.sys store); then the pad rows' metadata
 *             (epf_route_mark_pad_rows_block) unless EPF_ROUTE_FLAG_NO_PAD_MARK.
 *   Result:   [result:all] EPF_OK, or a wait's failure (then the offsets are not valid).
 *   Memory:   ld.relaxed.sys of the own window's COUNTS; plain stores to the route buffer. */
EPF_DEVICE_INLINE epf_status_t epf_route_offsets_block(epf_route_ctx_t* c, epf_team_t team, const epf_plan_t* plan,
                                                       epf_wait_t w) {
  const int E = c->num_experts, R = c->nranks, EL = c->experts_per_rank, row = E + R;
  const int me = team.rank, A = c->alignment, lane = epf_lane_id(), warp = epf_warp_id(), W = c->num_warps;
  const uint64_t* C = (const uint64_t*)epf_local_ptr(team, epf_plan_counts_offset(plan, (int)(c->epoch & 1u), 0, 0));
  int32_t* const send_offset = EPF__ROUTE_ARR(c, EPF_ROUTE_SEND_OFFSET, int32_t);
  int32_t* const wsum = c->misc + EPF__ROUTE_MISC_SINK; /* [32]: per-warp sums (the count pass's sink) */
  int32_t* const seg0 = c->hist;                        /* [R]: the scan's value at each d's first expert */
  epf_status_t st = EPF_OK;
  int carry = 0, e0, d;
  __syncthreads(); /* pass 2's last reads of c->hist */
#pragma unroll 1
  for (e0 = 0; e0 < E; e0 += (int)blockDim.x) {
    const int e = e0 + (int)threadIdx.x;
    const bool valid = e < E;
    const int dd = valid ? epf__route_dest(c, e) : 0, j = valid ? e - dd * EL : 1;
    int tot = 0, pre = 0, padded, incl, x, u;
    int v[EPF__ROUTE_KEEP]; /* R <= EPF__ROUTE_KEEP: every source's count of e (the first R set) */
    if (valid) epf__route_sum_words(C + e, row, R, me, c->epoch, 0, me, c->tot[e], w, &st, &tot, &pre, v);
    padded = valid ? (tot + A - 1) & -A : 0; /* A: a power of two (epf_plan_compute checks it) */
    /* block-wide exclusive scan x of the padded counts: warp scans, one barrier, then every warp
     * scans the warps' sums itself (no second pass through one warp and back) */
    incl = padded + epf__route_warp_exclusive_sum(padded, &x, c->cub_temp);
    if (lane == 31) wsum[warp] = incl;
    __syncthreads();
    {
      int wt;
      const int wx = epf__route_warp_exclusive_sum(lane < W ? wsum[lane] : 0, &wt, c->cub_temp);
      x = carry + __shfl_sync(0xffffffffu, wx, warp) + incl - padded;
      carry += wt;
    }
    if (valid && j == 0) seg0[dd] = x;
    __syncthreads(); /* seg0 written; also every read of wsum is done before the next chunk's */
    if (valid) {
      const int begin = x - seg0[dd];
      send_offset[e] = begin + pre;
      if (dd == me) {
        int32_t* const src = EPF__ROUTE_ARR(c, EPF_ROUTE_RECV_SRC_OFFSET, int32_t) + (int64_t)j * (R + 1);
        epf_route_segment_t sg;
        int run = begin;
        sg.begin = begin;
        sg.count = tot;
        sg.padded_count = padded;
        sg.reserved = 0;
        EPF__ROUTE_ARR(c, EPF_ROUTE_RECV_SEGMENT, epf_route_segment_t)[j] = sg;
        if (R <= EPF__ROUTE_KEEP) {
#pragma unroll
          for (u = 0; u < EPF__ROUTE_KEEP; ++u) {
            if (u >= R) break;
            src[u] = run;
            run += v[u];
          }
        } else {
#pragma unroll 1
          for (u = 0; u < R; ++u) {
            src[u] = run;
            run += u == me ? c->tot[e] /* not loaded: the rank's own */
                           : (int)epf_count_word_count(epf_ld_relaxed_sys_u64(C + (int64_t)u * row + e)); /* validated above */
          }
        }
        src[R] = run;
        if (j == EL - 1) c->misc[EPF__ROUTE_MISC_ROWS_EM] = begin + padded;
      }
    }
  }
  if (c->rank_major && warp == W - 1) {
    /* the block's last warp (destination warps start at 0): send_rm_offset[d] for every d, then
     * recv_rm_offset by warp scans over the sources, 32 at a time */
    int32_t* const send_rm = EPF__ROUTE_ARR(c, EPF_ROUTE_SEND_RM_OFFSET, int32_t);
    int32_t* const recv_rm = EPF__ROUTE_ARR(c, EPF_ROUTE_RECV_RM_OFFSET, int32_t);
    int carry = 0, s0;
#pragma unroll 1
    for (d = lane; d < R; d += 32) {
      int tot, pre;
      epf__route_sum_words(C + E + d, row, me, me, c->epoch, 0, -1, 0, w, &st, &tot, &pre, NULL); /* s < me */
      send_rm[d] = tot;
    }
#pragma unroll 1
    for (s0 = 0; s0 < R; s0 += 32) {
      const int si = s0 + lane;
      int v = 0, agg, excl, z;
      if (si < R)
        epf__route_sum_words(C + (int64_t)si * row + E + me, 0, 1, 0, c->epoch, si, si == me ? 0 : -1, c->tot[E + me], w,
                             &st, &v, &z, NULL);
      excl = carry + epf__route_warp_exclusive_sum(v, &agg, c->cub_temp);
      carry += agg;
      if (si < R) recv_rm[si] = excl;
    }
    if (lane == 0) {
      recv_rm[R] = carry;
      c->misc[EPF__ROUTE_MISC_ROWS_RM] = carry;
    }
  }
  st = epf__route_block_status(st); /* also orders misc and the segments (read by the pad marks) */
  if (st != EPF_OK) return st;
  if (threadIdx.x == 0) {
    epf_route_header_t* const hdr = EPF__ROUTE_ARR(c, EPF_ROUTE_HEADER, epf_route_header_t);
    const int64_t rows_em = EL > 0 ? c->misc[EPF__ROUTE_MISC_ROWS_EM] : 0;
    const int64_t rows = c->rank_major ? (int64_t)c->misc[EPF__ROUTE_MISC_ROWS_RM] : rows_em;
    hdr->recv_rows = rows;
    hdr->recv_rows_em = rows_em;
    hdr->recv_overflow = rows > c->recv_capacity ? rows - c->recv_capacity : 0;
    if (c->recv_total_mapped != NULL) epf_st_relaxed_sys_u64((uint64_t*)c->recv_total_mapped, (uint64_t)rows);
  }
  if (c->mark_pads)
    epf_route_mark_pad_rows_block(team, plan, EPF__ROUTE_ARR(c, EPF_ROUTE_RECV_SEGMENT, epf_route_segment_t), EL);
  return EPF_OK;
}

/* epf_route_epoch_ack_wait_block — before epf_route_finish_block: in a 3-block SPLIT update,
 *   block 0 waits (bounded by w) until block 2 has acknowledged reading this update's epoch
 *   (block 2 writes the acknowledgement at the start of its epf_route_count_block), so block 0's
 *   epoch store cannot reach a block that has not read the epoch yet. Every other block, and
 *   every other kind of update, returns EPF_OK at once (the merge gives that order there).
 *   Scope:    [collective:block] [uniform-args] [blocking] in every block of the rank.
 *   Result:   [result:all] EPF_OK or the wait's failure.
 *   Memory:   ld.relaxed.sys / the bounded wait on one word of the route's SCRATCH. */
EPF_DEVICE_INLINE epf_status_t epf_route_epoch_ack_wait_block(const epf_route_ctx_t* c, epf_wait_t w) {
  epf_status_t st = EPF_OK;
  if (!(c->split && c->offsets_block == 2 && c->block_index == 0)) return EPF_OK;
  if (threadIdx.x == 0) st = epf_count_word_wait_sys(epf__route_epoch_ack(c), c->epoch, w, -1, NULL);
  return epf__route_block_status(st);
}

/* epf_route_finish_block — end of an update: the offsets block records a failure (recv_rows =
 *   -1, *recv_total_mapped = -status), any block's failure goes to the header status, and block
 *   0 stores the new epoch.
 *   Scope:    [collective:block] [uniform-args] last phase, in every block of the rank.
 *   Memory:   plain stores; the epoch store needs no ordering inside the update (every block of
 *             the rank read the epoch before its scratch row, and block 0 has read every row; the
 *             next update is a later kernel on the same stream). */
EPF_DEVICE_INLINE void epf_route_finish_block(const epf_route_ctx_t* c, epf_status_t st) {
  epf_route_header_t* const hdr = EPF__ROUTE_ARR(c, EPF_ROUTE_HEADER, epf_route_header_t);
  __syncthreads();
  if (threadIdx.x != 0) return;
  if (st != EPF_OK) {
    atomicCAS(&hdr->status, (uint32_t)EPF_OK, (uint32_t)st);
    if (c->exchange && c->block_index == c->offsets_block) {
      hdr->recv_rows = -1;
      if (c->recv_total_mapped != NULL) epf_st_relaxed_sys_u64((uint64_t*)c->recv_total_mapped, (uint64_t)-(int64_t)st);
    }
  }
  if (c->block_index == 0) {
    *c->epoch_word = c->epoch;
    hdr->epoch = c->epoch;
  }
}

/* epf_route_update_block — one rank's whole route update: count, merge, publish, slots, offsets
 *   (block 0, which waits for the peers' counts word by word), finish — the phases above, in
 *   that order. In a SPLIT update (2 or 3 blocks, T K <= EPF_ROUTE_SPLIT_ENTRIES) block 0
 *   counts, writes the is_token_in_rank rows and publishes, block 1 counts per warp and writes
 *   the slots, and the offsets are computed by block 2 (3 blocks: it counts the expert columns
 *   itself) or block 0 (2 blocks): no scratch row, no merge wait between them; block 0 stores
 *   the next epoch only after block 2's acknowledgement (epf_route_epoch_ack_wait_block).
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
 *             update runs. SEND_OFFSET and the receive arrays are written by block 0 only: a fused
 *             kernel whose other blocks read them needs a rank-level rendezvous after this call. */
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
    if (!c.split || block_index == 1) epf_route_slots_block(&c);
    if (c.exchange && block_index == c.offsets_block) st = epf_route_offsets_block(&c, team, plan, w);
  }
  {
    const epf_status_t a = epf_route_epoch_ack_wait_block(&c, w);
    if (st == EPF_OK) st = a;
  }
  c.status = st;
  epf_route_finish_block(&c, st);
  return st;
}

EPF_END_DECLS

#endif /* EPF_ROUTE_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
