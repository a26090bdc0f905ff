/* epfuse/ll/impl/dispatch.cuh — low-latency dispatch: send half and receive half as block functions — part of epfuse v0.1
 *
 * What it is: decode-time dispatch into the FIXED LL layout (ll/ll.cuh): no count exchange, no
 * second copy, deterministic order, CUDA-graph friendly.
 *   SEND (epf_ll_dispatch_send_block; never waits):
 *     1. every block of the rank computes, from topk_idx alone, the slot of every (token, k) pair
 *        (epf_ll_slots_block, ll/ll.cuh): its rank among this source's pairs routed to the same
 *        expert, in (token, k) order (match_any inside warps + per-segment histograms scanned over
 *        segments) — the same on every run, so received rows [0, count) of (expert, source) are
 *        packed in token order;
 *     2. one warp per (token, 256-element chunk) reads the chunk once (16 bytes per lane),
 *        quantizes it once if the payload asks (MXFP8: E4M3 + one E8M0 byte per 32, rule RCEIL or
 *        FLOOR by EPF_FLAG_MX_SCALE_FLOOR; per-128 FP8: E4M3 + one FP32 scale per 128, UE8M0 by
 *        EPF_FLAG_SCALE_UE8M0 — quant/quant.cuh's lane8 blocks, bit-identical to its scalar
 *        references) and stores it into the slot of every destination, with the compact scales
 *        beside it in RECV_SCALES and a metadata row (src_token, src_rank, k, local_expert,
 *        weight);
 *     3. the last block of the rank to finish (epf_arrive_last_block) release-stores one signal
 *        word per (destination, local expert): (epoch << 32) | rows, into
 *        SIG_LL_DISPATCH[parity][le][rank] of the destination, and advances the state's epoch.
 *   RECV (epf_ll_dispatch_recv_block; bounded waits):
 *     block b of the rank waits for the signal words of its local experts (le = b, b + nblocks,
 *     ...) from every source, writes the row counts ([EL][R] and per expert: DeepEP's masked_m)
 *     and, if asked, copies the rows into a packed per-expert layout (rows of source 0, then 1,
 *     ...) with their metadata and scales. Without the packed copy it is ZERO COPY: the rows stay
 *     in the window at epf_ll_recv_row(plan, round, le, src, slot), slot < count.
 *   The two halves are independent: run them in one launch (co-resident blocks) or in two launches
 *   with other work in between (NCCL EP's send_only + complete, DeepEP's receive hook).
 *
 * Semantics worth knowing:
 *   - topk_idx -1 = not routed. Ids outside [-1, E) are dropped and counted
 *     (record->dropped_routes, once per rank). A token that names the same expert twice is sent
 *     ONCE, with the first k; the combine weights every occurrence with that one output.
 *   - So a source sends at most T rows per (expert): no overflow is possible.
 *   - Fault tolerance (EPF_FLAG_FAULT_TOLERANT): nothing is sent to a masked destination; a masked
 *     or late source (timeout -> masked) counts 0 rows. Without the flag a late source times out
 *     (recorded), counts 0 rows for this round, and is waited for again next round.
 *
 * Scales: the window always holds COMPACT scales ([row][hidden / group]); with
 * EPF_SCALE_LAYOUT_SWIZZLED_128X4 (MXFP8) the packed copy writes them swizzled, row = packed row
 * (each expert's segment of R * T rows starts a new 128-row atom when R * T % 128 == 0).
 *
 * What it does NOT do: allocate, launch, or run a RANK_MAJOR plan (ll/impl/dispatch_rm.cuh does; the
 * launchers of ll/kernels.cuh pick by plan.layout).
 *
 * Usage (ll/kernels.cuh: epf_ll_dispatch_kernel is exactly this):
 *   extern __shared__ uint4 smem[];   // epf_ll_smem_bytes(&plan, blockDim.x) bytes
 *   epf_ll_ctx_t ctx = epf_ll_ctx_make(team, state, rec, NULL, blockIdx.x % bpr, bpr);
 *   epf_ll_dispatch_send_block(&plan, ctx, &args, smem);
 *   __syncthreads();                  // [smem-reuse]
 *   epf_status_t st = epf_ll_dispatch_recv_block(&plan, ctx, &args, smem);
 *
 * Contents:
 *   bool         epf_ll_payload_supported(int payload)                                   [EPF_HD]
 *   void         epf_ll_dispatch_send_block(const epf_plan_t*, epf_ll_ctx_t, const epf_ll_dispatch_args_t*, void* smem)
 *   void         epf_ll_combine_backward_send_block(const epf_plan_t*, epf_ll_ctx_t, const epf_ll_dispatch_args_t*, void* smem)
 *   epf_status_t epf_ll_dispatch_recv_block(const epf_plan_t*, epf_ll_ctx_t, const epf_ll_dispatch_args_t*, void* smem)
 *
 * Requirements: CUDA, sm_70+ (__match_any_sync), sm_90 / sm_100 compiled (-Werror); tested on an H200.
 */
