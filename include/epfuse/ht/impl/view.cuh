/* epfuse/ht/impl/view.cuh — high-throughput blocks over the route: one token's dispatch, one token's combine — part of epfuse v0.1
 *
 * What it is: the per-token and per-row steps of high-throughput (HT) EP, reading the route
 * (route/route.cuh) of the step, as warp-level blocks a fused kernel calls in its own loops. They
 * compose the payload-level blocks of ht/impl/dispatch.cuh and ht/impl/combine.cuh; ht/kernels.cuh's ready-made
 * kernels are these loops and nothing more:
 *     dispatch  for each token t of this rank: epf_ht_dispatch_token_warp        (send half)
 *               epf_arrive_last_block_epoch -> epf_dispatch_signal_block; epf_dispatch_wait_block
 *     expand    RANK_MAJOR, for each receive row r: epf_expand_row_warp (ht/impl/dispatch.cuh)
 *     combine   expert side: epf_ht_combine_expert_warp (this rank's share of the receive rows),
 *               then epf_arrive_last_block_epoch -> epf_combine_signal_block; epf_combine_wait_block;
 *               source side: for each token t: epf_ht_combine_token_warp
 *   and for training, over the same route (ht/kernels.cuh: epf_ht_combine_backward_kernel,
 *   epf_ht_dispatch_backward_kernel):
 *     backward of combine   a team barrier, then for each token t: epf_ht_combine_backward_token_warp
 *                           (dy to the forward's receive rows), arrive, signal, wait — a dispatch
 *     backward of dispatch  epf_ht_dispatch_backward_expert_warp, arrive, signal, wait, then for each
 *                           token t: epf_ht_dispatch_backward_token_warp — a unit-weight combine
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
 * Training (the backward direction over the forward's route; docs/high-throughput.md "Training"):
 *   uint32_t epf_ht_combine_backward_token_warp(view, plan, dy_row, int t, const epf_wait_t*)
 *                                     backward of combine: dy to the forward's receive rows  [collective:warp]
 *   void     epf_ht_dispatch_backward_expert_warp(view, plan, dx_rows, expert_rows, weight_grad, int warp,
 *                                                 int nwarps, const epf_wait_t*)
 *                                     backward of dispatch, expert side                       [collective:warp]
 *   void     epf_ht_dispatch_backward_token_warp(view, plan, int t, void* out_row, float* wgrad_row,
 *                                                const epf_wait_t*)
 *                                     backward of dispatch, source side (unit weights)        [collective:warp]
 *
 * Requirements: CUDA, sm_80+ (sm_90 / sm_100 tested).
 */
#ifndef EPF_HT_IMPL_VIEW_CUH
#define EPF_HT_IMPL_VIEW_CUH

#include "../../config.h"

#if !EPF_IS_CUDA
#error "epfuse/ht/impl/view.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

#include "combine.cuh"
#include "dispatch.cuh"
#include "../../host.h"
#include "../../core/signal.cuh"
#include "../../core/team.cuh"
#include "types.cuh"

EPF_BEGIN_DECLS

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

EPF_HD int epf_ht_expert_id(const void* topk, int index_type, int64_t i, int num_experts) {
  const int64_t v = index_type == EPF_INDEX_INT32 ? (int64_t)((const int32_t*)topk)[i] : ((const int64_t*)topk)[i];
  return v >= 0 && v < (int64_t)num_experts ? (int)v : -1;
}

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

EPF_DEVICE_INLINE int64_t epf_ht_recv_rows(const epf_ht_view_t* v, const epf_plan_t* plan) {
  const int64_t n = v->rm_offset[v->R];
  return n < plan->recv_capacity ? n : plan->recv_capacity;
}

EPF_DEVICE_INLINE void epf_ht_report_stale_warp(const epf_ht_view_t* v, const epf_wait_t* w, int t, bool stale) {
  epf_error_report_warp(w, stale, EPF_ERR_ROUTE_STALE, v->dst_rank + ((int64_t)t * v->K + epf_lane_id()), 0, 0);
}

/* epf__ht_dispatch_token_warp — epf_ht_dispatch_token_warp (combine_weight == 0) and
 * epf_ht_combine_backward_token_warp (combine_weight != 0: EXPERT_MAJOR metadata weight = the row's
 * combine weight). [collective:warp] */
