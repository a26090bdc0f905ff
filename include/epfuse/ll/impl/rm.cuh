/* epfuse/detail/ll_rm.cuh — LL RANK_MAJOR: rows, signal and count words, combine rows, the per-rank slot pass — part of epfuse v0.1
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
 *     count words (signal.cuh, epf_count_word_pack: they carry the epoch) in the COUNTS region:
 *     epf_ll_rm_count_offset(plan, epoch, src, expert), written before the signal word;
 *   - combine landing rows COMBINE[2 parity][T][R] at the source: the pre-reduced partial of
 *     (token, expert rank), epf_ll_rm_combine_row(plan, epoch, token, rank); the backward of
 *     dispatch pushes the router-weight gradients into the other parity's row
 *     (epf_ll_rm_weight_grad_row).
 * The expert-major view the expand writes is the one of an EXPERT_MAJOR plan's packed output:
 * row epf_ll_packed_row(plan, le, pos), [EL][R * T] rows.
 * Include epfuse/ll.cuh, not this file (it stands alone too, for the compile tests).
 *
 * Contents: see ll.cuh.
 *
 * Requirements: see ll.cuh.
 */
#ifndef EPF_DETAIL_LL_RM_CUH
#define EPF_DETAIL_LL_RM_CUH

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

/* epf_ll_rm_fixed_row — RANK_MAJOR: the fixed order of one parity's receive rows, the one owner
 *   of the formula: slot `slot` of source `src` is row src * T + slot of [R][T] (= recv_capacity
 *   rows). Scope: any thread. Pure. */
EPF_HD int64_t epf_ll_rm_fixed_row(const epf_plan_t* plan, int src, int slot) {
  if (EPF__HOST_CHECK(plan == NULL || epf__ll_id_bad(src, plan->nranks) || epf__ll_id_bad(slot, plan->max_tokens_per_rank)))
    return EPF_ROW_INVALID;
  return (int64_t)src * plan->max_tokens_per_rank + slot;
}

/* epf_ll_rm_recv_row — RANK_MAJOR: row of RECV_TOKENS / RECV_SCALES / RECV_META (pass it to
 *   epf_plan_recv_token_offset & co.) that holds slot `slot` of `src` in the round of `epoch`:
 *   (epoch & 1) * recv_capacity + epf_ll_rm_fixed_row(plan, src, slot). Scope: any thread. Pure. */
EPF_HD int64_t epf_ll_rm_recv_row(const epf_plan_t* plan, uint32_t epoch, int src, int slot) {
  if (EPF__HOST_CHECK(plan == NULL || epf_ll_rm_fixed_row(plan, src, slot) < 0)) return EPF_ROW_INVALID;
  return (int64_t)(epoch & 1u) * plan->recv_capacity + epf_ll_rm_fixed_row(plan, src, slot);
}

/* epf_ll_rm_dispatch_signal_index — RANK_MAJOR: word of SIG_LL_DISPATCH in which `src` publishes
 *   (epoch, rows) to the window's owner: (epoch & 1) * R + src. Scope: any thread. Pure. */
EPF_HD int64_t epf_ll_rm_dispatch_signal_index(const epf_plan_t* plan, uint32_t epoch, int src) {
  if (EPF__HOST_CHECK(plan == NULL || epf__ll_id_bad(src, plan->nranks))) return EPF_ROW_INVALID;
  return (int64_t)(epoch & 1u) * plan->nranks + src;
}

/* epf_ll_rm_count_offset — RANK_MAJOR: byte offset (in the window of expert / EL) of the count
 *   word in which `src` publishes its copies to global expert `expert` in the round of `epoch`:
 *   COUNTS word (epoch & 1, src, expert) of epf_plan_counts_offset (HT uses the same words for its
 *   count exchange; an LL plan has no other use for them). Scope: any thread. Pure. */
EPF_HD uint64_t epf_ll_rm_count_offset(const epf_plan_t* plan, uint32_t epoch, int src, int expert) {
  if (EPF__HOST_CHECK(plan == NULL || epf__ll_id_bad(expert, plan->num_experts))) return EPF_OFFSET_INVALID;
  return epf_plan_counts_offset(plan, (int)(epoch & 1u), src, expert);
}

