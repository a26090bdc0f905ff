/* epf_test_gpu.h — shared helpers of the GPU test programs (not part of the library).
 *   EPF_CHECK_CUDA(call)       fail the current cmocka test on any CUDA error, with file:line
 *   EPF_CHECK_LAUNCH()         cudaGetLastError + cudaDeviceSynchronize after a launch
 *   epf_test_gpus_or_skip(n)   77 when fewer than n GPUs are usable (CTest: "Not Run"), else 0;
 *                              says "no CUDA driver / no GPU found" on a machine without either
 *   epf_test_seed()            fresh seed per run (time-based, or EPF_TEST_SEED), printed
 * Device memory that sizes itself to the card (cmocka programs):
 *   epf_test_fits(bytes, what) 1 if `bytes` fit in the free device memory with a margin; else it
 *                              prints "SKIP <what>: needs X GiB, Y GiB free" and returns 0
 *   EPF_TEST_MALLOC(&p, bytes) cudaMalloc that the running test owns: an out-of-memory failure
 *                              fails the test with the sizes (never a sticky error for the next)
 *   EPF_TEST_HOST_ALLOC(&p, bytes, flags)  the same for cudaHostAlloc
 *   EPF_TEST_FREE(p)           free one of them (device or pinned host)
 *   epf_test_teardown          a cmocka teardown (cmocka_unit_test_teardown(test, epf_test_teardown);
 *                              cmocka runs it after a failed test too): frees whatever the test
 *                              still owned and clears a pending CUDA error, so one failure cannot
 *                              poison the tests that follow
 */
#ifndef EPF_TEST_GPU_H
#define EPF_TEST_GPU_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <dlfcn.h>

#include <cuda_runtime.h>

#include "epf_rng.h"

#define EPF_CHECK_CUDA(call)                                                                  \
  do {                                                                                        \
    cudaError_t epf_e_ = (call);                                                              \
    if (epf_e_ != cudaSuccess)                                                                \
      fail_msg("%s:%d: %s -> %s (%s)", __FILE__, __LINE__, #call, cudaGetErrorName(epf_e_),   \
               cudaGetErrorString(epf_e_));                                                   \
  } while (0)

#define EPF_CHECK_LAUNCH()                   \
  do {                                       \
    EPF_CHECK_CUDA(cudaGetLastError());      \
    EPF_CHECK_CUDA(cudaDeviceSynchronize()); \
  } while (0)

/* 1 when cudaGetDeviceCount's error means the machine has no CUDA driver or no GPU at all: no
 * device, or an "insufficient driver" / stub library with no libcuda.so.1 to load (the runtime's
 * word for a missing driver); 0 for a libcuda.so.1 that loads but is too old, and other errors */
static inline int epf_test_no_driver_or_gpu(cudaError_t e) {
  void* h;
  if (e == cudaErrorNoDevice) return 1;
  if (e != cudaErrorInsufficientDriver && e != cudaErrorStubLibrary) return 0;
  h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h == NULL) return 1;
  dlclose(h);
  return e == cudaErrorStubLibrary;
}

static inline int epf_test_gpus_or_skip(int need) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n >= need) return 0;
  if (e != cudaSuccess && epf_test_no_driver_or_gpu(e))
    printf("SKIP: needs %d GPU(s): no CUDA driver / no GPU found (%s)\n", need, cudaGetErrorName(e));
  else if (e == cudaErrorInsufficientDriver)
    printf("SKIP: needs %d GPU(s): the CUDA driver is too old for this CUDA runtime (%s: %s)\n", need,
           cudaGetErrorName(e), cudaGetErrorString(e));
  else
    printf("SKIP: needs %d GPU(s), found %d (%s)\n", need, e == cudaSuccess ? n : 0,
           e == cudaSuccess ? "ok" : cudaGetErrorString(e));
  return 77;
}

/* ---- device memory that sizes itself to the card ---------------------------------------------- */

#define EPF_TEST_MARGIN_BYTES ((size_t)1 << 30) /* kept free for the CUDA context, kernels' locals, cuBLAS */

/* epf_test_fits — does a case that allocates `bytes` of device memory fit the card now? */
static inline int epf_test_fits(size_t bytes, const char* what) {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1; /* let the allocation say what is wrong */
  }
  if (bytes + EPF_TEST_MARGIN_BYTES <= free_b) return 1;
  printf("SKIP %s: needs %.2f GiB of device memory, %.2f GiB free of %.2f GiB on this card\n", what,
         (double)bytes / (1u << 30), (double)free_b / (1u << 30), (double)total_b / (1u << 30));
  return 0;
}

#if defined(fail_msg) /* the tracked allocations fail a cmocka test */
#define EPF_TEST_MAX_ALLOCS 512
static void* epf__test_alloc_ptr[EPF_TEST_MAX_ALLOCS];
static int epf__test_alloc_host[EPF_TEST_MAX_ALLOCS];
static int epf__test_nallocs;

