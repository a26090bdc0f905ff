/* epfuse/ll/impl/dispatch_rm.cuh — low-latency RANK_MAJOR dispatch: send half, receive half, expand — part of epfuse v0.1
 *
 * What it is: the LL dispatch of a RANK_MAJOR plan (plan.mode == EPF_MODE_LL, plan.layout ==
 * EPF_LAYOUT_RANK_MAJOR): ONE copy of a token per destination rank, however many of its top-k
 * experts live there, into fixed rows (no count exchange), plus a local EXPAND into the same
 * expert-major view an EXPERT_MAJOR plan's receive gives the expert stage (its packed output), so
 * one grouped GEMM serves both layouts. Rows, words and slots: ll/ll.cuh (ll/impl/rm.cuh).
 *   SEND (epf_ll_rm_dispatch_send_block; never waits):
 *     1. every block of the rank computes, from topk_idx alone, two slot tables: the expert slots
 *        of an EXPERT_MAJOR dispatch (epf_ll_slots_block: the position of each (token, expert) copy
 *        in the receiver's expert-major view) and the per-rank slots (epf_ll_rm_slots_block: the
 *        receive row of each (token, destination rank) copy);
 *     2. one warp per (token, 256-element chunk) reads the chunk once, quantizes it once if the
 *        payload asks (as ll/impl/dispatch.cuh) and stores it into row epf_ll_rm_recv_row(plan, e,
 *        rank, slot) of every destination rank of the token, with the compact scales beside it
 *        and (first chunk) the RANK_MAJOR metadata row of plan.h (epf_recv_meta_rm_*): the header
 *        (src_token, src_rank, num_local), then in k order every entry of the token whose expert
 *        lives on that rank — its local expert, its weight and its expert slot (a repeated expert
 *        lists its first occurrence's slot, with its own weight);
 *     3. the last block of the rank writes, per active destination d, one count word per expert
 *        of d ((epoch, copies), COUNTS, epf_ll_rm_count_offset) and then release-stores the
 *        signal word (epoch << 32) | rows into SIG_LL_DISPATCH (epf_ll_rm_dispatch_signal_index).
 *   RECV (epf_ll_rm_dispatch_recv_block; bounded waits): every block waits for the signal word of
 *     every source, reads its count words, writes the counts of the expert-major view (block 0:
 *     recv_counts [EL][R], expert_counts [EL], exactly as an EXPERT_MAJOR receive) and, if asked
 *     (packed_x / packed_scales / packed_meta), expands the rows into the packed view (the rank's
 *     blocks share the rows).
 *   EXPAND (epf_ll_rm_expand_block; no waits): the same expansion as a separate step, after the
 *     receive half of the round (a later launch: epf_ll_expand in ll/kernels.cuh).
 *
 * The expert-major view (the packed output of an EXPERT_MAJOR receive, ll/impl/dispatch.cuh): row
 * epf_ll_packed_row(plan, le, pos), pos = (copies of sources < s for le) + the copy's expert slot,
 * so rows [0, expert_counts[le]) of expert le hold its copies from source 0, then 1, ..., in token
 * order; scales compact, or swizzled 128x4 for MXFP8 with EPF_SCALE_LAYOUT_SWIZZLED_128X4 (row =
 * packed row); packed_meta rows epf_recv_meta_em_t {src_token, src_rank, k = -1, local_expert,
 * weight of the token's first entry naming that expert}: k = -1 because a rank-major row carries
 * its entries in k order but not their k. Each view row is written once (a repeated expert names
 * its first occurrence's row).
 *
 * Semantics as ll/impl/dispatch.cuh: ids -1 not routed; ids outside [-1, E) dropped and counted
 * (record->dropped_routes, once per rank); nothing can overflow (at most T copies per (source,
 * rank) and per (source, expert)). Fault tolerance: nothing is sent to a masked destination (its
 * slots stay reserved); a masked, late or aborted source counts 0 rows and 0 copies (and
 * state.dispatch_fail remembers it for the expand and the combine). Metadata or count words that
 * fail their checks (a header naming another source or a token past T, an entry's local expert
 * or slot out of range, a count word of another round) are skipped and reported
 * (EPF_ERR_BAD_METADATA) before any value forms an address.
 *
 * What it does NOT do: allocate, launch (ll/kernels.cuh), or run an EXPERT_MAJOR plan
 * (ll/impl/dispatch.cuh does; the launchers pick by plan.layout).
 *
 * Usage (ll/kernels.cuh: epf_ll_rm_dispatch_kernel is exactly this):
 *   extern __shared__ uint4 smem[];   // epf_ll_smem_bytes(&plan, blockDim.x) bytes (RANK_MAJOR plan)
 *   epf_ll_ctx_t ctx = epf_ll_ctx_make(team, state, rec, NULL, blockIdx.x % bpr, bpr);
 *   epf_ll_rm_dispatch_send_block(&plan, ctx, &args, smem);
 *   __syncthreads();                  // [smem-reuse]
 *   epf_status_t st = epf_ll_rm_dispatch_recv_block(&plan, ctx, &args, smem);  // + expand if packed_x
 *
 * Contents:
 *   void         epf_ll_rm_dispatch_send_block(const epf_plan_t*, epf_ll_ctx_t, const epf_ll_dispatch_args_t*, void* smem)
 *   epf_status_t epf_ll_rm_dispatch_recv_block(const epf_plan_t*, epf_ll_ctx_t, const epf_ll_dispatch_args_t*, void* smem)
 *   epf_status_t epf_ll_rm_combine_backward_recv_block(const epf_plan_t*, epf_ll_ctx_t, const epf_ll_dispatch_args_t*, void* smem)
 *   void         epf_ll_rm_expand_block(const epf_plan_t*, epf_ll_ctx_t, const epf_ll_dispatch_args_t*, void* smem)
 *
 * Requirements: CUDA, sm_70+ (__match_any_sync), sm_90 compiled (-Werror).
 */
