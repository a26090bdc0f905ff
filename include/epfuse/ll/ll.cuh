/* epfuse/ll/ll.cuh — low-latency (LL) dispatch and combine: the blocks, the fixed layout, per-rank state, epochs, active mask — part of epfuse v0.1
 *
 * What it is: low-latency expert parallelism for decode-time EP (a few hundred tokens per rank,
 * every call inside a CUDA graph), declared here with each contract; the bodies are in impl/. The
 * dispatch blocks (impl/dispatch.cuh; RANK_MAJOR: impl/dispatch_rm.cuh) and the combine blocks
 * (impl/combine.cuh; RANK_MAJOR: impl/combine_rm.cuh) stand on this common ground:
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
 *     wait (plan.timeout_ns) is removed from the waiter's mask (core/signal.cuh), the host-mapped error
 *     record gets the diagnostic, and the call completes. A masked peer is treated as absent in
 *     both directions: nothing is sent to it, nothing is awaited from it. Mask query / set
 *     (device, graph-capturable), and epf_ll_mask_clean_block: the collective that re-admits
 *     ranks and re-synchronises epochs (every participant adopts the largest epoch any of them
 *     used; stale signal words can then never satisfy a later wait).
 *   - Host-side checks of an LL plan and a call (epf_ll_plan_check, epf_ll_tokens_check) and the
 *     shared-memory carve-up of the blocks (epf_ll_smem_layout: sizes and offsets from one function).
 *
   - The RANK_MAJOR LL layout (plan.layout == EPF_LAYOUT_RANK_MAJOR; ll/impl/rm.cuh): one copy
 *     of a token per destination rank, receive rows RECV_TOKENS[2 parity][R source][T] with
 *     rank-major metadata rows (plan.h's epf_recv_meta_rm_*), one signal word per (parity,
 *     source) carrying (epoch << 32 | rows), the per-(expert, source) counts as count words in
 *     COUNTS, combine landing rows COMBINE[2 parity][T][R] (one pre-reduced partial per (token,
 *     expert rank)), and the per-rank slot pass (epf_ll_rm_slots_block). The blocks are in
 *     impl/dispatch_rm.cuh and impl/combine_rm.cuh.
 *
 * What it does NOT do: allocate, launch (ll/kernels.cuh does), include nccl_device.h, trap or
 * print.
 *
 * Usage (one rank's view, inside a kernel; ll/kernels.cuh composes the same calls):
 *   epf_ll_ctx_t ctx = epf_ll_ctx_make(team, state, err_record, NULL, block_in_rank, blocks_per_rank);
 *   epf_ll_dispatch_send_block(&plan, ctx, &args, smem);
 *   ... other work ...
 *   epf_ll_dispatch_recv_block(&plan, ctx, &args, smem);      // a later launch, or co-resident
 *   // host, once per rank before the first round:
 *   epf_ll_state_t s0; epf_ll_state_init(&s0, plan.nranks); cudaMemcpy(d_state, &s0, sizeof s0, ...);
 *
 * COMPILE-TIME OPTIONS: none of its own (EPF_MAX_RANKS sizes the mask; see config.h).
 *
 * Contents (declared below with their contracts, by part; the bodies are in impl/):
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
 *   RANK_MAJOR (ll/impl/rm.cuh):
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
 *   epf_ll_combine_backward_send_block(plan, ctx, const epf_ll_dispatch_args_t*, smem)  ll/impl/dispatch.cuh
 *       a dispatch send of dy, metadata weight = the row's combine weight; receive half:
 *       epf_ll_dispatch_recv_block
 *   epf_ll_dispatch_backward_send_block(plan, ctx, const epf_ll_combine_args_t*, smem)  ll/impl/combine.cuh
 *   epf_ll_dispatch_backward_recv_block(plan, ctx, const epf_ll_combine_args_t*, smem)  ll/impl/combine.cuh
 *       a combine of dx with unit weights over first occurrences, plus the router-weight gradient
 *       (weight_grad -> topk_weights_grad)
 *   launchers (ll/kernels.cuh): epf_ll_combine_backward, epf_ll_dispatch_backward
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

#include "impl/types.cuh" /* halves, phases, state, context, operands, smem layout, constants */

EPF_BEGIN_DECLS

/* ---- state, checks, rows, signal words, buffers, shared memory: host or device (impl/layout.cuh) --- */

/* epf_ll_state_init — a fresh state: epochs 0, counters 0, every rank of [0, nranks) active.
 *   Scope: any single thread, host or device. Copy the result into the device state before the
 *   first LL call (or use epf_ll_state_reset from ll/kernels.cuh, stream-ordered). A host call
 *   with out NULL or nranks outside [1, EPF_MAX_RANKS] writes nothing. */
EPF_HD void epf_ll_state_init(epf_ll_state_t* out, int nranks);

/* epf_ll_plan_check — may this plan run the LL blocks? EPF_OK, or the reason:
 *   prefix (EPF_ERR_STRUCT_VERSION), mode not LL (EPF_ERR_MODE), a layout other than EXPERT_MAJOR
 *   and RANK_MAJOR (EPF_ERR_LAYOUT), a plan whose LL regions are missing or whose receive rows
 *   are not the layout's (EPF_ERR_INVALID_ARGUMENT: EXPERT_MAJOR [EL][R][T] rows per parity,
 *   RANK_MAJOR [R][T] rows with rank-major metadata rows and the COUNTS region that carries the
 *   per-expert counts). Hidden-size rules (per-128 FP8 with hidden 2880 ->
 *   EPF_ERR_HIDDEN_ALIGNMENT) are refused earlier, by epf_plan_compute. The ready-made launchers
 *   (ll/kernels.cuh) run the rank-major blocks (ll/impl/dispatch_rm.cuh, ll/impl/combine_rm.cuh) for a
 *   RANK_MAJOR plan. Scope: any thread, host or device. Pure. */
EPF_HD epf_status_t epf_ll_plan_check(const epf_plan_t* plan);

/* epf_ll_tokens_check — num_tokens in [0, plan.max_tokens_per_rank], else EPF_ERR_TOKENS;
 *   EPF_ERR_INVALID_ARGUMENT for a NULL plan. */
EPF_HD epf_status_t epf_ll_tokens_check(const epf_plan_t* plan, int num_tokens);

/* epf_ll_backward_check — may this LL plan run the training direction (epf_ll_combine_backward,
 *   epf_ll_dispatch_backward and their blocks)? EXPERT_MAJOR and RANK_MAJOR plans both may.
 *   EPF_OK, or epf_ll_plan_check's status, or EPF_ERR_NOT_SUPPORTED unless the payload and the
 *   combine payload are both BF16 (gradients travel unquantized: the rows carry dy and dx exactly)
 *   and, RANK_MAJOR, a combine landing row holds top_k FP32 (the pushed router-weight gradients of
 *   one (token, rank): combine_row_bytes >= 4 * top_k, i.e. hidden >= 2 * top_k). Scope: any
 *   thread. Pure. */
