/* epfuse/host.h — configuration, validation and the window plan — part of epfuse v0.1
 *
 * What it is: the tiny host setup header. It turns an epf_config_t into an epf_plan_t: the byte
 * offset and size of every region of one rank's slice of the symmetric window. The plan is the
 * ONE place where epfuse does offset arithmetic; device code receives the same struct by value
 * and reads offsets out of it (the epf_plan_*_offset accessors below index inside one region).
 * Plain C11 (gcc -std=c11 -Wall -Wextra -Wpedantic -Werror clean), also C++17 and CUDA; it needs
 * no CUDA and is meant for FFI (Rust, Python ctypes/cffi): fixed-width fields, no bitfields.
 *
 * What it does NOT do: allocate, call CUDA or NCCL, launch kernels, print, abort or exit. NCCL
 * helpers (symmetric allocation, window registration, communicator creation with a deadline) are
 * in host_nccl.h; the device communicator helpers in nccl.cuh.
 *
 * Usage (examples/04_plan_from_c has it whole):
 *   epf_config_t cfg = EPF_CONFIG_INIT;           // zero fields mean "default"
 *   cfg.nranks = 8; cfg.num_experts = 256; cfg.top_k = 8; cfg.hidden = 7168;
 *   epf_plan_t plan;
 *   epf_status_t st = epf_plan_compute(&cfg, &plan);   // resolves, validates, plans
 *   if (st != EPF_OK) { puts(epf_status_message(st)); return 1; }
 *   // allocate plan.total_bytes per rank (host_nccl.h: epf_nccl_window_create) and pass `plan`
 *   // by value to kernels.
 *
 * COMPILE-TIME OPTIONS: see config.h (limits, EPF_ALIGN).
 *
 * Contents:
 *   EPF_CONFIG_INIT, epf_config_t, epf_mode_t, epf_layout_t, epf_payload_t, epf_scale_layout_t,
 *   EPF_FLAG_*                                             configuration
 *   epf_status_t epf_config_resolve(const epf_config_t* in, epf_config_t* out_resolved)
 *   epf_status_t epf_config_validate(const epf_config_t* resolved)
 *   uint64_t     epf_config_hash(const epf_config_t* resolved)
 *   int64_t      epf_config_worst_case_rows(const epf_config_t* resolved)   HT rows that never overflow
 *   int          epf_payload_vector_width(int payload)     hidden must be a multiple of this
 *   epf_region_id_t, epf_region_t, epf_plan_t, epf_window_header_t, EPF_HEADER_BYTES
 *   epf_status_t epf_plan_compute(const epf_config_t* cfg, epf_plan_t* out_plan)
 *   epf_status_t epf_plan_check(const epf_plan_t* plan)    prefix + build check (host or FFI)
 *   uint64_t     epf_build_signature(void)                 this build's compile-time configuration
 *   uint64_t     epf_plan_signal_offset(const epf_plan_t*, epf_region_id_t, int64_t index)
 *   uint64_t     epf_plan_counts_offset(const epf_plan_t*, int parity, int src, int index)
 *   uint64_t     epf_plan_recv_token_offset / _scale_offset / _meta_offset(const epf_plan_t*, int64_t row)
 *   uint64_t     epf_plan_expert_out_offset / epf_plan_combine_offset(const epf_plan_t*, int64_t row)
 *   epf_error_record_t, epf_error_read(rec, out), epf_error_clear(rec)   host-mapped diagnostics
 *   const char*  epf_status_name(epf_status_t), epf_status_message(epf_status_t)
 *   int          epf_version(void)
 *
 * Requirements: C11 or C++17. No CUDA, no NCCL.
 */
#ifndef EPF_HOST_H
#define EPF_HOST_H

#include "config.h"
#include "status.h"
#include "version.h"

EPF_BEGIN_DECLS

/* ============================================================================================ */
/* Configuration                                                                                 */
/* ============================================================================================ */

#define EPF_CONFIG_MAGIC 0x43465045u /* "EPFC" little-endian */
#define EPF_CONFIG_VERSION 1u
#define EPF_PLAN_MAGIC 0x4c504645u /* "EFPL" */
#define EPF_PLAN_VERSION 2u /* 2: build_signature */

typedef enum epf_mode {
  EPF_MODE_DEFAULT = 0, /* -> EPF_MODE_HT */
  EPF_MODE_HT = 1,      /* high throughput: count exchange, exact receive offsets */
  EPF_MODE_LL = 2       /* low latency: fixed [expert][source][max_tokens] receive regions */
} epf_mode_t;

typedef enum epf_layout {
  EPF_LAYOUT_DEFAULT = 0,      /* -> EPF_LAYOUT_EXPERT_MAJOR */
  EPF_LAYOUT_EXPERT_MAJOR = 1, /* one copy per (token, expert), grouped by local expert */
  EPF_LAYOUT_RANK_MAJOR = 2    /* one copy per (token, destination rank) + local expert list */
} epf_layout_t;

typedef enum epf_payload {
  EPF_PAYLOAD_DEFAULT = 0, /* -> EPF_PAYLOAD_BF16 */
  EPF_PAYLOAD_BF16 = 1,    /* 2 bytes per element, no scales */
  EPF_PAYLOAD_MXFP8 = 2,   /* E4M3 bytes + one E8M0 scale byte per 32 elements */
  EPF_PAYLOAD_FP8_128 = 3  /* E4M3 bytes + one FP32 scale per 128 elements (DeepSeek) */
} epf_payload_t;

typedef enum epf_scale_layout {
  EPF_SCALE_LAYOUT_DEFAULT = 0,      /* -> EPF_SCALE_LAYOUT_COMPACT */
  EPF_SCALE_LAYOUT_COMPACT = 1,      /* row-major [rows, hidden / group] */
  EPF_SCALE_LAYOUT_SWIZZLED_128X4 = 2 /* Blackwell block-scaled GEMM atoms (MXFP8 only) */
} epf_scale_layout_t;

/* flags */
#define EPF_FLAG_FAULT_TOLERANT 0x1u  /* bounded waits mask late peers instead of failing */
#define EPF_FLAG_COMBINE_PUSH 0x2u    /* HT combine: expert side stores into the source's window */
#define EPF_FLAG_SCALE_UE8M0 0x4u     /* per-128 FP8: round scales up to a power of two */
#define EPF_FLAG_MX_SCALE_FLOOR 0x8u  /* MXFP8: OCP FLOOR scale rule instead of RCEIL */
#define EPF_FLAGS_ALL 0xFu

#define EPF_DEFAULT_NUM_EXPERTS 256
#define EPF_DEFAULT_TOPK 8
#define EPF_DEFAULT_HIDDEN 7168
#define EPF_DEFAULT_TOKENS_HT 4096
#define EPF_DEFAULT_TOKENS_LL 128
#define EPF_DEFAULT_TIMEOUT_NS 10000000000ull /* 10 s */
#define EPF_MAX_HIDDEN (1 << 20)

/* Versioned public struct: size/magic/version first (never move), fields only ever appended.
 * Zero in any other field means "default"; epf_config_resolve() returns the filled-in copy.
 * Enumerations are stored as int32_t so the layout is fixed for FFI. */
typedef struct epf_config {
  uint32_t size;    /* sizeof(epf_config_t) as the caller compiled it */
  uint32_t magic;   /* EPF_CONFIG_MAGIC */
  uint32_t version; /* EPF_CONFIG_VERSION */
  int32_t nranks;   /* LSA team size R (virtual or real); 0 -> 1 */
  int32_t num_experts;         /* E, global; 0 -> 256; multiple of nranks */
  int32_t top_k;               /* K; 0 -> 8 */
  int32_t hidden;              /* H elements per token row; 0 -> 7168 */
  int32_t max_tokens_per_rank; /* T, tokens one rank sends per call; 0 -> 4096 (HT) / 128 (LL) */
  int32_t mode;                /* epf_mode_t */
  int32_t layout;              /* epf_layout_t */
  int32_t payload;             /* epf_payload_t: what dispatch delivers */
  int32_t combine_payload;     /* epf_payload_t: BF16 or MXFP8 on the way back */
  int32_t scale_layout;        /* epf_scale_layout_t of the receive-side scales */
  int32_t expert_alignment;    /* pad each expert's receive segment to this many rows; 0 -> 1 */
  uint32_t flags;              /* EPF_FLAG_* */
  uint32_t reserved0;          /* must be 0 */
  int64_t recv_capacity;       /* HT: rows of the receive region; 0 -> worst case; at most
                                  INT32_MAX, at least expert_alignment (EXPERT_MAJOR) or 1
                                  (RANK_MAJOR). LL: must be 0 */
  uint64_t timeout_ns;         /* bounded waits; 0 -> 10 s. Not part of the config hash. */
} epf_config_t;

/* Every field is listed so -Wextra (missing-field-initializers) stays quiet in C and C++. */
#define EPF_CONFIG_INIT                                                                        \
  {(uint32_t)sizeof(epf_config_t), EPF_CONFIG_MAGIC, EPF_CONFIG_VERSION, 0, 0, 0, 0, 0, 0, 0, 0, \
   0, 0, 0, 0u, 0u, 0, 0u}

