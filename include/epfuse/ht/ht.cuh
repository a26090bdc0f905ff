/* epfuse/ht/ht.cuh — high-throughput (HT) dispatch and combine: the payload blocks and the per-token blocks over the route — part of epfuse v0.1
 *
 * What it is: the device side of high-throughput expert parallelism, declared here with each
 * contract; the bodies are in impl/, in three parts:
 *   - dispatch (impl/dispatch.cuh): one warp copies a token row straight into its final slot in
 *     every destination's receive region (as it is, or quantized on the way), with its metadata;
 *     where a receive scale lives; the RANK_MAJOR expand into the expert-major view; the stage's
 *     signal and bounded wait.
 *   - combine (impl/combine.cuh): the way back. The source weighs the expert outputs of its
 *     token's copies and reduces them in FP32 in k order (pull from the expert rank's window, or
 *     push into the source's COMBINE region); the RANK_MAJOR pre-reduce on the expert side; the
 *     stage's signal and bounded wait.
 *   - the blocks over the route (impl/view.cuh): one rank's view of a step (epf_ht_view_t, read
 *     from the route of the step, route/route.cuh), one token's dispatch, one token's combine, the
 *     expert side's share of the receive rows, and the same for training (the backward of
 *     combine is a dispatch, the backward of dispatch a unit-weight combine). Every token and every
 *     receive row is one warp's work, in any order. The ready-made kernels (ht/kernels.cuh) are
 *     loops over these blocks and nothing more.
 * The row helpers LL uses too (the RANK_MAJOR metadata reader, the router-weight gradient's
 * slot, the BF16 steps of the k-order sum) are in core/rows.cuh and core/bf16.cuh.
 *
 * Vocabulary (HT and LL alike): a STAGE is dispatch or combine; each stage has two HALVES, send
 * (EPF_HT_SEND) and receive (EPF_HT_RECV); a ready-made call runs one of them or both (EPF_HT_BOTH).
 *
 * What it does NOT do: update the route (route/), launch (ht/kernels.cuh), allocate, or order
 * anything beyond what each contract says.
 *
 * Usage (one step of a fused kernel; ht/kernels.cuh composes the same calls):
 *   epf_ht_view_t v = epf_ht_view(&route, team, &plan, index, topk_idx, topk_weights);
 *   for (t = warp; t < v.T; t += nwarps) dropped += epf_ht_dispatch_token_warp(&v, &plan, x_row(t), NULL, 0, t, &w);
 *   if (epf_arrive_last_block_epoch(&arrive[0], blocks_per_rank, v.epoch))
 *     epf_dispatch_signal_block(team, &plan, v.epoch);
 *   ... the experts run on the receive rows (epf_ht_recv_rows of them) ...
 *   epf_ht_combine_expert_warp(&v, &plan, expert_out, expert_rows, warp, nwarps, &w);
 *   ... arrive, epf_combine_signal_block, epf_combine_wait_block ...
 *   for (t = warp; t < v.T; t += nwarps) epf_ht_combine_token_warp(&v, &plan, t, out + t * H, &w);
 *
 * Contents: the types (epf_ht_view_t, EPF_HT_SEND / _RECV / _BOTH: impl/types.cuh), then every
 * public function below with its contract, by part; each impl/ file's manual has the part's
 * summary.
 *
 * Requirements: CUDA, sm_80+ (BF16 conversions; sm_90 / sm_100 tested). Rows 16-byte aligned
 * (row_bytes is a multiple of 16 by the plan's hidden-size rules).
 */
#ifndef EPF_HT_HT_CUH
#define EPF_HT_HT_CUH

#include "../config.h"

#if !EPF_IS_CUDA
#error "epfuse/ht/ht.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

#include "../host.h"
#include "../core/ptx.cuh"
#include "../core/rows.cuh"
#include "../core/signal.cuh"
#include "../core/team.cuh"
#include "../quant/quant.cuh"

#include "impl/types.cuh" /* epf_ht_view_t, EPF_HT_SEND / _RECV / _BOTH */

EPF_BEGIN_DECLS

/* ---- dispatch (impl/dispatch.cuh) ------------------------------------------------------------ */

/* epf_copy_row_warp — copy `bytes` (multiple of 16) from src to dst with 16-byte accesses,
 *   EPF_COPY_UNROLL loads per lane in flight before the first store.
 *   Scope: [collective:warp] [uniform-args]. Memory: plain loads and stores, no ordering. */
EPF_DEVICE_INLINE void epf_copy_row_warp(void* dst, const void* src, uint32_t bytes);

/* epf_topk_first_lane_warp — the DUPLICATE rule of epfuse, for a warp that holds one token's ids
 *   (lane k < top_k: expert id e_k, -1 for none; other lanes -1): the lowest lane whose id equals
 *   this lane's. A lane whose result is not itself holds a REPEAT: an expert the token already
 *   named at a lower k. A repeat gets no copy of its own (the route gives it DST_RANK = SLOT = -1
 *   and counts each (token, expert) once); in the combine it uses its first occurrence's output
 *   with its own weight, in k order. A lane with e < 0 gets itself.
 *   Scope: [collective:warp], converged. */
