/* test_host — host.h: defaults, every validation error, the window plan, hashes, status strings,
 * the error record and the version. Plain C11, no CUDA. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epf_cmocka.h"
#include "epf_rng.h"

#include "epfuse/host.h"

/* ---- helpers ---------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static int rnd_in(int lo, int hi) { return epf_rng_in(&rng_state, lo, hi); }

static epf_config_t small_config(void) {
  epf_config_t c = EPF_CONFIG_INIT;
  c.nranks = 8;
  c.num_experts = 64;
  c.top_k = 4;
  c.hidden = 1024;
  c.max_tokens_per_rank = 128;
  return c;
}

/* ---- defaults --------------------------------------------------------------------------------- */

static void test_defaults(void** state) {
  epf_config_t in = EPF_CONFIG_INIT, out;
  (void)state;
  assert_int_equal(epf_config_resolve(&in, &out), EPF_OK);
  assert_int_equal(out.nranks, 1);
  assert_int_equal(out.num_experts, EPF_DEFAULT_NUM_EXPERTS);
  assert_int_equal(out.top_k, EPF_DEFAULT_TOPK);
  assert_int_equal(out.hidden, EPF_DEFAULT_HIDDEN);
  assert_int_equal(out.max_tokens_per_rank, EPF_DEFAULT_TOKENS_HT);
  assert_int_equal(out.mode, EPF_MODE_HT);
  assert_int_equal(out.layout, EPF_LAYOUT_EXPERT_MAJOR);
  assert_int_equal(out.payload, EPF_PAYLOAD_BF16);
  assert_int_equal(out.combine_payload, EPF_PAYLOAD_BF16);
  assert_int_equal(out.scale_layout, EPF_SCALE_LAYOUT_COMPACT);
  assert_int_equal(out.expert_alignment, 1);
  assert_int_equal(out.flags, 0);
  assert_true(out.timeout_ns == EPF_DEFAULT_TIMEOUT_NS);
  /* worst case: 1 source x 4096 tokens x min(8, 256) copies */
  assert_true(out.recv_capacity == 4096 * 8);

  in.mode = EPF_MODE_LL;
  assert_int_equal(epf_config_resolve(&in, &out), EPF_OK);
  assert_int_equal(out.max_tokens_per_rank, EPF_DEFAULT_TOKENS_LL);
  assert_true(out.recv_capacity == 0);

  /* worst case with alignment padding and rank-major */
  in = small_config();
  in.expert_alignment = 128;
  assert_int_equal(epf_config_resolve(&in, &out), EPF_OK);
  assert_true(out.recv_capacity == 8 * 128 * 4 + 8 * 127);
  in.layout = EPF_LAYOUT_RANK_MAJOR;
  in.expert_alignment = 0;
  assert_int_equal(epf_config_resolve(&in, &out), EPF_OK);
  assert_true(out.recv_capacity == 8 * 128);
  /* top_k above experts per rank: a token lands at most experts_per_rank times on one rank */
  in = small_config();
  in.num_experts = 16; /* 2 per rank */
  in.top_k = 8;
  assert_int_equal(epf_config_resolve(&in, &out), EPF_OK);
  assert_true(out.recv_capacity == 8 * 128 * 2);
  /* resolve is idempotent and may alias */
  in = small_config();
  assert_int_equal(epf_config_resolve(&in, &in), EPF_OK);
  out = in;
  assert_int_equal(epf_config_resolve(&in, &in), EPF_OK);
  assert_memory_equal(&in, &out, sizeof(in));
}

/* ---- resolve is idempotent, for every layout and mode (issue #14 item 7) ------------------------ */

/* RANK_MAJOR receives one unpadded row per (token, destination rank): its worst case (R * T = 64
 * rows here) may be below expert_alignment (128), which pads only the expert-major layout. resolve
 * used to accept this config and fill in 64, which validate, a second resolve and plan_compute
 * then refused with EPF_ERR_RECV_CAPACITY (the rule recv_capacity >= expert_alignment). */