EPF_DEVICE_INLINE uint32_t epf__ht_dispatch_token_warp(const epf_ht_view_t* v, const epf_plan_t* plan, const void* x_row,
                                                       const uint8_t* x_scales_row, int quantize, int t,
                                                       const epf_wait_t* w, int combine_weight) {
  const int lane = epf_lane_id();
  const int64_t i = (int64_t)t * v->K + lane;
  int e, dst, n;
  int64_t row;
  bool stale;
  const int d_lane = epf_ht_copy_em_lane(v, t, &e, &stale);
  epf_ht_report_stale_warp(v, w, t, stale);
  if (plan->layout == EPF_LAYOUT_EXPERT_MAJOR) { /* lane k: the copy of (t, k) */
    dst = d_lane;
    row = dst >= 0 ? (int64_t)v->send_offset[e] + v->slot[i] : -1;
    n = v->K;
    if (combine_weight) { /* the backward of combine: the row's weight is the sum of every k that reads it */
      const int first = epf_topk_first_lane_warp(e);
      const float wk = e >= 0 ? v->topk_weights[i] : 0.f;
      float cw = 0.f;
      int j;
      for (j = 0; j < v->K; ++j) { /* warp-uniform; ascending k, FP32 adds from 0 */
        const float wj = __shfl_sync(0xffffffffu, wk, j);
        const int fj = __shfl_sync(0xffffffffu, e >= 0 ? first : -1, j);
        if (fj == lane) cw += wj;
      }
      if (dst >= 0) epf_dispatch_meta_em(v->team, plan, dst, row, t, lane, e - dst * v->EL, cw);
    } else if (dst >= 0) {
      epf_dispatch_meta_em(v->team, plan, dst, row, t, lane, e - dst * v->EL, v->topk_weights[i]);
    }
  } else { /* lane j: the copy to the j-th distinct rank; entry k lists k's rank, expert, weight, slot */
    const int first = epf_topk_first_lane_warp(e);
    const int d_first = __shfl_sync(0xffffffffu, d_lane, first);
    const int s_first = __shfl_sync(0xffffffffu, lane < v->K ? v->slot[i] : -1, first);
    const int dk = e >= 0 ? d_first : -1;
    n = epf_ht_copies_rm_warp(v, t, &dst, &row);
    epf_dispatch_meta_rm_warp(v->team, plan, t, dst, row, n, dk, dk >= 0 ? e - dk * v->EL : -1,
                              dk >= 0 ? v->topk_weights[i] : 0.f, s_first);
  }
  /* GEMM-ready scales travel as compact stage runs: the sends need no segments */
  return epf_dispatch_send_token_warp(v->team, plan, x_row, x_scales_row, quantize, dst, row, n, 0, 0);
}

EPF_DEVICE_INLINE uint32_t epf_ht_dispatch_token_warp(const epf_ht_view_t* v, const epf_plan_t* plan, const void* x_row,
                                                      const uint8_t* x_scales_row, int quantize, int t,
                                                      const epf_wait_t* w) {
  return epf__ht_dispatch_token_warp(v, plan, x_row, x_scales_row, quantize, t, w, 0);
}

EPF_DEVICE_INLINE uint32_t epf_ht_combine_backward_token_warp(const epf_ht_view_t* v, const epf_plan_t* plan,
                                                              const void* dy_row, int t, const epf_wait_t* w) {
  return epf__ht_dispatch_token_warp(v, plan, dy_row, NULL, 0, t, w, 1);
}

/* epf__ht_combine_expert_warp — epf_ht_combine_expert_warp (unit == 0) and
 * epf_ht_dispatch_backward_expert_warp (unit != 0: RANK_MAJOR unit-weight pre-reduce, each view row
 * once; the router-weight gradients into the rows' metadata when weight_grad != NULL).
 * [collective:warp] */
EPF_DEVICE_INLINE void epf__ht_combine_expert_warp(const epf_ht_view_t* v, const epf_plan_t* plan, const void* expert_out,
                                                   int64_t expert_rows, int warp, int nwarps, const epf_wait_t* w,
                                                   int unit, const float* weight_grad) {
  if (plan->layout == EPF_LAYOUT_EXPERT_MAJOR) {
    int64_t o = warp, i = warp;
    int le;
    if (expert_out == NULL && !(plan->flags & EPF_FLAG_COMBINE_PUSH) && weight_grad == NULL)
      return; /* pull in place: nothing moves (with weight_grad the loop below only writes those) */
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
        if (weight_grad != NULL && epf_lane_id() == 0) /* before the signal: the source reads it after its wait */
          *epf_combine_weight_grad_ptr(v->team, plan, r, 0, v->team.rank) = weight_grad[r];
        epf_combine_expert_row_em_warp(v->team, plan, r, y, w); /* in place: y is where the source reads */
      }
      o = i - n; /* i >= n: the position after this expert's rows, relative to the next one's */
    }
  } else {
    const int64_t rows = epf_ht_recv_rows(v, plan);
    int64_t r;
    for (r = warp; r < rows; r += nwarps)
      epf__combine_prereduce_rm_row_warp(v->team, plan, r, v->src_offset, expert_out, expert_rows, w, unit, weight_grad);
  }
}

EPF_DEVICE_INLINE void epf_ht_combine_expert_warp(const epf_ht_view_t* v, const epf_plan_t* plan, const void* expert_out,
                                                  int64_t expert_rows, int warp, int nwarps, const epf_wait_t* w) {
  epf__ht_combine_expert_warp(v, plan, expert_out, expert_rows, warp, nwarps, w, 0, NULL);
}

