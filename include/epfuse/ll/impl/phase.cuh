/* epfuse/ll/impl/phase.cuh — LL device side of a phase: waits, epochs, completion, active mask, mask clean — part of epfuse v0.1
 *
 * What it is: what every LL block does around its work: the wait context, the epoch of the
 * round, the completion of a phase by the rank's last block, the block's mask snapshot, the
 * mask query / set and the mask-clean collective.
 * Include epfuse/ll/ll.cuh, not this file (it stands alone too, for the compile tests).
 *
 * Contents: see ll/ll.cuh.
 *
 * Requirements: see ll/ll.cuh.
 */
#ifndef EPF_LL_IMPL_PHASE_CUH
#define EPF_LL_IMPL_PHASE_CUH

#include "../../config.h"
#include "../../host.h"
#include "../../core/ptx.cuh"
#include "../../core/signal.cuh"
#include "../../core/team.cuh"
#include "layout.cuh"
#include "types.cuh"

EPF_BEGIN_DECLS

/* ============================================================================================ */
/* Device: epochs, phase completion, waits                                                       */
/* ============================================================================================ */

EPF_DEVICE_INLINE epf_wait_t epf_ll_wait(const epf_plan_t* plan, epf_ll_ctx_t ctx) {
  epf_wait_t w = epf_wait_make(plan->timeout_ns, ctx.record, ctx.abort_word, ctx.team.rank);
  if ((plan->flags & EPF_FLAG_FAULT_TOLERANT) != 0u) w.mask = ctx.state->mask;
  return w;
}

EPF_DEVICE_INLINE uint32_t epf_ll_epoch_next(const epf_ll_state_t* state, epf_ll_phase_t phase) {
  return epf_ld_relaxed_gpu_u32(&state->epoch[phase]) + 1u;
}

EPF_DEVICE_INLINE bool epf_ll_phase_end_block(epf_ll_ctx_t ctx, epf_ll_phase_t phase) {
  return epf_arrive_last_block(&ctx.state->arrive[phase], (uint32_t)ctx.nblocks, 1u);
}

EPF_DEVICE_INLINE void epf_ll_phase_commit_block(epf_ll_ctx_t ctx, epf_ll_phase_t phase, uint32_t epoch) {
  if (threadIdx.x == 0) {
    epf_st_relaxed_gpu_u32(&ctx.state->arrive[phase], 0u);
    epf_st_relaxed_gpu_u32(&ctx.state->epoch[phase], epoch);
  }
}

/* epf__ll_snapshot_mask_block — copy the rank's active mask into smem (all ones without fault
 * tolerance), so that every send decision of the block uses one view. [collective:block] */
EPF_DEVICE_INLINE void epf__ll_snapshot_mask_block(const epf_plan_t* plan, epf_ll_ctx_t ctx, uint32_t* smem_mask) {
  const bool ft = (plan->flags & EPF_FLAG_FAULT_TOLERANT) != 0u;
  int i;
  for (i = (int)threadIdx.x; i < EPF_MASK_WORDS; i += (int)blockDim.x)
    smem_mask[i] = ft ? epf_ld_relaxed_sys_u32(ctx.state->mask + i) : 0xffffffffu;
  __syncthreads();
}
EPF_DEVICE_INLINE bool epf__ll_active(const uint32_t* smem_mask, int rank) {
  return ((smem_mask[rank >> 5] >> (rank & 31)) & 1u) != 0u;
}


/* ============================================================================================ */
/* Device: active mask query / set, mask clean                                                   */
/* ============================================================================================ */

EPF_DEVICE_INLINE void epf_ll_mask_query(const epf_ll_state_t* state, uint32_t* out_mask) {
  int i;
  for (i = 0; i < EPF_MASK_WORDS; ++i) out_mask[i] = epf_ld_relaxed_sys_u32(state->mask + i);
}

EPF_DEVICE_INLINE void epf_ll_mask_set(epf_ll_state_t* state, const uint32_t* mask) {
  int i;
  for (i = 0; i < EPF_MASK_WORDS; ++i) epf_st_relaxed_sys_u32(state->mask + i, mask[i]);
}

