/* epfuse/ht/impl/types.cuh — the HT view of a step and the halves of a call — part of epfuse v0.1
 *
 * What it is: epf_ht_view_t (one rank's route arrays and routing inputs, which the per-token blocks
 * read) and EPF_HT_SEND / EPF_HT_RECV / EPF_HT_BOTH (the halves a ready-made call runs). Include
 * epfuse/ht/ht.cuh, not this file (it stands alone too, for the compile tests).
 *
 * Contents: see ht/ht.cuh.
 *
 * Requirements: see ht/ht.cuh.
 */
#ifndef EPF_HT_IMPL_TYPES_CUH
#define EPF_HT_IMPL_TYPES_CUH

#include "../../config.h"

#if !EPF_IS_CUDA
#error "epfuse/ht/impl/types.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

#include "../../host.h"
#include "../../core/team.cuh"

EPF_BEGIN_DECLS

#define EPF_HT_SEND 0x1 /* the send half of a stage */
#define EPF_HT_RECV 0x2 /* the receive half: wait for every peer */
#define EPF_HT_BOTH 0x3 /* both halves in one call */

/* One rank's view of a step: its team, the route arrays of its route buffer and its routing
 * inputs. Build it with epf_ht_view; read-only. */
typedef struct epf_ht_view {
  epf_team_t team;
  int index;        /* route buffer / packed-input index: the virtual rank, or 0 for a real rank */
  int T, K, R, E, EL; /* tokens this step (route header), top_k, ranks, experts, experts per rank */
  int index_type;   /* EPF_INDEX_INT32 / EPF_INDEX_INT64 of topk */
  uint32_t epoch;   /* the route's epoch: the epoch of every signal of this step */
  const int32_t* dst_rank;        /* [T][K] */
  const int32_t* slot;            /* [T][K] */
  const int32_t* rm_slot;         /* [T][R] */
  const int32_t* send_offset;     /* [E] */
  const int32_t* send_rm_offset;  /* [R] */
  const epf_route_segment_t* seg; /* [EL] */
  const epf_route_segment_t* send_seg; /* [E]: each expert's segment at its destination */
  const int32_t* src_offset;      /* [EL][R + 1] */
  const int32_t* rm_offset;       /* [R + 1] */
  const void* topk;               /* this rank's topk_idx [T][K] */
  const float* topk_weights;      /* this rank's topk_weights [T][K], or NULL */
} epf_ht_view_t;

EPF_END_DECLS

#endif /* EPF_HT_IMPL_TYPES_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
