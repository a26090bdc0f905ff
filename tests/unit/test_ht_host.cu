/* test_ht_host — the host-side checks of the ready-made HT launchers (ht/kernels.cuh) on the CPU, no
 * GPU needed: every case breaks one rule and must be refused with its status BEFORE any CUDA call
 * (a machine without a GPU would otherwise answer with a CUDA error or a launch). Regression tests
 * of issue #14 §3: the team's rank, size and memory (item 1), expert_rows of an expert-major
 * expert_out (item 2), blocks_per_rank's bound (item 3), the route handle (item 5: prefix, base,
 * count 0 divided by zero on the host), phase bits. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "epf_cmocka.h"

#include "epfuse/ht/kernels.cuh"

typedef struct {
  epf_plan_t plan;
  epf_route_t route;
  epf_ht_step_t step;
  epf_team_t team; /* a real rank's view (route.count == 1) */
  epf_ht_state_t state;
  alignas(EPF_ALIGN) char dummy[64]; /* stands in for device buffers (a route's base is EPF_ALIGN-aligned):
                                        nothing is dereferenced on the host */
} fix_t;

/* A valid HT setup of R ranks, as far as the host can tell: everything is checked, nothing runs. */
static void fix_make(fix_t* f, int R, int layout, int push) {
  epf_config_t c = EPF_CONFIG_INIT;
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  memset(f, 0, sizeof(*f));
  c.nranks = R;
  c.num_experts = 8 * R;
  c.top_k = 4;
  c.hidden = 2880;
  c.max_tokens_per_rank = 64;
  c.layout = layout;
  c.flags = push ? EPF_FLAG_COMBINE_PUSH : 0u;
  assert_int_equal(epf_plan_compute(&c, &f->plan), EPF_OK);
  f->route.size = (uint32_t)sizeof(epf_route_t);
  f->route.magic = EPF_ROUTE_HANDLE_MAGIC;
  f->route.version = EPF_ROUTE_HANDLE_VERSION;
  f->route.count = 1;
  f->route.base = f->dummy;
  assert_int_equal(epf_route_layout_compute(&f->plan, &rc, &f->route.layout), EPF_OK);
  f->team = epf_team_affine(f->dummy, f->plan.total_bytes, R - 1, R);
  {
    const epf_ht_step_t init = EPF_HT_STEP_INIT;
    f->step = init;
  }
  f->step.x = f->dummy;
  f->step.topk_weights = (const float*)f->dummy;
  f->step.out = f->dummy;
  f->step.expert_out = f->dummy;
  f->step.em_view = f->dummy;
  f->step.state = &f->state;
  f->step.expert_rows = f->plan.recv_capacity;
}

/* every launcher of this fixture refuses with `want` (and the pure check agrees where it should) */
static void expect_all(fix_t* f, epf_status_t want) {
  assert_int_equal(epf_ht_dispatch(&f->route, f->team, &f->plan, &f->step, f->dummy, EPF_HT_BOTH, 0), want);
  assert_int_equal(epf_ht_combine(&f->route, f->team, &f->plan, &f->step, f->dummy, 0), want);
  if (f->plan.layout == EPF_LAYOUT_RANK_MAJOR) assert_int_equal(epf_ht_expand(&f->route, f->team, &f->plan, &f->step, 0), want);
}

static void test_valid_fixture(void** state) {
  fix_t f;
  (void)state;
  fix_make(&f, 6, EPF_LAYOUT_EXPERT_MAJOR, 0);
  assert_int_equal(epf_ht_check(&f.plan, &f.route, &f.step), EPF_OK);
  fix_make(&f, 5, EPF_LAYOUT_RANK_MAJOR, 1);
  assert_int_equal(epf_ht_check(&f.plan, &f.route, &f.step), EPF_OK);
}

/* item 1: a real rank outside [0, nranks), a team of another size, a team without memory */
static void test_team(void** state) {
  fix_t f;
  (void)state;
  for (int layout = EPF_LAYOUT_EXPERT_MAJOR; layout <= EPF_LAYOUT_RANK_MAJOR; ++layout) {
    fix_make(&f, 6, layout, 0);
    f.team.rank = 6;
    expect_all(&f, EPF_ERR_RANK);
    f.team.rank = -1;
    expect_all(&f, EPF_ERR_RANK);
    fix_make(&f, 6, layout, 0);
    f.team.nranks = 5;
    expect_all(&f, EPF_ERR_CONFIG_MISMATCH);
    fix_make(&f, 6, layout, 0);
    f.team.base = NULL;
    expect_all(&f, EPF_ERR_INVALID_ARGUMENT);
    fix_make(&f, 6, layout, 0);
    f.team.stride = f.plan.total_bytes - 16; /* slices would overlap */
    expect_all(&f, EPF_ERR_INVALID_ARGUMENT);
  }
}

