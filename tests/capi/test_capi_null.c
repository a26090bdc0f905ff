/* test_capi_null — every export of libepfuse.so, called with NULL and with out-of-range ids
 * (region ids, route array ids, LL buffer ids, index types, negative counts and indices), as a
 * binding (ctypes passing None, a Rust FFI passing a null pointer) would. Plain C11, no GPU.
 *
 * The convention (docs/bindings.md, "Bad arguments"): a function that returns epf_status_t
 * returns EPF_ERR_INVALID_ARGUMENT (or its more specific status) before touching anything; a
 * value-returning accessor returns its documented sentinel — EPF_OFFSET_INVALID (UINT64_MAX) for
 * byte offsets, EPF_ROW_INVALID (-1) for rows, word indices and row counts, 0 for sizes and
 * counts, 0 for a hash, NULL for pointers, a fixed non-NULL string for names, false for
 * predicates, an all-zero struct for a struct returned by value; a void function does nothing.
 *
 * One cmocka test per export (a crash is caught by cmocka's signal handler and fails that export
 * only), every function called through dlsym: the library's own code, not this file's copy of the
 * static inline header functions. test_every_export_has_a_case compares the table below with the
 * exports file the build writes (EPF_CAPI_EXPORTS_FILE, from src/capi_api.def): a new export
 * without a case here fails it.
 *
 * Group "test_null_ll_launchers" (run with the argument --ll-launchers; ctest
 * test_capi_null_ll_launchers): the launchers of ll/kernels.cuh, kept apart because that header
 * is changed elsewhere; its cases say what the launchers must do with NULL.
 *
 * The NCCL functions are called only when epf_abi_has_nccl() (skipped otherwise). */
#define _GNU_SOURCE 1 /* RTLD_DEFAULT */
#include <dlfcn.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epf_cmocka.h"

#include "epfuse/capi.h"

#ifndef EPF_CAPI_EXPORTS_FILE
#error "EPF_CAPI_EXPORTS_FILE (build/src/capi_exports.txt) must be defined"
#endif

/* the sentinels (status.h); spelled out here too so the expectations stand on their own */
#define OFFSET_INVALID UINT64_MAX
#define ROW_INVALID ((int64_t)-1)

/* ---- the library's entry points, by name -------------------------------------------------------- */

typedef void (*any_fn)(void);
static any_fn symf(const char* name) {
  void* p = dlsym(RTLD_DEFAULT, name);
  any_fn f;
  if (p == NULL) fail_msg("libepfuse.so does not export %s", name);
  memcpy(&f, &p, sizeof(f));
  return f;
}
/* F(type, name): the export `name` as a function pointer of `type` */
#define F(type, name) ((type)symf(#name))

/* C mirrors of the CUDA-side structs passed BY VALUE (their size must match exactly: checked
 * against epf_abi_sizeof in test_mirrors), and a blob for structs returned by value (returned
 * through a hidden pointer: any size at least the real one is safe). */
typedef struct {
  void* base;
  uint64_t stride;
  void* const* peers;
  int32_t rank, nranks;
} team_t;
typedef struct {
  uint64_t timeout_ns;
  void* record;
  const uint32_t* abort_word;
  uint32_t* mask;
  int32_t rank, reserved;
} wait_t;
typedef struct {
  unsigned char b[4096];
} blob_t;
typedef struct {
  char internal[128];
} unique_id_t;

static int64_t constant(const char* name) {
  const int64_t v = epf_abi_constant(name);
  if (v < 0) fail_msg("epf_abi_constant(%s) unknown", name);
  return v;
}

static int all_bytes(const void* p, size_t n, unsigned char v) {
  const unsigned char* b = (const unsigned char*)p;
  size_t i;
  for (i = 0; i < n; ++i)
    if (b[i] != v) return 0;
  return 1;
}

/* plans computed by the library: HT expert-major, LL expert-major, LL rank-major */
static epf_plan_t make_plan(int mode, int layout) {
  epf_config_t c = EPF_CONFIG_INIT;
  epf_plan_t p;
  c.nranks = 4;
  c.num_experts = 16;
  c.top_k = 4;
  c.hidden = 256;
  c.max_tokens_per_rank = 8;
  c.mode = mode;
  c.layout = layout;
  memset(&p, 0, sizeof(p));
  assert_int_equal(F(epf_status_t(*)(const epf_config_t*, epf_plan_t*), epf_plan_compute)(&c, &p), EPF_OK);
  return p;
}
static epf_plan_t ht_plan(void) { return make_plan(EPF_MODE_HT, EPF_LAYOUT_EXPERT_MAJOR); }
static epf_plan_t ll_plan(void) { return make_plan(EPF_MODE_LL, EPF_LAYOUT_EXPERT_MAJOR); }
static epf_plan_t ll_rm_plan(void) { return make_plan(EPF_MODE_LL, EPF_LAYOUT_RANK_MAJOR); }

/* a route handle over a fake device address (only pointer arithmetic is done with it) */
static epf_route_t fake_route(const epf_plan_t* plan) {
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  epf_route_t r;
  memset(&r, 0, sizeof(r));
  r.size = (uint32_t)sizeof(r);
  r.magic = EPF_ROUTE_HANDLE_MAGIC;
  r.version = EPF_ROUTE_HANDLE_VERSION;
  r.count = 1;
  r.base = (void*)(uintptr_t)0x10000000ull;
  r.resident_blocks = 132;
  assert_int_equal(F(epf_status_t(*)(const epf_plan_t*, const epf_route_config_t*, epf_route_layout_t*),
                     epf_route_layout_compute)(plan, &rc, &r.layout),
                   EPF_OK);
  return r;
}

static team_t null_team(void) {
  team_t t;
  memset(&t, 0, sizeof(t));
  return t;
}

#define S_INVALID EPF_ERR_INVALID_ARGUMENT

/* ================================================================================================ */
/* host.h                                                                                            */
/* ================================================================================================ */

static void c_epf_version(void) { assert_int_equal(F(int (*)(void), epf_version)(), EPF_VERSION); }

static void c_epf_status_name(void) {
  const char* (*f)(int) = F(const char* (*)(int), epf_status_name);
  assert_string_equal(f(-1), "EPF_STATUS_UNKNOWN");
  assert_string_equal(f(EPF_STATUS_COUNT), "EPF_STATUS_UNKNOWN");
  assert_string_equal(f(0x7fffffff), "EPF_STATUS_UNKNOWN");
}

static void c_epf_status_message(void) {
  const char* (*f)(int) = F(const char* (*)(int), epf_status_message);
  assert_string_equal(f(-1), "unknown status code");
  assert_string_equal(f(EPF_STATUS_COUNT), "unknown status code");
}

static void c_epf_config_resolve(void) {
  epf_status_t (*f)(const epf_config_t*, epf_config_t*) =
      F(epf_status_t(*)(const epf_config_t*, epf_config_t*), epf_config_resolve);
  const epf_config_t in = EPF_CONFIG_INIT;
  epf_config_t out;
  assert_int_equal(f(NULL, NULL), S_INVALID);
  assert_int_equal(f(NULL, &out), S_INVALID);
  assert_int_equal(f(&in, NULL), S_INVALID);
}

static void c_epf_config_validate(void) {
  assert_int_equal(F(epf_status_t(*)(const epf_config_t*), epf_config_validate)(NULL), S_INVALID);
}

static void c_epf_config_hash(void) {
  uint64_t (*f)(const epf_config_t*) = F(uint64_t(*)(const epf_config_t*), epf_config_hash);
  assert_int_equal(f(NULL), 0); /* a hash is never 0 */
}

static void c_epf_config_worst_case_rows(void) {
  int64_t (*f)(const epf_config_t*) = F(int64_t(*)(const epf_config_t*), epf_config_worst_case_rows);
  epf_config_t c = EPF_CONFIG_INIT; /* unresolved: nranks 0 (a division by zero before) */
  assert_int_equal(f(NULL), ROW_INVALID);
  assert_int_equal(f(&c), ROW_INVALID);
  c.nranks = -2;
  c.num_experts = 16;
  c.top_k = 4;
  c.max_tokens_per_rank = 8;
  c.expert_alignment = 1;
  c.layout = EPF_LAYOUT_EXPERT_MAJOR;
  assert_int_equal(f(&c), ROW_INVALID);
  c.nranks = 4;
  assert_int_equal(f(&c), 4 * 8 * 4); /* valid fields: R * T * min(K, E / R) */
  c.expert_alignment = 0;
  assert_int_equal(f(&c), ROW_INVALID);
}

static void c_epf_payload_vector_width(void) {
  int (*f)(int) = F(int (*)(int), epf_payload_vector_width);
  assert_int_equal(f(-1), 0);
  assert_int_equal(f(99), 0);
}

static void c_epf_build_signature(void) {
  assert_true(F(uint64_t(*)(void), epf_build_signature)() != 0u);
}