/* ============================================================================================ */
/* Status strings and version (one X-macro list in status.h)                                      */
/* ============================================================================================ */

#define EPF__STATUS_NAME_CASE(name, value, message) \
  case name:                                        \
    return #name;
#define EPF__STATUS_MESSAGE_CASE(name, value, message) \
  case name:                                           \
    return message;

/* epf_status_name — the enumerator's name, e.g. "EPF_ERR_TOPK"; "EPF_STATUS_UNKNOWN" otherwise.
 *   Scope: any thread, host or device. Never NULL. */
EPF_HD const char* epf_status_name(epf_status_t status) {
  switch (status) {
    EPF_STATUS_LIST(EPF__STATUS_NAME_CASE)
    default:
      return "EPF_STATUS_UNKNOWN";
  }
}

/* epf_status_message — one sentence that says what is wrong. Never NULL. */
EPF_HD const char* epf_status_message(epf_status_t status) {
  switch (status) {
    EPF_STATUS_LIST(EPF__STATUS_MESSAGE_CASE)
    default:
      return "unknown status code";
  }
}

/* epf_version — EPF_VERSION of the headers this translation unit was compiled with. Host only
 *   (like every EPF_INLINE function: left out under NVRTC). */
#if !defined(__CUDACC_RTC__)
EPF_INLINE int epf_version(void) { return EPF_VERSION; }
#endif

/* ============================================================================================ */
/* Resolve and validate                                                                          */
/* ============================================================================================ */

/* epf_payload_vector_width — elements per vector unit of a payload: hidden must be a multiple.
 *   BF16: 8 (one 16-byte vector), MXFP8: 32 (one scale group), FP8_128: 128. 0 if unknown. */
EPF_HD int epf_payload_vector_width(int payload) {
  switch (payload) {
    case EPF_PAYLOAD_BF16: return 8;
    case EPF_PAYLOAD_MXFP8: return 32;
    case EPF_PAYLOAD_FP8_128: return 128;
    default: return 0;
  }
}

EPF_HD int epf__max_i(int a, int b) { return a > b ? a : b; }
EPF_HD int epf__min_i(int a, int b) { return a < b ? a : b; }

/* epf__check_prefix — a versioned struct's prefix: known magic, version >= 1, and at least as
 * large as this header's definition (a larger, newer struct is accepted; its tail is ignored). */
EPF_HD epf_status_t epf__check_prefix(uint32_t size, uint32_t magic, uint32_t version,
                                      uint32_t want_magic, uint32_t min_size) {
  if (magic != want_magic || version < 1u || size < min_size) return EPF_ERR_STRUCT_VERSION;
  return EPF_OK;
}

/* epf_config_validate — check every limit of an already resolved config (no zero defaults left).
 *   Returns the status of the first violated rule, in this order: prefix, reserved0 != 0
 *   (EPF_ERR_INVALID_ARGUMENT), mode, layout, payloads, scale layout, flags, ranks, experts,
 *   divisibility, top-k, hidden, hidden alignment, tokens, alignment, receive capacity.
 *   Receive capacity: LL must be 0; HT must be at most INT32_MAX and at least one padded expert
 *   segment, expert_alignment rows, in the EXPERT_MAJOR layout, at least 1 row in the RANK_MAJOR
 *   layout (its receive region is one unpadded row per (token, destination rank), so the
 *   alignment does not apply there).
 *   Scope: any thread, host or device. Pure. */
EPF_HD epf_status_t epf_config_validate(const epf_config_t* c) {
  epf_status_t st;
  int width;
  if (c == NULL) return EPF_ERR_INVALID_ARGUMENT;
  st = epf__check_prefix(c->size, c->magic, c->version, EPF_CONFIG_MAGIC,
                         (uint32_t)sizeof(epf_config_t));
  if (st != EPF_OK) return st;
  if (c->reserved0 != 0u) return EPF_ERR_INVALID_ARGUMENT;
  if (c->mode != EPF_MODE_HT && c->mode != EPF_MODE_LL) return EPF_ERR_MODE;
  if (c->layout != EPF_LAYOUT_EXPERT_MAJOR && c->layout != EPF_LAYOUT_RANK_MAJOR)
    return EPF_ERR_LAYOUT;
  if (epf_payload_vector_width(c->payload) == 0) return EPF_ERR_PAYLOAD;
  if (c->combine_payload != EPF_PAYLOAD_BF16 && c->combine_payload != EPF_PAYLOAD_MXFP8)
    return EPF_ERR_PAYLOAD;
  if (c->scale_layout != EPF_SCALE_LAYOUT_COMPACT &&
      c->scale_layout != EPF_SCALE_LAYOUT_SWIZZLED_128X4)
    return EPF_ERR_SCALE_LAYOUT;
  if (c->scale_layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4 && c->payload != EPF_PAYLOAD_MXFP8)
    return EPF_ERR_SCALE_LAYOUT;
  if ((c->flags & ~EPF_FLAGS_ALL) != 0u) return EPF_ERR_FLAGS;
  if (c->nranks < 1 || c->nranks > EPF_MAX_RANKS) return EPF_ERR_RANKS;
  if (c->num_experts < 1 || c->num_experts > EPF_MAX_EXPERTS) return EPF_ERR_EXPERTS;
  if (c->num_experts % c->nranks != 0) return EPF_ERR_EXPERTS_NOT_DIVISIBLE;
  if (c->top_k < 1 || c->top_k > EPF_MAX_TOPK) return EPF_ERR_TOPK;
  if (c->hidden < 1 || c->hidden > EPF_MAX_HIDDEN) return EPF_ERR_HIDDEN;
  width = epf__max_i(epf_payload_vector_width(c->payload),
                     epf_payload_vector_width(c->combine_payload));
  if (c->hidden % width != 0) return EPF_ERR_HIDDEN_ALIGNMENT;
  if (c->max_tokens_per_rank < 1 || c->max_tokens_per_rank > EPF_MAX_TOKENS_PER_RANK)
    return EPF_ERR_TOKENS;
  if (c->expert_alignment < 1 || c->expert_alignment > 1024 ||
      (c->expert_alignment & (c->expert_alignment - 1)) != 0)
    return EPF_ERR_ALIGNMENT;
  if (c->mode == EPF_MODE_LL) {
    if (c->recv_capacity != 0) return EPF_ERR_RECV_CAPACITY;
  } else if (c->recv_capacity < (c->layout == EPF_LAYOUT_RANK_MAJOR ? 1 : (int64_t)c->expert_alignment) ||
             c->recv_capacity > INT32_MAX) {
    return EPF_ERR_RECV_CAPACITY;
  }
  return EPF_OK;
}

/* epf_config_worst_case_rows — HT receive rows that can never overflow: every token of every
 * source routed to this rank, min(top_k, experts per rank) copies each plus the alignment padding
 * of every local expert segment (EXPERT_MAJOR: R * T * min(K, E / R) + (E / R) *
 * (expert_alignment - 1)), or one unpadded copy each (RANK_MAJOR: R * T). Valid fields only. */
EPF_HD int64_t epf_config_worst_case_rows(const epf_config_t* c) {
  int64_t local = c->num_experts / c->nranks;
  int64_t copies = c->layout == EPF_LAYOUT_RANK_MAJOR ? 1 : (int64_t)epf__min_i(c->top_k, (int)local);
  int64_t pad = c->layout == EPF_LAYOUT_RANK_MAJOR ? 0 : local * (int64_t)(c->expert_alignment - 1);
  return (int64_t)c->nranks * (int64_t)c->max_tokens_per_rank * copies + pad;
}

/* epf_config_resolve — copy `in`, replace every zero field by its default, then validate.
 *   Statuses: EPF_ERR_INVALID_ARGUMENT (NULL), then those of epf_config_validate on the resolved
 *   copy (EPF_ERR_RECV_CAPACITY too when the HT worst case passes INT32_MAX rows).
 *   out_resolved is written on every error but a NULL or a bad prefix (defaults applied as far as
 *   they go; recv_capacity stays 0 when the worst case cannot be computed), so a caller can print
 *   what was checked. `in` and `out_resolved` may alias. Idempotent: resolving
 *   *out_resolved again gives the same config and the same status, in every mode and layout
 *   (and when it returns EPF_OK, epf_config_validate(out_resolved) returns EPF_OK too).
 *   Scope: any thread, host or device. Pure. */
