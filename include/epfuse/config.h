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
 *   EPF_ENABLE_NC_LOADS  default 0. 1 allows ld.global.nc on peer-written data (see core/ptx.cuh).
 *   EPF_MAX_RANKS        72  (LSA team size limit; NVL72).                                 agree.
 *   EPF_MAX_EXPERTS      1024.                                                             agree.
 *   EPF_MAX_TOPK         32.                                                               agree.
 *   EPF_MAX_TOKENS_PER_RANK 65536.                                                         agree.
 *   EPF_ALIGN            256: alignment of every window region, in bytes (power of two in
 *                        [128, 2^30]).                                                     agree.
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
 * With the toolkit's CCCL directory on the include path (needed anyway for cub in route/route.cuh and
 * ll/ll.cuh) the fixed-width types come from libcu++; with only epfuse's include directory, from the
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

/* ---- tuning: performance only (the same bytes and results whatever the value; ranks need not
 * agree). One line each on what the value trades. ------------------------------------------- */
/* 16-byte vectors per lane in flight before the first store of a row copy (more: latency hidden,
 * more registers). */
#ifndef EPF_COPY_UNROLL
#define EPF_COPY_UNROLL 4
#endif
/* the same for the HT sends and the combine's put / push, whose kernels run 16 warps per SM with 128
 * registers and do little else between loads */
#ifndef EPF_SEND_UNROLL
#define EPF_SEND_UNROLL 8
#endif
/* 256-element chunks a warp of the MXFP8 / FP8 row quantizers loads before its first conversion */
#ifndef EPF_QUANT_UNROLL
#define EPF_QUANT_UNROLL 4
#endif
/* 1: Blackwell arch-family targets use the hardware E8M0 conversion; 0: the integer path everywhere
 * (same bits, one instruction against a few) */
#ifndef EPF_QUANT_HW_E8M0
#define EPF_QUANT_HW_E8M0 1
#endif
/* 256-element chunks of one row a warp of the LL combine send moves per unit (loads in flight per
 * lane against one metadata lookup per unit; the LL dispatch send always moves one: grouping there
 * made T = 1 slower) */
#ifndef EPF_LL_SEND_CHUNKS
#define EPF_LL_SEND_CHUNKS 4
#endif
/* rows in flight per lane in the LL combine reduction (loads issued before the first fma) */
#ifndef EPF_LL_COMBINE_BATCH
#define EPF_LL_COMBINE_BATCH 8
#endif
/* threads of a block of the ready-made route kernel */
#ifndef EPF_ROUTE_BLOCK_THREADS
#define EPF_ROUTE_BLOCK_THREADS 512
#endif
/* blocks per SM the ready-made HT dispatch kernel is compiled for: 1 gives it up to 128 registers
 * without spills; 2 halves that, spills, and makes the quantizing dispatch slower */
#ifndef EPF_HT_DISPATCH_MIN_BLOCKS
#define EPF_HT_DISPATCH_MIN_BLOCKS 1
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

/* The allowed range of each limit (and the widths of EPF_CONFIG_SIGNATURE follow from them). */
#define EPF__MAX_RANKS_LIMIT 1024
#define EPF__MAX_EXPERTS_LIMIT 65535
#define EPF__MAX_TOPK_LIMIT 64
#define EPF__MAX_TOKENS_LIMIT (1 << 24)
#define EPF__ALIGN_LIMIT (1 << 30)

EPF_STATIC_ASSERT(EPF_MAX_RANKS >= 1 && EPF_MAX_RANKS <= EPF__MAX_RANKS_LIMIT, "EPF_MAX_RANKS out of range");
EPF_STATIC_ASSERT(EPF_MAX_EXPERTS >= 1 && EPF_MAX_EXPERTS <= EPF__MAX_EXPERTS_LIMIT, "EPF_MAX_EXPERTS out of range");
EPF_STATIC_ASSERT(EPF_MAX_TOPK >= 1 && EPF_MAX_TOPK <= EPF__MAX_TOPK_LIMIT, "EPF_MAX_TOPK out of range");
EPF_STATIC_ASSERT(EPF_MAX_TOKENS_PER_RANK >= 1 && EPF_MAX_TOKENS_PER_RANK <= EPF__MAX_TOKENS_LIMIT,
                  "EPF_MAX_TOKENS_PER_RANK out of range");
