/* test_quant — quant/quant.cuh on one GPU, bit-exact against the EPF_HD scalar reference on the CPU:
 *   - MXFP8 rows (BF16 and FP32 in, RCEIL and FLOOR, compact and swizzled scales) and per-128 FP8
 *     rows (BF16 and FP32, plain and UE8M0 scales, row-major and MN-major scale strides) for
 *     H in {32, 2880, 4096, 7168} (per-128: {128, 4096, 7168}; 2880 is refused by epf_quant_check)
 *     and rows in {1, 37, 1000}, on fresh random inputs (seed printed) with injected NaN, +-Inf,
 *     +-0, subnormals, huge values, all-zero / all-NaN / all-subnormal / one-Inf blocks; every
 *     output (the swizzle padding included) poisoned before each launch, the padding must be 0;
 *   - dequantize and the fused dequantize x weight FP32 accumulate against the CPU reference;
 *   - the per-thread 32-block primitive and the register-level (lane8) fused example;
 *   - the HT quantizing send's group quantizer (EPF_QSEND_UNROLL chunks: packed-BF16 amax, the
 *     chunks' shuffle steps together) for all four scale rules, on the same special-value inputs;
 *   - exhaustive device checks: the FP8/E8M0 conversion instructions against the integer
 *     reference for all 2^32 FP32 inputs; every BF16 amax -> scale on the device; the one-step
 *     division-free per-128 path against IEEE division for every (BF16 amax, BF16 x) pair.
 * Every CUDA call is checked. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epf_cmocka.h"

#include "epf_test_gpu.h"
#include "epfuse/ht/ht.cuh" /* the quantizing send's group quantizer (epf__qsend_group_amax / _chunk) */
#include "epfuse/quant/quant.cuh"

static uint64_t g_seed;

/* ---- kernels ------------------------------------------------------------------------------------ */

/* one warp per row, grid-stride; swizzled scales: every thread also zeroes its share of padding */
__global__ void k_mx_bf16(const uint16_t* x, int64_t rows, int H, int rule, int layout, uint8_t* q, uint8_t* sf) {
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nthreads = (int64_t)gridDim.x * blockDim.x;
  if (layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4) epf_scale_swizzle_zero_padding(sf, rows, H / 32, tid, nthreads);
  __syncwarp();
  for (int64_t r = tid >> 5; r < rows; r += nthreads >> 5)
    epf_mxfp8_quantize_row_bf16_warp(x + r * H, H, rule, r, layout, q + r * H, sf);
}

__global__ void k_mx_f32(const float* x, int64_t rows, int H, int rule, int layout, uint8_t* q, uint8_t* sf) {
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nthreads = (int64_t)gridDim.x * blockDim.x;
  if (layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4) epf_scale_swizzle_zero_padding(sf, rows, H / 32, tid, nthreads);
  __syncwarp();
  for (int64_t r = tid >> 5; r < rows; r += nthreads >> 5)
    epf_mxfp8_quantize_row_f32_warp(x + r * H, H, rule, r, layout, q + r * H, sf);
}

/* per-128: mn_major = scales stored [H/128, rows] (stride rows) instead of [rows, H/128] */
__global__ void k_128_bf16(const uint16_t* x, int64_t rows, int H, bool ue8m0, int mn_major, uint8_t* q, float* sf) {
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nthreads = (int64_t)gridDim.x * blockDim.x;
  for (int64_t r = tid >> 5; r < rows; r += nthreads >> 5)
    epf_fp8_128_quantize_row_bf16_warp(x + r * H, H, ue8m0, mn_major ? rows : 1, q + r * H,
                                       mn_major ? sf + r : sf + r * (H / 128));
}

__global__ void k_128_f32(const float* x, int64_t rows, int H, bool ue8m0, int mn_major, uint8_t* q, float* sf) {
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nthreads = (int64_t)gridDim.x * blockDim.x;
  for (int64_t r = tid >> 5; r < rows; r += nthreads >> 5)
    epf_fp8_128_quantize_row_f32_warp(x + r * H, H, ue8m0, mn_major ? rows : 1, q + r * H,
                                      mn_major ? sf + r : sf + r * (H / 128));
}

__global__ void k_mx_dequant(const uint8_t* q, const uint8_t* sf, int64_t rows, int H, float* out) {
  const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
  for (int64_t r = w; r < rows; r += nw) epf_mxfp8_dequantize_row_f32_warp(q + r * H, sf + r * (H / 32), H, out + r * H);
}

/* combine: acc[r] += sum_k deq(q_k[r]) * w[r][k], k in order */
__global__ void k_mx_accumulate(const uint8_t* q, const uint8_t* sf, int64_t rows, int H, int K, const float* w,
                                float* acc) {
  const int64_t wi = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
  for (int64_t r = wi; r < rows; r += nw)
    for (int k = 0; k < K; ++k)
      epf_mxfp8_dequantize_accumulate_row_warp(q + ((int64_t)k * rows + r) * H, sf + ((int64_t)k * rows + r) * (H / 32), H,
                                               w[r * K + k], acc + r * H);
}

__global__ void k_128_dequant(const uint8_t* q, const float* sf, int64_t rows, int H, float* out) {
  const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
  for (int64_t r = w; r < rows; r += nw) epf_fp8_128_dequantize_row_f32_warp(q + r * H, sf + r * (H / 128), 1, H, out + r * H);
}

/* per-thread: thread t quantizes block t (32 floats) with epf_mxfp8_quantize_block32 */
__global__ void k_block32(const float* x, int64_t nblocks, int rule, uint8_t* q, uint8_t* sf) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t < nblocks) {
    float v[32];
    uint32_t out[8];
    for (int i = 0; i < 32; ++i) v[i] = x[t * 32 + i];
    sf[t] = epf_mxfp8_quantize_block32(v, rule, out);
    for (int i = 0; i < 8; ++i) ((uint32_t*)(q + t * 32))[i] = out[i];
  }
}

// example-begin quant-fused
/* A fused send loop: each warp streams one BF16 row with 16-byte loads and writes MXFP8 straight
 * from registers (here to local memory; a dispatch send would write epf_peer_ptr destinations,
 * possibly several, from the same registers). Compact scales, one row per warp. */
