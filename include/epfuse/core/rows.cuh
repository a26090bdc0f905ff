/* epfuse/core/rows.cuh — receive-row helpers that HT and LL share: a received RANK_MAJOR metadata row, the router-weight gradient's slot — part of epfuse v0.1
 *
 * What it is: the row helpers that the high-throughput blocks (ht/) and the low-latency blocks
 * (ll/) share, in one neutral place below both:
 *   - the reader of a received RANK_MAJOR metadata row (the HT expand and pre-reduce, the LL
 *     rank-major expand and combine), which checks every value before it forms an address;
 *   - where a receive row's router-weight gradient travels back in training (its metadata weight
 *     slot), which the HT and LL backward blocks write and read.
 * The metadata layouts themselves (epf_recv_meta_em_t, epf_recv_meta_rm_*) are plan.h's; the BF16
 * vector steps of the k-order sum, which both combines use too, are bf16.cuh's.
 *
 * What it does NOT do: move rows between ranks, wait, or signal (ht/, ll/ and core/signal.cuh do).
 *
 * Contents:
 *   epf_recv_meta_rm_lane_t                                   a received RANK_MAJOR metadata row, per lane
 *   epf_recv_meta_rm_lane_t epf_recv_meta_rm_read_warp(team, plan, int64_t row, const int32_t* src_offset)
 *                                                                                      [collective:warp]
 *   float*   epf_combine_weight_grad_ptr(team, plan, int64_t row, int entry, int peer)
 *        where a receive row's router-weight gradient travels back (its metadata weight slot)
 *
 * Requirements: CUDA, sm_70+ (sm_90 / sm_100 tested).
 */
#ifndef EPF_CORE_ROWS_CUH
#define EPF_CORE_ROWS_CUH

#include "../config.h"

#if !EPF_IS_CUDA
#error "epfuse/core/rows.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

#include "../host.h"
#include "ptx.cuh"
#include "team.cuh"

EPF_BEGIN_DECLS

/* One received RANK_MAJOR metadata row as a warp reads it (epf_recv_meta_rm_read_warp). */
typedef struct epf_recv_meta_rm_lane {
  int src_token, src_rank, num_local; /* the header, as received */
  bool header_ok;   /* src_rank in [0, nranks), num_local in [0, top_k] (warp-uniform) */
  bool token_ok;    /* header_ok and src_token in [0, max_tokens_per_rank) */
  int local_expert; /* lane j < num_local: entry j's local expert, else -1 */
  float weight;     /* its weight (0 for no entry) */
  int64_t em_row;   /* its row in the expert-major view (src_offset[local_expert][src_rank] + slot),
                       -1 for no entry or an entry that fails its checks */
  bool entry_bad;   /* lane j < num_local whose local expert or slot is out of range */
} epf_recv_meta_rm_lane_t;

/* epf_recv_meta_rm_read_warp — read receive row `row`'s RANK_MAJOR metadata, checking it before
 *   any value forms an address: the header (source rank, entry count, token), then each entry's
 *   local expert and slot. src_offset: the route's RECV_SRC_OFFSET array ([experts_per_rank]
 *   [nranks + 1]: where source s's rows of local expert le start in the expert-major view).
 *   Scope: [collective:warp] (uniform row); the warp reads the row once, lane j its entry j.
 *   Memory: plain local loads (after the dispatch's receive half). */
EPF_DEVICE_INLINE epf_recv_meta_rm_lane_t epf_recv_meta_rm_read_warp(epf_team_t team, const epf_plan_t* plan, int64_t row,
                                                                    const int32_t* src_offset) {
  const int lane = epf_lane_id(), K = plan->top_k, R = plan->nranks;
  const char* meta = (const char*)epf_local_ptr(team, epf_plan_recv_meta_offset(plan, row));
  const epf_recv_meta_rm_t* h = (const epf_recv_meta_rm_t*)meta;
  epf_recv_meta_rm_lane_t m;
  int sl;
  m.src_token = h->src_token;
  m.src_rank = h->src_rank;
  m.num_local = h->num_local;
  m.header_ok = m.src_rank >= 0 && m.src_rank < R && m.num_local >= 0 && m.num_local <= K;
  m.token_ok = m.header_ok && m.src_token >= 0 && m.src_token < plan->max_tokens_per_rank;
  m.local_expert = m.header_ok && lane < m.num_local ? *(const int32_t*)(meta + epf_recv_meta_rm_expert_at(K, lane)) : -1;
  m.weight = m.header_ok && lane < m.num_local ? *(const float*)(meta + epf_recv_meta_rm_weight_at(K, lane)) : 0.f;
  sl = m.header_ok && lane < m.num_local ? *(const int32_t*)(meta + epf_recv_meta_rm_slot_at(K, lane)) : -1;
  m.entry_bad = m.header_ok && lane < m.num_local && !(m.local_expert >= 0 && m.local_expert < plan->experts_per_rank && sl >= 0);
  m.em_row = m.header_ok && lane < m.num_local && !m.entry_bad
                 ? (int64_t)src_offset[m.local_expert * (R + 1) + m.src_rank] + sl
                 : -1;
  return m;
}

/* epf_combine_weight_grad_ptr — where the router-weight gradient of receive row `row` travels back
 *   (the backward of dispatch, docs/high-throughput.md "Training"): the row's metadata weight slot
 *   in `peer`'s window — EXPERT_MAJOR: epf_recv_meta_em_t.weight; RANK_MAJOR: entry `entry`'s
 *   weight (epf_recv_meta_rm_weight_at). The expert side writes it (peer = team.rank) before it
 *   signals the combine; the source reads it (peer = the row's rank) after
 *   epf_combine_wait_block. The metadata's weight is not needed again once the expert stage has
 *   read it. Scope: any thread. Pure pointer arithmetic (row in [0, recv_capacity), entry in
 *   [0, top_k)). */
EPF_DEVICE_INLINE float* epf_combine_weight_grad_ptr(epf_team_t team, const epf_plan_t* plan, int64_t row, int entry,
                                                     int peer) {
  char* meta = (char*)epf_peer_ptr(team, epf_plan_recv_meta_offset(plan, row), peer);
  if (plan->layout == EPF_LAYOUT_EXPERT_MAJOR) return &((epf_recv_meta_em_t*)meta)->weight;
  return (float*)(meta + epf_recv_meta_rm_weight_at(plan->top_k, entry));
}

EPF_END_DECLS

#endif /* EPF_CORE_ROWS_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