EPF_STATIC_ASSERT(EPF_ALIGN >= 128 && EPF_ALIGN <= EPF__ALIGN_LIMIT && (EPF_ALIGN & (EPF_ALIGN - 1)) == 0,
                  "EPF_ALIGN must be a power of two in [128, 2^30]");

/* ---- EPF_CONFIG_SIGNATURE: every "agree" option, one bit field each --------------------------
 * Every option that changes the window layout or the protocol, packed into one 64-bit number. The
 * setup handshake hashes it with the resolved config (epf_config_hash) and epf_build_signature
 * hashes it with the struct versions, so ranks or plans built with different limits refuse each
 * other instead of corrupting memory. Each field has its own bits, wide enough for every allowed
 * value of its option (the asserts below), so two different builds never pack to the same number:
 *   bits  0..9   EPF_MAX_RANKS - 1            [0, 1023]
 *   bits 10..25  EPF_MAX_EXPERTS - 1          [0, 65534]
 *   bits 26..31  EPF_MAX_TOPK - 1             [0, 63]
 *   bits 32..55  EPF_MAX_TOKENS_PER_RANK - 1  [0, 2^24 - 1]
 *   bits 56..60  log2(EPF_ALIGN)              [7, 30]
 *   bit  61      EPF_ENABLE_TIMEOUT != 0
 *   bits 62..63  0
 * (Until issue #30 EPF_ALIGN was packed whole at bit 36, so EPF_ALIGN >= 65536 ran into the
 * timeout bit at 52, and EPF_MAX_TOKENS_PER_RANK was not packed.) EPF__SIG_PACK packs any values,
 * EPF__SIG_GET(sig, FIELD) unpacks one (tests/unit/test_signature.c). */
#define EPF__SIG_RANKS_SHIFT 0
#define EPF__SIG_RANKS_BITS 10
#define EPF__SIG_EXPERTS_SHIFT 10
#define EPF__SIG_EXPERTS_BITS 16
#define EPF__SIG_TOPK_SHIFT 26
#define EPF__SIG_TOPK_BITS 6
#define EPF__SIG_TOKENS_SHIFT 32
#define EPF__SIG_TOKENS_BITS 24
#define EPF__SIG_ALIGN_SHIFT 56
#define EPF__SIG_ALIGN_BITS 5
#define EPF__SIG_TIMEOUT_SHIFT 61
#define EPF__SIG_TIMEOUT_BITS 1

/* the fields follow each other without overlap, inside 64 bits */
EPF_STATIC_ASSERT(EPF__SIG_EXPERTS_SHIFT == EPF__SIG_RANKS_SHIFT + EPF__SIG_RANKS_BITS, "signature: RANKS | EXPERTS");
EPF_STATIC_ASSERT(EPF__SIG_TOPK_SHIFT == EPF__SIG_EXPERTS_SHIFT + EPF__SIG_EXPERTS_BITS, "signature: EXPERTS | TOPK");
EPF_STATIC_ASSERT(EPF__SIG_TOKENS_SHIFT >= EPF__SIG_TOPK_SHIFT + EPF__SIG_TOPK_BITS, "signature: TOPK | TOKENS");
EPF_STATIC_ASSERT(EPF__SIG_ALIGN_SHIFT == EPF__SIG_TOKENS_SHIFT + EPF__SIG_TOKENS_BITS, "signature: TOKENS | ALIGN");
EPF_STATIC_ASSERT(EPF__SIG_TIMEOUT_SHIFT == EPF__SIG_ALIGN_SHIFT + EPF__SIG_ALIGN_BITS, "signature: ALIGN | TIMEOUT");
EPF_STATIC_ASSERT(EPF__SIG_TIMEOUT_SHIFT + EPF__SIG_TIMEOUT_BITS <= 64, "signature: 64 bits");
/* each field holds the largest value its option may take */
EPF_STATIC_ASSERT(EPF__MAX_RANKS_LIMIT - 1 < (1ll << EPF__SIG_RANKS_BITS), "signature: EPF_MAX_RANKS field too narrow");
EPF_STATIC_ASSERT(EPF__MAX_EXPERTS_LIMIT - 1 < (1ll << EPF__SIG_EXPERTS_BITS), "signature: EPF_MAX_EXPERTS field too narrow");
EPF_STATIC_ASSERT(EPF__MAX_TOPK_LIMIT - 1 < (1ll << EPF__SIG_TOPK_BITS), "signature: EPF_MAX_TOPK field too narrow");
EPF_STATIC_ASSERT(EPF__MAX_TOKENS_LIMIT - 1 < (1ll << EPF__SIG_TOKENS_BITS), "signature: EPF_MAX_TOKENS_PER_RANK field too narrow");
EPF_STATIC_ASSERT(30 < (1ll << EPF__SIG_ALIGN_BITS) && EPF__ALIGN_LIMIT == (1 << 30), "signature: EPF_ALIGN field too narrow");
EPF_STATIC_ASSERT(1 < (1ll << EPF__SIG_TIMEOUT_BITS), "signature: EPF_ENABLE_TIMEOUT field too narrow");

