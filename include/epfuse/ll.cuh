/* epfuse/ll.cuh — low-latency (LL) mode: fixed layout, per-rank state, epochs, active mask, mask clean — part of epfuse v0.1
 *
 * What it is: the common ground of the low-latency dispatch (dispatch_ll.cuh) and combine
 * (combine_ll.cuh) blocks, for decode-time EP (a few hundred tokens per rank, every call inside a
 * CUDA graph):
 *   - The FIXED LAYOUT of an LL window (plan.mode == EPF_MODE_LL, EXPERT_MAJOR): receive rows
 *     RECV_TOKENS[2 parity][E_local][R source][T max], so a sender knows every slot without a
 *     count exchange; one signal word per (parity, local expert, source) in SIG_LL_DISPATCH that
 *     carries (epoch << 32 | rows); combine landing rows COMBINE[2 parity][T][K] at the source and
 *     one signal word per (parity, peer) in SIG_LL_COMBINE. Accessors: epf_ll_*_row / _index.
 *   - epf_ll_state_t: a small per-rank struct in DEVICE memory that the kernels advance
 *     themselves: the epoch of the last completed round of each half (dispatch send / receive,
 *     combine send / receive), the per-half block arrival counters and the ACTIVE MASK. Nothing in
 *     it needs host work between rounds, so CUDA-graph replays just work.
 *   - Epochs and parity: round e of a half uses epoch e = state.epoch[half] + 1 and the buffers of
 *     parity e & 1. A rank may be one round ahead of a peer (its send of e + 1 goes to the other
 *     parity) but never two: every receive waits for every active peer, so round e + 2 cannot
 *     start anywhere before every rank finished reading round e.
 *   - Active-mask fault tolerance (opt-in, EPF_FLAG_FAULT_TOLERANT): a peer that misses a bounded
 *     wait (plan.timeout_ns) is removed from the waiter's mask (signal.cuh), the host-mapped error
 *     record gets the diagnostic, and the call completes. A masked peer is treated as absent in
 *     both directions: nothing is sent to it, nothing is awaited from it. Mask query / set
 *     (device, graph-capturable), and epf_ll_mask_clean_block: the collective that re-admits
 *     ranks and re-synchronises epochs (every participant adopts the largest epoch any of them
 *     used; stale signal words can then never satisfy a later wait).
 *   - Host-side checks of an LL plan and a call (epf_ll_plan_check, epf_ll_tokens_check) and the
 *     scratch sizes of the blocks.
 *
 * What it does NOT do: allocate, launch (kernels_ll.cuh does), move rows (dispatch_ll.cuh,
 * combine_ll.cuh), include nccl_device.h, trap or print. RANK_MAJOR LL is not implemented
 * (epf_ll_plan_check refuses it with EPF_ERR_LAYOUT).
 *
 * Usage (one rank's view, inside a kernel; kernels_ll.cuh composes the same calls):
 *   epf_ll_ctx_t ctx = epf_ll_ctx_make(team, state, err_record, NULL, block_in_rank, blocks_per_rank);
 *   epf_ll_dispatch_send_block(&plan, ctx, &args, smem);      // dispatch_ll.cuh
 *   ... other work ...
 *   epf_ll_dispatch_recv_block(&plan, ctx, &args, smem);      // a later launch, or co-resident
 *   // host, once per rank before the first round:
 *   epf_ll_state_t s0; epf_ll_state_init(&s0, plan.nranks); cudaMemcpy(d_state, &s0, sizeof s0, ...);
 *
 * COMPILE-TIME OPTIONS: none of its own (EPF_MAX_RANKS sizes the mask; see config.h).
 *
 * Contents:
 *   EPF_LL_SEND, EPF_LL_RECV, EPF_LL_BOTH                 halves of a ready-made call
 *   epf_ll_phase_t, epf_ll_y_layout_t, epf_ll_state_t, EPF_LL_STATE_MAGIC, epf_ll_ctx_t
 *   epf_ll_dispatch_args_t, epf_ll_combine_args_t           per-call operands
 *   void     epf_ll_state_init(epf_ll_state_t* out, int nranks)                         [EPF_HD]
 *   epf_status_t epf_ll_plan_check(const epf_plan_t* plan)                              [EPF_HD]
 *   epf_status_t epf_ll_tokens_check(const epf_plan_t* plan, int num_tokens)            [EPF_HD]
 *   int64_t  epf_ll_recv_row(plan, uint32_t epoch, int local_expert, int src, int slot) [EPF_HD]
 *   int64_t  epf_ll_packed_row(plan, int local_expert, int pos_in_expert)               [EPF_HD]
 *   int64_t  epf_ll_combine_row(plan, uint32_t epoch, int token, int k)                 [EPF_HD]
 *   int64_t  epf_ll_dispatch_signal_index(plan, uint32_t epoch, int local_expert, int src) [EPF_HD]
 *   int64_t  epf_ll_combine_signal_index(plan, uint32_t epoch, int peer)                [EPF_HD]
 *   uint64_t epf_ll_rank_bytes(plan, epf_ll_buffer_t which, int index_type)            [EPF_HD]
 *   bool     epf_ll_index_type_ok(int index_type), int epf_ll_index_is64(int index_type) [EPF_HD]
 *   epf_ll_buffer_t                                        per-rank operand buffers (sizes, strides)
 *   epf_ll_dispatch_args_t epf_ll_dispatch_args_for_rank(const epf_ll_dispatch_args_t*, plan, int rank) [EPF_HD]
 *   epf_ll_combine_args_t  epf_ll_combine_args_for_rank(const epf_ll_combine_args_t*, plan, int rank)   [EPF_HD]
 *   size_t   epf_ll_dispatch_smem_bytes / epf_ll_combine_smem_bytes / epf_ll_smem_bytes(plan, threads)  [EPF_HD]
 *   epf_ll_ctx_t epf_ll_ctx_make(team, state, record, abort_word, block, nblocks)        [EPF_HD]
 *   epf_wait_t epf_ll_wait(const epf_plan_t*, epf_ll_ctx_t)                              [device]
 *   uint32_t epf_ll_epoch_next(const epf_ll_state_t*, epf_ll_phase_t)                    [device]
 *   bool     epf_ll_phase_end_block(epf_ll_ctx_t, epf_ll_phase_t)    true in the rank's last block [collective:block]
 *   void     epf_ll_phase_commit_block(epf_ll_ctx_t, epf_ll_phase_t, uint32_t epoch)          [collective:block]
 *   void     epf_ll_mask_query(const epf_ll_state_t*, uint32_t* out_mask)               [device]
 *   void     epf_ll_mask_set(epf_ll_state_t*, const uint32_t* mask)                     [device]
 *   epf_status_t epf_ll_mask_clean_block(const epf_plan_t*, epf_ll_ctx_t, void* smem)   [collective:block]
 *
 * Requirements: CUDA, sm_70+ (sm_90 / sm_100 compiled (-Werror); tested on an H200), CUB from the toolkit (cub::WarpScan).
 */
