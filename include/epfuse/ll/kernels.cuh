/* epfuse/ll/kernels.cuh — ready-made low-latency kernels and their host launchers — part of epfuse v0.1
 *
 * What it is: the easy path (and the benchmark path) of LL EP, composed only from the blocks of
 * ll/impl/dispatch.cuh, ll/impl/combine.cuh and ll/ll.cuh. One kernel per operation serves both launch kinds:
 *   - a REAL rank (virtual_ranks = 0): `team` from epf_nccl_team_query (or a table / IPC view), the
 *     grid is this rank's blocks;
 *   - VIRTUAL RANKS (virtual_ranks != 0): `team` is epf_team_virtual(base, plan.total_bytes, 0, R)
 *     over one allocation of R slices; block b plays rank b / blocks_per_rank; `state` and every
 *     operand pointer are arrays of R per-rank buffers (epf_ll_buffer_bytes strides).
 * Each call takes `halves`: EPF_LL_SEND, EPF_LL_RECV or EPF_LL_BOTH (fused in one launch). Split
 * halves let the caller run other work between them; the fused launch needs every block resident
 * at once, which the launcher checks (EPF_ERR_CO_RESIDENCY).
 *
 * Everything a launcher does is capturable in a CUDA graph: argument checks, an occupancy query
 * and one kernel launch (cudaFuncSetAttribute only when more than 48 KiB of shared memory is
 * needed). The epochs live in the device state, so a captured graph replays with no host work;
 * write new routing into the captured buffers between replays and launch the graph again.
 *
 * Layouts: an EXPERT_MAJOR plan runs ll/impl/dispatch.cuh / ll/impl/combine.cuh, a RANK_MAJOR plan
 * ll/impl/dispatch_rm.cuh / ll/impl/combine_rm.cuh (one copy per (token, rank); its receive half with packed
 * outputs, or epf_ll_expand, writes the same expert-major view as an EXPERT_MAJOR packed receive);
 * the launchers pick the kernels by plan.layout (separate kernels: neither carries the other's
 * code).
 *
 * What it does NOT do: allocate, synchronise, or create NCCL objects (host_nccl.h, core/nccl.cuh).
 *
 * Usage (8 virtual ranks on one GPU; tests/gpu/test_ll.cu has it whole):
 *   epf_plan_t plan;  epf_plan_compute(&cfg, &plan);          // cfg.mode = EPF_MODE_LL
 *   cudaMalloc(&win, R * plan.total_bytes); cudaMemset(win, 0, R * plan.total_bytes);
 *   cudaMalloc(&state, R * sizeof(epf_ll_state_t));
 *   epf_ll_launch_t L = epf_ll_launch_make(&plan, epf_team_virtual(win, plan.total_bytes, 0, R),
 *                                          state, err_dev, 1);
 *   epf_ll_state_reset(&L, stream);
 *   epf_ll_dispatch(&L, &dargs, EPF_LL_BOTH, stream);          // rows + counts
 *   ... experts write y ...
 *   epf_ll_combine(&L, &cargs, EPF_LL_BOTH, stream);           // out = sum_k w_k y_k
 *
 * Contents:
 *   epf_ll_launch_t
 *   epf_ll_launch_t epf_ll_launch_make(const epf_plan_t*, epf_team_t, epf_ll_state_t*, epf_error_record_t*, int virtual_ranks)
 *   epf_status_t epf_ll_dispatch(const epf_ll_launch_t*, const epf_ll_dispatch_args_t*, int halves, cudaStream_t)
 *   epf_status_t epf_ll_combine(const epf_ll_launch_t*, const epf_ll_combine_args_t*, int halves, cudaStream_t)
 *   epf_status_t epf_ll_expand(const epf_ll_launch_t*, const epf_ll_dispatch_args_t*, cudaStream_t)   RANK_MAJOR
 *   epf_status_t epf_ll_combine_backward(const epf_ll_launch_t*, const epf_ll_dispatch_args_t*, int halves, cudaStream_t)
 *   epf_status_t epf_ll_dispatch_backward(const epf_ll_launch_t*, const epf_ll_combine_args_t*, int halves, cudaStream_t)
 *   epf_status_t epf_ll_state_reset(const epf_ll_launch_t*, cudaStream_t)
 *   epf_status_t epf_ll_mask_query_async(const epf_ll_launch_t*, uint32_t* out_masks, cudaStream_t)
 *   epf_status_t epf_ll_mask_update(const epf_ll_launch_t*, const uint32_t* host_mask, cudaStream_t)
 *   epf_status_t epf_ll_mask_clean(const epf_ll_launch_t*, cudaStream_t)
 *   epf_status_t epf_ll_error_clear_async(epf_error_record_t* record, cudaStream_t)
 *   int          epf_ll_blocks_per_rank(const epf_ll_launch_t*, int num_tokens, int is_combine)
 *   EPF_LL_BPR_COMBINE, EPF_LL_BPR_COMBINE_PULL             is_combine values
 *   kernels (static __global__): epf_ll_dispatch_kernel, epf_ll_combine_kernel, epf_ll_rm_dispatch_kernel,
 *   epf_ll_rm_combine_kernel, epf_ll_expand_kernel, epf_ll_combine_backward_kernel,
 *   epf_ll_dispatch_backward_kernel, epf_ll_rm_combine_backward_kernel, epf_ll_rm_dispatch_backward_kernel,
 *   epf_ll_clean_kernel, epf_ll_state_kernel, epf_ll_error_clear_kernel
 *   Host-side error reading: epf_error_read (host.h) on the host-mapped record, no device sync.
 *
 * Requirements: CUDA runtime API, sm_80+ (sm_90 / sm_100 compiled (-Werror); tested on an H200).
 */
#ifndef EPF_LL_KERNELS_CUH
#define EPF_LL_KERNELS_CUH

#if !defined(__CUDACC_RTC__)
#include <string.h>

#include <cuda_runtime_api.h>
#endif

#include "../config.h"
#include "../host.h"
#include "ll.cuh"
#include "../core/signal.cuh"
#include "../core/team.cuh"

EPF_BEGIN_DECLS

#define EPF_LL_DEFAULT_THREADS 512
/* is_combine values of epf_ll_blocks_per_rank */
#define EPF_LL_BPR_COMBINE 1
#define EPF_LL_BPR_COMBINE_PULL 2
#define EPF_LL_CLEAN_THREADS 128
/* the most blocks per rank a launcher takes (epf_ll_launch_t.blocks_per_rank; the phase arrival
 * counters count at most 65535 blocks, and bpr x ranks must stay a valid grid) */
#define EPF_LL_MAX_BLOCKS_PER_RANK 1024

/* What a launcher needs besides the operands. Fill with epf_ll_launch_make, then adjust. */
typedef struct epf_ll_launch {
  epf_plan_t plan;             /* an LL plan (epf_ll_plan_check) */
  epf_team_t team;             /* real: the rank's view; virtual: the affine view of R slices */
  epf_ll_state_t* state;       /* device: 1 state (real) or R states (virtual) */
  epf_error_record_t* record;  /* device pointer of the host-mapped error record, or NULL */
  const uint32_t* abort_word;  /* device-visible abort word, or NULL */
  int32_t virtual_ranks;       /* 0: one real rank; nonzero: all team.nranks ranks in the launch */
  int32_t blocks_per_rank;     /* 0: chosen per call (epf_ll_blocks_per_rank); at most EPF_LL_MAX_BLOCKS_PER_RANK */
  int32_t threads;             /* threads per block; 0: EPF_LL_DEFAULT_THREADS (multiple of 32) */
  int32_t device;              /* CUDA device of the launches (co-residency check) */
} epf_ll_launch_t;

