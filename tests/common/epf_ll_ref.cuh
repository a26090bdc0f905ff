/* epf_ll_ref.cuh — the low-latency tests' CPU reference, expert stage and checks (not part of the
 * library), shared by tests/gpu/test_ll.cu (virtual ranks on one GPU) and
 * tests/multigpu/test_mg_ll.cu (one rank per GPU over NCCL). Moved out of test_ll unchanged in
 * what it computes; what changed is that everything works on ONE rank's buffers, so a test can
 * check the rank it owns:
 *   llref_in_t                host inputs of one round, all R ranks: x, routing, weights and the
 *                             FP8 payloads of x (scalar quant/quant.cuh references)
 *   llref_in_init / _free     allocate / free them; llref_fill(in, T, bad_ids, seed): fresh inputs
 *                             (the draws test_ll always made, so its seeds reproduce)
 *   llref_dispatch            what every rank must receive (counts, slot -> (token, k)), with
 *                             `absent` ranks (bit r: rank r took no part) and the dropped ids
 *   llref_combine             what every source must get back (FP32 k-order fmaf, BF16 out)
 *   llref_experts_kernel      the test's experts over received rows (window or packed copy), y in
 *                             any epf_ll_y_layout_t; grid.y = ranks in the launch from rank0 on
 *   llref_poison_window       poison one rank's window rows of a round (receive, meta, scales,
 *                             combine landing rows, EXPERT_OUT rows)
 *   llref_check_dispatch_rank / llref_check_combine_rank
 *                             one rank's outputs against the reference: 0, or -1 with the first
 *                             difference in msg[LLREF_MSG]. No cmocka calls: safe on any thread.
 * The training direction (epf_ll_combine_backward / epf_ll_dispatch_backward):
 *   llref_in_t.combine_weights  the dispatch round is a backward of combine: the metadata weight the
 *                             checks expect is llref_combine_weight (sum over the k reading the row)
 *   llref_in_t.Ts             optional tokens per source (unequal T), NULL: T everywhere
 *   llref_dispatch_backward   dx = unit-weight first-occurrence k-order sum of the experts' rows, and
 *                             the router-weight gradient [R][Tmax][K] the sources must get back
 *   llref_wgrad_value / llref_wgrad_kernel  the test's per-row router-weight gradient (GPU side)
 *   llref_check_wgrad_rank    one source's topk_weights_grad against the reference
 */
#ifndef EPF_LL_REF_CUH
#define EPF_LL_REF_CUH

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "epf_test_gpu.h"
#include "epfuse/epfuse.cuh"
#include "epfuse/ll/kernels.cuh"

#define LLREF_MSG 512

/* ============================================================================================ */
/* helpers: BF16, experts                                                                        */
/* ============================================================================================ */

__host__ __device__ static inline float llref_bf2f(uint16_t b) {
  union {
    uint32_t u;
    float f;
  } v;
  v.u = (uint32_t)b << 16;
  return v.f;
}