EPF_DEVICE_INLINE int epf_topk_first_lane_warp(int e);

/* epf_dispatch_send_row_warp — copy one token row into up to 32 destination slots.
 *   Scope:    [collective:warp] every lane, converged; src_row and ncopies uniform.
 *   Input:    lane j < ncopies holds copy j: (dst_rank, dst_row) = destination rank and row of the
 *             destination's RECV_TOKENS region (dst_rank < 0: no copy). Lanes >= ncopies ignored.
 *             src_row: plan->row_bytes bytes, 16-byte aligned, local memory, not written during
 *             the call.
 *   Does:     reads the row once (EPF_SEND_UNROLL 16-byte vectors per lane in flight) and stores it
 *             into every present copy. A copy whose dst_row is outside [0, recv_capacity) is
 *             dropped (never written).
 *   Result:   [result:all] the number of dropped copies (the caller counts them, e.g. with
 *             epf_error_count_add(&rec->recv_overflow, n) from lane 0).
 *   Memory:   plain stores to peers; nothing is published: signal after the copies (see
 *             epf_arrive_last_block + epf_dispatch_signal_block). */
EPF_DEVICE_INLINE uint32_t epf_dispatch_send_row_warp(epf_team_t team, const epf_plan_t* plan, const void* src_row,
                                                      int dst_rank, int64_t dst_row, int ncopies);

/* epf_recv_scale_offset — where the scale of receive row `row`, scale column `col` lives, as a
 *   byte offset in the rank's window slice: THE owner of a receive scale's position, for every
 *   scale layout (readers and the tests' references read through it; the dispatch writes through
 *   it, or, for a plan that stages its scales (epf_plan_scales_staged: HT EXPERT_MAJOR with
 *   SEGMENT_MN_MAJOR or SWIZZLED_128X4), its receive half does: epf_dispatch_scales_finish_block). MXFP8: one E8M0 byte per 32 elements (cols = hidden / 32); FP8-128: one FP32 per 128
 *   (cols = hidden / 128).
 *     COMPACT           row-major [rows][cols] from the RECV_SCALES start
 *     SWIZZLED_128X4    epf_scale_swizzle_offset(row, col, cols) from the RECV_SCALES start
 *     SEGMENT_MN_MAJOR  row's expert segment [seg_begin, seg_begin + seg_rows) (the route's
 *                       segment: begin, padded_count) holds the FP32 matrix [cols][seg_rows],
 *                       row index contiguous, at scale element seg_begin * cols:
 *                       (seg_begin * cols + col * seg_rows + (row - seg_begin)) * 4
 *   seg_begin / seg_rows are read by SEGMENT_MN_MAJOR only (pass anything, e.g. 0, otherwise);
 *   there the position is meaningful only where epf_recv_scale_seg_fits says so.
 *   Scope: any thread, host or device. Pure. */
EPF_HD uint64_t epf_recv_scale_offset(const epf_plan_t* plan, int64_t row, int col, int64_t seg_begin, int64_t seg_rows);

/* epf_recv_scale_seg_fits — may row `row`'s scales be written at (read from) epf_recv_scale_offset
 *   with this segment? Always for COMPACT and SWIZZLED_128X4. SEGMENT_MN_MAJOR: the row lies in
 *   the segment and the whole segment lies below recv_capacity (a segment cut by the capacity is
 *   no GEMM operand: its rows past the capacity were dropped and counted as recv_overflow, and
 *   its scales are not written at all, so nothing lands outside RECV_SCALES).
 *   Scope: any thread, host or device. Pure. */
EPF_HD bool epf_recv_scale_seg_fits(const epf_plan_t* plan, int64_t row, int64_t seg_begin, int64_t seg_rows);

/* epf_recv_scale_col_offset — epf_recv_scale_offset for the layouts without segments (COMPACT,
 *   SWIZZLED_128X4; a SEGMENT_MN_MAJOR plan needs the segment: use epf_recv_scale_offset).
 *   Scope: any thread. Pure. */
EPF_HD uint64_t epf_recv_scale_col_offset(const epf_plan_t* plan, int64_t row, int col);

