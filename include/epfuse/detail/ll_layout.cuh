/* epfuse/detail/ll_layout.cuh — LL host-and-device helpers: state, checks, rows, per-rank buffers, shared memory — part of epfuse v0.1
 *
 * What it is: the EPF_HD functions of LL mode (usable on the host and in tests): the state's
 * initial value, plan and token checks, the one owner of every LL row / signal word / operand
 * stride, and the one owner of the blocks' shared-memory carve-up (sizes and pointers).
 * Include epfuse/ll.cuh, not this file (it stands alone too, for the compile tests).
 *
 * Contents: see ll.cuh.
 *
 * Requirements: see ll.cuh.
 */
#ifndef EPF_DETAIL_LL_LAYOUT_CUH
#define EPF_DETAIL_LL_LAYOUT_CUH

#include "../config.h"
#include "../host.h"
#include "../quant.cuh"
#include "../signal.cuh"
#include "../team.cuh"
#include "ll_types.cuh"

EPF_BEGIN_DECLS

/* ============================================================================================ */
/* Host-and-device helpers: state, checks, layout                                                */
/* ============================================================================================ */

/* epf_ll_state_init — a fresh state: epochs 0, counters 0, every rank of [0, nranks) active.
 *   Scope: any single thread, host or device. Copy the result into the device state before the
 *   first LL call (or use epf_ll_state_reset from kernels_ll.cuh, stream-ordered). */
EPF_HD void epf_ll_state_init(epf_ll_state_t* out, int nranks) {
  int i;
  for (i = 0; i < EPF_LL_PHASE_COUNT; ++i) {
    out->epoch[i] = 0u;
    out->arrive[i] = 0u;
  }
  epf_mask_init_all(out->mask, nranks);
  out->clean_gen = 0u;
  out->magic = EPF_LL_STATE_MAGIC;
  out->nranks = nranks;
  out->reserved = 0u;
  for (i = 0; i < EPF_MAX_RANKS; ++i) out->dispatch_fail[i] = 0u;
}

/* epf_ll_plan_check — may this plan run the LL blocks? EPF_OK, or the reason:
 *   prefix (EPF_ERR_STRUCT_VERSION), mode not LL (EPF_ERR_MODE), RANK_MAJOR (EPF_ERR_LAYOUT: LL
 *   rank-major is not implemented), a plan whose LL regions are missing (EPF_ERR_INVALID_ARGUMENT).
 *   Hidden-size rules (per-128 FP8 with hidden 2880 -> EPF_ERR_HIDDEN_ALIGNMENT) are refused
 *   earlier, by epf_plan_compute. Scope: any thread, host or device. Pure. */
EPF_HD epf_status_t epf_ll_plan_check(const epf_plan_t* plan) {
  epf_status_t st = epf_plan_check(plan);
  if (st != EPF_OK) return st;
  if (plan->mode != EPF_MODE_LL) return EPF_ERR_MODE;
  if (plan->layout != EPF_LAYOUT_EXPERT_MAJOR) return EPF_ERR_LAYOUT;
  if (plan->region[EPF_REGION_SIG_LL_DISPATCH].bytes == 0 || plan->region[EPF_REGION_SIG_LL_COMBINE].bytes == 0 ||
      plan->region[EPF_REGION_COMBINE].bytes == 0 || plan->recv_capacity <= 0)
    return EPF_ERR_INVALID_ARGUMENT;
  return EPF_OK;
}

/* epf_ll_tokens_check — num_tokens in [0, plan.max_tokens_per_rank], else EPF_ERR_TOKENS. */
EPF_HD epf_status_t epf_ll_tokens_check(const epf_plan_t* plan, int num_tokens) {
  if (num_tokens < 0 || num_tokens > plan->max_tokens_per_rank) return EPF_ERR_TOKENS;
  return EPF_OK;
}

/* epf_ll_recv_row — row of RECV_TOKENS / RECV_SCALES / RECV_META (pass it to
 *   epf_plan_recv_token_offset & co.) that holds slot `slot` of (local_expert, src) in the round
 *   of `epoch`: (epoch & 1) * recv_capacity + (local_expert * R + src) * T + slot. */
EPF_HD int64_t epf_ll_recv_row(const epf_plan_t* plan, uint32_t epoch, int local_expert, int src, int slot) {
  return (int64_t)(epoch & 1u) * plan->recv_capacity +
         ((int64_t)local_expert * plan->nranks + src) * plan->max_tokens_per_rank + slot;
}

/* epf_ll_packed_row — row of the packed per-expert output: local_expert * (R * T) + pos, where pos
 *   counts the expert's rows from sources < src first (source order, then slot = token order). */
EPF_HD int64_t epf_ll_packed_row(const epf_plan_t* plan, int local_expert, int pos_in_expert) {
  return (int64_t)local_expert * plan->nranks * plan->max_tokens_per_rank + pos_in_expert;
}

/* epf_ll_combine_row — row of the source's COMBINE region (epf_plan_combine_offset) where the
 *   output for (token, k) of the round of `epoch` lands: ((epoch & 1) * T + token) * K + k. */