static void test_resolve_rank_major_small(void** state) {
  epf_config_t in = EPF_CONFIG_INIT, r1, r2;
  epf_plan_t plan;
  (void)state;
  in.nranks = 1;
  in.num_experts = 8;
  in.top_k = 1;
  in.hidden = 1024;
  in.max_tokens_per_rank = 64;
  in.expert_alignment = 128;
  in.layout = EPF_LAYOUT_RANK_MAJOR;
  assert_int_equal(epf_config_resolve(&in, &r1), EPF_OK);
  assert_true(r1.recv_capacity == 64);
  assert_int_equal(epf_config_validate(&r1), EPF_OK);
  assert_int_equal(epf_config_resolve(&r1, &r2), EPF_OK);
  assert_memory_equal(&r1, &r2, sizeof(r1));
  assert_int_equal(epf_plan_compute(&in, &plan), EPF_OK);
  assert_true(plan.recv_capacity == 64);
  assert_int_equal(epf_plan_compute(&r1, &plan), EPF_OK);
  /* RANK_MAJOR: any capacity of at least one row; EXPERT_MAJOR keeps one aligned segment */
  in.recv_capacity = 1;
  assert_int_equal(epf_config_resolve(&in, &r1), EPF_OK);
  in.recv_capacity = 0;
  in.max_tokens_per_rank = 0; /* -> 4096 */
  assert_int_equal(epf_config_resolve(&in, &r1), EPF_OK);
  in.layout = EPF_LAYOUT_EXPERT_MAJOR;
  in.recv_capacity = 127;
  assert_int_equal(epf_config_resolve(&in, &r1), EPF_ERR_RECV_CAPACITY);
  in.recv_capacity = 128;
  assert_int_equal(epf_config_resolve(&in, &r1), EPF_OK);
}

/* resolving a resolved config gives the same config and the same status, whatever the status */
static void test_resolve_idempotent(void** state) {
  int n, i, ok = 0;
  (void)state;
  for (n = 0; n < 50000; ++n) {
    epf_config_t c = EPF_CONFIG_INIT, r1, r2;
    epf_status_t s1, s2;
    int32_t* f[] = {&c.nranks, &c.num_experts, &c.top_k, &c.hidden, &c.max_tokens_per_rank, &c.mode,
                    &c.layout, &c.payload, &c.combine_payload, &c.scale_layout, &c.expert_alignment};
    static const int32_t small[] = {0, 1, 2, 3, 8, 64, 128, 1024};
    for (i = 0; i < (int)(sizeof(f) / sizeof(f[0])); ++i) *f[i] = small[rnd_in(0, 7)];
    c.mode = rnd_in(0, 3);
    c.layout = rnd_in(0, 3);
    c.payload = rnd_in(0, 3);
    c.combine_payload = rnd_in(0, 2);
    c.scale_layout = rnd_in(0, 2);
    c.expert_alignment = rnd_in(0, 3) == 0 ? 0 : 1 << rnd_in(0, 10);
    c.recv_capacity = rnd_in(0, 2) == 0 ? 0 : rnd_in(0, 3000);
    s1 = epf_config_resolve(&c, &r1);
    s2 = epf_config_resolve(&r1, &r2);
    if (s1 != s2 || memcmp(&r1, &r2, sizeof(r1)) != 0)
      fail_msg("config %d (R %d E %d K %d T %d layout %d mode %d align %d cap %lld): %s, then %s", n, c.nranks,
               c.num_experts, c.top_k, c.max_tokens_per_rank, c.layout, c.mode, c.expert_alignment,
               (long long)c.recv_capacity, epf_status_name(s1), epf_status_name(s2));
    if (s1 == EPF_OK) {
      ++ok;
      assert_int_equal(epf_config_validate(&r1), EPF_OK);
    }
  }
  assert_true(ok > 1000);
}

/* ---- every validation error, with its exact status --------------------------------------------- */

typedef struct {
  const char* what;
  void (*mutate)(epf_config_t*);
  epf_status_t want;
} case_t;

#define MUT(name, body) \
  static void name(epf_config_t* c) { body; }