EPF_HD epf_status_t epf_ll_backward_check(const epf_plan_t* plan);

/* epf_ll_fixed_row — the FIXED ORDER of one parity's receive rows, the one owner of the LL
 *   receive-row formula: slot `slot` of (local_expert, src) is row
 *   (local_expert * R + src) * T + slot of [EL][R][T] (= recv_capacity rows). epf_ll_recv_row adds
 *   the parity; a y in EPF_LL_Y_FIXED order uses it as is. Scope: any thread. Pure. */
EPF_HD int64_t epf_ll_fixed_row(const epf_plan_t* plan, int local_expert, int src, int slot);

/* epf_ll_fixed_row_split — the inverse: (local_expert, src, slot) of fixed row `row` in
 *   [0, recv_capacity), for loops over the fixed order. A host call with a NULL plan or row outside
 *   [0, recv_capacity) sets every non-NULL output to -1; NULL outputs are never written.
 *   Scope: any thread. Pure. */
EPF_HD void epf_ll_fixed_row_split(const epf_plan_t* plan, int64_t row, int* out_local_expert, int* out_src,
                                   int* out_slot);

/* epf_ll_recv_row — row of RECV_TOKENS / RECV_SCALES / RECV_META (pass it to
 *   epf_plan_recv_token_offset & co.) that holds slot `slot` of (local_expert, src) in the round
 *   of `epoch`: (epoch & 1) * recv_capacity + epf_ll_fixed_row(plan, local_expert, src, slot). */
EPF_HD int64_t epf_ll_recv_row(const epf_plan_t* plan, uint32_t epoch, int local_expert, int src, int slot);

/* epf_ll_packed_row — row of the packed per-expert output: local_expert * (R * T) + pos, where pos
 *   (in [0, R * T)) counts the expert's rows from sources < src first (source order, then slot =
 *   token order). */
EPF_HD int64_t epf_ll_packed_row(const epf_plan_t* plan, int local_expert, int pos_in_expert);

/* epf_ll_combine_row — row of the source's COMBINE region (epf_plan_combine_offset) where the
 *   output for (token, k) of the round of `epoch` lands: ((epoch & 1) * T + token) * K + k. */
EPF_HD int64_t epf_ll_combine_row(const epf_plan_t* plan, uint32_t epoch, int token, int k);

/* epf_ll_weight_grad_row — row of the source's COMBINE region whose first 4 bytes receive the
 *   router-weight gradient of (token, k) pushed in the backward-of-dispatch round of `epoch`
 *   (epf_ll_dispatch_backward): the landing row of (token, k) of the OTHER parity,
 *   epf_ll_combine_row(plan, epoch + 1, token, k). Nobody reads or writes that row between the
 *   push and the source's receive of the round (docs/low-latency.md, "Training: the backward
 *   direction"). Scope: any thread. Pure. */
EPF_HD int64_t epf_ll_weight_grad_row(const epf_plan_t* plan, uint32_t epoch, int token, int k);

/* epf_ll_dispatch_signal_index — word of SIG_LL_DISPATCH (epf_plan_signal_offset) in which `src`
 *   publishes (epoch, rows) for `local_expert` of the window's owner: ((epoch & 1) * EL + le) * R + src. */
EPF_HD int64_t epf_ll_dispatch_signal_index(const epf_plan_t* plan, uint32_t epoch, int local_expert, int src);

/* epf_ll_combine_signal_index — word of SIG_LL_COMBINE in which `peer` publishes the combine
 *   round of `epoch` to the window's owner: (epoch & 1) * R + peer. */
EPF_HD int64_t epf_ll_combine_signal_index(const epf_plan_t* plan, uint32_t epoch, int peer);

/* epf_ll_index_type_ok — index_type is DEFAULT (0, means INT64), INT32 or INT64. The launchers
 *   refuse anything else with EPF_ERR_INVALID_ARGUMENT. epf_ll_index_is64 — its storage is int64. */
EPF_HD bool epf_ll_index_type_ok(int index_type);

EPF_HD int epf_ll_index_is64(int index_type);

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
EPF_HD uint64_t epf_ll_buffer_bytes(const epf_plan_t* plan, epf_ll_buffer_t which, epf_index_type_t index_type);

/* epf_ll_dispatch_args_for_rank — virtual ranks: the operands of `rank` when every pointer of `a`
 *   is the base of R consecutive per-rank buffers (stride epf_ll_buffer_bytes). NULL stays NULL.
 *   A host call with a or plan NULL, or rank outside [0, plan.nranks), gets an all-zero struct
 *   (no operands: every launcher refuses it). */
EPF_HD epf_ll_dispatch_args_t epf_ll_dispatch_args_for_rank(const epf_ll_dispatch_args_t* a, const epf_plan_t* plan,
                                                            int rank);

/* epf_ll_combine_args_for_rank — the same for combine operands (all zero for bad arguments). */
EPF_HD epf_ll_combine_args_t epf_ll_combine_args_for_rank(const epf_ll_combine_args_t* a, const epf_plan_t* plan,
                                                          int rank);

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
EPF_HD epf_ll_smem_layout_t epf_ll_smem_layout(const epf_plan_t* plan, int threads);

/* epf_ll_dispatch_smem_bytes — dynamic shared memory the dispatch blocks need at `threads`
 *   threads per block (epf_ll_smem_layout's dispatch_bytes). */
EPF_HD size_t epf_ll_dispatch_smem_bytes(const epf_plan_t* plan, int threads);

/* epf_ll_combine_smem_bytes — the combine blocks' scratch (epf_ll_smem_layout's combine_bytes). */
EPF_HD size_t epf_ll_combine_smem_bytes(const epf_plan_t* plan, int threads);

/* epf_ll_smem_bytes — enough for every LL block and for epf_ll_mask_clean_block. */
EPF_HD size_t epf_ll_smem_bytes(const epf_plan_t* plan, int threads);

/* epf_ll_slots_at — the slot table that starts `offset` bytes into `smem` (a slot table of
 *   epf_ll_smem_layout: send_slots or reduce_slots, at the same `threads`), split for num_tokens
 *   tokens over at most min(threads / 32, EPF_LL_SCAN_SEGMENTS) segments of a multiple of 32
 *   pairs. Scope: any thread (device: every thread of the block gets the same). Pure. */
