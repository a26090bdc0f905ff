/* epfuse/ll/impl/combine_rm.cuh — low-latency RANK_MAJOR combine: pre-reduce on the expert side, reduce at the source — part of epfuse v0.1
 *
 * What it is: the way back of a RANK_MAJOR LL plan (ll/impl/dispatch_rm.cuh): each expert rank sends
 * ONE row per (token, expert rank) back, the pre-reduced partial of the token's experts on that
 * rank, and the source sums the partials. Bitwise deterministic, and bit-identical to the
 * RANK_MAJOR rule of the HT combine (ht/impl/combine.cuh's epf_combine_prereduce_rm_row_warp; the CPU
 * reference rule of tests/common/epf_ht_ref.h):
 *   SEND (epf_ll_rm_combine_send_block; never waits): for every rank-major row of the round (the
 *     sources the dispatch receive did not miss), one warp per (row, 256-element chunk) reads the
 *     row's metadata (epf_recv_meta_rm_read_warp, every value checked before it forms an address)
 *     and computes
 *       p[h] = fma(w_{j_n}, y_{j_n}[h], ... fma(w_{j_0}, y_{j_0}[h], 0.0f))
 *     over the row's entries j in k order (FP32, one rounding per fma; a repeated expert names its
 *     first occurrence's view row, with its own weight), y = the expert outputs in the order of
 *     the expert-major view (a->y: PACKED, as epf_ll_rm_expand_block wrote the inputs, or FIXED),
 *     then rounds p to the combine payload (BF16 RNE, or an MXFP8 combine row quantized from the
 *     FP32 partial: plan.combine_row_bytes, epf_combine_row_scale_at) and stores it into row
 *     epf_ll_rm_combine_row(plan, c, token, rank) of the SOURCE's COMBINE region (push) or, with
 *     EPF_LL_Y_PACKED_PULL, over the row's own receive row in this rank's window (pull; BF16 both
 *     ways). The last block signals every active source: (c, 0) or (c, EPF__LL_COMBINE_PULL).
 *   RECV (epf_ll_rm_combine_recv_block; bounded waits): every block waits for the combine signal of
 *     every rank, rebuilds the per-rank slot table from topk_idx if a rank let it pull
 *     (epf_ll_rm_slots_block), then one warp per (token, 256-element chunk) computes
 *       out[t][h] = BF16_RNE( fma(1, p_{d_m}[h], ... fma(1, p_{d_0}[h], 0.0f)) )
 *     over the token's expert ranks d_0, d_1, ... in the order of their FIRST OCCURRENCE in k,
 *     skipping ranks that are masked or did not signal.
 *
 * Why not bit-identical to the EXPERT_MAJOR reference: the EXPERT_MAJOR sum is ONE fma chain over
 * all k, acc_k = fma(w_k, y_k, acc_{k-1}); the rank-major sum groups the entries of each rank into a
 * partial (rounded once to the combine payload) and adds the partials. When a token's entries on
 * two ranks interleave in k (ranks A B A), no grouping reproduces the single chain's rounding
 * sequence, and the partial's rounding to BF16 is an extra rounding anyway. Both results are the
 * exact documented rule of their layout, the same on every run.
 *
 * Fault tolerance, as ll/impl/combine.cuh: an expert rank that is masked or did not signal in time
 * contributes zero (its partials are skipped); a token with no partial gets +0.0; rows [0,
 * num_tokens) of out are always written. The expert side sends nothing to (and does not signal) a
 * source that is masked or whose dispatch of this round it missed (state.dispatch_fail).
 *
 * What it does NOT do: run the experts, allocate or launch (ll/kernels.cuh: epf_ll_combine picks
 * these blocks for a RANK_MAJOR plan).
 *
 * Usage (ll/kernels.cuh: epf_ll_rm_combine_kernel):
 *   epf_ll_rm_combine_send_block(&plan, ctx, &cargs, smem);   // expert side, after the experts ran
 *   __syncthreads();
 *   epf_ll_rm_combine_recv_block(&plan, ctx, &cargs, smem);   // source side
 *
 * COMPILE-TIME OPTIONS: EPF_LL_COMBINE_BATCH (ll/impl/combine.cuh: rows in flight per lane).
 *
 * Contents:
 *   void         epf_ll_rm_combine_send_block(const epf_plan_t*, epf_ll_ctx_t, const epf_ll_combine_args_t*, void* smem)
 *   epf_status_t epf_ll_rm_combine_recv_block(const epf_plan_t*, epf_ll_ctx_t, const epf_ll_combine_args_t*, void* smem)
 *   void         epf_ll_rm_dispatch_backward_send_block(const epf_plan_t*, epf_ll_ctx_t, const epf_ll_combine_args_t*, void* smem)
 *   epf_status_t epf_ll_rm_dispatch_backward_recv_block(const epf_plan_t*, epf_ll_ctx_t, const epf_ll_combine_args_t*, void* smem)
 *
 * Requirements: CUDA, sm_80+ (BF16 conversions), sm_90 compiled (-Werror).
 */
