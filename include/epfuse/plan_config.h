/* epfuse/plan_config.h — the configuration a plan is computed from, and its rules — part of epfuse v0.1
 *
 * What it is: the configuration a window plan is computed from (epf_config_t: team size, experts,
 * top-k, hidden size, tokens, mode, layout, payloads, alignment, capacity, timeout), its
 * enumerations and flags, and the rules: epf_config_resolve fills the zero ("default") fields,
 * epf_config_validate checks every limit, epf_config_hash names a resolved config for the setup
 * handshake. Plain C11, also C++17 and CUDA (EPF_HD: host and device); part of host.h.
 *
 * What it does NOT do: lay out memory (plan.h), allocate or call CUDA.
 *
 * Contents:
 *   EPF_CONFIG_INIT, epf_config_t, epf_mode_t, epf_layout_t, epf_payload_t, epf_scale_layout_t,
 *   EPF_FLAG_*, EPF_DEFAULT_*, EPF_MAX_HIDDEN
 *   epf_status_t epf_config_resolve(const epf_config_t* in, epf_config_t* out_resolved)
 *   epf_status_t epf_config_validate(const epf_config_t* resolved)
 *   uint64_t     epf_config_hash(const epf_config_t* resolved)         0 for NULL
 *   int64_t      epf_config_worst_case_rows(const epf_config_t* resolved)   HT rows that never overflow (-1: invalid)
 *   int          epf_payload_vector_width(int payload)     hidden must be a multiple of this
 *
 * Requirements: C11 or C++17. No CUDA, no NCCL.
 */
#ifndef EPF_PLAN_CONFIG_H
#define EPF_PLAN_CONFIG_H

#include "config.h"
#include "status.h"
#include "version.h"

EPF_BEGIN_DECLS

/* ============================================================================================ */
/* Configuration                                                                                 */
/* ============================================================================================ */

#define EPF_CONFIG_MAGIC 0x43465045u /* "EPFC" little-endian */
#define EPF_CONFIG_VERSION 1u

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
  EPF_SCALE_LAYOUT_DEFAULT = 0,         /* -> EPF_SCALE_LAYOUT_COMPACT */
  EPF_SCALE_LAYOUT_COMPACT = 1,         /* row-major [rows, hidden / group] */
  EPF_SCALE_LAYOUT_SWIZZLED_128X4 = 2,  /* Blackwell block-scaled GEMM atoms (MXFP8 only) */
  EPF_SCALE_LAYOUT_SEGMENT_MN_MAJOR = 3 /* per-128 FP8, HT EXPERT_MAJOR, expert_alignment >= 8:
                                           each expert segment's scales as its own FP32 matrix
                                           [hidden / 128][padded_count] (row index contiguous),
                                           starting at scale element begin * hidden / 128 — the
                                           per-128 activation scales a Hopper GEMM reads in place
                                           (cuBLASLt VEC128_32F); docs/quant.md */
} epf_scale_layout_t;

/* flags */
#define EPF_FLAG_FAULT_TOLERANT 0x1u  /* bounded waits mask late peers instead of failing */
#define EPF_FLAG_COMBINE_PUSH 0x2u    /* HT combine, and the LL combine with an MXFP8 combine payload:
                                         expert side stores into the source's window (no
                                         EXPERT_OUT region; the default is pull) */
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

/* ---- the rules of the shape fields, one function each ------------------------------------------
 * epf_config_validate checks a config with them; epf_route_layout_compute (route_layout.h)
 * re-checks a plan's copy of the same fields with them (a plan may have crossed an FFI). Each
 * returns EPF_OK or the status of its rule. Scope: any thread, host or device. Pure. */

/* mode: HT or LL (resolved) -> EPF_ERR_MODE */
EPF_HD epf_status_t epf__config_check_mode(int mode) {
  return mode == EPF_MODE_HT || mode == EPF_MODE_LL ? EPF_OK : EPF_ERR_MODE;
}

