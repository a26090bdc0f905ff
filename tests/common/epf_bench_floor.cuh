/* epf_bench_floor.cuh — the latency floor of one LL stage on this GPU, for the benchmarks
 * (bench_ll prints it first; bench_zoo bounds its LL rows with it).
 *
 * Two captured CUDA graphs, each replayed back to back like a benchmarked stage (an event between
 * replays, median): an empty kernel of the grid, and one signal exchange among R virtual ranks —
 * every block sets one .sys signal in its counterpart block on every rank, then waits for the R
 * signals meant for it, as every LL receive half does. A stage of any LL implementation launches
 * a grid, moves its bytes, and then signals its receivers (the signal must follow the data), so
 * its time is at least the exchange's time plus its bytes at the copy ceiling. Per-block round
 * words keep the epochs growing across replays. */
#ifndef EPF_BENCH_FLOOR_CUH
#define EPF_BENCH_FLOOR_CUH

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "epf_bench.h"
#include "epfuse/core/signal.cuh"

static __global__ void epf_bench_floor_empty(int unused) { (void)unused; }

static __global__ void epf_bench_floor_signal(uint64_t* words, uint32_t* rounds, int R, int bpr,
                                              epf_error_record_t* rec) {
  const int rank = (int)blockIdx.x / bpr, b = (int)blockIdx.x % bpr;
  const uint32_t epoch = rounds[blockIdx.x] + 1u;
  const epf_wait_t w = epf_wait_make(0, rec, NULL, rank);
  __syncthreads(); /* every thread read the round before thread 0 advances it */
  for (int i = (int)threadIdx.x; i < R; i += (int)blockDim.x)
    epf_signal_set_sys(&words[((int64_t)i * R + rank) * bpr + b], epoch, 1u);
  for (int i = (int)threadIdx.x; i < R; i += (int)blockDim.x)
    (void)epf_signal_wait_sys(&words[((int64_t)rank * R + i) * bpr + b], epoch, w, i, NULL);
  __syncthreads();
  if (threadIdx.x == 0) rounds[blockIdx.x] = epoch;
}

/* median µs of one captured graph replayed `reps` times back to back (10 untimed first) */
static double epf_bench_graph_us(cudaGraphExec_t x, cudaStream_t s, int reps) {
  cudaEvent_t* ev = (cudaEvent_t*)malloc(sizeof(cudaEvent_t) * (size_t)(reps + 1));
  float* t = (float*)malloc(sizeof(float) * (size_t)reps);
  double us;
  for (int i = 0; i <= reps; ++i) EPF_BENCH_CUDA(cudaEventCreate(&ev[i]));
  for (int i = 0; i < 10; ++i) EPF_BENCH_CUDA(cudaGraphLaunch(x, s));
  EPF_BENCH_CUDA(cudaEventRecord(ev[0], s));
  for (int i = 0; i < reps; ++i) {
    EPF_BENCH_CUDA(cudaGraphLaunch(x, s));
    EPF_BENCH_CUDA(cudaEventRecord(ev[i + 1], s));
  }
  EPF_BENCH_CUDA(cudaStreamSynchronize(s));
  for (int i = 0; i < reps; ++i) EPF_BENCH_CUDA(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]));
  us = epf_bench_median(t, reps) * 1e3;
  for (int i = 0; i <= reps; ++i) EPF_BENCH_CUDA(cudaEventDestroy(ev[i]));
  free(ev);
  free(t);
  return us;
}

/* epf_bench_latency_floor — R ranks x bpr blocks of `threads`: *empty_us (an empty kernel) and
 * *signal_us (one signal exchange), medians of `reps` replays. Returns 0, or 1 when a wait of
 * the exchange failed (its time is then not a floor). */
static int epf_bench_latency_floor(int R, int bpr, int threads, int reps, double* empty_us, double* signal_us) {
  cudaStream_t s;
  cudaGraph_t g;
  cudaGraphExec_t xe, xs;
  uint64_t* words;
  uint32_t* rounds;
  epf_error_record_t* rec;
  int failed;
  EPF_BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  EPF_BENCH_CUDA(cudaMalloc(&words, sizeof(uint64_t) * (size_t)R * R * bpr));
  EPF_BENCH_CUDA(cudaMalloc(&rounds, sizeof(uint32_t) * (size_t)R * bpr));
  EPF_BENCH_CUDA(cudaMemset(words, 0, sizeof(uint64_t) * (size_t)R * R * bpr));
  EPF_BENCH_CUDA(cudaMemset(rounds, 0, sizeof(uint32_t) * (size_t)R * bpr));
  EPF_BENCH_CUDA(cudaMallocHost(&rec, sizeof(*rec)));
  memset(rec, 0, sizeof(*rec));
  EPF_BENCH_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  epf_bench_floor_empty<<<R * bpr, threads, 0, s>>>(0);
  EPF_BENCH_CUDA(cudaStreamEndCapture(s, &g));
  EPF_BENCH_CUDA(cudaGraphInstantiate(&xe, g, 0));
  EPF_BENCH_CUDA(cudaGraphDestroy(g));
  EPF_BENCH_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  epf_bench_floor_signal<<<R * bpr, threads, 0, s>>>(words, rounds, R, bpr, rec);
  EPF_BENCH_CUDA(cudaStreamEndCapture(s, &g));
  EPF_BENCH_CUDA(cudaGraphInstantiate(&xs, g, 0));
  EPF_BENCH_CUDA(cudaGraphDestroy(g));
  *empty_us = epf_bench_graph_us(xe, s, reps);
  *signal_us = epf_bench_graph_us(xs, s, reps);
  failed = rec->count != 0;
  EPF_BENCH_CUDA(cudaGraphExecDestroy(xe));
  EPF_BENCH_CUDA(cudaGraphExecDestroy(xs));
  EPF_BENCH_CUDA(cudaStreamDestroy(s));
  EPF_BENCH_CUDA(cudaFree(words));
  EPF_BENCH_CUDA(cudaFree(rounds));
  EPF_BENCH_CUDA(cudaFreeHost(rec));
  return failed;
}

#endif /* EPF_BENCH_FLOOR_CUH */