#ifndef EPF_LL_IMPL_COMBINE_RM_CUH
#define EPF_LL_IMPL_COMBINE_RM_CUH

#include "../../core/bf16.cuh"
#include "../../core/rows.cuh"
#include "combine.cuh"
#include "../../config.h"
#include "dispatch_rm.cuh"
#include "../../host.h"
#include "types.cuh"
#include "layout.cuh"
#include "phase.cuh"
#include "slots.cuh"
#include "rm.cuh"
#include "frame.cuh"
#include "../../core/ptx.cuh"
#include "../../quant/quant.cuh"
#include "../../core/signal.cuh"
#include "../../core/team.cuh"

EPF_BEGIN_DECLS

/* epf__ll_rm_reduce_chunk_warp — acc[8] (lane's 8 elements at column col of a 256-element chunk)
 * = the fma chain over the rows the lanes hold (lane j: row src_j, weight w_j; `m` marks them),
 * in ascending lane order, from the current acc: EPF_LL_COMBINE_BATCH rows' loads in flight
 * before their fmas. Rows: BF16 (16 bytes per lane) or MXFP8 combine rows (mx). [collective:warp] */
EPF_DEVICE_INLINE void epf__ll_rm_reduce_chunk_warp(const char* src, float wk, uint32_t m, int col, bool on, bool mx,
                                                    int H, bool nc, float* acc) {
  while (m != 0u) { /* warp-uniform */
    uint4 v[EPF_LL_COMBINE_BATCH];
    float wv[EPF_LL_COMBINE_BATCH];
    int n = 0, b;
#pragma unroll
    for (b = 0; b < EPF_LL_COMBINE_BATCH; ++b) {
      v[b] = make_uint4(0u, 0u, 0u, 0u);
      wv[b] = 0.f;
      if (m != 0u) { /* warp-uniform */
        const int j = __ffs((int)m) - 1;
        const char* sj = (const char*)epf__ll_shfl_ptr((void*)src, j);
        m &= m - 1u;
        wv[b] = __shfl_sync(0xffffffffu, wk, j);
        if (on) {
          if (!mx) {
            v[b] = nc ? epf_ld_nc_v4_u32(sj + (int64_t)col * 2) : epf_ld_v4_u32(sj + (int64_t)col * 2);
          } else { /* x, y: the 8 E4M3 bytes; z: the group's E8M0 byte */
            const uint2 q = *(const uint2*)(sj + col);
            v[b] = make_uint4(q.x, q.y, (uint32_t)((const uint8_t*)sj)[epf_combine_row_scale_at(H, col)], 0u);
          }
        }
        n = b + 1;
      }
    }
#pragma unroll
    for (b = 0; b < EPF_LL_COMBINE_BATCH; ++b) {
      if (b >= n) continue;
      if (!mx)
        epf_bf16x8_fma(acc, v[b], wv[b]);
      else
        epf_mxfp8_dequantize_accumulate8(make_uint2(v[b].x, v[b].y), (uint8_t)v[b].z, wv[b], acc);
    }
  }
}

