/* test_capi — libepfuse.so as a binding sees it (plain C11, no GPU needed):
 *   - the library's functions, looked up by name (dlsym), agree with the headers;
 *   - epf_abi_sizeof knows every struct a binding mirrors, and the INIT functions fill them;
 *   - a plan from another build is refused (EPF_ERR_BUILD_MISMATCH), by the library and by
 *     extensions built with other limits, and two such extensions loaded into one process each
 *     run their own copy of the inline header functions (no interposition);
 *   - epf_error_describe turns a record into a sentence (truncation like snprintf);
 *   - a CUDA failure keeps its cudaError_t (epf_cuda_last_error) — without a GPU every CUDA call
 *     fails, which is exactly what the test needs; with one, that part is skipped;
 *   - no driver / no GPU is said in those words; the NCCL release rule through the library. */
#define _GNU_SOURCE 1 /* RTLD_DEFAULT */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epf_cmocka.h"

#include "epfuse/capi.h"

/* ---- the library's entry points, by name -------------------------------------------------------- */

static void* sym(const char* name) {
  void* p = dlsym(RTLD_DEFAULT, name);
  if (p == NULL) fail_msg("libepfuse.so does not export %s", name);
  return p;
}

/* a function pointer from dlsym (ISO C has no object-to-function pointer cast; POSIX guarantees
 * the representation) */
typedef void (*any_fn)(void);
static any_fn symf(const char* name) {
  void* p = sym(name);
  any_fn f;
  memcpy(&f, &p, sizeof(f));
  return f;
}

typedef epf_status_t (*plan_compute_fn)(const epf_config_t*, epf_plan_t*);
typedef epf_status_t (*plan_check_fn)(const epf_plan_t*);
typedef const char* (*status_name_fn)(epf_status_t);
typedef size_t (*abi_sizeof_fn)(const char*);
typedef epf_status_t (*route_init_fn)(const epf_plan_t*, const epf_route_config_t*, void*, uint64_t, int, uint32_t,
                                      void*, epf_route_t*);
typedef epf_status_t (*route_size_fn)(const epf_plan_t*, const epf_route_config_t*, uint64_t*);
typedef int (*last_error_fn)(void);
typedef void (*void_fn)(void);

static epf_config_t small_config(int nranks) {
  epf_config_t c = EPF_CONFIG_INIT;
  c.nranks = nranks;
  c.num_experts = 8 * nranks;
  c.top_k = 4;
  c.hidden = 2880;
  c.max_tokens_per_rank = 77;
  return c;
}

static void test_version_and_statuses(void** state) {
  status_name_fn name = (status_name_fn)symf("epf_status_name");
  (void)state;
  assert_int_equal(epf_abi_version(), EPF_VERSION);
  assert_int_equal(((int (*)(void))symf("epf_version"))(), EPF_VERSION);
  assert_string_equal(name(EPF_ERR_BUILD_MISMATCH), "EPF_ERR_BUILD_MISMATCH");
  assert_string_equal(name(EPF_OK), "EPF_OK");
  assert_true(epf_abi_has_nccl() == 0 || epf_abi_has_nccl() == 1);
}

/* ---- struct sizes and INIT functions ------------------------------------------------------------ */

