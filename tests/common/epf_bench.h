/* epf_bench.h — shared helpers of the benchmark programs (not part of the library):
 *   EPF_BENCH_CUDA(call)     exit(1) with file:line and the CUDA error on failure
 *   EPF_BENCH_OK(call)       exit(1) with file:line and the epf_status_t name on failure
 *   epf_bench_splitmix(s)    splitmix64 step of the state *s (reproducible inputs)
 *   epf_bench_median(v, n)   median of n floats (sorts v in place)
 */
#ifndef EPF_BENCH_H
#define EPF_BENCH_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#include "epf_rng.h"

#include "epfuse/host.h"

#define EPF_BENCH_CUDA(call)                                                                   \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) {                                                                   \
      fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

#define EPF_BENCH_OK(call)                                                                     \
  do {                                                                                         \
    epf_status_t s_ = (call);                                                                  \
    if (s_ != EPF_OK) {                                                                        \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, epf_status_name(s_), \
              epf_status_message(s_));                                                         \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

static inline uint64_t epf_bench_splitmix(uint64_t* s) { return epf_rng_next(s); } /* epf_rng.h */

static inline int epf_bench_cmp_f(const void* a, const void* b) {
  const float x = *(const float*)a, y = *(const float*)b;
  return x < y ? -1 : x > y;
}

static inline float epf_bench_median(float* v, int n) {
  qsort(v, (size_t)n, sizeof(float), epf_bench_cmp_f);
  return v[n / 2];
}

#endif /* EPF_BENCH_H */
