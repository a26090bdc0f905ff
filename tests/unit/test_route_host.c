/* test_route_host — host.h "Route memory": epf_route_layout_compute (aligned, non-overlapping arrays
 * of the exact sizes for many random plans and route configs; every status for bad input, in
 * order), epf_route_size, the route header (init / check round trip and every rejection),
 * epf_route_ptr / epf_route_epoch_ptr arithmetic and the array names. Plain C11, no CUDA. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "epf_cmocka.h"
#include "epf_rng.h"

#include "epfuse/host.h"

static uint64_t rng_state;
static uint64_t rnd(void) { return epf_rng_next(&rng_state); }
static int rnd_in(int lo, int hi) { return epf_rng_in(&rng_state, lo, hi); }

static epf_plan_t make_plan(int R, int E, int K, int T, int A, int layout, int mode) {
  epf_config_t c = EPF_CONFIG_INIT;
  epf_plan_t p;
  c.nranks = R;
  c.num_experts = E;
  c.top_k = K;
  c.hidden = 256;
  c.max_tokens_per_rank = T;
  c.expert_alignment = A;
  c.layout = layout;
  c.mode = mode;
  assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
  return p;
}

static uint64_t align_up(uint64_t x) { return (x + EPF_ALIGN - 1) / EPF_ALIGN * EPF_ALIGN; }

/* the expected size of every array, written out independently of host.h */
static void expected_sizes(const epf_plan_t* p, int K, int T, int B, int exchange, uint64_t* sz) {
  const uint64_t R = (uint64_t)p->nranks, E = (uint64_t)p->num_experts, EL = E / R;
  const int rm = p->layout == EPF_LAYOUT_RANK_MAJOR;
  memset(sz, 0, sizeof(uint64_t) * EPF_ROUTE_ARRAY_COUNT);
  sz[EPF_ROUTE_HEADER] = 112;
  sz[EPF_ROUTE_EXPERT_COUNT] = 4 * E;
  sz[EPF_ROUTE_RANK_COUNT] = 4 * R;
  sz[EPF_ROUTE_TOKEN_IN_RANK] = (uint64_t)T * R;
  sz[EPF_ROUTE_DST_RANK] = 4ull * (uint64_t)T * (uint64_t)K;
  sz[EPF_ROUTE_SLOT] = 4ull * (uint64_t)T * (uint64_t)K;
  sz[EPF_ROUTE_RM_SLOT] = rm ? 4ull * (uint64_t)T * R : 0;
  if (exchange) {
    sz[EPF_ROUTE_SEND_OFFSET] = 4 * E;
    sz[EPF_ROUTE_SEND_RM_OFFSET] = rm ? 4 * R : 0;
    sz[EPF_ROUTE_RECV_SEGMENT] = 16 * EL;
    sz[EPF_ROUTE_RECV_SRC_OFFSET] = 4 * EL * (R + 1);
    sz[EPF_ROUTE_RECV_RM_OFFSET] = rm ? 4 * (R + 1) : 0;
    sz[EPF_ROUTE_SEND_SEGMENT] = 16 * E;
  }
  sz[EPF_ROUTE_SCRATCH] = 8ull * (uint64_t)B * (E + R + 1);
}

static void test_struct_sizes(void** state) {
  epf_route_config_t c = EPF_ROUTE_CONFIG_INIT;
  (void)state;
  assert_int_equal(sizeof(epf_route_header_t), 112);
  assert_int_equal(sizeof(epf_route_segment_t), 16);
  assert_int_equal(offsetof(epf_route_header_t, epoch), 12);
  assert_int_equal(offsetof(epf_route_header_t, recv_rows), 80);
  assert_int_equal(offsetof(epf_route_header_t, barrier), 104);
  assert_int_equal(c.size, sizeof(epf_route_config_t));
  assert_int_equal(c.magic, EPF_ROUTE_CONFIG_MAGIC);
  assert_int_equal(c.version, EPF_ROUTE_CONFIG_VERSION);
  assert_int_equal(c.index_type, 0);
  assert_int_equal(c.top_k, 0);
  assert_int_equal(c.max_tokens, 0);
  assert_int_equal(c.max_blocks, 0);
  assert_int_equal(c.flags, 0);
}

