/* epfuse/ll/ll.cuh — low-latency (LL) mode: fixed layout, per-rank state, epochs, active mask, mask clean — part of epfuse v0.1
 *
 * What it is: the common ground of the low-latency dispatch (dispatch_ll.cuh) and combine
 * (combine_ll.cuh) blocks, for decode-time EP (a few hundred tokens per rank, every call inside a
 * CUDA graph):
 *   - The FIXED LAYOUT of an LL window (plan.mode == EPF_MODE_LL, EXPERT_MAJOR): receive rows
 *     RECV_TOKENS[2 parity][E_local][R source][T max], so a sender knows every slot without a
 *     count exchange; one signal word per (parity, local expert, source) in SIG_LL_DISPATCH that
 *     carries (epoch << 32 | rows); combine landing rows COMBINE[2 parity][T][K] at the source and
 *     one signal word per (parity, peer) in SIG_LL_COMBINE. Accessors: epf_ll_*_row / _index
 *     (the one owner of each: docs/concepts.md, "Who owns each layout").
 *   - The SLOT PASS (epf_ll_slots_block): where each (token, k) lands, from topk_idx alone, the
 *     same rule as the route's slots (docs/concepts.md, "Slots in HT and LL").
 *   - Vocabulary: a STAGE is dispatch or combine; each stage has two HALVES, send and receive
 *     (a call's `halves`: EPF_LL_SEND, EPF_LL_RECV, EPF_LL_BOTH); a PHASE is one (stage, half)
 *     pair (epf_ll_phase_t), the unit that keeps an epoch.
 *   - epf_ll_state_t: a small per-rank struct in DEVICE memory that the kernels advance
 *     themselves: the epoch of the last completed round of each phase (dispatch send / receive,
 *     combine send / receive), the per-phase block arrival counters and the ACTIVE MASK. Nothing in
 *     it needs host work between rounds, so CUDA-graph replays just work.
 *   - Epochs and parity: round e of a phase uses epoch e = state.epoch[phase] + 1 and the buffers of
 *     parity e & 1. A rank may be one round ahead of a peer (its send of e + 1 goes to the other
 *     parity) but never two: every receive waits for every active peer, so round e + 2 cannot
 *     start anywhere before every rank finished reading round e.
 *   - Active-mask fault tolerance (opt-in, EPF_FLAG_FAULT_TOLERANT): a peer that misses a bounded
 *     wait (plan.timeout_ns) is removed from the waiter's mask (signal.cuh), the host-mapped error
 *     record gets the diagnostic, and the call completes. A masked peer is treated as absent in
 *     both directions: nothing is sent to it, nothing is awaited from it. Mask query / set
 *     (device, graph-capturable), and epf_ll_mask_clean_block: the collective that re-admits
 *     ranks and re-synchronises epochs (every participant adopts the largest epoch any of them
 *     used; stale signal words can then never satisfy a later wait).
 *   - Host-side checks of an LL plan and a call (epf_ll_plan_check, epf_ll_tokens_check) and the
 *     shared-memory carve-up of the blocks (epf_ll_smem_layout: sizes and offsets from one function).
 *
   - The RANK_MAJOR LL layout (plan.layout == EPF_LAYOUT_RANK_MAJOR; detail/ll_rm.cuh): one copy
 *     of a token per destination rank, receive rows RECV_TOKENS[2 parity][R source][T] with
 *     rank-major metadata rows (plan.h's epf_recv_meta_rm_*), one signal word per (parity,
 *     source) carrying (epoch << 32 | rows), the per-(expert, source) counts as count words in
 *     COUNTS, combine landing rows COMBINE[2 parity][T][R] (one pre-reduced partial per (token,
 *     expert rank)), and the per-rank slot pass (epf_ll_rm_slots_block). The blocks are in
 *     dispatch_ll_rm.cuh and combine_ll_rm.cuh.
 *
 * What it does NOT do: allocate, launch (kernels_ll.cuh does), move rows (dispatch_ll.cuh,
 * combine_ll.cuh, dispatch_ll_rm.cuh, combine_ll_rm.cuh), include nccl_device.h, trap or print.
 *
 * Usage (one rank's view, inside a kernel; kernels_ll.cuh composes the same calls):
 *   epf_ll_ctx_t ctx = epf_ll_ctx_make(team, state, err_record, NULL, block_in_rank, blocks_per_rank);
 *   epf_ll_dispatch_send_block(&plan, ctx, &args, smem);      // dispatch_ll.cuh
 *   ... other work ...
 *   epf_ll_dispatch_recv_block(&plan, ctx, &args, smem);      // a later launch, or co-resident
 *   // host, once per rank before the first round:
 *   epf_ll_state_t s0; epf_ll_state_init(&s0, plan.nranks); cudaMemcpy(d_state, &s0, sizeof s0, ...);
 *
 * COMPILE-TIME OPTIONS: none of its own (EPF_MAX_RANKS sizes the mask; see config.h).
 *
 * Contents:
 *   EPF_LL_SEND, EPF_LL_RECV, EPF_LL_BOTH                 `halves` of a call
 *   epf_ll_phase_t, epf_ll_y_layout_t, epf_ll_state_t, EPF_LL_STATE_MAGIC, epf_ll_ctx_t
 *   epf_ll_dispatch_args_t, epf_ll_combine_args_t           per-call operands
 *   epf_ll_smem_layout_t, epf_ll_slots_t, EPF_LL_SLOT_NONE  shared memory, slot table
 *   EPF_LL_UNIT_ELEMS, EPF_LL_SCAN_SEGMENTS                 work unit, slot-scan segments
 *   void     epf_ll_state_init(epf_ll_state_t* out, int nranks)                         [EPF_HD]
 *   epf_status_t epf_ll_plan_check(const epf_plan_t* plan)                              [EPF_HD]
 *   epf_status_t epf_ll_tokens_check(const epf_plan_t* plan, int num_tokens)            [EPF_HD]
 *   epf_status_t epf_ll_backward_check(const epf_plan_t* plan)   training direction: BF16 both ways, both layouts [EPF_HD]
 *   (the row / word accessors: EPF_ROW_INVALID for a NULL plan or an id out of range, host calls)
 *   int64_t  epf_ll_fixed_row(plan, int local_expert, int src, int slot)                [EPF_HD]
 *   void     epf_ll_fixed_row_split(plan, int64_t row, int* out_le, int* out_src, int* out_slot) [EPF_HD]
 *   int64_t  epf_ll_recv_row(plan, uint32_t epoch, int local_expert, int src, int slot) [EPF_HD]
 *   int64_t  epf_ll_packed_row(plan, int local_expert, int pos_in_expert)               [EPF_HD]
 *   int64_t  epf_ll_combine_row(plan, uint32_t epoch, int token, int k)                 [EPF_HD]
 *   int64_t  epf_ll_weight_grad_row(plan, uint32_t epoch, int token, int k)             [EPF_HD]
 *   int64_t  epf_ll_dispatch_signal_index(plan, uint32_t epoch, int local_expert, int src) [EPF_HD]
 *   int64_t  epf_ll_combine_signal_index(plan, uint32_t epoch, int peer)                [EPF_HD]
 *   uint64_t epf_ll_buffer_bytes(plan, epf_ll_buffer_t which, epf_index_type_t)       [EPF_HD]
 *   bool     epf_ll_index_type_ok(int index_type), int epf_ll_index_is64(int index_type) [EPF_HD]
 *   epf_ll_buffer_t                                        per-rank operand buffers (sizes, strides)
 *   epf_ll_dispatch_args_t epf_ll_dispatch_args_for_rank(const epf_ll_dispatch_args_t*, plan, int rank) [EPF_HD]
 *   epf_ll_combine_args_t  epf_ll_combine_args_for_rank(const epf_ll_combine_args_t*, plan, int rank)   [EPF_HD]
 *   epf_ll_smem_layout_t epf_ll_smem_layout(plan, int threads)                         [EPF_HD]
 *   size_t   epf_ll_dispatch_smem_bytes / epf_ll_combine_smem_bytes / epf_ll_smem_bytes(plan, threads)  [EPF_HD]
 *   epf_ll_slots_t epf_ll_slots_at(plan, void* smem, size_t offset, int num_tokens, int threads)   [EPF_HD]
 *   epf_ll_ctx_t epf_ll_ctx_make(team, state, record, abort_word, block, nblocks)        [EPF_HD]
 *   epf_wait_t epf_ll_wait(const epf_plan_t*, epf_ll_ctx_t)                              [device]
 *   uint32_t epf_ll_epoch_next(const epf_ll_state_t*, epf_ll_phase_t)                    [device]
 *   bool     epf_ll_phase_end_block(epf_ll_ctx_t, epf_ll_phase_t)    true in the rank's last block [collective:block]
 *   void     epf_ll_phase_commit_block(epf_ll_ctx_t, epf_ll_phase_t, uint32_t epoch)          [collective:block]
 *   void     epf_ll_mask_query(const epf_ll_state_t*, uint32_t* out_mask)               [device]
 *   void     epf_ll_mask_set(epf_ll_state_t*, const uint32_t* mask)                     [device]
 *   epf_status_t epf_ll_mask_clean_block(const epf_plan_t*, epf_ll_ctx_t, void* smem)   [collective:block]
 *   void     epf_ll_slots_block(plan, const void* topk_idx, int index_type, int num_tokens,
 *                               epf_ll_slots_t, uint32_t* dropped_routes)           [collective:block]
 *   uint32_t epf_ll_slot(plan, epf_ll_slots_t, int pair, int* out_expert)             [device]
 *   RANK_MAJOR (detail/ll_rm.cuh):
 *   int64_t  epf_ll_rm_fixed_row(plan, int src, int slot)                              [EPF_HD]
 *   int64_t  epf_ll_rm_recv_row(plan, uint32_t epoch, int src, int slot)               [EPF_HD]
 *   int64_t  epf_ll_rm_dispatch_signal_index(plan, uint32_t epoch, int src)            [EPF_HD]
 *   uint64_t epf_ll_rm_count_offset(plan, uint32_t epoch, int src, int expert)         [EPF_HD]
 *   int64_t  epf_ll_rm_combine_row(plan, uint32_t epoch, int token, int rank)          [EPF_HD]
 *   int64_t  epf_ll_rm_weight_grad_row(plan, uint32_t epoch, int token, int rank)      [EPF_HD]
 *   epf_ll_slots_t epf_ll_rm_slots_at(plan, void* smem, size_t offset, int num_tokens, int threads) [EPF_HD]
 *   void     epf_ll_rm_slots_block(plan, const void* topk_idx, int index_type, int num_tokens,
 *                                  epf_ll_slots_t)                                  [collective:block]
 *   uint32_t epf_ll_rm_slot(plan, epf_ll_slots_t, int pair, int* out_rank)            [device]
 *
 * The training direction (docs/low-latency.md, "Training: the backward direction"), the same
 * rounds with other weights, as blocks for fused kernels (same args, scope and epochs as the
 * forward blocks they share their bodies with):
 *   epf_ll_combine_backward_send_block(plan, ctx, const epf_ll_dispatch_args_t*, smem)  dispatch_ll.cuh
 *       a dispatch send of dy, metadata weight = the row's combine weight; receive half:
 *       epf_ll_dispatch_recv_block
 *   epf_ll_dispatch_backward_send_block(plan, ctx, const epf_ll_combine_args_t*, smem)  combine_ll.cuh
 *   epf_ll_dispatch_backward_recv_block(plan, ctx, const epf_ll_combine_args_t*, smem)  combine_ll.cuh
 *       a combine of dx with unit weights over first occurrences, plus the router-weight gradient
 *       (weight_grad -> topk_weights_grad)
 *   launchers (kernels_ll.cuh): epf_ll_combine_backward, epf_ll_dispatch_backward
 *
 * Requirements: CUDA, sm_70+ (sm_90 / sm_100 compiled (-Werror); tested on an H200), CUB from the toolkit (cub::WarpScan).
 */
#ifndef EPF_LL_LL_CUH
#define EPF_LL_LL_CUH

#include "../config.h"
#include "../host.h"
#include "../core/ptx.cuh"
#include "../quant/quant.cuh"
#include "../core/signal.cuh"
#include "../core/team.cuh"

/* the declarations are listed above; the definitions and their contracts, by part: */
#include "impl/types.cuh"  /* halves, phases, state, context, operands, smem layout, constants */
#include "impl/layout.cuh" /* EPF_HD: state init, checks, rows, buffers, shared memory */
#include "impl/phase.cuh"  /* device: waits, epochs, phase completion, mask, mask clean */
#include "impl/slots.cuh"  /* device: the slot pass, private block helpers */
#include "impl/rm.cuh"     /* RANK_MAJOR: rows, signal / count words, combine rows, per-rank slots */

#endif /* EPF_LL_LL_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