__host__ __device__ static inline uint16_t llref_f2bf(float f) { /* round to nearest even, NaN -> 0x7fff */
  union {
    uint32_t u;
    float f;
  } v;
  v.f = f;
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

/* the test's experts: identity, or y = bf16(fma(x, a_e, b_e)) with constants per global expert
 * (x: the received element as FP32: BF16, or the dequantized FP8 payload) */
__host__ __device__ static inline uint16_t llref_expert_apply(int e, float x, int identity) {
  if (identity) return llref_f2bf(x);
  return llref_f2bf(fmaf(x, 1.0f + (float)(e % 7) * 0.125f, (float)(e % 5 - 2) * 0.0625f));
}

static inline uint16_t llref_rand_bf16(uint64_t* s) { /* finite values in about [-4, 4] */
  const uint64_t r = epf_test_rand(s);
  return llref_f2bf(((float)(r & 0xffffff) / 8388608.0f - 1.0f) * (float)(1 << ((r >> 24) & 3)));
}

/* IN_PLACE and IN_PLACE_PULL: the experts overwrite the window's receive rows */
__host__ __device__ static inline int llref_y_in_place(int y_layout) {
  return y_layout == EPF_LL_Y_IN_PLACE || y_layout == EPF_LL_Y_IN_PLACE_PULL;
}

/* ============================================================================================ */
/* host inputs of one round                                                                      */
/* ============================================================================================ */

typedef struct llref_in {
  int R, Tmax, T, H, K, E, EL;
  int payload, cpayload, mx_rule, ue8m0, sbytes; /* sbytes: compact scale bytes per row */
  uint16_t* hx;   /* [R][Tmax][H] */
  int64_t* htopk; /* [R][Tmax][K] */
  float* hw;      /* [R][Tmax][K] */
  uint8_t* hq;    /* FP8 payloads: [R][Tmax][H] E4M3 bytes of x (scalar reference) */
  uint8_t* hs;    /* FP8 payloads: [R][Tmax][sbytes] compact scales */
  int combine_weights; /* backward of combine: metadata weight = llref_combine_weight */
  const int* Ts;       /* [R] tokens of each source (unequal T), or NULL: T for every source */
} llref_in_t;

/* tokens of source s in this round */
static inline int llref_T(const llref_in_t* in, int s) { return in->Ts != NULL ? in->Ts[s] : in->T; }

/* the combine weight of the row pair (s, t, k) sends (k its first occurrence): the sum over k' >= k
 * with the same id of w[k'], FP32 adds in ascending k' from +0.0f */
static inline float llref_combine_weight(const llref_in_t* in, int s, int t, int k) {
  const size_t base = ((size_t)s * in->Tmax + t) * in->K;
  float acc = 0.0f;
  for (int j = k; j < in->K; ++j)
    if (in->htopk[base + j] == in->htopk[base + k]) acc = acc + in->hw[base + j];
  return acc;
}

/* k if row[k] is the first occurrence of its id in the row, else the k of that first occurrence */
static inline int llref_first_k(const int64_t* row, int k) {
  for (int q = 0; q < k; ++q)
    if (row[q] == row[k]) return q;
  return k;
}

/* the weight the metadata of the row of (s, t, k) must carry: llref_combine_weight (the dispatch
 * is a backward of combine), or the router weight w[k] */
static inline float llref_meta_weight(const llref_in_t* in, int s, int t, int k) {
  return in->combine_weights ? llref_combine_weight(in, s, t, k) : in->hw[((size_t)s * in->Tmax + t) * in->K + k];
}

/* the test's router-weight gradient of a receive row: a function of the expert and the row's first
 * element (the same fmaf on both sides) */
__host__ __device__ static inline float llref_wgrad_value(int e, float x0) {
  return fmaf(x0, 0.5f, (float)(e % 11) - 5.0f);
}

static inline void llref_in_free(llref_in_t* in) {
  free(in->hx);
  free(in->htopk);
  free(in->hw);
  free(in->hq);
  free(in->hs);
  in->hx = NULL;
  in->htopk = NULL;
  in->hw = NULL;
  in->hq = NULL;
  in->hs = NULL;
}

/* flags: the plan's (MX rule, UE8M0); sbytes: plan.scale_bytes_per_row. 0, or -1 (out of memory,
 * nothing left allocated). */
static inline int llref_in_init(llref_in_t* in, int R, int Tmax, int H, int K, int E, int payload, int cpayload,
                                uint32_t flags, int sbytes) {
  const size_t n = (size_t)R * Tmax;
  memset(in, 0, sizeof(*in));
  in->R = R;
  in->Tmax = Tmax;
  in->H = H;
  in->K = K;
  in->E = E;
  in->EL = E / R;
  in->payload = payload;
  in->cpayload = cpayload;
  in->mx_rule = epf_mx_rule_from_flags(flags);
  in->ue8m0 = epf_fp8_128_ue8m0_from_flags(flags);
  in->sbytes = sbytes;
  in->hx = (uint16_t*)malloc(n * H * sizeof(uint16_t));
  in->htopk = (int64_t*)malloc(n * K * sizeof(int64_t));
  in->hw = (float*)malloc(n * K * sizeof(float));
  in->hq = (uint8_t*)malloc(n * H);
  in->hs = (uint8_t*)malloc(n * (size_t)(sbytes > 0 ? sbytes : 1));
  if (in->hx == NULL || in->htopk == NULL || in->hw == NULL || in->hq == NULL || in->hs == NULL) {
    llref_in_free(in);
    return -1;
  }
  return 0;
}

/* the scalar quant reference (quant/quant.cuh) of token row (s, t) into hq / hs */
static inline void llref_quantize_row(llref_in_t* in, int s, int t) {
  const size_t row = (size_t)s * in->Tmax + t;
  const uint16_t* x = in->hx + row * in->H;
  uint8_t* q = in->hq + row * in->H;
  uint8_t* sc = in->hs + row * (size_t)in->sbytes;
  float buf[128];
  if (in->payload == EPF_PAYLOAD_MXFP8) {
    for (int g = 0; g < in->H / 32; ++g) {
      for (int i = 0; i < 32; ++i) buf[i] = llref_bf2f(x[g * 32 + i]);
      sc[g] = epf_mxfp8_quantize_block_ref(buf, in->mx_rule, q + g * 32);
    }
  } else if (in->payload == EPF_PAYLOAD_FP8_128) {
    for (int g = 0; g < in->H / 128; ++g) {
      float scale;
      for (int i = 0; i < 128; ++i) buf[i] = llref_bf2f(x[g * 128 + i]);
      scale = epf_fp8_128_quantize_block_ref(buf, in->ue8m0 != 0, q + g * 128);
      memcpy(sc + g * 4, &scale, 4);
    }
  }
}

/* element h of the row the experts see for token (s, t): x, or its dequantized FP8 payload */
static inline float llref_xval(const llref_in_t* in, int s, int t, int h) {
  const size_t row = (size_t)s * in->Tmax + t;
  if (in->payload == EPF_PAYLOAD_MXFP8)
    return epf_mxfp8_dequantize_ref(in->hq[row * in->H + h], in->hs[row * in->sbytes + h / 32]);
  if (in->payload == EPF_PAYLOAD_FP8_128) {
    float scale;
    memcpy(&scale, in->hs + row * in->sbytes + (h / 128) * 4, 4);
    return epf_fp8_128_dequantize_ref(in->hq[row * in->H + h], scale);
  }
  return llref_bf2f(in->hx[row * in->H + h]);
}

/* Fresh inputs: routing with ~8% -1, ~6% repeats of an earlier k, and (bad_ids) ~3% ids outside
 * [-1, E). Whole Tmax rows (rows >= T are garbage the kernels must ignore); FP8 payloads of rows
 * < T. Host only: the test uploads what its ranks need. */
static inline void llref_fill(llref_in_t* in, int T, int bad_ids, uint64_t* seed) {
  const int R = in->R, Tmax = in->Tmax, H = in->H, K = in->K, E = in->E;
  size_t i;
  in->T = T;
  for (i = 0; i < (size_t)R * Tmax * H; ++i) in->hx[i] = llref_rand_bf16(seed);
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < Tmax; ++t)
      for (int k = 0; k < K; ++k) {
        const size_t idx = ((size_t)r * Tmax + t) * K + k;
        const uint64_t u = epf_test_rand(seed);
        int64_t e = (int64_t)(u % (uint64_t)E);
        const int p = (int)((u >> 32) % 100);
        if (t >= T) e = (int64_t)(u % 3000) - 1000; /* garbage beyond num_tokens */
        else if (p < 8) e = -1;
        else if (p < 14 && k > 0) e = in->htopk[idx - 1 - (size_t)((u >> 40) % (uint64_t)k)];
        else if (bad_ids && p < 17) e = (u >> 50) & 1 ? (int64_t)E + (int64_t)((u >> 52) % 5) : -2 - (int64_t)((u >> 52) % 5);
        in->htopk[idx] = e;
        in->hw[idx] = (float)((u >> 20) & 0xfff) / 2048.0f - 0.75f;
      }
  if (in->payload != EPF_PAYLOAD_BF16)
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) llref_quantize_row(in, r, t);
}