MUT(m_ranks0, c->nranks = -1)
MUT(m_ranks73, { c->nranks = EPF_MAX_RANKS + 1; c->num_experts = EPF_MAX_RANKS + 1; })
MUT(m_experts_neg, c->num_experts = -8)
MUT(m_experts_big, c->num_experts = EPF_MAX_EXPERTS + 8)
MUT(m_experts_div, { c->nranks = 3; c->num_experts = 64; })
MUT(m_topk_neg, c->top_k = -1)
MUT(m_topk_big, c->top_k = EPF_MAX_TOPK + 1)
MUT(m_hidden_neg, c->hidden = -16)
MUT(m_hidden_big, c->hidden = EPF_MAX_HIDDEN + 8)
MUT(m_hidden_bf16, c->hidden = 1028)
MUT(m_hidden_mx, { c->payload = EPF_PAYLOAD_MXFP8; c->hidden = 1040; })
MUT(m_hidden_fp8, { c->payload = EPF_PAYLOAD_FP8_128; c->hidden = 2880; })
MUT(m_hidden_combine_mx, { c->combine_payload = EPF_PAYLOAD_MXFP8; c->hidden = 1048; })
MUT(m_tokens_neg, c->max_tokens_per_rank = -1)
MUT(m_tokens_big, c->max_tokens_per_rank = EPF_MAX_TOKENS_PER_RANK + 1)
MUT(m_align_npot, c->expert_alignment = 96)
MUT(m_align_big, c->expert_alignment = 2048)
MUT(m_align_neg, c->expert_alignment = -4)
MUT(m_cap_neg, c->recv_capacity = -5)
MUT(m_cap_big, c->recv_capacity = (int64_t)INT32_MAX + 1)
MUT(m_cap_small, { c->expert_alignment = 128; c->recv_capacity = 100; })
MUT(m_cap_ll, { c->mode = EPF_MODE_LL; c->recv_capacity = 1000; })
MUT(m_mode, c->mode = 7)
MUT(m_layout, c->layout = 3)
MUT(m_payload, c->payload = 9)
MUT(m_combine_payload_fp8, c->combine_payload = EPF_PAYLOAD_FP8_128)
MUT(m_combine_payload_bad, c->combine_payload = -2)
MUT(m_scale_layout, c->scale_layout = 5)
MUT(m_scale_swizzle_bf16, c->scale_layout = EPF_SCALE_LAYOUT_SWIZZLED_128X4)
MUT(m_flags, c->flags = 0x100)
MUT(m_reserved, c->reserved0 = 1)
MUT(m_magic, c->magic = 0x1234)
MUT(m_version, c->version = 0)
MUT(m_size, c->size = (uint32_t)sizeof(epf_config_t) - 8)

static const case_t k_cases[] = {
    {"nranks < 1", m_ranks0, EPF_ERR_RANKS},
    {"nranks > 72", m_ranks73, EPF_ERR_RANKS},
    {"experts < 1", m_experts_neg, EPF_ERR_EXPERTS},
    {"experts > 1024", m_experts_big, EPF_ERR_EXPERTS},
    {"experts % ranks", m_experts_div, EPF_ERR_EXPERTS_NOT_DIVISIBLE},
    {"top_k < 1", m_topk_neg, EPF_ERR_TOPK},
    {"top_k > 32", m_topk_big, EPF_ERR_TOPK},
    {"hidden < 1", m_hidden_neg, EPF_ERR_HIDDEN},
    {"hidden too big", m_hidden_big, EPF_ERR_HIDDEN},
    {"hidden % 8 (BF16)", m_hidden_bf16, EPF_ERR_HIDDEN_ALIGNMENT},
    {"hidden % 32 (MXFP8)", m_hidden_mx, EPF_ERR_HIDDEN_ALIGNMENT},
    {"hidden % 128 (FP8_128, H=2880)", m_hidden_fp8, EPF_ERR_HIDDEN_ALIGNMENT},
    {"hidden % 32 (MXFP8 combine)", m_hidden_combine_mx, EPF_ERR_HIDDEN_ALIGNMENT},
    {"tokens < 1", m_tokens_neg, EPF_ERR_TOKENS},
    {"tokens > 65536", m_tokens_big, EPF_ERR_TOKENS},
    {"alignment not a power of two", m_align_npot, EPF_ERR_ALIGNMENT},
    {"alignment > 1024", m_align_big, EPF_ERR_ALIGNMENT},
    {"alignment < 0", m_align_neg, EPF_ERR_ALIGNMENT},
    {"capacity < 0", m_cap_neg, EPF_ERR_RECV_CAPACITY},
    {"capacity > INT32_MAX", m_cap_big, EPF_ERR_RECV_CAPACITY},
    {"capacity < alignment", m_cap_small, EPF_ERR_RECV_CAPACITY},
    {"capacity set in LL", m_cap_ll, EPF_ERR_RECV_CAPACITY},
    {"mode", m_mode, EPF_ERR_MODE},
    {"layout", m_layout, EPF_ERR_LAYOUT},
    {"payload", m_payload, EPF_ERR_PAYLOAD},
    {"combine payload FP8_128", m_combine_payload_fp8, EPF_ERR_PAYLOAD},
    {"combine payload unknown", m_combine_payload_bad, EPF_ERR_PAYLOAD},
    {"scale layout unknown", m_scale_layout, EPF_ERR_SCALE_LAYOUT},
    {"swizzled scales with BF16", m_scale_swizzle_bf16, EPF_ERR_SCALE_LAYOUT},
    {"flags", m_flags, EPF_ERR_FLAGS},
    {"reserved0", m_reserved, EPF_ERR_INVALID_ARGUMENT},
    {"magic", m_magic, EPF_ERR_STRUCT_VERSION},
    {"version 0", m_version, EPF_ERR_STRUCT_VERSION},
    {"size too small", m_size, EPF_ERR_STRUCT_VERSION},
};

