/* epfuse/quant/impl/mxfp8.cuh — MXFP8 device blocks: lane and warp quantize, row dequantize, fused dequant x weight — part of epfuse v0.1
 *
 * What it is: the device half of MXFP8 (E4M3 elements + one E8M0 scale per 32 elements) from
 * quant/quant.cuh, bit-identical to the scalar reference of quant/impl/scalar.cuh. Include
 * epfuse/quant/quant.cuh, not this file (it stands alone too, for the compile tests).
 *
 * Register layout ("lane8"): a warp works on a 256-element chunk of a row; lane l holds elements
 * [8l, 8l + 8) of it (one uint4 of BF16, or 8 floats); lanes 4g..4g+3 (a "quad") hold the 32
 * elements of scale group g of the chunk, in lane order. A lane's 8 E4M3 bytes are one uint2, so a
 * warp stores 256 contiguous bytes per chunk. This is what a warp that streams a row with 16-byte
 * loads has in its registers, so fused code (dispatch sends, GEMM epilogues) calls the lane8
 * functions straight from registers.
 *
 * The row quantizers (epf_mxfp8_quantize_row_*_warp) are in quant/impl/rows.cuh: one row loop for
 * both formats.
 *
 * Contents: see quant/quant.cuh.
 *
 * Requirements: CUDA, sm_70+ (sm_89+ uses cvt.rn.satfinite.e4m3x2.f32 and cvt.rn.f16x2.e4m3x2).
 */
#ifndef EPF_QUANT_IMPL_MXFP8_CUH
#define EPF_QUANT_IMPL_MXFP8_CUH

#include "../../config.h"
#include "../../host.h"
#include "scalar.cuh"

#if !EPF_IS_CUDA
#error "epfuse/quant/impl/mxfp8.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif


/* Debug-only contract checks of the row functions (alignment, hidden). */
#if EPF_DEBUG
#define EPF__QUANT_CHECK(c) EPF_DEVICE_ASSERT(c)
#else
#define EPF__QUANT_CHECK(c) ((void)0)
#endif
#define EPF__QUANT_ALIGNED(p, a) ((((uintptr_t)(const void*)(p)) & (uintptr_t)((a) - 1)) == 0u)

EPF_BEGIN_DECLS

/* ============================================================================================ */
/* Private lane helpers                                                                          */
/* ============================================================================================ */


/* epf__f32_chunk_load — the FP32 row quantizers' chunk load: lane's vector base + 32 u (u <
 * EPF_QUANT_UNROLL) as two float4 each, zeros past nvec; every load in flight before the first use. */
EPF_DEVICE_INLINE void epf__f32_chunk_load(const float4* xv, int base, int nvec, float4* in) {
  const int lane = (int)(threadIdx.x & 31u);
  int u;
#pragma unroll
  for (u = 0; u < EPF_QUANT_UNROLL; ++u) {
    const int i = base + 32 * u + lane;
    const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    in[2 * u] = i < nvec ? xv[2 * i] : z;
    in[2 * u + 1] = i < nvec ? xv[2 * i + 1] : z;
  }
}

/* epf__f32x8_unpack — a lane's 8 consecutive floats (two 16-byte vectors) as an array: the FP32
 * row quantizers of both formats load their inputs this way. */
EPF_DEVICE_INLINE void epf__f32x8_unpack(float4 a, float4 b, float* v) {
  v[0] = a.x;
  v[1] = a.y;
  v[2] = a.z;
  v[3] = a.w;
  v[4] = b.x;
  v[5] = b.y;
  v[6] = b.z;
  v[7] = b.w;
}

