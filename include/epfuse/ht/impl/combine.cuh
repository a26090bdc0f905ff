/* epfuse/ht/impl/combine.cuh — high-throughput combine blocks: weighted FP32 reduction in k order — part of epfuse v0.1
 *
 * What it is: the way back of high-throughput (HT) EP. Expert outputs (BF16, one row per received
 * row, in the receive order) return to their source rank, which weights them by topk_weights,
 * reduces in FP32 **in k order** with fused multiply-adds (acc = fma(w_k, y_k, acc), k ascending,
 * from acc = 0), and writes one BF16 row per token — bitwise deterministic, and equal to the CPU
 * reference that does the same fmaf sequence. Two transports over LSA:
 *   - PULL (default): the source loads each copy's output straight from the expert rank's window
 *     (epf_plan_expert_out_offset) — no landing buffer, no extra pass.
 *   - PUSH (EPF_FLAG_COMBINE_PUSH): the expert rank stores each output row into the source's
 *     COMBINE region row (token, k); the source then reduces locally.
 *   Readiness: the expert side signals SIG_COMBINE[rank] in every peer with the epoch
 *   (epf_combine_signal_block) once its outputs are in place (pull) or pushed (push); the source
 *   waits for all peers (epf_combine_wait_block) before it reads.
 *
 * What it does NOT do: run the experts, pick routes, or protect the receive region against the
 * next dispatch: a rank may overwrite its peers' receive regions again only after the next count
 * exchange (route update), which every rank enters after finishing its combine.
 *
 * Usage (a fused epilogue; ht/kernels.cuh has ready-made kernels):
 *   // source rank, one warp per token t; lane j < K holds copy j
 *   epf_combine_pull_row_warp(team, &plan, dst_rank_j, dst_row_j, w_j, K, out + t * H);
 *
 * Contents:
 *   void epf_combine_reduce_rows_warp(const void* my_row, float my_w, uint32_t present, int hidden, int mxfp8, void* out_row)
 *        (one k-order reduction: epf__combine_reduce_warp, also behind the rank-major pre-reduce)
 *   void epf_combine_pull_row_warp(team, plan, int src_rank, int64_t src_row, float weight, int ncopies, void* out_row)
 *   void epf_combine_put_row_warp(const epf_plan_t* plan, const void* src_bf16, char* dst)
 *   void epf_combine_push_row_warp(team, plan, const void* expert_out_row, int dst_rank, int64_t combine_row)
 *   void epf_combine_expert_row_em_warp(team, plan, int64_t row, const void* y, const epf_wait_t*)
 *        EXPERT_MAJOR expert side: one receive row's output where its source reads it
 *   void epf_combine_prereduce_rm_row_warp(team, plan, row, src_offset, expert_out, expert_rows, const epf_wait_t*)
 *        RANK_MAJOR expert side: one receive row's k-order partial
 *   void epf_combine_prereduce_rm_row_unit_warp(team, plan, row, src_offset, dx_rows, expert_rows,
 *                                               const float* weight_grad, const epf_wait_t*)
 *        the same with unit weights, each view row once (the backward of dispatch)
 *   void epf_combine_signal_block(team, plan, uint32_t epoch)                     [collective:block]
 *   epf_status_t epf_combine_wait_block(team, plan, uint32_t epoch, epf_wait_t w) [collective:block]
 *   (shared with LL: epf_combine_weight_grad_ptr in core/rows.cuh, where a receive row's
 *    router-weight gradient travels back; epf_bf16x8_fma / epf_bf16x8_from_f32 in core/bf16.cuh)
 *
 * Requirements: CUDA, sm_80+ for the BF16 conversions (sm_90 / sm_100 tested).
 */
#ifndef EPF_HT_IMPL_COMBINE_CUH
#define EPF_HT_IMPL_COMBINE_CUH

#include <cuda_bf16.h>

#include "../../config.h"
#include "dispatch.cuh"
#include "../../host.h"
#include "../../core/bf16.cuh"
#include "../../core/ptx.cuh"
#include "../../core/rows.cuh"
#include "../../quant/quant.cuh"
#include "../../core/signal.cuh"
#include "../../core/team.cuh"

EPF_BEGIN_DECLS

/* epf__combine_acc8 — acc += w_u * row_u[vector i] for u < m (m <= 8), in ascending u: the m
 * rows' vectors are loaded first (all in flight), then the fmas run in order. Rows are BF16 (16
 * bytes per vector) or MXFP8 combine rows (8 E4M3 bytes per vector, the row's E8M0 scales after
 * its `hidden` element bytes). on == false: nothing is loaded (a lane past the row end). */