/* Many random shapes: arrays aligned, in order, non-overlapping, exact sizes, resolved fields. */
static void test_layout_random(void** state) {
  static const int ranks[] = {1, 2, 3, 4, 8, 9, 16, 18, 36, 72};
  int n, ok = 0, overflow = 0;
  (void)state;
  for (n = 0; n < 20000; ++n) {
    const int R = ranks[rnd_in(0, 9)];
    const int EL = rnd_in(1, EPF_MAX_EXPERTS / R);
    const int E = EL * R, K = rnd_in(1, EPF_MAX_TOPK);
    const int T = rnd() & 1 ? rnd_in(1, 300) : rnd_in(1, EPF_MAX_TOKENS_PER_RANK);
    const int A = 1 << rnd_in(0, 10);
    const int layout = rnd_in(1, 2), mode = rnd() % 4 == 0 ? EPF_MODE_LL : EPF_MODE_HT;
    epf_config_t cfg = EPF_CONFIG_INIT;
    epf_plan_t plan;
    epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
    epf_route_layout_t L;
    epf_status_t st;
    uint64_t sz[EPF_ROUTE_ARRAY_COUNT], worst, bytes;
    int rK, rT, rB, rI, exchange, i;
    cfg.nranks = R;
    cfg.num_experts = E;
    cfg.top_k = K;
    cfg.hidden = 128;
    cfg.max_tokens_per_rank = T;
    cfg.expert_alignment = A;
    cfg.layout = layout;
    cfg.mode = mode;
    if (epf_plan_compute(&cfg, &plan) != EPF_OK) continue; /* worst-case capacity too large */
    rc.index_type = rnd_in(0, 2);
    rc.top_k = rnd() & 1 ? 0 : rnd_in(1, K);
    rc.max_tokens = rnd() & 1 ? 0 : rnd_in(1, T);
    rc.max_blocks = rnd() & 1 ? 0 : rnd_in(1, EPF_ROUTE_MAX_BLOCKS);
    rc.flags = (uint32_t)rnd_in(0, (int)EPF_ROUTE_FLAGS_ALL);
    st = epf_route_layout_compute(&plan, &rc, &L);
    rK = rc.top_k ? rc.top_k : K;
    rT = rc.max_tokens ? rc.max_tokens : T;
    rB = rc.max_blocks ? rc.max_blocks : EPF_ROUTE_DEFAULT_MAX_BLOCKS;
    rI = rc.index_type ? rc.index_type : EPF_INDEX_INT64;
    exchange = mode == EPF_MODE_HT && (rc.flags & EPF_ROUTE_FLAG_LOCAL_ONLY) == 0;
    worst = (uint64_t)R * (uint64_t)T * (uint64_t)K + (uint64_t)EL * (uint64_t)(A - 1);
    if (exchange && worst > (uint64_t)INT32_MAX) {
      assert_int_equal(st, EPF_ERR_SIZE_OVERFLOW);
      assert_true(L.total_bytes == 0 && L.magic == EPF_ROUTE_LAYOUT_MAGIC);
      ++overflow;
      continue;
    }
    assert_int_equal(st, EPF_OK);
    ++ok;
    assert_int_equal(L.size, sizeof(epf_route_layout_t));
    assert_int_equal(L.magic, EPF_ROUTE_LAYOUT_MAGIC);
    assert_int_equal(L.version, EPF_ROUTE_LAYOUT_VERSION);
    assert_int_equal(L.nranks, R);
    assert_int_equal(L.num_experts, E);
    assert_int_equal(L.experts_per_rank, EL);
    assert_int_equal(L.top_k, rK);
    assert_int_equal(L.max_tokens, rT);
    assert_int_equal(L.max_blocks, rB);
    assert_int_equal(L.index_type, rI);
    assert_int_equal(L.plan_layout, layout);
    assert_int_equal(L.plan_mode, mode);
    assert_int_equal(L.expert_alignment, A);
    assert_int_equal(L.exchange, exchange);
    assert_int_equal(L.flags, rc.flags | (mode == EPF_MODE_LL ? EPF_ROUTE_FLAG_LOCAL_ONLY : 0u));
    assert_true(L.recv_capacity == plan.recv_capacity);
    assert_true(L.config_hash == plan.config_hash);
    expected_sizes(&plan, rK, rT, rB, exchange, sz);
    for (i = 0; i < EPF_ROUTE_ARRAY_COUNT; ++i) {
      assert_true(L.array[i].bytes == sz[i]);
      assert_int_equal(L.array[i].offset % EPF_ALIGN, 0);
      if (i > 0) assert_true(L.array[i].offset >= L.array[i - 1].offset + L.array[i - 1].bytes);
      if (i > 0) assert_true(L.array[i].offset == L.array[i - 1].offset + align_up(L.array[i - 1].bytes));
      assert_true(L.array[i].offset + L.array[i].bytes <= L.total_bytes);
    }
    assert_int_equal(L.array[0].offset, 0);
    assert_int_equal(L.total_bytes % EPF_ALIGN, 0);
    assert_true(L.total_bytes == L.array[EPF_ROUTE_ARRAY_COUNT - 1].offset + align_up(sz[EPF_ROUTE_ARRAY_COUNT - 1]));
    assert_int_equal(epf_route_size(&plan, &rc, &bytes), EPF_OK);
    assert_true(bytes == L.total_bytes);
  }
  printf("route layouts: %d checked, %d refused with EPF_ERR_SIZE_OVERFLOW\n", ok, overflow);
  assert_true(ok > 10000);
}

