/* epfuse/ll/impl/combine.cuh — low-latency combine: push half and reduce half as block functions — part of epfuse v0.1
 *
 * What it is: the way back of LL EP. The expert rank pushes each output row to its source (or,
 * with EPF_LL_Y_IN_PLACE_PULL, lets the source read it where it is; with an MXFP8 combine payload
 * it quantizes the row into its own window for the source to read: the default); the source
 * weights and reduces in FP32 in k order, bitwise deterministic. epf_ll_combine_pulls says which.
 *   SEND (epf_ll_combine_send_block; never waits): for every row the dispatch receive of this
 *     round counted (recv_counts), one warp per (row, EPF_LL_SEND_CHUNKS 256-element chunks)
 *     reads the expert output (a caller buffer in the FIXED or PACKED order, or IN_PLACE over the
 *     receive rows) and stores it into row epf_ll_combine_row(plan, epoch, src_token, k) of the
 *     SOURCE's COMBINE region (src_token and k come from the row's metadata). The last block of
 *     the rank to finish release-stores (epoch, 0) into SIG_LL_COMBINE[parity][rank] of every
 *     active source — also of sources it had no rows for, so every source can wait for every rank.
 *     PULL (y_layout EPF_LL_Y_IN_PLACE_PULL, BF16 combine payload): nothing is moved; the last
 *     block publishes (epoch, EPF__LL_COMBINE_PULL) instead: "my outputs are in my receive rows".
 *     MXFP8 PULL (MXFP8 combine payload and a plan with an EXPERT_OUT region: every LL
 *     expert-major plan without EPF_FLAG_COMBINE_PUSH; any y_layout): the same units as the push,
 *     but each quantized row goes to THIS rank's EXPERT_OUT row epf_plan_expert_out_offset(plan,
 *     receive row of this round), where the source will read it; then (epoch, EPF__LL_COMBINE_PULL).
 *   RECV (epf_ll_combine_recv_block; bounded waits): every block waits for the combine signal of
 *     every rank; for ranks that signalled PULL it rebuilds the dispatch's slot table from
 *     topk_idx (epf_ll_slots_block, the same pass as the dispatch send), so (token, k) -> the expert
 *     rank's receive row epf_ll_recv_row(plan, c, le, rank, slot) (BF16: RECV_TOKENS; MXFP8: that
 *     row of EXPERT_OUT); then one warp per (token,
 *     256-element chunk) computes
 *       out[t][h] = BF16_RNE( fma(w_{k_n}, y_{k_n}[h], ... fma(w_{k_0}, y_{k_0}[h], 0.0f)) )
 *     over the token's present entries k_0 < k_1 < ... (acc starts at +0.0f; one rounding per
 *     fma; BF16 -> FP32 is exact). An entry is present when its expert id is in [0, E) and its
 *     rank signalled this round. A repeated expert id of a token reads the output of its first
 *     occurrence (the dispatch sent it once) with its own weight. Pushed or pulled, the rows hold
 *     the same bytes and are summed in the same order: the two transports give identical bits.
 *   Pull and the buffers: the expert rank's receive rows of round c are next written by the
 *     dispatch send of round c + 2 of some source, which follows that source's combine of round
 *     c + 1, which waited for this expert rank's combine send of c + 1, which follows its dispatch
 *     receive of c + 1, which waited for every source's dispatch send of c + 1 — each after that
 *     source finished reading round c. So the rows a source pulls are stable while it reads them
 *     (the same argument as for the landing rows; docs/low-latency.md).
 *   MXFP8 on the way back (plan.combine_payload): the expert side quantizes each 32-element group
 *     of y (quant/quant.cuh lane8 block; landing row = hidden E4M3 bytes, then hidden / 32 scale
 *     bytes, epf_combine_row_scale_at), the source uses y = dequantize (exact in FP32) and the
 *     same fma chain (epf_mxfp8_dequantize_accumulate8 = epf_mxfp8_dequantize_accumulate_ref).
 *     Pushed into the source's COMBINE row or pulled from the expert rank's EXPERT_OUT row, the
 *     bytes and the order are the same: pull and push give identical bits here too. The
 *     EXPERT_OUT rows of round c are next written by this rank's combine send of c + 2, which
 *     follows its dispatch receive of c + 2, which waited for every source's dispatch send of
 *     c + 2 — each after that source's combine of c (the same argument as above).
 *
 * What masked / late ranks become: the contribution of every expert on a rank that is masked or
 * did not signal in time is ZERO (skipped in the sum, so it cannot inject NaN or stale data); a
 * token whose every entry is absent, -1 or dropped gets a row of +0.0 BF16. Rows [0, num_tokens)
 * of `out` are always written; rows beyond are untouched.
 *
 * What it does NOT do: run the experts, allocate or launch, or combine a RANK_MAJOR plan
 * (ll/impl/combine_rm.cuh does).
 *
 * Usage (ll/kernels.cuh: epf_ll_combine_kernel):
 *   epf_ll_combine_send_block(&plan, ctx, &cargs, smem);   // expert side, after the experts ran
 *   __syncthreads();
 *   epf_ll_combine_recv_block(&plan, ctx, &cargs, smem);   // source side
 *
 * COMPILE-TIME OPTIONS: EPF_LL_SEND_CHUNKS (4: 256-element chunks per push unit),
 *   EPF_LL_COMBINE_BATCH (8: rows in flight per lane in the reduce). Performance only.
 *
 * Contents:
 *   bool         epf_ll_combine_payload_supported(int payload)                           [EPF_HD]
 *   bool         epf_ll_combine_pulls(const epf_plan_t*, int y_layout)                   [EPF_HD]
 *   void         epf_ll_combine_send_block(const epf_plan_t*, epf_ll_ctx_t, const epf_ll_combine_args_t*, void* smem)
 *   epf_status_t epf_ll_combine_recv_block(const epf_plan_t*, epf_ll_ctx_t, const epf_ll_combine_args_t*, void* smem)
 *   void         epf_ll_dispatch_backward_send_block(const epf_plan_t*, epf_ll_ctx_t, const epf_ll_combine_args_t*, void* smem)
 *   epf_status_t epf_ll_dispatch_backward_recv_block(const epf_plan_t*, epf_ll_ctx_t, const epf_ll_combine_args_t*, void* smem)
 *
 * Requirements: CUDA, sm_80+ (BF16 conversions); compiled for sm_90 / sm_100 (-Werror); tested on
 *   an H200 (sm_90), push and pull, the MXFP8 pull included (test_ll, test_shapes); its multi-GPU
 *   test (test_mg_ll) needs two GPUs and has not run.
 */