/* ---- kernels -------------------------------------------------------------------------------- */

/* One rank's context in a ready-made kernel: team, state, block index within the rank. */
EPF_DEVICE_INLINE epf_ll_ctx_t epf__ll_kernel_ctx(epf_team_t team, epf_ll_state_t* state, epf_error_record_t* record,
                                                  const uint32_t* abort_word, int virtual_ranks, int bpr) {
  const epf_team_t t = epf_team_for_block(team, virtual_ranks, bpr);
  return epf_ll_ctx_make(t, virtual_ranks ? state + t.rank : state, record, abort_word,
                         virtual_ranks ? (int)(blockIdx.x % (unsigned)bpr) : (int)blockIdx.x, bpr);
}

/* The operations of the ready-made kernels with a send and a receive half: the selector of
 * epf__ll_kernel_body. Each kernel passes its own as a literal to the force-inlined body, so the
 * switch folds away and every kernel carries only its own two block functions. */
#define EPF__LL_OP_DISPATCH 0             /* epf_ll_dispatch_send_block, epf_ll_dispatch_recv_block */
#define EPF__LL_OP_COMBINE 1              /* epf_ll_combine_send_block, epf_ll_combine_recv_block */
#define EPF__LL_OP_RM_DISPATCH 2          /* epf_ll_rm_dispatch_send_block, epf_ll_rm_dispatch_recv_block */
#define EPF__LL_OP_RM_COMBINE 3           /* epf_ll_rm_combine_send_block, epf_ll_rm_combine_recv_block */
#define EPF__LL_OP_COMBINE_BACKWARD 4     /* epf_ll_combine_backward_send_block, epf_ll_dispatch_recv_block */
#define EPF__LL_OP_DISPATCH_BACKWARD 5    /* epf_ll_dispatch_backward_send_block, _recv_block */
#define EPF__LL_OP_RM_COMBINE_BACKWARD 6  /* epf_ll_rm_dispatch_send_block, epf_ll_rm_combine_backward_recv_block */
#define EPF__LL_OP_RM_DISPATCH_BACKWARD 7 /* epf_ll_rm_dispatch_backward_send_block, _recv_block */

/* epf__ll_kernel_half — the send half (send) or the receive half (!send) of operation op (an
 * EPF__LL_OP_* literal) for one rank: the block function named beside op. [collective:block], as
 * that function. d: the rank's operands of DISPATCH, RM_DISPATCH, COMBINE_BACKWARD and
 * RM_COMBINE_BACKWARD; c: those of the others (the other pointer is not read). */
EPF_DEVICE_INLINE void epf__ll_kernel_half(int op, bool send, const epf_plan_t* plan, epf_ll_ctx_t ctx,
                                           const epf_ll_dispatch_args_t* d, const epf_ll_combine_args_t* c, void* smem) {
  switch (op) {
    case EPF__LL_OP_DISPATCH:
      if (send) epf_ll_dispatch_send_block(plan, ctx, d, smem);
      else (void)epf_ll_dispatch_recv_block(plan, ctx, d, smem);
      break;
    case EPF__LL_OP_COMBINE:
      if (send) epf_ll_combine_send_block(plan, ctx, c, smem);
      else (void)epf_ll_combine_recv_block(plan, ctx, c, smem);
      break;
    case EPF__LL_OP_RM_DISPATCH:
      if (send) epf_ll_rm_dispatch_send_block(plan, ctx, d, smem);
      else (void)epf_ll_rm_dispatch_recv_block(plan, ctx, d, smem);
      break;
    case EPF__LL_OP_RM_COMBINE:
      if (send) epf_ll_rm_combine_send_block(plan, ctx, c, smem);
      else (void)epf_ll_rm_combine_recv_block(plan, ctx, c, smem);
      break;
    case EPF__LL_OP_COMBINE_BACKWARD:
      if (send) epf_ll_combine_backward_send_block(plan, ctx, d, smem);
      else (void)epf_ll_dispatch_recv_block(plan, ctx, d, smem);
      break;
    case EPF__LL_OP_DISPATCH_BACKWARD:
      if (send) epf_ll_dispatch_backward_send_block(plan, ctx, c, smem);
      else (void)epf_ll_dispatch_backward_recv_block(plan, ctx, c, smem);
      break;
    case EPF__LL_OP_RM_COMBINE_BACKWARD:
      if (send) epf_ll_rm_dispatch_send_block(plan, ctx, d, smem);
      else (void)epf_ll_rm_combine_backward_recv_block(plan, ctx, d, smem);
      break;
    case EPF__LL_OP_RM_DISPATCH_BACKWARD:
      if (send) epf_ll_rm_dispatch_backward_send_block(plan, ctx, c, smem);
      else (void)epf_ll_rm_dispatch_backward_recv_block(plan, ctx, c, smem);
      break;
  }
}

/* epf__ll_kernel_body — the body of the eight kernels below: the rank's context and operands
 * (epf_ll_*_args_for_rank under virtual ranks), the send half, a __syncthreads when both halves
 * run, the receive half. op: an EPF__LL_OP_* literal; dargs / cargs: the kernel's operands, the
 * one op does not use NULL. [collective:block]: every thread of the grid, converged. */
EPF_DEVICE_INLINE void epf__ll_kernel_body(int op, const epf_plan_t* plan, epf_team_t team, epf_ll_state_t* state,
                                           epf_error_record_t* record, const uint32_t* abort_word, int virtual_ranks,
                                           int bpr, int halves, const epf_ll_dispatch_args_t* dargs,
                                           const epf_ll_combine_args_t* cargs) {
  extern __shared__ uint4 epf__ll_smem[];
  const epf_ll_ctx_t ctx = epf__ll_kernel_ctx(team, state, record, abort_word, virtual_ranks, bpr);
  if (dargs != NULL) {
    const epf_ll_dispatch_args_t a = virtual_ranks ? epf_ll_dispatch_args_for_rank(dargs, plan, ctx.team.rank) : *dargs;
    if (halves & EPF_LL_SEND) epf__ll_kernel_half(op, true, plan, ctx, &a, NULL, epf__ll_smem);
    if (halves == EPF_LL_BOTH) __syncthreads();
    if (halves & EPF_LL_RECV) epf__ll_kernel_half(op, false, plan, ctx, &a, NULL, epf__ll_smem);
  } else {
    const epf_ll_combine_args_t a = virtual_ranks ? epf_ll_combine_args_for_rank(cargs, plan, ctx.team.rank) : *cargs;
    if (halves & EPF_LL_SEND) epf__ll_kernel_half(op, true, plan, ctx, NULL, &a, epf__ll_smem);
    if (halves == EPF_LL_BOTH) __syncthreads();
    if (halves & EPF_LL_RECV) epf__ll_kernel_half(op, false, plan, ctx, NULL, &a, epf__ll_smem);
  }
}

