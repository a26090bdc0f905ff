/* epfuse/core/nccl.cuh — team views from NCCL windows and device communicators — part of epfuse v0.1
 *
 * What it is: the ONLY epfuse header that includes nccl_device.h. It turns an NCCL symmetric
 * window (ncclWindow_t) and device communicator (ncclDevComm) into an epf_team_t, so every other
 * block runs unchanged over NCCL, virtual ranks or a foreign transport. It also wraps the NCCL
 * LSA barrier (a C++ template in NCCL) behind a plain function, and creates the device
 * communicator on the host for both NCCL 2.28 (no requirements initializer) and 2.29+ (the
 * initializer is required).
 *
 * What it does NOT do: allocate windows (host_nccl.h does), or use GIN/network transports: epfuse
 * moves data over LSA (NVLink) only.
 *
 * Usage (tests/gpu/test_nccl.cu has it whole):
 *   ncclDevComm_t dev;
 *   epf_nccl_devcomm_create(comm, nblocks, 60.0, &dev);          // host, collective
 *   __global__ void k(ncclDevComm_t dev, ncclWindow_t win, epf_plan_t plan) {
 *     epf_team_t team = epf_team_from_devcomm(&dev, win);
 *     epf_lsa_barrier_sync_block(&dev, blockIdx.x);
 *   }
 *
 * Contents:
 *   epf_team_t   epf_team_from_window(ncclWindow_t win, int lsa_rank, int lsa_size)   [device]
 *   epf_team_t   epf_team_from_devcomm(const ncclDevComm_t* comm, ncclWindow_t win)  [device]
 *   void         epf_lsa_barrier_sync_block(const ncclDevComm_t* comm, uint32_t index) [collective:block]
 *   epf_status_t epf_nccl_devcomm_create(ncclComm_t, int lsa_barrier_count, double timeout_s, ncclDevComm_t* out)
 *   epf_status_t epf_nccl_devcomm_destroy(ncclComm_t, const ncclDevComm_t* dev)
 *   epf_status_t epf_nccl_team_query(const ncclDevComm_t* dev, ncclWindow_t win, cudaStream_t, epf_team_t* out)
 *
 * Requirements: CUDA (C++), NCCL 2.28 – 2.32 (compiled against each; run with 2.28.9: README, "NCCL versions") with the device API (nccl_device.h), sm_70+.
 */
#ifndef EPF_CORE_NCCL_CUH
#define EPF_CORE_NCCL_CUH

#include "../config.h"

#if !EPF_IS_CUDA
#error "epfuse/core/nccl.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

#include <string.h>
#include <nccl.h>
#include <nccl_device.h>

#include "../host_nccl.h"
#include "team.cuh"

EPF_BEGIN_DECLS

/* epf_team_from_window — team view of an NCCL symmetric window, through ncclGetLsaPointer. NCCL's
 *   LSA mapping is affine (peer p at lsaFlatBase + p * stride), so the view stores the base and
 *   stride and never calls back into NCCL. Scope: any thread; cheap (two pointer queries). */
EPF_DEVICE_INLINE epf_team_t epf_team_from_window(ncclWindow_t win, int lsa_rank, int lsa_size) {
  char* p0 = (char*)ncclGetLsaPointer(win, 0, 0);
  uint64_t stride = lsa_size > 1 ? (uint64_t)((char*)ncclGetLsaPointer(win, 0, 1) - p0) : 0u;
  return epf_team_affine(p0, stride, lsa_rank, lsa_size);
}

/* epf_team_from_devcomm — the same, with rank and size from the device communicator's LSA team. */
EPF_DEVICE_INLINE epf_team_t epf_team_from_devcomm(const ncclDevComm_t* comm, ncclWindow_t win) {
  return epf_team_from_window(win, comm->lsaRank, comm->lsaSize);
}

/* epf_lsa_barrier_sync_block — NCCL's LSA barrier (ncclLsaBarrierSession<ncclCoopCta>::sync with
 *   acquire-release order) behind a plain function.
 *   Scope: [collective:block] every thread; one block per `index` per rank, index <
 *   lsa_barrier_count given to epf_nccl_devcomm_create. Blocking: yes (NCCL 2.28 has no timeout;
 *   use epf_barrier_block from core/signal.cuh where a bounded wait is needed). */