EPF_HD epf_status_t epf_config_resolve(const epf_config_t* in, epf_config_t* out_resolved) {
  epf_config_t c;
  epf_status_t st;
  if (in == NULL || out_resolved == NULL) return EPF_ERR_INVALID_ARGUMENT;
  st = epf__check_prefix(in->size, in->magic, in->version, EPF_CONFIG_MAGIC,
                         (uint32_t)sizeof(epf_config_t));
  if (st != EPF_OK) return st;
  c = *in; /* reads only this header's fields, also from a larger future struct */
  c.size = (uint32_t)sizeof(epf_config_t);
  c.version = EPF_CONFIG_VERSION;
  if (c.nranks == 0) c.nranks = 1;
  if (c.num_experts == 0) c.num_experts = EPF_DEFAULT_NUM_EXPERTS;
  if (c.top_k == 0) c.top_k = EPF_DEFAULT_TOPK;
  if (c.hidden == 0) c.hidden = EPF_DEFAULT_HIDDEN;
  if (c.mode == EPF_MODE_DEFAULT) c.mode = EPF_MODE_HT;
  if (c.layout == EPF_LAYOUT_DEFAULT) c.layout = EPF_LAYOUT_EXPERT_MAJOR;
  if (c.payload == EPF_PAYLOAD_DEFAULT) c.payload = EPF_PAYLOAD_BF16;
  if (c.combine_payload == EPF_PAYLOAD_DEFAULT) c.combine_payload = EPF_PAYLOAD_BF16;
  if (c.scale_layout == EPF_SCALE_LAYOUT_DEFAULT) c.scale_layout = EPF_SCALE_LAYOUT_COMPACT;
  if (c.expert_alignment == 0) c.expert_alignment = 1;
  if (c.max_tokens_per_rank == 0)
    c.max_tokens_per_rank = c.mode == EPF_MODE_LL ? EPF_DEFAULT_TOKENS_LL : EPF_DEFAULT_TOKENS_HT;
  if (c.timeout_ns == 0) c.timeout_ns = EPF_DEFAULT_TIMEOUT_NS;
  /* The worst case needs valid ranks/experts/top-k/tokens: validate first with a placeholder. */
  if (c.mode != EPF_MODE_LL && c.recv_capacity == 0) {
    c.recv_capacity = INT32_MAX; /* placeholder that passes the capacity check */
    st = epf_config_validate(&c);
    c.recv_capacity = st == EPF_OK ? epf_config_worst_case_rows(&c) : 0;
    if (st == EPF_OK && c.recv_capacity > INT32_MAX) st = EPF_ERR_RECV_CAPACITY;
  } else {
    st = epf_config_validate(&c);
  }
  *out_resolved = c;
  return st;
}

/* epf_config_hash — FNV-1a 64 of every field that changes the window layout or the protocol
 * (not timeout_ns), the library's major version and EPF_CONFIG_SIGNATURE. Never 0. Ranks
 * exchange it in the setup handshake (signal.cuh). Input: a resolved config. */
EPF_HD uint64_t epf__fnv1a_u64(uint64_t h, uint64_t v) {
  int i;
  for (i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xffu;
    h *= 0x100000001b3ull;
  }
  return h;
}

EPF_HD uint64_t epf_config_hash(const epf_config_t* c) {
  uint64_t h = 0xcbf29ce484222325ull;
  h = epf__fnv1a_u64(h, (uint64_t)EPF_VERSION_MAJOR);
  h = epf__fnv1a_u64(h, (uint64_t)EPF_CONFIG_SIGNATURE);
  h = epf__fnv1a_u64(h, (uint64_t)(uint32_t)c->nranks);
  h = epf__fnv1a_u64(h, (uint64_t)(uint32_t)c->num_experts);
  h = epf__fnv1a_u64(h, (uint64_t)(uint32_t)c->top_k);
  h = epf__fnv1a_u64(h, (uint64_t)(uint32_t)c->hidden);
  h = epf__fnv1a_u64(h, (uint64_t)(uint32_t)c->max_tokens_per_rank);
  h = epf__fnv1a_u64(h, (uint64_t)(uint32_t)c->mode);
  h = epf__fnv1a_u64(h, (uint64_t)(uint32_t)c->layout);
  h = epf__fnv1a_u64(h, (uint64_t)(uint32_t)c->payload);
  h = epf__fnv1a_u64(h, (uint64_t)(uint32_t)c->combine_payload);
  h = epf__fnv1a_u64(h, (uint64_t)(uint32_t)c->scale_layout);
  h = epf__fnv1a_u64(h, (uint64_t)(uint32_t)c->expert_alignment);
  h = epf__fnv1a_u64(h, (uint64_t)c->flags);
  h = epf__fnv1a_u64(h, (uint64_t)c->recv_capacity);
  return h == 0 ? 1 : h;
}

/* ============================================================================================ */
/* The window plan                                                                               */
/* ============================================================================================ */

/* The regions of one rank's window slice, in address order. Every rank has the same plan, so
 * (window, offset, peer) names the same region on every peer. Signals are uint64_t words. */
typedef enum epf_region_id {
  EPF_REGION_HEADER = 0,       /* epf_window_header_t; offset 0, size fixed (EPF_HEADER_BYTES) */
  EPF_REGION_SIG_COUNT,        /* [R] one word per source: LL mask-clean rendezvous (the HT count exchange
                                  needs no signal: every COUNTS word carries its epoch) */
  EPF_REGION_SIG_DISPATCH,     /* [R] HT dispatch arrival, one per source */
  EPF_REGION_SIG_COMBINE,      /* [R] combine arrival, one per peer */
  EPF_REGION_SIG_BARRIER,      /* [R] team barrier, one per peer */
  EPF_REGION_SIG_LL_DISPATCH,  /* LL: [2 parity][experts_per_rank][R] epoch|count */
  EPF_REGION_SIG_LL_COMBINE,   /* LL: [2 parity][R] */
  EPF_REGION_COUNTS,           /* [2 parity][R source][E + R] uint64 count words (epoch << 32 | 1 << 31 | count): per-expert, then per-rank counts */
  EPF_REGION_RECV_TOKENS,      /* HT: [recv_capacity] rows; LL: [2][E_local][R][T] (EM) or [2][R][T] (RM) */
  EPF_REGION_RECV_SCALES,      /* the rows' scales (compact or swizzled); 0 bytes for BF16 */
  EPF_REGION_RECV_META,        /* the rows' metadata (epf_recv_meta_* layout, meta_bytes_per_row) */
  EPF_REGION_COMBINE,          /* combine landing area at the source (push / LL); else 0 bytes */
  EPF_REGION_EXPERT_OUT,       /* HT pull combine: expert outputs (combine_payload rows) in the
                                  receive row order, unless both directions are BF16 (then the
                                  outputs overwrite RECV_TOKENS in place and this is 0 bytes) */
  EPF_REGION_COUNT
} epf_region_id_t;

typedef struct epf_region {
  uint64_t offset; /* bytes from the start of the rank's slice; multiple of EPF_ALIGN */
  uint64_t bytes;  /* may be 0 (region unused in this configuration) */
} epf_region_t;

/* Window header at offset 0: the setup handshake writes here. Its size does not depend on the
 * config (it must be found before ranks know they agree). Slot s is written by rank s. */
typedef struct epf_window_header {
  uint64_t peer_hash[EPF_MAX_RANKS];  /* config hash of rank s (written before peer_epoch[s]) */
  uint32_t peer_epoch[EPF_MAX_RANKS]; /* handshake epoch of rank s, release-stored */
} epf_window_header_t;

#define EPF__ALIGN_UP(x, a) ((((x) + (a) - 1) / (a)) * (a))
#define EPF_HEADER_BYTES EPF__ALIGN_UP(sizeof(epf_window_header_t), EPF_ALIGN)

typedef struct epf_plan {
  uint32_t size, magic, version; /* sizeof(epf_plan_t), EPF_PLAN_MAGIC, EPF_PLAN_VERSION */
  uint32_t flags;                /* config flags */
  int32_t nranks, num_experts, experts_per_rank, top_k, hidden, max_tokens_per_rank;
  int32_t mode, layout, payload, combine_payload, scale_layout, expert_alignment;
  int64_t recv_capacity;      /* HT: rows of RECV_TOKENS; LL: rows of one parity */
  uint32_t row_bytes;         /* bytes of one received token row (no scales) */
  uint32_t scale_bytes_per_row; /* compact scale bytes of one row (0 for BF16) */
  uint32_t meta_bytes_per_row;  /* bytes of one row's metadata */
  uint32_t combine_row_bytes;   /* bytes of one combine row (elements, then MXFP8 scales) */
  uint64_t config_hash;       /* epf_config_hash of the resolved config */
  uint64_t timeout_ns;        /* resolved timeout */
  uint64_t total_bytes;       /* bytes of one rank's slice; multiple of EPF_ALIGN */
  epf_region_t region[EPF_REGION_COUNT];
  uint64_t build_signature;   /* epf_build_signature() of the build that computed the plan:
                                 epf_plan_check (and so every launcher) refuses a plan from a
                                 build with other compile-time limits (EPF_ERR_BUILD_MISMATCH) */
} epf_plan_t;

/* Receive metadata rows. EXPERT_MAJOR: epf_recv_meta_em_t. RANK_MAJOR: epf_recv_meta_rm_t
 * followed by top_k int32 local expert ids (-1 = none), top_k float weights and top_k int32
 * expert-major slots (the copy's rank within its (source, expert) group, so a local `expand` can
 * place it without a scan), padded to 16 bytes. Entries [0, num_local) are used, in k order. */
