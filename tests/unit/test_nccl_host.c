/* test_nccl_host — host_nccl.h without a GPU or a communicator (issue #14 item 8): every function
 * that takes a timeout refuses a NaN, infinite or negative one with EPF_ERR_INVALID_ARGUMENT before
 * any NCCL call (a NaN deadline never expired: `now > NaN` is always false), accepts 0 and large
 * finite ones, and deadlines run on a monotonic clock. The communicators passed here are fake
 * addresses that must never be dereferenced. Built as strict C11 (-std=c11, no GNU extensions),
 * where <time.h> hides clock_gettime: the header's own declaration is what runs. Also the NCCL
 * release rule (issue #30): epf_nccl_version_check over a table of (built against, loaded)
 * releases, its sentences, and epf_nccl_runtime_check against the NCCL linked here. */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
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

/* the NCCL release rule (issue #30): a 2.28 build needs exactly its release; a 2.29+ build needs
 * its release or a newer one; an unreadable version (<= 0) is refused. Pure: no NCCL call. */
typedef struct {
  int build, runtime;
  epf_status_t want;
} version_case_t;

static const version_case_t k_versions[] = {
    /* 2.28: unversioned device structs, the exact release only */
    {22803, 22803, EPF_OK},
    {22809, 22809, EPF_OK},
    {22803, 22809, EPF_ERR_NOT_SUPPORTED}, /* the H200 failure: 2.28.3 headers, PyTorch's 2.28.9 */
    {22809, 22803, EPF_ERR_NOT_SUPPORTED},
    {22809, 22902, EPF_ERR_NOT_SUPPORTED}, /* newer is no better for a 2.28 build */
    {22809, 23007, EPF_ERR_NOT_SUPPORTED},
    {22809, 23102, EPF_ERR_NOT_SUPPORTED},
    /* 2.29+: the release built against or newer */
    {22902, 22902, EPF_OK},
    {22902, 23007, EPF_OK},
    {22902, 23102, EPF_OK},
    {22902, 22809, EPF_ERR_NOT_SUPPORTED},
    {22907, 22902, EPF_ERR_NOT_SUPPORTED}, /* an older patch of the same minor */
    {23007, 23007, EPF_OK},
    {23007, 23102, EPF_OK},
    {23007, 23206, EPF_OK},
    {23007, 22809, EPF_ERR_NOT_SUPPORTED}, /* the finding: built with the 2.30.7 wheel, 2.28.9 loaded */
    {23007, 22803, EPF_ERR_NOT_SUPPORTED},
    {23007, 22907, EPF_ERR_NOT_SUPPORTED},
    {23007, 23003, EPF_ERR_NOT_SUPPORTED},
    {23102, 23102, EPF_OK},
    {23102, 23206, EPF_OK},
    {23102, 23007, EPF_ERR_NOT_SUPPORTED},
    {23102, 22809, EPF_ERR_NOT_SUPPORTED},
    /* the version could not be read */
    {22809, 0, EPF_ERR_NOT_SUPPORTED},
    {23007, -1, EPF_ERR_NOT_SUPPORTED},
};

static void test_version_rule(void** state) {
  char buf[320];
  size_t i;
  (void)state;
  for (i = 0; i < sizeof(k_versions) / sizeof(k_versions[0]); ++i) {
    const version_case_t* c = &k_versions[i];
    epf_status_t st;
    print_message("build %d runtime %d\n", c->build, c->runtime);
    assert_int_equal(epf_nccl_version_check(c->build, c->runtime, NULL, 0), c->want);
    memset(buf, 'x', sizeof(buf));
    st = epf_nccl_version_check(c->build, c->runtime, buf, sizeof(buf));
    assert_int_equal(st, c->want);
    assert_non_null(memchr(buf, '\0', sizeof(buf)));
    assert_true(strlen(buf) < sizeof(buf) - 1); /* 320 bytes suffice: never truncated */
    assert_true(strncmp(buf, "built against NCCL 2.", 21) == 0);
    if (c->want == EPF_OK) assert_non_null(strstr(buf, ": compatible"));
  }
}

static void test_version_sentences(void** state) {
  char buf[320], small[24], want[64];
  (void)state;
  /* the finding of issue #30, word for word where it matters */
  assert_int_equal(epf_nccl_version_check(23007, 22809, buf, sizeof(buf)), EPF_ERR_NOT_SUPPORTED);
  assert_true(strncmp(buf, "built against NCCL 2.30.7, running 2.28.9: ", 43) == 0);
  assert_non_null(strstr(buf, "older than the headers"));
  snprintf(want, sizeof(want), "nvidia-nccl-cu%d>=2.30.7", CUDART_VERSION / 1000); /* the toolkit's CUDA */
  assert_non_null(strstr(buf, want));
  assert_non_null(strstr(buf, "rebuild epfuse against 2.28.9"));
  assert_int_equal(epf_nccl_version_check(22803, 22809, buf, sizeof(buf)), EPF_ERR_NOT_SUPPORTED);
  assert_true(strncmp(buf, "built against NCCL 2.28.3, running 2.28.9: ", 43) == 0);
  assert_non_null(strstr(buf, "exact release"));
  snprintf(want, sizeof(want), "nvidia-nccl-cu%d==2.28.3", CUDART_VERSION / 1000);
  assert_non_null(strstr(buf, want));
  assert_int_equal(epf_nccl_version_check(23007, 23102, buf, sizeof(buf)), EPF_OK);
  assert_string_equal(buf, "built against NCCL 2.30.7, running 2.31.2: compatible");
  assert_int_equal(epf_nccl_version_check(23007, 0, buf, sizeof(buf)), EPF_ERR_NOT_SUPPORTED);
  assert_non_null(strstr(buf, "could not be read"));
  /* truncated, still terminated; n = 0 writes nothing */
  assert_int_equal(epf_nccl_version_check(23007, 22809, small, sizeof(small)), EPF_ERR_NOT_SUPPORTED);
  assert_int_equal(strlen(small), sizeof(small) - 1);
  small[0] = 'q';
  assert_int_equal(epf_nccl_version_check(23007, 22809, small, 0), EPF_ERR_NOT_SUPPORTED);
  assert_int_equal(small[0], 'q');
}

/* this build and the NCCL linked into the test: the build code is the header's, and the run-time
 * check agrees with the rule applied to ncclGetVersion */
static void test_version_this_build(void** state) {
  char buf[320];
  int loaded = 0;
  (void)state;
  assert_int_equal(epf_nccl_build_version(), NCCL_VERSION_CODE);
  assert_int_equal(ncclGetVersion(&loaded), ncclSuccess);
  assert_int_equal(epf_nccl_runtime_check(buf, sizeof(buf)),
                   epf_nccl_version_check(NCCL_VERSION_CODE, loaded, NULL, 0));
  print_message("%s\n", buf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wait_timeouts),   cmocka_unit_test(test_comm_init_timeouts),
      cmocka_unit_test(test_comm_destroy_timeouts), cmocka_unit_test(test_window_timeouts),
      cmocka_unit_test(test_clock),           cmocka_unit_test(test_version_rule),
      cmocka_unit_test(test_version_sentences), cmocka_unit_test(test_version_this_build),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
/* SPDX-License-Identifier: Apache-2.0 */