#ifndef EPF_LL_CUH
#define EPF_LL_CUH

#include <cub/warp/warp_scan.cuh>

#include "config.h"
#include "dispatch.cuh"
#include "host.h"
#include "ptx.cuh"
#include "quant.cuh"
#include "signal.cuh"
#include "team.cuh"

EPF_BEGIN_DECLS

/* ============================================================================================ */
/* Types                                                                                         */
/* ============================================================================================ */

/* halves of a ready-made call (kernels_ll.cuh): send only, receive only, or both fused */
#define EPF_LL_SEND 1
#define EPF_LL_RECV 2
#define EPF_LL_BOTH 3

#define EPF_LL_STATE_MAGIC 0x4c4c5045u /* "EPLL" */

/* The four halves of an LL layer; each keeps its own epoch and arrival counter. */
typedef enum epf_ll_phase {
  EPF_LL_PHASE_DISPATCH_SEND = 0,
  EPF_LL_PHASE_DISPATCH_RECV = 1,
  EPF_LL_PHASE_COMBINE_SEND = 2,
  EPF_LL_PHASE_COMBINE_RECV = 3,
  EPF_LL_PHASE_COUNT = 4
} epf_ll_phase_t;

/* Where the combine finds the expert outputs (BF16 rows of `hidden`):
 *   FIXED    caller buffer in the fixed receive order: row (le * R + src) * T + slot
 *   PACKED   caller buffer in the packed order of epf_ll_dispatch_args_t.packed_x:
 *            row le * (R * T) + (rows of sources < src for le) + slot
 *   IN_PLACE the receive rows of the window themselves (the experts overwrote their inputs);
 *            BF16 dispatch payload only. The expert side pushes them to the sources.
 *   IN_PLACE_PULL  as IN_PLACE, but nothing is pushed: the expert side only signals, and each
 *            source reads its outputs straight from this rank's receive rows (PULL, like the HT
 *            default): every output row crosses memory once instead of three times (read + push
 *            + read back). Same results, bit for bit. BF16 combine payload only (with an MXFP8
 *            combine payload it behaves as IN_PLACE). Extra rule: this rank must leave the
 *            round's receive rows untouched until its next dispatch receive returns (by then
 *            every source has finished reading them). The mode travels in the combine signal
 *            word, so ranks may mix IN_PLACE_PULL with the other layouts in one round. */
typedef enum epf_ll_y_layout {
  EPF_LL_Y_FIXED = 0,
  EPF_LL_Y_PACKED = 1,
  EPF_LL_Y_IN_PLACE = 2,
  EPF_LL_Y_IN_PLACE_PULL = 3
} epf_ll_y_layout_t;

