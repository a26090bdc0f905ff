/* test_quant_host — quant/quant.cuh's EPF_HD reference functions, run on the CPU (no GPU needed):
 *   - every one of the 65,536 BF16 bit patterns as a block amax -> the scale byte, RCEIL and FLOOR,
 *     against an independent reference written here from the formula in double precision
 *     (frexp/ldexp), also through the block quantizer (a block {x, 0, ..., 0});
 *   - the E4M3 conversion against an independent double-precision RNE reference on all 65,536 BF16
 *     inputs for a spread of scales, and on a sample of all 2^32 FP32 inputs;
 *   - every edge case of NUMERICS.md as its own assertion;
 *   - E8M0 multipliers, per-128 scales (1e-4 floor, UE8M0), the division-free paths the device
 *     blocks use (Markstein steps, fast scale) against IEEE division;
 *   - swizzled scale offsets against an independent construction (torchao's to_blocked), padding;
 *   - epf_quant_check statuses.
 * None of the reference code here calls the library. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epf_cmocka.h"
#include "epf_rng.h"

#include "epfuse/quant/quant.cuh"

/* ---- independent references (double precision, no library calls) ---------------------------- */

static float f32(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}
static uint32_t bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
static float bf16(uint32_t b) { return f32(b << 16); }

/* RNE to E4M3 with saturation to +-448, from the value's binade (frexp) and floor(), in double. */
static uint8_t ref_e4m3(double v) {
  int k, e;
  double a, quantum, n, fl, fr, r;
  uint8_t sign;
  if (isnan(v)) return 0x7f;
  sign = signbit(v) ? 0x80 : 0x00;
  a = fabs(v);
  if (isinf(a)) return (uint8_t)(sign | 0x7e);
  (void)frexp(a, &k); /* a = f * 2^k, f in [0.5, 1): a in [2^(k-1), 2^k) */
  quantum = a < ldexp(1.0, -6) ? ldexp(1.0, -9) : ldexp(1.0, k - 1 - 3);
  n = a / quantum;
  fl = floor(n);
  fr = n - fl;
  if (fr > 0.5 || (fr == 0.5 && fmod(fl, 2.0) == 1.0)) fl += 1.0;
  r = fl * quantum;
  if (r > 448.0) r = 448.0;
  if (r == 0.0) return sign;
  (void)frexp(r, &k);
  e = k - 1 + 7;
  if (e <= 0) return (uint8_t)(sign | (int)(r / ldexp(1.0, -9)));
  return (uint8_t)(sign | (e << 3) | (int)((r / ldexp(1.0, k - 1) - 1.0) * 8.0));
}

/* E4M3 byte -> value, from the field definitions. */
static double ref_e4m3_value(uint8_t q) {
  const int e = (q >> 3) & 0xf, m = q & 7;
  const double mag = e == 0 ? m * ldexp(1.0, -9) : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
  return (q & 0x80) ? -mag : mag;
}

/* RCEIL: 127 + ceil(log2(amax / 448)) clamped to [0, 254]; amax >= 0. */
static int ref_rceil(double amax) {
  int k;
  double f;
  int e, b;
  if (isnan(amax)) return 0xff;
  if (amax == 0.0) return 0;
  if (isinf(amax)) return 254;
  f = frexp(amax / 448.0, &k); /* v = f 2^k: ceil(log2 v) = k, or k-1 for a power of two */
  e = f == 0.5 ? k - 1 : k;
  b = e + 127;
  return b < 0 ? 0 : b > 254 ? 254 : b;
}

/* FLOOR: 127 + floor(log2(amax)) - 8 clamped to [0, 254]. */
static int ref_floor(double amax) {
  int k, b;
  if (isnan(amax)) return 0xff;
  if (amax == 0.0) return 0;
  if (isinf(amax)) return 254;
  (void)frexp(amax, &k);
  b = (k - 1) - 8 + 127;
  return b < 0 ? 0 : b > 254 ? 254 : b;
}

/* Per-128 scale: fl(max(amax, 1e-4f) / 448) (double division then one rounding to float is the
 * correctly rounded float quotient), optionally 2^ceil(log2(s)). */
static float ref_fp8_128_scale(float amax, int ue8m0) {
  const double a = (isnan(amax) || fabs((double)amax) < (double)1e-4f) ? (double)1e-4f : fabs((double)amax);
  float s = isinf(a) ? INFINITY : (float)(a / 448.0);
  if (ue8m0) {
    int k;
    double f;
    if (isinf(s)) return ldexpf(1.0f, 127);
    f = frexp((double)s, &k);
    s = (float)ldexp(1.0, f == 0.5 ? k - 1 : k);
  }
  return s;
}

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint64_t rnd(void) { return epf_rng_next(&rng); }

/* ---- E4M3 --------------------------------------------------------------------------------------- */