/* epf_dispatch_send_row_quant_seg_warp — the quantizing send: one BF16 row, quantized on the way to
 *   plan.payload (MXFP8 or FP8_128; plan.flags pick the rounding rules, as quant/quant.cuh documents),
 *   into up to 32 destination rows, with its scales as one compact run per copy: at the copy's
 *   scale position in a COMPACT plan, in the copy's stage run (epf_plan_recv_scale_stage_offset) in
 *   a plan that stages its scales (epf_plan_scales_staged), whose receive half then rearranges them
 *   (epf_dispatch_scales_finish_block); RANK_MAJOR swizzled scales go straight to
 *   epf_recv_scale_offset. seg_begin / seg_rows are ignored (the segments matter to the receive half
 *   only), kept for one release: call epf_dispatch_send_row_quant_warp. Up to 8 copies of a plan
 *   with compact runs take the register-held loop; other tokens (and RANK_MAJOR swizzled scales) the
 *   general one. Copies are lane-held exactly as for
 *   epf_dispatch_send_row_warp (lane j < ncopies: copy j, dst_rank < 0 = none, dst_row at or past
 *   recv_capacity = dropped). Returns the dropped copies (the same value in every lane): the caller
 *   counts them (epf_error_count_add(&rec->recv_overflow, n) from lane 0). Each element is
 *   quantized once, whatever the number of copies. Memory: plain 8-byte stores of the payload and
 *   1-byte / 4-byte scale stores to the peers; the caller publishes them (epf_dispatch_signal_block).
 *   [collective:warp] Requirements: src_row 16-byte aligned, hidden % (32 | 128) == 0. */
EPF_DEVICE_INLINE uint32_t epf_dispatch_send_row_quant_seg_warp(epf_team_t team, const epf_plan_t* plan, const void* src_row,
                                                                int dst_rank, int64_t dst_row, int ncopies, int seg_begin,
                                                                int seg_rows);

/* epf_dispatch_send_row_quant_warp — the quantizing send, for every scale layout (the _seg form
 *   without its ignored segment arguments). [collective:warp], as the _seg form. */
EPF_DEVICE_INLINE uint32_t epf_dispatch_send_row_quant_warp(epf_team_t team, const epf_plan_t* plan, const void* src_row,
                                                            int dst_rank, int64_t dst_row, int ncopies);

/* epf_dispatch_send_scales_seg_warp — forward a caller-quantized row's compact scales (MXFP8:
 *   hidden / 32 E8M0 bytes; FP8-128: hidden / 128 floats) to every present copy: its compact scale
 *   position, or its stage run in a plan that stages its scales (epf_plan_scales_staged; the
 *   receive half rearranges them: epf_dispatch_scales_finish_block), or its swizzled position
 *   (RANK_MAJOR). seg_begin / seg_rows are ignored, kept for one release. Copies as for
 *   epf_dispatch_send_row_warp (send the row itself with that). [collective:warp] */
EPF_DEVICE_INLINE void epf_dispatch_send_scales_seg_warp(epf_team_t team, const epf_plan_t* plan, const uint8_t* src_scales,
                                                         int dst_rank, int64_t dst_row, int ncopies, int seg_begin,
                                                         int seg_rows);

/* epf_dispatch_send_scales_warp — epf_dispatch_send_scales_seg_warp without the ignored segment
 *   arguments; every scale layout. [collective:warp] */
EPF_DEVICE_INLINE void epf_dispatch_send_scales_warp(epf_team_t team, const epf_plan_t* plan, const uint8_t* src_scales,
                                                     int dst_rank, int64_t dst_row, int ncopies);

/* epf_dispatch_meta_em — write one EXPERT_MAJOR metadata row (epf_recv_meta_em_t) beside a copy.
 *   Scope: any single thread (typically lane j for copy j). Skips absent / out-of-range copies,
 *   exactly as epf_dispatch_send_row_warp does. Memory: one 16-byte plain store to the peer. */
EPF_DEVICE_INLINE void epf_dispatch_meta_em(epf_team_t team, const epf_plan_t* plan, int dst_rank, int64_t dst_row,
                                            int src_token, int k, int local_expert, float weight);

/* epf_dispatch_send_token_warp — one token's payload to all its copies, whatever the payload:
 *   a BF16 plan copies the row (epf_dispatch_send_row_warp); a quantized plan either quantizes the
 *   BF16 row on the way (quantize != 0: epf_dispatch_send_row_quant_warp) or forwards a row already
 *   in plan.payload format and its compact scales (quantize == 0: epf_dispatch_send_row_warp +
 *   epf_dispatch_send_scales_warp; src_scales NULL: no scales are sent).
 *   Scope: [collective:warp] every lane, converged; src_row, src_scales, quantize, ncopies uniform.
 *   Copies lane-held as for epf_dispatch_send_row_warp; seg_begin / seg_rows are ignored (kept
 *   for one release; the segments matter to the receive half only).
 *   Result: [result:all] the dropped copies. */
EPF_DEVICE_INLINE uint32_t epf_dispatch_send_token_warp(epf_team_t team, const epf_plan_t* plan, const void* src_row,
                                                        const uint8_t* src_scales, int quantize, int dst_rank,
                                                        int64_t dst_row, int ncopies, int seg_begin, int seg_rows);