typedef struct epf_recv_meta_em {
  int32_t src_token;    /* token index on the source rank; -1 = pad row */
  int16_t src_rank;     /* source rank */
  int16_t k;            /* which of the token's top_k entries this copy is */
  int32_t local_expert; /* expert index on this rank */
  float weight;         /* topk_weights[src_token][k] */
} epf_recv_meta_em_t;

typedef struct epf_recv_meta_rm {
  int32_t src_token;
  int32_t src_rank;
  int32_t num_local; /* how many of the top_k entries that follow are used */
  int32_t reserved;
} epf_recv_meta_rm_t;

EPF_HD uint64_t epf__align_up_u64(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* zero-fill without memset: no <string.h>, and the same code runs on the device */
EPF_HD void epf__zero_bytes(void* p, size_t n) {
  unsigned char* b = (unsigned char*)p;
  size_t i;
  for (i = 0; i < n; ++i) b[i] = 0;
}

/* checked a*b (both < 2^63); returns false on overflow */
EPF_HD bool epf__mul_ok(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > UINT64_MAX / a) return false;
  *out = a * b;
  return true;
}

/* epf_build_signature — FNV-1a 64 of this build's compile-time configuration: the version, every
 *   "agree" option of config.h (EPF_CONFIG_SIGNATURE, EPF_MAX_TOKENS_PER_RANK), the struct
 *   versions and the sizes of the structs a plan's window depends on. Two builds with the same
 *   signature lay out the same window and read the same plan. Never 0. Scope: any thread. */
EPF_HD uint64_t epf_build_signature(void) {
  uint64_t h = 0xcbf29ce484222325ull;
  h = epf__fnv1a_u64(h, (uint64_t)EPF_VERSION);
  h = epf__fnv1a_u64(h, (uint64_t)EPF_CONFIG_SIGNATURE);
  h = epf__fnv1a_u64(h, (uint64_t)EPF_MAX_TOKENS_PER_RANK);
  h = epf__fnv1a_u64(h, (uint64_t)EPF_CONFIG_VERSION);
  h = epf__fnv1a_u64(h, (uint64_t)EPF_PLAN_VERSION);
  h = epf__fnv1a_u64(h, (uint64_t)sizeof(epf_config_t));
  h = epf__fnv1a_u64(h, (uint64_t)sizeof(epf_plan_t));
  h = epf__fnv1a_u64(h, (uint64_t)sizeof(epf_window_header_t));
  return h == 0 ? 1 : h;
}

/* epf_plan_compute — resolve + validate `cfg`, then lay out every region of one rank's window
 *   slice, each at a multiple of EPF_ALIGN, in epf_region_id_t order. This is the only function in
 *   epfuse that computes region offsets. Statuses: EPF_ERR_INVALID_ARGUMENT (NULL), those of
 *   epf_config_resolve, EPF_ERR_SIZE_OVERFLOW (the slice would reach 2^63 bytes). On error
 *   *out_plan is zeroed (size/magic/version and build_signature still set).
 *   Scope: any thread, host or device. Pure: no allocation, no I/O. */
EPF_HD epf_status_t epf_plan_compute(const epf_config_t* cfg, epf_plan_t* out_plan) {
  epf_config_t c;
  epf_plan_t p;
  epf_status_t st;
  uint64_t R, E, EL, T, K, H, rows, sizes[EPF_REGION_COUNT], off;
  uint64_t scale_cols, combine_rows;
  int i;
  if (cfg == NULL || out_plan == NULL) return EPF_ERR_INVALID_ARGUMENT;
  epf__zero_bytes(&p, sizeof(p));
  p.size = (uint32_t)sizeof(epf_plan_t);
  p.magic = EPF_PLAN_MAGIC;
  p.version = EPF_PLAN_VERSION;
  p.build_signature = epf_build_signature(); /* the prefix and the build, also on failure */
  *out_plan = p;
  st = epf_config_resolve(cfg, &c);
  if (st != EPF_OK) return st;

  R = (uint64_t)c.nranks;
  E = (uint64_t)c.num_experts;
  EL = E / R;
  T = (uint64_t)c.max_tokens_per_rank;
  K = (uint64_t)c.top_k;
  H = (uint64_t)c.hidden;

  p.flags = c.flags;
  p.nranks = c.nranks;
  p.num_experts = c.num_experts;
  p.experts_per_rank = (int32_t)EL;
  p.top_k = c.top_k;
  p.hidden = c.hidden;
  p.max_tokens_per_rank = c.max_tokens_per_rank;
  p.mode = c.mode;
  p.layout = c.layout;
  p.payload = c.payload;
  p.combine_payload = c.combine_payload;
  p.scale_layout = c.scale_layout;
  p.expert_alignment = c.expert_alignment;
  p.config_hash = epf_config_hash(&c);
  p.timeout_ns = c.timeout_ns;

  /* per-row sizes (all < 2^32 by the hidden and top-k limits) */
  p.row_bytes = (uint32_t)(c.payload == EPF_PAYLOAD_BF16 ? H * 2u : H);
  p.scale_bytes_per_row = (uint32_t)(c.payload == EPF_PAYLOAD_MXFP8     ? H / 32u
                                     : c.payload == EPF_PAYLOAD_FP8_128 ? H / 128u * 4u
                                                                        : 0u);
  p.meta_bytes_per_row = (uint32_t)(c.layout == EPF_LAYOUT_EXPERT_MAJOR
                                        ? sizeof(epf_recv_meta_em_t)
                                        : epf__align_up_u64(sizeof(epf_recv_meta_rm_t) + K * 12u, 16u));
  p.combine_row_bytes = (uint32_t)(c.combine_payload == EPF_PAYLOAD_MXFP8
                                       ? epf__align_up_u64(H + H / 32u, 16u)
                                       : H * 2u);

  /* rows of the receive region */
  if (c.mode == EPF_MODE_LL) {
    rows = (c.layout == EPF_LAYOUT_EXPERT_MAJOR ? EL : 1u) * R * T; /* one parity */
    p.recv_capacity = (int64_t)rows;
    rows *= 2u;
  } else {
    p.recv_capacity = c.recv_capacity;
    rows = (uint64_t)c.recv_capacity;
  }
  /* combine landing rows at the source: (token, k) for EM, (token, rank) for RM */
  combine_rows = T * (c.layout == EPF_LAYOUT_EXPERT_MAJOR ? K : R);
  if (c.mode == EPF_MODE_LL)
    combine_rows *= 2u;
  else if ((c.flags & EPF_FLAG_COMBINE_PUSH) == 0u)
    combine_rows = 0;

  for (i = 0; i < EPF_REGION_COUNT; ++i) sizes[i] = 0;
  sizes[EPF_REGION_HEADER] = EPF_HEADER_BYTES;
  sizes[EPF_REGION_SIG_COUNT] = R * 8u;
  sizes[EPF_REGION_SIG_DISPATCH] = R * 8u;
  sizes[EPF_REGION_SIG_COMBINE] = R * 8u;
  sizes[EPF_REGION_SIG_BARRIER] = R * 8u;
  if (c.mode == EPF_MODE_LL) {
    sizes[EPF_REGION_SIG_LL_DISPATCH] = 2u * EL * R * 8u;
    sizes[EPF_REGION_SIG_LL_COMBINE] = 2u * R * 8u;
  }
  sizes[EPF_REGION_COUNTS] = 2u * R * (E + R) * 8u;
  if (!epf__mul_ok(rows, p.row_bytes, &sizes[EPF_REGION_RECV_TOKENS])) return EPF_ERR_SIZE_OVERFLOW;
  if (c.scale_layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4) {
    /* 512-byte atoms of 128 rows x 4 scale columns; rows padded to 128, columns to 4 */
    scale_cols = epf__align_up_u64(H / 32u, 4u);
    if (!epf__mul_ok(epf__align_up_u64(rows, 128u), scale_cols, &sizes[EPF_REGION_RECV_SCALES]))
      return EPF_ERR_SIZE_OVERFLOW;
  } else if (!epf__mul_ok(rows, p.scale_bytes_per_row, &sizes[EPF_REGION_RECV_SCALES])) {
    return EPF_ERR_SIZE_OVERFLOW;
  }
  if (!epf__mul_ok(rows, p.meta_bytes_per_row, &sizes[EPF_REGION_RECV_META])) return EPF_ERR_SIZE_OVERFLOW;
  if (!epf__mul_ok(combine_rows, p.combine_row_bytes, &sizes[EPF_REGION_COMBINE]))
    return EPF_ERR_SIZE_OVERFLOW;
  /* pull combine reads expert outputs from the window: in place over BF16 dispatch rows when both
   * directions are BF16, else from EXPERT_OUT (quantized rows are too small, and an MXFP8 combine
   * row written over the BF16 row it is read from would clobber unread elements) */
  if (c.mode == EPF_MODE_HT && (c.flags & EPF_FLAG_COMBINE_PUSH) == 0u &&
      (c.payload != EPF_PAYLOAD_BF16 || c.combine_payload != EPF_PAYLOAD_BF16) &&
      !epf__mul_ok(rows, p.combine_row_bytes, &sizes[EPF_REGION_EXPERT_OUT]))
    return EPF_ERR_SIZE_OVERFLOW;

  off = 0;
  for (i = 0; i < EPF_REGION_COUNT; ++i) {
    uint64_t sz = epf__align_up_u64(sizes[i], EPF_ALIGN);
    if (sz < sizes[i] || off > UINT64_MAX / 2 - sz) return EPF_ERR_SIZE_OVERFLOW;
    p.region[i].offset = off;
    p.region[i].bytes = sizes[i];
    off += sz;
  }
  p.total_bytes = off;
  *out_plan = p;
  return EPF_OK;
}

