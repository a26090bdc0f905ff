/* epfuse/route/route.cuh — routing layout blocks: counts, deterministic slots, count exchange, offsets — part of epfuse v0.1
 *
 * What it is: the device side of the route (the handle): from topk_idx [T, K] (int32 or int64,
 * -1 = not routed) one rank's blocks compute
 *   - tokens per expert [E] ((token, k) pairs) and per destination rank [R] (deduplicated),
 *     is_token_in_rank [T, R], and for every (token, k) its destination rank and its SLOT: its
 *     rank within its (source, expert) group in (token, k) order — warp votes + prefix, never an
 *     atomic, so the result is the same bits on every run, for any number of blocks or warps;
 *   - RANK_MAJOR: for every (token, destination rank) its slot in token order;
 *   - the count exchange: per-expert and per-rank counts into every peer's COUNTS region
 *     (parity = epoch & 1, row = this rank) as count words that carry the epoch (core/signal.cuh), which
 *     the reader validates one by one with bounded waits — no signal, no fence;
 *   - then, on the device, with no host sync: send offsets (the row of the destination's receive
 *     region where this rank's group of expert e, or its rank-major block, starts), this rank's
 *     receive segments (per local expert begin / count / padded count, aligned to
 *     plan.expert_alignment), per-(local expert, source) starts, rank-major per-source starts, the
 *     total receive rows (also stored to host-mapped memory) and the pad rows' metadata.
 * epf_route_update_block composes all of it; the phases are public for fused kernels, with one
 * contract in every case (block 0 is the control block, block b >= 1 reads topk_idx of the
 * tokens epf_route_block_tokens gives it only). The ready-made kernel may arrange the same phases
 * differently for small updates (a private choice: route/kernels.cuh). Expert ids
 * outside [-1, E) are dropped: treated as -1, counted (route header and the error record's
 * dropped_routes), never used as an index. A token that names one expert more than once is
 * routed to it once: the first occurrence (lowest k) gets the slot, later ones (REPEATS) are
 * treated like -1 here (DST_RANK = SLOT = -1, not counted, not dropped) and reuse the first
 * occurrence's output in the combine (ht/impl/dispatch.cuh: epf_topk_first_lane_warp).
 *
 * What it does NOT do: allocate, launch kernels (route/kernels.cuh does), move token rows
 * (ht/impl/dispatch.cuh), or include nccl_device.h. CUB is used inside function bodies only (warp scans
 * and reductions); the API is template-free. cub::BlockScan / BlockHistogram are not used because
 * they fix the block size and bin count at compile time, and these blocks take both at run time.
 *
 * Usage (route/kernels.cuh has it whole):
 *   extern __shared__ uint4 smem[];                  // epf_route_smem_bytes(&route.layout, blockDim.x)
 *   epf_team_t me = epf_team_for_block(team, virtual_ranks, blocks_per_rank);
 *   epf_route_update_block(&route, virtual_ranks ? me.rank : 0, me, &plan, topk_idx, num_tokens,
 *                          blockIdx.x % blocks_per_rank, blocks_per_rank, wait, recv_total_mapped, smem);
 *   // HT dispatch of the same step, EXPERT_MAJOR, copy (t, k) with expert e >= 0:
 *   //   row = send_offset[e] + slot[t * K + k] on rank dst_rank[t * K + k]; drop if row >= capacity
 *   // RANK_MAJOR, token t to rank d with token_in_rank[t * R + d]:
 *   //   row = send_rm_offset[d] + rm_slot[t * R + d]
 *
 * COMPILE-TIME OPTIONS: none of its own (config.h limits; EPF_MAX_RANKS sets the register mask
 * width, (EPF_MAX_RANKS + 31) / 32 words per token).
 *
 * Contents (declared below with their contracts; the bodies are in impl/):
 *   epf_route_ctx_t                                  one rank-block's view of an update
 *   size_t epf_route_smem_bytes(const epf_route_layout_t*, int block_threads)            [EPF_HD]
 *   epf_route_ctx_t epf_route_ctx_make(const epf_route_t*, int index, int rank, const void* topk_idx,
 *                       int num_tokens, int block_index, int num_blocks, int64_t* recv_total_mapped,
 *                       void* smem)                                                       [device]
 *   void epf_route_count_block(epf_route_ctx_t*)                      pass 1: histograms   [collective:block]
 *   epf_status_t epf_route_merge_block(epf_route_ctx_t*, epf_wait_t)  blocks of a rank    [collective:block]
 *   void epf_route_publish_block(const epf_route_ctx_t*, epf_team_t, const epf_plan_t*)   [collective:block]
 *   void epf_route_slots_block(epf_route_ctx_t*)                      pass 2: slots        [collective:block]
 *   epf_status_t epf_route_wait_counts_block(const epf_route_ctx_t*, epf_team_t, const epf_plan_t*, epf_wait_t)
 *   epf_status_t epf_route_offsets_block(epf_route_ctx_t*, epf_team_t, const epf_plan_t*, epf_wait_t) [collective:block]
 *   void epf_route_mark_pad_rows_block(epf_team_t, const epf_plan_t*, const epf_route_segment_t*, int num_local)
 *   void epf_route_finish_block(const epf_route_ctx_t*, epf_status_t)                   [collective:block]
 *   epf_status_t epf_route_update_block(const epf_route_t*, int index, epf_team_t, const epf_plan_t*,
 *                       const void* topk_idx, int num_tokens, int block_index, int num_blocks,
 *                       epf_wait_t, int64_t* recv_total_mapped, void* smem)              [collective:block]
 *   epf_status_t epf_route_update_split_block(same arguments)   the SPLIT arrangement where it applies
 *                                                                                       [collective:block]
 *   int  epf_route_split_ok(int num_blocks, int num_tokens, int top_k)  when SPLIT applies     [EPF_HD]
 *   int  epf_route_rows_em(const epf_route_segment_t*, int num_local)  (host/device helper)
 *   void epf_route_block_tokens(int num_tokens, int block_index, int num_blocks, int* out_t0, int* out_t1) [EPF_HD]
 *
 * Requirements: CUDA, sm_70+ (warp votes and shuffles with masks); sm_90 / sm_100 compiled. blockDim.x a multiple
 * of 32, at most 1024. CUB from the CUDA toolkit (CCCL).
 */