/* epf_dispatch_meta_rm_warp — write the RANK_MAJOR metadata row (epf_recv_meta_rm_*) of every
 *   copy of one token: header (src_token, team.rank, entry count), then, in k order, each of the
 *   token's top-k entries that lives on that copy's rank.
 *   Scope:    [collective:warp] every lane, converged; src_token uniform.
 *   Input:    lane j < ncopies holds copy j (dst_rank, dst_row) exactly as for
 *             epf_dispatch_send_row_warp (absent or out-of-range copies are skipped). Lane k <
 *             plan->top_k holds the token's entry k: entry_rank, the rank its expert lives on (-1:
 *             none, left out of every list), its local expert there, its weight and its
 *             expert-major slot (the route's slot; a repeated expert lists its first occurrence's).
 *   Memory:   plain 4-byte stores to the peers; published with the rows (epf_dispatch_signal_block). */
EPF_DEVICE_INLINE void epf_dispatch_meta_rm_warp(epf_team_t team, const epf_plan_t* plan, int src_token, int dst_rank,
                                                 int64_t dst_row, int ncopies, int entry_rank, int local_expert,
                                                 float weight, int slot);

/* epf_expand_row_warp — RANK_MAJOR: place receive row `row` (payload and, for quantized payloads,
 *   its scales) at each of its expert-major view rows. A repeated expert lists its first
 *   occurrence's view row again: each view row is written once.
 *   Scope:    [collective:warp] every lane, converged; uniform arguments.
 *   Input:    view: this rank's [expert_rows][plan->row_bytes] rows; view_scales: their compact
 *             scales ([expert_rows][plan->scale_bytes_per_row], whatever the window's scale
 *             layout), or NULL; src_offset as for epf_recv_meta_rm_read_warp.
 *   Does:     bad metadata is reported (EPF_ERR_BAD_METADATA into w->record) and places nothing;
 *             view rows at or past expert_rows are not written.
 *   Result:   [result:all] how many view rows were past expert_rows (the caller counts them in
 *             recv_overflow: never silent).
 *   Memory:   plain local loads and stores. */
EPF_DEVICE_INLINE uint32_t epf_expand_row_warp(epf_team_t team, const epf_plan_t* plan, int64_t row,
                                               const int32_t* src_offset, char* view, uint8_t* view_scales,
                                               int64_t expert_rows, const epf_wait_t* w);

/* epf_dispatch_signal_block — publish this rank's dispatch of `epoch` to every peer: thread p
 *   release-stores (epoch, 0) into SIG_DISPATCH[team.rank] of peer p.
 *   Scope: [collective:block], called by the block that epf_arrive_last_block chose.
 *   Memory: .sys release; ordered after everything the rank's blocks wrote before arriving. */
EPF_DEVICE_INLINE void epf_dispatch_signal_block(epf_team_t team, const epf_plan_t* plan, uint32_t epoch);

/* epf_dispatch_wait_block — the receive half: wait until every peer published dispatch `epoch`.
 *   Scope:    [collective:block] [blocking]; any number of blocks of a rank may call it.
 *   Result:   [result:all] EPF_OK, or the first failure by priority (TIMEOUT, ABORTED,
 *             PEER_MASKED: a masked peer sent nothing this round).
 *   Memory:   .sys acquire per peer, then __syncthreads: after OK every thread of the block may read
 *             the receive region. */
EPF_DEVICE_INLINE epf_status_t epf_dispatch_wait_block(epf_team_t team, const epf_plan_t* plan, uint32_t epoch,
                                                       epf_wait_t w);

/* epf_dispatch_scales_finish_block — the receive half's last step for a plan that stages its
 *   scales (epf_plan_scales_staged: HT EXPERT_MAJOR, SEGMENT_MN_MAJOR or SWIZZLED_128X4): copy the
 *   stage run of every received row of this rank's segments into the plan's layout
 *   (epf_recv_scale_offset), so that a GEMM can read them in place. Does nothing for other plans.
 *   Scope:    [collective:block] [uniform-args] blocks block = 0 .. nblocks - 1 of the rank each
 *             call it once (every thread, converged), AFTER their own epf_dispatch_wait_block
 *             returned EPF_OK or EPF_ERR_PEER_MASKED; the blocks share the work: items of 128 rows
 *             x 32 stage bytes, dealt round-robin over every warp of the rank. The caller orders the result before its readers (a kernel boundary,
 *             or the rank's blocks meeting, e.g. epf_rank_barrier_block).
 *   Input:    seg: this rank's receive segments [plan.experts_per_rank] (the route's
 *             EPF_ROUTE_RECV_SEGMENT). Rows [begin, begin + count) of each segment, clipped at
 *             recv_capacity, are rearranged; a SEGMENT_MN_MAJOR segment that does not fit the
 *             capacity (epf_recv_scale_seg_fits) gets none (its rows past the capacity were dropped
 *             and counted). Pad rows and the padding columns of a 128x4 atom are not written (the
 *             padding columns of a rearranged row's last atom get zeros).
 *   Memory:   loads of the local stage runs, plain stores into the local RECV_SCALES; nothing is
 *             published. Work: 2 x the scale bytes of the received rows, in whole sectors (the
 *             send's scattered stores cost 1.86x the compact dispatch; the rearrangement measured ~60 us
 *             of a 1,021 us DeepSeek-V3 FP8 dispatch on an H100, all after the slowest peer:
 *             docs/quant.md). */