#ifndef EPF_LL_IMPL_DISPATCH_CUH
#define EPF_LL_IMPL_DISPATCH_CUH

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

EPF_HD bool epf_ll_payload_supported(int payload) {
  return payload == EPF_PAYLOAD_BF16 || payload == EPF_PAYLOAD_MXFP8 || payload == EPF_PAYLOAD_FP8_128;
}

/* epf__ll_combine_weight — the combine weight of the row that pair (t, k) sends (k = the first k
 * naming its expert): the sum over k' >= k of the token with the same id of topk_weights[t][k']
 * (1.0f when NULL), FP32 adds in ascending k' from +0.0f (docs/low-latency.md, "Training"). */
EPF_DEVICE_INLINE float epf__ll_combine_weight(const void* topk_idx, int is64, const float* topk_weights, int t, int k,
                                               int K) {
  const int64_t base = (int64_t)t * K;
  const int64_t id = epf__ll_topk_raw(topk_idx, is64, base + k);
  float acc = 0.0f;
  int j;
  for (j = k; j < K; ++j)
    if (epf__ll_topk_raw(topk_idx, is64, base + j) == id) acc = __fadd_rn(acc, topk_weights != NULL ? topk_weights[base + j] : 1.0f);
  return acc;
}

/* epf__ll_quantize_chunk_warp — the lane's 8 BF16 values of one chunk in the payload's wire form
 *   (the sends of ll/impl/dispatch.cuh and ll/impl/dispatch_rm.cuh: once per chunk, before its copies).
 *   Scope:    [collective:warp] every lane, converged (lanes past the row end pass zeros); payload
 *             warp-uniform.
 *   Result:   EPF_PAYLOAD_MXFP8: the E4M3 bytes, *out_sbits = the group's E8M0 byte (rule mx_rule);
 *             EPF_PAYLOAD_FP8_128: the E4M3 bytes, *out_sbits = the FP32 bits of the group's scale
 *             (UE8M0 when ue8m0); BF16: zeros, *out_sbits = 0 (v is stored as it is). */
EPF_DEVICE_INLINE uint2 epf__ll_quantize_chunk_warp(uint4 v, int payload, int mx_rule, bool ue8m0, uint32_t* out_sbits) {
  uint2 q = make_uint2(0u, 0u);
  *out_sbits = 0u;
  if (payload == EPF_PAYLOAD_MXFP8) {
    uint8_t sb = 0;
    q = epf_mxfp8_quantize_lane8_bf16_warp(v, mx_rule, &sb);
    *out_sbits = sb;
  } else if (payload == EPF_PAYLOAD_FP8_128) {
    float sf = 0.f;
    q = epf_fp8_128_quantize_lane8_bf16_warp(v, ue8m0, &sf);
    *out_sbits = __float_as_uint(sf);
  }
  return q;
}

/* epf__ll_store_copies_warp — one 256-element chunk of one token into every copy the warp carries
 *   (the sends of ll/impl/dispatch.cuh and ll/impl/dispatch_rm.cuh).
 *   Scope:    [collective:warp] every lane, converged; payload warp-uniform.
 *   Input:    per lane: dst / sdst, the token and scale rows of one copy (epf_plan_recv_token_offset
 *             / _scale_offset in its destination's window) or dst = NULL (no copy); col = the lane's
 *             first element (chunk * EPF_LL_UNIT_ELEMS + lane * 8), on = col < hidden; v = its 8
 *             BF16 values; q / sbits = epf__ll_quantize_chunk_warp(v, payload, ...).
 *   Does:     for each lane with a copy (ascending lane), every lane stores its 16 BF16 bytes, or
 *             8 E4M3 bytes plus its group's scale (the group's first lane), into that copy.
 *   Memory:   plain stores to peers; no fence. */