static void c_epf_plan_compute(void) {
  epf_status_t (*f)(const epf_config_t*, epf_plan_t*) =
      F(epf_status_t(*)(const epf_config_t*, epf_plan_t*), epf_plan_compute);
  const epf_config_t c = EPF_CONFIG_INIT;
  epf_plan_t p;
  assert_int_equal(f(NULL, NULL), S_INVALID);
  assert_int_equal(f(NULL, &p), S_INVALID);
  assert_int_equal(f(&c, NULL), S_INVALID);
}

static void c_epf_plan_check(void) {
  assert_int_equal(F(epf_status_t(*)(const epf_plan_t*), epf_plan_check)(NULL), S_INVALID);
}

static void c_epf_plan_signal_offset(void) {
  uint64_t (*f)(const epf_plan_t*, int, int64_t) = F(uint64_t(*)(const epf_plan_t*, int, int64_t), epf_plan_signal_offset);
  const epf_plan_t p = ht_plan();
  assert_int_equal(f(NULL, EPF_REGION_SIG_BARRIER, 0), OFFSET_INVALID);
  assert_int_equal(f(&p, -1, 0), OFFSET_INVALID);
  assert_int_equal(f(&p, EPF_REGION_COUNT, 0), OFFSET_INVALID);
  assert_int_equal(f(&p, 1 << 30, 0), OFFSET_INVALID);
  assert_int_equal(f(&p, EPF_REGION_SIG_BARRIER, -1), OFFSET_INVALID);
  assert_int_equal(f(&p, EPF_REGION_SIG_BARRIER, 1), p.region[EPF_REGION_SIG_BARRIER].offset + 8u);
}

static void c_epf_plan_counts_offset(void) {
  uint64_t (*f)(const epf_plan_t*, int, int, int) = F(uint64_t(*)(const epf_plan_t*, int, int, int), epf_plan_counts_offset);
  const epf_plan_t p = ht_plan();
  assert_int_equal(f(NULL, 0, 0, 0), OFFSET_INVALID);
  assert_int_equal(f(&p, 0, -1, 0), OFFSET_INVALID);
  assert_int_equal(f(&p, 0, p.nranks, 0), OFFSET_INVALID);
  assert_int_equal(f(&p, 0, 0, -1), OFFSET_INVALID);
  assert_int_equal(f(&p, 0, 0, p.num_experts + p.nranks), OFFSET_INVALID);
  assert_int_equal(f(&p, 1, 0, 0), p.region[EPF_REGION_COUNTS].offset + (uint64_t)p.nranks * (p.num_experts + p.nranks) * 8u);
}

/* the row accessors of plan.h: NULL and a negative row */
typedef uint64_t (*row_offset_fn)(const epf_plan_t*, int64_t);
static void row_offset_case(row_offset_fn f) {
  const epf_plan_t p = ht_plan();
  assert_int_equal(f(NULL, 0), OFFSET_INVALID);
  assert_int_equal(f(&p, -1), OFFSET_INVALID);
  assert_int_equal(f(&p, INT64_MIN), OFFSET_INVALID);
  assert_true(f(&p, 0) != OFFSET_INVALID);
}
static void c_epf_plan_recv_token_offset(void) { row_offset_case(F(row_offset_fn, epf_plan_recv_token_offset)); }
static void c_epf_plan_recv_scale_offset(void) { row_offset_case(F(row_offset_fn, epf_plan_recv_scale_offset)); }
static void c_epf_plan_recv_meta_offset(void) { row_offset_case(F(row_offset_fn, epf_plan_recv_meta_offset)); }
static void c_epf_plan_expert_out_offset(void) { row_offset_case(F(row_offset_fn, epf_plan_expert_out_offset)); }
static void c_epf_plan_combine_offset(void) { row_offset_case(F(row_offset_fn, epf_plan_combine_offset)); }
static void c_epf_plan_recv_scale_stage_offset(void) { row_offset_case(F(row_offset_fn, epf_plan_recv_scale_stage_offset)); }
static void c_epf_plan_scales_staged(void) { /* a predicate: 0 for NULL; the test plan is COMPACT */
  int (*f)(const epf_plan_t*) = F(int (*)(const epf_plan_t*), epf_plan_scales_staged);
  const epf_plan_t p = ht_plan();
  assert_int_equal(f(NULL), 0);
  assert_int_equal(f(&p), 0);
}

static void c_epf_region_name(void) {
  const char* (*f)(int) = F(const char* (*)(int), epf_region_name);
  assert_string_equal(f(-1), "UNKNOWN");
  assert_string_equal(f(EPF_REGION_COUNT), "UNKNOWN");
}

static void c_epf_error_read(void) {
  void (*f)(const epf_error_record_t*, epf_error_record_t*) =
      F(void (*)(const epf_error_record_t*, epf_error_record_t*), epf_error_read);
  epf_error_record_t rec, out;
  memset(&rec, 0, sizeof(rec));
  memset(&out, 0xAB, sizeof(out));
  f(NULL, &out); /* no record: nothing recorded, *out zeroed (always fully written) */
  assert_true(all_bytes(&out, sizeof(out), 0));
  f(&rec, NULL);
  f(NULL, NULL);
}

static void c_epf_error_clear(void) { F(void (*)(epf_error_record_t*), epf_error_clear)(NULL); }

static void c_epf_route_layout_compute(void) {
  epf_status_t (*f)(const epf_plan_t*, const epf_route_config_t*, epf_route_layout_t*) =
      F(epf_status_t(*)(const epf_plan_t*, const epf_route_config_t*, epf_route_layout_t*), epf_route_layout_compute);
  const epf_plan_t p = ht_plan();
  const epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  epf_route_layout_t L;
  assert_int_equal(f(NULL, NULL, NULL), S_INVALID);
  assert_int_equal(f(NULL, &rc, &L), S_INVALID);
  assert_int_equal(f(&p, NULL, &L), S_INVALID);
  assert_int_equal(f(&p, &rc, NULL), S_INVALID);
}

static void c_epf_route_size(void) {
  epf_status_t (*f)(const epf_plan_t*, const epf_route_config_t*, uint64_t*) =
      F(epf_status_t(*)(const epf_plan_t*, const epf_route_config_t*, uint64_t*), epf_route_size);
  const epf_plan_t p = ht_plan();
  const epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  uint64_t bytes = 7;
  assert_int_equal(f(NULL, &rc, &bytes), S_INVALID);
  assert_int_equal(bytes, 0);
  assert_int_equal(f(&p, NULL, &bytes), S_INVALID);
  assert_int_equal(f(&p, &rc, NULL), S_INVALID);
}

static void c_epf_route_header_init(void) {
  void (*f)(const epf_route_layout_t*, uint32_t, epf_route_header_t*) =
      F(void (*)(const epf_route_layout_t*, uint32_t, epf_route_header_t*), epf_route_header_init);
  const epf_plan_t p = ht_plan();
  const epf_route_t r = fake_route(&p);
  epf_route_header_t h;
  memset(&h, 0xAB, sizeof(h));
  f(NULL, 0u, &h);
  assert_true(all_bytes(&h, sizeof(h), 0xAB));
  f(&r.layout, 0u, NULL);
  f(NULL, 0u, NULL);
}

static void c_epf_route_header_check(void) {
  epf_status_t (*f)(const epf_route_header_t*, const epf_plan_t*, uint64_t, epf_route_layout_t*) =
      F(epf_status_t(*)(const epf_route_header_t*, const epf_plan_t*, uint64_t, epf_route_layout_t*),
        epf_route_header_check);
  const epf_plan_t p = ht_plan();
  epf_route_header_t h;
  epf_route_layout_t L;
  memset(&h, 0, sizeof(h));
  assert_int_equal(f(NULL, NULL, 0, NULL), S_INVALID);
  assert_int_equal(f(NULL, &p, 0, &L), S_INVALID);
  assert_int_equal(f(&h, NULL, 0, &L), S_INVALID);
  assert_int_equal(f(&h, &p, 0, NULL), S_INVALID);
}

static void c_epf_route_ptr(void) {
  void* (*f)(const epf_route_t*, int, int) = F(void* (*)(const epf_route_t*, int, int), epf_route_ptr);
  const epf_plan_t p = ht_plan();
  const epf_route_t r = fake_route(&p);
  assert_null(f(NULL, 0, EPF_ROUTE_SLOT));
  assert_null(f(&r, -1, EPF_ROUTE_SLOT));
  assert_null(f(&r, r.count, EPF_ROUTE_SLOT));
  assert_null(f(&r, 0, -1));
  assert_null(f(&r, 0, EPF_ROUTE_ARRAY_COUNT));
  assert_null(f(&r, 0, 1 << 30));
  assert_ptr_equal(f(&r, 0, EPF_ROUTE_SLOT), (char*)r.base + r.layout.array[EPF_ROUTE_SLOT].offset);
}