static void test_validation_errors(void** state) {
  size_t i;
  (void)state;
  for (i = 0; i < sizeof(k_cases) / sizeof(k_cases[0]); ++i) {
    epf_config_t c = small_config(), out;
    epf_plan_t plan;
    epf_status_t st;
    k_cases[i].mutate(&c);
    st = epf_config_resolve(&c, &out);
    if (st != k_cases[i].want)
      fail_msg("%s: got %s, want %s", k_cases[i].what, epf_status_name(st), epf_status_name(k_cases[i].want));
    /* the plan refuses the same config with the same status and a zeroed body */
    st = epf_plan_compute(&c, &plan);
    assert_int_equal(st, k_cases[i].want);
    assert_true(plan.total_bytes == 0);
    assert_int_equal(epf_plan_check(&plan), EPF_OK);
  }
  /* NULL arguments */
  {
    epf_config_t c = small_config(), out;
    epf_plan_t plan;
    assert_int_equal(epf_config_resolve(NULL, &out), EPF_ERR_INVALID_ARGUMENT);
    assert_int_equal(epf_config_resolve(&c, NULL), EPF_ERR_INVALID_ARGUMENT);
    assert_int_equal(epf_config_validate(NULL), EPF_ERR_INVALID_ARGUMENT);
    assert_int_equal(epf_plan_compute(NULL, &plan), EPF_ERR_INVALID_ARGUMENT);
    assert_int_equal(epf_plan_compute(&c, NULL), EPF_ERR_INVALID_ARGUMENT);
    assert_int_equal(epf_plan_check(NULL), EPF_ERR_INVALID_ARGUMENT);
  }
  /* validate() on an unresolved config (zeros) refuses it rather than guessing */
  {
    epf_config_t c = EPF_CONFIG_INIT;
    assert_int_equal(epf_config_validate(&c), EPF_ERR_MODE);
  }
  /* top_k above num_experts is a plan: a token's ids then repeat experts, and repeats are defined
   * inputs (the first occurrence carries the token; test_route / test_ht / test_ll run K > E) */
  {
    epf_config_t c = small_config(), out;
    c.nranks = 2;
    c.num_experts = 4;
    c.top_k = 4;
    assert_int_equal(epf_config_resolve(&c, &out), EPF_OK);
    assert_int_equal(epf_config_validate(&out), EPF_OK);
    out.top_k = 5;
    assert_int_equal(epf_config_validate(&out), EPF_OK);
  }
  /* epf_config_worst_case_rows needs valid fields: -1, never a division by zero */
  {
    epf_config_t c = EPF_CONFIG_INIT, out;
    assert_int_equal(epf_config_worst_case_rows(NULL), EPF_ROW_INVALID);
    assert_int_equal(epf_config_worst_case_rows(&c), EPF_ROW_INVALID); /* unresolved: nranks 0 */
    c = small_config();
    assert_int_equal(epf_config_resolve(&c, &out), EPF_OK);
    assert_true(epf_config_worst_case_rows(&out) > 0);
    out.nranks = 0;
    assert_int_equal(epf_config_worst_case_rows(&out), EPF_ROW_INVALID);
  }
  /* the limits themselves are accepted */
  {
    epf_config_t c = small_config(), out;
    c.nranks = EPF_MAX_RANKS;
    c.num_experts = EPF_MAX_RANKS * 14; /* 1008 <= 1024 */
    c.top_k = EPF_MAX_TOPK;
    c.max_tokens_per_rank = EPF_MAX_TOKENS_PER_RANK;
    c.expert_alignment = 1024;
    c.recv_capacity = 1 << 20;
    assert_int_equal(epf_config_resolve(&c, &out), EPF_OK);
    c.hidden = 2880; /* any multiple of 8 for BF16, no whitelist */
    assert_int_equal(epf_config_resolve(&c, &out), EPF_OK);
    c.payload = EPF_PAYLOAD_MXFP8;
    c.combine_payload = EPF_PAYLOAD_MXFP8;
    c.scale_layout = EPF_SCALE_LAYOUT_SWIZZLED_128X4;
    assert_int_equal(epf_config_resolve(&c, &out), EPF_OK);
  }
}

