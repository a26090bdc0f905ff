/* test_nccl_host — host_nccl.h without a GPU or a communicator (issue #14 item 8): every function
 * that takes a timeout refuses a NaN, infinite or negative one with EPF_ERR_INVALID_ARGUMENT before
 * any NCCL call (a NaN deadline never expired: `now > NaN` is always false), accepts 0 and large
 * finite ones, and deadlines run on a monotonic clock. The communicators passed here are fake
 * addresses that must never be dereferenced. Built as strict C11 (-std=c11, no GNU extensions),
 * where <time.h> hides clock_gettime: the header's own declaration is what runs. */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "epf_cmocka.h"

#include "epfuse/host_nccl.h"

static ncclComm_t fake_comm(void) { return (ncclComm_t)(uintptr_t)0x10; } /* never a real one */

static const double k_bad[] = {NAN, -NAN, INFINITY, -INFINITY, -1.0, -1e-300, -DBL_MAX};
#define N_BAD (sizeof(k_bad) / sizeof(k_bad[0]))

static void test_wait_timeouts(void** state) {
  size_t i;
  (void)state;
  for (i = 0; i < N_BAD; ++i) {
    /* refused first: before the call's own status, before looking at comm */
    assert_int_equal(epf_nccl_wait(NULL, ncclSuccess, k_bad[i]), EPF_ERR_INVALID_ARGUMENT);
    assert_int_equal(epf_nccl_wait(NULL, ncclInProgress, k_bad[i]), EPF_ERR_INVALID_ARGUMENT);
    assert_int_equal(epf_nccl_wait(NULL, ncclInternalError, k_bad[i]), EPF_ERR_INVALID_ARGUMENT);
    assert_int_equal(epf_nccl_wait(fake_comm(), ncclInProgress, k_bad[i]), EPF_ERR_INVALID_ARGUMENT);
  }
  /* usable timeouts: 0 (poll once), -0.0, large finite */
  assert_int_equal(epf_nccl_wait(NULL, ncclSuccess, 0.0), EPF_OK);
  assert_int_equal(epf_nccl_wait(NULL, ncclSuccess, -0.0), EPF_OK);
  assert_int_equal(epf_nccl_wait(NULL, ncclSuccess, DBL_MAX), EPF_OK);
  assert_int_equal(epf_nccl_wait(NULL, ncclSuccess, 1e300), EPF_OK);
  assert_int_equal(epf_nccl_wait(NULL, ncclInternalError, 1.0), EPF_ERR_NCCL);
  assert_int_equal(epf_nccl_wait(fake_comm(), ncclInvalidArgument, 1.0), EPF_ERR_NCCL); /* failed call: no poll */
}

static void test_comm_init_timeouts(void** state) {
  ncclUniqueId id;
  ncclComm_t comm;
  size_t i;
  (void)state;
  memset(&id, 0, sizeof(id));
  for (i = 0; i < N_BAD; ++i) {
    comm = fake_comm();
    assert_int_equal(epf_nccl_comm_init_rank(&comm, 1, id, 0, k_bad[i]), EPF_ERR_INVALID_ARGUMENT);
    assert_null(comm);
    /* the earlier argument checks keep their order */
    assert_int_equal(epf_nccl_comm_init_rank(NULL, 1, id, 0, k_bad[i]), EPF_ERR_INVALID_ARGUMENT);
    assert_int_equal(epf_nccl_comm_init_rank(&comm, 0, id, 0, k_bad[i]), EPF_ERR_RANKS);
    assert_int_equal(epf_nccl_comm_init_rank(&comm, 2, id, 2, k_bad[i]), EPF_ERR_RANK);
  }
}

static void test_comm_destroy_timeouts(void** state) {
  size_t i;
  (void)state;
  for (i = 0; i < N_BAD; ++i) {
    assert_int_equal(epf_nccl_comm_destroy(NULL, k_bad[i]), EPF_ERR_INVALID_ARGUMENT);
    assert_int_equal(epf_nccl_comm_destroy(fake_comm(), k_bad[i]), EPF_ERR_INVALID_ARGUMENT);
  }
  assert_int_equal(epf_nccl_comm_destroy(NULL, 1.0), EPF_OK);
  assert_int_equal(epf_nccl_comm_destroy(NULL, 0.0), EPF_OK);
}

static void test_window_timeouts(void** state) {
  epf_nccl_window_t win;
  size_t i;
  (void)state;
  for (i = 0; i < N_BAD; ++i) {
    memset(&win, 0, sizeof(win));
    assert_int_equal(epf_nccl_window_create(fake_comm(), 4096, k_bad[i], &win), EPF_ERR_INVALID_ARGUMENT);
    assert_null(win.ptr);
    assert_int_equal(epf_nccl_window_destroy(fake_comm(), &win, k_bad[i]), EPF_ERR_INVALID_ARGUMENT);
    /* a registered window is left alone (nothing deregistered or freed) */
    win.ptr = (void*)(uintptr_t)0x20;
    win.window = (ncclWindow_t)(uintptr_t)0x30;
    win.bytes = 4096;
    assert_int_equal(epf_nccl_window_destroy(fake_comm(), &win, k_bad[i]), EPF_ERR_INVALID_ARGUMENT);
    assert_true(win.ptr == (void*)(uintptr_t)0x20 && win.bytes == 4096);
  }
  memset(&win, 0, sizeof(win));
  assert_int_equal(epf_nccl_window_destroy(fake_comm(), &win, 1.0), EPF_OK); /* zeroed struct: nothing to do */
  assert_int_equal(epf_nccl_window_destroy(NULL, NULL, 1.0), EPF_ERR_INVALID_ARGUMENT);
}

/* the deadline clock is the monotonic one, not the wall clock (which a clock step moves): the two
 * differ by about the time since 1970 minus the uptime; it never runs backwards and does advance */
static void test_clock(void** state) {
  double prev = epf__now_s(), first = prev, wall, apart;
  struct timespec ts;
  long i;
  (void)state;
  assert_int_equal(timespec_get(&ts, TIME_UTC), TIME_UTC);
  wall = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
  apart = wall > first ? wall - first : first - wall;
  assert_true(apart > 86400.0); /* not the wall clock */
  for (i = 0; i < 2000000 && prev - first < 0.002; ++i) {
    const double now = epf__now_s();
    assert_true(now >= prev);
    prev = now;
  }
  assert_true(prev > first);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wait_timeouts),   cmocka_unit_test(test_comm_init_timeouts),
      cmocka_unit_test(test_comm_destroy_timeouts), cmocka_unit_test(test_window_timeouts),
      cmocka_unit_test(test_clock),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
/* SPDX-License-Identifier: Apache-2.0 */
