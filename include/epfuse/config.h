/* epfuse/config.h — portability macros, limits and compile-time options — part of epfuse v0.1
 *
 * What it is: the macros every other epfuse header builds on. Plain C: compiles as C11, C++17 and
 * CUDA. It defines no functions.
 *
 * What it does NOT do: it never #undefs or redefines a user or CUDA macro, never defines
 * __host__/__device__, and never sets a CUDA architecture.
 *
 * COMPILE-TIME OPTIONS (define before including any epfuse header; "agree" = every translation
 * unit that shares a window must use the same value, and the value is folded into
 * EPF_CONFIG_SIGNATURE, which the setup handshake compares across ranks):
 *   EPF_DEBUG            default !NDEBUG. Enables EPF_DEVICE_ASSERT and pointer-alignment checks.
 *   EPF_ASSERT(c)        host assert hook, default assert(c) from <assert.h> (only in EPF_DEBUG).
 *   EPF_DEVICE_ASSERT(c) device assert hook, default: trap when !(c) (only in EPF_DEBUG).
 *   EPF_ENABLE_TIMEOUT   default 1. 0 makes every bounded wait unbounded (it still polls abort). agree.
 *   EPF_ABORT_POLL_MASK  default 1023: a wait checks its abort word every (mask+1) polls.
 *   EPF_ENABLE_NC_LOADS  default 0. 1 allows ld.global.nc on peer-written data (see ptx.cuh).
 *   EPF_MAX_RANKS        72  (LSA team size limit; NVL72).                                 agree.
 *   EPF_MAX_EXPERTS      1024.                                                             agree.
 *   EPF_MAX_TOPK         32.                                                               agree.
 *   EPF_MAX_TOKENS_PER_RANK 65536.                                                         agree.
 *   EPF_ALIGN            256: alignment of every window region, in bytes (power of two, >= 128).
 *
 * Contents:
 *   EPF_BEGIN_DECLS / EPF_END_DECLS       extern "C" { } under C++; empty in C
 *   EPF_IS_CUDA / EPF_IS_DEVICE_PASS      nvcc or clang-cuda; compiling device code now
 *   EPF_INLINE                            host-only inline (static inline in C, inline in C++)
 *   EPF_HOST_DEVICE_INLINE / EPF_HD       callable from host and device
 *   EPF_DEVICE_INLINE                     __device__ __forceinline__ (CUDA only)
 *   EPF_RESTRICT, EPF_ALIGNAS(n), EPF_STATIC_ASSERT(c, msg)
 *   EPF__HOST_CHECK(c)                    (private) an argument check of a host-and-device accessor
 *   EPF_CONFIG_SIGNATURE                  the "agree" options packed into 64 bits, one field each
 *
 * Requirements: C11 or C++17; CUDA >= 12.8 for the device headers.
 */
#ifndef EPF_CONFIG_H
#define EPF_CONFIG_H

#if defined(__CUDACC_RTC__)
/* NVRTC (run-time compilation; no C library headers). size_t, ptrdiff_t and bool are built in.
 * With the toolkit's CCCL directory on the include path (needed anyway for cub in route.cuh and
 * ll.cuh) the fixed-width types come from libcu++; with only epfuse's include directory, from the
 * same typedefs here (identical types, so the two can meet in one program). Host-only code in the
 * headers is guarded by #if !defined(__CUDACC_RTC__); EPF_ASSERT (a host hook) is a no-op. */
#if defined(__has_include) && __has_include(<cuda/std/cstdint>)
#include <cuda/std/cstdint>
#else
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef long long intptr_t;
typedef unsigned long long uintptr_t;
#define INT32_MAX 2147483647
#define UINT64_MAX 18446744073709551615ull
#endif
#ifndef NULL
#define NULL 0
#endif
#ifndef EPF_ASSERT
#define EPF_ASSERT(c) ((void)0)
#endif
#else
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#endif

/* ---- language / compiler detection (NCCL_CHECK_CUDACC style) -------------------------------- */
#if defined(__CUDACC__) || defined(__CUDA__)
#define EPF_IS_CUDA 1
#else
#define EPF_IS_CUDA 0
#endif

#if defined(__CUDA_ARCH__)
#define EPF_IS_DEVICE_PASS 1
#else
#define EPF_IS_DEVICE_PASS 0
#endif

#ifdef __cplusplus
#define EPF_BEGIN_DECLS extern "C" {
#define EPF_END_DECLS }
#else
#define EPF_BEGIN_DECLS
#define EPF_END_DECLS
#endif

/* Public functions are non-static inline in C++/CUDA (so C linkage rejects an accidental
 * overload: tests/compile/fail_overload.cu) and static inline in C (C99 bare inline needs an external
 * definition).
 *
 * Visibility: in C++/CUDA an inline function is a weak symbol, and on ELF a weak symbol of default
 * visibility is interposable: two shared libraries (two Python extensions, say) built with
 * different EPF_MAX_RANKS would resolve to ONE definition at load time. So every host-side epfuse
 * function is hidden (EPF__VISIBILITY): each library or executable keeps its own copy. The C ABI
 * library (libepfuse.so, src/capi.cu) defines EPF_BUILD_CAPI to make them default, and its linker
 * version script then exports exactly the API (src/capi_api.def). */
