/* ex05_moe_layer_gemm — a whole MoE layer with real expert GEMMs, over 8 virtual ranks on one GPU:
 *
 *   top-k (given, from the seed) -> epf_route_update -> epf_ht_dispatch (EXPERT_MAJOR, each local
 *   expert's rows one contiguous segment padded to --align rows) -> per local expert a SwiGLU FFN
 *   with cuBLASLt straight on the receive region (gate/up GEMM [n x H] x [H x 2I], SiLU(gate) * up,
 *   down GEMM [n x I] x [I x H]) -> epf_ht_combine (weighted FP32 reduction in k order, BF16 out).
 *
 * Two payloads, same inputs and weights:
 *   bf16  BF16 rows; BF16 GEMMs with FP32 accumulation; the down GEMM writes the expert outputs in
 *         place over the received rows (what a BF16/BF16 pull combine reads).
 *   fp8   the dispatch quantizes to per-128 FP8 on the way and writes the scales in
 *         EPF_SCALE_LAYOUT_SEGMENT_MN_MAJOR: each expert segment's [H/128][padded_count] FP32
 *         matrix, which is exactly the B-operand scale tensor of cuBLASLt's
 *         CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F. The GEMM gets A = FP8 weights with 128x128
 *         block scales (BLK128x128_32F), B = the segment's FP8 rows and scale pointer straight out
 *         of the receive region (no repack kernel), D = BF16. SiLU * up is quantized to per-128
 *         FP8 again (same segment layout) for the down GEMM.
 *
 * GEMM shapes need the per-expert row counts on the host: the route's RECV_SEGMENT arrays of all
 * ranks ([R][E/R] epf_route_segment_t) are copied to pinned memory right after the route update
 * and the host waits for that copy while the dispatch runs on the GPU; the cost is measured and
 * printed ("segments D2H + sync").
 *
 * Self-checks (exit 1 on any failure): the route's segments and every received BF16 row against a
 * CPU model of the placement (bit-exact: which token went where, in which order); every received
 * FP8 row and its GEMM-ready scales against the CPU quantization reference; the layer output of
 * sampled tokens (all with --small) against a CPU reference with an element-wise error bound
 * derived from the formats (README.md). --dump DIR writes inputs, weights and outputs for
 * scripts/moe_layer_torch.py. Timing: CUDA events, medians.
 *
 *   ex05_moe_layer_gemm                 small shape (the ctest run: --ctest)
 *   ex05_moe_layer_gemm --real          H 7168, I 2048, E 256, top-8, T 4096 per rank, 8 ranks
 *   options: --T --H --I --E --K --R --align --iters --seed --payload bf16|fp8|both --dump DIR
 *            --check-tokens N (CPU-checked tokens per path, default: all for small, 4 for --real)
 */
#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "epfuse/epfuse.cuh"
#include "epfuse/ht/kernels.cuh"
#include "ex_common.h"

#define EX_LT(call)                                                                                   \
  do {                                                                                                \
    cublasStatus_t ex_l_ = (call);                                                                    \
    if (ex_l_ != CUBLAS_STATUS_SUCCESS) {                                                             \
      fprintf(stderr, "%s:%d: %s -> cuBLAS status %d (%s)\n", __FILE__, __LINE__, #call, (int)ex_l_, \
              cublasGetStatusString(ex_l_));                                                          \
      exit(1);                                                                                        \
    }                                                                                                 \
  } while (0)

/* ---- options ---------------------------------------------------------------------------------- */

struct Opts {
  int R = 8, T = 64, H = 512, I = 256, E = 32, K = 4, align = 16, iters = 20;
  uint64_t seed = 0;
  bool real = false, ctest = false, run_bf16 = true, run_fp8 = true;
  int check_tokens = -1;
  std::string dump;
};

static Opts parse(int argc, char** argv) {
  Opts o;
  o.seed = (uint64_t)std::chrono::high_resolution_clock::now().time_since_epoch().count();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&](void) -> const char* {
      if (i + 1 >= argc) {
        fprintf(stderr, "%s needs a value\n", a.c_str());
        exit(2);
      }
      return argv[++i];
    };
    if (a == "--real") {
      o.real = true;
      o.T = 4096, o.H = 7168, o.I = 2048, o.E = 256, o.K = 8, o.iters = 10;
    } else if (a == "--small") {
    } else if (a == "--ctest") o.ctest = true;
    else if (a == "--T") o.T = atoi(next());
    else if (a == "--H") o.H = atoi(next());
    else if (a == "--I") o.I = atoi(next());
    else if (a == "--E") o.E = atoi(next());
    else if (a == "--K") o.K = atoi(next());
    else if (a == "--R") o.R = atoi(next());
    else if (a == "--align") o.align = atoi(next());
    else if (a == "--iters") o.iters = atoi(next());
    else if (a == "--seed") o.seed = strtoull(next(), NULL, 0);
    else if (a == "--check-tokens") o.check_tokens = atoi(next());
    else if (a == "--dump") o.dump = next();
    else if (a == "--payload") {
      std::string p = next();
      o.run_bf16 = p == "bf16" || p == "both";
      o.run_fp8 = p == "fp8" || p == "both";
      if (!o.run_bf16 && !o.run_fp8) {
        fprintf(stderr, "--payload bf16|fp8|both\n");
        exit(2);
      }
    } else {
      fprintf(stderr, "unknown option %s (see the top of main.cu)\n", a.c_str());
      exit(2);
    }
  }
  if (o.H % 128 || o.I % 128 || o.E % o.R || o.K > o.E / 1 || o.align < 8 || (o.align & (o.align - 1))) {
    fprintf(stderr, "need H, I multiples of 128, E a multiple of R, K <= E, align a power of two >= 8\n");
    exit(2);
  }
  if (o.check_tokens < 0) o.check_tokens = o.real ? 4 : o.R * o.T;
  return o;
}