/* four floats -> four E4M3 bytes, element i in byte i (little endian: memory order) */
EPF_DEVICE_INLINE uint32_t epf__e4m3x4(float v0, float v1, float v2, float v3) {
#if EPF__QUANT_HAS_E4M3_CVT
  uint32_t r;
  /* cvt ...e4m3x2.f32 d, a, b puts a in the UPPER byte of d: pass (v1, v0) and (v3, v2) */
  asm("{\n\t"
      ".reg .b16 lo, hi;\n\t"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n\t"
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n\t"
      "mov.b32 %0, {lo, hi};\n\t"
      "}"
      : "=r"(r)
      : "f"(v0), "f"(v1), "f"(v2), "f"(v3));
  return r;
#else
  return (uint32_t)epf__e4m3_from_float_soft(v0) | ((uint32_t)epf__e4m3_from_float_soft(v1) << 8) |
         ((uint32_t)epf__e4m3_from_float_soft(v2) << 16) | ((uint32_t)epf__e4m3_from_float_soft(v3) << 24);
#endif
}

/* four E4M3 bytes (byte i = element i) -> four exact floats */
EPF_DEVICE_INLINE void epf__e4m3x4_to_float(uint32_t w, float* out4) {
#if EPF__QUANT_HAS_E4M3_CVT
  uint32_t h01, h23;
  float f0, f1, f2, f3;
  /* cvt.rn.f16x2.e4m3x2: the low byte becomes the low half (exact: E4M3 is a subset of F16) */
  asm("{\n\t"
      ".reg .b16 lo, hi;\n\t"
      "mov.b32 {lo, hi}, %2;\n\t"
      "cvt.rn.f16x2.e4m3x2 %0, lo;\n\t"
      "cvt.rn.f16x2.e4m3x2 %1, hi;\n\t"
      "}"
      : "=r"(h01), "=r"(h23)
      : "r"(w));
  asm("{\n\t"
      ".reg .f16 a, b, c, d;\n\t"
      "mov.b32 {a, b}, %4;\n\t"
      "mov.b32 {c, d}, %5;\n\t"
      "cvt.f32.f16 %0, a;\n\t"
      "cvt.f32.f16 %1, b;\n\t"
      "cvt.f32.f16 %2, c;\n\t"
      "cvt.f32.f16 %3, d;\n\t"
      "}"
      : "=f"(f0), "=f"(f1), "=f"(f2), "=f"(f3)
      : "r"(h01), "r"(h23));
  out4[0] = f0;
  out4[1] = f1;
  out4[2] = f2;
  out4[3] = f3;
#else
  out4[0] = epf_e4m3_to_float((uint8_t)(w & 0xffu));
  out4[1] = epf_e4m3_to_float((uint8_t)((w >> 8) & 0xffu));
  out4[2] = epf_e4m3_to_float((uint8_t)((w >> 16) & 0xffu));
  out4[3] = epf_e4m3_to_float((uint8_t)(w >> 24));
#endif
}

EPF_DEVICE_INLINE void epf_bf16x8_to_float(uint4 x, float* v) {
  v[0] = __uint_as_float(x.x << 16);
  v[1] = __uint_as_float(x.x & 0xffff0000u);
  v[2] = __uint_as_float(x.y << 16);
  v[3] = __uint_as_float(x.y & 0xffff0000u);
  v[4] = __uint_as_float(x.z << 16);
  v[5] = __uint_as_float(x.z & 0xffff0000u);
  v[6] = __uint_as_float(x.w << 16);
  v[7] = __uint_as_float(x.w & 0xffff0000u);
}

/* max |v[i]| over 8 values, NaN ignored (NaN only if all 8 are NaN; PTX max.f32 ignores quiet and
 * signalling NaN alike, as epf__fmax does). fabsf/fmaxf so the abs folds
 * into FMNMX; under -ftz they flush a subnormal |v| to 0, which never changes a scale byte (any amax
 * below 2^-118 gives byte 0 under both rules, and the per-128 floor is 1e-4). */
EPF_DEVICE_INLINE float epf__amax8(const float* v) {
  const float a01 = fmaxf(fabsf(v[0]), fabsf(v[1]));
  const float a23 = fmaxf(fabsf(v[2]), fabsf(v[3]));
  const float a45 = fmaxf(fabsf(v[4]), fabsf(v[5]));
  const float a67 = fmaxf(fabsf(v[6]), fabsf(v[7]));
  return fmaxf(fmaxf(a01, a23), fmaxf(a45, a67));
}