static void test_abi_sizeof(void** state) {
  abi_sizeof_fn sz = (abi_sizeof_fn)symf("epf_abi_sizeof");
  int i, n = epf_abi_type_count();
  (void)state;
  /* the structs this C file can see agree with the library's */
  assert_int_equal(sz("epf_config_t"), sizeof(epf_config_t));
  assert_int_equal(sz("epf_plan_t"), sizeof(epf_plan_t));
  assert_int_equal(sz("epf_region_t"), sizeof(epf_region_t));
  assert_int_equal(sz("epf_window_header_t"), sizeof(epf_window_header_t));
  assert_int_equal(sz("epf_recv_meta_em_t"), sizeof(epf_recv_meta_em_t));
  assert_int_equal(sz("epf_recv_meta_rm_t"), sizeof(epf_recv_meta_rm_t));
  assert_int_equal(sz("epf_error_record_t"), sizeof(epf_error_record_t));
  assert_int_equal(sz("epf_route_config_t"), sizeof(epf_route_config_t));
  assert_int_equal(sz("epf_route_header_t"), sizeof(epf_route_header_t));
  assert_int_equal(sz("epf_route_segment_t"), sizeof(epf_route_segment_t));
  assert_int_equal(sz("epf_route_layout_t"), sizeof(epf_route_layout_t));
  assert_int_equal(sz("epf_route_t"), sizeof(epf_route_t));
  /* the CUDA-side structs are known too (bindings mirror them) */
  assert_true(sz("epf_team_t") >= 24);
  assert_true(sz("epf_wait_t") >= 32);
  assert_true(sz("epf_ht_step_t") > sz("epf_wait_t"));
  assert_true(sz("epf_route_step_t") > sz("epf_wait_t"));
  assert_true(sz("epf_ll_launch_t") > sizeof(epf_plan_t));
  assert_true(sz("epf_ll_dispatch_args_t") > 0 && sz("epf_ll_combine_args_t") > 0);
  assert_true(sz("epf_ll_state_t") > 0 && sz("epf_ht_state_t") > 0);
  /* unknown names */
  assert_int_equal(sz("epf_nothing_t"), 0);
  assert_int_equal(sz(""), 0);
  assert_int_equal(sz(NULL), 0);
  /* the enumeration */
  assert_true(n >= 21);
  for (i = 0; i < n; ++i) {
    const char* t = epf_abi_type_name(i);
    assert_non_null(t);
    assert_true(sz(t) > 0);
  }
  assert_null(epf_abi_type_name(-1));
  assert_null(epf_abi_type_name(n));
  if (epf_abi_has_nccl()) {
    assert_int_equal(sz("ncclUniqueId"), 128);
    assert_true(sz("ncclDevComm_t") > 0);
  }
}

static int all_bytes(const unsigned char* p, size_t n, unsigned char v) {
  size_t i;
  for (i = 0; i < n; ++i)
    if (p[i] != v) return 0;
  return 1;
}

static void test_init_functions(void** state) {
  const epf_config_t want_c = EPF_CONFIG_INIT;
  const epf_route_config_t want_rc = EPF_ROUTE_CONFIG_INIT;
  epf_config_t c;
  epf_route_config_t rc;
  unsigned char buf[1024];
  struct {
    const char* type;
    void (*init)(void*);
  } zero_inits[] = {
      {"epf_wait_t", (void (*)(void*))epf_wait_init},
      {"epf_route_step_t", (void (*)(void*))epf_route_step_init},
      {"epf_ll_dispatch_args_t", (void (*)(void*))epf_ll_dispatch_args_init},
      {"epf_ll_combine_args_t", (void (*)(void*))epf_ll_combine_args_init},
  };
  size_t i;
  (void)state;
  memset(&c, 0xAB, sizeof(c));
  epf_config_init(&c);
  assert_memory_equal(&c, &want_c, sizeof(c));
  memset(&rc, 0xAB, sizeof(rc));
  epf_route_config_init(&rc);
  assert_memory_equal(&rc, &want_rc, sizeof(rc));
  /* structs without a prefix: zero means default; the init writes exactly sizeof bytes */
  for (i = 0; i < sizeof(zero_inits) / sizeof(zero_inits[0]); ++i) {
    const size_t n = epf_abi_sizeof(zero_inits[i].type);
    assert_true(n > 0 && n + 16 <= sizeof(buf));
    memset(buf, 0xAB, sizeof(buf));
    zero_inits[i].init(buf);
    assert_true(all_bytes(buf, n, 0));
    assert_true(all_bytes(buf + n, 16, 0xAB));
  }
  /* the versioned HT step: the caller's size, the prefix set, everything else zero */
  {
    const size_t n = epf_abi_sizeof("epf_ht_step_t");
    uint32_t prefix[4];
    assert_true(n >= 16 && n + 16 <= sizeof(buf));
    memset(buf, 0xAB, sizeof(buf));
    assert_int_equal(epf_ht_step_init_sized((struct epf_ht_step*)buf, n), EPF_OK);
    memcpy(prefix, buf, sizeof(prefix));
    assert_int_equal(prefix[0], n);
    assert_int_equal(prefix[1], epf_abi_constant("EPF_HT_STEP_MAGIC"));
    assert_int_equal(prefix[2], epf_abi_constant("EPF_HT_STEP_VERSION"));
    assert_int_equal(prefix[3], 0);
    assert_true(all_bytes(buf + 12, n - 12, 0));
    assert_true(all_bytes(buf + n, 16, 0xAB));
    assert_int_equal((int64_t)n, epf_abi_constant("EPF_HT_STEP_MIN_SIZE"));
  }
  /* NULL is ignored */
  epf_config_init(NULL);
  epf_route_config_init(NULL);
  assert_int_equal(epf_ht_step_init_sized(NULL, 160), EPF_ERR_INVALID_ARGUMENT);
}

