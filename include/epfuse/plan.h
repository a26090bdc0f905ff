/* epfuse/plan.h — the window plan: regions, offsets, the build signature — part of epfuse v0.1
 *
 * What it is: the window plan. epf_plan_compute turns an epf_config_t (plan_config.h) into an
 * epf_plan_t: the byte offset and size of every region of one rank's slice of the symmetric
 * window. The plan is the ONE place where epfuse does window offset arithmetic; device code
 * receives the same struct by value and reads offsets out of it (the epf_plan_*_offset accessors
 * index inside one region). A plan carries the signature of the build that computed it, so a plan
 * from a build with other limits is refused (epf_plan_check). Plain C11, also C++17 and CUDA;
 * part of host.h.
 *
 * What it does NOT do: allocate, call CUDA or NCCL, launch kernels.
 *
 * Contents:
 *   EPF_PLAN_MAGIC, EPF_PLAN_VERSION
 *   epf_region_id_t, epf_region_t, epf_plan_t, epf_window_header_t, EPF_HEADER_BYTES
 *   epf_recv_meta_em_t, epf_recv_meta_rm_t                  receive metadata rows
 *   epf_recv_meta_em_t epf_recv_meta_em_make(src_token, src_rank, k, local_expert, weight)
 *   uint32_t     epf_recv_meta_rm_bytes / _expert_at / _weight_at / _slot_at(int top_k[, int j])
 *   uint32_t     epf_combine_row_scale_at(int hidden, int elem)   an MXFP8 combine row's scale byte
 *   uint64_t     epf_build_signature(void)                 this build's compile-time configuration
 *   epf_status_t epf_plan_compute(const epf_config_t* cfg, epf_plan_t* out_plan)
 *   epf_status_t epf_plan_check(const epf_plan_t* plan)    prefix + build check (host or FFI)
 *   uint64_t     epf_plan_signal_offset(const epf_plan_t*, epf_region_id_t, int64_t index)
 *   uint64_t     epf_plan_counts_offset(const epf_plan_t*, int parity, int src, int index)
 *   uint64_t     epf_plan_recv_token_offset / _scale_offset / _meta_offset(const epf_plan_t*, int64_t row)
 *   int          epf_plan_scales_staged(const epf_plan_t*)  GEMM-ready scales go through stage rows
 *   uint64_t     epf_plan_recv_scale_stage_offset(const epf_plan_t*, int64_t row)  a row's stage run
 *   uint64_t     epf_plan_expert_out_offset / epf_plan_combine_offset(const epf_plan_t*, int64_t row)
 *                (the accessors: EPF_OFFSET_INVALID for a NULL plan or an id out of range)
 *   const char*  epf_region_name(epf_region_id_t)
 *
 * Requirements: C11 or C++17. No CUDA, no NCCL.
 */
#ifndef EPF_PLAN_H
#define EPF_PLAN_H

#include "config.h"
#include "status.h"
#include "version.h"
#include "plan_config.h"

EPF_BEGIN_DECLS

/* ============================================================================================ */
/* The window plan                                                                               */
/* ============================================================================================ */

#define EPF_PLAN_MAGIC 0x4c504645u /* "EFPL" */
#define EPF_PLAN_VERSION 3u /* 2: build_signature; 3: staged GEMM-ready scales (epf_plan_scales_staged) */

/* The regions of one rank's window slice, in address order. Every rank has the same plan, so
 * (window, offset, peer) names the same region on every peer. Signals are uint64_t words. */
/* The regions of one rank's slice, in window order: X(name, comment). One list makes the enum and
 * epf_region_name (as status.h does for the statuses). Values are ABI: append only. */
#define EPF_REGION_LIST(X)                                                                          \
  X(HEADER, "epf_window_header_t; offset 0, size fixed (EPF_HEADER_BYTES)")                        \
  X(SIG_COUNT, "[R] one word per source: LL mask-clean rendezvous (the HT count exchange needs "   \
               "no signal: every COUNTS word carries its epoch)")                                  \
  X(SIG_DISPATCH, "[R] HT dispatch arrival, one per source")                                       \
  X(SIG_COMBINE, "[R] combine arrival, one per peer")                                              \
  X(SIG_BARRIER, "[R] team barrier, one per peer")                                                 \
  X(SIG_LL_DISPATCH, "LL: [2 parity][experts_per_rank][R] epoch|count (RM: the first [2][R])")    \
  X(SIG_LL_COMBINE, "LL: [2 parity][R]")                                                           \
  X(COUNTS, "[2 parity][R source][E + R] uint64 count words (epoch << 32 | 1 << 31 | count): "     \
            "per-expert, then per-rank counts (LL RM: the per-expert copies of each source)")      \
  X(RECV_TOKENS, "HT: [recv_capacity] rows; LL: [2][E_local][R][T] (EM) or [2][R][T] (RM)")        \
  X(RECV_SCALES, "the rows' scales (compact, swizzled or segment MN-major; GEMM-ready layouts then "  \
    "one compact stage run per row, epf_plan_scales_staged); 0 bytes for BF16")                    \
  X(RECV_META, "the rows' metadata (epf_recv_meta_* layout, meta_bytes_per_row)")                  \
  X(COMBINE, "combine landing area at the source (push / LL); else 0 bytes")                       \
  X(EXPERT_OUT, "HT pull combine: expert outputs (combine_payload rows) in the receive row "       \
                "order, unless both directions are BF16 (then the outputs overwrite RECV_TOKENS "  \
                "in place and this is 0 bytes); LL expert-major MXFP8 pull combine: the "          \
                "quantized outputs, [2 parity][E_local][R][T] rows like RECV_TOKENS")

