/* epfuse/ll/impl/types.cuh — the LL types: halves, phases, y layouts, state, context, operands, constants — part of epfuse v0.1
 *
 * What it is: every type and constant of the low-latency blocks, apart from their functions.
 * Include epfuse/ll/ll.cuh, not this file (it stands alone too, for the compile tests).
 *
 * Contents: see ll/ll.cuh.
 *
 * Requirements: see ll/ll.cuh.
 */
#ifndef EPF_LL_IMPL_TYPES_CUH
#define EPF_LL_IMPL_TYPES_CUH

#include "../../config.h"
#include "../../host.h"
#include "../../core/ptx.cuh"
#include "../../quant/quant.cuh"
#include "../../core/signal.cuh"
#include "../../core/team.cuh"

EPF_BEGIN_DECLS

/* ============================================================================================ */
/* Types                                                                                         */
/* ============================================================================================ */

/* Vocabulary (docs/concepts.md): a STAGE is dispatch or combine; each stage has two HALVES, send
 * and receive; a PHASE is one (stage, half) pair. `halves` of a call (ll/kernels.cuh's launchers
 * and kernels): the send half only, the receive half only, or both fused in one launch. */
#define EPF_LL_SEND 1
#define EPF_LL_RECV 2
#define EPF_LL_BOTH 3

#define EPF_LL_STATE_MAGIC 0x4c4c5045u /* "EPLL" */

/* The four phases of an LL layer, (stage, half) pairs; each keeps its own epoch and arrival
 * counter in epf_ll_state_t. */
typedef enum epf_ll_phase {
  EPF_LL_PHASE_DISPATCH_SEND = 0,
  EPF_LL_PHASE_DISPATCH_RECV = 1,
  EPF_LL_PHASE_COMBINE_SEND = 2,
  EPF_LL_PHASE_COMBINE_RECV = 3,
  EPF_LL_PHASE_COUNT = 4
} epf_ll_phase_t;

/* Where the combine finds the expert outputs (BF16 rows of `hidden`):
 *   FIXED    caller buffer in the fixed receive order: row epf_ll_fixed_row(plan, le, src, slot)
 *   PACKED   caller buffer in the packed order of epf_ll_dispatch_args_t.packed_x:
 *            row epf_ll_packed_row(plan, le, (rows of sources < src for le) + slot)
 *   IN_PLACE the receive rows of the window themselves (the experts overwrote their inputs);
 *            BF16 dispatch payload only. The expert side pushes them to the sources.
 *   IN_PLACE_PULL  as IN_PLACE, but nothing is pushed: the expert side only signals, and each
 *            source reads its outputs straight from this rank's receive rows (PULL, like the HT
 *            default): every output row crosses memory once instead of three times (read + push
 *            + read back). Same results, bit for bit. BF16 combine payload only (with an MXFP8
 *            combine payload the plan chooses the transport, see below). Extra rule: this rank
 *            must leave the round's receive rows untouched until its next dispatch receive returns
 *            (by then every source has finished reading them). The mode travels in the combine
 *            signal word, so ranks may mix IN_PLACE_PULL with the other layouts in one round.
 *   PACKED_PULL    RANK_MAJOR plans only: y in the PACKED order (a caller buffer), and the
 *            combine pulls: the expert side writes each (source, token) row's pre-reduced partial
 *            over that row's own receive row in its window (nothing is pushed) and each source
 *            reads its partials from there. BF16 dispatch and combine payloads (otherwise it
 *            behaves as PACKED: pushed). Same buffer rule as IN_PLACE_PULL.
 * EXPERT_MAJOR plans with an MXFP8 combine payload: the layout only says where y is; the PLAN
 * chooses the transport (epf_ll_combine_pulls, ll/impl/combine.cuh): pull by default — the expert side
 * quantizes each row into its own EXPERT_OUT row and the sources read it there — or push with
 * EPF_FLAG_COMBINE_PUSH (IN_PLACE_PULL then behaves as IN_PLACE).
 * A RANK_MAJOR plan (ll/impl/combine_rm.cuh) takes FIXED, PACKED or PACKED_PULL: y in the order of the
 * expert-major view that epf_ll_rm_expand_block wrote (the window's rows are rank-major rows, so
 * IN_PLACE and IN_PLACE_PULL are refused); it has no EXPERT_OUT region, so with an MXFP8 combine
 * payload it always pushes. */
