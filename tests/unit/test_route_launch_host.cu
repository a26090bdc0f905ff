/* test_route_launch_host — the EPF_HD launch arithmetic of route/route.cuh / route/kernels.cuh on the CPU
 * (no GPU): the token partition of the blocks (epf_route_block_tokens), the default blocks per rank
 * (few entries: 3 blocks when the route exchanges counts, 2 when it is local-only; one token block
 * per 2304 entries plus the control block above that; within max_blocks and co-residency), the
 * block size (epf_route_update_threads, with the kernel's SPLIT rule asked of its one owner,
 * epf_route_split_ok) and the shared memory (epf__route_smem_carve, the one owner of sizes and
 * offsets: regions in order, 16-byte aligned, within 48 KiB at the default block size, the slot
 * pass's tag rows counted exactly when they fit; epf_route_smem_bytes is its total), for random
 * plans. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "epf_cmocka.h"
#include "epf_rng.h"

#include "epfuse/route/kernels.cuh"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static int rnd_in(int lo, int hi) { return epf_rng_in(&rng, lo, hi); }

/* a route handle as epf_route_init would bind it, without a device: layout from host.h, the
 * co-residency figure given */
static epf_route_t make_route(int R, int E, int K, int T, int max_blocks, uint32_t flags, int count, int resident) {
  epf_config_t c = EPF_CONFIG_INIT;
  epf_plan_t p;
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  epf_route_t r;
  c.nranks = R;
  c.num_experts = E;
  c.top_k = K;
  c.hidden = 256;
  c.max_tokens_per_rank = T;
  assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
  rc.max_blocks = max_blocks;
  rc.flags = flags;
  memset(&r, 0, sizeof(r));
  assert_int_equal(epf_route_layout_compute(&p, &rc, &r.layout), EPF_OK);
  r.count = count;
  r.resident_blocks = resident;
  return r;
}

static void test_block_tokens(void** state) {
  (void)state;
  for (int it = 0; it < 2000; ++it) {
    const int T = rnd_in(0, 1 << 20), B = rnd_in(1, EPF_ROUTE_MAX_BLOCKS);
    int prev = 0;
    for (int b = 0; b < B; ++b) {
      int t0, t1;
      epf_route_block_tokens(T, b, B, &t0, &t1);
      if (B > 1 && b == 0) { /* the control block owns no tokens */
        assert_int_equal(t0, 0);
        assert_int_equal(t1, 0);
        continue;
      }
      assert_int_equal(t0, prev); /* contiguous, in block order */
      assert_true(t1 >= t0);
      prev = t1;
    }
    assert_int_equal(prev, T);
  }
}

static void test_blocks_per_rank(void** state) {
  (void)state;
  const int Es[] = {8, 64, 256, 1024}, Ks[] = {1, 4, 8, 32};
  for (int it = 0; it < 4000; ++it) {
    const int E = Es[rnd_in(0, 3)], K = Ks[rnd_in(0, 3)], R = 1 << rnd_in(0, 3);
    if (K > E || E % R != 0) continue;
    const int Tmax = rnd_in(1, 8192), T = rnd_in(0, Tmax), mb = rnd_in(1, EPF_ROUTE_MAX_BLOCKS);
    const uint32_t flags = rnd_in(0, 1) ? EPF_ROUTE_FLAG_LOCAL_ONLY : 0u;
    const int count = rnd_in(0, 1) ? R : 1, resident = rnd_in(count, 264);
    const epf_route_t r = make_route(R, E, K, Tmax, mb, flags, count, resident);
    const int64_t entries = (int64_t)T * K;
    int want;
    if (entries > 0 && epf_route_split_ok(2, T, K))
      want = r.layout.exchange ? 3 : 2;
    else {
      want = (int)((entries + 2303) / 2304);
      if (want > 1) want += 1;
    }
    if (want > mb) want = mb;
    if (want > resident / count) want = resident / count;
    if (want < 1) want = 1;
    assert_int_equal(epf_route_blocks_per_rank(&r, T), want);
  }
  /* the shapes bench_route measures: T = 4096 -> 16 blocks, T = 128 -> 3 (exchange) / 2 (local) */
  {
    const epf_route_t x = make_route(1, 256, 8, 4096, 0, 0u, 1, 132), l = make_route(1, 256, 8, 4096, 0, EPF_ROUTE_FLAG_LOCAL_ONLY, 1, 132);
    assert_int_equal(epf_route_blocks_per_rank(&x, 4096), 16);
    assert_int_equal(epf_route_blocks_per_rank(&x, 128), 3);
    assert_int_equal(epf_route_blocks_per_rank(&l, 128), 2);
  }
}