#ifndef EPF_LL_IMPL_DISPATCH_RM_CUH
#define EPF_LL_IMPL_DISPATCH_RM_CUH

#include "../../config.h"
#include "../../core/rows.cuh"
#include "dispatch.cuh"
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

EPF_DEVICE_INLINE void epf_ll_rm_dispatch_send_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                     const epf_ll_dispatch_args_t* a, void* smem) {
  EPF__LL_FRAME_MAKE(f, plan, ctx, a->num_tokens, EPF_LL_PHASE_DISPATCH_SEND, smem);
  const int is64 = epf_ll_index_is64(a->index_type);
  const int64_t units = (int64_t)f.T * f.nchunks;
  const int payload = plan->payload;
  const int mx_rule = epf_mx_rule_from_flags(plan->flags);
  const bool ue8m0 = epf_fp8_128_ue8m0_from_flags(plan->flags);
  int64_t u;

  epf__ll_snapshot_mask_block(plan, ctx, f.mask);
  epf__ll_slot_pass_block(plan, a->topk_idx, a->index_type, f.T, f.slots,
                          ctx.block == 0 && ctx.record != NULL ? &ctx.record->dropped_routes : NULL, 0);
  epf__ll_slot_pass_block(plan, a->topk_idx, a->index_type, f.T, f.rslots, NULL, 1);

  for (u = (int64_t)ctx.block * f.nwarps + f.warp; u < units; u += (int64_t)ctx.nblocks * f.nwarps) {
    const int t = (int)(u / f.nchunks), c = (int)(u - (int64_t)t * f.nchunks);
    const int col = c * EPF_LL_UNIT_ELEMS + f.lane * 8;
    const bool on = col < f.H;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    uint2 q;
    uint32_t sbits;   /* the lane's group scale: E8M0 byte (MXFP8) or FP32 bits (per-128) */
    char* dst = NULL; /* lane k < K: the copy that entry k carries (its first entry on a rank) */
    char* sdst = NULL;
    int64_t row = -1;
    int d = -1;
    if (on) v = epf_ld_nc_v4_u32((const char*)a->x + ((int64_t)t * f.H + col) * 2);
    q = epf__ll_quantize_chunk_warp(v, payload, mx_rule, ue8m0, &sbits);
    if (f.lane < f.K) {
      const uint32_t slot = epf_ll_rm_slot(plan, f.rslots, t * f.K + f.lane, &d);
      if (slot != EPF_LL_SLOT_NONE && slot < (uint32_t)f.Tmax && epf__ll_active(f.mask, d)) {
        row = epf_ll_rm_recv_row(plan, f.epoch, f.rank, (int)slot);
        dst = (char*)epf_peer_ptr(f.team, epf_plan_recv_token_offset(plan, row), d);
        sdst = (char*)epf_peer_ptr(f.team, epf_plan_recv_scale_offset(plan, row), d);
      }
    }
    epf__ll_store_copies_warp(dst, sdst, payload, col, on, v, q, sbits); /* one copy per destination rank */
    if (c == 0) { /* warp-uniform: the metadata rows (plan.h's epf_recv_meta_rm_* offsets) */
      int first_k = f.lane;
      const int e = f.lane < f.K ? epf__ll_route(a->topk_idx, is64, t, f.lane, f.K, f.E, &first_k) : -1;
      const int dk = e >= 0 ? e / f.EL : -1;
      /* the lanes of one destination rank; the lowest is the first entry on it (the copy) */
      const uint32_t same = __match_any_sync(0xffffffffu, dk >= 0 ? dk : -1 - f.lane);
      const int lead = __ffs((int)same) - 1;
      char* my_meta = dst != NULL ? (char*)epf_peer_ptr(f.team, epf_plan_recv_meta_offset(plan, row), d) : NULL;
      char* meta = (char*)epf__ll_shfl_ptr(my_meta, lead);
      if (dk >= 0 && meta != NULL) {
        const int j = __popc(same & ((1u << f.lane) - 1u)); /* entry j of the row: k order */
        int ex;
        const uint32_t es = epf_ll_slot(plan, f.slots, t * f.K + first_k, &ex); /* the expert's first occurrence */
        *(int32_t*)(meta + epf_recv_meta_rm_expert_at(f.K, j)) = e - dk * f.EL;
        *(float*)(meta + epf_recv_meta_rm_weight_at(f.K, j)) =
            a->topk_weights != NULL ? a->topk_weights[(int64_t)t * f.K + f.lane] : 1.0f;
        *(int32_t*)(meta + epf_recv_meta_rm_slot_at(f.K, j)) = es == EPF_LL_SLOT_NONE ? -1 : (int32_t)es;
        if (f.lane == lead) {
          union {
            epf_recv_meta_rm_t h;
            uint4 v;
          } hd; /* registers only: one 16-byte store */
          hd.h.src_token = t;
          hd.h.src_rank = f.rank;
          hd.h.num_local = __popc(same);
          hd.h.reserved = 0;
          epf_st_v4_u32(meta, hd.v);
        }
      }
    }
  }

  if (epf_ll_phase_end_block(ctx, EPF_LL_PHASE_DISPATCH_SEND)) {
    int g;
    /* the copies of every expert of every active destination, as count words, before the signal */
    for (g = (int)threadIdx.x; g < f.E; g += (int)blockDim.x) {
      const int dd = g / f.EL;
      const uint32_t n = f.slots.count[g] < (uint32_t)f.Tmax ? f.slots.count[g] : (uint32_t)f.Tmax;
      if (!epf__ll_active(f.mask, dd)) continue;
      epf_st_relaxed_sys_u64((uint64_t*)epf_peer_ptr(f.team, epf_ll_rm_count_offset(plan, f.epoch, f.rank, g), dd),
                             epf_count_word_pack(f.epoch, n));
    }
    __syncthreads();
    for (g = (int)threadIdx.x; g < f.R; g += (int)blockDim.x) {
      const uint32_t n = f.rslots.count[g] < (uint32_t)f.Tmax ? f.rslots.count[g] : (uint32_t)f.Tmax;
      if (!epf__ll_active(f.mask, g)) continue;
      epf_signal_set_sys((uint64_t*)epf_peer_ptr(f.team,
                                                 epf_plan_signal_offset(plan, EPF_REGION_SIG_LL_DISPATCH,
                                                                        epf_ll_rm_dispatch_signal_index(plan, f.epoch, f.rank)),
                                                 g),
                         f.epoch, n);
    }
    epf_ll_phase_commit_block(ctx, EPF_LL_PHASE_DISPATCH_SEND, f.epoch);
  }
}

