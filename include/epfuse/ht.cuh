/* epfuse/ht.cuh — high-throughput blocks over the route: one token's dispatch, one token's combine — part of epfuse v0.1
 *
 * What it is: the per-token and per-row steps of high-throughput (HT) EP, reading the route
 * (route.cuh) of the step, as warp-level blocks a fused kernel calls in its own loops. They
 * compose the payload-level blocks of dispatch.cuh and combine.cuh; kernels_ht.cuh's ready-made
 * kernels are these loops and nothing more:
 *     dispatch  for each token t of this rank: epf_ht_dispatch_token_warp        (send half)
 *               epf_arrive_last_block_epoch -> epf_dispatch_signal_block; epf_dispatch_wait_block
 *     expand    RANK_MAJOR, for each receive row r: epf_expand_row_warp (dispatch.cuh)
 *     combine   expert side: epf_ht_combine_expert_warp (this rank's share of the receive rows),
 *               then epf_arrive_last_block_epoch -> epf_combine_signal_block; epf_combine_wait_block;
 *               source side: for each token t: epf_ht_combine_token_warp
 *   Every token and every receive row is one warp's work: a kernel may deal them to its warps in
 *   any order (the results do not depend on it).
 *
 * Vocabulary (HT and LL alike): a STAGE is dispatch or combine; each stage has two HALVES, send
 * (EPF_HT_SEND) and receive (EPF_HT_RECV); a ready-made call runs one of them or both
 * (EPF_HT_BOTH).
 *
 * What it does NOT do: update the route, launch, or wait (the halves' synchronization is the
 * caller's: the ready-made kernels show it).
 *
 * Contents:
 *   epf_ht_view_t                                     one rank's route arrays and routing inputs
 *   epf_ht_view_t epf_ht_view(route, team, plan, int index, topk_idx, topk_weights)          [device]
 *   int      epf_ht_expert_id(const void* topk, int index_type, int64_t i, int num_experts)  [EPF_HD]
 *   int      epf_ht_copy_em_lane(const epf_ht_view_t*, int t, int* out_expert, bool* out_stale)  [lane]
 *   int      epf_ht_copies_rm_warp(const epf_ht_view_t*, int t, int* out_rank, int64_t* out_row) [collective:warp]
 *   int64_t  epf_ht_recv_rows(const epf_ht_view_t*, const epf_plan_t*)   rows received this step
 *   uint32_t epf_ht_dispatch_token_warp(view, plan, x_row, x_scales_row, int quantize, int t,
 *                                       const epf_wait_t*)                [collective:warp]
 *   void     epf_ht_combine_expert_warp(view, plan, expert_out, expert_rows, int warp, int nwarps,
 *                                       const epf_wait_t*)                [collective:warp]
 *   void     epf_ht_combine_token_warp(view, plan, int t, void* out_row, const epf_wait_t*) [collective:warp]
 *
 * Requirements: CUDA, sm_80+ (sm_90 / sm_100 tested).
 */
#ifndef EPF_HT_CUH
#define EPF_HT_CUH

#include "config.h"

#if !EPF_IS_CUDA
#error "epfuse/ht.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

#include "combine.cuh"
#include "dispatch.cuh"
#include "host.h"
#include "signal.cuh"
#include "team.cuh"

EPF_BEGIN_DECLS

#define EPF_HT_SEND 0x1 /* the send half of a stage */
#define EPF_HT_RECV 0x2 /* the receive half: wait for every peer */
#define EPF_HT_BOTH 0x3 /* both halves in one call */

/* One rank's view of a step: its team, the route arrays of its route buffer and its routing
 * inputs. Build it with epf_ht_view; read-only. */