#ifndef EPF_ROUTE_ROUTE_CUH
#define EPF_ROUTE_ROUTE_CUH

#include "../config.h"

#if !EPF_IS_CUDA
#error "epfuse/route/route.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

#include "../host.h"
#include "../core/ptx.cuh"
#include "../core/signal.cuh"
#include "../core/team.cuh"

#include "impl/types.cuh" /* epf_route_ctx_t and the passes' private constants */

EPF_BEGIN_DECLS

/* ---- the context and its shared memory (impl/ctx.cuh) ---------------------------------------- */

/* epf_route_smem_bytes — dynamic shared memory the route blocks need for a block of
 *   `block_threads` threads (W = block_threads / 32 warps): 4 * (W * (E + R) + (E + R + 1) + 64 +
 *   W * 160) + 512 bytes (each part rounded up to 16 bytes), plus 4 W E for the slot pass's tag
 *   rows when the total stays within 48 KiB (E = 256: up to 16 warps).
 *   Scope: any thread, host or device. Pure. */
EPF_HD size_t epf_route_smem_bytes(const epf_route_layout_t* layout, int block_threads);

/* epf_route_rows_em — rows of an expert-major receive layout: end of the last segment. */
EPF_HD int epf_route_rows_em(const epf_route_segment_t* seg, int num_local);

/* epf_route_block_tokens — the tokens [*out_t0, *out_t1) block b of B owns in an update (the
 *   count and slot passes of a ctx from epf_route_ctx_make, and so epf_route_update_block, read
 *   topk_idx of those tokens only; a fused kernel that produces topk_idx per block uses the same
 *   partition, examples/03_fused_moe_layer). B == 1: all of [0, T). B > 1: block 0 is the rank's
 *   CONTROL block and owns no tokens (it merges the counts, publishes them and computes the
 *   offsets while the others walk the tokens); block b >= 1 owns [T (b - 1) / (B - 1),
 *   T b / (B - 1)). The same for every T and B.
 *   On the device T * B must stay below 2^31 (what the route's limits give: T <= 2^24,
 *   B <= EPF_ROUTE_MAX_BLOCKS): the arithmetic is 32-bit there; on the host any int.
 *   Scope: any thread, host or device. Pure. */