/* Per-rank LL state, in device memory (one per rank; an array of R for virtual ranks). Initialise
 * with epf_ll_state_init (host copy + cudaMemcpy) or kernels_ll.cuh's epf_ll_state_reset. The
 * kernels advance it; the host never has to touch it again (graph replays). */
typedef struct epf_ll_state {
  uint32_t epoch[EPF_LL_PHASE_COUNT];  /* epoch of the last completed round of each half */
  uint32_t arrive[EPF_LL_PHASE_COUNT]; /* blocks of the running half that finished (the last one resets it) */
  uint32_t mask[EPF_MASK_WORDS];       /* active mask: bit r set = rank r takes part */
  uint32_t clean_gen;                  /* number of epf_ll_mask_clean_block rounds taken part in */
  uint32_t magic;                      /* EPF_LL_STATE_MAGIC */
  int32_t nranks;                      /* team size it was initialised for */
  uint32_t reserved;
  uint32_t dispatch_fail[EPF_MAX_RANKS]; /* epoch of the last dispatch round whose receive missed
                                            source s (timeout, mask, abort): the combine of that
                                            round neither pushes to s nor signals it, so s never
                                            reads landing rows this rank did not write */
} epf_ll_state_t;

/* The context of one block's LL call, passed by value: which rank it plays and how the rank's
 * blocks share the work. block in [0, nblocks); every block of a rank that runs a half passes the
 * same nblocks (the completion of the half is "all nblocks blocks arrived"). */
typedef struct epf_ll_ctx {
  epf_team_t team;               /* team.rank = the rank this block plays */
  epf_ll_state_t* state;         /* that rank's state */
  epf_error_record_t* record;    /* host-mapped error record (device pointer), or NULL */
  const uint32_t* abort_word;    /* nonzero aborts every wait, or NULL */
  int32_t block;                 /* this block's index among the rank's blocks */
  int32_t nblocks;               /* blocks of the rank running this half */
} epf_ll_ctx_t;

/* Dispatch operands (one rank's; for virtual ranks every pointer is the base of R consecutive
 * per-rank buffers of epf_ll_rank_bytes each, see epf_ll_dispatch_args_for_rank). T below is
 * plan.max_tokens_per_rank, EL = plan.experts_per_rank, R = plan.nranks. */
typedef struct epf_ll_dispatch_args {
  const void* x;                   /* send: [T][hidden] BF16 rows, 16-byte aligned */
  const void* topk_idx;            /* send: [T][top_k] of index_type; -1 = none */
  const float* topk_weights;       /* send: [T][top_k] or NULL (1.0f) -> metadata weight */
  int32_t num_tokens;              /* send: tokens of this call, 0..T (rows >= num_tokens ignored) */
  int32_t index_type;              /* send: epf_index_type_t of topk_idx; 0 (DEFAULT) -> INT64, as
                                      the route (epf_route_config_t.index_type) */
  int32_t* recv_counts;            /* recv out: [EL][R] rows received per (local expert, source) */
  int32_t* expert_counts;          /* recv out: [EL] rows per local expert (masked_m), or NULL */
  void* packed_x;                  /* recv out: [EL][R * T] rows of plan.row_bytes, or NULL */
  void* packed_scales;             /* recv out: scales of packed_x, plan.scale_layout, or NULL */
  epf_recv_meta_em_t* packed_meta; /* recv out: [EL * R * T] metadata rows, or NULL */
  uint32_t* round;                 /* recv out: epoch of the round received (its parity = & 1), or NULL */
} epf_ll_dispatch_args_t;

/* Combine operands (one rank's; virtual ranks as above). */
typedef struct epf_ll_combine_args {
  const void* y;               /* send: expert outputs, BF16 rows of hidden, in y_layout (unused for IN_PLACE) */
  const int32_t* recv_counts;  /* send: [EL][R] the dispatch receive of this round wrote */
  const void* topk_idx;        /* recv: the [T][top_k] routing this rank dispatched with */
  const float* topk_weights;   /* recv: [T][top_k] weights, or NULL (1.0f) */
  void* out;                   /* recv out: [T][hidden] BF16 */
  int32_t num_tokens;          /* recv: tokens of this call (the dispatch's) */
  int32_t index_type;          /* recv: epf_index_type_t of topk_idx; 0 (DEFAULT) -> INT64 */
  int32_t y_layout;            /* send: epf_ll_y_layout_t; recv: only a hint (IN_PLACE_PULL: build
                                  the slot table before waiting; what each peer did travels in
                                  its signal word) */
  int32_t reserved;
} epf_ll_combine_args_t;