static void test_e4m3_edge_cases(void** state) {
  (void)state;
  /* NUMERICS.md, one assertion each */
  assert_int_equal(epf_e4m3_from_float(0.0f), 0x00);
  assert_int_equal(epf_e4m3_from_float(-0.0f), 0x80);
  assert_int_equal(epf_e4m3_from_float(448.0f), 0x7e);
  assert_int_equal(epf_e4m3_from_float(449.0f), 0x7e);
  assert_int_equal(epf_e4m3_from_float(463.9f), 0x7e);
  assert_int_equal(epf_e4m3_from_float(464.0f), 0x7e); /* tie: to even 448 */
  assert_int_equal(epf_e4m3_from_float(464.1f), 0x7e);
  assert_int_equal(epf_e4m3_from_float(480.0f), 0x7e);
  assert_int_equal(epf_e4m3_from_float(500.0f), 0x7e);
  assert_int_equal(epf_e4m3_from_float(1e6f), 0x7e);
  assert_int_equal(epf_e4m3_from_float(INFINITY), 0x7e);
  assert_int_equal(epf_e4m3_from_float(-INFINITY), 0xfe);
  assert_int_equal(epf_e4m3_from_float(-464.0f), 0xfe);
  assert_int_equal(epf_e4m3_from_float(NAN), 0x7f);
  assert_int_equal(epf_e4m3_from_float(-NAN), 0x7f);
  assert_int_equal(epf_e4m3_from_float(f32(0xffc00001u)), 0x7f);
  assert_int_equal(epf_e4m3_from_float(232.0f), 0x76); /* tie: to even 224 */
  assert_int_equal(epf_e4m3_from_float(248.0f), 0x78); /* tie: to even 256 */
  assert_int_equal(epf_e4m3_from_float(ldexpf(1.0f, -10)), 0x00); /* tie: to even 0 */
  assert_int_equal(epf_e4m3_from_float(f32(bits(ldexpf(1.0f, -10)) + 1u)), 0x01);
  /* more */
  assert_int_equal(epf_e4m3_from_float(-ldexpf(1.0f, -10)), 0x80);
  assert_int_equal(epf_e4m3_from_float(-f32(bits(ldexpf(1.0f, -10)) + 1u)), 0x81);
  assert_int_equal(epf_e4m3_from_float(ldexpf(1.0f, -9)), 0x01);
  assert_int_equal(epf_e4m3_from_float(ldexpf(3.0f, -10)), 0x02); /* 1.5 * 2^-9: tie, to even 2 */
  assert_int_equal(epf_e4m3_from_float(ldexpf(1.0f, -6)), 0x08);  /* smallest normal */
  assert_int_equal(epf_e4m3_from_float(ldexpf(15.0f, -10)), 0x08); /* 7.5 * 2^-9: tie, to even 8 */
  assert_int_equal(epf_e4m3_from_float(1.0f), 0x38);
  assert_int_equal(epf_e4m3_from_float(-1.0f), 0xb8);
  assert_int_equal(epf_e4m3_from_float(1.0625f), 0x38); /* tie: to even 1.0 */
  assert_int_equal(epf_e4m3_from_float(1.1875f), 0x3a); /* tie: to even 1.25 */
  assert_int_equal(epf_e4m3_from_float(f32(1u)), 0x00); /* smallest FP32 subnormal */
  assert_int_equal(epf_e4m3_from_float(f32(0x80000001u)), 0x80);
  assert_int_equal(epf_e4m3_from_float(3.4e38f), 0x7e);
  /* the integer reference and the public function are the same on the host */
  for (uint32_t u = 0; u < 0xffffffffu - 65535u; u += 65537u)
    assert_int_equal(epf__e4m3_from_float_soft(f32(u)), epf_e4m3_from_float(f32(u)));
}

static void test_e4m3_to_float(void** state) {
  (void)state;
  for (int q = 0; q < 256; ++q) {
    const float v = epf_e4m3_to_float((uint8_t)q);
    if ((q & 0x7f) == 0x7f) {
      assert_true(isnan(v));
      continue;
    }
    assert_true((double)v == ref_e4m3_value((uint8_t)q));
    assert_int_equal(!!signbit(v), q >> 7); /* 0x80 is -0 */
    assert_int_equal(epf_e4m3_from_float(v), q); /* round trip */
  }
  assert_true(epf_e4m3_to_float(0x7e) == 448.0f);
  assert_true(epf_e4m3_to_float(0x01) == ldexpf(1.0f, -9));
  assert_true(epf_e4m3_to_float(0x08) == ldexpf(1.0f, -6));
}

/* all 65,536 BF16 inputs, scaled by 2^(127 - b) for a spread of scale bytes b */
static void test_e4m3_bf16_vs_double(void** state) {
  static const int scales[] = {0, 1, 2, 20, 100, 115, 120, 124, 126, 127, 128, 130, 135, 150, 200, 240, 250, 253, 254};
  long checked = 0;
  (void)state;
  for (size_t si = 0; si < sizeof(scales) / sizeof(scales[0]); ++si) {
    const int b = scales[si];
    for (uint32_t x = 0; x < 65536u; ++x) {
      const float v = bf16(x);
      const uint8_t want = ref_e4m3((double)v * ldexp(1.0, 127 - b));
      const uint8_t got = epf_mxfp8_quantize_ref(v, (uint8_t)b);
      if (got != want) fail_msg("bf16 0x%04x scale %d: got 0x%02x want 0x%02x", x, b, got, want);
      ++checked;
    }
  }
  printf("E4M3: %ld BF16 x scale conversions match the double reference\n", checked);
}

