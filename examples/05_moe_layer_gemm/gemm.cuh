/* gemm.cuh — ex05_moe_layer_gemm's expert stage on the GPU: the weights (BF16 from the hash, FP8 with
 * 128x128 block scales for cuBLASLt's BLK128x128_32F A operand), SiLU(gate) * up (BF16, or per-128
 * FP8 in the segment MN-major scale layout the down GEMM reads), and the cuBLASLt TN GEMM wrapper.
 * Part of the example (one translation unit: main.cu includes it). */
#ifndef EX05_GEMM_CUH
#define EX05_GEMM_CUH

#include <map>
#include <tuple>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "epfuse/epfuse.cuh"
#include "ex_common.h"
#include "layer.h"

#define EX_LT(call)                                                                                   \
  do {                                                                                                \
    cublasStatus_t ex_l_ = (call);                                                                    \
    if (ex_l_ != CUBLAS_STATUS_SUCCESS) {                                                             \
      fprintf(stderr, "%s:%d: %s -> cuBLAS status %d (%s)\n", __FILE__, __LINE__, #call, (int)ex_l_, \
              cublasGetStatusString(ex_l_));                                                          \
      exit(1);                                                                                        \
    }                                                                                                 \
  } while (0)

static __global__ void weights_kernel(__nv_bfloat16* w, uint64_t n, uint64_t seed, int tensor, float scale) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
    w[i] = __float2bfloat16_rn(ex05_weight(seed, tensor, i, scale));
}

/* FP8 E4M3 copy of `mats` row-major [M][K] BF16 matrices with one FP32 scale per 128x128 block,
 * scales in cuBLASLt's BLK128x128_32F layout for a transposed A operand: per matrix
 * [M / 128][ldk] with ldk = roundup(K / 128, 4), the K blocks contiguous (padding 0). One block of
 * 256 threads per 128x128 tile: amax, s = amax / 448 (1 for an all-zero tile), q = e4m3(w / s). */
static __global__ void quant_weights_kernel(const __nv_bfloat16* w, int M, int K, uint8_t* q, float* s, int ldk) {
  __shared__ float red[8];
  const int mb = blockIdx.x, kb = blockIdx.y, mat = blockIdx.z;
  const __nv_bfloat16* W = w + (uint64_t)mat * M * K;
  float amax = 0.f;
  for (int i = threadIdx.x; i < 128 * 128; i += blockDim.x) {
    const int r = mb * 128 + i / 128, c = kb * 128 + i % 128;
    amax = fmaxf(amax, fabsf(__bfloat162float(W[(uint64_t)r * K + c])));
  }
  for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = 0.f;
  for (int i = 0; i < (int)(blockDim.x >> 5); ++i) amax = fmaxf(amax, red[i]);
  const float sc = amax > 0.f ? amax / 448.0f : 1.0f;
  for (int i = threadIdx.x; i < 128 * 128; i += blockDim.x) {
    const int r = mb * 128 + i / 128, c = kb * 128 + i % 128;
    const __nv_fp8_e4m3 v(__bfloat162float(W[(uint64_t)r * K + c]) / sc);
    q[(uint64_t)mat * M * K + (uint64_t)r * K + c] = *(const uint8_t*)&v;
  }
  if (threadIdx.x == 0) {
    float* S = s + (uint64_t)mat * (M / 128) * ldk + (uint64_t)mb * ldk;
    S[kb] = sc;
    if (kb == 0)
      for (int p = K / 128; p < ldk; ++p) S[p] = 0.f;
  }
}

/* SiLU(gate) * up for every received row of every local expert of every rank. h: [R][cap][2I] BF16
 * (gate | up per row, the gate/up GEMM's output). BF16 path: a = bf16(silu(g) * u) into a_bf16
 * [R][cap][I]. FP8 path: per 128-group amax, s = amax / 448 (1e-4 floor, as the dispatch's per-128
 * rule), a_q = e4m3(a / s) into [R][cap][I] and s into a_s in the segment MN-major layout (the
 * expert's [I/128][padded] matrix at scale element begin * I/128), what the down GEMM's
 * VEC128_32F B operand reads. Grid (x, E/R, R); one warp per (row, 128-group). */