/* the expected received row (payload bytes) and compact scales of token (s, t) */
static inline const void* llref_want_row(const llref_in_t* in, int s, int t) {
  const size_t row = (size_t)s * in->Tmax + t;
  return in->payload == EPF_PAYLOAD_BF16 ? (const void*)(in->hx + row * in->H) : (const void*)(in->hq + row * in->H);
}
static inline const uint8_t* llref_want_scales(const llref_in_t* in, int s, int t) {
  return in->hs + ((size_t)s * in->Tmax + t) * (size_t)in->sbytes;
}

/* ============================================================================================ */
/* CPU reference                                                                                 */
/* ============================================================================================ */

typedef struct llref {
  int* counts;          /* [R dst][EL][R src] */
  int* row_t;           /* [R dst][EL][R src][Tmax] token of slot */
  int* row_k;           /* ... its k */
  uint32_t dropped;     /* ids outside [-1, E) of all present sources */
  uint32_t* dropped_src; /* [R]: the same per source (a real rank's record counts its own) */
} llref_t;

/* absent: bit r set = rank r takes no part (neither sends nor receives, its experts absent) */
static inline void llref_dispatch(const llref_in_t* in, uint32_t absent, llref_t* out) {
  const int R = in->R, Tmax = in->Tmax, K = in->K, E = in->E, EL = in->EL;
  int* cnt = (int*)calloc((size_t)E, sizeof(int));
  out->counts = (int*)calloc((size_t)R * EL * R, sizeof(int));
  out->row_t = (int*)malloc((size_t)R * EL * R * Tmax * sizeof(int));
  out->row_k = (int*)malloc((size_t)R * EL * R * Tmax * sizeof(int));
  out->dropped_src = (uint32_t*)calloc((size_t)R, sizeof(uint32_t));
  out->dropped = 0;
  for (int s = 0; s < R; ++s) {
    memset(cnt, 0, (size_t)E * sizeof(int));
    if ((absent >> s) & 1u) continue;
    for (int t = 0; t < llref_T(in, s); ++t)
      for (int k = 0; k < K; ++k) {
        const int64_t* row = in->htopk + ((size_t)s * Tmax + t) * K;
        const int64_t v = row[k];
        if (v == -1) continue;
        if (v < -1 || v >= E) {
          out->dropped++;
          out->dropped_src[s]++;
          continue;
        }
        if (llref_first_k(row, k) != k) continue;
        {
          const int e = (int)v, d = e / EL, le = e % EL;
          const int slot = cnt[e]++;
          const size_t g = ((size_t)d * EL + le) * R + s;
          if ((absent >> d) & 1u) continue;
          out->counts[g] = slot + 1;
          out->row_t[g * Tmax + slot] = t;
          out->row_k[g * Tmax + slot] = k;
        }
      }
  }
  free(cnt);
}

static inline void llref_free(llref_t* r) {
  free(r->counts);
  free(r->row_t);
  free(r->row_k);
  free(r->dropped_src);
}

/* rows of H FP32 values: the pieces both references (this one and epf_ll_rm_ref.cuh) chain */

/* xs[h] = llref_xval(in, s, t, h): the row the experts see for token (s, t) */
static inline void llref_x_row(const llref_in_t* in, int s, int t, float* xs) {
  for (int h = 0; h < in->H; ++h) xs[h] = llref_xval(in, s, t, h);
}

/* y[h] = the test's expert e of xs[h], as FP32 of its BF16 output */
static inline void llref_expert_row(int e, const float* xs, int H, int identity, float* y) {
  for (int h = 0; h < H; ++h) y[h] = llref_bf2f(llref_expert_apply(e, xs[h], identity));
}

/* acc[h] = fmaf(w, y[h], acc[h]) */
static inline void llref_fma_row(float w, const float* y, int H, float* acc) {
  for (int h = 0; h < H; ++h) acc[h] = fmaf(w, y[h], acc[h]);
}

/* every 32-element block of v quantized to MXFP8 (epf_mxfp8_quantize_block_ref, mx_rule), then
 * acc[h] = epf_mxfp8_dequantize_accumulate_ref(q[h], scale, w, acc[h]): what a source adds for a
 * row the far side sent as MXFP8 */