static void c_epf_route_epoch_ptr(void) {
  uint32_t* (*f)(const epf_route_t*, int) = F(uint32_t * (*)(const epf_route_t*, int), epf_route_epoch_ptr);
  const epf_plan_t p = ht_plan();
  epf_route_t r = fake_route(&p);
  assert_null(f(NULL, 0));
  assert_null(f(&r, -1));
  assert_null(f(&r, r.count));
  assert_non_null(f(&r, 0));
  r.epoch_words = (uint32_t*)(uintptr_t)0x20000000ull;
  assert_null(f(&r, -1));
  assert_null(f(&r, r.count));
}

static void c_epf_route_array_name(void) {
  const char* (*f)(int) = F(const char* (*)(int), epf_route_array_name);
  assert_string_equal(f(-1), "UNKNOWN");
  assert_string_equal(f(EPF_ROUTE_ARRAY_COUNT), "UNKNOWN");
}

/* ================================================================================================ */
/* core/team.cuh, core/signal.cuh: constructors by value (nothing to dereference), the CUDA error slot */
/* ================================================================================================ */

static void c_epf_team_affine(void) {
  const team_t t = F(team_t(*)(void*, uint64_t, int, int), epf_team_affine)(NULL, 0u, 0, 1);
  assert_null(t.base);
  assert_null(t.peers);
  assert_int_equal(t.nranks, 1);
}

static void c_epf_team_virtual(void) {
  const team_t t = F(team_t(*)(void*, uint64_t, int, int), epf_team_virtual)(NULL, 0u, -1, 0);
  assert_null(t.base);
  assert_int_equal(t.rank, -1);
}

static void c_epf_team_from_table(void) {
  const team_t t = F(team_t(*)(void* const*, int, int), epf_team_from_table)(NULL, 0, 1);
  assert_null(t.peers);
  assert_null(t.base);
}

static void c_epf_wait_make(void) {
  const wait_t w = F(wait_t(*)(uint64_t, void*, const uint32_t*, int), epf_wait_make)(0u, NULL, NULL, 0);
  assert_null(w.record);
  assert_null(w.abort_word);
  assert_null(w.mask);
}

static void c_epf_cuda_last_error(void) { (void)F(int (*)(void), epf_cuda_last_error)(); }

static void c_epf_cuda_last_error_clear(void) {
  F(void (*)(void), epf_cuda_last_error_clear)();
  assert_int_equal(F(int (*)(void), epf_cuda_last_error)(), 0);
}

/* ================================================================================================ */
/* route/kernels.cuh                                                                                 */
/* ================================================================================================ */

typedef struct {
  const void* topk_idx;
  int32_t num_tokens, blocks_per_rank;
  const int32_t* num_tokens_dev;
  int64_t* recv_total_mapped;
  wait_t wait;
} route_step_t;

static void c_epf_route_step_make(void) {
  wait_t w;
  route_step_t s;
  memset(&w, 0, sizeof(w));
  s = F(route_step_t(*)(const void*, int, wait_t), epf_route_step_make)(NULL, -1, w);
  assert_null(s.topk_idx);
  assert_null(s.num_tokens_dev);
}

static void c_epf_route_blocks_per_rank(void) {
  int (*f)(const epf_route_t*, int) = F(int (*)(const epf_route_t*, int), epf_route_blocks_per_rank);
  const epf_plan_t p = ht_plan();
  const epf_route_t r = fake_route(&p);
  assert_int_equal(f(NULL, 1), 0);
  assert_int_equal(f(&r, -1), 0);
  assert_true(f(&r, 8) >= 1);
}

typedef epf_status_t (*route_init_fn)(const epf_plan_t*, const epf_route_config_t*, void*, uint64_t, int, uint32_t,
                                      void*, epf_route_t*);
static void c_epf_route_init(void) {
  route_init_fn f = F(route_init_fn, epf_route_init);
  const epf_plan_t p = ht_plan();
  const epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  void* buf = (void*)(uintptr_t)0x10000000ull;
  epf_route_t r;
  assert_int_equal(f(NULL, NULL, NULL, 0, 1, 0, NULL, NULL), S_INVALID);
  assert_int_equal(f(NULL, &rc, buf, 1u << 20, 1, 0, NULL, &r), S_INVALID);
  assert_int_equal(f(&p, NULL, buf, 1u << 20, 1, 0, NULL, &r), S_INVALID);
  assert_int_equal(f(&p, &rc, NULL, 1u << 20, 1, 0, NULL, &r), S_INVALID);
  assert_int_equal(f(&p, &rc, buf, 1u << 20, 1, 0, NULL, NULL), S_INVALID);
  assert_int_equal(f(&p, &rc, buf, 1u << 20, -1, 0, NULL, &r), S_INVALID);
  assert_int_equal(f(&p, &rc, buf, 1u << 20, 0, 0, NULL, &r), S_INVALID);
}

static void c_epf_route_check(void) {
  epf_status_t (*f)(const epf_route_t*, const epf_plan_t*) =
      F(epf_status_t(*)(const epf_route_t*, const epf_plan_t*), epf_route_check);
  const epf_plan_t p = ht_plan();
  epf_route_t r = fake_route(&p);
  assert_int_equal(f(NULL, NULL), S_INVALID);
  assert_int_equal(f(&r, NULL), S_INVALID);
  assert_int_equal(f(NULL, &p), S_INVALID);
  assert_int_equal(f(&r, &p), EPF_OK);
  r.count = -1;
  assert_int_equal(f(&r, &p), S_INVALID);
  r = fake_route(&p);
  r.layout.array[3].offset = UINT64_MAX; /* a damaged handle */
  assert_int_equal(f(&r, &p), EPF_ERR_CONFIG_MISMATCH);
}

static void c_epf_route_update(void) {
  epf_status_t (*f)(const epf_route_t*, team_t, const epf_plan_t*, const void*, void*) =
      F(epf_status_t(*)(const epf_route_t*, team_t, const epf_plan_t*, const void*, void*), epf_route_update);
  const epf_plan_t p = ht_plan();
  const epf_route_t r = fake_route(&p);
  blob_t step;
  memset(&step, 0, sizeof(step));
  assert_int_equal(f(NULL, null_team(), NULL, NULL, NULL), S_INVALID);
  assert_int_equal(f(&r, null_team(), &p, NULL, NULL), S_INVALID);
  assert_int_equal(f(&r, null_team(), NULL, &step, NULL), S_INVALID);
  assert_int_equal(f(&r, null_team(), &p, &step, NULL), S_INVALID); /* step.topk_idx NULL */
}

static void c_epf_route_create(void) {
  epf_status_t (*f)(const epf_plan_t*, const epf_route_config_t*, void*, uint64_t, int, uint32_t, team_t, const void*,
                    void*, epf_route_t*) =
      F(epf_status_t(*)(const epf_plan_t*, const epf_route_config_t*, void*, uint64_t, int, uint32_t, team_t,
                        const void*, void*, epf_route_t*),
        epf_route_create);
  assert_int_equal(f(NULL, NULL, NULL, 0, 1, 0, null_team(), NULL, NULL, NULL), S_INVALID);
}

static void c_epf_route_read_header(void) {
  epf_status_t (*f)(const epf_route_t*, int, void*, epf_route_header_t*) =
      F(epf_status_t(*)(const epf_route_t*, int, void*, epf_route_header_t*), epf_route_read_header);
  const epf_plan_t p = ht_plan();
  const epf_route_t r = fake_route(&p);
  epf_route_header_t h;
  assert_int_equal(f(NULL, 0, NULL, &h), S_INVALID);
  assert_int_equal(f(&r, 0, NULL, NULL), S_INVALID);
  assert_int_equal(f(&r, -1, NULL, &h), S_INVALID);
  assert_int_equal(f(&r, r.count, NULL, &h), S_INVALID);
}

static void c_epf_route_import(void) {
  epf_status_t (*f)(const epf_plan_t*, void*, uint64_t, int, void*, epf_route_t*) =
      F(epf_status_t(*)(const epf_plan_t*, void*, uint64_t, int, void*, epf_route_t*), epf_route_import);
  const epf_plan_t p = ht_plan();
  epf_route_t r;
  void* buf = (void*)(uintptr_t)0x10000000ull;
  assert_int_equal(f(NULL, NULL, 0, 1, NULL, NULL), S_INVALID);
  assert_int_equal(f(&p, NULL, 1u << 20, 1, NULL, &r), S_INVALID);
  assert_int_equal(f(&p, buf, 1u << 20, 1, NULL, NULL), S_INVALID);
  assert_int_equal(f(&p, buf, 1u << 20, -1, NULL, &r), S_INVALID);
}

/* ================================================================================================ */
/* ht/kernels.cuh                                                                                    */
/* ================================================================================================ */

static void c_epf_ht_check(void) {
  epf_status_t (*f)(const epf_plan_t*, const epf_route_t*, const void*) =
      F(epf_status_t(*)(const epf_plan_t*, const epf_route_t*, const void*), epf_ht_check);
  const epf_plan_t p = ht_plan();
  const epf_route_t r = fake_route(&p);
  assert_int_equal(f(NULL, NULL, NULL), S_INVALID);
  assert_int_equal(f(&p, &r, NULL), S_INVALID);
  assert_int_equal(f(NULL, &r, NULL), S_INVALID);
}