EPF_HD void epf_route_block_tokens(int num_tokens, int block_index, int num_blocks, int* out_t0, int* out_t1);

/* epf_route_split_ok — THE rule for the SPLIT arrangement of an update
 *   (epf_route_update_split_block): 1 when num_blocks is 2 or 3 and the update has at most 2304
 *   (token, k) entries (num_tokens * top_k), else 0. The ready-made kernel, the launcher's block
 *   size (epf_route_update_threads), epf_route_blocks_per_rank and the tests all ask this function.
 *   Scope: any thread, host or device. Pure. */
EPF_HD int epf_route_split_ok(int num_blocks, int num_tokens, int top_k);

/* epf_route_ctx_make — this block's view of one rank's update.
 *   Scope: any thread (every thread of the block calls it with uniform arguments).
 *   index: the buffer of the route group (0 for a real rank, the virtual rank otherwise); rank:
 *   the team rank the block plays; topk_idx: this rank's [num_tokens][K] ids; block_index in
 *   [0, num_blocks), num_blocks <= route->layout.max_blocks; smem: epf_route_smem_bytes bytes,
 *   16-byte aligned. Reads the epoch word (a plain load: call it before the block's counts reach
 *   the scratch in epf_route_count_block; block 0 stores the next epoch only after it has read
 *   every block's scratch row, which is what makes that store safe).
 *   Token partition: epf_route_block_tokens (block 0 owns none when B > 1), split again over the
 *   block's warps in order, for every T and B; the count and slot passes read topk_idx of the
 *   block's own tokens only, so a fused kernel may produce them in the same block
 *   (examples/03_fused_moe_layer). */
EPF_DEVICE_INLINE epf_route_ctx_t epf_route_ctx_make(const epf_route_t* route, int index, int rank,
                                                     const void* topk_idx, int num_tokens, int block_index,
                                                     int num_blocks, int64_t* recv_total_mapped, void* smem);

/* ---- pass 1, the rank's blocks meet, the count exchange (impl/count.cuh) --------------------- */

/* epf_route_count_block — pass 1 over this block's tokens: per-warp counts per expert and per
 *   destination rank, is_token_in_rank rows, dropped ids; then this block's totals into its
 *   scratch row.
 *   Scope:    [collective:block] [uniform-args] every thread, converged; exactly one block per
 *             (rank, block_index) of an update.
 *   Does:     warp w of the block owns a contiguous token range (blocks in order, warps in order
 *             inside) and walks it in batches of whole tokens (at most 160 entries). Entries
 *             (t, k) are visited 32 at a time in (t, k) order; each valid entry adds 1 to its
 *             expert's column of the warp's own row of c->hist (shared-memory atomics: a sum,
 *             the same whatever their order). An entry that is its token's first to its
 *             destination rank (epf__route_batch_first / _first_shfl) adds 1 to that rank's column;
 *             the batch's is_token_in_rank rows are written whole. Then c->hist columns
 *             become exclusive prefixes over warps and the block totals [E counts, R counts,
 *             dropped] go to scratch[block_index] as count words (epf_count_word_pack; with
 *             num_blocks == 1 to c->tot instead: they are the rank's totals). Block 0 also resets
 *             header->status.
 *   Memory:   reads topk_idx; writes token_in_rank rows of its tokens (plain stores) and its
 *             scratch row (st.relaxed.gpu, each word carries the epoch: no fence, no flag).
 *             Smem: c->hist, c->stage, c->misc.
 *   [smem-reuse] starts with a __syncthreads. */
EPF_DEVICE_INLINE void epf_route_count_block(epf_route_ctx_t* c);