/* Every rejection, with its exact status. */
static void test_layout_errors(void** state) {
  epf_plan_t plan = make_plan(8, 256, 8, 4096, 128, EPF_LAYOUT_EXPERT_MAJOR, EPF_MODE_HT);
  epf_plan_t p;
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT, c;
  epf_route_layout_t L;
  uint64_t bytes = 7;
  (void)state;
  assert_int_equal(epf_route_layout_compute(NULL, &rc, &L), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_route_layout_compute(&plan, NULL, &L), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_route_layout_compute(&plan, &rc, NULL), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_route_size(&plan, &rc, NULL), EPF_ERR_INVALID_ARGUMENT);
  /* config prefix */
  c = rc; c.size = 8;
  assert_int_equal(epf_route_layout_compute(&plan, &c, &L), EPF_ERR_STRUCT_VERSION);
  assert_true(L.total_bytes == 0 && L.size == sizeof(L) && L.magic == EPF_ROUTE_LAYOUT_MAGIC);
  c = rc; c.magic = EPF_CONFIG_MAGIC;
  assert_int_equal(epf_route_layout_compute(&plan, &c, &L), EPF_ERR_STRUCT_VERSION);
  c = rc; c.version = 0;
  assert_int_equal(epf_route_layout_compute(&plan, &c, &L), EPF_ERR_STRUCT_VERSION);
  c = rc; c.size = sizeof(epf_route_config_t) + 64; /* a larger, newer struct is accepted */
  assert_int_equal(epf_route_layout_compute(&plan, &c, &L), EPF_OK);
  /* plan prefix and fields (a plan that crossed an FFI) */
  p = plan; p.magic = 0;
  assert_int_equal(epf_route_layout_compute(&p, &rc, &L), EPF_ERR_STRUCT_VERSION);
  p = plan; p.nranks = 0;
  assert_int_equal(epf_route_layout_compute(&p, &rc, &L), EPF_ERR_RANKS);
  p = plan; p.nranks = EPF_MAX_RANKS + 1;
  assert_int_equal(epf_route_layout_compute(&p, &rc, &L), EPF_ERR_RANKS);
  p = plan; p.num_experts = EPF_MAX_EXPERTS + 8;
  assert_int_equal(epf_route_layout_compute(&p, &rc, &L), EPF_ERR_EXPERTS);
  p = plan; p.num_experts = 252;
  assert_int_equal(epf_route_layout_compute(&p, &rc, &L), EPF_ERR_EXPERTS_NOT_DIVISIBLE);
  p = plan; p.experts_per_rank = 31;
  assert_int_equal(epf_route_layout_compute(&p, &rc, &L), EPF_ERR_EXPERTS_NOT_DIVISIBLE);
  p = plan; p.top_k = 0;
  assert_int_equal(epf_route_layout_compute(&p, &rc, &L), EPF_ERR_TOPK);
  p = plan; p.max_tokens_per_rank = 0;
  assert_int_equal(epf_route_layout_compute(&p, &rc, &L), EPF_ERR_TOKENS);
  p = plan; p.expert_alignment = 96;
  assert_int_equal(epf_route_layout_compute(&p, &rc, &L), EPF_ERR_ALIGNMENT);
  p = plan; p.layout = 7;
  assert_int_equal(epf_route_layout_compute(&p, &rc, &L), EPF_ERR_LAYOUT);
  p = plan; p.mode = 7;
  assert_int_equal(epf_route_layout_compute(&p, &rc, &L), EPF_ERR_MODE);
  /* route config fields */
  c = rc; c.index_type = 3;
  assert_int_equal(epf_route_layout_compute(&plan, &c, &L), EPF_ERR_INVALID_ARGUMENT);
  c = rc; c.index_type = -1;
  assert_int_equal(epf_route_layout_compute(&plan, &c, &L), EPF_ERR_INVALID_ARGUMENT);
  c = rc; c.top_k = 9;
  assert_int_equal(epf_route_layout_compute(&plan, &c, &L), EPF_ERR_TOPK);
  c = rc; c.top_k = -1;
  assert_int_equal(epf_route_layout_compute(&plan, &c, &L), EPF_ERR_TOPK);
  c = rc; c.max_tokens = 4097;
  assert_int_equal(epf_route_layout_compute(&plan, &c, &L), EPF_ERR_TOKENS);
  c = rc; c.max_tokens = -5;
  assert_int_equal(epf_route_layout_compute(&plan, &c, &L), EPF_ERR_TOKENS);
  c = rc; c.max_blocks = EPF_ROUTE_MAX_BLOCKS + 1;
  assert_int_equal(epf_route_layout_compute(&plan, &c, &L), EPF_ERR_INVALID_ARGUMENT);
  c = rc; c.max_blocks = -1;
  assert_int_equal(epf_route_layout_compute(&plan, &c, &L), EPF_ERR_INVALID_ARGUMENT);
  c = rc; c.flags = 0x4u;
  assert_int_equal(epf_route_layout_compute(&plan, &c, &L), EPF_ERR_FLAGS);
  /* order: the first violated rule wins (top_k before max_tokens before blocks before flags) */
  c = rc; c.top_k = 99; c.max_tokens = -1; c.max_blocks = -1; c.flags = 0x80u;
  assert_int_equal(epf_route_layout_compute(&plan, &c, &L), EPF_ERR_TOPK);
  c.top_k = 0;
  assert_int_equal(epf_route_layout_compute(&plan, &c, &L), EPF_ERR_TOKENS);
  c.max_tokens = 0;
  assert_int_equal(epf_route_layout_compute(&plan, &c, &L), EPF_ERR_INVALID_ARGUMENT);
  c.max_blocks = 0;
  assert_int_equal(epf_route_layout_compute(&plan, &c, &L), EPF_ERR_FLAGS);
  /* int32 offsets: with the default limits the most rows one rank can be sent (72 x 65536 x 32 +
   * pads) stay below INT32_MAX; with EPF_MAX_RANKS = 1024 (the test_route_host_limits build) they
   * do not, and the layout is refused unless the route is local-only */
  {
    epf_config_t cfg = EPF_CONFIG_INIT;
    const int R = EPF_MAX_RANKS >= 1024 ? 1024 : 72;
    cfg.nranks = R;
    cfg.num_experts = R;
    cfg.top_k = 32;
    cfg.hidden = 128;
    cfg.max_tokens_per_rank = 65536;
    cfg.recv_capacity = 1 << 20;
    assert_int_equal(epf_plan_compute(&cfg, &p), EPF_OK);
    if (R * 65536.0 * 32.0 > (double)INT32_MAX) {
      assert_int_equal(epf_route_layout_compute(&p, &rc, &L), EPF_ERR_SIZE_OVERFLOW);
      assert_int_equal(epf_route_size(&p, &rc, &bytes), EPF_ERR_SIZE_OVERFLOW);
      assert_true(bytes == 0);
      printf("EPF_MAX_RANKS=%d: int32 offset overflow refused\n", EPF_MAX_RANKS);
    } else {
      assert_int_equal(epf_route_layout_compute(&p, &rc, &L), EPF_OK);
    }
    c = rc; c.flags = EPF_ROUTE_FLAG_LOCAL_ONLY; /* no offsets: always fine */
    assert_int_equal(epf_route_layout_compute(&p, &c, &L), EPF_OK);
  }
}