typedef struct epf_ht_view {
  epf_team_t team;
  int index;        /* route buffer / packed-input index: the virtual rank, or 0 for a real rank */
  int T, K, R, E, EL; /* tokens this step (route header), top_k, ranks, experts, experts per rank */
  int index_type;   /* EPF_INDEX_INT32 / EPF_INDEX_INT64 of topk */
  uint32_t epoch;   /* the route's epoch: the epoch of every signal of this step */
  const int32_t* dst_rank;        /* [T][K] */
  const int32_t* slot;            /* [T][K] */
  const int32_t* rm_slot;         /* [T][R] */
  const int32_t* send_offset;     /* [E] */
  const int32_t* send_rm_offset;  /* [R] */
  const epf_route_segment_t* seg; /* [EL] */
  const epf_route_segment_t* send_seg; /* [E]: each expert's segment at its destination */
  const int32_t* src_offset;      /* [EL][R + 1] */
  const int32_t* rm_offset;       /* [R + 1] */
  const void* topk;               /* this rank's topk_idx [T][K] */
  const float* topk_weights;      /* this rank's topk_weights [T][K], or NULL */
} epf_ht_view_t;

/* epf_ht_view — the view of route buffer `index` (0 for a real rank's single buffer; the virtual
 *   rank for virtual ranks) for `team` (already the rank's team: epf_team_for_block). topk_idx and
 *   topk_weights point at this rank's own [max_tokens][top_k] arrays (NULL allowed where a block
 *   does not read them). Scope: any thread; reads the route header and epoch word (after the
 *   route update of the step, on the same stream). */
EPF_DEVICE_INLINE epf_ht_view_t epf_ht_view(const epf_route_t* route, epf_team_t team, const epf_plan_t* plan, int index,
                                            const void* topk_idx, const float* topk_weights) {
  epf_ht_view_t v;
  v.team = team;
  v.index = index;
  v.T = ((const epf_route_header_t*)epf_route_ptr(route, index, EPF_ROUTE_HEADER))->num_tokens;
  v.K = route->layout.top_k;
  v.R = plan->nranks;
  v.E = plan->num_experts;
  v.EL = plan->experts_per_rank;
  v.index_type = route->layout.index_type;
  v.epoch = *epf_route_epoch_ptr(route, index);
  v.dst_rank = (const int32_t*)epf_route_ptr(route, index, EPF_ROUTE_DST_RANK);
  v.slot = (const int32_t*)epf_route_ptr(route, index, EPF_ROUTE_SLOT);
  v.rm_slot = (const int32_t*)epf_route_ptr(route, index, EPF_ROUTE_RM_SLOT);
  v.send_offset = (const int32_t*)epf_route_ptr(route, index, EPF_ROUTE_SEND_OFFSET);
  v.send_rm_offset = (const int32_t*)epf_route_ptr(route, index, EPF_ROUTE_SEND_RM_OFFSET);
  v.seg = (const epf_route_segment_t*)epf_route_ptr(route, index, EPF_ROUTE_RECV_SEGMENT);
  v.send_seg = (const epf_route_segment_t*)epf_route_ptr(route, index, EPF_ROUTE_SEND_SEGMENT);
  v.src_offset = (const int32_t*)epf_route_ptr(route, index, EPF_ROUTE_RECV_SRC_OFFSET);
  v.rm_offset = (const int32_t*)epf_route_ptr(route, index, EPF_ROUTE_RECV_RM_OFFSET);
  v.topk = topk_idx;
  v.topk_weights = topk_weights;
  return v;
}

/* epf_ht_expert_id — entry i of topk (either index type) when it is an expert id in [0,
 *   num_experts), else -1. The ids are read again after the route update: checked here, never
 *   trusted as an index. Scope: any thread. */
EPF_HD int epf_ht_expert_id(const void* topk, int index_type, int64_t i, int num_experts) {
  const int64_t v = index_type == EPF_INDEX_INT32 ? (int64_t)((const int32_t*)topk)[i] : ((const int64_t*)topk)[i];
  return v >= 0 && v < (int64_t)num_experts ? (int)v : -1;
}

/* epf_ht_copy_em_lane — lane k < K of token t: its expert (*out_expert; -1: not routed or out of
 *   range) and the destination rank of its own copy from the route (-1: no copy of its own — not
 *   routed, dropped, a repeat of an earlier k, or an id that no longer matches the route, which
 *   sets *out_stale). Lanes >= K: -1. Scope: any lane (no collective). */
