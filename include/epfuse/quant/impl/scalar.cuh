/* epfuse/quant/impl/scalar.cuh — EPF_HD scalar reference of every quantization rule, scale layouts and checks — part of epfuse v0.1
 *
 * What it is: the part of quant/quant.cuh that runs on the host as well as on the device (EPF_HD): the
 * exact rules of docs/quant.md as scalar functions. They are the reference the warp-level blocks
 * (quant/impl/mxfp8.cuh, quant/impl/fp8_128.cuh) are bit-identical to, and the functions host
 * code and tests call to produce or check quantized data. Include epfuse/quant/quant.cuh, not this file
 * (it stands alone too, for the compile tests).
 *
 * What it does NOT do: allocate, launch, or depend on the floating-point flags of the translation
 * unit: every rounding step is explicit (RN multiply, FMA, division and reciprocal as PTX without
 * .ftz on the device; IEEE float arithmetic on the host), so -ftz=true / --use_fast_math in the
 * user's build changes no result.
 *
 * COMPILE-TIME OPTIONS:
 *   EPF_QUANT_HW_E8M0  default 1: on arch-family targets that have it (sm_100f/sm_100a and later
 *                      families, __CUDA_ARCH_FAMILY_SPECIFIC__), epf_e8m0_roundup uses
 *                      cvt.rp.satfinite.ue8m0x2.f32. 0 forces the integer path everywhere.
 *                      Results are the same either way (tests/gpu/test_quant checks all 2^32 inputs).
 *
 * Contents: see quant/quant.cuh.
 *
 * Requirements: CUDA (nvcc or clang-cuda), C++17; device code sm_70+ (sm_89+ for the FP8
 * conversion instructions; older targets use the integer reference).
 */
#ifndef EPF_QUANT_IMPL_SCALAR_CUH
#define EPF_QUANT_IMPL_SCALAR_CUH

#if !defined(__CUDACC_RTC__) /* NVRTC declares the math functions itself */
#include <math.h>
#endif

#include "../../config.h"
#include "../../host.h"
#include "../../status.h"

#if !EPF_IS_CUDA
#error "epfuse/quant/impl/scalar.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif


/* The E8M0 instruction exists on the arch-family targets of Blackwell and later (the same test
 * cuda_fp8.h uses); generic sm_100 code and sm_90 use the integer path. */
#if defined(__CUDA_ARCH__) && EPF_QUANT_HW_E8M0 && defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && \
    (__CUDA_ARCH_FAMILY_SPECIFIC__ >= 1000) && (__CUDA_ARCH_FAMILY_SPECIFIC__ < 1300)
#define EPF__QUANT_HAS_UE8M0_CVT 1
#else
#define EPF__QUANT_HAS_UE8M0_CVT 0
#endif

/* cvt.rn.satfinite.e4m3x2.f32 / cvt.rn.f16x2.e4m3x2: sm_89 and later. */
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 890)
#define EPF__QUANT_HAS_E4M3_CVT 1
#else
#define EPF__QUANT_HAS_E4M3_CVT 0
#endif

EPF_BEGIN_DECLS

/* ============================================================================================ */
/* Constants                                                                                     */
/* ============================================================================================ */

/* MXFP8 scale rules (docs/quant.md). */
typedef enum epf_mx_rule {
  EPF_MX_RCEIL = 0, /* default: scale = E8M0 round-up of amax * (1/448), saturating at 0xFE */
  EPF_MX_FLOOR = 1  /* OCP MX v1.0: floor(log2(amax)) - 8; elements above 448 saturate */
} epf_mx_rule_t;

#define EPF_MXFP8_GROUP 32          /* elements per E8M0 scale */
#define EPF_FP8_128_GROUP 128       /* elements per FP32 scale */
#define EPF_E4M3_MAX 448.0f         /* largest finite E4M3 */
#define EPF_FP8_128_AMAX_MIN 1e-4f  /* per-128 amax floor (DeepEP): an all-zero group gets 1e-4/448 */
#define EPF_E8M0_NAN 0xFFu          /* the E8M0 NaN byte */
#define EPF_E4M3_NAN 0x7Fu          /* the E4M3 NaN byte every NaN becomes */