/* item 2: an expert-major expert_out needs one row per receive row */
static void test_expert_rows(void** state) {
  fix_t f;
  (void)state;
  fix_make(&f, 6, EPF_LAYOUT_EXPERT_MAJOR, 0);
  f.step.expert_rows = f.plan.recv_capacity - 1;
  assert_int_equal(epf_ht_combine(&f.route, f.team, &f.plan, &f.step, f.dummy, 0), EPF_ERR_INVALID_ARGUMENT);
  f.step.expert_rows = 0;
  assert_int_equal(epf_ht_combine(&f.route, f.team, &f.plan, &f.step, f.dummy, 0), EPF_ERR_INVALID_ARGUMENT);
  f.step.expert_rows = -1;
  expect_all(&f, EPF_ERR_INVALID_ARGUMENT);
  /* rank-major: at least one view row */
  fix_make(&f, 6, EPF_LAYOUT_RANK_MAJOR, 0);
  f.step.expert_rows = 0;
  assert_int_equal(epf_ht_combine(&f.route, f.team, &f.plan, &f.step, f.dummy, 0), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_ht_expand(&f.route, f.team, &f.plan, &f.step, 0), EPF_ERR_INVALID_ARGUMENT);
}

/* expert outputs already in the window's EXPERT_OUT rows: a BF16 combine pulls them in place (the
 * put is skipped where source and destination coincide); an MXFP8 combine would skip quantizing a
 * row that sits at its own destination, so the launcher refuses the overlap */
static void test_expert_out_in_window(void** state) {
  fix_t f;
  epf_config_t c = EPF_CONFIG_INIT;
  char* far_away = (char*)malloc(64);
  (void)state;
  fix_make(&f, 6, EPF_LAYOUT_EXPERT_MAJOR, 0);
  c.nranks = 6;
  c.num_experts = 48;
  c.top_k = 4;
  c.hidden = 2880;
  c.max_tokens_per_rank = 64;
  c.combine_payload = EPF_PAYLOAD_MXFP8;
  assert_int_equal(epf_plan_compute(&c, &f.plan), EPF_OK);
  assert_true(f.plan.region[EPF_REGION_EXPERT_OUT].bytes > 0);
  { /* the route and the team follow the new plan */
    epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
    assert_int_equal(epf_route_layout_compute(&f.plan, &rc, &f.route.layout), EPF_OK);
    f.team = epf_team_affine(f.dummy, f.plan.total_bytes, 5, 6);
  }
  f.step.expert_out = far_away; /* the control: the same plan with a separate buffer is not refused for it */
  assert_int_equal(epf_ht_check(&f.plan, &f.route, &f.step), EPF_OK);
  f.step.expert_rows = f.plan.recv_capacity;
  /* rank 3's EXPERT_OUT rows (the team's slices: dummy + p * total_bytes) */
  f.step.expert_out = f.dummy + 3 * f.plan.total_bytes + f.plan.region[EPF_REGION_EXPERT_OUT].offset;
  assert_int_equal(epf__ht_expert_out_in_window(&f.route, f.team, &f.plan, &f.step), 1);
  assert_int_equal(epf_ht_combine(&f.route, f.team, &f.plan, &f.step, f.dummy, 0), EPF_ERR_INVALID_ARGUMENT);
  /* a separate buffer does not overlap; a table team's slices are not known on the host */
  f.step.expert_out = far_away;
  assert_int_equal(epf__ht_expert_out_in_window(&f.route, f.team, &f.plan, &f.step), 0);
  f.step.expert_out = f.dummy + f.plan.region[EPF_REGION_EXPERT_OUT].offset;
  assert_int_equal(epf__ht_expert_out_in_window(&f.route, f.team, &f.plan, &f.step), 1);
  f.team.base = NULL;
  assert_int_equal(epf__ht_expert_out_in_window(&f.route, f.team, &f.plan, &f.step), 0);
  free(far_away);
}

