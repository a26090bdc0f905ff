/* epfuse/ll/impl/frame.cuh — the LL frame: the prologue every LL block repeated, built once — part of epfuse v0.1
 *
 * What it is: the private prologue of the LL send and receive bodies (ll/impl/dispatch.cuh,
 * dispatch_rm.cuh, combine.cuh, combine_rm.cuh). Each starts with
 *   EPF__LL_FRAME_MAKE(f, plan, ctx, a->num_tokens, EPF_LL_PHASE_..., smem);
 * and reads from f what each of them used to work out for itself: the shapes (R, rank, T, Tmax,
 * K, E, EL, H), the thread's lane and warp, the round (epoch; a combine send's dispatch round),
 * the wait context, the shared-memory carve-up (epf_ll_smem_layout and its pointers) and the slot
 * tables.
 *
 * Cost: none. Every field is a pure function of the arguments except the epoch loads, which are
 * issued only for the phase that reads them (phase is a literal at every use, so the choices
 * fold); a field a block does not read is not computed. The generated code of every block is
 * that of its former hand-written prologue (scripts/sass_diff.py: every kernel identical).
 *
 * Include epfuse/ll/ll.cuh, not this file (it stands alone too, for the compile tests).
 *
 * Requirements: see ll/ll.cuh.
 */
#ifndef EPF_LL_IMPL_FRAME_CUH
#define EPF_LL_IMPL_FRAME_CUH

#include "../../config.h"
#include "../../host.h"
#include "../../core/ptx.cuh"
#include "../../core/signal.cuh"
#include "../../core/team.cuh"
#include "types.cuh"
#include "layout.cuh"
#include "phase.cuh"
#include "rm.cuh"

EPF_BEGIN_DECLS

/* One LL block's view of its call (private to ll/). The shared-memory pointers are named after the
 * epf_ll_smem_layout_t fields they come from; which ones a block may use depends on its phase
 * (the halves of a stage overlay the same bytes). Fields marked with phases are set for those
 * phases only. */
typedef struct epf__ll_frame {
  epf_team_t team;          /* ctx.team */
  int R, rank;              /* team.nranks, team.rank */
  int T;                    /* the call's num_tokens (not COMBINE_SEND) */
  int Tmax, K, E, EL, H;    /* plan: max_tokens_per_rank, top_k, num_experts, experts_per_rank, hidden */
  int nchunks;              /* DISPATCH_SEND: EPF_LL_UNIT_ELEMS-element chunks per row of H */
  int lane, warp, nwarps;   /* the thread's lane and warp, warps per block */
  uint32_t epoch;           /* epf_ll_epoch_next(state, phase): the round of this call */
  uint32_t dispatch_round;  /* COMBINE_SEND: state.epoch[DISPATCH_RECV], read after epoch (else 0) */
  int nmy, G;               /* the block's local experts le = block + m * nblocks, m < nmy; G = nmy * R */
  epf_wait_t w;             /* epf_ll_wait(plan, ctx) */
  epf_ll_smem_layout_t sl;  /* epf_ll_smem_layout(plan, blockDim.x) */
  uint32_t* mask;           /* sl.mask: the block's active-mask snapshot (sends) */
  void* scan;               /* sl.scan: warp-scan storage */
  uint32_t* recv_groups;    /* sl.recv_groups (dispatch receive, EXPERT_MAJOR) */
  uint32_t* push_prefix;    /* sl.push_prefix (combine send, EXPERT_MAJOR) */
  uint32_t* reduce_present; /* sl.reduce_present (combine receive) */
  uint32_t* reduce_pulled;  /* sl.reduce_pulled (combine receive) */
  uint32_t* reduce_wgrad;   /* sl.reduce_wgrad (combine receive, backward) */
  uint32_t* rm_present;     /* sl.rm_present (RANK_MAJOR) */
  uint32_t* rm_rows;        /* sl.rm_rows (RANK_MAJOR) */
  uint32_t* rm_cnt;         /* sl.rm_cnt (RANK_MAJOR) */
  int32_t* rm_off;          /* sl.rm_off (RANK_MAJOR) */
  epf_ll_slots_t slots;     /* DISPATCH_SEND, COMBINE_RECV: the expert slot table of T tokens (sl.send_slots,
                               sl.reduce_slots) */
  epf_ll_slots_t rslots;    /* DISPATCH_SEND, COMBINE_RECV: the per-rank slot table of T tokens (RANK_MAJOR:
                               sl.rm_send_slots, sl.rm_reduce_slots) */
} epf__ll_frame_t;