/* epf__ll_rm_prefix_block — from rows[R] (rows per source) and cnt[EL][R] (copies per (local
 * expert, source)) in the smem of epf_ll_smem_layout (rm_rows, rm_cnt): rows becomes its exclusive
 * prefix (rows[R] = total) and off[le][s] ([EL][R + 1], rm_off) the first expert-major view row of
 * (le, s): packed (epf_ll_packed_row after the copies of sources < s; off[le][R] the end) or fixed
 * (epf_ll_fixed_row(plan, le, s, 0)). [collective:block]; __syncthreads before and after. */
EPF_DEVICE_INLINE void epf__ll_rm_prefix_block(const epf_plan_t* plan, const epf_ll_smem_layout_t* sl, void* smem,
                                               bool packed) {
  const int R = plan->nranks, EL = plan->experts_per_rank;
  uint32_t* rows = (uint32_t*)((char*)smem + sl->rm_rows);
  const uint32_t* cnt = (const uint32_t*)((const char*)smem + sl->rm_cnt);
  int32_t* off = (int32_t*)((char*)smem + sl->rm_off);
  int le;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t acc = 0u;
    int s;
    for (s = 0; s < R; ++s) {
      const uint32_t n = rows[s];
      rows[s] = acc;
      acc += n;
    }
    rows[R] = acc;
  }
  for (le = (int)threadIdx.x; le < EL; le += (int)blockDim.x) {
    int acc = 0, s;
    for (s = 0; s <= R; ++s) {
      off[le * (R + 1) + s] = packed ? (int32_t)epf_ll_packed_row(plan, le, acc)
                                     : (int32_t)epf_ll_fixed_row(plan, le, s < R ? s : R - 1, 0);
      if (s < R) acc += (int)cnt[le * R + s];
    }
  }
  __syncthreads();
}