typedef epf_status_t (*ht_launch_fn)(const epf_route_t*, team_t, const epf_plan_t*, const void*, const void*, int, void*);
static void c_epf_ht_dispatch(void) {
  ht_launch_fn f = F(ht_launch_fn, epf_ht_dispatch);
  const epf_plan_t p = ht_plan();
  const epf_route_t r = fake_route(&p);
  assert_int_equal(f(NULL, null_team(), NULL, NULL, NULL, 3, NULL), S_INVALID);
  assert_int_equal(f(&r, null_team(), &p, NULL, NULL, 3, NULL), S_INVALID);
}

static void c_epf_ht_expand(void) {
  epf_status_t (*f)(const epf_route_t*, team_t, const epf_plan_t*, const void*, void*) =
      F(epf_status_t(*)(const epf_route_t*, team_t, const epf_plan_t*, const void*, void*), epf_ht_expand);
  const epf_plan_t p = ht_plan();
  const epf_route_t r = fake_route(&p);
  assert_int_equal(f(NULL, null_team(), NULL, NULL, NULL), S_INVALID);
  assert_int_equal(f(&r, null_team(), &p, NULL, NULL), S_INVALID);
}

static void c_epf_ht_combine(void) {
  epf_status_t (*f)(const epf_route_t*, team_t, const epf_plan_t*, const void*, const void*, void*) =
      F(epf_status_t(*)(const epf_route_t*, team_t, const epf_plan_t*, const void*, const void*, void*), epf_ht_combine);
  const epf_plan_t p = ht_plan();
  const epf_route_t r = fake_route(&p);
  assert_int_equal(f(NULL, null_team(), NULL, NULL, NULL, NULL), S_INVALID);
  assert_int_equal(f(&r, null_team(), &p, NULL, NULL, NULL), S_INVALID);
}

static void c_epf_ht_combine_backward(void) {
  epf_status_t (*f)(const epf_route_t*, team_t, const epf_plan_t*, const void*, int, void*) =
      F(epf_status_t(*)(const epf_route_t*, team_t, const epf_plan_t*, const void*, int, void*), epf_ht_combine_backward);
  const epf_plan_t p = ht_plan();
  const epf_route_t r = fake_route(&p);
  assert_int_equal(f(NULL, null_team(), NULL, NULL, 3, NULL), S_INVALID);
  assert_int_equal(f(&r, null_team(), &p, NULL, 3, NULL), S_INVALID);
}

static void c_epf_ht_dispatch_backward(void) {
  epf_status_t (*f)(const epf_route_t*, team_t, const epf_plan_t*, const void*, void*) =
      F(epf_status_t(*)(const epf_route_t*, team_t, const epf_plan_t*, const void*, void*), epf_ht_dispatch_backward);
  const epf_plan_t p = ht_plan();
  const epf_route_t r = fake_route(&p);
  assert_int_equal(f(NULL, null_team(), NULL, NULL, NULL), S_INVALID);
  assert_int_equal(f(&r, null_team(), &p, NULL, NULL), S_INVALID);
}

/* ================================================================================================ */
/* ll/ll.cuh: plan checks, rows, buffers                                                             */
/* ================================================================================================ */

static void c_epf_ll_plan_check(void) {
  assert_int_equal(F(epf_status_t(*)(const epf_plan_t*), epf_ll_plan_check)(NULL), S_INVALID);
}

static void c_epf_ll_tokens_check(void) {
  epf_status_t (*f)(const epf_plan_t*, int) = F(epf_status_t(*)(const epf_plan_t*, int), epf_ll_tokens_check);
  const epf_plan_t p = ll_plan();
  assert_int_equal(f(NULL, 0), S_INVALID);
  assert_int_equal(f(&p, -1), EPF_ERR_TOKENS);
  assert_int_equal(f(&p, 0), EPF_OK);
}

static void c_epf_ll_index_type_ok(void) {
  bool (*f)(int) = F(bool (*)(int), epf_ll_index_type_ok);
  assert_false(f(-1));
  assert_false(f(3));
}

/* epf_ll_rank_bytes: the exported symbol of the former name. Its third argument meant "is int64"
 * (1 = int64) before it meant epf_index_type_t (1 = INT32): the ids' buffer for the ambiguous
 * values 0 and 1 is refused with the size sentinel 0 (an old caller gets nothing instead of a
 * half-size buffer); EPF_INDEX_INT64 (2, nonzero in the old meaning too) keeps its 8 bytes. */
static void c_epf_ll_rank_bytes(void) {
  uint64_t (*f)(const epf_plan_t*, int, int) = F(uint64_t(*)(const epf_plan_t*, int, int), epf_ll_rank_bytes);
  const epf_plan_t p = ll_plan();
  const int idx = (int)constant("EPF_LL_BUF_TOPK_IDX"), x = (int)constant("EPF_LL_BUF_X");
  assert_int_equal(f(NULL, x, 0), 0);
  assert_int_equal(f(&p, -1, 0), 0);
  assert_int_equal(f(&p, 1000, 0), 0);
  assert_int_equal(f(&p, idx, 0), 0);
  assert_int_equal(f(&p, idx, 1), 0);
  assert_int_equal(f(&p, idx, -1), 0);
  assert_int_equal(f(&p, idx, 3), 0);
  assert_int_equal(f(&p, idx, EPF_INDEX_INT64), (uint64_t)p.max_tokens_per_rank * (uint64_t)p.top_k * 8u);
  assert_int_equal(f(&p, x, 0), (uint64_t)p.max_tokens_per_rank * (uint64_t)p.hidden * 2u);
}

/* epf_ll_buffer_bytes: the name the headers declare, third argument an epf_index_type_t */
static void c_epf_ll_buffer_bytes(void) {
  uint64_t (*f)(const epf_plan_t*, int, int) = F(uint64_t(*)(const epf_plan_t*, int, int), epf_ll_buffer_bytes);
  const epf_plan_t p = ll_plan();
  const int idx = (int)constant("EPF_LL_BUF_TOPK_IDX"), x = (int)constant("EPF_LL_BUF_X");
  const uint64_t TK = (uint64_t)p.max_tokens_per_rank * (uint64_t)p.top_k;
  assert_int_equal(f(NULL, x, EPF_INDEX_DEFAULT), 0);
  assert_int_equal(f(&p, -1, EPF_INDEX_DEFAULT), 0);
  assert_int_equal(f(&p, 1000, EPF_INDEX_DEFAULT), 0);
  assert_int_equal(f(&p, idx, -1), 0);
  assert_int_equal(f(&p, idx, 3), 0);
  assert_int_equal(f(&p, x, 3), 0); /* an unknown index type is refused for every buffer */
  assert_int_equal(f(&p, idx, EPF_INDEX_DEFAULT), TK * 8u);
  assert_int_equal(f(&p, idx, EPF_INDEX_INT32), TK * 4u);
  assert_int_equal(f(&p, idx, EPF_INDEX_INT64), TK * 8u);
}

static void c_epf_ll_recv_row(void) {
  int64_t (*f)(const epf_plan_t*, uint32_t, int, int, int) =
      F(int64_t(*)(const epf_plan_t*, uint32_t, int, int, int), epf_ll_recv_row);
  const epf_plan_t p = ll_plan();
  assert_int_equal(f(NULL, 0u, 0, 0, 0), ROW_INVALID);
  assert_int_equal(f(&p, 0u, -1, 0, 0), ROW_INVALID);
  assert_int_equal(f(&p, 0u, p.experts_per_rank, 0, 0), ROW_INVALID);
  assert_int_equal(f(&p, 0u, 0, -1, 0), ROW_INVALID);
  assert_int_equal(f(&p, 0u, 0, p.nranks, 0), ROW_INVALID);
  assert_int_equal(f(&p, 0u, 0, 0, -1), ROW_INVALID);
  assert_int_equal(f(&p, 0u, 0, 0, p.max_tokens_per_rank), ROW_INVALID);
  assert_int_equal(f(&p, 1u, 0, 0, 1), p.recv_capacity + 1);
}

static void c_epf_ll_packed_row(void) {
  int64_t (*f)(const epf_plan_t*, int, int) = F(int64_t(*)(const epf_plan_t*, int, int), epf_ll_packed_row);
  const epf_plan_t p = ll_plan();
  assert_int_equal(f(NULL, 0, 0), ROW_INVALID);
  assert_int_equal(f(&p, -1, 0), ROW_INVALID);
  assert_int_equal(f(&p, p.experts_per_rank, 0), ROW_INVALID);
  assert_int_equal(f(&p, 0, -1), ROW_INVALID);
  assert_int_equal(f(&p, 0, p.nranks * p.max_tokens_per_rank), ROW_INVALID);
}