/* item 3: blocks_per_rank has a bound (bpr * count overflowed int: 4 blocks all playing rank 0) */
static void test_blocks_per_rank(void** state) {
  fix_t f;
  (void)state;
  fix_make(&f, 6, EPF_LAYOUT_EXPERT_MAJOR, 0);
  f.step.blocks_per_rank = EPF_HT_MAX_BLOCKS_PER_RANK + 1;
  expect_all(&f, EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_ht_check(&f.plan, &f.route, &f.step), EPF_ERR_INVALID_ARGUMENT);
  f.step.blocks_per_rank = (1 << 30) + 1; /* times 4 ranks wraps to 4 blocks in 32 bits */
  assert_int_equal(epf_ht_check(&f.plan, &f.route, &f.step), EPF_ERR_INVALID_ARGUMENT);
  f.step.blocks_per_rank = -1;
  assert_int_equal(epf_ht_check(&f.plan, &f.route, &f.step), EPF_ERR_INVALID_ARGUMENT);
  f.step.blocks_per_rank = EPF_HT_MAX_BLOCKS_PER_RANK;
  assert_int_equal(epf_ht_check(&f.plan, &f.route, &f.step), EPF_OK);
}

/* item 5: the route handle is validated (count 0 divided by zero on the host) */
static void test_route_handle(void** state) {
  fix_t f;
  (void)state;
  fix_make(&f, 6, EPF_LAYOUT_EXPERT_MAJOR, 0);
  f.route.count = 0;
  expect_all(&f, EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_ht_check(&f.plan, &f.route, &f.step), EPF_ERR_INVALID_ARGUMENT);
  f.route.count = 3; /* neither 1 nor nranks */
  assert_int_equal(epf_ht_check(&f.plan, &f.route, &f.step), EPF_ERR_INVALID_ARGUMENT);
  f.route.count = -6;
  assert_int_equal(epf_ht_check(&f.plan, &f.route, &f.step), EPF_ERR_INVALID_ARGUMENT);
  fix_make(&f, 6, EPF_LAYOUT_EXPERT_MAJOR, 0);
  f.route.base = NULL;
  expect_all(&f, EPF_ERR_INVALID_ARGUMENT);
  fix_make(&f, 6, EPF_LAYOUT_EXPERT_MAJOR, 0);
  f.route.magic = 0;
  expect_all(&f, EPF_ERR_STRUCT_VERSION);
  fix_make(&f, 6, EPF_LAYOUT_EXPERT_MAJOR, 0);
  f.route.size = 8;
  assert_int_equal(epf_ht_check(&f.plan, &f.route, &f.step), EPF_ERR_STRUCT_VERSION);
  fix_make(&f, 6, EPF_LAYOUT_EXPERT_MAJOR, 0);
  f.route.layout.nranks = 3;
  assert_int_equal(epf_ht_check(&f.plan, &f.route, &f.step), EPF_ERR_CONFIG_MISMATCH);
  fix_make(&f, 6, EPF_LAYOUT_EXPERT_MAJOR, 0);
  f.route.layout.exchange = 0;
  assert_int_equal(epf_ht_check(&f.plan, &f.route, &f.step), EPF_ERR_CONFIG_MISMATCH);
  /* a handle damaged after it was made (a field overwritten, a copy of another route's layout
   * over this plan): its layout is re-derived from the plan at every launch, byte for byte */
  {
    static const char* const what[] = {"an array moved", "total_bytes", "max_tokens", "config hash", "top_k",
                                       "max_blocks", "recv_capacity", "flags"};
    for (int i = 0; i < (int)(sizeof(what) / sizeof(what[0])); ++i) {
      epf_route_step_t rs;
      fix_make(&f, 6, EPF_LAYOUT_EXPERT_MAJOR, 0);
      assert_int_equal(epf_route_check(&f.route, &f.plan), EPF_OK);
      switch (i) {
        case 0: f.route.layout.array[EPF_ROUTE_SLOT].offset += EPF_ALIGN; break;
        case 1: f.route.layout.total_bytes += EPF_ALIGN; break;
        case 2: f.route.layout.max_tokens -= 1; break;
        case 3: f.route.layout.config_hash ^= 1u; break;
        case 4: f.route.layout.top_k = 2; break;
        case 5: f.route.layout.max_blocks += 1; break;
        case 6: f.route.layout.recv_capacity += 1; break;
        default: f.route.layout.flags |= EPF_ROUTE_FLAG_LOCAL_ONLY; break;
      }
      if (epf_route_check(&f.route, &f.plan) != EPF_ERR_CONFIG_MISMATCH) fail_msg("damaged route (%s) accepted", what[i]);
      expect_all(&f, EPF_ERR_CONFIG_MISMATCH);
      rs = epf_route_step_make(f.dummy, 8, epf_wait_make(0, NULL, NULL, 0));
      assert_int_equal(epf_route_update(&f.route, f.team, &f.plan, &rs, 0), EPF_ERR_CONFIG_MISMATCH);
    }
    fix_make(&f, 6, EPF_LAYOUT_EXPERT_MAJOR, 0);
    f.route.layout.magic = 0;
    assert_int_equal(epf_route_check(&f.route, &f.plan), EPF_ERR_STRUCT_VERSION);
    expect_all(&f, EPF_ERR_STRUCT_VERSION);
    fix_make(&f, 6, EPF_LAYOUT_EXPERT_MAJOR, 0);
    f.route.base = f.dummy + 16;
    assert_int_equal(epf_route_check(&f.route, &f.plan), EPF_ERR_ALIGNMENT);
    expect_all(&f, EPF_ERR_ALIGNMENT);
    assert_int_equal(epf_route_check(NULL, &f.plan), EPF_ERR_INVALID_ARGUMENT);
    assert_int_equal(epf_route_check(&f.route, NULL), EPF_ERR_INVALID_ARGUMENT);
  }
  fix_make(&f, 6, EPF_LAYOUT_EXPERT_MAJOR, 0);
  f.step.state = NULL;
  expect_all(&f, EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_ht_check(NULL, &f.route, &f.step), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_ht_check(&f.plan, NULL, &f.step), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_ht_check(&f.plan, &f.route, NULL), EPF_ERR_INVALID_ARGUMENT);
}