/* A newer caller's larger struct is accepted (its tail ignored); an older, smaller one is not. */
static void test_struct_prefix(void** state) {
  struct {
    epf_config_t cfg;
    uint64_t future_fields[8];
  } big;
  epf_config_t out;
  epf_plan_t plan;
  (void)state;
  memset(&big, 0xA5, sizeof(big));
  big.cfg = small_config();
  big.cfg.size = (uint32_t)sizeof(big);
  big.cfg.version = EPF_CONFIG_VERSION + 1;
  assert_int_equal(epf_config_resolve(&big.cfg, &out), EPF_OK);
  assert_int_equal(out.size, (uint32_t)sizeof(epf_config_t));
  assert_int_equal(out.version, EPF_CONFIG_VERSION);
  assert_int_equal(epf_plan_compute(&big.cfg, &plan), EPF_OK);
  assert_int_equal(plan.size, (uint32_t)sizeof(epf_plan_t));
  assert_int_equal(plan.magic, EPF_PLAN_MAGIC);
  plan.magic ^= 1u;
  assert_int_equal(epf_plan_check(&plan), EPF_ERR_STRUCT_VERSION);
  plan.magic ^= 1u;
  plan.size = 16;
  assert_int_equal(epf_plan_check(&plan), EPF_ERR_STRUCT_VERSION);
}

/* ---- the plan --------------------------------------------------------------------------------- */

static epf_config_t random_config(void) {
  static const int payloads[] = {EPF_PAYLOAD_BF16, EPF_PAYLOAD_MXFP8, EPF_PAYLOAD_FP8_128};
  epf_config_t c = EPF_CONFIG_INIT;
  int width;
  c.nranks = rnd_in(1, EPF_MAX_RANKS);
  c.num_experts = c.nranks * rnd_in(1, EPF_MAX_EXPERTS / c.nranks);
  c.top_k = rnd_in(1, EPF_MAX_TOPK);
  c.mode = rnd_in(1, 2);
  c.layout = rnd_in(1, 2);
  c.payload = payloads[rnd_in(0, 2)];
  c.combine_payload = rnd_in(0, 1) ? EPF_PAYLOAD_MXFP8 : EPF_PAYLOAD_BF16;
  c.scale_layout = c.payload == EPF_PAYLOAD_MXFP8 && rnd_in(0, 1) ? EPF_SCALE_LAYOUT_SWIZZLED_128X4
                                                                   : EPF_SCALE_LAYOUT_COMPACT;
  width = epf_payload_vector_width(c.payload);
  if (c.combine_payload == EPF_PAYLOAD_MXFP8 && width < 32) width = 32;
  c.hidden = width * rnd_in(1, 8192 / width);
  c.max_tokens_per_rank = rnd_in(0, 3) == 0 ? rnd_in(1, EPF_MAX_TOKENS_PER_RANK) : rnd_in(1, 512);
  c.expert_alignment = 1 << rnd_in(0, 7);
  c.flags = (uint32_t)rnd_in(0, (int)EPF_FLAGS_ALL);
  if (c.mode == EPF_MODE_HT && rnd_in(0, 1)) c.recv_capacity = rnd_in(c.expert_alignment, 1 << 20);
  return c;
}