EPF_HD epf_ll_slots_t epf_ll_slots_at(const epf_plan_t* plan, void* smem, size_t offset, int num_tokens,
                                      int threads);

/* epf_ll_ctx_make — fill an epf_ll_ctx_t. Scope: any thread. */
EPF_HD epf_ll_ctx_t epf_ll_ctx_make(epf_team_t team, epf_ll_state_t* state, epf_error_record_t* record,
                                    const uint32_t* abort_word, int block, int nblocks);

/* ---- waits, epochs, phase completion, the active mask (impl/phase.cuh) ----------------------- */

/* epf_ll_wait — the wait context of an LL call: plan.timeout_ns, the record, the abort word, and
 *   (EPF_FLAG_FAULT_TOLERANT only) the rank's active mask. Scope: any thread. */
EPF_DEVICE_INLINE epf_wait_t epf_ll_wait(const epf_plan_t* plan, epf_ll_ctx_t ctx);

/* epf_ll_epoch_next — the epoch of the round a phase is about to run: state.epoch[phase] + 1.
 *   Scope: any thread. The value is stable while the phase runs (only its last block advances it,
 *   after every block arrived), so every thread of every block of the rank reads the same. */
EPF_DEVICE_INLINE uint32_t epf_ll_epoch_next(const epf_ll_state_t* state, epf_ll_phase_t phase);

/* epf_ll_phase_end_block — a phase's completion: every one of the ctx.nblocks blocks of the rank
 *   arrives (epf_arrive_last_block: one .sys atomic add per block); the last one gets true. The
 *   caller publishes the rank's work from that block, then calls epf_ll_phase_commit_block to
 *   advance the epoch and reset the counter.
 *   The counter carries no epoch tag (the HT kernels' epf_arrive_last_block_epoch does): on the
 *   LL path its compare-and-swap cost 3 to 26 us per call at T = 1 (H100, bench_ll), and a tag
 *   could not tell a rerun from the round it repeats anyway (a round whose blocks did not all
 *   arrive never advances the epoch). A launch that cannot be whole is refused instead (the
 *   launchers' checks, EPF_LL_MAX_BLOCKS_PER_RANK); after a kernel that died part-way, reset the
 *   state (epf_ll_state_reset with a zeroed window, or epf_ll_mask_clean on every rank).
 *   Scope: [collective:block] [uniform-args]. Memory: what every block wrote before arriving
 *   happens before what the last block does after (release/acquire at .sys, cumulative). */
EPF_DEVICE_INLINE bool epf_ll_phase_end_block(epf_ll_ctx_t ctx, epf_ll_phase_t phase);

/* epf_ll_phase_commit_block — in the last block only: reset the arrival counter and record
 *   `epoch` as the phase's last completed round (the next launch of the phase runs epoch + 1).
 *   Scope: [collective:block] (thread 0 stores). */
EPF_DEVICE_INLINE void epf_ll_phase_commit_block(epf_ll_ctx_t ctx, epf_ll_phase_t phase, uint32_t epoch);

/* epf_ll_mask_query — copy the rank's active mask (EPF_MASK_WORDS words) into out_mask.
 *   Scope: any single thread. Memory: .sys relaxed loads. No allocation, no sync: capturable. */
EPF_DEVICE_INLINE void epf_ll_mask_query(const epf_ll_state_t* state, uint32_t* out_mask);

/* epf_ll_mask_set — replace the rank's active mask. Scope: any single thread, while no LL phase of
 *   the rank runs (stream-ordered between calls). Memory: .sys relaxed stores. */
EPF_DEVICE_INLINE void epf_ll_mask_set(epf_ll_state_t* state, const uint32_t* mask);

/* epf_ll_mask_clean_block — re-admit delayed ranks and re-synchronise the LL epochs.
 *   Scope:    [collective:block] [uniform-args] [blocking] [needs-co-residency]: exactly one block
 *             per rank, every rank that should (re)join calls it, after all of its earlier LL
 *             phases completed (stream order). Ranks that do not call it stay masked.
 *   Does:     1. zeroes the rank's own SIG_LL_DISPATCH / SIG_LL_COMBINE words (nobody writes them:
 *                every participant is quiescent until it sees this rank's arrival);
 *             2. publishes (generation g = state.clean_gen + 1, M_r = the largest epoch this rank
 *                used) into slot `rank` of every peer's SIG_COUNT words (unused in LL mode);
 *             3. waits (bounded, without the mask) for every peer's slot to reach g;
 *             4. sets every phase's epoch to M = the largest M_p among the ranks that arrived (so
 *                the next round, M + 1, exceeds every epoch any signal word may hold), resets the
 *                arrival counters, sets the active mask to {ranks that arrived} plus itself, and
 *                stores g.
 *   Result:   [result:all] EPF_OK if every rank arrived; EPF_ERR_TIMEOUT (recorded) if some did
 *             not (they stay masked); EPF_ERR_ABORTED.
 *   Scratch:  smem: EPF__LL_HDR_BYTES bytes (epf_ll_smem_bytes covers it). [smem-reuse]
 *   Limits:   every participant must have taken part in the same number of cleans (generation
 *             numbers are compared); epochs of the ranks less than 2^31 apart. */
EPF_DEVICE_INLINE epf_status_t epf_ll_mask_clean_block(const epf_plan_t* plan, epf_ll_ctx_t ctx, void* smem);

/* ---- the slot pass (impl/slots.cuh) ---------------------------------------------------------- */

/* epf_ll_slots_block — the slot pass of one source's round: where each (token, k) pair of
 *   topk_idx lands in its expert rank's receive rows (row epf_ll_recv_row(plan, round, le, source,
 *   slot)). The dispatch send runs it; the combine receive runs it again, on the same operands,
 *   for peers that let it pull. Its result is the same on every run and for any block size.
 *   Scope:    [collective:block] [uniform-args]: every thread of the block, converged.
 *   Input:    topk_idx [num_tokens][K] of index_type (epf_index_type_t; 0 = INT64), num_tokens in
 *             [0, plan.max_tokens_per_rank]; s = epf_ll_slots_at(plan, smem, offset, num_tokens,
 *             blockDim.x). Local memory, not written during the call.
 *   Does:     the slot of pair (t, k) is its rank among this source's pairs with the same expert,
 *             in (t, k) order, counting first occurrences only: id -1, ids outside [-1, E)
 *             (dropped) and a repeated expert of a token (any k after the first k naming it) get
 *             no slot (EPF_LL_SLOT_NONE) and are not counted. The same rule as the route's SLOT
 *             (route/route.cuh): docs/concepts.md, "Slots in HT and LL".
 *   Result:   [result:all] the table in s: epf_ll_slot gives every pair's slot and expert, and
 *             epf__ll_slot_route a repeat's first occurrence; s.count[e] = this source's copies
 *             to expert e (<= num_tokens).
 *             dropped_routes: NULL, or a counter (the error record's dropped_routes) to which the
 *             block adds the ids outside [-1, E) (pass it from one block of the rank only).
 *   Scratch:  the table s in shared memory; __syncthreads inside, before and after. [smem-reuse]
 *   Memory:   reads topk_idx (each id once, EPF__LL_SLOT_PREFETCH steps of a warp in flight);
 *             no peer access, no fence. Blocking: no.
 *   Arch:     sm_70+ (__match_any_sync). */