__global__ void k_fused_example(const uint16_t* x, int64_t rows, int H, uint8_t* q, uint8_t* sf) {
  const int lane = (int)(threadIdx.x & 31u);
  const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (row >= rows) return; /* whole warps leave together */
  const uint4* src = (const uint4*)(x + row * H);
  uint2* dst = (uint2*)(q + row * H);
  uint8_t* dst_scales = sf + row * (H / 32);
  for (int chunk = 0; chunk * 256 < H; ++chunk) {
    const int i = chunk * 32 + lane; /* this lane's 8 elements: [8i, 8i + 8) */
    const uint4 v = i * 8 < H ? src[i] : make_uint4(0u, 0u, 0u, 0u);
    uint8_t sb;
    const uint2 e4m3 = epf_mxfp8_quantize_lane8_bf16_warp(v, EPF_MX_RCEIL, &sb); /* all 32 lanes */
    if (i * 8 < H) {
      dst[i] = e4m3;
      if ((lane & 3) == 0) dst_scales[i / 4] = sb; /* one scale per quad */
    }
  }
}
// example-end quant-fused

/* exhaustive: FP8 / E8M0 conversion paths against the integer reference, all 2^32 inputs */
__global__ void k_exhaustive_cvt(unsigned long long* bad, uint32_t* first) {
  const uint64_t n = (uint64_t)gridDim.x * blockDim.x;
  unsigned long long mine = 0;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (1ull << 32); i += n) {
    const float v = __uint_as_float((uint32_t)i);
    const bool e4 = epf_e4m3_from_float(v) != epf__e4m3_from_float_soft(v);
    const bool e8 = epf_e8m0_roundup(v) != epf__e8m0_roundup_soft(v);
    if (e4 || e8) {
      ++mine;
      atomicMin(first + (e4 ? 0 : 1), (uint32_t)i);
    }
  }
  if (mine) atomicAdd(bad, mine);
}

/* every BF16 pattern as an amax: scale bytes (both rules), per-128 scales (both modes) */
__global__ void k_amax_all(uint8_t* rceil, uint8_t* floor_, float* s, float* s_ue, float* fast, float* fast_ue,
                           float* recip) {
  const uint32_t x = blockIdx.x * blockDim.x + threadIdx.x;
  if (x < 65536u) {
    const float a = epf_bf16_to_float((uint16_t)x);
    float y;
    rceil[x] = epf_e8m0_from_amax(a, EPF_MX_RCEIL);
    floor_[x] = epf_e8m0_from_amax(a, EPF_MX_FLOOR);
    s[x] = epf_fp8_128_scale(a, false);
    s_ue[x] = epf_fp8_128_scale(a, true);
    fast[x] = epf_fp8_128_scale_fast(fabsf(a), false, &y);
    recip[x] = y;
    fast_ue[x] = epf_fp8_128_scale_fast(fabsf(a), true, &y);
  }
}

/* every (BF16 amax >= 1e-4, BF16 x with |x| <= amax, both signs): the one-Markstein-step byte
 * equals the byte of IEEE x / s */
__global__ void k_markstein_all(unsigned long long* bad, unsigned long long* total, uint32_t* first) {
  const uint32_t ab = blockIdx.y * 128u + (blockIdx.z << 16); /* amax bf16 bits: 128 per grid row */
  unsigned long long mine = 0, cnt = 0;
  for (uint32_t j = 0; j < 128u; ++j) {
    const uint32_t abits = ab + j;
    const float amax = epf_bf16_to_float((uint16_t)abits);
    if (abits >= 0x7f80u || !(amax >= 1e-4f)) continue;
    const float s = epf_fp8_128_scale(amax, false);
    const float y = epf_fp8_128_recip(s);
    for (uint32_t xb = blockIdx.x * blockDim.x + threadIdx.x; xb <= abits; xb += gridDim.x * blockDim.x) {
      for (uint32_t sg = 0; sg < 2; ++sg) {
        const float v = epf_bf16_to_float((uint16_t)(xb | (sg << 15)));
        const uint8_t want = epf_fp8_128_quantize_ref(v, s);
        const uint8_t got = epf__fp8_128_recip_exact(s) ? epf_e4m3_from_float(v * y)
                                                        : epf_e4m3_from_float(epf__fdiv_markstein1(v, s, y));
        ++cnt;
        if (got != want) {
          ++mine;
          atomicMin(first, (abits << 16) | xb);
        }
      }
    }
  }
  atomicAdd(total, cnt);
  if (mine) atomicAdd(bad, mine);
}

/* all 256 E4M3 bytes through the device dequantize path (cvt.rn.f16x2.e4m3x2 on sm_89+) */
__global__ void k_e4m3_to_float_all(float* out) {
  const int t = threadIdx.x; /* 64 threads x 4 bytes */
  uint2 q;
  float f[8];
  q.x = (uint32_t)(4 * t) | (uint32_t)(4 * t + 1) << 8 | (uint32_t)(4 * t + 2) << 16 | (uint32_t)(4 * t + 3) << 24;
  q.y = q.x;
  epf_mxfp8_dequantize8(q, 127, f);
  for (int i = 0; i < 4; ++i) out[4 * t + i] = f[i];
}

/* ---- host helpers --------------------------------------------------------------------------------- */

static int grid_for_rows(int64_t rows, int threads) {
  const int64_t warps = threads / 32;
  int64_t g = (rows + warps - 1) / warps;
  if (g > 4096) g = 4096; /* grid-stride beyond */
  return (int)(g < 1 ? 1 : g);
}

static uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
static float f32_from(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* Random rows with special values. Each 32-block gets a base exponent (so block scales spread over
 * the whole E8M0 range); elements are 2^(base - k) * (1 + random mantissa), random sign; injected:
 * NaN (both signs, payloads), +-Inf, +-0, subnormals, max finite; whole special blocks: all zero,
 * all NaN, all subnormal, one Inf. fp32 = 0: values are exact BF16 (low 16 bits 0). */
static void make_input(float* out, int64_t n, int fp32) {
  for (int64_t b = 0; b < n; b += 32) {
    const uint64_t kind = epf_test_rand(&g_seed) % 64;
    const int base = (int)(epf_test_rand(&g_seed) % 100) == 0 ? (int)(epf_test_rand(&g_seed) % 254) + 1
                                                              : 127 + (int)(epf_test_rand(&g_seed) % 61) - 30;
    for (int64_t i = b; i < b + 32 && i < n; ++i) {
      const uint64_t r = epf_test_rand(&g_seed);
      const uint32_t sign = (uint32_t)(r >> 63) << 31;
      uint32_t u;
      int e = base - (int)((r >> 8) % 24);
      if (e < 0) e = 0;
      u = sign | ((uint32_t)e << 23) | (uint32_t)((r >> 32) & 0x7fffffu);
      switch (r % 97) {
        case 0: u = 0x7fc00000u | (uint32_t)((r >> 20) & 0x3fffffu); break; /* NaN */
        case 1: u = 0xff800001u | (uint32_t)((r >> 20) & 0x3f0000u); break; /* -NaN, signalling */
        case 2: u = 0x7f800000u; break;
        case 3: u = 0xff800000u; break;
        case 4: u = 0; break;
        case 5: u = 0x80000000u; break;
        case 6: u = sign | (uint32_t)((r >> 20) & 0x7fffffu); break; /* subnormal */
        case 7: u = sign | 0x7f7f0000u; break;                       /* BF16 max finite */
        default: break;
      }
      if (kind == 0) u = (uint32_t)(r >> 63) << 31;                                       /* all +-0 */
      if (kind == 1) u = 0x7fc00000u | (uint32_t)(r >> 63) << 31;                         /* all NaN */
      if (kind == 2) u = sign | (uint32_t)((r >> 20) & 0x7fffffu);                         /* all subnormal */
      if (kind == 3 && i == b + (int64_t)(epf_test_rand(&g_seed) % 32)) u = 0x7f800000u | sign; /* one Inf */
      if (!fp32 && (u & 0x7fffffffu) <= 0x7f800000u) u &= 0xffff0000u;                    /* exact BF16 */
      if (!fp32 && (u & 0x7fffffffu) > 0x7f800000u) u = (u & 0xffff0000u) | 0x00400000u;  /* keep NaN */
      out[i] = f32_from(u);
    }
  }
}

static void to_bf16(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = (uint16_t)(f32_bits(in[i]) >> 16);
}

static int same_float(float a, float b) { return (isnan(a) && isnan(b)) || f32_bits(a) == f32_bits(b); }

/* ---- MXFP8 rows -------------------------------------------------------------------------------- */

/* the buffers of one row-quantization case: n fresh inputs (make_input) as FP32 xf and BF16 xb,
 * uploaded to d_x in the kernel's input type (fp32: xf, else xb); the reference and the device's
 * payload (n bytes) and scales (want_sf_bytes / sf_bytes) */
typedef struct {
  float* xf;
  uint16_t* xb;
  uint8_t *want_q, *got_q;
  void *want_sf, *got_sf;
  void* d_x;
  uint8_t* d_q;
  void* d_sf;
} qbufs_t;

static void qbufs_init(qbufs_t* b, int64_t n, int64_t want_sf_bytes, int64_t sf_bytes, int fp32) {
  b->xf = (float*)malloc((size_t)n * 4);
  b->xb = (uint16_t*)malloc((size_t)n * 2);
  b->want_q = (uint8_t*)malloc((size_t)n);
  b->want_sf = malloc((size_t)want_sf_bytes);
  b->got_q = (uint8_t*)malloc((size_t)n);
  b->got_sf = malloc((size_t)sf_bytes);
  assert_non_null(b->xf);
  assert_non_null(b->xb);
  assert_non_null(b->want_q);
  assert_non_null(b->want_sf);
  assert_non_null(b->got_q);
  assert_non_null(b->got_sf);
  make_input(b->xf, n, fp32);
  to_bf16(b->xf, b->xb, n);
  EPF_TEST_MALLOC(&b->d_x, (size_t)n * 4);
  EPF_TEST_MALLOC(&b->d_q, (size_t)n);
  EPF_TEST_MALLOC(&b->d_sf, (size_t)sf_bytes);
  if (fp32) EPF_CHECK_CUDA(cudaMemcpy(b->d_x, b->xf, (size_t)n * 4, cudaMemcpyHostToDevice));
  else EPF_CHECK_CUDA(cudaMemcpy(b->d_x, b->xb, (size_t)n * 2, cudaMemcpyHostToDevice));
}

static void qbufs_free(qbufs_t* b) {
  EPF_TEST_FREE(b->d_x);
  EPF_TEST_FREE(b->d_q);
  EPF_TEST_FREE(b->d_sf);
  free(b->xf);
  free(b->xb);
  free(b->want_q);
  free(b->want_sf);
  free(b->got_q);
  free(b->got_sf);
}

static void run_mxfp8_case(int H, int64_t rows, int fp32) {
  const int64_t n = rows * H;
  const int ncols = H / 32;
  const int threads = 128;
  const int64_t sw_bytes = epf_scale_swizzle_bytes(rows, ncols);
  qbufs_t b;
  assert_int_equal(epf_quant_check(H, EPF_PAYLOAD_MXFP8), EPF_OK);
  qbufs_init(&b, n, rows * ncols, sw_bytes, fp32);
  const float* xf = b.xf;
  const uint16_t* xb = b.xb;
  const void* d_x = b.d_x;
  uint8_t *want_q = b.want_q, *got_q = b.got_q, *d_q = b.d_q;
  uint8_t *want_sf = (uint8_t*)b.want_sf, *got_sf = (uint8_t*)b.got_sf, *d_sf = (uint8_t*)b.d_sf;
  for (int rule = EPF_MX_RCEIL; rule <= EPF_MX_FLOOR; ++rule) {
    /* CPU reference */
    for (int64_t r = 0; r < rows; ++r)
      for (int c = 0; c < ncols; ++c) {
        float blk[32];
        for (int i = 0; i < 32; ++i) {
          const int64_t k = r * H + c * 32 + i;
          blk[i] = fp32 ? xf[k] : epf_bf16_to_float(xb[k]);
        }
        want_sf[r * ncols + c] = epf_mxfp8_quantize_block_ref(blk, rule, want_q + r * H + c * 32);
      }
    for (int layout = EPF_SCALE_LAYOUT_COMPACT; layout <= EPF_SCALE_LAYOUT_SWIZZLED_128X4; ++layout) {
      const int64_t sf_bytes = epf_scale_bytes(layout, rows, ncols);
      EPF_CHECK_CUDA(cudaMemset(d_q, 0xaa, (size_t)n)); /* poison, padding included */
      EPF_CHECK_CUDA(cudaMemset(d_sf, 0xaa, (size_t)sw_bytes));
      if (fp32)
        k_mx_f32<<<grid_for_rows(rows, threads), threads>>>((const float*)d_x, rows, H, rule, layout, d_q, d_sf);
      else
        k_mx_bf16<<<grid_for_rows(rows, threads), threads>>>((const uint16_t*)d_x, rows, H, rule, layout, d_q, d_sf);
      EPF_CHECK_LAUNCH();
      EPF_CHECK_CUDA(cudaMemcpy(got_q, d_q, (size_t)n, cudaMemcpyDeviceToHost));
      EPF_CHECK_CUDA(cudaMemcpy(got_sf, d_sf, (size_t)sw_bytes, cudaMemcpyDeviceToHost));
      for (int64_t k = 0; k < n; ++k)
        if (got_q[k] != want_q[k]) {
          const float v = fp32 ? xf[k] : epf_bf16_to_float(xb[k]);
          fail_msg("MXFP8 %s H=%d rows=%lld rule=%d layout=%d: element (%lld, %lld) = %a: got 0x%02x want 0x%02x "
                   "(scale 0x%02x)",
                   fp32 ? "f32" : "bf16", H, (long long)rows, rule, layout, (long long)(k / H), (long long)(k % H),
                   (double)v, got_q[k], want_q[k], want_sf[(k / H) * ncols + (k % H) / 32]);
        }
      for (int64_t r = 0; r < rows; ++r)
        for (int c = 0; c < ncols; ++c) {
          const uint8_t got = got_sf[epf_scale_offset(layout, r, c, ncols)];
          if (got != want_sf[r * ncols + c])
            fail_msg("MXFP8 H=%d rows=%lld rule=%d layout=%d: scale (%lld, %d) got 0x%02x want 0x%02x", H,
                     (long long)rows, rule, layout, (long long)r, c, got, want_sf[r * ncols + c]);
        }
      if (layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4) {
        /* every byte that is not a real scale is padding and must be 0 */
        uint8_t* is_scale = (uint8_t*)calloc((size_t)sw_bytes, 1);
        assert_non_null(is_scale);
        for (int64_t r = 0; r < rows; ++r)
          for (int c = 0; c < ncols; ++c) is_scale[epf_scale_swizzle_offset(r, c, ncols)] = 1;
        for (int64_t b = 0; b < sw_bytes; ++b)
          if (!is_scale[b] && got_sf[b] != 0) fail_msg("swizzle padding byte %lld = 0x%02x", (long long)b, got_sf[b]);
        free(is_scale);
      } else {
        assert_true(sf_bytes == rows * ncols);
      }
    }
  }
  qbufs_free(&b);
}

static const int k_rows[] = {1, 37, 1000};

static void test_mxfp8_rows(void** state) {
  static const int hs[] = {32, 2880, 4096, 7168};
  (void)state;
  for (int fp32 = 0; fp32 < 2; ++fp32)
    for (int hi = 0; hi < 4; ++hi)
      for (int ri = 0; ri < 3; ++ri) {
        run_mxfp8_case(hs[hi], k_rows[ri], fp32);
        printf("MXFP8 %s H=%d rows=%d: RCEIL+FLOOR x compact+swizzled bit-exact\n", fp32 ? "f32 " : "bf16", hs[hi],
               k_rows[ri]);
      }
}

/* ---- per-128 rows ------------------------------------------------------------------------------- */

static void run_fp8_128_case(int H, int64_t rows, int fp32) {
  const int64_t n = rows * H;
  const int G = H / 128;
  const int threads = 256;
  qbufs_t b;
  assert_int_equal(epf_quant_check(H, EPF_PAYLOAD_FP8_128), EPF_OK);
  qbufs_init(&b, n, (rows * G) * 4, (rows * G) * 4, fp32);
  const float* xf = b.xf;
  const uint16_t* xb = b.xb;
  const void* d_x = b.d_x;
  uint8_t *want_q = b.want_q, *got_q = b.got_q, *d_q = b.d_q;
  float *want_sf = (float*)b.want_sf, *got_sf = (float*)b.got_sf, *d_sf = (float*)b.d_sf;
  for (int ue = 0; ue < 2; ++ue) {
    for (int64_t r = 0; r < rows; ++r)
      for (int g = 0; g < G; ++g) {
        float blk[128];
        for (int i = 0; i < 128; ++i) {
          const int64_t k = r * H + g * 128 + i;
          blk[i] = fp32 ? xf[k] : epf_bf16_to_float(xb[k]);
        }
        want_sf[r * G + g] = epf_fp8_128_quantize_block_ref(blk, ue != 0, want_q + r * H + g * 128);
      }
    for (int mn = 0; mn < 2; ++mn) {
      EPF_CHECK_CUDA(cudaMemset(d_q, 0xaa, (size_t)n));
      EPF_CHECK_CUDA(cudaMemset(d_sf, 0xaa, (size_t)(rows * G) * 4));
      if (fp32)
        k_128_f32<<<grid_for_rows(rows, threads), threads>>>((const float*)d_x, rows, H, ue != 0, mn, d_q, d_sf);
      else
        k_128_bf16<<<grid_for_rows(rows, threads), threads>>>((const uint16_t*)d_x, rows, H, ue != 0, mn, d_q, d_sf);
      EPF_CHECK_LAUNCH();
      EPF_CHECK_CUDA(cudaMemcpy(got_q, d_q, (size_t)n, cudaMemcpyDeviceToHost));
      EPF_CHECK_CUDA(cudaMemcpy(got_sf, d_sf, (size_t)(rows * G) * 4, cudaMemcpyDeviceToHost));
      for (int64_t k = 0; k < n; ++k)
        if (got_q[k] != want_q[k]) {
          const float v = fp32 ? xf[k] : epf_bf16_to_float(xb[k]);
          fail_msg("FP8-128 %s H=%d rows=%lld ue8m0=%d: element (%lld, %lld) = %a: got 0x%02x want 0x%02x (scale %a)",
                   fp32 ? "f32" : "bf16", H, (long long)rows, ue, (long long)(k / H), (long long)(k % H), (double)v,
                   got_q[k], want_q[k], (double)want_sf[(k / H) * G + (k % H) / 128]);
        }
      for (int64_t r = 0; r < rows; ++r)
        for (int g = 0; g < G; ++g) {
          const float got = got_sf[mn ? (int64_t)g * rows + r : r * G + g];
          if (f32_bits(got) != f32_bits(want_sf[r * G + g]))
            fail_msg("FP8-128 H=%d rows=%lld ue8m0=%d mn=%d: scale (%lld, %d) got %a want %a", H, (long long)rows, ue, mn,
                     (long long)r, g, (double)got, (double)want_sf[r * G + g]);
        }
    }
  }
  qbufs_free(&b);
}

static void test_fp8_128_rows(void** state) {
  static const int hs[] = {128, 4096, 7168};
  (void)state;
  /* 2880 is not a multiple of 128: refused with a clear status, nothing launched */
  assert_int_equal(epf_quant_check(2880, EPF_PAYLOAD_FP8_128), EPF_ERR_HIDDEN_ALIGNMENT);
  printf("FP8-128 H=2880: %s (%s)\n", epf_status_name(epf_quant_check(2880, EPF_PAYLOAD_FP8_128)),
         epf_status_message(EPF_ERR_HIDDEN_ALIGNMENT));
  for (int fp32 = 0; fp32 < 2; ++fp32)
    for (int hi = 0; hi < 3; ++hi)
      for (int ri = 0; ri < 3; ++ri) {
        run_fp8_128_case(hs[hi], k_rows[ri], fp32);
        printf("FP8-128 %s H=%d rows=%d: plain+UE8M0 x row/MN-major scales bit-exact\n", fp32 ? "f32 " : "bf16", hs[hi],
               k_rows[ri]);
      }
}

/* ---- dequantize, fused accumulate ------------------------------------------------------------- */

static void test_dequant(void** state) {
  const int H = 2880, K = 3;
  const int64_t rows = 37, n = rows * H;
  const int ncols = H / 32;
  float* xf = (float*)malloc((size_t)(K * n) * 4);
  uint16_t* xb = (uint16_t*)malloc((size_t)(K * n) * 2);
  uint8_t* q = (uint8_t*)malloc((size_t)(K * n));
  uint8_t* sf = (uint8_t*)malloc((size_t)(K * rows * ncols));
  float* acc = (float*)malloc((size_t)n * 4);
  float* got = (float*)malloc((size_t)n * 4);
  float* w = (float*)malloc((size_t)(rows * K) * 4);
  uint16_t* d_x;
  uint8_t *d_q, *d_sf;
  float *d_out, *d_w;
  (void)state;
  assert_non_null(xf);
  assert_non_null(xb);
  assert_non_null(q);
  assert_non_null(sf);
  assert_non_null(acc);
  assert_non_null(got);
  assert_non_null(w);
  make_input(xf, K * n, 0);
  to_bf16(xf, xb, K * n);
  for (int64_t i = 0; i < rows * K; ++i) w[i] = (float)(epf_test_rand(&g_seed) % 2001) / 1000.0f - 1.0f;
  for (int64_t i = 0; i < n; ++i) acc[i] = (float)((int64_t)(epf_test_rand(&g_seed) % 20001) - 10000) / 256.0f;
  EPF_TEST_MALLOC(&d_x, (size_t)(K * n) * 2);
  EPF_TEST_MALLOC(&d_q, (size_t)(K * n));
  EPF_TEST_MALLOC(&d_sf, (size_t)(K * rows * ncols));
  EPF_TEST_MALLOC(&d_out, (size_t)n * 4);
  EPF_TEST_MALLOC(&d_w, (size_t)(rows * K) * 4);
  EPF_CHECK_CUDA(cudaMemcpy(d_x, xb, (size_t)(K * n) * 2, cudaMemcpyHostToDevice));
  EPF_CHECK_CUDA(cudaMemcpy(d_w, w, (size_t)(rows * K) * 4, cudaMemcpyHostToDevice));
  /* K quantized sources (device), compact scales */
  k_mx_bf16<<<grid_for_rows(K * rows, 128), 128>>>(d_x, K * rows, H, EPF_MX_RCEIL, EPF_SCALE_LAYOUT_COMPACT, d_q, d_sf);
  EPF_CHECK_LAUNCH();
  EPF_CHECK_CUDA(cudaMemcpy(q, d_q, (size_t)(K * n), cudaMemcpyDeviceToHost));
  EPF_CHECK_CUDA(cudaMemcpy(sf, d_sf, (size_t)(K * rows * ncols), cudaMemcpyDeviceToHost));
  /* dequantize source 0 */
  EPF_CHECK_CUDA(cudaMemset(d_out, 0xff, (size_t)n * 4));
  k_mx_dequant<<<grid_for_rows(rows, 128), 128>>>(d_q, d_sf, rows, H, d_out);
  EPF_CHECK_LAUNCH();
  EPF_CHECK_CUDA(cudaMemcpy(got, d_out, (size_t)n * 4, cudaMemcpyDeviceToHost));
  for (int64_t k = 0; k < n; ++k) {
    const float want = epf_mxfp8_dequantize_ref(q[k], sf[k / 32]);
    if (!same_float(got[k], want)) fail_msg("dequant %lld: q 0x%02x sf 0x%02x got %a want %a", (long long)k, q[k], sf[k / 32], (double)got[k], (double)want);
  }
  /* fused dequantize x weight, FP32 accumulate over K sources in order */
  EPF_CHECK_CUDA(cudaMemcpy(d_out, acc, (size_t)n * 4, cudaMemcpyHostToDevice));
  k_mx_accumulate<<<grid_for_rows(rows, 128), 128>>>(d_q, d_sf, rows, H, K, d_w, d_out);
  EPF_CHECK_LAUNCH();
  EPF_CHECK_CUDA(cudaMemcpy(got, d_out, (size_t)n * 4, cudaMemcpyDeviceToHost));
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < H; ++h) {
      float a = acc[r * H + h];
      for (int k = 0; k < K; ++k) {
        const int64_t e = ((int64_t)k * rows + r) * H + h;
        a = epf_mxfp8_dequantize_accumulate_ref(q[e], sf[e / 32], w[r * K + k], a);
      }
      if (!same_float(got[r * H + h], a))
        fail_msg("accumulate (%lld, %d): got %a want %a", (long long)r, h, (double)got[r * H + h], (double)a);
    }
  /* per-128: quantize on the device, dequantize on the device, compare with the reference */
  {
    const int H2 = 4096;
    const int64_t n2 = rows * H2;
    float* sf2 = (float*)malloc((size_t)(rows * (H2 / 128)) * 4);
    float *d_sf2, *d_out2;
    uint8_t* d_q2;
    uint8_t* q2 = (uint8_t*)malloc((size_t)n2);
    float* got2 = (float*)malloc((size_t)n2 * 4);
    assert_non_null(sf2);
    assert_non_null(q2);
    assert_non_null(got2);
    EPF_TEST_MALLOC(&d_q2, (size_t)n2);
    EPF_TEST_MALLOC(&d_sf2, (size_t)(rows * (H2 / 128)) * 4);
    EPF_TEST_MALLOC(&d_out2, (size_t)n2 * 4);
    k_128_bf16<<<grid_for_rows(rows, 128), 128>>>(d_x, rows, H2, false, 0, d_q2, d_sf2);
    EPF_CHECK_LAUNCH();
    k_128_dequant<<<grid_for_rows(rows, 128), 128>>>(d_q2, d_sf2, rows, H2, d_out2);
    EPF_CHECK_LAUNCH();
    EPF_CHECK_CUDA(cudaMemcpy(q2, d_q2, (size_t)n2, cudaMemcpyDeviceToHost));
    EPF_CHECK_CUDA(cudaMemcpy(sf2, d_sf2, (size_t)(rows * (H2 / 128)) * 4, cudaMemcpyDeviceToHost));
    EPF_CHECK_CUDA(cudaMemcpy(got2, d_out2, (size_t)n2 * 4, cudaMemcpyDeviceToHost));
    for (int64_t k = 0; k < n2; ++k) {
      const float want = epf_fp8_128_dequantize_ref(q2[k], sf2[k / 128]);
      if (!same_float(got2[k], want)) fail_msg("per-128 dequant %lld: got %a want %a", (long long)k, (double)got2[k], (double)want);
    }
    EPF_TEST_FREE(d_q2);
    EPF_TEST_FREE(d_sf2);
    EPF_TEST_FREE(d_out2);
    free(sf2);
    free(q2);
    free(got2);
  }
  EPF_TEST_FREE(d_x);
  EPF_TEST_FREE(d_q);
  EPF_TEST_FREE(d_sf);
  EPF_TEST_FREE(d_out);
  EPF_TEST_FREE(d_w);
  free(xf);
  free(xb);
  free(q);
  free(sf);
  free(acc);
  free(got);
  free(w);
  printf("dequantize, fused dequantize x weight accumulate (K=%d), per-128 dequantize: bit-exact\n", K);
}

