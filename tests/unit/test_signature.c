/* test_signature — EPF_CONFIG_SIGNATURE (config.h) packs every "agree" option into its own bits:
 *   - this build's signature decodes back to this build's options (the file is compiled three
 *     times: the defaults, every option at its largest allowed value, every option at its
 *     smallest; tests/unit/CMakeLists.txt);
 *   - signatures packed from extreme values decode back field by field, and changing one option
 *     changes only its own field (no overlap for any allowed value), in particular EPF_ALIGN at
 *     2^16 and above against the timeout flag (issue #30: EPF_ALIGN was packed whole at bit 36 and
 *     reached the timeout bit at 52);
 *   - the build signature of a plan follows the packed signature. */
#include <stdint.h>
#include <stdio.h>

#include "epf_cmocka.h"

#include "epfuse/host.h"

/* the value each field holds for an option value */
static uint64_t pack(int ranks, int experts, int topk, int tokens, int align_log2, int timeout) {
  return EPF__SIG_PACK(ranks, experts, topk, tokens, align_log2, timeout);
}

static void expect_fields(uint64_t sig, int ranks, int experts, int topk, int tokens, int align_log2, int timeout) {
  assert_int_equal(EPF__SIG_GET(sig, RANKS) + 1u, (uint64_t)ranks);
  assert_int_equal(EPF__SIG_GET(sig, EXPERTS) + 1u, (uint64_t)experts);
  assert_int_equal(EPF__SIG_GET(sig, TOPK) + 1u, (uint64_t)topk);
  assert_int_equal(EPF__SIG_GET(sig, TOKENS) + 1u, (uint64_t)tokens);
  assert_int_equal(EPF__SIG_GET(sig, ALIGN), (uint64_t)align_log2);
  assert_int_equal(EPF__SIG_GET(sig, TIMEOUT), (uint64_t)(timeout != 0));
  assert_int_equal(sig >> 62, 0); /* the spare bits */
}

/* this build's options, as compiled */
static void test_this_build(void** state) {
  (void)state;
  printf("EPF_CONFIG_SIGNATURE = 0x%016llx (ranks %d, experts %d, top-k %d, tokens %d, align %d, timeout %d)\n",
         (unsigned long long)EPF_CONFIG_SIGNATURE, EPF_MAX_RANKS, EPF_MAX_EXPERTS, EPF_MAX_TOPK, EPF_MAX_TOKENS_PER_RANK,
         EPF_ALIGN, EPF_ENABLE_TIMEOUT);
  assert_int_equal(1ull << EPF__LOG2_POW2(EPF_ALIGN), (unsigned long long)EPF_ALIGN);
  expect_fields(EPF_CONFIG_SIGNATURE, EPF_MAX_RANKS, EPF_MAX_EXPERTS, EPF_MAX_TOPK, EPF_MAX_TOKENS_PER_RANK,
                EPF__LOG2_POW2(EPF_ALIGN), EPF_ENABLE_TIMEOUT);
}

/* log2 of every allowed alignment */
static void test_log2(void** state) {
  int k;
  (void)state;
  for (k = 0; k <= 30; ++k) assert_int_equal(EPF__LOG2_POW2(1ull << k), k);
}

/* the smallest and the largest allowed value of every option, in every combination of the
 * extremes: each decodes back, and no two combinations collide */
static void test_extremes(void** state) {
  const int lo[6] = {1, 1, 1, 1, 7, 0};
  const int hi[6] = {EPF__MAX_RANKS_LIMIT, EPF__MAX_EXPERTS_LIMIT, EPF__MAX_TOPK_LIMIT, EPF__MAX_TOKENS_LIMIT, 30, 1};
  uint64_t seen[64];
  int m, i, j;
  (void)state;
  for (m = 0; m < 64; ++m) {
    int v[6];
    for (i = 0; i < 6; ++i) v[i] = (m >> i) & 1 ? hi[i] : lo[i];
    seen[m] = pack(v[0], v[1], v[2], v[3], v[4], v[5]);
    expect_fields(seen[m], v[0], v[1], v[2], v[3], v[4], v[5]);
    for (j = 0; j < m; ++j) assert_true(seen[j] != seen[m]);
  }
}

/* one option moved from its smallest to its largest value changes its own bits only */
static void test_fields_disjoint(void** state) {
  const uint64_t base = pack(1, 1, 1, 1, 7, 0);
  const uint64_t moved[6] = {
      pack(EPF__MAX_RANKS_LIMIT, 1, 1, 1, 7, 0), pack(1, EPF__MAX_EXPERTS_LIMIT, 1, 1, 7, 0),
      pack(1, 1, EPF__MAX_TOPK_LIMIT, 1, 7, 0),  pack(1, 1, 1, EPF__MAX_TOKENS_LIMIT, 7, 0),
      pack(1, 1, 1, 1, 30, 0),                   pack(1, 1, 1, 1, 7, 1),
  };
  uint64_t all = 0;
  int i;
  (void)state;
  for (i = 0; i < 6; ++i) {
    const uint64_t diff = moved[i] ^ base;
    assert_true(diff != 0);
    assert_int_equal(all & diff, 0); /* no bit shared with another field */
    all |= diff;
  }
}

/* the case that overlapped before: EPF_ALIGN 2^16 .. 2^30 with and without timeouts */
static void test_large_align_vs_timeout(void** state) {
  int k;
  (void)state;
  for (k = 16; k <= 30; ++k) {
    const uint64_t on = pack(72, 1024, 32, 65536, k, 1), off = pack(72, 1024, 32, 65536, k, 0);
    assert_true(on != off);
    expect_fields(on, 72, 1024, 32, 65536, k, 1);
    expect_fields(off, 72, 1024, 32, 65536, k, 0);
    assert_true(on != pack(72, 1024, 32, 65536, k - 1, 1));
  }
}

/* a plan carries epf_build_signature, which hashes EPF_CONFIG_SIGNATURE */
static void test_plan_carries_it(void** state) {
  epf_config_t c = EPF_CONFIG_INIT;
  epf_plan_t p;
  (void)state;
  c.nranks = 1;
  c.num_experts = EPF_MAX_EXPERTS < 8 ? EPF_MAX_EXPERTS : 8;
  c.top_k = 1;
  c.hidden = 128;
  c.max_tokens_per_rank = 1;
  assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
  assert_int_equal(p.build_signature, epf_build_signature());
  assert_true(epf_build_signature() != 0u);
  assert_int_equal(epf_plan_check(&p), EPF_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_this_build),      cmocka_unit_test(test_log2),
      cmocka_unit_test(test_extremes),        cmocka_unit_test(test_fields_disjoint),
      cmocka_unit_test(test_large_align_vs_timeout), cmocka_unit_test(test_plan_carries_it),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
