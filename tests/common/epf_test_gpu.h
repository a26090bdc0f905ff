/* epf_test_gpu.h — shared helpers of the GPU test programs (not part of the library).
 *   EPF_CHECK_CUDA(call)       fail the current cmocka test on any CUDA error, with file:line
 *   EPF_CHECK_LAUNCH()         cudaGetLastError + cudaDeviceSynchronize after a launch
 *   epf_test_gpus_or_skip(n)   77 when fewer than n GPUs are usable (CTest: "Not Run"), else 0;
 *                              says "no CUDA driver / no GPU found" on a machine without either
 *   epf_test_seed()            fresh seed per run (time-based, or EPF_TEST_SEED), printed
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

static inline uint64_t epf_test_seed(void) {
  const char* s = getenv("EPF_TEST_SEED");
  uint64_t seed = s ? strtoull(s, NULL, 0) : ((uint64_t)time(NULL) * 2654435761ull) ^ (uint64_t)clock();
  printf("EPF_TEST_SEED=%llu\n", (unsigned long long)seed);
  return seed;
}

/* splitmix64 (epf_rng.h) */
static inline uint64_t epf_test_rand(uint64_t* s) { return epf_rng_next(s); }

#endif /* EPF_TEST_GPU_H */