EPF_DEVICE_INLINE void epf_dispatch_scales_finish_block(epf_team_t team, const epf_plan_t* plan,
                                                        const epf_route_segment_t* seg, int block, int nblocks);

/* ---- combine (impl/combine.cuh) -------------------------------------------------------------- */

/* epf_combine_reduce_rows_warp — out = BF16(fma chain over a lane-held list of rows, in order).
 *   Scope:    [collective:warp] every lane, converged; present, hidden, mxfp8, out_row uniform.
 *   Input:    lane j holds row j's address (any memory this GPU can load: local or a peer's
 *             window) and weight; `present` marks the rows to use (up to 32); they are used in
 *             ascending lane order (the caller puts copies in k order). Rows are BF16 [hidden]
 *             (mxfp8 == 0) or MXFP8 [hidden bytes E4M3][hidden / 32 E8M0 scales] (mxfp8 != 0).
 *             hidden: any multiple of 8 (of 32 with mxfp8).
 *   Does:     acc = fma(w_j, y_j, acc) from acc = 0 for j ascending, in FP32; RNE to BF16. Up to 8
 *             rows are loaded before the first fma (loads in flight, not one at a time).
 *   Memory:   plain loads; plain local stores. */
EPF_DEVICE_INLINE void epf_combine_reduce_rows_warp(const void* my_row, float my_w, uint32_t present, int hidden,
                                                    int mxfp8, void* out_row);

/* epf_combine_pull_row_warp — reduce one token's expert outputs, loading them from the peers.
 *   Scope:    [collective:warp] every lane, converged; ncopies, out_row uniform.
 *   Input:    lane j < ncopies holds copy j in k order: the rank that received it (src_rank < 0:
 *             not routed, skipped), its receive row there (src_row; outside [0, recv_capacity):
 *             dropped at dispatch, skipped) and its weight. The outputs are combine_payload rows
 *             (BF16 or MXFP8) at epf_plan_expert_out_offset(plan, src_row) of that rank's window.
 *   Does:     out[h] = BF16_RNE(fma(w_{j_n}, y_{j_n}[h], ... fma(w_{j_0}, y_{j_0}[h], 0))) over the
 *             present copies in ascending j (epf_combine_reduce_rows_warp); a token with no present
 *             copy gets zeros.
 *   Memory:   plain loads from peers (call after epf_combine_wait_block); plain local stores. */
EPF_DEVICE_INLINE void epf_combine_pull_row_warp(epf_team_t team, const epf_plan_t* plan, int src_rank,
                                                 int64_t src_row, float weight, int ncopies, void* out_row);

/* epf_combine_put_row_warp — write one BF16 expert output row as a combine_payload row at dst:
 *   a copy (BF16) or an MXFP8 quantization (hidden E4M3 bytes, then hidden / 32 E8M0 scales, rule
 *   from the plan's flags). Scope: [collective:warp] [uniform-args]. dst: local or a peer's
 *   window, 16-byte aligned. Memory: plain loads and stores, nothing published. */
EPF_DEVICE_INLINE void epf_combine_put_row_warp(const epf_plan_t* plan, const void* src_bf16, char* dst);

/* epf_combine_push_row_warp — push one expert output row into row `combine_row` of the source's
 *   COMBINE region (EXPERT_MAJOR: token * top_k + k; RANK_MAJOR: token * nranks + this rank), as
 *   epf_combine_put_row_warp writes it. dst_rank < 0 or a row outside the region: no-op.
 *   Scope: [collective:warp] [uniform-args].
 *   Memory: plain stores to the peer; publish with epf_arrive_last_block + epf_combine_signal_block. */
EPF_DEVICE_INLINE void epf_combine_push_row_warp(epf_team_t team, const epf_plan_t* plan, const void* expert_out_row,
                                                 int dst_rank, int64_t combine_row);

/* epf_combine_expert_row_em_warp — EXPERT_MAJOR expert side, one receive row: put the expert
 *   output `y` (BF16 [hidden], local) where the row's source will read it.
 *   Push plans (EPF_FLAG_COMBINE_PUSH): into the source's COMBINE row (src_token * top_k + k), both
 *   named by the row's metadata (epf_recv_meta_em_t), which is checked before it forms an address
 *   (EPF_ERR_BAD_METADATA into w->record; nothing is pushed). Pull plans: at the row's
 *   epf_plan_expert_out_offset, as a combine_payload row — nothing to do when y already is there
 *   (outputs written in place over the received BF16 rows).
 *   Scope: [collective:warp] every lane, converged; uniform arguments.
 *   Memory: plain stores (local or to the source); publish with epf_arrive_last_block +
 *   epf_combine_signal_block. */