/* LL plans are local-only; RANK_MAJOR adds its arrays; LOCAL_ONLY drops the offset arrays. */
static void test_layout_variants(void** state) {
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  epf_route_layout_t L;
  epf_plan_t p;
  (void)state;
  p = make_plan(8, 256, 8, 128, 1, EPF_LAYOUT_EXPERT_MAJOR, EPF_MODE_LL);
  assert_int_equal(epf_route_layout_compute(&p, &rc, &L), EPF_OK);
  assert_int_equal(L.exchange, 0);
  assert_int_equal(L.flags, EPF_ROUTE_FLAG_LOCAL_ONLY);
  assert_true(L.array[EPF_ROUTE_SEND_OFFSET].bytes == 0 && L.array[EPF_ROUTE_RECV_SEGMENT].bytes == 0);
  assert_true(L.array[EPF_ROUTE_SLOT].bytes == 128 * 8 * 4);
  p = make_plan(8, 256, 8, 4096, 1, EPF_LAYOUT_RANK_MAJOR, EPF_MODE_HT);
  assert_int_equal(epf_route_layout_compute(&p, &rc, &L), EPF_OK);
  assert_int_equal(L.exchange, 1);
  assert_true(L.array[EPF_ROUTE_RM_SLOT].bytes == 4096 * 8 * 4);
  assert_true(L.array[EPF_ROUTE_SEND_RM_OFFSET].bytes == 8 * 4);
  assert_true(L.array[EPF_ROUTE_RECV_RM_OFFSET].bytes == 9 * 4);
  assert_true(L.array[EPF_ROUTE_RECV_SRC_OFFSET].bytes == 32 * 9 * 4);
  assert_int_equal(L.index_type, EPF_INDEX_INT64);
  assert_int_equal(L.max_blocks, EPF_ROUTE_DEFAULT_MAX_BLOCKS);
  rc.flags = EPF_ROUTE_FLAG_LOCAL_ONLY;
  assert_int_equal(epf_route_layout_compute(&p, &rc, &L), EPF_OK);
  assert_true(L.array[EPF_ROUTE_RM_SLOT].bytes == 4096 * 8 * 4);
  assert_true(L.array[EPF_ROUTE_SEND_RM_OFFSET].bytes == 0 && L.array[EPF_ROUTE_RECV_RM_OFFSET].bytes == 0);
}