EPF_DEVICE_INLINE void epf_ll_slots_block(const epf_plan_t* plan, const void* topk_idx, int index_type, int num_tokens,
                                          epf_ll_slots_t s, uint32_t* dropped_routes);

/* epf_ll_slot — the slot of pair `pair` = t * K + k (t < the pass's num_tokens) in a table that
 *   epf_ll_slots_block filled, and its expert in *out_expert; EPF_LL_SLOT_NONE (and *out_expert
 *   = -1) when the pair has no copy of its own. Scope: any thread, after the pass returned. */
EPF_DEVICE_INLINE uint32_t epf_ll_slot(const epf_plan_t* plan, epf_ll_slots_t s, int pair, int* out_expert);

/* ---- RANK_MAJOR rows, signal and count words, per-rank slots (impl/rm.cuh) ------------------- */

/* epf_ll_rm_fixed_row — RANK_MAJOR: the fixed order of one parity's receive rows, the one owner
 *   of the formula: slot `slot` of source `src` is row src * T + slot of [R][T] (= recv_capacity
 *   rows). Scope: any thread. Pure. */
EPF_HD int64_t epf_ll_rm_fixed_row(const epf_plan_t* plan, int src, int slot);

/* epf_ll_rm_recv_row — RANK_MAJOR: row of RECV_TOKENS / RECV_SCALES / RECV_META (pass it to
 *   epf_plan_recv_token_offset & co.) that holds slot `slot` of `src` in the round of `epoch`:
 *   (epoch & 1) * recv_capacity + epf_ll_rm_fixed_row(plan, src, slot). Scope: any thread. Pure. */
EPF_HD int64_t epf_ll_rm_recv_row(const epf_plan_t* plan, uint32_t epoch, int src, int slot);

/* epf_ll_rm_dispatch_signal_index — RANK_MAJOR: word of SIG_LL_DISPATCH in which `src` publishes
 *   (epoch, rows) to the window's owner: (epoch & 1) * R + src. Scope: any thread. Pure. */
EPF_HD int64_t epf_ll_rm_dispatch_signal_index(const epf_plan_t* plan, uint32_t epoch, int src);

/* epf_ll_rm_count_offset — RANK_MAJOR: byte offset (in the window of expert / EL) of the count
 *   word in which `src` publishes its copies to global expert `expert` in the round of `epoch`:
 *   COUNTS word (epoch & 1, src, expert) of epf_plan_counts_offset (HT uses the same words for its
 *   count exchange; an LL plan has no other use for them). Scope: any thread. Pure. */
EPF_HD uint64_t epf_ll_rm_count_offset(const epf_plan_t* plan, uint32_t epoch, int src, int expert);

/* epf_ll_rm_combine_row — RANK_MAJOR: row of the source's COMBINE region where the partial of
 *   (token, expert rank `rank`) of the round of `epoch` lands: ((epoch & 1) * T + token) * R + rank.
 *   Scope: any thread. Pure. */
EPF_HD int64_t epf_ll_rm_combine_row(const epf_plan_t* plan, uint32_t epoch, int token, int rank);

/* epf_ll_rm_weight_grad_row — RANK_MAJOR: row of the source's COMBINE region whose first 4 * top_k
 *   bytes receive the router-weight gradients of the entries of (token, rank `rank`) pushed in
 *   the backward-of-dispatch round of `epoch` (epf_ll_dispatch_backward; float j = the token's
 *   j-th entry on that rank in k order): the landing row of (token, rank) of the OTHER parity,
 *   epf_ll_rm_combine_row(plan, epoch + 1, token, rank). Nobody reads or writes that row between
 *   the push and the source's receive of the round (as epf_ll_weight_grad_row; docs/low-latency.md,
 *   "Training: the backward direction"); epf_ll_backward_check makes sure a row holds top_k FP32.
 *   Scope: any thread. Pure. */
EPF_HD int64_t epf_ll_rm_weight_grad_row(const epf_plan_t* plan, uint32_t epoch, int token, int rank);

/* epf_ll_rm_slots_at — the per-rank slot table that starts `offset` bytes into `smem`
 *   (epf_ll_smem_layout's rm_send_slots or rm_reduce_slots, at the same `threads`): T * K codes,
 *   then [nseg][R] histograms, then [R] counts; segments as epf_ll_slots_at. Scope: any thread. */
EPF_HD epf_ll_slots_t epf_ll_rm_slots_at(const epf_plan_t* plan, void* smem, size_t offset, int num_tokens, int threads);

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
                                             int num_tokens, epf_ll_slots_t s);

/* epf_ll_rm_slot — the slot of pair `pair` = t * K + k in a table that epf_ll_rm_slots_block
 *   filled, and its destination rank in *out_rank; EPF_LL_SLOT_NONE (and -1) when the pair
 *   carries no copy (it is not the first entry of its token on that rank, or its id is invalid).
 *   Scope: any thread, after the pass returned. */
EPF_DEVICE_INLINE uint32_t epf_ll_rm_slot(const epf_plan_t* plan, epf_ll_slots_t s, int pair, int* out_rank);

/* ---- dispatch, EXPERT_MAJOR (impl/dispatch.cuh) ---------------------------------------------- */

/* epf_ll_payload_supported — payloads the LL dispatch moves: BF16, and MXFP8 / per-128 FP8
 *   quantized on the fly by the sender (quant/quant.cuh lane8 blocks: once per token, then stored into
 *   every copy). */
EPF_HD bool epf_ll_payload_supported(int payload);

