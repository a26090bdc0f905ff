/* test_signal — core/signal.cuh and core/team.cuh on one GPU with virtual ranks:
 *   - all-to-all signal ping-pong among R in {1, 2, 4, 8} virtual ranks for 10,000 epochs with no
 *     reset, a warp's 512-byte payload per (epoch, source, destination) double-buffered by parity
 *     and checked word by word;
 *   - a rank that never signals: its peers return EPF_ERR_TIMEOUT within the deadline, the
 *     host reads the diagnostic from host-mapped memory while the kernel is still in flight
 *     (no device sync), with fault tolerance the late rank is masked and later waits skip it;
 *   - the setup handshake with matching configs (OK everywhere), mismatched configs and a
 *     mismatched team size (EPF_ERR_CONFIG_MISMATCH everywhere), then recovery at the next epoch;
 *   - the team barrier: 2 x 500 rounds of write-all / barrier / check-all / barrier;
 *   - the rank barrier (epf_rank_barrier_block): 5 ranks x 7 blocks, 200 launches, each block
 *     reading another block's words after it; a lost block makes only its rank time out.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "epf_cmocka.h"

#include "epf_test_gpu.h"
#include "epfuse/epfuse.cuh"

static uint64_t g_seed;

/* ---- helpers ---------------------------------------------------------------------------------- */

__host__ __device__ static inline uint32_t mix32(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  uint32_t h = a * 0x9e3779b1u ^ (b + 0x7f4a7c15u) * 0x85ebca6bu;
  h ^= (c + 0x165667b1u) * 0xc2b2ae35u;
  h ^= (d + 0x27d4eb2fu) * 0x27d4eb2du;
  h ^= h >> 15;
  h *= 0x2c1b3c6du;
  h ^= h >> 12;
  return h;
}

/* a small virtual-rank plan: hidden 256 BF16 = 512-byte rows, 2 * R rows (one per parity x source) */
static epf_plan_t small_plan(int nranks, int hidden, uint64_t timeout_ns) {
  epf_config_t c = EPF_CONFIG_INIT;
  epf_plan_t p;
  c.nranks = nranks;
  c.num_experts = nranks;
  c.top_k = 1;
  c.hidden = hidden;
  c.max_tokens_per_rank = 1;
  c.recv_capacity = 2 * nranks;
  c.timeout_ns = timeout_ns;
  assert_int_equal(epf_plan_compute(&c, &p), EPF_OK);
  return p;
}

typedef struct {
  char* window; /* nranks * plan.total_bytes, zeroed */
  epf_error_record_t* rec_host;
  epf_error_record_t* rec_dev;
  int* status;      /* [nranks] device */
  uint32_t* errors; /* [nranks] device */
  uint32_t* masks;  /* [nranks][EPF_MASK_WORDS] device */
} fixture_t;

static void fixture_init(fixture_t* f, int nranks, uint64_t bytes_per_rank) {
  EPF_TEST_MALLOC(&f->window, (size_t)nranks * bytes_per_rank);
  EPF_CHECK_CUDA(cudaMemset(f->window, 0, (size_t)nranks * bytes_per_rank));
  EPF_TEST_HOST_ALLOC(&f->rec_host, sizeof(epf_error_record_t), cudaHostAllocMapped);
  EPF_CHECK_CUDA(cudaHostGetDevicePointer(&f->rec_dev, f->rec_host, 0));
  epf_error_clear(f->rec_host);
  EPF_TEST_MALLOC(&f->status, nranks * sizeof(int));
  EPF_CHECK_CUDA(cudaMemset(f->status, 0xff, nranks * sizeof(int))); /* poison */
  EPF_TEST_MALLOC(&f->errors, nranks * sizeof(uint32_t));
  EPF_CHECK_CUDA(cudaMemset(f->errors, 0, nranks * sizeof(uint32_t)));
  EPF_TEST_MALLOC(&f->masks, nranks * EPF_MASK_WORDS * sizeof(uint32_t));
}

static void fixture_free(fixture_t* f) {
  EPF_TEST_FREE(f->window);
  EPF_TEST_FREE(f->rec_host);
  EPF_TEST_FREE(f->status);
  EPF_TEST_FREE(f->errors);
  EPF_TEST_FREE(f->masks);
}

