/* epfuse/route_layout.h — route memory: configuration, header and layout of a route buffer — part of epfuse v0.1
 *
 * What it is: the memory of a route (the handle): the route configuration, the header every
 * route buffer starts with, and epf_route_layout_compute, the ONE function that computes offsets
 * inside a route buffer (device and host code read the same epf_route_layout_t). The kernels that
 * fill a route are in route/route.cuh / route/kernels.cuh. Plain C11, also C++17 and CUDA; part of
 * host.h.
 *
 * What it does NOT do: allocate or launch (route/kernels.cuh: epf_route_init, epf_route_update).
 *
 * Requirements: C11 or C++17. No CUDA, no NCCL.
 */
#ifndef EPF_ROUTE_LAYOUT_H
#define EPF_ROUTE_LAYOUT_H

#include "config.h"
#include "status.h"
#include "plan.h"

EPF_BEGIN_DECLS

/* ============================================================================================ */
/* Route memory                                                                                  */
/* ============================================================================================ */

/* The route (the handle) is per-step routing state derived from topk_idx, kept in caller-provided
 * DEVICE memory (cudaMalloc; not the window). epf_route_layout_compute is the ONE function that
 * computes offsets inside a route buffer; device code and host code read the same
 * epf_route_layout_t. A route buffer holds no pointers (only offsets from its own start), so a
 * byte copy of it is a valid route buffer: epf_route_header_check validates the header a copy
 * starts with and rebuilds the layout (route/kernels.cuh: epf_route_import).
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
 *   void*        epf_route_ptr(const epf_route_t*, int index, epf_route_array_id_t)   device address (NULL: bad id)
 *   uint32_t*    epf_route_epoch_ptr(const epf_route_t*, int index)                   device address (NULL: bad id)
 *   const char*  epf_route_array_name(epf_route_array_id_t)
 *   epf_status_t epf_route_check(const epf_route_t*, const epf_plan_t*)              the handle still fits the plan
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
/* The arrays of one route buffer, in buffer order: X(name, comment). One list makes the enum and
 * epf_route_array_name. Values are ABI: append only. */
#define EPF_ROUTE_ARRAY_LIST(X)                                                                     \
  X(HEADER, "epf_route_header_t")                                                                 \
  X(EXPERT_COUNT, "[E] (token, k) pairs this rank routes to each global expert")                   \
  X(RANK_COUNT, "[R] tokens this rank sends to each destination (deduplicated)")                   \
  X(TOKEN_IN_RANK, "[T][R] uint8: 1 if token t has an expert on rank r")                           \
  X(DST_RANK, "[T][K] destination rank of (t, k); -1 = not routed or dropped")                     \
  X(SLOT, "[T][K] rank of (t, k) within its (source, expert) group in (t, k) order; -1 = not "     \
          "routed or dropped")                                                                      \
  X(RM_SLOT, "RANK_MAJOR: [T][R] rank of token t among this rank's tokens to r, in token order; "  \
             "-1 = t not sent to r")                                                                \
  X(SEND_OFFSET, "exchange: [E] row of expert e's destination receive region where THIS rank's "  \
                 "group of e starts (expert-major view)")                                          \
  X(SEND_RM_OFFSET, "exchange, RANK_MAJOR: [R] row of rank d's receive region where this rank's " \
                    "tokens start")                                                                 \
  X(RECV_SEGMENT, "exchange: [EL] epf_route_segment_t of this rank's local experts")               \
  X(RECV_SRC_OFFSET, "exchange: [EL][R + 1] row where source s's group of local expert j starts; " \
                     "[j][R] = segment end before padding (begin + count)")                        \
  X(RECV_RM_OFFSET, "exchange, RANK_MAJOR: [R + 1] row where source s's tokens start; [R] = total") \
  X(SCRATCH, "[max_blocks][E + R + 1] uint64 count words (epoch << 32 | 1 << 31 | count): "        \
             "partial counts of the update's blocks")                                              \
  X(SEND_SEGMENT, "exchange: [E] epf_route_segment_t of global expert e in its destination's "     \
                  "expert-major receive layout (the whole segment, every source's rows): what a "  \
                  "sender needs for segment-relative layouts (EPF_SCALE_LAYOUT_SEGMENT_MN_MAJOR)")

#define EPF__ROUTE_ARRAY_ENUM_ITEM(name, comment) EPF_ROUTE_##name,
typedef enum epf_route_array_id {
  EPF_ROUTE_ARRAY_LIST(EPF__ROUTE_ARRAY_ENUM_ITEM) EPF_ROUTE_ARRAY_COUNT
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
 * by value into kernels). Filled by epf_route_init / epf_route_import (route/kernels.cuh). */
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
  /* the plan may have crossed an FFI: re-check what the arithmetic below relies on, with the
   * config's own rules (plan_config.h), plus the one field a plan derives (experts_per_rank) */
  if ((st = epf__config_check_team(plan->nranks, plan->num_experts)) != EPF_OK) return st;
  if (plan->experts_per_rank != plan->num_experts / plan->nranks) return EPF_ERR_EXPERTS_NOT_DIVISIBLE;
  if ((st = epf__config_check_top_k(plan->top_k)) != EPF_OK) return st;
  if ((st = epf__config_check_tokens(plan->max_tokens_per_rank)) != EPF_OK) return st;
  if ((st = epf__config_check_alignment(plan->expert_alignment)) != EPF_OK) return st;
  if ((st = epf__config_check_layout(plan->layout)) != EPF_OK) return st;
  if ((st = epf__config_check_mode(plan->mode)) != EPF_OK) return st;

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
    sizes[EPF_ROUTE_SEND_SEGMENT] = E * sizeof(epf_route_segment_t);
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
 *   epoch of the window's last count exchange; 0 for a fresh, zeroed window). layout or out NULL:
 *   nothing is written. Pure. */
