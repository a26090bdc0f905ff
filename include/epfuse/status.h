/* epfuse/status.h — the status codes every epfuse function returns — part of epfuse v0.1
 *
 * What it is: one X-macro list, EPF_STATUS_LIST, that produces the epf_status_t enum here and the
 * name and message tables in host.h (epf_status_name, epf_status_message). Device code returns
 * the same codes and records them in the host-mapped error record (core/signal.cuh).
 *
 * What it does NOT do: print, abort or keep a "last error" global.
 *
 * Usage:
 *   epf_status_t st = epf_config_resolve(&cfg, &resolved);
 *   if (st != EPF_OK) fprintf(stderr, "%s: %s\n", epf_status_name(st), epf_status_message(st));
 *
 * Contents:
 *   EPF_STATUS_LIST(X)   X(name, value, message) for every status
 *   epf_status_t         enum; EPF_OK == 0; values are stable ABI (only ever appended)
 *   EPF_STATUS_COUNT     one past the largest value
 *   EPF_OFFSET_INVALID, EPF_ROW_INVALID   what value-returning accessors return for bad arguments
 *
 * Requirements: any C or C++ compiler.
 */
#ifndef EPF_STATUS_H
#define EPF_STATUS_H

/* X(name, value, message). Values are ABI: append only, never renumber. */
#define EPF_STATUS_LIST(X)                                                                      \
  X(EPF_OK, 0, "success")                                                                       \
  X(EPF_ERR_INVALID_ARGUMENT, 1, "a required pointer is NULL or an argument is malformed")     \
  X(EPF_ERR_STRUCT_VERSION, 2,                                                                  \
    "struct prefix (size, magic, version) is wrong: initialize it with its *_INIT macro")       \
  X(EPF_ERR_RANKS, 3, "nranks must be in [1, EPF_MAX_RANKS]")                                   \
  X(EPF_ERR_RANK, 4, "rank must be in [0, nranks)")                                             \
  X(EPF_ERR_EXPERTS, 5, "num_experts must be in [1, EPF_MAX_EXPERTS]")                          \
  X(EPF_ERR_EXPERTS_NOT_DIVISIBLE, 6, "num_experts must be a multiple of nranks")               \
  X(EPF_ERR_TOPK, 7, "top_k must be in [1, EPF_MAX_TOPK]")                                      \
  X(EPF_ERR_HIDDEN, 8, "hidden must be positive and at most 1 << 20")                           \
  X(EPF_ERR_HIDDEN_ALIGNMENT, 9,                                                                \
    "hidden is not a multiple of the payload's vector width (8 for BF16, 32 for MXFP8, "        \
    "128 for per-128 FP8)")                                                                     \
  X(EPF_ERR_TOKENS, 10, "max_tokens_per_rank must be in [1, EPF_MAX_TOKENS_PER_RANK]")         \
  X(EPF_ERR_RECV_CAPACITY, 11,                                                                  \
    "recv_capacity is too small (below expert_alignment for EXPERT_MAJOR, below 1 for "         \
    "RANK_MAJOR) or too large (above INT32_MAX, or nonzero in LL mode)")                        \
  X(EPF_ERR_ALIGNMENT, 12,                                                                      \
    "expert_alignment must be a power of two in [1, 1024], or a pointer is misaligned")         \
  X(EPF_ERR_PAYLOAD, 13, "unknown payload or combine payload")                                  \
  X(EPF_ERR_LAYOUT, 14, "unknown layout, or a layout the chosen mode does not support")         \
  X(EPF_ERR_MODE, 15, "unknown mode")                                                           \
  X(EPF_ERR_SCALE_LAYOUT, 16, "unknown scale layout, or one the payload does not support")      \
  X(EPF_ERR_FLAGS, 17, "unknown bits in flags")                                                 \
  X(EPF_ERR_SIZE_OVERFLOW, 18, "the window plan does not fit in 64-bit byte offsets")           \
  X(EPF_ERR_WINDOW_TOO_SMALL, 19, "the window is smaller than the plan's total_bytes")          \
  X(EPF_ERR_CONFIG_MISMATCH, 20,                                                                \
    "ranks of the team were set up with different configurations (config hash differs)")        \
  X(EPF_ERR_TIMEOUT, 21, "a bounded wait expired: a peer did not signal in time")               \
  X(EPF_ERR_ABORTED, 22, "the operation was aborted through the abort word")                    \
  X(EPF_ERR_PEER_MASKED, 23, "the peer is masked out of the team (active mask)")                \
  X(EPF_ERR_CUDA, 24, "a CUDA runtime call failed")                                             \
  X(EPF_ERR_NCCL, 25, "an NCCL call failed")                                                    \
  X(EPF_ERR_NOT_SUPPORTED, 26, "not supported on this device, architecture or NCCL version")  \
  X(EPF_ERR_CO_RESIDENCY, 27,                                                                   \
    "the virtual-rank grid cannot be co-resident on this device (too many blocks)")             \
  X(EPF_ERR_ROUTE_DROPPED, 28, "expert ids outside [-1, num_experts) were dropped and counted") \
  X(EPF_ERR_RECV_OVERFLOW, 29, "received rows exceeded recv_capacity; they were dropped and counted") \
  X(EPF_ERR_ROUTE_STALE, 30,                                                                    \
    "topk_idx changed after the route update of this step: the copies whose ids no longer "     \
    "match the route were skipped")                                                             \
  X(EPF_ERR_BAD_METADATA, 31,                                                                   \
    "a received metadata row is out of range (token, source rank, expert or slot): the row "    \
    "was skipped")                                                                             \
  X(EPF_ERR_BUILD_MISMATCH, 32,                                                                 \
    "the plan was computed by a build of epfuse with other compile-time limits or struct "      \
    "versions (EPF_MAX_*, EPF_ALIGN, EPF_ENABLE_TIMEOUT, the version): compute it with this "   \
    "build, or build both with the same options")

#define EPF__STATUS_ENUM_ITEM(name, value, message) name = value,

typedef enum epf_status {
  EPF_STATUS_LIST(EPF__STATUS_ENUM_ITEM) EPF_STATUS_COUNT
} epf_status_t;

/* ---- bad arguments: statuses and sentinels ----------------------------------------------------
 * Every public function refuses a NULL pointer and an out-of-range id (region, route array, LL
 * buffer, index type, a negative count or index) instead of crashing (docs/bindings.md, "Bad
 * arguments"). A function that returns epf_status_t returns EPF_ERR_INVALID_ARGUMENT (or its more
 * specific status) before it touches anything. A value-returning accessor returns a sentinel,
 * one per return type, named in its contract:
 *   uint64_t byte offsets                        EPF_OFFSET_INVALID (UINT64_MAX)
 *   int64_t rows, word indices, row counts       EPF_ROW_INVALID (-1)
 *   sizes in bytes, counts (blocks)              0
 *   hashes (never 0 when valid)                  0
 *   pointers                                     NULL
 *   names                                        a fixed non-NULL string ("UNKNOWN", ...)
 *   predicates                                   false
 *   a struct returned by value                   all zero
 * and a void function does nothing (except that an out-parameter a caller reads unconditionally
 * still gets a defined value: epf_error_read, epf_ll_fixed_row_split). Checks of EPF_HD accessors
 * that device code calls on hot paths run in host code only (the C ABI, bindings, host
 * launchers): config.h, EPF__HOST_CHECK. */
#define EPF_OFFSET_INVALID (~(uint64_t)0)
#define EPF_ROW_INVALID ((int64_t)-1)

#endif /* EPF_STATUS_H */
/* SPDX-License-Identifier: Apache-2.0 */
