/* fuzz_host — a libFuzzer harness over every public function of epfuse/host.h (issue #14 §5).
 *
 * The input bytes are read as config, route-config, plan-mutation, header-mutation and
 * error-record fields; every field has a selector byte that picks its default (0), a value in its
 * valid range, a value at or just past its limit, or an extreme (-1, INT32_MIN, INT32_MAX, raw
 * bits), so the fuzzer reaches the deep paths (accepted plans, route layouts) as well as every
 * refusal. The oracle is the documented contract of host.h, recomputed here independently
 * (statuses in the documented order, region and array sizes in 128-bit arithmetic); a function
 * under test is never used to compute its own expectation. Any mismatch prints what was checked
 * and aborts (libFuzzer saves the input); ASan and UBSan (-fno-sanitize-recover=all) catch the rest.
 *
 * Plain C11; includes only epfuse/host.h and libc. Built by tests/fuzz/CMakeLists.txt with clang
 * -fsanitize=fuzzer,address,undefined, once with the default limits (fuzz_host) and once with the
 * largest the static asserts of config.h allow (fuzz_host_limits), where the overflow checks can
 * trigger. tests/fuzz/README.md says how to run a campaign. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epfuse/host.h"

__extension__ typedef unsigned __int128 u128;

/* ---- failure report ----------------------------------------------------------------------------- */

static const char* g_what = "";        /* the step being checked */
static epf_config_t g_cfg;             /* the config of this input, as handed to resolve */
static epf_route_config_t g_rcfg;      /* the route config of this input */

static void dump_config(const char* name, const epf_config_t* c) {
  fprintf(stderr,
          "  %s: size %u magic 0x%08x version %u R %d E %d K %d H %d T %d mode %d layout %d payload %d "
          "combine %d scales %d align %d flags 0x%x reserved0 %u recv_capacity %lld timeout_ns %llu\n",
          name, c->size, c->magic, c->version, c->nranks, c->num_experts, c->top_k, c->hidden,
          c->max_tokens_per_rank, c->mode, c->layout, c->payload, c->combine_payload, c->scale_layout,
          c->expert_alignment, c->flags, c->reserved0, (long long)c->recv_capacity,
          (unsigned long long)c->timeout_ns);
}

static void fail_here(const char* file, int line, const char* expr, long long got, long long want) {
  fprintf(stderr, "fuzz_host: %s:%d: [%s] check failed: %s (got %lld, want %lld)\n", file, line, g_what,
          expr, got, want);
  dump_config("config", &g_cfg);
  fprintf(stderr, "  route config: size %u magic 0x%08x version %u index %d K %d T %d blocks %d flags 0x%x\n",
          g_rcfg.size, g_rcfg.magic, g_rcfg.version, g_rcfg.index_type, g_rcfg.top_k, g_rcfg.max_tokens,
          g_rcfg.max_blocks, g_rcfg.flags);
  abort();
}

