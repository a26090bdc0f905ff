/* test_ht_guards — regression tests of issue #14 §3 that need a GPU: what the ready-made HT kernels
 * do with input that breaks their contract. Each case must end with a clear record in the error
 * record and no out-of-bounds access (run it under compute-sanitizer memcheck too):
 *   - item 3: an arrival counter left behind by a round that failed part-way (a grid that never
 *     completed) must not make later rounds signal early or never (epoch-tagged arrivals);
 *   - item 4: topk_idx changed after the route update (other experts, ids >= E, huge int64 values)
 *     -> the copies that no longer match the route are skipped, EPF_ERR_ROUTE_STALE is reported;
 *   - item 9: received metadata out of range (source, token, entry count, expert, slot) -> the row
 *     is skipped, EPF_ERR_BAD_METADATA is reported, no peer address is formed from it;
 *   - item 10: a step whose wait has timeout 0 waits for the plan's timeout, not forever (a
 *     receive-only dispatch whose peers never send must time out, recorded).
 * Shapes: 4 virtual ranks, 16 experts, top-4, hidden 264 (not a multiple of 256), 61 tokens. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "epf_cmocka.h"
#include "epf_test_gpu.h"
#include "epfuse/epfuse.cuh"
#include "epfuse/ht/kernels.cuh"

static uint64_t g_seed;

enum { R = 4, E = 16, K = 4, H = 264, T = 61, BPR = 3 };

typedef struct {
  epf_plan_t plan;
  char* window;
  void* route_buf;
  epf_route_t route;
  epf_team_t team;
  int64_t* d_topk; /* [R][T][K] int64 */
  uint16_t* d_x;   /* [R][T][H] */
  float* d_w;      /* [R][T][K] */
  uint16_t* d_out; /* [R][T][H] */
  uint16_t* d_y;   /* [R][expert_rows][H] expert outputs / view rows */
  uint8_t* d_view;
  epf_ht_state_t* d_state;
  epf_error_record_t* rec_h;
  epf_error_record_t* rec_d;
  int64_t expert_rows;
  int64_t topk[R * T * K];
  uint16_t x[R * T * H];
  float w[R * T * K];
} fix_t;