/* epf__ll_rm_entry_ok — lane j's entry of a received rank-major row (epf_recv_meta_rm_read_warp over
 * the view offsets `off`) names a view row inside its (local expert, source) group: its slot is
 * below the group's copies cnt[le][s]. The header must have been checked (m.token_ok). */
EPF_DEVICE_INLINE bool epf__ll_rm_entry_ok(const epf_plan_t* plan, const epf_recv_meta_rm_lane_t* m, const int32_t* off,
                                           const uint32_t* cnt, int s) {
  const int R = plan->nranks;
  return m->em_row >= 0 && m->em_row - off[m->local_expert * (R + 1) + s] < (int64_t)cnt[m->local_expert * R + s];
}

/* epf__ll_rm_expand_rows_block — the expansion of round `epoch`'s rank-major rows into the
 * expert-major view (a->packed_x / packed_scales / packed_meta, each optional), with rows[R] and
 * cnt[EL][R] already in the smem of epf_ll_smem_layout. One warp per (row, 512-byte chunk), the
 * rank's blocks sharing the rows. [collective:block] (every block of the rank, same arguments).
 * bwd (a constant of every caller): the packed_meta weight of a view row is its COMBINE WEIGHT,
 * the FP32 sum from +0.0f, in ascending k, of the weights of the row's entries that name it (its
 * first occurrence and every repeat), instead of the first entry's weight. */