EPF_DEVICE_INLINE float epf_amax8_bf16(uint4 x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t m01, m23, m;
  asm("max.bf16x2 %0, %1, %2;" : "=r"(m01) : "r"(x.x & 0x7fff7fffu), "r"(x.y & 0x7fff7fffu));
  asm("max.bf16x2 %0, %1, %2;" : "=r"(m23) : "r"(x.z & 0x7fff7fffu), "r"(x.w & 0x7fff7fffu));
  asm("max.bf16x2 %0, %1, %2;" : "=r"(m) : "r"(m01), "r"(m23));
  return fmaxf(__uint_as_float(m << 16), __uint_as_float(m & 0xffff0000u));
#else
  float v[8];
  epf_bf16x8_to_float(x, v);
  return epf__amax8(v);
#endif
}

EPF_DEVICE_INLINE uint8_t epf_e8m0_from_amax_nonneg(float a, int rule) {
  return rule == EPF_MX_FLOOR ? epf_e8m0_from_amax_floor(a) : epf_e8m0_roundup(epf__fmul_rn(a, 1.0f / 448.0f));
}

/* ============================================================================================ */
/* Lane and thread primitives                                                                    */
/* ============================================================================================ */

EPF_DEVICE_INLINE uint2 epf_mxfp8_quantize8(const float* v, uint8_t scale) {
  const float m = epf_e8m0_quant_multiplier(scale);
  uint2 q;
  q.x = epf__e4m3x4(epf__fmul_rn(v[0], m), epf__fmul_rn(v[1], m), epf__fmul_rn(v[2], m), epf__fmul_rn(v[3], m));
  q.y = epf__e4m3x4(epf__fmul_rn(v[4], m), epf__fmul_rn(v[5], m), epf__fmul_rn(v[6], m), epf__fmul_rn(v[7], m));
  return q;
}

EPF_DEVICE_INLINE uint2 epf_mxfp8_quantize_lane8_warp(const float* v, int rule, uint8_t* out_scale) {
  float a = epf__amax8(v);
  uint8_t scale;
  a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 1));
  a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 2));
  a = fmaxf(a, 0.0f); /* an all-NaN group: amax 0 */
  scale = epf_e8m0_from_amax_nonneg(a, rule);
  *out_scale = scale;
  return epf_mxfp8_quantize8(v, scale);
}

EPF_DEVICE_INLINE uint2 epf_mxfp8_quantize_lane8_bf16_warp(uint4 x, int rule, uint8_t* out_scale) {
  float v[8];
  epf_bf16x8_to_float(x, v);
  return epf_mxfp8_quantize_lane8_warp(v, rule, out_scale);
}

EPF_DEVICE_INLINE uint8_t epf_mxfp8_quantize_block32(const float* v, int rule, uint32_t* out_q) {
  float a = 0.0f;
  uint8_t scale;
  int i;
#pragma unroll
  for (i = 0; i < 32; i += 8) a = fmaxf(a, epf__amax8(v + i));
  scale = epf_e8m0_from_amax_nonneg(a, rule);
#pragma unroll
  for (i = 0; i < 32; i += 8) {
    const uint2 q = epf_mxfp8_quantize8(v + i, scale);
    out_q[i / 4] = q.x;
    out_q[i / 4 + 1] = q.y;
  }
  return scale;
}

EPF_DEVICE_INLINE void epf_mxfp8_dequantize8(uint2 q, uint8_t scale, float* out) {
  const float s = epf_e8m0_to_float(scale);
  float f[8];
  int i;
  epf__e4m3x4_to_float(q.x, f);
  epf__e4m3x4_to_float(q.y, f + 4);
#pragma unroll
  for (i = 0; i < 8; ++i) out[i] = epf__fmul_rn(f[i], s);
}

