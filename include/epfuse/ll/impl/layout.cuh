/* epfuse/ll/impl/layout.cuh — LL host-and-device helpers: state, checks, rows, per-rank buffers, shared memory — part of epfuse v0.1
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

/* epf_ll_state_init — a fresh state: epochs 0, counters 0, every rank of [0, nranks) active.
 *   Scope: any single thread, host or device. Copy the result into the device state before the
 *   first LL call (or use epf_ll_state_reset from kernels_ll.cuh, stream-ordered). A host call
 *   with out NULL or nranks outside [1, EPF_MAX_RANKS] writes nothing. */
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

/* epf_ll_plan_check — may this plan run the LL blocks? EPF_OK, or the reason:
 *   prefix (EPF_ERR_STRUCT_VERSION), mode not LL (EPF_ERR_MODE), a layout other than EXPERT_MAJOR
 *   and RANK_MAJOR (EPF_ERR_LAYOUT), a plan whose LL regions are missing or whose receive rows
 *   are not the layout's (EPF_ERR_INVALID_ARGUMENT: EXPERT_MAJOR [EL][R][T] rows per parity,
 *   RANK_MAJOR [R][T] rows with rank-major metadata rows and the COUNTS region that carries the
 *   per-expert counts). Hidden-size rules (per-128 FP8 with hidden 2880 ->
 *   EPF_ERR_HIDDEN_ALIGNMENT) are refused earlier, by epf_plan_compute. The ready-made launchers
 *   (kernels_ll.cuh) run the rank-major blocks (dispatch_ll_rm.cuh, combine_ll_rm.cuh) for a
 *   RANK_MAJOR plan. Scope: any thread, host or device. Pure. */
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

/* epf_ll_tokens_check — num_tokens in [0, plan.max_tokens_per_rank], else EPF_ERR_TOKENS;
 *   EPF_ERR_INVALID_ARGUMENT for a NULL plan. */
EPF_HD epf_status_t epf_ll_tokens_check(const epf_plan_t* plan, int num_tokens) {
  if (plan == NULL) return EPF_ERR_INVALID_ARGUMENT;
  if (num_tokens < 0 || num_tokens > plan->max_tokens_per_rank) return EPF_ERR_TOKENS;
  return EPF_OK;
}

/* epf_ll_backward_check — may this LL plan run the training direction (epf_ll_combine_backward,
 *   epf_ll_dispatch_backward and their blocks)? EXPERT_MAJOR and RANK_MAJOR plans both may.
 *   EPF_OK, or epf_ll_plan_check's status, or EPF_ERR_NOT_SUPPORTED unless the payload and the
 *   combine payload are both BF16 (gradients travel unquantized: the rows carry dy and dx exactly)
 *   and, RANK_MAJOR, a combine landing row holds top_k FP32 (the pushed router-weight gradients of
 *   one (token, rank): combine_row_bytes >= 4 * top_k, i.e. hidden >= 2 * top_k). Scope: any
 *   thread. Pure. */
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

/* epf_ll_fixed_row — the FIXED ORDER of one parity's receive rows, the one owner of the LL
 *   receive-row formula: slot `slot` of (local_expert, src) is row
 *   (local_expert * R + src) * T + slot of [EL][R][T] (= recv_capacity rows). epf_ll_recv_row adds
 *   the parity; a y in EPF_LL_Y_FIXED order uses it as is. Scope: any thread. Pure. */
EPF_HD int64_t epf_ll_fixed_row(const epf_plan_t* plan, int local_expert, int src, int slot) {
  if (EPF__HOST_CHECK(plan == NULL || epf__ll_id_bad(local_expert, plan->experts_per_rank) ||
                      epf__ll_id_bad(src, plan->nranks) || epf__ll_id_bad(slot, plan->max_tokens_per_rank)))
    return EPF_ROW_INVALID;
  return ((int64_t)local_expert * plan->nranks + src) * plan->max_tokens_per_rank + slot;
}

/* epf_ll_fixed_row_split — the inverse: (local_expert, src, slot) of fixed row `row` in
 *   [0, recv_capacity), for loops over the fixed order. A host call with a NULL plan or row outside
 *   [0, recv_capacity) sets every non-NULL output to -1; NULL outputs are never written.
 *   Scope: any thread. Pure. */
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

/* epf_ll_recv_row — row of RECV_TOKENS / RECV_SCALES / RECV_META (pass it to
 *   epf_plan_recv_token_offset & co.) that holds slot `slot` of (local_expert, src) in the round
 *   of `epoch`: (epoch & 1) * recv_capacity + epf_ll_fixed_row(plan, local_expert, src, slot). */