/* epf_plan_check — the plan was computed by this build (e.g. a plan that crossed an FFI, or one
 *   from another library in the same process): its prefix (EPF_ERR_STRUCT_VERSION) and its
 *   build_signature (EPF_ERR_BUILD_MISMATCH: other EPF_MAX_* / EPF_ALIGN / versions) match. */
EPF_HD epf_status_t epf_plan_check(const epf_plan_t* plan) {
  epf_status_t st;
  if (plan == NULL) return EPF_ERR_INVALID_ARGUMENT;
  st = epf__check_prefix(plan->size, plan->magic, plan->version, EPF_PLAN_MAGIC,
                         (uint32_t)sizeof(epf_plan_t));
  if (st != EPF_OK) return st;
  return plan->build_signature == epf_build_signature() ? EPF_OK : EPF_ERR_BUILD_MISMATCH;
}

/* ---- accessors: index inside one region (the region's base comes from the plan) ------------- */

/* epf_plan_signal_offset — byte offset of uint64_t signal word `index` of a SIG_* region.
 *   `region` must be an epf_region_id_t below EPF_REGION_COUNT (it indexes plan->region). */
EPF_HD uint64_t epf_plan_signal_offset(const epf_plan_t* plan, epf_region_id_t region, int64_t index) {
  return plan->region[region].offset + (uint64_t)index * 8u;
}

/* epf_plan_counts_offset — count word number `index` published by `src` into buffer `parity`
 *   (a uint64 (epoch << 32 | count): the word carries the epoch of the update that wrote it):
 *   index in [0, E) is the (token, k) count of global expert `index`; index in [E, E + R) is the
 *   deduplicated token count for destination rank `index - E`. */
EPF_HD uint64_t epf_plan_counts_offset(const epf_plan_t* plan, int parity, int src, int index) {
  const uint64_t row = (uint64_t)plan->num_experts + (uint64_t)plan->nranks;
  return plan->region[EPF_REGION_COUNTS].offset +
         (((uint64_t)(parity & 1) * (uint64_t)plan->nranks + (uint64_t)src) * row + (uint64_t)index) * 8u;
}

/* epf_plan_recv_token_offset / _scale_offset / _meta_offset — row `row` of the receive region
 * (row in [0, rows of RECV_TOKENS)). The compact scale layout only; swizzled scales use
 * epf_scale_swizzle_offset (quant.cuh) relative to the RECV_SCALES base. */
EPF_HD uint64_t epf_plan_recv_token_offset(const epf_plan_t* plan, int64_t row) {
  return plan->region[EPF_REGION_RECV_TOKENS].offset + (uint64_t)row * plan->row_bytes;
}
EPF_HD uint64_t epf_plan_recv_scale_offset(const epf_plan_t* plan, int64_t row) {
  return plan->region[EPF_REGION_RECV_SCALES].offset + (uint64_t)row * plan->scale_bytes_per_row;
}
EPF_HD uint64_t epf_plan_recv_meta_offset(const epf_plan_t* plan, int64_t row) {
  return plan->region[EPF_REGION_RECV_META].offset + (uint64_t)row * plan->meta_bytes_per_row;
}

/* epf_plan_expert_out_offset — where the expert output of receive row `row` lives for an HT pull
 *   combine: in EXPERT_OUT (combine_row_bytes per row) when the plan has that region, else in
 *   place over the received BF16 row in RECV_TOKENS (both directions BF16). */
EPF_HD uint64_t epf_plan_expert_out_offset(const epf_plan_t* plan, int64_t row) {
  if (plan->region[EPF_REGION_EXPERT_OUT].bytes != 0)
    return plan->region[EPF_REGION_EXPERT_OUT].offset + (uint64_t)row * plan->combine_row_bytes;
  return plan->region[EPF_REGION_RECV_TOKENS].offset + (uint64_t)row * plan->row_bytes;
}

/* epf_plan_combine_offset — row `row` of the COMBINE landing region (push / LL combine). */
EPF_HD uint64_t epf_plan_combine_offset(const epf_plan_t* plan, int64_t row) {
  return plan->region[EPF_REGION_COMBINE].offset + (uint64_t)row * plan->combine_row_bytes;
}

/* epf_region_name — "HEADER", "SIG_COUNT", ... for diagnostics and docs. */
EPF_HD const char* epf_region_name(epf_region_id_t region) {
  switch (region) {
    case EPF_REGION_HEADER: return "HEADER";
    case EPF_REGION_SIG_COUNT: return "SIG_COUNT";
    case EPF_REGION_SIG_DISPATCH: return "SIG_DISPATCH";
    case EPF_REGION_SIG_COMBINE: return "SIG_COMBINE";
    case EPF_REGION_SIG_BARRIER: return "SIG_BARRIER";
    case EPF_REGION_SIG_LL_DISPATCH: return "SIG_LL_DISPATCH";
    case EPF_REGION_SIG_LL_COMBINE: return "SIG_LL_COMBINE";
    case EPF_REGION_COUNTS: return "COUNTS";
    case EPF_REGION_RECV_TOKENS: return "RECV_TOKENS";
    case EPF_REGION_RECV_SCALES: return "RECV_SCALES";
    case EPF_REGION_RECV_META: return "RECV_META";
    case EPF_REGION_COMBINE: return "COMBINE";
    case EPF_REGION_EXPERT_OUT: return "EXPERT_OUT";
    default: return "UNKNOWN";
  }
}

/* ============================================================================================ */
/* The error record (device writes, host reads without a device sync)                            */
/* ============================================================================================ */

/* One per rank (or per virtual-rank group), in host-mapped memory (cudaHostAlloc with
 * cudaHostAllocMapped; the device uses the mapped pointer), written by that one GPU only. Device code records the FIRST error
 * in full and counts all of them (signal.cuh: epf_error_report). The host reads it at any time
 * with epf_error_read; fields other than the counters mean something only when valid == 1. */
typedef struct epf_error_record {
  uint32_t status;      /* epf_status_t of the first error; 0 = none. Set once (CAS from 0). */
  uint32_t count;       /* how many errors were reported, the first included */
  uint32_t valid;       /* 1 once the diagnostic below describes `status` (release-stored last) */
  int32_t waiter_rank;  /* rank whose thread reported */
  int32_t waiter_block; /* blockIdx.x of the reporting thread */
  int32_t waiter_thread;/* threadIdx.x of the reporting thread */
  int32_t peer;         /* the rank it waited for, or -1 */
  uint32_t reserved;
  uint64_t address;     /* address of the word it waited on (device virtual address) */
  uint64_t wanted;      /* the epoch it wanted */
  uint64_t seen;        /* the value it last saw there */
  uint64_t elapsed_ns;  /* how long it waited */
  uint32_t dropped_routes; /* expert ids outside [-1, E) dropped by route blocks */
  uint32_t recv_overflow;  /* received rows dropped because recv_capacity was full */
  uint32_t masked_ranks;   /* how many times a peer was masked after a timeout */
  uint32_t reserved2;
} epf_error_record_t;

#if !defined(__CUDACC_RTC__) /* host functions (NVRTC compiles device code only) */
/* epf_error_read — copy the record the device writes, from the host, without a device sync.
 *   rec: the host pointer of host-mapped memory. Word-by-word volatile reads; `valid` is read
 *   first, so when out->valid == 1 the diagnostic fields belong to out->status. */
EPF_INLINE void epf_error_read(const epf_error_record_t* rec, epf_error_record_t* out) {
  const volatile epf_error_record_t* r = (const volatile epf_error_record_t*)rec;
  out->valid = r->valid;
  out->status = r->status;
  out->count = r->count;
  out->waiter_rank = r->waiter_rank;
  out->waiter_block = r->waiter_block;
  out->waiter_thread = r->waiter_thread;
  out->peer = r->peer;
  out->reserved = 0;
  out->address = r->address;
  out->wanted = r->wanted;
  out->seen = r->seen;
  out->elapsed_ns = r->elapsed_ns;
  out->dropped_routes = r->dropped_routes;
  out->recv_overflow = r->recv_overflow;
  out->masked_ranks = r->masked_ranks;
  out->reserved2 = 0;
}

/* epf_error_clear — zero the record from the host. Only while no kernel that may report into it
 *   is running (after a stream or event sync). */
EPF_INLINE void epf_error_clear(epf_error_record_t* rec) {
  volatile unsigned char* b = (volatile unsigned char*)rec;
  size_t n;
  for (n = 0; n < sizeof(*rec); ++n) b[n] = 0;
}
#endif

/* ============================================================================================ */
/* Route memory                                                                                  */
/* ============================================================================================ */