/* layout: EXPERT_MAJOR or RANK_MAJOR (resolved) -> EPF_ERR_LAYOUT */
EPF_HD epf_status_t epf__config_check_layout(int layout) {
  return layout == EPF_LAYOUT_EXPERT_MAJOR || layout == EPF_LAYOUT_RANK_MAJOR ? EPF_OK : EPF_ERR_LAYOUT;
}

/* team, in this order: 1 <= nranks <= EPF_MAX_RANKS (EPF_ERR_RANKS), 1 <= num_experts <=
 * EPF_MAX_EXPERTS (EPF_ERR_EXPERTS), num_experts a multiple of nranks
 * (EPF_ERR_EXPERTS_NOT_DIVISIBLE) */
EPF_HD epf_status_t epf__config_check_team(int nranks, int num_experts) {
  if (nranks < 1 || nranks > EPF_MAX_RANKS) return EPF_ERR_RANKS;
  if (num_experts < 1 || num_experts > EPF_MAX_EXPERTS) return EPF_ERR_EXPERTS;
  if (num_experts % nranks != 0) return EPF_ERR_EXPERTS_NOT_DIVISIBLE;
  return EPF_OK;
}

/* 1 <= top_k <= EPF_MAX_TOPK -> EPF_ERR_TOPK */
EPF_HD epf_status_t epf__config_check_top_k(int top_k) {
  return top_k >= 1 && top_k <= EPF_MAX_TOPK ? EPF_OK : EPF_ERR_TOPK;
}

/* 1 <= max_tokens_per_rank <= EPF_MAX_TOKENS_PER_RANK -> EPF_ERR_TOKENS */
EPF_HD epf_status_t epf__config_check_tokens(int max_tokens_per_rank) {
  return max_tokens_per_rank >= 1 && max_tokens_per_rank <= EPF_MAX_TOKENS_PER_RANK ? EPF_OK : EPF_ERR_TOKENS;
}

/* scale layout (payload, mode, layout resolved) -> EPF_ERR_SCALE_LAYOUT: COMPACT any payload;
 * SWIZZLED_128X4 MXFP8 only; SEGMENT_MN_MAJOR FP8_128 only, HT EXPERT_MAJOR only, and an
 * expert_alignment of at least 8 rows (a segment's rows are a GEMM operand's outer dimension,
 * which cuBLASLt's per-128 block scaling wants a multiple of 8; it also puts every segment's
 * scale matrix at a 16-byte boundary). An invalid alignment is left to the alignment rule. */
EPF_HD epf_status_t epf__config_check_scale_layout(int scale_layout, int payload, int mode, int layout,
                                                   int expert_alignment) {
  switch (scale_layout) {
    case EPF_SCALE_LAYOUT_COMPACT: return EPF_OK;
    case EPF_SCALE_LAYOUT_SWIZZLED_128X4: return payload == EPF_PAYLOAD_MXFP8 ? EPF_OK : EPF_ERR_SCALE_LAYOUT;
    case EPF_SCALE_LAYOUT_SEGMENT_MN_MAJOR:
      if (payload != EPF_PAYLOAD_FP8_128 || mode != EPF_MODE_HT || layout != EPF_LAYOUT_EXPERT_MAJOR)
        return EPF_ERR_SCALE_LAYOUT;
      return expert_alignment >= 1 && expert_alignment < 8 && (expert_alignment & (expert_alignment - 1)) == 0
                 ? EPF_ERR_SCALE_LAYOUT
                 : EPF_OK;
    default: return EPF_ERR_SCALE_LAYOUT;
  }
}

/* expert_alignment a power of two in [1, 1024] -> EPF_ERR_ALIGNMENT */
EPF_HD epf_status_t epf__config_check_alignment(int expert_alignment) {
  return expert_alignment >= 1 && expert_alignment <= 1024 && (expert_alignment & (expert_alignment - 1)) == 0
             ? EPF_OK
             : EPF_ERR_ALIGNMENT;
}

