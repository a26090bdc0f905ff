/* bench_route — route update latency (route/kernels.cuh) on one GPU, and the count-exchange round
 * trip among 8 virtual ranks. A program, not a test.
 *
 *   ./bench_route [reps]          (default 2000)
 *   ./bench_route --profile R T   30 full updates of R virtual ranks x T tokens, for a profiler
 *
 * Rows printed (median of `reps` launches, each bracketed by CUDA events, and the per-update time
 * of a CUDA graph of 100 back-to-back updates, which removes launch gaps):
 *   - full update (count + slots + count exchange + wait + offsets), 1 rank (virtual team of one),
 *     T = 4096 and T = 128, E = 256, K = 8, int64 ids, blocks per rank swept;
 *   - local-only update (no exchange: DeepEP get_dispatch_layout's job plus slots);
 *   - full update with 8 virtual ranks (T per rank as above);
 *   - the count exchange alone among 8 virtual ranks: one kernel, one block per rank, N rounds of
 *     publish (E + R counts into every peer, release signal) + wait for every peer, per round;
 *   - the launch floor: an empty kernel with the update's grid, block size and shared memory
 *     (event and graph), so the update's own time is the difference;
 *   - a phase breakdown: the update's phases, route/route.cuh's public blocks composed here as
 *     epf_route_update_block composes them, with a __syncthreads + clock64 stamp between them;
 *     the median over launches of the slowest block's time per phase (and block 0's), in us.
 *     Coarser than a profile: one stamp per phase, nothing inside a phase (the library has no
 *     probe hooks). It times the PUBLIC composition: for 2 or 3 blocks and <= 2304 entries the
 *     ready-made kernel uses the SPLIT arrangement (epf_route_update_split_block) instead, so those rows are not the
 *     kernel's (its whole time is in the first table).
 * Targets (issue #4): T = 4096 <= 10 us, T = 128 <= 5 us (PyTorch eager ~500 us:
 * scripts/bench_route_torch.py prints the baseline at the same shapes).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "epf_bench.h"
#include "epfuse/epfuse.cuh"
#include "epfuse/route/kernels.cuh"
#include "epfuse/route/route.cuh"


static uint64_t g_rng = 0x1234567ull;

struct Setup {
  epf_plan_t plan;
  epf_route_t route;
  char* window;
  void* route_buf;
  int64_t* topk;
  epf_error_record_t* rec;
  int R, T;
};

static void setup(Setup& s, int R, int E, int K, int T, uint32_t flags) {
  epf_config_t c = EPF_CONFIG_INIT;
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  uint64_t bytes;
  c.nranks = R;
  c.num_experts = E;
  c.top_k = K;
  c.hidden = 7168;
  c.max_tokens_per_rank = T;
  EPF_BENCH_OK(epf_plan_compute(&c, &s.plan));
  rc.index_type = EPF_INDEX_INT64;
  rc.flags = flags;
  rc.max_blocks = 32;
  EPF_BENCH_OK(epf_route_size(&s.plan, &rc, &bytes));
  /* the window: only the signal / count regions matter here, but allocate the whole plan */
  EPF_BENCH_CUDA(cudaMalloc(&s.window, (size_t)R * s.plan.total_bytes));
  EPF_BENCH_CUDA(cudaMemset(s.window, 0, (size_t)R * s.plan.total_bytes));
  EPF_BENCH_CUDA(cudaMalloc(&s.route_buf, (size_t)R * bytes));
  EPF_BENCH_CUDA(cudaMalloc(&s.topk, (size_t)R * T * K * 8));
  EPF_BENCH_CUDA(cudaMalloc(&s.rec, sizeof(epf_error_record_t)));
  EPF_BENCH_CUDA(cudaMemset(s.rec, 0, sizeof(epf_error_record_t)));
  EPF_BENCH_OK(epf_route_init(&s.plan, &rc, s.route_buf, (uint64_t)R * bytes, R, 0u, 0, &s.route));
  { /* DeepSeek-like routing: K distinct experts per token, uniform */
    std::vector<int64_t> h((size_t)R * T * K);
    for (size_t t = 0; t < (size_t)R * T; ++t)
      for (int k = 0; k < K; ++k) {
        int64_t e;
        bool dup;
        do {
          e = (int64_t)(epf_bench_splitmix(&g_rng) % (uint64_t)E);
          dup = false;
          for (int q = 0; q < k; ++q) dup |= h[t * K + q] == e;
        } while (dup);
        h[t * K + k] = e;
      }
    EPF_BENCH_CUDA(cudaMemcpy(s.topk, h.data(), h.size() * 8, cudaMemcpyHostToDevice));
  }
  s.R = R;
  s.T = T;
  EPF_BENCH_CUDA(cudaDeviceSynchronize());
}