/* ---- plans across builds ---------------------------------------------------------------------------- */

static void test_plan_through_library(void** state) {
  plan_compute_fn compute = (plan_compute_fn)symf("epf_plan_compute");
  plan_check_fn check = (plan_check_fn)symf("epf_plan_check");
  const epf_config_t c = small_config(5);
  epf_plan_t lib, hdr;
  (void)state;
  memset(&lib, 0, sizeof(lib));
  memset(&hdr, 0, sizeof(hdr));
  assert_int_equal(compute(&c, &lib), EPF_OK);
  assert_int_equal(epf_plan_compute(&c, &hdr), EPF_OK); /* this file's copy: same build options */
  assert_memory_equal(&lib, &hdr, sizeof(lib));
  assert_int_equal(lib.build_signature, epf_build_signature());
  assert_int_equal(check(&lib), EPF_OK);
  lib.build_signature ^= 1u; /* a plan from a build with other limits */
  assert_int_equal(check(&lib), EPF_ERR_BUILD_MISMATCH);
  assert_int_equal(epf_plan_check(&lib), EPF_ERR_BUILD_MISMATCH);
  lib.build_signature ^= 1u;
  lib.size = (uint32_t)sizeof(epf_plan_t) - 8u; /* a first-version plan: no build_signature */
  assert_int_equal(check(&lib), EPF_ERR_STRUCT_VERSION);
}

typedef int (*plugin_int_fn)(void);
typedef unsigned long long (*plugin_u64_fn)(void);
typedef unsigned long long (*plugin_offset_fn)(int);
typedef int (*plugin_check_fn)(const epf_plan_t*);

static any_fn plugin_sym(void* h, const char* name) {
  void* p = dlsym(h, name);
  any_fn f;
  if (p == NULL) fail_msg("plugin lacks %s: %s", name, dlerror());
  memcpy(&f, &p, sizeof(f));
  return f;
}

static void test_two_extensions(void** state) {
  /* RTLD_GLOBAL: the worst case, both plugins' symbols in the global scope */
  void* a = dlopen(EPF_TEST_PLUGIN_A, RTLD_NOW | RTLD_GLOBAL);
  void* b = dlopen(EPF_TEST_PLUGIN_B, RTLD_NOW | RTLD_GLOBAL);
  const epf_config_t c = small_config(4);
  epf_plan_t plan;
  (void)state;
  if (a == NULL || b == NULL) fail_msg("dlopen: %s", dlerror());
  assert_int_equal(((plugin_int_fn)plugin_sym(a, "plugin_max_ranks"))(), 8);
  assert_int_equal(((plugin_int_fn)plugin_sym(b, "plugin_max_ranks"))(), 72);
  /* each runs its own epf_plan_compute: the window header depends on EPF_MAX_RANKS */
  assert_int_equal(((plugin_offset_fn)plugin_sym(a, "plugin_first_region_offset"))(4), 256);   /* 8 ranks: 96 B -> 256 */
  assert_int_equal(((plugin_offset_fn)plugin_sym(b, "plugin_first_region_offset"))(4), 1024);  /* 72 ranks: 864 B -> 1024 */
  assert_true(((plugin_u64_fn)plugin_sym(a, "plugin_build_signature"))() !=
              ((plugin_u64_fn)plugin_sym(b, "plugin_build_signature"))());
  /* the library is built with the defaults (72): plugin b accepts its plans, plugin a refuses them */
  assert_int_equal(((plan_compute_fn)symf("epf_plan_compute"))(&c, &plan), EPF_OK);
  assert_int_equal(((plugin_check_fn)plugin_sym(b, "plugin_plan_check"))(&plan), EPF_OK);
  assert_int_equal(((plugin_check_fn)plugin_sym(a, "plugin_plan_check"))(&plan), EPF_ERR_BUILD_MISMATCH);
  dlclose(b);
  dlclose(a);
}