/* The route (the handle) is per-step routing state derived from topk_idx, kept in caller-provided
 * DEVICE memory (cudaMalloc; not the window). epf_route_layout_compute is the ONE function that
 * computes offsets inside a route buffer; device code and host code read the same
 * epf_route_layout_t. A route buffer holds no pointers (only offsets from its own start), so a
 * byte copy of it is a valid route buffer: epf_route_header_check validates the header a copy
 * starts with and rebuilds the layout (kernels_route.cuh: epf_route_import).
 *
 * Buffer = [header][arrays...], each array at a multiple of EPF_ALIGN from the buffer start.
 * With VIRTUAL RANKS a route group is `count` = nranks buffers back to back (buffer i at
 * base + i * total_bytes), one per virtual rank. docs/route.md has the data layout in full.
 *
 * Contents:
 *   EPF_ROUTE_CONFIG_INIT, epf_route_config_t, epf_index_type_t, EPF_ROUTE_FLAG_*
 *   epf_route_array_id_t, epf_route_header_t, epf_route_segment_t, epf_route_layout_t, epf_route_t
 *   epf_status_t epf_route_layout_compute(const epf_plan_t*, const epf_route_config_t*, epf_route_layout_t* out)
 *   epf_status_t epf_route_size(const epf_plan_t*, const epf_route_config_t*, uint64_t* out_bytes)
 *   void         epf_route_header_init(const epf_route_layout_t*, uint32_t epoch, epf_route_header_t* out)
 *   epf_status_t epf_route_header_check(const epf_route_header_t*, const epf_plan_t*, uint64_t buffer_bytes,
 *                                       epf_route_layout_t* out_layout)
 *   void*        epf_route_ptr(const epf_route_t*, int index, epf_route_array_id_t)   device address
 *   uint32_t*    epf_route_epoch_ptr(const epf_route_t*, int index)                   device address
 *   const char*  epf_route_array_name(epf_route_array_id_t)
 */

#define EPF_ROUTE_CONFIG_MAGIC 0x43525045u /* "EPRC" */
#define EPF_ROUTE_CONFIG_VERSION 1u
#define EPF_ROUTE_LAYOUT_MAGIC 0x4c525045u /* "EPRL" */
#define EPF_ROUTE_LAYOUT_VERSION 1u
#define EPF_ROUTE_MAGIC 0x54525045u /* "EPRT": the header every route buffer starts with */
#define EPF_ROUTE_VERSION 2u /* 2: SCRATCH holds count words (uint64) */
#define EPF_ROUTE_HANDLE_MAGIC 0x48525045u /* "EPRH" */
#define EPF_ROUTE_HANDLE_VERSION 1u

/* Blocks per rank an update may use (the scratch area holds one partial-count row per block). */
#define EPF_ROUTE_MAX_BLOCKS 64
#define EPF_ROUTE_DEFAULT_MAX_BLOCKS 32

/* Element type of topk_idx. Stored as int32_t in the structs below. */
typedef enum epf_index_type {
  EPF_INDEX_DEFAULT = 0, /* -> EPF_INDEX_INT64 (torch.int64, what DeepEP and NCCL EP take) */
  EPF_INDEX_INT32 = 1,
  EPF_INDEX_INT64 = 2
} epf_index_type_t;

/* route flags */
#define EPF_ROUTE_FLAG_LOCAL_ONLY 0x1u  /* no count exchange: counts, slots, is_token_in_rank only
                                           (forced for LL plans, whose receive slots are fixed) */
#define EPF_ROUTE_FLAG_NO_PAD_MARK 0x2u /* EXPERT_MAJOR with expert_alignment > 1: do not write the
                                           pad rows' metadata (src_token = -1) in RECV_META */
#define EPF_ROUTE_FLAGS_ALL 0x3u

/* Versioned public struct: zero fields mean "default"; initialize with EPF_ROUTE_CONFIG_INIT. */
typedef struct epf_route_config {
  uint32_t size;      /* sizeof(epf_route_config_t) as the caller compiled it */
  uint32_t magic;     /* EPF_ROUTE_CONFIG_MAGIC */
  uint32_t version;   /* EPF_ROUTE_CONFIG_VERSION */
  int32_t index_type; /* epf_index_type_t of topk_idx; 0 -> INT64 */
  int32_t top_k;      /* K of topk_idx [T, K]; 0 -> plan.top_k; 1..plan.top_k */
  int32_t max_tokens; /* T_max: rows of topk_idx an update may see; 0 -> plan.max_tokens_per_rank */
  int32_t max_blocks; /* most blocks per rank an update may use; 0 -> 32; 1..EPF_ROUTE_MAX_BLOCKS */
  uint32_t flags;     /* EPF_ROUTE_FLAG_* */
} epf_route_config_t;

#define EPF_ROUTE_CONFIG_INIT \
  {(uint32_t)sizeof(epf_route_config_t), EPF_ROUTE_CONFIG_MAGIC, EPF_ROUTE_CONFIG_VERSION, 0, 0, 0, 0, 0u}

/* The arrays of one route buffer, in address order. E = num_experts, R = nranks, EL = E / R,
 * T = max_tokens, K = top_k of the route. "exchange" = HT plan without EPF_ROUTE_FLAG_LOCAL_ONLY;
 * arrays that do not apply have 0 bytes (epf_route_ptr returns NULL for them). All int32 unless noted. */
typedef enum epf_route_array_id {
  EPF_ROUTE_HEADER = 0,      /* epf_route_header_t */
  EPF_ROUTE_EXPERT_COUNT,    /* [E] (token, k) pairs this rank routes to each global expert */
  EPF_ROUTE_RANK_COUNT,      /* [R] tokens this rank sends to each destination (deduplicated) */
  EPF_ROUTE_TOKEN_IN_RANK,   /* [T][R] uint8: 1 if token t has an expert on rank r */
  EPF_ROUTE_DST_RANK,        /* [T][K] destination rank of (t, k); -1 = not routed or dropped */
  EPF_ROUTE_SLOT,            /* [T][K] rank of (t, k) within its (source, expert) group in (t, k)
                                order; -1 = not routed or dropped */
  EPF_ROUTE_RM_SLOT,         /* RANK_MAJOR: [T][R] rank of token t among this rank's tokens to r,
                                in token order; -1 = t not sent to r */
  EPF_ROUTE_SEND_OFFSET,     /* exchange: [E] row of expert e's destination receive region where
                                THIS rank's group of e starts (expert-major view) */
  EPF_ROUTE_SEND_RM_OFFSET,  /* exchange, RANK_MAJOR: [R] row of rank d's receive region where
                                this rank's tokens start */
  EPF_ROUTE_RECV_SEGMENT,    /* exchange: [EL] epf_route_segment_t of this rank's local experts */
  EPF_ROUTE_RECV_SRC_OFFSET, /* exchange: [EL][R + 1] row where source s's group of local expert j
                                starts; [j][R] = segment end before padding (begin + count) */
  EPF_ROUTE_RECV_RM_OFFSET,  /* exchange, RANK_MAJOR: [R + 1] row where source s's tokens start;
                                [R] = total */
  EPF_ROUTE_SCRATCH,         /* [max_blocks][E + R + 1] uint64 count words (epoch << 32 | 1 << 31 | count): partial counts of the update's blocks */
  EPF_ROUTE_ARRAY_COUNT
} epf_route_array_id_t;

/* The header at offset 0 of every route buffer (device memory). The host writes it at init; the
 * update writes the "last update" fields and the epoch. Fixed layout (112 bytes). */
typedef struct epf_route_header {
  uint32_t size;           /* sizeof(epf_route_header_t) */
  uint32_t magic;          /* EPF_ROUTE_MAGIC */
  uint32_t version;        /* EPF_ROUTE_VERSION */
  uint32_t epoch;          /* epoch of the last update; the update adds 1 on the device */
  uint64_t config_hash;    /* plan.config_hash the buffer was laid out for */
  uint64_t total_bytes;    /* bytes of this buffer (epf_route_layout_t.total_bytes) */
  int32_t nranks;          /* plan.nranks */
  int32_t num_experts;     /* plan.num_experts */
  int32_t top_k;           /* K of the route */
  int32_t max_tokens;      /* T_max of the route */
  int32_t index_type;      /* epf_index_type_t (resolved) */
  int32_t max_blocks;      /* scratch rows */
  uint32_t flags;          /* EPF_ROUTE_FLAG_* (resolved: LOCAL_ONLY set for LL plans) */
  int32_t rank;            /* team rank of the last update; -1 before the first */
  int32_t num_tokens;      /* T of the last update (0 before the first) */
  uint32_t dropped_routes; /* ids outside [-1, E) dropped by the last update */
  uint32_t status;         /* epf_status_t of the last update (EPF_OK, or a wait's failure) */
  uint32_t reserved0;
  int64_t recv_rows;       /* exchange: rows this rank receives in the plan's layout (EM: padded) */
  int64_t recv_rows_em;    /* exchange: rows of the expert-major view (padded), either layout */
  int64_t recv_overflow;   /* exchange: max(0, recv_rows - plan.recv_capacity) */
  uint64_t barrier;        /* reserved (v0.1's block barrier word; v0.2 updates validate the epoch each scratch count carries) */
} epf_route_header_t;