static inline void llref_mxfp8_accumulate_row(const float* v, int H, int mx_rule, float w, float* acc) {
  for (int g = 0; g < H / 32; ++g) {
    uint8_t q32[32];
    const uint8_t sb = epf_mxfp8_quantize_block_ref(v + g * 32, mx_rule, q32);
    for (int i = 0; i < 32; ++i) acc[g * 32 + i] = epf_mxfp8_dequantize_accumulate_ref(q32[i], sb, w, acc[g * 32 + i]);
  }
}

/* out[h] = BF16(acc[h]) */
static inline void llref_bf16_row(const float* acc, int H, uint16_t* out) {
  for (int h = 0; h < H; ++h) out[h] = llref_f2bf(acc[h]);
}

/* wg[k] ([K], the token's row of [R][Tmax][K]) of token (s, t): for every valid k whose rank is
 * present, llref_wgrad_value of the token's row (a repeat reads its first occurrence's row: the
 * same value), else 0 */
static inline void llref_wgrad_token(const llref_in_t* in, int s, int t, uint32_t absent, float* wg) {
  const int64_t* row = in->htopk + ((size_t)s * in->Tmax + t) * in->K;
  const float x0 = llref_bf2f(in->hx[((size_t)s * in->Tmax + t) * in->H]);
  for (int k = 0; k < in->K; ++k) {
    const int64_t v = row[k];
    float g = 0.0f;
    if (v >= 0 && v < in->E && !((absent >> (v / in->EL)) & 1u)) g = llref_wgrad_value((int)v, x0);
    wg[k] = g;
  }
}

/* The EXPERT_MAJOR sum of one token (its ids row[K], the experts' input xs[H]) into acc[H] (from
 * +0.0f): in k order over the valid ids whose rank is present, acc = fmaf(w[k], y_k, acc), or
 * (cpayload MXFP8: the expert side quantizes y_k, the source dequantizes) the MXFP8 accumulate of
 * y_k with weight w[k]; w NULL: weight 1 and only the first occurrence of each id. y: [H] scratch. */
static inline void llref_token_sum(const llref_in_t* in, const int64_t* row, const float* w, uint32_t absent, int identity,
                                   int cpayload, const float* xs, float* y, float* acc) {
  const int H = in->H;
  for (int h = 0; h < H; ++h) acc[h] = 0.0f;
  for (int k = 0; k < in->K; ++k) {
    const int64_t v = row[k];
    const float wk = w != NULL ? w[k] : 1.0f;
    if (v < 0 || v >= in->E || ((absent >> (v / in->EL)) & 1u)) continue;
    if (w == NULL && llref_first_k(row, k) != k) continue;
    llref_expert_row((int)v, xs, H, identity, y);
    if (cpayload == EPF_PAYLOAD_MXFP8)
      llref_mxfp8_accumulate_row(y, H, in->mx_rule, wk, acc);
    else
      llref_fma_row(wk, y, H, acc);
  }
}

/* out[s][t][h] ([R][Tmax][H]) for every present source s (absent sources are not computed), or
 * only for source only_src (>= 0) */
static inline void llref_combine(const llref_in_t* in, uint32_t absent, int identity, int only_src, uint16_t* out) {
  const int Tmax = in->Tmax, K = in->K, H = in->H;
  float* acc = (float*)malloc((size_t)3 * H * sizeof(float)); /* acc, xs, y: [H] each */
  float *xs = acc + H, *y = acc + 2 * H;
  for (int s = 0; s < in->R; ++s) {
    if ((absent >> s) & 1u) continue;
    if (only_src >= 0 && s != only_src) continue;
    for (int t = 0; t < llref_T(in, s); ++t) {
      const size_t tk = ((size_t)s * Tmax + t) * K;
      llref_x_row(in, s, t, xs);
      llref_token_sum(in, in->htopk + tk, in->hw + tk, absent, identity, in->cpayload, xs, y, acc);
      llref_bf16_row(acc, H, out + ((size_t)s * Tmax + t) * H);
    }
  }
  free(acc);
}

/* The backward of the dispatch: dx[s][t][h] ([R][Tmax][H]) = BF16 of the fmaf(1.0f, row, acc)
 * chain over the token's present FIRST occurrences in k order (row = the experts' output of the
 * received row, i.e. of x = dy here: BF16 plans only), and wg ([R][Tmax][K], or NULL) = for every
 * valid, present k the row's llref_wgrad_value (a repeat: its first occurrence's row, the same
 * value), else 0. Absent sources are not computed. */
static inline void llref_dispatch_backward(const llref_in_t* in, uint32_t absent, int identity, uint16_t* out,
                                           float* wg) {
  const int Tmax = in->Tmax, K = in->K, H = in->H;
  float* acc = (float*)malloc((size_t)3 * H * sizeof(float)); /* acc, xs, y: [H] each */
  float *xs = acc + H, *y = acc + 2 * H;
  for (int s = 0; s < in->R; ++s) {
    if ((absent >> s) & 1u) continue;
    for (int t = 0; t < llref_T(in, s); ++t) {
      const size_t tk = ((size_t)s * Tmax + t) * K;
      const uint16_t* x = in->hx + ((size_t)s * Tmax + t) * H;
      for (int h = 0; h < H; ++h) xs[h] = llref_bf2f(x[h]);
      llref_token_sum(in, in->htopk + tk, NULL, absent, identity, EPF_PAYLOAD_BF16, xs, y, acc);
      if (wg != NULL) llref_wgrad_token(in, s, t, absent, wg + tk);
      llref_bf16_row(acc, H, out + ((size_t)s * Tmax + t) * H);
    }
  }
  free(acc);
}