#ifndef EPF_LL_IMPL_COMBINE_CUH
#define EPF_LL_IMPL_COMBINE_CUH

#include "../../core/bf16.cuh"
#include "../../config.h"
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

EPF_HD bool epf_ll_combine_payload_supported(int payload) {
  return payload == EPF_PAYLOAD_BF16 || payload == EPF_PAYLOAD_MXFP8;
}

EPF_HD bool epf_ll_combine_pulls(const epf_plan_t* plan, int y_layout) {
  if (EPF__HOST_CHECK(plan == NULL)) return false;
  if (plan->layout == EPF_LAYOUT_RANK_MAJOR) /* ll/impl/combine_rm.cuh: no EXPERT_OUT region */
    return y_layout == EPF_LL_Y_PACKED_PULL && plan->payload == EPF_PAYLOAD_BF16 &&
           plan->combine_payload == EPF_PAYLOAD_BF16;
  if (plan->combine_payload == EPF_PAYLOAD_MXFP8) return plan->region[EPF_REGION_EXPERT_OUT].bytes != 0;
  return y_layout == EPF_LL_Y_IN_PLACE_PULL && plan->combine_payload == EPF_PAYLOAD_BF16;
}

/* Value half of a combine signal word: 0 = the peer pushed its outputs into this rank's COMBINE
 * rows; EPF__LL_COMBINE_PULL = read them from the peer's window: its receive rows
 * (EPF_LL_Y_IN_PLACE_PULL, BF16) or its EXPERT_OUT rows (MXFP8 combine payload). */
#define EPF__LL_COMBINE_PULL 1u
/* Bit of a combine signal word's value half, backward of dispatch only: the peer carried the
 * router-weight gradients of its rows (pushed: epf_ll_weight_grad_row; pulled: the weight field of
 * its receive rows' metadata). Without it the source writes 0 for that peer's entries. */
#define EPF__LL_COMBINE_WGRAD 2u