/* epf_ll_dispatch_kernel — grid = ranks_in_launch * bpr blocks; dynamic smem epf_ll_smem_bytes. */
static __global__ void __launch_bounds__(1024, 1) epf_ll_dispatch_kernel(epf_plan_t plan, epf_team_t team, epf_ll_state_t* state,
                                              epf_error_record_t* record, const uint32_t* abort_word,
                                              int virtual_ranks, int bpr, int halves, epf_ll_dispatch_args_t args) {
  epf__ll_kernel_body(EPF__LL_OP_DISPATCH, &plan, team, state, record, abort_word, virtual_ranks, bpr,
                      halves, &args, NULL);
}

/* epf_ll_combine_kernel — grid = ranks_in_launch * bpr blocks; dynamic smem epf_ll_smem_bytes.
 * Same shape as epf_ll_dispatch_kernel on purpose (one kernel per stage and operand type, no
 * templates): context, per-rank operands, the send half, the receive half (epf__ll_kernel_body). */
static __global__ void __launch_bounds__(1024, 1) epf_ll_combine_kernel(epf_plan_t plan, epf_team_t team, epf_ll_state_t* state,
                                             epf_error_record_t* record, const uint32_t* abort_word,
                                             int virtual_ranks, int bpr, int halves, epf_ll_combine_args_t args) {
  epf__ll_kernel_body(EPF__LL_OP_COMBINE, &plan, team, state, record, abort_word, virtual_ranks, bpr,
                      halves, NULL, &args);
}

/* epf_ll_rm_dispatch_kernel / epf_ll_rm_combine_kernel — the same kernels for a RANK_MAJOR plan
 * (ll/impl/dispatch_rm.cuh, ll/impl/combine_rm.cuh): kept apart from the EXPERT_MAJOR kernels so that neither
 * carries the other's code (registers, occupancy). The launchers pick by plan.layout. */
static __global__ void __launch_bounds__(1024, 1) epf_ll_rm_dispatch_kernel(epf_plan_t plan, epf_team_t team, epf_ll_state_t* state,
                                                 epf_error_record_t* record, const uint32_t* abort_word,
                                                 int virtual_ranks, int bpr, int halves, epf_ll_dispatch_args_t args) {
  epf__ll_kernel_body(EPF__LL_OP_RM_DISPATCH, &plan, team, state, record, abort_word, virtual_ranks, bpr,
                      halves, &args, NULL);
}

static __global__ void __launch_bounds__(1024, 1) epf_ll_rm_combine_kernel(epf_plan_t plan, epf_team_t team, epf_ll_state_t* state,
                                                epf_error_record_t* record, const uint32_t* abort_word,
                                                int virtual_ranks, int bpr, int halves, epf_ll_combine_args_t args) {
  epf__ll_kernel_body(EPF__LL_OP_RM_COMBINE, &plan, team, state, record, abort_word, virtual_ranks, bpr,
                      halves, NULL, &args);
}

/* epf_ll_expand_kernel — RANK_MAJOR: epf_ll_rm_expand_block on every block of every rank of the
 * launch (no waits: any grid). */
static __global__ void __launch_bounds__(1024, 1) epf_ll_expand_kernel(epf_plan_t plan, epf_team_t team, epf_ll_state_t* state,
                                            epf_error_record_t* record, const uint32_t* abort_word, int virtual_ranks,
                                            int bpr, epf_ll_dispatch_args_t args) {
  extern __shared__ uint4 epf__ll_smem[];
  const epf_ll_ctx_t ctx = epf__ll_kernel_ctx(team, state, record, abort_word, virtual_ranks, bpr);
  const epf_ll_dispatch_args_t a = virtual_ranks ? epf_ll_dispatch_args_for_rank(&args, &plan, ctx.team.rank) : args;
  epf_ll_rm_expand_block(&plan, ctx, &a, epf__ll_smem);
}

/* epf_ll_combine_backward_kernel — the backward of the combine (training): epf_ll_dispatch_kernel
 * with epf_ll_combine_backward_send_block as its send half (the receive half is the dispatch's). */
static __global__ void __launch_bounds__(1024, 1) epf_ll_combine_backward_kernel(epf_plan_t plan, epf_team_t team, epf_ll_state_t* state,
                                                      epf_error_record_t* record, const uint32_t* abort_word,
                                                      int virtual_ranks, int bpr, int halves, epf_ll_dispatch_args_t args) {
  epf__ll_kernel_body(EPF__LL_OP_COMBINE_BACKWARD, &plan, team, state, record, abort_word, virtual_ranks, bpr,
                      halves, &args, NULL);
}

/* epf_ll_dispatch_backward_kernel — the backward of the dispatch (training): epf_ll_combine_kernel
 * with the backward halves (epf_ll_dispatch_backward_send_block / _recv_block). */
static __global__ void __launch_bounds__(1024, 1) epf_ll_dispatch_backward_kernel(epf_plan_t plan, epf_team_t team, epf_ll_state_t* state,
                                                       epf_error_record_t* record, const uint32_t* abort_word,
                                                       int virtual_ranks, int bpr, int halves, epf_ll_combine_args_t args) {
  epf__ll_kernel_body(EPF__LL_OP_DISPATCH_BACKWARD, &plan, team, state, record, abort_word, virtual_ranks, bpr,
                      halves, NULL, &args);
}

/* epf_ll_rm_combine_backward_kernel / epf_ll_rm_dispatch_backward_kernel — the training direction of
 * a RANK_MAJOR plan: epf_ll_rm_dispatch_kernel with the backward receive half (the expand writes
 * the view rows' combine weights; the send half is the dispatch's), epf_ll_rm_combine_kernel with
 * the backward halves (unit weights over distinct view rows, the router-weight gradients). */
static __global__ void __launch_bounds__(1024, 1) epf_ll_rm_combine_backward_kernel(epf_plan_t plan, epf_team_t team, epf_ll_state_t* state,
                                                         epf_error_record_t* record, const uint32_t* abort_word,
                                                         int virtual_ranks, int bpr, int halves, epf_ll_dispatch_args_t args) {
  epf__ll_kernel_body(EPF__LL_OP_RM_COMBINE_BACKWARD, &plan, team, state, record, abort_word, virtual_ranks, bpr,
                      halves, &args, NULL);
}

static __global__ void __launch_bounds__(1024, 1) epf_ll_rm_dispatch_backward_kernel(epf_plan_t plan, epf_team_t team, epf_ll_state_t* state,
                                                          epf_error_record_t* record, const uint32_t* abort_word,
                                                          int virtual_ranks, int bpr, int halves, epf_ll_combine_args_t args) {
  epf__ll_kernel_body(EPF__LL_OP_RM_DISPATCH_BACKWARD, &plan, team, state, record, abort_word, virtual_ranks, bpr,
                      halves, NULL, &args);
}

/* epf_ll_clean_kernel — one block per rank of the launch. */
static __global__ void epf_ll_clean_kernel(epf_plan_t plan, epf_team_t team, epf_ll_state_t* state,
                                           epf_error_record_t* record, const uint32_t* abort_word, int virtual_ranks) {
  extern __shared__ uint4 epf__ll_smem[];
  const epf_ll_ctx_t ctx = epf__ll_kernel_ctx(team, state, record, abort_word, virtual_ranks, 1);
  (void)epf_ll_mask_clean_block(&plan, ctx, epf__ll_smem);
}

/* The mask words of one rank, by value (kernel parameter). */
typedef struct epf_ll_mask_words {
  uint32_t w[EPF_MASK_WORDS];
} epf_ll_mask_words_t;

