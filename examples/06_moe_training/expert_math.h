/* expert_math.h — ex06_moe_training's expert math, ONE definition for the GPU kernels and the CPU
 * reference (EPF_HD): the target is built with --fmad=false and -ffp-contract=off so both sides
 * compute the same bits. Part of the example (one translation unit: main.cu includes it). */
#ifndef EX06_EXPERT_MATH_H
#define EX06_EXPERT_MATH_H

#include <stdint.h>
#include <string.h>

#include "epfuse/epfuse.cuh"

/* ============================================================================================ */
/* The expert math, one definition for the GPU kernels and the CPU reference                    */
/* ============================================================================================ */
/* Every function is a fixed sequence of IEEE FP32 operations (explicit fmaf, no library exp), so
 * the host and the device compute the same bits. Weights are row-major: W1, W3 [H][I], W2 [I][H]. */

EPF_HD float ex06_f(uint16_t b) { return epf_bf16_to_float(b); }

EPF_HD uint16_t ex06_bf16(float f) { /* round to nearest even */
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* e^x: Cody-Waite reduction by ln 2 and a degree-7 Taylor polynomial, |error| <= 3 ulp */
EPF_HD float ex06_exp(float x) {
  x = fminf(fmaxf(x, -87.0f), 88.0f);
  const float n = rintf(x * 1.44269504f);
  float r = fmaf(n, -6.93145752e-1f, x); /* ln 2, high part (exact products) */
  r = fmaf(n, -1.42860677e-6f, r);       /* ln 2, low part */
  float p = 1.0f / 5040.0f;
  p = fmaf(p, r, 1.0f / 720.0f);
  p = fmaf(p, r, 1.0f / 120.0f);
  p = fmaf(p, r, 1.0f / 24.0f);
  p = fmaf(p, r, 1.0f / 6.0f);
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  return ldexpf(p, (int)n);
}

EPF_HD float ex06_sigmoid(float a) { return 1.0f / (1.0f + ex06_exp(-a)); }

/* hidden unit i of a row: a = x . W1[:, i], b = x . W3[:, i] (fma chains, h ascending, from 0) */
EPF_HD void ex06_gate_up(const uint16_t* x, const uint16_t* w1, const uint16_t* w3, int H, int I, int i, float* a,
                         float* b) {
  float sa = 0.f, sb = 0.f;
  for (int h = 0; h < H; ++h) {
    const float xv = ex06_f(x[h]);
    sa = fmaf(xv, ex06_f(w1[(size_t)h * I + i]), sa);
    sb = fmaf(xv, ex06_f(w3[(size_t)h * I + i]), sb);
  }
  *a = sa;
  *b = sb;
}

/* SwiGLU: silu(a) * b */
EPF_HD float ex06_swiglu(float a, float b) { return (a * ex06_sigmoid(a)) * b; }

/* its backward for the incoming gradient dh: db = dh * silu(a), da = dh * b * silu'(a) with
 * silu'(a) = sigmoid(a) * (1 + a * (1 - sigmoid(a))) */
EPF_HD void ex06_swiglu_backward(float a, float b, float dh, float* da, float* db) {
  const float sg = ex06_sigmoid(a);
  const float ds = sg * (1.0f + a * (1.0f - sg));
  *db = dh * (a * sg);
  *da = (dh * b) * ds;
}

/* output element j of a row: sum_i h_i W2[i][j] (i ascending) */
EPF_HD float ex06_down(const float* hv, const uint16_t* w2, int I, int H, int j) {
  float s = 0.f;
  for (int i = 0; i < I; ++i) s = fmaf(hv[i], ex06_f(w2[(size_t)i * H + j]), s);
  return s;
}

/* the gradient of a row's output: d out_j = w_row * dy_j (w_row: the row's combine weight) */
EPF_HD float ex06_dout(float w_row, uint16_t dy) { return w_row * ex06_f(dy); }

/* dh_i = sum_j d out_j W2[i][j] (j ascending) */
EPF_HD float ex06_dh(const uint16_t* dy, float w_row, const uint16_t* w2, int H, int i) {
  float s = 0.f;
  for (int j = 0; j < H; ++j) s = fmaf(ex06_dout(w_row, dy[j]), ex06_f(w2[(size_t)i * H + j]), s);
  return s;
}

/* the row's input gradient, element j: sum_i (W1[j][i] da_i + W3[j][i] db_i) (i ascending) */
EPF_HD float ex06_dx(const float* da, const float* db, const uint16_t* w1, const uint16_t* w3, int I, int j) {
  float s = 0.f;
  for (int i = 0; i < I; ++i) {
    s = fmaf(ex06_f(w1[(size_t)j * I + i]), da[i], s);
    s = fmaf(ex06_f(w3[(size_t)j * I + i]), db[i], s);
  }
  return s;
}

/* the router-weight gradient of a row: dot(dy, out_row) (h ascending) */
EPF_HD float ex06_wgrad(const uint16_t* dy, const uint16_t* out, int H) {
  float s = 0.f;
  for (int h = 0; h < H; ++h) s = fmaf(ex06_f(dy[h]), ex06_f(out[h]), s);
  return s;
}

#endif /* EX06_EXPERT_MATH_H */