/* sizes recomputed here from the documented formulas, independently of host.h's code */
static void expected_sizes(const epf_config_t* r, uint64_t* s) {
  uint64_t R = (uint64_t)r->nranks, E = (uint64_t)r->num_experts, EL = E / R;
  uint64_t T = (uint64_t)r->max_tokens_per_rank, K = (uint64_t)r->top_k, H = (uint64_t)r->hidden;
  int em = r->layout == EPF_LAYOUT_EXPERT_MAJOR, ll = r->mode == EPF_MODE_LL;
  uint64_t rows = ll ? 2 * (em ? EL : 1) * R * T : (uint64_t)r->recv_capacity;
  uint64_t row_bytes = r->payload == EPF_PAYLOAD_BF16 ? 2 * H : H;
  uint64_t scale = r->payload == EPF_PAYLOAD_MXFP8 ? H / 32 : r->payload == EPF_PAYLOAD_FP8_128 ? H / 32 : 0;
  uint64_t meta = em ? 16 : (16 + 12 * K + 15) / 16 * 16;
  uint64_t crow = r->combine_payload == EPF_PAYLOAD_MXFP8 ? (H + H / 32 + 15) / 16 * 16 : 2 * H;
  uint64_t crows = T * (em ? K : R) * (ll ? 2 : ((r->flags & EPF_FLAG_COMBINE_PUSH) ? 1 : 0));
  int i;
  for (i = 0; i < EPF_REGION_COUNT; ++i) s[i] = 0;
  s[EPF_REGION_HEADER] = (sizeof(epf_window_header_t) + EPF_ALIGN - 1) / EPF_ALIGN * EPF_ALIGN;
  s[EPF_REGION_SIG_COUNT] = s[EPF_REGION_SIG_DISPATCH] = s[EPF_REGION_SIG_COMBINE] =
      s[EPF_REGION_SIG_BARRIER] = 8 * R;
  s[EPF_REGION_SIG_LL_DISPATCH] = ll ? 8 * 2 * EL * R : 0;
  s[EPF_REGION_SIG_LL_COMBINE] = ll ? 8 * 2 * R : 0;
  s[EPF_REGION_COUNTS] = 8 * 2 * R * (E + R);
  s[EPF_REGION_RECV_TOKENS] = rows * row_bytes;
  s[EPF_REGION_RECV_SCALES] = r->scale_layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4
                                  ? (rows + 127) / 128 * 128 * ((H / 32 + 3) / 4 * 4)
                                  : rows * scale;
  /* GEMM-ready scales of HT EXPERT_MAJOR: then one 16-byte aligned compact stage run per row */
  if (!ll && em && r->payload != EPF_PAYLOAD_BF16 &&
      (r->scale_layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4 || r->scale_layout == EPF_SCALE_LAYOUT_SEGMENT_MN_MAJOR))
    s[EPF_REGION_RECV_SCALES] += rows * ((scale + 15) / 16 * 16);
  s[EPF_REGION_RECV_META] = rows * meta;
  s[EPF_REGION_COMBINE] = crows * crow;
  s[EPF_REGION_EXPERT_OUT] = (!ll && !(r->flags & EPF_FLAG_COMBINE_PUSH) &&
                              (r->payload != EPF_PAYLOAD_BF16 || r->combine_payload != EPF_PAYLOAD_BF16))
                                 ? rows * crow
                                 : 0;
  /* LL expert-major MXFP8 pull combine: the quantized outputs at the receive rows */
  if (ll && em && !(r->flags & EPF_FLAG_COMBINE_PUSH) && r->combine_payload == EPF_PAYLOAD_MXFP8)
    s[EPF_REGION_EXPERT_OUT] = rows * crow;
}