/* epf_route_merge_block — every block of the rank gets the counts of the blocks before it (added
 *   to its warps' prefixes); block 0 gets the rank's totals. With num_blocks == 1 there is nothing
 *   to merge (the totals epf_route_count_block left in c->tot are the rank's).
 *   Scope:    [collective:block] [uniform-args] after epf_route_count_block, in every block of the
 *             rank; the rank's num_blocks blocks must be co-resident [needs-co-residency] [blocking].
 *   Does:     thread x loads word x of the scratch rows it needs (block b: rows < b; block 0:
 *             every row; ld.relaxed.sys, 16 rows per round trip); a word whose epoch is not this
 *             update's is waited for (bounded by w: epf_count_word_wait_sys, the diagnostic names
 *             the word). No barrier word, no fence: each count carries its epoch. Then
 *             c->hist[w][x] += counts of blocks < block_index; block 0: c->tot = the rank's totals
 *             [E + R + 1] (block 0 reading every row is also what makes its epoch store at the end
 *             safe: every block has read the epoch by then). Block 0 writes expert_count, rank_count,
 *             header rank / num_tokens / dropped_routes and adds dropped ids to
 *             w.record->dropped_routes.
 *   Result:   [result:all] EPF_OK, or a wait's failure (also kept in c->status). */
EPF_DEVICE_INLINE epf_status_t epf_route_merge_block(epf_route_ctx_t* c, epf_wait_t w);

/* epf_route_publish_block — publish this rank's totals into every peer's window.
 *   Scope:    [collective:block] [uniform-args] after epf_route_merge_block returned EPF_OK, in
 *             every block of the rank; block 0 (which holds the totals) does the stores, the
 *             others return at once. This rank is its own peer.
 *   Does:     COUNTS[parity = epoch & 1][src = rank][0 .. E + R) of peer p =
 *             epf_count_word_pack(epoch, c->tot[x]) with .sys relaxed 8-byte stores. No signal, no fence: every word carries
 *             its epoch (NCCL's LL idea), so the reader (epf_route_offsets_block) validates each
 *             word it loads and the exchange costs one store and one load round trip.
 *   Memory:   st.relaxed.sys u64 to peers (single-copy atomic: aligned 8-byte words).
 *             Parity: a rank writes parity P of a peer again only at epoch + 2, which it reaches
 *             only after that peer has published epoch + 1, i.e. after the peer's update of this
 *             epoch (a separate kernel, or a later phase in a fused kernel) has finished reading
 *             parity P. A fused persistent kernel must keep that order. */
EPF_DEVICE_INLINE void epf_route_publish_block(const epf_route_ctx_t* c, epf_team_t team, const epf_plan_t* plan);

/* ---- pass 2, offsets, finish, the whole update (impl/offsets.cuh) ---------------------------- */

/* epf_route_slots_block — pass 2: slot and destination rank of every (t, k) of this block's
 *   tokens, and (RANK_MAJOR) the rank-major slot of every (t, destination).
 *   Scope:    [collective:block] [uniform-args] after epf_route_merge_block returned EPF_OK.
 *   Does:     the same walk as pass 1 (when a warp's tokens are one batch, on the ids
 *             epf_route_count_block left in the ctx, not loaded again: call both with the same
 *             ctx); slot(t, k) = c->hist[warp][e] (blocks and warps before) + the number of equal
 *             experts in lower lanes of the same 32-entry step; the group's highest lane then
 *             advances c->hist[warp][e]. slot = dst = -1 for -1 and dropped ids. Rank-major: the
 *             batch's rm_slot rows are set to -1, then each token's first entry to rank d takes
 *             the next slot of column E + d the same way.
 *   Memory:   plain coalesced stores to slot / dst_rank / rm_slot rows. No peer access. */
EPF_DEVICE_INLINE void epf_route_slots_block(epf_route_ctx_t* c);

/* epf_route_wait_counts_block — wait until every peer's count words of this epoch have arrived.
 *   Scope:    [collective:block] [uniform-args] [blocking]. Optional: epf_route_offsets_block
 *             waits for each word it reads by itself; a fused kernel that reads the COUNTS region
 *             directly calls this first.
 *   Does:     thread x (strided over the R x (E + R) words of this parity) loads each word and
 *             waits (bounded, w) until it carries this epoch.
 *   Result:   [result:all] EPF_OK, or the failure by priority (TIMEOUT > ABORTED > PEER_MASKED).
 *   Memory:   ld.relaxed.sys / ld.acquire.sys of the own window's COUNTS. */