static void read_ints(const void* dev, int* host, int n) {
  EPF_CHECK_CUDA(cudaMemcpy(host, dev, n * sizeof(int), cudaMemcpyDeviceToHost));
}

/* ---- ping-pong -------------------------------------------------------------------------------- */

/* One block per virtual rank. Each epoch, warp w sends to peers w, w + nwarps, ...: 32 lanes store
 * 16 bytes each into the peer's receive row [parity][rank], __syncwarp, lane 0 release-stores the
 * signal SIG_DISPATCH[rank] = (epoch, rank + 1). Then each warp waits for its peers' signals and
 * checks their rows. `silent` (>= 0) is a rank that never sends. `use_mask` turns on fault
 * tolerance (the per-rank mask in masks[rank]). status[rank] = first non-OK status seen. */
__global__ void pingpong_kernel(char* window, epf_plan_t plan, int nranks, int epochs, uint32_t epoch0,
                                uint32_t salt, int silent, int use_mask, uint64_t timeout_ns,
                                epf_error_record_t* rec, uint32_t* masks, int* status, uint32_t* errors) {
  const int rank = (int)blockIdx.x;
  const int lane = epf_lane_id(), warp = epf_warp_id(), nwarps = (int)(blockDim.x >> 5);
  const epf_team_t team = epf_team_virtual(window, plan.total_bytes, rank, nranks);
  epf_wait_t w = epf_wait_make(timeout_ns, rec, NULL, rank);
  __shared__ int first_status;
  if (use_mask) w.mask = masks + rank * EPF_MASK_WORDS;
  if (threadIdx.x == 0) first_status = EPF_OK;
  __syncthreads();
  if (rank == silent) {
    if (threadIdx.x == 0) status[rank] = EPF_OK;
    return;
  }
  for (int i = 0; i < epochs; ++i) {
    const uint32_t e = epoch0 + (uint32_t)i;
    const int par = (int)(e & 1u);
    for (int p = warp; p < nranks; p += nwarps) {
      uint4* dst = (uint4*)epf_peer_ptr(team, epf_plan_recv_token_offset(&plan, par * nranks + rank), p);
      uint4 v;
      v.x = mix32(e, (uint32_t)rank, (uint32_t)p, 4u * lane + 0u ^ salt);
      v.y = mix32(e, (uint32_t)rank, (uint32_t)p, 4u * lane + 1u ^ salt);
      v.z = mix32(e, (uint32_t)rank, (uint32_t)p, 4u * lane + 2u ^ salt);
      v.w = mix32(e, (uint32_t)rank, (uint32_t)p, 4u * lane + 3u ^ salt);
      epf_st_v4_u32(dst + lane, v);
      __syncwarp();
      if (lane == 0)
        epf_signal_set_sys((uint64_t*)epf_peer_ptr(team, epf_plan_signal_offset(&plan, EPF_REGION_SIG_DISPATCH, rank), p),
                           e, (uint32_t)rank + 1u);
    }
    for (int p = warp; p < nranks; p += nwarps) {
      int st = EPF_OK;
      uint32_t value = 0;
      if (lane == 0)
        st = epf_signal_wait_sys(
            (const uint64_t*)epf_local_ptr(team, epf_plan_signal_offset(&plan, EPF_REGION_SIG_DISPATCH, p)), e, w, p,
            &value);
      st = __shfl_sync(0xffffffffu, st, 0);
      value = __shfl_sync(0xffffffffu, value, 0);
      if (st != EPF_OK) {
        if (lane == 0) atomicCAS(&first_status, EPF_OK, st);
        continue; /* a masked or late peer sends nothing: skip its data */
      }
      const uint4 got = epf_ld_v4_u32((const uint4*)epf_local_ptr(team, epf_plan_recv_token_offset(&plan, par * nranks + p)) + lane);
      uint32_t bad = 0;
      bad += got.x != mix32(e, (uint32_t)p, (uint32_t)rank, 4u * lane + 0u ^ salt);
      bad += got.y != mix32(e, (uint32_t)p, (uint32_t)rank, 4u * lane + 1u ^ salt);
      bad += got.z != mix32(e, (uint32_t)p, (uint32_t)rank, 4u * lane + 2u ^ salt);
      bad += got.w != mix32(e, (uint32_t)p, (uint32_t)rank, 4u * lane + 3u ^ salt);
      if (lane == 0) bad += value != (uint32_t)p + 1u;
      if (bad) atomicAdd(&errors[rank], bad);
    }
    __syncthreads(); /* the next epoch's sends reuse this block's warps */
    if (first_status != EPF_OK) break;
  }
  if (threadIdx.x == 0) status[rank] = first_status;
}