static void test_plan_random(void** state) {
  int n, ok = 0;
  (void)state;
  for (n = 0; n < 20000; ++n) {
    epf_config_t c = random_config(), r;
    epf_plan_t p;
    uint64_t want[EPF_REGION_COUNT], end = 0;
    epf_status_t st_resolve = epf_config_resolve(&c, &r);
    epf_status_t st = epf_plan_compute(&c, &p);
    int i;
    assert_int_equal(st, st_resolve);
    if (st != EPF_OK) continue;
    ++ok;
    assert_int_equal(p.config_hash, epf_config_hash(&r));
    assert_true(p.recv_capacity == (r.mode == EPF_MODE_LL
                                        ? (int64_t)(r.layout == EPF_LAYOUT_EXPERT_MAJOR ? r.num_experts / r.nranks : 1) *
                                              r.nranks * r.max_tokens_per_rank
                                        : r.recv_capacity));
    expected_sizes(&r, want);
    assert_true(p.region[EPF_REGION_HEADER].offset == 0);
    assert_true(p.region[EPF_REGION_HEADER].bytes >= sizeof(epf_window_header_t));
    for (i = 0; i < EPF_REGION_COUNT; ++i) {
      const epf_region_t* g = &p.region[i];
      if (g->bytes != want[i])
        fail_msg("config %d region %s: %llu bytes, want %llu", n, epf_region_name((epf_region_id_t)i),
                 (unsigned long long)g->bytes, (unsigned long long)want[i]);
      assert_true(g->offset % EPF_ALIGN == 0);
      assert_true(g->offset >= end); /* ordered, non-overlapping */
      end = g->offset + g->bytes;
    }
    assert_true(end <= p.total_bytes);
    assert_true(p.total_bytes % EPF_ALIGN == 0);
    assert_true(p.total_bytes - end < EPF_ALIGN);
    /* accessors stay inside their regions */
    assert_true(epf_plan_signal_offset(&p, EPF_REGION_SIG_BARRIER, r.nranks - 1) + 8 <=
                p.region[EPF_REGION_SIG_BARRIER].offset + p.region[EPF_REGION_SIG_BARRIER].bytes);
    assert_true(epf_plan_counts_offset(&p, 1, r.nranks - 1, r.num_experts + r.nranks - 1) + 8 ==
                p.region[EPF_REGION_COUNTS].offset + p.region[EPF_REGION_COUNTS].bytes);
    {
      int64_t last = (int64_t)(p.region[EPF_REGION_RECV_TOKENS].bytes / p.row_bytes) - 1;
      assert_true(epf_plan_recv_token_offset(&p, last) + p.row_bytes ==
                  p.region[EPF_REGION_RECV_TOKENS].offset + p.region[EPF_REGION_RECV_TOKENS].bytes);
      assert_true(epf_plan_recv_meta_offset(&p, last) + p.meta_bytes_per_row ==
                  p.region[EPF_REGION_RECV_META].offset + p.region[EPF_REGION_RECV_META].bytes);
      if (p.region[EPF_REGION_EXPERT_OUT].bytes)
        assert_true(epf_plan_expert_out_offset(&p, last) + p.combine_row_bytes ==
                    p.region[EPF_REGION_EXPERT_OUT].offset + p.region[EPF_REGION_EXPERT_OUT].bytes);
      else
        assert_true(epf_plan_expert_out_offset(&p, last) == epf_plan_recv_token_offset(&p, last));
      if (r.scale_layout == EPF_SCALE_LAYOUT_COMPACT)
        assert_true(epf_plan_recv_scale_offset(&p, last) + p.scale_bytes_per_row ==
                    p.region[EPF_REGION_RECV_SCALES].offset + p.region[EPF_REGION_RECV_SCALES].bytes);
    }
  }
  assert_true(ok > 10000); /* most random configs are valid: the checks above really ran */
}

/* ---- hash ------------------------------------------------------------------------------------- */

static void test_hash(void** state) {
  epf_config_t a = small_config(), b;
  uint64_t h;
  (void)state;
  assert_int_equal(epf_config_resolve(&a, &a), EPF_OK);
  h = epf_config_hash(&a);
  assert_true(h != 0);
  b = a;
  assert_true(epf_config_hash(&b) == h);
  b.timeout_ns = 1; /* not part of the agreement */
  assert_true(epf_config_hash(&b) == h);
#define CHANGES(field, value) \
  b = a;                      \
  b.field = value;            \
  assert_true(epf_config_hash(&b) != h);
  CHANGES(nranks, 4)
  CHANGES(num_experts, 128)
  CHANGES(top_k, 8)
  CHANGES(hidden, 2048)
  CHANGES(max_tokens_per_rank, 129)
  CHANGES(mode, EPF_MODE_LL)
  CHANGES(layout, EPF_LAYOUT_RANK_MAJOR)
  CHANGES(payload, EPF_PAYLOAD_MXFP8)
  CHANGES(combine_payload, EPF_PAYLOAD_MXFP8)
  CHANGES(scale_layout, EPF_SCALE_LAYOUT_SWIZZLED_128X4)
  CHANGES(expert_alignment, 128)
  CHANGES(flags, EPF_FLAG_FAULT_TOLERANT)
  CHANGES(recv_capacity, a.recv_capacity + 1)
#undef CHANGES
}