#define CHECK(c)                                                         \
  do {                                                                   \
    if (!(c)) fail_here(__FILE__, __LINE__, #c, 0, 1);                   \
  } while (0)
#define CHECK_EQ(got, want)                                                        \
  do {                                                                             \
    long long g_ = (long long)(got), w_ = (long long)(want);                       \
    if (g_ != w_) fail_here(__FILE__, __LINE__, #got " == " #want, g_, w_);        \
  } while (0)
#define CHECK_STATUS(got, want)                                                              \
  do {                                                                                       \
    epf_status_t g_ = (got), w_ = (want);                                                    \
    if (g_ != w_) {                                                                          \
      fprintf(stderr, "fuzz_host: status %s, want %s\n", epf_status_name(g_), epf_status_name(w_)); \
      fail_here(__FILE__, __LINE__, #got " == " #want, (long long)g_, (long long)w_);        \
    }                                                                                        \
  } while (0)

/* ---- reading the input ---------------------------------------------------------------------------- */

typedef struct {
  const uint8_t* p;
  size_t n, i;
} rd_t;

static uint8_t u8(rd_t* r) { return r->i < r->n ? r->p[r->i++] : 0; }
static uint32_t u32(rd_t* r) {
  uint32_t v = 0;
  int k;
  for (k = 0; k < 4; ++k) v |= (uint32_t)u8(r) << (8 * k);
  return v;
}
static uint64_t u64(rd_t* r) {
  uint64_t lo = u32(r);
  return lo | (uint64_t)u32(r) << 32;
}

/* an int32 field: default, in [lo, hi] (a multiple of `mult` when mult > 1), the limit, one past
 * it, or an extreme. Most selectors give valid values, so most inputs get past validation. */
static int32_t field(rd_t* r, int32_t lo, int32_t hi, int32_t mult, int32_t limit) {
  const uint8_t s = u8(r);
  switch (s & 15) {
    case 0: return 0;
    case 1: return limit;
    case 2: return limit == INT32_MAX ? INT32_MIN : limit + 1;
    case 3: return -1;
    case 4: return (s & 16) ? INT32_MIN : INT32_MAX;
    case 5: return (int32_t)u32(r);
    case 6: return lo;
    default:
      if (mult > 1) {
        const int32_t n = hi / mult;
        return n < 1 ? mult : mult * (1 + (int32_t)(u32(r) % (uint32_t)n));
      }
      return lo + (int32_t)(u32(r) % (uint32_t)(hi - lo + 1));
  }
}

/* an enumeration stored as int32: 0 (default) .. count valid values, or something else */
static int32_t enum_field(rd_t* r, int32_t count) {
  const uint8_t s = u8(r);
  if (s < 224) return (int32_t)(s % (uint8_t)(count + 1));
  switch (s & 7) {
    case 0: return count + 1;
    case 1: return -1;
    case 2: return INT32_MIN;
    case 3: return INT32_MAX;
    default: return (int32_t)u32(r);
  }
}

/* a versioned prefix: mostly right; else one of size / magic / version broken */
static void prefix(rd_t* r, uint32_t* size, uint32_t* magic, uint32_t* version, uint32_t want_size,
                   uint32_t want_magic, uint32_t want_version) {
  const uint8_t s = u8(r);
  *size = want_size;
  *magic = want_magic;
  *version = want_version;
  if (s < 232) return;
  switch (s & 7) {
    case 0: *size = want_size - 4u; break;
    case 1: *size = 0u; break;
    case 2: *size = u32(r); break;
    case 3: *magic = want_magic ^ (1u << (u8(r) & 31)); break;
    case 4: *version = 0u; break;
    case 5: *version = u32(r); break;
    case 6: *size = want_size + 64u; break; /* a larger, newer struct */
    default: *magic = u32(r); break;
  }
}

/* ---- the documented rules, written out independently ------------------------------------------------ */

static int width_of(int32_t payload) { /* hidden must be a multiple of this; 0 = unknown payload */
  return payload == 1 ? 8 : payload == 2 ? 32 : payload == 3 ? 128 : 0;
}
static int pow2_in(int32_t a, int32_t hi) {
  int32_t v;
  for (v = 1; v <= hi; v *= 2)
    if (a == v) return 1;
  return 0;
}
static u128 up(u128 x, u128 a) { return (x + a - 1) / a * a; }

/* validate: prefix, reserved0, mode, layout, payloads, scale layout, flags, ranks, experts,
 * divisibility, top-k, hidden, hidden alignment, tokens, alignment, receive capacity. */
static epf_status_t want_validate(const epf_config_t* c, int skip_capacity) {
  int w;
  if (c->magic != EPF_CONFIG_MAGIC || c->version < 1u || c->size < (uint32_t)sizeof(epf_config_t))
    return EPF_ERR_STRUCT_VERSION;
  if (c->reserved0 != 0u) return EPF_ERR_INVALID_ARGUMENT;
  if (c->mode != 1 && c->mode != 2) return EPF_ERR_MODE;
  if (c->layout != 1 && c->layout != 2) return EPF_ERR_LAYOUT;
  if (width_of(c->payload) == 0) return EPF_ERR_PAYLOAD;
  if (c->combine_payload != 1 && c->combine_payload != 2) return EPF_ERR_PAYLOAD;
  if (c->scale_layout < 1 || c->scale_layout > 3) return EPF_ERR_SCALE_LAYOUT;
  if (c->scale_layout == 2 && c->payload != 2) return EPF_ERR_SCALE_LAYOUT;
  /* 3 = SEGMENT_MN_MAJOR: FP8_128, HT, EXPERT_MAJOR, a valid alignment of at least 8 */
  if (c->scale_layout == 3 && (c->payload != 3 || c->mode != 1 || c->layout != 1)) return EPF_ERR_SCALE_LAYOUT;
  if (c->scale_layout == 3 && (c->expert_alignment == 1 || c->expert_alignment == 2 || c->expert_alignment == 4))
    return EPF_ERR_SCALE_LAYOUT;
  if (c->flags > 0xFu) return EPF_ERR_FLAGS;
  if (c->nranks < 1 || c->nranks > EPF_MAX_RANKS) return EPF_ERR_RANKS;
  if (c->num_experts < 1 || c->num_experts > EPF_MAX_EXPERTS) return EPF_ERR_EXPERTS;
  if (c->num_experts % c->nranks != 0) return EPF_ERR_EXPERTS_NOT_DIVISIBLE;
  if (c->top_k < 1 || c->top_k > EPF_MAX_TOPK) return EPF_ERR_TOPK;
  if (c->hidden < 1 || c->hidden > (1 << 20)) return EPF_ERR_HIDDEN;
  w = width_of(c->payload) > width_of(c->combine_payload) ? width_of(c->payload) : width_of(c->combine_payload);
  if (c->hidden % w != 0) return EPF_ERR_HIDDEN_ALIGNMENT;
  if (c->max_tokens_per_rank < 1 || c->max_tokens_per_rank > EPF_MAX_TOKENS_PER_RANK) return EPF_ERR_TOKENS;
  if (!pow2_in(c->expert_alignment, 1024)) return EPF_ERR_ALIGNMENT;
  if (skip_capacity) return EPF_OK;
  if (c->mode == 2) return c->recv_capacity == 0 ? EPF_OK : EPF_ERR_RECV_CAPACITY;
  if (c->recv_capacity < (c->layout == 2 ? 1 : (int64_t)c->expert_alignment) || c->recv_capacity > INT32_MAX)
    return EPF_ERR_RECV_CAPACITY;
  return EPF_OK;
}

/* HT rows that can never overflow (fields valid): R * T * min(K, E / R) + (E / R) * (alignment - 1)
 * for EXPERT_MAJOR, R * T for RANK_MAJOR (one unpadded row per token and destination rank). */
static u128 want_worst_rows(const epf_config_t* c) {
  const u128 R = (u128)c->nranks, T = (u128)c->max_tokens_per_rank, EL = (u128)(c->num_experts / c->nranks);
  const u128 K = (u128)c->top_k;
  if (c->layout == 2) return R * T;
  return R * T * (K < EL ? K : EL) + EL * (u128)(c->expert_alignment - 1);
}

/* resolve: zero fields -> defaults, then validate; HT capacity 0 -> the worst case */
static epf_status_t want_resolve(const epf_config_t* in, epf_config_t* c) {
  epf_status_t st;
  if (in->magic != EPF_CONFIG_MAGIC || in->version < 1u || in->size < (uint32_t)sizeof(epf_config_t))
    return EPF_ERR_STRUCT_VERSION;
  *c = *in;
  c->size = (uint32_t)sizeof(epf_config_t);
  c->version = 1u;
  if (c->nranks == 0) c->nranks = 1;
  if (c->num_experts == 0) c->num_experts = 256;
  if (c->top_k == 0) c->top_k = 8;
  if (c->hidden == 0) c->hidden = 7168;
  if (c->mode == 0) c->mode = 1;
  if (c->layout == 0) c->layout = 1;
  if (c->payload == 0) c->payload = 1;
  if (c->combine_payload == 0) c->combine_payload = 1;
  if (c->scale_layout == 0) c->scale_layout = 1;
  if (c->expert_alignment == 0) c->expert_alignment = 1;
  if (c->max_tokens_per_rank == 0) c->max_tokens_per_rank = c->mode == 2 ? 128 : 4096;
  if (c->timeout_ns == 0) c->timeout_ns = 10000000000ull;
  if (c->mode != 2 && c->recv_capacity == 0) {
    st = want_validate(c, 1);
    if (st != EPF_OK) return st;
    {
      const u128 w = want_worst_rows(c);
      if (w > (u128)INT32_MAX) {
        c->recv_capacity = (int64_t)w;
        return EPF_ERR_RECV_CAPACITY;
      }
      c->recv_capacity = (int64_t)w;
    }
  }
  return want_validate(c, 0);
}

typedef struct {
  u128 region[EPF_REGION_COUNT];
  u128 recv_capacity, row_bytes, scale_bytes_per_row, meta_bytes_per_row, combine_row_bytes;
} want_plan_t;

/* the region sizes of a resolved, valid config, from the region comments of host.h */
static void want_plan(const epf_config_t* c, want_plan_t* w) {
  const u128 R = (u128)c->nranks, E = (u128)c->num_experts, EL = E / R, T = (u128)c->max_tokens_per_rank;
  const u128 K = (u128)c->top_k, H = (u128)c->hidden;
  const int ll = c->mode == 2, em = c->layout == 1, push = (c->flags & EPF_FLAG_COMBINE_PUSH) != 0u;
  u128 rows, crows;
  int i;
  for (i = 0; i < EPF_REGION_COUNT; ++i) w->region[i] = 0;
  w->row_bytes = c->payload == 1 ? 2 * H : H;                                    /* BF16 2 B, FP8 1 B */
  w->scale_bytes_per_row = c->payload == 2 ? H / 32 : c->payload == 3 ? H / 128 * 4 : 0; /* E8M0 / FP32 */
  w->meta_bytes_per_row = em ? 16 : up(16 + K * (4 + 4 + 4), 16); /* rm header + ids, weights, slots */
  w->combine_row_bytes = c->combine_payload == 2 ? up(H + H / 32, 16) : 2 * H;
  w->recv_capacity = ll ? (em ? EL : 1) * R * T : (u128)c->recv_capacity; /* LL: one parity */
  rows = ll ? 2 * w->recv_capacity : w->recv_capacity;
  crows = T * (em ? K : R) * (ll ? 2 : push ? 1 : 0);
  w->region[EPF_REGION_HEADER] = up(sizeof(epf_window_header_t), EPF_ALIGN);
  w->region[EPF_REGION_SIG_COUNT] = 8 * R;
  w->region[EPF_REGION_SIG_DISPATCH] = 8 * R;
  w->region[EPF_REGION_SIG_COMBINE] = 8 * R;
  w->region[EPF_REGION_SIG_BARRIER] = 8 * R;
  w->region[EPF_REGION_SIG_LL_DISPATCH] = ll ? 8 * 2 * EL * R : 0;
  w->region[EPF_REGION_SIG_LL_COMBINE] = ll ? 8 * 2 * R : 0;
  w->region[EPF_REGION_COUNTS] = 8 * 2 * R * (E + R);
  w->region[EPF_REGION_RECV_TOKENS] = rows * w->row_bytes;
  w->region[EPF_REGION_RECV_SCALES] =
      c->scale_layout == 2 ? up(rows, 128) * up(H / 32, 4) : rows * w->scale_bytes_per_row;
  if (!ll && em && c->payload != 1 && (c->scale_layout == 2 || c->scale_layout == 3)) /* + stage runs */
    w->region[EPF_REGION_RECV_SCALES] += rows * up(w->scale_bytes_per_row, 16);
  w->region[EPF_REGION_RECV_META] = rows * w->meta_bytes_per_row;
  w->region[EPF_REGION_COMBINE] = crows * w->combine_row_bytes;
  w->region[EPF_REGION_EXPERT_OUT] = (!ll && !push && (c->payload != 1 || c->combine_payload != 1))
                                         ? rows * w->combine_row_bytes
                                         : 0;
  if (ll && em && !push && c->combine_payload == 2) /* LL MXFP8 pull combine: quantized outputs */
    w->region[EPF_REGION_EXPERT_OUT] = rows * w->combine_row_bytes;
}

static int bytes_zero(const void* p, size_t off, size_t n) {
  const unsigned char* b = (const unsigned char*)p;
  size_t i;
  for (i = off; i < n; ++i)
    if (b[i] != 0) return 0;
  return 1;
}

/* ---- names, statuses, widths, version ------------------------------------------------------------------ */

static void check_names(rd_t* r) {
  const int32_t raw = (int32_t)u32(r);
  const int32_t probes[] = {raw, -1, 0, EPF_STATUS_COUNT - 1, EPF_STATUS_COUNT, EPF_REGION_COUNT,
                            EPF_ROUTE_ARRAY_COUNT, INT32_MIN, INT32_MAX};
  size_t i;
  int j;
  g_what = "names";
  for (i = 0; i < sizeof(probes) / sizeof(probes[0]); ++i) {
    const int32_t v = probes[i];
    const char* name = epf_status_name((epf_status_t)v);
    const char* msg = epf_status_message((epf_status_t)v);
    const char* region = epf_region_name((epf_region_id_t)v);
    const char* array = epf_route_array_name((epf_route_array_id_t)v);
    const int w = epf_payload_vector_width(v);
    CHECK(name != NULL && msg != NULL && region != NULL && array != NULL);
    CHECK(msg[0] != '\0');
    if (v >= 0 && v < EPF_STATUS_COUNT) {
      CHECK(strncmp(name, "EPF_", 4) == 0 && strcmp(name, "EPF_STATUS_UNKNOWN") != 0);
      CHECK(strcmp(msg, "unknown status code") != 0);
    } else {
      CHECK(strcmp(name, "EPF_STATUS_UNKNOWN") == 0 && strcmp(msg, "unknown status code") == 0);
    }
    CHECK((strcmp(region, "UNKNOWN") != 0) == (v >= 0 && v < EPF_REGION_COUNT));
    CHECK((strcmp(array, "UNKNOWN") != 0) == (v >= 0 && v < EPF_ROUTE_ARRAY_COUNT));
    CHECK_EQ(w, width_of(v));
  }
  CHECK_EQ(epf_status_name(EPF_OK)[0], 'E');
  CHECK(strcmp(epf_status_name(EPF_ERR_TOPK), "EPF_ERR_TOPK") == 0);
  for (j = 0; j < EPF_REGION_COUNT; ++j) {
    int k;
    for (k = 0; k < j; ++k)
      CHECK(strcmp(epf_region_name((epf_region_id_t)j), epf_region_name((epf_region_id_t)k)) != 0);
  }
  for (j = 0; j < EPF_ROUTE_ARRAY_COUNT; ++j) {
    int k;
    for (k = 0; k < j; ++k)
      CHECK(strcmp(epf_route_array_name((epf_route_array_id_t)j), epf_route_array_name((epf_route_array_id_t)k)) != 0);
  }
  CHECK_EQ(epf_version(), EPF_VERSION);
}

/* ---- the error record --------------------------------------------------------------------------------- */

static void check_error_record(rd_t* r) {
  epf_error_record_t rec, out;
  unsigned char* b = (unsigned char*)&rec;
  size_t i;
  g_what = "error record";
  for (i = 0; i < sizeof(rec); ++i) b[i] = u8(r);
  memset(&out, 0xA5, sizeof(out));
  epf_error_read(&rec, &out);
  CHECK_EQ(out.status, rec.status);
  CHECK_EQ(out.count, rec.count);
  CHECK_EQ(out.valid, rec.valid);
  CHECK_EQ(out.waiter_rank, rec.waiter_rank);
  CHECK_EQ(out.waiter_block, rec.waiter_block);
  CHECK_EQ(out.waiter_thread, rec.waiter_thread);
  CHECK_EQ(out.peer, rec.peer);
  CHECK_EQ(out.reserved, 0);
  CHECK(out.address == rec.address && out.wanted == rec.wanted && out.seen == rec.seen);
  CHECK(out.elapsed_ns == rec.elapsed_ns);
  CHECK_EQ(out.dropped_routes, rec.dropped_routes);
  CHECK_EQ(out.recv_overflow, rec.recv_overflow);
  CHECK_EQ(out.masked_ranks, rec.masked_ranks);
  CHECK_EQ(out.reserved2, 0);
  epf_error_clear(&rec);
  CHECK(bytes_zero(&rec, 0, sizeof(rec)));
}

/* ---- config: validate, resolve, hash, worst case --------------------------------------------------------- */

static void read_config(rd_t* r, epf_config_t* c) {
  static const int32_t widths[] = {8, 32, 128, 8};
  const uint8_t s = u8(r);
  memset(c, 0, sizeof(*c));
  prefix(r, &c->size, &c->magic, &c->version, (uint32_t)sizeof(epf_config_t), EPF_CONFIG_MAGIC, EPF_CONFIG_VERSION);
  c->nranks = field(r, 1, EPF_MAX_RANKS, 1, EPF_MAX_RANKS);
  /* experts: mostly a multiple of the ranks */
  c->num_experts = field(r, 1, EPF_MAX_EXPERTS, (s & 1) && c->nranks > 1 ? c->nranks : 1, EPF_MAX_EXPERTS);
  c->top_k = field(r, 1, EPF_MAX_TOPK, 1, EPF_MAX_TOPK);
  c->hidden = field(r, 1, 1 << 20, widths[(s >> 1) & 3], 1 << 20);
  c->max_tokens_per_rank = field(r, 1, (s & 8) ? EPF_MAX_TOKENS_PER_RANK : 512, 1, EPF_MAX_TOKENS_PER_RANK);
  c->mode = enum_field(r, 2);
  c->layout = enum_field(r, 2);
  c->payload = enum_field(r, 3);
  c->combine_payload = enum_field(r, 2);
  c->scale_layout = enum_field(r, 3);
  {
    const uint8_t a = u8(r);
    c->expert_alignment = a < 200 ? (a % 12 == 11 ? 0 : 1 << (a % 11)) : field(r, 1, 2048, 1, 1024);
  }
  {
    const uint8_t f = u8(r);
    c->flags = f < 240 ? (uint32_t)(f & 15u) : u32(r);
  }
  c->reserved0 = u8(r) < 250 ? 0u : u32(r);
  switch (u8(r) & 15) {
    case 0: case 1: case 2: case 3: case 4: case 5: c->recv_capacity = 0; break;
    case 6: case 7: c->recv_capacity = 1 + (int64_t)(u32(r) % (1u << 20)); break;
    case 8: c->recv_capacity = (int64_t)(u32(r) % 2048u); break;
    case 9: c->recv_capacity = (int64_t)c->expert_alignment - 1; break;
    case 10: c->recv_capacity = c->expert_alignment; break;
    case 11: c->recv_capacity = (u8(r) & 1) ? INT32_MAX : (int64_t)INT32_MAX + 1; break;
    case 12: c->recv_capacity = (u8(r) & 1) ? -1 : INT64_MIN; break;
    case 13: c->recv_capacity = INT64_MAX; break;
    case 14: c->recv_capacity = 1; break;
    default: c->recv_capacity = (int64_t)u64(r); break;
  }
  c->timeout_ns = (u8(r) & 3) == 0 ? u64(r) : 0u;
}

/* the fields of `b` that equal their default set back to 0: must resolve to the same config */
static epf_config_t defaults_zeroed(const epf_config_t* b) {
  epf_config_t z = *b;
  if (z.nranks == 1) z.nranks = 0;
  if (z.num_experts == 256) z.num_experts = 0;
  if (z.top_k == 8) z.top_k = 0;
  if (z.hidden == 7168) z.hidden = 0;
  if (z.max_tokens_per_rank == (z.mode == 2 ? 128 : 4096)) z.max_tokens_per_rank = 0;
  if (z.mode == 1) z.mode = 0;
  if (z.layout == 1) z.layout = 0;
  if (z.payload == 1) z.payload = 0;
  if (z.combine_payload == 1) z.combine_payload = 0;
  if (z.scale_layout == 1) z.scale_layout = 0;
  if (z.expert_alignment == 1) z.expert_alignment = 0;
  if (z.timeout_ns == 10000000000ull) z.timeout_ns = 0;
  if (z.mode != 2 && (u128)z.recv_capacity == want_worst_rows(b)) z.recv_capacity = 0;
  return z;
}

/* returns the status of resolve; *out the resolved copy */
static epf_status_t check_config(const epf_config_t* in, epf_config_t* out) {
  epf_config_t want, alias, again;
  epf_status_t st, want_st, st2;
  g_what = "validate";
  CHECK_STATUS(epf_config_validate(in), want_validate(in, 0));
  CHECK_STATUS(epf_config_validate(NULL), EPF_ERR_INVALID_ARGUMENT);

  g_what = "resolve";
  CHECK_STATUS(epf_config_resolve(NULL, out), EPF_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(epf_config_resolve(in, NULL), EPF_ERR_INVALID_ARGUMENT);
  memset(&want, 0, sizeof(want));
  memset(out, 0, sizeof(*out));
  want_st = want_resolve(in, &want);
  st = epf_config_resolve(in, out);
  CHECK_STATUS(st, want_st);
  if (st == EPF_ERR_STRUCT_VERSION) return st; /* nothing written */
  /* every field resolved as documented; on error the capacity default may be left at 0 */
  if (st != EPF_OK && in->recv_capacity == 0 && in->mode != 2) want.recv_capacity = out->recv_capacity;
  CHECK(memcmp(out, &want, sizeof(want)) == 0);
  /* in and out may alias */
  alias = *in;
  CHECK_STATUS(epf_config_resolve(&alias, &alias), st);
  CHECK(memcmp(&alias, out, sizeof(alias)) == 0);
  /* idempotent: same config, same status, every mode and layout */
  g_what = "resolve idempotent";
  st2 = epf_config_resolve(out, &again);
  CHECK_STATUS(st2, st);
  CHECK(memcmp(&again, out, sizeof(again)) == 0);
  if (st == EPF_OK) {
    epf_config_t z, rz;
    uint64_t h;
    g_what = "resolved validates";
    CHECK_STATUS(epf_config_validate(out), EPF_OK);
    g_what = "worst case rows";
    CHECK((u128)epf_config_worst_case_rows(out) == want_worst_rows(out));
    g_what = "hash";
    h = epf_config_hash(out);
    CHECK(h != 0);
    CHECK(epf_config_hash(&again) == h);
    again.timeout_ns ^= 0x5555u; /* not part of the agreement */
    CHECK(epf_config_hash(&again) == h);
    /* the same config with its defaults written as zeros: same resolved config, same hash */
    z = defaults_zeroed(out);
    CHECK_STATUS(epf_config_resolve(&z, &rz), EPF_OK);
    CHECK(memcmp(&rz, out, sizeof(rz)) == 0);
    CHECK(epf_config_hash(&rz) == h);
  } else if (want_validate(out, 1) == EPF_OK) {
    /* only the capacity is wrong: the worst case is still defined on these fields */
    g_what = "worst case rows (capacity refused)";
    CHECK((u128)epf_config_worst_case_rows(out) == want_worst_rows(out));
  }
  return st;
}

/* ---- the plan --------------------------------------------------------------------------------------- */

static void check_plan_accessors(const epf_plan_t* p, rd_t* r) {
  const epf_region_t* g = p->region;
  const uint64_t R = (uint64_t)p->nranks, E = (uint64_t)p->num_experts;
  const uint64_t rows = g[EPF_REGION_RECV_TOKENS].bytes / p->row_bytes;
  const uint64_t crows = p->combine_row_bytes ? g[EPF_REGION_COMBINE].bytes / p->combine_row_bytes : 0;
  static const epf_region_id_t sig[] = {EPF_REGION_SIG_COUNT, EPF_REGION_SIG_DISPATCH, EPF_REGION_SIG_COMBINE,
                                        EPF_REGION_SIG_BARRIER, EPF_REGION_SIG_LL_DISPATCH,
                                        EPF_REGION_SIG_LL_COMBINE};
  size_t i;
  int parity;
  g_what = "accessors";
  for (i = 0; i < sizeof(sig) / sizeof(sig[0]); ++i) {
    const uint64_t words = g[sig[i]].bytes / 8u;
    if (words == 0) continue;
    CHECK(epf_plan_signal_offset(p, sig[i], 0) == g[sig[i]].offset);
    CHECK(epf_plan_signal_offset(p, sig[i], (int64_t)(words - 1)) + 8u == g[sig[i]].offset + g[sig[i]].bytes);
    {
      const uint64_t k = u32(r) % words;
      CHECK(epf_plan_signal_offset(p, sig[i], (int64_t)k) == g[sig[i]].offset + 8u * k);
    }
  }
  /* COUNTS: [2 parity][R source][E + R] words */
  for (parity = 0; parity < 2; ++parity) {
    const uint64_t src = u32(r) % R, idx = u32(r) % (E + R);
    const uint64_t o = epf_plan_counts_offset(p, parity, (int)src, (int)idx);
    CHECK(o == g[EPF_REGION_COUNTS].offset + 8u * (((uint64_t)parity * R + src) * (E + R) + idx));
    CHECK(o + 8u <= g[EPF_REGION_COUNTS].offset + g[EPF_REGION_COUNTS].bytes);
  }
  CHECK(epf_plan_counts_offset(p, 1, (int)R - 1, (int)(E + R - 1)) + 8u ==
        g[EPF_REGION_COUNTS].offset + g[EPF_REGION_COUNTS].bytes);
  CHECK(epf_plan_counts_offset(p, 0, 0, 0) == g[EPF_REGION_COUNTS].offset);
  /* receive rows: row k of RECV_TOKENS / RECV_SCALES (compact) / RECV_META / EXPERT_OUT */
  CHECK(rows * p->row_bytes == g[EPF_REGION_RECV_TOKENS].bytes);
  CHECK(rows * p->meta_bytes_per_row == g[EPF_REGION_RECV_META].bytes);
  {
    const uint64_t ks[3] = {0, rows - 1, u64(r) % rows};
    int j;
    for (j = 0; j < 3; ++j) {
      const uint64_t k = ks[j];
      CHECK(epf_plan_recv_token_offset(p, (int64_t)k) == g[EPF_REGION_RECV_TOKENS].offset + k * p->row_bytes);
      CHECK(epf_plan_recv_token_offset(p, (int64_t)k) + p->row_bytes <=
            g[EPF_REGION_RECV_TOKENS].offset + g[EPF_REGION_RECV_TOKENS].bytes);
      CHECK(epf_plan_recv_meta_offset(p, (int64_t)k) == g[EPF_REGION_RECV_META].offset + k * p->meta_bytes_per_row);
      CHECK(epf_plan_recv_meta_offset(p, (int64_t)k) + p->meta_bytes_per_row <=
            g[EPF_REGION_RECV_META].offset + g[EPF_REGION_RECV_META].bytes);
      if (p->scale_layout == EPF_SCALE_LAYOUT_COMPACT) {
        CHECK(epf_plan_recv_scale_offset(p, (int64_t)k) ==
              g[EPF_REGION_RECV_SCALES].offset + k * p->scale_bytes_per_row);
        CHECK(epf_plan_recv_scale_offset(p, (int64_t)k) + p->scale_bytes_per_row <=
              g[EPF_REGION_RECV_SCALES].offset + g[EPF_REGION_RECV_SCALES].bytes);
      }
      if (g[EPF_REGION_EXPERT_OUT].bytes != 0) {
        CHECK(epf_plan_expert_out_offset(p, (int64_t)k) ==
              g[EPF_REGION_EXPERT_OUT].offset + k * p->combine_row_bytes);
        CHECK(epf_plan_expert_out_offset(p, (int64_t)k) + p->combine_row_bytes <=
              g[EPF_REGION_EXPERT_OUT].offset + g[EPF_REGION_EXPERT_OUT].bytes);
      } else {
        /* in place over the received BF16 row */
        CHECK(epf_plan_expert_out_offset(p, (int64_t)k) == g[EPF_REGION_RECV_TOKENS].offset + k * p->row_bytes);
      }
    }
  }
  if (crows != 0) {
    const uint64_t k = u64(r) % crows;
    CHECK(crows * p->combine_row_bytes == g[EPF_REGION_COMBINE].bytes);
    CHECK(epf_plan_combine_offset(p, (int64_t)k) == g[EPF_REGION_COMBINE].offset + k * p->combine_row_bytes);
    CHECK(epf_plan_combine_offset(p, (int64_t)(crows - 1)) + p->combine_row_bytes ==
          g[EPF_REGION_COMBINE].offset + g[EPF_REGION_COMBINE].bytes);
  }
}

static void check_plan_prefix(rd_t* r) {
  epf_plan_t p;
  epf_status_t want;
  g_what = "plan_check";
  memset(&p, 0, sizeof(p));
  prefix(r, &p.size, &p.magic, &p.version, (uint32_t)sizeof(epf_plan_t), EPF_PLAN_MAGIC, EPF_PLAN_VERSION);
  /* a plan from this build, or from one with other compile-time limits */
  p.build_signature = (u8(r) & 3) == 0 ? u64(r) : epf_build_signature();
  want = p.magic == EPF_PLAN_MAGIC && p.version >= 1u && p.size >= (uint32_t)sizeof(epf_plan_t)
             ? (p.build_signature == epf_build_signature() ? EPF_OK : EPF_ERR_BUILD_MISMATCH)
             : EPF_ERR_STRUCT_VERSION;
  CHECK_STATUS(epf_plan_check(&p), want);
  CHECK_STATUS(epf_plan_check(NULL), EPF_ERR_INVALID_ARGUMENT);
}

/* returns the plan's status; *p the plan */
static epf_status_t check_plan(const epf_config_t* in, epf_status_t resolve_st, const epf_config_t* c,
                               epf_plan_t* p, rd_t* r) {
  want_plan_t w;
  epf_status_t st, want_st = resolve_st;
  uint64_t end = 0;
  int i;
  g_what = "plan_compute";
  CHECK_STATUS(epf_plan_compute(NULL, p), EPF_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(epf_plan_compute(in, NULL), EPF_ERR_INVALID_ARGUMENT);
  memset(&w, 0, sizeof(w));
  if (want_st == EPF_OK) {
    u128 total = 0;
    want_plan(c, &w);
    /* no size overflow: every region, aligned, fits below 2^63 */
    for (i = 0; i < EPF_REGION_COUNT; ++i) total += up(w.region[i], EPF_ALIGN);
    if (total >= ((u128)1 << 63)) want_st = EPF_ERR_SIZE_OVERFLOW;
  }
  memset(p, 0x5A, sizeof(*p));
  st = epf_plan_compute(in, p);
  CHECK_STATUS(st, want_st);
  CHECK_EQ(p->size, sizeof(epf_plan_t));
  CHECK_EQ(p->magic, EPF_PLAN_MAGIC);
  CHECK_EQ(p->version, EPF_PLAN_VERSION);
  CHECK_STATUS(epf_plan_check(p), EPF_OK);
  if (st != EPF_OK) {
    /* zeroed body (the prefix and the build signature stay) */
    CHECK(bytes_zero(p, offsetof(epf_plan_t, flags), offsetof(epf_plan_t, build_signature)));
    CHECK_EQ(p->build_signature, epf_build_signature());
    return st;
  }
  /* the resolved fields */
  CHECK_EQ(p->flags, c->flags);
  CHECK_EQ(p->nranks, c->nranks);
  CHECK_EQ(p->num_experts, c->num_experts);
  CHECK_EQ(p->experts_per_rank, c->num_experts / c->nranks);
  CHECK_EQ(p->top_k, c->top_k);
  CHECK_EQ(p->hidden, c->hidden);
  CHECK_EQ(p->max_tokens_per_rank, c->max_tokens_per_rank);
  CHECK_EQ(p->mode, c->mode);
  CHECK_EQ(p->layout, c->layout);
  CHECK_EQ(p->payload, c->payload);
  CHECK_EQ(p->combine_payload, c->combine_payload);
  CHECK_EQ(p->scale_layout, c->scale_layout);
  CHECK_EQ(p->expert_alignment, c->expert_alignment);
  CHECK(p->config_hash == epf_config_hash(c) && p->config_hash != 0);
  CHECK(p->timeout_ns == c->timeout_ns);
  CHECK((u128)p->recv_capacity == w.recv_capacity && p->recv_capacity >= 1);
  CHECK((u128)p->row_bytes == w.row_bytes);
  CHECK((u128)p->scale_bytes_per_row == w.scale_bytes_per_row);
  CHECK((u128)p->meta_bytes_per_row == w.meta_bytes_per_row);
  CHECK((u128)p->combine_row_bytes == w.combine_row_bytes);
  /* every region: documented size, aligned, in address order, not overlapping, inside the slice */
  g_what = "plan regions";
  CHECK(p->region[EPF_REGION_HEADER].offset == 0);
  CHECK(p->region[EPF_REGION_HEADER].bytes >= sizeof(epf_window_header_t));
  for (i = 0; i < EPF_REGION_COUNT; ++i) {
    const epf_region_t* g = &p->region[i];
    if ((u128)g->bytes != w.region[i]) {
      fprintf(stderr, "fuzz_host: region %s: %llu bytes, want %llu\n", epf_region_name((epf_region_id_t)i),
              (unsigned long long)g->bytes, (unsigned long long)w.region[i]);
      CHECK((u128)g->bytes == w.region[i]);
    }
    CHECK(g->offset % EPF_ALIGN == 0);
    CHECK(g->offset >= end);
    CHECK((u128)g->offset + g->bytes <= (u128)p->total_bytes);
    end = g->offset + g->bytes;
  }
  CHECK(p->total_bytes % EPF_ALIGN == 0);
  CHECK(p->total_bytes - end < EPF_ALIGN);
  CHECK(p->total_bytes < ((uint64_t)1 << 63));
  check_plan_accessors(p, r);
  return st;
}

/* ---- route memory ----------------------------------------------------------------------------------- */

typedef struct {
  epf_status_t st;
  int32_t index_type, top_k, max_tokens, max_blocks, exchange;
  uint32_t flags;
  u128 array[EPF_ROUTE_ARRAY_COUNT];
} want_route_t;

/* epf_route_layout_compute's documented statuses, in order, and array sizes */
static void want_route(const epf_plan_t* p, const epf_route_config_t* c, want_route_t* w) {
  u128 R, E, EL, T, K, B;
  int rm, i;
  memset(w, 0, sizeof(*w));
  w->st = EPF_ERR_STRUCT_VERSION;
  if (p->magic != EPF_PLAN_MAGIC || p->version < 1u || p->size < (uint32_t)sizeof(epf_plan_t)) return;
  if (c->magic != EPF_ROUTE_CONFIG_MAGIC || c->version < 1u || c->size < (uint32_t)sizeof(epf_route_config_t))
    return;
  w->st = EPF_ERR_RANKS;
  if (p->nranks < 1 || p->nranks > EPF_MAX_RANKS) return;
  w->st = EPF_ERR_EXPERTS;
  if (p->num_experts < 1 || p->num_experts > EPF_MAX_EXPERTS) return;
  w->st = EPF_ERR_EXPERTS_NOT_DIVISIBLE;
  if (p->num_experts % p->nranks != 0 || p->experts_per_rank != p->num_experts / p->nranks) return;
  w->st = EPF_ERR_TOPK;
  if (p->top_k < 1 || p->top_k > EPF_MAX_TOPK) return;
  w->st = EPF_ERR_TOKENS;
  if (p->max_tokens_per_rank < 1 || p->max_tokens_per_rank > EPF_MAX_TOKENS_PER_RANK) return;
  w->st = EPF_ERR_ALIGNMENT;
  if (!pow2_in(p->expert_alignment, 1024)) return;
  w->st = EPF_ERR_LAYOUT;
  if (p->layout != 1 && p->layout != 2) return;
  w->st = EPF_ERR_MODE;
  if (p->mode != 1 && p->mode != 2) return;
  w->st = EPF_ERR_INVALID_ARGUMENT;
  w->index_type = c->index_type == 0 ? EPF_INDEX_INT64 : c->index_type;
  if (w->index_type != 1 && w->index_type != 2) return;
  w->st = EPF_ERR_TOPK;
  w->top_k = c->top_k == 0 ? p->top_k : c->top_k;
  if (w->top_k < 1 || w->top_k > p->top_k) return;
  w->st = EPF_ERR_TOKENS;
  w->max_tokens = c->max_tokens == 0 ? p->max_tokens_per_rank : c->max_tokens;
  if (w->max_tokens < 1 || w->max_tokens > p->max_tokens_per_rank) return;
  w->st = EPF_ERR_INVALID_ARGUMENT;
  w->max_blocks = c->max_blocks == 0 ? 32 : c->max_blocks;
  if (w->max_blocks < 1 || w->max_blocks > 64) return;
  w->st = EPF_ERR_FLAGS;
  if (c->flags > 3u) return;
  w->flags = c->flags | (p->mode == 2 ? 1u : 0u);
  w->exchange = (w->flags & 1u) == 0u;
  R = (u128)p->nranks;
  E = (u128)p->num_experts;
  EL = E / R;
  T = (u128)w->max_tokens;
  K = (u128)w->top_k;
  B = (u128)w->max_blocks;
  rm = p->layout == 2;
  w->st = EPF_ERR_SIZE_OVERFLOW;
  if (w->exchange && R * (u128)p->max_tokens_per_rank * (u128)p->top_k + EL * (u128)(p->expert_alignment - 1) >
                         (u128)INT32_MAX)
    return;
  w->array[EPF_ROUTE_HEADER] = 112;
  w->array[EPF_ROUTE_EXPERT_COUNT] = 4 * E;
  w->array[EPF_ROUTE_RANK_COUNT] = 4 * R;
  w->array[EPF_ROUTE_TOKEN_IN_RANK] = T * R; /* uint8 */
  w->array[EPF_ROUTE_DST_RANK] = 4 * T * K;
  w->array[EPF_ROUTE_SLOT] = 4 * T * K;
  w->array[EPF_ROUTE_RM_SLOT] = rm ? 4 * T * R : 0;
  if (w->exchange) {
    w->array[EPF_ROUTE_SEND_OFFSET] = 4 * E;
    w->array[EPF_ROUTE_SEND_RM_OFFSET] = rm ? 4 * R : 0;
    w->array[EPF_ROUTE_RECV_SEGMENT] = 16 * EL;
    w->array[EPF_ROUTE_RECV_SRC_OFFSET] = 4 * EL * (R + 1);
    w->array[EPF_ROUTE_RECV_RM_OFFSET] = rm ? 4 * (R + 1) : 0;
    w->array[EPF_ROUTE_SEND_SEGMENT] = 16 * E;
  }
  w->array[EPF_ROUTE_SCRATCH] = 8 * B * (E + R + 1);
  {
    u128 total = 0;
    for (i = 0; i < EPF_ROUTE_ARRAY_COUNT; ++i) total += up(w->array[i], EPF_ALIGN);
    if (total > ((u128)1 << 62)) return;
  }
  w->st = EPF_OK;
}

static void read_route_config(rd_t* r, epf_route_config_t* c, const epf_plan_t* p) {
  memset(c, 0, sizeof(*c));
  prefix(r, &c->size, &c->magic, &c->version, (uint32_t)sizeof(epf_route_config_t), EPF_ROUTE_CONFIG_MAGIC,
         EPF_ROUTE_CONFIG_VERSION);
  c->index_type = enum_field(r, 2);
  c->top_k = field(r, 1, p->top_k > 0 ? p->top_k : 1, 1, p->top_k);
  c->max_tokens = field(r, 1, p->max_tokens_per_rank > 0 ? p->max_tokens_per_rank : 1, 1, p->max_tokens_per_rank);
  c->max_blocks = field(r, 1, EPF_ROUTE_MAX_BLOCKS, 1, EPF_ROUTE_MAX_BLOCKS);
  {
    const uint8_t f = u8(r);
    c->flags = f < 240 ? (uint32_t)(f & 3u) : u32(r);
  }
}

/* a plan that crossed an FFI: one field possibly broken */
static void mutate_plan(rd_t* r, epf_plan_t* p) {
  const uint8_t s = u8(r);
  int32_t* f[] = {&p->nranks, &p->num_experts, &p->experts_per_rank, &p->top_k, &p->max_tokens_per_rank,
                  &p->expert_alignment, &p->layout, &p->mode};
  if (s < 224) return;
  if ((s & 15) < 8) {
    *f[s & 7] = field(r, 1, 1024, 1, (s & 16) ? EPF_MAX_RANKS : EPF_MAX_EXPERTS);
  } else {
    prefix(r, &p->size, &p->magic, &p->version, (uint32_t)sizeof(epf_plan_t), EPF_PLAN_MAGIC, EPF_PLAN_VERSION);
  }
}

static void check_route_layout_fields(const epf_route_layout_t* L, const epf_plan_t* p, const want_route_t* w) {
  uint64_t end = 0;
  int i;
  CHECK_EQ(L->flags, w->flags);
  CHECK_EQ(L->nranks, p->nranks);
  CHECK_EQ(L->num_experts, p->num_experts);
  CHECK_EQ(L->experts_per_rank, p->experts_per_rank);
  CHECK_EQ(L->top_k, w->top_k);
  CHECK_EQ(L->max_tokens, w->max_tokens);
  CHECK_EQ(L->index_type, w->index_type);
  CHECK_EQ(L->max_blocks, w->max_blocks);
  CHECK_EQ(L->plan_layout, p->layout);
  CHECK_EQ(L->plan_mode, p->mode);
  CHECK_EQ(L->expert_alignment, p->expert_alignment);
  CHECK_EQ(L->exchange, w->exchange);
  CHECK_EQ(L->reserved0, 0);
  CHECK(L->recv_capacity == p->recv_capacity);
  CHECK(L->config_hash == p->config_hash);
  g_what = "route arrays";
  CHECK(L->array[EPF_ROUTE_HEADER].offset == 0);
  for (i = 0; i < EPF_ROUTE_ARRAY_COUNT; ++i) {
    const epf_region_t* a = &L->array[i];
    if ((u128)a->bytes != w->array[i]) {
      fprintf(stderr, "fuzz_host: route array %s: %llu bytes, want %llu\n",
              epf_route_array_name((epf_route_array_id_t)i), (unsigned long long)a->bytes,
              (unsigned long long)w->array[i]);
      CHECK((u128)a->bytes == w->array[i]);
    }
    CHECK(a->offset % EPF_ALIGN == 0);
    CHECK(a->offset >= end);
    CHECK((u128)a->offset + a->bytes <= (u128)L->total_bytes);
    end = a->offset + a->bytes;
  }
  CHECK(L->total_bytes % EPF_ALIGN == 0);
  CHECK(L->total_bytes - end < EPF_ALIGN);
  CHECK(L->total_bytes <= ((uint64_t)1 << 62));
}

/* epf_route_header_check's documented statuses, in order */
static epf_status_t want_header_check(const epf_route_header_t* h, const epf_plan_t* p, uint64_t buffer_bytes) {
  epf_route_config_t c = EPF_ROUTE_CONFIG_INIT;
  want_route_t w;
  if (h->magic != EPF_ROUTE_MAGIC || h->version != EPF_ROUTE_VERSION || h->size != (uint32_t)sizeof(*h))
    return EPF_ERR_STRUCT_VERSION;
  if (p->magic != EPF_PLAN_MAGIC || p->version < 1u || p->size < (uint32_t)sizeof(epf_plan_t))
    return EPF_ERR_STRUCT_VERSION;
  if (h->config_hash != p->config_hash || h->nranks != p->nranks || h->num_experts != p->num_experts)
    return EPF_ERR_CONFIG_MISMATCH;
  /* the recorded state is resolved: a 0 there is not a default but a bad value */
  c.index_type = h->index_type == 0 ? -1 : h->index_type;
  c.top_k = h->top_k == 0 ? -1 : h->top_k;
  c.max_tokens = h->max_tokens == 0 ? -1 : h->max_tokens;
  c.max_blocks = h->max_blocks == 0 ? -1 : h->max_blocks;
  c.flags = h->flags;
  want_route(p, &c, &w);
  if (w.st != EPF_OK) return w.st;
  {
    u128 total = 0;
    int i;
    for (i = 0; i < EPF_ROUTE_ARRAY_COUNT; ++i) total += up(w.array[i], EPF_ALIGN);
    if ((u128)h->total_bytes != total || h->flags != w.flags) return EPF_ERR_CONFIG_MISMATCH;
    if ((u128)buffer_bytes < total) return EPF_ERR_INVALID_ARGUMENT;
  }
  if (h->num_tokens < 0 || h->num_tokens > h->max_tokens) return EPF_ERR_TOKENS;
  if (h->rank < -1 || h->rank >= h->nranks) return EPF_ERR_RANK;
  return EPF_OK;
}

static void mutate_header(rd_t* r, epf_route_header_t* h) {
  const uint8_t s = u8(r);
  if (s < 96) return;
  switch (s & 15) {
    case 0: h->size = u32(r); break;
    case 1: h->magic ^= 1u << (u8(r) & 31); break;
    case 2: h->version = u8(r) & 3u; break;
    case 3: h->config_hash ^= (uint64_t)1 << (u8(r) & 63); break;
    case 4: h->total_bytes += (uint64_t)(int64_t)(int8_t)u8(r) * EPF_ALIGN; break;
    case 5: h->nranks = field(r, 1, EPF_MAX_RANKS, 1, EPF_MAX_RANKS); break;
    case 6: h->num_experts = field(r, 1, EPF_MAX_EXPERTS, 1, EPF_MAX_EXPERTS); break;
    case 7: h->top_k = field(r, 1, EPF_MAX_TOPK, 1, h->top_k); break;
    case 8: h->max_tokens = field(r, 1, EPF_MAX_TOKENS_PER_RANK, 1, h->max_tokens); break;
    case 9: h->index_type = enum_field(r, 2); break;
    case 10: h->max_blocks = field(r, 1, EPF_ROUTE_MAX_BLOCKS, 1, EPF_ROUTE_MAX_BLOCKS); break;
    case 11: h->flags = u8(r) < 200 ? (uint32_t)(u8(r) & 3u) : u32(r); break;
    case 12: h->rank = field(r, -1, h->nranks - 1, 1, h->nranks); break;
    case 13: h->num_tokens = field(r, 0, h->max_tokens, 1, h->max_tokens); break;
    case 14: h->epoch = u32(r); h->status = u32(r); h->recv_rows = (int64_t)u64(r); break; /* free fields */
    default: h->dropped_routes = u32(r); h->barrier = u64(r); break;
  }
}

static void check_route(rd_t* r, const epf_plan_t* plan_in) {
  epf_plan_t plan = *plan_in;
  epf_route_config_t cfg;
  epf_route_layout_t L, L2;
  want_route_t w;
  uint64_t bytes = 1;
  epf_status_t st;
  mutate_plan(r, &plan);
  read_route_config(r, &cfg, &plan);
  g_rcfg = cfg;
  g_what = "route layout";
  CHECK_STATUS(epf_route_layout_compute(NULL, &cfg, &L), EPF_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(epf_route_layout_compute(&plan, NULL, &L), EPF_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(epf_route_layout_compute(&plan, &cfg, NULL), EPF_ERR_INVALID_ARGUMENT);
  want_route(&plan, &cfg, &w);
  memset(&L, 0x5A, sizeof(L));
  st = epf_route_layout_compute(&plan, &cfg, &L);
  CHECK_STATUS(st, w.st);
  CHECK_EQ(L.size, sizeof(epf_route_layout_t));
  CHECK_EQ(L.magic, EPF_ROUTE_LAYOUT_MAGIC);
  CHECK_EQ(L.version, EPF_ROUTE_LAYOUT_VERSION);
  g_what = "route size";
  CHECK_STATUS(epf_route_size(&plan, &cfg, NULL), EPF_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(epf_route_size(&plan, &cfg, &bytes), st);
  if (st != EPF_OK) {
    g_what = "route layout refused";
    CHECK(bytes_zero(&L, offsetof(epf_route_layout_t, flags), sizeof(L)));
    CHECK(bytes == 0);
    return;
  }
  CHECK(bytes == L.total_bytes);
  check_route_layout_fields(&L, &plan, &w);

  /* header: init + check round trip, then one field changed */
  {
    epf_route_header_t h;
    const uint32_t epoch = u32(r);
    uint64_t buffer_bytes;
    g_what = "route header";
    memset(&h, 0x5A, sizeof(h));
    epf_route_header_init(&L, epoch, &h);
    CHECK_EQ(h.size, sizeof(epf_route_header_t));
    CHECK_EQ(h.magic, EPF_ROUTE_MAGIC);
    CHECK_EQ(h.version, EPF_ROUTE_VERSION);
    CHECK_EQ(h.epoch, epoch);
    CHECK(h.config_hash == L.config_hash && h.total_bytes == L.total_bytes);
    CHECK(h.nranks == L.nranks && h.num_experts == L.num_experts && h.top_k == L.top_k);
    CHECK(h.max_tokens == L.max_tokens && h.index_type == L.index_type && h.max_blocks == L.max_blocks);
    CHECK(h.flags == L.flags && h.rank == -1 && h.num_tokens == 0);
    CHECK(h.dropped_routes == 0 && h.status == 0 && h.reserved0 == 0);
    CHECK(h.recv_rows == 0 && h.recv_rows_em == 0 && h.recv_overflow == 0);
    CHECK(h.barrier == (uint64_t)epoch << 32);
    CHECK_STATUS(epf_route_header_check(NULL, &plan, L.total_bytes, &L2), EPF_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(epf_route_header_check(&h, NULL, L.total_bytes, &L2), EPF_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(epf_route_header_check(&h, &plan, L.total_bytes, NULL), EPF_ERR_INVALID_ARGUMENT);
    memset(&L2, 0x5A, sizeof(L2));
    CHECK_STATUS(epf_route_header_check(&h, &plan, L.total_bytes, &L2), EPF_OK);
    CHECK(memcmp(&L2, &L, sizeof(L)) == 0);
    CHECK_STATUS(epf_route_header_check(&h, &plan, L.total_bytes - 1, &L2), EPF_ERR_INVALID_ARGUMENT);
    mutate_header(r, &h);
    buffer_bytes = (u8(r) & 7) == 0 ? u64(r) : L.total_bytes;
    g_what = "route header (changed)";
    {
      epf_plan_t hp = plan; /* sometimes a plan with a broken prefix */
      if ((u8(r) & 15) == 15)
        prefix(r, &hp.size, &hp.magic, &hp.version, (uint32_t)sizeof(epf_plan_t), EPF_PLAN_MAGIC, EPF_PLAN_VERSION);
      CHECK_STATUS(epf_route_header_check(&h, &hp, buffer_bytes, &L2), want_header_check(&h, &hp, buffer_bytes));
    }
  }

  /* pointers: buffer `index` of a group at a fake device address (never dereferenced) */
  {
    epf_route_t route;
    const int count = (u8(r) & 1) ? 1 : plan.nranks;
    const int index = (int)(u32(r) % (uint32_t)count);
    const uintptr_t base = (uintptr_t)1 << 40;
    int i;
    g_what = "route pointers";
    memset(&route, 0, sizeof(route));
    route.size = (uint32_t)sizeof(route);
    route.magic = EPF_ROUTE_HANDLE_MAGIC;
    route.version = EPF_ROUTE_HANDLE_VERSION;
    route.count = count;
    route.base = (void*)base;
    route.layout = L;
    for (i = 0; i < EPF_ROUTE_ARRAY_COUNT; ++i) {
      const uintptr_t got = (uintptr_t)epf_route_ptr(&route, index, (epf_route_array_id_t)i);
      if (L.array[i].bytes == 0)
        CHECK(got == 0);
      else
        CHECK(got == base + (uintptr_t)((uint64_t)index * L.total_bytes + L.array[i].offset));
    }
    CHECK((uintptr_t)epf_route_epoch_ptr(&route, index) ==
          base + (uintptr_t)((uint64_t)index * L.total_bytes + offsetof(epf_route_header_t, epoch)));
    route.epoch_words = (uint32_t*)((uintptr_t)1 << 44);
    CHECK((uintptr_t)epf_route_epoch_ptr(&route, index) == ((uintptr_t)1 << 44) + 4u * (uintptr_t)index);
  }
}

/* ---- entry point ---------------------------------------------------------------------------------------- */

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rd_t r;
  epf_config_t resolved;
  epf_plan_t plan;
  epf_status_t st;
  struct {
    epf_config_t cfg;
    uint8_t tail[64]; /* a newer caller's larger struct: tail ignored */
  } big;
  size_t i;
  r.p = data;
  r.n = size;
  r.i = 0;
  memset(&g_rcfg, 0, sizeof(g_rcfg));
  read_config(&r, &big.cfg);
  for (i = 0; i < sizeof(big.tail); ++i) big.tail[i] = (uint8_t)(0xA5 ^ i);
  g_cfg = big.cfg;

  st = check_config(&big.cfg, &resolved);
  st = check_plan(&big.cfg, st, &resolved, &plan, &r);
  if (st == EPF_OK) check_route(&r, &plan);
  check_plan_prefix(&r);
  check_names(&r);
  check_error_record(&r);
  return 0;
}
/* SPDX-License-Identifier: Apache-2.0 */