#define EPF__REGION_ENUM_ITEM(name, comment) EPF_REGION_##name,
typedef enum epf_region_id { EPF_REGION_LIST(EPF__REGION_ENUM_ITEM) EPF_REGION_COUNT } epf_region_id_t;

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

/* epf_recv_meta_em_make — THE expert-major metadata row, as every writer fills it (the library's
 *   dispatches, the tests' references). src_rank and k are stored in 16 bits (both are below
 *   EPF_MAX_RANKS and EPF_MAX_TOP_K). Scope: any thread. Pure. */
EPF_HD epf_recv_meta_em_t epf_recv_meta_em_make(int src_token, int src_rank, int k, int local_expert, float weight) {
  epf_recv_meta_em_t m;
  m.src_token = src_token;
  m.src_rank = (int16_t)src_rank;
  m.k = (int16_t)k;
  m.local_expert = local_expert;
  m.weight = weight;
  return m;
}

/* epf_combine_row_scale_at — THE MXFP8 combine row (combine_payload MXFP8, in COMBINE, EXPERT_OUT
 *   and the rank-major partials): `hidden` E4M3 bytes, then one E8M0 scale byte per 32 elements,
 *   padded to 16 bytes (plan.combine_row_bytes); this is the byte offset of element `elem`'s scale
 *   in the row. Scope: any thread. Pure. */
EPF_HD uint32_t epf_combine_row_scale_at(int hidden, int elem) { return (uint32_t)hidden + (uint32_t)elem / 32u; }

/* The rank-major metadata row — THE owner of its layout (the plan sizes it, the dispatch writes it,
 *   the expand and the pre-reduce read it, the tests' references rebuild it, all through these):
 *   an epf_recv_meta_rm_t header, then top_k int32 local expert ids, top_k float weights and top_k
 *   int32 expert-major slots, padded to 16 bytes. Entry j of the three lists describes the j-th of
 *   the token's top-k entries that live on the receiving rank, in k order.
 *     epf_recv_meta_rm_bytes(K)        bytes of one row
 *     epf_recv_meta_rm_expert_at(K, j) byte offset of entry j's local expert id in the row
 *     epf_recv_meta_rm_weight_at(K, j) byte offset of entry j's weight
 *     epf_recv_meta_rm_slot_at(K, j)   byte offset of entry j's slot
 *   Scope: any thread. Pure. */
EPF_HD uint32_t epf_recv_meta_rm_bytes(int top_k) {
  return (uint32_t)epf__align_up_u64(sizeof(epf_recv_meta_rm_t) + (uint64_t)top_k * 12u, 16u);
}
EPF_HD uint32_t epf_recv_meta_rm_expert_at(int top_k, int j) {
  (void)top_k;
  return (uint32_t)sizeof(epf_recv_meta_rm_t) + 4u * (uint32_t)j;
}
EPF_HD uint32_t epf_recv_meta_rm_weight_at(int top_k, int j) {
  return (uint32_t)sizeof(epf_recv_meta_rm_t) + 4u * (uint32_t)(top_k + j);
}
EPF_HD uint32_t epf_recv_meta_rm_slot_at(int top_k, int j) {
  return (uint32_t)sizeof(epf_recv_meta_rm_t) + 4u * (uint32_t)(2 * top_k + j);
}

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

/* epf_plan_scales_staged — 1 when the plan's receive scales are GEMM-ready and reached through
 *   stage rows: HT, EXPERT_MAJOR, a quantized payload, scale layout SEGMENT_MN_MAJOR or
 *   SWIZZLED_128X4. In such a layout one row's scales are scattered (SEGMENT_MN_MAJOR: an FP32 per
 *   column, each in its own 32-byte sector), and a send that stored them there directly cost 1.86x
 *   the compact dispatch. So the send stores each row's scales compact, as one run, in the row's
 *   stage run (epf_plan_recv_scale_stage_offset), and the receive half rearranges every received
 *   row into the layout (epf_dispatch_scales_finish_block, ht/ht.cuh); readers use
 *   epf_recv_scale_offset after that. 0 for a NULL plan. Scope: any thread. Pure. */
