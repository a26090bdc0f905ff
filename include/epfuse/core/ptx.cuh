/* epfuse/core/ptx.cuh — memory-ordering primitives, named by op, order, scope and width — part of epfuse v0.1
 *
 * What it is: every load, store, reduction and fence epfuse uses for signalling, each one inline
 * PTX with a "memory" clobber. Names follow epf_<op>_<order>_<scope>_<type>:
 *   op     ld | st | red_add | atom_add | atom_cas | fence
 *   order  relaxed | acquire | release | acq_rel | sc
 *   scope  gpu (other threads of this GPU) | sys (peer GPUs over NVLink/LSA, and the host)
 * Cross-GPU flags use _sys, intra-GPU flags _gpu: a reviewer checks each use by its name.
 *
 * What it does NOT do: spin (core/signal.cuh has the one wait helper), or use ld.global.nc on memory a
 * peer may write during the kernel unless EPF_ENABLE_NC_LOADS=1 (epf_ld_nc_v4_u32).
 *
 * Usage:
 *   epf_st_v4_u32(dst, v);                       // data: ordinary 16-byte stores
 *   __syncwarp();
 *   if (lane == 0) epf_st_release_sys_u64(flag, epoch);   // publish
 *   ...
 *   while (epf_ld_acquire_sys_u64(flag) < epoch) {}       // (use epf_wait_*, core/signal.cuh)
 *
 * Contents (each for u32 and u64 unless noted):
 *   epf_ld_relaxed_{gpu,sys}_*   epf_ld_acquire_{gpu,sys}_*   epf_ld_volatile_*
 *   epf_st_relaxed_{gpu,sys}_*   epf_st_release_{gpu,sys}_*
 *   epf_red_add_relaxed_{gpu,sys}_*   epf_red_add_release_{gpu,sys}_*
 *   epf_atom_add_acq_rel_{gpu,sys}_*  epf_atom_cas_acq_rel_{gpu,sys}_u32
 *   epf_fence_acq_rel_{gpu,sys}  epf_fence_sc_{gpu,sys}  epf_fence_acq_rel_cta
 *   epf_ld_v4_u32  epf_st_v4_u32  epf_ld_nc_v4_u32     16-byte data access (uint4)
 *   epf_globaltimer_ns  epf_lane_id  epf_warp_id
 *
 * Requirements: CUDA, sm_70+ (all of it is plain PTX ISA 6.0+); nvcc or clang-cuda.
 */
#ifndef EPF_CORE_PTX_CUH
#define EPF_CORE_PTX_CUH

#include "../config.h"

#if !EPF_IS_CUDA
#error "epfuse/core/ptx.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

EPF_BEGIN_DECLS

/* ---- loads ------------------------------------------------------------------------------------ */
/* ld.relaxed.{gpu,sys}.global: atomic (no tearing) load with no ordering. */
EPF_DEVICE_INLINE uint32_t epf_ld_relaxed_gpu_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
EPF_DEVICE_INLINE uint64_t epf_ld_relaxed_gpu_u64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
EPF_DEVICE_INLINE uint32_t epf_ld_relaxed_sys_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
EPF_DEVICE_INLINE uint64_t epf_ld_relaxed_sys_u64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
/* ld.acquire.{gpu,sys}.global: later accesses of this thread are ordered after the load; pairs
 * with a release of the same scope on the writer's side. */
EPF_DEVICE_INLINE uint32_t epf_ld_acquire_gpu_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
EPF_DEVICE_INLINE uint64_t epf_ld_acquire_gpu_u64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
EPF_DEVICE_INLINE uint32_t epf_ld_acquire_sys_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
EPF_DEVICE_INLINE uint64_t epf_ld_acquire_sys_u64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
/* ld.volatile.global: re-read every time, no ordering; for host-mapped words the host writes. */
EPF_DEVICE_INLINE uint32_t epf_ld_volatile_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
EPF_DEVICE_INLINE uint64_t epf_ld_volatile_u64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