/* a sample of all 2^32 FP32 inputs (every bit pattern class: subnormal, normal, Inf, NaN) */
static void test_e4m3_fp32_sample_vs_double(void** state) {
  long n = 0;
  (void)state;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4093u) {
    const float v = f32((uint32_t)u);
    const uint8_t want = ref_e4m3((double)v);
    const uint8_t got = epf_e4m3_from_float(v);
    if (got != want) fail_msg("f32 0x%08x (%a): got 0x%02x want 0x%02x", (uint32_t)u, (double)v, got, want);
    ++n;
  }
  /* dense around every E4M3 rounding boundary: each midpoint and its f32 neighbours */
  for (int q = 0; q < 0x7e; ++q) {
    const double mid = 0.5 * (ref_e4m3_value((uint8_t)q) + ref_e4m3_value((uint8_t)(q + 1)));
    const float m = (float)mid;
    for (int d = -3; d <= 3; ++d) {
      const float v = f32(bits(m) + (uint32_t)d);
      assert_int_equal(epf_e4m3_from_float(v), ref_e4m3((double)v));
      assert_int_equal(epf_e4m3_from_float(-v), ref_e4m3(-(double)v));
      n += 2;
    }
  }
  printf("E4M3: %ld FP32 conversions match the double reference\n", n);
}

/* ---- E8M0 scales ------------------------------------------------------------------------------- */

static void check_amax_sweep(int rule) {
  long n = 0;
  for (uint32_t x = 0; x < 65536u; ++x) {
    const float v = bf16(x);
    float block[32];
    uint8_t q[32];
    int want;
    uint8_t got;
    const double amax = isnan(v) ? 0.0 : fabs((double)v); /* NaN elements do not enter amax */
    want = rule == EPF_MX_FLOOR ? ref_floor(amax) : ref_rceil(amax);
    /* the scale function on the amax itself */
    if (!isnan(v)) {
      got = epf_e8m0_from_amax(fabsf(v), rule);
      if (got != want) fail_msg("rule %d amax bf16 0x%04x (%a): got 0x%02x want 0x%02x", rule, x, (double)v, got, want);
    }
    /* a block whose amax is |x| */
    for (int i = 0; i < 32; ++i) block[i] = 0.0f;
    block[x % 32] = v;
    got = epf_mxfp8_quantize_block_ref(block, rule, q);
    if (got != want) fail_msg("rule %d block with bf16 0x%04x: scale 0x%02x want 0x%02x", rule, x, got, want);
    if (isnan(v)) assert_int_equal(q[x % 32], 0x7f);
    else assert_int_equal(q[x % 32], ref_e4m3((double)v * ldexp(1.0, 127 - want)));
    ++n;
  }
  printf("E8M0 %s: all %ld BF16 amax patterns match the double reference\n", rule == EPF_MX_FLOOR ? "FLOOR" : "RCEIL", n);
}
static void test_e8m0_rceil_exhaustive(void** state) {
  (void)state;
  check_amax_sweep(EPF_MX_RCEIL);
}
static void test_e8m0_floor_exhaustive(void** state) {
  (void)state;
  check_amax_sweep(EPF_MX_FLOOR);
}

/* NUMERICS.md: the rules differ for exactly 7,657 of the 32,639 positive finite BF16 amax values,
 * and multiplying by fl(1/448) gives the same byte as dividing by 448 for every BF16 amax. */
static void test_rule_difference_count(void** state) {
  int positive = 0, differ = 0;
  (void)state;
  for (uint32_t x = 1; x < 0x7f80u; ++x) {
    const float a = bf16(x);
    ++positive;
    if (epf_e8m0_from_amax_rceil(a) != epf_e8m0_from_amax_floor(a)) ++differ;
    assert_int_equal(epf_e8m0_from_amax_rceil(a), epf_e8m0_roundup(a / 448.0f));
  }
  assert_int_equal(positive, 32639);
  assert_int_equal(differ, 7657);
}