EPF_DEVICE_INLINE void epf__ll_store_copies_warp(char* dst, char* sdst, int payload, int col, bool on, uint4 v, uint2 q,
                                                 uint32_t sbits) {
  const int lane = epf_lane_id();
  uint32_t present = __ballot_sync(0xffffffffu, dst != NULL);
  while (present != 0u) {
    const int j = __ffs((int)present) - 1;
    char* dj = (char*)epf__ll_shfl_ptr(dst, j);
    present &= present - 1u;
    if (payload == EPF_PAYLOAD_BF16) {
      if (on) epf_st_v4_u32(dj + (int64_t)col * 2, v);
    } else {
      char* sj = (char*)epf__ll_shfl_ptr(sdst, j);
      if (on) {
        *(uint2*)(dj + col) = q;
        if (payload == EPF_PAYLOAD_MXFP8 && (lane & 3) == 0)
          ((uint8_t*)sj)[col / EPF_MXFP8_GROUP] = (uint8_t)sbits;
        else if (payload == EPF_PAYLOAD_FP8_128 && (lane & 15) == 0)
          ((float*)sj)[col / EPF_FP8_128_GROUP] = __uint_as_float(sbits);
      }
    }
  }
}

/* epf__ll_send_chunk_load — the lane's 16 bytes of unit u (token u / nchunks, 256-element chunk
 *   u % nchunks) of x [T][H] BF16, or zeros past the row end or when u >= units. Scope: any lane. */
EPF_DEVICE_INLINE uint4 epf__ll_send_chunk_load(const void* x, int64_t u, int64_t units, int nchunks, int H) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (u < units) {
    const int t = (int)(u / nchunks), c = (int)(u - (int64_t)t * nchunks);
    const int col = c * EPF_LL_UNIT_ELEMS + epf_lane_id() * 8;
    if (col < H) v = epf_ld_nc_v4_u32((const char*)x + ((int64_t)t * H + col) * 2);
  }
  return v;
}

/* the body of the two send blocks below (defined after them) */
EPF_DEVICE_INLINE void epf__ll_dispatch_send(const epf_plan_t* plan, epf_ll_ctx_t ctx, const epf_ll_dispatch_args_t* a,
                                             void* smem, bool bwd);

EPF_DEVICE_INLINE void epf_ll_dispatch_send_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                  const epf_ll_dispatch_args_t* a, void* smem) {
  epf__ll_dispatch_send(plan, ctx, a, smem, false);
}

EPF_DEVICE_INLINE void epf_ll_combine_backward_send_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                          const epf_ll_dispatch_args_t* a, void* smem) {
  epf__ll_dispatch_send(plan, ctx, a, smem, true);
}

/* (the body is epf__ll_dispatch_send, shared with epf_ll_combine_backward_send_block: bwd = true
 * makes the metadata weight the row's combine weight, epf__ll_combine_weight; every caller passes
 * a constant, so the forward code carries no backward code) */