static void teardown(Setup& s) {
  EPF_BENCH_CUDA(cudaFree(s.window));
  EPF_BENCH_CUDA(cudaFree(s.route_buf));
  EPF_BENCH_CUDA(cudaFree(s.topk));
  EPF_BENCH_CUDA(cudaFree(s.rec));
}

static double median(std::vector<float>& v) { return v.empty() ? 0.0 : (double)epf_bench_median(v.data(), (int)v.size()); }

/* time_launches — `enqueue(st)` puts one launch on the stream st: 50 warm-up launches, then the
 * median of `reps` launches each bracketed by CUDA events (*out_event_us), and the per-launch time
 * inside a CUDA graph of 100 launches, median of 20 replays (*out_graph_us). */
template <typename F>
static void time_launches(F enqueue, int reps, double* out_event_us, double* out_graph_us) {
  cudaStream_t st;
  cudaEvent_t a, b;
  cudaGraph_t g;
  cudaGraphExec_t ge;
  std::vector<float> ms;
  EPF_BENCH_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  EPF_BENCH_CUDA(cudaEventCreate(&a));
  EPF_BENCH_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 50; ++i) enqueue(st);
  EPF_BENCH_CUDA(cudaGetLastError());
  EPF_BENCH_CUDA(cudaStreamSynchronize(st));
  for (int i = 0; i < reps; ++i) {
    float t;
    EPF_BENCH_CUDA(cudaEventRecord(a, st));
    enqueue(st);
    EPF_BENCH_CUDA(cudaEventRecord(b, st));
    EPF_BENCH_CUDA(cudaEventSynchronize(b));
    EPF_BENCH_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  *out_event_us = median(ms) * 1e3;
  EPF_BENCH_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < 100; ++i) enqueue(st);
  EPF_BENCH_CUDA(cudaStreamEndCapture(st, &g));
  EPF_BENCH_CUDA(cudaGraphInstantiate(&ge, g, 0));
  EPF_BENCH_CUDA(cudaGraphLaunch(ge, st));
  EPF_BENCH_CUDA(cudaStreamSynchronize(st));
  ms.clear();
  for (int i = 0; i < 20; ++i) {
    float t;
    EPF_BENCH_CUDA(cudaEventRecord(a, st));
    EPF_BENCH_CUDA(cudaGraphLaunch(ge, st));
    EPF_BENCH_CUDA(cudaEventRecord(b, st));
    EPF_BENCH_CUDA(cudaEventSynchronize(b));
    EPF_BENCH_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t / 100.0f);
  }
  *out_graph_us = median(ms) * 1e3;
  EPF_BENCH_CUDA(cudaGraphExecDestroy(ge));
  EPF_BENCH_CUDA(cudaGraphDestroy(g));
  EPF_BENCH_CUDA(cudaEventDestroy(a));
  EPF_BENCH_CUDA(cudaEventDestroy(b));
  EPF_BENCH_CUDA(cudaStreamDestroy(st));
}

/* one route update per launch: {median per-launch us, graph per-update us}; exits on a device error */
static void time_update(Setup& s, int B, int reps, double* out_event_us, double* out_graph_us) {
  const epf_team_t team = epf_team_virtual(s.window, s.plan.total_bytes, 0, s.R);
  epf_route_step_t step = epf_route_step_make(s.topk, s.T, epf_wait_make(s.plan.timeout_ns, s.rec, NULL, 0));
  step.blocks_per_rank = B;
  time_launches([&](cudaStream_t st) { EPF_BENCH_OK(epf_route_update(&s.route, team, &s.plan, &step, st)); }, reps,
                out_event_us, out_graph_us);
  {
    epf_error_record_t rec;
    EPF_BENCH_CUDA(cudaMemcpy(&rec, s.rec, sizeof(rec), cudaMemcpyDeviceToHost));
    if (rec.count != 0) {
      fprintf(stderr, "device reported %u errors (first: %s)\n", rec.count, epf_status_name((epf_status_t)rec.status));
      exit(1);
    }
  }
}