/* Per-rank buffers, for sizing and for virtual-rank strides (epf_ll_rank_bytes). */
typedef enum epf_ll_buffer {
  EPF_LL_BUF_X = 0,          /* [T][hidden] BF16 (dispatch x, combine out) */
  EPF_LL_BUF_TOPK_IDX,       /* [T][top_k] int32 / int64 */
  EPF_LL_BUF_TOPK_WEIGHTS,   /* [T][top_k] float */
  EPF_LL_BUF_RECV_COUNTS,    /* [EL][R] int32 */
  EPF_LL_BUF_EXPERT_COUNTS,  /* [EL] int32 */
  EPF_LL_BUF_PACKED_X,       /* [EL * R * T] rows of row_bytes */
  EPF_LL_BUF_PACKED_SCALES,  /* [EL * R * T][scale_bytes_per_row] compact, or swizzled 128x4 (MXFP8) */
  EPF_LL_BUF_PACKED_META,    /* [EL * R * T] epf_recv_meta_em_t */
  EPF_LL_BUF_ROUND,          /* one uint32 */
  EPF_LL_BUF_Y               /* [EL * R * T] BF16 rows of hidden (FIXED or PACKED y) */
} epf_ll_buffer_t;

/* ============================================================================================ */
/* Host-and-device helpers: state, checks, layout                                                */
/* ============================================================================================ */

/* epf_ll_state_init — a fresh state: epochs 0, counters 0, every rank of [0, nranks) active.
 *   Scope: any single thread, host or device. Copy the result into the device state before the
 *   first LL call (or use epf_ll_state_reset from kernels_ll.cuh, stream-ordered). */
EPF_HD void epf_ll_state_init(epf_ll_state_t* out, int nranks) {
  int i;
  for (i = 0; i < EPF_LL_PHASE_COUNT; ++i) {
    out->epoch[i] = 0u;
    out->arrive[i] = 0u;
  }
  epf_mask_init_all(out->mask, nranks);
  out->clean_gen = 0u;
  out->magic = EPF_LL_STATE_MAGIC;
  out->nranks = nranks;
  out->reserved = 0u;
  for (i = 0; i < EPF_MAX_RANKS; ++i) out->dispatch_fail[i] = 0u;
}

/* epf_ll_plan_check — may this plan run the LL blocks? EPF_OK, or the reason:
 *   prefix (EPF_ERR_STRUCT_VERSION), mode not LL (EPF_ERR_MODE), RANK_MAJOR (EPF_ERR_LAYOUT: LL
 *   rank-major is not implemented), a plan whose LL regions are missing (EPF_ERR_INVALID_ARGUMENT).
 *   Hidden-size rules (per-128 FP8 with hidden 2880 -> EPF_ERR_HIDDEN_ALIGNMENT) are refused
 *   earlier, by epf_plan_compute. Scope: any thread, host or device. Pure. */
EPF_HD epf_status_t epf_ll_plan_check(const epf_plan_t* plan) {
  epf_status_t st = epf_plan_check(plan);
  if (st != EPF_OK) return st;
  if (plan->mode != EPF_MODE_LL) return EPF_ERR_MODE;
  if (plan->layout != EPF_LAYOUT_EXPERT_MAJOR) return EPF_ERR_LAYOUT;
  if (plan->region[EPF_REGION_SIG_LL_DISPATCH].bytes == 0 || plan->region[EPF_REGION_SIG_LL_COMBINE].bytes == 0 ||
      plan->region[EPF_REGION_COMBINE].bytes == 0 || plan->recv_capacity <= 0)
    return EPF_ERR_INVALID_ARGUMENT;
  return EPF_OK;
}

/* epf_ll_tokens_check — num_tokens in [0, plan.max_tokens_per_rank], else EPF_ERR_TOKENS. */
EPF_HD epf_status_t epf_ll_tokens_check(const epf_plan_t* plan, int num_tokens) {
  if (num_tokens < 0 || num_tokens > plan->max_tokens_per_rank) return EPF_ERR_TOKENS;
  return EPF_OK;
}

/* epf_ll_recv_row — row of RECV_TOKENS / RECV_SCALES / RECV_META (pass it to
 *   epf_plan_recv_token_offset & co.) that holds slot `slot` of (local_expert, src) in the round
 *   of `epoch`: (epoch & 1) * recv_capacity + (local_expert * R + src) * T + slot. */
EPF_HD int64_t epf_ll_recv_row(const epf_plan_t* plan, uint32_t epoch, int local_expert, int src, int slot) {
  return (int64_t)(epoch & 1u) * plan->recv_capacity +
         ((int64_t)local_expert * plan->nranks + src) * plan->max_tokens_per_rank + slot;
}

/* epf_ll_packed_row — row of the packed per-expert output: local_expert * (R * T) + pos, where pos
 *   counts the expert's rows from sources < src first (source order, then slot = token order). */