/* One local expert's segment of the expert-major receive layout. */
typedef struct epf_route_segment {
  int32_t begin;        /* first row; a multiple of plan.expert_alignment */
  int32_t count;        /* rows received for this expert (all sources) */
  int32_t padded_count; /* count rounded up to plan.expert_alignment; rows [begin + count,
                           begin + padded_count) are pad rows */
  int32_t reserved;     /* 0 */
} epf_route_segment_t;

/* Where every array of one route buffer lives. Filled by epf_route_layout_compute only. */
typedef struct epf_route_layout {
  uint32_t size, magic, version; /* sizeof(epf_route_layout_t), EPF_ROUTE_LAYOUT_MAGIC, _VERSION */
  uint32_t flags;                /* resolved EPF_ROUTE_FLAG_* */
  int32_t nranks, num_experts, experts_per_rank, top_k, max_tokens, index_type;
  int32_t max_blocks, plan_layout, plan_mode, expert_alignment;
  int32_t exchange;              /* 1: the update exchanges counts and computes offsets */
  int32_t reserved0;
  int64_t recv_capacity;         /* plan.recv_capacity */
  uint64_t config_hash;          /* plan.config_hash */
  uint64_t total_bytes;          /* bytes of one route buffer; a multiple of EPF_ALIGN */
  epf_region_t array[EPF_ROUTE_ARRAY_COUNT];
} epf_route_layout_t;

/* The handle: a route group in device memory, as the host launchers and kernels see it (passed
 * by value into kernels). Filled by epf_route_init / epf_route_import (kernels_route.cuh). */
typedef struct epf_route {
  uint32_t size, magic, version; /* sizeof(epf_route_t), EPF_ROUTE_HANDLE_MAGIC, _VERSION */
  int32_t count;                 /* buffers: 1 (one real rank) or plan.nranks (virtual ranks) */
  void* base;                    /* device address of buffer 0 (EPF_ALIGN-aligned) */
  uint32_t* epoch_words;         /* NULL: each buffer's header epoch. Else device uint32[count]
                                    shared by several routes on one window (docs/route.md) */
  int32_t device;                /* CUDA device of the buffers */
  int32_t resident_blocks;       /* update blocks that can be co-resident on that device */
  epf_route_layout_t layout;
} epf_route_t;

/* epf_route_layout_compute — resolve `cfg` against `plan` and place every array of one route
 *   buffer at a multiple of EPF_ALIGN. The only function that computes route offsets.
 *   Statuses, in this order: EPF_ERR_INVALID_ARGUMENT (NULL), EPF_ERR_STRUCT_VERSION (plan or cfg
 *   prefix), plan fields out of range (EPF_ERR_RANKS / _EXPERTS / _EXPERTS_NOT_DIVISIBLE (also
 *   experts_per_rank != num_experts / nranks) / _TOPK / _TOKENS / _ALIGNMENT / _LAYOUT / _MODE),
 *   EPF_ERR_INVALID_ARGUMENT (index type), EPF_ERR_TOPK (top_k < 0 or > plan.top_k),
 *   EPF_ERR_TOKENS (max_tokens < 0 or > plan.max_tokens_per_rank), EPF_ERR_INVALID_ARGUMENT
 *   (max_blocks < 0 or > EPF_ROUTE_MAX_BLOCKS), EPF_ERR_FLAGS, EPF_ERR_SIZE_OVERFLOW (with the
 *   count exchange, receive rows could pass INT32_MAX: nranks * max_tokens_per_rank * top_k +
 *   experts_per_rank * (expert_alignment - 1) of the plan; or the buffer passes 2^62 bytes).
 *   On error *out_layout is zeroed (size/magic/version set).
 *   Scope: any thread, host or device. Pure. */
EPF_HD epf_status_t epf_route_layout_compute(const epf_plan_t* plan, const epf_route_config_t* cfg,
                                             epf_route_layout_t* out_layout) {
  epf_route_layout_t L;
  epf_status_t st;
  uint64_t R, E, EL, T, K, B, sizes[EPF_ROUTE_ARRAY_COUNT], off, worst;
  int i, rm;
  if (plan == NULL || cfg == NULL || out_layout == NULL) return EPF_ERR_INVALID_ARGUMENT;
  epf__zero_bytes(&L, sizeof(L));
  L.size = (uint32_t)sizeof(epf_route_layout_t);
  L.magic = EPF_ROUTE_LAYOUT_MAGIC;
  L.version = EPF_ROUTE_LAYOUT_VERSION;
  *out_layout = L;
  st = epf_plan_check(plan);
  if (st != EPF_OK) return st;
  st = epf__check_prefix(cfg->size, cfg->magic, cfg->version, EPF_ROUTE_CONFIG_MAGIC,
                         (uint32_t)sizeof(epf_route_config_t));
  if (st != EPF_OK) return st;
  /* the plan may have crossed an FFI: re-check what the arithmetic below relies on */
  if (plan->nranks < 1 || plan->nranks > EPF_MAX_RANKS) return EPF_ERR_RANKS;
  if (plan->num_experts < 1 || plan->num_experts > EPF_MAX_EXPERTS) return EPF_ERR_EXPERTS;
  if (plan->num_experts % plan->nranks != 0 || plan->experts_per_rank != plan->num_experts / plan->nranks)
    return EPF_ERR_EXPERTS_NOT_DIVISIBLE;
  if (plan->top_k < 1 || plan->top_k > EPF_MAX_TOPK) return EPF_ERR_TOPK;
  if (plan->max_tokens_per_rank < 1 || plan->max_tokens_per_rank > EPF_MAX_TOKENS_PER_RANK) return EPF_ERR_TOKENS;
  if (plan->expert_alignment < 1 || plan->expert_alignment > 1024 ||
      (plan->expert_alignment & (plan->expert_alignment - 1)) != 0)
    return EPF_ERR_ALIGNMENT;
  if (plan->layout != EPF_LAYOUT_EXPERT_MAJOR && plan->layout != EPF_LAYOUT_RANK_MAJOR) return EPF_ERR_LAYOUT;
  if (plan->mode != EPF_MODE_HT && plan->mode != EPF_MODE_LL) return EPF_ERR_MODE;

  L.index_type = cfg->index_type == EPF_INDEX_DEFAULT ? EPF_INDEX_INT64 : cfg->index_type;
  if (L.index_type != EPF_INDEX_INT32 && L.index_type != EPF_INDEX_INT64) return EPF_ERR_INVALID_ARGUMENT;
  L.top_k = cfg->top_k == 0 ? plan->top_k : cfg->top_k;
  if (L.top_k < 1 || L.top_k > plan->top_k) return EPF_ERR_TOPK;
  L.max_tokens = cfg->max_tokens == 0 ? plan->max_tokens_per_rank : cfg->max_tokens;
  if (L.max_tokens < 1 || L.max_tokens > plan->max_tokens_per_rank) return EPF_ERR_TOKENS;
  L.max_blocks = cfg->max_blocks == 0 ? EPF_ROUTE_DEFAULT_MAX_BLOCKS : cfg->max_blocks;
  if (L.max_blocks < 1 || L.max_blocks > EPF_ROUTE_MAX_BLOCKS) return EPF_ERR_INVALID_ARGUMENT;
  if ((cfg->flags & ~EPF_ROUTE_FLAGS_ALL) != 0u) return EPF_ERR_FLAGS;
  L.flags = cfg->flags | (plan->mode == EPF_MODE_LL ? EPF_ROUTE_FLAG_LOCAL_ONLY : 0u);

  L.nranks = plan->nranks;
  L.num_experts = plan->num_experts;
  L.experts_per_rank = plan->experts_per_rank;
  L.plan_layout = plan->layout;
  L.plan_mode = plan->mode;
  L.expert_alignment = plan->expert_alignment;
  L.exchange = (L.flags & EPF_ROUTE_FLAG_LOCAL_ONLY) == 0u ? 1 : 0;
  L.recv_capacity = plan->recv_capacity;
  L.config_hash = plan->config_hash;

  R = (uint64_t)L.nranks;
  E = (uint64_t)L.num_experts;
  EL = (uint64_t)L.experts_per_rank;
  T = (uint64_t)L.max_tokens;
  K = (uint64_t)L.top_k;
  B = (uint64_t)L.max_blocks;
  rm = plan->layout == EPF_LAYOUT_RANK_MAJOR;
  /* offsets are int32: the most rows any rank can be sent (every peer at the plan's limits) */
  worst = R * (uint64_t)plan->max_tokens_per_rank * (uint64_t)plan->top_k +
          EL * (uint64_t)(plan->expert_alignment - 1);
  if (L.exchange && worst > (uint64_t)INT32_MAX) return EPF_ERR_SIZE_OVERFLOW;

  for (i = 0; i < EPF_ROUTE_ARRAY_COUNT; ++i) sizes[i] = 0;
  sizes[EPF_ROUTE_HEADER] = sizeof(epf_route_header_t);
  sizes[EPF_ROUTE_EXPERT_COUNT] = E * 4u;
  sizes[EPF_ROUTE_RANK_COUNT] = R * 4u;
  sizes[EPF_ROUTE_TOKEN_IN_RANK] = T * R;
  sizes[EPF_ROUTE_DST_RANK] = T * K * 4u;
  sizes[EPF_ROUTE_SLOT] = T * K * 4u;
  sizes[EPF_ROUTE_RM_SLOT] = rm ? T * R * 4u : 0u;
  if (L.exchange) {
    sizes[EPF_ROUTE_SEND_OFFSET] = E * 4u;
    sizes[EPF_ROUTE_SEND_RM_OFFSET] = rm ? R * 4u : 0u;
    sizes[EPF_ROUTE_RECV_SEGMENT] = EL * sizeof(epf_route_segment_t);
    sizes[EPF_ROUTE_RECV_SRC_OFFSET] = EL * (R + 1u) * 4u;
    sizes[EPF_ROUTE_RECV_RM_OFFSET] = rm ? (R + 1u) * 4u : 0u;
  }
  sizes[EPF_ROUTE_SCRATCH] = B * (E + R + 1u) * 8u;

  off = 0;
  for (i = 0; i < EPF_ROUTE_ARRAY_COUNT; ++i) {
    uint64_t sz = epf__align_up_u64(sizes[i], EPF_ALIGN);
    if (sizes[i] > ((uint64_t)1 << 62) || off > ((uint64_t)1 << 62) - sz) return EPF_ERR_SIZE_OVERFLOW;
    L.array[i].offset = off;
    L.array[i].bytes = sizes[i];
    off += sz;
  }
  L.total_bytes = off;
  *out_layout = L;
  return EPF_OK;
}