#define EPF__LL_STATE_RESET 0
#define EPF__LL_STATE_QUERY 1
#define EPF__LL_STATE_UPDATE 2

/* epf_ll_state_kernel — state maintenance for `count` states: reset, mask query, mask update. */
static __global__ void epf_ll_state_kernel(epf_ll_state_t* state, int count, int nranks, int op,
                                           epf_ll_mask_words_t mask, uint32_t* out_masks) {
  const int r = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  if (r >= count) return;
  if (op == EPF__LL_STATE_RESET) {
    epf_ll_state_t s;
    epf_ll_state_init(&s, nranks);
    state[r] = s;
  } else if (op == EPF__LL_STATE_QUERY) {
    epf_ll_mask_query(state + r, out_masks + (int64_t)r * EPF_MASK_WORDS);
  } else {
    epf_ll_mask_set(state + r, mask.w);
  }
}

/* epf_ll_error_clear_kernel — zero an error record, stream-ordered. */
static __global__ void epf_ll_error_clear_kernel(epf_error_record_t* record) {
  uint32_t* w = (uint32_t*)record;
  const int n = (int)(sizeof(epf_error_record_t) / 4u);
  int i;
  for (i = (int)threadIdx.x; i < n; i += (int)blockDim.x) epf_st_relaxed_sys_u32(w + i, 0u);
}

#if !defined(__CUDACC_RTC__) /* host launchers: nvcc only (NVRTC compiles the kernels above) */
/* ---- host launchers ------------------------------------------------------------------------- */

/* epf_ll_launch_make — a launch description with defaults (blocks chosen per call, 512 threads,
 *   the current device). virtual_ranks != 0: team is the affine view of all R slices and state
 *   points at R states. plan NULL: an all-zero description that every launcher refuses. Nothing is
 *   checked here: each launcher checks the description (epf__ll_launch_check). Scope: host. */
EPF_INLINE epf_ll_launch_t epf_ll_launch_make(const epf_plan_t* plan, epf_team_t team, epf_ll_state_t* state,
                                              epf_error_record_t* record, int virtual_ranks) {
  epf_ll_launch_t L;
  int dev = 0;
  memset(&L, 0, sizeof(L));
  if (plan == NULL) return L; /* every launcher refuses it (EPF_ERR_STRUCT_VERSION: no plan) */
  L.plan = *plan;
  L.team = team;
  L.state = state;
  L.record = record;
  L.abort_word = NULL;
  L.virtual_ranks = virtual_ranks ? 1 : 0;
  L.blocks_per_rank = 0;
  L.threads = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
  L.device = dev;
  return L;
}

EPF_INLINE int epf__ll_threads(const epf_ll_launch_t* L) {
  return L->threads > 0 ? L->threads : EPF_LL_DEFAULT_THREADS;
}
EPF_INLINE int epf__ll_ranks_in_launch(const epf_ll_launch_t* L) { return L->virtual_ranks ? L->team.nranks : 1; }

/* epf__ll_launch_check — the launch description itself, before any use of its fields: L and its
 * state (EPF_ERR_INVALID_ARGUMENT), the plan (epf_ll_plan_check: EPF_ERR_STRUCT_VERSION, EPF_ERR_MODE
 * for a non-LL plan, ...), the team against the plan (EPF_ERR_RANKS: another size; EPF_ERR_RANK: a
 * real rank outside [0, R); EPF_ERR_INVALID_ARGUMENT: no memory, or an affine stride below the
 * plan's slice, so slices would overlap), threads (a multiple of 32 in [32, 1024]) and
 * blocks_per_rank ([0, EPF_LL_MAX_BLOCKS_PER_RANK]). Host; no CUDA calls. The HT twin is
 * epf__ht_launch_check. */
EPF_INLINE epf_status_t epf__ll_launch_check(const epf_ll_launch_t* L) {
  epf_status_t st;
  int threads;
  if (L == NULL || L->state == NULL) return EPF_ERR_INVALID_ARGUMENT;
  st = epf_ll_plan_check(&L->plan);
  if (st != EPF_OK) return st;
  if (L->team.nranks != L->plan.nranks) return EPF_ERR_RANKS;
  if (!L->virtual_ranks && (L->team.rank < 0 || L->team.rank >= L->team.nranks)) return EPF_ERR_RANK;
  if (L->team.peers == NULL && (L->team.base == NULL || (L->team.nranks > 1 && L->team.stride < L->plan.total_bytes)))
    return EPF_ERR_INVALID_ARGUMENT; /* slices would overlap (a team of one has no stride: NCCL gives 0) */
  threads = epf__ll_threads(L);
  if (threads < 32 || threads > 1024 || threads % 32 != 0) return EPF_ERR_INVALID_ARGUMENT;
  if (L->blocks_per_rank < 0 || L->blocks_per_rank > EPF_LL_MAX_BLOCKS_PER_RANK) return EPF_ERR_INVALID_ARGUMENT;
  return EPF_OK;
}

/* epf__ll_capacity — how many blocks of `kernel` can be resident at once on the device.
 *   EPF_ERR_TOKENS when the blocks' scratch (which grows with max_tokens_per_rank x top_k and with
 *   num_experts) exceeds the device's opt-in shared memory per block: such a plan is not an LL
 *   plan. */
EPF_INLINE epf_status_t epf__ll_capacity(const void* kernel, int threads, size_t smem, int device, int* out) {
  int per_sm = 0, sms = 0, optin = 0;
  if (!epf__cuda_ok(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device)))
    return EPF_ERR_CUDA;
  if (smem > (size_t)optin) return EPF_ERR_TOKENS;
  if (smem > 48u * 1024u &&
      !epf__cuda_ok(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)))
    return EPF_ERR_CUDA;
  if (!epf__cuda_ok(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem)) ||
      !epf__cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)))
    return EPF_ERR_CUDA;
  *out = per_sm * sms;
  return *out > 0 ? EPF_OK : EPF_ERR_CO_RESIDENCY;
}

/* epf_ll_blocks_per_rank — the launchers' choice when L->blocks_per_rank is 0: enough warps for
 *   one unit each (dispatch and the combine's reduce: (token, 256-element chunk); the combine
 *   push: (row, EPF_LL_SEND_CHUNKS chunks), num_tokens * top_k rows; a pull combine,
 *   EPF_LL_BPR_COMBINE_PULL (a BF16 pull): the reduce's units only, since its send half moves
 *   nothing; an MXFP8 pull quantizes every row, EPF_LL_BPR_COMBINE), at most
 *   the resident capacity divided by the ranks of the launch, at least 1. is_combine: 0
 *   dispatch, EPF_LL_BPR_COMBINE (1), EPF_LL_BPR_COMBINE_PULL (2). Scope: host. Returns 1 if the
 *   occupancy query fails, 0 for a launch description the launchers refuse (epf__ll_launch_check:
 *   NULL, not an LL plan, ...) or an unknown is_combine. */
/* (epf__ll_blocks_per_rank: the choice for a launch description already checked — the launchers
 * call it after epf__ll_launch_check; the public function checks first) */
