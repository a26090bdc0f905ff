/* epfuse/quant/impl/fp8_128.cuh — per-128 FP8 device blocks (DeepSeek-V3 / DeepEP): lane quantize, dequantize — part of epfuse v0.1
 *
 * What it is: the device half of per-128 FP8 (E4M3 elements + one FP32 scale per 128 elements)
 * from quant/quant.cuh, bit-identical to the scalar reference of quant/impl/scalar.cuh. Include
 * epfuse/quant/quant.cuh, not this file (it stands alone too, for the compile tests).
 *
 * Register layout ("lane8", as for MXFP8): lane l of a warp holds elements [8l, 8l + 8) of a
 * 256-element chunk; each half-warp (lanes 0-15, 16-31) holds one 128-element scale group.
 *
 * Division: elements are RNE_satfinite_e4m3(fl(x / s)). The blocks compute fl(x / s) without a
 * division per element: y = RN(1/s) once per group, then x * y when that is exact (s a power of
 * two: UE8M0 scales, or s = Inf), else two Markstein FMA correction steps (epf__fdiv_markstein),
 * which give the correctly rounded quotient. tests/unit/test_quant_host checks both against IEEE
 * division.
 *
 * The row quantizers (epf_fp8_128_quantize_row_*_warp) are in quant/impl/rows.cuh: one row loop
 * for both formats.
 *
 * Contents: see quant/quant.cuh.
 *
 * Requirements: CUDA, sm_70+ (sm_89+ uses cvt.rn.satfinite.e4m3x2.f32 and cvt.rn.f16x2.e4m3x2).
 */
#ifndef EPF_QUANT_IMPL_FP8_128_CUH
#define EPF_QUANT_IMPL_FP8_128_CUH

#include "../../config.h"
#include "mxfp8.cuh"
#include "scalar.cuh"

#if !EPF_IS_CUDA
#error "epfuse/quant/impl/fp8_128.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

EPF_BEGIN_DECLS

EPF_DEVICE_INLINE uint2 epf_fp8_128_quantize8_steps(const float* v, float s, float y, bool two_steps) {
  float q[8];
  uint2 r;
  int i;
  if (epf__fp8_128_recip_exact(s)) { /* UE8M0 (power of two) or Inf scale: x * y is x / s */
#pragma unroll
    for (i = 0; i < 8; ++i) q[i] = epf__fmul_rn(v[i], y);
  } else if (two_steps) {
#pragma unroll
    for (i = 0; i < 8; ++i) q[i] = epf__fdiv_markstein(v[i], s, y);
  } else {
#pragma unroll
    for (i = 0; i < 8; ++i) q[i] = epf__fdiv_markstein1(v[i], s, y);
  }
  r.x = epf__e4m3x4(q[0], q[1], q[2], q[3]);
  r.y = epf__e4m3x4(q[4], q[5], q[6], q[7]);
  return r;
}

EPF_DEVICE_INLINE uint2 epf_fp8_128_quantize8(const float* v, float s, float y) {
  return epf_fp8_128_quantize8_steps(v, s, y, true);
}

/* the half-warp group's scale and the lane's bytes */
EPF_DEVICE_INLINE uint2 epf__fp8_128_lane8(const float* v, bool ue8m0, bool two_steps, float* out_scale) {
  float a = epf__amax8(v), s, y;
  a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 1));
  a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 2));
  a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 4));
  a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 8));
  s = epf_fp8_128_scale_fast(a, ue8m0, &y); /* the 1e-4 floor also maps an all-NaN amax to 1e-4 */
  *out_scale = s;
  return epf_fp8_128_quantize8_steps(v, s, y, two_steps);
}

EPF_DEVICE_INLINE uint2 epf_fp8_128_quantize_lane8_warp(const float* v, bool ue8m0, float* out_scale) {
  return epf__fp8_128_lane8(v, ue8m0, true, out_scale);
}

EPF_DEVICE_INLINE uint2 epf_fp8_128_quantize_lane8_bf16_warp(uint4 x, bool ue8m0, float* out_scale) {
  float v[8];
  epf_bf16x8_to_float(x, v);
  return epf__fp8_128_lane8(v, ue8m0, false, out_scale);
}

EPF_DEVICE_INLINE void epf_fp8_128_dequantize8(uint2 q, float s, float* out) {
  float f[8];
  int i;
  epf__e4m3x4_to_float(q.x, f);
  epf__e4m3x4_to_float(q.y, f + 4);
#pragma unroll
  for (i = 0; i < 8; ++i) out[i] = epf__fmul_rn(f[i], s);
}

EPF_DEVICE_INLINE void epf_fp8_128_dequantize_accumulate8(uint2 q, float s, float weight, float* acc) {
  float f[8];
  int i;
  epf__e4m3x4_to_float(q.x, f);
  epf__e4m3x4_to_float(q.y, f + 4);
#pragma unroll
  for (i = 0; i < 8; ++i) acc[i] = epf__fma_rn(epf__fmul_rn(f[i], s), weight, acc[i]);
}

/* epf__fp8_128_store — the lane's 8 bytes, and the group's scale from the half-warp's first lane */
EPF_DEVICE_INLINE void epf__fp8_128_store(uint2 q, float s, int i, int lane, int64_t scale_stride, uint8_t* out_q,
                                          float* out_scales) {
  ((uint2*)out_q)[i] = q;
  if ((lane & 15) == 0) out_scales[(int64_t)(i >> 4) * scale_stride] = s;
}

EPF_DEVICE_INLINE void epf_fp8_128_dequantize_row_f32_warp(const uint8_t* q, const float* scales, int64_t scale_stride,
                                                          int hidden, float* out) {
  const int lane = (int)(threadIdx.x & 31u);
  const int nvec = hidden >> 3;
  const uint2* qv = (const uint2*)q;
  float4* ov = (float4*)out;
  int i;
  EPF__QUANT_CHECK(hidden > 0 && (hidden & 127) == 0);
  EPF__QUANT_CHECK(EPF__QUANT_ALIGNED(q, 8) && EPF__QUANT_ALIGNED(out, 16));
  for (i = lane; i < nvec; i += 32) {
    float f[8];
    epf_fp8_128_dequantize8(qv[i], scales[(int64_t)(i >> 4) * scale_stride], f);
    ov[2 * i] = make_float4(f[0], f[1], f[2], f[3]);
    ov[2 * i + 1] = make_float4(f[4], f[5], f[6], f[7]);
  }
}

EPF_END_DECLS

#endif /* EPF_QUANT_IMPL_FP8_128_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
