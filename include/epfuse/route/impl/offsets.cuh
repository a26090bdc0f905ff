/* epfuse/route/impl/offsets.cuh — route pass 2: slots, the peers' counts, offsets, the whole update — part of epfuse v0.1
 *
 * What it is: epf_route_slots_block, epf_route_wait_counts_block, epf_route_offsets_block and
 * what finishes an update, composed by epf_route_update_block. Include epfuse/route/route.cuh, not this file (it stands alone too, for the
 * compile tests).
 *
 * Contents: see route/route.cuh.
 *
 * Requirements: see route/route.cuh.
 */
#ifndef EPF_ROUTE_IMPL_OFFSETS_CUH
#define EPF_ROUTE_IMPL_OFFSETS_CUH

#include "../../config.h"

#if !EPF_IS_CUDA
#error "epfuse/route/impl/offsets.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

#include "count.cuh"

EPF_BEGIN_DECLS

/* ---- pass 2 ----------------------------------------------------------------------------------- */

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
        union {
          epf_recv_meta_em_t m;
          uint4 v;
        } pad; /* registers only: one 16-byte store */
        pad.m = epf_recv_meta_em_make(-1, -1, -1, j, 0.0f);
        epf_st_v4_u32(epf_local_ptr(team, epf_plan_recv_meta_offset(plan, r)), pad.v);
      }
    }
  }
}

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
      /* expert e's whole segment at its destination dd (an epf_route_segment_t, one 16-byte store) */
      ((int4*)EPF__ROUTE_ARR(c, EPF_ROUTE_SEND_SEGMENT, epf_route_segment_t))[e] = make_int4(begin, tot, padded, 0);
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

/* epf__route_epoch_ack_wait_block — the SPLIT arrangement with 3 blocks: before
 * epf_route_finish_block, block 0 waits (bounded by w) until block 2 has acknowledged reading this
 * update's epoch (block 2 writes the acknowledgement at the start of its epf_route_count_block),
 * so block 0's epoch store cannot reach a block that has not read the epoch yet. Every other
 * block, and every other arrangement, returns EPF_OK at once (the merge gives that order there).
 * [collective:block] [uniform-args] [blocking] in every block of the rank; [result:all]. Memory:
 * the bounded wait on one word of the route's SCRATCH. */
EPF_DEVICE_INLINE epf_status_t epf__route_epoch_ack_wait_block(const epf_route_ctx_t* c, epf_wait_t w) {
  epf_status_t st = EPF_OK;
  if (!(c->split && c->offsets_block == 2 && c->block_index == 0)) return EPF_OK;
  if (threadIdx.x == 0) st = epf_count_word_wait_sys(epf__route_epoch_ack(c), c->epoch, w, -1, NULL);
  return epf__route_block_status(st);
}

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

/* epf__route_update_block — the body of epf_route_update_block (split = 0) and
 * epf_route_update_split_block (split = epf_route_split_ok(...)). */
EPF_DEVICE_INLINE epf_status_t epf__route_update_block(const epf_route_t* route, int index, epf_team_t team,
                                                       const epf_plan_t* plan, const void* topk_idx, int num_tokens,
                                                       int block_index, int num_blocks, int split, epf_wait_t w,
                                                       int64_t* recv_total_mapped, void* smem) {
  epf_route_ctx_t c = epf__route_ctx_init(route, index, team.rank, topk_idx, num_tokens, block_index, num_blocks,
                                          split, recv_total_mapped, smem);
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
    const epf_status_t a = epf__route_epoch_ack_wait_block(&c, w);
    if (st == EPF_OK) st = a;
  }
  c.status = st;
  epf_route_finish_block(&c, st);
  return st;
}

EPF_DEVICE_INLINE epf_status_t epf_route_update_block(const epf_route_t* route, int index, epf_team_t team,
                                                      const epf_plan_t* plan, const void* topk_idx, int num_tokens,
                                                      int block_index, int num_blocks, epf_wait_t w,
                                                      int64_t* recv_total_mapped, void* smem) {
  return epf__route_update_block(route, index, team, plan, topk_idx, num_tokens, block_index, num_blocks, 0, w,
                                 recv_total_mapped, smem);
}

EPF_DEVICE_INLINE epf_status_t epf_route_update_split_block(const epf_route_t* route, int index, epf_team_t team,
                                                            const epf_plan_t* plan, const void* topk_idx,
                                                            int num_tokens, int block_index, int num_blocks,
                                                            epf_wait_t w, int64_t* recv_total_mapped, void* smem) {
  return epf__route_update_block(route, index, team, plan, topk_idx, num_tokens, block_index, num_blocks,
                                 epf_route_split_ok(num_blocks, num_tokens, route->layout.top_k), w,
                                 recv_total_mapped, smem);
}

EPF_END_DECLS

#endif /* EPF_ROUTE_IMPL_OFFSETS_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