EPF_DEVICE_INLINE void epf__combine_acc8(const char* const* p, const float* w, int m, int i, bool on, int mxfp8,
                                         int hidden, float* acc) {
  int u;
  if (!mxfp8) {
    uint4 v[8];
#pragma unroll
    for (u = 0; u < 8; ++u)
      if (u < m && on) v[u] = epf_ld_v4_u32((const uint4*)p[u] + i);
#pragma unroll
    for (u = 0; u < 8; ++u)
      if (u < m && on) epf_bf16x8_fma(acc, v[u], w[u]);
  } else {
    uint2 q[8];
    uint8_t sc[8];
#pragma unroll
    for (u = 0; u < 8; ++u)
      if (u < m && on) {
        q[u] = *(const uint2*)(p[u] + (uint64_t)i * 8u);
        sc[u] = (uint8_t)p[u][epf_combine_row_scale_at(hidden, 8 * i)];
      }
#pragma unroll
    for (u = 0; u < 8; ++u)
      if (u < m && on) epf_mxfp8_dequantize_accumulate8(q[u], sc[u], w[u], acc);
  }
}

/* epf__combine_out_warp — store chunk c's accumulators: BF16 (RNE) or an MXFP8 combine row.
 * Warp-uniform call (the quantizer's collectives see the whole warp); lanes past nvec store nothing. */
EPF_DEVICE_INLINE void epf__combine_out_warp(const float* acc, int i, int nvec, int hidden, int out_mxfp8, int mx_rule,
                                             void* out_row) {
  if (!out_mxfp8) {
    if (i < nvec) epf_st_v4_u32((uint4*)out_row + i, epf_bf16x8_from_f32(acc));
  } else {
    uint8_t sb;
    const uint2 q = epf_mxfp8_quantize_lane8_warp(acc, mx_rule, &sb); /* lanes past the end: zeros */
    if (i < nvec) {
      *(uint2*)((char*)out_row + (uint64_t)i * 8u) = q;
      if ((epf_lane_id() & 3) == 0) ((char*)out_row)[epf_combine_row_scale_at(hidden, 8 * i)] = (char)sb;
    }
  }
}

/* epf__combine_chunks_warp — the reduction of n <= 8 / C rows, C (2, 4 or 8) 32-vector chunks per
 * step: the n * C vectors of a step are loaded first (all in flight), then each chunk's fmas run
 * in row order and its output is stored (one chunk's accumulators live at a time).
 * [collective:warp], warp-uniform arguments; C a constant at each call. */
EPF_DEVICE_INLINE void epf__combine_chunks_warp(const char* const* p, const float* wv, int n, int C, int nvec, int hidden,
                                                int in_mxfp8, int out_mxfp8, int mx_rule, void* out_row) {
  const int lane = epf_lane_id();
  int base, c, u;
  for (base = 0; base < nvec; base += 32 * C) { /* warp-uniform */
    const int i = base + lane;
    uint4 v[8];    /* BF16 rows: vector (u, c) at u * C + c */
    uint2 q[8];    /* MXFP8 rows */
    uint8_t sc[8];
#pragma unroll
    for (c = 0; c < 8; ++c)
#pragma unroll
      for (u = 0; u < 8; ++u)
        if (c < C && u * C + c < 8 && u < n && i + 32 * c < nvec) {
          if (!in_mxfp8) {
            v[u * C + c] = epf_ld_v4_u32((const uint4*)p[u] + i + 32 * c);
          } else {
            q[u * C + c] = *(const uint2*)(p[u] + (uint64_t)(i + 32 * c) * 8u);
            sc[u * C + c] = (uint8_t)p[u][epf_combine_row_scale_at(hidden, 8 * (i + 32 * c))];
          }
        }
#pragma unroll
    for (c = 0; c < 8; ++c) {
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      if (c >= C || base + 32 * c >= nvec) continue; /* warp-uniform */
#pragma unroll
      for (u = 0; u < 8; ++u)
        if (u * C + c < 8 && u < n && i + 32 * c < nvec) {
          if (!in_mxfp8)
            epf_bf16x8_fma(acc, v[u * C + c], wv[u]);
          else
            epf_mxfp8_dequantize_accumulate8(q[u * C + c], sc[u * C + c], wv[u], acc);
        }
      epf__combine_out_warp(acc, i + 32 * c, nvec, hidden, out_mxfp8, mx_rule, out_row);
    }
  }
}