/* ---- thread-level primitive and the fused example ------------------------------------------------ */

static void test_lane_primitives(void** state) {
  const int H = 2880;
  const int64_t rows = 37, n = rows * H, nblocks = n / 32;
  float* xf = (float*)malloc((size_t)n * 4);
  uint16_t* xb = (uint16_t*)malloc((size_t)n * 2);
  uint8_t *q1 = (uint8_t*)malloc((size_t)n), *q2 = (uint8_t*)malloc((size_t)n);
  uint8_t *s1 = (uint8_t*)malloc((size_t)nblocks), *s2 = (uint8_t*)malloc((size_t)nblocks);
  float* d_xf;
  uint16_t* d_xb;
  uint8_t *d_q, *d_sf;
  (void)state;
  assert_non_null(xf);
  assert_non_null(xb);
  assert_non_null(q1);
  assert_non_null(q2);
  assert_non_null(s1);
  assert_non_null(s2);
  make_input(xf, n, 1);
  to_bf16(xf, xb, n);
  EPF_TEST_MALLOC(&d_xf, (size_t)n * 4);
  EPF_TEST_MALLOC(&d_xb, (size_t)n * 2);
  EPF_TEST_MALLOC(&d_q, (size_t)n);
  EPF_TEST_MALLOC(&d_sf, (size_t)nblocks);
  EPF_CHECK_CUDA(cudaMemcpy(d_xf, xf, (size_t)n * 4, cudaMemcpyHostToDevice));
  EPF_CHECK_CUDA(cudaMemcpy(d_xb, xb, (size_t)n * 2, cudaMemcpyHostToDevice));
  for (int rule = EPF_MX_RCEIL; rule <= EPF_MX_FLOOR; ++rule) {
    EPF_CHECK_CUDA(cudaMemset(d_q, 0xaa, (size_t)n));
    EPF_CHECK_CUDA(cudaMemset(d_sf, 0xaa, (size_t)nblocks));
    k_block32<<<(unsigned)((nblocks + 127) / 128), 128>>>(d_xf, nblocks, rule, d_q, d_sf);
    EPF_CHECK_LAUNCH();
    EPF_CHECK_CUDA(cudaMemcpy(q1, d_q, (size_t)n, cudaMemcpyDeviceToHost));
    EPF_CHECK_CUDA(cudaMemcpy(s1, d_sf, (size_t)nblocks, cudaMemcpyDeviceToHost));
    for (int64_t b = 0; b < nblocks; ++b) {
      uint8_t want[32];
      const uint8_t sb = epf_mxfp8_quantize_block_ref(xf + b * 32, rule, want);
      assert_int_equal(s1[b], sb);
      assert_memory_equal(q1 + b * 32, want, 32);
    }
  }
  /* the fused example == the row function (compact scales) */
  EPF_CHECK_CUDA(cudaMemset(d_q, 0xaa, (size_t)n));
  EPF_CHECK_CUDA(cudaMemset(d_sf, 0xaa, (size_t)nblocks));
  k_fused_example<<<(unsigned)((rows * 32 + 127) / 128), 128>>>(d_xb, rows, H, d_q, d_sf);
  EPF_CHECK_LAUNCH();
  EPF_CHECK_CUDA(cudaMemcpy(q1, d_q, (size_t)n, cudaMemcpyDeviceToHost));
  EPF_CHECK_CUDA(cudaMemcpy(s1, d_sf, (size_t)nblocks, cudaMemcpyDeviceToHost));
  EPF_CHECK_CUDA(cudaMemset(d_q, 0x55, (size_t)n));
  EPF_CHECK_CUDA(cudaMemset(d_sf, 0x55, (size_t)nblocks));
  k_mx_bf16<<<grid_for_rows(rows, 64), 64>>>(d_xb, rows, H, EPF_MX_RCEIL, EPF_SCALE_LAYOUT_COMPACT, d_q, d_sf);
  EPF_CHECK_LAUNCH();
  EPF_CHECK_CUDA(cudaMemcpy(q2, d_q, (size_t)n, cudaMemcpyDeviceToHost));
  EPF_CHECK_CUDA(cudaMemcpy(s2, d_sf, (size_t)nblocks, cudaMemcpyDeviceToHost));
  assert_memory_equal(q1, q2, (size_t)n);
  assert_memory_equal(s1, s2, (size_t)nblocks);
  EPF_TEST_FREE(d_xf);
  EPF_TEST_FREE(d_xb);
  EPF_TEST_FREE(d_q);
  EPF_TEST_FREE(d_sf);
  free(xf);
  free(xb);
  free(q1);
  free(q2);
  free(s1);
  free(s2);
}