EPF_HD int epf_plan_scales_staged(const epf_plan_t* plan) {
  return plan != NULL && plan->mode == EPF_MODE_HT && plan->layout == EPF_LAYOUT_EXPERT_MAJOR &&
         plan->payload != EPF_PAYLOAD_BF16 &&
         (plan->scale_layout == EPF_SCALE_LAYOUT_SEGMENT_MN_MAJOR || plan->scale_layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4);
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
                                        : epf_recv_meta_rm_bytes((int)K));
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
    /* compact, and SEGMENT_MN_MAJOR: the segments' [hidden / 128][padded_count] matrices tile
     * the rows [0, recv_capacity) back to back, the same bytes as the compact rows */
    return EPF_ERR_SIZE_OVERFLOW;
  }
  if (epf_plan_scales_staged(&p)) {
    /* GEMM-ready scales: after the layout's bytes, one compact stage run per row (16-byte
     * aligned), where the send stores whole runs; the receive half rearranges them */
    uint64_t stage;
    if (!epf__mul_ok(rows, epf__align_up_u64(p.scale_bytes_per_row, 16u), &stage) ||
        sizes[EPF_REGION_RECV_SCALES] > UINT64_MAX / 2 - stage)
      return EPF_ERR_SIZE_OVERFLOW;
    sizes[EPF_REGION_RECV_SCALES] += stage;
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
  /* LL expert-major pull combine with an MXFP8 combine payload: the expert side quantizes each
   * output row into its own window at the row's receive position (both parities), the sources
   * read it there */
  if (c.mode == EPF_MODE_LL && c.layout == EPF_LAYOUT_EXPERT_MAJOR && (c.flags & EPF_FLAG_COMBINE_PUSH) == 0u &&
      c.combine_payload == EPF_PAYLOAD_MXFP8 && !epf__mul_ok(rows, p.combine_row_bytes, &sizes[EPF_REGION_EXPERT_OUT]))
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

/* ---- accessors: index inside one region (the region's base comes from the plan) -------------
 * Bad arguments (host calls, e.g. through the C ABI; EPF__HOST_CHECK): a NULL plan, a region id
 * outside [0, EPF_REGION_COUNT), a negative row or index (and the ids named below outside their
 * range) give EPF_OFFSET_INVALID (UINT64_MAX) instead of an offset. Device code calls them on hot
 * paths and is not checked: pass valid arguments there. Scope: any thread, host or device. Pure. */

/* epf_plan_signal_offset — byte offset of uint64_t signal word `index` (>= 0) of a SIG_* region.
 *   `region` must be an epf_region_id_t below EPF_REGION_COUNT (it indexes plan->region).
 *   EPF_OFFSET_INVALID for NULL, a region outside [0, EPF_REGION_COUNT) or index < 0 (host). */
EPF_HD uint64_t epf_plan_signal_offset(const epf_plan_t* plan, epf_region_id_t region, int64_t index) {
  if (EPF__HOST_CHECK(plan == NULL || (unsigned)region >= (unsigned)EPF_REGION_COUNT || index < 0))
    return EPF_OFFSET_INVALID;
  return plan->region[region].offset + (uint64_t)index * 8u;
}

/* epf_plan_counts_offset — count word number `index` published by `src` into buffer `parity`
 *   (a uint64 (epoch << 32 | count): the word carries the epoch of the update that wrote it):
 *   index in [0, E) is the (token, k) count of global expert `index`; index in [E, E + R) is the
 *   deduplicated token count for destination rank `index - E`. parity: only its low bit counts.
 *   EPF_OFFSET_INVALID for NULL, src outside [0, R) or index outside [0, E + R) (host). */
EPF_HD uint64_t epf_plan_counts_offset(const epf_plan_t* plan, int parity, int src, int index) {
  uint64_t row;
  if (EPF__HOST_CHECK(plan == NULL || src < 0 || src >= plan->nranks || index < 0 ||
                      index >= plan->num_experts + plan->nranks))
    return EPF_OFFSET_INVALID;
  row = (uint64_t)plan->num_experts + (uint64_t)plan->nranks;
  return plan->region[EPF_REGION_COUNTS].offset +
         (((uint64_t)(parity & 1) * (uint64_t)plan->nranks + (uint64_t)src) * row + (uint64_t)index) * 8u;
}

/* epf_plan_recv_token_offset / _scale_offset / _meta_offset — row `row` of the receive region
 * (row in [0, rows of RECV_TOKENS)). The compact scale layout only; every layout's scale position
 * (compact, swizzled, segment MN-major) is epf_recv_scale_offset's (ht/impl/dispatch.cuh).
 * EPF_OFFSET_INVALID for NULL or row < 0 (host). */
EPF_HD uint64_t epf_plan_recv_token_offset(const epf_plan_t* plan, int64_t row) {
  if (EPF__HOST_CHECK(plan == NULL || row < 0)) return EPF_OFFSET_INVALID;
  return plan->region[EPF_REGION_RECV_TOKENS].offset + (uint64_t)row * plan->row_bytes;
}
EPF_HD uint64_t epf_plan_recv_scale_offset(const epf_plan_t* plan, int64_t row) {
  if (EPF__HOST_CHECK(plan == NULL || row < 0)) return EPF_OFFSET_INVALID;
  return plan->region[EPF_REGION_RECV_SCALES].offset + (uint64_t)row * plan->scale_bytes_per_row;
}
/* epf_plan_recv_scale_stage_offset — where the send stores receive row `row`'s scales: its stage
 *   run (compact, scale_bytes_per_row bytes, 16-byte aligned, after the layout's bytes in
 *   RECV_SCALES) when epf_plan_scales_staged, else its compact position
 *   (epf_plan_recv_scale_offset). EPF_OFFSET_INVALID for NULL or row < 0 (host). Pure. */
EPF_HD uint64_t epf_plan_recv_scale_stage_offset(const epf_plan_t* plan, int64_t row) {
  uint64_t stride;
  if (EPF__HOST_CHECK(plan == NULL || row < 0)) return EPF_OFFSET_INVALID;
  if (!epf_plan_scales_staged(plan)) return epf_plan_recv_scale_offset(plan, row);
  stride = epf__align_up_u64(plan->scale_bytes_per_row, 16u);
  return plan->region[EPF_REGION_RECV_SCALES].offset + plan->region[EPF_REGION_RECV_SCALES].bytes -
         (uint64_t)plan->recv_capacity * stride + (uint64_t)row * stride;
}
EPF_HD uint64_t epf_plan_recv_meta_offset(const epf_plan_t* plan, int64_t row) {
  if (EPF__HOST_CHECK(plan == NULL || row < 0)) return EPF_OFFSET_INVALID;
  return plan->region[EPF_REGION_RECV_META].offset + (uint64_t)row * plan->meta_bytes_per_row;
}

/* epf_plan_expert_out_offset — where the expert output of receive row `row` lives for a pull
 *   combine: in EXPERT_OUT (combine_row_bytes per row) when the plan has that region, else in
 *   place over the received BF16 row in RECV_TOKENS (both directions BF16). HT: row of the
 *   receive region; LL (MXFP8 combine payload): row epf_ll_recv_row(plan, epoch, le, src, slot),
 *   parity included. EPF_OFFSET_INVALID for NULL or row < 0 (host). */
EPF_HD uint64_t epf_plan_expert_out_offset(const epf_plan_t* plan, int64_t row) {
  if (EPF__HOST_CHECK(plan == NULL || row < 0)) return EPF_OFFSET_INVALID;
  if (plan->region[EPF_REGION_EXPERT_OUT].bytes != 0)
    return plan->region[EPF_REGION_EXPERT_OUT].offset + (uint64_t)row * plan->combine_row_bytes;
  return plan->region[EPF_REGION_RECV_TOKENS].offset + (uint64_t)row * plan->row_bytes;
}

/* epf_plan_combine_offset — row `row` of the COMBINE landing region (push / LL combine).
 *   EPF_OFFSET_INVALID for NULL or row < 0 (host). */
EPF_HD uint64_t epf_plan_combine_offset(const epf_plan_t* plan, int64_t row) {
  if (EPF__HOST_CHECK(plan == NULL || row < 0)) return EPF_OFFSET_INVALID;
  return plan->region[EPF_REGION_COMBINE].offset + (uint64_t)row * plan->combine_row_bytes;
}

/* epf_region_name — "HEADER", "SIG_COUNT", ... for diagnostics and docs; "UNKNOWN" (the name
 *   sentinel, never NULL) for an id outside [0, EPF_REGION_COUNT). Scope: any thread. Pure. */
#define EPF__REGION_NAME_CASE(name, comment) \
  case EPF_REGION_##name:                    \
    return #name;
EPF_HD const char* epf_region_name(epf_region_id_t region) {
  switch (region) {
    EPF_REGION_LIST(EPF__REGION_NAME_CASE)
    default: return "UNKNOWN";
  }
}

EPF_END_DECLS

#endif /* EPF_PLAN_H */
/* SPDX-License-Identifier: Apache-2.0 */
