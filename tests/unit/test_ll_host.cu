/* test_ll_host — the EPF_HD parts of ll/ll.cuh / ll/impl/dispatch.cuh / ll/impl/combine.cuh on the CPU (no GPU):
 * the LL state's initial value, plan and token checks (every refusal status), the fixed-layout
 * accessors (every (parity, expert, source, slot) row, signal word and combine row is distinct and
 * inside its region, for random configurations), epoch parity, per-rank buffer sizes and virtual
 * rank operand strides, the shared-memory carve-up of the blocks (sizes and offsets from
 * epf_ll_smem_layout), the combine transport (epf_ll_combine_pulls: pull / push per payload,
 * y layout and EPF_FLAG_COMBINE_PUSH, the EXPERT_OUT rows of an MXFP8 pull; RANK_MAJOR: pull only
 * with EPF_LL_Y_PACKED_PULL and BF16 both ways, never an EXPERT_OUT region), and that LL gives
 * every (token, k) the slot the route gives it (the two CPU references, epf_ll_ref.cuh and
 * epf_route_ref.h, which the GPU tests hold the library to); and the same for RANK_MAJOR plans
 * (test_rm_layout, test_rm_slots_match_route: the rank-major reference epf_ll_rm_ref.cuh gives
 * every (token, rank) the route's rank-major slot). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "epf_cmocka.h"
#include "epf_ll_ref.cuh"
#include "epf_ll_rm_ref.cuh"
#include "epf_rng.h"
#include "epf_route_ref.h"

#include "epfuse/ll/kernels.cuh"

static uint64_t rng = 0x243f6a8885a308d3ull;
static int rnd_in(int lo, int hi) { return epf_rng_in(&rng, lo, hi); }

static epf_config_t ll_config(int R, int E, int K, int H, int T) {
  epf_config_t c = EPF_CONFIG_INIT;
  c.nranks = R;
  c.num_experts = E;
  c.top_k = K;
  c.hidden = H;
  c.max_tokens_per_rank = T;
  c.mode = EPF_MODE_LL;
  return c;
}

/* seen[i] is 0, then 1: each row or word is produced once. The range check is repeated as a
 * plain branch because cmocka's assert_true is not known to the compiler to stop the test (an
 * accessor may return EPF_ROW_INVALID, -1, and gcc's -Wstringop-overflow then sees seen[-1]). */
static void mark_once(unsigned char* seen, int64_t i, int64_t n) {
  assert_true(i >= 0 && i < n);
  if (i < 0 || i >= n) return;
  assert_int_equal(seen[i], 0);
  seen[i] = 1;
}

static void test_state_init(void** state) {
  epf_ll_state_t s;
  (void)state;
  for (int n = 1; n <= EPF_MAX_RANKS; ++n) {
    memset(&s, 0xcd, sizeof(s));
    epf_ll_state_init(&s, n);
    for (int i = 0; i < EPF_LL_PHASE_COUNT; ++i) {
      assert_int_equal(s.epoch[i], 0);
      assert_int_equal(s.arrive[i], 0);
    }
    for (int r = 0; r < EPF_MASK_WORDS * 32; ++r) assert_int_equal((s.mask[r >> 5] >> (r & 31)) & 1u, r < n ? 1u : 0u);
    for (int r = 0; r < EPF_MAX_RANKS; ++r) assert_int_equal(s.dispatch_fail[r], 0);
    assert_int_equal(s.clean_gen, 0);
    assert_int_equal(s.magic, EPF_LL_STATE_MAGIC);
    assert_int_equal(s.nranks, n);
  }
}