/* ---- the quantizing send's group quantizer ------------------------------------------------------ */

/* one warp per group of EPF_QSEND_UNROLL chunks (256 elements each): q in row order (lane l of chunk
 * c: elements [256c + 8l, +8)); the scale of each 32- (MXFP8) or 128-element (FP8-128) block as a
 * u32 (E8M0 byte or FP32 bits) */
__global__ void k_qsend_group(const uint4* x, int64_t ngroups, int kind, uint2* q, uint32_t* sc) {
  const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = (int)(threadIdx.x & 31u);
  const bool mx = kind == EPF__QK_MX_RCEIL || kind == EPF__QK_MX_FLOOR;
  uint4 v[EPF_QSEND_UNROLL];
  float a[EPF_QSEND_UNROLL];
  if (w >= ngroups) return; /* warp-uniform */
  for (int u = 0; u < EPF_QSEND_UNROLL; ++u) v[u] = x[(w * EPF_QSEND_UNROLL + u) * 32 + lane];
  epf__qsend_group_amax(v, kind, a);
  for (int u = 0; u < EPF_QSEND_UNROLL; ++u) {
    const int64_t c = w * EPF_QSEND_UNROLL + u;
    uint32_t s;
    q[c * 32 + lane] = epf__qsend_chunk(v[u], a[u], kind, &s);
    if (mx && (lane & 3) == 0) sc[c * 8 + lane / 4] = s;
    if (!mx && (lane & 15) == 0) sc[c * 2 + lane / 16] = s;
  }
}