/* ---- stores ----------------------------------------------------------------------------------- */
EPF_DEVICE_INLINE void epf_st_relaxed_gpu_u32(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
EPF_DEVICE_INLINE void epf_st_relaxed_gpu_u64(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
EPF_DEVICE_INLINE void epf_st_relaxed_sys_u32(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
EPF_DEVICE_INLINE void epf_st_relaxed_sys_u64(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
/* st.release.{gpu,sys}.global: every earlier access of this thread (and, cumulatively, what it
 * observed) is visible to a thread that acquires this value at the same scope. */
EPF_DEVICE_INLINE void epf_st_release_gpu_u32(uint32_t* p, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
EPF_DEVICE_INLINE void epf_st_release_gpu_u64(uint64_t* p, uint64_t v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
EPF_DEVICE_INLINE void epf_st_release_sys_u32(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
EPF_DEVICE_INLINE void epf_st_release_sys_u64(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* ---- reductions (no return value) ------------------------------------------------------------- */
EPF_DEVICE_INLINE void epf_red_add_relaxed_gpu_u32(uint32_t* p, uint32_t v) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
EPF_DEVICE_INLINE void epf_red_add_relaxed_gpu_u64(uint64_t* p, uint64_t v) {
  asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
EPF_DEVICE_INLINE void epf_red_add_relaxed_sys_u32(uint32_t* p, uint32_t v) {
  asm volatile("red.relaxed.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
EPF_DEVICE_INLINE void epf_red_add_relaxed_sys_u64(uint64_t* p, uint64_t v) {
  asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
EPF_DEVICE_INLINE void epf_red_add_release_gpu_u32(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
EPF_DEVICE_INLINE void epf_red_add_release_gpu_u64(uint64_t* p, uint64_t v) {
  asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
EPF_DEVICE_INLINE void epf_red_add_release_sys_u32(uint32_t* p, uint32_t v) {
  asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
EPF_DEVICE_INLINE void epf_red_add_release_sys_u64(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* ---- atomics (return the old value) ----------------------------------------------------------- */
EPF_DEVICE_INLINE uint32_t epf_atom_add_acq_rel_gpu_u32(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
EPF_DEVICE_INLINE uint64_t epf_atom_add_acq_rel_gpu_u64(uint64_t* p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}
EPF_DEVICE_INLINE uint32_t epf_atom_add_acq_rel_sys_u32(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.sys.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
EPF_DEVICE_INLINE uint64_t epf_atom_add_acq_rel_sys_u64(uint64_t* p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.acq_rel.sys.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}
EPF_DEVICE_INLINE uint32_t epf_atom_cas_acq_rel_gpu_u32(uint32_t* p, uint32_t compare, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.cas.b32 %0, [%1], %2, %3;"
               : "=r"(old)
               : "l"(p), "r"(compare), "r"(v)
               : "memory");
  return old;
}
EPF_DEVICE_INLINE uint32_t epf_atom_cas_acq_rel_sys_u32(uint32_t* p, uint32_t compare, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.sys.global.cas.b32 %0, [%1], %2, %3;"
               : "=r"(old)
               : "l"(p), "r"(compare), "r"(v)
               : "memory");
  return old;
}

/* ---- fences ----------------------------------------------------------------------------------- */
EPF_DEVICE_INLINE void epf_fence_acq_rel_cta(void) { asm volatile("fence.acq_rel.cta;" ::: "memory"); }
EPF_DEVICE_INLINE void epf_fence_acq_rel_gpu(void) { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
EPF_DEVICE_INLINE void epf_fence_acq_rel_sys(void) { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
EPF_DEVICE_INLINE void epf_fence_sc_gpu(void) { asm volatile("fence.sc.gpu;" ::: "memory"); }
EPF_DEVICE_INLINE void epf_fence_sc_sys(void) { asm volatile("fence.sc.sys;" ::: "memory"); }

/* ---- 16-byte data access ---------------------------------------------------------------------- */
/* Plain (weak) 16-byte global load/store: the data path. p must be 16-byte aligned. */
EPF_DEVICE_INLINE uint4 epf_ld_v4_u32(const void* p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
EPF_DEVICE_INLINE void epf_st_v4_u32(void* p, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}
/* Non-coherent 16-byte load: only for data nobody writes during the kernel. With
 * EPF_ENABLE_NC_LOADS=0 (the default) it is a plain load. */
EPF_DEVICE_INLINE uint4 epf_ld_nc_v4_u32(const void* p) {
#if EPF_ENABLE_NC_LOADS
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
#else
  return epf_ld_v4_u32(p);
#endif
}

/* ---- misc ------------------------------------------------------------------------------------- */
/* %globaltimer: nanoseconds, the same clock on every SM (coarse: updates every ~1 us). */
EPF_DEVICE_INLINE uint64_t epf_globaltimer_ns(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
EPF_DEVICE_INLINE int epf_lane_id(void) { return (int)(threadIdx.x & 31u); }
EPF_DEVICE_INLINE int epf_warp_id(void) { return (int)(threadIdx.x >> 5); }

EPF_END_DECLS

#endif /* EPF_CORE_PTX_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