static inline void epf__test_track(void* p, int host, const char* file, int line) {
  if (epf__test_nallocs == EPF_TEST_MAX_ALLOCS) {
    if (host) (void)cudaFreeHost(p);
    else (void)cudaFree(p);
    fail_msg("%s:%d: more than %d tracked allocations at once", file, line, EPF_TEST_MAX_ALLOCS);
  }
  epf__test_alloc_ptr[epf__test_nallocs] = p;
  epf__test_alloc_host[epf__test_nallocs] = host;
  ++epf__test_nallocs;
}

static inline void epf__test_alloc_failed(cudaError_t e, const char* call, size_t bytes, const char* file, int line) {
  size_t free_b = 0, total_b = 0;
  (void)cudaGetLastError(); /* an out-of-memory error is not sticky: keep it out of the next call */
  (void)cudaMemGetInfo(&free_b, &total_b);
  fail_msg("%s:%d: %s(%.3f GiB) -> %s (%.2f GiB free of %.2f GiB)", file, line, call, (double)bytes / (1u << 30),
           cudaGetErrorName(e), (double)free_b / (1u << 30), (double)total_b / (1u << 30));
}

static inline void epf__test_malloc(void** p, size_t bytes, const char* file, int line) {
  cudaError_t e;
  *p = NULL;
  e = cudaMalloc(p, bytes > 0 ? bytes : 16);
  if (e != cudaSuccess) epf__test_alloc_failed(e, "cudaMalloc", bytes, file, line);
  epf__test_track(*p, 0, file, line);
}

static inline void epf__test_host_alloc(void** p, size_t bytes, unsigned flags, const char* file, int line) {
  cudaError_t e;
  *p = NULL;
  e = cudaHostAlloc(p, bytes > 0 ? bytes : 16, flags);
  if (e != cudaSuccess) epf__test_alloc_failed(e, "cudaHostAlloc", bytes, file, line);
  epf__test_track(*p, 1, file, line);
}

static inline void epf__test_free(void* p, const char* file, int line) {
  int i;
  if (p == NULL) return;
  for (i = epf__test_nallocs - 1; i >= 0; --i)
    if (epf__test_alloc_ptr[i] == p) {
      const int host = epf__test_alloc_host[i];
      cudaError_t e;
      epf__test_alloc_ptr[i] = epf__test_alloc_ptr[epf__test_nallocs - 1];
      epf__test_alloc_host[i] = epf__test_alloc_host[epf__test_nallocs - 1];
      --epf__test_nallocs;
      e = host ? cudaFreeHost(p) : cudaFree(p);
      if (e != cudaSuccess) fail_msg("%s:%d: free -> %s", file, line, cudaGetErrorName(e));
      return;
    }
  fail_msg("%s:%d: EPF_TEST_FREE of a pointer the test does not own", file, line);
}

#define EPF_TEST_MALLOC(pp, bytes) epf__test_malloc((void**)(pp), (size_t)(bytes), __FILE__, __LINE__)
#define EPF_TEST_HOST_ALLOC(pp, bytes, flags) \
  epf__test_host_alloc((void**)(pp), (size_t)(bytes), (unsigned)(flags), __FILE__, __LINE__)
#define EPF_TEST_FREE(p) epf__test_free((void*)(p), __FILE__, __LINE__)

/* epf_test_teardown — free what the test still owns (it failed part-way, or forgot), after the
 * device finished with it; a test that faulted the device leaves a sticky error: say so. */
static inline int epf_test_teardown(void** state) {
  cudaError_t e = cudaDeviceSynchronize();
  (void)state;
  if (e != cudaSuccess) printf("teardown: the device reports %s\n", cudaGetErrorName(e));
  while (epf__test_nallocs > 0) {
    --epf__test_nallocs;
    if (epf__test_alloc_host[epf__test_nallocs]) (void)cudaFreeHost(epf__test_alloc_ptr[epf__test_nallocs]);
    else (void)cudaFree(epf__test_alloc_ptr[epf__test_nallocs]);
  }
  (void)cudaGetLastError();
  return 0;
}
#endif /* fail_msg */

static inline uint64_t epf_test_seed(void) {
  const char* s = getenv("EPF_TEST_SEED");
  uint64_t seed = s ? strtoull(s, NULL, 0) : ((uint64_t)time(NULL) * 2654435761ull) ^ (uint64_t)clock();
  printf("EPF_TEST_SEED=%llu\n", (unsigned long long)seed);
  return seed;
}

/* splitmix64 (epf_rng.h) */
static inline uint64_t epf_test_rand(uint64_t* s) { return epf_rng_next(s); }

#endif /* EPF_TEST_GPU_H */