EPF_DEVICE_INLINE void epf__ll_rm_expand_rows_block(const epf_plan_t* plan, epf_ll_ctx_t ctx, uint32_t epoch,
                                                    const epf_ll_dispatch_args_t* a, void* smem, bool bwd) {
  const epf_team_t team = ctx.team;
  const int R = plan->nranks;
  const int lane = epf_lane_id(), warp = epf_warp_id(), nwarps = (int)(blockDim.x >> 5);
  const epf_ll_smem_layout_t sl = epf_ll_smem_layout(plan, (int)blockDim.x);
  const uint32_t* rows = (const uint32_t*)((char*)smem + sl.rm_rows);
  const uint32_t* cnt = (const uint32_t*)((char*)smem + sl.rm_cnt);
  const int32_t* off = (const int32_t*)((char*)smem + sl.rm_off);
  const int nch = (int)((plan->row_bytes + 511u) / 512u); /* 512-byte chunks: 16 bytes per lane */
  const bool swizzled = plan->scale_layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4 && plan->payload == EPF_PAYLOAD_MXFP8;
  const epf_wait_t w = epf_ll_wait(plan, ctx);
  int64_t u, units;
  epf__ll_rm_prefix_block(plan, &sl, smem, true);
  units = (int64_t)rows[R] * nch;
  for (u = (int64_t)ctx.block * nwarps + warp; u < units; u += (int64_t)ctx.nblocks * nwarps) {
    const uint32_t r = (uint32_t)(u / nch);
    const int c = (int)(u - (int64_t)r * nch);
    const int s = epf__ll_find_group(rows, R, r);
    const int64_t src_row = epf_ll_rm_recv_row(plan, epoch, s, (int)(r - rows[s]));
    const epf_recv_meta_rm_lane_t m = epf_recv_meta_rm_read_warp(team, plan, src_row, off);
    const bool hdr_ok = m.token_ok && m.src_rank == s; /* warp-uniform */
    const bool ok = hdr_ok && epf__ll_rm_entry_ok(plan, &m, off, cnt, s);
    const int64_t em = ok ? m.em_row : -1;
    const uint32_t same = __match_any_sync(0xffffffffu, em >= 0 ? (unsigned long long)em : ~(unsigned long long)lane);
    const bool lead = em >= 0 && __ffs((int)same) - 1 == lane; /* a repeated expert: its view row once */
    const uint32_t boff = (uint32_t)c * 512u + (uint32_t)lane * 16u;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    uint32_t pending;
    if (c == 0)
      epf_error_report_warp(&w, hdr_ok ? (lane < m.num_local && !ok) : lane == 0, EPF_ERR_BAD_METADATA,
                            epf_local_ptr(team, epf_plan_recv_meta_offset(plan, src_row)), 0, 0);
    if (!hdr_ok) continue; /* warp-uniform */
    if (a->packed_x != NULL && boff < plan->row_bytes)
      v = epf_ld_v4_u32((const char*)epf_local_ptr(team, epf_plan_recv_token_offset(plan, src_row)) + boff);
    for (pending = __ballot_sync(0xffffffffu, lead); pending != 0u; pending &= pending - 1u) {
      const int j = __ffs((int)pending) - 1;
      const int64_t er = __shfl_sync(0xffffffffu, (long long)em, j);
      if (a->packed_x != NULL && boff < plan->row_bytes)
        epf_st_v4_u32((char*)a->packed_x + er * plan->row_bytes + boff, v);
      if (c == 0 && a->packed_scales != NULL) {
        const unsigned char* ss = (const unsigned char*)epf_local_ptr(team, epf_plan_recv_scale_offset(plan, src_row));
        uint32_t b;
        for (b = (uint32_t)lane; b < plan->scale_bytes_per_row; b += 32u) {
          if (swizzled) /* MXFP8 only: one byte per 32 elements, 128x4 atoms */
            ((unsigned char*)a->packed_scales)[epf_scale_swizzle_offset(er, (int)b, (int)plan->scale_bytes_per_row)] = ss[b];
          else
            ((unsigned char*)a->packed_scales)[er * plan->scale_bytes_per_row + b] = ss[b];
        }
      }
    }
    float wview = m.weight; /* the view row's metadata weight: the first entry's (forward) */
    if (bwd && c == 0) {    /* warp-uniform: the combine weight, entries in k order = lanes ascending */
      float acc = 0.0f;
      int q;
      for (q = 0; q < 32; ++q) {
        const float wq = __shfl_sync(0xffffffffu, m.weight, q);
        if (em >= 0 && ((same >> q) & 1u) != 0u) acc = __fadd_rn(acc, wq);
      }
      wview = acc;
    }
    if (c == 0 && lead && a->packed_meta != NULL) {
      union {
        epf_recv_meta_em_t m;
        uint4 v;
      } pm; /* registers only: one 16-byte store */
      pm.m = epf_recv_meta_em_make(m.src_token, s, -1, m.local_expert, wview);
      epf_st_v4_u32(a->packed_meta + em, pm.v);
    }
  }
}

