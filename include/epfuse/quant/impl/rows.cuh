/* epfuse/quant/impl/rows.cuh — the row quantizers of both FP8 formats: one row loop — part of epfuse v0.1
 *
 * What it is: epf_mxfp8_quantize_row_{bf16,f32}_warp and epf_fp8_128_quantize_row_{bf16,f32}_warp
 * of quant/quant.cuh, as one private row loop (epf__quant_row_warp) with the format and the input
 * type as constants: the loads of EPF_QUANT_UNROLL chunks in flight, then per chunk the format's
 * lane8 quantizer (quant/impl/mxfp8.cuh, quant/impl/fp8_128.cuh) and its store. Bit-identical to
 * the scalar references of quant/impl/scalar.cuh, as the lane8 blocks are. Include
 * epfuse/quant/quant.cuh, not this file (it stands alone too, for the compile tests).
 *
 * Contents: see quant/quant.cuh.
 *
 * Requirements: CUDA, sm_70+ (sm_89+ uses cvt.rn.satfinite.e4m3x2.f32 and cvt.rn.f16x2.e4m3x2).
 */
#ifndef EPF_QUANT_IMPL_ROWS_CUH
#define EPF_QUANT_IMPL_ROWS_CUH

#include "../../config.h"
#include "mxfp8.cuh"
#include "fp8_128.cuh"

#if !EPF_IS_CUDA
#error "epfuse/quant/impl/rows.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

EPF_BEGIN_DECLS

/* The formats of epf__quant_row_warp (its `fmt`, a literal at every call). */
#define EPF__QR_MXFP8 0   /* E4M3 + one E8M0 byte per 32 (epf_mxfp8_quantize_lane8_*warp) */
#define EPF__QR_FP8_128 1 /* E4M3 + one FP32 scale per 128 (epf_fp8_128_quantize_lane8_*warp) */

/* epf__quant_row_warp — the row loop of the four row quantizers: nvec = hidden / 8 lane vectors of
 *   x (BF16, or FP32 when f32), EPF_QUANT_UNROLL chunks of 32 vectors per step with all their
 *   loads in flight first; per chunk the lanes' lane8 quantizer of format fmt (an EPF__QR_*; rule:
 *   the MXFP8 scale rule; ue8m0: the per-128 scale kind) and its store: 8 E4M3 bytes at vector i
 *   of out_q, and the scale (MXFP8: byte of group i / 4 at sf_row + epf__mxfp8_scale_col, swizzled
 *   or not; per-128: float of group i / 16 at out_scales[(i / 16) * scale_stride]).
 *   fmt and f32 are constants at every call, so each row quantizer carries only its own step.
 *   Scope: [collective:warp] [uniform-args]. */
EPF_DEVICE_INLINE void epf__quant_row_warp(const void* x, int nvec, int fmt, bool f32, int rule, bool ue8m0,
                                           bool swizzled, uint8_t* sf_row, int64_t scale_stride, float* out_scales,
                                           uint8_t* out_q) {
  const int lane = (int)(threadIdx.x & 31u);
  const uint4* xv = (const uint4*)x;
  const float4* xf = (const float4*)x;
  int base;
  for (base = 0; base < nvec; base += 32 * EPF_QUANT_UNROLL) {
    uint4 in[EPF_QUANT_UNROLL];       /* BF16 */
    float4 inf[2 * EPF_QUANT_UNROLL]; /* FP32 */
    int u;
    if (f32) {
      epf__f32_chunk_load(xf, base, nvec, inf);
    } else {
#pragma unroll
      for (u = 0; u < EPF_QUANT_UNROLL; ++u) {
        const int i = base + 32 * u + lane;
        in[u] = i < nvec ? xv[i] : make_uint4(0u, 0u, 0u, 0u);
      }
    }
#pragma unroll
    for (u = 0; u < EPF_QUANT_UNROLL; ++u) {
      const int i = base + 32 * u + lane;
      if (base + 32 * u < nvec) { /* warp-uniform: skip chunks wholly past the row's end */
        float v[8];
        uint2 q;
        if (f32) epf__f32x8_unpack(inf[2 * u], inf[2 * u + 1], v);
        if (fmt == EPF__QR_MXFP8) {
          uint8_t scale;
          q = f32 ? epf_mxfp8_quantize_lane8_warp(v, rule, &scale) : epf_mxfp8_quantize_lane8_bf16_warp(in[u], rule, &scale);
          if (i < nvec) epf__mxfp8_store(q, scale, i, lane, swizzled, out_q, sf_row);
        } else {
          float s;
          q = f32 ? epf_fp8_128_quantize_lane8_warp(v, ue8m0, &s) : epf_fp8_128_quantize_lane8_bf16_warp(in[u], ue8m0, &s);
          if (i < nvec) epf__fp8_128_store(q, s, i, lane, scale_stride, out_q, out_scales);
        }
      }
    }
  }
}