/* ============================================================================================ */
/* Bit casts and explicitly rounded arithmetic (private)                                         */
/* ============================================================================================ */

EPF_HD uint32_t epf__f32_bits(float x) {
#if EPF_IS_DEVICE_PASS
  return __float_as_uint(x);
#else
  union {
    float f;
    uint32_t u;
  } c;
  c.f = x;
  return c.u;
#endif
}

EPF_HD float epf__f32_from_bits(uint32_t u) {
#if EPF_IS_DEVICE_PASS
  return __uint_as_float(u);
#else
  union {
    float f;
    uint32_t u;
  } c;
  c.u = u;
  return c.f;
#endif
}

/* RN multiply that keeps subnormal operands and results (no .ftz, never contracted into an FMA). */
EPF_HD float epf__fmul_rn(float a, float b) {
#if EPF_IS_DEVICE_PASS
  float d;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
#else
  return a * b;
#endif
}

/* RN fused multiply-add a * b + c, subnormals kept. */
EPF_HD float epf__fma_rn(float a, float b, float c) {
#if EPF_IS_DEVICE_PASS
  float d;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
  return d;
#else
  return fmaf(a, b, c);
#endif
}

/* IEEE division a / b, RN, subnormals kept. */
EPF_HD float epf__fdiv_rn(float a, float b) {
#if EPF_IS_DEVICE_PASS
  float d;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
#else
  return a / b;
#endif
}

/* IEEE reciprocal 1 / a, RN, subnormals kept. */
EPF_HD float epf__frcp_rn(float a) {
#if EPF_IS_DEVICE_PASS
  float d;
  asm("rcp.rn.f32 %0, %1;" : "=f"(d) : "f"(a));
  return d;
#else
  return 1.0f / a;
#endif
}

/* |x| without flushing subnormals. */
EPF_HD float epf__fabs(float x) { return epf__f32_from_bits(epf__f32_bits(x) & 0x7fffffffu); }

/* max(a, b) ignoring a NaN operand, quiet or signalling (PTX max.f32's rule; C fmaxf returns NaN
 * for a signalling NaN on glibc, so it is not used here). NaN only if both are NaN. */
EPF_HD float epf__fmax(float a, float b) { return (b > a || a != a) ? b : a; }

/* ============================================================================================ */
/* BF16, E4M3 and E8M0 scalars                                                                   */
/* ============================================================================================ */

EPF_HD float epf_bf16_to_float(uint16_t bits) { return epf__f32_from_bits((uint32_t)bits << 16); }

/* epf__e4m3_from_float_soft — the integer reference of epf_e4m3_from_float (all targets). */
EPF_HD uint8_t epf__e4m3_from_float_soft(float x) {
  const uint32_t u = epf__f32_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint8_t)EPF_E4M3_NAN; /* NaN (either sign) -> 0x7F */
  if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7eu); /* |x| >= 448, Inf: saturate to 448 */
  if (a < 0x3c800000u) {                                /* |x| < 2^-6: E4M3 subnormal range */
    uint32_t e, m, shift, k, rem, half;
    if (a <= 0x3a800000u) return (uint8_t)sign; /* |x| <= 2^-10 (2^-10 is a tie: to even 0) */
    /* k = RNE(|x| * 2^9) in [1, 8]; |x| = m * 2^(e - 150) with the implicit bit in m */
    e = a >> 23;
    m = (a & 0x7fffffu) | 0x800000u;
    shift = 141u - e; /* 21..24 */
    k = m >> shift;
    rem = m & ((1u << shift) - 1u);
    half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (k & 1u) != 0u)) ++k;
    return (uint8_t)(sign | k); /* k == 8 is 0x08, the smallest normal 2^-6 */
  }
  {
    /* normal: RNE of the 23-bit mantissa to 3 bits; a carry moves into the exponent */
    const uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20; /* (f32 exponent << 3) | mantissa */
    return (uint8_t)(sign | (r - (120u << 3)));                 /* E4M3 exponent = f32 - 120 */
  }
}

EPF_HD uint8_t epf_e4m3_from_float(float x) {
#if EPF__QUANT_HAS_E4M3_CVT
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x)); /* x: low byte */
  return (uint8_t)(r & 0xffu);