EPF_HD void epf_route_header_init(const epf_route_layout_t* layout, uint32_t epoch, epf_route_header_t* out) {
  if (layout == NULL || out == NULL) return;
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
 *   arithmetic: host or device. index in [0, route->count), id below EPF_ROUTE_ARRAY_COUNT: a
 *   host call (the C ABI) gets NULL for a NULL route or either outside its range (device code is
 *   not checked: EPF__HOST_CHECK). */
EPF_HD void* epf_route_ptr(const epf_route_t* route, int index, epf_route_array_id_t id) {
  if (EPF__HOST_CHECK(route == NULL || index < 0 || index >= route->count ||
                      (unsigned)id >= (unsigned)EPF_ROUTE_ARRAY_COUNT))
    return NULL;
  if (route->layout.array[id].bytes == 0) return NULL;
  return (char*)route->base + (uint64_t)index * route->layout.total_bytes + route->layout.array[id].offset;
}

/* epf_route_epoch_ptr — device address of the epoch word of buffer `index`: after an update it
 *   holds that step's epoch, which dispatch and combine of the same step use. NULL for a NULL
 *   route or index outside [0, route->count) (host calls; as epf_route_ptr). */
EPF_HD uint32_t* epf_route_epoch_ptr(const epf_route_t* route, int index) {
  if (EPF__HOST_CHECK(route == NULL || index < 0 || index >= route->count)) return NULL;
  if (route->epoch_words != NULL) return route->epoch_words + index;
  return &((epf_route_header_t*)epf_route_ptr(route, index, EPF_ROUTE_HEADER))->epoch;
}

/* epf_route_array_name — "EXPERT_COUNT", "SLOT", ... for diagnostics and docs; "UNKNOWN" (never
 *   NULL) for an id outside [0, EPF_ROUTE_ARRAY_COUNT). */
#define EPF__ROUTE_ARRAY_NAME_CASE(name, comment) \
  case EPF_ROUTE_##name:                          \
    return #name;
EPF_HD const char* epf_route_array_name(epf_route_array_id_t id) {
  switch (id) {
    EPF_ROUTE_ARRAY_LIST(EPF__ROUTE_ARRAY_NAME_CASE)
    default: return "UNKNOWN";
  }
}

/* epf_route_check — is `route` (a handle made by epf_route_init / epf_route_import, then passed
 *   around, copied across an FFI or kept in a checkpoint) still the handle of `plan`? The launchers
 *   that take a route call it first (epf_route_update, epf_ht_check and every HT launcher), so a
 *   damaged handle is refused before anything runs instead of sending rows to wrong offsets.
 *   Statuses, in this order: EPF_ERR_INVALID_ARGUMENT (NULL route or plan), EPF_ERR_STRUCT_VERSION
 *   (the handle's or its layout's size / magic / version, or the plan's), EPF_ERR_INVALID_ARGUMENT
 *   (no base, count not 1 or plan->nranks), EPF_ERR_ALIGNMENT (base not EPF_ALIGN-aligned),
 *   EPF_ERR_CONFIG_MISMATCH (the
 *   layout is not what epf_route_layout_compute makes of `plan` with the layout's own resolved
 *   route config — index type, top-k, T, blocks, flags — byte for byte: another plan, or a field
 *   changed since). The layout's own route config is the handle's choice, not re-checked: a handle
 *   whose index type was switched is a consistent handle of the other type (the ids' dtype is the
 *   caller's to match; the Python package checks it).
 *   Scope: host (any thread; no CUDA call; graph-capturable) or device. */
EPF_HD epf_status_t epf_route_check(const epf_route_t* route, const epf_plan_t* plan) {
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  epf_route_layout_t fresh;
  const unsigned char* a;
  const unsigned char* b;
  size_t i;
  epf_status_t st;
  if (route == NULL || plan == NULL) return EPF_ERR_INVALID_ARGUMENT;
  st = epf__check_prefix(route->size, route->magic, route->version, EPF_ROUTE_HANDLE_MAGIC,
                         (uint32_t)sizeof(epf_route_t));
  if (st != EPF_OK) return st;
  st = epf__check_prefix(route->layout.size, route->layout.magic, route->layout.version, EPF_ROUTE_LAYOUT_MAGIC,
                         (uint32_t)sizeof(epf_route_layout_t));
  if (st != EPF_OK) return st;
  st = epf_plan_check(plan);
  if (st != EPF_OK) return st;
  if (route->base == NULL || (route->count != 1 && route->count != plan->nranks)) return EPF_ERR_INVALID_ARGUMENT;
  if (((uintptr_t)route->base & (uintptr_t)(EPF_ALIGN - 1)) != 0u) return EPF_ERR_ALIGNMENT;
  rc.index_type = route->layout.index_type;
  rc.top_k = route->layout.top_k;
  rc.max_tokens = route->layout.max_tokens;
  rc.max_blocks = route->layout.max_blocks;
  rc.flags = route->layout.flags & EPF_ROUTE_FLAGS_ALL;
  if (epf_route_layout_compute(plan, &rc, &fresh) != EPF_OK) return EPF_ERR_CONFIG_MISMATCH;
  a = (const unsigned char*)&fresh;
  b = (const unsigned char*)&route->layout;
  for (i = 0; i < sizeof(fresh); ++i) /* the struct has no padding: every byte is a field's */
    if (a[i] != b[i]) return EPF_ERR_CONFIG_MISMATCH;
  return EPF_OK;
}

EPF_END_DECLS

#endif /* EPF_ROUTE_LAYOUT_H */
/* SPDX-License-Identifier: Apache-2.0 */
