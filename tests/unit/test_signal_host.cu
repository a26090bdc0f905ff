/* test_signal_host — the EPF_HD parts of core/team.cuh and core/signal.cuh, run on the CPU (no GPU needed):
 * wrap-safe epoch comparison, signal word packing, the active mask's initial value and peer
 * addressing for affine (virtual ranks / NCCL) and table teams. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "epf_cmocka.h"

#include "epfuse/core/signal.cuh"
#include "epfuse/core/team.cuh"

static void test_epoch_reached(void** state) {
  (void)state;
  assert_true(epf_epoch_reached(5, 5));
  assert_true(epf_epoch_reached(6, 5));
  assert_false(epf_epoch_reached(4, 5));
  /* wrap: 0x00000002 is 4 epochs past 0xfffffffe */
  assert_true(epf_epoch_reached(2u, 0xfffffffeu));
  assert_false(epf_epoch_reached(0xfffffffeu, 2u));
  assert_true(epf_epoch_reached(0u, 0xffffffffu));
  /* every distance below 2^31 in both directions, from many starting points */
  for (uint32_t i = 0, base = 0xffffff00u; i < 64; ++i, base += 0x11u) { /* crosses the wrap */
    for (uint32_t d = 1; d < (1u << 31); d = d * 3 + 1) {
      assert_true(epf_epoch_reached(base + d, base));
      assert_false(epf_epoch_reached(base, base + d));
    }
  }
}

static void test_signal_pack(void** state) {
  (void)state;
  for (uint32_t e = 0xfffffff0u; e != 0x10u; ++e) {
    uint64_t w = epf_signal_pack(e, e * 7u + 1u);
    assert_int_equal(epf_signal_epoch(w), e);
    assert_int_equal(epf_signal_value(w), e * 7u + 1u);
  }
  assert_true(epf_signal_pack(1u, 0u) == (1ull << 32));
}

static void test_mask_init(void** state) {
  uint32_t m[EPF_MASK_WORDS];
  (void)state;
  for (int n = 0; n <= EPF_MAX_RANKS; ++n) {
    memset(m, 0xcc, sizeof(m));
    epf_mask_init_all(m, n);
    for (int r = 0; r < EPF_MASK_WORDS * 32; ++r) {
      int bit = (m[r >> 5] >> (r & 31)) & 1;
      assert_int_equal(bit, r < n ? 1 : 0);
    }
  }
}

static void test_peer_ptr(void** state) {
  static char window[8 * 4096];
  void* table[4];
  (void)state;
  for (int r = 0; r < 8; ++r) {
    epf_team_t t = epf_team_virtual(window, 4096, r, 8);
    assert_int_equal(t.rank, r);
    assert_int_equal(t.nranks, 8);
    for (int p = 0; p < 8; ++p) assert_ptr_equal(epf_peer_ptr(t, 100, p), window + p * 4096 + 100);
    assert_ptr_equal(epf_local_ptr(t, 8), window + r * 4096 + 8);
  }
  /* a table team: arbitrary, non-affine slice addresses */
  table[0] = window + 3 * 4096;
  table[1] = window;
  table[2] = window + 7 * 4096;
  table[3] = window + 1 * 4096;
  for (int r = 0; r < 4; ++r) {
    epf_team_t t = epf_team_from_table(table, r, 4);
    for (int p = 0; p < 4; ++p) assert_ptr_equal(epf_peer_ptr(t, 64, p), (char*)table[p] + 64);
    assert_ptr_equal(epf_local_ptr(t, 0), table[r]);
  }
  /* 1-rank affine team with stride 0 (what epf_team_from_window builds for lsa_size 1) */
  {
    epf_team_t t = epf_team_affine(window, 0, 0, 1);
    assert_ptr_equal(epf_peer_ptr(t, 12, 0), window + 12);
  }
}

static void test_wait_make(void** state) {
  epf_error_record_t rec;
  uint32_t abort_word = 0;
  (void)state;
  epf_wait_t w = epf_wait_make(123, &rec, &abort_word, 3);
  assert_true(w.timeout_ns == 123);
  assert_ptr_equal(w.record, &rec);
  assert_ptr_equal(w.abort_word, &abort_word);
  assert_null(w.mask);
  assert_int_equal(w.rank, 3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_epoch_reached), cmocka_unit_test(test_signal_pack),
      cmocka_unit_test(test_mask_init),     cmocka_unit_test(test_peer_ptr),
      cmocka_unit_test(test_wait_make),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
