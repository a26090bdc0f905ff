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
 *     (parity = epoch & 1, row = this rank) as count words that carry the epoch (signal.cuh), which
 *     the reader validates one by one with bounded waits — no signal, no fence;
 *   - then, on the device, with no host sync: send offsets (the row of the destination's receive
 *     region where this rank's group of expert e, or its rank-major block, starts), this rank's
 *     receive segments (per local expert begin / count / padded count, aligned to
 *     plan.expert_alignment), per-(local expert, source) starts, rank-major per-source starts, the
 *     total receive rows (also stored to host-mapped memory) and the pad rows' metadata.
 * epf_route_update_block composes all of it; the phases are public for fused kernels, with one
 * contract in every case (block 0 is the control block, block b >= 1 reads topk_idx of the
 * tokens epf_route_block_tokens gives it only). The ready-made kernel may arrange the same phases
 * differently for small updates (a private choice: kernels_route.cuh). Expert ids
 * outside [-1, E) are dropped: treated as -1, counted (route header and the error record's
 * dropped_routes), never used as an index. A token that names one expert more than once is
 * routed to it once: the first occurrence (lowest k) gets the slot, later ones (REPEATS) are
 * treated like -1 here (DST_RANK = SLOT = -1, not counted, not dropped) and reuse the first
 * occurrence's output in the combine (dispatch.cuh: epf_topk_first_lane_warp).
 *
 * What it does NOT do: allocate, launch kernels (kernels_route.cuh does), move token rows
 * (dispatch.cuh), or include nccl_device.h. CUB is used inside function bodies only (warp scans
 * and reductions); the API is template-free. cub::BlockScan / BlockHistogram are not used because
 * they fix the block size and bin count at compile time, and these blocks take both at run time.
 *
 * Usage (kernels_route.cuh has it whole):
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
 * Contents:
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

/* the declarations are listed above; the definitions and their contracts, by part: */
#include "impl/ctx.cuh"     /* epf_route_ctx_t, shared memory, epf_route_ctx_make */
#include "impl/batch.cuh"   /* private warp helpers of the passes */
#include "impl/count.cuh"   /* pass 1, the rank's blocks meet, the count exchange */
#include "impl/offsets.cuh" /* pass 2, offsets, finish, epf_route_update_block */

#endif /* EPF_ROUTE_ROUTE_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