/* epf_ll_dispatch_send_block — the send half of LL dispatch for one rank.
 *   Scope:    [collective:block] [uniform-args]: every thread of each of the ctx.nblocks blocks of
 *             the rank calls it once per round, converged, with the same plan and args.
 *   Input:    a->x [num_tokens][hidden] BF16 (16-byte aligned), a->topk_idx [num_tokens][K],
 *             a->topk_weights (or NULL: 1.0f), a->num_tokens in [0, plan->max_tokens_per_rank]
 *             (checked on the host: epf_ll_tokens_check). Local memory, not written during the call.
 *   Does:     see the file manual; round epoch e = state.epoch[DISPATCH_SEND] + 1, parity e & 1.
 *             Rows land at epf_ll_recv_row(plan, e, le, rank, slot) in the destination's window
 *             with their metadata row (epf_recv_meta_em_t, k = the first k naming the expert).
 *   Result:   none. The last block to finish publishes (epoch e, rows) for every (destination,
 *             local expert) that is active in the rank's mask (all of them without fault
 *             tolerance), rows = copies sent there, and sets state.epoch[DISPATCH_SEND] = e.
 *   Scratch:  smem of epf_ll_dispatch_smem_bytes(plan, blockDim.x) bytes, 16-byte aligned.
 *             [smem-reuse]
 *   Memory:   plain 16-byte stores to peers; .sys release of the signal words after every block
 *             arrived (epf_arrive_last_block). Never waits: no co-residency needed.
 *   Limits:   plan checked with epf_ll_plan_check; payload epf_ll_payload_supported.
 *             Blocking: no. */
EPF_DEVICE_INLINE void epf_ll_dispatch_send_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                  const epf_ll_dispatch_args_t* a, void* smem);

/* epf_ll_combine_backward_send_block — the send half of the backward of the LL combine (training):
 *   an LL dispatch round of the output gradients. Everything as epf_ll_dispatch_send_block (same
 *   scope, slots, rows, signals, epochs: it IS a dispatch round of the rank; the receive half is
 *   epf_ll_dispatch_recv_block itself), with a->x = dy [num_tokens][hidden] BF16 and the same
 *   topk_idx / topk_weights / num_tokens as the forward round, except the metadata weight of each
 *   row: the row's COMBINE WEIGHT, the sum over the k of the token that read the row in the forward
 *   combine (its first occurrence and every repeat of the expert) of topk_weights[t][k], FP32 adds
 *   in ascending k from +0.0f (1.0f per k when topk_weights is NULL). The rows carry dy exactly, so
 *   the expert stage computes d out_row = weight * dy_row.
 *   Limits:   epf_ll_backward_check(plan) == EPF_OK (BF16 both ways; the launcher checks it).
 *   Rows:     the same (local expert, source, slot) as the forward round with the same routing, i.e.
 *             the same epf_ll_fixed_row / epf_ll_packed_row; the parity is this round's (*round). */
EPF_DEVICE_INLINE void epf_ll_combine_backward_send_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                          const epf_ll_dispatch_args_t* a, void* smem);

/* epf_ll_dispatch_recv_block — the receive half of LL dispatch for one rank.
 *   Scope:    [collective:block] [uniform-args] [blocking]: every thread of each of the
 *             ctx.nblocks blocks of the rank, once per round. Block b serves local experts
 *             b, b + nblocks, ... (blocks beyond E_local only take part in the completion).
 *   Does:     waits (bounded; masked sources skipped) for (epoch e, rows) of every (local expert,
 *             source), e = state.epoch[DISPATCH_RECV] + 1; writes a->recv_counts[le * R + src]
 *             (0 for a masked, late or aborted source), a->expert_counts[le] (if not NULL), and
 *             with a->packed_x / packed_meta / packed_scales (each optional) copies the rows to
 *             row epf_ll_packed_row(plan, le, pos) of those buffers, pos = rows of sources < src
 *             + slot. The last block to finish writes *a->round = e (if not NULL) and sets
 *             state.epoch[DISPATCH_RECV] = e.
 *   Result:   [result:all] EPF_OK, or the block's first failure by priority (EPF_ERR_TIMEOUT,
 *             EPF_ERR_ABORTED, EPF_ERR_PEER_MASKED); every failure is also in the error record
 *             except PEER_MASKED (a known-absent peer is not an error).
 *   After:    the rows of round e are valid until this rank's combine send of round e returns
 *             (or, without a combine, until its dispatch receive of round e + 1 returns).
 *   Scratch:  smem of epf_ll_dispatch_smem_bytes(plan, blockDim.x) bytes. [smem-reuse]
 *   Memory:   .sys acquire per signal word, then __syncthreads before any row is read.
 *   Co-residency: waits only on the send halves of the peers (and of this rank). In one launch
 *             with the send half, every block of the grid must be resident [needs-co-residency];
 *             in a later launch, nothing is needed. */
EPF_DEVICE_INLINE epf_status_t epf_ll_dispatch_recv_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                          const epf_ll_dispatch_args_t* a, void* smem);

/* ---- dispatch, RANK_MAJOR, and the rank-major expand (impl/dispatch_rm.cuh) ------------------ */

/* epf_ll_rm_dispatch_send_block — the send half of RANK_MAJOR LL dispatch for one rank.
 *   Scope:    [collective:block] [uniform-args]: every thread of each of the ctx.nblocks blocks of
 *             the rank calls it once per round, converged, with the same plan and args.
 *   Input:    as epf_ll_dispatch_send_block (a->x, a->topk_idx, a->topk_weights or NULL = 1.0f,
 *             a->num_tokens in [0, T], a->index_type); plan: a RANK_MAJOR LL plan.
 *   Does:     see the file manual; round e = state.epoch[DISPATCH_SEND] + 1, parity e & 1.
 *   Result:   none. The last block publishes, for every destination active in the rank's mask,
 *             its count words and then (epoch e, rows), and sets state.epoch[DISPATCH_SEND] = e.
 *   Scratch:  smem of epf_ll_dispatch_smem_bytes(plan, blockDim.x) bytes (the expert and the
 *             per-rank slot tables), 16-byte aligned. [smem-reuse]
 *   Memory:   plain stores to peers (payload, scales, metadata, count words); .sys release of the
 *             signal words after every block arrived. Never waits: no co-residency needed.
 *   Blocking: no. */
EPF_DEVICE_INLINE void epf_ll_rm_dispatch_send_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                     const epf_ll_dispatch_args_t* a, void* smem);