static void test_e8m0_edge_cases(void** state) {
  (void)state;
  /* amax -> scale byte */
  assert_int_equal(epf_e8m0_from_amax_rceil(0.0f), 0x00);
  assert_int_equal(epf_e8m0_from_amax_floor(0.0f), 0x00);
  assert_int_equal(epf_e8m0_from_amax_rceil(INFINITY), 0xfe);
  assert_int_equal(epf_e8m0_from_amax_floor(INFINITY), 0xfe);
  assert_int_equal(epf_e8m0_from_amax_rceil(NAN), 0xff);
  assert_int_equal(epf_e8m0_from_amax_floor(NAN), 0xff);
  assert_int_equal(epf_e8m0_from_amax_rceil(448.0f), 127);
  assert_int_equal(epf_e8m0_from_amax_rceil(449.0f), 128);
  assert_int_equal(epf_e8m0_from_amax_rceil(1.0f), 119); /* ceil(log2(1/448)) = -8 */
  assert_int_equal(epf_e8m0_from_amax_floor(448.0f), 127);
  assert_int_equal(epf_e8m0_from_amax_floor(511.0f), 127);
  assert_int_equal(epf_e8m0_from_amax_floor(512.0f), 128);
  assert_int_equal(epf_e8m0_from_amax_floor(1.0f), 119);
  assert_int_equal(epf_e8m0_from_amax_floor(1.9f), 119);
  assert_int_equal(epf_e8m0_from_amax_rceil(1.9f), 120);
  assert_int_equal(epf_e8m0_from_amax_rceil(3.4e38f), 247);
  assert_int_equal(epf_e8m0_from_amax_floor(3.4e38f), 246);
  assert_int_equal(epf_e8m0_from_amax_floor(ldexpf(1.0f, -118)), 1);
  assert_int_equal(epf_e8m0_from_amax_floor(ldexpf(1.0f, -119)), 0);
  assert_int_equal(epf_e8m0_from_amax_rceil(ldexpf(1.75f, -119)), 0); /* amax / 448 = 2^-127 */
  assert_int_equal(epf_e8m0_from_amax_rceil(ldexpf(1.875f, -119)), 1);
  assert_int_equal(epf_e8m0_from_amax_rceil(ldexpf(1.75f, -118)), 1); /* amax / 448 = 2^-126 */
  assert_int_equal(epf_e8m0_from_amax_rceil(ldexpf(1.875f, -118)), 2);
  assert_int_equal(epf_e8m0_from_amax_rceil(f32(1u)), 0); /* subnormal amax */
  assert_int_equal(epf_e8m0_from_amax_rceil(-448.0f), 127); /* the sign of amax is ignored */
  /* round-up of a value */
  assert_int_equal(epf_e8m0_roundup(0.0f), 0x00);
  assert_int_equal(epf_e8m0_roundup(f32(0x00400000u)), 0x00); /* 2^-127 */
  assert_int_equal(epf_e8m0_roundup(f32(0x00400001u)), 0x01);
  assert_int_equal(epf_e8m0_roundup(f32(0x00800000u)), 0x01); /* 2^-126 */
  assert_int_equal(epf_e8m0_roundup(f32(0x00800001u)), 0x02);
  assert_int_equal(epf_e8m0_roundup(1.0f), 127);
  assert_int_equal(epf_e8m0_roundup(1.5f), 128);
  assert_int_equal(epf_e8m0_roundup(ldexpf(1.0f, 127)), 254);
  assert_int_equal(epf_e8m0_roundup(ldexpf(1.5f, 127)), 254); /* saturates */
  assert_int_equal(epf_e8m0_roundup(INFINITY), 254);
  assert_int_equal(epf_e8m0_roundup(NAN), 255);
  assert_int_equal(epf_e8m0_roundup(-1.0f), 0);
  /* byte -> value and multiplier */
  for (int b = 0; b < 255; ++b) {
    assert_true((double)epf_e8m0_to_float((uint8_t)b) == ldexp(1.0, b - 127));
    assert_true((double)epf_e8m0_quant_multiplier((uint8_t)b) == ldexp(1.0, 127 - b));
    assert_true(epf_e8m0_to_float((uint8_t)b) * epf_e8m0_quant_multiplier((uint8_t)b) == 1.0f);
  }
  assert_int_equal(bits(epf_e8m0_to_float(0)), 0x00400000u);
  assert_int_equal(bits(epf_e8m0_quant_multiplier(254)), 0x00400000u);
  assert_int_equal(bits(epf_e8m0_quant_multiplier(0)), 0x7f000000u); /* (254 - 0) << 23 */
  assert_true(isnan(epf_e8m0_to_float(255)));
  assert_true(isnan(epf_e8m0_quant_multiplier(255)));
}