static void launch_pingpong(fixture_t* f, const epf_plan_t* plan, int nranks, int threads, int epochs, uint32_t epoch0,
                            uint32_t salt, int silent, int use_mask, uint64_t timeout_ns) {
  assert_int_equal(epf_virtual_grid_check((const void*)pingpong_kernel, threads, 0, nranks, 0), EPF_OK);
  pingpong_kernel<<<nranks, threads>>>(f->window, *plan, nranks, epochs, epoch0, salt, silent, use_mask, timeout_ns,
                                       f->rec_dev, f->masks, f->status, f->errors);
  EPF_CHECK_CUDA(cudaGetLastError());
}

static void test_pingpong(void** state) {
  static const int ranks[] = {1, 2, 4, 8};
  (void)state;
  for (int ri = 0; ri < 4; ++ri) {
    const int R = ranks[ri];
    for (int threads = 32; threads <= 128; threads *= 4) { /* 1 warp (loops over peers) and 4 warps */
      const epf_plan_t plan = small_plan(R, 256, 5000000000ull);
      fixture_t f;
      int status[8];
      uint32_t errors[8];
      uint32_t salt = (uint32_t)epf_test_rand(&g_seed);
      fixture_init(&f, R, plan.total_bytes);
      /* two launches: epochs 1..5000 then 5001..10000 on the same window, nothing reset between */
      launch_pingpong(&f, &plan, R, threads, 5000, 1u, salt, -1, 0, plan.timeout_ns);
      EPF_CHECK_LAUNCH();
      launch_pingpong(&f, &plan, R, threads, 5000, 5001u, salt, -1, 0, plan.timeout_ns);
      EPF_CHECK_LAUNCH();
      read_ints(f.status, status, R);
      EPF_CHECK_CUDA(cudaMemcpy(errors, f.errors, R * sizeof(uint32_t), cudaMemcpyDeviceToHost));
      for (int r = 0; r < R; ++r) {
        if (status[r] != EPF_OK) fail_msg("R=%d threads=%d rank %d: %s", R, threads, r, epf_status_name((epf_status_t)status[r]));
        if (errors[r] != 0) fail_msg("R=%d threads=%d rank %d: %u corrupted words", R, threads, r, errors[r]);
      }
      assert_int_equal(f.rec_host->count, 0);
      printf("ping-pong R=%d threads=%d: 10000 epochs, %d x %d x 512 B checked per epoch, OK\n", R, threads, R, R);
      fixture_free(&f);
    }
  }
}