#else
  return epf__e4m3_from_float_soft(x);
#endif
}

EPF_HD float epf_e4m3_to_float(uint8_t q) {
  const uint32_t sign = ((uint32_t)q & 0x80u) << 24;
  const uint32_t mag = (uint32_t)q & 0x7fu;
  if (mag == 0x7fu) return epf__f32_from_bits(sign | 0x7fc00000u);
  /* the byte's bits placed under the f32 sign: value * 2^-120 (an f32 subnormal for E4M3
   * subnormals), times 2^120 (0x7B800000) exactly */
  return epf__fmul_rn(epf__f32_from_bits(sign | (mag << 20)), epf__f32_from_bits(0x7b800000u));
}

/* epf__e8m0_roundup_soft — the integer reference of epf_e8m0_roundup (branch-free). Adding
 * 0x7FFFFF before the shift rounds a normal v up unless its mantissa is 0; a subnormal v (or 0)
 * rounds to 2^-127 (byte 0) when v <= 2^-127 (mantissa <= 0x400000), else to 2^-126: add 0x3FFFFF. */
EPF_HD uint8_t epf__e8m0_roundup_soft(float v) {
  const uint32_t u = epf__f32_bits(v);
  uint32_t b = (u + (u < 0x00800000u ? 0x003fffffu : 0x007fffffu)) >> 23;
  b = b < 0xfeu ? b : 0xfeu;                       /* v > 2^127, +Inf: saturate to 2^127 */
  b = (u & 0x80000000u) != 0u ? 0u : b;            /* v <= -0: the smallest scale, 2^-127 */
  b = (u & 0x7fffffffu) > 0x7f800000u ? 0xffu : b; /* NaN */
  return (uint8_t)b;
}