/* MXFP8 blocks with special values (NUMERICS.md edge cases, TransformerEngine's behaviour) */
static void test_mxfp8_block_edge_cases(void** state) {
  float x[32];
  uint8_t q[32];
  (void)state;
  /* amax 0: scale 0x00, elements 0 (sign kept) */
  for (int i = 0; i < 32; ++i) x[i] = (i & 1) ? -0.0f : 0.0f;
  assert_int_equal(epf_mxfp8_quantize_block_ref(x, EPF_MX_RCEIL, q), 0x00);
  for (int i = 0; i < 32; ++i) assert_int_equal(q[i], (i & 1) ? 0x80 : 0x00);
  assert_int_equal(epf_mxfp8_quantize_block_ref(x, EPF_MX_FLOOR, q), 0x00);
  /* a NaN element: it becomes 0x7F, the scale comes from the others */
  for (int i = 0; i < 32; ++i) x[i] = (float)(i - 16);
  x[3] = NAN;
  x[9] = -NAN;
  assert_int_equal(epf_mxfp8_quantize_block_ref(x, EPF_MX_RCEIL, q), (uint8_t)ref_rceil(16.0));
  assert_int_equal(q[3], 0x7f);
  assert_int_equal(q[9], 0x7f);
  assert_int_equal(q[31], ref_e4m3(15.0 * ldexp(1.0, 127 - ref_rceil(16.0))));
  /* all NaN: amax 0 -> scale 0x00, every element 0x7F */
  for (int i = 0; i < 32; ++i) x[i] = NAN;
  assert_int_equal(epf_mxfp8_quantize_block_ref(x, EPF_MX_RCEIL, q), 0x00);
  for (int i = 0; i < 32; ++i) assert_int_equal(q[i], 0x7f);
  /* an Inf element: scale 0xFE, Inf -> 448, the others flush toward 0 (x * 2^-127) */
  for (int i = 0; i < 32; ++i) x[i] = 1.0f;
  x[0] = INFINITY;
  x[1] = -INFINITY;
  x[2] = 3.0e38f;
  assert_int_equal(epf_mxfp8_quantize_block_ref(x, EPF_MX_RCEIL, q), 0xfe);
  assert_int_equal(q[0], 0x7e);
  assert_int_equal(q[1], 0xfe);
  assert_int_equal(q[2], ref_e4m3(3.0e38 * ldexp(1.0, -127)));
  assert_int_equal(q[5], 0x00);
  assert_int_equal(epf_mxfp8_quantize_block_ref(x, EPF_MX_FLOOR, q), 0xfe);
  assert_int_equal(q[0], 0x7e);
  /* subnormal-only block: scale 0x00 (2^-127), elements x * 2^127 */
  for (int i = 0; i < 32; ++i) x[i] = f32((uint32_t)(i + 1) << 16); /* BF16 subnormals */
  assert_int_equal(epf_mxfp8_quantize_block_ref(x, EPF_MX_RCEIL, q), 0x00);
  for (int i = 0; i < 32; ++i) assert_int_equal(q[i], ref_e4m3((double)x[i] * ldexp(1.0, 127)));
  assert_true(q[31] != 0); /* not flushed */
  /* FLOOR: elements above 448 saturate (amax significand > 1.75) */
  for (int i = 0; i < 32; ++i) x[i] = 1.0f;
  x[7] = 1.9f;
  assert_int_equal(epf_mxfp8_quantize_block_ref(x, EPF_MX_FLOOR, q), 119);
  assert_int_equal(q[7], 0x7e); /* 1.9 * 256 = 486 -> 448 */
  assert_int_equal(epf_mxfp8_quantize_block_ref(x, EPF_MX_RCEIL, q), 120);
  assert_int_equal(q[7], ref_e4m3(1.9f * 128.0));
}

/* dequantize and the fused dequantize x weight accumulate */
static void test_mxfp8_dequant_ref(void** state) {
  (void)state;
  for (int s = 0; s < 255; ++s) {
    for (int q = 0; q < 256; ++q) {
      const float got = epf_mxfp8_dequantize_ref((uint8_t)q, (uint8_t)s);
      if ((q & 0x7f) == 0x7f) {
        assert_true(isnan(got));
        continue;
      }
      /* the exact product in double, rounded once */
      assert_int_equal(bits(got), bits((float)(ref_e4m3_value((uint8_t)q) * ldexp(1.0, s - 127))));
    }
  }
  assert_true(isnan(epf_mxfp8_dequantize_ref(0x38, 0xff)));
  assert_true(isinf(epf_mxfp8_dequantize_ref(0x7e, 0xfe))); /* 448 * 2^127 overflows */
  /* acc = fma(deq, w, acc): one rounding */
  assert_true(epf_mxfp8_dequantize_accumulate_ref(0x38, 127, 0.5f, 1.0f) == 1.5f);
  {
    const float acc = 1.0f, w = 1.0f + ldexpf(1.0f, -23);
    const float deq = epf_mxfp8_dequantize_ref(0x3c, 127); /* 1.5 */
    assert_true(epf_mxfp8_dequantize_accumulate_ref(0x3c, 127, w, acc) == fmaf(deq, w, acc));
    assert_true(epf_fp8_128_dequantize_accumulate_ref(0x3c, 1.0f, w, acc) == fmaf(deq, w, acc));
  }
  for (int q = 0; q < 256; ++q) {
    if ((q & 0x7f) == 0x7f) continue;
    assert_true((double)epf_fp8_128_dequantize_ref((uint8_t)q, 0.25f) == ref_e4m3_value((uint8_t)q) * 0.25);
  }
}

/* ---- per-128 FP8 ------------------------------------------------------------------------------- */

