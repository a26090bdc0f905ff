/* epf_mg.h — one thread per GPU over real NCCL, for the multi-GPU tests and benchmarks (not part
 * of the library). Each thread owns one rank: communicator (non-blocking init with a deadline),
 * one symmetric window, the device communicator, the host-side team view and a host-mapped error
 * record.
 *
 *   int n = epf_mg_gpus(2);                 // GPUs to use, or 77 (CTest "Not Run") when fewer than
 *                                           // need; EPF_MG_GPUS=k uses k (k >= 1: a 1-rank NCCL
 *                                           // team is a smoke run on one GPU), at most EPF_MG_MAX
 *   ncclUniqueId id;  ncclGetUniqueId(&id);
 *   // thread r (epf_mg_run starts them, thread r on GPU r):
 *   epf_mg_rank_t m;
 *   if (epf_mg_rank_open(&m, r, n, id, plan.total_bytes) != EPF_OK) { ... m.msg ... }
 *   ... kernels with m.team (epf_nccl_team_query over m.dev and m.win), m.rec_d ...
 *   epf_mg_rank_close(&m);
 *
 * NCCL_NVLS_ENABLE=0 is set by epf_mg_gpus (no NVLink multicast: KINDS.md). */
#ifndef EPF_MG_H
#define EPF_MG_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "epfuse/host_nccl.h"
#include "epfuse/core/nccl.cuh"

#define EPF_MG_MAX 8
#define EPF_MG_TIMEOUT_S 120.0

typedef struct epf_mg_rank {
  int rank, nranks;
  ncclComm_t comm;
  ncclDevComm_t dev;
  epf_nccl_window_t win;
  epf_team_t team;
  epf_error_record_t* rec_h; /* host-mapped */
  epf_error_record_t* rec_d; /* its device address */
  int open_steps;            /* what epf_mg_rank_close has to undo */
  char msg[256];             /* first failure, for the test's report */
} epf_mg_rank_t;

/* GPUs to use: all visible (at most EPF_MG_MAX), or EPF_MG_GPUS; 77 when fewer than `need`
 * (EPF_MG_GPUS lowers `need` to what it asks for, so a 1-GPU smoke run is possible). */
static inline int epf_mg_gpus(int need) {
  int n = 0;
  const char* want = getenv("EPF_MG_GPUS");
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  if (n > EPF_MG_MAX) n = EPF_MG_MAX;
  if (want != NULL && atoi(want) >= 1) {
    const int k = atoi(want);
    if (k <= n) {
      n = k;
      need = k;
    }
  }
  if (n < need) {
    printf("SKIP: needs %d GPU(s), found %d\n", need, n);
    return 77;
  }
  return n;
}

/* Open rank `rank` of `nranks` on GPU `rank` (the calling thread): communicator, a zeroed
 * symmetric window of window_bytes, device communicator (one LSA barrier), team view,
 * host-mapped error record. On failure m->msg says where; epf_mg_rank_close undoes what opened. */
static inline epf_status_t epf_mg_rank_open(epf_mg_rank_t* m, int rank, int nranks, ncclUniqueId id,
                                            uint64_t window_bytes) {
  epf_status_t st;
  memset(m, 0, sizeof(*m));
  m->rank = rank;
  m->nranks = nranks;
  if (cudaSetDevice(rank) != cudaSuccess) {
    snprintf(m->msg, sizeof(m->msg), "cudaSetDevice(%d) failed", rank);
    return EPF_ERR_CUDA;
  }
  if ((st = epf_nccl_comm_init_rank(&m->comm, nranks, id, rank, EPF_MG_TIMEOUT_S)) != EPF_OK) {
    snprintf(m->msg, sizeof(m->msg), "comm init: %s", epf_status_name(st));
    return st;
  }
  m->open_steps = 1;
  if ((st = epf_nccl_window_create(m->comm, window_bytes, EPF_MG_TIMEOUT_S, &m->win)) != EPF_OK) {
    snprintf(m->msg, sizeof(m->msg), "window: %s (%s)", epf_status_name(st), epf_nccl_last_message(m->comm, ncclInternalError));
    return st;
  }
  m->open_steps = 2;
  if ((st = epf_nccl_devcomm_create(m->comm, 1, EPF_MG_TIMEOUT_S, &m->dev)) != EPF_OK) {
    snprintf(m->msg, sizeof(m->msg), "devcomm: %s (%s)", epf_status_name(st), epf_nccl_last_message(m->comm, ncclInternalError));
    return st;
  }
  m->open_steps = 3;
  if ((st = epf_nccl_team_query(&m->dev, m->win.window, 0, &m->team)) != EPF_OK) {
    snprintf(m->msg, sizeof(m->msg), "team query: %s", epf_status_name(st));
    return st;
  }
  if (cudaHostAlloc((void**)&m->rec_h, sizeof(*m->rec_h), cudaHostAllocMapped) != cudaSuccess ||
      cudaHostGetDevicePointer((void**)&m->rec_d, m->rec_h, 0) != cudaSuccess) {
    snprintf(m->msg, sizeof(m->msg), "host-mapped error record failed");
    return EPF_ERR_CUDA;
  }
  m->open_steps = 4;
  epf_error_clear(m->rec_h);
  return EPF_OK;
}

static inline void epf_mg_rank_close(epf_mg_rank_t* m) {
  cudaDeviceSynchronize();
  if (m->open_steps >= 4) cudaFreeHost(m->rec_h);
  if (m->open_steps >= 3) epf_nccl_devcomm_destroy(m->comm, &m->dev);
  if (m->open_steps >= 2) epf_nccl_window_destroy(m->comm, &m->win, EPF_MG_TIMEOUT_S);
  if (m->open_steps >= 1) epf_nccl_comm_destroy(m->comm, EPF_MG_TIMEOUT_S);
  m->open_steps = 0;
}

/* Run fn on n threads; thread r gets (char*)args + r * arg_size. Returns 0, or -1 when a thread
 * could not be started (the started ones are joined). */
static inline int epf_mg_run(int n, void* (*fn)(void*), void* args, size_t arg_size) {
  pthread_t th[EPF_MG_MAX];
  int r, started = 0, rc = 0;
  for (r = 0; r < n && r < EPF_MG_MAX; ++r) {
    if (pthread_create(&th[r], NULL, fn, (char*)args + (size_t)r * arg_size) != 0) {
      rc = -1;
      break;
    }
    ++started;
  }
  for (r = 0; r < started; ++r) pthread_join(th[r], NULL);
  return rc;
}

#endif /* EPF_MG_H */