EPF_HD int64_t epf_ll_packed_row(const epf_plan_t* plan, int local_expert, int pos_in_expert) {
  return (int64_t)local_expert * plan->nranks * plan->max_tokens_per_rank + pos_in_expert;
}

/* epf_ll_combine_row — row of the source's COMBINE region (epf_plan_combine_offset) where the
 *   output for (token, k) of the round of `epoch` lands: ((epoch & 1) * T + token) * K + k. */
EPF_HD int64_t epf_ll_combine_row(const epf_plan_t* plan, uint32_t epoch, int token, int k) {
  return ((int64_t)(epoch & 1u) * plan->max_tokens_per_rank + token) * plan->top_k + k;
}

/* epf_ll_dispatch_signal_index — word of SIG_LL_DISPATCH (epf_plan_signal_offset) in which `src`
 *   publishes (epoch, rows) for `local_expert` of the window's owner: ((epoch & 1) * EL + le) * R + src. */
EPF_HD int64_t epf_ll_dispatch_signal_index(const epf_plan_t* plan, uint32_t epoch, int local_expert, int src) {
  return ((int64_t)(epoch & 1u) * plan->experts_per_rank + local_expert) * plan->nranks + src;
}

/* epf_ll_combine_signal_index — word of SIG_LL_COMBINE in which `peer` publishes the combine
 *   round of `epoch` to the window's owner: (epoch & 1) * R + peer. */
EPF_HD int64_t epf_ll_combine_signal_index(const epf_plan_t* plan, uint32_t epoch, int peer) {
  return (int64_t)(epoch & 1u) * plan->nranks + peer;
}

/* epf_ll_rank_bytes — bytes of one rank's buffer `which` (see epf_ll_buffer_t), sized for
 *   plan.max_tokens_per_rank; the per-rank stride of virtual-rank operand arrays. index_type:
 *   the ids' epf_index_type_t (only EPF_LL_BUF_TOPK_IDX depends on it). */
/* epf_ll_index_type_ok — index_type is DEFAULT (0, means INT64), INT32 or INT64. The launchers
 *   refuse anything else with EPF_ERR_INVALID_ARGUMENT. epf_ll_index_is64 — its storage is int64. */
EPF_HD bool epf_ll_index_type_ok(int index_type) {
  return index_type == EPF_INDEX_DEFAULT || index_type == EPF_INDEX_INT32 || index_type == EPF_INDEX_INT64;
}
EPF_HD int epf_ll_index_is64(int index_type) { return index_type != EPF_INDEX_INT32; }

EPF_HD uint64_t epf_ll_rank_bytes(const epf_plan_t* plan, epf_ll_buffer_t which, int index_type) {
  const uint64_t T = (uint64_t)plan->max_tokens_per_rank, K = (uint64_t)plan->top_k;
  const uint64_t H = (uint64_t)plan->hidden, rows = (uint64_t)plan->recv_capacity;
  switch (which) {
    case EPF_LL_BUF_X: return T * H * 2u;
    case EPF_LL_BUF_TOPK_IDX: return T * K * (epf_ll_index_is64(index_type) ? 8u : 4u);
    case EPF_LL_BUF_TOPK_WEIGHTS: return T * K * 4u;
    case EPF_LL_BUF_RECV_COUNTS: return (uint64_t)plan->experts_per_rank * (uint64_t)plan->nranks * 4u;
    case EPF_LL_BUF_EXPERT_COUNTS: return (uint64_t)plan->experts_per_rank * 4u;
    case EPF_LL_BUF_PACKED_X: return rows * plan->row_bytes;
    case EPF_LL_BUF_PACKED_SCALES:
      if (plan->scale_layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4 && plan->payload == EPF_PAYLOAD_MXFP8)
        return (uint64_t)epf_scale_swizzle_bytes((int64_t)rows, (int)plan->scale_bytes_per_row);
      return rows * plan->scale_bytes_per_row;
    case EPF_LL_BUF_PACKED_META: return rows * (uint64_t)sizeof(epf_recv_meta_em_t);
    case EPF_LL_BUF_ROUND: return 4u;
    case EPF_LL_BUF_Y: return rows * H * 2u;
    default: return 0u;
  }
}

EPF_HD const void* epf__ll_cadv(const void* p, uint64_t bytes) {
  return p == NULL ? NULL : (const void*)((const char*)p + bytes);
}
EPF_HD void* epf__ll_adv(void* p, uint64_t bytes) { return p == NULL ? NULL : (void*)((char*)p + bytes); }

/* epf_ll_dispatch_args_for_rank — virtual ranks: the operands of `rank` when every pointer of `a`
 *   is the base of R consecutive per-rank buffers (stride epf_ll_rank_bytes). NULL stays NULL. */