/* epf_config_validate — check every limit of an already resolved config (no zero defaults left).
 *   Returns the status of the first violated rule, in this order: prefix, reserved0 != 0
 *   (EPF_ERR_INVALID_ARGUMENT), mode, layout, payloads, scale layout, flags, ranks, experts,
 *   divisibility, top-k (EPF_ERR_TOPK: outside [1, EPF_MAX_TOPK]; above num_experts is legal: a
 *   token's ids then repeat, and repeats are defined inputs), hidden, hidden alignment, tokens, alignment, receive capacity.
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
  if ((st = epf__config_check_mode(c->mode)) != EPF_OK) return st;
  if ((st = epf__config_check_layout(c->layout)) != EPF_OK) return st;
  if (epf_payload_vector_width(c->payload) == 0) return EPF_ERR_PAYLOAD;
  if (c->combine_payload != EPF_PAYLOAD_BF16 && c->combine_payload != EPF_PAYLOAD_MXFP8)
    return EPF_ERR_PAYLOAD;
  if ((st = epf__config_check_scale_layout(c->scale_layout, c->payload, c->mode, c->layout,
                                            c->expert_alignment)) != EPF_OK)
    return st;
  if ((c->flags & ~EPF_FLAGS_ALL) != 0u) return EPF_ERR_FLAGS;
  if ((st = epf__config_check_team(c->nranks, c->num_experts)) != EPF_OK) return st;
  if ((st = epf__config_check_top_k(c->top_k)) != EPF_OK) return st;
  if (c->hidden < 1 || c->hidden > EPF_MAX_HIDDEN) return EPF_ERR_HIDDEN;
  width = epf__max_i(epf_payload_vector_width(c->payload),
                     epf_payload_vector_width(c->combine_payload));
  if (c->hidden % width != 0) return EPF_ERR_HIDDEN_ALIGNMENT;
  if ((st = epf__config_check_tokens(c->max_tokens_per_rank)) != EPF_OK) return st;
  if ((st = epf__config_check_alignment(c->expert_alignment)) != EPF_OK) return st;
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
 * (expert_alignment - 1)), or one unpadded copy each (RANK_MAJOR: R * T). Reads only the fields
 * it needs, which must be valid: EPF_ROW_INVALID (-1) for NULL, or when nranks / num_experts
 * (epf__config_check_team), top_k, max_tokens_per_rank, expert_alignment or layout break their
 * rule (an unresolved config with zero defaults, say: nothing is divided by zero).
 * Scope: any thread, host or device. Pure. */
EPF_HD int64_t epf_config_worst_case_rows(const epf_config_t* c) {
  int64_t local, copies, pad;
  if (c == NULL || epf__config_check_team(c->nranks, c->num_experts) != EPF_OK ||
      epf__config_check_top_k(c->top_k) != EPF_OK || epf__config_check_tokens(c->max_tokens_per_rank) != EPF_OK ||
      epf__config_check_alignment(c->expert_alignment) != EPF_OK || epf__config_check_layout(c->layout) != EPF_OK)
    return EPF_ROW_INVALID;
  local = c->num_experts / c->nranks;
  copies = c->layout == EPF_LAYOUT_RANK_MAJOR ? 1 : (int64_t)epf__min_i(c->top_k, (int)local);
  pad = c->layout == EPF_LAYOUT_RANK_MAJOR ? 0 : local * (int64_t)(c->expert_alignment - 1);
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
 * (not timeout_ns), the library's major version and EPF_CONFIG_SIGNATURE. Never 0 for a config;
 * 0 (the hash sentinel) for NULL. Ranks exchange it in the setup handshake (core/signal.cuh). Input: a
 * resolved config. Scope: any thread, host or device. Pure. */
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
  if (c == NULL) return 0u;
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

EPF_END_DECLS

#endif /* EPF_PLAN_CONFIG_H */
/* SPDX-License-Identifier: Apache-2.0 */