/* epf_ll_rm_dispatch_recv_block — the receive half of RANK_MAJOR LL dispatch for one rank.
 *   Scope:    [collective:block] [uniform-args] [blocking]: every thread of each of the
 *             ctx.nblocks blocks of the rank, once per round. Every block waits for every source.
 *   Does:     round e = state.epoch[DISPATCH_RECV] + 1; waits (bounded; masked sources skipped)
 *             for (epoch e, rows) of every source, reads its count words (one per local expert);
 *             block 0 writes a->recv_counts[le * R + src] (0 for a masked, late or aborted
 *             source; state.dispatch_fail[src] = e) and a->expert_counts[le] (if not NULL), the
 *             counts of the expert-major view; with a->packed_x / packed_scales / packed_meta
 *             (each optional) the rank's blocks expand the rows into that view (see the file
 *             manual). The last block to finish writes *a->round = e (if not NULL) and sets
 *             state.epoch[DISPATCH_RECV] = e.
 *   Result:   [result:all] EPF_OK, or the block's first failure by priority (EPF_ERR_TIMEOUT,
 *             EPF_ERR_ABORTED, EPF_ERR_PEER_MASKED), as epf_ll_dispatch_recv_block. Count words
 *             and metadata that fail their checks are recorded (EPF_ERR_BAD_METADATA) and skipped.
 *   After:    the rank-major rows of round e stay valid until this rank's combine send of round
 *             e (which, pulling, writes the partials over them): expand them before.
 *   Scratch:  smem of epf_ll_dispatch_smem_bytes(plan, blockDim.x) bytes. [smem-reuse]
 *   Memory:   .sys acquire per signal word, __syncthreads, then plain loads of the count words and
 *             rows. Co-residency: as epf_ll_dispatch_recv_block. */
EPF_DEVICE_INLINE epf_status_t epf_ll_rm_dispatch_recv_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                             const epf_ll_dispatch_args_t* a, void* smem);

/* epf_ll_rm_combine_backward_recv_block — the receive half of the backward of a RANK_MAJOR LL
 *   combine (training). The send half is epf_ll_rm_dispatch_send_block itself, with a->x = dy
 *   [num_tokens][hidden] BF16 and the same topk_idx / topk_weights / num_tokens as the forward
 *   round: the rows land in the same (source, slot) receive rows with the same rank-major metadata
 *   (the entries of the token on this rank in k order, each with its forward weight, local expert
 *   and expert slot). Everything here as epf_ll_rm_dispatch_recv_block (scope, waits, counts,
 *   expand, epochs), except the packed_meta weight of each view row the expand writes: the row's
 *   COMBINE WEIGHT, the sum over the entries naming that view row (its first occurrence and every
 *   repeat of the expert) of their weights, FP32 adds in ascending k from +0.0f — the expert
 *   stage computes d out_row = weight * dy_row. (epf_ll_rm_expand_block, the separate expand,
 *   keeps the forward's rule, the first entry's weight: expand in this receive half, or derive
 *   the combine weight from the rank-major rows' entries.)
 *   Limits:   epf_ll_backward_check(plan) == EPF_OK (BF16 both ways; the launcher checks it). */
EPF_DEVICE_INLINE epf_status_t epf_ll_rm_combine_backward_recv_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                                     const epf_ll_dispatch_args_t* a, void* smem);

/* epf_ll_rm_expand_block — the expand of a RANK_MAJOR LL round as a separate step: the rank-major
 *   rows of the last dispatch round this rank received (state.epoch[DISPATCH_RECV]) into the
 *   expert-major view (a->packed_x / packed_scales / packed_meta, each optional; see the file
 *   manual), with the counts a->recv_counts [EL][R] that the receive half of the round wrote.
 *   Scope:    [collective:block] [uniform-args]: every thread of each of the ctx.nblocks blocks of
 *             the rank, after the receive half of the round (a later launch; stream order) and
 *             before the combine send of the round. Any number of blocks.
 *   Does:     sources the receive half missed (state.dispatch_fail) expand nothing; metadata that
 *             fails its checks is reported (EPF_ERR_BAD_METADATA) and places nothing. Advances no
 *             epoch (it may run again, e.g. into another buffer).
 *   Scratch:  smem of epf_ll_dispatch_smem_bytes(plan, blockDim.x) bytes. [smem-reuse]
 *   Memory:   plain local loads and stores. Blocking: no. */
EPF_DEVICE_INLINE void epf_ll_rm_expand_block(const epf_plan_t* plan, epf_ll_ctx_t ctx, const epf_ll_dispatch_args_t* a,
                                              void* smem);

/* ---- combine, EXPERT_MAJOR (impl/combine.cuh) ------------------------------------------------ */

/* epf_ll_combine_payload_supported — what the LL combine carries back: BF16, or MXFP8 (the
 *   expert side quantizes with quant/quant.cuh's lane8 block, rule by EPF_FLAG_MX_SCALE_FLOOR; the
 *   source dequantizes inside the k-order FP32 sum). */
EPF_HD bool epf_ll_combine_payload_supported(int payload);

/* epf_ll_combine_pulls — the transport of an LL combine send with this plan and y_layout: true =
 *   PULL (the sources read the outputs from this rank's window), false = PUSH (this rank stores
 *   them into the sources' COMBINE rows). BF16 combine payload: pull iff y_layout is
 *   EPF_LL_Y_IN_PLACE_PULL (the outputs are read where the experts wrote them, nothing moves on
 *   the expert side). MXFP8 combine payload: pull iff the plan has an EXPERT_OUT region
 *   (epf_plan_compute gives every LL expert-major plan one unless EPF_FLAG_COMBINE_PUSH forces
 *   push), whatever y_layout: the send quantizes y into it. RANK_MAJOR plan (ll/impl/combine_rm.cuh,
 *   never an EXPERT_OUT region): pull iff y_layout is EPF_LL_Y_PACKED_PULL and both payloads are
 *   BF16 (the pre-reduced partials overwrite their receive rows). The send half acts on it and tells
 *   the sources in the signal word; a receive half uses it only as the hint to build its slot
 *   table early. A host call with a NULL plan gets false (EPF__HOST_CHECK). Scope: any thread,
 *   host or device. Pure. */
EPF_HD bool epf_ll_combine_pulls(const epf_plan_t* plan, int y_layout);

/* epf_ll_combine_send_block — the expert side: push this round's expert outputs to their sources.
 *   Scope:    [collective:block] [uniform-args]: every thread of each of the ctx.nblocks blocks of
 *             the rank, once per round, after the dispatch receive of the same round completed
 *             (an earlier launch) and after the experts wrote y.
 *   Input:    a->recv_counts [EL][R] as the dispatch receive wrote them; a->y and a->y_layout
 *             (epf_ll_y_layout_t; IN_PLACE needs the BF16 dispatch payload).
 *   Does:     round c = state.epoch[COMBINE_SEND] + 1 (it must equal the dispatch round: the
 *             stages run in lockstep, one combine per dispatch; otherwise EPF_ERR_INVALID_ARGUMENT
 *             is recorded, nothing is pushed and nobody is signalled: the sources time out and
 *             count this rank's experts as absent instead of reading stale rows). Sources that
 *             are masked now, or whose dispatch of this round the receive missed
 *             (state.dispatch_fail), get neither rows nor the signal, for the same reason.
 *             Metadata rows that do not name a valid (token < T, k < K, source) are skipped.
 *             Transport by epf_ll_combine_pulls(plan, a->y_layout): push (rows into the sources'
 *             COMBINE), BF16 pull (nothing moves) or MXFP8 pull (quantized rows into this rank's
 *             EXPERT_OUT at epf_plan_expert_out_offset(plan, epf_ll_recv_row(plan, c, le, src,
 *             slot))). The last block signals every other source and sets
 *             state.epoch[COMBINE_SEND] = c.
 *   Scratch:  smem of epf_ll_combine_smem_bytes(plan, blockDim.x) bytes. [smem-reuse]
 *   Memory:   plain stores to peers (push) or to the own window (MXFP8 pull); .sys release of the
 *             signal words after every block arrived. Blocking: no. */