static void test_fp8_128_scale(void** state) {
  (void)state;
  /* every BF16 amax (and its negative, and NaN), both modes, reference and fast path */
  for (uint32_t x = 0; x < 65536u; ++x) {
    const float a = bf16(x);
    for (int ue = 0; ue < 2; ++ue) {
      const float want = ref_fp8_128_scale(a, ue);
      const float got = epf_fp8_128_scale(a, ue != 0);
      float y, fast;
      if (bits(got) != bits(want)) fail_msg("amax %a ue8m0 %d: %a want %a", (double)a, ue, (double)got, (double)want);
      if (isnan(a) || signbit(a)) continue;
      fast = epf_fp8_128_scale_fast(a, ue != 0, &y);
      if (bits(fast) != bits(want)) fail_msg("fast amax %a ue8m0 %d: %a want %a", (double)a, ue, (double)fast, (double)want);
      if (bits(y) != bits(1.0f / want)) fail_msg("fast recip amax %a: %a want %a", (double)a, (double)y, 1.0 / want);
    }
  }
  /* random FP32 amax values: the fast path's division-free amax / 448 */
  for (int i = 0; i < 2000000; ++i) {
    const float a = f32((uint32_t)(rnd() % 0x7f800000u));
    float y;
    assert_int_equal(bits(epf_fp8_128_scale_fast(a, false, &y)), bits(ref_fp8_128_scale(a, 0)));
  }
  /* the rules, one assertion each */
  assert_true(epf_fp8_128_scale(0.0f, false) == 1e-4f / 448.0f); /* floor */
  assert_true(epf_fp8_128_scale(1e-5f, false) == 1e-4f / 448.0f);
  assert_true(epf_fp8_128_scale(NAN, false) == 1e-4f / 448.0f);
  assert_true(epf_fp8_128_scale(448.0f, false) == 1.0f);
  assert_true(epf_fp8_128_scale(1.0f, false) == 1.0f / 448.0f);
  assert_true(isinf(epf_fp8_128_scale(INFINITY, false)));
  assert_true(epf_fp8_128_scale(0.0f, true) == ldexpf(1.0f, -22)); /* 2.23e-7 -> 2^-22 */
  assert_true(epf_fp8_128_scale(448.0f, true) == 1.0f);
  assert_true(epf_fp8_128_scale(449.0f, true) == 2.0f);
  assert_true(epf_fp8_128_scale(1.0f, true) == ldexpf(1.0f, -8));
  assert_true(epf_fp8_128_scale(INFINITY, true) == ldexpf(1.0f, 127));
  assert_true(epf_fp8_128_recip(0.5f) == 2.0f);
}

/* the elements: RNE_sat(fl(x / s)) for all 65,536 BF16 x over a spread of scales, against double;
 * the device paths (Markstein steps) against IEEE division */
static void test_fp8_128_elements(void** state) {
  long n = 0;
  (void)state;
  for (int si = 0; si < 24; ++si) {
    const float amax = si == 0 ? 0.0f : si == 1 ? 448.0f : si == 2 ? 3.0e38f : f32(0x38000000u + (uint32_t)(rnd() % 0x0c000000u));
    for (int ue = 0; ue < 2; ++ue) {
      const float s = ref_fp8_128_scale(amax, ue);
      const float y = 1.0f / s;
      for (uint32_t x = 0; x < 65536u; ++x) {
        const float v = bf16(x);
        const uint8_t want = ref_e4m3((double)(float)((double)v / (double)s));
        const uint8_t got = epf_fp8_128_quantize_ref(v, s);
        if (got != want) fail_msg("x %a s %a: 0x%02x want 0x%02x", (double)v, (double)s, got, want);
        if (!isinf(v) && fabsf(v / s) <= 3.0e38f) {
          const uint8_t m2 = epf_e4m3_from_float(epf__fdiv_markstein(v, s, y));
          if (m2 != want) fail_msg("markstein x %a s %a: 0x%02x want 0x%02x", (double)v, (double)s, m2, want);
        }
        ++n;
      }
    }
  }
  /* one Markstein step: byte-exact for BF16 x with |x| <= amax (sampled here; the GPU test checks
   * every pair) */
  for (uint32_t ab = 0x3800u; ab < 0x7f80u; ab += 61u) {
    const float amax = bf16(ab);
    const float s = epf_fp8_128_scale(amax, false);
    const float y = 1.0f / s;
    for (uint32_t xb = 0; xb <= ab; ++xb) {
      const float v = bf16(xb);
      assert_int_equal(epf_e4m3_from_float(epf__fdiv_markstein1(v, s, y)), epf_fp8_128_quantize_ref(v, s));
      assert_int_equal(epf_e4m3_from_float(epf__fdiv_markstein1(-v, s, y)), epf_fp8_128_quantize_ref(-v, s));
      n += 2;
    }
  }
  /* two steps on random FP32 x, |x| <= amax */
  for (int i = 0; i < 2000000; ++i) {
    const float amax = f32(0x38d1b717u + (uint32_t)(rnd() % (0x7f000000u - 0x38d1b717u)));
    const float s = epf_fp8_128_scale(amax, false);
    const float v = amax * f32(0x3f000000u | (uint32_t)(rnd() & 0x007fffffu)) * ((rnd() & 1) ? -1.0f : 1.0f);
    assert_int_equal(epf_e4m3_from_float(epf__fdiv_markstein(v, s, 1.0f / s)), epf_fp8_128_quantize_ref(v, s));
    ++n;
  }
  /* signed zeros survive the division-free path */
  assert_int_equal(epf_e4m3_from_float(epf__fdiv_markstein1(-0.0f, 3.0f, 1.0f / 3.0f)), 0x80);
  assert_int_equal(epf_e4m3_from_float(epf__fdiv_markstein(-0.0f, 3.0f, 1.0f / 3.0f)), 0x80);
  assert_int_equal(epf_e4m3_from_float(epf__fdiv_markstein(0.0f, 3.0f, 1.0f / 3.0f)), 0x00);
  printf("per-128: %ld element conversions checked\n", n);
}

