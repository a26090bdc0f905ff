/* test_mg_signal — the foundation over real NCCL on every visible GPU (at least 2; else exit 77,
 * reported "Not Run"): one thread per GPU, non-blocking communicator creation with a deadline,
 * symmetric windows, device communicators and host-side team views; then on the device: the setup
 * handshake (matching, then mismatched configs on one rank), 2,000 all-to-all ping-pong epochs of a
 * 512-byte payload per (source, destination) over NVLink, and the team barrier. Run with
 * NCCL_NVLS_ENABLE=0. */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "epf_cmocka.h"
#include "epf_test_gpu.h"
#include "epfuse/epfuse.cuh"
#include "epfuse/core/nccl.cuh"

#define MG_MAX 8

__host__ __device__ static inline uint32_t mg_mix(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  uint32_t h = a * 0x9e3779b1u ^ (b + 0x7f4a7c15u) * 0x85ebca6bu;
  h ^= (c + 0x165667b1u) * 0xc2b2ae35u;
  h ^= (d + 0x27d4eb2fu) * 0x27d4eb2du;
  h ^= h >> 15;
  return h * 0x2c1b3c6du;
}

/* one block, warp p talks to peer p (loop) */
__global__ void mg_kernel(epf_team_t team, epf_plan_t plan, uint32_t hs_epoch, int epochs, uint32_t salt,
                          epf_error_record_t* rec, int* out_status, uint32_t* out_errors) {
  const int lane = epf_lane_id(), warp = epf_warp_id(), nwarps = (int)(blockDim.x >> 5);
  const epf_wait_t w = epf_wait_make(plan.timeout_ns, rec, NULL, team.rank);
  __shared__ int first;
  epf_status_t st = epf_handshake_block(team, &plan, hs_epoch, w);
  if (threadIdx.x == 0) first = st;
  __syncthreads();
  if (st != EPF_OK || epochs == 0) {
    if (threadIdx.x == 0) *out_status = st;
    return;
  }
  for (int i = 0; i < epochs && first == EPF_OK; ++i) {
    const uint32_t e = (uint32_t)i + 1u;
    const int par = (int)(e & 1u);
    for (int p = warp; p < team.nranks; p += nwarps) {
      uint4* dst = (uint4*)epf_peer_ptr(team, epf_plan_recv_token_offset(&plan, par * team.nranks + team.rank), p);
      epf_st_v4_u32(dst + lane, make_uint4(mg_mix(e, team.rank, p, 4 * lane ^ salt), mg_mix(e, team.rank, p, 4 * lane + 1),
                                           mg_mix(e, team.rank, p, 4 * lane + 2), mg_mix(e, team.rank, p, 4 * lane + 3)));
      __syncwarp();
      if (lane == 0)
        epf_signal_set_sys((uint64_t*)epf_peer_ptr(team, epf_plan_signal_offset(&plan, EPF_REGION_SIG_DISPATCH, team.rank), p),
                           e, 0u);
    }
    for (int p = warp; p < team.nranks; p += nwarps) {
      int s = EPF_OK;
      if (lane == 0)
        s = epf_signal_wait_sys((const uint64_t*)epf_local_ptr(team, epf_plan_signal_offset(&plan, EPF_REGION_SIG_DISPATCH, p)),
                                e, w, p, NULL);
      s = __shfl_sync(0xffffffffu, s, 0);
      if (s != EPF_OK) {
        if (lane == 0) atomicCAS(&first, EPF_OK, s);
        continue;
      }
      const uint4 g = epf_ld_v4_u32((const uint4*)epf_local_ptr(team, epf_plan_recv_token_offset(&plan, par * team.nranks + p)) + lane);
      const uint32_t bad = (g.x != mg_mix(e, p, team.rank, 4 * lane ^ salt)) + (g.y != mg_mix(e, p, team.rank, 4 * lane + 1)) +
                           (g.z != mg_mix(e, p, team.rank, 4 * lane + 2)) + (g.w != mg_mix(e, p, team.rank, 4 * lane + 3));
      if (bad) atomicAdd(out_errors, bad);
    }
    __syncthreads();
  }
  st = (epf_status_t)first;
  if (st == EPF_OK) st = epf_barrier_block(team, &plan, 1u, w);
  if (threadIdx.x == 0) *out_status = st;
}

typedef struct {
  int rank, nranks;
  ncclUniqueId id;
  int status_match, status_mismatch;
  uint32_t errors;
  char msg[256];
} mg_arg_t;

