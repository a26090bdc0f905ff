/* epfuse/core/bf16.cuh — BF16 vectors in the k-order FP32 sum: the fused multiply-add step and the rounding back — part of epfuse v0.1
 *
 * What it is: the two steps on 16-byte BF16 vectors (8 elements) that every combine, HT (ht/) and
 * LL (ll/), pull and push, forward and backward, builds its k-order FP32 reduction from:
 * acc = fma(w_k, y_k, acc) over k ascending from acc = 0, then one rounding to BF16.
 *
 * What it does NOT do: load, store or weigh rows (the combines do).
 *
 * Contents:
 *   void  epf_bf16x8_fma(float acc[8], uint4 v, float w)   one 16-byte BF16 vector into FP32 accumulators
 *   uint4 epf_bf16x8_from_f32(const float acc[8])          RNE back to BF16
 *
 * Requirements: CUDA, sm_80+ for the BF16 conversions (sm_90 / sm_100 tested), cuda_bf16.h.
 */
#ifndef EPF_CORE_BF16_CUH
#define EPF_CORE_BF16_CUH

#include <cuda_bf16.h>

#include "../config.h"

#if !EPF_IS_CUDA
#error "epfuse/core/bf16.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

EPF_BEGIN_DECLS

/* epf_bf16x8_fma — acc[i] = fma(w, bf16 element i of v, acc[i]) for the 8 BF16 values of v.
 *   Scope: any thread. Exact: BF16 -> FP32 is exact; one rounding per fma. */
EPF_DEVICE_INLINE void epf_bf16x8_fma(float* acc, uint4 v, float w) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  int i;
#pragma unroll
  for (i = 0; i < 4; ++i) {
    acc[2 * i] = __fmaf_rn(w, __uint_as_float(words[i] << 16), acc[2 * i]);
    acc[2 * i + 1] = __fmaf_rn(w, __uint_as_float(words[i] & 0xffff0000u), acc[2 * i + 1]);
  }
}

/* epf_bf16x8_from_f32 — 8 FP32 values to 8 BF16 (round to nearest even; NaN -> 0x7fff). */
EPF_DEVICE_INLINE uint4 epf_bf16x8_from_f32(const float* acc) {
  uint32_t words[4];
  int i;
#pragma unroll
  for (i = 0; i < 4; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
    words[i] = *(const uint32_t*)&h;
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

EPF_END_DECLS

#endif /* EPF_CORE_BF16_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