/* The count exchange alone: block r plays rank r; `rounds` rounds of publish + wait. */
__global__ void exchange_kernel(epf_route_t route, epf_team_t team, epf_plan_t plan, int rounds, uint32_t epoch0,
                                epf_error_record_t* rec, int* status) {
  extern __shared__ uint4 smem[];
  const epf_team_t me = epf_team_for_block(team, 1, 1);
  epf_route_ctx_t c = epf_route_ctx_make(&route, me.rank, me.rank, NULL, 0, 0, 1, NULL, smem);
  const epf_wait_t w = epf_wait_make(plan.timeout_ns, rec, NULL, me.rank);
  epf_status_t st = EPF_OK;
  for (int x = (int)threadIdx.x; x <= c.num_experts + c.nranks; x += (int)blockDim.x) c.tot[x] = x + me.rank;
  __syncthreads();
  for (int i = 0; i < rounds && st == EPF_OK; ++i) {
    c.epoch = epoch0 + (uint32_t)i;
    epf_route_publish_block(&c, me, &plan);
    st = epf_route_wait_counts_block(&c, me, &plan, w);
  }
  if (threadIdx.x == 0) status[me.rank] = st;
}

static double time_exchange(int R, int E, int rounds) {
  Setup s;
  int* d_status;
  cudaEvent_t a, b;
  float ms;
  std::vector<int> status(R);
  setup(s, R, E, 8, 128, 0u);
  const int threads = 256;
  const size_t smem = epf_route_smem_bytes(&s.route.layout, threads);
  EPF_BENCH_OK(epf_virtual_grid_check((const void*)exchange_kernel, threads, smem, R, 0));
  EPF_BENCH_CUDA(cudaMalloc(&d_status, R * sizeof(int)));
  EPF_BENCH_CUDA(cudaEventCreate(&a));
  EPF_BENCH_CUDA(cudaEventCreate(&b));
  const epf_team_t team = epf_team_virtual(s.window, s.plan.total_bytes, 0, R);
  exchange_kernel<<<R, threads, smem>>>(s.route, team, s.plan, 100, 1u, s.rec, d_status); /* warm-up */
  EPF_BENCH_CUDA(cudaEventRecord(a));
  exchange_kernel<<<R, threads, smem>>>(s.route, team, s.plan, rounds, 101u, s.rec, d_status);
  EPF_BENCH_CUDA(cudaEventRecord(b));
  EPF_BENCH_CUDA(cudaEventSynchronize(b));
  EPF_BENCH_CUDA(cudaGetLastError());
  EPF_BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
  EPF_BENCH_CUDA(cudaMemcpy(status.data(), d_status, R * sizeof(int), cudaMemcpyDeviceToHost));
  for (int r = 0; r < R; ++r)
    if (status[r] != EPF_OK) {
      fprintf(stderr, "exchange: rank %d %s\n", r, epf_status_name((epf_status_t)status[r]));
      exit(1);
    }
  EPF_BENCH_CUDA(cudaFree(d_status));
  EPF_BENCH_CUDA(cudaEventDestroy(a));
  EPF_BENCH_CUDA(cudaEventDestroy(b));
  teardown(s);
  return (double)ms * 1e3 / rounds;
}

/* ---- launch floor: an empty kernel with the update's launch shape ------------------------------ */

__global__ void __launch_bounds__(EPF_ROUTE_BLOCK_THREADS) empty_kernel(int* never) {
  if (never != NULL && threadIdx.x == 0) *never = 1; /* never taken: keeps the kernel from being elided */
}

static void time_empty(int grid, int threads, size_t smem, int reps, double* out_event_us, double* out_graph_us) {
  time_launches([&](cudaStream_t st) { empty_kernel<<<grid, threads, smem, st>>>(NULL); }, reps, out_event_us,
                out_graph_us);
}

/* ---- phase breakdown ------------------------------------------------------------------------------ */

enum { PH_START = 0, PH_CTX, PH_COUNT, PH_MERGE, PH_PUBLISH, PH_SLOTS, PH_OFFSETS, PH_FINISH, PH_N };
static const char* const ph_name[PH_N] = {"start", "ctx", "count", "merge", "publish", "slots", "offsets+wait", "finish"};

