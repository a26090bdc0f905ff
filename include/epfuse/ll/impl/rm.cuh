/* epfuse/ll/impl/rm.cuh — LL RANK_MAJOR: rows, signal and count words, combine rows, the per-rank slot pass — part of epfuse v0.1
 *
 * What it is: the layout owners of a RANK_MAJOR LL plan (plan.mode == EPF_MODE_LL, plan.layout ==
 * EPF_LAYOUT_RANK_MAJOR) and the per-rank slot pass that places a token's one copy per
 * destination rank:
 *   - receive rows RECV_TOKENS[2 parity][R source][T]: row epf_ll_rm_recv_row(plan, epoch, src,
 *     slot); slot = the token's rank among this source's tokens that have at least one expert on
 *     the destination, in token order (epf_ll_rm_slots_block), so rows [0, rows) of (parity,
 *     source) are valid and packed in token order;
 *   - one signal word per (parity, source) in SIG_LL_DISPATCH: (epoch << 32) | rows
 *     (epf_ll_rm_dispatch_signal_index; the region's first 2 R words);
 *   - the per-(expert, source) copy counts a receiver needs for its expert-major view travel as
 *     count words (core/signal.cuh, epf_count_word_pack: they carry the epoch) in the COUNTS region:
 *     epf_ll_rm_count_offset(plan, epoch, src, expert), written before the signal word;
 *   - combine landing rows COMBINE[2 parity][T][R] at the source: the pre-reduced partial of
 *     (token, expert rank), epf_ll_rm_combine_row(plan, epoch, token, rank); the backward of
 *     dispatch pushes the router-weight gradients into the other parity's row
 *     (epf_ll_rm_weight_grad_row).
 * The expert-major view the expand writes is the one of an EXPERT_MAJOR plan's packed output:
 * row epf_ll_packed_row(plan, le, pos), [EL][R * T] rows.
 * Include epfuse/ll/ll.cuh, not this file (it stands alone too, for the compile tests).
 *
 * Contents: see ll/ll.cuh.
 *
 * Requirements: see ll/ll.cuh.
 */
#ifndef EPF_LL_IMPL_RM_CUH
#define EPF_LL_IMPL_RM_CUH

#include "../../config.h"
#include "../../host.h"
#include "../../core/ptx.cuh"
#include "../../core/signal.cuh"
#include "layout.cuh"
#include "slots.cuh"
#include "types.cuh"

EPF_BEGIN_DECLS

/* ============================================================================================ */
/* Host-and-device: rows, signal and count words, combine rows                                   */
/* ============================================================================================ */

/* The accessors below take src / rank in [0, R), slot / token in [0, T), expert in [0, E). A host
 * call (the C ABI; EPF__HOST_CHECK) with a NULL plan or an id outside its range gets
 * EPF_ROW_INVALID (-1), or EPF_OFFSET_INVALID from epf_ll_rm_count_offset; device code is not
 * checked. */

EPF_HD int64_t epf_ll_rm_fixed_row(const epf_plan_t* plan, int src, int slot) {
  if (EPF__HOST_CHECK(plan == NULL || epf__ll_id_bad(src, plan->nranks) || epf__ll_id_bad(slot, plan->max_tokens_per_rank)))
    return EPF_ROW_INVALID;
  return (int64_t)src * plan->max_tokens_per_rank + slot;
}

EPF_HD int64_t epf_ll_rm_recv_row(const epf_plan_t* plan, uint32_t epoch, int src, int slot) {
  if (EPF__HOST_CHECK(plan == NULL || epf_ll_rm_fixed_row(plan, src, slot) < 0)) return EPF_ROW_INVALID;
  return (int64_t)(epoch & 1u) * plan->recv_capacity + epf_ll_rm_fixed_row(plan, src, slot);
}

EPF_HD int64_t epf_ll_rm_dispatch_signal_index(const epf_plan_t* plan, uint32_t epoch, int src) {
  if (EPF__HOST_CHECK(plan == NULL || epf__ll_id_bad(src, plan->nranks))) return EPF_ROW_INVALID;
  return (int64_t)(epoch & 1u) * plan->nranks + src;
}

EPF_HD uint64_t epf_ll_rm_count_offset(const epf_plan_t* plan, uint32_t epoch, int src, int expert) {
  if (EPF__HOST_CHECK(plan == NULL || epf__ll_id_bad(expert, plan->num_experts))) return EPF_OFFSET_INVALID;
  return epf_plan_counts_offset(plan, (int)(epoch & 1u), src, expert);
}

EPF_HD int64_t epf_ll_rm_combine_row(const epf_plan_t* plan, uint32_t epoch, int token, int rank) {
  if (EPF__HOST_CHECK(plan == NULL || epf__ll_id_bad(token, plan->max_tokens_per_rank) || epf__ll_id_bad(rank, plan->nranks)))
    return EPF_ROW_INVALID;
  return ((int64_t)(epoch & 1u) * plan->max_tokens_per_rank + token) * plan->nranks + rank;
}

EPF_HD int64_t epf_ll_rm_weight_grad_row(const epf_plan_t* plan, uint32_t epoch, int token, int rank) {
  return epf_ll_rm_combine_row(plan, epoch + 1u, token, rank);
}

EPF_HD epf_ll_slots_t epf_ll_rm_slots_at(const epf_plan_t* plan, void* smem, size_t offset, int num_tokens, int threads) {
  const int TK = num_tokens * plan->top_k;
  const int nseg_max = epf__ll_segments(threads);
  epf_ll_slots_t s;
  s.code = (uint32_t*)((char*)smem + offset);
  s.hist = s.code + epf__ll_align16((size_t)plan->max_tokens_per_rank * (size_t)plan->top_k * 4u) / 4u;
  s.count = s.hist + epf__ll_align16((size_t)nseg_max * (size_t)plan->nranks * 4u) / 4u;
  s.nseg = TK <= 0 ? 1 : ((TK + 31) / 32 < nseg_max ? (TK + 31) / 32 : nseg_max);
  s.seg_len = TK > 0 ? ((((TK + s.nseg - 1) / s.nseg) + 31) & ~31) : 32;
  return s;
}

/* ============================================================================================ */
/* Device: the per-rank slot pass                                                                */
/* ============================================================================================ */

EPF_DEVICE_INLINE void epf_ll_rm_slots_block(const epf_plan_t* plan, const void* topk_idx, int index_type,
                                             int num_tokens, epf_ll_slots_t s) {
  epf__ll_slot_pass_block(plan, topk_idx, index_type, num_tokens, s, NULL, 1);
}

EPF_DEVICE_INLINE uint32_t epf_ll_rm_slot(const epf_plan_t* plan, epf_ll_slots_t s, int pair, int* out_rank) {
  const uint32_t cd = s.code[pair];
  int d;
  if (cd == EPF__LL_CODE_NONE) {
    *out_rank = -1;
    return EPF_LL_SLOT_NONE;
  }
  d = (int)(cd >> 16);
  *out_rank = d;
  return (cd & 0xffffu) + s.hist[(pair / s.seg_len) * plan->nranks + d];
}

EPF_END_DECLS

#endif /* EPF_LL_IMPL_RM_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