/* epf_ll_rm_combine_row — RANK_MAJOR: row of the source's COMBINE region where the partial of
 *   (token, expert rank `rank`) of the round of `epoch` lands: ((epoch & 1) * T + token) * R + rank.
 *   Scope: any thread. Pure. */
EPF_HD int64_t epf_ll_rm_combine_row(const epf_plan_t* plan, uint32_t epoch, int token, int rank) {
  if (EPF__HOST_CHECK(plan == NULL || epf__ll_id_bad(token, plan->max_tokens_per_rank) || epf__ll_id_bad(rank, plan->nranks)))
    return EPF_ROW_INVALID;
  return ((int64_t)(epoch & 1u) * plan->max_tokens_per_rank + token) * plan->nranks + rank;
}

/* epf_ll_rm_weight_grad_row — RANK_MAJOR: row of the source's COMBINE region whose first 4 * top_k
 *   bytes receive the router-weight gradients of the entries of (token, rank `rank`) pushed in
 *   the backward-of-dispatch round of `epoch` (epf_ll_dispatch_backward; float j = the token's
 *   j-th entry on that rank in k order): the landing row of (token, rank) of the OTHER parity,
 *   epf_ll_rm_combine_row(plan, epoch + 1, token, rank). Nobody reads or writes that row between
 *   the push and the source's receive of the round (as epf_ll_weight_grad_row; docs/low-latency.md,
 *   "Training: the backward direction"); epf_ll_backward_check makes sure a row holds top_k FP32.
 *   Scope: any thread. Pure. */
EPF_HD int64_t epf_ll_rm_weight_grad_row(const epf_plan_t* plan, uint32_t epoch, int token, int rank) {
  return epf_ll_rm_combine_row(plan, epoch + 1u, token, rank);
}

/* epf_ll_rm_slots_at — the per-rank slot table that starts `offset` bytes into `smem`
 *   (epf_ll_smem_layout's rm_send_slots or rm_reduce_slots, at the same `threads`): T * K codes,
 *   then [nseg][R] histograms, then [R] counts; segments as epf_ll_slots_at. Scope: any thread. */
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

/* epf_ll_rm_slots_block — the per-rank slot pass of one source's round (RANK_MAJOR): for each
 *   token, its copy to each destination rank that one of its valid expert ids lives on.
 *   Scope:    [collective:block] [uniform-args], as epf_ll_slots_block (same inputs; table from
 *             epf_ll_rm_slots_at).
 *   Does:     pair (t, k) carries the copy of token t to rank d = topk_idx[t][k] / EL when its id
 *             is valid and no earlier k' < k of the token names an expert on d (the FIRST
 *             OCCURRENCE of d in k); its slot is its rank among this source's copies to d, in
 *             token order. Every other pair (id -1, ids outside [-1, E), a later entry on the same
 *             rank) has no slot (EPF_LL_SLOT_NONE). Not counted here: the dropped ids (the expert
 *             pass, epf_ll_slots_block, counts them).
 *   Result:   [result:all] the table: epf_ll_rm_slot gives every pair's slot and rank;
 *             s.count[d] = this source's copies to rank d (<= num_tokens).
 *   Scratch:  the table s in shared memory; __syncthreads inside, before and after. [smem-reuse]
 *   Memory:   reads topk_idx; no peer access, no fence. Blocking: no. Arch: sm_70+. */
EPF_DEVICE_INLINE void epf_ll_rm_slots_block(const epf_plan_t* plan, const void* topk_idx, int index_type,
                                             int num_tokens, epf_ll_slots_t s) {
  epf__ll_slot_pass_block(plan, topk_idx, index_type, num_tokens, s, NULL, 1);
}

/* epf_ll_rm_slot — the slot of pair `pair` = t * K + k in a table that epf_ll_rm_slots_block
 *   filled, and its destination rank in *out_rank; EPF_LL_SLOT_NONE (and -1) when the pair
 *   carries no copy (it is not the first entry of its token on that rank, or its id is invalid).
 *   Scope: any thread, after the pass returned. */
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

#endif /* EPF_DETAIL_LL_RM_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