static void test_fp8_128_block_edge_cases(void** state) {
  float x[128];
  uint8_t q[128];
  (void)state;
  for (int i = 0; i < 128; ++i) x[i] = 0.0f;
  assert_true(epf_fp8_128_quantize_block_ref(x, false, q) == 1e-4f / 448.0f);
  for (int i = 0; i < 128; ++i) assert_int_equal(q[i], 0x00);
  /* an Inf element: s = Inf, finite elements -> +-0, the Inf -> Inf/Inf = NaN -> 0x7F */
  for (int i = 0; i < 128; ++i) x[i] = (float)(i - 64);
  x[5] = INFINITY;
  assert_true(isinf(epf_fp8_128_quantize_block_ref(x, false, q)));
  assert_int_equal(q[5], 0x7f);
  assert_int_equal(q[100], 0x00);
  assert_int_equal(q[1], 0x80);
  /* UE8M0 with an Inf element: s = 2^127, the Inf -> 448 */
  assert_true(epf_fp8_128_quantize_block_ref(x, true, q) == ldexpf(1.0f, 127));
  assert_int_equal(q[5], 0x7e);
  /* NaN element: 0x7F, scale from the others */
  x[5] = NAN;
  assert_true(epf_fp8_128_quantize_block_ref(x, false, q) == 64.0f / 448.0f);
  assert_int_equal(q[5], 0x7f);
  assert_int_equal(q[0], 0xfe); /* -64 / (64/448) = -448 */
}

/* ---- scale layouts ------------------------------------------------------------------------------- */

/* torchao's to_blocked, as index arithmetic on the output: the padded [128*RB, 4*CB] matrix is cut
 * into 128x4 blocks, block (rb, cb) stored at ((rb * CB) + cb) * 512, and inside a block
 * block.reshape(4, 32, 4).transpose(0, 1).reshape(32, 16): output (i, j) of the 32x16 view holds
 * block row (j / 4) * 32 + i, column j % 4. */
static void test_swizzle_offsets(void** state) {
  static const int rows_list[] = {1, 5, 31, 32, 127, 128, 129, 255, 256, 300, 1000};
  static const int cols_list[] = {1, 2, 3, 4, 5, 7, 8, 90, 128, 224};
  (void)state;
  for (size_t ri = 0; ri < sizeof(rows_list) / sizeof(rows_list[0]); ++ri) {
    for (size_t ci = 0; ci < sizeof(cols_list) / sizeof(cols_list[0]); ++ci) {
      const int rows = rows_list[ri], cols = cols_list[ci];
      const int RB = (rows + 127) / 128, CB = (cols + 3) / 4;
      const int64_t total = (int64_t)RB * 128 * CB * 4;
      int* owner = (int*)malloc((size_t)total * sizeof(int)); /* byte -> (row << 16 | col) or -1 */
      uint8_t* buf = (uint8_t*)malloc((size_t)total);
      assert_non_null(owner);
      assert_non_null(buf);
      assert_true(epf_scale_swizzle_bytes(rows, cols) == total);
      assert_true(epf_scale_bytes(EPF_SCALE_LAYOUT_SWIZZLED_128X4, rows, cols) == total);
      assert_true(epf_scale_bytes(EPF_SCALE_LAYOUT_COMPACT, rows, cols) == (int64_t)rows * cols);
      for (int rb = 0; rb < RB; ++rb)
        for (int cb = 0; cb < CB; ++cb)
          for (int i = 0; i < 32; ++i)
            for (int j = 0; j < 16; ++j) {
              const int64_t out = ((int64_t)rb * CB + cb) * 512 + i * 16 + j;
              const int r = rb * 128 + (j / 4) * 32 + i, c = cb * 4 + j % 4;
              owner[out] = (r < rows && c < cols) ? (r << 16 | c) : -1;
            }
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
          const int64_t off = epf_scale_swizzle_offset(r, c, cols);
          assert_true(off >= 0 && off < total);
          if (owner[off] != (r << 16 | c)) fail_msg("rows %d cols %d: (%d, %d) at %lld", rows, cols, r, c, (long long)off);
          assert_true(epf_scale_offset(EPF_SCALE_LAYOUT_SWIZZLED_128X4, r, c, cols) == off);
          assert_true(epf_scale_offset(EPF_SCALE_LAYOUT_COMPACT, r, c, cols) == (int64_t)r * cols + c);
        }
      /* padding: poison, mark real scales, zero the padding from 3 "threads": every padding byte 0,
       * every real scale untouched */
      memset(buf, 0xaa, (size_t)total);
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) buf[epf_scale_swizzle_offset(r, c, cols)] = 0x11;
      for (int t = 0; t < 3; ++t) epf_scale_swizzle_zero_padding(buf, rows, cols, t, 3);
      for (int64_t b = 0; b < total; ++b) assert_int_equal(buf[b], owner[b] < 0 ? 0x00 : 0x11);
      free(owner);
      free(buf);
    }
  }
}