static void test_plan_checks(void** state) {
  epf_config_t c = ll_config(8, 256, 8, 7168, 128);
  epf_plan_t p;
  (void)state;
  assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
  assert_int_equal(epf_ll_plan_check(&p), EPF_OK);
  assert_int_equal(epf_ll_tokens_check(&p, 0), EPF_OK);
  assert_int_equal(epf_ll_tokens_check(&p, 128), EPF_OK);
  assert_int_equal(epf_ll_tokens_check(&p, 129), EPF_ERR_TOKENS);
  assert_int_equal(epf_ll_tokens_check(&p, -1), EPF_ERR_TOKENS);
  /* HT plan: not an LL plan */
  c.mode = EPF_MODE_HT;
  assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
  assert_int_equal(epf_ll_plan_check(&p), EPF_ERR_MODE);
  /* LL rank-major: an LL plan; a damaged one (receive rows, metadata rows, layout) is refused */
  c = ll_config(8, 256, 8, 7168, 128);
  c.layout = EPF_LAYOUT_RANK_MAJOR;
  assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
  assert_int_equal(epf_ll_plan_check(&p), EPF_OK);
  p.recv_capacity = 8 * 32 * 128; /* the expert-major rows */
  assert_int_equal(epf_ll_plan_check(&p), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
  p.meta_bytes_per_row = 16;
  assert_int_equal(epf_ll_plan_check(&p), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
  p.layout = 7;
  assert_int_equal(epf_ll_plan_check(&p), EPF_ERR_LAYOUT);
  /* per-128 FP8 with hidden 2880 never becomes a plan */
  c = ll_config(8, 256, 8, 2880, 128);
  c.payload = EPF_PAYLOAD_FP8_128;
  assert_int_equal(epf_plan_compute(&c, &p), EPF_ERR_HIDDEN_ALIGNMENT);
  c.payload = EPF_PAYLOAD_MXFP8;
  assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
  assert_int_equal(epf_ll_plan_check(&p), EPF_OK);
  /* a damaged prefix / NULL */
  p.magic ^= 1u;
  assert_int_equal(epf_ll_plan_check(&p), EPF_ERR_STRUCT_VERSION);
  assert_int_equal(epf_ll_plan_check(NULL), EPF_ERR_INVALID_ARGUMENT);
  /* payload support */
  assert_true(epf_ll_payload_supported(EPF_PAYLOAD_BF16));
  assert_true(epf_ll_payload_supported(EPF_PAYLOAD_MXFP8));
  assert_true(epf_ll_payload_supported(EPF_PAYLOAD_FP8_128));
  assert_false(epf_ll_payload_supported(0));
  assert_true(epf_ll_combine_payload_supported(EPF_PAYLOAD_BF16));
  assert_true(epf_ll_combine_payload_supported(EPF_PAYLOAD_MXFP8));
  assert_false(epf_ll_combine_payload_supported(EPF_PAYLOAD_FP8_128));
}

/* every index of the fixed layout is distinct and inside its region */
static void test_layout(void** state) {
  (void)state;
  for (int it = 0; it < 300; ++it) {
    const int R = rnd_in(1, 9), EL = rnd_in(1, 6), K = epf__min_i(rnd_in(1, 9), R * EL), T = rnd_in(1, 40), H = 32 * rnd_in(1, 8);
    epf_config_t c = ll_config(R, R * EL, K, H, T);
    epf_plan_t p;
    unsigned char* seen;
    int64_t n;
    c.combine_payload = it & 1 ? EPF_PAYLOAD_MXFP8 : EPF_PAYLOAD_BF16;
    c.payload = it % 3 == 0 ? EPF_PAYLOAD_MXFP8 : EPF_PAYLOAD_BF16;
    assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
    assert_int_equal(epf_ll_plan_check(&p), EPF_OK);
    assert_true(p.recv_capacity == (int64_t)EL * R * T);
    /* receive rows */
    n = 2 * p.recv_capacity;
    seen = (unsigned char*)calloc((size_t)n, 1);
    for (uint32_t e = 1; e <= 2; ++e)
      for (int le = 0; le < EL; ++le)
        for (int s = 0; s < R; ++s)
          for (int j = 0; j < T; ++j) {
            const int64_t row = epf_ll_recv_row(&p, e, le, s, j);
            const int64_t fr = epf_ll_fixed_row(&p, le, s, j);
            int le2 = -1, s2 = -1, j2 = -1;
            /* the fixed order: one parity's rows, (le, s, slot) in that nesting, and back */
            assert_true(fr == ((int64_t)le * R + s) * T + j);
            assert_true(row == (int64_t)(e & 1u) * p.recv_capacity + fr);
            epf_ll_fixed_row_split(&p, fr, &le2, &s2, &j2);
            assert_true(le2 == le && s2 == s && j2 == j);
            assert_true(row >= 0 && row < n);
            mark_once(seen, row, n);
            assert_true(row / p.recv_capacity == (int64_t)(e & 1u));
            assert_true(epf_plan_recv_token_offset(&p, row) + p.row_bytes <=
                        p.region[EPF_REGION_RECV_TOKENS].offset + p.region[EPF_REGION_RECV_TOKENS].bytes);
            assert_true(epf_plan_recv_meta_offset(&p, row) + p.meta_bytes_per_row <=
                        p.region[EPF_REGION_RECV_META].offset + p.region[EPF_REGION_RECV_META].bytes);
            assert_true(epf_plan_recv_scale_offset(&p, row) + p.scale_bytes_per_row <=
                        p.region[EPF_REGION_RECV_SCALES].offset + p.region[EPF_REGION_RECV_SCALES].bytes);
          }
    free(seen);
    /* packed rows: expert-major, R * T per expert */
    assert_true(epf_ll_packed_row(&p, EL - 1, R * T - 1) == p.recv_capacity - 1);
    /* dispatch signal words */
    n = (int64_t)(p.region[EPF_REGION_SIG_LL_DISPATCH].bytes / 8);
    assert_true(n == 2 * (int64_t)EL * R);
    seen = (unsigned char*)calloc((size_t)n, 1);
    for (uint32_t e = 7; e <= 8; ++e)
      for (int le = 0; le < EL; ++le)
        for (int s = 0; s < R; ++s) {
          const int64_t i = epf_ll_dispatch_signal_index(&p, e, le, s);
          assert_true(i >= 0 && i < n);
          mark_once(seen, i, n);
        }
    free(seen);
    /* combine signal words */
    n = (int64_t)(p.region[EPF_REGION_SIG_LL_COMBINE].bytes / 8);
    assert_true(n == 2 * (int64_t)R);
    seen = (unsigned char*)calloc((size_t)n, 1);
    for (uint32_t e = 3; e <= 4; ++e)
      for (int q = 0; q < R; ++q) {
        const int64_t i = epf_ll_combine_signal_index(&p, e, q);
        assert_true(i >= 0 && i < n);
        mark_once(seen, i, n);
      }
    free(seen);
    /* combine landing rows [2][T][K] */
    n = (int64_t)(p.region[EPF_REGION_COMBINE].bytes / p.combine_row_bytes);
    assert_true(n == 2 * (int64_t)T * K);
    seen = (unsigned char*)calloc((size_t)n, 1);
    for (uint32_t e = 5; e <= 6; ++e)
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k) {
          const int64_t row = epf_ll_combine_row(&p, e, t, k);
          assert_true(row >= 0 && row < n);
          mark_once(seen, row, n);
          assert_true(epf_plan_combine_offset(&p, row) + p.combine_row_bytes <=
                      p.region[EPF_REGION_COMBINE].offset + p.region[EPF_REGION_COMBINE].bytes);
        }
    free(seen);
    /* MXFP8 combine rows hold hidden E4M3 bytes and hidden / 32 scale bytes */
    if (c.combine_payload == EPF_PAYLOAD_MXFP8) assert_true(p.combine_row_bytes >= (uint32_t)(H + H / 32));
  }
}

static void test_rank_buffers(void** state) {
  epf_config_t c = ll_config(4, 64, 8, 2880, 16);
  epf_plan_t p;
  epf_ll_dispatch_args_t a, r;
  epf_ll_combine_args_t ca, cr;
  (void)state;
  assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
  assert_true(epf_ll_buffer_bytes(&p, EPF_LL_BUF_X, EPF_INDEX_DEFAULT) == 16u * 2880u * 2u);
  assert_true(epf_ll_buffer_bytes(&p, EPF_LL_BUF_TOPK_IDX, EPF_INDEX_INT32) == 16u * 8u * 4u);
  assert_true(epf_ll_buffer_bytes(&p, EPF_LL_BUF_TOPK_IDX, EPF_INDEX_INT64) == 16u * 8u * 8u);
  assert_true(epf_ll_buffer_bytes(&p, EPF_LL_BUF_TOPK_IDX, EPF_INDEX_DEFAULT) == 16u * 8u * 8u);
  assert_true(epf_ll_buffer_bytes(&p, EPF_LL_BUF_TOPK_WEIGHTS, EPF_INDEX_DEFAULT) == 16u * 8u * 4u);
  assert_true(epf_ll_buffer_bytes(&p, EPF_LL_BUF_RECV_COUNTS, EPF_INDEX_DEFAULT) == 64u * 4u);
  assert_true(epf_ll_buffer_bytes(&p, EPF_LL_BUF_EXPERT_COUNTS, EPF_INDEX_DEFAULT) == 16u * 4u);
  assert_true(epf_ll_buffer_bytes(&p, EPF_LL_BUF_PACKED_X, EPF_INDEX_DEFAULT) == (uint64_t)p.recv_capacity * p.row_bytes);
  assert_true(epf_ll_buffer_bytes(&p, EPF_LL_BUF_PACKED_SCALES, EPF_INDEX_DEFAULT) == 0u);
  assert_true(epf_ll_buffer_bytes(&p, EPF_LL_BUF_PACKED_META, EPF_INDEX_DEFAULT) == (uint64_t)p.recv_capacity * 16u);
  assert_true(epf_ll_buffer_bytes(&p, EPF_LL_BUF_Y, EPF_INDEX_DEFAULT) == (uint64_t)p.recv_capacity * 2880u * 2u);
  /* MXFP8: compact or swizzled packed scales */
  c.payload = EPF_PAYLOAD_MXFP8;
  assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
  assert_true(epf_ll_buffer_bytes(&p, EPF_LL_BUF_PACKED_SCALES, EPF_INDEX_DEFAULT) == (uint64_t)p.recv_capacity * 90u);
  c.scale_layout = EPF_SCALE_LAYOUT_SWIZZLED_128X4;
  assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
  assert_true(epf_ll_buffer_bytes(&p, EPF_LL_BUF_PACKED_SCALES, EPF_INDEX_DEFAULT) ==
              (uint64_t)epf_scale_swizzle_bytes(p.recv_capacity, 90));

  /* virtual-rank operand strides; NULL stays NULL */
  c = ll_config(4, 64, 8, 2880, 16);
  assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
  memset(&a, 0, sizeof(a));
  a.x = (const void*)(uintptr_t)0x10000;
  a.topk_idx = (const void*)(uintptr_t)0x20000;
  a.index_type = EPF_INDEX_INT64;
  a.recv_counts = (int32_t*)(uintptr_t)0x30000;
  a.round = (uint32_t*)(uintptr_t)0x40000;
  r = epf_ll_dispatch_args_for_rank(&a, &p, 3);
  assert_true((uintptr_t)r.x == 0x10000u + 3u * 16u * 2880u * 2u);
  assert_true((uintptr_t)r.topk_idx == 0x20000u + 3u * 16u * 8u * 8u);
  assert_true((uintptr_t)r.recv_counts == 0x30000u + 3u * 64u * 4u);
  assert_true((uintptr_t)r.round == 0x40000u + 3u * 4u);
  assert_null(r.topk_weights);
  assert_null(r.packed_x);
  assert_null(r.expert_counts);
  memset(&ca, 0, sizeof(ca));
  ca.y = (const void*)(uintptr_t)0x50000;
  ca.out = (void*)(uintptr_t)0x60000;
  cr = epf_ll_combine_args_for_rank(&ca, &p, 2);
  assert_true((uintptr_t)cr.y == 0x50000u + 2u * (uint64_t)p.recv_capacity * 2880u * 2u);
  assert_true((uintptr_t)cr.out == 0x60000u + 2u * 16u * 2880u * 2u);
  assert_null(cr.topk_idx);
}

static void test_smem(void** state) {
  epf_config_t c = ll_config(8, 256, 8, 7168, 128);
  epf_plan_t p;
  size_t d, cmb;
  (void)state;
  assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
  d = epf_ll_dispatch_smem_bytes(&p, 512);
  cmb = epf_ll_combine_smem_bytes(&p, 512);
  /* header + T*K codes + 16 segments (one per warp, EPF_LL_SCAN_SEGMENTS) x E histogram + E counts */
  assert_true(d == (size_t)EPF__LL_HDR_BYTES + 128u * 8u * 4u + 16u * 256u * 4u + 256u * 4u);
  assert_true(cmb >= (size_t)EPF__LL_HDR_BYTES + 257u * 4u);
  assert_true(epf_ll_smem_bytes(&p, 512) == (d > cmb ? d : cmb));
  assert_true(d % 16u == 0u);
  /* fewer warps, fewer histogram segments */
  assert_true(epf_ll_dispatch_smem_bytes(&p, 64) == (size_t)EPF__LL_HDR_BYTES + 128u * 8u * 4u + 2u * 256u * 4u + 256u * 4u);
  assert_true(epf_ll_smem_bytes(&p, 64) >= (size_t)EPF__LL_HDR_BYTES); /* the clean's scratch */
  /* the carve-up: every block's part inside its stage's size, the slot tables cover T * K pairs */
  for (int it = 0; it < 200; ++it) {
    const int R = rnd_in(1, 9), EL = rnd_in(1, 9), K = epf__min_i(rnd_in(1, 9), R * EL), T = rnd_in(1, 300);
    const int threads = 32 * rnd_in(1, 32);
    epf_config_t cc = ll_config(R, R * EL, K, 256, T);
    epf_plan_t q;
    epf_ll_smem_layout_t l;
    const size_t E = (size_t)R * EL;
    assert_int_equal(epf_plan_compute(&cc, &q), EPF_OK);
    l = epf_ll_smem_layout(&q, threads);
    assert_true(l.mask == 0u && l.scan >= (size_t)EPF_MASK_WORDS * 4u && l.scan + 16u <= (size_t)EPF__LL_HDR_BYTES);
    assert_true(l.send_slots >= (size_t)EPF__LL_HDR_BYTES && l.send_slots + l.slots_bytes <= l.dispatch_bytes);
    assert_true(l.recv_groups >= (size_t)EPF__LL_HDR_BYTES && l.recv_groups + (E + 1u) * 4u <= l.dispatch_bytes);
    assert_true(l.push_prefix >= (size_t)EPF__LL_HDR_BYTES && l.push_prefix + (E + 1u) * 4u <= l.combine_bytes);
    assert_true(l.reduce_present >= (size_t)EPF__LL_HDR_BYTES &&
                l.reduce_pulled >= l.reduce_present + (size_t)EPF_MASK_WORDS * 4u &&
                l.reduce_slots >= l.reduce_pulled + (size_t)EPF_MASK_WORDS * 4u);
    assert_true(l.reduce_slots + l.slots_bytes <= l.combine_bytes);
    /* the reduce's per-thread routes: 16-byte aligned, after the weight-gradient bits, inside the stage */
    assert_true(l.reduce_route % 16u == 0u && l.reduce_route >= l.reduce_wgrad + (size_t)EPF_MASK_WORDS * 4u &&
                l.reduce_route + (size_t)threads * 16u <= l.combine_bytes);
    assert_true(l.bytes == (l.dispatch_bytes > l.combine_bytes ? l.dispatch_bytes : l.combine_bytes));
    assert_true(l.send_slots % 16u == 0u && l.reduce_slots % 16u == 0u && l.recv_groups % 16u == 0u);
    assert_true(epf_ll_dispatch_smem_bytes(&q, threads) == l.dispatch_bytes);
    assert_true(epf_ll_combine_smem_bytes(&q, threads) == l.combine_bytes);
    assert_true(epf_ll_smem_bytes(&q, threads) == l.bytes);
    char* smem = (char*)malloc(l.bytes);
    assert_non_null(smem);
    for (int nt = 0; nt <= T; nt += (T / 7) + 1) {
      const epf_ll_slots_t sl = epf_ll_slots_at(&q, smem, l.reduce_slots, nt, threads);
      const char* base = (const char*)sl.code;
      assert_true(base == smem + l.reduce_slots);
      assert_true((const char*)sl.hist >= base + (size_t)T * K * 4u);
      assert_true((const char*)sl.count >= (const char*)sl.hist + (size_t)sl.nseg * E * 4u);
      assert_true((const char*)(sl.count + E) <= base + l.slots_bytes);
      assert_true(sl.nseg >= 1 && sl.nseg <= EPF_LL_SCAN_SEGMENTS && sl.nseg <= (threads >> 5 > 0 ? threads >> 5 : 1));
      assert_true(sl.seg_len % 32 == 0 && (int64_t)sl.nseg * sl.seg_len >= (int64_t)nt * K);
    }
    free(smem);
  }
  /* the largest LL configuration of the defaults still fits an opt-in 227 KB block */
  c = ll_config(8, 1024, 32, 7168, 256);
  assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
  assert_true(epf_ll_smem_bytes(&p, 1024) <= 227u * 1024u);
}

/* issue #14 §3.6 / §4: the launchers check the launch before they use it (a NULL launch was
 * dereferenced by state_reset, mask_update, mask_query_async and mask_clean), and refuse an unknown
 * index type (0 means int64, as for the route). Every refusal comes before any CUDA call. */
static void test_null_launch_and_index_type(void** state) {
  epf_config_t c = ll_config(4, 32, 4, 1024, 16);
  epf_plan_t p;
  epf_ll_state_t st;
  char dummy[64];
  uint32_t mask[EPF_MASK_WORDS] = {0};
  epf_ll_dispatch_args_t da;
  epf_ll_combine_args_t ca;
  (void)state;
  memset(&da, 0, sizeof(da));
  memset(&ca, 0, sizeof(ca));
  assert_int_equal(epf_ll_state_reset(NULL, 0), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_ll_mask_update(NULL, mask, 0), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_ll_mask_query_async(NULL, mask, 0), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_ll_mask_clean(NULL, 0), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_ll_dispatch(NULL, &da, EPF_LL_BOTH, 0), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_ll_combine(NULL, &ca, EPF_LL_BOTH, 0), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
  {
    const epf_ll_launch_t L = epf_ll_launch_make(&p, epf_team_virtual(dummy, p.total_bytes, 0, 4), &st, NULL, 1);
    da.num_tokens = 0;
    da.recv_counts = (int32_t*)dummy;
    da.index_type = 7;
    assert_int_equal(epf_ll_dispatch(&L, &da, EPF_LL_BOTH, 0), EPF_ERR_INVALID_ARGUMENT);
    da.index_type = -1;
    assert_int_equal(epf_ll_dispatch(&L, &da, EPF_LL_SEND, 0), EPF_ERR_INVALID_ARGUMENT);
    ca.index_type = 3;
    ca.recv_counts = (const int32_t*)dummy;
    ca.y = dummy;
    assert_int_equal(epf_ll_combine(&L, &ca, EPF_LL_BOTH, 0), EPF_ERR_INVALID_ARGUMENT);
  }
  assert_true(epf_ll_index_type_ok(EPF_INDEX_DEFAULT) && epf_ll_index_type_ok(EPF_INDEX_INT32) &&
              epf_ll_index_type_ok(EPF_INDEX_INT64) && !epf_ll_index_type_ok(3));
  assert_int_equal(epf_ll_index_is64(EPF_INDEX_DEFAULT), 1);
  assert_int_equal(epf_ll_index_is64(EPF_INDEX_INT32), 0);
}

/* The combine transport (epf_ll_combine_pulls, and the launchers' epf__ll_combine_pulls): BF16 pulls
 * only with EPF_LL_Y_IN_PLACE_PULL; MXFP8 pulls by default for every y layout, through the
 * EXPERT_OUT region the plan gives it ([2][EL][R][T] combine rows, where the expert side quantizes
 * the outputs), and EPF_FLAG_COMBINE_PUSH forces push (no region). The EXPERT_OUT row of a receive
 * row is epf_plan_expert_out_offset's, inside the region, for both parities. */
static void test_combine_transport(void** state) {
  static const int ys[] = {EPF_LL_Y_FIXED, EPF_LL_Y_PACKED, EPF_LL_Y_IN_PLACE, EPF_LL_Y_IN_PLACE_PULL};
  (void)state;
  for (int it = 0; it < 200; ++it) {
    const int R = rnd_in(1, 13), EL = rnd_in(1, 8), K = rnd_in(1, 22), T = rnd_in(1, 256);
    const int H = 32 * rnd_in(1, 224);
    for (int cp = 0; cp < 2; ++cp)
      for (int push = 0; push < 2; ++push) {
        epf_config_t c = ll_config(R, R * EL, K < R * EL ? K : R * EL, H, T);
        epf_plan_t p;
        epf_ll_launch_t L;
        epf_ll_combine_args_t a;
        const int mx = cp == 1;
        c.combine_payload = mx ? EPF_PAYLOAD_MXFP8 : EPF_PAYLOAD_BF16;
        c.payload = it & 1 ? EPF_PAYLOAD_MXFP8 : EPF_PAYLOAD_BF16;
        c.flags = push ? EPF_FLAG_COMBINE_PUSH : 0u;
        assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
        assert_int_equal(epf_ll_plan_check(&p), EPF_OK);
        if (mx && !push) {
          const uint64_t rows = 2u * (uint64_t)p.recv_capacity;
          assert_true(p.region[EPF_REGION_EXPERT_OUT].bytes == rows * p.combine_row_bytes);
          for (uint32_t ep = 1; ep <= 2; ++ep) {
            const int le = rnd_in(0, EL - 1), src = rnd_in(0, R - 1), slot = rnd_in(0, T - 1);
            const int64_t row = epf_ll_recv_row(&p, ep, le, src, slot);
            const uint64_t o = epf_plan_expert_out_offset(&p, row);
            assert_true(o == p.region[EPF_REGION_EXPERT_OUT].offset + (uint64_t)row * p.combine_row_bytes);
            assert_true(o + p.combine_row_bytes <= p.region[EPF_REGION_EXPERT_OUT].offset +
                                                       p.region[EPF_REGION_EXPERT_OUT].bytes);
          }
        } else {
          assert_true(p.region[EPF_REGION_EXPERT_OUT].bytes == 0);
        }
        assert_true(p.region[EPF_REGION_COMBINE].bytes != 0); /* push stays possible */
        L = epf_ll_launch_make(&p, epf_team_virtual(NULL, p.total_bytes, 0, R), NULL, NULL, 1);
        memset(&a, 0, sizeof(a));
        for (int yi = 0; yi < 4; ++yi) {
          const bool want = mx ? !push : ys[yi] == EPF_LL_Y_IN_PLACE_PULL;
          a.y_layout = ys[yi];
          assert_int_equal(epf_ll_combine_pulls(&p, ys[yi]), want);
          assert_int_equal(epf__ll_combine_pulls(&L, &a), want);
          /* a BF16 pull only signals: the grid follows the reduce; an MXFP8 pull quantizes every row */
          assert_int_equal(epf__ll_combine_bpr_kind(&L, &a),
                           want && !mx ? EPF_LL_BPR_COMBINE_PULL : EPF_LL_BPR_COMBINE);
        }
        /* RANK_MAJOR: no EXPERT_OUT region (any payload, any flag); pull only with PACKED_PULL and
         * BF16 both ways (the expert side pre-reduces, so the grid stays the push's) */
        c.layout = EPF_LAYOUT_RANK_MAJOR;
        assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
        assert_int_equal(epf_ll_plan_check(&p), EPF_OK);
        assert_true(p.region[EPF_REGION_EXPERT_OUT].bytes == 0);
        L = epf_ll_launch_make(&p, epf_team_virtual(NULL, p.total_bytes, 0, R), NULL, NULL, 1);
        for (int yi = 0; yi < 5; ++yi) {
          const int y = yi < 4 ? ys[yi] : EPF_LL_Y_PACKED_PULL;
          const bool want = y == EPF_LL_Y_PACKED_PULL && !mx && c.payload == EPF_PAYLOAD_BF16;
          a.y_layout = y;
          assert_int_equal(epf_ll_combine_pulls(&p, y), want);
          assert_int_equal(epf__ll_combine_pulls(&L, &a), want);
          assert_int_equal(epf__ll_combine_bpr_kind(&L, &a), EPF_LL_BPR_COMBINE);
        }
      }
  }
}

/* routing-only inputs of the LL references (in->htopk [R][Tmax][K]; the caller frees it): ids
 * mostly valid from a few experts (many repeats), some -1, some outside [-1, E), E = R * EL */
static void rand_routing_in(llref_in_t* in, int R, int EL, int K, int Tmax, int T) {
  const int E = R * EL;
  /* R, Tmax, T, K, E, EL; no payload, no H: the slot references read only htopk */
  const llref_in_t z = {R, Tmax, T, 0, K, E, EL, 0, 0, 0, 0, 0, NULL, NULL, NULL, NULL, NULL, 0, NULL};
  *in = z;
  in->htopk = (int64_t*)malloc((size_t)R * Tmax * K * sizeof(int64_t));
  assert_non_null(in->htopk);
  for (size_t i = 0; i < (size_t)R * Tmax * K; ++i) {
    const int c = rnd_in(0, 19);
    in->htopk[i] = c < 14 ? (int64_t)rnd_in(0, E - 1) % (c < 7 ? 3 : E) : c < 17 ? -1 : c == 17 ? E : c == 18 ? -2 : (int64_t)1 << 40;
  }
}

/* Slots in HT and LL (docs/concepts.md): for the same topk_idx, the LL slot of every (token, k)
 * (the LL reference: where the GPU tests require the row to land) is the route's SLOT (the route
 * reference: what the route tests require), including -1, ids outside [-1, E) and repeats, with
 * the same per-expert counts and the same dropped-id counts. */
static void test_slots_match_route(void** state) {
  (void)state;
  for (int it = 0; it < 200; ++it) {
    const int R = rnd_in(1, 8), EL = rnd_in(1, 6), K = rnd_in(1, 9), Tmax = rnd_in(1, 48);
    const int E = R * EL, T = rnd_in(0, Tmax);
    llref_in_t in;
    llref_t ll;
    route_ref_t rr;
    int Tr[8];
    rand_routing_in(&in, R, EL, K, Tmax, T);
    for (int r = 0; r < R; ++r) Tr[r] = T;
    llref_dispatch(&in, 0u, &ll);
    assert_int_equal(route_ref_compute_ex(&rr, R, E, K, Tmax, Tr, 1, 0, (int64_t)R * Tmax * K, in.htopk), 0);
    for (int s = 0; s < R; ++s) {
      assert_int_equal(ll.dropped_src[s], rr.dropped[s]);
      for (int e = 0; e < E; ++e)
        assert_int_equal(ll.counts[((size_t)(e / EL) * EL + e % EL) * R + s], rr.expert_count[(size_t)s * E + e]);
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k) {
          const size_t tk = ((size_t)s * Tmax + t) * K + k;
          const int slot = rr.slot[tk];
          if (slot < 0) continue; /* no copy of its own: the counts above say LL made none either */
          {
            const int e = (int)in.htopk[tk];
            const size_t g = ((size_t)(e / EL) * EL + e % EL) * R + s;
            assert_int_equal(ll.row_t[g * Tmax + slot], t);
            assert_int_equal(ll.row_k[g * Tmax + slot], k);
          }
        }
    }
    llref_free(&ll);
    route_ref_free(&rr);
    free(in.htopk);
  }
}

/* RANK_MAJOR: every (parity, source, slot) row, (parity, source) signal word, count word and
 * (parity, token, rank) combine row is distinct and inside its region; the expert-major view
 * buffers have EL * R * T rows; the shared-memory carve-up of the rank-major blocks stays inside
 * the stage sizes (and an EXPERT_MAJOR plan's sizes do not change) */
static void test_rm_layout(void** state) {
  (void)state;
  for (int it = 0; it < 300; ++it) {
    const int R = rnd_in(1, 13), EL = rnd_in(1, 6), K = epf__min_i(rnd_in(1, 32), R * EL), T = rnd_in(1, 40), H = 32 * rnd_in(1, 8);
    const int threads = 32 * rnd_in(1, 32);
    epf_config_t c = ll_config(R, R * EL, K, H, T);
    epf_plan_t p, pem;
    epf_ll_smem_layout_t l, lem;
    unsigned char* seen;
    int64_t n;
    c.combine_payload = it & 1 ? EPF_PAYLOAD_MXFP8 : EPF_PAYLOAD_BF16;
    c.payload = it % 3 == 0 ? EPF_PAYLOAD_MXFP8 : EPF_PAYLOAD_BF16;
    assert_int_equal(epf_plan_compute(&c, &pem), EPF_OK);
    c.layout = EPF_LAYOUT_RANK_MAJOR;
    assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
    assert_int_equal(epf_ll_plan_check(&p), EPF_OK);
    assert_true(p.recv_capacity == (int64_t)R * T);
    assert_true(p.meta_bytes_per_row == epf_recv_meta_rm_bytes(K));
    /* receive rows [2][R][T] */
    n = 2 * p.recv_capacity;
    seen = (unsigned char*)calloc((size_t)n, 1);
    for (uint32_t e = 1; e <= 2; ++e)
      for (int s = 0; s < R; ++s)
        for (int j = 0; j < T; ++j) {
          const int64_t row = epf_ll_rm_recv_row(&p, e, s, j);
          assert_true(epf_ll_rm_fixed_row(&p, s, j) == (int64_t)s * T + j);
          assert_true(row == (int64_t)(e & 1u) * p.recv_capacity + (int64_t)s * T + j);
          assert_true(row >= 0 && row < n);
          mark_once(seen, row, n);
          assert_true(epf_plan_recv_token_offset(&p, row) + p.row_bytes <=
                      p.region[EPF_REGION_RECV_TOKENS].offset + p.region[EPF_REGION_RECV_TOKENS].bytes);
          assert_true(epf_plan_recv_meta_offset(&p, row) + p.meta_bytes_per_row <=
                      p.region[EPF_REGION_RECV_META].offset + p.region[EPF_REGION_RECV_META].bytes);
          assert_true(epf_plan_recv_scale_offset(&p, row) + p.scale_bytes_per_row <=
                      p.region[EPF_REGION_RECV_SCALES].offset + p.region[EPF_REGION_RECV_SCALES].bytes);
        }
    free(seen);
    /* signal words: the first 2 R of SIG_LL_DISPATCH */
    n = (int64_t)(p.region[EPF_REGION_SIG_LL_DISPATCH].bytes / 8);
    seen = (unsigned char*)calloc((size_t)n, 1);
    for (uint32_t e = 7; e <= 8; ++e)
      for (int s = 0; s < R; ++s) {
        const int64_t i = epf_ll_rm_dispatch_signal_index(&p, e, s);
        assert_true(i >= 0 && i < 2 * R && i < n);
        mark_once(seen, i, n);
      }
    free(seen);
    /* count words: (parity, source, expert) inside COUNTS, distinct, 8-byte aligned */
    n = (int64_t)(p.region[EPF_REGION_COUNTS].bytes / 8);
    seen = (unsigned char*)calloc((size_t)n, 1);
    for (uint32_t e = 3; e <= 4; ++e)
      for (int s = 0; s < R; ++s)
        for (int g = 0; g < R * EL; ++g) {
          const uint64_t o = epf_ll_rm_count_offset(&p, e, s, g);
          const int64_t i = (int64_t)((o - p.region[EPF_REGION_COUNTS].offset) / 8);
          assert_true(o >= p.region[EPF_REGION_COUNTS].offset && o % 8u == 0u && i < n);
          mark_once(seen, i, n);
        }
    free(seen);
    /* combine landing rows [2][T][R] */
    n = (int64_t)(p.region[EPF_REGION_COMBINE].bytes / p.combine_row_bytes);
    assert_true(n == 2 * (int64_t)T * R);
    seen = (unsigned char*)calloc((size_t)n, 1);
    for (uint32_t e = 5; e <= 6; ++e)
      for (int t = 0; t < T; ++t)
        for (int d = 0; d < R; ++d) {
          const int64_t row = epf_ll_rm_combine_row(&p, e, t, d);
          assert_true(row >= 0 && row < n);
          mark_once(seen, row, n);
        }
    free(seen);
    /* the expert-major view: the same rows for both layouts */
    assert_true(epf_ll_buffer_bytes(&p, EPF_LL_BUF_PACKED_X, EPF_INDEX_DEFAULT) == (uint64_t)EL * R * T * p.row_bytes);
    assert_true(epf_ll_buffer_bytes(&p, EPF_LL_BUF_PACKED_META, EPF_INDEX_DEFAULT) == (uint64_t)EL * R * T * 16u);
    assert_true(epf_ll_buffer_bytes(&p, EPF_LL_BUF_Y, EPF_INDEX_DEFAULT) == epf_ll_buffer_bytes(&pem, EPF_LL_BUF_Y, EPF_INDEX_DEFAULT));
    assert_true(epf_ll_buffer_bytes(&p, EPF_LL_BUF_PACKED_X, EPF_INDEX_DEFAULT) == epf_ll_buffer_bytes(&pem, EPF_LL_BUF_PACKED_X, EPF_INDEX_DEFAULT));
    assert_true(epf_ll_packed_row(&p, EL - 1, R * T - 1) == (int64_t)EL * R * T - 1);
    /* shared memory */
    l = epf_ll_smem_layout(&p, threads);
    lem = epf_ll_smem_layout(&pem, threads);
    assert_true(lem.dispatch_bytes == epf_ll_smem_layout(&pem, threads).dispatch_bytes);
    assert_true(l.rm_send_slots >= l.send_slots + l.slots_bytes && l.rm_send_slots + l.rm_slots_bytes <= l.dispatch_bytes);
    assert_true(l.rm_present >= (size_t)EPF__LL_HDR_BYTES && l.rm_rows >= l.rm_present + EPF_MASK_WORDS * 4u);
    assert_true(l.rm_cnt >= l.rm_rows + (size_t)(R + 1) * 4u && l.rm_off >= l.rm_cnt + (size_t)EL * R * 4u);
    assert_true(l.rm_off + (size_t)EL * (R + 1) * 4u <= l.dispatch_bytes);
    assert_true(l.rm_off + (size_t)EL * (R + 1) * 4u <= l.combine_bytes);
    assert_true(l.rm_reduce_slots >= l.reduce_pulled + EPF_MASK_WORDS * 4u && l.rm_reduce_slots + l.rm_slots_bytes <= l.combine_bytes);
    assert_true(l.rm_send_slots % 16u == 0u && l.rm_cnt % 16u == 0u && l.rm_off % 16u == 0u && l.rm_reduce_slots % 16u == 0u);
    assert_true(l.bytes == (l.dispatch_bytes > l.combine_bytes ? l.dispatch_bytes : l.combine_bytes));
    assert_true(epf_ll_smem_bytes(&p, threads) == l.bytes);
    {
      char* smem = (char*)malloc(l.bytes);
      assert_non_null(smem);
      for (int nt = 0; nt <= T; nt += (T / 5) + 1) {
        const epf_ll_slots_t sl = epf_ll_rm_slots_at(&p, smem, l.rm_send_slots, nt, threads);
        const char* base = (const char*)sl.code;
        assert_true((const char*)sl.hist >= base + (size_t)T * K * 4u);
        assert_true((const char*)sl.count >= (const char*)sl.hist + (size_t)sl.nseg * R * 4u);
        assert_true((const char*)(sl.count + R) <= base + l.rm_slots_bytes);
        assert_true(sl.seg_len % 32 == 0 && (int64_t)sl.nseg * sl.seg_len >= (int64_t)nt * K);
      }
      free(smem);
    }
  }
  /* the largest LL configuration of the defaults fits an opt-in 227 KB block as RANK_MAJOR too */
  {
    epf_config_t c = ll_config(8, 1024, 32, 7168, 256);
    epf_plan_t p;
    c.layout = EPF_LAYOUT_RANK_MAJOR;
    assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
    assert_true(epf_ll_smem_bytes(&p, 1024) <= 227u * 1024u);
  }
}

/* RANK_MAJOR: the LL reference's rank-major slots (llrm_dispatch: one row per (token, rank), in
 * token order) are the route's rank-major slots (epf_route_ref.h rm_slot), with unequal T per
 * rank, -1, repeats and ids outside [-1, E); its expert slots are llref_dispatch's */
static void test_rm_slots_match_route(void** state) {
  (void)state;
  for (int it = 0; it < 200; ++it) {
    const int R = rnd_in(1, 8), EL = rnd_in(1, 6), K = rnd_in(1, 12), Tmax = rnd_in(1, 48);
    const int E = R * EL;
    llref_in_t in;
    llrm_ref_t rm;
    route_ref_t rr;
    int Tr[8];
    rand_routing_in(&in, R, EL, K, Tmax, Tmax);
    for (int r = 0; r < R; ++r) Tr[r] = r == 0 ? 0 : r == 1 ? (Tmax < 1 ? Tmax : 1) : rnd_in(0, Tmax);
    llrm_dispatch(&in, Tr, 0u, &rm);
    assert_int_equal(route_ref_compute_ex(&rr, R, E, K, Tmax, Tr, 1, 1, (int64_t)R * Tmax * K, in.htopk), 0);
    for (int s = 0; s < R; ++s) {
      assert_int_equal(rm.em.dropped_src[s], rr.dropped[s]);
      for (int e = 0; e < E; ++e)
        assert_int_equal(rm.em.counts[((size_t)(e / EL) * EL + e % EL) * R + s], rr.expert_count[(size_t)s * E + e]);
      for (int d = 0; d < R; ++d) {
        int n = 0;
        for (int t = 0; t < Tr[s]; ++t) {
          const int slot = rr.rm_slot[((size_t)s * Tmax + t) * R + d];
          if (slot < 0) continue;
          assert_int_equal(slot, n);
          assert_int_equal(rm.row_t[((size_t)d * R + s) * Tmax + slot], t);
          ++n;
        }
        assert_int_equal(rm.rows[(size_t)d * R + s], n);
      }
      for (int t = 0; t < Tr[s]; ++t)
        for (int k = 0; k < K; ++k) {
          const size_t tk = ((size_t)s * Tmax + t) * K + k;
          if (rr.slot[tk] >= 0) assert_int_equal(rm.em_slot[tk], rr.slot[tk]);
        }
    }
    llrm_free(&rm);
    route_ref_free(&rr);
    free(in.htopk);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rm_layout), cmocka_unit_test(test_rm_slots_match_route),
      cmocka_unit_test(test_state_init), cmocka_unit_test(test_plan_checks), cmocka_unit_test(test_layout),
      cmocka_unit_test(test_rank_buffers), cmocka_unit_test(test_smem), cmocka_unit_test(test_null_launch_and_index_type),
      cmocka_unit_test(test_slots_match_route), cmocka_unit_test(test_combine_transport),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