EPF_DEVICE_INLINE void epf_ll_combine_send_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                 const epf_ll_combine_args_t* a, void* smem);

/* epf_ll_dispatch_backward_send_block — the expert side of the backward of the LL dispatch
 *   (training): an LL combine round of the expert-input gradients. Everything as
 *   epf_ll_combine_send_block (same scope, layouts, push / pull, signals, epochs: it IS a combine
 *   round of the rank, and it follows a dispatch round, normally epf_ll_combine_backward's), with
 *   a->y = dx rows (one per receive row, in y_layout's order; IN_PLACE / IN_PLACE_PULL: over the
 *   receive rows), plus, when a->weight_grad is not NULL, one FP32 per row in the same order (the
 *   router-weight gradient the expert stage computed for the row) carried to the source:
 *   pushed into the first 4 bytes of the source's landing row epf_ll_weight_grad_row(plan, c, t, k)
 *   (the other parity's landing row of the row's (t, k)); pulled (EPF_LL_Y_IN_PLACE_PULL): stored
 *   into the weight field of the row's own metadata row, where the source reads it. The signal
 *   word says so (EPF__LL_COMBINE_WGRAD).
 *   Limits:   epf_ll_backward_check(plan) == EPF_OK (BF16 both ways; the launcher checks it). */
EPF_DEVICE_INLINE void epf_ll_dispatch_backward_send_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                           const epf_ll_combine_args_t* a, void* smem);

/* epf_ll_combine_recv_block — the source side: wait for every rank, then reduce in k order.
 *   Scope:    [collective:block] [uniform-args] [blocking]: every thread of each of the
 *             ctx.nblocks blocks of the rank, once per round.
 *   Input:    a->topk_idx / a->topk_weights / a->num_tokens: exactly what this rank dispatched
 *             with in this round; a->out [num_tokens][hidden] BF16; a->y_layout only as a hint
 *             (EPF_LL_Y_IN_PLACE_PULL: the peers will likely let this rank pull, so the slot table
 *             is built while the signals are still on their way).
 *   Does:     round c = state.epoch[COMBINE_RECV] + 1; waits (bounded; masked ranks skipped) for
 *             SIG_LL_COMBINE[c & 1][d] of every rank d; writes out (see the file manual); the last
 *             block sets state.epoch[COMBINE_RECV] = c. The outputs of rank d come from this
 *             rank's COMBINE rows (d pushed: signal value 0) or straight from d's window (d
 *             signalled EPF__LL_COMBINE_PULL): row epf_ll_recv_row(plan, c, le, rank, slot) of its
 *             receive rows (BF16) or of its EXPERT_OUT (MXFP8), slot rebuilt from topk_idx exactly
 *             as the dispatch send computed it.
 *   Result:   [result:all] EPF_OK, or the block's first failure by priority (TIMEOUT, ABORTED,
 *             PEER_MASKED). A rank that failed contributes zero to this block's tokens.
 *   Scratch:  smem of epf_ll_combine_smem_bytes(plan, blockDim.x) bytes. [smem-reuse]
 *   Memory:   .sys acquire per rank, __syncthreads, then plain loads of the own COMBINE region
 *             and (pull) of the peers' receive rows or EXPERT_OUT rows.
 *   Co-residency: waits on the combine send halves of every rank; in one launch with them
 *             [needs-co-residency]. */
EPF_DEVICE_INLINE epf_status_t epf_ll_combine_recv_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                         const epf_ll_combine_args_t* a, void* smem);

/* epf_ll_dispatch_backward_recv_block — the source side of the backward of the LL dispatch
 *   (training). Everything as epf_ll_combine_recv_block (scope, waits, push / pull, masked ranks,
 *   epochs), except the sum: UNIT weights over the FIRST OCCURRENCES only (a repeated expert of a
 *   token contributes nothing: its gradient is already inside its first occurrence's row):
 *     out[t][h] = BF16_RNE( fma(1.0f, dx_{k_n}[h], ... fma(1.0f, dx_{k_0}[h], 0.0f)) )
 *   over the token's present first-occurrence entries k_0 < k_1 < ...; a->topk_weights is not read.
 *   With a->topk_weights_grad (not NULL): [num_tokens][top_k] FP32, for every k the gradient of
 *   the row k read in the forward (a repeat: its first occurrence's row), or 0 when the id is -1
 *   or dropped, its rank is absent this round, or the rank did not carry gradients (no weight_grad
 *   on its side). Written by the blocks that own chunk 0 of each token.
 *   Limits:   epf_ll_backward_check(plan) == EPF_OK (BF16 both ways; the launcher checks it). */
EPF_DEVICE_INLINE epf_status_t epf_ll_dispatch_backward_recv_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                                   const epf_ll_combine_args_t* a, void* smem);

/* ---- combine, RANK_MAJOR (impl/combine_rm.cuh) ----------------------------------------------- */

/* epf_ll_rm_combine_send_block — the expert side of a RANK_MAJOR LL combine: pre-reduce and send.
 *   Scope:    [collective:block] [uniform-args]: every thread of each of the ctx.nblocks blocks of
 *             the rank, once per round, after the dispatch receive of the same round (and the
 *             expand) completed and the experts wrote y.
 *   Input:    a->y: BF16 expert outputs [EL * R * T][hidden] in the order of the expert-major view
 *             (a->y_layout EPF_LL_Y_PACKED or EPF_LL_Y_PACKED_PULL: row epf_ll_packed_row, as the
 *             expand placed the inputs; EPF_LL_Y_FIXED: row epf_ll_fixed_row(plan, le, src,
 *             slot)); a->recv_counts [EL][R] as the dispatch receive wrote them.
 *   Does:     round c = state.epoch[COMBINE_SEND] + 1, which must equal the dispatch round
 *             (otherwise EPF_ERR_INVALID_ARGUMENT is recorded, nothing is sent, nobody is
 *             signalled, as epf_ll_combine_send_block; also for a y_layout other than FIXED,
 *             PACKED, PACKED_PULL or a NULL y / recv_counts). See the file manual. Sources that
 *             are masked now or whose dispatch of this round the receive missed get neither rows
 *             nor the signal. Rows whose metadata fails its checks are reported
 *             (EPF_ERR_BAD_METADATA) and send nothing; an entry past its (expert, source) group
 *             contributes nothing (reported). The last block sets state.epoch[COMBINE_SEND] = c.
 *   Scratch:  smem of epf_ll_combine_smem_bytes(plan, blockDim.x) bytes. [smem-reuse]
 *   Memory:   plain loads of y (local) and stores to the sources' COMBINE rows (push) or this
 *             rank's receive rows (pull); .sys release of the signal words after every block
 *             arrived. Blocking: no. */