/* EPF__LL_FRAME_MAKE — declares the frame `f` of one LL block call and fills it: the body's first
 * statement. num_tokens: the call's num_tokens; phase: the body's epf_ll_phase_t, a literal.
 * Any thread; reads state.epoch[phase] (and, for EPF_LL_PHASE_COMBINE_SEND,
 * state.epoch[EPF_LL_PHASE_DISPATCH_RECV] after it), nothing else. plan, ctx and smem are
 * evaluated more than once: pass names.
 * A macro, not a function, on purpose: a function is optimized on its own before it is inlined,
 * with every field live, and the loads and arithmetic the fields share would no longer be those
 * of each body's former prologue (its generated code changes). Expanded in the body, the fields the
 * body does not read are dropped as if they had never been written. The ORDER of the statements,
 * and what each phase computes, reproduce those prologues exactly (a combine receive loaded T and
 * Tmax after the other shapes; only a dispatch send took nchunks at that point; the combine
 * receive's route slot and the others' nchunks come later in the bodies): change them only with
 * scripts/sass_diff.py showing every kernel identical. */
#define EPF__LL_FRAME_MAKE(f, plan, ctx, num_tokens, phase, smem)                                                      \
  epf__ll_frame_t f;                                                                                                   \
  f.team = (ctx).team;                                                                                                 \
  f.R = (ctx).team.nranks;                                                                                             \
  f.rank = (ctx).team.rank;                                                                                            \
  if ((phase) != EPF_LL_PHASE_COMBINE_RECV) {                                                                          \
    if ((phase) != EPF_LL_PHASE_COMBINE_SEND) f.T = (num_tokens);                                                      \
    f.Tmax = (plan)->max_tokens_per_rank;                                                                              \
  }                                                                                                                    \
  f.K = (plan)->top_k;                                                                                                 \
  f.E = (plan)->num_experts;                                                                                           \
  f.EL = (plan)->experts_per_rank;                                                                                     \
  f.H = (plan)->hidden;                                                                                                \
  if ((phase) == EPF_LL_PHASE_COMBINE_RECV) {                                                                          \
    f.Tmax = (plan)->max_tokens_per_rank;                                                                              \
    f.T = (num_tokens);                                                                                                \
  }                                                                                                                    \
  f.lane = epf_lane_id();                                                                                              \
  f.warp = epf_warp_id();                                                                                              \
  f.nwarps = (int)(blockDim.x >> 5);                                                                                   \
  f.epoch = epf_ll_epoch_next((ctx).state, (phase));                                                                   \
  f.dispatch_round = (phase) == EPF_LL_PHASE_COMBINE_SEND                                                              \
                         ? epf_ld_relaxed_gpu_u32(&(ctx).state->epoch[EPF_LL_PHASE_DISPATCH_RECV])                     \
                         : 0u;                                                                                         \
  f.nmy = (ctx).block < f.EL ? (f.EL - 1 - (ctx).block) / (ctx).nblocks + 1 : 0;                                       \
  f.G = f.nmy * f.R;                                                                                                   \
  f.w = epf_ll_wait((plan), (ctx));                                                                                    \
  f.sl = epf_ll_smem_layout((plan), (int)blockDim.x);                                                                  \
  f.mask = (uint32_t*)((char*)(smem) + f.sl.mask);                                                                     \
  f.scan = (char*)(smem) + f.sl.scan;                                                                                  \
  f.recv_groups = (uint32_t*)((char*)(smem) + f.sl.recv_groups);                                                       \
  f.push_prefix = (uint32_t*)((char*)(smem) + f.sl.push_prefix);                                                       \
  f.reduce_present = (uint32_t*)((char*)(smem) + f.sl.reduce_present);                                                 \
  f.reduce_pulled = (uint32_t*)((char*)(smem) + f.sl.reduce_pulled);                                                   \
  f.reduce_wgrad = (uint32_t*)((char*)(smem) + f.sl.reduce_wgrad);                                                     \
  f.rm_present = (uint32_t*)((char*)(smem) + f.sl.rm_present);                                                         \
  f.rm_rows = (uint32_t*)((char*)(smem) + f.sl.rm_rows);                                                               \
  f.rm_cnt = (uint32_t*)((char*)(smem) + f.sl.rm_cnt);                                                                 \
  f.rm_off = (int32_t*)((char*)(smem) + f.sl.rm_off);                                                                  \
  if ((phase) == EPF_LL_PHASE_DISPATCH_SEND || (phase) == EPF_LL_PHASE_COMBINE_RECV) {                                 \
    f.slots = epf_ll_slots_at((plan), (smem),                                                                          \
                              (phase) == EPF_LL_PHASE_DISPATCH_SEND ? f.sl.send_slots : f.sl.reduce_slots,             \
                              f.T, (int)blockDim.x);                                                                   \
    f.rslots = epf_ll_rm_slots_at((plan), (smem),                                                                      \
                                  (phase) == EPF_LL_PHASE_DISPATCH_SEND ? f.sl.rm_send_slots : f.sl.rm_reduce_slots,   \
                                  f.T, (int)blockDim.x);                                                               \
  }                                                                                                                    \
  if ((phase) == EPF_LL_PHASE_DISPATCH_SEND) f.nchunks = (f.H + EPF_LL_UNIT_ELEMS - 1) / EPF_LL_UNIT_ELEMS

EPF_END_DECLS

#endif /* EPF_LL_IMPL_FRAME_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