EPF_HD uint8_t epf_e8m0_roundup(float v) {
#if EPF__QUANT_HAS_UE8M0_CVT
  uint16_t r;
  asm("cvt.rp.satfinite.ue8m0x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(v)); /* v: low byte */
  return (uint8_t)(r & 0xffu);
#else
  return epf__e8m0_roundup_soft(v);
#endif
}

EPF_HD uint8_t epf_e8m0_from_amax_rceil(float amax) {
  return epf_e8m0_roundup(epf__fmul_rn(epf__fabs(amax), 1.0f / 448.0f));
}

EPF_HD uint8_t epf_e8m0_from_amax_floor(float amax) {
  const uint32_t u = epf__f32_bits(amax) & 0x7fffffffu;
  const uint32_t e = u >> 23;
  uint32_t b = e > 8u ? e - 8u : 0u;
  b = u == 0x7f800000u ? 0xfeu : b;
  b = u > 0x7f800000u ? 0xffu : b;
  return (uint8_t)b;
}

EPF_HD uint8_t epf_e8m0_from_amax(float amax, int rule) {
  return rule == EPF_MX_FLOOR ? epf_e8m0_from_amax_floor(amax) : epf_e8m0_from_amax_rceil(amax);
}

EPF_HD float epf_e8m0_to_float(uint8_t b) {
  const uint32_t u = (uint32_t)b;
  return epf__f32_from_bits(u == 0xffu ? 0x7fc00000u : u == 0u ? 0x00400000u : u << 23);
}

EPF_HD float epf_e8m0_quant_multiplier(uint8_t b) {
  const uint32_t u = (uint32_t)b;
  return epf__f32_from_bits(u == 0xffu ? 0x7fc00000u : u == 0xfeu ? 0x00400000u : (254u - u) << 23);
}

/* ============================================================================================ */
/* MXFP8 reference                                                                               */
/* ============================================================================================ */

EPF_HD uint8_t epf_mxfp8_quantize_ref(float x, uint8_t scale) {
  return epf_e4m3_from_float(epf__fmul_rn(x, epf_e8m0_quant_multiplier(scale)));
}

EPF_HD float epf_mxfp8_dequantize_ref(uint8_t q, uint8_t scale) {
  return epf__fmul_rn(epf_e4m3_to_float(q), epf_e8m0_to_float(scale));
}

EPF_HD float epf_mxfp8_dequantize_accumulate_ref(uint8_t q, uint8_t scale, float weight, float acc) {
  return epf__fma_rn(epf_mxfp8_dequantize_ref(q, scale), weight, acc);
}

EPF_HD uint8_t epf_mxfp8_quantize_block_ref(const float* x, int rule, uint8_t* out_q) {
  float amax = 0.0f;
  uint8_t scale;
  int i;
  for (i = 0; i < EPF_MXFP8_GROUP; ++i) amax = epf__fmax(amax, epf__fabs(x[i]));
  scale = epf_e8m0_from_amax(amax, rule);
  for (i = 0; i < EPF_MXFP8_GROUP; ++i) out_q[i] = epf_mxfp8_quantize_ref(x[i], scale);
  return scale;
}

/* ============================================================================================ */
/* Per-128 FP8 reference (DeepSeek-V3 / DeepEP)                                                  */
/* ============================================================================================ */

EPF_HD float epf_fp8_128_scale(float amax, bool ue8m0) {
  const float s = epf__fdiv_rn(epf__fmax(epf__fabs(amax), EPF_FP8_128_AMAX_MIN), 448.0f);
  return ue8m0 ? epf_e8m0_to_float(epf_e8m0_roundup(s)) : s;
}

EPF_HD float epf_fp8_128_recip(float scale) { return epf__frcp_rn(scale); }

EPF_HD uint8_t epf_fp8_128_quantize_ref(float x, float scale) {
  return epf_e4m3_from_float(epf__fdiv_rn(x, scale));
}

EPF_HD float epf_fp8_128_dequantize_ref(uint8_t q, float scale) {
  return epf__fmul_rn(epf_e4m3_to_float(q), scale);
}

EPF_HD float epf_fp8_128_dequantize_accumulate_ref(uint8_t q, float scale, float weight, float acc) {
  return epf__fma_rn(epf_fp8_128_dequantize_ref(q, scale), weight, acc);
}

EPF_HD float epf_fp8_128_quantize_block_ref(const float* x, bool ue8m0, uint8_t* out_q) {
  float amax = 0.0f, s;
  int i;
  for (i = 0; i < EPF_FP8_128_GROUP; ++i) amax = epf__fmax(amax, epf__fabs(x[i]));
  s = epf_fp8_128_scale(amax, ue8m0);
  for (i = 0; i < EPF_FP8_128_GROUP; ++i) out_q[i] = epf_fp8_128_quantize_ref(x[i], s);
  return s;
}

/* epf__fdiv_markstein1 / epf__fdiv_markstein — fl(x / s) from y = RN(1/s) without a division:
 *   q = x * y, then one (…1) or two Markstein correction steps q += (x - s q) y, each an exact
 *   remainder FMA and an FMA. The remainder is formed negated, fma(s, q, -x), so the sign of a
 *   zero quotient is the sign of x (-0 / s = -0) with no extra instruction.
 *   Two steps: the first makes q faithful, the second correctly rounded (Markstein's theorem), so
 *   the result equals IEEE x / s whenever the remainders do not underflow, which holds for every
 *   |x / s| >= 2^-10 with s >= 1e-4/448 (smaller quotients are +-0 in E4M3 either way): the E4M3
 *   byte always equals epf_e4m3_from_float(x / s). One step: the same byte for every BF16 x with
 *   |x| <= amax and s from that amax (checked exhaustively, all ~8.5e8 such pairs, by
 *   tests/gpu/test_quant; sampled by tests/unit/test_quant_host). Requires s > 0, normal, and
 *   x / s finite (x finite or NaN). */
EPF_HD float epf__fdiv_markstein1(float x, float s, float y) {
  const float q = epf__fmul_rn(x, y);
  return epf__fma_rn(-epf__fma_rn(s, q, -x), y, q);
}

EPF_HD float epf__fdiv_markstein(float x, float s, float y) {
  const float q = epf__fdiv_markstein1(x, s, y);
  return epf__fma_rn(-epf__fma_rn(s, q, -x), y, q);
}

EPF_HD float epf_fp8_128_scale_fast(float amax, bool ue8m0, float* out_recip) {
  const float a = epf__fmax(amax, EPF_FP8_128_AMAX_MIN);
  float s = a < epf__f32_from_bits(0x7f800000u) ? epf__fdiv_markstein(a, 448.0f, 1.0f / 448.0f)
                                                : epf__f32_from_bits(0x7f800000u);
  if (ue8m0) {
    const uint8_t b = epf_e8m0_roundup(s);
    *out_recip = epf_e8m0_quant_multiplier(b);
    return epf_e8m0_to_float(b);
  }
  *out_recip = epf__frcp_rn(s);
  return s;
}

/* epf__fp8_128_recip_exact — true when y = RN(1/s) makes x * y == x / s for every x: s is a power
 *   of two (normal), 0, +-Inf or NaN. Then the per-128 blocks multiply instead of dividing. */
EPF_HD bool epf__fp8_128_recip_exact(float s) {
  const uint32_t u = epf__f32_bits(s) & 0x7fffffffu;
  return (u & 0x007fffffu) == 0u || u >= 0x7f800000u;
}

/* ============================================================================================ */
/* Scale layouts                                                                                 */
/* ============================================================================================ */

EPF_HD int64_t epf_scale_swizzle_offset(int64_t row, int col, int n_scale_cols) {
  const int64_t n_katoms = ((int64_t)n_scale_cols + 3) / 4;
  return ((row / 128) * n_katoms + (int64_t)(col / 4)) * 512 + (row % 32) * 16 +
         ((row % 128) / 32) * 4 + (int64_t)(col % 4);
}

EPF_HD int64_t epf_scale_swizzle_bytes(int64_t rows, int n_scale_cols) {
  return (rows + 127) / 128 * 128 * (((int64_t)n_scale_cols + 3) / 4 * 4);
}

EPF_HD int64_t epf_scale_offset(int scale_layout, int64_t row, int col, int n_scale_cols) {
  return scale_layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4 ? epf_scale_swizzle_offset(row, col, n_scale_cols)
                                                         : row * (int64_t)n_scale_cols + (int64_t)col;
}

EPF_HD int64_t epf_scale_bytes(int scale_layout, int64_t rows, int n_scale_cols) {
  return scale_layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4 ? epf_scale_swizzle_bytes(rows, n_scale_cols)
                                                         : rows * (int64_t)n_scale_cols;
}

EPF_HD void epf_scale_swizzle_zero_padding(uint8_t* scales, int64_t rows, int n_scale_cols, int64_t index,
                                           int64_t stride) {
  const int64_t pcols = ((int64_t)n_scale_cols + 3) / 4 * 4;
  const int64_t prows = (rows + 127) / 128 * 128;
  const int64_t extra = pcols - (int64_t)n_scale_cols;
  const int64_t tail = (prows - rows) * pcols; /* whole padding rows */
  const int64_t total = tail + rows * extra;   /* + padding columns of real rows */
  int64_t i;
  for (i = index; i < total; i += stride) {
    int64_t r, c;
    if (i < tail) {
      r = rows + i / pcols;
      c = i % pcols;
    } else {
      r = (i - tail) / extra;
      c = (int64_t)n_scale_cols + (i - tail) % extra;
    }
    scales[epf_scale_swizzle_offset(r, (int)c, n_scale_cols)] = 0u;
  }
}

/* ============================================================================================ */
/* Checks and config helpers                                                                     */
/* ============================================================================================ */

EPF_HD epf_status_t epf_quant_check(int hidden, int payload) {
  const int group = epf_payload_vector_width(payload);
  if (group == 0) return EPF_ERR_PAYLOAD;
  if (hidden < 1 || hidden > EPF_MAX_HIDDEN) return EPF_ERR_HIDDEN;
  if (hidden % group != 0) return EPF_ERR_HIDDEN_ALIGNMENT;
  return EPF_OK;
}

EPF_HD int epf_mx_rule_from_flags(uint32_t flags) {
  return (flags & EPF_FLAG_MX_SCALE_FLOOR) != 0u ? EPF_MX_FLOOR : EPF_MX_RCEIL;
}

EPF_HD bool epf_fp8_128_ue8m0_from_flags(uint32_t flags) { return (flags & EPF_FLAG_SCALE_UE8M0) != 0u; }

EPF_END_DECLS

#endif /* EPF_QUANT_IMPL_SCALAR_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