static void test_header(void** state) {
  const epf_plan_t plan = make_plan(4, 64, 8, 1024, 16, EPF_LAYOUT_EXPERT_MAJOR, EPF_MODE_HT);
  const epf_plan_t other = make_plan(4, 64, 8, 1024, 32, EPF_LAYOUT_EXPERT_MAJOR, EPF_MODE_HT);
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  epf_route_layout_t L, L2;
  epf_route_header_t h, x;
  epf_plan_t p;
  (void)state;
  rc.index_type = EPF_INDEX_INT32;
  rc.top_k = 6;
  rc.max_tokens = 1000;
  rc.max_blocks = 5;
  rc.flags = EPF_ROUTE_FLAG_NO_PAD_MARK;
  assert_int_equal(epf_route_layout_compute(&plan, &rc, &L), EPF_OK);
  memset(&h, 0xab, sizeof(h));
  epf_route_header_init(&L, 77u, &h);
  assert_int_equal(h.size, sizeof(h));
  assert_int_equal(h.magic, EPF_ROUTE_MAGIC);
  assert_int_equal(h.version, EPF_ROUTE_VERSION);
  assert_int_equal(h.epoch, 77);
  assert_true(h.barrier == (77ull << 32));
  assert_true(h.config_hash == plan.config_hash && h.total_bytes == L.total_bytes);
  assert_int_equal(h.nranks, 4);
  assert_int_equal(h.num_experts, 64);
  assert_int_equal(h.top_k, 6);
  assert_int_equal(h.max_tokens, 1000);
  assert_int_equal(h.index_type, EPF_INDEX_INT32);
  assert_int_equal(h.max_blocks, 5);
  assert_int_equal(h.flags, EPF_ROUTE_FLAG_NO_PAD_MARK);
  assert_int_equal(h.rank, -1);
  assert_int_equal(h.num_tokens, 0);
  assert_int_equal(h.status, 0);
  assert_true(h.recv_rows == 0 && h.recv_rows_em == 0 && h.recv_overflow == 0);
  /* round trip: the rebuilt layout is the original */
  memset(&L2, 0, sizeof(L2));
  assert_int_equal(epf_route_header_check(&h, &plan, L.total_bytes, &L2), EPF_OK);
  assert_memory_equal(&L, &L2, sizeof(L));
  /* a header after some updates (state recorded) still checks */
  x = h; x.epoch = 0xfffffff0u; x.rank = 3; x.num_tokens = 1000; x.recv_rows = 12345; x.dropped_routes = 9;
  assert_int_equal(epf_route_header_check(&x, &plan, L.total_bytes + 4096, &L2), EPF_OK);
  /* rejections */
  assert_int_equal(epf_route_header_check(NULL, &plan, L.total_bytes, &L2), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_route_header_check(&h, NULL, L.total_bytes, &L2), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_route_header_check(&h, &plan, L.total_bytes, NULL), EPF_ERR_INVALID_ARGUMENT);
  x = h; x.magic ^= 1u;
  assert_int_equal(epf_route_header_check(&x, &plan, L.total_bytes, &L2), EPF_ERR_STRUCT_VERSION);
  x = h; x.version = EPF_ROUTE_VERSION + 1;
  assert_int_equal(epf_route_header_check(&x, &plan, L.total_bytes, &L2), EPF_ERR_STRUCT_VERSION);
  x = h; x.version = 1; /* a v0.1 buffer (uint32 scratch rows) */
  assert_int_equal(epf_route_header_check(&x, &plan, L.total_bytes, &L2), EPF_ERR_STRUCT_VERSION);
  x = h; x.size = 96;
  assert_int_equal(epf_route_header_check(&x, &plan, L.total_bytes, &L2), EPF_ERR_STRUCT_VERSION);
  p = plan; p.version = 0;
  assert_int_equal(epf_route_header_check(&h, &p, L.total_bytes, &L2), EPF_ERR_STRUCT_VERSION);
  assert_int_equal(epf_route_header_check(&h, &other, L.total_bytes, &L2), EPF_ERR_CONFIG_MISMATCH);
  x = h; x.nranks = 2;
  assert_int_equal(epf_route_header_check(&x, &plan, L.total_bytes, &L2), EPF_ERR_CONFIG_MISMATCH);
  x = h; x.num_experts = 128;
  assert_int_equal(epf_route_header_check(&x, &plan, L.total_bytes, &L2), EPF_ERR_CONFIG_MISMATCH);
  x = h; x.top_k = 9;
  assert_int_equal(epf_route_header_check(&x, &plan, L.total_bytes, &L2), EPF_ERR_TOPK);
  x = h; x.top_k = 0;
  assert_int_equal(epf_route_header_check(&x, &plan, L.total_bytes, &L2), EPF_ERR_TOPK);
  x = h; x.max_tokens = 1025;
  assert_int_equal(epf_route_header_check(&x, &plan, L.total_bytes, &L2), EPF_ERR_TOKENS);
  x = h; x.index_type = 0;
  assert_int_equal(epf_route_header_check(&x, &plan, L.total_bytes, &L2), EPF_ERR_INVALID_ARGUMENT);
  x = h; x.max_blocks = 0;
  assert_int_equal(epf_route_header_check(&x, &plan, L.total_bytes, &L2), EPF_ERR_INVALID_ARGUMENT);
  x = h; x.flags = 0x10u;
  assert_int_equal(epf_route_header_check(&x, &plan, L.total_bytes, &L2), EPF_ERR_FLAGS);
  x = h; x.total_bytes += EPF_ALIGN;
  assert_int_equal(epf_route_header_check(&x, &plan, x.total_bytes, &L2), EPF_ERR_CONFIG_MISMATCH);
  x = h; x.max_tokens = 500; /* recorded state and recorded size disagree */
  assert_int_equal(epf_route_header_check(&x, &plan, L.total_bytes, &L2), EPF_ERR_CONFIG_MISMATCH);
  assert_int_equal(epf_route_header_check(&h, &plan, L.total_bytes - 1, &L2), EPF_ERR_INVALID_ARGUMENT);
  x = h; x.num_tokens = 1001;
  assert_int_equal(epf_route_header_check(&x, &plan, L.total_bytes, &L2), EPF_ERR_TOKENS);
  x = h; x.num_tokens = -1;
  assert_int_equal(epf_route_header_check(&x, &plan, L.total_bytes, &L2), EPF_ERR_TOKENS);
  x = h; x.rank = 4;
  assert_int_equal(epf_route_header_check(&x, &plan, L.total_bytes, &L2), EPF_ERR_RANK);
  x = h; x.rank = -2;
  assert_int_equal(epf_route_header_check(&x, &plan, L.total_bytes, &L2), EPF_ERR_RANK);
}