EPF_DEVICE_INLINE void epf__ll_dispatch_send(const epf_plan_t* plan, epf_ll_ctx_t ctx, const epf_ll_dispatch_args_t* a,
                                             void* smem, bool bwd) {
  EPF__LL_FRAME_MAKE(f, plan, ctx, a->num_tokens, EPF_LL_PHASE_DISPATCH_SEND, smem);
  const int64_t units = (int64_t)f.T * f.nchunks;
  const int payload = plan->payload;
  const int mx_rule = epf_mx_rule_from_flags(plan->flags);
  const bool ue8m0 = epf_fp8_128_ue8m0_from_flags(plan->flags);
  const int64_t ustride = (int64_t)ctx.nblocks * f.nwarps;
  int64_t u = (int64_t)ctx.block * f.nwarps + f.warp;
  /* the chunk of the warp's next unit, loaded one unit ahead: the first one before the slot pass,
   * so its load overlaps the pass; each next one before the current unit's stores */
  uint4 vnext = epf__ll_send_chunk_load(a->x, u, units, f.nchunks, f.H);

  epf__ll_snapshot_mask_block(plan, ctx, f.mask);
  epf__ll_slot_pass_block(plan, a->topk_idx, a->index_type, f.T, f.slots,
                          ctx.block == 0 && ctx.record != NULL ? &ctx.record->dropped_routes : NULL, 0);

  for (; u < units; u += ustride) {
    const int t = (int)(u / f.nchunks), c = (int)(u - (int64_t)t * f.nchunks);
    const int col = c * EPF_LL_UNIT_ELEMS + f.lane * 8;
    const bool on = col < f.H;
    const uint4 v = vnext;
    uint2 q;
    uint32_t sbits; /* the lane's group scale: E8M0 byte (MXFP8) or FP32 bits (per-128) */
    int kb;
    vnext = epf__ll_send_chunk_load(a->x, u + ustride, units, f.nchunks, f.H);
    q = epf__ll_quantize_chunk_warp(v, payload, mx_rule, ue8m0, &sbits);
    for (kb = 0; kb < f.K; kb += 32) {
      const int k = kb + f.lane;
      char* dst = NULL;
      char* sdst = NULL;
      int64_t row = -1;
      int d = -1, le = 0;
      /* the metadata weight (chunk 0 only), loaded before the copies rather than after them */
      const float wrow = c != 0 || k >= f.K ? 0.0f
                         : bwd ? epf__ll_combine_weight(a->topk_idx, epf_ll_index_is64(a->index_type), a->topk_weights, t, k, f.K)
                         : a->topk_weights != NULL ? a->topk_weights[(int64_t)t * f.K + k] : 1.0f;
      if (k < f.K) {
        int ex;
        const uint32_t slot = epf_ll_slot(plan, f.slots, t * f.K + k, &ex);
        if (slot != EPF_LL_SLOT_NONE) {
          d = ex / f.EL;
          le = ex - d * f.EL;
          if (slot < (uint32_t)f.Tmax && epf__ll_active(f.mask, d)) {
            row = epf_ll_recv_row(plan, f.epoch, le, f.rank, (int)slot);
            dst = (char*)epf_peer_ptr(f.team, epf_plan_recv_token_offset(plan, row), d);
            sdst = (char*)epf_peer_ptr(f.team, epf_plan_recv_scale_offset(plan, row), d);
          }
        }
      }
      epf__ll_store_copies_warp(dst, sdst, payload, col, on, v, q, sbits);
      if (c == 0 && dst != NULL) {
        union {
          epf_recv_meta_em_t m;
          uint4 v;
        } meta; /* registers only: one 16-byte store */
        meta.m = epf_recv_meta_em_make(t, f.rank, k, le, wrow);
        epf_st_v4_u32(epf_peer_ptr(f.team, epf_plan_recv_meta_offset(plan, row), d), meta.v);
      }
    }
  }

  if (epf_ll_phase_end_block(ctx, EPF_LL_PHASE_DISPATCH_SEND)) {
    int g;
    for (g = (int)threadIdx.x; g < f.E; g += (int)blockDim.x) {
      const int d = g / f.EL, le = g - d * f.EL;
      const uint32_t n = f.slots.count[g] < (uint32_t)f.Tmax ? f.slots.count[g] : (uint32_t)f.Tmax;
      if (!epf__ll_active(f.mask, d)) continue;
      epf_signal_set_sys((uint64_t*)epf_peer_ptr(f.team,
                                                 epf_plan_signal_offset(plan, EPF_REGION_SIG_LL_DISPATCH,
                                                                        epf_ll_dispatch_signal_index(plan, f.epoch, le, f.rank)),
                                                 d),
                         f.epoch, n);
    }
    epf_ll_phase_commit_block(ctx, EPF_LL_PHASE_DISPATCH_SEND, f.epoch);
  }
}