static void test_qsend_group(void** state) {
  const int64_t ngroups = 777, n = ngroups * EPF_QSEND_UNROLL * 256;
  float* xf = (float*)malloc((size_t)n * 4);
  uint16_t* xb = (uint16_t*)malloc((size_t)n * 2);
  uint8_t* q = (uint8_t*)malloc((size_t)n);
  uint32_t* sc = (uint32_t*)malloc((size_t)(n / 32) * 4);
  uint16_t* d_x;
  uint2* d_q;
  uint32_t* d_sc;
  (void)state;
  assert_non_null(xf);
  assert_non_null(xb);
  assert_non_null(q);
  assert_non_null(sc);
  make_input(xf, n, 0);
  to_bf16(xf, xb, n);
  EPF_TEST_MALLOC(&d_x, (size_t)n * 2);
  EPF_TEST_MALLOC(&d_q, (size_t)n);
  EPF_TEST_MALLOC(&d_sc, (size_t)(n / 32) * 4);
  EPF_CHECK_CUDA(cudaMemcpy(d_x, xb, (size_t)n * 2, cudaMemcpyHostToDevice));
  for (int kind = EPF__QK_MX_RCEIL; kind <= EPF__QK_FP8_UE8M0; ++kind) {
    const bool mx = kind == EPF__QK_MX_RCEIL || kind == EPF__QK_MX_FLOOR;
    const int64_t group = mx ? 32 : 128, nscales = n / group;
    EPF_CHECK_CUDA(cudaMemset(d_q, 0xaa, (size_t)n));
    EPF_CHECK_CUDA(cudaMemset(d_sc, 0xaa, (size_t)nscales * 4));
    k_qsend_group<<<(unsigned)((ngroups * 32 + 127) / 128), 128>>>((const uint4*)d_x, ngroups, kind, d_q, d_sc);
    EPF_CHECK_LAUNCH();
    EPF_CHECK_CUDA(cudaMemcpy(q, d_q, (size_t)n, cudaMemcpyDeviceToHost));
    EPF_CHECK_CUDA(cudaMemcpy(sc, d_sc, (size_t)nscales * 4, cudaMemcpyDeviceToHost));
    for (int64_t b = 0; b < nscales; ++b) {
      uint8_t want[128];
      uint32_t want_s;
      if (mx) {
        want_s = epf_mxfp8_quantize_block_ref(xf + b * 32, kind == EPF__QK_MX_FLOOR ? EPF_MX_FLOOR : EPF_MX_RCEIL, want);
      } else {
        const float s = epf_fp8_128_quantize_block_ref(xf + b * 128, kind == EPF__QK_FP8_UE8M0, want);
        want_s = f32_bits(s);
      }
      if (sc[b] != want_s) fail_msg("kind %d block %lld: scale 0x%08x, reference 0x%08x", kind, (long long)b, sc[b], want_s);
      if (memcmp(q + b * group, want, (size_t)group) != 0) fail_msg("kind %d block %lld: bytes differ from the reference", kind, (long long)b);
    }
  }
  EPF_TEST_FREE(d_x);
  EPF_TEST_FREE(d_q);
  EPF_TEST_FREE(d_sc);
  free(xf);
  free(xb);
  free(q);
  free(sc);
  printf("quantizing send's group quantizer: %lld elements x 4 scale rules, bit-exact\n", (long long)n);
}