EPF_DEVICE_INLINE void epf_combine_expert_row_em_warp(epf_team_t team, const epf_plan_t* plan, int64_t row, const void* y,
                                                      const epf_wait_t* w);

/* epf_combine_prereduce_rm_row_warp — RANK_MAJOR expert side, one receive row: the partial of this
 *   rank's entries of the row's token, fma in k order (repeats included: they name their first
 *   occurrence's view row, with their own weight) from 0 in FP32, written as one combine_payload
 *   row: into the source's COMBINE row (src_token * nranks + team.rank) for push plans, at the
 *   row's epf_plan_expert_out_offset for pull plans.
 *   Scope:    [collective:warp] every lane, converged; uniform arguments.
 *   Input:    expert_out: this rank's expert outputs in the expert-major view's row order (BF16
 *             [expert_rows][hidden]); src_offset as for epf_recv_meta_rm_read_warp.
 *   Does:     the metadata is checked before it forms an address (EPF_ERR_BAD_METADATA into
 *             w->record; a bad header writes nothing); entries whose view row is at or past
 *             expert_rows (not placed by the expand) contribute nothing.
 *   Memory:   plain loads, plain stores (local or to the source); publish as above. */
EPF_DEVICE_INLINE void epf_combine_prereduce_rm_row_warp(epf_team_t team, const epf_plan_t* plan, int64_t row,
                                                         const int32_t* src_offset, const void* expert_out,
                                                         int64_t expert_rows, const epf_wait_t* w);

/* epf_combine_prereduce_rm_row_unit_warp — the backward of the RANK_MAJOR dispatch, expert side, one
 *   receive row: the partial of the row's token over this rank's entries with UNIT weights, each
 *   view row once (a repeat adds nothing: its gradient is already in its first occurrence's row),
 *   in k order from 0 in FP32 (acc = fma(1, dx_row, acc)), written where
 *   epf_combine_prereduce_rm_row_warp writes (push: the source's COMBINE row; pull: the row's
 *   epf_plan_expert_out_offset). weight_grad (this rank's [expert_rows] FP32, in view order, or
 *   NULL): each entry j's router-weight gradient — its view row's value, 0 for a row at or past
 *   expert_rows — goes into the row's metadata (epf_combine_weight_grad_ptr), where the source
 *   reads it.
 *   Scope:    [collective:warp] every lane, converged; uniform arguments.
 *   Input:    dx_rows: this rank's input gradients (BF16 [expert_rows][hidden], view order).
 *   Memory:   as epf_combine_prereduce_rm_row_warp; publish with epf_arrive_last_block_epoch +
 *             epf_combine_signal_block. */
EPF_DEVICE_INLINE void epf_combine_prereduce_rm_row_unit_warp(epf_team_t team, const epf_plan_t* plan, int64_t row,
                                                              const int32_t* src_offset, const void* dx_rows,
                                                              int64_t expert_rows, const float* weight_grad,
                                                              const epf_wait_t* w);

/* epf_combine_signal_block — publish combine readiness of `epoch` to every peer: thread p
 *   release-stores (epoch, 0) into SIG_COMBINE[team.rank] of peer p.
 *   Scope: [collective:block]; for push, by the block epf_arrive_last_block chose; for pull, after
 *   the expert outputs are complete (e.g. at the end of the expert kernel, or a separate launch). */
EPF_DEVICE_INLINE void epf_combine_signal_block(epf_team_t team, const epf_plan_t* plan, uint32_t epoch);

/* epf_combine_wait_block — wait until every peer signalled combine `epoch`.
 *   Scope: [collective:block] [blocking]. Result: [result:all] as epf_dispatch_wait_block. */
EPF_DEVICE_INLINE epf_status_t epf_combine_wait_block(epf_team_t team, const epf_plan_t* plan, uint32_t epoch,
                                                      epf_wait_t w);

/* ---- the view and the blocks over the route (impl/view.cuh) ---------------------------------- */

/* epf_ht_view — the view of route buffer `index` (0 for a real rank's single buffer; the virtual
 *   rank for virtual ranks) for `team` (already the rank's team: epf_team_for_block). topk_idx and
 *   topk_weights point at this rank's own [max_tokens][top_k] arrays (NULL allowed where a block
 *   does not read them). Scope: any thread; reads the route header and epoch word (after the
 *   route update of the step, on the same stream). */
EPF_DEVICE_INLINE epf_ht_view_t epf_ht_view(const epf_route_t* route, epf_team_t team, const epf_plan_t* plan, int index,
                                            const void* topk_idx, const float* topk_weights);

/* epf_ht_expert_id — entry i of topk (either index type) when it is an expert id in [0,
 *   num_experts), else -1. The ids are read again after the route update: checked here, never
 *   trusted as an index. Scope: any thread. */
EPF_HD int epf_ht_expert_id(const void* topk, int index_type, int64_t i, int num_experts);