EPF_DEVICE_INLINE epf_status_t epf_route_wait_counts_block(const epf_route_ctx_t* c, epf_team_t team,
                                                           const epf_plan_t* plan, epf_wait_t w);

/* epf_route_mark_pad_rows_block — write the metadata of every pad row of an expert-major receive
 *   layout: rows [begin + count, begin + padded_count) of each local expert j (those below
 *   plan->recv_capacity) get epf_recv_meta_em_t {src_token -1, src_rank -1, k -1,
 *   local_expert j, weight 0}. Rows received from sources are not touched.
 *   Scope:    [collective:block] [uniform-args]. seg: [num_local] segments (global or shared).
 *   Memory:   one 16-byte plain store per pad row into this rank's RECV_META (local window). */
EPF_DEVICE_INLINE void epf_route_mark_pad_rows_block(epf_team_t team, const epf_plan_t* plan,
                                                     const epf_route_segment_t* seg, int num_local);

/* epf_route_offsets_block — offsets from the exchanged counts (C[s][x] = COUNTS[parity][s][x]).
 *   Scope:    [collective:block] [uniform-args] [blocking] after pass 2 (it reuses c->hist), in
 *             block 0 of the rank only (c->offsets_block: one block computes every destination).
 *   Does:     thread e (strided over [0, E)) loads C[s][e] of every source s, waiting for words
 *             that do not carry this epoch yet (bounded by w); d = e / EL, j = e % EL:
 *               count_d[j] = sum_s C[s][e], padded_d[j] = roundup(count_d[j], alignment),
 *               begin_d[j] = sum_{j' < j} padded_d[j'] (one block scan over all e: warp scans and
 *               two barriers per blockDim experts, restarted at each destination by subtracting
 *               the scan's value at its first expert), send_offset[e] = begin_d[j] + sum_{s < rank} C[s][e],
 *               send_segment[e] = {begin_d[j], count_d[j], padded_d[j], 0}.
 *             This rank's segment: recv_segment[j] = {begin, count, padded, 0}, recv_src_offset[j][s]
 *             = begin + sum_{s' < s} C[s'][e] (s = 0..R). RANK_MAJOR (the block's last warp, warp
 *             scans over the sources): send_rm_offset[d] = sum_{s < rank} C[s][E + d],
 *             recv_rm_offset[s] = sum_{s' < s} C[s'][E + rank] (s = 0..R). Then header recv_rows
 *             (plan layout), recv_rows_em, recv_overflow = max(0, recv_rows - recv_capacity);
 *             *c->recv_total_mapped = recv_rows (.sys store); then the pad rows' metadata
 *             (epf_route_mark_pad_rows_block) unless EPF_ROUTE_FLAG_NO_PAD_MARK.
 *   Result:   [result:all] EPF_OK, or a wait's failure (then the offsets are not valid).
 *   Memory:   ld.relaxed.sys of the own window's COUNTS; plain stores to the route buffer. */
EPF_DEVICE_INLINE epf_status_t epf_route_offsets_block(epf_route_ctx_t* c, epf_team_t team, const epf_plan_t* plan,
                                                       epf_wait_t w);

/* epf_route_finish_block — end of an update: block 0 (the offsets block) records a failure
 *   (recv_rows = -1, *recv_total_mapped = -status), any block's failure goes to the header
 *   status, and block 0 stores the new epoch.
 *   Scope:    [collective:block] [uniform-args] last phase, in every block of the rank.
 *   Memory:   plain stores; the epoch store needs no ordering inside the update (every block of
 *             the rank read the epoch before its scratch row, and block 0 has read every row; the
 *             next update is a later kernel on the same stream). */
EPF_DEVICE_INLINE void epf_route_finish_block(const epf_route_ctx_t* c, epf_status_t st);