/* ---- timeout, diagnostic, active mask --------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  timespec_get(&ts, TIME_UTC);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_timeout_and_mask(void** state) {
  const int R = 4, silent = 2;
  const uint64_t timeout_ns = 50000000ull; /* 50 ms */
  const epf_plan_t plan = small_plan(R, 256, timeout_ns);
  fixture_t f;
  int status[4];
  uint32_t masks[4 * EPF_MASK_WORDS];
  epf_error_record_t rec;
  double t0, seen_at = -1.0, done_at;
  (void)state;
  fixture_init(&f, R, plan.total_bytes);
  for (int r = 0; r < R; ++r) epf_mask_init_all(masks + r * EPF_MASK_WORDS, R);
  EPF_CHECK_CUDA(cudaMemcpy(f.masks, masks, sizeof(masks), cudaMemcpyHostToDevice));

  /* 1. no mask: every live rank times out on the silent one */
  t0 = now_s();
  launch_pingpong(&f, &plan, R, 128, 1, 1u, 7u, silent, 0, timeout_ns);
  /* read the diagnostic from host-mapped memory while the launch is in flight: no device sync */
  while (now_s() - t0 < 20.0) {
    epf_error_read(f.rec_host, &rec);
    if (rec.valid) {
      seen_at = now_s() - t0;
      break;
    }
  }
  EPF_CHECK_LAUNCH();
  done_at = now_s() - t0;
  assert_true(seen_at >= 0.0);
  printf("timeout: diagnostic visible on the host after %.1f ms (no sync), kernel done after %.1f ms\n",
         seen_at * 1e3, done_at * 1e3);
  assert_true(done_at < 5.0); /* bounded: 50 ms deadline, generous slack for launch */
  read_ints(f.status, status, R);
  for (int r = 0; r < R; ++r) assert_int_equal(status[r], r == silent ? EPF_OK : EPF_ERR_TIMEOUT);
  epf_error_read(f.rec_host, &rec);
  assert_int_equal(rec.valid, 1);
  assert_int_equal(rec.status, EPF_ERR_TIMEOUT);
  assert_int_equal(rec.count, R - 1); /* each live rank's one wait on the silent rank */
  assert_int_equal(rec.peer, silent);
  assert_true(rec.waiter_rank >= 0 && rec.waiter_rank < R && rec.waiter_rank != silent);
  assert_int_equal(rec.waiter_block, rec.waiter_rank);
  assert_true(rec.wanted == 1);
  assert_true(rec.seen == 0);
  assert_true(rec.elapsed_ns >= timeout_ns);
  {
    const uint64_t off = epf_plan_signal_offset(&plan, EPF_REGION_SIG_DISPATCH, silent);
    const uint64_t want = (uint64_t)(uintptr_t)(f.window + (uint64_t)rec.waiter_rank * plan.total_bytes + off);
    assert_true(rec.address == want);
  }
  assert_int_equal(rec.masked_ranks, 0);

  /* 2. fault tolerance: the same at epoch 2 with masks -> the silent rank gets masked by all */
  epf_error_clear(f.rec_host);
  launch_pingpong(&f, &plan, R, 128, 1, 2u, 7u, silent, 1, timeout_ns);
  EPF_CHECK_LAUNCH();
  read_ints(f.status, status, R);
  for (int r = 0; r < R; ++r) assert_int_equal(status[r], r == silent ? EPF_OK : EPF_ERR_TIMEOUT);
  EPF_CHECK_CUDA(cudaMemcpy(masks, f.masks, sizeof(masks), cudaMemcpyDeviceToHost));
  for (int r = 0; r < R; ++r) {
    if (r == silent) continue;
    for (int p = 0; p < R; ++p) assert_int_equal((masks[r * EPF_MASK_WORDS] >> p) & 1u, p == silent ? 0u : 1u);
  }
  epf_error_read(f.rec_host, &rec);
  assert_int_equal(rec.masked_ranks, R - 1);

  /* 3. masked peers are skipped at once: 100 more epochs finish quickly, data from the others OK */
  epf_error_clear(f.rec_host);
  t0 = now_s();
  launch_pingpong(&f, &plan, R, 128, 1, 3u, 7u, silent, 1, timeout_ns);
  EPF_CHECK_LAUNCH();
  read_ints(f.status, status, R);
  for (int r = 0; r < R; ++r) assert_int_equal(status[r], r == silent ? EPF_OK : EPF_ERR_PEER_MASKED);
  {
    uint32_t errors[4];
    EPF_CHECK_CUDA(cudaMemcpy(errors, f.errors, sizeof(errors), cudaMemcpyDeviceToHost));
    for (int r = 0; r < R; ++r) assert_int_equal(errors[r], 0);
  }
  epf_error_read(f.rec_host, &rec);
  assert_int_equal(rec.count, 0); /* skipping a masked peer is not an error */
  assert_true(now_s() - t0 < 1.0);
  fixture_free(&f);
}

/* ---- handshake -------------------------------------------------------------------------------- */

__global__ void handshake_kernel(char* window, uint64_t stride, const epf_plan_t* plans, int nranks, uint32_t epoch,
                                 uint64_t timeout_ns, epf_error_record_t* rec, int* status) {
  const int rank = (int)blockIdx.x;
  const epf_team_t team = epf_team_virtual(window, stride, rank, nranks);
  const epf_plan_t plan = plans[rank];
  epf_status_t st = epf_handshake_block(team, &plan, epoch, epf_wait_make(timeout_ns, rec, NULL, rank));
  if (threadIdx.x == 0) status[rank] = st;
}

