/* epf_bench.h — shared helpers of the benchmark programs (not part of the library):
 *   EPF_BENCH_CUDA(call)     exit(1) with file:line and the CUDA error on failure
 *   EPF_BENCH_OK(call)       exit(1) with file:line and the epf_status_t name on failure
 *   epf_bench_splitmix(s)    splitmix64 step of the state *s (reproducible inputs)
 *   epf_bench_median(v, n)   median of n floats (sorts v in place)
 *   epf_bench_parse_ints(s, out, max)    "1,128,256" -> ints; count, or -1 on a bad list
 *   epf_bench_topk_distinct(s, n, K, E, w_mode, topk, w)
 *                            n tokens of K distinct uniform experts in [0, E) (host; K <= E),
 *                            weights random in [0, 1) (w_mode 0) or 1/K (w_mode 1)
 *   epf_bench_fill_bf16      (CUDA) kernel: BF16 values with |x| in [2^-8, 2), hashed from the index
 *   epf_bench_copy_ceiling_gbs(bytes, reps)  (CUDA) median cudaMemcpyAsync D2D of `bytes` over reps
 *                            (after 3 warm-ups), GB/s with read + write counted
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

/* "1,128,256" -> out[0..n); returns n, or -1 when an entry is not a positive integer or there
 * are more than max of them. */
static inline int epf_bench_parse_ints(const char* s, int* out, int max) {
  int n = 0;
  while (*s) {
    char* end;
    const long v = strtol(s, &end, 10);
    if (end == s || v <= 0 || v > 1 << 30 || n == max || (*end != ',' && *end != '\0')) return -1;
    out[n++] = (int)v;
    s = *end == ',' ? end + 1 : end;
  }
  return n;
}

/* n tokens, K distinct experts each, uniform in [0, E) (K <= E); topk[n * K], w[n * K] (w may be
 * NULL). w_mode 0: weights (r % 1000) / 1000; 1: 1 / K. Host; reproducible from *s. */
static inline void epf_bench_topk_distinct(uint64_t* s, int64_t n, int K, int E, int w_mode, int32_t* topk,
                                           float* w) {
  int64_t i;
  for (i = 0; i < n; ++i) {
    int k;
    for (k = 0; k < K; ++k) {
      int e, dup, j;
      do {
        e = (int)(epf_bench_splitmix(s) % (uint64_t)E);
        dup = 0;
        for (j = 0; j < k; ++j) dup |= topk[i * K + j] == e;
      } while (dup && K <= E);
      topk[i * K + k] = e;
      if (w != NULL) w[i * K + k] = w_mode == 1 ? 1.0f / (float)K : (float)(epf_bench_splitmix(s) % 1000) / 1000.f;
    }
  }
}

#ifdef __CUDACC__
/* BF16 values with |x| in [2^-8, 2) and random signs, hashed from the index and seed. */
static __global__ void epf_bench_fill_bf16(uint16_t* p, size_t n, uint32_t seed) {
  size_t i;
  for (i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    p[i] = (uint16_t)(0x3c00u + (h & 0x7ffu) - 0x400u) | (uint16_t)((h >> 16) & 0x8000u);
  }
}

/* The device-to-device copy ceiling: median of `reps` timed cudaMemcpyAsync of `bytes` (after 3
 * untimed), in GB/s counting the read and the write. Allocates and frees its two buffers. */
static inline double epf_bench_copy_ceiling_gbs(size_t bytes, int reps) {
  void *a, *b;
  cudaEvent_t e0, e1;
  float* t = (float*)malloc(sizeof(float) * (size_t)(reps > 0 ? reps : 1));
  double gbs;
  int i;
  if (reps < 1) reps = 1;
  EPF_BENCH_CUDA(cudaMalloc(&a, bytes));
  EPF_BENCH_CUDA(cudaMalloc(&b, bytes));
  EPF_BENCH_CUDA(cudaMemset(a, 1, bytes));
  EPF_BENCH_CUDA(cudaEventCreate(&e0));
  EPF_BENCH_CUDA(cudaEventCreate(&e1));
  for (i = -3; i < reps; ++i) {
    EPF_BENCH_CUDA(cudaEventRecord(e0, 0));
    EPF_BENCH_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
    EPF_BENCH_CUDA(cudaEventRecord(e1, 0));
    EPF_BENCH_CUDA(cudaEventSynchronize(e1));
    if (i >= 0) EPF_BENCH_CUDA(cudaEventElapsedTime(&t[i], e0, e1));
  }
  gbs = 2.0 * (double)bytes / (epf_bench_median(t, reps) * 1e-3) / 1e9;
  EPF_BENCH_CUDA(cudaFree(a));
  EPF_BENCH_CUDA(cudaFree(b));
  EPF_BENCH_CUDA(cudaEventDestroy(e0));
  EPF_BENCH_CUDA(cudaEventDestroy(e1));
  free(t);
  return gbs;
}
#endif /* __CUDACC__ */

#endif /* EPF_BENCH_H */