EPF_DEVICE_INLINE int epf_ht_copy_em_lane(const epf_ht_view_t* v, int t, int* out_expert, bool* out_stale) {
  const int lane = epf_lane_id();
  int e = -1, d = -1;
  *out_stale = false;
  if (lane < v->K) {
    const int64_t i = (int64_t)t * v->K + lane;
    e = epf_ht_expert_id(v->topk, v->index_type, i, v->E);
    d = v->dst_rank[i];
    if (d >= 0 && (e < 0 || e / v->EL != d)) {
      *out_stale = true;
      d = -1;
    }
  }
  *out_expert = e;
  return d;
}

/* epf_ht_copies_rm_warp — the RANK_MAJOR copy list of token t: lane j holds the j-th distinct
 *   destination rank among the token's top-k, in order of first occurrence in k, and its receive
 *   row there (-1 on lanes past the list); returns the number of copies.
 *   Scope: [collective:warp], converged. */
EPF_DEVICE_INLINE int epf_ht_copies_rm_warp(const epf_ht_view_t* v, int t, int* out_rank, int64_t* out_row) {
  const int lane = epf_lane_id();
  const int d = lane < v->K ? v->dst_rank[(int64_t)t * v->K + lane] : -1;
  const uint32_t same = __match_any_sync(0xffffffffu, d);
  const uint32_t firsts = __ballot_sync(0xffffffffu, d >= 0 && (__ffs((int)same) - 1) == lane);
  const int n = __popc(firsts);
  const int src = lane < n ? (int)__fns(firsts, 0u, lane + 1) : 0;
  const int dj = __shfl_sync(0xffffffffu, d, src);
  *out_rank = lane < n ? dj : -1;
  *out_row = lane < n ? (int64_t)v->send_rm_offset[dj] + v->rm_slot[(int64_t)t * v->R + dj] : -1;
  return n;
}

/* epf_ht_recv_rows — RANK_MAJOR: how many receive rows hold a row this step (the route's total,
 *   capped at the receive capacity). Scope: any thread. */
EPF_DEVICE_INLINE int64_t epf_ht_recv_rows(const epf_ht_view_t* v, const epf_plan_t* plan) {
  const int64_t n = v->rm_offset[v->R];
  return n < plan->recv_capacity ? n : plan->recv_capacity;
}

/* epf_ht_report_stale_warp — EPF_ERR_ROUTE_STALE for token t once per warp (lane k's flag). */
EPF_DEVICE_INLINE void epf_ht_report_stale_warp(const epf_ht_view_t* v, const epf_wait_t* w, int t, bool stale) {
  epf_error_report_warp(w, stale, EPF_ERR_ROUTE_STALE, v->dst_rank + ((int64_t)t * v->K + epf_lane_id()), 0, 0);
}

/* epf_ht_dispatch_token_warp — the send half for token t: its copies (EXPERT_MAJOR: one per
 *   (token, expert), repeats get none; RANK_MAJOR: one per destination rank), their metadata
 *   and payload in the final receive rows of every destination.
 *   Scope:    [collective:warp] every lane, converged; uniform arguments.
 *   Input:    x_row: the token's row — BF16 [hidden] when quantize != 0 (quantized on the way to a
 *             quantized plan.payload), else a plan.payload row with its compact scales in
 *             x_scales_row (NULL for BF16); the view's topk_weights are read.
 *   Does:     ids that no longer match the route are reported (EPF_ERR_ROUTE_STALE) and sent
 *             nowhere; copies past the receive capacity are dropped. SEGMENT_MN_MAJOR scales go
 *             to each copy's segment (the route's SEND_SEGMENT of its expert).
 *   Result:   [result:all] the dropped copies (count them: recv_overflow).
 *   Memory:   plain stores to the peers; publish as the ready-made kernel does. */