/* the body of the two receive blocks below (defined after them) */
EPF_DEVICE_INLINE epf_status_t epf__ll_rm_dispatch_recv(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                        const epf_ll_dispatch_args_t* a, void* smem, bool bwd);

EPF_DEVICE_INLINE epf_status_t epf_ll_rm_dispatch_recv_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                             const epf_ll_dispatch_args_t* a, void* smem) {
  return epf__ll_rm_dispatch_recv(plan, ctx, a, smem, false);
}

EPF_DEVICE_INLINE epf_status_t epf_ll_rm_combine_backward_recv_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                                     const epf_ll_dispatch_args_t* a, void* smem) {
  return epf__ll_rm_dispatch_recv(plan, ctx, a, smem, true);
}

/* (the body of the two receive blocks above: bwd = true makes the view rows' metadata weight their
 * combine weight; every caller passes a constant, so the forward code carries no backward code) */
EPF_DEVICE_INLINE epf_status_t epf__ll_rm_dispatch_recv(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                        const epf_ll_dispatch_args_t* a, void* smem, bool bwd) {
  EPF__LL_FRAME_MAKE(f, plan, ctx, a->num_tokens, EPF_LL_PHASE_DISPATCH_RECV, smem);
  /* f.rm_present [EPF_MASK_WORDS], f.rm_rows [R + 1], f.rm_cnt [EL][R] */
  epf_status_t mine = EPF_OK, res;
  int i;

  for (i = (int)threadIdx.x; i < EPF_MASK_WORDS; i += (int)blockDim.x) f.rm_present[i] = 0u;
  __syncthreads();
  for (i = (int)threadIdx.x; i < f.R; i += (int)blockDim.x) {
    const uint64_t off = epf_plan_signal_offset(plan, EPF_REGION_SIG_LL_DISPATCH,
                                                epf_ll_rm_dispatch_signal_index(plan, f.epoch, i));
    uint32_t v = 0u;
    const epf_status_t st = epf_signal_wait_sys((const uint64_t*)epf_local_ptr(f.team, off), f.epoch, f.w, i, &v);
    if (st == EPF_OK) {
      f.rm_rows[i] = v < (uint32_t)f.Tmax ? v : (uint32_t)f.Tmax;
      atomicOr(&f.rm_present[i >> 5], 1u << (i & 31));
    } else {
      f.rm_rows[i] = 0u;
      if (mine == EPF_OK) mine = st;
      epf_st_relaxed_gpu_u32(&ctx.state->dispatch_fail[i], f.epoch);
    }
  }
  res = epf__block_status(mine); /* __syncthreads: present[] / rows[] complete, words acquired */

  for (i = (int)threadIdx.x; i < f.EL * f.R; i += (int)blockDim.x) { /* i = le * R + s */
    const int le = i / f.R, s = i - le * f.R;
    uint32_t n = 0u;
    if (epf__ll_active(f.rm_present, s)) {
      const uint64_t* wp = (const uint64_t*)epf_local_ptr(f.team, epf_ll_rm_count_offset(plan, f.epoch, s, f.rank * f.EL + le));
      const uint64_t word = *wp;
      if (epf_count_word_valid(word, f.epoch)) {
        n = epf_count_word_count(word);
        n = n < (uint32_t)f.Tmax ? n : (uint32_t)f.Tmax;
      } else {
        epf_error_report(ctx.record, EPF_ERR_BAD_METADATA, f.rank, s, wp, f.epoch, word >> 32, 0);
      }
    }
    f.rm_cnt[i] = n;
    if (ctx.block == 0 && a->recv_counts != NULL) a->recv_counts[i] = (int32_t)n;
  }
  __syncthreads();
  if (ctx.block == 0 && a->expert_counts != NULL) {
    for (i = (int)threadIdx.x; i < f.EL; i += (int)blockDim.x) {
      uint32_t sum = 0u;
      int s;
      for (s = 0; s < f.R; ++s) sum += f.rm_cnt[i * f.R + s];
      a->expert_counts[i] = (int32_t)sum;
    }
  }
  if (a->packed_x != NULL || a->packed_meta != NULL || a->packed_scales != NULL) /* block-uniform */
    epf__ll_rm_expand_rows_block(plan, ctx, f.epoch, a, smem, bwd);

  if (epf_ll_phase_end_block(ctx, EPF_LL_PHASE_DISPATCH_RECV)) {
    if (threadIdx.x == 0 && a->round != NULL) *a->round = f.epoch;
    epf_ll_phase_commit_block(ctx, EPF_LL_PHASE_DISPATCH_RECV, f.epoch);
  }
  return res;
}