EPF_INLINE int epf__ll_blocks_per_rank(const epf_ll_launch_t* L, int num_tokens, int is_combine) {
  int threads, cap = 0, ranks;
  size_t smem;
  bool rm;
  const void* kernel;
  int64_t nchunks, ngroups, tokens, push, units, want, bpr;
  if (L->blocks_per_rank > 0) return L->blocks_per_rank;
  threads = epf__ll_threads(L);
  smem = epf_ll_smem_bytes(&L->plan, threads);
  rm = L->plan.layout == EPF_LAYOUT_RANK_MAJOR;
  kernel = is_combine ? (rm ? (const void*)epf_ll_rm_combine_kernel : (const void*)epf_ll_combine_kernel)
                      : (rm ? (const void*)epf_ll_rm_dispatch_kernel : (const void*)epf_ll_dispatch_kernel);
  nchunks = (L->plan.hidden + EPF_LL_UNIT_ELEMS - 1) / EPF_LL_UNIT_ELEMS;
  ngroups = (nchunks + EPF_LL_SEND_CHUNKS - 1) / EPF_LL_SEND_CHUNKS;
  tokens = num_tokens > 0 ? num_tokens : 1;
  /* the push's units: EXPERT_MAJOR (row, chunk group) over T * K rows; RANK_MAJOR (row, chunk)
   * over at most T * min(K, R) rows (the pre-reduce) */
  push = rm ? tokens * (L->plan.top_k < L->plan.nranks ? L->plan.top_k : L->plan.nranks) * nchunks
            : tokens * L->plan.top_k * ngroups;
  units = is_combine == EPF_LL_BPR_COMBINE ? (push > tokens * nchunks ? push : tokens * nchunks) : tokens * nchunks;
  want = (units + threads / 32 - 1) / (threads / 32);
  ranks = epf__ll_ranks_in_launch(L);
  if (epf__ll_capacity(kernel, threads, smem, L->device, &cap) != EPF_OK) return 1;
  bpr = cap / ranks;
  if (bpr > want) bpr = want;
  if (bpr < 1) bpr = 1;
  return (int)bpr;
}
EPF_INLINE int epf_ll_blocks_per_rank(const epf_ll_launch_t* L, int num_tokens, int is_combine) {
  if (epf__ll_launch_check(L) != EPF_OK || is_combine < 0 || is_combine > EPF_LL_BPR_COMBINE_PULL) return 0;
  return epf__ll_blocks_per_rank(L, num_tokens, is_combine);
}

/* epf__ll_launch_op — common part of epf_ll_dispatch / epf_ll_combine. */
EPF_INLINE epf_status_t epf__ll_grid(const epf_ll_launch_t* L, const void* kernel, int halves, int num_tokens,
                                     int is_combine, int* out_bpr, int* out_grid, size_t* out_smem) {
  const int threads = epf__ll_threads(L);
  const size_t smem = epf_ll_smem_bytes(&L->plan, threads);
  const int ranks = epf__ll_ranks_in_launch(L);
  const int bpr = epf__ll_blocks_per_rank(L, num_tokens, is_combine); /* L checked by the caller */
  int cap = 0;
  epf_status_t st = epf__ll_capacity(kernel, threads, smem, L->device, &cap);
  if (st != EPF_OK) return st;
  /* fused halves wait on blocks of the same launch: all of them must be resident */
  if (halves == EPF_LL_BOTH && (int64_t)bpr * ranks > cap) return EPF_ERR_CO_RESIDENCY;
  *out_bpr = bpr;
  *out_grid = bpr * ranks;
  *out_smem = smem;
  return EPF_OK;
}

EPF_INLINE bool epf__ll_aligned16(const void* p) { return ((uintptr_t)p & 15u) == 0u; }

/* epf__ll_combine_pulls — does this call pull (epf_ll_combine_pulls: EPF_LL_Y_IN_PLACE_PULL with a
 * BF16 combine payload; an MXFP8 combine payload unless the plan has EPF_FLAG_COMBINE_PUSH)? */
EPF_INLINE bool epf__ll_combine_pulls(const epf_ll_launch_t* L, const epf_ll_combine_args_t* args) {
  return epf_ll_combine_pulls(&L->plan, args->y_layout);
}

/* epf__ll_combine_bpr_kind — the grid of a combine call: a BF16 pull's send half only signals,
 * so the reduce is the whole work (EPF_LL_BPR_COMBINE_PULL); an MXFP8 pull quantizes every row
 * on the expert side, the same units as a push (EPF_LL_BPR_COMBINE). RANK_MAJOR: always
 * EPF_LL_BPR_COMBINE (push or pull, the expert side pre-reduces every (source, token) row). */
EPF_INLINE int epf__ll_combine_bpr_kind(const epf_ll_launch_t* L, const epf_ll_combine_args_t* args) {
  if (L->plan.layout == EPF_LAYOUT_RANK_MAJOR) return EPF_LL_BPR_COMBINE;
  return epf__ll_combine_pulls(L, args) && L->plan.combine_payload == EPF_PAYLOAD_BF16 ? EPF_LL_BPR_COMBINE_PULL
                                                                                       : EPF_LL_BPR_COMBINE;
}

/* ---- the four calls with a send and a receive half: one table, one body ---------------------- */

/* What distinguishes epf_ll_dispatch, epf_ll_combine, epf_ll_combine_backward and
 * epf_ll_dispatch_backward (epf__ll_calls): their operands, their direction and their kernels. */
typedef struct epf__ll_call {
  int combine; /* operands: epf_ll_combine_args_t (1: epf__ll_combine_operands_check, the combine
                  payload, the combine grid) or epf_ll_dispatch_args_t (0) */
  int bwd;     /* the training direction: epf_ll_backward_check first */
  int op[2];   /* the kernel, an EPF__LL_OP_* (epf__ll_op_kernel): [0] EXPERT_MAJOR, [1] RANK_MAJOR plan */
} epf__ll_call_t;

#define EPF__LL_CALL_DISPATCH 0          /* epf_ll_dispatch */
#define EPF__LL_CALL_COMBINE 1           /* epf_ll_combine */
#define EPF__LL_CALL_COMBINE_BACKWARD 2  /* epf_ll_combine_backward */
#define EPF__LL_CALL_DISPATCH_BACKWARD 3 /* epf_ll_dispatch_backward */

/* epf__ll_calls — the table row of call (an EPF__LL_CALL_*). Host. */
EPF_INLINE epf__ll_call_t epf__ll_calls(int call) {
  static const epf__ll_call_t table[4] = {
      {0, 0, {EPF__LL_OP_DISPATCH, EPF__LL_OP_RM_DISPATCH}},
      {1, 0, {EPF__LL_OP_COMBINE, EPF__LL_OP_RM_COMBINE}},
      {0, 1, {EPF__LL_OP_COMBINE_BACKWARD, EPF__LL_OP_RM_COMBINE_BACKWARD}},
      {1, 1, {EPF__LL_OP_DISPATCH_BACKWARD, EPF__LL_OP_RM_DISPATCH_BACKWARD}},
  };
  return table[call];
}