/* ---- checks ------------------------------------------------------------------------------------- */

static void test_quant_check(void** state) {
  (void)state;
  assert_int_equal(epf_quant_check(7168, EPF_PAYLOAD_MXFP8), EPF_OK);
  assert_int_equal(epf_quant_check(7168, EPF_PAYLOAD_FP8_128), EPF_OK);
  assert_int_equal(epf_quant_check(2880, EPF_PAYLOAD_MXFP8), EPF_OK);
  assert_int_equal(epf_quant_check(2880, EPF_PAYLOAD_FP8_128), EPF_ERR_HIDDEN_ALIGNMENT);
  assert_int_equal(epf_quant_check(32, EPF_PAYLOAD_MXFP8), EPF_OK);
  assert_int_equal(epf_quant_check(32, EPF_PAYLOAD_FP8_128), EPF_ERR_HIDDEN_ALIGNMENT);
  assert_int_equal(epf_quant_check(48, EPF_PAYLOAD_MXFP8), EPF_ERR_HIDDEN_ALIGNMENT);
  assert_int_equal(epf_quant_check(128, EPF_PAYLOAD_FP8_128), EPF_OK);
  assert_int_equal(epf_quant_check(0, EPF_PAYLOAD_MXFP8), EPF_ERR_HIDDEN);
  assert_int_equal(epf_quant_check(-32, EPF_PAYLOAD_MXFP8), EPF_ERR_HIDDEN);
  assert_int_equal(epf_quant_check(EPF_MAX_HIDDEN, EPF_PAYLOAD_FP8_128), EPF_OK);
  assert_int_equal(epf_quant_check(EPF_MAX_HIDDEN + 128, EPF_PAYLOAD_FP8_128), EPF_ERR_HIDDEN);
  assert_int_equal(epf_quant_check(7168, EPF_PAYLOAD_BF16), EPF_OK); /* unquantized: 8-element vectors */
  assert_int_equal(epf_quant_check(2880, EPF_PAYLOAD_BF16), EPF_OK);
  assert_int_equal(epf_quant_check(7164, EPF_PAYLOAD_BF16), EPF_ERR_HIDDEN_ALIGNMENT);
  assert_int_equal(epf_quant_check(7168, EPF_PAYLOAD_DEFAULT), EPF_ERR_PAYLOAD);
  assert_int_equal(epf_quant_check(7168, 99), EPF_ERR_PAYLOAD);
  assert_int_equal(epf_mx_rule_from_flags(0), EPF_MX_RCEIL);
  assert_int_equal(epf_mx_rule_from_flags(EPF_FLAG_MX_SCALE_FLOOR), EPF_MX_FLOOR);
  assert_false(epf_fp8_128_ue8m0_from_flags(EPF_FLAG_MX_SCALE_FLOOR));
  assert_true(epf_fp8_128_ue8m0_from_flags(EPF_FLAG_SCALE_UE8M0));
  assert_true(epf_bf16_to_float(0x3f80) == 1.0f);
  assert_true(epf_bf16_to_float(0xc040) == -3.0f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_e4m3_edge_cases),       cmocka_unit_test(test_e4m3_to_float),
      cmocka_unit_test(test_e4m3_bf16_vs_double),   cmocka_unit_test(test_e4m3_fp32_sample_vs_double),
      cmocka_unit_test(test_e8m0_rceil_exhaustive), cmocka_unit_test(test_e8m0_floor_exhaustive),
      cmocka_unit_test(test_rule_difference_count), cmocka_unit_test(test_e8m0_edge_cases),
      cmocka_unit_test(test_mxfp8_block_edge_cases), cmocka_unit_test(test_mxfp8_dequant_ref),
      cmocka_unit_test(test_fp8_128_scale),         cmocka_unit_test(test_fp8_128_elements),
      cmocka_unit_test(test_fp8_128_block_edge_cases), cmocka_unit_test(test_swizzle_offsets),
      cmocka_unit_test(test_quant_check),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
