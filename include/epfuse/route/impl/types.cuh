/* epfuse/route/impl/types.cuh — the route update context type and the passes' constants — part of epfuse v0.1
 *
 * What it is: epf_route_ctx_t, one rank-block's view of a route update, and the private constants
 * of the passes that size it and their shared memory (batches of entries, count-word rows, misc
 * slots, the shared-memory limit, the SPLIT arrangement's bound). Include epfuse/route/route.cuh,
 * not this file (it stands alone too, for the compile tests).
 *
 * Contents: see route/route.cuh.
 *
 * Requirements: see route/route.cuh.
 */
#ifndef EPF_ROUTE_IMPL_TYPES_CUH
#define EPF_ROUTE_IMPL_TYPES_CUH

#include "../../config.h"

#if !EPF_IS_CUDA
#error "epfuse/route/impl/types.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

#include "../../host.h"

EPF_BEGIN_DECLS

/* misc shared-memory slots (int32) */
#define EPF__ROUTE_MISC_SINK 0 /* [32]: per-lane target of the count pass's branch-free atomics */
#define EPF__ROUTE_MISC_DROPPED 40
#define EPF__ROUTE_MISC_ROWS_EM 41 /* offsets: rows of this rank's expert-major segment */
#define EPF__ROUTE_MISC_ROWS_RM 42 /* offsets: rows of this rank's rank-major region */
#define EPF__ROUTE_MISC_INTS 64
#define EPF__ROUTE_CUB_BYTES_PER_WARP 16
/* A warp walks its tokens in BATCHES of whole tokens, at most EPF__ROUTE_BATCH (token, k) entries
 * (EPF__ROUTE_STEPS 32-entry steps, loads in flight per lane); rows of counts per batch of loads
 * (latency hiding; results do not depend on these). */
#define EPF__ROUTE_STEPS 5
#define EPF__ROUTE_BATCH (32 * EPF__ROUTE_STEPS)
#define EPF__ROUTE_ROWS 16 /* count words (blocks or sources) loaded per batch: <= 16 is one round trip */
#define EPF__ROUTE_KEEP 8  /* per-source counts the offsets keep in registers (more ranks: loaded again) */
#define EPF__ROUTE_QUICK_SPINS 64 /* batch reloads before a late count word goes to the bounded wait */
/* Shared memory a block gets without the opt-in attribute: the slot pass's tag rows are kept
 * within it (epf__route_smem_carve), and so is the ready-made kernel's block (route/kernels.cuh). */
#define EPF__ROUTE_SMEM_LIMIT (48u * 1024u)
/* The SPLIT arrangement of an update (epf_route_update_split_block; epf_route_split_ok says when):
 * with 2 or 3 blocks per rank and at most this many (token, k) entries, every block walks all the
 * tokens itself and none waits for another's counts. A ctx from epf_route_ctx_make is never
 * SPLIT. */
#define EPF__ROUTE_SPLIT_ENTRIES 2304

/* One rank-block's view of an update: this rank's arrays, the shapes, this update's epoch and the
 * caller's shared memory carved up. Built by epf_route_ctx_make; passed by pointer to the phases.
 * Uniform over the block except the warp's token range and the lane's cached ids. */
typedef struct epf_route_ctx {
  /* this rank's route buffer and its layout (route->layout: with epf_route_update's kernel, the
   * kernel's by-value parameter, so the array offsets are constant-bank operands). The arrays'
   * addresses are formed where a phase uses them (EPF__ROUTE_ARR), not held in the ctx */
  char* buf;
  const epf_route_layout_t* layout;
  uint32_t* epoch_word;       /* the route's epoch word for this rank */
  const void* topk_idx;       /* [num_tokens][K] */
  int64_t* recv_total_mapped; /* host-mapped int64 or NULL */
  int32_t num_tokens, top_k, num_experts, nranks, experts_per_rank, index64;
  int32_t rank_major, exchange, alignment, mark_pads;
  int32_t rank;               /* team rank this block plays */
  int32_t block_index, num_blocks, num_warps;
  int32_t split;              /* 0 from epf_route_ctx_make; 1 only in the SPLIT arrangement
                                 (epf_route_update_split_block) */
  int32_t offsets_block;      /* the block that computes the offsets: 0 (2 in a 3-block SPLIT
                                 arrangement) */
  int32_t batch_tokens;       /* whole tokens per warp batch: EPF__ROUTE_BATCH / K */
  uint32_t el_inv;            /* destination rank of expert e = __umulhi(e, el_inv) (0: EL == 1) */
  int32_t ebits, rbits;       /* bits of E - 1 and of R - 1: ballots per equality mask (epf__route_match) */
  int32_t shfl_first;         /* K a power of two <= 32 and R <= 32: first entries by warp ballots */
  int32_t t0, t1;             /* this warp's tokens [t0, t1) */
  uint32_t epoch;             /* this update's epoch: the route's epoch word + 1 */
  int32_t status;             /* set by the phases: EPF_OK or the first failure */
  int64_t recv_capacity;
  int32_t* hist;              /* smem [W][E + R]: per-warp counts, then running slots */
  int32_t* tot;               /* smem [E + R + 1]: this rank's totals (+ dropped) */
  int32_t* misc;              /* smem [EPF__ROUTE_MISC_INTS] */
  int32_t* stage;             /* smem [num_warps][EPF__ROUTE_BATCH]: a batch's destination ranks */
  void* cub_temp;             /* smem [32][EPF__ROUTE_CUB_BYTES_PER_WARP] */
  int32_t* tags;              /* smem [num_warps][E]: the slot pass's expert tags, or NULL (ballots) */
  int32_t ids_cached;         /* 1: this warp's tokens are one batch and ids[] / first hold this
                                 lane's entries (set by epf_route_count_block, read by _slots_block) */
  uint32_t first;             /* bit u: the lane's entry of step u is its token's first to its rank */
  int32_t ids[EPF__ROUTE_STEPS];
} epf_route_ctx_t;

EPF_END_DECLS

#endif /* EPF_ROUTE_IMPL_TYPES_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