/* ---- exhaustive device checks ---------------------------------------------------------------------- */

static void test_exhaustive_conversions(void** state) {
  unsigned long long* d_bad;
  uint32_t* d_first;
  unsigned long long bad = 0;
  uint32_t first[2];
  int sms = 0;
  (void)state;
  EPF_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  EPF_TEST_MALLOC(&d_bad, sizeof(bad));
  EPF_TEST_MALLOC(&d_first, sizeof(first));
  EPF_CHECK_CUDA(cudaMemset(d_bad, 0, sizeof(bad)));
  EPF_CHECK_CUDA(cudaMemset(d_first, 0xff, sizeof(first)));
  k_exhaustive_cvt<<<sms * 8, 256>>>(d_bad, d_first);
  EPF_CHECK_LAUNCH();
  EPF_CHECK_CUDA(cudaMemcpy(&bad, d_bad, sizeof(bad), cudaMemcpyDeviceToHost));
  EPF_CHECK_CUDA(cudaMemcpy(first, d_first, sizeof(first), cudaMemcpyDeviceToHost));
  if (bad) fail_msg("%llu of 2^32 FP32 inputs differ (first E4M3 0x%08x, first E8M0 0x%08x)", bad, first[0], first[1]);
  printf("all 2^32 FP32 inputs: device E4M3 and E8M0 conversions == integer reference\n");

  /* E4M3 -> float on the device path, all 256 bytes */
  {
    float* d_f;
    float f[256];
    EPF_TEST_MALLOC(&d_f, sizeof(f));
    k_e4m3_to_float_all<<<1, 64>>>(d_f);
    EPF_CHECK_LAUNCH();
    EPF_CHECK_CUDA(cudaMemcpy(f, d_f, sizeof(f), cudaMemcpyDeviceToHost));
    for (int q = 0; q < 256; ++q) assert_true(same_float(f[q], epf_e4m3_to_float((uint8_t)q)));
    EPF_TEST_FREE(d_f);
  }

  /* every BF16 amax on the device == on the host */
  {
    uint8_t *d_r, *d_fl, r[65536], fl[65536];
    float *d_s, *d_su, *d_f, *d_fu, *d_y;
    static float s[65536], su[65536], fa[65536], fu[65536], y[65536];
    EPF_TEST_MALLOC(&d_r, 65536);
    EPF_TEST_MALLOC(&d_fl, 65536);
    EPF_TEST_MALLOC(&d_s, 65536 * 4);
    EPF_TEST_MALLOC(&d_su, 65536 * 4);
    EPF_TEST_MALLOC(&d_f, 65536 * 4);
    EPF_TEST_MALLOC(&d_fu, 65536 * 4);
    EPF_TEST_MALLOC(&d_y, 65536 * 4);
    k_amax_all<<<256, 256>>>(d_r, d_fl, d_s, d_su, d_f, d_fu, d_y);
    EPF_CHECK_LAUNCH();
    EPF_CHECK_CUDA(cudaMemcpy(r, d_r, 65536, cudaMemcpyDeviceToHost));
    EPF_CHECK_CUDA(cudaMemcpy(fl, d_fl, 65536, cudaMemcpyDeviceToHost));
    EPF_CHECK_CUDA(cudaMemcpy(s, d_s, 65536 * 4, cudaMemcpyDeviceToHost));
    EPF_CHECK_CUDA(cudaMemcpy(su, d_su, 65536 * 4, cudaMemcpyDeviceToHost));
    EPF_CHECK_CUDA(cudaMemcpy(fa, d_f, 65536 * 4, cudaMemcpyDeviceToHost));
    EPF_CHECK_CUDA(cudaMemcpy(fu, d_fu, 65536 * 4, cudaMemcpyDeviceToHost));
    EPF_CHECK_CUDA(cudaMemcpy(y, d_y, 65536 * 4, cudaMemcpyDeviceToHost));
    for (uint32_t x = 0; x < 65536u; ++x) {
      const float a = epf_bf16_to_float((uint16_t)x);
      if (r[x] != epf_e8m0_from_amax(a, EPF_MX_RCEIL)) fail_msg("device RCEIL of bf16 0x%04x: 0x%02x", x, r[x]);
      if (fl[x] != epf_e8m0_from_amax(a, EPF_MX_FLOOR)) fail_msg("device FLOOR of bf16 0x%04x: 0x%02x", x, fl[x]);
      assert_true(same_float(s[x], epf_fp8_128_scale(a, false)));
      assert_true(same_float(su[x], epf_fp8_128_scale(a, true)));
      assert_true(same_float(fa[x], epf_fp8_128_scale(a, false)));
      assert_true(same_float(fu[x], epf_fp8_128_scale(a, true)));
      assert_true(same_float(y[x], 1.0f / epf_fp8_128_scale(a, false)));
    }
    EPF_TEST_FREE(d_r);
    EPF_TEST_FREE(d_fl);
    EPF_TEST_FREE(d_s);
    EPF_TEST_FREE(d_su);
    EPF_TEST_FREE(d_f);
    EPF_TEST_FREE(d_fu);
    EPF_TEST_FREE(d_y);
    printf("all 65536 BF16 amax: device scales (RCEIL, FLOOR, per-128, UE8M0) == host\n");
  }

  /* one Markstein step is byte-exact for every BF16 (amax, x) pair */
  {
    unsigned long long* d_total;
    unsigned long long total = 0;
    uint32_t f1 = 0;
    EPF_TEST_MALLOC(&d_total, sizeof(total));
    EPF_CHECK_CUDA(cudaMemset(d_bad, 0, sizeof(bad)));
    EPF_CHECK_CUDA(cudaMemset(d_total, 0, sizeof(total)));
    EPF_CHECK_CUDA(cudaMemset(d_first, 0xff, sizeof(first)));
    k_markstein_all<<<dim3(16, 0x7f80 / 128, 1), 256>>>(d_bad, d_total, d_first);
    EPF_CHECK_LAUNCH();
    EPF_CHECK_CUDA(cudaMemcpy(&bad, d_bad, sizeof(bad), cudaMemcpyDeviceToHost));
    EPF_CHECK_CUDA(cudaMemcpy(&total, d_total, sizeof(total), cudaMemcpyDeviceToHost));
    EPF_CHECK_CUDA(cudaMemcpy(&f1, d_first, sizeof(f1), cudaMemcpyDeviceToHost));
    if (bad) fail_msg("one-step per-128 division: %llu of %llu (amax, x) pairs differ (first amax 0x%04x x 0x%04x)", bad, total, f1 >> 16, f1 & 0xffffu);
    assert_true(total > 800000000ull);
    printf("per-128 division-free path: all %llu (BF16 amax, BF16 x) pairs byte-exact\n", total);
    EPF_TEST_FREE(d_total);
  }
  EPF_TEST_FREE(d_bad);
  EPF_TEST_FREE(d_first);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_exhaustive_conversions, epf_test_teardown), cmocka_unit_test_teardown(test_mxfp8_rows, epf_test_teardown),
      cmocka_unit_test_teardown(test_fp8_128_rows, epf_test_teardown),           cmocka_unit_test_teardown(test_dequant, epf_test_teardown),
      cmocka_unit_test_teardown(test_lane_primitives, epf_test_teardown),        cmocka_unit_test_teardown(test_qsend_group, epf_test_teardown),
  };
  int rc = epf_test_gpus_or_skip(1);
  if (rc) return rc;
  g_seed = epf_test_seed();
  return cmocka_run_group_tests(tests, NULL, NULL);
}