/* epf_route_update_block's phases in its order, composed from route/route.cuh's public blocks, with a
 * clock64 stamp after each (one extra __syncthreads per phase). `iters` updates in one launch (epochs e0 + i; block 0 stores the epoch
 * word at each finish, the others count it themselves); stamps of the LAST one, so iters = 2
 * shows the update with warm instruction caches. stamps: [grid][PH_N]. Virtual ranks only. */
__global__ void __launch_bounds__(EPF_ROUTE_BLOCK_THREADS, 1) phase_kernel(epf_route_t route, epf_team_t team, epf_plan_t plan,
                                                                        const int64_t* topk, int T, int B, int iters,
                                                                        epf_error_record_t* rec, long long* stamps) {
  extern __shared__ uint4 smem[];
  const epf_team_t me = epf_team_for_block(team, 1, B);
  const int index = (int)me.rank, bi = (int)(blockIdx.x % (unsigned)B);
  const int64_t* ids = topk + (int64_t)index * route.layout.max_tokens * route.layout.top_k;
  epf_wait_t w = epf_wait_make(plan.timeout_ns, rec, NULL, me.rank);
  long long* st = stamps + (int64_t)blockIdx.x * PH_N;
  const uint32_t e0 = *epf_route_epoch_ptr(&route, index) + 1u;
  for (int it = 0; it < iters; ++it) {
    epf_status_t s = EPF_OK;
#define PHASE_STAMP(i)                    \
  do {                                    \
    __syncthreads();                      \
    if (threadIdx.x == 0) st[i] = clock64(); \
  } while (0)
    PHASE_STAMP(PH_START);
    epf_route_ctx_t c = epf_route_ctx_make(&route, index, me.rank, ids, T, bi, B, NULL, smem);
    c.epoch = e0 + (uint32_t)it;
    PHASE_STAMP(PH_CTX);
    epf_route_count_block(&c);
    PHASE_STAMP(PH_COUNT);
    s = epf_route_merge_block(&c, w);
    PHASE_STAMP(PH_MERGE);
    if (s == EPF_OK && c.exchange) epf_route_publish_block(&c, me, &plan);
    PHASE_STAMP(PH_PUBLISH);
    if (s == EPF_OK) epf_route_slots_block(&c);
    PHASE_STAMP(PH_SLOTS);
    if (s == EPF_OK && c.exchange && bi == 0) s = epf_route_offsets_block(&c, me, &plan, w); /* block 0 */
    PHASE_STAMP(PH_OFFSETS);
    c.status = s;
    epf_route_finish_block(&c, s);
    PHASE_STAMP(PH_FINISH);
#undef PHASE_STAMP
  }
}

static void phase_breakdown(Setup& s, int B, int threads, int iters, int launches, double clock_khz) {
  const int grid = B * s.route.count;
  const size_t smem = epf_route_smem_bytes(&s.route.layout, threads);
  const epf_team_t team = epf_team_virtual(s.window, s.plan.total_bytes, 0, s.R);
  long long* d_st;
  std::vector<long long> h((size_t)launches * grid * PH_N);
  std::vector<float> worst[PH_N], b0[PH_N], total;
  EPF_BENCH_CUDA(cudaMalloc(&d_st, h.size() * sizeof(long long)));
  for (int i = 0; i < 20; ++i) /* warm-up, same epochs as below would be reused: keep counting up */
    phase_kernel<<<grid, threads, smem>>>(s.route, team, s.plan, s.topk, s.T, B, iters, s.rec, d_st);
  for (int i = 0; i < launches; ++i)
    phase_kernel<<<grid, threads, smem>>>(s.route, team, s.plan, s.topk, s.T, B, iters, s.rec, d_st + (size_t)i * grid * PH_N);
  EPF_BENCH_CUDA(cudaGetLastError());
  EPF_BENCH_CUDA(cudaDeviceSynchronize());
  EPF_BENCH_CUDA(cudaMemcpy(h.data(), d_st, h.size() * sizeof(long long), cudaMemcpyDeviceToHost));
  for (int i = 0; i < launches; ++i) {
    float tmax = 0.f;
    for (int p = 1; p < PH_N; ++p) {
      float m = 0.f;
      for (int g = 0; g < grid; ++g) {
        const long long* x = &h[((size_t)i * grid + g) * PH_N];
        const float us = (float)((double)(x[p] - x[p - 1]) / clock_khz * 1e3);
        if (us > m) m = us;
        if (g == 0) b0[p].push_back(us);
      }
      worst[p].push_back(m);
    }
    for (int g = 0; g < grid; ++g) {
      const long long* x = &h[((size_t)i * grid + g) * PH_N];
      const float us = (float)((double)(x[PH_FINISH] - x[PH_START]) / clock_khz * 1e3);
      if (us > tmax) tmax = us;
    }
    total.push_back(tmax);
  }
  printf("| %5d | %6d | %6d | %7d | %5s |", s.R, s.T, B, threads, iters > 1 ? "warm" : "cold");
  for (int p = 1; p < PH_N; ++p) printf(" %5.2f / %5.2f |", median(worst[p]), median(b0[p]));
  printf(" %6.2f |\n", median(total));
  {
    epf_error_record_t rec;
    EPF_BENCH_CUDA(cudaMemcpy(&rec, s.rec, sizeof(rec), cudaMemcpyDeviceToHost));
    if (rec.count != 0) {
      fprintf(stderr, "phase kernel: device reported %u errors (first: %s)\n", rec.count, epf_status_name((epf_status_t)rec.status));
      exit(1);
    }
  }
  EPF_BENCH_CUDA(cudaFree(d_st));
}