static void run_handshake(const epf_plan_t* plans, int R, uint64_t stride, char* window, uint32_t epoch,
                          fixture_t* f, int* status) {
  epf_plan_t* d_plans;
  EPF_TEST_MALLOC(&d_plans, R * sizeof(epf_plan_t));
  EPF_CHECK_CUDA(cudaMemcpy(d_plans, plans, R * sizeof(epf_plan_t), cudaMemcpyHostToDevice));
  EPF_CHECK_CUDA(cudaMemset(f->status, 0xff, R * sizeof(int)));
  assert_int_equal(epf_virtual_grid_check((const void*)handshake_kernel, 64, 0, R, 0), EPF_OK);
  handshake_kernel<<<R, 64>>>(window, stride, d_plans, R, epoch, 2000000000ull, f->rec_dev, f->status);
  EPF_CHECK_LAUNCH();
  read_ints(f->status, status, R);
  EPF_TEST_FREE(d_plans);
}

static void test_handshake(void** state) {
  static const int ranks[] = {1, 2, 4, 8};
  (void)state;
  for (int ri = 0; ri < 4; ++ri) {
    const int R = ranks[ri];
    epf_plan_t plans[8];
    int status[8];
    fixture_t f;
    uint64_t stride = 0;
    uint32_t epoch = 1;
    for (int r = 0; r < R; ++r) plans[r] = small_plan(R, 256, 1000000000ull);
    plans[R - 1] = small_plan(R, 264, 1000000000ull); /* for the mismatch case; stride covers both */
    for (int r = 0; r < R; ++r) stride = plans[r].total_bytes > stride ? plans[r].total_bytes : stride;
    fixture_init(&f, R, stride);

    /* matching configs */
    for (int r = 0; r < R; ++r) plans[r] = small_plan(R, 256, 1000000000ull);
    run_handshake(plans, R, stride, f.window, epoch++, &f, status);
    for (int r = 0; r < R; ++r) assert_int_equal(status[r], EPF_OK);
    assert_int_equal(f.rec_host->count, 0);

    if (R > 1) {
      /* one rank with another hidden size: everyone sees the mismatch */
      plans[R - 1] = small_plan(R, 264, 1000000000ull);
      run_handshake(plans, R, stride, f.window, epoch++, &f, status);
      for (int r = 0; r < R; ++r) assert_int_equal(status[r], EPF_ERR_CONFIG_MISMATCH);
      assert_int_equal(f.rec_host->status, EPF_ERR_CONFIG_MISMATCH);
      assert_int_equal(f.rec_host->count, R);
      epf_error_clear(f.rec_host);
      /* one rank configured for another team size (hash and nranks differ) */
      plans[R - 1] = small_plan(R * 2, 256, 1000000000ull);
      run_handshake(plans, R, stride, f.window, epoch++, &f, status);
      for (int r = 0; r < R; ++r) assert_int_equal(status[r], EPF_ERR_CONFIG_MISMATCH);
      epf_error_clear(f.rec_host);
    } else {
      /* a single rank whose plan says 2 ranks is refused locally */
      plans[0] = small_plan(2, 256, 1000000000ull);
      run_handshake(plans, R, stride, f.window, epoch++, &f, status);
      assert_int_equal(status[0], EPF_ERR_CONFIG_MISMATCH);
      epf_error_clear(f.rec_host);
    }
    /* agreement again at the next epoch: the handshake recovers without a reset */
    for (int r = 0; r < R; ++r) plans[r] = small_plan(R, 256, 1000000000ull);
    run_handshake(plans, R, stride, f.window, epoch++, &f, status);
    for (int r = 0; r < R; ++r) assert_int_equal(status[r], EPF_OK);
    printf("handshake R=%d: match OK, mismatch detected on all ranks, recovered\n", R);
    fixture_free(&f);
  }
}

/* ---- barrier ---------------------------------------------------------------------------------- */