/* epf__ll_combine_publish_block — the end of a combine send round (the sends of ll/impl/combine.cuh and
 *   ll/impl/combine_rm.cuh): every block arrives; the last one signals (epoch, value) into this rank's
 *   SIG_LL_COMBINE word of every rank active in mask (no rank when !ok_round), then sets
 *   state.epoch[COMBINE_SEND] = epoch.
 *   Scope:    [collective:block] [uniform-args]: every thread of each of the ctx.nblocks blocks of
 *             the rank, once per round, after the block's last store of the round.
 *   Input:    mask = the block's snapshot (epf__ll_snapshot_mask_block, less the sources whose
 *             dispatch was missed); value = the value half of the word: EPF__LL_COMBINE_PULL and /
 *             or EPF__LL_COMBINE_WGRAD, or 0 (pushed).
 *   Memory:   what every block stored happens before the .sys release of the signal words
 *             (epf_ll_phase_end_block). Blocking: no. */
EPF_DEVICE_INLINE void epf__ll_combine_signal_block(const epf_plan_t* plan, epf_ll_ctx_t ctx, const uint32_t* mask,
                                                    uint32_t epoch, bool ok_round, uint32_t value) {
  const epf_team_t team = ctx.team;
  const int R = team.nranks, rank = team.rank;
  int g;
  for (g = (int)threadIdx.x; g < R && ok_round; g += (int)blockDim.x) {
    if (!epf__ll_active(mask, g)) continue;
    epf_signal_set_sys((uint64_t*)epf_peer_ptr(team,
                                               epf_plan_signal_offset(plan, EPF_REGION_SIG_LL_COMBINE,
                                                                      epf_ll_combine_signal_index(plan, epoch, rank)),
                                               g),
                       epoch, value);
  }
}

EPF_DEVICE_INLINE void epf__ll_combine_publish_block(const epf_plan_t* plan, epf_ll_ctx_t ctx, const uint32_t* mask,
                                                     uint32_t epoch, bool ok_round, uint32_t value) {
  if (epf_ll_phase_end_block(ctx, EPF_LL_PHASE_COMBINE_SEND)) {
    epf__ll_combine_signal_block(plan, ctx, mask, epoch, ok_round, value);
    epf_ll_phase_commit_block(ctx, EPF_LL_PHASE_COMBINE_SEND, epoch);
  }
}

/* epf__ll_combine_send_src — the y row a combine send reads for receive row (le, s, j) = wrow:
 * the receive row itself (IN_PLACE*), or row epf_ll_packed_row / epf_ll_fixed_row of a->y. Any
 * thread; in bounds for every j below the clamped count, whatever the row's metadata says. */
EPF_DEVICE_INLINE const char* epf__ll_combine_send_src(const epf_plan_t* plan, epf_team_t team,
                                                       const epf_ll_combine_args_t* a, bool in_place,
                                                       const uint32_t* pre, int gi, int le, int s, int j,
                                                       int64_t wrow) {
  const int64_t H = plan->hidden;
  if (in_place) return (const char*)epf_local_ptr(team, epf_plan_recv_token_offset(plan, wrow));
  if (a->y_layout == EPF_LL_Y_PACKED)
    return (const char*)a->y + epf_ll_packed_row(plan, le, (int)(pre[gi] - pre[le * plan->nranks]) + j) * H * 2;
  return (const char*)a->y + epf_ll_fixed_row(plan, le, s, j) * H * 2;
}

/* epf__ll_send_chunks_load — a lane's 16 bytes of EPF_LL_SEND_CHUNKS 256-element chunks from chunk
 * c0 of BF16 row src (zeros past hidden H); plain loads when the row is in this launch's window
 * (in_place), else non-coherent ones. Any lane. */
EPF_DEVICE_INLINE void epf__ll_send_chunks_load(uint4* v, const char* src, int c0, int H, bool in_place) {
  const int lane = epf_lane_id();
  int ci;
#pragma unroll
  for (ci = 0; ci < EPF_LL_SEND_CHUNKS; ++ci) {
    const int col = (c0 + ci) * EPF_LL_UNIT_ELEMS + lane * 8;
    v[ci] = make_uint4(0u, 0u, 0u, 0u);
    if (col < H) v[ci] = in_place ? epf_ld_v4_u32(src + (int64_t)col * 2) : epf_ld_nc_v4_u32(src + (int64_t)col * 2);
  }
}

/* the body of the two send blocks below (defined after them) */
EPF_DEVICE_INLINE void epf__ll_combine_send(const epf_plan_t* plan, epf_ll_ctx_t ctx, const epf_ll_combine_args_t* a,
                                            void* smem, bool bwd);