/* ---- diagnostics -------------------------------------------------------------------------------------- */

static void test_error_describe(void** state) {
  epf_error_record_t r;
  char buf[512], small[12];
  size_t n, n2;
  (void)state;
  memset(&r, 0, sizeof(r));
  assert_int_equal(epf_error_describe(&r, buf, sizeof(buf)), strlen("no error"));
  assert_string_equal(buf, "no error");
  assert_int_equal(epf_error_describe(NULL, buf, sizeof(buf)), strlen("no error record"));
  r.status = EPF_ERR_TIMEOUT;
  r.count = 3;
  r.valid = 1;
  r.waiter_rank = 3;
  r.waiter_block = 17;
  r.waiter_thread = 0;
  r.peer = 5;
  r.address = 0x7f0012345600ull;
  r.wanted = 7;
  r.seen = 6;
  r.elapsed_ns = 10000000000ull;
  r.recv_overflow = 42;
  n = epf_error_describe(&r, buf, sizeof(buf));
  assert_int_equal(n, strlen(buf));
  assert_non_null(strstr(buf, "EPF_ERR_TIMEOUT"));
  assert_non_null(strstr(buf, "rank 3 (block 17, thread 0)"));
  assert_non_null(strstr(buf, "waiting for rank 5 at address 0x7f0012345600"));
  assert_non_null(strstr(buf, "wanted epoch 7, saw 6, after 10000.000 ms"));
  assert_non_null(strstr(buf, "3 errors in all"));
  assert_non_null(strstr(buf, "42 received rows past the capacity dropped"));
  assert_null(strstr(buf, "masked"));
  /* truncation: like snprintf */
  memset(small, 'x', sizeof(small));
  n2 = epf_error_describe(&r, small, sizeof(small));
  assert_int_equal(n2, n);
  assert_int_equal(small[sizeof(small) - 1], '\0');
  assert_memory_equal(small, buf, sizeof(small) - 1);
  assert_int_equal(epf_error_describe(&r, NULL, 0), n);
  /* counters without an error status */
  memset(&r, 0, sizeof(r));
  r.dropped_routes = 2;
  epf_error_describe(&r, buf, sizeof(buf));
  assert_string_equal(buf, "no error; 2 expert ids outside [-1, E) dropped");
}

/* ---- a CUDA failure keeps its cudaError_t --------------------------------------------------------------- */