static void c_epf_ll_combine_row(void) {
  int64_t (*f)(const epf_plan_t*, uint32_t, int, int) = F(int64_t(*)(const epf_plan_t*, uint32_t, int, int), epf_ll_combine_row);
  const epf_plan_t p = ll_plan();
  assert_int_equal(f(NULL, 0u, 0, 0), ROW_INVALID);
  assert_int_equal(f(&p, 0u, -1, 0), ROW_INVALID);
  assert_int_equal(f(&p, 0u, p.max_tokens_per_rank, 0), ROW_INVALID);
  assert_int_equal(f(&p, 0u, 0, -1), ROW_INVALID);
  assert_int_equal(f(&p, 0u, 0, p.top_k), ROW_INVALID);
}

static void c_epf_ll_weight_grad_row(void) {
  int64_t (*f)(const epf_plan_t*, uint32_t, int, int) =
      F(int64_t(*)(const epf_plan_t*, uint32_t, int, int), epf_ll_weight_grad_row);
  const epf_plan_t p = ll_plan();
  assert_int_equal(f(NULL, 0u, 0, 0), ROW_INVALID);
  assert_int_equal(f(&p, 0u, -1, 0), ROW_INVALID);
  assert_int_equal(f(&p, 0u, 0, p.top_k), ROW_INVALID);
}

/* the args structs are opaque here: a zeroed blob in, an all-zero struct out on bad arguments */
static void args_for_rank_case(blob_t (*f)(const void*, const epf_plan_t*, int), size_t size) {
  const epf_plan_t p = ll_plan();
  blob_t a, r;
  memset(&a, 0x11, sizeof(a)); /* non-NULL "pointers" everywhere */
  memset(a.b + size, 0, sizeof(a) - size);
  r = f(NULL, NULL, 0);
  assert_true(all_bytes(&r, size, 0));
  r = f(&a, NULL, 0);
  assert_true(all_bytes(&r, size, 0));
  r = f(NULL, &p, 0);
  assert_true(all_bytes(&r, size, 0));
  r = f(&a, &p, -1);
  assert_true(all_bytes(&r, size, 0));
  r = f(&a, &p, p.nranks);
  assert_true(all_bytes(&r, size, 0));
}
static void c_epf_ll_dispatch_args_for_rank(void) {
  args_for_rank_case(F(blob_t(*)(const void*, const epf_plan_t*, int), epf_ll_dispatch_args_for_rank),
                     epf_abi_sizeof("epf_ll_dispatch_args_t"));
}
static void c_epf_ll_combine_args_for_rank(void) {
  args_for_rank_case(F(blob_t(*)(const void*, const epf_plan_t*, int), epf_ll_combine_args_for_rank),
                     epf_abi_sizeof("epf_ll_combine_args_t"));
}

static void c_epf_ll_payload_supported(void) {
  assert_false(F(bool (*)(int), epf_ll_payload_supported)(-1));
  assert_false(F(bool (*)(int), epf_ll_payload_supported)(99));
}

static void c_epf_ll_combine_payload_supported(void) {
  assert_false(F(bool (*)(int), epf_ll_combine_payload_supported)(-1));
}

static void c_epf_ll_combine_pulls(void) {
  assert_false(F(bool (*)(const epf_plan_t*, int), epf_ll_combine_pulls)(NULL, 3));
}

static void c_epf_ll_state_init(void) {
  void (*f)(void*, int) = F(void (*)(void*, int), epf_ll_state_init);
  const size_t n = epf_abi_sizeof("epf_ll_state_t");
  blob_t s;
  assert_true(n > 0 && n <= sizeof(s));
  f(NULL, 1);
  memset(&s, 0xAB, sizeof(s));
  f(&s, 0); /* nranks outside [1, EPF_MAX_RANKS]: nothing written */
  f(&s, -1);
  f(&s, (int)constant("EPF_MAX_RANKS") + 1);
  assert_true(all_bytes(&s, sizeof(s), 0xAB));
}

static void c_epf_ll_backward_check(void) {
  assert_int_equal(F(epf_status_t(*)(const epf_plan_t*), epf_ll_backward_check)(NULL), S_INVALID);
}

/* rank-major rows */
static void c_epf_ll_rm_fixed_row(void) {
  int64_t (*f)(const epf_plan_t*, int, int) = F(int64_t(*)(const epf_plan_t*, int, int), epf_ll_rm_fixed_row);
  const epf_plan_t p = ll_rm_plan();
  assert_int_equal(f(NULL, 0, 0), ROW_INVALID);
  assert_int_equal(f(&p, -1, 0), ROW_INVALID);
  assert_int_equal(f(&p, p.nranks, 0), ROW_INVALID);
  assert_int_equal(f(&p, 0, -1), ROW_INVALID);
  assert_int_equal(f(&p, 0, p.max_tokens_per_rank), ROW_INVALID);
}

static void c_epf_ll_rm_recv_row(void) {
  int64_t (*f)(const epf_plan_t*, uint32_t, int, int) = F(int64_t(*)(const epf_plan_t*, uint32_t, int, int), epf_ll_rm_recv_row);
  const epf_plan_t p = ll_rm_plan();
  assert_int_equal(f(NULL, 0u, 0, 0), ROW_INVALID);
  assert_int_equal(f(&p, 0u, -1, 0), ROW_INVALID);
  assert_int_equal(f(&p, 0u, 0, -1), ROW_INVALID);
}

static void c_epf_ll_rm_dispatch_signal_index(void) {
  int64_t (*f)(const epf_plan_t*, uint32_t, int) = F(int64_t(*)(const epf_plan_t*, uint32_t, int), epf_ll_rm_dispatch_signal_index);
  const epf_plan_t p = ll_rm_plan();
  assert_int_equal(f(NULL, 0u, 0), ROW_INVALID);
  assert_int_equal(f(&p, 0u, -1), ROW_INVALID);
  assert_int_equal(f(&p, 0u, p.nranks), ROW_INVALID);
}

static void c_epf_ll_rm_count_offset(void) {
  uint64_t (*f)(const epf_plan_t*, uint32_t, int, int) = F(uint64_t(*)(const epf_plan_t*, uint32_t, int, int), epf_ll_rm_count_offset);
  const epf_plan_t p = ll_rm_plan();
  assert_int_equal(f(NULL, 0u, 0, 0), OFFSET_INVALID);
  assert_int_equal(f(&p, 0u, -1, 0), OFFSET_INVALID);
  assert_int_equal(f(&p, 0u, 0, -1), OFFSET_INVALID);
  assert_int_equal(f(&p, 0u, 0, p.num_experts), OFFSET_INVALID);
}

static void c_epf_ll_rm_combine_row(void) {
  int64_t (*f)(const epf_plan_t*, uint32_t, int, int) = F(int64_t(*)(const epf_plan_t*, uint32_t, int, int), epf_ll_rm_combine_row);
  const epf_plan_t p = ll_rm_plan();
  assert_int_equal(f(NULL, 0u, 0, 0), ROW_INVALID);
  assert_int_equal(f(&p, 0u, -1, 0), ROW_INVALID);
  assert_int_equal(f(&p, 0u, 0, -1), ROW_INVALID);
  assert_int_equal(f(&p, 0u, 0, p.nranks), ROW_INVALID);
}

/* ================================================================================================ */
/* ll/kernels.cuh: the launchers (group test_null_ll_launchers)                                      */
/* ================================================================================================ */

typedef epf_status_t (*ll_op_fn)(const void*, const void*, int, void*);

static void c_epf_ll_launch_make(void) {
  blob_t (*f)(const epf_plan_t*, team_t, void*, void*, int) =
      F(blob_t(*)(const epf_plan_t*, team_t, void*, void*, int), epf_ll_launch_make);
  blob_t L = f(NULL, null_team(), NULL, NULL, 0); /* must not read through the NULL plan */
  blob_t args;
  memset(&args, 0, sizeof(args));
  /* and what it returns is refused by every launcher */
  assert_int_not_equal(F(ll_op_fn, epf_ll_dispatch)(&L, &args, 3, NULL), EPF_OK);
}

static void c_epf_ll_blocks_per_rank(void) {
  assert_int_equal(F(int (*)(const void*, int, int), epf_ll_blocks_per_rank)(NULL, 1, 0), 0);
}