/* epf__ll_op_kernel — the ready-made kernel of operation op (an EPF__LL_OP_*). Host. */
EPF_INLINE const void* epf__ll_op_kernel(int op) {
  switch (op) {
    case EPF__LL_OP_DISPATCH: return (const void*)epf_ll_dispatch_kernel;
    case EPF__LL_OP_COMBINE: return (const void*)epf_ll_combine_kernel;
    case EPF__LL_OP_RM_DISPATCH: return (const void*)epf_ll_rm_dispatch_kernel;
    case EPF__LL_OP_RM_COMBINE: return (const void*)epf_ll_rm_combine_kernel;
    case EPF__LL_OP_COMBINE_BACKWARD: return (const void*)epf_ll_combine_backward_kernel;
    case EPF__LL_OP_DISPATCH_BACKWARD: return (const void*)epf_ll_dispatch_backward_kernel;
    case EPF__LL_OP_RM_COMBINE_BACKWARD: return (const void*)epf_ll_rm_combine_backward_kernel;
    default: return (const void*)epf_ll_rm_dispatch_backward_kernel; /* EPF__LL_OP_RM_DISPATCH_BACKWARD */
  }
}

/* epf__ll_dispatch_operands_check — the operands of a dispatch-shaped call (epf_ll_dispatch,
 * epf_ll_combine_backward), as epf_ll_dispatch documents them. Host. */
EPF_INLINE epf_status_t epf__ll_dispatch_operands_check(const epf_ll_dispatch_args_t* args, int halves) {
  if (halves & EPF_LL_SEND) {
    if (args->num_tokens > 0 && (args->x == NULL || args->topk_idx == NULL)) return EPF_ERR_INVALID_ARGUMENT;
    if (!epf__ll_aligned16(args->x)) return EPF_ERR_ALIGNMENT;
  }
  if (halves & EPF_LL_RECV) {
    if (args->recv_counts == NULL) return EPF_ERR_INVALID_ARGUMENT;
    if (!epf__ll_aligned16(args->packed_x) || !epf__ll_aligned16(args->packed_meta)) return EPF_ERR_ALIGNMENT;
  }
  return EPF_OK;
}

/* epf__ll_combine_operands_check — the operands of a combine-shaped call (epf_ll_combine,
 * epf_ll_dispatch_backward with bwd), as epf_ll_combine documents them; rm: a RANK_MAJOR plan
 * (y in the expert-major view's order, FIXED, PACKED or PACKED_PULL, a buffer). Host. */
EPF_INLINE epf_status_t epf__ll_combine_operands_check(const epf_ll_launch_t* L, const epf_ll_combine_args_t* args,
                                                       int halves, bool rm, bool bwd) {
  const bool in_place = args->y_layout == EPF_LL_Y_IN_PLACE || args->y_layout == EPF_LL_Y_IN_PLACE_PULL;
  if (halves & EPF_LL_SEND) {
    if (rm) {
      if (args->recv_counts == NULL || args->y == NULL) return EPF_ERR_INVALID_ARGUMENT;
      if (args->y_layout != EPF_LL_Y_FIXED && args->y_layout != EPF_LL_Y_PACKED && args->y_layout != EPF_LL_Y_PACKED_PULL)
        return EPF_ERR_INVALID_ARGUMENT;
    } else {
      if (args->recv_counts == NULL) return EPF_ERR_INVALID_ARGUMENT;
      if (args->y_layout != EPF_LL_Y_FIXED && args->y_layout != EPF_LL_Y_PACKED && !in_place)
        return EPF_ERR_INVALID_ARGUMENT;
      if (in_place && L->plan.payload != EPF_PAYLOAD_BF16) return EPF_ERR_PAYLOAD;
      if (!in_place && args->y == NULL) return EPF_ERR_INVALID_ARGUMENT;
    }
    if (!epf__ll_aligned16(args->y)) return EPF_ERR_ALIGNMENT;
  }
  if (halves & EPF_LL_RECV) {
    if (args->num_tokens > 0 && (args->topk_idx == NULL || args->out == NULL)) return EPF_ERR_INVALID_ARGUMENT;
    if (!epf__ll_aligned16(args->out)) return EPF_ERR_ALIGNMENT;
  }
  /* backward: the router-weight gradient's buffers, 4-byte aligned FP32 */
  if (bwd && (((uintptr_t)args->weight_grad & 3u) != 0u || ((uintptr_t)args->topk_weights_grad & 3u) != 0u))
    return EPF_ERR_ALIGNMENT;
  return EPF_OK;
}

/* epf__ll_call_launch — the body of the four calls: call (an EPF__LL_CALL_*) picks the operands'
 * type (args), the checks and the kernel from epf__ll_calls. Checks, in this order: the launch,
 * epf_ll_backward_check (backward calls), args and halves, the index type, the payload (the
 * dispatch's or the combine's: EPF_ERR_NOT_SUPPORTED), the tokens, the operands (by the plan's
 * layout), the grid; then one launch of the kernel of (call, layout) with the kernels' common
 * parameters and *args (cudaLaunchKernel, as `<<<>>>` does). Host; stream-ordered; capturable. */
EPF_INLINE epf_status_t epf__ll_call_launch(const epf_ll_launch_t* L, int call, const void* args, int halves,
                                            cudaStream_t stream) {
  const epf__ll_call_t c = epf__ll_calls(call);
  const epf_ll_dispatch_args_t* da = (const epf_ll_dispatch_args_t*)args; /* read only if !c.combine */
  const epf_ll_combine_args_t* ca = (const epf_ll_combine_args_t*)args;   /* read only if c.combine */
  int bpr = 0, grid = 0, num_tokens, threads;
  size_t smem = 0;
  bool rm;
  const void* kernel;
  epf_status_t st = epf__ll_launch_check(L);
  if (st != EPF_OK) return st;
  if (c.bwd && (st = epf_ll_backward_check(&L->plan)) != EPF_OK) return st;
  if (args == NULL || halves < EPF_LL_SEND || halves > EPF_LL_BOTH) return EPF_ERR_INVALID_ARGUMENT;
  if (!epf_ll_index_type_ok(c.combine ? ca->index_type : da->index_type)) return EPF_ERR_INVALID_ARGUMENT;
  if (c.combine ? !epf_ll_combine_payload_supported(L->plan.combine_payload) : !epf_ll_payload_supported(L->plan.payload))
    return EPF_ERR_NOT_SUPPORTED;
  num_tokens = c.combine ? ca->num_tokens : da->num_tokens;
  st = epf_ll_tokens_check(&L->plan, num_tokens);
  if (st != EPF_OK) return st;
  rm = L->plan.layout == EPF_LAYOUT_RANK_MAJOR;
  st = c.combine ? epf__ll_combine_operands_check(L, ca, halves, rm, c.bwd != 0) : epf__ll_dispatch_operands_check(da, halves);
  if (st != EPF_OK) return st;
  kernel = epf__ll_op_kernel(c.op[rm ? 1 : 0]);
  st = epf__ll_grid(L, kernel, halves, num_tokens, c.combine ? epf__ll_combine_bpr_kind(L, ca) : 0, &bpr, &grid, &smem);
  if (st != EPF_OK) return st;
  threads = epf__ll_threads(L);
  {
    /* the parameters of every kernel of epf__ll_op_kernel, in order; args: that call's operand type */
    void* params[9];
    params[0] = (void*)&L->plan;
    params[1] = (void*)&L->team;
    params[2] = (void*)&L->state;
    params[3] = (void*)&L->record;
    params[4] = (void*)&L->abort_word;
    params[5] = (void*)&L->virtual_ranks;
    params[6] = &bpr;
    params[7] = &halves;
    params[8] = (void*)args;
    (void)cudaLaunchKernel(kernel, dim3((unsigned)grid), dim3((unsigned)threads), params, smem, stream);
  }
  return epf__cuda_status(cudaGetLastError());
}