EPF_DEVICE_INLINE void epf_lsa_barrier_sync_block(const ncclDevComm_t* comm, uint32_t index) {
  ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), *comm, ncclTeamLsa(*comm), comm->lsaBarrier,
                                         index);
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

/* epf_nccl_devcomm_create — ncclDevCommCreate with `lsa_barrier_count` LSA barriers, for NCCL 2.28
 *   (requirements zero-filled) and 2.29+ (NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER), finished
 *   against the deadline on a non-blocking communicator. Scope: host; collective.
 *   Returns EPF_ERR_NOT_SUPPORTED before any collective call when the NCCL loaded cannot run code
 *   built against these headers (epf_nccl_runtime_check, host_nccl.h, says why): built against
 *   NCCL 2.28 it needs exactly that release (2.28's device-API structures carry no size or version
 *   and change between 2.28 releases: a build against the 2.28.3 headers fails inside
 *   ncclDevCommCreate of a 2.28.9 library); built against 2.29+ it needs that release or a newer
 *   one (2.29+ version the structures, so newer releases accept older builds, not the reverse).
 *   EPF_ERR_INVALID_ARGUMENT, before any NCCL call, for comm or out_dev NULL, lsa_barrier_count < 0
 *   or a NaN, infinite or negative timeout_s. */
EPF_INLINE epf_status_t epf_nccl_devcomm_create(ncclComm_t comm, int lsa_barrier_count,
                                                double timeout_s, ncclDevComm_t* out_dev) {
#ifdef NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER
  ncclDevCommRequirements_t reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
#else
  ncclDevCommRequirements_t reqs;
  memset(&reqs, 0, sizeof(reqs));
#endif
  if (comm == NULL || out_dev == NULL || lsa_barrier_count < 0 || !epf__timeout_ok(timeout_s))
    return EPF_ERR_INVALID_ARGUMENT; /* a NaN, infinite or negative timeout: before any NCCL call */
  if (epf_nccl_runtime_check(NULL, 0) != EPF_OK) return EPF_ERR_NOT_SUPPORTED; /* before any collective */
  reqs.lsaBarrierCount = lsa_barrier_count;
  return epf_nccl_wait(comm, ncclDevCommCreate(comm, &reqs, out_dev), timeout_s);
}

/* epf_nccl_devcomm_destroy — ncclDevCommDestroy. EPF_ERR_INVALID_ARGUMENT for comm or dev NULL.
 *   Scope: host; collective. */
EPF_INLINE epf_status_t epf_nccl_devcomm_destroy(ncclComm_t comm, const ncclDevComm_t* dev) {
  if (comm == NULL || dev == NULL) return EPF_ERR_INVALID_ARGUMENT;
  return epf_nccl_status(ncclDevCommDestroy(comm, dev));
}

/* Reads the LSA base and stride of a window on the device (ncclGetLsaPointer is device-only). */
static __global__ void epf__nccl_team_query_kernel(ncclDevComm_t dev, ncclWindow_t win, epf_team_t* out) {
  *out = epf_team_from_devcomm(&dev, win);
}

/* epf_nccl_team_query — the window's team view as a host value, so host launchers of ready-made
 *   kernels can pass it by value (the LSA mapping does not change while the window lives).
 *   Launches one 1-thread kernel on `stream` and waits for it. Scope: host, outside graph
 *   capture, once per window. Returns EPF_OK, EPF_ERR_INVALID_ARGUMENT (dev, win or out_team
 *   NULL; before any CUDA call) or EPF_ERR_CUDA. */
EPF_INLINE epf_status_t epf_nccl_team_query(const ncclDevComm_t* dev, ncclWindow_t win, cudaStream_t stream,
                                            epf_team_t* out_team) {
  epf_team_t* d_team = NULL;
  cudaError_t e;
  if (dev == NULL || win == NULL || out_team == NULL) return EPF_ERR_INVALID_ARGUMENT;
  if (!epf__cuda_ok(cudaMalloc((void**)&d_team, sizeof(epf_team_t)))) return EPF_ERR_CUDA;
  epf__nccl_team_query_kernel<<<1, 1, 0, stream>>>(*dev, win, d_team);
  e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpyAsync(out_team, d_team, sizeof(epf_team_t), cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  cudaFree(d_team);
  return epf__cuda_status(e);
}

EPF_END_DECLS

#endif /* EPF_CORE_NCCL_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