EPF_DEVICE_INLINE uint32_t epf_ht_dispatch_token_warp(const epf_ht_view_t* v, const epf_plan_t* plan, const void* x_row,
                                                      const uint8_t* x_scales_row, int quantize, int t,
                                                      const epf_wait_t* w) {
  const int lane = epf_lane_id();
  const int64_t i = (int64_t)t * v->K + lane;
  int e, dst, n, seg_begin = 0, seg_rows = 0;
  int64_t row;
  bool stale;
  const int d_lane = epf_ht_copy_em_lane(v, t, &e, &stale);
  epf_ht_report_stale_warp(v, w, t, stale);
  if (plan->layout == EPF_LAYOUT_EXPERT_MAJOR) { /* lane k: the copy of (t, k) */
    dst = d_lane;
    row = dst >= 0 ? (int64_t)v->send_offset[e] + v->slot[i] : -1;
    n = v->K;
    if (dst >= 0 && plan->scale_layout == EPF_SCALE_LAYOUT_SEGMENT_MN_MAJOR) { /* the copy's segment */
      seg_begin = v->send_seg[e].begin;
      seg_rows = v->send_seg[e].padded_count;
    }
    if (dst >= 0) epf_dispatch_meta_em(v->team, plan, dst, row, t, lane, e - dst * v->EL, v->topk_weights[i]);
  } else { /* lane j: the copy to the j-th distinct rank; entry k lists k's rank, expert, weight, slot */
    const int first = epf_topk_first_lane_warp(e);
    const int d_first = __shfl_sync(0xffffffffu, d_lane, first);
    const int s_first = __shfl_sync(0xffffffffu, lane < v->K ? v->slot[i] : -1, first);
    const int dk = e >= 0 ? d_first : -1;
    n = epf_ht_copies_rm_warp(v, t, &dst, &row);
    epf_dispatch_meta_rm_warp(v->team, plan, t, dst, row, n, dk, dk >= 0 ? e - dk * v->EL : -1,
                              dk >= 0 ? v->topk_weights[i] : 0.f, s_first);
  }
  return epf_dispatch_send_token_warp(v->team, plan, x_row, x_scales_row, quantize, dst, row, n, seg_begin, seg_rows);
}

/* epf_ht_combine_expert_warp — the expert side of the combine, this warp's share: `warp` of the
 *   rank's `nwarps` warps takes every nwarps-th receive row. EXPERT_MAJOR: each row's output to
 *   where its source reads it (epf_combine_expert_row_em_warp); RANK_MAJOR: each row's k-order
 *   partial (epf_combine_prereduce_rm_row_warp).
 *   Input:    expert_out: this rank's expert outputs, BF16 [expert_rows][hidden] — EXPERT_MAJOR in
 *             receive-row order (NULL: written in place over the received BF16 rows), RANK_MAJOR in
 *             the expert-major view's order.
 *   Scope:    [collective:warp] every lane, converged; uniform arguments. Call from every warp of
 *             the rank, then arrive and signal (epf_arrive_last_block_epoch, epf_combine_signal_block). */
EPF_DEVICE_INLINE void epf_ht_combine_expert_warp(const epf_ht_view_t* v, const epf_plan_t* plan, const void* expert_out,
                                                  int64_t expert_rows, int warp, int nwarps, const epf_wait_t* w) {
  if (plan->layout == EPF_LAYOUT_EXPERT_MAJOR) {
    int64_t o = warp, i = warp;
    int le;
    if (expert_out == NULL && !(plan->flags & EPF_FLAG_COMBINE_PUSH)) return; /* pull in place: nothing moves */
    /* the received rows of all local experts form one sequence dealt round-robin over the rank's
     * warps: o is this warp's next position relative to the current expert's first row (restarting
     * at warp 0 for every expert would leave most warps idle) */
    for (le = 0; le < v->EL; ++le) {
      const int64_t begin = v->seg[le].begin;
      const int64_t end = begin + v->seg[le].count < plan->recv_capacity ? begin + v->seg[le].count : plan->recv_capacity;
      const int64_t n = end > begin ? end - begin : 0;
      for (i = o; i < n; i += nwarps) {
        const int64_t r = begin + i;
        const void* y = expert_out != NULL ? (const void*)((const char*)expert_out + (uint64_t)r * (uint64_t)plan->hidden * 2u)
                                           : epf_local_ptr(v->team, epf_plan_recv_token_offset(plan, r));
        epf_combine_expert_row_em_warp(v->team, plan, r, y, w);
      }
      o = i - n; /* i >= n: the position after this expert's rows, relative to the next one's */
    }
  } else {
    const int64_t rows = epf_ht_recv_rows(v, plan);
    int64_t r;
    for (r = warp; r < rows; r += nwarps) epf_combine_prereduce_rm_row_warp(v->team, plan, r, v->src_offset, expert_out, expert_rows, w);
  }
}

