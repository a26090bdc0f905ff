/* test_nccl — a real 1-rank NCCL communicator: non-blocking init with a deadline, a symmetric
 * window sized by the plan, the device communicator, and on the device: the team view from the
 * window (rank, size, peer pointer == NCCL's LSA pointer == its local pointer), a round trip
 * through the window (device writes through the peer pointer, host reads the window memory;
 * host writes, device reads through the peer pointer), the setup handshake, the epfuse barrier
 * and NCCL's LSA barrier. Then teardown in order. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "epf_cmocka.h"

#include "epf_test_gpu.h"
#include "epfuse/epfuse.cuh"
#include "epfuse/core/nccl.cuh"

static uint64_t g_seed;

typedef struct {
  int rank, nranks;
  uint64_t peer_ptr, lsa_ptr, local_ptr;
  int handshake, barrier;
  uint32_t read_errors;
} probe_t;

#define WORDS 4096 /* 16 KiB each way */

__global__ void probe_kernel(ncclDevComm_t dev, ncclWindow_t win, epf_plan_t plan, uint32_t salt,
                             epf_error_record_t* rec, probe_t* out) {
  const epf_team_t team = epf_team_from_devcomm(&dev, win);
  const uint64_t off_out = epf_plan_recv_token_offset(&plan, 0);
  const uint64_t off_in = epf_plan_recv_token_offset(&plan, 1);
  const epf_wait_t w = epf_wait_make(plan.timeout_ns, rec, NULL, team.rank);
  epf_status_t st;
  if (threadIdx.x == 0) {
    out->rank = team.rank;
    out->nranks = team.nranks;
    out->peer_ptr = (uint64_t)(uintptr_t)epf_peer_ptr(team, off_out, 0);
    out->lsa_ptr = (uint64_t)(uintptr_t)ncclGetLsaPointer(win, off_out, 0);
    out->local_ptr = (uint64_t)(uintptr_t)ncclGetLocalPointer(win, off_out);
    out->read_errors = 0;
  }
  /* device -> window (through the peer pointer) */
  uint32_t* dst = (uint32_t*)epf_peer_ptr(team, off_out, team.rank);
  for (int i = (int)threadIdx.x; i < WORDS; i += (int)blockDim.x) dst[i] = (uint32_t)i * 2654435761u ^ salt;
  /* window -> device (the host wrote these before the launch) */
  const uint32_t* src = (const uint32_t*)epf_peer_ptr(team, off_in, team.rank);
  uint32_t bad = 0;
  for (int i = (int)threadIdx.x; i < WORDS; i += (int)blockDim.x) bad += src[i] != ((uint32_t)i ^ ~salt);
  if (bad) atomicAdd(&out->read_errors, bad);
  st = epf_handshake_block(team, &plan, 1u, w);
  if (threadIdx.x == 0) out->handshake = st;
  st = epf_barrier_block(team, &plan, 1u, w);
  if (threadIdx.x == 0) out->barrier = st;
  epf_lsa_barrier_sync_block(&dev, blockIdx.x);
}