static void c_epf_ll_dispatch(void) {
  blob_t args;
  memset(&args, 0, sizeof(args));
  assert_int_equal(F(ll_op_fn, epf_ll_dispatch)(NULL, NULL, 3, NULL), S_INVALID);
  assert_int_equal(F(ll_op_fn, epf_ll_dispatch)(NULL, &args, 3, NULL), S_INVALID);
}
static void c_epf_ll_combine(void) { assert_int_equal(F(ll_op_fn, epf_ll_combine)(NULL, NULL, 3, NULL), S_INVALID); }
static void c_epf_ll_combine_backward(void) {
  assert_int_equal(F(ll_op_fn, epf_ll_combine_backward)(NULL, NULL, 3, NULL), S_INVALID);
}
static void c_epf_ll_dispatch_backward(void) {
  assert_int_equal(F(ll_op_fn, epf_ll_dispatch_backward)(NULL, NULL, 3, NULL), S_INVALID);
}
static void c_epf_ll_expand(void) {
  assert_int_equal(F(epf_status_t(*)(const void*, const void*, void*), epf_ll_expand)(NULL, NULL, NULL), S_INVALID);
}
static void c_epf_ll_state_reset(void) {
  assert_int_equal(F(epf_status_t(*)(const void*, void*), epf_ll_state_reset)(NULL, NULL), S_INVALID);
}
static void c_epf_ll_mask_query_async(void) {
  assert_int_equal(F(epf_status_t(*)(const void*, uint32_t*, void*), epf_ll_mask_query_async)(NULL, NULL, NULL), S_INVALID);
}
static void c_epf_ll_mask_update(void) {
  assert_int_equal(F(epf_status_t(*)(const void*, const uint32_t*, void*), epf_ll_mask_update)(NULL, NULL, NULL), S_INVALID);
}
static void c_epf_ll_mask_clean(void) {
  assert_int_equal(F(epf_status_t(*)(const void*, void*), epf_ll_mask_clean)(NULL, NULL), S_INVALID);
}
static void c_epf_ll_error_clear_async(void) {
  assert_int_equal(F(epf_status_t(*)(void*, void*), epf_ll_error_clear_async)(NULL, NULL), S_INVALID);
}

/* ================================================================================================ */
/* capi.h                                                                                            */
/* ================================================================================================ */

static void c_epf_abi_version(void) { assert_int_equal(F(int (*)(void), epf_abi_version)(), EPF_VERSION); }
static void c_epf_abi_has_nccl(void) {
  const int n = F(int (*)(void), epf_abi_has_nccl)();
  assert_true(n == 0 || n == 1);
}
static void c_epf_abi_sizeof(void) {
  assert_int_equal(F(size_t(*)(const char*), epf_abi_sizeof)(NULL), 0);
  assert_int_equal(F(size_t(*)(const char*), epf_abi_sizeof)(""), 0);
}
static void c_epf_abi_type_count(void) { assert_true(F(int (*)(void), epf_abi_type_count)() > 0); }
static void c_epf_abi_type_name(void) {
  const char* (*f)(int) = F(const char* (*)(int), epf_abi_type_name);
  assert_null(f(-1));
  assert_null(f(F(int (*)(void), epf_abi_type_count)()));
  assert_null(f(1 << 30));
}
static void c_epf_abi_constant(void) {
  assert_int_equal(F(int64_t(*)(const char*), epf_abi_constant)(NULL), -1);
  assert_int_equal(F(int64_t(*)(const char*), epf_abi_constant)("EPF_NOTHING"), -1);
}

static void c_epf_config_init(void) { F(void (*)(void*), epf_config_init)(NULL); }
static void c_epf_route_config_init(void) { F(void (*)(void*), epf_route_config_init)(NULL); }
static void c_epf_wait_init(void) { F(void (*)(void*), epf_wait_init)(NULL); }
static void c_epf_route_step_init(void) { F(void (*)(void*), epf_route_step_init)(NULL); }
/* the legacy epf_ht_step_init: zeroes the first 120 bytes (the smallest prefix-less step ever
 * shipped) and nothing past them; the launchers then refuse the step (magic 0) */
static void c_epf_ht_step_init(void) {
  void (*f)(void*) = F(void (*)(void*), epf_ht_step_init);
  const epf_plan_t p = ht_plan();
  const epf_route_t r = fake_route(&p);
  blob_t b;
  f(NULL);
  memset(&b, 0xAB, sizeof(b));
  f(&b);
  assert_true(all_bytes(b.b, 120, 0));
  assert_true(all_bytes(b.b + 120, sizeof(b) - 120, 0xAB));
  assert_int_equal(F(epf_status_t(*)(const epf_plan_t*, const epf_route_t*, const void*), epf_ht_check)(&p, &r, &b),
                   EPF_ERR_STRUCT_VERSION);
}

/* epf_ht_step_init_sized: exactly `size` bytes, the prefix set; a size below the versioned layout
 * (a mirror of the 120- or 144-byte step) is refused without a write */
static void c_epf_ht_step_init_sized(void) {
  epf_status_t (*f)(void*, size_t) = F(epf_status_t(*)(void*, size_t), epf_ht_step_init_sized);
  const size_t n = epf_abi_sizeof("epf_ht_step_t");
  blob_t b;
  uint32_t prefix[3];
  assert_true(n > 0 && n + 64 <= sizeof(b));
  assert_int_equal(f(NULL, n), S_INVALID);
  memset(&b, 0xAB, sizeof(b));
  assert_int_equal(f(&b, 0), EPF_ERR_STRUCT_VERSION);
  assert_int_equal(f(&b, 120), EPF_ERR_STRUCT_VERSION);
  assert_int_equal(f(&b, 144), EPF_ERR_STRUCT_VERSION);
  assert_int_equal(f(&b, n - 1), EPF_ERR_STRUCT_VERSION);
  assert_true(all_bytes(&b, sizeof(b), 0xAB));
#if SIZE_MAX > UINT32_MAX
  assert_int_equal(f(&b, (size_t)UINT32_MAX + 1u), S_INVALID);
#endif
  assert_int_equal(f(&b, n), EPF_OK);
  memcpy(prefix, b.b, sizeof(prefix));
  assert_int_equal(prefix[0], n);
  assert_int_equal(prefix[1], (uint32_t)constant("EPF_HT_STEP_MAGIC"));
  assert_int_equal(prefix[2], (uint32_t)constant("EPF_HT_STEP_VERSION"));
  assert_true(all_bytes(b.b + 12, n - 12, 0));
  assert_true(all_bytes(b.b + n, sizeof(b) - n, 0xAB));
  /* a newer caller's larger struct: all of it zeroed, its size recorded */
  memset(&b, 0xAB, sizeof(b));
  assert_int_equal(f(&b, n + 32), EPF_OK);
  memcpy(prefix, b.b, sizeof(prefix));
  assert_int_equal(prefix[0], n + 32);
  assert_true(all_bytes(b.b + n, 32, 0));
  assert_true(all_bytes(b.b + n + 32, sizeof(b) - n - 32, 0xAB));
}
static void c_epf_ll_dispatch_args_init(void) { F(void (*)(void*), epf_ll_dispatch_args_init)(NULL); }
static void c_epf_ll_combine_args_init(void) { F(void (*)(void*), epf_ll_combine_args_init)(NULL); }

static void c_epf_error_describe(void) {
  size_t (*f)(const epf_error_record_t*, char*, size_t) =
      F(size_t(*)(const epf_error_record_t*, char*, size_t), epf_error_describe);
  assert_int_equal(f(NULL, NULL, 0), strlen("no error record"));
  assert_int_equal(f(NULL, NULL, 100), strlen("no error record")); /* NULL buffer with a size */
}

static void c_epf_cuda_error_string(void) {
  assert_non_null(F(const char* (*)(int), epf_cuda_error_string)(-1));
  assert_non_null(F(const char* (*)(int), epf_cuda_error_string)(1 << 30));
}

static void c_epf_cuda_set_device(void) {
  assert_int_equal(F(epf_status_t(*)(int), epf_cuda_set_device)(-1), S_INVALID);
}
static void c_epf_cuda_get_device(void) {
  assert_int_equal(F(epf_status_t(*)(int*), epf_cuda_get_device)(NULL), S_INVALID);
}
static void c_epf_cuda_device_count(void) {
  assert_int_equal(F(epf_status_t(*)(int*), epf_cuda_device_count)(NULL), S_INVALID);
}
static void c_epf_cuda_malloc(void) {
  assert_int_equal(F(epf_status_t(*)(void**, size_t), epf_cuda_malloc)(NULL, 16), S_INVALID);
}
static void c_epf_cuda_free(void) { /* like free(NULL): nothing to do, no CUDA call */
  assert_int_equal(F(epf_status_t(*)(void*), epf_cuda_free)(NULL), EPF_OK);
}
static void c_epf_cuda_host_alloc_mapped(void) {
  epf_status_t (*f)(void**, void**, size_t) = F(epf_status_t(*)(void**, void**, size_t), epf_cuda_host_alloc_mapped);
  void *h = NULL, *d = NULL;
  assert_int_equal(f(NULL, NULL, 16), S_INVALID);
  assert_int_equal(f(&h, NULL, 16), S_INVALID);
  assert_int_equal(f(NULL, &d, 16), S_INVALID);
  assert_int_equal(f(&h, &d, 0), S_INVALID);
}
static void c_epf_cuda_free_host(void) {
  assert_int_equal(F(epf_status_t(*)(void*), epf_cuda_free_host)(NULL), EPF_OK);
}
static void c_epf_cuda_memset_async(void) {
  assert_int_equal(F(epf_status_t(*)(void*, int, size_t, void*), epf_cuda_memset_async)(NULL, 0, 16, NULL), S_INVALID);
}
static void c_epf_cuda_memcpy(void) {
  epf_status_t (*f)(void*, const void*, size_t) = F(epf_status_t(*)(void*, const void*, size_t), epf_cuda_memcpy);
  char b[16];
  assert_int_equal(f(NULL, NULL, 16), S_INVALID);
  assert_int_equal(f(b, NULL, 16), S_INVALID);
  assert_int_equal(f(NULL, b, 16), S_INVALID);
}
static void c_epf_cuda_memcpy_async(void) {
  epf_status_t (*f)(void*, const void*, size_t, void*) =
      F(epf_status_t(*)(void*, const void*, size_t, void*), epf_cuda_memcpy_async);
  char b[16];
  assert_int_equal(f(NULL, NULL, 16, NULL), S_INVALID);
  assert_int_equal(f(b, NULL, 16, NULL), S_INVALID);
}
static void c_epf_cuda_stream_synchronize(void) {
  /* NULL is the legacy default stream, a valid argument: EPF_OK with a GPU, EPF_ERR_CUDA without */
  const epf_status_t st = F(epf_status_t(*)(void*), epf_cuda_stream_synchronize)(NULL);
  assert_true(st == EPF_OK || st == EPF_ERR_CUDA);
}

