/* epfuse/route/impl/count.cuh — route pass 1: counts, the rank's blocks meet, the count exchange — part of epfuse v0.1
 *
 * What it is: epf_route_count_block (histograms), epf_route_merge_block (the rank's blocks meet)
 * and epf_route_publish_block (counts into every peer's window). Include epfuse/route/route.cuh, not this file (it stands alone too, for the
 * compile tests).
 *
 * Contents: see route/route.cuh.
 *
 * Requirements: see route/route.cuh.
 */
#ifndef EPF_ROUTE_IMPL_COUNT_CUH
#define EPF_ROUTE_IMPL_COUNT_CUH

#include "../../config.h"

#if !EPF_IS_CUDA
#error "epfuse/route/impl/count.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

#include "batch.cuh"

EPF_BEGIN_DECLS

/* ---- pass 1 ----------------------------------------------------------------------------------- */

EPF_DEVICE_INLINE void epf_route_count_block(epf_route_ctx_t* c) {
  typedef cub::WarpReduce<int> epf__warp_reduce_t;
  typedef epf__warp_reduce_t::TempStorage epf__warp_reduce_temp_t;
  EPF_STATIC_ASSERT(sizeof(epf__warp_reduce_temp_t) <= EPF__ROUTE_CUB_BYTES_PER_WARP, "cub temp storage");
  const int lane = epf_lane_id(), warp = epf_warp_id(), W = c->num_warps;
  const int E = c->num_experts, R = c->nranks, K = c->top_k, row = E + R;
  /* the SPLIT arrangement (epf__route_ctx_init): the control block's warps add into the
   * block's totals c->tot directly (no per-warp rows to zero and prefix: nothing reads them) and
   * it writes the is_token_in_rank rows; so do the offsets block's (block 2 of 3: expert columns;
   * rank columns for RANK_MAJOR's own receive count). The token block's totals are not the
   * rank's, so it needs no first-entry test (unless RANK_MAJOR: its rank columns give the
   * rank-major slots) and no dropped count. With a ctx from epf_route_ctx_make all three are
   * the plain path: rows, totals and rank columns. */
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
  /* strided loops stay rolled (#pragma unroll 1) here and below: unrolled, each would need its
   * trip count, a 32-bit division, before the first iteration */
  if (rows) {
#pragma unroll 1
    for (x = lane; x < row; x += 32) H[x] = 0;
  } else {
#pragma unroll 1
    for (x = (int)threadIdx.x; x < row; x += (int)blockDim.x) H[x] = 0;
  }
  c->ids_cached = c->t1 - c->t0 <= c->batch_tokens;
  __syncthreads();

  for (tb = c->t0; tb < c->t1; tb += c->batch_tokens) {
    const int nt = c->t1 - tb < c->batch_tokens ? c->t1 - tb : c->batch_tokens;
    uint32_t first;
    if (tb != c->t0) epf__route_batch_load(c, (int64_t)tb * K, nt * K, ev, &dropped);
    if (!rank_cols) {
      first = 0u;
    } else if (c->shfl_first) {
      first = epf__route_batch_first_shfl(c, ev, tir, tb, nt * K); /* rows written too */
    } else {
      first = epf__route_batch_first(c, ev);
      if (tir != NULL) {
        epf__route_fill_warp(tir + (int64_t)tb * R, (int64_t)nt * R, 0); /* ends with __syncwarp */
#pragma unroll
        for (u = 0; u < EPF__ROUTE_STEPS; ++u)
          if ((first >> u) & 1u) tir[(int64_t)(tb + (32 * u + lane) / K) * R + epf__route_dest(c, ev[u])] = 1;
      }
    }
    /* counts: shared-memory atomics on the warp's own row (the totals do not depend on the order
     * of the adds; the slots pass, which needs an order, uses epf__route_match) */
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) { /* branch-free: a lane with nothing to add adds to its sink */
      const int e = ev[u], d = epf__route_dest(c, e); /* d: meaningless for e < 0, then unused */
      atomicAdd(e >= 0 ? &H[e] : sink, 1);
      atomicAdd((first >> u) & 1u ? &H[E + d] : sink, 1);
    }
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
  /* B == 1 (or the SPLIT arrangement, where block 0 counted every token: its totals are
   * the rank's): the __syncthreads above made epf_route_count_block's c->tot visible */
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

EPF_END_DECLS

#endif /* EPF_ROUTE_IMPL_COUNT_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