EPF_DEVICE_INLINE void epf_ll_combine_send_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                 const epf_ll_combine_args_t* a, void* smem) {
  epf__ll_combine_send(plan, ctx, a, smem, false);
}

EPF_DEVICE_INLINE void epf_ll_dispatch_backward_send_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                           const epf_ll_combine_args_t* a, void* smem) {
  epf__ll_combine_send(plan, ctx, a, smem, true);
}

/* (the body is epf__ll_combine_send, shared with epf_ll_dispatch_backward_send_block: bwd = true
 * also carries a->weight_grad; every caller passes a constant. A BF16 pull round moves nothing
 * here, yet it signals from the last block to arrive: in a fused kernel other blocks may still be
 * writing the rows the sources will pull.) */
EPF_DEVICE_INLINE void epf__ll_combine_send(const epf_plan_t* plan, epf_ll_ctx_t ctx, const epf_ll_combine_args_t* a,
                                            void* smem, bool bwd) {
  EPF__LL_FRAME_MAKE(f, plan, ctx, a->num_tokens, EPF_LL_PHASE_COMBINE_SEND, smem);
  const bool in_place = a->y_layout == EPF_LL_Y_IN_PLACE || a->y_layout == EPF_LL_Y_IN_PLACE_PULL;
  const bool ok_round = f.dispatch_round == f.epoch && a->recv_counts != NULL && (a->y != NULL || in_place) &&
                        (!in_place || plan->payload == EPF_PAYLOAD_BF16) &&
                        (a->y_layout == EPF_LL_Y_FIXED || a->y_layout == EPF_LL_Y_PACKED || in_place);
  /* pull: the sources read the outputs from this rank's window: BF16 from the receive rows (nothing
   * to move), MXFP8 from EXPERT_OUT (quantized below, into this rank's own window) */
  const bool pull = epf_ll_combine_pulls(plan, a->y_layout);
  uint32_t* pre = f.push_prefix; /* [E + 1], group g = le * R + src */
  const int nchunks = (f.H + EPF_LL_UNIT_ELEMS - 1) / EPF_LL_UNIT_ELEMS;
  const int ngroups = (nchunks + EPF_LL_SEND_CHUNKS - 1) / EPF_LL_SEND_CHUNKS;
  const bool mx = plan->combine_payload == EPF_PAYLOAD_MXFP8;
  const int mx_rule = epf_mx_rule_from_flags(plan->flags);
  /* backward: this rank carries the router-weight gradients of its rows */
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
  if (!pull || mx || wgrad) { /* block-uniform */
    for (g = (int)threadIdx.x; g < f.E; g += (int)blockDim.x) {
      const int s = g % f.R;
      int32_t n = ok_round && epf__ll_active(f.mask, s) ? a->recv_counts[g] : 0;
      pre[g] = (uint32_t)(n < 0 ? 0 : (n > f.Tmax ? f.Tmax : n));
    }
    epf__ll_scan_block(pre, f.E, f.scan);
    units = pull && !mx ? 0 : (int64_t)pre[f.E] * ngroups;
  } else {
    units = 0;
  }
  if (wgrad && pull) { /* the sources read each row's gradient from the weight field of its metadata */
    for (u = (int64_t)ctx.block * blockDim.x + threadIdx.x; u < (int64_t)pre[f.E]; u += (int64_t)ctx.nblocks * blockDim.x) {
      const uint32_t r = (uint32_t)u;
      const int gi = epf__ll_find_group(pre, f.E, r);
      const int le = gi / f.R, s = gi - le * f.R, j = (int)(r - pre[gi]);
      epf_recv_meta_em_t* m =
          (epf_recv_meta_em_t*)epf_local_ptr(f.team, epf_plan_recv_meta_offset(plan, epf_ll_recv_row(plan, f.epoch, le, s, j)));
      m->weight = a->weight_grad[epf_ll_fixed_row(plan, le, s, j)];
    }
  }

  /* one unit = (row, group of EPF_LL_SEND_CHUNKS 256-element chunks): one metadata load per
   * group, then all the group's loads in flight before its stores */
  for (u = (int64_t)ctx.block * f.nwarps + f.warp; u < units; u += (int64_t)ctx.nblocks * f.nwarps) {
    const uint32_t r = (uint32_t)(u / ngroups);
    const int c0 = (int)(u - (int64_t)r * ngroups) * EPF_LL_SEND_CHUNKS;
    const int gi = epf__ll_find_group(pre, f.E, r);
    const int le = gi / f.R, s = gi - le * f.R;
    const int j = (int)(r - pre[gi]);
    const int64_t wrow = epf_ll_recv_row(plan, f.epoch, le, s, j); /* this round's receive row */
    union {
      uint4 v;
      epf_recv_meta_em_t m;
    } meta; /* one 16-byte load of the row's epf_recv_meta_em_t */
    int t, src_rank, k;
    const char* src;
    char* dst;
    uint4 v[EPF_LL_SEND_CHUNKS];
    int ci;
    meta.v = epf_ld_v4_u32(epf_local_ptr(f.team, epf_plan_recv_meta_offset(plan, wrow)));
    t = meta.m.src_token;
    src_rank = meta.m.src_rank;
    k = meta.m.k;
    if (t < 0 || t >= f.Tmax || k < 0 || k >= f.K || src_rank != s) continue; /* warp-uniform */
    src = epf__ll_combine_send_src(plan, f.team, a, in_place, pre, gi, le, s, j, wrow);
    dst = pull ? (char*)epf_local_ptr(f.team, epf_plan_expert_out_offset(plan, wrow)) /* MXFP8 pull */
               : (char*)epf_peer_ptr(f.team, epf_plan_combine_offset(plan, epf_ll_combine_row(plan, f.epoch, t, k)), s);
    if (wgrad && c0 == 0 && f.lane == 0) { /* the row's gradient, into the other parity's landing row */
      const int64_t yrow = a->y_layout == EPF_LL_Y_PACKED ? epf_ll_packed_row(plan, le, (int)(pre[gi] - pre[le * f.R]) + j)
                                                          : epf_ll_fixed_row(plan, le, s, j);
      *(float*)epf_peer_ptr(f.team, epf_plan_combine_offset(plan, epf_ll_weight_grad_row(plan, f.epoch, t, k)), s) =
          a->weight_grad[yrow];
    }
    epf__ll_send_chunks_load(v, src, c0, f.H, in_place);
#pragma unroll
    for (ci = 0; ci < EPF_LL_SEND_CHUNKS; ++ci) {
      const int col = (c0 + ci) * EPF_LL_UNIT_ELEMS + f.lane * 8;
      if (!mx) {
        if (col < f.H) epf_st_v4_u32(dst + (int64_t)col * 2, v[ci]);
      } else if (c0 + ci < nchunks) { /* warp-uniform; landing row: hidden E4M3 bytes, then hidden / 32 E8M0 bytes */
        uint8_t sb = 0;
        const uint2 q = epf_mxfp8_quantize_lane8_bf16_warp(v[ci], mx_rule, &sb); /* all lanes, converged */
        if (col < f.H) {
          *(uint2*)(dst + col) = q;
          if ((f.lane & 3) == 0) ((uint8_t*)dst)[epf_combine_row_scale_at(f.H, col)] = sb;
        }
      }
    }
  }

  epf__ll_combine_publish_block(plan, ctx, f.mask, f.epoch, ok_round,
                                (pull ? EPF__LL_COMBINE_PULL : 0u) | (wgrad ? EPF__LL_COMBINE_WGRAD : 0u));
}

