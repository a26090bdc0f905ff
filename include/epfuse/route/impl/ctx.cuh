/* epfuse/route/impl/ctx.cuh — the route update context: shared memory, epf_route_ctx_make — part of epfuse v0.1
 *
 * What it is: the shared-memory carve-up of one rank-block's view of a route update
 * (epf__route_smem_carve: the one owner, sizes and pointers), epf_route_ctx_make,
 * epf_route_block_tokens, and the rule of the SPLIT arrangement (epf_route_split_ok); the
 * context type and the passes' constants are in types.cuh. Include
 * epfuse/route/route.cuh, not this file (it stands alone too, for the compile tests).
 *
 * Contents: see route/route.cuh.
 *
 * Requirements: see route/route.cuh.
 */
#ifndef EPF_ROUTE_IMPL_CTX_CUH
#define EPF_ROUTE_IMPL_CTX_CUH

#include "../../config.h"

#if !EPF_IS_CUDA
#error "epfuse/route/impl/ctx.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

#include <cub/warp/warp_reduce.cuh>
#include <cub/warp/warp_scan.cuh>

#include "../../host.h"
#include "../../core/ptx.cuh"
#include "../../core/signal.cuh"
#include "../../core/team.cuh"
#include "types.cuh"

EPF_BEGIN_DECLS

/* EPF__ROUTE_ARR(c, id, type) — device address of array `id` of the ctx's route buffer, as a
 * `type*` (array ids: host.h epf_route_array_id_t). Arrays a layout leaves out have 0 bytes and
 * are only formed where their flag says they exist (RM_SLOT: tested with EPF__ROUTE_HAS). */
#define EPF__ROUTE_ARR(c, id, type) ((type*)((c)->buf + (c)->layout->array[(id)].offset))
#define EPF__ROUTE_HAS(c, id) ((c)->layout->array[(id)].bytes != 0u)

EPF_HD size_t epf__route_align4(size_t n) { return (n + 3u) & ~(size_t)3u; }

/* epf__route_smem_t — THE carve-up of the route blocks' shared memory for a block of W warps:
 * byte offsets of each region from the start of the caller's buffer (each a multiple of 16),
 * and the total. E = num_experts, R = nranks.
 *   hist   int32 [W][E + R] per-warp counts, then running slots (the offsets reuse its first R)
 *   tot    int32 [E + R + 1] the rank's totals (+ dropped)
 *   misc   int32 [EPF__ROUTE_MISC_INTS]
 *   stage  int32 [W][EPF__ROUTE_BATCH] a batch's destination ranks / match words
 *   cub    [32][EPF__ROUTE_CUB_BYTES_PER_WARP] CUB warp temp storage
 *   tags   int32 [W][E] the slot pass's expert tags (epf__route_match_tags), only when the whole
 *          carve-up stays within EPF__ROUTE_SMEM_LIMIT; otherwise has_tags = 0 and the slot pass
 *          matches by ballots
 * Computed by epf__route_smem_carve only: epf_route_smem_bytes (the launchers' size) and
 * epf_route_ctx_make (the pointers) both read it. */
typedef struct epf__route_smem {
  size_t hist, tot, misc, stage, cub, tags; /* byte offsets */
  size_t bytes;                             /* total: epf_route_smem_bytes */
  int has_tags;
} epf__route_smem_t;

/* epf__route_smem_carve — the carve-up above for W warps. Scope: any thread, host or device. Pure. */
EPF_HD epf__route_smem_t epf__route_smem_carve(const epf_route_layout_t* layout, size_t W) {
  const size_t row = (size_t)layout->num_experts + (size_t)layout->nranks;
  const size_t tag_bytes = 4u * W * (size_t)layout->num_experts;
  epf__route_smem_t s;
  s.hist = 0u;
  s.tot = s.hist + 4u * epf__route_align4(W * row);
  s.misc = s.tot + 4u * epf__route_align4(row + 1u);
  s.stage = s.misc + 4u * EPF__ROUTE_MISC_INTS;
  s.cub = s.stage + 4u * W * EPF__ROUTE_BATCH;
  s.tags = s.cub + 32u * EPF__ROUTE_CUB_BYTES_PER_WARP;
  s.has_tags = s.tags + tag_bytes <= EPF__ROUTE_SMEM_LIMIT;
  s.bytes = s.tags + (s.has_tags ? tag_bytes : 0u);
  return s;
}