typedef enum epf_ll_y_layout {
  EPF_LL_Y_FIXED = 0,
  EPF_LL_Y_PACKED = 1,
  EPF_LL_Y_IN_PLACE = 2,
  EPF_LL_Y_IN_PLACE_PULL = 3,
  EPF_LL_Y_PACKED_PULL = 4
} epf_ll_y_layout_t;

/* Per-rank LL state, in device memory (one per rank; an array of R for virtual ranks). Initialise
 * with epf_ll_state_init (host copy + cudaMemcpy) or ll/kernels.cuh's epf_ll_state_reset. The
 * kernels advance it; the host never has to touch it again (graph replays). */
typedef struct epf_ll_state {
  uint32_t epoch[EPF_LL_PHASE_COUNT];  /* epoch of the last completed round of each phase */
  uint32_t arrive[EPF_LL_PHASE_COUNT]; /* blocks of the running phase that finished (the last one resets it) */
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
 * blocks share the work. block in [0, nblocks); every block of a rank that runs a phase passes the
 * same nblocks (the completion of the phase is "all nblocks blocks arrived"). */
typedef struct epf_ll_ctx {
  epf_team_t team;               /* team.rank = the rank this block plays */
  epf_ll_state_t* state;         /* that rank's state */
  epf_error_record_t* record;    /* host-mapped error record (device pointer), or NULL */
  const uint32_t* abort_word;    /* nonzero aborts every wait, or NULL */
  int32_t block;                 /* this block's index among the rank's blocks */
  int32_t nblocks;               /* blocks of the rank running this phase */
} epf_ll_ctx_t;

/* Dispatch operands (one rank's; for virtual ranks every pointer is the base of R consecutive
 * per-rank buffers of epf_ll_buffer_bytes each, see epf_ll_dispatch_args_for_rank). T below is
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
  /* the training direction (epf_ll_dispatch_backward); the forward combine ignores both: */
  const float* weight_grad;    /* send: one FP32 per row of y (the router-weight gradient the expert
                                  stage computed for that receive row), in y's row order (FIXED and
                                  IN_PLACE*: epf_ll_fixed_row; PACKED: epf_ll_packed_row), or NULL */
  float* topk_weights_grad;    /* recv out: [T][top_k] FP32: the value of the row each valid k reads
                                  (a repeat: its first occurrence's), 0 for -1 / dropped / absent, or NULL */
} epf_ll_combine_args_t;

/* Per-rank buffers, for sizing and for virtual-rank strides (epf_ll_buffer_bytes). Values are ABI. */
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
  EPF_LL_BUF_Y,              /* [EL * R * T] BF16 rows of hidden (FIXED or PACKED y) */
  EPF_LL_BUF_WEIGHT_GRAD     /* [EL * R * T] FP32 (epf_ll_combine_args_t.weight_grad) */
} epf_ll_buffer_t;

/* ---- shared-memory scratch ------------------------------------------------------------------ */

/* Work units: one warp moves EPF_LL_UNIT_ELEMS elements of a row (8 per lane: one 16-byte BF16
 * vector). The slot scan of the dispatch send splits the (token, k) pairs into at most
 * EPF_LL_SCAN_SEGMENTS segments, one per warp. */
#define EPF_LL_UNIT_ELEMS 256
#define EPF_LL_SCAN_SEGMENTS 16
#define EPF__LL_CODE_NONE 0xffffffffu
/* a repeated expert of its token: EPF__LL_CODE_REPEAT | first k naming the expert (an expert id
 * is below EPF_MAX_EXPERTS <= 65535, so no slot code has 0xffff in its upper half) */
#define EPF__LL_CODE_REPEAT 0xffff0000u
/* 32-pair steps of a warp whose topk ids the slot pass loads at once */
#define EPF__LL_SLOT_PREFETCH 4
/* epf_ll_slot: the pair has no copy of its own (id -1, dropped, or a repeated expert of its token) */
#define EPF_LL_SLOT_NONE 0xffffffffu
/* every scratch starts with the block's mask snapshot, then 16 bytes of scan temp storage */
#define EPF__LL_MASK_BYTES (((EPF_MASK_WORDS * 4) + 15) / 16 * 16)
#define EPF__LL_HDR_BYTES (EPF__LL_MASK_BYTES + 16)