EPF_HD int64_t epf_ll_combine_row(const epf_plan_t* plan, uint32_t epoch, int token, int k) {
  return ((int64_t)(epoch & 1u) * plan->max_tokens_per_rank + token) * plan->top_k + k;
}

/* epf_ll_dispatch_signal_index — word of SIG_LL_DISPATCH (epf_plan_signal_offset) in which `src`
 *   publishes (epoch, rows) for `local_expert` of the window's owner: ((epoch & 1) * EL + le) * R + src. */
EPF_HD int64_t epf_ll_dispatch_signal_index(const epf_plan_t* plan, uint32_t epoch, int local_expert, int src) {
  return ((int64_t)(epoch & 1u) * plan->experts_per_rank + local_expert) * plan->nranks + src;
}

/* epf_ll_combine_signal_index — word of SIG_LL_COMBINE in which `peer` publishes the combine
 *   round of `epoch` to the window's owner: (epoch & 1) * R + peer. */
EPF_HD int64_t epf_ll_combine_signal_index(const epf_plan_t* plan, uint32_t epoch, int peer) {
  return (int64_t)(epoch & 1u) * plan->nranks + peer;
}

/* epf_ll_rank_bytes — bytes of one rank's buffer `which` (see epf_ll_buffer_t), sized for
 *   plan.max_tokens_per_rank; the per-rank stride of virtual-rank operand arrays. index_type:
 *   the ids' epf_index_type_t (only EPF_LL_BUF_TOPK_IDX depends on it). */
/* epf_ll_index_type_ok — index_type is DEFAULT (0, means INT64), INT32 or INT64. The launchers
 *   refuse anything else with EPF_ERR_INVALID_ARGUMENT. epf_ll_index_is64 — its storage is int64. */
EPF_HD bool epf_ll_index_type_ok(int index_type) {
  return index_type == EPF_INDEX_DEFAULT || index_type == EPF_INDEX_INT32 || index_type == EPF_INDEX_INT64;
}
EPF_HD int epf_ll_index_is64(int index_type) { return index_type != EPF_INDEX_INT32; }

EPF_HD uint64_t epf_ll_rank_bytes(const epf_plan_t* plan, epf_ll_buffer_t which, int index_type) {
  const uint64_t T = (uint64_t)plan->max_tokens_per_rank, K = (uint64_t)plan->top_k;
  const uint64_t H = (uint64_t)plan->hidden, rows = (uint64_t)plan->recv_capacity;
  switch (which) {
    case EPF_LL_BUF_X: return T * H * 2u;
    case EPF_LL_BUF_TOPK_IDX: return T * K * (epf_ll_index_is64(index_type) ? 8u : 4u);
    case EPF_LL_BUF_TOPK_WEIGHTS: return T * K * 4u;
    case EPF_LL_BUF_RECV_COUNTS: return (uint64_t)plan->experts_per_rank * (uint64_t)plan->nranks * 4u;
    case EPF_LL_BUF_EXPERT_COUNTS: return (uint64_t)plan->experts_per_rank * 4u;
    case EPF_LL_BUF_PACKED_X: return rows * plan->row_bytes;
    case EPF_LL_BUF_PACKED_SCALES:
      if (plan->scale_layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4 && plan->payload == EPF_PAYLOAD_MXFP8)
        return (uint64_t)epf_scale_swizzle_bytes((int64_t)rows, (int)plan->scale_bytes_per_row);
      return rows * plan->scale_bytes_per_row;
    case EPF_LL_BUF_PACKED_META: return rows * (uint64_t)sizeof(epf_recv_meta_em_t);
    case EPF_LL_BUF_ROUND: return 4u;
    case EPF_LL_BUF_Y: return rows * H * 2u;
    default: return 0u;
  }
}

EPF_HD const void* epf__ll_cadv(const void* p, uint64_t bytes) {
  return p == NULL ? NULL : (const void*)((const char*)p + bytes);
}
EPF_HD void* epf__ll_adv(void* p, uint64_t bytes) { return p == NULL ? NULL : (void*)((char*)p + bytes); }

/* epf_ll_dispatch_args_for_rank — virtual ranks: the operands of `rank` when every pointer of `a`
 *   is the base of R consecutive per-rank buffers (stride epf_ll_rank_bytes). NULL stays NULL. */
