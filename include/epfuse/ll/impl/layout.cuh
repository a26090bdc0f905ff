/* epfuse/ll/impl/layout.cuh — LL host-and-device helpers: state, checks, rows, per-rank buffers, shared memory — part of epfuse v0.1
 *
 * What it is: the EPF_HD functions of LL mode (usable on the host and in tests): the state's
 * initial value, plan and token checks, the one owner of every LL row / signal word / operand
 * stride, and the one owner of the blocks' shared-memory carve-up (sizes and pointers).
 * Include epfuse/ll/ll.cuh, not this file (it stands alone too, for the compile tests).
 *
 * Contents: see ll/ll.cuh.
 *
 * Requirements: see ll/ll.cuh.
 */
#ifndef EPF_LL_IMPL_LAYOUT_CUH
#define EPF_LL_IMPL_LAYOUT_CUH

#include "../../config.h"
#include "../../host.h"
#include "../../quant/quant.cuh"
#include "../../core/signal.cuh"
#include "../../core/team.cuh"
#include "types.cuh"

EPF_BEGIN_DECLS

/* ============================================================================================ */
/* Host-and-device helpers: state, checks, layout                                                */
/* ============================================================================================ */

EPF_HD void epf_ll_state_init(epf_ll_state_t* out, int nranks) {
  int i;
  if (EPF__HOST_CHECK(out == NULL || nranks < 1 || nranks > EPF_MAX_RANKS)) return;
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

EPF_HD epf_status_t epf_ll_plan_check(const epf_plan_t* plan) {
  epf_status_t st = epf_plan_check(plan);
  int64_t rows;
  if (st != EPF_OK) return st;
  if (plan->mode != EPF_MODE_LL) return EPF_ERR_MODE;
  if (plan->layout != EPF_LAYOUT_EXPERT_MAJOR && plan->layout != EPF_LAYOUT_RANK_MAJOR) return EPF_ERR_LAYOUT;
  if (plan->region[EPF_REGION_SIG_LL_DISPATCH].bytes == 0 || plan->region[EPF_REGION_SIG_LL_COMBINE].bytes == 0 ||
      plan->region[EPF_REGION_COMBINE].bytes == 0 || plan->recv_capacity <= 0)
    return EPF_ERR_INVALID_ARGUMENT;
  rows = (int64_t)plan->nranks * plan->max_tokens_per_rank;
  if (plan->layout == EPF_LAYOUT_RANK_MAJOR &&
      (plan->recv_capacity != rows || plan->meta_bytes_per_row != epf_recv_meta_rm_bytes(plan->top_k) ||
       plan->region[EPF_REGION_COUNTS].bytes < 2u * (uint64_t)plan->nranks * (uint64_t)(plan->num_experts + plan->nranks) * 8u ||
       plan->region[EPF_REGION_COMBINE].bytes < 2u * (uint64_t)rows * plan->combine_row_bytes))
    return EPF_ERR_INVALID_ARGUMENT;
  return EPF_OK;
}

EPF_HD epf_status_t epf_ll_tokens_check(const epf_plan_t* plan, int num_tokens) {
  if (plan == NULL) return EPF_ERR_INVALID_ARGUMENT;
  if (num_tokens < 0 || num_tokens > plan->max_tokens_per_rank) return EPF_ERR_TOKENS;
  return EPF_OK;
}

EPF_HD epf_status_t epf_ll_backward_check(const epf_plan_t* plan) {
  const epf_status_t st = epf_ll_plan_check(plan);
  if (st != EPF_OK) return st;
  if (plan->payload != EPF_PAYLOAD_BF16 || plan->combine_payload != EPF_PAYLOAD_BF16) return EPF_ERR_NOT_SUPPORTED;
  if (plan->layout == EPF_LAYOUT_RANK_MAJOR && plan->combine_row_bytes < 4u * (uint32_t)plan->top_k)
    return EPF_ERR_NOT_SUPPORTED;
  return EPF_OK;
}

/* The row and word accessors below take ids in these ranges: local_expert [0, EL), src / peer
 * [0, R), slot / token [0, T), k [0, K) (EL = plan.experts_per_rank, R = nranks, T =
 * max_tokens_per_rank, K = top_k). A host call (the C ABI; EPF__HOST_CHECK) with a NULL plan or an
 * id outside its range gets EPF_ROW_INVALID (-1); device code is not checked. */
EPF_HD bool epf__ll_id_bad(int id, int32_t n) { return id < 0 || id >= n; }

EPF_HD int64_t epf_ll_fixed_row(const epf_plan_t* plan, int local_expert, int src, int slot) {
  if (EPF__HOST_CHECK(plan == NULL || epf__ll_id_bad(local_expert, plan->experts_per_rank) ||
                      epf__ll_id_bad(src, plan->nranks) || epf__ll_id_bad(slot, plan->max_tokens_per_rank)))
    return EPF_ROW_INVALID;
  return ((int64_t)local_expert * plan->nranks + src) * plan->max_tokens_per_rank + slot;
}

EPF_HD void epf_ll_fixed_row_split(const epf_plan_t* plan, int64_t row, int* out_local_expert, int* out_src,
                                   int* out_slot) {
  int64_t T, g;
  if (EPF__HOST_CHECK(plan == NULL || out_local_expert == NULL || out_src == NULL || out_slot == NULL || row < 0 ||
                      row >= plan->recv_capacity || plan->max_tokens_per_rank < 1 || plan->nranks < 1)) {
    if (out_local_expert != NULL) *out_local_expert = -1;
    if (out_src != NULL) *out_src = -1;
    if (out_slot != NULL) *out_slot = -1;
    return;
  }
  T = plan->max_tokens_per_rank;
  g = row / T;
  *out_local_expert = (int)(g / plan->nranks);
  *out_src = (int)(g - (int64_t)*out_local_expert * plan->nranks);
  *out_slot = (int)(row - g * T);
}

EPF_HD int64_t epf_ll_recv_row(const epf_plan_t* plan, uint32_t epoch, int local_expert, int src, int slot) {
  if (EPF__HOST_CHECK(plan == NULL || epf_ll_fixed_row(plan, local_expert, src, slot) < 0)) return EPF_ROW_INVALID;
  return (int64_t)(epoch & 1u) * plan->recv_capacity + epf_ll_fixed_row(plan, local_expert, src, slot);
}

EPF_HD int64_t epf_ll_packed_row(const epf_plan_t* plan, int local_expert, int pos_in_expert) {
  if (EPF__HOST_CHECK(plan == NULL || epf__ll_id_bad(local_expert, plan->experts_per_rank) || pos_in_expert < 0 ||
                      (int64_t)pos_in_expert >= (int64_t)plan->nranks * plan->max_tokens_per_rank))
    return EPF_ROW_INVALID;
  return (int64_t)local_expert * plan->nranks * plan->max_tokens_per_rank + pos_in_expert;
}

EPF_HD int64_t epf_ll_combine_row(const epf_plan_t* plan, uint32_t epoch, int token, int k) {
  if (EPF__HOST_CHECK(plan == NULL || epf__ll_id_bad(token, plan->max_tokens_per_rank) || epf__ll_id_bad(k, plan->top_k)))
    return EPF_ROW_INVALID;
  return ((int64_t)(epoch & 1u) * plan->max_tokens_per_rank + token) * plan->top_k + k;
}

EPF_HD int64_t epf_ll_weight_grad_row(const epf_plan_t* plan, uint32_t epoch, int token, int k) {
  return epf_ll_combine_row(plan, epoch + 1u, token, k);
}

EPF_HD int64_t epf_ll_dispatch_signal_index(const epf_plan_t* plan, uint32_t epoch, int local_expert, int src) {
  if (EPF__HOST_CHECK(plan == NULL || epf__ll_id_bad(local_expert, plan->experts_per_rank) ||
                      epf__ll_id_bad(src, plan->nranks)))
    return EPF_ROW_INVALID;
  return ((int64_t)(epoch & 1u) * plan->experts_per_rank + local_expert) * plan->nranks + src;
}

EPF_HD int64_t epf_ll_combine_signal_index(const epf_plan_t* plan, uint32_t epoch, int peer) {
  if (EPF__HOST_CHECK(plan == NULL || epf__ll_id_bad(peer, plan->nranks))) return EPF_ROW_INVALID;
  return (int64_t)(epoch & 1u) * plan->nranks + peer;
}

EPF_HD bool epf_ll_index_type_ok(int index_type) {
  return index_type == EPF_INDEX_DEFAULT || index_type == EPF_INDEX_INT32 || index_type == EPF_INDEX_INT64;
}
EPF_HD int epf_ll_index_is64(int index_type) { return index_type != EPF_INDEX_INT32; }

EPF_HD uint64_t epf_ll_buffer_bytes(const epf_plan_t* plan, epf_ll_buffer_t which, epf_index_type_t index_type) {
  uint64_t T, K, H, rows;
  if (EPF__HOST_CHECK(plan == NULL || !epf_ll_index_type_ok((int)index_type))) return 0u;
  T = (uint64_t)plan->max_tokens_per_rank;
  K = (uint64_t)plan->top_k;
  /* rows of the expert-major view [EL][R][T] (one parity of an EXPERT_MAJOR plan's receive rows;
   * a RANK_MAJOR plan's expand writes the same view) */
  H = (uint64_t)plan->hidden;
  rows = (uint64_t)plan->experts_per_rank * (uint64_t)plan->nranks * T;
  switch (which) {
    case EPF_LL_BUF_X: return T * H * 2u;
    case EPF_LL_BUF_TOPK_IDX: return T * K * (epf_ll_index_is64((int)index_type) ? 8u : 4u);
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
    case EPF_LL_BUF_WEIGHT_GRAD: return rows * 4u;
    default: return 0u;
  }
}

/* an args struct's int32 index_type as the enum (a value outside it stays outside: refused) */
EPF_HD epf_index_type_t epf__ll_index_type(int32_t index_type) { return (epf_index_type_t)index_type; }

EPF_HD const void* epf__ll_cadv(const void* p, uint64_t bytes) {
  return p == NULL ? NULL : (const void*)((const char*)p + bytes);
}
EPF_HD void* epf__ll_adv(void* p, uint64_t bytes) { return p == NULL ? NULL : (void*)((char*)p + bytes); }

EPF_HD epf_ll_dispatch_args_t epf_ll_dispatch_args_for_rank(const epf_ll_dispatch_args_t* a, const epf_plan_t* plan,
                                                            int rank) {
  epf_ll_dispatch_args_t r;
  uint64_t k;
  if (EPF__HOST_CHECK(a == NULL || plan == NULL || epf__ll_id_bad(rank, plan->nranks))) {
    epf__zero_bytes(&r, sizeof(r));
    return r;
  }
  r = *a;
  k = (uint64_t)rank;
  r.x = epf__ll_cadv(a->x, k * epf_ll_buffer_bytes(plan, EPF_LL_BUF_X, EPF_INDEX_DEFAULT));
  r.topk_idx = epf__ll_cadv(a->topk_idx, k * epf_ll_buffer_bytes(plan, EPF_LL_BUF_TOPK_IDX, epf__ll_index_type(a->index_type)));
  r.topk_weights =
      (const float*)epf__ll_cadv(a->topk_weights, k * epf_ll_buffer_bytes(plan, EPF_LL_BUF_TOPK_WEIGHTS, EPF_INDEX_DEFAULT));
  r.recv_counts = (int32_t*)epf__ll_adv(a->recv_counts, k * epf_ll_buffer_bytes(plan, EPF_LL_BUF_RECV_COUNTS, EPF_INDEX_DEFAULT));
  r.expert_counts = (int32_t*)epf__ll_adv(a->expert_counts, k * epf_ll_buffer_bytes(plan, EPF_LL_BUF_EXPERT_COUNTS, EPF_INDEX_DEFAULT));
  r.packed_x = epf__ll_adv(a->packed_x, k * epf_ll_buffer_bytes(plan, EPF_LL_BUF_PACKED_X, EPF_INDEX_DEFAULT));
  r.packed_scales = epf__ll_adv(a->packed_scales, k * epf_ll_buffer_bytes(plan, EPF_LL_BUF_PACKED_SCALES, EPF_INDEX_DEFAULT));
  r.packed_meta =
      (epf_recv_meta_em_t*)epf__ll_adv(a->packed_meta, k * epf_ll_buffer_bytes(plan, EPF_LL_BUF_PACKED_META, EPF_INDEX_DEFAULT));
  r.round = (uint32_t*)epf__ll_adv(a->round, k * epf_ll_buffer_bytes(plan, EPF_LL_BUF_ROUND, EPF_INDEX_DEFAULT));
  return r;
}

EPF_HD epf_ll_combine_args_t epf_ll_combine_args_for_rank(const epf_ll_combine_args_t* a, const epf_plan_t* plan,
                                                          int rank) {
  epf_ll_combine_args_t r;
  uint64_t k;
  if (EPF__HOST_CHECK(a == NULL || plan == NULL || epf__ll_id_bad(rank, plan->nranks))) {
    epf__zero_bytes(&r, sizeof(r));
    return r;
  }
  r = *a;
  k = (uint64_t)rank;
  r.y = epf__ll_cadv(a->y, k * epf_ll_buffer_bytes(plan, EPF_LL_BUF_Y, EPF_INDEX_DEFAULT));
  r.recv_counts =
      (const int32_t*)epf__ll_cadv(a->recv_counts, k * epf_ll_buffer_bytes(plan, EPF_LL_BUF_RECV_COUNTS, EPF_INDEX_DEFAULT));
  r.topk_idx = epf__ll_cadv(a->topk_idx, k * epf_ll_buffer_bytes(plan, EPF_LL_BUF_TOPK_IDX, epf__ll_index_type(a->index_type)));
  r.topk_weights =
      (const float*)epf__ll_cadv(a->topk_weights, k * epf_ll_buffer_bytes(plan, EPF_LL_BUF_TOPK_WEIGHTS, EPF_INDEX_DEFAULT));
  r.out = epf__ll_adv(a->out, k * epf_ll_buffer_bytes(plan, EPF_LL_BUF_X, EPF_INDEX_DEFAULT));
  r.weight_grad = (const float*)epf__ll_cadv(a->weight_grad, k * epf_ll_buffer_bytes(plan, EPF_LL_BUF_WEIGHT_GRAD, EPF_INDEX_DEFAULT));
  r.topk_weights_grad = (float*)epf__ll_adv(a->topk_weights_grad, k * epf_ll_buffer_bytes(plan, EPF_LL_BUF_TOPK_WEIGHTS, EPF_INDEX_DEFAULT));
  return r;
}

EPF_HD size_t epf__ll_align16(size_t x) { return (x + 15u) & ~(size_t)15u; }
EPF_HD int epf__ll_segments(int threads) {
  const int w = threads >> 5;
  return w < 1 ? 1 : (w > EPF_LL_SCAN_SEGMENTS ? EPF_LL_SCAN_SEGMENTS : w);
}

EPF_HD epf_ll_smem_layout_t epf_ll_smem_layout(const epf_plan_t* plan, int threads) {
  const size_t TK = (size_t)plan->max_tokens_per_rank * (size_t)plan->top_k;
  const size_t E = (size_t)plan->num_experts;
  const size_t H = EPF__LL_HDR_BYTES;
  epf_ll_smem_layout_t l;
  size_t send_end, recv_end;
  l.mask = 0u;
  l.scan = EPF__LL_MASK_BYTES;
  l.slots_bytes = epf__ll_align16(TK * 4u) + epf__ll_align16((size_t)epf__ll_segments(threads) * E * 4u) +
                  epf__ll_align16(E * 4u);
  l.send_slots = H;
  l.recv_groups = H;
  send_end = l.send_slots + l.slots_bytes;
  recv_end = l.recv_groups + 2u * epf__ll_align16((E + 1u) * 4u);
  l.dispatch_bytes = send_end > recv_end ? send_end : recv_end;
  l.push_prefix = H;
  l.reduce_present = H;
  l.reduce_pulled = H + EPF_MASK_WORDS * 4u;
  l.reduce_slots = H + epf__ll_align16(2u * EPF_MASK_WORDS * 4u);
  send_end = l.push_prefix + epf__ll_align16((E + 1u) * 4u) + 16u * EPF_MASK_WORDS;
  l.reduce_wgrad = l.reduce_slots + l.slots_bytes;
  l.reduce_route = l.reduce_wgrad + epf__ll_align16(EPF_MASK_WORDS * 4u);
  recv_end = l.reduce_route + (size_t)threads * 16u;
  l.combine_bytes = send_end > recv_end ? send_end : recv_end;
  /* RANK_MAJOR (ll_rm.cuh): the send adds a per-rank slot table after the expert table; the
   * receive, the expand and the combine send share the sources' presence, rows and prefix, the
   * per-(expert, source) counts and the view offsets; the combine receive rebuilds the per-rank
   * table (pull). Only a RANK_MAJOR plan's stage sizes grow. */
  {
    const size_t R = (size_t)plan->nranks, EL = (size_t)plan->experts_per_rank;
    size_t rm_end;
    l.rm_slots_bytes = epf__ll_align16(TK * 4u) + epf__ll_align16((size_t)epf__ll_segments(threads) * R * 4u) +
                       epf__ll_align16(R * 4u);
    l.rm_send_slots = l.send_slots + l.slots_bytes;
    l.rm_present = H;
    l.rm_rows = H + epf__ll_align16(EPF_MASK_WORDS * 4u);
    l.rm_cnt = l.rm_rows + epf__ll_align16((R + 1u) * 4u);
    l.rm_off = l.rm_cnt + epf__ll_align16(EL * R * 4u);
    l.rm_reduce_slots = l.reduce_slots;
    if (plan->layout == EPF_LAYOUT_RANK_MAJOR) {
      rm_end = l.rm_off + epf__ll_align16(EL * (R + 1u) * 4u);
      send_end = l.rm_send_slots + l.rm_slots_bytes;
      if (send_end > l.dispatch_bytes) l.dispatch_bytes = send_end;
      if (rm_end > l.dispatch_bytes) l.dispatch_bytes = rm_end;
      if (rm_end > l.combine_bytes) l.combine_bytes = rm_end;
      recv_end = l.rm_reduce_slots + l.rm_slots_bytes;
      if (recv_end > l.combine_bytes) l.combine_bytes = recv_end;
    }
  }
  l.bytes = l.dispatch_bytes > l.combine_bytes ? l.dispatch_bytes : l.combine_bytes;
  return l;
}

EPF_HD size_t epf_ll_dispatch_smem_bytes(const epf_plan_t* plan, int threads) {
  return epf_ll_smem_layout(plan, threads).dispatch_bytes;
}

EPF_HD size_t epf_ll_combine_smem_bytes(const epf_plan_t* plan, int threads) {
  return epf_ll_smem_layout(plan, threads).combine_bytes;
}

EPF_HD size_t epf_ll_smem_bytes(const epf_plan_t* plan, int threads) { return epf_ll_smem_layout(plan, threads).bytes; }

EPF_HD epf_ll_slots_t epf_ll_slots_at(const epf_plan_t* plan, void* smem, size_t offset, int num_tokens,
                                      int threads) {
  const int TK = num_tokens * plan->top_k;
  const int nseg_max = epf__ll_segments(threads);
  epf_ll_slots_t s;
  s.code = (uint32_t*)((char*)smem + offset);
  s.hist = s.code + epf__ll_align16((size_t)plan->max_tokens_per_rank * (size_t)plan->top_k * 4u) / 4u;
  s.count = s.hist + epf__ll_align16((size_t)nseg_max * (size_t)plan->num_experts * 4u) / 4u;
  s.nseg = TK <= 0 ? 1 : ((TK + 31) / 32 < nseg_max ? (TK + 31) / 32 : nseg_max);
  s.seg_len = TK > 0 ? ((((TK + s.nseg - 1) / s.nseg) + 31) & ~31) : 32;
  return s;
}

EPF_HD epf_ll_ctx_t epf_ll_ctx_make(epf_team_t team, epf_ll_state_t* state, epf_error_record_t* record,
                                    const uint32_t* abort_word, int block, int nblocks) {
  const epf_ll_ctx_t c = {team, state, record, abort_word, block, nblocks};
  return c;
}

EPF_END_DECLS

#endif /* EPF_LL_IMPL_LAYOUT_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