/* epf__combine_reduce_warp — THE k-order reduction of epfuse (the source's combine, the
 *   rank-major pre-reduce and epf_combine_pull_row_warp all call it): out = round(fma chain over a
 *   lane-held list of rows, in ascending lane order, from acc = 0, in FP32).
 *   Scope:    [collective:warp] every lane, converged; present, hidden, in_mxfp8, out_mxfp8,
 *             mx_rule, out_row uniform.
 *   Input:    lane j holds row j's address and weight; `present` marks the rows to use (any
 *             number, up to 32). Rows: BF16 [hidden] (in_mxfp8 == 0) or MXFP8 combine rows.
 *   Does:     out_mxfp8 == 0: out_row is BF16 [hidden], RNE. out_mxfp8 != 0: out_row is an MXFP8
 *             combine row (hidden E4M3 bytes, then hidden / 32 E8M0 scales, rule mx_rule).
 *   Loads:    8 vectors per lane in flight before the fmas: 8 rows of one 32-vector chunk, or, for
 *             fewer rows, 8 / n chunks of n rows (one or two rows — a rank-major partial, top-1 /
 *             top-2 models — would otherwise leave one or two loads in flight and the combine
 *             latency-bound). The order of every element's fmas is the
 *             same in every case.
 *   Loops:    every loop is warp-uniform — its trip count is the same in every lane, lanes past
 *             the row end are predicated off — so the shuffles inside and the quantizer's
 *             collectives always see the whole warp (a lane-strided loop around a shuffle is
 *             undefined behaviour when hidden / 8 is not a multiple of 32, e.g. hidden 2880). */
EPF_DEVICE_INLINE void epf__combine_reduce_warp(const void* my_row, float my_w, uint32_t present, int hidden,
                                                int in_mxfp8, int out_mxfp8, int mx_rule, void* out_row) {
  const int lane = epf_lane_id();
  const int nvec = hidden >> 3;
  const int n = __popc(present);
  /* compact: lane j gets the j-th present row (order kept) */
  const int src = lane < n ? (int)__fns(present, 0u, lane + 1) : 0;
  const unsigned long long row_j = __shfl_sync(0xffffffffu, (unsigned long long)(uintptr_t)my_row, src);
  const float w_j = __shfl_sync(0xffffffffu, my_w, src);
  const char* p[8]; /* top-k <= 8: every row's address in registers, loaded once */
  float wv[8];
  int base, u;
#pragma unroll
  for (u = 0; u < 8; ++u) {
    p[u] = (const char*)__shfl_sync(0xffffffffu, row_j, u);
    wv[u] = __shfl_sync(0xffffffffu, w_j, u);
  }
  if (n <= 4) { /* warp-uniform: 8 / n chunks per step, so 8 loads per lane are in flight */
    if (n <= 1)
      epf__combine_chunks_warp(p, wv, n, 8, nvec, hidden, in_mxfp8, out_mxfp8, mx_rule, out_row);
    else if (n <= 2)
      epf__combine_chunks_warp(p, wv, n, 4, nvec, hidden, in_mxfp8, out_mxfp8, mx_rule, out_row);
    else
      epf__combine_chunks_warp(p, wv, n, 2, nvec, hidden, in_mxfp8, out_mxfp8, mx_rule, out_row);
    return;
  }
  for (base = 0; base < nvec; base += 32) { /* warp-uniform */
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    int j0;
    for (j0 = 0; j0 < n; j0 += 8) { /* warp-uniform: 8 rows at a time, in order */
      if (n > 8) { /* top-k > 8: this group's addresses (one set of registers for all groups) */
#pragma unroll
        for (u = 0; u < 8; ++u) {
          p[u] = (const char*)__shfl_sync(0xffffffffu, row_j, (j0 + u) & 31);
          wv[u] = __shfl_sync(0xffffffffu, w_j, (j0 + u) & 31);
        }
      }
      epf__combine_acc8(p, wv, n - j0 < 8 ? n - j0 : 8, base + lane, base + lane < nvec, in_mxfp8, hidden, acc);
    }
    epf__combine_out_warp(acc, base + lane, nvec, hidden, out_mxfp8, mx_rule, out_row);
  }
}