static void test_one_rank_window(void** state) {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  ncclDevComm_t dev;
  epf_nccl_window_t win;
  epf_config_t cfg = EPF_CONFIG_INIT;
  epf_plan_t plan;
  epf_error_record_t *rec_host, *rec_dev;
  probe_t* d_probe;
  probe_t probe;
  uint32_t* host_words;
  const uint32_t salt = (uint32_t)epf_test_rand(&g_seed);
  epf_status_t st;
  (void)state;

  cfg.nranks = 1;
  cfg.num_experts = 8;
  cfg.top_k = 2;
  cfg.hidden = 2 * WORDS; /* BF16 rows of WORDS * 4 bytes */
  cfg.max_tokens_per_rank = 16;
  cfg.timeout_ns = 2000000000ull;
  assert_int_equal(epf_plan_compute(&cfg, &plan), EPF_OK);

  EPF_CHECK_CUDA(cudaSetDevice(0));
  assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
  st = epf_nccl_comm_init_rank(&comm, 1, id, 0, 60.0);
  if (st != EPF_OK) fail_msg("comm init: %s (%s)", epf_status_name(st), epf_nccl_last_message(comm, ncclInternalError));
  st = epf_nccl_window_create(comm, plan.total_bytes, 60.0, &win);
  if (st != EPF_OK) fail_msg("window: %s (%s)", epf_status_name(st), epf_nccl_last_message(comm, ncclInternalError));
  assert_non_null(win.ptr);
  assert_true(win.bytes == plan.total_bytes);
  st = epf_nccl_devcomm_create(comm, 1, 60.0, &dev);
  if (st != EPF_OK) fail_msg("devcomm: %s (%s)", epf_status_name(st), epf_nccl_last_message(comm, ncclInternalError));

  /* the window starts zeroed (epochs at 0) */
  host_words = (uint32_t*)malloc(WORDS * sizeof(uint32_t));
  EPF_CHECK_CUDA(cudaMemcpy(host_words, win.ptr, WORDS * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  for (int i = 0; i < WORDS; ++i) assert_int_equal(host_words[i], 0);
  /* host -> window, poison the device -> window area */
  for (int i = 0; i < WORDS; ++i) host_words[i] = (uint32_t)i ^ ~salt;
  EPF_CHECK_CUDA(cudaMemcpy((char*)win.ptr + epf_plan_recv_token_offset(&plan, 1), host_words, WORDS * 4,
                            cudaMemcpyHostToDevice));
  EPF_CHECK_CUDA(cudaMemset((char*)win.ptr + epf_plan_recv_token_offset(&plan, 0), 0xAB, WORDS * 4));

  EPF_TEST_HOST_ALLOC(&rec_host, sizeof(*rec_host), cudaHostAllocMapped);
  EPF_CHECK_CUDA(cudaHostGetDevicePointer(&rec_dev, rec_host, 0));
  epf_error_clear(rec_host);
  EPF_TEST_MALLOC(&d_probe, sizeof(probe_t));
  EPF_CHECK_CUDA(cudaMemset(d_probe, 0xff, sizeof(probe_t)));
  probe_kernel<<<1, 256>>>(dev, win.window, plan, salt, rec_dev, d_probe);
  EPF_CHECK_LAUNCH();
  EPF_CHECK_CUDA(cudaMemcpy(&probe, d_probe, sizeof(probe), cudaMemcpyDeviceToHost));

  assert_int_equal(probe.rank, 0);
  assert_int_equal(probe.nranks, 1);
  assert_true(probe.peer_ptr == probe.lsa_ptr);
  assert_true(probe.peer_ptr == probe.local_ptr);
  assert_int_equal(probe.read_errors, 0);
  assert_int_equal(probe.handshake, EPF_OK);
  assert_int_equal(probe.barrier, EPF_OK);
  assert_int_equal(rec_host->count, 0);
  EPF_CHECK_CUDA(cudaMemcpy(host_words, (char*)win.ptr + epf_plan_recv_token_offset(&plan, 0), WORDS * 4,
                            cudaMemcpyDeviceToHost));
  for (int i = 0; i < WORDS; ++i) assert_int_equal(host_words[i], (uint32_t)i * 2654435761u ^ salt);
  /* the host-side team view matches what the kernel built */
  {
    epf_team_t team;
    assert_int_equal(epf_nccl_team_query(&dev, win.window, 0, &team), EPF_OK);
    assert_int_equal(team.rank, 0);
    assert_int_equal(team.nranks, 1);
    assert_null(team.peers);
    assert_true((uint64_t)(uintptr_t)epf_peer_ptr(team, epf_plan_recv_token_offset(&plan, 0), 0) == probe.peer_ptr);
  }
  /* the handshake left this rank's hash in its own header */
  {
    epf_window_header_t hdr;
    EPF_CHECK_CUDA(cudaMemcpy(&hdr, win.ptr, sizeof(hdr), cudaMemcpyDeviceToHost));
    assert_true(hdr.peer_hash[0] == plan.config_hash);
    assert_int_equal(hdr.peer_epoch[0], 1);
  }
  printf("1-rank NCCL window: team view, peer pointer == LSA pointer, %d-word round trip, handshake, barriers OK\n",
         WORDS);

  free(host_words);
  EPF_TEST_FREE(d_probe);
  EPF_TEST_FREE(rec_host);
  assert_int_equal(epf_nccl_devcomm_destroy(comm, &dev), EPF_OK);
  assert_int_equal(epf_nccl_window_destroy(comm, &win, 60.0), EPF_OK);
  assert_null(win.ptr);
  assert_int_equal(epf_nccl_comm_destroy(comm, 60.0), EPF_OK);
}

/* Bad arguments are refused with a status, never a crash. */
static void test_bad_arguments(void** state) {
  ncclUniqueId id;
  ncclComm_t comm = (ncclComm_t)0x1;
  epf_nccl_window_t win;
  (void)state;
  memset(&id, 0, sizeof(id));
  assert_int_equal(epf_nccl_comm_init_rank(NULL, 1, id, 0, 1.0), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_nccl_comm_init_rank(&comm, 0, id, 0, 1.0), EPF_ERR_RANKS);
  assert_null(comm);
  assert_int_equal(epf_nccl_comm_init_rank(&comm, 2, id, 2, 1.0), EPF_ERR_RANK);
  assert_int_equal(epf_nccl_window_create(NULL, 64, 1.0, &win), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_nccl_window_destroy(NULL, NULL, 1.0), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_nccl_status(ncclSuccess), EPF_OK);
  assert_int_equal(epf_nccl_status(ncclInvalidUsage), EPF_ERR_NCCL);
  assert_non_null(epf_nccl_last_message(NULL, ncclInvalidUsage));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_bad_arguments, epf_test_teardown),
      cmocka_unit_test_teardown(test_one_rank_window, epf_test_teardown),
  };
  int rc = epf_test_gpus_or_skip(1);
  if (rc) return rc;
  g_seed = epf_test_seed();
  return cmocka_run_group_tests(tests, NULL, NULL);
}