/* the bodies of the send and receive blocks below (defined after them) */
EPF_DEVICE_INLINE void epf__ll_rm_combine_send(const epf_plan_t* plan, epf_ll_ctx_t ctx, const epf_ll_combine_args_t* a,
                                               void* smem, bool bwd);
EPF_DEVICE_INLINE epf_status_t epf__ll_rm_combine_recv(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                       const epf_ll_combine_args_t* a, void* smem, bool bwd);

EPF_DEVICE_INLINE void epf_ll_rm_combine_send_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                    const epf_ll_combine_args_t* a, void* smem) {
  epf__ll_rm_combine_send(plan, ctx, a, smem, false);
}

EPF_DEVICE_INLINE void epf_ll_rm_dispatch_backward_send_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                              const epf_ll_combine_args_t* a, void* smem) {
  epf__ll_rm_combine_send(plan, ctx, a, smem, true);
}

/* (the body of the two send blocks above: bwd = true pre-reduces with unit weights over distinct
 * view rows and carries a->weight_grad; every caller passes a constant) */
EPF_DEVICE_INLINE void epf__ll_rm_combine_send(const epf_plan_t* plan, epf_ll_ctx_t ctx, const epf_ll_combine_args_t* a,
                                               void* smem, bool bwd) {
  EPF__LL_FRAME_MAKE(f, plan, ctx, a->num_tokens, EPF_LL_PHASE_COMBINE_SEND, smem);
  const bool packed = a->y_layout == EPF_LL_Y_PACKED || a->y_layout == EPF_LL_Y_PACKED_PULL;
  const bool ok_round = f.dispatch_round == f.epoch && a->recv_counts != NULL && a->y != NULL && (packed || a->y_layout == EPF_LL_Y_FIXED);
  /* pull: the partials stay in this rank's receive rows (BF16 rows both ways: one fits over the other) */
  const bool pull = epf_ll_combine_pulls(plan, a->y_layout);
  const int nchunks = (f.H + EPF_LL_UNIT_ELEMS - 1) / EPF_LL_UNIT_ELEMS;
  const bool mx = plan->combine_payload == EPF_PAYLOAD_MXFP8;
  const int mx_rule = epf_mx_rule_from_flags(plan->flags);
  /* backward: this rank carries the router-weight gradients of its view rows */
  const bool wgrad = bwd && a->weight_grad != NULL && ok_round;
  int64_t u, units;
  int g;

  epf__ll_snapshot_mask_block(plan, ctx, f.mask);
  /* sources whose dispatch of this round we missed get nothing, not even the signal */
  for (g = (int)threadIdx.x; g < f.R; g += (int)blockDim.x)
    if (epf_ld_relaxed_gpu_u32(&ctx.state->dispatch_fail[g]) == f.epoch) atomicAnd(&f.mask[g >> 5], ~(1u << (g & 31)));
  __syncthreads();
  if (!ok_round && ctx.block == 0 && threadIdx.x == 0)
    epf_error_report(ctx.record, EPF_ERR_INVALID_ARGUMENT, f.rank, -1, &ctx.state->epoch[EPF_LL_PHASE_DISPATCH_RECV],
                     f.epoch, f.dispatch_round, 0);
  epf__ll_rm_rows_block(plan, ctx, f.epoch, f.mask, f.rm_present, f.rm_rows);
  for (g = (int)threadIdx.x; g < f.EL * f.R; g += (int)blockDim.x) {
    const int32_t n = ok_round && epf__ll_active(f.rm_present, g % f.R) ? a->recv_counts[g] : 0;
    f.rm_cnt[g] = (uint32_t)(n < 0 ? 0 : (n > f.Tmax ? f.Tmax : n));
  }
  if (!ok_round)
    for (g = (int)threadIdx.x; g < f.R; g += (int)blockDim.x) f.rm_rows[g] = 0u;
  epf__ll_rm_prefix_block(plan, &f.sl, smem, packed); /* __syncthreads before and after */
  units = (int64_t)f.rm_rows[f.R] * nchunks;

  for (u = (int64_t)ctx.block * f.nwarps + f.warp; u < units; u += (int64_t)ctx.nblocks * f.nwarps) {
    const uint32_t r = (uint32_t)(u / nchunks);
    const int c = (int)(u - (int64_t)r * nchunks);
    const int col = c * EPF_LL_UNIT_ELEMS + f.lane * 8;
    const bool on = col < f.H;
    const int s = epf__ll_find_group(f.rm_rows, f.R, r);
    const int64_t wrow = epf_ll_rm_recv_row(plan, f.epoch, s, (int)(r - f.rm_rows[s]));
    const epf_recv_meta_rm_lane_t m = epf_recv_meta_rm_read_warp(f.team, plan, wrow, f.rm_off);
    const bool hdr_ok = m.token_ok && m.src_rank == s; /* warp-uniform */
    const bool ok = hdr_ok && epf__ll_rm_entry_ok(plan, &m, f.rm_off, f.rm_cnt, s);
    const char* y = ok ? (const char*)a->y + m.em_row * (int64_t)f.H * 2 : NULL;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    char* dst;
    if (c == 0)
      epf_error_report_warp(&f.w, hdr_ok ? (f.lane < m.num_local && !ok) : f.lane == 0, EPF_ERR_BAD_METADATA,
                            epf_local_ptr(f.team, epf_plan_recv_meta_offset(plan, wrow)), 0, 0);
    if (!hdr_ok) continue; /* warp-uniform */
    dst = pull ? (char*)epf_local_ptr(f.team, epf_plan_recv_token_offset(plan, wrow))
               : (char*)epf_peer_ptr(f.team, epf_plan_combine_offset(plan, epf_ll_rm_combine_row(plan, f.epoch, m.src_token, f.rank)), s);
    if (!bwd) {
      epf__ll_rm_reduce_chunk_warp(y, m.weight, __ballot_sync(0xffffffffu, y != NULL), col, on, false, f.H, true, acc);
    } else { /* unit weights, each view row once, at its first entry in k (the lowest lane) */
      const uint32_t same = __match_any_sync(0xffffffffu, y != NULL ? (unsigned long long)m.em_row : ~(unsigned long long)f.lane);
      epf__ll_rm_reduce_chunk_warp(y, 1.0f, __ballot_sync(0xffffffffu, y != NULL && __ffs((int)same) - 1 == f.lane), col, on,
                                   false, f.H, true, acc);
      if (wgrad && c == 0 && f.lane < m.num_local) { /* entry j = lane: its view row's gradient */
        const float g = y != NULL ? a->weight_grad[m.em_row] : 0.0f;
        if (pull)
          *epf_combine_weight_grad_ptr(f.team, plan, wrow, f.lane, f.rank) = g;
        else
          ((float*)epf_peer_ptr(f.team, epf_plan_combine_offset(plan, epf_ll_rm_weight_grad_row(plan, f.epoch, m.src_token, f.rank)),
                                s))[f.lane] = g;
      }
    }
    if (!mx) {
      if (on) epf_st_v4_u32(dst + (int64_t)col * 2, epf_bf16x8_from_f32(acc));
    } else { /* all lanes, converged: the quantizer's collectives (lanes past the row end: zeros) */
      uint8_t sb = 0;
      const uint2 q = epf_mxfp8_quantize_lane8_warp(acc, mx_rule, &sb);
      if (on) {
        *(uint2*)(dst + col) = q;
        if ((f.lane & 3) == 0) ((uint8_t*)dst)[epf_combine_row_scale_at(f.H, col)] = sb;
      }
    }
  }

  epf__ll_combine_publish_block(plan, ctx, f.mask, f.epoch, ok_round,
                                (pull ? EPF__LL_COMBINE_PULL : 0u) | (wgrad ? EPF__LL_COMBINE_WGRAD : 0u));
}