/* log2 of a power of two in [1, 2^30] (a constant expression) */
#define EPF__LOG2_POW2(x)                                                                                   \
  ((int)(((unsigned long long)(x) >> 1) != 0) + (int)(((unsigned long long)(x) >> 2) != 0) +                 \
   (int)(((unsigned long long)(x) >> 3) != 0) + (int)(((unsigned long long)(x) >> 4) != 0) +                 \
   (int)(((unsigned long long)(x) >> 5) != 0) + (int)(((unsigned long long)(x) >> 6) != 0) +                 \
   (int)(((unsigned long long)(x) >> 7) != 0) + (int)(((unsigned long long)(x) >> 8) != 0) +                 \
   (int)(((unsigned long long)(x) >> 9) != 0) + (int)(((unsigned long long)(x) >> 10) != 0) +                \
   (int)(((unsigned long long)(x) >> 11) != 0) + (int)(((unsigned long long)(x) >> 12) != 0) +               \
   (int)(((unsigned long long)(x) >> 13) != 0) + (int)(((unsigned long long)(x) >> 14) != 0) +               \
   (int)(((unsigned long long)(x) >> 15) != 0) + (int)(((unsigned long long)(x) >> 16) != 0) +               \
   (int)(((unsigned long long)(x) >> 17) != 0) + (int)(((unsigned long long)(x) >> 18) != 0) +               \
   (int)(((unsigned long long)(x) >> 19) != 0) + (int)(((unsigned long long)(x) >> 20) != 0) +               \
   (int)(((unsigned long long)(x) >> 21) != 0) + (int)(((unsigned long long)(x) >> 22) != 0) +               \
   (int)(((unsigned long long)(x) >> 23) != 0) + (int)(((unsigned long long)(x) >> 24) != 0) +               \
   (int)(((unsigned long long)(x) >> 25) != 0) + (int)(((unsigned long long)(x) >> 26) != 0) +               \
   (int)(((unsigned long long)(x) >> 27) != 0) + (int)(((unsigned long long)(x) >> 28) != 0) +               \
   (int)(((unsigned long long)(x) >> 29) != 0) + (int)(((unsigned long long)(x) >> 30) != 0))

/* one field: `value` (already offset: limit - 1, log2, 0/1) masked to its width, at its place */
#define EPF__SIG_FIELD(value, FIELD) \
  (((uint64_t)(value) & ((1ull << EPF__SIG_##FIELD##_BITS) - 1u)) << EPF__SIG_##FIELD##_SHIFT)
#define EPF__SIG_PACK(max_ranks, max_experts, max_topk, max_tokens, align_log2, timeout)                       \
  (EPF__SIG_FIELD((max_ranks) - 1, RANKS) | EPF__SIG_FIELD((max_experts) - 1, EXPERTS) |                         \
   EPF__SIG_FIELD((max_topk) - 1, TOPK) | EPF__SIG_FIELD((max_tokens) - 1, TOKENS) |                             \
   EPF__SIG_FIELD(align_log2, ALIGN) | EPF__SIG_FIELD((timeout) != 0, TIMEOUT))
#define EPF__SIG_GET(sig, FIELD) \
  (((uint64_t)(sig) >> EPF__SIG_##FIELD##_SHIFT) & ((1ull << EPF__SIG_##FIELD##_BITS) - 1u))

#define EPF_CONFIG_SIGNATURE                                                                        \
  EPF__SIG_PACK(EPF_MAX_RANKS, EPF_MAX_EXPERTS, EPF_MAX_TOPK, EPF_MAX_TOKENS_PER_RANK, EPF__LOG2_POW2(EPF_ALIGN), \
                EPF_ENABLE_TIMEOUT)

#endif /* EPF_CONFIG_H */
/* SPDX-License-Identifier: Apache-2.0 */