/* ---- status strings --------------------------------------------------------------------------- */

#define EXPECT_NAME(name, value, message)                     \
  assert_string_equal(epf_status_name(name), #name);          \
  assert_string_equal(epf_status_message(name), message);     \
  assert_int_equal((int)name, value);                         \
  assert_true(strlen(message) > 5);
static void test_status_strings(void** state) {
  int i, j;
  (void)state;
  EPF_STATUS_LIST(EXPECT_NAME)
  assert_int_equal(EPF_OK, 0);
  assert_string_equal(epf_status_name((epf_status_t)EPF_STATUS_COUNT), "EPF_STATUS_UNKNOWN");
  assert_string_equal(epf_status_name((epf_status_t)-1), "EPF_STATUS_UNKNOWN");
  assert_string_equal(epf_status_message((epf_status_t)9999), "unknown status code");
  /* dense, and every message distinct */
  for (i = 0; i < EPF_STATUS_COUNT; ++i) {
    assert_string_not_equal(epf_status_name((epf_status_t)i), "EPF_STATUS_UNKNOWN");
    for (j = 0; j < i; ++j)
      assert_string_not_equal(epf_status_message((epf_status_t)i), epf_status_message((epf_status_t)j));
  }
  for (i = 0; i < EPF_REGION_COUNT; ++i)
    assert_string_not_equal(epf_region_name((epf_region_id_t)i), "UNKNOWN");
}

/* ---- error record ----------------------------------------------------------------------------- */

static void test_error_record(void** state) {
  epf_error_record_t rec, out;
  (void)state;
  memset(&rec, 0x5a, sizeof(rec));
  epf_error_clear(&rec);
  epf_error_read(&rec, &out);
  assert_int_equal(out.valid, 0);
  assert_int_equal(out.status, EPF_OK);
  assert_int_equal(out.count, 0);
  rec.status = EPF_ERR_TIMEOUT;
  rec.count = 3;
  rec.peer = 5;
  rec.wanted = 77;
  rec.seen = 76;
  rec.recv_overflow = 12;
  rec.valid = 1;
  epf_error_read(&rec, &out);
  assert_int_equal(out.valid, 1);
  assert_int_equal(out.status, EPF_ERR_TIMEOUT);
  assert_int_equal(out.count, 3);
  assert_int_equal(out.peer, 5);
  assert_true(out.wanted == 77 && out.seen == 76);
  assert_int_equal(out.recv_overflow, 12);
}

/* ---- version ---------------------------------------------------------------------------------- */

static void test_version(void** state) {
  char buf[32];
  (void)state;
  assert_string_equal(EPF_VERSION_STRING, EPF_PROJECT_VERSION); /* version.h == project(VERSION) */
  snprintf(buf, sizeof(buf), "%d.%d.%d", EPF_VERSION_MAJOR, EPF_VERSION_MINOR, EPF_VERSION_PATCH);
  assert_string_equal(buf, EPF_VERSION_STRING);
  assert_int_equal(epf_version(), EPF_VERSION);
  assert_int_equal(EPF_VERSION, EPF_VERSION_MAJOR * 100000 + EPF_VERSION_MINOR * 100 + EPF_VERSION_PATCH);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),       cmocka_unit_test(test_validation_errors),
      cmocka_unit_test(test_struct_prefix),  cmocka_unit_test(test_plan_random),
      cmocka_unit_test(test_hash),           cmocka_unit_test(test_status_strings),
      cmocka_unit_test(test_error_record),   cmocka_unit_test(test_version),
      cmocka_unit_test(test_resolve_rank_major_small), cmocka_unit_test(test_resolve_idempotent),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
