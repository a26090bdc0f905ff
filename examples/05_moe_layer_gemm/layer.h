/* layer.h — ex05_moe_layer_gemm's host side of the layer: the options, the inputs (Model), the
 * weights as a counter-based hash (the GPU generates them, the host recomputes any element), the
 * device state (Dev), the timings, and the CPU model of the placement (which received row holds
 * which token). Part of the example (one translation unit: main.cu includes it). */
#ifndef EX05_LAYER_H
#define EX05_LAYER_H

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include <cuda_bf16.h>

#include "epfuse/epfuse.cuh"
#include "ex_common.h"

/* ---- options ---------------------------------------------------------------------------------- */

struct Opts {
  int R = 8, T = 64, H = 512, I = 256, E = 32, K = 4, align = 16, iters = 20;
  uint64_t seed = 0;
  bool real = false, ctest = false, run_bf16 = true, run_fp8 = true;
  /* where the FP8 path's down GEMM writes its BF16 outputs (--expert-out): the window's EXPERT_OUT
   * rows, where the pull combine reads them (nothing is put), and/or a separate buffer the combine
   * first puts into the window (the old path, for comparison); "both" runs the FP8 path twice */
  bool eo_window = true, eo_buffer = false;
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
    } else if (a == "--expert-out") {
      std::string p = next();
      o.eo_window = p == "window" || p == "both";
      o.eo_buffer = p == "buffer" || p == "both";
      if (!o.eo_window && !o.eo_buffer) {
        fprintf(stderr, "--expert-out window|buffer|both\n");
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

struct PathResult {
  std::vector<uint16_t> out; /* [R*T][H] */
  Times tm;
  bool ok = true;
};

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

#endif /* EX05_LAYER_H */