EPF_DEVICE_INLINE void epf_ll_rm_combine_send_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                    const epf_ll_combine_args_t* a, void* smem);

/* epf_ll_rm_dispatch_backward_send_block — the expert side of the backward of a RANK_MAJOR LL
 *   dispatch (training): an LL rank-major combine round of the expert-input gradients.
 *   Everything as epf_ll_rm_combine_send_block (scope, y layouts FIXED / PACKED / PACKED_PULL,
 *   push / pull, signals, epochs: it IS a combine round of the rank, and it follows a dispatch
 *   round, normally epf_ll_combine_backward's), with a->y = dx rows (one per view row, in
 *   y_layout's order), except the pre-reduce: per rank-major row, UNIT weights over the row's
 *   DISTINCT view rows, each once at its first entry in k (a repeated expert adds nothing: its
 *   gradient is already in its first occurrence's row): p = fma(1, dx_{j_n}, ... fma(1, dx_{j_0},
 *   0.0f)), rounded to BF16. With a->weight_grad (not NULL: one FP32 per view row, y's order), each
 *   entry j of the row carries its view row's value (0 for an entry that fails its checks) to the
 *   source: pushed into float j of the source's row epf_ll_rm_weight_grad_row(plan, c, token,
 *   rank) (the other parity's landing row of (token, rank)); pulled (EPF_LL_Y_PACKED_PULL): into
 *   entry j's weight field of the row's own metadata (epf_combine_weight_grad_ptr). The signal
 *   word says so (EPF__LL_COMBINE_WGRAD).
 *   Limits:   epf_ll_backward_check(plan) == EPF_OK (BF16 both ways; the launcher checks it). */
EPF_DEVICE_INLINE void epf_ll_rm_dispatch_backward_send_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                              const epf_ll_combine_args_t* a, void* smem);

/* epf_ll_rm_combine_recv_block — the source side of a RANK_MAJOR LL combine: wait for every rank,
 *   then sum the partials.
 *   Scope:    [collective:block] [uniform-args] [blocking]: every thread of each of the
 *             ctx.nblocks blocks of the rank, once per round.
 *   Input:    a->topk_idx / a->topk_weights / a->num_tokens / a->index_type: exactly what this rank
 *             dispatched with in this round (the weights are not read: the expert side applied
 *             them); a->out [num_tokens][hidden] BF16; a->y_layout only as a hint
 *             (EPF_LL_Y_PACKED_PULL: build the per-rank slot table before waiting).
 *   Does:     round c = state.epoch[COMBINE_RECV] + 1; waits (bounded; masked ranks skipped) for
 *             SIG_LL_COMBINE[c & 1][d] of every rank d; writes out (see the file manual): the
 *             partial of (t, d) comes from this rank's COMBINE row epf_ll_rm_combine_row(plan, c, t,
 *             d) (d pushed) or from d's receive row epf_ll_rm_recv_row(plan, c, rank, slot) (d
 *             signalled EPF__LL_COMBINE_PULL; slot rebuilt from topk_idx exactly as the dispatch
 *             send computed it). The last block sets state.epoch[COMBINE_RECV] = c.
 *   Result:   [result:all] EPF_OK, or the block's first failure by priority (TIMEOUT, ABORTED,
 *             PEER_MASKED). A rank that failed contributes zero to this block's tokens.
 *   Scratch:  smem of epf_ll_combine_smem_bytes(plan, blockDim.x) bytes. [smem-reuse]
 *   Memory:   .sys acquire per rank, __syncthreads, then plain loads of the own COMBINE region and
 *             (pull) of the peers' receive rows. Co-residency: as epf_ll_combine_recv_block. */
EPF_DEVICE_INLINE epf_status_t epf_ll_rm_combine_recv_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                            const epf_ll_combine_args_t* a, void* smem);

/* epf_ll_rm_dispatch_backward_recv_block — the source side of the backward of a RANK_MAJOR LL
 *   dispatch (training). Everything as epf_ll_rm_combine_recv_block (scope, waits, push / pull,
 *   masked ranks, epochs, the sum: weight 1 per rank's partial in the order of each rank's first
 *   occurrence in k, FP32 from +0.0f, BF16 out): out = dx [num_tokens][hidden]. With
 *   a->topk_weights_grad (not NULL): [num_tokens][top_k] FP32, for every k the gradient of the
 *   view row k read in the forward (a repeat: its first occurrence's row, the same value), or 0
 *   when the id is -1 or dropped, its rank is absent this round or did not carry gradients (no
 *   weight_grad on its side). Entry j of (t, rank d) = the j-th k of the token on d, in k order.
 *   Written by the warps that own chunk 0 of each token. a->topk_weights is not read.
 *   Limits:   epf_ll_backward_check(plan) == EPF_OK (BF16 both ways; the launcher checks it). */
EPF_DEVICE_INLINE epf_status_t epf_ll_rm_dispatch_backward_recv_block(const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                                                      const epf_ll_combine_args_t* a, void* smem);

EPF_END_DECLS

/* the definitions, by part: */
#include "impl/layout.cuh"      /* EPF_HD: state init, checks, rows, buffers, shared memory */
#include "impl/phase.cuh"       /* device: waits, epochs, phase completion, mask, mask clean */
#include "impl/slots.cuh"       /* device: the slot pass, private block helpers */
#include "impl/rm.cuh"          /* RANK_MAJOR: rows, signal / count words, combine rows, per-rank slots */
#include "impl/frame.cuh"       /* private: the prologue of the LL bodies, built once */
#include "impl/dispatch.cuh"    /* the dispatch blocks (EXPERT_MAJOR) */
#include "impl/dispatch_rm.cuh" /* the dispatch blocks (RANK_MAJOR) and the rank-major expand */
#include "impl/combine.cuh"     /* the combine blocks (EXPERT_MAJOR) */
#include "impl/combine_rm.cuh"  /* the combine blocks (RANK_MAJOR) */

#endif /* EPF_LL_LL_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