EPF_HD epf_ll_dispatch_args_t epf_ll_dispatch_args_for_rank(const epf_ll_dispatch_args_t* a, const epf_plan_t* plan,
                                                            int rank) {
  epf_ll_dispatch_args_t r = *a;
  const uint64_t k = (uint64_t)rank;
  r.x = epf__ll_cadv(a->x, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_X, 0));
  r.topk_idx = epf__ll_cadv(a->topk_idx, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_TOPK_IDX, a->index_type));
  r.topk_weights =
      (const float*)epf__ll_cadv(a->topk_weights, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_TOPK_WEIGHTS, 0));
  r.recv_counts = (int32_t*)epf__ll_adv(a->recv_counts, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_RECV_COUNTS, 0));
  r.expert_counts = (int32_t*)epf__ll_adv(a->expert_counts, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_EXPERT_COUNTS, 0));
  r.packed_x = epf__ll_adv(a->packed_x, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_PACKED_X, 0));
  r.packed_scales = epf__ll_adv(a->packed_scales, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_PACKED_SCALES, 0));
  r.packed_meta =
      (epf_recv_meta_em_t*)epf__ll_adv(a->packed_meta, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_PACKED_META, 0));
  r.round = (uint32_t*)epf__ll_adv(a->round, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_ROUND, 0));
  return r;
}

/* epf_ll_combine_args_for_rank — the same for combine operands. */
EPF_HD epf_ll_combine_args_t epf_ll_combine_args_for_rank(const epf_ll_combine_args_t* a, const epf_plan_t* plan,
                                                          int rank) {
  epf_ll_combine_args_t r = *a;
  const uint64_t k = (uint64_t)rank;
  r.y = epf__ll_cadv(a->y, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_Y, 0));
  r.recv_counts =
      (const int32_t*)epf__ll_cadv(a->recv_counts, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_RECV_COUNTS, 0));
  r.topk_idx = epf__ll_cadv(a->topk_idx, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_TOPK_IDX, a->index_type));
  r.topk_weights =
      (const float*)epf__ll_cadv(a->topk_weights, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_TOPK_WEIGHTS, 0));
  r.out = epf__ll_adv(a->out, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_X, 0));
  return r;
}


EPF_HD size_t epf__ll_align16(size_t x) { return (x + 15u) & ~(size_t)15u; }
EPF_HD int epf__ll_segments(int threads) {
  const int w = threads >> 5;
  return w < 1 ? 1 : (w > EPF_LL_SCAN_SEGMENTS ? EPF_LL_SCAN_SEGMENTS : w);
}

/* epf_ll_dispatch_smem_bytes — dynamic shared memory the dispatch blocks need at `threads`
 *   threads per block: the send's per-pair code table (T * K words), per-segment expert
 *   histograms (segments * E words) and per-expert counts (E words); the receive's per-group
 *   counts and prefix (2 * (E + 1) words). The max of the two halves (they reuse the memory). */
EPF_HD size_t epf_ll_dispatch_smem_bytes(const epf_plan_t* plan, int threads) {
  const size_t TK = (size_t)plan->max_tokens_per_rank * (size_t)plan->top_k;
  const size_t E = (size_t)plan->num_experts;
  const size_t send = epf__ll_align16(TK * 4u) + epf__ll_align16((size_t)epf__ll_segments(threads) * E * 4u) +
                      epf__ll_align16(E * 4u);
  const size_t recv = 2u * epf__ll_align16((E + 1u) * 4u);
  return EPF__LL_HDR_BYTES + (send > recv ? send : recv);
}

/* epf_ll_combine_smem_bytes — the combine blocks' scratch: the send's per-group prefix (E + 1
 *   words); the receive's present / pulled rank bits and, for peers that let it pull
 *   (EPF_LL_Y_IN_PLACE_PULL), the dispatch's slot table (the same tables as the dispatch send:
 *   T * K codes, per-segment histograms, per-expert counts). The max of the two halves. */
EPF_HD size_t epf_ll_combine_smem_bytes(const epf_plan_t* plan, int threads) {
  const size_t TK = (size_t)plan->max_tokens_per_rank * (size_t)plan->top_k;
  const size_t E = (size_t)plan->num_experts;
  const size_t send = epf__ll_align16((E + 1u) * 4u) + 16u * EPF_MASK_WORDS;
  const size_t recv = epf__ll_align16(2u * EPF_MASK_WORDS * 4u) + epf__ll_align16(TK * 4u) +
                      epf__ll_align16((size_t)epf__ll_segments(threads) * E * 4u) + epf__ll_align16(E * 4u);
  return EPF__LL_HDR_BYTES + (send > recv ? send : recv);
}

/* epf_ll_smem_bytes — enough for every LL block and for epf_ll_mask_clean_block. */
EPF_HD size_t epf_ll_smem_bytes(const epf_plan_t* plan, int threads) {
  const size_t d = epf_ll_dispatch_smem_bytes(plan, threads), c = epf_ll_combine_smem_bytes(plan, threads);
  return d > c ? d : c;
}

/* epf_ll_ctx_make — fill an epf_ll_ctx_t. Scope: any thread. */
EPF_HD epf_ll_ctx_t epf_ll_ctx_make(epf_team_t team, epf_ll_state_t* state, epf_error_record_t* record,
                                    const uint32_t* abort_word, int block, int nblocks) {
  epf_ll_ctx_t c;
  c.team = team;
  c.state = state;
  c.record = record;
  c.abort_word = abort_word;
  c.block = block;
  c.nblocks = nblocks;
  return c;
}

EPF_END_DECLS

#endif /* EPF_DETAIL_LL_LAYOUT_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