/* ============================================================================================ */
/* the test's experts (GPU)                                                                      */
/* ============================================================================================ */

/* element h of a received row as FP32 (BF16, or the dequantized FP8 payload); `scales` is the row's
 * compact scale row, or (swizzled) the base of the packed scales with `row` its packed row */
__device__ static inline float llref_recv_elem(const epf_plan_t* plan, const void* x, const uint8_t* scales, int swizzled,
                                               int64_t row, int h) {
  const int ncols = (int)plan->scale_bytes_per_row;
  if (plan->payload == EPF_PAYLOAD_MXFP8) {
    const uint8_t sb = swizzled ? scales[epf_scale_swizzle_offset(row, h / 32, ncols)] : scales[h / 32];
    return epf_mxfp8_dequantize_ref(((const uint8_t*)x)[h], sb);
  }
  if (plan->payload == EPF_PAYLOAD_FP8_128)
    return epf_fp8_128_dequantize_ref(((const uint8_t*)x)[h], ((const float*)scales)[h / 128]);
  return llref_bf2f(((const uint16_t*)x)[h]);
}

/* Fixed row fr (epf_ll_fixed_row(plan, le, s, j)) of a rank with receive counts cnt ([EL][R]):
 * its (le, s, j) and pos, its place among expert le's packed rows (epf_ll_packed_row(plan, le,
 * pos)). 1 when it holds a received row (j < cnt[le][s]), else 0 (pos not set). */
__device__ static inline int llref_fixed_row_slot(const epf_plan_t* plan, const int32_t* cnt, int64_t fr, int* le, int* s,
                                                  int* j, int* pos) {
  const int R = plan->nranks;
  epf_ll_fixed_row_split(plan, fr, le, s, j);
  if (*j >= cnt[*le * R + *s]) return 0;
  *pos = *j;
  for (int q = 0; q < *s; ++q) *pos += cnt[*le * R + q];
  return 1;
}

/* For rank r = rank0 + blockIdx.y (r != skip_rank) and every row it received: y = expert(x).
 * Buffer i = blockIdx.y of each per-rank array (window slices of plan.total_bytes from `win`,
 * rounds, recv_counts, packed_x, packed_scales, y: epf_ll_buffer_bytes strides) belongs to rank r:
 * virtual ranks launch grid.y = R with rank0 = 0, a real rank grid.y = 1 with rank0 = its rank.
 * src: the window rows of the round (or the packed copy when from_packed); dst by y_layout
 * (IN_PLACE: over the window rows). */
static __global__ void llref_experts_kernel(epf_plan_t plan, char* win, int rank0, const uint32_t* rounds,
                                            const int32_t* recv_counts, const char* packed_x,
                                            const uint8_t* packed_scales, uint16_t* y, int from_packed, int y_layout,
                                            int identity, int skip_rank) {
  const int R = plan.nranks, EL = plan.experts_per_rank, Tmax = plan.max_tokens_per_rank, H = plan.hidden;
  const int i = (int)blockIdx.y, r = rank0 + i;
  const int64_t rows = (int64_t)EL * R * Tmax;
  const uint64_t ybytes = (uint64_t)rows * H;
  const int swizzled = plan.scale_layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4 && plan.payload == EPF_PAYLOAD_MXFP8;
  if (r == skip_rank) return;
  const uint32_t round = rounds[i];
  const int32_t* cnt = recv_counts + (int64_t)i * EL * R;
  char* base = win + (uint64_t)i * plan.total_bytes;
  for (int64_t fr = blockIdx.x; fr < rows; fr += gridDim.x) { /* fr: epf_ll_fixed_row(&plan, le, s, j) */
    int le, s, j, pos;
    if (!llref_fixed_row_slot(&plan, cnt, fr, &le, &s, &j, &pos)) continue;
    const int64_t prow = epf_ll_packed_row(&plan, le, pos), wrow = epf_ll_recv_row(&plan, round, le, s, j);
    const void* src;
    const uint8_t* sc = NULL;
    int sw = 0;
    if (from_packed) {
      src = packed_x + ((uint64_t)i * rows + prow) * plan.row_bytes;
      if (plan.scale_bytes_per_row > 0) {
        const uint64_t sbytes = epf_ll_buffer_bytes(&plan, EPF_LL_BUF_PACKED_SCALES, EPF_INDEX_DEFAULT);
        sw = swizzled;
        sc = packed_scales + (uint64_t)i * sbytes + (swizzled ? 0 : (uint64_t)prow * plan.scale_bytes_per_row);
      }
    } else {
      src = base + epf_plan_recv_token_offset(&plan, wrow);
      sc = (const uint8_t*)base + epf_plan_recv_scale_offset(&plan, wrow);
    }
    uint16_t* dst = llref_y_in_place(y_layout) ? (uint16_t*)src
                    : y_layout == EPF_LL_Y_PACKED ? y + (uint64_t)i * ybytes + (uint64_t)prow * H
                                                   : y + (uint64_t)i * ybytes + (uint64_t)fr * H;
    for (int h = (int)threadIdx.x; h < H; h += (int)blockDim.x)
      dst[h] = llref_expert_apply(r * EL + le, llref_recv_elem(&plan, src, sc, sw, prow, h), identity);
  }
}