/* epf_route_size — bytes of one route buffer (allocate count * this, EPF_ALIGN-aligned).
 *   Statuses: those of epf_route_layout_compute; *out_bytes = 0 on error. Pure. */
EPF_HD epf_status_t epf_route_size(const epf_plan_t* plan, const epf_route_config_t* cfg, uint64_t* out_bytes) {
  epf_route_layout_t L;
  epf_status_t st;
  if (out_bytes == NULL) return EPF_ERR_INVALID_ARGUMENT;
  st = epf_route_layout_compute(plan, cfg, &L);
  *out_bytes = st == EPF_OK ? L.total_bytes : 0u;
  return st;
}

/* epf_route_header_init — the header a fresh buffer of `layout` starts with, at `epoch` (the
 *   epoch of the window's last count exchange; 0 for a fresh, zeroed window). Pure. */
EPF_HD void epf_route_header_init(const epf_route_layout_t* layout, uint32_t epoch, epf_route_header_t* out) {
  epf__zero_bytes(out, sizeof(*out));
  out->size = (uint32_t)sizeof(epf_route_header_t);
  out->magic = EPF_ROUTE_MAGIC;
  out->version = EPF_ROUTE_VERSION;
  out->epoch = epoch;
  out->config_hash = layout->config_hash;
  out->total_bytes = layout->total_bytes;
  out->nranks = layout->nranks;
  out->num_experts = layout->num_experts;
  out->top_k = layout->top_k;
  out->max_tokens = layout->max_tokens;
  out->index_type = layout->index_type;
  out->max_blocks = layout->max_blocks;
  out->flags = layout->flags;
  out->rank = -1;
  out->barrier = (uint64_t)epoch << 32;
}

/* epf_route_header_check — validate the header of a route buffer (e.g. one copied from elsewhere,
 *   read back to the host) against `plan`, and rebuild its layout from the state it records
 *   (T_max, K, index type, max blocks, flags). buffer_bytes: bytes available at that buffer.
 *   Statuses, in this order: EPF_ERR_INVALID_ARGUMENT (NULL), EPF_ERR_STRUCT_VERSION (size, magic,
 *   version of the header or plan), EPF_ERR_CONFIG_MISMATCH (laid out for another plan: hash,
 *   ranks or experts differ), the statuses of epf_route_layout_compute for the recorded state (a
 *   recorded 0 is a bad value there, not a default), EPF_ERR_CONFIG_MISMATCH (recorded total_bytes
 *   or flags differ from the rebuilt layout's),
 *   EPF_ERR_INVALID_ARGUMENT (buffer_bytes < total_bytes), EPF_ERR_TOKENS (num_tokens outside
 *   [0, max_tokens]), EPF_ERR_RANK (rank outside [-1, nranks)). Pure. */
EPF_HD epf_status_t epf_route_header_check(const epf_route_header_t* hdr, const epf_plan_t* plan,
                                           uint64_t buffer_bytes, epf_route_layout_t* out_layout) {
  epf_route_config_t cfg = EPF_ROUTE_CONFIG_INIT;
  epf_route_layout_t L;
  epf_status_t st;
  if (hdr == NULL || plan == NULL || out_layout == NULL) return EPF_ERR_INVALID_ARGUMENT;
  if (hdr->magic != EPF_ROUTE_MAGIC || hdr->version != EPF_ROUTE_VERSION ||
      hdr->size != (uint32_t)sizeof(epf_route_header_t))
    return EPF_ERR_STRUCT_VERSION;
  st = epf_plan_check(plan);
  if (st != EPF_OK) return st;
  if (hdr->config_hash != plan->config_hash || hdr->nranks != plan->nranks ||
      hdr->num_experts != plan->num_experts)
    return EPF_ERR_CONFIG_MISMATCH;
  cfg.index_type = hdr->index_type == EPF_INDEX_DEFAULT ? -1 : hdr->index_type; /* resolved: never 0 */
  cfg.top_k = hdr->top_k == 0 ? -1 : hdr->top_k;
  cfg.max_tokens = hdr->max_tokens == 0 ? -1 : hdr->max_tokens;
  cfg.max_blocks = hdr->max_blocks == 0 ? -1 : hdr->max_blocks;
  cfg.flags = hdr->flags;
  st = epf_route_layout_compute(plan, &cfg, &L);
  if (st != EPF_OK) return st;
  if (L.total_bytes != hdr->total_bytes || L.flags != hdr->flags) return EPF_ERR_CONFIG_MISMATCH;
  if (buffer_bytes < L.total_bytes) return EPF_ERR_INVALID_ARGUMENT;
  if (hdr->num_tokens < 0 || hdr->num_tokens > hdr->max_tokens) return EPF_ERR_TOKENS;
  if (hdr->rank < -1 || hdr->rank >= hdr->nranks) return EPF_ERR_RANK;
  *out_layout = L;
  return EPF_OK;
}

/* epf_route_ptr — device address of array `id` of buffer `index` (0 for a real rank; the virtual
 *   rank for virtual ranks), or NULL when the array has no bytes in this layout. Pure pointer
 *   arithmetic: host or device. index in [0, route->count), id below EPF_ROUTE_ARRAY_COUNT. */
EPF_HD void* epf_route_ptr(const epf_route_t* route, int index, epf_route_array_id_t id) {
  if (route->layout.array[id].bytes == 0) return NULL;
  return (char*)route->base + (uint64_t)index * route->layout.total_bytes + route->layout.array[id].offset;
}

/* epf_route_epoch_ptr — device address of the epoch word of buffer `index`: after an update it
 *   holds that step's epoch, which dispatch and combine of the same step use. */
EPF_HD uint32_t* epf_route_epoch_ptr(const epf_route_t* route, int index) {
  if (route->epoch_words != NULL) return route->epoch_words + index;
  return &((epf_route_header_t*)epf_route_ptr(route, index, EPF_ROUTE_HEADER))->epoch;
}

/* epf_route_array_name — "EXPERT_COUNT", "SLOT", ... for diagnostics and docs. */
EPF_HD const char* epf_route_array_name(epf_route_array_id_t id) {
  switch (id) {
    case EPF_ROUTE_HEADER: return "HEADER";
    case EPF_ROUTE_EXPERT_COUNT: return "EXPERT_COUNT";
    case EPF_ROUTE_RANK_COUNT: return "RANK_COUNT";
    case EPF_ROUTE_TOKEN_IN_RANK: return "TOKEN_IN_RANK";
    case EPF_ROUTE_DST_RANK: return "DST_RANK";
    case EPF_ROUTE_SLOT: return "SLOT";
    case EPF_ROUTE_RM_SLOT: return "RM_SLOT";
    case EPF_ROUTE_SEND_OFFSET: return "SEND_OFFSET";
    case EPF_ROUTE_SEND_RM_OFFSET: return "SEND_RM_OFFSET";
    case EPF_ROUTE_RECV_SEGMENT: return "RECV_SEGMENT";
    case EPF_ROUTE_RECV_SRC_OFFSET: return "RECV_SRC_OFFSET";
    case EPF_ROUTE_RECV_RM_OFFSET: return "RECV_RM_OFFSET";
    case EPF_ROUTE_SCRATCH: return "SCRATCH";
    default: return "UNKNOWN";
  }
}

EPF_END_DECLS

#endif /* EPF_HOST_H */
/* SPDX-License-Identifier: Apache-2.0 */