EPF_HD epf_ll_dispatch_args_t epf_ll_dispatch_args_for_rank(const epf_ll_dispatch_args_t* a, const epf_plan_t* plan,
                                                            int rank) {
  epf_ll_dispatch_args_t r = *a;
  const uint64_t k = (uint64_t)rank;
  r.x = epf__ll_cadv(a->x, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_X, 0));
  r.topk_idx = epf__ll_cadv(a->topk_idx, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_TOPK_IDX, a->index_type));
  r.topk_weights =
      (const float*)epf__ll_cadv(a->topk_weights, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_TOPK_WEIGHTS, 0));
  r.recv_counts = (int32_t*)epf__ll_adv(a->recv_counts, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_RECV_COUNTS, 0));
  r.expert_counts = (int32_t*)epf__ll_adv(a->expert_counts, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_EXPERT_COUNTS, 0));
  r.packed_x = epf__ll_adv(a->packed_x, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_PACKED_X, 0));
  r.packed_scales = epf__ll_adv(a->packed_scales, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_PACKED_SCALES, 0));
  r.packed_meta =
      (epf_recv_meta_em_t*)epf__ll_adv(a->packed_meta, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_PACKED_META, 0));
  r.round = (uint32_t*)epf__ll_adv(a->round, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_ROUND, 0));
  return r;
}

/* epf_ll_combine_args_for_rank — the same for combine operands. */
EPF_HD epf_ll_combine_args_t epf_ll_combine_args_for_rank(const epf_ll_combine_args_t* a, const epf_plan_t* plan,
                                                          int rank) {
  epf_ll_combine_args_t r = *a;
  const uint64_t k = (uint64_t)rank;
  r.y = epf__ll_cadv(a->y, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_Y, 0));
  r.recv_counts =
      (const int32_t*)epf__ll_cadv(a->recv_counts, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_RECV_COUNTS, 0));
  r.topk_idx = epf__ll_cadv(a->topk_idx, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_TOPK_IDX, a->index_type));
  r.topk_weights =
      (const float*)epf__ll_cadv(a->topk_weights, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_TOPK_WEIGHTS, 0));
  r.out = epf__ll_adv(a->out, k * epf_ll_rank_bytes(plan, EPF_LL_BUF_X, 0));
  return r;
}

/* ---- shared-memory scratch ------------------------------------------------------------------ */

/* Work units: one warp moves EPF_LL_UNIT_ELEMS elements of a row (8 per lane: one 16-byte BF16
 * vector). The slot scan of the dispatch send splits the (token, k) pairs into at most
 * EPF_LL_SCAN_SEGMENTS segments, one per warp. */
#define EPF_LL_UNIT_ELEMS 256
#define EPF_LL_SCAN_SEGMENTS 8
#define EPF__LL_CODE_NONE 0xffffffffu
/* every scratch starts with the block's mask snapshot, then 16 bytes of scan temp storage */
#define EPF__LL_MASK_BYTES (((EPF_MASK_WORDS * 4) + 15) / 16 * 16)
#define EPF__LL_HDR_BYTES (EPF__LL_MASK_BYTES + 16)

EPF_HD size_t epf__ll_align16(size_t x) { return (x + 15u) & ~(size_t)15u; }
EPF_HD int epf__ll_segments(int threads) {
  const int w = threads >> 5;
  return w < 1 ? 1 : (w > EPF_LL_SCAN_SEGMENTS ? EPF_LL_SCAN_SEGMENTS : w);
}

/* epf_ll_dispatch_smem_bytes — dynamic shared memory the dispatch blocks need at `threads`
 *   threads per block: the send's per-pair code table (T * K words), per-segment expert
 *   histograms (segments * E words) and per-expert counts (E words); the receive's per-group
 *   counts and prefix (2 * (E + 1) words). The max of the two halves (they reuse the memory). */
EPF_HD size_t epf_ll_dispatch_smem_bytes(const epf_plan_t* plan, int threads) {
  const size_t TK = (size_t)plan->max_tokens_per_rank * (size_t)plan->top_k;
  const size_t E = (size_t)plan->num_experts;
  const size_t send = epf__ll_align16(TK * 4u) + epf__ll_align16((size_t)epf__ll_segments(threads) * E * 4u) +
                      epf__ll_align16(E * 4u);
  const size_t recv = 2u * epf__ll_align16((E + 1u) * 4u);
  return EPF__LL_HDR_BYTES + (send > recv ? send : recv);
}

/* epf_ll_combine_smem_bytes — the combine blocks' scratch: the send's per-group prefix (E + 1
 *   words); the receive's present / pulled rank bits and, for peers that let it pull
 *   (EPF_LL_Y_IN_PLACE_PULL), the dispatch's slot table (the same tables as the dispatch send:
 *   T * K codes, per-segment histograms, per-expert counts). The max of the two halves. */