/* ---- deterministic data ------------------------------------------------------------------------ */

/* weight element idx of tensor `tensor` (0: gate/up [E][2I][H], 1: down [E][H][I]) as FP32 before
 * rounding to BF16: uniform in [-scale, scale), a counter-based hash of (seed, tensor, idx), so the
 * GPU generates it and the host recomputes any element. */
EPF_HD float ex05_weight(uint64_t seed, int tensor, uint64_t idx, float scale) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (uint64_t)(tensor + 1) + idx * 0xd1b54a32d192ed03ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return ((float)(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale;
}

/* host copies of the BF16-rounded weights for the CPU reference: cached when small, else hashed
 * again per element (the reference of --real checks a few tokens only) */
static std::vector<float> g_wcache[2];
static float host_weight(const Opts& o, int tensor, uint64_t idx) {
  if (!g_wcache[tensor].empty()) return g_wcache[tensor][idx];
  const float sc = tensor == 0 ? 1.0f / sqrtf((float)o.H) : 1.0f / sqrtf((float)o.I);
  return ex_bf16_f(ex_bf16_rne(ex05_weight(o.seed, tensor, idx, sc)));
}
static void cache_weights(const Opts& o) {
  const uint64_t n[2] = {(uint64_t)o.E * 2 * o.I * o.H, (uint64_t)o.E * o.H * o.I};
  if (n[0] + n[1] > (64ull << 20)) return;
  for (int t = 0; t < 2; ++t) {
    const float sc = t == 0 ? 1.0f / sqrtf((float)o.H) : 1.0f / sqrtf((float)o.I);
    g_wcache[t].resize(n[t]);
    for (uint64_t i = 0; i < n[t]; ++i) g_wcache[t][i] = ex_bf16_f(ex_bf16_rne(ex05_weight(o.seed, t, i, sc)));
  }
}

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

/* ---- one path (payload) ------------------------------------------------------------------------ */

struct Model { /* host inputs of all ranks */
  std::vector<uint16_t> x;   /* [R*T][H] BF16 */
  std::vector<int32_t> topk; /* [R*T][K] */
  std::vector<float> w;      /* [R*T][K] */
};

struct Dev { /* device state shared by both paths */
  __nv_bfloat16 *wgu = NULL, *wd = NULL; /* [E][2I][H], [E][H][I] */
  uint8_t *wgu_q = NULL, *wd_q = NULL;   /* FP8 copies */
  float *wgu_s = NULL, *wd_s = NULL;     /* their BLK128x128 scales */
  int ldk_gu = 0, ldk_d = 0;
  void *x = NULL, *topk = NULL;
  float* w = NULL;
};

struct Times {
  std::vector<float> route, dispatch, gemm, combine, layer;
  std::vector<double> sync_us;
};

static float median(std::vector<float> v) {
  if (v.empty()) return 0.f;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
static double median_d(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/* the CPU model of the placement: segment begin / count / padded of every (rank, local expert),
 * and the (source rank, token) of every received row in order (source-major, token order) */
struct Placement {
  std::vector<epf_route_segment_t> seg;                 /* [R][EL] */
  std::vector<std::vector<std::pair<int, int>>> rows;   /* [R*EL]: (src, t) in receive order */
};
static Placement place(const Opts& o, const Model& m) {
  const int EL = o.E / o.R;
  Placement p;
  p.seg.resize((size_t)o.E);
  p.rows.resize((size_t)o.E);
  for (int s = 0; s < o.R; ++s)
    for (int t = 0; t < o.T; ++t)
      for (int k = 0; k < o.K; ++k) {
        const int e = m.topk[((size_t)s * o.T + t) * o.K + k];
        p.rows[(size_t)e].push_back({s, t}); /* experts are distinct per token (make_inputs) */
      }
  for (int d = 0; d < o.R; ++d) {
    int begin = 0;
    for (int le = 0; le < EL; ++le) {
      epf_route_segment_t& sg = p.seg[(size_t)d * EL + le];
      sg.begin = begin;
      sg.count = (int)p.rows[(size_t)d * EL + le].size();
      sg.padded_count = (sg.count + o.align - 1) / o.align * o.align;
      sg.reserved = 0;
      begin += sg.padded_count;
    }
  }
  return p;
}

/* CPU reference of token (s, t)'s layer output in double from the BF16 inputs and weights, with the
 * element-wise error bound of the path (README.md "Accuracy"): out[h] and bound[h]. fp8: the
 * dispatch's per-128 FP8 x, FP8 weights (128x128 blocks), FP8 SiLU * up; bf16: BF16 GEMM outputs
 * and BF16 SiLU * up. Both: FP32 accumulation, BF16 outputs, FP32 combine. */
static void cpu_token(const Opts& o, const Model& m, int s, int t, bool fp8, std::vector<double>& out,
                      std::vector<double>& bound) {
  const int H = o.H, I = o.I, K = o.K;
  const double ub = 1.0 / 256.0, u8 = fp8 ? 1.0 / 16.0 : 0.0, sub = fp8 ? 2.2e-6 : 0.0; /* E4M3 subnormal step / 448 */
  const double Ls = 1.1;                                                                 /* max |silu'| */
  /* accumulation: FP32 over k terms (k 2^-24); Hopper FP8 tensor cores keep ~14 bits inside one
   * 128-deep block before the scaled FP32 promotion (DeepSeek-V3 report): 128 * 2^-14 more */
  const double gH = H * 0x1p-24 + (fp8 ? 128 * 0x1p-14 : 0.0), gI = I * 0x1p-24 + (fp8 ? 128 * 0x1p-14 : 0.0);
  const float sgu = 1.0f / sqrtf((float)H), sd = 1.0f / sqrtf((float)I);
  std::vector<double> x(H), g(I), u(I), eg(I), eu(I), a(I), ea(I), row(H);
  double xmax = 0;
  for (int h = 0; h < H; ++h) {
    x[h] = ex_bf16_f(m.x[((size_t)s * o.T + t) * H + h]);
    xmax = std::max(xmax, fabs(x[h]));
  }
  out.assign(H, 0.0);
  bound.assign(H, 0.0);
  std::vector<double> wabs(H, 0.0);
  for (int k = 0; k < K; ++k) {
    const int e = m.topk[((size_t)s * o.T + t) * K + k];
    const double wk = m.w[((size_t)s * o.T + t) * K + k];
    for (int j = 0; j < 2 * I; ++j) {
      double v = 0, A = 0, W1 = 0, X1 = 0;
      for (int h = 0; h < H; ++h) {
        const double wv = host_weight(o, 0, ((uint64_t)e * 2 * I + j) * H + h);
        v += wv * x[h];
        A += fabs(wv * x[h]);
        W1 += fabs(wv);
        X1 += fabs(x[h]);
      }
      /* quantized x and W (relative u8 each, absolute sub * block amax below the E4M3 normals:
       * |x| <= xmax, |W| <= its generation scale), accumulation, then the BF16 output */
      double err = (2 * u8 + u8 * u8) * A + sub * (W1 * xmax + X1 * sgu) * (1 + u8) + gH * A * (1 + 2 * u8);
      err += ub * (fabs(v) + err); /* BF16 GEMM output */
      if (j < I) g[j] = v, eg[j] = err;
      else u[j - I] = v, eu[j - I] = err;
    }
    double amax = 0;
    for (int i = 0; i < I; ++i) {
      const double sg = g[i] / (1 + exp(-g[i]));
      a[i] = sg * u[i];
      ea[i] = Ls * eg[i] * (fabs(u[i]) + eu[i]) + fabs(sg) * eu[i] + 1e-7 * fabs(a[i]); /* + FP32 silu */
      amax = std::max(amax, fabs(a[i]) + ea[i]);
    }
    amax = std::max(amax, 1e-4); /* the per-128 scale's amax floor */
    for (int i = 0; i < I; ++i) ea[i] += (fp8 ? u8 : ub) * (fabs(a[i]) + ea[i]) + sub * amax; /* stored a */
    for (int hh = 0; hh < H; ++hh) {
      double v = 0, A = 0, Ae = 0, A1 = 0;
      for (int i = 0; i < I; ++i) {
        const double wv = host_weight(o, 1, ((uint64_t)e * H + hh) * I + i);
        v += wv * a[i];
        A += fabs(wv * a[i]);
        Ae += fabs(wv) * ea[i];
        A1 += fabs(a[i]) + ea[i];
      }
      /* perturbed a (ea, already including its own quantization), quantized W, accumulation */
      double err = (1 + u8) * Ae + u8 * A + sub * A1 * sd + gI * (A + Ae) * (1 + u8);
      err += ub * (fabs(v) + err); /* BF16 down-GEMM output */
      out[hh] += wk * v;
      bound[hh] += fabs(wk) * err;
      wabs[hh] += fabs(wk) * (fabs(v) + err);
    }
  }
  for (int hh = 0; hh < H; ++hh) bound[hh] += K * 0x1p-24 * wabs[hh] + ub * (fabs(out[hh]) + bound[hh]) + 1e-30;
}

/* the placement after the dispatch, against the CPU model: the route's segments equal the model's,
 * and every received row holds its token (BF16: the row bit for bit, in the model's order; FP8: the
 * CPU per-128 quantization of the row, and its scales at epf_recv_scale_offset in the segment
 * MN-major layout). Pad rows are not looked at. Returns true when everything matches. */
static bool check_placement(const Opts& o, const Model& m, const Placement& pl, const epf_plan_t& plan, const char* window,
                            const epf_route_segment_t* seg_h, bool fp8) {
  const int R = o.R, H = o.H, EL = o.E / o.R, G = H / 128;
  const char* name = fp8 ? "fp8" : "bf16";
  std::vector<uint8_t> tok(plan.region[EPF_REGION_RECV_TOKENS].bytes), sc(plan.region[EPF_REGION_RECV_SCALES].bytes + 1);
  std::vector<uint8_t> q(H);
  std::vector<float> qs(G), buf(128);
  long long rows = 0;
  for (int d = 0; d < R; ++d) {
    const char* b = window + (uint64_t)d * plan.total_bytes;
    EX_CK(cudaMemcpy(tok.data(), b + plan.region[EPF_REGION_RECV_TOKENS].offset, tok.size(), cudaMemcpyDeviceToHost));
    if (fp8) EX_CK(cudaMemcpy(sc.data(), b + plan.region[EPF_REGION_RECV_SCALES].offset, sc.size() - 1, cudaMemcpyDeviceToHost));
    for (int le = 0; le < EL; ++le) {
      const epf_route_segment_t g = seg_h[(size_t)d * EL + le], w = pl.seg[(size_t)d * EL + le];
      if (g.begin != w.begin || g.count != w.count || g.padded_count != w.padded_count) {
        fprintf(stderr, "[%s] rank %d expert %d: route segment {%d, %d, %d}, CPU model {%d, %d, %d}\n", name, d, le, g.begin,
                g.count, g.padded_count, w.begin, w.count, w.padded_count);
        return false;
      }
      const auto& want = pl.rows[(size_t)d * EL + le];
      for (int i = 0; i < w.count; ++i, ++rows) {
        const int64_t r = (int64_t)w.begin + i;
        if (fp8 && o.real && i % 16 != 0) continue; /* --real: every 16th FP8 row (CPU quantization is slow) */
        const uint16_t* x = m.x.data() + ((size_t)want[i].first * o.T + want[i].second) * H;
        const uint8_t* got = tok.data() + (uint64_t)r * plan.row_bytes;
        if (!fp8) {
          if (memcmp(got, x, (size_t)H * 2) != 0) {
            fprintf(stderr, "[bf16] rank %d expert %d row %lld: not (source %d, token %d)'s row\n", d, le, (long long)r,
                    want[i].first, want[i].second);
            return false;
          }
          continue;
        }
        for (int gi = 0; gi < G; ++gi) {
          for (int j = 0; j < 128; ++j) buf[j] = ex_bf16_f(x[gi * 128 + j]);
          qs[gi] = epf_fp8_128_quantize_block_ref(buf.data(), epf_fp8_128_ue8m0_from_flags(plan.flags), q.data() + gi * 128);
        }
        if (memcmp(got, q.data(), (size_t)H) != 0) {
          fprintf(stderr, "[fp8] rank %d expert %d row %lld: FP8 bytes differ from the CPU quantization\n", d, le, (long long)r);
          return false;
        }
        for (int gi = 0; gi < G; ++gi) {
          const uint64_t off = epf_recv_scale_offset(&plan, r, gi, w.begin, w.padded_count) - plan.region[EPF_REGION_RECV_SCALES].offset;
          float s;
          memcpy(&s, sc.data() + off, 4);
          if (!epf_recv_scale_seg_fits(&plan, r, w.begin, w.padded_count) || memcmp(&s, &qs[gi], 4) != 0) {
            fprintf(stderr, "[fp8] rank %d expert %d row %lld group %d: GEMM-ready scale %g, want %g\n", d, le, (long long)r, gi,
                    (double)s, (double)qs[gi]);
            return false;
          }
        }
      }
    }
  }
  printf("[%s] placement: %lld received rows and every segment equal the CPU model%s\n", name, rows,
         fp8 ? " (FP8 bytes and segment MN-major scales bit-exact)" : " (bit-exact, in order)");
  return true;
}

struct PathResult {
  std::vector<uint16_t> out; /* [R*T][H] */
  Times tm;
  bool ok = true;
};

static PathResult run_path(const Opts& o, const Model& m, const Placement& pl, Dev& dv, Lt& lt, bool fp8) {
  const int R = o.R, T = o.T, H = o.H, I = o.I, K = o.K, E = o.E, EL = E / R;
  const int n = R * T;
  PathResult res;
  const char* name = fp8 ? "fp8" : "bf16";

  /* ---- plan, window, team, route ----------------------------------------------------------- */
  int64_t max_rows = 0;
  for (int d = 0; d < R; ++d) {
    const epf_route_segment_t& l = pl.seg[(size_t)d * EL + EL - 1];
    max_rows = std::max<int64_t>(max_rows, (int64_t)l.begin + l.padded_count);
  }
  epf_config_t cfg = EPF_CONFIG_INIT;
  cfg.nranks = R;
  cfg.num_experts = E;
  cfg.top_k = K;
  cfg.hidden = H;
  cfg.max_tokens_per_rank = T;
  cfg.mode = EPF_MODE_HT;
  cfg.layout = EPF_LAYOUT_EXPERT_MAJOR;
  cfg.payload = fp8 ? EPF_PAYLOAD_FP8_128 : EPF_PAYLOAD_BF16;
  cfg.combine_payload = EPF_PAYLOAD_BF16;
  cfg.scale_layout = fp8 ? EPF_SCALE_LAYOUT_SEGMENT_MN_MAJOR : EPF_SCALE_LAYOUT_COMPACT;
  cfg.expert_alignment = o.align;
  cfg.recv_capacity = max_rows + (int64_t)EL * o.align; /* this routing fits; more is dropped and counted */
  epf_plan_t plan;
  EX_CS(epf_plan_compute(&cfg, &plan));
  const int64_t cap = plan.recv_capacity;

  char* window;
  EX_CK(cudaMalloc(&window, (size_t)R * plan.total_bytes));
  EX_CK(cudaMemset(window, 0, (size_t)R * plan.total_bytes));
  epf_team_t team = epf_team_virtual(window, plan.total_bytes, 0, R);
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  rc.index_type = EPF_INDEX_INT32;
  uint64_t rbytes = 0;
  EX_CS(epf_route_size(&plan, &rc, &rbytes));
  void* route_buf;
  EX_CK(cudaMalloc(&route_buf, (size_t)rbytes * R));
  epf_route_t route;
  EX_CS(epf_route_init(&plan, &rc, route_buf, rbytes * R, R, 1u, 0, &route));

  /* expert-stage buffers, per rank [cap] rows */
  __nv_bfloat16 *hbuf, *abuf = NULL, *eo = NULL;
  uint8_t* aq = NULL;
  float* as = NULL;
  EX_CK(cudaMalloc(&hbuf, (size_t)R * cap * 2 * I * 2));
  EX_CK(cudaMemset(hbuf, 0, (size_t)R * cap * 2 * I * 2));
  if (fp8) {
    EX_CK(cudaMalloc(&aq, (size_t)R * cap * I));
    EX_CK(cudaMalloc(&as, (size_t)R * cap * (I / 128) * 4));
    EX_CK(cudaMalloc(&eo, (size_t)R * cap * H * 2));
    EX_CK(cudaMemset(aq, 0, (size_t)R * cap * I));
    EX_CK(cudaMemset(as, 0, (size_t)R * cap * (I / 128) * 4));
  } else {
    EX_CK(cudaMalloc(&abuf, (size_t)R * cap * I * 2));
    EX_CK(cudaMemset(abuf, 0, (size_t)R * cap * I * 2));
  }
  void* d_out;
  EX_CK(cudaMalloc(&d_out, (size_t)n * H * 2));
  epf_ht_state_t* d_state;
  EX_CK(cudaMalloc(&d_state, R * sizeof(epf_ht_state_t)));
  EX_CK(cudaMemset(d_state, 0, R * sizeof(epf_ht_state_t)));
  epf_error_record_t *rec_h, *rec_d;
  EX_CK(cudaHostAlloc((void**)&rec_h, sizeof(epf_error_record_t), cudaHostAllocMapped));
  memset(rec_h, 0, sizeof(*rec_h));
  EX_CK(cudaHostGetDevicePointer((void**)&rec_d, rec_h, 0));
  epf_route_segment_t* seg_h; /* [R][EL], pinned: the GEMM sizes */
  EX_CK(cudaMallocHost((void**)&seg_h, sizeof(epf_route_segment_t) * E));

  epf_route_step_t rs = epf_route_step_make(dv.topk, T, epf_wait_make(plan.timeout_ns, rec_d, NULL, 0));
  epf_ht_step_t hs = EPF_HT_STEP_INIT;
  hs.x = dv.x;
  hs.topk_weights = dv.w;
  hs.out = d_out;
  hs.expert_out = fp8 ? eo : NULL; /* BF16/BF16 pull: the down GEMM writes over the received rows */
  hs.state = d_state;
  hs.expert_rows = cap;
  hs.wait = epf_wait_make(plan.timeout_ns, rec_d, NULL, 0);

  cudaStream_t st;
  EX_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t ev[5], ev_seg;
  for (auto& e : ev) EX_CK(cudaEventCreate(&e));
  EX_CK(cudaEventCreateWithFlags(&ev_seg, cudaEventDisableTiming));
  const size_t seg_off = route.layout.array[EPF_ROUTE_RECV_SEGMENT].offset;

  /* the expert stage of every rank: per local expert with rows, two GEMMs around SiLU * up */
  auto experts = [&](void) {
    for (int idx = 0; idx < R; ++idx) {
      char* base = window + (uint64_t)idx * plan.total_bytes;
      for (int le = 0; le < EL; ++le) {
        const epf_route_segment_t sg = seg_h[(size_t)idx * EL + le];
        if (sg.count == 0 || sg.begin + sg.padded_count > cap) continue; /* nothing, or overflowed (reported) */
        const int e = idx * EL + le, nr = sg.padded_count;
        // example-begin gemm_operands
        /* B operand: the segment's rows straight from the receive region; FP8: its scales too, the
         * segment's [H/128][padded_count] matrix (SEGMENT_MN_MAJOR), through the one owner */
        const void* X = base + epf_plan_recv_token_offset(&plan, sg.begin);
        const float* Xs = fp8 ? (const float*)(base + epf_recv_scale_offset(&plan, sg.begin, 0, sg.begin, sg.padded_count)) : NULL;
        __nv_bfloat16* Hh = hbuf + ((uint64_t)idx * cap + sg.begin) * 2 * I;
        lt.gemm(fp8, 2 * I, nr, H, fp8 ? (const void*)(dv.wgu_q + (uint64_t)e * 2 * I * H) : (const void*)(dv.wgu + (uint64_t)e * 2 * I * H),
                fp8 ? dv.wgu_s + (uint64_t)e * (2 * I / 128) * dv.ldk_gu : NULL, X, Xs, Hh, st);
        // example-end gemm_operands
      }
    }
    swiglu_kernel<<<dim3(std::max(1, 2048 / EL), EL, R), 256, 0, st>>>(route, hbuf, cap, I, abuf, aq, as);
    EX_CK(cudaGetLastError());
    for (int idx = 0; idx < R; ++idx) {
      char* base = window + (uint64_t)idx * plan.total_bytes;
      for (int le = 0; le < EL; ++le) {
        const epf_route_segment_t sg = seg_h[(size_t)idx * EL + le];
        if (sg.count == 0 || sg.begin + sg.padded_count > cap) continue;
        const int e = idx * EL + le, nr = sg.padded_count;
        const void* A = fp8 ? (const void*)(aq + ((uint64_t)idx * cap + sg.begin) * I) : (const void*)(abuf + ((uint64_t)idx * cap + sg.begin) * I);
        const float* As = fp8 ? as + (uint64_t)idx * cap * (I / 128) + (uint64_t)sg.begin * (I / 128) : NULL;
        void* Y = fp8 ? (void*)(eo + ((uint64_t)idx * cap + sg.begin) * H) : (void*)(base + epf_plan_recv_token_offset(&plan, sg.begin));
        lt.gemm(fp8, H, nr, I, fp8 ? (const void*)(dv.wd_q + (uint64_t)e * H * I) : (const void*)(dv.wd + (uint64_t)e * H * I),
                fp8 ? dv.wd_s + (uint64_t)e * (H / 128) * dv.ldk_d : NULL, A, As, Y, st);
      }
    }
  };

  /* one layer; check: also the placement checks after the dispatch */
  auto layer = [&](bool timed, bool check) -> bool {
    EX_CK(cudaEventRecord(ev[0], st));
    EX_CS(epf_route_update(&route, team, &plan, &rs, st));
    EX_CK(cudaEventRecord(ev[1], st));
    /* the GEMM sizes: every rank's RECV_SEGMENT to the host; the host waits for this copy while the
     * GPU runs the dispatch */
    EX_CK(cudaMemcpy2DAsync(seg_h, sizeof(epf_route_segment_t) * EL, (char*)route.base + seg_off, route.layout.total_bytes,
                            sizeof(epf_route_segment_t) * EL, R, cudaMemcpyDeviceToHost, st));
    EX_CK(cudaEventRecord(ev_seg, st));
    EX_CS(epf_ht_dispatch(&route, team, &plan, &hs, dv.topk, EPF_HT_BOTH, st));
    EX_CK(cudaEventRecord(ev[2], st));
    EX_CK(cudaEventSynchronize(ev_seg));
    bool ok = true;
    if (check) {
      EX_CK(cudaStreamSynchronize(st));
      ok = check_placement(o, m, pl, plan, window, seg_h, fp8);
    }
    experts();
    EX_CK(cudaEventRecord(ev[3], st));
    EX_CS(epf_ht_combine(&route, team, &plan, &hs, dv.topk, st));
    EX_CK(cudaEventRecord(ev[4], st));
    EX_CK(cudaStreamSynchronize(st));
    if (timed) {
      float ms[4], all;
      for (int i = 0; i < 4; ++i) EX_CK(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]));
      EX_CK(cudaEventElapsedTime(&all, ev[0], ev[4]));
      res.tm.route.push_back(ms[0] * 1e3f);
      res.tm.dispatch.push_back(ms[1] * 1e3f);
      res.tm.gemm.push_back(ms[2] * 1e3f);
      res.tm.combine.push_back(ms[3] * 1e3f);
      res.tm.layer.push_back(all * 1e3f);
    }
    return ok;
  };

  EX_CK(cudaMemset(d_out, 0xA7, (size_t)n * H * 2)); /* poison */
  res.ok = layer(false, true);
  EX_CK(cudaDeviceSynchronize());
  {
    epf_error_record_t rec;
    epf_error_read(rec_h, &rec);
    if (rec.status != 0 || rec.recv_overflow != 0) {
      fprintf(stderr, "[%s] error record: %s, recv_overflow %u\n", name, epf_status_name((epf_status_t)rec.status),
              rec.recv_overflow);
      res.ok = false;
    }
  }
  res.out.resize((size_t)n * H);
  EX_CK(cudaMemcpy(res.out.data(), d_out, (size_t)n * H * 2, cudaMemcpyDeviceToHost));

  /* timing: warm-up, then iters layers; and the pure cost of the segments copy + sync on an idle stream */
  for (int i = 0; i < 2; ++i) layer(false, false);
  for (int i = 0; i < o.iters; ++i) layer(true, false);
  for (int i = 0; i < std::max(o.iters, 20); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    EX_CK(cudaMemcpy2DAsync(seg_h, sizeof(epf_route_segment_t) * EL, (char*)route.base + seg_off, route.layout.total_bytes,
                            sizeof(epf_route_segment_t) * EL, R, cudaMemcpyDeviceToHost, st));
    EX_CK(cudaStreamSynchronize(st));
    res.tm.sync_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  {
    epf_error_record_t rec;
    epf_error_read(rec_h, &rec);
    if (rec.status != 0 || rec.recv_overflow != 0) {
      fprintf(stderr, "[%s] error record after the timed layers: %s\n", name, epf_status_name((epf_status_t)rec.status));
      res.ok = false;
    }
  }

  for (auto& e : ev) cudaEventDestroy(e);
  cudaEventDestroy(ev_seg);
  cudaStreamDestroy(st);
  cudaFreeHost(seg_h);
  cudaFreeHost(rec_h);
  cudaFree(d_state);
  cudaFree(d_out);
  cudaFree(hbuf);
  cudaFree(abuf);
  cudaFree(aq);
  cudaFree(as);
  cudaFree(eo);
  cudaFree(route_buf);
  cudaFree(window);
  return res;
}

/* ---- inputs, dump, verification, tables -------------------------------------------------------- */

/* x uniform in [-1, 1) as BF16; per token K distinct experts; weights the softmax of K random
 * logits (what a top-k router with renormalized weights produces) */
static Model make_inputs(const Opts& o) {
  Model m;
  const size_t n = (size_t)o.R * o.T;
  uint64_t s = o.seed ^ 0x5eed5eedull;
  m.x.resize(n * o.H);
  m.topk.resize(n * o.K);
  m.w.resize(n * o.K);
  for (auto& v : m.x) v = ex_bf16_rne((float)(ex_rand(&s) >> 40) * (2.0f / 16777216.0f) - 1.0f);
  for (size_t t = 0; t < n; ++t) {
    int32_t* r = m.topk.data() + t * o.K;
    float* w = m.w.data() + t * o.K;
    float sum = 0.f, lg[64];
    for (int k = 0; k < o.K; ++k) {
      for (;;) {
        r[k] = (int32_t)(ex_rand(&s) % (uint64_t)o.E);
        bool dup = false;
        for (int j = 0; j < k; ++j) dup |= r[j] == r[k];
        if (!dup) break;
      }
      lg[k] = (float)(ex_rand(&s) >> 40) * (4.0f / 16777216.0f);
      sum += expf(lg[k]);
    }
    for (int k = 0; k < o.K; ++k) w[k] = expf(lg[k]) / sum;
  }
  return m;
}

static bool write_file(const std::string& path, const void* p, size_t bytes) {
  FILE* f = fopen(path.c_str(), "wb");
  if (f == NULL || fwrite(p, 1, bytes, f) != bytes || fclose(f) != 0) {
    fprintf(stderr, "--dump: cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

/* the output of sampled tokens against the CPU reference and its bound; the normwise relative error */
static bool verify(const Opts& o, const Model& m, const std::vector<uint16_t>& out, bool fp8) {
  const int n = o.R * o.T, H = o.H;
  const int ntok = std::min(o.check_tokens, n);
  std::vector<double> ref, bound;
  double worst = 0, e2 = 0, r2 = 0;
  long long bad = 0;
  for (int c = 0; c < ntok; ++c) {
    const int st = ntok == n ? c : (int)(((uint64_t)c * 2654435761u + 17u) % (uint64_t)n);
    cpu_token(o, m, st / o.T, st % o.T, fp8, ref, bound);
    for (int h = 0; h < H; ++h) {
      const double got = ex_bf16_f(out[(size_t)st * H + h]), err = fabs(got - ref[h]);
      if (!(err <= bound[h])) {
        if (bad++ < 5)
          fprintf(stderr, "[%s] token %d h %d: got %.6g, reference %.6g, |error| %.3g > bound %.3g\n", fp8 ? "fp8" : "bf16", st, h,
                  got, ref[h], err, bound[h]);
      }
      worst = std::max(worst, err / bound[h]);
      e2 += err * err;
      r2 += ref[h] * ref[h];
    }
  }
  /* the normwise error against its statistical expectation (README.md "Accuracy"): the element-wise
   * bound is a worst case, far above typical errors; this limit catches a systematic error (a
   * misread scale layout, a wrong operand) that stays inside it */
  const double nrm = sqrt(e2 / (r2 > 0 ? r2 : 1)), nrm_limit = fp8 ? 2.0 / 16.0 : 4.0 / 256.0;
  const bool nrm_ok = nrm <= nrm_limit;
  printf("[%s] accuracy vs CPU reference (%d tokens): normwise relative error %.3e (limit %.3e), max |error| / bound %.3f%s\n",
         fp8 ? "fp8" : "bf16", ntok, nrm, nrm_limit, worst, bad || !nrm_ok ? "  FAILED" : "");
  return bad == 0 && nrm_ok;
}

int main(int argc, char** argv) {
  const Opts o = parse(argc, argv);
  ex_gpu_or_exit(1, o.ctest);
  const int R = o.R, T = o.T, H = o.H, I = o.I, E = o.E, K = o.K;
  printf("ex05_moe_layer_gemm: R=%d virtual ranks, T=%d tokens/rank, H=%d, I=%d, E=%d, top-%d, align %d, seed %llu\n", R, T, H,
         I, E, K, o.align, (unsigned long long)o.seed);
  const Model m = make_inputs(o);
  cache_weights(o);
  const Placement pl = place(o, m);

  Dev dv;
  const uint64_t ngu = (uint64_t)E * 2 * I * H, nd = (uint64_t)E * H * I;
  EX_CK(cudaMalloc(&dv.wgu, ngu * 2));
  EX_CK(cudaMalloc(&dv.wd, nd * 2));
  weights_kernel<<<1024, 256>>>(dv.wgu, ngu, o.seed, 0, 1.0f / sqrtf((float)H));
  weights_kernel<<<1024, 256>>>(dv.wd, nd, o.seed, 1, 1.0f / sqrtf((float)I));
  EX_CK(cudaGetLastError());
  if (o.run_fp8) {
    dv.ldk_gu = (H / 128 + 3) / 4 * 4;
    dv.ldk_d = (I / 128 + 3) / 4 * 4;
    EX_CK(cudaMalloc(&dv.wgu_q, ngu));
    EX_CK(cudaMalloc(&dv.wd_q, nd));
    EX_CK(cudaMalloc(&dv.wgu_s, (size_t)E * (2 * I / 128) * dv.ldk_gu * 4));
    EX_CK(cudaMalloc(&dv.wd_s, (size_t)E * (H / 128) * dv.ldk_d * 4));
    quant_weights_kernel<<<dim3(2 * I / 128, H / 128, E), 256>>>(dv.wgu, 2 * I, H, dv.wgu_q, dv.wgu_s, dv.ldk_gu);
    quant_weights_kernel<<<dim3(H / 128, I / 128, E), 256>>>(dv.wd, H, I, dv.wd_q, dv.wd_s, dv.ldk_d);
    EX_CK(cudaGetLastError());
  }
  EX_CK(cudaMalloc(&dv.x, m.x.size() * 2));
  EX_CK(cudaMalloc(&dv.topk, m.topk.size() * 4));
  EX_CK(cudaMalloc((void**)&dv.w, m.w.size() * 4));
  EX_CK(cudaMemcpy(dv.x, m.x.data(), m.x.size() * 2, cudaMemcpyHostToDevice));
  EX_CK(cudaMemcpy(dv.topk, m.topk.data(), m.topk.size() * 4, cudaMemcpyHostToDevice));
  EX_CK(cudaMemcpy(dv.w, m.w.data(), m.w.size() * 4, cudaMemcpyHostToDevice));
  EX_CK(cudaDeviceSynchronize());

  Lt lt;
  lt.init();
  bool ok = true;
  PathResult pr[2];
  for (int f = 0; f < 2; ++f) {
    if (f == 0 ? !o.run_bf16 : !o.run_fp8) continue;
    pr[f] = run_path(o, m, pl, dv, lt, f == 1);
    ok = ok && pr[f].ok;
    ok = verify(o, m, pr[f].out, f == 1) && ok;
  }

  /* ---- the timing table ------------------------------------------------------------------------ */
  const double flops = 2.0 * 3.0 * (double)R * T * K * H * I; /* unpadded rows: gate, up, down */
  printf("\n| stage (median of %d layers, us) | bf16 | fp8 (per-128, GEMM-ready scales) |\n| --- | ---: | ---: |\n", o.iters);
  const char* labels[5] = {"route update", "dispatch (+ segments D2H, overlapped)", "expert GEMMs + SiLU*up (cuBLASLt)",
                           "combine", "whole layer"};
  for (int s = 0; s < 5; ++s) {
    printf("| %s |", labels[s]);
    for (int f = 0; f < 2; ++f) {
      const Times& t = pr[f].tm;
      const std::vector<float>* v[5] = {&t.route, &t.dispatch, &t.gemm, &t.combine, &t.layer};
      if (v[s]->empty()) printf(" - |");
      else printf(" %.1f |", median(*v[s]));
    }
    printf("\n");
  }
  printf("| communication share (route + dispatch + combine) / layer |");
  for (int f = 0; f < 2; ++f) {
    const Times& t = pr[f].tm;
    if (t.layer.empty()) printf(" - |");
    else printf(" %.1f %% |", 100.0 * (median(t.route) + median(t.dispatch) + median(t.combine)) / median(t.layer));
  }
  printf("\n| expert GEMM TFLOP/s (unpadded rows) |");
  for (int f = 0; f < 2; ++f)
    if (pr[f].tm.gemm.empty()) printf(" - |");
    else printf(" %.0f |", flops / (median(pr[f].tm.gemm) * 1e-6) / 1e12);
  printf("\n| segments D2H + sync on an idle stream (host wall, us) |");
  for (int f = 0; f < 2; ++f)
    if (pr[f].tm.sync_us.empty()) printf(" - |");
    else printf(" %.1f |", median_d(pr[f].tm.sync_us));
  printf("\n\n");

  /* ---- --dump --------------------------------------------------------------------------------- */
  if (!o.dump.empty()) {
    const std::string d = o.dump + "/";
    std::vector<uint16_t> wgu(ngu), wd(nd);
    EX_CK(cudaMemcpy(wgu.data(), dv.wgu, ngu * 2, cudaMemcpyDeviceToHost));
    EX_CK(cudaMemcpy(wd.data(), dv.wd, nd * 2, cudaMemcpyDeviceToHost));
    FILE* f = fopen((d + "meta.txt").c_str(), "w");
    if (f == NULL) {
      fprintf(stderr, "--dump: cannot write %smeta.txt (does the directory exist?)\n", d.c_str());
      return 1;
    }
    fprintf(f, "R=%d\nT=%d\nH=%d\nI=%d\nE=%d\nK=%d\nalign=%d\nseed=%llu\nbf16=%d\nfp8=%d\n", R, T, H, I, E, K, o.align,
            (unsigned long long)o.seed, o.run_bf16 ? 1 : 0, o.run_fp8 ? 1 : 0);
    fclose(f);
    bool w = write_file(d + "x.bf16", m.x.data(), m.x.size() * 2) && write_file(d + "topk.i32", m.topk.data(), m.topk.size() * 4) &&
             write_file(d + "weights.f32", m.w.data(), m.w.size() * 4) && write_file(d + "w_gate_up.bf16", wgu.data(), ngu * 2) &&
             write_file(d + "w_down.bf16", wd.data(), nd * 2);
    if (o.run_bf16) w = w && write_file(d + "out_bf16.bf16", pr[0].out.data(), pr[0].out.size() * 2);
    if (o.run_fp8) w = w && write_file(d + "out_fp8.bf16", pr[1].out.data(), pr[1].out.size() * 2);
    if (!w) return 1;
    printf("dumped inputs, weights and outputs to %s (scripts/moe_layer_torch.py --dump %s)\n", o.dump.c_str(), o.dump.c_str());
  }

  lt.destroy();
  cudaFree(dv.wgu);
  cudaFree(dv.wd);
  cudaFree(dv.wgu_q);
  cudaFree(dv.wd_q);
  cudaFree(dv.wgu_s);
  cudaFree(dv.wd_s);
  cudaFree(dv.x);
  cudaFree(dv.topk);
  cudaFree(dv.w);
  printf(ok ? "ex05_moe_layer_gemm: OK\n" : "ex05_moe_layer_gemm: FAILED\n");
  return ok ? 0 : 1;
}