static void test_ptr(void** state) {
  const epf_plan_t plan = make_plan(8, 64, 4, 100, 1, EPF_LAYOUT_EXPERT_MAJOR, EPF_MODE_HT);
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  epf_route_t r;
  uint32_t words[8];
  int i, id;
  (void)state;
  memset(&r, 0, sizeof(r));
  assert_int_equal(epf_route_layout_compute(&plan, &rc, &r.layout), EPF_OK);
  r.base = (void*)(uintptr_t)0x100000u;
  r.count = 8;
  for (i = 0; i < 8; ++i) {
    for (id = 0; id < EPF_ROUTE_ARRAY_COUNT; ++id) {
      char* p = (char*)epf_route_ptr(&r, i, (epf_route_array_id_t)id);
      if (r.layout.array[id].bytes == 0) {
        assert_null(p);
      } else {
        assert_true((uintptr_t)p == 0x100000u + (uintptr_t)i * r.layout.total_bytes + r.layout.array[id].offset);
      }
    }
    assert_true((uintptr_t)epf_route_epoch_ptr(&r, i) ==
                0x100000u + (uintptr_t)i * r.layout.total_bytes + offsetof(epf_route_header_t, epoch));
  }
  assert_null(epf_route_ptr(&r, 0, EPF_ROUTE_RM_SLOT)); /* EXPERT_MAJOR: no rank-major slots */
  r.epoch_words = words;
  for (i = 0; i < 8; ++i) assert_ptr_equal(epf_route_epoch_ptr(&r, i), &words[i]);
}

static void test_names(void** state) {
  int id;
  (void)state;
  for (id = 0; id < EPF_ROUTE_ARRAY_COUNT; ++id) {
    const char* s = epf_route_array_name((epf_route_array_id_t)id);
    assert_non_null(s);
    assert_string_not_equal(s, "UNKNOWN");
  }
  assert_string_equal(epf_route_array_name(EPF_ROUTE_SLOT), "SLOT");
  assert_string_equal(epf_route_array_name(EPF_ROUTE_ARRAY_COUNT), "UNKNOWN");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_struct_sizes), cmocka_unit_test(test_layout_random),
      cmocka_unit_test(test_layout_errors), cmocka_unit_test(test_layout_variants),
      cmocka_unit_test(test_header), cmocka_unit_test(test_ptr),
      cmocka_unit_test(test_names),
  };
  const char* s = getenv("EPF_TEST_SEED");
  rng_state = s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL) * 2654435761ull;
  printf("EPF_TEST_SEED=%llu\n", (unsigned long long)rng_state);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
/* SPDX-License-Identifier: Apache-2.0 */