EPF_DEVICE_INLINE void epf_combine_reduce_rows_warp(const void* my_row, float my_w, uint32_t present, int hidden,
                                                    int mxfp8, void* out_row) {
  epf__combine_reduce_warp(my_row, my_w, present, hidden, mxfp8, 0, 0, out_row);
}

EPF_DEVICE_INLINE void epf_combine_pull_row_warp(epf_team_t team, const epf_plan_t* plan, int src_rank,
                                                 int64_t src_row, float weight, int ncopies, void* out_row) {
  const int lane = epf_lane_id();
  const bool ok = lane < ncopies && src_rank >= 0 && src_rank < team.nranks && src_row >= 0 &&
                  src_row < plan->recv_capacity;
  const void* my_src = ok ? epf_peer_ptr(team, epf_plan_expert_out_offset(plan, src_row), src_rank) : (const void*)0;
  epf_combine_reduce_rows_warp(my_src, weight, __ballot_sync(0xffffffffu, ok), plan->hidden,
                               plan->combine_payload == EPF_PAYLOAD_MXFP8, out_row);
}

EPF_DEVICE_INLINE void epf_combine_put_row_warp(const epf_plan_t* plan, const void* src_bf16, char* dst) {
  const int nvec = plan->hidden >> 3, lane = epf_lane_id();
  const int rule = epf_mx_rule_from_flags(plan->flags);
  int base;
  if (plan->combine_payload == EPF_PAYLOAD_BF16) {
    epf__copy_row_send_warp(dst, src_bf16, nvec);
    return;
  }
  /* MXFP8: EPF_SEND_UNROLL 256-element chunks per step, their loads all in flight before the
   * first quantization (one load at a time leaves the warp latency-bound) */
  for (base = 0; base < nvec; base += 32 * EPF_SEND_UNROLL) { /* warp-uniform */
    uint4 v[EPF_SEND_UNROLL];
    int u;
#pragma unroll
    for (u = 0; u < EPF_SEND_UNROLL; ++u) {
      const int i = base + u * 32 + lane;
      v[u] = i < nvec ? epf_ld_v4_u32((const uint4*)src_bf16 + i) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (u = 0; u < EPF_SEND_UNROLL; ++u) {
      const int i = base + u * 32 + lane;
      uint8_t sb;
      uint2 q;
      if (base + u * 32 >= nvec) break; /* warp-uniform: the quantizer's shuffles see the whole warp */
      q = epf_mxfp8_quantize_lane8_bf16_warp(v[u], rule, &sb);
      if (i < nvec) {
        *(uint2*)(dst + (uint64_t)i * 8u) = q;
        if ((lane & 3) == 0) dst[epf_combine_row_scale_at(plan->hidden, 8 * i)] = (char)sb;
      }
    }
  }
}

EPF_DEVICE_INLINE void epf_combine_push_row_warp(epf_team_t team, const epf_plan_t* plan, const void* expert_out_row,
                                                 int dst_rank, int64_t combine_row) {
  const uint64_t rows = plan->combine_row_bytes ? plan->region[EPF_REGION_COMBINE].bytes / plan->combine_row_bytes : 0;
  if (dst_rank < 0 || dst_rank >= team.nranks || combine_row < 0 || (uint64_t)combine_row >= rows) return;
  epf_combine_put_row_warp(plan, expert_out_row, (char*)epf_peer_ptr(team, epf_plan_combine_offset(plan, combine_row), dst_rank));
}

EPF_DEVICE_INLINE void epf_combine_expert_row_em_warp(epf_team_t team, const epf_plan_t* plan, int64_t row, const void* y,
                                                      const epf_wait_t* w) {
  if (plan->flags & EPF_FLAG_COMBINE_PUSH) {
    const epf_recv_meta_em_t* mp = (const epf_recv_meta_em_t*)epf_local_ptr(team, epf_plan_recv_meta_offset(plan, row));
    const epf_recv_meta_em_t m = *mp;
    const bool ok = m.src_token >= 0 && m.src_token < plan->max_tokens_per_rank && m.src_rank >= 0 &&
                    m.src_rank < plan->nranks && m.k >= 0 && m.k < plan->top_k;
    epf_error_report_warp(w, !ok && epf_lane_id() == 0, EPF_ERR_BAD_METADATA, mp, 0, 0);
    if (ok) epf_combine_push_row_warp(team, plan, y, m.src_rank, (int64_t)m.src_token * plan->top_k + m.k);
  } else {
    char* dst = (char*)epf_local_ptr(team, epf_plan_expert_out_offset(plan, row));
    if ((const void*)dst != y) epf_combine_put_row_warp(plan, y, dst);
  }
}

/* epf__combine_prereduce_rm_row_warp — epf_combine_prereduce_rm_row_warp (unit == 0) and
 * epf_combine_prereduce_rm_row_unit_warp (unit != 0: weight 1, each view row once, the router-weight
 * gradients into the row's entries when weight_grad != NULL). [collective:warp] */
EPF_DEVICE_INLINE void epf__combine_prereduce_rm_row_warp(epf_team_t team, const epf_plan_t* plan, int64_t row,
                                                          const int32_t* src_offset, const void* expert_out,
                                                          int64_t expert_rows, const epf_wait_t* w, int unit,
                                                          const float* weight_grad) {
  const epf_recv_meta_rm_lane_t m = epf_recv_meta_rm_read_warp(team, plan, row, src_offset);
  const bool ok = m.em_row >= 0 && m.em_row < expert_rows;
  const char* y = ok ? (const char*)expert_out + (uint64_t)m.em_row * (uint64_t)plan->hidden * 2u : NULL;
  uint32_t present;
  char* out;
  epf_error_report_warp(w, m.token_ok ? m.entry_bad : epf_lane_id() == 0, EPF_ERR_BAD_METADATA,
                        epf_local_ptr(team, epf_plan_recv_meta_offset(plan, row)), 0, 0);
  if (!m.token_ok) return; /* warp-uniform */
  if (unit) {
    /* a repeat names its first occurrence's view row again: that row counts once, at its first
     * (lowest) entry; entries whose row was not placed contribute nothing */
    const uint32_t same =
        __match_any_sync(0xffffffffu, m.em_row >= 0 ? (unsigned long long)m.em_row : ~(unsigned long long)epf_lane_id());
    present = __ballot_sync(0xffffffffu, ok && __ffs((int)same) - 1 == epf_lane_id());
    if (weight_grad != NULL && epf_lane_id() < m.num_local) /* entry j's gradient: its view row's, 0 if not placed */
      *epf_combine_weight_grad_ptr(team, plan, row, epf_lane_id(), team.rank) = ok ? weight_grad[m.em_row] : 0.f;
  } else {
    present = __ballot_sync(0xffffffffu, ok);
  }
  out = (plan->flags & EPF_FLAG_COMBINE_PUSH)
            ? (char*)epf_peer_ptr(team, epf_plan_combine_offset(plan, (int64_t)m.src_token * plan->nranks + team.rank),
                                  m.src_rank)
            : (char*)epf_local_ptr(team, epf_plan_expert_out_offset(plan, row));
  epf__combine_reduce_warp(y, unit ? 1.0f : m.weight, present, plan->hidden, 0,
                           plan->combine_payload == EPF_PAYLOAD_MXFP8, epf_mx_rule_from_flags(plan->flags), out);
}

EPF_DEVICE_INLINE void epf_combine_prereduce_rm_row_warp(epf_team_t team, const epf_plan_t* plan, int64_t row,
                                                         const int32_t* src_offset, const void* expert_out,
                                                         int64_t expert_rows, const epf_wait_t* w) {
  epf__combine_prereduce_rm_row_warp(team, plan, row, src_offset, expert_out, expert_rows, w, 0, NULL);
}

EPF_DEVICE_INLINE void epf_combine_prereduce_rm_row_unit_warp(epf_team_t team, const epf_plan_t* plan, int64_t row,
                                                              const int32_t* src_offset, const void* dx_rows,
                                                              int64_t expert_rows, const float* weight_grad,
                                                              const epf_wait_t* w) {
  epf__combine_prereduce_rm_row_warp(team, plan, row, src_offset, dx_rows, expert_rows, w, 1, weight_grad);
}

EPF_DEVICE_INLINE void epf_combine_signal_block(epf_team_t team, const epf_plan_t* plan, uint32_t epoch) {
  __syncthreads();
  epf_signal_peers_block(team, plan, EPF_REGION_SIG_COMBINE, epoch);
}

EPF_DEVICE_INLINE epf_status_t epf_combine_wait_block(epf_team_t team, const epf_plan_t* plan, uint32_t epoch,
                                                      epf_wait_t w) {
  return epf_wait_peers_block(team, plan, EPF_REGION_SIG_COMBINE, epoch, w);
}

EPF_END_DECLS

#endif /* EPF_HT_IMPL_COMBINE_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