EPF_HD size_t epf_route_smem_bytes(const epf_route_layout_t* layout, int block_threads) {
  return epf__route_smem_carve(layout, (size_t)(block_threads / 32)).bytes;
}

EPF_HD int epf_route_rows_em(const epf_route_segment_t* seg, int num_local) {
  return num_local > 0 ? seg[num_local - 1].begin + seg[num_local - 1].padded_count : 0;
}

/* x / d for x >= 0, d >= 1 on the device: a shift when d is a power of two (the common K, W and
 * block counts), else the 32-bit division */
EPF_DEVICE_INLINE int epf__route_div(int x, int d) {
  return (d & (d - 1)) == 0 ? x >> (__ffs(d) - 1) : x / d;
}

EPF_HD void epf_route_block_tokens(int num_tokens, int block_index, int num_blocks, int* out_t0, int* out_t1) {
  const int W = num_blocks > 1 ? num_blocks - 1 : 1, b = num_blocks > 1 ? block_index - 1 : block_index;
  if (b < 0) {
    *out_t0 = *out_t1 = 0;
    return;
  }
#if defined(__CUDA_ARCH__)
  *out_t0 = epf__route_div(num_tokens * b, W); /* W a power of two: shifts */
  *out_t1 = epf__route_div(num_tokens * (b + 1), W);
#else
  *out_t0 = (int)((int64_t)num_tokens * b / W);
  *out_t1 = (int)((int64_t)num_tokens * (b + 1) / W);
#endif
}

EPF_HD int epf_route_split_ok(int num_blocks, int num_tokens, int top_k) {
  return (num_blocks == 2 || num_blocks == 3) && (int64_t)num_tokens * top_k <= EPF__ROUTE_SPLIT_ENTRIES;
}

/* epf__route_ctx_init — epf_route_ctx_make with the arrangement chosen: split = 0 is the public
 *   one (epf_route_ctx_make); split = 1 (only where epf_route_split_ok says so; the SPLIT
 *   arrangement, epf_route_update_split_block) makes every block walk all of
 *   [0, T): block 0 counts them, writes the is_token_in_rank rows and publishes; block 1 writes
 *   every slot; block 2 (3 blocks) counts the expert columns and computes the offsets (with 2,
 *   block 0 does); no scratch row, no merge wait; block 0 stores the next epoch only after block
 *   2's acknowledgement (epf__route_epoch_ack_wait_block). */
EPF_DEVICE_INLINE epf_route_ctx_t epf__route_ctx_init(const epf_route_t* route, int index, int rank,
                                                      const void* topk_idx, int num_tokens, int block_index,
                                                      int num_blocks, int split, int64_t* recv_total_mapped,
                                                      void* smem) {
  epf_route_ctx_t c;
  const epf_route_layout_t* L = &route->layout;
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
  c.split = split;
  c.offsets_block = split && num_blocks == 3 ? 2 : 0;
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
  {
    const epf__route_smem_t s = epf__route_smem_carve(L, (size_t)c.num_warps);
    c.hist = (int32_t*)((char*)smem + s.hist);
    c.tot = (int32_t*)((char*)smem + s.tot);
    c.misc = (int32_t*)((char*)smem + s.misc);
    c.stage = (int32_t*)((char*)smem + s.stage);
    c.cub_temp = (void*)((char*)smem + s.cub);
    c.tags = s.has_tags ? (int32_t*)((char*)smem + s.tags) : NULL;
  }
  c.ids_cached = 0;
  c.first = 0u;
  return c;
}

EPF_DEVICE_INLINE epf_route_ctx_t epf_route_ctx_make(const epf_route_t* route, int index, int rank,
                                                     const void* topk_idx, int num_tokens, int block_index,
                                                     int num_blocks, int64_t* recv_total_mapped, void* smem) {
  return epf__route_ctx_init(route, index, rank, topk_idx, num_tokens, block_index, num_blocks, 0,
                             recv_total_mapped, smem);
}

EPF_END_DECLS

#endif /* EPF_ROUTE_IMPL_CTX_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