/* ================================================================================================ */
/* host_nccl.h, core/nccl.cuh, capi.h (NCCL builds only)                                             */
/* ================================================================================================ */

#define NEED_NCCL()                                \
  do {                                             \
    if (!F(int (*)(void), epf_abi_has_nccl)()) skip(); \
  } while (0)

static void c_epf_nccl_status(void) {
  NEED_NCCL();
  assert_int_equal(F(epf_status_t(*)(int), epf_nccl_status)(0), EPF_OK);
  assert_int_equal(F(epf_status_t(*)(int), epf_nccl_status)(-1), EPF_ERR_NCCL);
}
static void c_epf_nccl_last_message(void) {
  NEED_NCCL();
  assert_non_null(F(const char* (*)(void*, int), epf_nccl_last_message)(NULL, 1));
  assert_non_null(F(const char* (*)(void*, int), epf_nccl_last_message)(NULL, -1));
}
static void c_epf_nccl_wait(void) {
  epf_status_t (*f)(void*, int, double);
  NEED_NCCL();
  f = F(epf_status_t(*)(void*, int, double), epf_nccl_wait);
  assert_int_equal(f(NULL, 0, 1.0), EPF_OK);
  assert_int_equal(f(NULL, 0, NAN), S_INVALID);
  assert_int_equal(f(NULL, 0, -1.0), S_INVALID);
}
static void c_epf_nccl_comm_init_rank(void) {
  epf_status_t (*f)(void**, int, unique_id_t, int, double);
  unique_id_t id;
  void* comm = (void*)1;
  NEED_NCCL();
  f = F(epf_status_t(*)(void**, int, unique_id_t, int, double), epf_nccl_comm_init_rank);
  memset(&id, 0, sizeof(id));
  assert_int_equal(f(NULL, 1, id, 0, 1.0), S_INVALID);
  assert_int_equal(f(&comm, 0, id, 0, 1.0), EPF_ERR_RANKS);
  assert_null(comm);
  assert_int_equal(f(&comm, 2, id, 2, 1.0), EPF_ERR_RANK);
  assert_int_equal(f(&comm, 2, id, -1, 1.0), EPF_ERR_RANK);
}
static void c_epf_nccl_comm_destroy(void) {
  NEED_NCCL();
  assert_int_equal(F(epf_status_t(*)(void*, double), epf_nccl_comm_destroy)(NULL, 1.0), EPF_OK);
}
static void c_epf_nccl_window_create(void) {
  epf_status_t (*f)(void*, size_t, double, void*);
  blob_t w;
  NEED_NCCL();
  f = F(epf_status_t(*)(void*, size_t, double, void*), epf_nccl_window_create);
  assert_int_equal(f(NULL, 16, 1.0, NULL), S_INVALID);
  assert_int_equal(f(NULL, 16, 1.0, &w), S_INVALID);
}
static void c_epf_nccl_window_destroy(void) {
  epf_status_t (*f)(void*, void*, double);
  struct {
    void* ptr;
    size_t bytes;
    void* window;
  } w = {NULL, 0, (void*)(uintptr_t)0x1000};
  NEED_NCCL();
  f = F(epf_status_t(*)(void*, void*, double), epf_nccl_window_destroy);
  assert_int_equal(f(NULL, NULL, 1.0), S_INVALID);
  assert_int_equal(f(NULL, &w, 1.0), S_INVALID); /* a registered window needs its communicator */
  assert_ptr_equal(w.window, (void*)(uintptr_t)0x1000);
}
static void c_epf_nccl_devcomm_create(void) {
  NEED_NCCL();
  assert_int_equal(F(epf_status_t(*)(void*, int, double, void*), epf_nccl_devcomm_create)(NULL, 0, 1.0, NULL), S_INVALID);
}
static void c_epf_nccl_devcomm_destroy(void) {
  NEED_NCCL();
  assert_int_equal(F(epf_status_t(*)(void*, const void*), epf_nccl_devcomm_destroy)(NULL, NULL), S_INVALID);
}
static void c_epf_nccl_team_query(void) {
  epf_status_t (*f)(const void*, void*, void*, team_t*);
  blob_t dev;
  team_t t;
  NEED_NCCL();
  f = F(epf_status_t(*)(const void*, void*, void*, team_t*), epf_nccl_team_query);
  memset(&dev, 0, sizeof(dev));
  assert_int_equal(f(NULL, NULL, NULL, NULL), S_INVALID);
  assert_int_equal(f(&dev, (void*)1, NULL, NULL), S_INVALID);
  assert_int_equal(f(&dev, NULL, NULL, &t), S_INVALID); /* no window: nothing to query */
}
static void c_epf_nccl_get_unique_id(void) {
  char b[128];
  NEED_NCCL();
  assert_int_equal(F(epf_status_t(*)(void*, size_t), epf_nccl_get_unique_id)(NULL, 128), S_INVALID);
  assert_int_equal(F(epf_status_t(*)(void*, size_t), epf_nccl_get_unique_id)(b, 0), S_INVALID);
}
static void c_epf_nccl_version(void) {
  NEED_NCCL();
  (void)F(int (*)(void), epf_nccl_version)();
}
/* the NCCL release rule: NULL or an empty buffer gets the status and nothing written; a runtime
 * version that could not be read (<= 0) is refused, never an index into anything */
static void c_epf_nccl_version_check(void) {
  epf_status_t (*f)(int, int, char*, size_t);
  char b[4] = {'x', 'x', 'x', 'x'};
  NEED_NCCL();
  f = F(epf_status_t(*)(int, int, char*, size_t), epf_nccl_version_check);
  assert_int_equal(f(22809, 22809, NULL, 100), EPF_OK);
  assert_int_equal(f(22809, 22803, NULL, 0), EPF_ERR_NOT_SUPPORTED);
  assert_int_equal(f(23007, 22809, NULL, 320), EPF_ERR_NOT_SUPPORTED);
  assert_int_equal(f(23007, 0, NULL, 320), EPF_ERR_NOT_SUPPORTED);
  assert_int_equal(f(23007, -1, b, 0), EPF_ERR_NOT_SUPPORTED);
  assert_int_equal(b[0], 'x'); /* n == 0: nothing written */
  assert_int_equal(f(-5, 22809, b, 1), EPF_ERR_NOT_SUPPORTED); /* a build code that is no release */
  assert_int_equal(b[0], '\0'); /* n == 1: only the terminator fits */
  assert_int_equal(b[1], 'x');
}
static void c_epf_nccl_build_version(void) {
  NEED_NCCL();
  assert_true(F(int (*)(void), epf_nccl_build_version)() >= 22800);
}
static void c_epf_nccl_runtime_check(void) {
  char b[2] = {'x', 'x'};
  epf_status_t st;
  NEED_NCCL();
  st = F(epf_status_t(*)(char*, size_t), epf_nccl_runtime_check)(NULL, 320);
  assert_true(st == EPF_OK || st == EPF_ERR_NOT_SUPPORTED);
  assert_int_equal(F(epf_status_t(*)(char*, size_t), epf_nccl_runtime_check)(b, 0), st);
  assert_int_equal(b[0], 'x');
}

/* ================================================================================================ */
/* the table: one case per export                                                                    */
/* ================================================================================================ */

typedef struct {
  const char* name;
  void (*run)(void);
  int nccl;        /* EPF_CAPI_NCCL in capi_api.def */
  int ll_launcher; /* ll/kernels.cuh launcher: group test_null_ll_launchers */
} null_case_t;

#define CASE(name) {#name, c_##name, 0, 0}
#define CASE_NCCL(name) {#name, c_##name, 1, 0}
#define CASE_LL(name) {#name, c_##name, 0, 1}