/* The test's router-weight gradient of every row rank r = rank0 + blockIdx.y received (BF16
 * payload: read from the window rows of the round, before experts in place overwrite them), into
 * wg (per-rank [recv_capacity] FP32, epf_ll_buffer_bytes(EPF_LL_BUF_WEIGHT_GRAD) strides) at the
 * fixed row, or (packed_order) at the packed row: the order of y. */
static __global__ void llref_wgrad_kernel(epf_plan_t plan, char* win, int rank0, const uint32_t* rounds,
                                          const int32_t* recv_counts, float* wg, int packed_order, int skip_rank) {
  const int R = plan.nranks, EL = plan.experts_per_rank;
  const int i = (int)blockIdx.y, r = rank0 + i;
  const int64_t rows = plan.recv_capacity;
  if (r == skip_rank) return;
  const uint32_t round = rounds[i];
  const int32_t* cnt = recv_counts + (int64_t)i * EL * R;
  const char* base = win + (uint64_t)i * plan.total_bytes;
  for (int64_t fr = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; fr < rows; fr += (int64_t)gridDim.x * blockDim.x) {
    int le, s, j, pos;
    if (!llref_fixed_row_slot(&plan, cnt, fr, &le, &s, &j, &pos)) continue;
    const uint16_t* x = (const uint16_t*)(base + epf_plan_recv_token_offset(&plan, epf_ll_recv_row(&plan, round, le, s, j)));
    wg[(uint64_t)i * rows + (packed_order ? epf_ll_packed_row(&plan, le, pos) : fr)] = llref_wgrad_value(r * EL + le, llref_bf2f(x[0]));
  }
}

/* Poison (0xA5) the recv_capacity receive rows, metadata and scales of a round from its first row
 * row0. base: the rank's window slice. Stream-ordered. */
static inline cudaError_t llref_poison_recv_rows(const epf_plan_t* p, char* base, int64_t row0, cudaStream_t s) {
  cudaError_t e = cudaMemsetAsync(base + epf_plan_recv_token_offset(p, row0), 0xA5,
                                  (size_t)p->recv_capacity * p->row_bytes, s);
  if (e == cudaSuccess)
    e = cudaMemsetAsync(base + epf_plan_recv_meta_offset(p, row0), 0xA5, (size_t)p->recv_capacity * p->meta_bytes_per_row, s);
  if (e == cudaSuccess && p->scale_bytes_per_row > 0)
    e = cudaMemsetAsync(base + epf_plan_recv_scale_offset(p, row0), 0xA5,
                        (size_t)p->recv_capacity * p->scale_bytes_per_row, s);
  return e;
}

/* Poison the window rows one rank uses in the round of `epoch` (its parity): receive rows,
 * metadata, scales, combine landing rows, and the EXPERT_OUT rows of an MXFP8 pull plan. base: the
 * rank's window slice. Stream-ordered. */
static inline cudaError_t llref_poison_window(const epf_plan_t* p, char* base, uint32_t epoch, cudaStream_t s) {
  const int64_t row0 = epf_ll_recv_row(p, epoch, 0, 0, 0);
  cudaError_t e = llref_poison_recv_rows(p, base, row0, s);
  if (e == cudaSuccess)
    e = cudaMemsetAsync(base + epf_plan_combine_offset(p, epf_ll_combine_row(p, epoch, 0, 0)), 0xA5,
                        (size_t)p->max_tokens_per_rank * p->top_k * p->combine_row_bytes, s);
  if (e == cudaSuccess && p->region[EPF_REGION_EXPERT_OUT].bytes != 0) /* MXFP8 pull: the quantized outputs */
    e = cudaMemsetAsync(base + epf_plan_expert_out_offset(p, row0), 0xA5, (size_t)p->recv_capacity * p->combine_row_bytes,
                        s);
  return e;
}

/* ============================================================================================ */
/* checks of one rank                                                                            */
/* ============================================================================================ */

/* One rank's dispatch outputs (device pointers; packed ones may be NULL). */
typedef struct llref_rank_bufs {
  const char* win;                       /* the rank's window slice */
  const int32_t* recv_counts;            /* [EL][R] */
  const int32_t* expert_counts;          /* [EL] */
  const uint32_t* round;                 /* one word */
  const void* packed_x;                  /* [recv_capacity] rows */
  const void* packed_scales;             /* epf_ll_buffer_bytes(PACKED_SCALES) bytes */
  const epf_recv_meta_em_t* packed_meta; /* [recv_capacity] */
} llref_rank_bufs_t;

#define LLREF_FAIL(...)                     \
  do {                                      \
    snprintf(msg, LLREF_MSG, __VA_ARGS__); \
    goto done;                              \
  } while (0)

#define LLREF_CUDA(call)                                                                              \
  do {                                                                                                \
    cudaError_t llref_e_ = (call);                                                                    \
    if (llref_e_ != cudaSuccess)                                                                      \
      LLREF_FAIL("%s:%d: %s -> %s (%s)", __FILE__, __LINE__, #call, cudaGetErrorName(llref_e_),       \
                 cudaGetErrorString(llref_e_));                                                       \
  } while (0)

