/* epfuse/quant/quant.cuh — MXFP8 and per-128 FP8 quantization blocks, bit-exact and at memory speed — part of epfuse v0.1
 *
 * What it is: the quantization building blocks dispatch and combine use, and that users call in
 * their own kernels:
 *   - MXFP8: E4M3 elements + one E8M0 scale byte per 32 elements, scale rule RCEIL (default; cuBLAS,
 *     TransformerEngine) or FLOOR (OCP MX v1.0). BF16 or FP32 rows in.
 *   - per-128 FP8 (DeepSeek-V3 / DeepEP): E4M3 elements + one FP32 scale amax/448 per 128 elements
 *     (amax floored at 1e-4), optionally rounded up to a power of two (UE8M0).
 *   - scale writers for the compact row-major [rows, H/32] layout and the swizzled 128x4 layout
 *     Blackwell block-scaled GEMMs read; dequantize, and the fused "dequantize x weight, accumulate
 *     in FP32" step of combine.
 *   - EPF_HD scalar reference functions of every rule, usable from host code and tests; every
 *     device block is bit-identical to them (tests/gpu/test_quant, scripts/check_quant_torch.py).
 * The exact rules, edge cases (NaN, Inf, zeros, subnormals) and how they compare with torchao and
 * DeepGEMM are in docs/quant.md.
 *
 * Three levels, pick the one that matches what your code has in registers:
 *   row      epf_*_quantize_row_{bf16,f32}_warp: a warp quantizes one row in memory.
 *   lane8    epf_*_quantize_lane8[_bf16]_warp: a warp quantizes a 256-element chunk it holds, lane l
 *            with elements [8l, 8l+8) (one 16-byte BF16 load); MXFP8 groups are quads of lanes
 *            (amax by 2 shuffles), per-128 groups are half-warps (4 shuffles).
 *   thread   epf_mxfp8_quantize_block32 (one thread holds a whole 32-block), and
 *            epf_mxfp8_quantize8 / epf_fp8_128_quantize8 for code that reduced the amax itself and
 *            got the scale from epf_e8m0_from_amax / epf_fp8_128_scale.
 *
 * What it does NOT do: allocate, launch kernels, move data between ranks or order anything (the
 * stores are plain; publish with signal.cuh), or depend on -ftz / fast-math flags (every rounding
 * is explicit). It never reads or writes past `hidden` elements of a row.
 *
 * Usage (a fused kernel; tests/gpu/test_quant.cu "example-begin quant-fused" compiles it):
 *   // one warp per row: BF16 in, MXFP8 out, swizzled scales for a block-scaled GEMM
 *   if (epf_quant_check(H, EPF_PAYLOAD_MXFP8) != EPF_OK) ...                       // host
 *   epf_mxfp8_quantize_row_bf16_warp(x + row * H, H, EPF_MX_RCEIL, row,
 *                                    EPF_SCALE_LAYOUT_SWIZZLED_128X4, q + row * H, sf);
 *   epf_scale_swizzle_zero_padding(sf, rows, H / 32, global_thread, total_threads);
 *   // or from registers, e.g. inside a dispatch send loop:
 *   uint4 v = ((const uint4*)src_row)[chunk * 32 + lane];        // 8 BF16 per lane
 *   uint8_t sb;
 *   uint2 e4m3 = epf_mxfp8_quantize_lane8_bf16_warp(v, EPF_MX_RCEIL, &sb);
 *   ((uint2*)dst_row)[chunk * 32 + lane] = e4m3;
 *   if ((lane & 3) == 0) dst_scales[chunk * 8 + lane / 4] = sb;
 *
 * COMPILE-TIME OPTIONS (none has to agree across translation units: results never change):
 *   EPF_QUANT_UNROLL    default 4: 256-element chunks (16-byte loads per lane) in flight per warp
 *                       in the row functions.
 *   EPF_QUANT_HW_E8M0   default 1: use cvt.rp.satfinite.ue8m0x2.f32 on arch-family targets that
 *                       have it (sm_100f / sm_100a ...); 0: the integer path everywhere.
 *   EPF_DEBUG           (config.h) traps on misaligned pointers / bad hidden in the row functions.
 *
 * Contents ([HD] = EPF_HD, host or device, any thread; [T] = device, any thread;
 *           [W] = [collective:warp], all 32 lanes converged):
 *   constants   epf_mx_rule_t {EPF_MX_RCEIL, EPF_MX_FLOOR}, EPF_MXFP8_GROUP (32),
 *               EPF_FP8_128_GROUP (128), EPF_E4M3_MAX, EPF_FP8_128_AMAX_MIN (1e-4)
 *   [HD] float    epf_bf16_to_float(uint16_t bits)
 *   [HD] uint8_t  epf_e4m3_from_float(float x)                       RNE, satfinite, NaN -> 0x7F
 *   [HD] float    epf_e4m3_to_float(uint8_t q)
 *   [HD] uint8_t  epf_e8m0_roundup(float v)                          smallest 2^k >= v, sat 0xFE
 *   [HD] uint8_t  epf_e8m0_from_amax_rceil(float amax) / _floor(float amax)
 *   [HD] uint8_t  epf_e8m0_from_amax(float amax, int rule)
 *   [HD] float    epf_e8m0_to_float(uint8_t b)                       2^(b-127); 0 -> 2^-127; 255 -> NaN
 *   [HD] float    epf_e8m0_quant_multiplier(uint8_t b)               2^(127-b); 254 -> 2^-127
 *   [HD] uint8_t  epf_mxfp8_quantize_ref(float x, uint8_t scale)
 *   [HD] float    epf_mxfp8_dequantize_ref(uint8_t q, uint8_t scale)
 *   [HD] float    epf_mxfp8_dequantize_accumulate_ref(uint8_t q, uint8_t scale, float w, float acc)
 *   [HD] uint8_t  epf_mxfp8_quantize_block_ref(const float* x32, int rule, uint8_t* out_q32)
 *   [HD] float    epf_fp8_128_scale(float amax, bool ue8m0)
 *   [HD] float    epf_fp8_128_recip(float scale)
 *   [HD] uint8_t  epf_fp8_128_quantize_ref(float x, float scale)
 *   [HD] float    epf_fp8_128_dequantize_ref(uint8_t q, float scale)
 *   [HD] float    epf_fp8_128_dequantize_accumulate_ref(uint8_t q, float scale, float w, float acc)
 *   [HD] float    epf_fp8_128_quantize_block_ref(const float* x128, bool ue8m0, uint8_t* out_q128)
 *   [HD] int64_t  epf_scale_swizzle_offset(int64_t row, int col, int n_scale_cols)
 *   [HD] int64_t  epf_scale_swizzle_bytes(int64_t rows, int n_scale_cols)
 *   [HD] int64_t  epf_scale_offset(int scale_layout, int64_t row, int col, int n_scale_cols)
 *   [HD] int64_t  epf_scale_bytes(int scale_layout, int64_t rows, int n_scale_cols)
 *   [HD] void     epf_scale_swizzle_zero_padding(uint8_t* scales, int64_t rows, int n_scale_cols,
 *                                                int64_t index, int64_t stride)
 *   [HD] epf_status_t epf_quant_check(int hidden, int payload)
 *   [HD] int      epf_mx_rule_from_flags(uint32_t flags); bool epf_fp8_128_ue8m0_from_flags(uint32_t)
 *   [HD] float    epf_fp8_128_scale_fast(float amax, bool ue8m0, float* out_recip)  the device's scale and RN(1/s)
 *   lane steps for fused quantizers that reduce a group's amax themselves (the HT quantizing send):
 *   [T]  void     epf_bf16x8_to_float(uint4 x8, float* out8)
 *   [T]  float    epf_amax8_bf16(uint4 x8)
 *   [T]  uint8_t  epf_e8m0_from_amax_nonneg(float amax, int rule)
 *   [T]  uint2    epf_fp8_128_quantize8_steps(const float* v8, float scale, float recip, bool two_steps)
 *   [T]  uint2    epf_mxfp8_quantize8(const float* v8, uint8_t scale)
 *   [W]  uint2    epf_mxfp8_quantize_lane8_warp(const float* v8, int rule, uint8_t* out_scale)
 *   [W]  uint2    epf_mxfp8_quantize_lane8_bf16_warp(uint4 x8, int rule, uint8_t* out_scale)
 *   [T]  uint8_t  epf_mxfp8_quantize_block32(const float* v32, int rule, uint32_t* out_q8)
 *   [W]  void     epf_mxfp8_quantize_row_bf16_warp(const void* x, int hidden, int rule, int64_t row,
 *                                                  int scale_layout, uint8_t* out_q, uint8_t* out_scales)
 *   [W]  void     epf_mxfp8_quantize_row_f32_warp(const float* x, ...same...)
 *   [T]  void     epf_mxfp8_dequantize8(uint2 q, uint8_t scale, float* out8)
 *   [T]  void     epf_mxfp8_dequantize_accumulate8(uint2 q, uint8_t scale, float w, float* acc8)
 *   [W]  void     epf_mxfp8_dequantize_row_f32_warp(const uint8_t* q, const uint8_t* scales, int hidden,
 *                                                   float* out)
 *   [W]  void     epf_mxfp8_dequantize_accumulate_row_warp(const uint8_t* q, const uint8_t* scales,
 *                                                          int hidden, float w, float* acc)
 *   [T]  uint2    epf_fp8_128_quantize8(const float* v8, float scale, float recip)
 *   [W]  uint2    epf_fp8_128_quantize_lane8_warp(const float* v8, bool ue8m0, float* out_scale)
 *   [W]  uint2    epf_fp8_128_quantize_lane8_bf16_warp(uint4 x8, bool ue8m0, float* out_scale)
 *   [W]  void     epf_fp8_128_quantize_row_bf16_warp(const void* x, int hidden, bool ue8m0,
 *                                                    int64_t scale_stride, uint8_t* out_q, float* out_scales)
 *   [W]  void     epf_fp8_128_quantize_row_f32_warp(const float* x, ...same...)
 *   [T]  void     epf_fp8_128_dequantize8(uint2 q, float scale, float* out8)
 *   [T]  void     epf_fp8_128_dequantize_accumulate8(uint2 q, float scale, float w, float* acc8)
 *   [W]  void     epf_fp8_128_dequantize_row_f32_warp(const uint8_t* q, const float* scales,
 *                                                     int64_t scale_stride, int hidden, float* out)
 *
 * Requirements: CUDA >= 12.8 (nvcc or clang-cuda), C++17. Device code: sm_70+; sm_89+ (and sm_90 /
 * sm_100, both tested) use the FP8 conversion instructions, older targets the integer reference,
 * with identical results. Row pointers 16-byte aligned (x), 8-byte aligned (E4M3 out).
 */
#ifndef EPF_QUANT_QUANT_CUH
#define EPF_QUANT_QUANT_CUH

#include "../config.h"
#include "../host.h"
#include "../status.h"

#if !EPF_IS_CUDA
#error "epfuse/quant/quant.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

/* the declarations and their contracts sit with the definitions (cglm style), by part: */
#include "impl/scalar.cuh"   /* EPF_HD reference rules, scale layouts, epf_quant_check */
#include "impl/mxfp8.cuh"    /* MXFP8 device blocks */
#include "impl/fp8_128.cuh"  /* per-128 FP8 device blocks */

#endif /* EPF_QUANT_QUANT_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