/* the body of the two receive blocks below (defined after them) */
EPF_DEVICE_INLINE epf_status_t epf__ll_combine_recv(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                    const epf_ll_combine_args_t* a, void* smem, bool bwd);

EPF_DEVICE_INLINE epf_status_t epf_ll_combine_recv_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                         const epf_ll_combine_args_t* a, void* smem) {
  return epf__ll_combine_recv(plan, ctx, a, smem, false);
}

EPF_DEVICE_INLINE epf_status_t epf_ll_dispatch_backward_recv_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                                   const epf_ll_combine_args_t* a, void* smem) {
  return epf__ll_combine_recv(plan, ctx, a, smem, true);
}

/* (the body is epf__ll_combine_recv, shared with epf_ll_dispatch_backward_recv_block: bwd = true
 * sums with unit weights over first occurrences and writes a->topk_weights_grad; every caller
 * passes a constant) */
EPF_DEVICE_INLINE epf_status_t epf__ll_combine_recv(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                    const epf_ll_combine_args_t* a, void* smem, bool bwd) {
  EPF__LL_FRAME_MAKE(f, plan, ctx, a->num_tokens, EPF_LL_PHASE_COMBINE_RECV, smem);
  /* f.reduce_present, f.reduce_pulled, f.reduce_wgrad (backward): [EPF_MASK_WORDS] each; f.slots: the
   * dispatch's slot table of this round (pull) */
  float* const wg_out = bwd ? a->topk_weights_grad : NULL;
  const int nchunks = (f.H + EPF_LL_UNIT_ELEMS - 1) / EPF_LL_UNIT_ELEMS;
  const int64_t units = (int64_t)f.T * nchunks;
  const bool mx = plan->combine_payload == EPF_PAYLOAD_MXFP8;
  /* an MXFP8 plan lets the peers pull iff it has EXPERT_OUT (the plan is the same on every rank) */
  const bool can_pull = !mx || epf_ll_combine_pulls(plan, a->y_layout);
  /* the slot table is built before the waits when the peers will likely let this rank pull: then
   * the routes come from it, not from topk_idx */
  const bool early_slots = f.T > 0 && epf_ll_combine_pulls(plan, a->y_layout);
  epf_status_t mine = EPF_OK, res;
  bool any_pull = false;
  int u;
  int i;

  for (i = (int)threadIdx.x; i < EPF_MASK_WORDS; i += (int)blockDim.x) {
    f.reduce_present[i] = 0u;
    f.reduce_pulled[i] = 0u;
    if (bwd) f.reduce_wgrad[i] = 0u;
  }
  if (early_slots) /* block-uniform; dropped ids were counted by the dispatch send */
    epf_ll_slots_block(plan, a->topk_idx, a->index_type, f.T, f.slots, NULL);
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
  if (any_pull && !early_slots && f.T > 0) /* a peer lets this rank pull although it did not expect it */
    epf_ll_slots_block(plan, a->topk_idx, a->index_type, f.T, f.slots, NULL);
  /* with the slot table built, the routes come from it (shared memory) instead of topk_idx */
  const bool table = early_slots || (any_pull && f.T > 0);

  /* Each warp walks one contiguous range of (token, chunk) units, so consecutive units share their
   * token: with K <= 32 (one lane per k) the lane's route of the token (its source row and weight)
   * is worked out once, kept in the lane's 16-byte slot of shared memory and read back for the
   * token's other chunks in the range. A warp always works the route out at a token's chunk 0 (its
   * range starts there, or its previous unit was another token's), where the router-weight
   * gradient is written. */
  const int64_t gw = (int64_t)ctx.block * f.nwarps + f.warp, nw = (int64_t)ctx.nblocks * f.nwarps;
  const int u_end = (int)(units * (gw + 1) / nw); /* units <= 2^16 tokens x 2^12 chunks */
  uint4* const route = (uint4*)((char*)smem + f.sl.reduce_route) + threadIdx.x; /* this lane's slot */
  bool kept = false; /* the slot holds the previous unit's token (K <= 32) */
  for (u = (int)(units * gw / nw); u < u_end; ++u) {
    const int t = u / nchunks, c = u - t * nchunks;
    const int col = c * EPF_LL_UNIT_ELEMS + f.lane * 8;
    const bool on = col < f.H;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    int kb;
    for (kb = 0; kb < f.K && (EPF_MAX_TOPK > 32 || kb == 0); kb += 32) { /* K <= EPF_MAX_TOPK (plan) */
      const char* src = NULL;
      float wk = 0.f;
      uint32_t m;
      if (f.K <= 32 && kept && c != 0) { /* warp-uniform: the previous unit was (t, c - 1) */
        const uint4 r = *route;
        src = (const char*)(uintptr_t)(((uint64_t)r.y << 32) | r.x);
        wk = __uint_as_float(r.z);
      } else {
        const int k = kb + f.lane;
        /* the weight's load is issued with the route's, not after it */
        const float wt = !bwd && a->topk_weights != NULL && k < f.K ? a->topk_weights[(int64_t)t * f.K + k] : 1.0f;
        if (k < f.K) {
          int first_k;
          const int e = table ? epf__ll_slot_route(f.slots, t * f.K + k, k, &first_k)
                              : epf__ll_route(a->topk_idx, epf_ll_index_is64(a->index_type), t, k, f.K, f.E, &first_k);
          const int d = e >= 0 ? e / f.EL : 0;
          float wg = 0.f; /* backward: the router-weight gradient of (t, k) */
          if (e >= 0 && epf__ll_active(f.reduce_present, d)) {
            if (!epf__ll_active(f.reduce_pulled, d)) { /* pushed into this rank's COMBINE rows */
              src = (const char*)epf_local_ptr(f.team,
                                               epf_plan_combine_offset(plan, epf_ll_combine_row(plan, f.epoch, t, first_k)));
              if (wg_out != NULL && c == 0 && epf__ll_active(f.reduce_wgrad, d))
                wg = *(const float*)epf_local_ptr(
                    f.team, epf_plan_combine_offset(plan, epf_ll_weight_grad_row(plan, f.epoch, t, first_k)));
            } else { /* pull: the dispatch slot of (t, first_k) in d's receive rows (MXFP8: EXPERT_OUT) */
              int se;
              const uint32_t slot = epf_ll_slot(plan, f.slots, t * f.K + first_k, &se);
              if (slot != EPF_LL_SLOT_NONE && se == e && slot < (uint32_t)f.Tmax) {
                const int64_t rr = epf_ll_recv_row(plan, f.epoch, e - d * f.EL, f.rank, (int)slot);
                src = (const char*)epf_peer_ptr(
                    f.team, mx ? epf_plan_expert_out_offset(plan, rr) : epf_plan_recv_token_offset(plan, rr), d);
                if (wg_out != NULL && c == 0 && epf__ll_active(f.reduce_wgrad, d))
                  wg = ((const epf_recv_meta_em_t*)epf_peer_ptr(f.team, epf_plan_recv_meta_offset(plan, rr), d))->weight;
              }
            }
            if (bwd && first_k != k) src = NULL; /* a repeat: its gradient is in the first occurrence's row */
            if (src != NULL) wk = wt;
          }
          if (wg_out != NULL && c == 0) wg_out[(int64_t)t * f.K + k] = wg;
        }
        if (f.K <= 32) {
          *route = make_uint4((uint32_t)(uintptr_t)src, (uint32_t)((uint64_t)(uintptr_t)src >> 32), __float_as_uint(wk), 0u);
          kept = true;
        }
      }
      m = __ballot_sync(0xffffffffu, src != NULL);
      while (m != 0u) { /* batches of up to EPF_LL_COMBINE_BATCH rows: loads first, fmas in k order */
        uint4 v[EPF_LL_COMBINE_BATCH];
        uint32_t mf = m; /* the batch's rows again, for the weights of the fma pass */
        int n = 0, b;
#pragma unroll
        for (b = 0; b < EPF_LL_COMBINE_BATCH; ++b) {
          v[b] = make_uint4(0u, 0u, 0u, 0u);
          if (m != 0u) { /* warp-uniform */
            const int j = __ffs((int)m) - 1;
            const char* sj = (const char*)epf__ll_shfl_ptr((void*)src, j);
            m &= m - 1u;
            if (on) {
              if (!mx) {
                v[b] = epf_ld_v4_u32(sj + (int64_t)col * 2);
              } else { /* x, y: the 8 E4M3 bytes; z: the group's E8M0 byte */
                const uint2 q = *(const uint2*)(sj + col);
                v[b] = make_uint4(q.x, q.y, (uint32_t)((const uint8_t*)sj)[epf_combine_row_scale_at(f.H, col)], 0u);
              }
            }
            n = b + 1;
          }
        }
#pragma unroll
        for (b = 0; b < EPF_LL_COMBINE_BATCH; ++b) {
          float wb;
          if (b >= n) continue;
          wb = __shfl_sync(0xffffffffu, wk, __ffs((int)mf) - 1);
          mf &= mf - 1u;
          if (!mx)
            epf_bf16x8_fma(acc, v[b], wb);
          else
            epf_mxfp8_dequantize_accumulate8(make_uint2(v[b].x, v[b].y), (uint8_t)v[b].z, wb, acc);
        }
      }
    }
    if (on) epf_st_v4_u32((char*)a->out + ((int64_t)t * f.H + col) * 2, epf_bf16x8_from_f32(acc));
  }

  if (epf_ll_phase_end_block(ctx, EPF_LL_PHASE_COMBINE_RECV))
    epf_ll_phase_commit_block(ctx, EPF_LL_PHASE_COMBINE_RECV, f.epoch);
  return res;
}

EPF_END_DECLS

#endif /* EPF_LL_IMPL_COMBINE_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