/* epf_ht_copy_em_lane — lane k < K of token t: its expert (*out_expert; -1: not routed or out of
 *   range) and the destination rank of its own copy from the route (-1: no copy of its own — not
 *   routed, dropped, a repeat of an earlier k, or an id that no longer matches the route, which
 *   sets *out_stale). Lanes >= K: -1. Scope: any lane (no collective). */
EPF_DEVICE_INLINE int epf_ht_copy_em_lane(const epf_ht_view_t* v, int t, int* out_expert, bool* out_stale);

/* epf_ht_copies_rm_warp — the RANK_MAJOR copy list of token t: lane j holds the j-th distinct
 *   destination rank among the token's top-k, in order of first occurrence in k, and its receive
 *   row there (-1 on lanes past the list); returns the number of copies.
 *   Scope: [collective:warp], converged. */
EPF_DEVICE_INLINE int epf_ht_copies_rm_warp(const epf_ht_view_t* v, int t, int* out_rank, int64_t* out_row);

/* epf_ht_recv_rows — RANK_MAJOR: how many receive rows hold a row this step (the route's total,
 *   capped at the receive capacity). Scope: any thread. */
EPF_DEVICE_INLINE int64_t epf_ht_recv_rows(const epf_ht_view_t* v, const epf_plan_t* plan);

/* epf_ht_report_stale_warp — EPF_ERR_ROUTE_STALE for token t once per warp (lane k's flag). */
EPF_DEVICE_INLINE void epf_ht_report_stale_warp(const epf_ht_view_t* v, const epf_wait_t* w, int t, bool stale);

/* epf_ht_dispatch_token_warp — the send half for token t: its copies (EXPERT_MAJOR: one per
 *   (token, expert), repeats get none; RANK_MAJOR: one per destination rank), their metadata
 *   and payload in the final receive rows of every destination.
 *   Scope:    [collective:warp] every lane, converged; uniform arguments.
 *   Input:    x_row: the token's row — BF16 [hidden] when quantize != 0 (quantized on the way to a
 *             quantized plan.payload), else a plan.payload row with its compact scales in
 *             x_scales_row (NULL for BF16); the view's topk_weights are read.
 *   Does:     ids that no longer match the route are reported (EPF_ERR_ROUTE_STALE) and sent
 *             nowhere; copies past the receive capacity are dropped. SEGMENT_MN_MAJOR scales go
 *             to each copy's segment (the route's SEND_SEGMENT of its expert).
 *   Result:   [result:all] the dropped copies (count them: recv_overflow).
 *   Memory:   plain stores to the peers; publish as the ready-made kernel does. */
EPF_DEVICE_INLINE uint32_t epf_ht_dispatch_token_warp(const epf_ht_view_t* v, const epf_plan_t* plan, const void* x_row,
                                                      const uint8_t* x_scales_row, int quantize, int t,
                                                      const epf_wait_t* w);

/* epf_ht_combine_backward_token_warp — the backward of combine, send half, for token t: dy_row (BF16
 *   [hidden], the gradient of the token's combine output) to the very receive rows its forward
 *   dispatch filled (the same route: EXPERT_MAJOR one row per (token, distinct expert), RANK_MAJOR
 *   one per destination rank), unweighted. Metadata as the forward's, except the EXPERT_MAJOR
 *   weight: the row's COMBINE WEIGHT, the sum in ascending k (FP32 adds from 0) of the token's
 *   weights over every k that reads the row (its first occurrence and its repeats), so the expert
 *   stage computes d out_row = weight * dy_row. RANK_MAJOR metadata lists every k with its own
 *   weight, as the forward's (the expert stage sums the entries of a view row the same way).
 *   Scope:    [collective:warp] every lane, converged; uniform arguments. A BF16 plan
 *             (plan.payload == EPF_PAYLOAD_BF16).
 *   Does:     what epf_ht_dispatch_token_warp does: stale ids are reported and skipped, copies past
 *             the receive capacity are dropped (the same copies the forward dropped).
 *   Result:   [result:all] the dropped copies (count them: recv_overflow).
 *   Memory:   plain stores to the peers; only after every rank finished the forward's combine
 *             (the ready-made kernel's barrier, docs/high-throughput.md); publish as the dispatch. */
EPF_DEVICE_INLINE uint32_t epf_ht_combine_backward_token_warp(const epf_ht_view_t* v, const epf_plan_t* plan,
                                                              const void* dy_row, int t, const epf_wait_t* w);

/* epf_ht_combine_expert_warp — the expert side of the combine, this warp's share: `warp` of the
 *   rank's `nwarps` warps takes every nwarps-th receive row. EXPERT_MAJOR: each row's output to
 *   where its source reads it (epf_combine_expert_row_em_warp); RANK_MAJOR: each row's k-order
 *   partial (epf_combine_prereduce_rm_row_warp).
 *   Input:    expert_out: this rank's expert outputs, BF16 [expert_rows][hidden] — EXPERT_MAJOR in
 *             receive-row order (NULL: written in place over the received BF16 rows), RANK_MAJOR in
 *             the expert-major view's order.
 *   Scope:    [collective:warp] every lane, converged; uniform arguments. Call from every warp of
 *             the rank, then arrive and signal (epf_arrive_last_block_epoch, epf_combine_signal_block). */