__global__ void barrier_kernel(char* window, epf_plan_t plan, int nranks, int rounds, uint32_t salt,
                               epf_error_record_t* rec, int* status, uint32_t* errors) {
  const int rank = (int)blockIdx.x;
  const epf_team_t team = epf_team_virtual(window, plan.total_bytes, rank, nranks);
  const epf_wait_t w = epf_wait_make(plan.timeout_ns, rec, NULL, rank);
  epf_status_t st = EPF_OK;
  for (int i = 0; i < rounds && st == EPF_OK; ++i) {
    for (int p = (int)threadIdx.x; p < nranks; p += (int)blockDim.x) {
      uint32_t* slot = (uint32_t*)epf_peer_ptr(team, epf_plan_recv_token_offset(&plan, 0), p) + rank;
      *slot = mix32((uint32_t)i, (uint32_t)rank, (uint32_t)p, salt);
    }
    st = epf_barrier_block(team, &plan, 2u * (uint32_t)i + 1u, w);
    for (int p = (int)threadIdx.x; p < nranks; p += (int)blockDim.x) {
      const uint32_t* slot = (const uint32_t*)epf_local_ptr(team, epf_plan_recv_token_offset(&plan, 0)) + p;
      if (*slot != mix32((uint32_t)i, (uint32_t)p, (uint32_t)rank, salt)) atomicAdd(&errors[rank], 1u);
    }
    if (st == EPF_OK) st = epf_barrier_block(team, &plan, 2u * (uint32_t)i + 2u, w);
  }
  if (threadIdx.x == 0) status[rank] = st;
}