/* epf_route_update_block — one rank's whole route update: count, merge, publish, slots, offsets
 *   (block 0, which waits for the peers' counts word by word), finish — the phases above, in
 *   that order, on a ctx from epf_route_ctx_make: block b reads topk_idx of the tokens
 *   epf_route_block_tokens gives it only, for every T and num_blocks.
 *   Scope:    [collective:block] [uniform-args] every thread of each of the rank's num_blocks
 *             blocks (block_index 0 .. num_blocks - 1), converged; with virtual ranks every rank's
 *             blocks in one grid, all co-resident [needs-co-residency] [blocking].
 *   Input:    route: the group (route->layout matches plan); index: buffer of the group (0 for a
 *             real rank, the virtual rank otherwise); team: the view this block plays (rank =
 *             team.rank, team.nranks == plan->nranks); topk_idx: [num_tokens][K] of
 *             route->layout.index_type; num_tokens in [0, route->layout.max_tokens];
 *             recv_total_mapped: host-mapped int64 (device address) or NULL; smem:
 *             epf_route_smem_bytes(&route->layout, blockDim.x) bytes, 16-byte aligned.
 *   Result:   [result:all] EPF_OK, or the first failure (a wait's TIMEOUT / ABORTED / PEER_MASKED),
 *             also in header->status. On failure slots and counts are still valid; offsets are not
 *             (recv_rows = -1, *recv_total_mapped = -status).
 *   Epoch:    the route's epoch word + 1; stored back by block 0 at the end, so every update (and
 *             every CUDA graph replay) advances it with no host work. All ranks of a team must
 *             start from the same epoch (epf_route_init's first_epoch) and update in lockstep.
 *   Memory:   see the phases; the route buffer must not be read by other kernels while the
 *             update runs. SEND_OFFSET and the receive arrays are written by block 0 only: a fused
 *             kernel whose other blocks read them needs a rank-level rendezvous after this call. */
EPF_DEVICE_INLINE epf_status_t epf_route_update_block(const epf_route_t* route, int index, epf_team_t team,
                                                      const epf_plan_t* plan, const void* topk_idx, int num_tokens,
                                                      int block_index, int num_blocks, epf_wait_t w,
                                                      int64_t* recv_total_mapped, void* smem);

/* epf_route_update_split_block — epf_route_update_block in the SPLIT arrangement where
 *   epf_route_split_ok(num_blocks, num_tokens, top_k) says it applies (2 or 3 blocks, at most 2304
 *   (token, k) entries), else exactly epf_route_update_block. SPLIT: every block walks all the
 *   tokens itself, so none waits for another's counts: block 0 counts them, writes the
 *   is_token_in_rank rows and publishes, block 1 writes every slot, block 2 (block 0 with 2 blocks)
 *   counts the expert columns and computes the offsets; block 0 stores the next epoch after block
 *   2's acknowledgement. The ready-made update kernel uses it: at small T it is one merge wait
 *   shorter.
 *   Scope:    as epf_route_update_block.
 *   Requires: (beyond epf_route_update_block's) the rank's whole topk_idx[0, num_tokens) is
 *             written before the kernel starts (or before a rank-level rendezvous that precedes
 *             this call in every block): each block reads every token, not only its
 *             epf_route_block_tokens share. A fused kernel that produces topk_idx block by block
 *             must call epf_route_update_block instead.
 *   Result, Epoch, Memory: as epf_route_update_block (the same bytes in the route buffer). */
EPF_DEVICE_INLINE epf_status_t epf_route_update_split_block(const epf_route_t* route, int index, epf_team_t team,
                                                            const epf_plan_t* plan, const void* topk_idx,
                                                            int num_tokens, int block_index, int num_blocks,
                                                            epf_wait_t w, int64_t* recv_total_mapped, void* smem);

EPF_END_DECLS

/* the definitions, by part: */
#include "impl/ctx.cuh"     /* shared memory, epf_route_ctx_make */
#include "impl/batch.cuh"   /* private warp helpers of the passes */
#include "impl/count.cuh"   /* pass 1, the rank's blocks meet, the count exchange */
#include "impl/offsets.cuh" /* pass 2, offsets, finish, epf_route_update_block */

#endif /* EPF_ROUTE_ROUTE_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