/* unknown phase bits; the dispatch's own operands */
static void test_phases(void** state) {
  fix_t f;
  (void)state;
  fix_make(&f, 6, EPF_LAYOUT_EXPERT_MAJOR, 0);
  assert_int_equal(epf_ht_dispatch(&f.route, f.team, &f.plan, &f.step, f.dummy, 0, 0), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_ht_dispatch(&f.route, f.team, &f.plan, &f.step, f.dummy, EPF_HT_SEND | 0x10, 0),
                   EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_ht_dispatch(&f.route, f.team, &f.plan, &f.step, NULL, EPF_HT_SEND, 0), EPF_ERR_INVALID_ARGUMENT);
  f.step.x = NULL;
  assert_int_equal(epf_ht_dispatch(&f.route, f.team, &f.plan, &f.step, f.dummy, EPF_HT_SEND, 0), EPF_ERR_INVALID_ARGUMENT);
}

/* the versioned step (issue #30): a step without the prefix — zeroed, or filled by code built
 * against the 120- / 144-byte step — is refused by every launcher before anything else is read;
 * a larger (newer) step is accepted */
static void test_step_prefix(void** state) {
  fix_t f;
  (void)state;
  for (int layout = EPF_LAYOUT_EXPERT_MAJOR; layout <= EPF_LAYOUT_RANK_MAJOR; ++layout) {
    fix_make(&f, 4, layout, 0);
    const epf_ht_step_t good = f.step;
    memset(&f.step, 0, sizeof(f.step)); /* the old "zero means default" initialization */
    expect_all(&f, EPF_ERR_STRUCT_VERSION);
    assert_int_equal(epf_ht_check(&f.plan, &f.route, &f.step), EPF_ERR_STRUCT_VERSION);
    f.step = good;
    f.step.size = 144; /* a caller compiled against the prefix-less 144-byte step */
    expect_all(&f, EPF_ERR_STRUCT_VERSION);
    f.step.size = EPF_HT_STEP_MIN_SIZE - 1;
    expect_all(&f, EPF_ERR_STRUCT_VERSION);
    f.step = good;
    f.step.magic ^= 1u;
    expect_all(&f, EPF_ERR_STRUCT_VERSION);
    f.step = good;
    f.step.version = 0u;
    expect_all(&f, EPF_ERR_STRUCT_VERSION);
    f.step = good;
    f.step.reserved0 = 1u;
    expect_all(&f, EPF_ERR_INVALID_ARGUMENT);
    f.step = good;
    f.step.size = EPF_HT_STEP_MIN_SIZE + 64u; /* a newer, larger step: its tail is ignored */
    assert_int_equal(epf_ht_check(&f.plan, &f.route, &f.step), EPF_OK);
    f.step = good;
    assert_int_equal(epf_ht_check(&f.plan, &f.route, &f.step), EPF_OK);
    assert_int_equal(f.step.size, (uint32_t)sizeof(epf_ht_step_t));
    assert_int_equal(f.step.magic, EPF_HT_STEP_MAGIC);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid_fixture), cmocka_unit_test(test_team),          cmocka_unit_test(test_expert_rows),
      cmocka_unit_test(test_blocks_per_rank), cmocka_unit_test(test_route_handle), cmocka_unit_test(test_phases),
      cmocka_unit_test(test_step_prefix), cmocka_unit_test(test_expert_out_in_window),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