/* Host copies of one rank's outputs, for the checks. */
typedef struct llref_host_bufs {
  int32_t* counts;           /* [EL][R] */
  int32_t* ecounts;          /* [EL] */
  char* rows;                /* [Tmax] rows of row_bytes */
  uint8_t* scales;           /* [Tmax] compact scale rows */
  uint8_t* pscales;          /* the rank's packed scales (psb bytes) */
  char* meta;                /* [Tmax] window metadata rows of mb bytes (RANK_MAJOR) */
  epf_recv_meta_em_t* pmeta; /* [Tmax] expert-major metadata rows */
} llref_host_bufs_t;

static inline void llref_host_bufs_free(llref_host_bufs_t* h) {
  void* const p[] = {h->counts, h->ecounts, h->rows, h->scales, h->pscales, h->meta, h->pmeta};
  for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); ++i) free(p[i]);
}

/* 0, or -1 (out of memory; the struct can still be freed) */
static inline int llref_host_bufs_alloc(llref_host_bufs_t* h, const llref_in_t* in, size_t rb, uint64_t psb, size_t mb) {
  const int R = in->R, EL = in->EL, Tmax = in->Tmax, sb = in->sbytes;
  h->counts = (int32_t*)malloc((size_t)EL * R * 4);
  h->ecounts = (int32_t*)malloc((size_t)EL * 4);
  h->rows = (char*)malloc((size_t)Tmax * rb);
  h->scales = (uint8_t*)malloc((size_t)Tmax * (sb > 0 ? sb : 1));
  h->pscales = (uint8_t*)malloc(psb > 0 ? psb : 1);
  h->meta = (char*)malloc((size_t)Tmax * (mb > 0 ? mb : 1));
  h->pmeta = (epf_recv_meta_em_t*)malloc((size_t)Tmax * sizeof(epf_recv_meta_em_t));
  return h->counts && h->ecounts && h->rows && h->scales && h->pscales && h->meta && h->pmeta ? 0 : -1;
}

/* The scales of packed row `prow` in a rank's packed scales (sb bytes a row, compact or swizzled)
 * against want[sb]: the first differing byte, or -1 */
static inline int llref_packed_scales_diff(const uint8_t* pscales, int swizzled, int64_t prow, int sb, const uint8_t* want) {
  for (int c = 0; c < sb; ++c) {
    const int64_t o = swizzled ? epf_scale_swizzle_offset(prow, c, sb) : prow * sb + c;
    if (pscales[o] != want[c]) return c;
  }
  return -1;
}

/* Rank d: round, counts, expert counts; rows + scales + metadata (check_rows) in the window of
 * the round, and the packed copy (rows, scales compact or swizzled, metadata) when `packed`.
 * 0, or -1 with msg. */
static inline int llref_check_dispatch_rank(const llref_in_t* in, const epf_plan_t* p, const llref_t* ref, int d,
                                            const llref_rank_bufs_t* b, uint32_t want_round, int check_rows, int packed,
                                            const char* what, char* msg) {
  const int R = in->R, EL = in->EL, Tmax = in->Tmax, sb = in->sbytes;
  const size_t rb = p->row_bytes;
  const int swizzled = p->scale_layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4 && p->payload == EPF_PAYLOAD_MXFP8;
  const uint64_t psb = b->packed_scales != NULL ? epf_ll_buffer_bytes(p, EPF_LL_BUF_PACKED_SCALES, EPF_INDEX_DEFAULT) : 0;
  llref_host_bufs_t hb;
  uint32_t round = 0;
  int rc = -1;
  if (llref_host_bufs_alloc(&hb, in, rb, psb, 0) != 0) LLREF_FAIL("%s: out of host memory", what);
  LLREF_CUDA(cudaMemcpy(hb.counts, b->recv_counts, (size_t)EL * R * 4, cudaMemcpyDeviceToHost));
  LLREF_CUDA(cudaMemcpy(hb.ecounts, b->expert_counts, (size_t)EL * 4, cudaMemcpyDeviceToHost));
  LLREF_CUDA(cudaMemcpy(&round, b->round, 4, cudaMemcpyDeviceToHost));
  if (round != want_round) LLREF_FAIL("%s: rank %d round %u, want %u", what, d, round, want_round);
  if (packed && check_rows && sb > 0) LLREF_CUDA(cudaMemcpy(hb.pscales, b->packed_scales, psb, cudaMemcpyDeviceToHost));
  for (int le = 0; le < EL; ++le) {
    int tot = 0, pos = 0;
    for (int s = 0; s < R; ++s) tot += ref->counts[((size_t)d * EL + le) * R + s];
    if (hb.ecounts[le] != tot) LLREF_FAIL("%s: rank %d expert %d: expert_counts %d, want %d", what, d, le, hb.ecounts[le], tot);
    for (int s = 0; s < R; ++s) {
      const size_t g = ((size_t)d * EL + le) * R + s;
      const int n = ref->counts[g];
      if (hb.counts[le * R + s] != n)
        LLREF_FAIL("%s: rank %d expert %d src %d: count %d, want %d", what, d, le, s, hb.counts[le * R + s], n);
      if (n > 0 && check_rows) {
        const int64_t row0 = epf_ll_recv_row(p, want_round, le, s, 0);
        LLREF_CUDA(cudaMemcpy(hb.rows, b->win + epf_plan_recv_token_offset(p, row0), (size_t)n * rb, cudaMemcpyDeviceToHost));
        LLREF_CUDA(cudaMemcpy(hb.pmeta, b->win + epf_plan_recv_meta_offset(p, row0), (size_t)n * 16, cudaMemcpyDeviceToHost));
        if (sb > 0)
          LLREF_CUDA(cudaMemcpy(hb.scales, b->win + epf_plan_recv_scale_offset(p, row0), (size_t)n * sb, cudaMemcpyDeviceToHost));
        for (int j = 0; j < n; ++j) {
          const int t = ref->row_t[g * Tmax + j], k = ref->row_k[g * Tmax + j];
          if (memcmp(hb.rows + (size_t)j * rb, llref_want_row(in, s, t), rb) != 0)
            LLREF_FAIL("%s: rank %d expert %d src %d slot %d: row differs from token %d", what, d, le, s, j, t);
          if (sb > 0 && memcmp(hb.scales + (size_t)j * sb, llref_want_scales(in, s, t), (size_t)sb) != 0)
            LLREF_FAIL("%s: rank %d expert %d src %d slot %d: scales differ from token %d", what, d, le, s, j, t);
          const float wmeta = llref_meta_weight(in, s, t, k);
          const epf_recv_meta_em_t* m = hb.pmeta + j;
          if (m->src_token != t || m->src_rank != s || m->k != k || m->local_expert != le || memcmp(&m->weight, &wmeta, 4) != 0)
            LLREF_FAIL("%s: rank %d expert %d src %d slot %d: meta (%d,%d,%d,%d,%g), want (%d,%d,%d,%d)", what, d, le, s,
                       j, m->src_token, m->src_rank, m->k, m->local_expert, (double)m->weight, t, s, k, le);
        }
        if (packed) {
          const int64_t pr = epf_ll_packed_row(p, le, pos);
          LLREF_CUDA(cudaMemcpy(hb.rows, (const char*)b->packed_x + (uint64_t)pr * rb, (size_t)n * rb, cudaMemcpyDeviceToHost));
          LLREF_CUDA(cudaMemcpy(hb.pmeta, b->packed_meta + pr, (size_t)n * 16, cudaMemcpyDeviceToHost));
          for (int j = 0; j < n; ++j) {
            const int t = ref->row_t[g * Tmax + j];
            if (memcmp(hb.rows + (size_t)j * rb, llref_want_row(in, s, t), rb) != 0 || hb.pmeta[j].src_token != t ||
                hb.pmeta[j].src_rank != s)
              LLREF_FAIL("%s: packed rank %d expert %d row %d differs", what, d, le, pos + j);
            {
              const int c = llref_packed_scales_diff(hb.pscales, swizzled, pr + j, sb, llref_want_scales(in, s, t));
              if (c >= 0) LLREF_FAIL("%s: packed rank %d expert %d row %d scale byte %d differs", what, d, le, pos + j, c);
            }
          }
        }
      }
      pos += n;
    }
  }
  rc = 0;
done:
  llref_host_bufs_free(&hb);
  return rc;
}