EPF_HD int64_t epf_ll_recv_row(const epf_plan_t* plan, uint32_t epoch, int local_expert, int src, int slot) {
  if (EPF__HOST_CHECK(plan == NULL || epf_ll_fixed_row(plan, local_expert, src, slot) < 0)) return EPF_ROW_INVALID;
  return (int64_t)(epoch & 1u) * plan->recv_capacity + epf_ll_fixed_row(plan, local_expert, src, slot);
}

/* epf_ll_packed_row — row of the packed per-expert output: local_expert * (R * T) + pos, where pos
 *   (in [0, R * T)) counts the expert's rows from sources < src first (source order, then slot =
 *   token order). */
EPF_HD int64_t epf_ll_packed_row(const epf_plan_t* plan, int local_expert, int pos_in_expert) {
  if (EPF__HOST_CHECK(plan == NULL || epf__ll_id_bad(local_expert, plan->experts_per_rank) || pos_in_expert < 0 ||
                      (int64_t)pos_in_expert >= (int64_t)plan->nranks * plan->max_tokens_per_rank))
    return EPF_ROW_INVALID;
  return (int64_t)local_expert * plan->nranks * plan->max_tokens_per_rank + pos_in_expert;
}

/* epf_ll_combine_row — row of the source's COMBINE region (epf_plan_combine_offset) where the
 *   output for (token, k) of the round of `epoch` lands: ((epoch & 1) * T + token) * K + k. */
EPF_HD int64_t epf_ll_combine_row(const epf_plan_t* plan, uint32_t epoch, int token, int k) {
  if (EPF__HOST_CHECK(plan == NULL || epf__ll_id_bad(token, plan->max_tokens_per_rank) || epf__ll_id_bad(k, plan->top_k)))
    return EPF_ROW_INVALID;
  return ((int64_t)(epoch & 1u) * plan->max_tokens_per_rank + token) * plan->top_k + k;
}

/* epf_ll_weight_grad_row — row of the source's COMBINE region whose first 4 bytes receive the
 *   router-weight gradient of (token, k) pushed in the backward-of-dispatch round of `epoch`
 *   (epf_ll_dispatch_backward): the landing row of (token, k) of the OTHER parity,
 *   epf_ll_combine_row(plan, epoch + 1, token, k). Nobody reads or writes that row between the
 *   push and the source's receive of the round (docs/low-latency.md, "Training: the backward
 *   direction"). Scope: any thread. Pure. */
EPF_HD int64_t epf_ll_weight_grad_row(const epf_plan_t* plan, uint32_t epoch, int token, int k) {
  return epf_ll_combine_row(plan, epoch + 1u, token, k);
}

/* epf_ll_dispatch_signal_index — word of SIG_LL_DISPATCH (epf_plan_signal_offset) in which `src`
 *   publishes (epoch, rows) for `local_expert` of the window's owner: ((epoch & 1) * EL + le) * R + src. */
EPF_HD int64_t epf_ll_dispatch_signal_index(const epf_plan_t* plan, uint32_t epoch, int local_expert, int src) {
  if (EPF__HOST_CHECK(plan == NULL || epf__ll_id_bad(local_expert, plan->experts_per_rank) ||
                      epf__ll_id_bad(src, plan->nranks)))
    return EPF_ROW_INVALID;
  return ((int64_t)(epoch & 1u) * plan->experts_per_rank + local_expert) * plan->nranks + src;
}

/* epf_ll_combine_signal_index — word of SIG_LL_COMBINE in which `peer` publishes the combine
 *   round of `epoch` to the window's owner: (epoch & 1) * R + peer. */
EPF_HD int64_t epf_ll_combine_signal_index(const epf_plan_t* plan, uint32_t epoch, int peer) {
  if (EPF__HOST_CHECK(plan == NULL || epf__ll_id_bad(peer, plan->nranks))) return EPF_ROW_INVALID;
  return (int64_t)(epoch & 1u) * plan->nranks + peer;
}

/* epf_ll_index_type_ok — index_type is DEFAULT (0, means INT64), INT32 or INT64. The launchers
 *   refuse anything else with EPF_ERR_INVALID_ARGUMENT. epf_ll_index_is64 — its storage is int64. */
EPF_HD bool epf_ll_index_type_ok(int index_type) {
  return index_type == EPF_INDEX_DEFAULT || index_type == EPF_INDEX_INT32 || index_type == EPF_INDEX_INT64;
}
EPF_HD int epf_ll_index_is64(int index_type) { return index_type != EPF_INDEX_INT32; }