EPF_DEVICE_INLINE void epf_mxfp8_dequantize_accumulate8(uint2 q, uint8_t scale, float weight, float* acc) {
  const float s = epf_e8m0_to_float(scale);
  float f[8];
  int i;
  epf__e4m3x4_to_float(q.x, f);
  epf__e4m3x4_to_float(q.y, f + 4);
#pragma unroll
  for (i = 0; i < 8; ++i) acc[i] = epf__fma_rn(epf__fmul_rn(f[i], s), weight, acc[i]);
}

/* ============================================================================================ */
/* Row functions                                                                                 */
/* ============================================================================================ */

/* epf__mxfp8_scale_row — where row `row`'s scale column 0 is; column c is then at
 * + epf__mxfp8_scale_col(c, swizzled) (the swizzle formula splits into a row and a column part). */
EPF_DEVICE_INLINE uint8_t* epf__mxfp8_scale_row(uint8_t* out_scales, int scale_layout, int64_t row, int n_scale_cols) {
  return out_scales + epf_scale_offset(scale_layout, row, 0, n_scale_cols);
}
EPF_DEVICE_INLINE int epf__mxfp8_scale_col(int col, bool swizzled) {
  return swizzled ? (((col >> 2) << 9) | (col & 3)) : col;
}

/* epf__mxfp8_store — the lane's 8 bytes of vector i, and the group's scale byte from the quad's
 * first lane. */
EPF_DEVICE_INLINE void epf__mxfp8_store(uint2 q, uint8_t scale, int i, int lane, bool swizzled, uint8_t* out_q,
                                        uint8_t* sf_row) {
  ((uint2*)out_q)[i] = q;
  if ((lane & 3) == 0) sf_row[epf__mxfp8_scale_col(i >> 2, swizzled)] = scale;
}

EPF_DEVICE_INLINE void epf_mxfp8_dequantize_row_f32_warp(const uint8_t* q, const uint8_t* scales, int hidden,
                                                        float* out) {
  const int lane = (int)(threadIdx.x & 31u);
  const int nvec = hidden >> 3;
  const uint2* qv = (const uint2*)q;
  float4* ov = (float4*)out;
  int i;
  EPF__QUANT_CHECK(hidden > 0 && (hidden & 31) == 0);
  EPF__QUANT_CHECK(EPF__QUANT_ALIGNED(q, 8) && EPF__QUANT_ALIGNED(out, 16));
  for (i = lane; i < nvec; i += 32) {
    float f[8];
    epf_mxfp8_dequantize8(qv[i], scales[i >> 2], f);
    ov[2 * i] = make_float4(f[0], f[1], f[2], f[3]);
    ov[2 * i + 1] = make_float4(f[4], f[5], f[6], f[7]);
  }
}

EPF_DEVICE_INLINE void epf_mxfp8_dequantize_accumulate_row_warp(const uint8_t* q, const uint8_t* scales, int hidden,
                                                               float weight, float* acc) {
  const int lane = (int)(threadIdx.x & 31u);
  const int nvec = hidden >> 3;
  const uint2* qv = (const uint2*)q;
  float4* av = (float4*)acc;
  int i;
  EPF__QUANT_CHECK(hidden > 0 && (hidden & 31) == 0);
  EPF__QUANT_CHECK(EPF__QUANT_ALIGNED(q, 8) && EPF__QUANT_ALIGNED(acc, 16));
  for (i = lane; i < nvec; i += 32) {
    const float4 a0 = av[2 * i], a1 = av[2 * i + 1];
    float a[8];
    a[0] = a0.x;
    a[1] = a0.y;
    a[2] = a0.z;
    a[3] = a0.w;
    a[4] = a1.x;
    a[5] = a1.y;
    a[6] = a1.z;
    a[7] = a1.w;
    epf_mxfp8_dequantize_accumulate8(qv[i], scales[i >> 2], weight, a);
    av[2 * i] = make_float4(a[0], a[1], a[2], a[3]);
    av[2 * i + 1] = make_float4(a[4], a[5], a[6], a[7]);
  }
}

EPF_END_DECLS

#endif /* EPF_QUANT_IMPL_MXFP8_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