EPF_DEVICE_INLINE epf_status_t epf_ll_dispatch_recv_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                          const epf_ll_dispatch_args_t* a, void* smem) {
  EPF__LL_FRAME_MAKE(f, plan, ctx, a->num_tokens, EPF_LL_PHASE_DISPATCH_RECV, smem);
  const int nmy = f.nmy, G = f.G;
  uint32_t* cnt = f.recv_groups; /* [G + 1] */
  epf_status_t mine = EPF_OK, res;
  int i;

  for (i = (int)threadIdx.x; i < G; i += (int)blockDim.x) {
    const int m = i / f.R, s = i - m * f.R, le = ctx.block + m * ctx.nblocks;
    const uint64_t off = epf_plan_signal_offset(plan, EPF_REGION_SIG_LL_DISPATCH,
                                                epf_ll_dispatch_signal_index(plan, f.epoch, le, s));
    uint32_t v = 0u;
    const epf_status_t st = epf_signal_wait_sys((const uint64_t*)epf_local_ptr(f.team, off), f.epoch, f.w, s, &v);
    const uint32_t n = st == EPF_OK ? (v < (uint32_t)f.Tmax ? v : (uint32_t)f.Tmax) : 0u;
    if (st != EPF_OK) {
      if (mine == EPF_OK) mine = st;
      epf_st_relaxed_gpu_u32(&ctx.state->dispatch_fail[s], f.epoch);
    }
    cnt[i] = n;
    if (a->recv_counts != NULL) a->recv_counts[le * f.R + s] = (int32_t)n;
  }
  res = epf__block_status(mine); /* includes __syncthreads: cnt[] complete, rows acquired */

  if (a->expert_counts != NULL) {
    for (i = (int)threadIdx.x; i < nmy; i += (int)blockDim.x) {
      uint32_t sum = 0u;
      int s;
      for (s = 0; s < f.R; ++s) sum += cnt[i * f.R + s];
      a->expert_counts[ctx.block + i * ctx.nblocks] = (int32_t)sum;
    }
  }

  if (a->packed_x != NULL || a->packed_meta != NULL || a->packed_scales != NULL) {
    const int nch = (int)((plan->row_bytes + 511u) / 512u); /* 512-byte chunks: 16 bytes per lane */
    const bool swizzled = plan->scale_layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4 && plan->payload == EPF_PAYLOAD_MXFP8;
    uint32_t total;
    int64_t u, units;
    epf__ll_scan_block(cnt, G, f.scan); /* cnt becomes the exclusive prefix; cnt[G] = total */
    total = cnt[G];
    units = (int64_t)total * nch;
    for (u = (int64_t)f.warp; u < units; u += f.nwarps) {
      const uint32_t r = (uint32_t)(u / nch);
      const int c = (int)(u - (int64_t)r * nch);
      const int gi = epf__ll_find_group(cnt, G, r);
      const int m = gi / f.R, s = gi - m * f.R, le = ctx.block + m * ctx.nblocks;
      const int j = (int)(r - cnt[gi]);
      const int pos = (int)(cnt[gi] - cnt[m * f.R]) + j;
      const int64_t src_row = epf_ll_recv_row(plan, f.epoch, le, s, j);
      const int64_t dst_row = epf_ll_packed_row(plan, le, pos);
      const uint32_t off = (uint32_t)c * 512u + (uint32_t)f.lane * 16u;
      if (a->packed_x != NULL && off < plan->row_bytes)
        epf_st_v4_u32((char*)a->packed_x + dst_row * plan->row_bytes + off,
                      epf_ld_v4_u32((const char*)epf_local_ptr(f.team, epf_plan_recv_token_offset(plan, src_row)) + off));
      if (c == 0) {
        if (a->packed_meta != NULL && f.lane == 0)
          epf_st_v4_u32(a->packed_meta + dst_row, epf_ld_v4_u32(epf_local_ptr(f.team, epf_plan_recv_meta_offset(plan, src_row))));
        if (a->packed_scales != NULL) {
          const unsigned char* ss =
              (const unsigned char*)epf_local_ptr(f.team, epf_plan_recv_scale_offset(plan, src_row));
          uint32_t b;
          if (swizzled) { /* MXFP8 only: one byte per 32 elements, 128x4 atoms */
            for (b = (uint32_t)f.lane; b < plan->scale_bytes_per_row; b += 32u)
              ((unsigned char*)a->packed_scales)[epf_scale_swizzle_offset(dst_row, (int)b, (int)plan->scale_bytes_per_row)] = ss[b];
          } else {
            unsigned char* ds = (unsigned char*)a->packed_scales + dst_row * plan->scale_bytes_per_row;
            for (b = (uint32_t)f.lane; b < plan->scale_bytes_per_row; b += 32u) ds[b] = ss[b];
          }
        }
      }
    }
  }

  if (epf_ll_phase_end_block(ctx, EPF_LL_PHASE_DISPATCH_RECV)) {
    if (threadIdx.x == 0 && a->round != NULL) *a->round = f.epoch;
    epf_ll_phase_commit_block(ctx, EPF_LL_PHASE_DISPATCH_RECV, f.epoch);
  }
  return res;
}

EPF_END_DECLS

#endif /* EPF_LL_IMPL_DISPATCH_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