EPF_DEVICE_INLINE void epf_mxfp8_quantize_row_bf16_warp(const void* x, int hidden, int rule, int64_t row,
                                                       int scale_layout, uint8_t* out_q, uint8_t* out_scales) {
  EPF__QUANT_CHECK(hidden > 0 && (hidden & 31) == 0);
  EPF__QUANT_CHECK(EPF__QUANT_ALIGNED(x, 16) && EPF__QUANT_ALIGNED(out_q, 8));
  epf__quant_row_warp(x, hidden >> 3, EPF__QR_MXFP8, false, rule, false, scale_layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4,
                      epf__mxfp8_scale_row(out_scales, scale_layout, row, hidden >> 5), 0, NULL, out_q);
}

EPF_DEVICE_INLINE void epf_mxfp8_quantize_row_f32_warp(const float* x, int hidden, int rule, int64_t row,
                                                      int scale_layout, uint8_t* out_q, uint8_t* out_scales) {
  EPF__QUANT_CHECK(hidden > 0 && (hidden & 31) == 0);
  EPF__QUANT_CHECK(EPF__QUANT_ALIGNED(x, 16) && EPF__QUANT_ALIGNED(out_q, 8));
  epf__quant_row_warp(x, hidden >> 3, EPF__QR_MXFP8, true, rule, false, scale_layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4,
                      epf__mxfp8_scale_row(out_scales, scale_layout, row, hidden >> 5), 0, NULL, out_q);
}

EPF_DEVICE_INLINE void epf_fp8_128_quantize_row_bf16_warp(const void* x, int hidden, bool ue8m0, int64_t scale_stride,
                                                         uint8_t* out_q, float* out_scales) {
  EPF__QUANT_CHECK(hidden > 0 && (hidden & 127) == 0);
  EPF__QUANT_CHECK(EPF__QUANT_ALIGNED(x, 16) && EPF__QUANT_ALIGNED(out_q, 8) && EPF__QUANT_ALIGNED(out_scales, 4));
  epf__quant_row_warp(x, hidden >> 3, EPF__QR_FP8_128, false, 0, ue8m0, false, NULL, scale_stride, out_scales, out_q);
}

EPF_DEVICE_INLINE void epf_fp8_128_quantize_row_f32_warp(const float* x, int hidden, bool ue8m0, int64_t scale_stride,
                                                        uint8_t* out_q, float* out_scales) {
  EPF__QUANT_CHECK(hidden > 0 && (hidden & 127) == 0);
  EPF__QUANT_CHECK(EPF__QUANT_ALIGNED(x, 16) && EPF__QUANT_ALIGNED(out_q, 8) && EPF__QUANT_ALIGNED(out_scales, 4));
  epf__quant_row_warp(x, hidden >> 3, EPF__QR_FP8_128, true, 0, ue8m0, false, NULL, scale_stride, out_scales, out_q);
}

EPF_END_DECLS

#endif /* EPF_QUANT_IMPL_ROWS_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