/* The shared-memory carve-up of the LL blocks at one block size: byte offsets into the block's
 * dynamic shared memory and the sizes. One function computes it (epf_ll_smem_layout); the size
 * functions return its sizes and every block takes its pointers from it, so sizing and carving
 * cannot disagree. Every block starts with the same header: the mask snapshot, then 16 bytes of
 * warp-scan storage; the rest is the block's own (the halves of a stage reuse the memory). */
typedef struct epf_ll_smem_layout {
  size_t mask;           /* every block: [EPF_MASK_WORDS] uint32 active-mask snapshot (offset 0) */
  size_t scan;           /* every block: 16 bytes of warp-scan temp storage */
  size_t slots_bytes;    /* bytes of one slot table (epf_ll_slots_at): T * K codes, segments x E
                            histograms, E counts, each 16-byte aligned */
  size_t send_slots;     /* dispatch send: its slot table */
  size_t recv_groups;    /* dispatch receive: [G + 1] uint32 counts of its (expert, source) groups,
                            scanned in place (2 (E + 1) words reserved) */
  size_t push_prefix;    /* combine send: [E + 1] uint32 prefix of the rows to push */
  size_t reduce_present; /* combine receive: [EPF_MASK_WORDS] ranks that signalled */
  size_t reduce_pulled;  /* combine receive: [EPF_MASK_WORDS] ranks that let this rank pull */
  size_t reduce_slots;   /* combine receive: the dispatch's slot table, rebuilt (pull) */
  /* RANK_MAJOR plans only (ll_rm.cuh; folded into the stage sizes below only for such a plan) */
  size_t rm_slots_bytes; /* bytes of one per-rank slot table (epf_ll_rm_slots_at): T * K codes,
                            segments x R histograms, R counts, each 16-byte aligned */
  size_t rm_send_slots;  /* RM dispatch send: its per-rank table, after the expert table */
  size_t rm_present;     /* RM receive / expand / combine send: [EPF_MASK_WORDS] sources present */
  size_t rm_rows;        /* ... [R + 1] uint32: rows per source, then their prefix in place */
  size_t rm_cnt;         /* ... [EL][R] uint32: copies per (local expert, source) */
  size_t rm_off;         /* ... [EL][R + 1] int32: first expert-major view row of (local expert, source) */
  size_t rm_reduce_slots; /* RM combine receive: the per-rank slot table, rebuilt (pull) */
  size_t dispatch_bytes; /* epf_ll_dispatch_smem_bytes: the larger of the two dispatch halves */
  size_t combine_bytes;  /* epf_ll_combine_smem_bytes: the larger of the two combine halves */
  size_t bytes;          /* epf_ll_smem_bytes: every LL block and epf_ll_mask_clean_block */
  size_t reduce_wgrad;   /* combine receive: [EPF_MASK_WORDS] ranks that carried weight gradients
                            (backward of dispatch), after the slot table */
  size_t reduce_route;   /* combine receive: [threads] uint4, each lane's route of the token its
                            warp reduces (source row pointer, weight, rows-present mask), kept
                            across that token's chunks; after reduce_wgrad */
} epf_ll_smem_layout_t;

/* One source's slot table in shared memory (epf_ll_slots_at, filled by epf_ll_slots_block): where
 * each (token, k) pair of the round lands in its expert rank's receive rows. Read it with
 * epf_ll_slot. The split into segments is free: the slots do not depend on it. */
typedef struct epf_ll_slots {
  uint32_t* code;  /* [T * K]: per pair, EPF__LL_CODE_NONE, EPF__LL_CODE_REPEAT | first k, or
                      (expert << 16) | slot within its segment */
  uint32_t* hist;  /* [nseg][E]: after the pass, the expert's slots in the segments before */
  uint32_t* count; /* [E]: after the pass, this source's copies to each expert (<= num_tokens) */
  int32_t seg_len; /* pairs per segment, a multiple of 32 */
  int32_t nseg;    /* segments, 1..min(EPF_LL_SCAN_SEGMENTS, warps of the block) */
} epf_ll_slots_t;

EPF_END_DECLS

#endif /* EPF_LL_IMPL_TYPES_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