static void test_cuda_error_kept(void** state) {
  int count = -1;
  void* p = NULL;
  const epf_config_t c = small_config(2);
  epf_plan_t plan;
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  epf_route_t route;
  uint64_t bytes = 0;
  epf_status_t st;
  (void)state;
  assert_int_equal(epf_cuda_device_count(&count), EPF_OK);
  if (count > 0) skip(); /* with a GPU these calls succeed; the GPU suite covers them */
  ((void_fn)symf("epf_cuda_last_error_clear"))();
  assert_int_equal(((last_error_fn)symf("epf_cuda_last_error"))(), 0);
  assert_int_equal(epf_cuda_malloc(&p, 1024), EPF_ERR_CUDA);
  assert_null(p);
  assert_int_not_equal(((last_error_fn)symf("epf_cuda_last_error"))(), 0);
  assert_true(strlen(epf_cuda_error_string(((last_error_fn)symf("epf_cuda_last_error"))())) > 0);
  /* a launcher: every argument valid, the CUDA call fails and says why */
  ((void_fn)symf("epf_cuda_last_error_clear"))();
  assert_int_equal(((plan_compute_fn)symf("epf_plan_compute"))(&c, &plan), EPF_OK);
  rc.index_type = EPF_INDEX_INT32;
  assert_int_equal(((route_size_fn)symf("epf_route_size"))(&plan, &rc, &bytes), EPF_OK);
  st = ((route_init_fn)symf("epf_route_init"))(&plan, &rc, (void*)(uintptr_t)0x10000000ull, bytes * 2, 2, 1u, NULL,
                                              &route);
  assert_int_equal(st, EPF_ERR_CUDA);
  printf("without a GPU, epf_route_init: %s; cuda error %d: %s\n", epf_status_name(st),
         ((last_error_fn)symf("epf_cuda_last_error"))(),
         epf_cuda_error_string(((last_error_fn)symf("epf_cuda_last_error"))()));
  assert_int_not_equal(((last_error_fn)symf("epf_cuda_last_error"))(), 0);
  /* bad arguments are refused before any CUDA call */
  assert_int_equal(epf_cuda_malloc(NULL, 16), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_cuda_host_alloc_mapped(&p, NULL, 16), EPF_ERR_INVALID_ARGUMENT);
}

/* no driver / no GPU in words (issue #30): cudaErrorNoDevice (100) always, and
 * cudaErrorInsufficientDriver (35) where no libcuda.so.1 loads, read "no CUDA driver / no GPU
 * found"; with a libcuda.so.1 that loads, 35 names a driver too old */
static void test_no_gpu_words(void** state) {
  void* cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  int count = -1;
  (void)state;
  assert_string_equal(epf_cuda_error_string(100), "no CUDA driver / no GPU found (cudaErrorNoDevice)");
  if (cuda == NULL) {
    assert_string_equal(epf_cuda_error_string(35), "no CUDA driver / no GPU found (cudaErrorInsufficientDriver)");
    assert_int_equal(epf_cuda_device_count(&count), EPF_OK); /* no driver: zero devices, not an error */
    assert_int_equal(count, 0);
  } else {
    assert_non_null(strstr(epf_cuda_error_string(35), "the CUDA driver is too old"));
    dlclose(cuda);
  }
  assert_true(strlen(epf_cuda_error_string(2)) > 0); /* others: cudaGetErrorString */
}

/* the NCCL release rule through the library (a build with NCCL): the build's release, and the
 * check agreeing with the rule for the release loaded */
typedef int (*int_fn)(void);
typedef epf_status_t (*version_check_fn)(int, int, char*, size_t);
typedef epf_status_t (*runtime_check_fn)(char*, size_t);
static void test_nccl_release_rule(void** state) {
  char buf[320];
  int built, loaded;
  (void)state;
  if (!epf_abi_has_nccl()) skip();
  built = ((int_fn)symf("epf_nccl_build_version"))();
  loaded = ((int_fn)symf("epf_nccl_version"))();
  assert_true(built >= 22800);
  assert_int_equal(((version_check_fn)symf("epf_nccl_version_check"))(23007, 22809, buf, sizeof(buf)),
                   EPF_ERR_NOT_SUPPORTED);
  assert_true(strncmp(buf, "built against NCCL 2.30.7, running 2.28.9: ", 43) == 0);
  assert_int_equal(((runtime_check_fn)symf("epf_nccl_runtime_check"))(buf, sizeof(buf)),
                   ((version_check_fn)symf("epf_nccl_version_check"))(built, loaded, NULL, 0));
  printf("epf_nccl_runtime_check: %s\n", buf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_version_and_statuses), cmocka_unit_test(test_abi_sizeof),
      cmocka_unit_test(test_init_functions),       cmocka_unit_test(test_plan_through_library),
      cmocka_unit_test(test_two_extensions),       cmocka_unit_test(test_error_describe),
      cmocka_unit_test(test_cuda_error_kept),      cmocka_unit_test(test_no_gpu_words),
      cmocka_unit_test(test_nccl_release_rule),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
