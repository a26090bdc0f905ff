/* bench_match — what one warp's equality masks cost on the GPU: the route's ballot masks
 * (route/route.cuh epf__route_match: one vote per bit of the id), __match_any_sync (one MATCH
 * instruction per step) and shared-memory tags (epf__route_match_tags), for the route's batch of
 * EPF__ROUTE_STEPS 32-entry steps. A program, not a test: it decides which one the slot pass
 * uses (docs/dev/perf-log/route.md, v5).
 *
 *   ./bench_match [reps]   (default 200)
 *
 * Each warp of every block draws ids in [0, E) (E = 256: 8 bits; 1024: 10 bits), computes the
 * masks of all steps, and stamps clock64 around them (after a __syncwarp; the masks are stored,
 * so none is optimized away). Printed: the median over warps and launches of the cycles per
 * batch, with W warps per block and one block per SM (132 on the H200) — the route update's
 * shapes (T = 128: 8 warps; T = 4096: 14 warps per block). The methods' masks are compared on
 * the first launch of each shape (a mismatch exits 1).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#include "epf_bench.h"
#include "epfuse/route/route.cuh"

__global__ void match_kernel(int method, int nbits, uint32_t seed, uint32_t* out_masks, long long* out_cycles) {
  extern __shared__ int32_t smem[]; /* method 2: [W][2^nbits] tags, then [W][EPF__ROUTE_BATCH] words */
  const int lane = threadIdx.x & 31, warp = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  const int wib = (int)(threadIdx.x >> 5), W = (int)(blockDim.x >> 5);
  int v[EPF__ROUTE_STEPS];
  uint32_t m[EPF__ROUTE_STEPS];
  for (int u = 0; u < EPF__ROUTE_STEPS; ++u) {
    uint32_t x = seed ^ (uint32_t)(warp * 977 + u * 131 + lane * 7919);
    x *= 0x9e3779b1u;
    x ^= x >> 15;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    v[u] = (int)(x & ((1u << nbits) - 1u));
    if (u == EPF__ROUTE_STEPS - 1 && lane >= 16) v[u] = -1; /* a partial last step */
  }
  __syncwarp();
  const long long t0 = clock64();
  if (method == 0) {
    epf__route_match(v, nbits, m);
  } else if (method == 2) {
    epf__route_match_tags(v, smem + (wib << nbits), (uint32_t*)smem + (W << nbits) + wib * EPF__ROUTE_BATCH, m);
  } else {
#pragma unroll
    for (int u = 0; u < EPF__ROUTE_STEPS; ++u) m[u] = __match_any_sync(0xffffffffu, v[u]);
  }
  __syncwarp();
  const long long t1 = clock64();
  for (int u = 0; u < EPF__ROUTE_STEPS; ++u)
    out_masks[((int64_t)warp * EPF__ROUTE_STEPS + u) * 32 + lane] = v[u] >= 0 ? m[u] : 0u;
  if (lane == 0) out_cycles[warp] = t1 - t0;
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? atoi(argv[1]) : 200;
  int dev = 0, sms = 0;
  if (cudaGetDeviceCount(&dev) != cudaSuccess || dev == 0) {
    printf("bench_match: no GPU\n");
    return 77;
  }
  EPF_BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  /* the tags of 16 warps x 1024 experts pass the default 48 KiB of dynamic shared memory */
  EPF_BENCH_CUDA(cudaFuncSetAttribute(match_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 128 * 1024));
  printf("\n| ids | warps per block | blocks | ballots (epf__route_match) cycles | __match_any_sync cycles | smem tags (epf__route_match_tags) cycles |\n");
  printf("|-----|-----------------|--------|-----------------------------------|-------------------------|------------------------------------------|\n");
  const int bits_list[2] = {8, 10}, warps_list[3] = {8, 14, 16};
  for (int bi = 0; bi < 2; ++bi) {
    for (int wi = 0; wi < 3; ++wi) {
      const int nbits = bits_list[bi], W = warps_list[wi], nwarps = W * sms;
      uint32_t *d_m[3];
      long long* d_c;
      std::vector<uint32_t> h_m[3];
      std::vector<long long> h_c(nwarps);
      std::vector<double> med[3];
      const size_t smem = (size_t)W * (((size_t)1 << nbits) + EPF__ROUTE_BATCH) * 4;
      for (int k = 0; k < 3; ++k) {
        EPF_BENCH_CUDA(cudaMalloc(&d_m[k], (size_t)nwarps * EPF__ROUTE_STEPS * 32 * 4));
        h_m[k].resize((size_t)nwarps * EPF__ROUTE_STEPS * 32);
      }
      EPF_BENCH_CUDA(cudaMalloc(&d_c, (size_t)nwarps * 8));
      for (int r = 0; r < reps; ++r) {
        for (int k = 0; k < 3; ++k) {
          match_kernel<<<sms, 32 * W, k == 2 ? smem : 0>>>(k, nbits, 0x2545f491u * (uint32_t)(r + 1), d_m[k], d_c);
          EPF_BENCH_CUDA(cudaGetLastError());
          EPF_BENCH_CUDA(cudaMemcpy(h_c.data(), d_c, h_c.size() * 8, cudaMemcpyDeviceToHost));
          std::sort(h_c.begin(), h_c.end());
          med[k].push_back((double)h_c[h_c.size() / 2]);
          if (r == 0)
            EPF_BENCH_CUDA(cudaMemcpy(h_m[k].data(), d_m[k], h_m[k].size() * 4, cudaMemcpyDeviceToHost));
        }
        if (r == 0 && (h_m[0] != h_m[1] || h_m[0] != h_m[2])) {
          printf("bench_match: FAILED: the two methods' masks differ (ids of %d bits, %d warps)\n", nbits, W);
          return 1;
        }
      }
      for (int k = 0; k < 3; ++k) std::sort(med[k].begin(), med[k].end());
      printf("| %3d bits | %15d | %6d | %33.0f | %23.0f | %40.0f |\n", nbits, W, sms, med[0][med[0].size() / 2],
             med[1][med[1].size() / 2], med[2][med[2].size() / 2]);
      for (int k = 0; k < 3; ++k) EPF_BENCH_CUDA(cudaFree(d_m[k]));
      EPF_BENCH_CUDA(cudaFree(d_c));
    }
  }
  printf("\n(cycles: clock64 around one batch's masks in each warp, median over warps, then over %d launches)\n", reps);
  return 0;
}