EPF_HD size_t epf_ll_combine_smem_bytes(const epf_plan_t* plan, int threads) {
  const size_t TK = (size_t)plan->max_tokens_per_rank * (size_t)plan->top_k;
  const size_t E = (size_t)plan->num_experts;
  const size_t send = epf__ll_align16((E + 1u) * 4u) + 16u * EPF_MASK_WORDS;
  const size_t recv = epf__ll_align16(2u * EPF_MASK_WORDS * 4u) + epf__ll_align16(TK * 4u) +
                      epf__ll_align16((size_t)epf__ll_segments(threads) * E * 4u) + epf__ll_align16(E * 4u);
  return EPF__LL_HDR_BYTES + (send > recv ? send : recv);
}

/* epf_ll_smem_bytes — enough for every LL block and for epf_ll_mask_clean_block. */
EPF_HD size_t epf_ll_smem_bytes(const epf_plan_t* plan, int threads) {
  const size_t d = epf_ll_dispatch_smem_bytes(plan, threads), c = epf_ll_combine_smem_bytes(plan, threads);
  return d > c ? d : c;
}

/* epf_ll_ctx_make — fill an epf_ll_ctx_t. Scope: any thread. */
EPF_HD epf_ll_ctx_t epf_ll_ctx_make(epf_team_t team, epf_ll_state_t* state, epf_error_record_t* record,
                                    const uint32_t* abort_word, int block, int nblocks) {
  epf_ll_ctx_t c;
  c.team = team;
  c.state = state;
  c.record = record;
  c.abort_word = abort_word;
  c.block = block;
  c.nblocks = nblocks;
  return c;
}

/* ============================================================================================ */
/* Device: epochs, phase completion, waits                                                       */
/* ============================================================================================ */

/* epf_ll_wait — the wait context of an LL call: plan.timeout_ns, the record, the abort word, and
 *   (EPF_FLAG_FAULT_TOLERANT only) the rank's active mask. Scope: any thread. */
EPF_DEVICE_INLINE epf_wait_t epf_ll_wait(const epf_plan_t* plan, epf_ll_ctx_t ctx) {
  epf_wait_t w = epf_wait_make(plan->timeout_ns, ctx.record, ctx.abort_word, ctx.team.rank);
  if ((plan->flags & EPF_FLAG_FAULT_TOLERANT) != 0u) w.mask = ctx.state->mask;
  return w;
}

/* epf_ll_epoch_next — the epoch of the round a half is about to run: state.epoch[phase] + 1.
 *   Scope: any thread. The value is stable while the half runs (only its last block advances it,
 *   after every block arrived), so every thread of every block of the rank reads the same. */
EPF_DEVICE_INLINE uint32_t epf_ll_epoch_next(const epf_ll_state_t* state, epf_ll_phase_t phase) {
  return epf_ld_relaxed_gpu_u32(&state->epoch[phase]) + 1u;
}

/* epf_ll_phase_end_block — a half's completion: every one of the ctx.nblocks blocks of the rank
 *   arrives (epf_arrive_last_block); the last one gets *out_last = true. The caller publishes the
 *   rank's work from that block, then calls epf_ll_phase_commit_block to advance the epoch.
 *   Scope: [collective:block] [uniform-args]. Memory: what every block wrote before arriving
 *   happens before what the last block does after (release/acquire at .sys, cumulative). */
EPF_DEVICE_INLINE bool epf_ll_phase_end_block(epf_ll_ctx_t ctx, epf_ll_phase_t phase) {
  return epf_arrive_last_block(&ctx.state->arrive[phase], (uint32_t)ctx.nblocks, 1u);
}

/* epf_ll_phase_commit_block — in the last block only: reset the arrival counter and record
 *   `epoch` as the half's last completed round (the next launch of the half runs epoch + 1).
 *   Scope: [collective:block] (thread 0 stores). */
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

/* epf__ll_topk_raw — topk_idx[i] as int64 (int32 or int64 storage). */
EPF_DEVICE_INLINE int64_t epf__ll_topk_raw(const void* topk, int is64, int64_t i) {
  return is64 ? ((const int64_t*)topk)[i] : (int64_t)((const int32_t*)topk)[i];
}

/* epf__ll_route — the normalized expert of pair (t, k): >= 0 the expert; -1 not routed; -2
 * outside [-1, E) (dropped, counted once by the dispatch send). *out_first_k: the first k' <= k of
 * the token with the same expert (LL sends one copy per (token, expert); a repeated expert id
 * reuses the first copy's output in the combine). */
EPF_DEVICE_INLINE int epf__ll_route(const void* topk, int is64, int t, int k, int K, int E, int* out_first_k) {
  const int64_t base = (int64_t)t * K;
  const int64_t v = epf__ll_topk_raw(topk, is64, base + k);
  int j;
  *out_first_k = k;
  if (v == -1) return -1;
  if (v < -1 || v >= E) return -2;
  for (j = 0; j < k; ++j) {
    if (epf__ll_topk_raw(topk, is64, base + j) == v) {
      *out_first_k = j;
      break;
    }
  }
  return (int)v;
}