/* epf_ll_dispatch — launch the LL dispatch: send half, receive half, or both fused.
 *   Checks (EPF_OK or the first failure): the launch (epf_ll_plan_check: EPF_ERR_MODE for a non-LL
 *   plan; EPF_ERR_RANKS / EPF_ERR_RANK for the team; a RANK_MAJOR plan runs the rank-major
 *   kernel: one copy per (token, rank), and with packed outputs the receive half also expands
 *   them into the expert-major view), halves,
 *   index type (EPF_ERR_INVALID_ARGUMENT unless epf_ll_index_type_ok), payload
 *   (EPF_ERR_NOT_SUPPORTED unless epf_ll_payload_supported), tokens (EPF_ERR_TOKENS), operands
 *   (EPF_ERR_INVALID_ARGUMENT: send needs x and topk_idx unless num_tokens == 0, receive needs
 *   recv_counts; EPF_ERR_ALIGNMENT: x, packed_x, packed_meta not 16-byte aligned), then the grid
 *   (EPF_ERR_TOKENS when T x top_k / num_experts need more shared memory than a block can have,
 *   EPF_ERR_CO_RESIDENCY for a fused launch that cannot be resident) and the launch
 *   (EPF_ERR_CUDA). Scope: host; stream-ordered; capturable. */
EPF_INLINE epf_status_t epf_ll_dispatch(const epf_ll_launch_t* L, const epf_ll_dispatch_args_t* args, int halves,
                                        cudaStream_t stream) {
  return epf__ll_call_launch(L, EPF__LL_CALL_DISPATCH, args, halves, stream);
}

/* epf_ll_combine_backward — the backward of the LL combine (training): an LL dispatch round of the
 *   output gradients. args as for epf_ll_dispatch, with args->x = dy [num_tokens][hidden] BF16 and
 *   the SAME topk_idx / topk_weights / num_tokens (and index type) as the forward round; the rows
 *   land in the same (local expert, source, slot) as the forward's, each with the metadata weight
 *   = the row's combine weight (epf_ll_combine_backward_send_block). The receive half and its
 *   outputs (counts, packed copy, *round) are the dispatch's. It is a dispatch round of the state:
 *   the next combine round (normally epf_ll_dispatch_backward) pairs with it.
 *   RANK_MAJOR plan: the rank-major dispatch of dy (one row per (token, rank), entries per k with
 *   the forward's weights), and the expand of a receive half with packed outputs gives each view
 *   row's packed_meta weight = its combine weight (epf_ll_rm_combine_backward_recv_block).
 *   Checks: those of epf_ll_dispatch, plus epf_ll_backward_check (EPF_ERR_NOT_SUPPORTED unless the
 *   plan is BF16 both ways).
 *   Scope: host; stream-ordered; capturable. */
EPF_INLINE epf_status_t epf_ll_combine_backward(const epf_ll_launch_t* L, const epf_ll_dispatch_args_t* args,
                                                int halves, cudaStream_t stream) {
  return epf__ll_call_launch(L, EPF__LL_CALL_COMBINE_BACKWARD, args, halves, stream);
}

/* epf_ll_combine — launch the LL combine: send half (push, or pull: epf_ll_combine_pulls), reduce
 *   half, or both fused.
 *   Checks as epf_ll_dispatch, plus: combine_payload (EPF_ERR_NOT_SUPPORTED unless
 *   epf_ll_combine_payload_supported: BF16 or MXFP8); send needs recv_counts and y (unless IN_PLACE, which needs the BF16 dispatch
 *   payload: EPF_ERR_PAYLOAD) and a known y_layout; receive needs topk_idx (num_tokens > 0) and
 *   a 16-byte aligned out. A RANK_MAJOR plan runs the rank-major kernel (pre-reduce on the expert
 *   side): its send needs recv_counts and a 16-byte aligned y in the expert-major view's order,
 *   y_layout EPF_LL_Y_FIXED, EPF_LL_Y_PACKED or EPF_LL_Y_PACKED_PULL (the IN_PLACE layouts:
 *   EPF_ERR_INVALID_ARGUMENT); an EXPERT_MAJOR plan refuses EPF_LL_Y_PACKED_PULL the same way.
 *   Scope: host; stream-ordered; capturable. */
EPF_INLINE epf_status_t epf_ll_combine(const epf_ll_launch_t* L, const epf_ll_combine_args_t* args, int halves,
                                       cudaStream_t stream) {
  return epf__ll_call_launch(L, EPF__LL_CALL_COMBINE, args, halves, stream);
}

/* epf_ll_dispatch_backward — the backward of the LL dispatch (training): an LL combine round of
 *   the expert-input gradients dx (one BF16 row per receive row of the preceding dispatch round, in
 *   args->y_layout's order: FIXED, PACKED, IN_PLACE or IN_PLACE_PULL, push and pull as the forward
 *   combine) back to the tokens with UNIT weights, a repeated expert of a token contributing
 *   nothing: out = dx [num_tokens][hidden] BF16 (epf_ll_dispatch_backward_recv_block).
 *   args->topk_weights is not read. Router-weight gradient (optional): args->weight_grad (send:
 *   one FP32 per row, y's row order) and args->topk_weights_grad (receive: [num_tokens][top_k]
 *   FP32); both transports carry it (push: the source's other-parity landing row; pull: the row's
 *   metadata). RANK_MAJOR plan: y = dx in the view's order (FIXED, PACKED, PACKED_PULL), the expert
 *   side pre-reduces each (source, token) row with unit weights over its distinct view rows, the
 *   source sums the per-rank partials (epf_ll_rm_dispatch_backward_send_block / _recv_block);
 *   weight_grad is one FP32 per view row, carried per entry (push and pull).
 *   Checks: those of epf_ll_combine, plus epf_ll_backward_check (EPF_ERR_NOT_SUPPORTED unless the
 *   plan is BF16 both ways) and EPF_ERR_ALIGNMENT for gradient buffers not 4-byte aligned.
 *   Scope: host; stream-ordered; capturable. */
EPF_INLINE epf_status_t epf_ll_dispatch_backward(const epf_ll_launch_t* L, const epf_ll_combine_args_t* args,
                                                 int halves, cudaStream_t stream) {
  return epf__ll_call_launch(L, EPF__LL_CALL_DISPATCH_BACKWARD, args, halves, stream);
}

/* epf_ll_expand — RANK_MAJOR: launch epf_ll_rm_expand_block, the expand of the last dispatch round
 *   each rank of the launch received into the expert-major view (args->packed_x / packed_scales /
 *   packed_meta; args->recv_counts as the receive half wrote them). Use it when the receive half
 *   ran without packed outputs (e.g. the counts first, the view later); a receive half with packed
 *   outputs expands by itself. Checks: the launch, EPF_ERR_LAYOUT for an EXPERT_MAJOR plan (its
 *   receive rows are the view already), EPF_ERR_INVALID_ARGUMENT (args NULL, recv_counts NULL, no
 *   packed output), EPF_ERR_ALIGNMENT (packed_x, packed_meta not 16-byte aligned), EPF_ERR_TOKENS /
 *   EPF_ERR_CUDA as the other launchers. Needs no co-residency (no waits). Scope: host;
 *   stream-ordered, after the receive half and before the combine send of the round; capturable. */