static void test_threads_and_smem(void** state) {
  (void)state;
  const int Es[] = {8, 64, 256, 1024}, Ks[] = {1, 4, 8, 32};
  for (int it = 0; it < 4000; ++it) {
    const int E = Es[rnd_in(0, 3)], K = Ks[rnd_in(0, 3)], R = 1 << rnd_in(0, 6);
    if (K > E || E % R != 0 || R > E) continue;
    const int Tmax = rnd_in(1, 8192), T = rnd_in(0, Tmax);
    const epf_route_t r = make_route(R, E, K, Tmax, 0, 0u, 1, 132);
    const int most = epf_route_block_threads(&r.layout), B = rnd_in(1, 32);
    const int th = epf_route_update_threads(&r, T, B);
    const int64_t all = (int64_t)T * K;
    const int split = epf_route_split_ok(B, T, K);
    const int64_t share = split || B == 1 ? all : (all + B - 2) / (B - 1);
    int64_t want = 32 * ((share + 159) / 160);
    if (want < 256) want = 256;
    if (want > most) want = most;
    assert_true(most % 32 == 0 && most >= 32 && most <= EPF_ROUTE_BLOCK_THREADS);
    assert_int_equal(th, (int)want);
    assert_true(epf_route_smem_bytes(&r.layout, most) <= 48u * 1024u || most == 32);
    for (int W = 1; W <= most / 32; ++W) {
      const epf__route_smem_t s = epf__route_smem_carve(&r.layout, (size_t)W);
      const size_t core = s.tags, tags = 4u * (size_t)W * (size_t)E, row = (size_t)(E + R);
      const size_t got = epf_route_smem_bytes(&r.layout, 32 * W);
      assert_int_equal(got, core + tags <= 48u * 1024u ? core + tags : core);
      assert_int_equal(s.has_tags, core + tags <= 48u * 1024u);
      assert_int_equal(s.bytes, got);
      /* the regions in order, each 16-byte aligned and as large as the ctx uses */
      assert_int_equal(s.hist, 0);
      assert_true(s.tot >= s.hist + 4u * (size_t)W * row && s.misc >= s.tot + 4u * (row + 1u));
      assert_true(s.stage >= s.misc + 4u * EPF__ROUTE_MISC_INTS && s.cub >= s.stage + 4u * (size_t)W * EPF__ROUTE_BATCH);
      assert_true(s.tags >= s.cub + 32u * EPF__ROUTE_CUB_BYTES_PER_WARP);
      assert_true(s.tot % 16u == 0 && s.misc % 16u == 0 && s.stage % 16u == 0 && s.cub % 16u == 0 && s.tags % 16u == 0);
      /* the size a launcher passes is what the ctx carves: the documented formula */
      assert_int_equal(core, 4u * (((size_t)W * row + 3u) / 4u * 4u + (row + 1u + 3u) / 4u * 4u + 64u + (size_t)W * 160u) + 512u);
    }
  }
  /* E = 256: the tags fit at every block size up to 512 threads */
  {
    const epf_route_t r = make_route(8, 256, 8, 4096, 0, 0u, 1, 132);
    for (int W = 1; W <= 16; ++W) assert_true(epf__route_smem_carve(&r.layout, (size_t)W).has_tags);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_block_tokens),
      cmocka_unit_test(test_blocks_per_rank),
      cmocka_unit_test(test_threads_and_smem),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