static void test_barrier(void** state) {
  static const int ranks[] = {1, 2, 4, 8};
  (void)state;
  for (int ri = 0; ri < 4; ++ri) {
    const int R = ranks[ri];
    const epf_plan_t plan = small_plan(R, 256, 2000000000ull);
    fixture_t f;
    int status[8];
    uint32_t errors[8];
    fixture_init(&f, R, plan.total_bytes);
    assert_int_equal(epf_virtual_grid_check((const void*)barrier_kernel, 64, 0, R, 0), EPF_OK);
    barrier_kernel<<<R, 64>>>(f.window, plan, R, 500, (uint32_t)epf_test_rand(&g_seed), f.rec_dev, f.status, f.errors);
    EPF_CHECK_LAUNCH();
    read_ints(f.status, status, R);
    EPF_CHECK_CUDA(cudaMemcpy(errors, f.errors, R * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    for (int r = 0; r < R; ++r) {
      assert_int_equal(status[r], EPF_OK);
      assert_int_equal(errors[r], 0);
    }
    fixture_free(&f);
  }
}

/* epf_rank_barrier_block: R ranks x B blocks in one launch, each block writes its words, meets
 * the rank's other blocks, and reads every word its rank's blocks wrote; 200 launches (rounds)
 * with increasing epochs on the same barrier words. A rank with a block that never arrives: its
 * other blocks time out (bounded), the other ranks pass. */
__global__ void rank_barrier_kernel(uint32_t* words, uint64_t* barrier, int blocks_per_rank, uint32_t epoch,
                                    uint32_t salt, int missing_rank, epf_error_record_t* rec, int* status,
                                    uint32_t* errors) {
  const int rank = (int)blockIdx.x / blocks_per_rank, b = (int)blockIdx.x % blocks_per_rank;
  const epf_wait_t w = epf_wait_make(200000000ull, rec, NULL, rank); /* 0.2 s */
  uint32_t* mine = words + (uint64_t)rank * blocks_per_rank * blockDim.x;
  if (rank == missing_rank && b == blocks_per_rank - 1) return; /* never arrives */
  mine[(uint64_t)b * blockDim.x + threadIdx.x] = mix32(epoch, (uint32_t)rank, (uint32_t)b * 1024u + threadIdx.x, salt);
  const epf_status_t st = epf_rank_barrier_block(barrier + rank, (uint32_t)blocks_per_rank, epoch, w);
  if (st == EPF_OK) {
    const int other = (b + 1) % blocks_per_rank; /* another block's words, written before its call */
    for (int i = (int)threadIdx.x; i < (int)blockDim.x; i += (int)blockDim.x)
      if (epf_ld_relaxed_gpu_u32(mine + (uint64_t)other * blockDim.x + i) !=
          mix32(epoch, (uint32_t)rank, (uint32_t)other * 1024u + i, salt))
        atomicAdd(&errors[rank], 1u);
  }
  if (threadIdx.x == 0) status[blockIdx.x] = st;
}

static void test_rank_barrier(void** state) {
  const int R = 5, B = 7, threads = 128;
  uint32_t *words, *errors;
  uint64_t* barrier;
  int* status;
  int h_status[R * B];
  uint32_t h_errors[R];
  epf_error_record_t *rec_h, *rec_d;
  (void)state;
  assert_int_equal(epf_virtual_grid_check((const void*)rank_barrier_kernel, threads, 0, R * B, 0), EPF_OK);
  EPF_TEST_MALLOC(&words, (size_t)R * B * threads * 4);
  EPF_TEST_MALLOC(&barrier, R * 8);
  EPF_TEST_MALLOC(&status, R * B * sizeof(int));
  EPF_TEST_MALLOC(&errors, R * 4);
  EPF_TEST_HOST_ALLOC(&rec_h, sizeof(*rec_h), cudaHostAllocMapped);
  EPF_CHECK_CUDA(cudaHostGetDevicePointer(&rec_d, rec_h, 0));
  epf_error_clear(rec_h);
  EPF_CHECK_CUDA(cudaMemset(barrier, 0, R * 8));
  EPF_CHECK_CUDA(cudaMemset(errors, 0, R * 4));
  for (uint32_t epoch = 1; epoch <= 200; ++epoch) {
    EPF_CHECK_CUDA(cudaMemset(words, 0xEE, (size_t)R * B * threads * 4)); /* poison */
    rank_barrier_kernel<<<R * B, threads>>>(words, barrier, B, epoch, (uint32_t)epf_test_rand(&g_seed), -1, rec_d,
                                            status, errors);
    EPF_CHECK_LAUNCH();
    read_ints(status, h_status, R * B);
    for (int i = 0; i < R * B; ++i) assert_int_equal(h_status[i], EPF_OK);
  }
  EPF_CHECK_CUDA(cudaMemcpy(h_errors, errors, sizeof(h_errors), cudaMemcpyDeviceToHost));
  for (int r = 0; r < R; ++r) assert_int_equal(h_errors[r], 0);
  assert_int_equal(rec_h->status, 0);
  /* rank 2 loses a block: its other blocks time out and say so; the other ranks are not held up */
  rank_barrier_kernel<<<R * B, threads>>>(words, barrier, B, 201u, 7u, 2, rec_d, status, errors);
  EPF_CHECK_LAUNCH();
  read_ints(status, h_status, R * B);
  for (int i = 0; i < R * B; ++i) {
    const int r = i / B, b = i % B;
    if (r == 2 && b == B - 1) continue; /* returned early, wrote nothing */
    assert_int_equal(h_status[i], r == 2 ? EPF_ERR_TIMEOUT : EPF_OK);
  }
  assert_int_equal(rec_h->status, EPF_ERR_TIMEOUT);
  EPF_TEST_FREE(words);
  EPF_TEST_FREE(barrier);
  EPF_TEST_FREE(status);
  EPF_TEST_FREE(errors);
  EPF_TEST_FREE(rec_h);
}

/* The virtual grid check refuses a grid that cannot be co-resident. */
static void test_co_residency(void** state) {
  int sms = 0;
  (void)state;
  EPF_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  assert_int_equal(epf_virtual_grid_check((const void*)pingpong_kernel, 1024, 0, sms * 64, 0), EPF_ERR_CO_RESIDENCY);
  assert_int_equal(epf_virtual_grid_check((const void*)pingpong_kernel, 256, 0, sms, 0), EPF_OK);
  assert_int_equal(epf_virtual_grid_check(NULL, 32, 0, 1, 0), EPF_ERR_INVALID_ARGUMENT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_pingpong, epf_test_teardown),  cmocka_unit_test_teardown(test_timeout_and_mask, epf_test_teardown),
      cmocka_unit_test_teardown(test_handshake, epf_test_teardown), cmocka_unit_test_teardown(test_barrier, epf_test_teardown),
      cmocka_unit_test_teardown(test_rank_barrier, epf_test_teardown), cmocka_unit_test_teardown(test_co_residency, epf_test_teardown),
  };
  int rc = epf_test_gpus_or_skip(1);
  if (rc) return rc;
  g_seed = epf_test_seed();
  return cmocka_run_group_tests(tests, NULL, NULL);
}