#if defined(EPF_BUILD_CAPI) && (defined(__GNUC__) || defined(__clang__))
#define EPF__VISIBILITY __attribute__((visibility("default")))
#elif defined(__GNUC__) || defined(__clang__)
#define EPF__VISIBILITY __attribute__((visibility("hidden")))
#else
#define EPF__VISIBILITY
#endif
#if EPF_IS_CUDA
#define EPF_INLINE inline EPF__VISIBILITY
#define EPF_HOST_DEVICE_INLINE __host__ __device__ __forceinline__ EPF__VISIBILITY
#define EPF_DEVICE_INLINE __device__ __forceinline__
/* private: a device function kept out of line (slow paths such as a wait that has to spin: one
 * copy of the code instead of one per call site; the fast path around it stays inlined) */
#define EPF__DEVICE_NOINLINE __device__ __noinline__ inline
#elif defined(__cplusplus)
#define EPF_INLINE inline EPF__VISIBILITY
#define EPF_HOST_DEVICE_INLINE inline EPF__VISIBILITY
#else
#define EPF_INLINE static inline
#define EPF_HOST_DEVICE_INLINE static inline
#endif
#define EPF_HD EPF_HOST_DEVICE_INLINE

/* EPF__HOST_CHECK(c) — an argument check (NULL, an id out of range) of an EPF_HD accessor that
 * device code calls on a hot path (epf_plan_*_offset, epf_route_ptr, the LL row accessors): `c` in
 * host code — the C ABI, bindings and host launchers, where a NULL from ctypes must become a
 * sentinel instead of a crash — and constant false in device code, whose arguments come from the
 * library's own kernels: the device code is the same instructions as without the check. */
#if EPF_IS_DEVICE_PASS
#define EPF__HOST_CHECK(c) 0
#else
#define EPF__HOST_CHECK(c) (c)
#endif

#if defined(__cplusplus) || defined(_MSC_VER)
#define EPF_RESTRICT __restrict__
#else
#define EPF_RESTRICT restrict
#endif

#if defined(__cplusplus)
#define EPF_STATIC_ASSERT(c, msg) static_assert(c, msg)
#define EPF_ALIGNAS(n) alignas(n)
#else
#define EPF_STATIC_ASSERT(c, msg) _Static_assert(c, msg)
#define EPF_ALIGNAS(n) _Alignas(n)
#endif

/* ---- debug hooks ---------------------------------------------------------------------------- */
#ifndef EPF_DEBUG
#ifdef NDEBUG
#define EPF_DEBUG 0
#else
#define EPF_DEBUG 1
#endif
#endif

#ifndef EPF_ASSERT
#if EPF_DEBUG
#include <assert.h>
#define EPF_ASSERT(c) assert(c)
#else
#define EPF_ASSERT(c) ((void)0)
#endif
#endif

#ifndef EPF_DEVICE_ASSERT
#if EPF_DEBUG
#define EPF_DEVICE_ASSERT(c) \
  do {                       \
    if (!(c)) __trap();      \
  } while (0)
#else
#define EPF_DEVICE_ASSERT(c) ((void)0)
#endif
#endif

/* ---- features ------------------------------------------------------------------------------- */
#ifndef EPF_ENABLE_TIMEOUT
#define EPF_ENABLE_TIMEOUT 1
#endif
#ifndef EPF_ABORT_POLL_MASK
#define EPF_ABORT_POLL_MASK 1023u
#endif
#ifndef EPF_ENABLE_NC_LOADS
#define EPF_ENABLE_NC_LOADS 0
#endif

/* ---- limits --------------------------------------------------------------------------------- */
#ifndef EPF_MAX_RANKS
#define EPF_MAX_RANKS 72
#endif
#ifndef EPF_MAX_EXPERTS
#define EPF_MAX_EXPERTS 1024
#endif
#ifndef EPF_MAX_TOPK
#define EPF_MAX_TOPK 32
#endif
#ifndef EPF_MAX_TOKENS_PER_RANK
#define EPF_MAX_TOKENS_PER_RANK 65536
#endif
#ifndef EPF_ALIGN
#define EPF_ALIGN 256
#endif

EPF_STATIC_ASSERT(EPF_MAX_RANKS >= 1 && EPF_MAX_RANKS <= 1024, "EPF_MAX_RANKS out of range");
EPF_STATIC_ASSERT(EPF_MAX_EXPERTS >= 1 && EPF_MAX_EXPERTS <= 65535, "EPF_MAX_EXPERTS out of range");
EPF_STATIC_ASSERT(EPF_MAX_TOPK >= 1 && EPF_MAX_TOPK <= 64, "EPF_MAX_TOPK out of range");
EPF_STATIC_ASSERT(EPF_MAX_TOKENS_PER_RANK >= 1 && EPF_MAX_TOKENS_PER_RANK <= (1 << 24),
                  "EPF_MAX_TOKENS_PER_RANK out of range");
EPF_STATIC_ASSERT(EPF_ALIGN >= 128 && (EPF_ALIGN & (EPF_ALIGN - 1)) == 0,
                  "EPF_ALIGN must be a power of two >= 128");

/* Every option that changes the window layout or the protocol, folded into one number. The setup
 * handshake hashes it with the resolved config, so ranks built with different limits refuse to
 * talk instead of corrupting each other's memory. */
#define EPF_CONFIG_SIGNATURE                                                                  \
  ((uint64_t)EPF_MAX_RANKS | ((uint64_t)EPF_MAX_EXPERTS << 12) | ((uint64_t)EPF_MAX_TOPK << 28) | \
   ((uint64_t)EPF_ALIGN << 36) | ((uint64_t)EPF_ENABLE_TIMEOUT << 52))

#endif /* EPF_CONFIG_H */
/* SPDX-License-Identifier: Apache-2.0 */