EPF_DEVICE_INLINE epf_status_t epf_ll_rm_combine_recv_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                            const epf_ll_combine_args_t* a, void* smem) {
  return epf__ll_rm_combine_recv(plan, ctx, a, smem, false);
}

EPF_DEVICE_INLINE epf_status_t epf_ll_rm_dispatch_backward_recv_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                                      const epf_ll_combine_args_t* a, void* smem) {
  return epf__ll_rm_combine_recv(plan, ctx, a, smem, true);
}

/* (the body of the two receive blocks above: bwd = true also writes a->topk_weights_grad; every
 * caller passes a constant) */
EPF_DEVICE_INLINE epf_status_t epf__ll_rm_combine_recv(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                       const epf_ll_combine_args_t* a, void* smem, bool bwd) {
  EPF__LL_FRAME_MAKE(f, plan, ctx, a->num_tokens, EPF_LL_PHASE_COMBINE_RECV, smem);
  /* f.reduce_present, f.reduce_pulled, f.reduce_wgrad (backward): [EPF_MASK_WORDS] each; f.rslots:
   * the dispatch's per-rank slot table of this round (pull) */
  float* const wg_out = bwd ? a->topk_weights_grad : NULL;
  const int is64 = epf_ll_index_is64(a->index_type);
  const int nchunks = (f.H + EPF_LL_UNIT_ELEMS - 1) / EPF_LL_UNIT_ELEMS;
  const int64_t units = (int64_t)f.T * nchunks;
  const bool mx = plan->combine_payload == EPF_PAYLOAD_MXFP8;
  /* peers pull only with BF16 both ways (the plan is the same on every rank) */
  const bool can_pull = !mx && plan->payload == EPF_PAYLOAD_BF16;
  const bool early_slots = epf_ll_combine_pulls(plan, a->y_layout) && f.T > 0;
  epf_status_t mine = EPF_OK, res;
  bool any_pull = false;
  int64_t u;
  int i;

  for (i = (int)threadIdx.x; i < EPF_MASK_WORDS; i += (int)blockDim.x) {
    f.reduce_present[i] = 0u;
    f.reduce_pulled[i] = 0u;
    if (bwd) f.reduce_wgrad[i] = 0u;
  }
  if (early_slots) /* block-uniform */
    epf_ll_rm_slots_block(plan, a->topk_idx, a->index_type, f.T, f.rslots);
  __syncthreads();
  for (i = (int)threadIdx.x; i < f.R; i += (int)blockDim.x) {
    const uint64_t off =
        epf_plan_signal_offset(plan, EPF_REGION_SIG_LL_COMBINE, epf_ll_combine_signal_index(plan, f.epoch, i));
    uint32_t v = 0u;
    const epf_status_t st = epf_signal_wait_sys((const uint64_t*)epf_local_ptr(f.team, off), f.epoch, f.w, i, &v);
    if (st == EPF_OK) {
      atomicOr(&f.reduce_present[i >> 5], 1u << (i & 31));
      if (can_pull && (v & EPF__LL_COMBINE_PULL) != 0u) atomicOr(&f.reduce_pulled[i >> 5], 1u << (i & 31));
      if (bwd && (v & EPF__LL_COMBINE_WGRAD) != 0u) atomicOr(&f.reduce_wgrad[i >> 5], 1u << (i & 31));
    } else if (mine == EPF_OK) {
      mine = st;
    }
  }
  res = epf__block_status(mine); /* __syncthreads: present[] / pulled[] complete, rows acquired */
  for (i = 0; i < EPF_MASK_WORDS; ++i) any_pull = any_pull || f.reduce_pulled[i] != 0u; /* block-uniform */
  if (any_pull && !early_slots && f.T > 0)
    epf_ll_rm_slots_block(plan, a->topk_idx, a->index_type, f.T, f.rslots);

  for (u = (int64_t)ctx.block * f.nwarps + f.warp; u < units; u += (int64_t)ctx.nblocks * f.nwarps) {
    const int t = (int)(u / nchunks), c = (int)(u - (int64_t)t * nchunks);
    const int col = c * EPF_LL_UNIT_ELEMS + f.lane * 8;
    const bool on = col < f.H;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    int first_k = f.lane;
    const int e = f.lane < f.K ? epf__ll_route(a->topk_idx, is64, t, f.lane, f.K, f.E, &first_k) : -1;
    const int d = e >= 0 ? e / f.EL : -1;
    /* the lowest lane of each rank is its first occurrence in k: the partials in that order */
    const uint32_t same = __match_any_sync(0xffffffffu, d >= 0 ? d : -1 - f.lane);
    const char* src = NULL;
    char* wsrc = NULL; /* backward: where the gradients of the token's entries on d wait (lead lane) */
    if (d >= 0 && __ffs((int)same) - 1 == f.lane && epf__ll_active(f.reduce_present, d)) {
      const bool wg_here = bwd && wg_out != NULL && c == 0 && epf__ll_active(f.reduce_wgrad, d);
      if (!epf__ll_active(f.reduce_pulled, d)) { /* pushed into this rank's COMBINE rows */
        src = (const char*)epf_local_ptr(f.team, epf_plan_combine_offset(plan, epf_ll_rm_combine_row(plan, f.epoch, t, d)));
        if (wg_here) wsrc = (char*)epf_local_ptr(f.team, epf_plan_combine_offset(plan, epf_ll_rm_weight_grad_row(plan, f.epoch, t, d)));
      } else { /* pull: the copy's receive row at d, slot rebuilt as the dispatch send computed it */
        int sd;
        const uint32_t slot = epf_ll_rm_slot(plan, f.rslots, t * f.K + f.lane, &sd);
        if (slot != EPF_LL_SLOT_NONE && sd == d && slot < (uint32_t)f.Tmax) {
          src = (const char*)epf_peer_ptr(f.team, epf_plan_recv_token_offset(plan, epf_ll_rm_recv_row(plan, f.epoch, f.rank, (int)slot)), d);
          if (wg_here) /* the row's metadata at d: entry j's weight field (epf_combine_weight_grad_ptr) */
            wsrc = (char*)epf_peer_ptr(f.team, epf_plan_recv_meta_offset(plan, epf_ll_rm_recv_row(plan, f.epoch, f.rank, (int)slot)), d);
        }
      }
    }
    if (bwd && wg_out != NULL && c == 0) { /* warp-uniform: entry j of (t, d) = this k's rank among the token's k on d */
      const int j = __popc(same & ((1u << f.lane) - 1u));
      char* wb = (char*)epf__ll_shfl_ptr(wsrc, __ffs((int)same) - 1);
      if (f.lane < f.K) {
        float g = 0.0f;
        if (d >= 0 && wb != NULL)
          g = epf__ll_active(f.reduce_pulled, d) ? *(const float*)(wb + epf_recv_meta_rm_weight_at(f.K, j)) : ((const float*)wb)[j];
        wg_out[(int64_t)t * f.K + f.lane] = g;
      }
    }
    epf__ll_rm_reduce_chunk_warp(src, 1.0f, __ballot_sync(0xffffffffu, src != NULL), col, on, mx, f.H, false, acc);
    if (on) epf_st_v4_u32((char*)a->out + ((int64_t)t * f.H + col) * 2, epf_bf16x8_from_f32(acc));
  }

  if (epf_ll_phase_end_block(ctx, EPF_LL_PHASE_COMBINE_RECV))
    epf_ll_phase_commit_block(ctx, EPF_LL_PHASE_COMBINE_RECV, f.epoch);
  return res;
}

EPF_END_DECLS

#endif /* EPF_LL_IMPL_COMBINE_RM_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