EPF_INLINE epf_status_t epf_ll_expand(const epf_ll_launch_t* L, const epf_ll_dispatch_args_t* args, cudaStream_t stream) {
  int cap = 0, ranks, threads;
  int64_t rows, want, bpr;
  size_t smem;
  epf_status_t st = epf__ll_launch_check(L);
  if (st != EPF_OK) return st;
  if (L->plan.layout != EPF_LAYOUT_RANK_MAJOR) return EPF_ERR_LAYOUT;
  if (args == NULL || args->recv_counts == NULL ||
      (args->packed_x == NULL && args->packed_scales == NULL && args->packed_meta == NULL))
    return EPF_ERR_INVALID_ARGUMENT;
  if (!epf__ll_aligned16(args->packed_x) || !epf__ll_aligned16(args->packed_meta)) return EPF_ERR_ALIGNMENT;
  threads = epf__ll_threads(L);
  smem = epf_ll_smem_bytes(&L->plan, threads);
  st = epf__ll_capacity((const void*)epf_ll_expand_kernel, threads, smem, L->device, &cap);
  if (st != EPF_OK) return st;
  ranks = epf__ll_ranks_in_launch(L);
  /* one warp per (rank-major row, 512-byte chunk); at most T * min(K, R) rows per rank */
  rows = (int64_t)L->plan.max_tokens_per_rank * (L->plan.top_k < L->plan.nranks ? L->plan.top_k : L->plan.nranks);
  want = (rows * (int64_t)((L->plan.row_bytes + 511u) / 512u) + threads / 32 - 1) / (threads / 32);
  bpr = L->blocks_per_rank > 0 ? L->blocks_per_rank : cap / ranks;
  if (L->blocks_per_rank <= 0 && bpr > want) bpr = want;
  if (bpr < 1) bpr = 1;
  epf_ll_expand_kernel<<<(unsigned)(bpr * ranks), threads, smem, stream>>>(L->plan, L->team, L->state, L->record,
                                                                             L->abort_word, L->virtual_ranks, (int)bpr,
                                                                             *args);
  return epf__cuda_status(cudaGetLastError());
}

EPF_INLINE epf_status_t epf__ll_state_op(const epf_ll_launch_t* L, int op, const uint32_t* host_mask,
                                         uint32_t* out_masks, cudaStream_t stream) {
  epf_ll_mask_words_t m;
  int count, i;
  const epf_status_t st = epf__ll_launch_check(L); /* checks L != NULL before any use of it */
  if (st != EPF_OK) return st;
  count = epf__ll_ranks_in_launch(L);
  for (i = 0; i < EPF_MASK_WORDS; ++i) m.w[i] = host_mask != NULL ? host_mask[i] : 0u;
  epf_ll_state_kernel<<<(count + 127) / 128, 128, 0, stream>>>(L->state, count, L->plan.nranks, op, m, out_masks);
  return epf__cuda_status(cudaGetLastError());
}

/* epf_ll_state_reset — stream-ordered epf_ll_state_init of every state of the launch (epochs 0,
 *   everyone active). Only between rounds, and only together with a zeroed window (the signal
 *   words must not hold epochs ahead of 0), or right after epf_ll_mask_clean on all ranks.
 *   Checks (as every LL launcher, so a launch that would touch states it does not own is refused
 *   before anything runs): L and L->state (EPF_ERR_INVALID_ARGUMENT), an LL plan (EPF_ERR_MODE for
 *   an HT plan), team size == plan.nranks (EPF_ERR_RANKS), a real rank in [0, R) (EPF_ERR_RANK),
 *   team memory, threads and blocks_per_rank (EPF_ERR_INVALID_ARGUMENT); EPF_ERR_CUDA. The same
 *   checks guard epf_ll_mask_query_async and epf_ll_mask_update. Scope: host; stream-ordered. */
EPF_INLINE epf_status_t epf_ll_state_reset(const epf_ll_launch_t* L, cudaStream_t stream) {
  return epf__ll_state_op(L, EPF__LL_STATE_RESET, NULL, NULL, stream);
}

/* epf_ll_mask_query_async — copy each rank's active mask into out_masks (device or host-mapped
 *   memory, [ranks of the launch][EPF_MASK_WORDS] uint32). Stream-ordered, no allocation, no sync:
 *   capturable. */
EPF_INLINE epf_status_t epf_ll_mask_query_async(const epf_ll_launch_t* L, uint32_t* out_masks, cudaStream_t stream) {
  if (L == NULL || out_masks == NULL) return EPF_ERR_INVALID_ARGUMENT;
  return epf__ll_state_op(L, EPF__LL_STATE_QUERY, NULL, out_masks, stream);
}

/* epf_ll_mask_update — set the active mask of every rank of the launch to host_mask
 *   (EPF_MASK_WORDS words of host memory, read at the call: they travel as a kernel argument).
 *   Stream-ordered between LL calls. Masking a rank that is alive only makes both sides skip each
 *   other (see docs/low-latency.md); re-admission of a masked rank needs epf_ll_mask_clean. */
EPF_INLINE epf_status_t epf_ll_mask_update(const epf_ll_launch_t* L, const uint32_t* host_mask, cudaStream_t stream) {
  if (L == NULL || host_mask == NULL) return EPF_ERR_INVALID_ARGUMENT;
  return epf__ll_state_op(L, EPF__LL_STATE_UPDATE, host_mask, NULL, stream);
}

/* epf_ll_mask_clean — launch epf_ll_mask_clean_block, one block per rank of the launch (virtual:
 *   all R, co-resident). Collective: every rank that should (re)join calls it. Stream-ordered. */
EPF_INLINE epf_status_t epf_ll_mask_clean(const epf_ll_launch_t* L, cudaStream_t stream) {
  size_t smem;
  int cap = 0;
  epf_status_t st = epf__ll_launch_check(L); /* checks L != NULL before any use of it */
  if (st != EPF_OK) return st;
  smem = epf_ll_smem_bytes(&L->plan, EPF_LL_CLEAN_THREADS);
  st = epf__ll_capacity((const void*)epf_ll_clean_kernel, EPF_LL_CLEAN_THREADS, smem, L->device, &cap);
  if (st != EPF_OK) return st;
  if (epf__ll_ranks_in_launch(L) > cap) return EPF_ERR_CO_RESIDENCY;
  epf_ll_clean_kernel<<<epf__ll_ranks_in_launch(L), EPF_LL_CLEAN_THREADS, smem, stream>>>(
      L->plan, L->team, L->state, L->record, L->abort_word, L->virtual_ranks);
  return epf__cuda_status(cudaGetLastError());
}

/* epf_ll_error_clear_async — zero the error record (device pointer of the host-mapped record),
 *   stream-ordered: unlike epf_error_clear it needs no sync with kernels before it. */
EPF_INLINE epf_status_t epf_ll_error_clear_async(epf_error_record_t* record, cudaStream_t stream) {
  if (record == NULL) return EPF_ERR_INVALID_ARGUMENT;
  epf_ll_error_clear_kernel<<<1, 32, 0, stream>>>(record);
  return epf__cuda_status(cudaGetLastError());
}

#endif /* !__CUDACC_RTC__ */
EPF_END_DECLS

#endif /* EPF_LL_KERNELS_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