/* Source s: its combine output out ([Tmax][H] BF16, device), tokens [0, T), against want
 * ([R][Tmax][H], llref_combine). 0, or -1 with msg. */
static inline int llref_check_combine_rank(const llref_in_t* in, int s, const uint16_t* out, const uint16_t* want,
                                           const char* what, char* msg) {
  const size_t n = (size_t)in->Tmax * in->H;
  uint16_t* got = (uint16_t*)malloc(n * 2);
  int rc = -1;
  if (got == NULL) LLREF_FAIL("%s: out of host memory", what);
  LLREF_CUDA(cudaMemcpy(got, out, n * 2, cudaMemcpyDeviceToHost));
  for (int t = 0; t < llref_T(in, s); ++t) {
    const uint16_t* g = got + (size_t)t * in->H;
    const uint16_t* w = want + ((size_t)s * in->Tmax + t) * in->H;
    if (memcmp(g, w, (size_t)in->H * 2) != 0) {
      int h = 0;
      while (g[h] == w[h]) ++h;
      LLREF_FAIL("%s: combine rank %d token %d h %d: 0x%04x, want 0x%04x", what, s, t, h, g[h], w[h]);
    }
  }
  rc = 0;
done:
  free(got);
  return rc;
}

/* Source s: its topk_weights_grad ([Tmax][K] FP32, device), tokens [0, T_s), bit for bit against
 * want ([R][Tmax][K], llref_dispatch_backward). 0, or -1 with msg. */
static inline int llref_check_wgrad_rank(const llref_in_t* in, int s, const float* got_dev, const float* want,
                                         const char* what, char* msg) {
  const size_t n = (size_t)in->Tmax * in->K;
  float* got = (float*)malloc(n * 4);
  int rc = -1;
  if (got == NULL) LLREF_FAIL("%s: out of host memory", what);
  LLREF_CUDA(cudaMemcpy(got, got_dev, n * 4, cudaMemcpyDeviceToHost));
  for (int t = 0; t < llref_T(in, s); ++t)
    for (int k = 0; k < in->K; ++k) {
      const float g = got[(size_t)t * in->K + k], w = want[((size_t)s * in->Tmax + t) * in->K + k];
      if (memcmp(&g, &w, 4) != 0)
        LLREF_FAIL("%s: weight grad rank %d token %d k %d (id %lld): %g, want %g", what, s, t, k,
                   (long long)in->htopk[((size_t)s * in->Tmax + t) * in->K + k], (double)g, (double)w);
    }
  rc = 0;
done:
  free(got);
  return rc;
}

/* LLREF_FAIL / LLREF_CUDA stay defined: epf_ll_rm_ref.cuh's checks use them too */

#endif /* EPF_LL_REF_CUH */