EPF_DEVICE_INLINE void epf_ht_combine_expert_warp(const epf_ht_view_t* v, const epf_plan_t* plan, const void* expert_out,
                                                  int64_t expert_rows, int warp, int nwarps, const epf_wait_t* w);

/* epf_ht_dispatch_backward_expert_warp — the backward of dispatch, expert side, this warp's share
 *   (`warp` of the rank's `nwarps`): the input gradients of the expert stage back toward their
 *   sources, as the forward combine moves outputs — EXPERT_MAJOR: each receive row's dx row where its
 *   source reads it (pull: at epf_plan_expert_out_offset, nothing to do in place; push: into the
 *   source's COMBINE row); RANK_MAJOR: each receive row's partial with UNIT weights over its distinct
 *   view rows in k order (epf_combine_prereduce_rm_row_unit_warp). With weight_grad, each receive
 *   row's router-weight gradient goes into its metadata (epf_combine_weight_grad_ptr).
 *   Input:    dx_rows: BF16 [expert_rows][hidden] — EXPERT_MAJOR in receive-row order (NULL: in place
 *             over the receive rows), RANK_MAJOR in the expert-major view's order.
 *             weight_grad: FP32 [expert_rows] in the same row order (d w of each row: dot(dy_row,
 *             out_row), computed by the expert stage), or NULL.
 *   Scope:    [collective:warp] every lane, converged; uniform arguments; a BF16 plan (payload and
 *             combine payload). Call from every warp of the rank, then arrive and signal
 *             (epf_arrive_last_block_epoch, epf_combine_signal_block). */
EPF_DEVICE_INLINE void epf_ht_dispatch_backward_expert_warp(const epf_ht_view_t* v, const epf_plan_t* plan,
                                                            const void* dx_rows, int64_t expert_rows,
                                                            const float* weight_grad, int warp, int nwarps,
                                                            const epf_wait_t* w);

/* epf_ht_combine_token_warp — the source side for token t, after epf_combine_wait_block:
 *   out_row (BF16 [hidden]) = the fma chain in FP32 from 0 over the token's expert outputs in k
 *   order (EXPERT_MAJOR: w_k * y_k, a repeat reusing its first occurrence's output with its own
 *   weight) or over the rank-major partials in ascending rank order (RANK_MAJOR, weight 1), read
 *   from the expert ranks' windows (pull) or this rank's COMBINE rows (push). Copies dropped at
 *   dispatch, and outputs of ranks masked out under fault tolerance (pull), contribute nothing; a
 *   token with none gets zeros.
 *   Scope: [collective:warp] every lane, converged; uniform arguments. */
EPF_DEVICE_INLINE void epf_ht_combine_token_warp(const epf_ht_view_t* v, const epf_plan_t* plan, int t, void* out_row,
                                                 const epf_wait_t* w);

/* epf_ht_dispatch_backward_token_warp — the backward of dispatch, source side, for token t, after
 *   epf_combine_wait_block: out_row (BF16 [hidden], dx of the token) = the fma chain in FP32 from 0
 *   with UNIT weights over the token's gradient rows — EXPERT_MAJOR: the first occurrences in
 *   ascending k (a repeat adds nothing: its gradient is already inside its first occurrence's row);
 *   RANK_MAJOR: the per-rank partials in the order the token first names each rank — read as the
 *   forward combine reads (pull: the expert ranks' windows; push: this rank's COMBINE rows), then
 *   RNE to BF16. Copies dropped at dispatch (and, under fault tolerance, rows of masked ranks)
 *   contribute nothing, as in the forward; a token with none gets zeros.
 *   wgrad_row (FP32 [top_k], or NULL): for every k with a valid id, the router-weight gradient of
 *   the row k reads (a repeat: its first occurrence's), read from that row's metadata on its rank
 *   (epf_combine_weight_grad_ptr); 0 for -1 / invalid / stale ids and for dropped (or masked)
 *   copies. Meaningful only if the expert side carried weight_grad.
 *   Scope: [collective:warp] every lane, converged; uniform arguments; a BF16 plan. */
EPF_DEVICE_INLINE void epf_ht_dispatch_backward_token_warp(const epf_ht_view_t* v, const epf_plan_t* plan, int t,
                                                           void* out_row, float* wgrad_row, const epf_wait_t* w);

EPF_END_DECLS

/* the definitions, by part: */
#include "impl/dispatch.cuh" /* dispatch: send, scales, metadata, expand, signal / wait */
#include "impl/combine.cuh"  /* combine: the k-order reduction, pull / put / push, pre-reduce, signal / wait */
#include "impl/view.cuh"     /* the view, the per-token and per-row blocks, training */

#endif /* EPF_HT_HT_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
