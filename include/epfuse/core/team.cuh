/* epfuse/core/team.cuh — team views and peer addressing — part of epfuse v0.1
 *
 * What it is: epf_team_t, a small POD passed by value into kernels, and epf_peer_ptr(team, offset,
 * peer), the only way epfuse code reaches another rank's memory. A team view says where every
 * rank's window slice is. Three constructors:
 *   - epf_team_virtual:    VIRTUAL RANKS. One local allocation of nranks * stride bytes; rank p's
 *                          slice starts at base + p * stride. R ranks run as block groups of one
 *                          grid on one GPU (all blocks must be co-resident: check with
 *                          epf_virtual_grid_check before the launch).
 *   - epf_team_affine:     an NCCL LSA window (core/nccl.cuh fills it from ncclGetLsaPointer: NCCL's LSA
 *                          mapping is affine, peer p at lsaFlatBase + p * stride).
 *   - epf_team_from_table: the caller's own table of peer pointers (CUDA IPC, torch symmetric
 *                          memory, ...); the table lives in device memory.
 *
 * What it does NOT do: allocate, map or register memory, or include nccl_device.h (core/nccl.cuh
 * does), so every block works with virtual ranks and with foreign transports alike.
 *
 * Usage:
 *   __global__ void k(char* base, size_t stride, int nranks, epf_plan_t plan) {
 *     epf_team_t team = epf_team_virtual(base, stride, blockIdx.x / blocks_per_rank, nranks);
 *     uint64_t* flag = (uint64_t*)epf_peer_ptr(team,
 *         epf_plan_signal_offset(&plan, EPF_REGION_SIG_BARRIER, team.rank), peer);
 *   }
 *
 * Contents:
 *   epf_team_t
 *   epf_team_t epf_team_virtual(void* base, uint64_t stride, int rank, int nranks)      [EPF_HD]
 *   epf_team_t epf_team_affine(void* rank0_base, uint64_t stride, int rank, int nranks) [EPF_HD]
 *   epf_team_t epf_team_from_table(void* const* peers, int rank, int nranks)            [EPF_HD]
 *   void*      epf_peer_ptr(epf_team_t team, uint64_t offset, int peer)                 [EPF_HD]
 *   void*      epf_local_ptr(epf_team_t team, uint64_t offset)                          [EPF_HD]
 *   epf_team_t epf_team_for_block(epf_team_t team, int virtual_ranks, int blocks_per_rank) [device]
 *   epf_status_t epf_virtual_grid_check(const void* kernel, int block_threads,
 *                                       size_t dynamic_smem, int grid_blocks, int device) [host]
 *
 * Requirements: C++17 or CUDA (the functions are EPF_HD: tests call them on the host too).
 */
#ifndef EPF_CORE_TEAM_CUH
#define EPF_CORE_TEAM_CUH

#include "../config.h"
#include "../status.h"
#if EPF_IS_CUDA && !defined(__CUDACC_RTC__) /* NVRTC: device code only, no CUDA runtime */
#include <cuda_runtime_api.h>
#endif

EPF_BEGIN_DECLS

/* A view of the team's window. Either affine (peers == NULL: peer p at base + p * stride) or a
 * table (peers[p], a device array of nranks pointers to each rank's slice). */
typedef struct epf_team {
  char* base;         /* affine: rank 0's slice; table: unused (NULL) */
  uint64_t stride;    /* affine: bytes between consecutive ranks' slices */
  void* const* peers; /* table of nranks slice pointers in device memory, or NULL */
  int32_t rank;       /* this rank, in [0, nranks) */
  int32_t nranks;     /* team size */
} epf_team_t;

/* epf_team_affine — team over an affine mapping: rank p's slice at rank0_base + p * stride.
 *   Scope: any thread. rank0_base is a device pointer. */
EPF_HD epf_team_t epf_team_affine(void* rank0_base, uint64_t stride, int rank, int nranks) {
  epf_team_t t;
  t.base = (char*)rank0_base;
  t.stride = stride;
  t.peers = 0;
  t.rank = rank;
  t.nranks = nranks;
  return t;
}

/* epf_team_virtual — VIRTUAL RANKS: `base` is one allocation of nranks * stride bytes on this GPU;
 *   this thread plays `rank`. stride is a multiple of EPF_ALIGN (use plan.total_bytes).
 *   Scope: any thread; typically rank = blockIdx.x / blocks_per_rank. */
EPF_HD epf_team_t epf_team_virtual(void* base, uint64_t stride, int rank, int nranks) {
  return epf_team_affine(base, stride, rank, nranks);
}

/* epf_team_from_table — team over caller-provided peer pointers (device array of nranks slice
 *   pointers, each EPF_ALIGN-aligned and mapped into this GPU's address space). */