/* epf__ll_rm_rows_block — the sources of a RANK_MAJOR round `epoch` whose dispatch this rank
 * received, from the window (after the receive half of that round returned): for source s,
 * present (bit s of present[]) and rows[s] = its signal word's rows when the receive half did not
 * miss it (state.dispatch_fail[s] != epoch), the source is active in `mask` (NULL: all) and the
 * word carries exactly `epoch`; else not present and 0 rows. [collective:block]; ends with
 * __syncthreads. */
EPF_DEVICE_INLINE void epf__ll_rm_rows_block(const epf_plan_t* plan, epf_ll_ctx_t ctx, uint32_t epoch,
                                             const uint32_t* mask, uint32_t* present, uint32_t* rows) {
  const int R = plan->nranks, Tmax = plan->max_tokens_per_rank;
  int i;
  for (i = (int)threadIdx.x; i < EPF_MASK_WORDS; i += (int)blockDim.x) present[i] = 0u;
  __syncthreads();
  for (i = (int)threadIdx.x; i < R; i += (int)blockDim.x) {
    const uint64_t word = epf_ld_relaxed_sys_u64((const uint64_t*)epf_local_ptr(
        ctx.team, epf_plan_signal_offset(plan, EPF_REGION_SIG_LL_DISPATCH, epf_ll_rm_dispatch_signal_index(plan, epoch, i))));
    const bool ok = epf_ld_relaxed_gpu_u32(&ctx.state->dispatch_fail[i]) != epoch && epf_signal_epoch(word) == epoch &&
                    (mask == NULL || epf__ll_active(mask, i));
    const uint32_t n = epf_signal_value(word);
    rows[i] = ok ? (n < (uint32_t)Tmax ? n : (uint32_t)Tmax) : 0u;
    if (ok) atomicOr(&present[i >> 5], 1u << (i & 31));
  }
  __syncthreads();
}

EPF_DEVICE_INLINE void epf_ll_rm_expand_block(const epf_plan_t* plan, epf_ll_ctx_t ctx, const epf_ll_dispatch_args_t* a,
                                              void* smem) {
  const int R = plan->nranks, EL = plan->experts_per_rank, Tmax = plan->max_tokens_per_rank;
  const uint32_t epoch = epf_ld_relaxed_gpu_u32(&ctx.state->epoch[EPF_LL_PHASE_DISPATCH_RECV]);
  const epf_ll_smem_layout_t sl = epf_ll_smem_layout(plan, (int)blockDim.x);
  uint32_t* present = (uint32_t*)((char*)smem + sl.rm_present);
  uint32_t* rows = (uint32_t*)((char*)smem + sl.rm_rows);
  uint32_t* cnt = (uint32_t*)((char*)smem + sl.rm_cnt);
  int i;
  epf__ll_rm_rows_block(plan, ctx, epoch, NULL, present, rows);
  for (i = (int)threadIdx.x; i < EL * R; i += (int)blockDim.x) {
    const int32_t n = a->recv_counts != NULL && epf__ll_active(present, i % R) ? a->recv_counts[i] : 0;
    cnt[i] = (uint32_t)(n < 0 ? 0 : (n > Tmax ? Tmax : n));
  }
  epf__ll_rm_expand_rows_block(plan, ctx, epoch, a, smem, false); /* __syncthreads first */
}

EPF_END_DECLS

#endif /* EPF_LL_IMPL_DISPATCH_RM_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