static __global__ void swiglu_kernel(epf_route_t route, const __nv_bfloat16* h, int64_t cap, int I, __nv_bfloat16* a_bf16,
                                     uint8_t* a_q, float* a_s) {
  const int le = blockIdx.y, idx = blockIdx.z, lane = threadIdx.x & 31;
  const epf_route_segment_t sg = ((const epf_route_segment_t*)epf_route_ptr(&route, idx, EPF_ROUTE_RECV_SEGMENT))[le];
  const int groups = I / 128;
  const int64_t items = (int64_t)sg.count * groups;
  const int64_t warp0 = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5), nw = gridDim.x * (int64_t)(blockDim.x >> 5);
  if (sg.begin + sg.padded_count > cap) return; /* overflowed: the host reports the route's recv_overflow */
  for (int64_t it = warp0; it < items; it += nw) {
    const int64_t r = sg.begin + it / groups;
    const int g = (int)(it % groups);
    const __nv_bfloat16* hr = h + ((uint64_t)idx * cap + r) * 2 * I;
    float v[4], amax = 0.f;
    for (int j = 0; j < 4; ++j) {
      const int i = g * 128 + lane * 4 + j;
      const float gt = __bfloat162float(hr[i]), up = __bfloat162float(hr[I + i]);
      v[j] = gt / (1.0f + expf(-gt)) * up;
      amax = fmaxf(amax, fabsf(v[j]));
    }
    if (a_bf16 != NULL) {
      for (int j = 0; j < 4; ++j) a_bf16[((uint64_t)idx * cap + r) * I + g * 128 + lane * 4 + j] = __float2bfloat16_rn(v[j]);
      continue;
    }
    for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float sc = epf_fp8_128_scale(amax, false), rc = epf_fp8_128_recip(sc);
    for (int j = 0; j < 4; ++j) a_q[((uint64_t)idx * cap + r) * I + g * 128 + lane * 4 + j] = epf_e4m3_from_float(v[j] * rc);
    if (lane == 0) a_s[(uint64_t)idx * cap * groups + (uint64_t)sg.begin * groups + (uint64_t)g * sg.padded_count + (r - sg.begin)] = sc;
  }
}

/* ---- cuBLASLt -------------------------------------------------------------------------------- */

/* D[m x n] (column-major, ld m; = row-major [n][m]) = op(A)^T-form: A stored as k x m column-major
 * (row-major [m][k] weights, transa = T), B as k x n column-major (row-major [n][k] activations,
 * transb = N): the TN form Hopper FP8 GEMMs require. FP8: A E4M3 with BLK128x128_32F scales, B E4M3
 * with VEC128_32F scales; BF16 otherwise. FP32 accumulation, BF16 D. */
struct Lt {
  cublasLtHandle_t h = NULL;
  cublasLtMatmulDesc_t desc[2] = {NULL, NULL}; /* [fp8] */
  void* ws = NULL;
  size_t ws_bytes = 64u << 20;
  struct Shape {
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
  };
  std::map<std::tuple<int, int, int, int>, Shape> cache;

  void init() {
    EX_LT(cublasLtCreate(&h));
    EX_CK(cudaMalloc(&ws, ws_bytes));
    for (int f = 0; f < 2; ++f) {
      EX_LT(cublasLtMatmulDescCreate(&desc[f], CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
      EX_LT(cublasLtMatmulDescSetAttribute(desc[f], CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
      EX_LT(cublasLtMatmulDescSetAttribute(desc[f], CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)));
      if (f) {
        const int32_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        EX_LT(cublasLtMatmulDescSetAttribute(desc[f], CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof(ma)));
        EX_LT(cublasLtMatmulDescSetAttribute(desc[f], CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof(mb)));
      }
    }
  }
  void destroy() {
    for (auto& kv : cache) {
      cublasLtMatrixLayoutDestroy(kv.second.a);
      cublasLtMatrixLayoutDestroy(kv.second.b);
      cublasLtMatrixLayoutDestroy(kv.second.d);
    }
    for (int f = 0; f < 2; ++f) cublasLtMatmulDescDestroy(desc[f]);
    cudaFree(ws);
    cublasLtDestroy(h);
  }
  void gemm(bool fp8, int m, int n, int k, const void* A, const float* a_scale, const void* B, const float* b_scale, void* D,
            cudaStream_t s) {
    cublasLtMatmulDesc_t dsc = desc[fp8 ? 1 : 0];
    if (fp8) {
      EX_LT(cublasLtMatmulDescSetAttribute(dsc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale)));
      EX_LT(cublasLtMatmulDescSetAttribute(dsc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale)));
    }
    auto key = std::make_tuple((int)fp8, m, n, k);
    auto it = cache.find(key);
    if (it == cache.end()) {
      Shape sh;
      const cudaDataType_t in = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
      EX_LT(cublasLtMatrixLayoutCreate(&sh.a, in, k, m, k));
      EX_LT(cublasLtMatrixLayoutCreate(&sh.b, in, k, n, k));
      EX_LT(cublasLtMatrixLayoutCreate(&sh.d, CUDA_R_16BF, m, n, m));
      cublasLtMatmulPreference_t pref;
      EX_LT(cublasLtMatmulPreferenceCreate(&pref));
      EX_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
      cublasLtMatmulHeuristicResult_t res;
      int got = 0;
      EX_LT(cublasLtMatmulAlgoGetHeuristic(h, dsc, sh.a, sh.b, sh.d, sh.d, pref, 1, &res, &got));
      cublasLtMatmulPreferenceDestroy(pref);
      if (got < 1) {
        fprintf(stderr, "cuBLASLt has no %s algorithm for m=%d n=%d k=%d (TN, FP32 accumulation, BF16 out)\n",
                fp8 ? "FP8 BLK128x128 x VEC128" : "BF16", m, n, k);
        exit(1);
      }
      sh.algo = res.algo;
      it = cache.emplace(key, sh).first;
    }
    const float one = 1.0f, zero = 0.0f;
    EX_LT(cublasLtMatmul(h, dsc, &one, A, it->second.a, B, it->second.b, &zero, D, it->second.d, D, it->second.d,
                         &it->second.algo, ws, ws_bytes, s));
  }
};

#endif /* EX05_GEMM_CUH */