EPF_HD epf_team_t epf_team_from_table(void* const* peers, int rank, int nranks) {
  epf_team_t t;
  t.base = 0;
  t.stride = 0;
  t.peers = peers;
  t.rank = rank;
  t.nranks = nranks;
  return t;
}

/* epf_peer_ptr — address of byte `offset` of `peer`'s window slice, as this GPU sees it
 *   (NCCL's (window, offset, peer) order). Scope: any thread. Pure. peer in [0, nranks). */
EPF_HD void* epf_peer_ptr(epf_team_t team, uint64_t offset, int peer) {
  if (team.peers != 0) return (char*)team.peers[peer] + offset;
  return team.base + (uint64_t)peer * team.stride + offset;
}

/* epf_local_ptr — this rank's own slice (epf_peer_ptr with peer = team.rank). */
EPF_HD void* epf_local_ptr(epf_team_t team, uint64_t offset) {
  return epf_peer_ptr(team, offset, team.rank);
}

#if EPF_IS_CUDA
/* epf_team_for_block — the team view this block plays in a ready-made kernel. One kernel serves
 *   both launch kinds: a real rank (virtual_ranks == 0: `team` as given, e.g. from
 *   epf_nccl_team_query) and VIRTUAL RANKS (virtual_ranks != 0: `team` is the affine view of one
 *   local allocation of team.nranks slices and this block plays rank blockIdx.x / blocks_per_rank).
 *   Scope: any thread. */
EPF_DEVICE_INLINE epf_team_t epf_team_for_block(epf_team_t team, int virtual_ranks, int blocks_per_rank) {
  if (virtual_ranks) team.rank = (int32_t)(blockIdx.x / (unsigned)blocks_per_rank);
  return team;
}

#if !defined(__CUDACC_RTC__) /* host code below; NVRTC compiles device code only */

/* ---- the CUDA error behind EPF_ERR_CUDA ----------------------------------------------------------
 * Every epfuse host function that returns EPF_ERR_CUDA first stores the cudaError_t it got in a
 * per-thread slot (like cudaGetLastError, but it is not reset by reading), so "no kernel image is
 * available for execution on the device" (a build without this GPU's architecture) says so. With
 * hidden visibility (config.h) each shared library keeps its own slot: read it through the same
 * library that returned the status (libepfuse.so: epf_cuda_last_error). */
EPF_INLINE cudaError_t* epf__cuda_error_slot(void) {
  static thread_local cudaError_t e = cudaSuccess;
  return &e;
}

/* epf__cuda_status — EPF_OK for cudaSuccess; otherwise remember `e` and return EPF_ERR_CUDA. */
EPF_INLINE epf_status_t epf__cuda_status(cudaError_t e) {
  if (e == cudaSuccess) return EPF_OK;
  *epf__cuda_error_slot() = e;
  return EPF_ERR_CUDA;
}

/* epf__cuda_ok — true for cudaSuccess; otherwise remember `e` (for `if (!ok(a) || !ok(b)) return
 *   EPF_ERR_CUDA;` chains). */
EPF_INLINE bool epf__cuda_ok(cudaError_t e) { return epf__cuda_status(e) == EPF_OK; }

/* epf_cuda_last_error — the cudaError_t of the last EPF_ERR_CUDA an epfuse host function returned
 *   on this thread (cudaSuccess if none yet); cudaGetErrorString turns it into text.
 *   epf_cuda_last_error_clear resets it. Scope: host. */
EPF_INLINE cudaError_t epf_cuda_last_error(void) { return *epf__cuda_error_slot(); }
EPF_INLINE void epf_cuda_last_error_clear(void) { *epf__cuda_error_slot() = cudaSuccess; }

/* epf_virtual_grid_check — can a grid of `grid_blocks` blocks of `kernel` be co-resident on
 *   `device`? Virtual ranks spin on each other inside one launch, so a block that is not resident
 *   would never run and its peers would time out. Returns EPF_OK, EPF_ERR_CO_RESIDENCY, or
 *   EPF_ERR_CUDA if the occupancy query fails. Scope: host, before the launch. No allocation. */
EPF_INLINE epf_status_t epf_virtual_grid_check(const void* kernel, int block_threads,
                                               size_t dynamic_smem, int grid_blocks, int device) {
  int per_sm = 0, sms = 0;
  cudaError_t e;
  if (kernel == NULL || block_threads <= 0 || grid_blocks <= 0) return EPF_ERR_INVALID_ARGUMENT;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block_threads, dynamic_smem);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return epf__cuda_status(e);
  return (int64_t)per_sm * sms >= grid_blocks ? EPF_OK : EPF_ERR_CO_RESIDENCY;
}
#endif /* !__CUDACC_RTC__ */
#endif

EPF_END_DECLS

#endif /* EPF_CORE_TEAM_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