/* epf__ll_scan_block — exclusive prefix sum in place over data[0, n) (uint32), data[n] = total.
 * Warp 0 runs cub::WarpScan over chunks of 32 with a carry (n is at most E + 1 <= 1025: a block
 * scan would need a compile-time block size). ws: 16 bytes of smem for the scan's temp storage.
 * [collective:block], __syncthreads before and after. */
EPF_DEVICE_INLINE void epf__ll_scan_block(uint32_t* data, int n, void* ws) {
  typedef cub::WarpScan<uint32_t> epf__ws_t;
  EPF_STATIC_ASSERT(sizeof(epf__ws_t::TempStorage) <= 16, "cub::WarpScan temp storage exceeds its scratch slot");
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = (int)threadIdx.x;
    uint32_t carry = 0u;
    int base;
    for (base = 0; base < n; base += 32) {
      const int i = base + lane;
      uint32_t v = i < n ? data[i] : 0u, excl = 0u, agg = 0u;
      epf__ws_t(*(epf__ws_t::TempStorage*)ws).ExclusiveSum(v, excl, agg);
      if (i < n) data[i] = carry + excl;
      carry += agg;
      __syncwarp();
    }
    if (lane == 0) data[n] = carry;
  }
  __syncthreads();
}

/* epf__ll_find_group — the group g in [0, n) with prefix[g] <= r < prefix[g + 1] (prefix is
 * non-decreasing, prefix[n] > r); empty groups are skipped. */
EPF_DEVICE_INLINE int epf__ll_find_group(const uint32_t* prefix, int n, uint32_t r) {
  int lo = 0, hi = n; /* invariant: prefix[lo] <= r < prefix[hi] */
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (prefix[mid] <= r)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

EPF_DEVICE_INLINE void* epf__ll_shfl_ptr(void* p, int src_lane) {
  return (void*)(uintptr_t)__shfl_sync(0xffffffffu, (unsigned long long)(uintptr_t)p, src_lane);
}

/* ============================================================================================ */
/* Device: active mask query / set, mask clean                                                   */
/* ============================================================================================ */

/* epf_ll_mask_query — copy the rank's active mask (EPF_MASK_WORDS words) into out_mask.
 *   Scope: any single thread. Memory: .sys relaxed loads. No allocation, no sync: capturable. */
EPF_DEVICE_INLINE void epf_ll_mask_query(const epf_ll_state_t* state, uint32_t* out_mask) {
  int i;
  for (i = 0; i < EPF_MASK_WORDS; ++i) out_mask[i] = epf_ld_relaxed_sys_u32(state->mask + i);
}

/* epf_ll_mask_set — replace the rank's active mask. Scope: any single thread, while no LL half of
 *   the rank runs (stream-ordered between calls). Memory: .sys relaxed stores. */
EPF_DEVICE_INLINE void epf_ll_mask_set(epf_ll_state_t* state, const uint32_t* mask) {
  int i;
  for (i = 0; i < EPF_MASK_WORDS; ++i) epf_st_relaxed_sys_u32(state->mask + i, mask[i]);
}

/* epf_ll_mask_clean_block — re-admit delayed ranks and re-synchronise the LL epochs.
 *   Scope:    [collective:block] [uniform-args] [blocking] [needs-co-residency]: exactly one block
 *             per rank, every rank that should (re)join calls it, after all of its earlier LL
 *             halves completed (stream order). Ranks that do not call it stay masked.
 *   Does:     1. zeroes the rank's own SIG_LL_DISPATCH / SIG_LL_COMBINE words (nobody writes them:
 *                every participant is quiescent until it sees this rank's arrival);
 *             2. publishes (generation g = state.clean_gen + 1, M_r = the largest epoch this rank
 *                used) into slot `rank` of every peer's SIG_COUNT words (unused in LL mode);
 *             3. waits (bounded, without the mask) for every peer's slot to reach g;
 *             4. sets every half's epoch to M = the largest M_p among the ranks that arrived (so
 *                the next round, M + 1, exceeds every epoch any signal word may hold), resets the
 *                arrival counters, sets the active mask to {ranks that arrived} plus itself, and
 *                stores g.
 *   Result:   [result:all] EPF_OK if every rank arrived; EPF_ERR_TIMEOUT (recorded) if some did
 *             not (they stay masked); EPF_ERR_ABORTED.
 *   Scratch:  smem: EPF__LL_HDR_BYTES bytes (epf_ll_smem_bytes covers it). [smem-reuse]
 *   Limits:   every participant must have taken part in the same number of cleans (generation
 *             numbers are compared); epochs of the ranks less than 2^31 apart. */
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

#endif /* EPF_LL_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