/* epf_ll_buffer_bytes — bytes of one rank's buffer `which` (see epf_ll_buffer_t), sized for
 *   plan.max_tokens_per_rank; the per-rank stride of virtual-rank operand arrays. index_type: the
 *   ids' epf_index_type_t (EPF_INDEX_DEFAULT = INT64, INT32, INT64), the same meaning as
 *   epf_ll_dispatch_args_t.index_type; only EPF_LL_BUF_TOPK_IDX depends on it (pass
 *   EPF_INDEX_DEFAULT for the others). 0 (the size sentinel; also the size of a buffer the plan
 *   does not use, e.g. PACKED_SCALES of BF16) for a NULL plan, `which` outside epf_ll_buffer_t or
 *   an index_type outside epf_index_type_t (host calls; EPF__HOST_CHECK).
 *   (It replaces epf_ll_rank_bytes, whose third argument once meant "ids are int64": 1 was int64
 *   there and is INT32 here. The name changed so that old callers stop compiling; libepfuse.so
 *   keeps the old symbol for old binaries, refusing the ambiguous id sizes: CHANGELOG.md.)
 *   Scope: any thread, host or device. Pure. */
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

/* epf_ll_dispatch_args_for_rank — virtual ranks: the operands of `rank` when every pointer of `a`
 *   is the base of R consecutive per-rank buffers (stride epf_ll_buffer_bytes). NULL stays NULL.
 *   A host call with a or plan NULL, or rank outside [0, plan.nranks), gets an all-zero struct
 *   (no operands: every launcher refuses it). */
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

/* epf_ll_combine_args_for_rank — the same for combine operands (all zero for bad arguments). */
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

/* epf_ll_smem_layout — the one owner of the LL blocks' shared memory at `threads` threads per
 *   block (epf_ll_smem_layout_t). After the common header (mask snapshot, scan storage):
 *     dispatch send:    the slot table: T * K codes, per-segment expert histograms
 *                       (min(warps, EPF_LL_SCAN_SEGMENTS) * E words), per-expert counts (E words);
 *     dispatch receive: per-group counts, scanned in place (2 * (E + 1) words reserved);
 *     combine send:     the per-group prefix (E + 1 words), then 16 * EPF_MASK_WORDS spare bytes;
 *     combine receive:  present / pulled rank bits, then the dispatch's slot table (pull), then
 *                       the bits of the ranks that carried weight gradients (backward), then
 *                       one 16-byte route per thread (the token its warp reduces);
 *     RANK_MAJOR plans (rm_* fields): the send's per-rank table after its expert table; the
 *     receive / expand / combine send's source presence, rows (+ prefix), [EL][R] counts and
 *     [EL][R + 1] view offsets; the combine receive's per-rank table (pull; it fits in
 *     reduce_slots' bytes, R <= E, so reduce_wgrad serves the rank-major backward too).
 *   The halves of a stage reuse the memory: each stage needs the larger of its halves.
 *   Scope: any thread, host or device. Pure. */
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

/* epf_ll_dispatch_smem_bytes — dynamic shared memory the dispatch blocks need at `threads`
 *   threads per block (epf_ll_smem_layout's dispatch_bytes). */
EPF_HD size_t epf_ll_dispatch_smem_bytes(const epf_plan_t* plan, int threads) {
  return epf_ll_smem_layout(plan, threads).dispatch_bytes;
}

/* epf_ll_combine_smem_bytes — the combine blocks' scratch (epf_ll_smem_layout's combine_bytes). */
EPF_HD size_t epf_ll_combine_smem_bytes(const epf_plan_t* plan, int threads) {
  return epf_ll_smem_layout(plan, threads).combine_bytes;
}

/* epf_ll_smem_bytes — enough for every LL block and for epf_ll_mask_clean_block. */
EPF_HD size_t epf_ll_smem_bytes(const epf_plan_t* plan, int threads) { return epf_ll_smem_layout(plan, threads).bytes; }

/* epf_ll_slots_at — the slot table that starts `offset` bytes into `smem` (a slot table of
 *   epf_ll_smem_layout: send_slots or reduce_slots, at the same `threads`), split for num_tokens
 *   tokens over at most min(threads / 32, EPF_LL_SCAN_SEGMENTS) segments of a multiple of 32
 *   pairs. Scope: any thread (device: every thread of the block gets the same). Pure. */
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

/* epf_ll_ctx_make — fill an epf_ll_ctx_t. Scope: any thread. */
EPF_HD epf_ll_ctx_t epf_ll_ctx_make(epf_team_t team, epf_ll_state_t* state, epf_error_record_t* record,
                                    const uint32_t* abort_word, int block, int nblocks) {
  const epf_ll_ctx_t c = {team, state, record, abort_word, block, nblocks};
  return c;
}

EPF_END_DECLS

#endif /* EPF_LL_IMPL_LAYOUT_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