/* epf_ht_combine_token_warp — the source side for token t, after epf_combine_wait_block:
 *   out_row (BF16 [hidden]) = the fma chain in FP32 from 0 over the token's expert outputs in k
 *   order (EXPERT_MAJOR: w_k * y_k, a repeat reusing its first occurrence's output with its own
 *   weight) or over the rank-major partials in ascending rank order (RANK_MAJOR, weight 1), read
 *   from the expert ranks' windows (pull) or this rank's COMBINE rows (push). Copies dropped at
 *   dispatch, and outputs of ranks masked out under fault tolerance (pull), contribute nothing; a
 *   token with none gets zeros.
 *   Scope: [collective:warp] every lane, converged; uniform arguments. */
EPF_DEVICE_INLINE void epf_ht_combine_token_warp(const epf_ht_view_t* v, const epf_plan_t* plan, int t, void* out_row,
                                                 const epf_wait_t* w) {
  const int lane = epf_lane_id();
  const bool push = (plan->flags & EPF_FLAG_COMBINE_PUSH) != 0u;
  const char* my_row = NULL;
  float my_w = 0.f;
  if (plan->layout == EPF_LAYOUT_EXPERT_MAJOR) {
    int e;
    bool stale;
    const int d = epf_ht_copy_em_lane(v, t, &e, &stale);
    const int first = epf_topk_first_lane_warp(e);
    const char* first_row;
    if (d >= 0) {
      const int64_t row = (int64_t)v->send_offset[e] + v->slot[(int64_t)t * v->K + lane];
      if (row < plan->recv_capacity) { /* else dropped at dispatch */
        if (push)
          my_row = (const char*)epf_local_ptr(v->team, epf_plan_combine_offset(plan, (int64_t)t * v->K + lane));
        else if (w->mask == NULL || epf_mask_is_active(w->mask, d))
          my_row = (const char*)epf_peer_ptr(v->team, epf_plan_expert_out_offset(plan, row), d);
      }
    }
    first_row = (const char*)__shfl_sync(0xffffffffu, (unsigned long long)(uintptr_t)my_row, first);
    if (e >= 0 && first != lane) my_row = first_row;
    if (my_row != NULL) my_w = v->topk_weights[(int64_t)t * v->K + lane];
    epf_ht_report_stale_warp(v, w, t, stale);
  } else {
    int d = -1;
    int64_t row = -1;
    (void)epf_ht_copies_rm_warp(v, t, &d, &row);
    my_w = 1.0f;
    if (d >= 0 && row < plan->recv_capacity) {
      if (push)
        my_row = (const char*)epf_local_ptr(v->team, epf_plan_combine_offset(plan, (int64_t)t * v->R + d));
      else if (w->mask == NULL || epf_mask_is_active(w->mask, d))
        my_row = (const char*)epf_peer_ptr(v->team, epf_plan_expert_out_offset(plan, row), d);
    }
  }
  epf_combine_reduce_rows_warp(my_row, my_w, __ballot_sync(0xffffffffu, my_row != NULL), plan->hidden,
                               plan->combine_payload == EPF_PAYLOAD_MXFP8, out_row);
}

EPF_END_DECLS

#endif /* EPF_HT_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