/* --profile R T: 30 updates (default blocks, full update) and nothing else, for a profiler
 * (ncu --kernel-name epf__route_update_kernel --launch-skip 20 --launch-count 1) */
static int profile_only(int R, int T) {
  Setup s;
  setup(s, R, 256, 8, T, 0u);
  const epf_team_t team = epf_team_virtual(s.window, s.plan.total_bytes, 0, s.R);
  epf_route_step_t step = epf_route_step_make(s.topk, s.T, epf_wait_make(s.plan.timeout_ns, s.rec, NULL, 0));
  for (int i = 0; i < 30; ++i) EPF_BENCH_OK(epf_route_update(&s.route, team, &s.plan, &step, 0));
  EPF_BENCH_CUDA(cudaDeviceSynchronize());
  printf("bench_route --profile: R = %d, T = %d, %d blocks per rank x %d threads, 30 updates\n", R, T,
         epf_route_blocks_per_rank(&s.route, T), epf_route_update_threads(&s.route, T, epf_route_blocks_per_rank(&s.route, T)));
  teardown(s);
  return 0;
}

int main(int argc, char** argv) {
  const int reps = argc > 1 && strcmp(argv[1], "--profile") != 0 ? atoi(argv[1]) : 2000;
  int ndev = 0;
  cudaDeviceProp prop;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    printf("bench_route: no GPU\n");
    return 77;
  }
  if (argc > 3 && strcmp(argv[1], "--profile") == 0) return profile_only(atoi(argv[2]), atoi(argv[3]));
  EPF_BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  printf("bench_route on %s (%d SMs), median of %d launches; graph = per update in a graph of 100\n", prop.name,
         prop.multiProcessorCount, reps);
  printf("E = 256, K = 8, int64 topk_idx, uniform routing (8 distinct experts per token)\n\n");
  printf("| case                                   | ranks | T/rank | blocks/rank | threads | event us | graph us |\n");
  printf("|----------------------------------------|-------|--------|-------------|---------|----------|----------|\n");
  struct { const char* name; int R, T; uint32_t flags; } cases[] = {
      {"full update (exchange + offsets)", 1, 4096, 0u},
      {"full update (exchange + offsets)", 1, 128, 0u},
      {"local only (layout + slots)", 1, 4096, EPF_ROUTE_FLAG_LOCAL_ONLY},
      {"local only (layout + slots)", 1, 128, EPF_ROUTE_FLAG_LOCAL_ONLY},
      {"full update, 8 virtual ranks", 8, 4096, 0u},
      {"full update, 8 virtual ranks", 8, 128, 0u},
  };
  static const int blocks[] = {0, 1, 4, 8, 12, 14, 16, 20, 32};
  for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ++ci) {
    Setup s;
    setup(s, cases[ci].R, 256, 8, cases[ci].T, cases[ci].flags);
    for (size_t bi = 0; bi < sizeof(blocks) / sizeof(blocks[0]); ++bi) {
      const int B = blocks[bi] != 0 ? blocks[bi] : epf_route_blocks_per_rank(&s.route, s.T);
      double ev, gr;
      if (blocks[bi] > 1 && (int64_t)s.T * 8 / B < 1024) continue; /* fewer than 1024 entries a block */
      if ((int64_t)B * s.route.count > s.route.resident_blocks) continue;
      time_update(s, B, reps, &ev, &gr);
      printf("| %-38s | %5d | %6d | %8d%s | %7d | %8.2f | %8.2f |\n", cases[ci].name, s.R, s.T, B,
             blocks[bi] == 0 ? "(d)" : "   ", epf_route_update_threads(&s.route, s.T, B), ev, gr);
    }
    teardown(s);
  }
  printf("\n(d) = the launcher's default blocks per rank (epf_route_blocks_per_rank)\n\n");
  printf("| count exchange round trip (publish E + R counts to every peer, signal, wait all) | ranks | us/round |\n");
  printf("|------------------------------------------------------------------------------------|-------|----------|\n");
  for (int R = 2; R <= 8; R *= 2)
    printf("| one block per virtual rank, E = 256, 10000 rounds in one kernel                    | %5d | %8.2f |\n", R,
           time_exchange(R, 256, 10000));

  printf("\n| launch floor: empty kernel, the update's launch shape | grid | threads | smem B | event us | graph us |\n");
  printf("|-------------------------------------------------------|------|---------|--------|----------|----------|\n");
  {
    Setup s;
    setup(s, 1, 256, 8, 128, 0u);
    const int threads = epf_route_block_threads(&s.route.layout);
    const size_t smem = epf_route_smem_bytes(&s.route.layout, threads);
    static const int grids[] = {1, 16, 128};
    for (size_t gi = 0; gi < sizeof(grids) / sizeof(grids[0]); ++gi) {
      double ev, gr;
      time_empty(grids[gi], threads, smem, reps, &ev, &gr);
      printf("| %-53s | %4d | %7d | %6zu | %8.2f | %8.2f |\n", "empty kernel", grids[gi], threads, smem, ev, gr);
    }
    teardown(s);
  }

  printf("\nphase breakdown (clock64 per block, a __syncthreads + stamp after each phase; median of 200 launches;\n"
         "slowest block / block 0, us; total = slowest block start..finish; E = 256, K = 8, full update;\n"
         "cold = one update per launch, warm = the second of two updates in one launch)\n"
         "route/route.cuh's public blocks composed as epf_route_update_block does: one stamp per phase, nothing\n"
         "inside a phase; with 2 or 3 blocks and <= 2304 entries the ready-made kernel uses a private\n"
         "arrangement (SPLIT) instead, so those rows time the public composition, not the kernel\n\n");
  printf("| ranks | T/rank | blocks | threads | icache |");
  for (int p = 1; p < PH_N; ++p) printf(" %-13s |", ph_name[p]);
  printf(" total  |\n|-------|--------|--------|---------|--------|");
  for (int p = 1; p < PH_N; ++p) printf("---------------|");
  printf("--------|\n");
  {
    int clock_khz = 0;
    EPF_BENCH_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    /* threads 0 = what the launcher picks (epf_route_update_threads) */
    struct { int R, T, B, threads; } pc[] = {{1, 4096, 17, 0}, {1, 4096, 16, 0}, {1, 128, 1, 0}, {1, 128, 2, 0},
                                             {1, 128, 3, 0}, {8, 4096, 16, 0}, {8, 128, 3, 0}};
    for (size_t i = 0; i < sizeof(pc) / sizeof(pc[0]); ++i) {
      Setup s;
      setup(s, pc[i].R, 256, 8, pc[i].T, 0u);
      if ((int64_t)pc[i].B * s.route.count <= s.route.resident_blocks && pc[i].B <= s.route.layout.max_blocks)
        for (int iters = 1; iters <= 2; ++iters)
          phase_breakdown(s, pc[i].B, pc[i].threads != 0 ? pc[i].threads : epf_route_update_threads(&s.route, s.T, pc[i].B), iters,
                          200, (double)clock_khz);
      teardown(s);
    }
  }
  return 0;
}
/* SPDX-License-Identifier: Apache-2.0 */