EPF_DEVICE_INLINE epf_status_t epf_ll_mask_clean_block(const epf_plan_t* plan, epf_ll_ctx_t ctx, void* smem) {
  uint32_t* arrived = (uint32_t*)smem;                      /* [EPF_MASK_WORDS] */
  int32_t* max_delta = (int32_t*)smem + EPF_MASK_WORDS;     /* one word */
  const epf_team_t team = ctx.team;
  const int R = team.nranks;
  epf_ll_state_t* st = ctx.state;
  const uint32_t g = epf_ld_relaxed_gpu_u32(&st->clean_gen) + 1u;
  const epf_wait_t w = epf_wait_make(plan->timeout_ns, ctx.record, ctx.abort_word, team.rank);
  epf_status_t mine = EPF_OK, res;
  uint32_t m0 = epf_ld_relaxed_gpu_u32(&st->epoch[0]);
  int i;
  for (i = 1; i < EPF_LL_PHASE_COUNT; ++i) {
    const uint32_t e = epf_ld_relaxed_gpu_u32(&st->epoch[i]);
    if (epf_epoch_reached(e, m0)) m0 = e;
  }
  if (threadIdx.x == 0) {
    for (i = 0; i < EPF_MASK_WORDS; ++i) arrived[i] = 0u;
    *max_delta = 0;
  }
  {
    const int64_t nd = plan->region[EPF_REGION_SIG_LL_DISPATCH].bytes / 8, nc =
        plan->region[EPF_REGION_SIG_LL_COMBINE].bytes / 8;
    int64_t j;
    for (j = threadIdx.x; j < nd; j += blockDim.x)
      epf_st_relaxed_sys_u64((uint64_t*)epf_local_ptr(team, epf_plan_signal_offset(plan, EPF_REGION_SIG_LL_DISPATCH, j)),
                             0ull);
    for (j = threadIdx.x; j < nc; j += blockDim.x)
      epf_st_relaxed_sys_u64((uint64_t*)epf_local_ptr(team, epf_plan_signal_offset(plan, EPF_REGION_SIG_LL_COMBINE, j)),
                             0ull);
  }
  __syncthreads();
  for (i = (int)threadIdx.x; i < R; i += (int)blockDim.x)
    epf_signal_set_sys((uint64_t*)epf_peer_ptr(team, epf_plan_signal_offset(plan, EPF_REGION_SIG_COUNT, team.rank), i),
                       g, m0);
  for (i = (int)threadIdx.x; i < R; i += (int)blockDim.x) {
    uint32_t v = 0u;
    const epf_status_t s = epf_signal_wait_sys(
        (const uint64_t*)epf_local_ptr(team, epf_plan_signal_offset(plan, EPF_REGION_SIG_COUNT, i)), g, w, i, &v);
    if (s == EPF_OK) {
      atomicOr(&arrived[i >> 5], 1u << (i & 31));
      atomicMax(max_delta, (int32_t)(v - m0));
    } else if (mine == EPF_OK) {
      mine = s;
    }
  }
  res = epf__block_status(mine);
  if (threadIdx.x == 0) {
    const uint32_t m = m0 + (uint32_t)*max_delta;
    arrived[team.rank >> 5] |= 1u << (team.rank & 31);
    for (i = 0; i < EPF_LL_PHASE_COUNT; ++i) {
      epf_st_relaxed_gpu_u32(&st->epoch[i], m);
      epf_st_relaxed_gpu_u32(&st->arrive[i], 0u);
    }
    for (i = 0; i < EPF_MASK_WORDS; ++i) epf_st_relaxed_sys_u32(st->mask + i, arrived[i]);
    epf_st_relaxed_gpu_u32(&st->clean_gen, g);
  }
  __syncthreads();
  return res;
}

EPF_END_DECLS

#endif /* EPF_LL_IMPL_PHASE_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