static uint16_t bf16_rne(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float bf16_f(uint16_t b) {
  const uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void fix_init(fix_t* f, int layout, int push, uint64_t timeout_ns) {
  epf_config_t c = EPF_CONFIG_INIT;
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  uint64_t rbytes = 0;
  memset(f, 0, sizeof(*f));
  c.nranks = R;
  c.num_experts = E;
  c.top_k = K;
  c.hidden = H;
  c.max_tokens_per_rank = T;
  c.layout = layout;
  c.flags = push ? EPF_FLAG_COMBINE_PUSH : 0u;
  c.timeout_ns = timeout_ns;
  assert_int_equal(epf_plan_compute(&c, &f->plan), EPF_OK);
  EPF_TEST_MALLOC(&f->window, (size_t)R * f->plan.total_bytes);
  EPF_CHECK_CUDA(cudaMemset(f->window, 0, (size_t)R * f->plan.total_bytes));
  f->team = epf_team_virtual(f->window, f->plan.total_bytes, 0, R);
  rc.index_type = EPF_INDEX_INT64;
  assert_int_equal(epf_route_size(&f->plan, &rc, &rbytes), EPF_OK);
  EPF_TEST_MALLOC(&f->route_buf, (size_t)rbytes * R);
  assert_int_equal(epf_route_init(&f->plan, &rc, f->route_buf, rbytes * R, R, 1u + (uint32_t)(epf_test_rand(&g_seed) % 1000u), 0,
                                  &f->route),
                   EPF_OK);
  f->expert_rows = f->plan.recv_capacity * K + (int64_t)(E / R);
  EPF_TEST_MALLOC(&f->d_topk, sizeof(f->topk));
  EPF_TEST_MALLOC(&f->d_x, sizeof(f->x));
  EPF_TEST_MALLOC(&f->d_w, sizeof(f->w));
  EPF_TEST_MALLOC(&f->d_out, sizeof(f->x));
  EPF_TEST_MALLOC(&f->d_y, (size_t)R * f->expert_rows * H * 2);
  EPF_CHECK_CUDA(cudaMemset(f->d_y, 0, (size_t)R * f->expert_rows * H * 2));
  EPF_TEST_MALLOC(&f->d_view, (size_t)R * f->expert_rows * f->plan.row_bytes);
  EPF_TEST_MALLOC(&f->d_state, R * sizeof(epf_ht_state_t));
  EPF_CHECK_CUDA(cudaMemset(f->d_state, 0, R * sizeof(epf_ht_state_t)));
  EPF_TEST_HOST_ALLOC(&f->rec_h, sizeof(epf_error_record_t), cudaHostAllocMapped);
  EPF_CHECK_CUDA(cudaHostGetDevicePointer(&f->rec_d, f->rec_h, 0));
  epf_error_clear(f->rec_h);
}

static void fix_free(fix_t* f) {
  EPF_CHECK_CUDA(cudaDeviceSynchronize());
  EPF_TEST_FREE(f->window);
  EPF_TEST_FREE(f->route_buf);
  EPF_TEST_FREE(f->d_topk);
  EPF_TEST_FREE(f->d_x);
  EPF_TEST_FREE(f->d_w);
  EPF_TEST_FREE(f->d_out);
  EPF_TEST_FREE(f->d_y);
  EPF_TEST_FREE(f->d_view);
  EPF_TEST_FREE(f->d_state);
  EPF_TEST_FREE(f->rec_h);
}

/* fresh inputs: distinct experts per token, x BF16, weights; uploaded, output poisoned */
static void fix_inputs(fix_t* f) {
  for (int i = 0; i < R * T; ++i) {
    for (int k = 0; k < K; ++k) {
      int64_t e;
      int dup;
      do {
        e = (int64_t)(epf_test_rand(&g_seed) % E);
        dup = 0;
        for (int j = 0; j < k; ++j) dup |= f->topk[i * K + j] == e;
      } while (dup);
      f->topk[i * K + k] = e;
      f->w[i * K + k] = (float)(epf_test_rand(&g_seed) % 1000) / 997.0f;
    }
    for (int h = 0; h < H; ++h) f->x[i * H + h] = bf16_rne((float)((int)(epf_test_rand(&g_seed) % 2001) - 1000) / 64.0f);
  }
  EPF_CHECK_CUDA(cudaMemcpy(f->d_topk, f->topk, sizeof(f->topk), cudaMemcpyHostToDevice));
  EPF_CHECK_CUDA(cudaMemcpy(f->d_x, f->x, sizeof(f->x), cudaMemcpyHostToDevice));
  EPF_CHECK_CUDA(cudaMemcpy(f->d_w, f->w, sizeof(f->w), cudaMemcpyHostToDevice));
  EPF_CHECK_CUDA(cudaMemset(f->d_out, 0xA7, sizeof(f->x)));
}

static epf_ht_step_t fix_step(fix_t* f, uint64_t timeout_ns) {
  epf_ht_step_t s = EPF_HT_STEP_INIT;
  s.x = f->d_x;
  s.topk_weights = f->d_w;
  s.out = f->d_out;
  s.expert_out = f->plan.layout == EPF_LAYOUT_RANK_MAJOR || (f->plan.flags & EPF_FLAG_COMBINE_PUSH) ? f->d_y : NULL;
  s.em_view = f->d_view;
  s.state = f->d_state;
  s.expert_rows = f->expert_rows;
  s.blocks_per_rank = BPR;
  s.wait = epf_wait_make(timeout_ns, f->rec_d, NULL, 0);
  return s;
}

/* wait for the device with a host-side deadline: a hang fails the test instead of blocking it */
static void sync_or_fail(double seconds, const char* what) {
  struct timespec ts0, ts;
  timespec_get(&ts0, TIME_UTC);
  for (;;) {
    const cudaError_t e = cudaStreamQuery(0);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) fail_msg("%s: %s", what, cudaGetErrorString(e));
    timespec_get(&ts, TIME_UTC);
    if ((double)(ts.tv_sec - ts0.tv_sec) + 1e-9 * (double)(ts.tv_nsec - ts0.tv_nsec) > seconds) {
      fprintf(stderr, "%s: the device did not finish within %.0f s (a wait without a deadline?)\n", what, seconds);
      exit(1); /* the kernel still runs: no clean teardown possible */
    }
  }
}

/* one round: route update, dispatch, the identity expert in place (EM pull), combine */
static void fix_round(fix_t* f, const epf_ht_step_t* s) {
  epf_route_step_t rs = epf_route_step_make(f->d_topk, T, epf_wait_make(f->plan.timeout_ns, f->rec_d, NULL, 0));
  assert_int_equal(epf_route_update(&f->route, f->team, &f->plan, &rs, 0), EPF_OK);
  assert_int_equal(epf_ht_dispatch(&f->route, f->team, &f->plan, s, f->d_topk, EPF_HT_BOTH, 0), EPF_OK);
  assert_int_equal(epf_ht_combine(&f->route, f->team, &f->plan, s, f->d_topk, 0), EPF_OK);
  sync_or_fail(30.0, "round");
}

/* EM pull in place, identity experts: out = bf16(sum_k w_k x) in k order */
static void check_identity_combine(fix_t* f) {
  static uint16_t out[R * T * H];
  EPF_CHECK_CUDA(cudaMemcpy(out, f->d_out, sizeof(out), cudaMemcpyDeviceToHost));
  for (int i = 0; i < R * T; ++i)
    for (int h = 0; h < H; ++h) {
      float acc = 0.f;
      for (int k = 0; k < K; ++k) acc = fmaf(f->w[i * K + k], bf16_f(f->x[i * H + h]), acc);
      if (out[i * H + h] != bf16_rne(acc))
        fail_msg("combine: rank %d token %d h %d: got %04x want %04x", i / T, i % T, h, out[i * H + h], bf16_rne(acc));
    }
}

/* item 3: a counter left by a failed round (every rank's dispatch and combine counters one short
 * of a full round, as a grid that lost a block leaves them) */
static void test_failed_round_state(void** state) {
  fix_t f;
  epf_ht_state_t st[R];
  (void)state;
  fix_init(&f, EPF_LAYOUT_EXPERT_MAJOR, 0, 2000000000ull);
  for (int r = 0; r < R; ++r) {
    memset(&st[r], 0, sizeof(st[r]));
    st[r].arrive[0] = BPR - 1; /* tag 0: a round of an epoch whose low 16 bits were 0 */
    st[r].arrive[1] = BPR - 1;
  }
  EPF_CHECK_CUDA(cudaMemcpy(f.d_state, st, sizeof(st), cudaMemcpyHostToDevice));
  for (int round = 0; round < 3; ++round) {
    epf_error_record_t rec;
    const epf_ht_step_t s = fix_step(&f, 0);
    fix_inputs(&f);
    fix_round(&f, &s);
    epf_error_read(f.rec_h, &rec);
    if (rec.status != 0)
      fail_msg("round %d after a failed round: %s (peer %d)", round, epf_status_name((epf_status_t)rec.status), rec.peer);
    check_identity_combine(&f);
  }
  printf("failed-round counters: 3 later rounds complete and exact\n");
  fix_free(&f);
}

/* item 4: ids rewritten between the route update and dispatch / combine */
static void test_stale_ids(void** state) {
  fix_t f;
  epf_error_record_t rec;
  static const int64_t bad[] = {E, E + 5, (int64_t)1 << 40, -((int64_t)1 << 40), INT64_MAX, INT64_MIN, -7};
  (void)state;
  fix_init(&f, EPF_LAYOUT_EXPERT_MAJOR, 0, 2000000000ull);
  fix_inputs(&f);
  {
    const epf_ht_step_t s = fix_step(&f, 0);
    epf_route_step_t rs = epf_route_step_make(f.d_topk, T, epf_wait_make(f.plan.timeout_ns, f.rec_d, NULL, 0));
    assert_int_equal(epf_route_update(&f.route, f.team, &f.plan, &rs, 0), EPF_OK);
    /* now the ids change under the route: out of range, huge, or another expert */
    for (int i = 0; i < R * T * K; ++i) {
      const uint64_t r = epf_test_rand(&g_seed) % 4;
      if (r == 0) f.topk[i] = bad[epf_test_rand(&g_seed) % (sizeof(bad) / sizeof(bad[0]))];
      else if (r == 1) f.topk[i] = (f.topk[i] + 1 + (int64_t)(epf_test_rand(&g_seed) % (E - 1))) % E;
    }
    EPF_CHECK_CUDA(cudaMemcpy(f.d_topk, f.topk, sizeof(f.topk), cudaMemcpyHostToDevice));
    assert_int_equal(epf_ht_dispatch(&f.route, f.team, &f.plan, &s, f.d_topk, EPF_HT_BOTH, 0), EPF_OK);
    assert_int_equal(epf_ht_combine(&f.route, f.team, &f.plan, &s, f.d_topk, 0), EPF_OK);
    sync_or_fail(30.0, "stale ids");
  }
  epf_error_read(f.rec_h, &rec);
  if (rec.status != EPF_ERR_ROUTE_STALE)
    fail_msg("stale ids: record %s, want EPF_ERR_ROUTE_STALE", epf_status_name((epf_status_t)rec.status));
  printf("stale ids: %u reports, first by rank %d\n", rec.count, rec.waiter_rank);
  fix_free(&f);
}

/* item 9: received metadata overwritten between dispatch and combine */
static void test_bad_metadata(void** state) {
  for (int layout = EPF_LAYOUT_EXPERT_MAJOR; layout <= EPF_LAYOUT_RANK_MAJOR; ++layout) {
    fix_t f;
    epf_error_record_t rec;
    (void)state;
    fix_init(&f, layout, 1, 2000000000ull);
    fix_inputs(&f);
    {
      const epf_ht_step_t s = fix_step(&f, 0);
      epf_route_step_t rs = epf_route_step_make(f.d_topk, T, epf_wait_make(f.plan.timeout_ns, f.rec_d, NULL, 0));
      assert_int_equal(epf_route_update(&f.route, f.team, &f.plan, &rs, 0), EPF_OK);
      assert_int_equal(epf_ht_dispatch(&f.route, f.team, &f.plan, &s, f.d_topk, EPF_HT_BOTH, 0), EPF_OK);
      if (layout == EPF_LAYOUT_RANK_MAJOR) assert_int_equal(epf_ht_expand(&f.route, f.team, &f.plan, &s, 0), EPF_OK);
      EPF_CHECK_CUDA(cudaDeviceSynchronize());
      epf_error_clear(f.rec_h);
      /* every rank's metadata rows: huge token, source and entry count (0x7f7f7f7f) */
      for (int r = 0; r < R; ++r)
        EPF_CHECK_CUDA(cudaMemset(f.window + (uint64_t)r * f.plan.total_bytes + f.plan.region[EPF_REGION_RECV_META].offset, 0x7f,
                                  (size_t)f.plan.region[EPF_REGION_RECV_META].bytes));
      assert_int_equal(epf_ht_combine(&f.route, f.team, &f.plan, &s, f.d_topk, 0), EPF_OK);
      sync_or_fail(30.0, "bad metadata");
    }
    epf_error_read(f.rec_h, &rec);
    if (rec.status != EPF_ERR_BAD_METADATA)
      fail_msg("bad metadata (%s push): record %s, want EPF_ERR_BAD_METADATA",
               layout == EPF_LAYOUT_RANK_MAJOR ? "rank-major" : "expert-major", epf_status_name((epf_status_t)rec.status));
    printf("bad metadata (%s push): %u reports\n", layout == EPF_LAYOUT_RANK_MAJOR ? "rank-major" : "expert-major", rec.count);
    fix_free(&f);
  }
}

/* item 10: timeout 0 in the step's wait = the plan's timeout (200 ms here), not forever */
static void test_zero_timeout(void** state) {
  fix_t f;
  epf_error_record_t rec;
  (void)state;
  fix_init(&f, EPF_LAYOUT_EXPERT_MAJOR, 0, 200000000ull);
  fix_inputs(&f);
  {
    const epf_ht_step_t s = fix_step(&f, 0); /* wait.timeout_ns == 0 */
    epf_route_step_t rs = epf_route_step_make(f.d_topk, T, epf_wait_make(0, f.rec_d, NULL, 0));
    assert_int_equal(epf_route_update(&f.route, f.team, &f.plan, &rs, 0), EPF_OK);
    /* the receive half alone: no rank sends this epoch, so every wait must expire */
    assert_int_equal(epf_ht_dispatch(&f.route, f.team, &f.plan, &s, f.d_topk, EPF_HT_RECV, 0), EPF_OK);
    sync_or_fail(20.0, "zero timeout");
  }
  epf_error_read(f.rec_h, &rec);
  if (rec.status != EPF_ERR_TIMEOUT) fail_msg("zero timeout: record %s, want EPF_ERR_TIMEOUT", epf_status_name((epf_status_t)rec.status));
  if (rec.elapsed_ns < 150000000ull || rec.elapsed_ns > 5000000000ull)
    fail_msg("zero timeout: waited %llu ns, want about the plan's 200 ms", (unsigned long long)rec.elapsed_ns);
  printf("zero timeout: expired after %.1f ms (plan 200 ms)\n", 1e-6 * (double)rec.elapsed_ns);
  fix_free(&f);
}

/* ---- the backward's barrier (docs/high-throughput.md "Signals and epochs of the backward") ------ */

/* the whole window, states and route set up afresh: the recovery a team that fell out of step has
 * (route.md: every rank starts from the same epoch on a zeroed window) */
static void fix_reset(fix_t* f) {
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  uint64_t rbytes = 0;
  EPF_CHECK_CUDA(cudaDeviceSynchronize());
  EPF_CHECK_CUDA(cudaMemset(f->window, 0, (size_t)R * f->plan.total_bytes));
  EPF_CHECK_CUDA(cudaMemset(f->d_state, 0, R * sizeof(epf_ht_state_t)));
  rc.index_type = EPF_INDEX_INT64;
  assert_int_equal(epf_route_size(&f->plan, &rc, &rbytes), EPF_OK);
  assert_int_equal(epf_route_init(&f->plan, &rc, f->route_buf, rbytes * R, R, 1u + (uint32_t)(epf_test_rand(&g_seed) % 1000u),
                                  0, &f->route),
                   EPF_OK);
  EPF_CHECK_CUDA(cudaDeviceSynchronize());
  epf_error_clear(f->rec_h);
}

static void read_epochs(const fix_t* f, uint32_t* e) {
  for (int r = 0; r < R; ++r)
    EPF_CHECK_CUDA(cudaMemcpy(&e[r], epf_route_epoch_ptr(&f->route, r), 4, cudaMemcpyDeviceToHost));
}

static double wall_s(void) {
  struct timespec ts;
  timespec_get(&ts, TIME_UTC);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* identity experts in place, dy = x: the backward of dispatch gives dx[t] = BF16(fma(1, dy, ...
 * fma(1, dy, 0))) over the K distinct experts of the token */
static void check_identity_backward(fix_t* f) {
  static uint16_t out[R * T * H];
  EPF_CHECK_CUDA(cudaMemcpy(out, f->d_out, sizeof(out), cudaMemcpyDeviceToHost));
  for (int i = 0; i < R * T; ++i)
    for (int h = 0; h < H; ++h) {
      float acc = 0.f;
      for (int k = 0; k < K; ++k) acc = fmaf(1.0f, bf16_f(f->x[i * H + h]), acc);
      if (out[i * H + h] != bf16_rne(acc))
        fail_msg("backward: rank %d token %d h %d: got %04x want %04x", i / T, i % T, h, out[i * H + h], bf16_rne(acc));
    }
}

/* a whole step on every rank through the launchers: route update, dispatch, combine (checked), then
 * the backward of combine (dy = x) and of dispatch (identity experts in place, checked); no error */
static void full_step(fix_t* f, const char* what) {
  epf_ht_step_t s = fix_step(f, 0);
  epf_error_record_t rec;
  s.topk_idx = f->d_topk;
  fix_inputs(f);
  fix_round(f, &s);
  check_identity_combine(f);
  EPF_CHECK_CUDA(cudaMemset(f->d_out, 0xA7, sizeof(f->x)));
  assert_int_equal(epf_ht_combine_backward(&f->route, f->team, &f->plan, &s, EPF_HT_BOTH, 0), EPF_OK);
  assert_int_equal(epf_ht_dispatch_backward(&f->route, f->team, &f->plan, &s, 0), EPF_OK);
  sync_or_fail(30.0, what);
  check_identity_backward(f);
  epf_error_read(f->rec_h, &rec);
  if (rec.count != 0)
    fail_msg("%s: %u errors recorded (%s, peer %d)", what, rec.count, epf_status_name((epf_status_t)rec.status), rec.peer);
}

/* The backward of combine starts with a team barrier over SIG_COMBINE(e + 1). Ranks 0 .. R-2 launch
 * it (the ready-made kernel on a grid of R-1 ranks), rank R-1 does not: the barrier's wait on rank
 * R-1 must end with the documented outcome and no hang — timeout: EPF_ERR_TIMEOUT recorded in
 * full (peer R-1, epoch e + 1, elapsed >= the plan's timeout); abort (the step's abort word set
 * before the launch): the waits end at once with EPF_ERR_ABORTED ("a barrier that times out or is
 * aborted sends nothing (recorded in the error record)"). The round still stores e + 1 into the
 * launching ranks' epoch words. Then the team is set up afresh and whole forward + backward steps
 * are exact again. */
static void backward_barrier_case(int abort_it) {
  const uint64_t timeout_ns = abort_it ? 2000000000ull : 100000000ull; /* abort: far beyond the check */
  fix_t f;
  epf_error_record_t rec;
  uint32_t e0[R], e1[R];
  uint32_t *abort_h = NULL, *abort_d = NULL;
  const char* what = abort_it ? "backward barrier abort" : "backward barrier timeout";
  double dt;
  fix_init(&f, EPF_LAYOUT_EXPERT_MAJOR, 0, timeout_ns);
  full_step(&f, "backward barrier: step before the fault");
  read_epochs(&f, e0);
  for (int r = 1; r < R; ++r) assert_int_equal(e0[r], e0[0]);
  epf_error_clear(f.rec_h);
  {
    epf_ht_step_t s = fix_step(&f, 0);
    epf__ht_kargs_t ks;
    s.topk_idx = f.d_topk;
    if (abort_it) {
      EPF_TEST_HOST_ALLOC(&abort_h, 4, cudaHostAllocMapped);
      EPF_CHECK_CUDA(cudaHostGetDevicePointer(&abort_d, abort_h, 0));
      *abort_h = 1u;
      s.wait.abort_word = abort_d;
    }
    fix_inputs(&f);
    ks = epf__ht_step_for_launch(&s, &f.plan);
    assert_int_equal(epf_virtual_grid_check((const void*)epf_ht_combine_backward_kernel, EPF_HT_THREADS, 0, (R - 1) * BPR, 0),
                     EPF_OK);
    EPF_CHECK_CUDA(cudaDeviceSynchronize());
    dt = wall_s();
    epf_ht_combine_backward_kernel<<<(R - 1) * BPR, EPF_HT_THREADS>>>(f.route, f.team, f.plan, ks, f.d_topk, 1, BPR,
                                                                      EPF_HT_BOTH);
    EPF_CHECK_CUDA(cudaGetLastError());
    sync_or_fail(30.0, what);
    dt = wall_s() - dt;
  }
  printf("%s: ranks 0..%d returned after %.1f ms (timeout %.0f ms)\n", what, R - 2, dt * 1e3, timeout_ns * 1e-6);
  read_epochs(&f, e1);
  for (int r = 0; r < R - 1; ++r)
    if (e1[r] != e0[r] + 1u) fail_msg("%s: rank %d epoch word %u, want %u", what, r, e1[r], e0[r] + 1u);
  assert_int_equal(e1[R - 1], e0[R - 1]); /* the absent rank launched nothing */
  epf_error_read(f.rec_h, &rec);
  if (abort_it) {
    assert_true(dt < 1.0); /* far below the 2 s timeout: the waits were aborted, not timed out */
    /* documented: an aborted barrier is recorded in the error record */
    if (rec.valid != 1 || rec.status != EPF_ERR_ABORTED)
      fail_msg("%s: record valid %u status %s, want EPF_ERR_ABORTED (docs/high-throughput.md: an aborted barrier is "
               "recorded)",
               what, rec.valid, epf_status_name((epf_status_t)rec.status));
    assert_true(rec.count >= 1);
    *abort_h = 0u;
  } else {
    assert_true(dt < 3.0);
    assert_int_equal(rec.valid, 1);
    assert_int_equal(rec.status, EPF_ERR_TIMEOUT);
    assert_int_equal(rec.peer, R - 1);
    assert_true(rec.waiter_rank >= 0 && rec.waiter_rank < R - 1);
    assert_int_equal(rec.wanted, (uint64_t)(e0[0] + 1u));
    assert_true(rec.elapsed_ns >= timeout_ns);
    assert_int_equal(rec.masked_ranks, 0); /* no mask in the step's wait */
    assert_true(rec.count >= 1);
  }
  /* recovery: the team set up afresh; two whole steps exact, nothing recorded */
  fix_reset(&f);
  full_step(&f, "backward barrier: step 1 after the reset");
  full_step(&f, "backward barrier: step 2 after the reset");
  printf("%s: recorded as documented, team reset, 2 forward + backward steps exact\n", what);
  if (abort_h != NULL) EPF_TEST_FREE(abort_h);
  fix_free(&f);
}

static void test_backward_barrier_timeout(void** state) {
  (void)state;
  backward_barrier_case(0);
}

static void test_backward_barrier_abort(void** state) {
  (void)state;
  backward_barrier_case(1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_failed_round_state, epf_test_teardown),
      cmocka_unit_test_teardown(test_stale_ids, epf_test_teardown),
      cmocka_unit_test_teardown(test_bad_metadata, epf_test_teardown),
      cmocka_unit_test_teardown(test_zero_timeout, epf_test_teardown),
      cmocka_unit_test_teardown(test_backward_barrier_timeout, epf_test_teardown),
      cmocka_unit_test_teardown(test_backward_barrier_abort, epf_test_teardown),
  };
  int rc = epf_test_gpus_or_skip(1);
  if (rc) return rc;
  g_seed = epf_test_seed();
  if (getenv("EPF_TEST_FILTER") != NULL) cmocka_set_test_filter(getenv("EPF_TEST_FILTER")); /* e.g. "test_backward_*" */
  return cmocka_run_group_tests(tests, NULL, NULL);
}