EPF_DEVICE_INLINE void epf_ht_dispatch_backward_expert_warp(const epf_ht_view_t* v, const epf_plan_t* plan,
                                                            const void* dx_rows, int64_t expert_rows,
                                                            const float* weight_grad, int warp, int nwarps,
                                                            const epf_wait_t* w) {
  epf__ht_combine_expert_warp(v, plan, dx_rows, expert_rows, warp, nwarps, w, 1, weight_grad);
}

/* epf__ht_combine_token_warp — epf_ht_combine_token_warp (unit == 0) and
 * epf_ht_dispatch_backward_token_warp (unit != 0: EXPERT_MAJOR weight 1 and repeats add nothing;
 * the router-weight gradients into wgrad_row when it is not NULL). [collective:warp] */
EPF_DEVICE_INLINE void epf__ht_combine_token_warp(const epf_ht_view_t* v, const epf_plan_t* plan, int t, void* out_row,
                                                  const epf_wait_t* w, int unit, float* wgrad_row) {
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
    int64_t row = -1;
    if (d >= 0) {
      row = (int64_t)v->send_offset[e] + v->slot[(int64_t)t * v->K + lane];
      if (row < plan->recv_capacity) { /* else dropped at dispatch */
        if (push)
          my_row = (const char*)epf_local_ptr(v->team, epf_plan_combine_offset(plan, (int64_t)t * v->K + lane));
        else if (w->mask == NULL || epf_mask_is_active(w->mask, d))
          my_row = (const char*)epf_peer_ptr(v->team, epf_plan_expert_out_offset(plan, row), d);
      }
    }
    if (unit) { /* backward: weight 1, a repeat adds nothing (its gradient is in its first occurrence's row) */
      if (wgrad_row != NULL) {
        /* the gradient of (t, k): the value of the row k reads (its first occurrence's), 0 if none */
        const bool has = d >= 0 && row < plan->recv_capacity && (w->mask == NULL || epf_mask_is_active(w->mask, d));
        const float g = has ? *epf_combine_weight_grad_ptr(v->team, plan, row, 0, d) : 0.f;
        const float gf = __shfl_sync(0xffffffffu, g, first);
        if (lane < v->K) wgrad_row[lane] = e >= 0 ? gf : 0.f;
      }
      if (my_row != NULL) my_w = 1.0f;
    } else {
      first_row = (const char*)__shfl_sync(0xffffffffu, (unsigned long long)(uintptr_t)my_row, first);
      if (e >= 0 && first != lane) my_row = first_row;
      if (my_row != NULL) my_w = v->topk_weights[(int64_t)t * v->K + lane];
    }
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
    if (unit && wgrad_row != NULL) {
      /* lane k: its entry on rank dk (the rank of its first occurrence) is the j-th of that rank's
       * entries, j = the lower lanes with the same dk (the dispatch listed them in k order) */
      int e;
      bool stale;
      const int d_lane = epf_ht_copy_em_lane(v, t, &e, &stale);
      const int d_first = __shfl_sync(0xffffffffu, d_lane, epf_topk_first_lane_warp(e));
      const int dk = e >= 0 ? d_first : -1;
      const uint32_t same = __match_any_sync(0xffffffffu, dk);
      const int j = __popc(same & ((1u << lane) - 1u));
      const int64_t rk = dk >= 0 ? (int64_t)v->send_rm_offset[dk] + v->rm_slot[(int64_t)t * v->R + dk] : -1;
      const bool has = dk >= 0 && rk < plan->recv_capacity && (w->mask == NULL || epf_mask_is_active(w->mask, dk));
      if (lane < v->K) wgrad_row[lane] = has ? *epf_combine_weight_grad_ptr(v->team, plan, rk, j, dk) : 0.f;
    }
  }
  epf_combine_reduce_rows_warp(my_row, my_w, __ballot_sync(0xffffffffu, my_row != NULL), plan->hidden,
                               plan->combine_payload == EPF_PAYLOAD_MXFP8, out_row);
}

EPF_DEVICE_INLINE void epf_ht_combine_token_warp(const epf_ht_view_t* v, const epf_plan_t* plan, int t, void* out_row,
                                                 const epf_wait_t* w) {
  epf__ht_combine_token_warp(v, plan, t, out_row, w, 0, NULL);
}

EPF_DEVICE_INLINE void epf_ht_dispatch_backward_token_warp(const epf_ht_view_t* v, const epf_plan_t* plan, int t,
                                                           void* out_row, float* wgrad_row, const epf_wait_t* w) {
  epf__ht_combine_token_warp(v, plan, t, out_row, w, 1, wgrad_row);
}

EPF_END_DECLS

#endif /* EPF_HT_IMPL_VIEW_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