static void* mg_thread(void* p) {
  mg_arg_t* a = (mg_arg_t*)p;
  ncclComm_t comm = NULL;
  ncclDevComm_t dev;
  epf_nccl_window_t win;
  epf_team_t team;
  epf_config_t cfg = EPF_CONFIG_INIT;
  epf_plan_t plan, bad_plan;
  epf_error_record_t *rec_h, *rec_d;
  int* d_status;
  uint32_t* d_err;
  epf_status_t st;
  a->status_match = a->status_mismatch = -1;
  cudaSetDevice(a->rank);
  cfg.nranks = a->nranks;
  cfg.num_experts = a->nranks;
  cfg.top_k = 1;
  cfg.hidden = 256;
  cfg.max_tokens_per_rank = 1;
  cfg.recv_capacity = 2 * a->nranks;
  cfg.timeout_ns = 5000000000ull;
  epf_plan_compute(&cfg, &plan);
  cfg.hidden = 512;
  epf_plan_compute(&cfg, &bad_plan);
  if ((st = epf_nccl_comm_init_rank(&comm, a->nranks, a->id, a->rank, 120.0)) != EPF_OK ||
      (st = epf_nccl_window_create(comm, bad_plan.total_bytes, 120.0, &win)) != EPF_OK ||
      (st = epf_nccl_devcomm_create(comm, 1, 120.0, &dev)) != EPF_OK ||
      (st = epf_nccl_team_query(&dev, win.window, 0, &team)) != EPF_OK) {
    snprintf(a->msg, sizeof(a->msg), "setup: %s (%s)", epf_status_name(st), epf_nccl_last_message(comm, ncclInternalError));
    return NULL;
  }
  cudaHostAlloc((void**)&rec_h, sizeof(*rec_h), cudaHostAllocMapped);
  cudaHostGetDevicePointer((void**)&rec_d, rec_h, 0);
  epf_error_clear(rec_h);
  cudaMalloc((void**)&d_status, sizeof(int));
  cudaMalloc((void**)&d_err, sizeof(uint32_t));
  cudaMemset(d_err, 0, sizeof(uint32_t));
  mg_kernel<<<1, 32 * (a->nranks < 4 ? a->nranks : 4)>>>(team, plan, 1u, 2000, 0x5eedu, rec_d, d_status, d_err);
  cudaDeviceSynchronize();
  cudaMemcpy(&a->status_match, d_status, sizeof(int), cudaMemcpyDeviceToHost);
  cudaMemcpy(&a->errors, d_err, sizeof(uint32_t), cudaMemcpyDeviceToHost);
  /* mismatch: the last rank uses another hidden size */
  mg_kernel<<<1, 64>>>(team, a->rank == a->nranks - 1 ? bad_plan : plan, 2u, 0, 0u, rec_d, d_status, d_err);
  if (cudaDeviceSynchronize() != cudaSuccess) snprintf(a->msg, sizeof(a->msg), "kernel failed");
  cudaMemcpy(&a->status_mismatch, d_status, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d_status);
  cudaFree(d_err);
  cudaFreeHost(rec_h);
  epf_nccl_devcomm_destroy(comm, &dev);
  epf_nccl_window_destroy(comm, &win, 120.0);
  epf_nccl_comm_destroy(comm, 120.0);
  return NULL;
}

static int g_ngpus;

static void test_mg_signal(void** state) {
  mg_arg_t args[MG_MAX];
  pthread_t th[MG_MAX];
  ncclUniqueId id;
  (void)state;
  assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
  for (int r = 0; r < g_ngpus; ++r) {
    memset(&args[r], 0, sizeof(args[r]));
    args[r].rank = r;
    args[r].nranks = g_ngpus;
    args[r].id = id;
    assert_int_equal(pthread_create(&th[r], NULL, mg_thread, &args[r]), 0);
  }
  for (int r = 0; r < g_ngpus; ++r) pthread_join(th[r], NULL);
  for (int r = 0; r < g_ngpus; ++r) {
    if (args[r].msg[0]) fail_msg("rank %d: %s", r, args[r].msg);
    assert_int_equal(args[r].status_match, EPF_OK);
    assert_int_equal(args[r].errors, 0);
    assert_int_equal(args[r].status_mismatch, EPF_ERR_CONFIG_MISMATCH);
  }
  printf("%d GPUs: handshake, 2000 ping-pong epochs, barrier OK; mismatch seen by all ranks\n", g_ngpus);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_mg_signal)};
  int rc = epf_test_gpus_or_skip(2);
  if (rc) return rc;
  cudaGetDeviceCount(&g_ngpus);
  if (g_ngpus > MG_MAX) g_ngpus = MG_MAX;
  return cmocka_run_group_tests(tests, NULL, NULL);
}