static const null_case_t cases[] = {
    /* host.h */
    CASE(epf_version), CASE(epf_status_name), CASE(epf_status_message), CASE(epf_config_resolve),
    CASE(epf_config_validate), CASE(epf_config_hash), CASE(epf_config_worst_case_rows), CASE(epf_payload_vector_width),
    CASE(epf_build_signature), CASE(epf_plan_compute), CASE(epf_plan_check), CASE(epf_plan_signal_offset),
    CASE(epf_plan_counts_offset), CASE(epf_plan_recv_token_offset), CASE(epf_plan_recv_scale_offset),
    CASE(epf_plan_recv_meta_offset), CASE(epf_plan_expert_out_offset), CASE(epf_plan_combine_offset),
    CASE(epf_plan_scales_staged), CASE(epf_plan_recv_scale_stage_offset),
    CASE(epf_region_name), CASE(epf_error_read), CASE(epf_error_clear), CASE(epf_route_layout_compute),
    CASE(epf_route_size), CASE(epf_route_header_init), CASE(epf_route_header_check), CASE(epf_route_ptr),
    CASE(epf_route_epoch_ptr), CASE(epf_route_array_name),
    /* core/team.cuh, core/signal.cuh */
    CASE(epf_team_affine), CASE(epf_team_virtual), CASE(epf_team_from_table), CASE(epf_wait_make),
    CASE(epf_cuda_last_error), CASE(epf_cuda_last_error_clear),
    /* route/kernels.cuh */
    CASE(epf_route_step_make), CASE(epf_route_blocks_per_rank), CASE(epf_route_init), CASE(epf_route_update),
    CASE(epf_route_create), CASE(epf_route_read_header), CASE(epf_route_import),
    /* ht/kernels.cuh */
    CASE(epf_ht_check), CASE(epf_ht_dispatch), CASE(epf_ht_expand), CASE(epf_ht_combine),
    CASE(epf_ht_combine_backward), CASE(epf_ht_dispatch_backward),
    /* ll/ll.cuh */
    CASE(epf_ll_plan_check), CASE(epf_ll_tokens_check), CASE(epf_ll_index_type_ok), CASE(epf_ll_rank_bytes),
    CASE(epf_ll_recv_row), CASE(epf_ll_packed_row), CASE(epf_ll_combine_row), CASE(epf_ll_dispatch_args_for_rank),
    CASE(epf_ll_combine_args_for_rank), CASE(epf_ll_payload_supported), CASE(epf_ll_combine_payload_supported),
    CASE(epf_ll_combine_pulls), CASE(epf_ll_state_init), CASE(epf_ll_backward_check), CASE(epf_ll_weight_grad_row),
    CASE(epf_ll_rm_fixed_row), CASE(epf_ll_rm_recv_row), CASE(epf_ll_rm_dispatch_signal_index),
    CASE(epf_ll_rm_count_offset), CASE(epf_ll_rm_combine_row),
    /* ll/kernels.cuh launchers */
    CASE_LL(epf_ll_launch_make), CASE_LL(epf_ll_blocks_per_rank), CASE_LL(epf_ll_dispatch), CASE_LL(epf_ll_combine),
    CASE_LL(epf_ll_state_reset), CASE_LL(epf_ll_mask_query_async), CASE_LL(epf_ll_mask_update),
    CASE_LL(epf_ll_mask_clean), CASE_LL(epf_ll_error_clear_async), CASE_LL(epf_ll_combine_backward),
    CASE_LL(epf_ll_dispatch_backward), CASE_LL(epf_ll_expand),
    /* capi.h */
    CASE(epf_abi_version), CASE(epf_abi_has_nccl), CASE(epf_abi_sizeof), CASE(epf_abi_type_count),
    CASE(epf_abi_type_name), CASE(epf_abi_constant), CASE(epf_config_init), CASE(epf_route_config_init),
    CASE(epf_wait_init), CASE(epf_route_step_init), CASE(epf_ht_step_init), CASE(epf_ll_dispatch_args_init),
    CASE(epf_ll_combine_args_init), CASE(epf_error_describe), CASE(epf_cuda_error_string), CASE(epf_cuda_set_device),
    CASE(epf_cuda_get_device), CASE(epf_cuda_device_count), CASE(epf_cuda_malloc), CASE(epf_cuda_free),
    CASE(epf_cuda_host_alloc_mapped), CASE(epf_cuda_free_host), CASE(epf_cuda_memset_async), CASE(epf_cuda_memcpy),
    CASE(epf_cuda_memcpy_async), CASE(epf_cuda_stream_synchronize),
    /* NCCL */
    CASE_NCCL(epf_nccl_status), CASE_NCCL(epf_nccl_last_message), CASE_NCCL(epf_nccl_wait),
    CASE_NCCL(epf_nccl_comm_init_rank), CASE_NCCL(epf_nccl_comm_destroy), CASE_NCCL(epf_nccl_window_create),
    CASE_NCCL(epf_nccl_window_destroy), CASE_NCCL(epf_nccl_devcomm_create), CASE_NCCL(epf_nccl_devcomm_destroy),
    CASE_NCCL(epf_nccl_team_query), CASE_NCCL(epf_nccl_get_unique_id), CASE_NCCL(epf_nccl_version),
    /* appended exports (issue #30) */
    CASE(epf_ll_buffer_bytes), CASE(epf_ht_step_init_sized),
    CASE_NCCL(epf_nccl_version_check), CASE_NCCL(epf_nccl_build_version), CASE_NCCL(epf_nccl_runtime_check),
    CASE(epf_route_check),
};
#define NUM_CASES (sizeof(cases) / sizeof(cases[0]))

static void run_case(void** state) {
  const null_case_t* c = (const null_case_t*)*state;
  c->run();
}

/* the mirrors passed by value above have the library's sizes */
static void test_mirrors(void** state) {
  (void)state;
  assert_int_equal(epf_abi_sizeof("epf_team_t"), sizeof(team_t));
  assert_int_equal(epf_abi_sizeof("epf_wait_t"), sizeof(wait_t));
  assert_int_equal(epf_abi_sizeof("epf_route_step_t"), sizeof(route_step_t));
  assert_true(epf_abi_sizeof("epf_ll_launch_t") <= sizeof(blob_t));
  assert_true(epf_abi_sizeof("epf_ll_dispatch_args_t") <= sizeof(blob_t));
  assert_true(epf_abi_sizeof("epf_ll_combine_args_t") <= sizeof(blob_t));
  assert_true(epf_abi_sizeof("epf_ht_step_t") <= sizeof(blob_t));
  if (epf_abi_has_nccl()) {
    assert_int_equal(epf_abi_sizeof("ncclUniqueId"), sizeof(unique_id_t));
    assert_true(epf_abi_sizeof("ncclDevComm_t") <= sizeof(blob_t));
  }
}

/* every exported name has a case, and every case names an export */
static void test_every_export_has_a_case(void** state) {
  FILE* f = fopen(EPF_CAPI_EXPORTS_FILE, "r");
  char line[256];
  int exported[NUM_CASES];
  int missing = 0, stale = 0, n = 0;
  size_t i;
  (void)state;
  if (f == NULL) fail_msg("cannot open %s", EPF_CAPI_EXPORTS_FILE);
  memset(exported, 0, sizeof(exported));
  while (fgets(line, sizeof(line), f) != NULL) {
    line[strcspn(line, "\r\n")] = '\0';
    if (line[0] == '\0') continue;
    ++n;
    for (i = 0; i < NUM_CASES; ++i)
      if (strcmp(cases[i].name, line) == 0) break;
    if (i == NUM_CASES) {
      printf("export without a NULL case: %s\n", line);
      ++missing;
    } else {
      exported[i] = 1;
    }
  }
  fclose(f);
  for (i = 0; i < NUM_CASES; ++i)
    if (!exported[i] && !(cases[i].nccl && !epf_abi_has_nccl())) {
      printf("case for a name the library does not export: %s\n", cases[i].name);
      ++stale;
    }
  printf("%d exports, %d cases\n", n, (int)NUM_CASES);
  assert_int_equal(missing, 0);
  assert_int_equal(stale, 0);
}

static struct CMUnitTest group_tests[NUM_CASES + 2];

static int run_group(const char* group, int ll_launchers) {
  size_t i, n = 0;
  if (!ll_launchers) {
    group_tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_mirrors);
    group_tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_every_export_has_a_case);
  }
  for (i = 0; i < NUM_CASES; ++i) {
    if (cases[i].ll_launcher != ll_launchers) continue;
    group_tests[n].name = cases[i].name;
    group_tests[n].test_func = run_case;
    group_tests[n].setup_func = NULL;
    group_tests[n].teardown_func = NULL;
    group_tests[n].initial_state = (void*)(uintptr_t)&cases[i];
    ++n;
  }
  return _cmocka_run_group_tests(group, group_tests, n, NULL, NULL);
}

/* test_null_ll_launchers — the launchers of ll/kernels.cuh with NULL (a separate group and ctest
 *   test: that header is changed elsewhere; epf_ll_launch_make and epf_ll_blocks_per_rank
 *   dereference their NULL argument until it is). */
static int test_null_ll_launchers(void) { return run_group("test_null_ll_launchers", 1); }

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "--ll-launchers") == 0) return test_null_ll_launchers();
  return run_group("test_capi_null", 0);
}
