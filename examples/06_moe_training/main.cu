/* ex06_moe_training — one training step (forward + backward) of a small MoE layer through epfuse,
 * over virtual ranks on one GPU, checked bit for bit against a CPU reference and, as a gradient
 * check, against finite differences of the exact layer (and, with --dump, against PyTorch autograd:
 * scripts/moe_training_torch.py).
 *
 * The layer: y[t] = sum_k w[t,k] * f_e(x[t]) over the token's top-k experts e = topk_idx[t,k]
 * (a -1 names no expert; a repeated expert counts once per k), with a SwiGLU MLP per expert:
 *     f_e(x) = (silu(x W1_e) * (x W3_e)) W2_e        W1_e, W3_e [H][I], W2_e [I][H], BF16
 * The experts here are plain CUDA kernels in FP32 from the BF16 rows (one thread per hidden unit);
 * their outputs and input gradients are rounded to BF16, the weight gradients stay FP32.
 *
 *   forward   epf_route_update                 the route (kept for the backward: no second update)
 *             epf_ht_dispatch                  x rows to the experts' ranks
 *             [epf_ht_expand]                  RANK_MAJOR: the expert-major view of the rows
 *             experts_forward_kernel           out_row = f_e(x_row) in BF16; x_row saved for the backward
 *             epf_ht_combine                   y[t] = sum_k w * out_row, FP32 in k order, BF16 out
 *   backward  epf_ht_combine_backward          dy rows (BF16, exact) to the very rows x arrived at
 *             [epf_ht_expand]                  RANK_MAJOR: into the same view rows
 *             row_weights_kernel               each row's combine weight (the sum of the w[t,k] that read it)
 *             experts_backward_kernel          d out = w_row * dy; dx_row (BF16) and d w = dot(dy, out_row)
 *             weight_grads_kernel              dW1, dW3, dW2 of every expert (FP32, row order)
 *             epf_ht_dispatch_backward         dx[t] = sum of the token's dx rows (unit weights),
 *                                              d topk_weights[t,k] = the d w of the row k reads
 *
 * Checks (exit 1 on any failure; the seed is printed, --seed repeats a run):
 *   1. the route's segments equal a CPU model of the placement (which row holds which token);
 *   2. bit-exact against the CPU reference, which runs the SAME expert math (the ex06_* functions
 *      below are compiled for both sides; this target is built with --fmad=false so that no
 *      multiply-add is contracted differently): every expert output row, row weight, router-weight
 *      gradient and dx row, then y, dx, d topk_weights and dW1 / dW3 / dW2;
 *   3. the gradient check: the exact layer in double; y within 2 u_bf16 normwise, and for each of
 *      x, topk_weights, W1, W3, W2 a central finite difference of L = sum(dy * y) along a random
 *      direction against epfuse's gradient (README.md "Accuracy");
 *   4. the error record is clean; --steps N runs the whole step N times on the same route buffers
 *      (epochs advance) and every step must give the same bits.
 *
 *   ex06_moe_training                  both layouts x both combine transports, small shapes
 *   ex06_moe_training --ctest          the same (CTest; exit 77 without a GPU)
 *   ex06_moe_training --dump DIR       also writes DIR/<case>/ for scripts/moe_training_torch.py
 *   ex06_moe_training --cpu-reference  no GPU: the CPU reference alone (its gradient check, --dump)
 *   options: --layout em|rm|both --combine pull|push|both --R --T (max tokens per rank) --H --I
 *            --E --K --steps N --seed N
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <sys/stat.h>
#include <utility>
#include <vector>

#include "epfuse/epfuse.cuh"
#include "epfuse/ht/kernels.cuh"
#include "ex_common.h"

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

/* ============================================================================================ */
/* Options and inputs                                                                            */
/* ============================================================================================ */

struct Opts {
  int R = 0, T = 0, H = 0, I = 0, E = 0, K = 0, steps = 2; /* 0: the case's default */
  bool em = true, rm = true, pull = true, push = true, ctest = false, cpu = false;
  uint64_t seed = 0;
  std::string dump;
};

/* one configuration: layout, combine transport, shape */
struct Case {
  std::string name;
  int layout, push, R, Tmax, H, I, E, K;
};

static void usage_exit(const char* why) {
  fprintf(stderr, "%s\nusage: ex06_moe_training [--layout em|rm|both] [--combine pull|push|both] [--R n] [--T max]\n"
                  "       [--H n] [--I n] [--E n] [--K n] [--steps n] [--seed n] [--dump DIR] [--ctest] [--cpu-reference]\n", why);
  exit(2);
}

static Opts parse(int argc, char** argv) {
  Opts o;
  o.seed = (uint64_t)std::chrono::high_resolution_clock::now().time_since_epoch().count() % 1000000007ull;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) usage_exit((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "--ctest") o.ctest = true;
    else if (a == "--cpu-reference") o.cpu = true;
    else if (a == "--R") o.R = atoi(next());
    else if (a == "--T") o.T = atoi(next());
    else if (a == "--H") o.H = atoi(next());
    else if (a == "--I") o.I = atoi(next());
    else if (a == "--E") o.E = atoi(next());
    else if (a == "--K") o.K = atoi(next());
    else if (a == "--steps") o.steps = atoi(next());
    else if (a == "--seed") o.seed = strtoull(next(), NULL, 0);
    else if (a == "--dump") o.dump = next();
    else if (a == "--layout") {
      const std::string v = next();
      o.em = v == "em" || v == "both";
      o.rm = v == "rm" || v == "both";
      if (!o.em && !o.rm) usage_exit("--layout em|rm|both");
    } else if (a == "--combine") {
      const std::string v = next();
      o.pull = v == "pull" || v == "both";
      o.push = v == "push" || v == "both";
      if (!o.pull && !o.push) usage_exit("--combine pull|push|both");
    } else usage_exit(("unknown option " + a).c_str());
  }
  if (o.steps < 1) usage_exit("--steps >= 1");
  return o;
}

/* the runs: per layout its default shape (EXPERT_MAJOR over 4 ranks, RANK_MAJOR over 5, hidden
 * sizes that are no multiple of 256), each with the pull and/or the push combine */
static std::vector<Case> cases(const Opts& o) {
  std::vector<Case> v;
  for (int l = 0; l < 2; ++l) {
    if (l == 0 ? !o.em : !o.rm) continue;
    for (int p = 0; p < 2; ++p) {
      if (p == 0 ? !o.pull : !o.push) continue;
      Case c;
      c.layout = l == 0 ? EPF_LAYOUT_EXPERT_MAJOR : EPF_LAYOUT_RANK_MAJOR;
      c.push = p;
      c.R = o.R ? o.R : (l == 0 ? 4 : 5);
      c.Tmax = o.T ? o.T : (l == 0 ? 12 : 10);
      c.H = o.H ? o.H : (l == 0 ? 264 : 520);
      c.I = o.I ? o.I : (l == 0 ? 64 : 96);
      c.E = o.E ? o.E : (l == 0 ? 16 : 40);
      c.K = o.K ? o.K : (l == 0 ? 4 : 6);
      c.name = std::string(l == 0 ? "em" : "rm") + (p ? "_push" : "_pull");
      if (c.R < 2 || c.Tmax < 2 || c.H < 8 || c.H % 8 || c.I < 1 || c.I > 4096 || c.E % c.R || c.K < 3 || c.K > c.E ||
          c.K > 32)
        usage_exit("need R >= 2, T >= 2, H a multiple of 8, 1 <= I <= 4096 (shared memory), E a multiple of R, "
                   "3 <= K <= min(E, 32)");
      v.push_back(c);
    }
  }
  return v;
}

/* host inputs, packed per rank [R][Tmax][...] (rows t >= T[r] are not part of the layer) */
struct Model {
  Case c;
  std::vector<int32_t> T;              /* [R] tokens per rank: unequal, one rank with T = 1 (and, R >= 5, one with 0) */
  std::vector<uint16_t> x, dy;         /* [R][Tmax][H] BF16 */
  std::vector<int32_t> topk;           /* [R][Tmax][K], -1 = no expert */
  std::vector<float> w;                /* [R][Tmax][K] */
  std::vector<uint16_t> w1, w3, w2;    /* [E][H][I], [E][H][I], [E][I][H] BF16 */
};

static float ex06_uniform(uint64_t* s) { return (float)(ex_rand(s) >> 40) * (2.0f / 16777216.0f) - 1.0f; } /* [-1, 1) */

static Model make_model(const Case& c, uint64_t seed) {
  Model m;
  m.c = c;
  const int R = c.R, Tm = c.Tmax, H = c.H, I = c.I, E = c.E, K = c.K;
  uint64_t s = seed ^ 0x6a09e667f3bcc908ull;
  m.T.resize(R);
  for (int r = 0; r < R; ++r) m.T[r] = 2 + (int)(ex_rand(&s) % (uint64_t)(Tm - 1)); /* [2, Tmax] */
  m.T[0] = Tm;
  m.T[1] = 1;
  if (R >= 5) m.T[R - 1] = 0;
  const size_t n = (size_t)R * Tm;
  m.x.resize(n * H);
  m.dy.resize(n * H);
  m.topk.assign(n * K, -1);
  m.w.resize(n * K);
  for (auto& v : m.x) v = ex06_bf16(ex06_uniform(&s));
  for (auto& v : m.dy) v = ex06_bf16(ex06_uniform(&s));
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < Tm; ++t) {
      int32_t* ids = m.topk.data() + ((size_t)r * Tm + t) * K;
      float* w = m.w.data() + ((size_t)r * Tm + t) * K;
      float lg[32], sum = 0.f;
      for (int k = 0; k < K; ++k) { /* softmax of random logits: a renormalized top-k router */
        lg[k] = (ex06_uniform(&s) + 1.0f) * 2.0f;
        sum += expf(lg[k]);
      }
      for (int k = 0; k < K; ++k) w[k] = expf(lg[k]) / sum;
      if (t >= m.T[r]) continue;
      for (int k = 0; k < K; ++k) /* distinct experts ... */
        for (;;) {
          ids[k] = (int32_t)(ex_rand(&s) % (uint64_t)E);
          bool dup = false;
          for (int j = 0; j < k; ++j) dup |= ids[j] == ids[k];
          if (!dup) break;
        }
      const uint64_t z = ex_rand(&s); /* ... then about 1 token in 6 repeats one, 1 in 6 has a -1 */
      const bool forced = (r == 0 && t < 2) || (r == 1 && t == 0);
      const int kr = 1 + (int)((z >> 8) % (uint64_t)(K - 1));
      if (!forced && z % 6 == 0) ids[kr] = ids[(z >> 16) % (uint64_t)kr];
      if (!forced && (z >> 24) % 6 == 0) ids[(z >> 32) % (uint64_t)K] = -1;
    }
  /* and for sure: rank 0 token 0 repeats its first expert at the last k; rank 0 token 1 has a -1;
   * the single token of rank 1 has both */
  int32_t* t00 = m.topk.data();
  t00[K - 1] = t00[0];
  m.topk[(size_t)1 * K + 1] = -1;
  int32_t* t10 = m.topk.data() + (size_t)1 * Tm * K;
  t10[1] = -1;
  t10[2] = t10[0];
  m.w1.resize((size_t)E * H * I);
  m.w3.resize((size_t)E * H * I);
  m.w2.resize((size_t)E * I * H);
  const float s13 = 1.0f / sqrtf((float)H), s2 = 1.0f / sqrtf((float)I);
  for (auto& v : m.w1) v = ex06_bf16(ex06_uniform(&s) * s13);
  for (auto& v : m.w3) v = ex06_bf16(ex06_uniform(&s) * s13);
  for (auto& v : m.w2) v = ex06_bf16(ex06_uniform(&s) * s2);
  return m;
}

/* the first k' <= k with the same expert id (k itself if none before it) */
static int first_k(const int32_t* ids, int k) {
  for (int j = 0; j < k; ++j)
    if (ids[j] == ids[k]) return j;
  return k;
}

/* ============================================================================================ */
/* The CPU model of the placement (docs/route.md "Expert-major receive order")                   */
/* ============================================================================================ */
/* The expert stage sees one row per (token, distinct expert): EXPERT_MAJOR the receive rows,
 * RANK_MAJOR the expand view's rows; both are ordered by local expert, then source rank, then the
 * source's token order. With expert_alignment 1 each local expert's segment starts where the
 * previous one ends. */
struct Place {
  std::vector<std::vector<std::pair<int, int>>> rows; /* [R * EL]: (source rank, token) of each row, in order */
  std::vector<int64_t> begin;                         /* [R * EL]: the segment's first row */
  std::vector<int64_t> row_of;                        /* [R][Tmax][K]: the row (t, k) reads on rank e / EL, -1 */
  int64_t max_expert_rows = 0, max_recv_rows = 0;     /* over the ranks: expert rows; receive rows (RANK_MAJOR: per (token, rank)) */
};

static Place place(const Model& m) {
  const Case& c = m.c;
  const int R = c.R, Tm = c.Tmax, K = c.K, EL = c.E / c.R;
  Place p;
  p.rows.resize((size_t)c.E);
  p.begin.resize((size_t)c.E);
  p.row_of.assign((size_t)R * Tm * K, -1);
  std::vector<int64_t> rm_rows(R, 0);
  for (int s = 0; s < R; ++s)
    for (int t = 0; t < m.T[s]; ++t) {
      const int32_t* ids = m.topk.data() + ((size_t)s * Tm + t) * K;
      std::vector<char> to_rank((size_t)R, 0);
      for (int k = 0; k < K; ++k)
        if (ids[k] >= 0 && first_k(ids, k) == k) {
          p.rows[(size_t)ids[k]].push_back({s, t});
          to_rank[ids[k] / EL] = true;
        }
      for (int d = 0; d < R; ++d) rm_rows[d] += to_rank[d];
    }
  for (int d = 0; d < R; ++d) {
    int64_t b = 0;
    for (int le = 0; le < EL; ++le) {
      p.begin[(size_t)d * EL + le] = b;
      b += (int64_t)p.rows[(size_t)d * EL + le].size();
    }
    p.max_expert_rows = std::max(p.max_expert_rows, b);
    p.max_recv_rows = std::max(p.max_recv_rows, c.layout == EPF_LAYOUT_EXPERT_MAJOR ? b : rm_rows[d]);
  }
  for (int e = 0; e < c.E; ++e)
    for (size_t i = 0; i < p.rows[(size_t)e].size(); ++i) {
      const int s = p.rows[(size_t)e][i].first, t = p.rows[(size_t)e][i].second;
      const int32_t* ids = m.topk.data() + ((size_t)s * Tm + t) * K;
      for (int k = 0; k < K; ++k)
        if (ids[k] == e) p.row_of[((size_t)s * Tm + t) * K + k] = p.begin[(size_t)e] + (int64_t)i;
    }
  return p;
}

/* ============================================================================================ */
/* The expert stage on the GPU (plain kernels, no communication)                                 */
/* ============================================================================================ */
/* Every kernel covers all virtual ranks: blockIdx.y = rank (route buffer index), and walks the
 * rank's local experts' segments (the route's RECV_SEGMENT: receive rows EXPERT_MAJOR, view rows
 * RANK_MAJOR). Per-row buffers are [R][expert_rows][...] in the same row order. */

/* the row a dispatch delivered to rank idx's expert stage: EXPERT_MAJOR the receive row in the
 * window (read in place), RANK_MAJOR row r of the rank's expand view */
static __device__ const uint16_t* ex06_arrived_row(const epf_plan_t& plan, const char* window, const uint16_t* view,
                                                   int64_t expert_rows, int idx, int64_t r) {
  if (plan.layout == EPF_LAYOUT_EXPERT_MAJOR)
    return (const uint16_t*)(window + (uint64_t)idx * plan.total_bytes + epf_plan_recv_token_offset(&plan, r));
  return (const uint16_t*)((const char*)view + ((uint64_t)idx * expert_rows + r) * plan.row_bytes);
}

/* the rows [begin, end) of local expert le on rank idx, clipped at the rows that exist */
static __device__ void ex06_segment(const epf_route_t& route, const epf_plan_t& plan, int64_t expert_rows, int idx, int le,
                                    int64_t* begin, int64_t* end) {
  const epf_route_segment_t sg = ((const epf_route_segment_t*)epf_route_ptr(&route, idx, EPF_ROUTE_RECV_SEGMENT))[le];
  const int64_t cap = plan.layout == EPF_LAYOUT_EXPERT_MAJOR ? plan.recv_capacity : expert_rows;
  *begin = sg.begin;
  *end = sg.begin + sg.count < cap ? sg.begin + sg.count : cap;
}

// example-begin experts_forward
/* experts_forward_kernel — out_row = bf16(f_e(x_row)) for every row; the x row is saved for the
 * backward (EXPERT_MAJOR: the backward's dy arrives in the same receive row). One block per row,
 * h (I floats) in shared memory. Grid (any, R). */
__global__ void experts_forward_kernel(epf_route_t route, epf_plan_t plan, const char* window, const uint16_t* view,
                                       int64_t expert_rows, int I, const uint16_t* w1, const uint16_t* w3,
                                       const uint16_t* w2, uint16_t* saved_x, uint16_t* out) {
  extern __shared__ float ex06_smem[]; /* h [I] */
  const int idx = (int)blockIdx.y, H = plan.hidden, EL = plan.experts_per_rank;
  for (int le = 0; le < EL; ++le) {
    const uint64_t e = (uint64_t)idx * EL + le;
    const uint16_t *W1 = w1 + e * H * I, *W3 = w3 + e * H * I, *W2 = w2 + e * I * H;
    int64_t begin, end;
    ex06_segment(route, plan, expert_rows, idx, le, &begin, &end);
    for (int64_t r = begin + blockIdx.x; r < end; r += gridDim.x) {
      const uint16_t* x = ex06_arrived_row(plan, window, view, expert_rows, idx, r);
      const uint64_t row = (uint64_t)idx * expert_rows + r;
      for (int h = threadIdx.x; h < H; h += blockDim.x) saved_x[row * H + h] = x[h];
      for (int i = threadIdx.x; i < I; i += blockDim.x) {
        float a, b;
        ex06_gate_up(x, W1, W3, H, I, i, &a, &b);
        ex06_smem[i] = ex06_swiglu(a, b);
      }
      __syncthreads();
      for (int j = threadIdx.x; j < H; j += blockDim.x) out[row * H + j] = ex06_bf16(ex06_down(ex06_smem, W2, I, H, j));
      __syncthreads();
    }
  }
}
// example-end experts_forward

// example-begin row_weights
/* row_weights_kernel — after epf_ht_combine_backward (+ expand): the combine weight of every expert
 * row, the sum in ascending k (FP32 from 0) of w[t,k] over every k of the token that reads the
 * row (a repeated expert's k read its first occurrence's row), into rw [R][expert_rows].
 *   EXPERT_MAJOR: the backward of combine wrote exactly that into the row's metadata weight.
 *   RANK_MAJOR: the metadata of a receive row lists the token's entries on this rank in k order,
 *   each with its own weight and its view row; the entries naming the same view row are summed.
 * One warp per row. Grid (any, R). */
__global__ void row_weights_kernel(epf_route_t route, epf_plan_t plan, char* window, int64_t expert_rows, float* rw) {
  const int idx = (int)blockIdx.y, lane = epf_lane_id();
  const epf_team_t me = epf_team_virtual(window, plan.total_bytes, idx, plan.nranks);
  const int warp = (int)(blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)), nwarps = (int)(gridDim.x * (blockDim.x >> 5));
  if (plan.layout == EPF_LAYOUT_EXPERT_MAJOR) {
    for (int le = 0; le < plan.experts_per_rank; ++le) {
      int64_t begin, end;
      ex06_segment(route, plan, expert_rows, idx, le, &begin, &end);
      for (int64_t r = begin + warp; r < end; r += nwarps)
        if (lane == 0)
          rw[(uint64_t)idx * expert_rows + r] = ((const epf_recv_meta_em_t*)epf_local_ptr(me, epf_plan_recv_meta_offset(&plan, r)))->weight;
    }
    return;
  }
  const epf_ht_view_t v = epf_ht_view(&route, me, &plan, idx, NULL, NULL);
  const int64_t rows = epf_ht_recv_rows(&v, &plan);
  for (int64_t r = warp; r < rows; r += nwarps) { /* warp-uniform */
    const epf_recv_meta_rm_lane_t m = epf_recv_meta_rm_read_warp(me, &plan, r, v.src_offset);
    const int64_t er = m.token_ok ? m.em_row : -1; /* lane j: entry j's view row */
    float sum = 0.f;
    for (int j = 0; j < 32; ++j) { /* warp-uniform; entries in k order */
      const long long ej = __shfl_sync(0xffffffffu, (long long)er, j);
      const float wj = __shfl_sync(0xffffffffu, m.weight, j);
      if (er >= 0 && ej == er) sum += wj;
    }
    const uint32_t same = __match_any_sync(0xffffffffu, (unsigned long long)er);
    if (er >= 0 && er < expert_rows && __ffs((int)same) - 1 == lane) rw[(uint64_t)idx * expert_rows + er] = sum;
  }
}
// example-end row_weights

// example-begin experts_backward
/* experts_backward_kernel — per row, with dy_row where the backward of combine delivered it (the
 * row x arrived in; RANK_MAJOR its view row) and w_row = rw[row]:
 *   wg[row]  = dot(dy_row, out_row)                     the router-weight gradient of the row
 *   d out    = w_row * dy_row;  dh = d out . W2^T;  (da, db) = the SwiGLU backward at (a, b)
 *   dxr[row] = bf16(da . W1^T + db . W3^T)              the gradient of the row's input
 * and da, db, h (FP32 [R][expert_rows][I]) for weight_grads_kernel. a, b are recomputed from the
 * saved x row (same bits as the forward). One block per row. Grid (any, R). */
__global__ void experts_backward_kernel(epf_route_t route, epf_plan_t plan, const char* window, const uint16_t* view,
                                        int64_t expert_rows, int I, const uint16_t* w1, const uint16_t* w3,
                                        const uint16_t* w2, const uint16_t* saved_x, const uint16_t* out, const float* rw,
                                        uint16_t* dxr, float* wg, float* da_rows, float* db_rows, float* h_rows) {
  extern __shared__ float ex06_smem[]; /* da [I], db [I] */
  float *da = ex06_smem, *db = ex06_smem + I;
  const int idx = (int)blockIdx.y, H = plan.hidden, EL = plan.experts_per_rank;
  for (int le = 0; le < EL; ++le) {
    const uint64_t e = (uint64_t)idx * EL + le;
    const uint16_t *W1 = w1 + e * H * I, *W3 = w3 + e * H * I, *W2 = w2 + e * I * H;
    int64_t begin, end;
    ex06_segment(route, plan, expert_rows, idx, le, &begin, &end);
    for (int64_t r = begin + blockIdx.x; r < end; r += gridDim.x) {
      const uint16_t* dy = ex06_arrived_row(plan, window, view, expert_rows, idx, r);
      const uint64_t row = (uint64_t)idx * expert_rows + r;
      const uint16_t* x = saved_x + row * H;
      const float w_row = rw[row];
      if (threadIdx.x == 0) wg[row] = ex06_wgrad(dy, out + row * H, H);
      for (int i = threadIdx.x; i < I; i += blockDim.x) {
        float a, b, dai, dbi;
        ex06_gate_up(x, W1, W3, H, I, i, &a, &b);
        ex06_swiglu_backward(a, b, ex06_dh(dy, w_row, W2, H, i), &dai, &dbi);
        da[i] = dai;
        db[i] = dbi;
        da_rows[row * I + i] = dai;
        db_rows[row * I + i] = dbi;
        h_rows[row * I + i] = ex06_swiglu(a, b);
      }
      __syncthreads();
      for (int j = threadIdx.x; j < H; j += blockDim.x) dxr[row * H + j] = ex06_bf16(ex06_dx(da, db, W1, W3, I, j));
      __syncthreads();
    }
  }
}
// example-end experts_backward

/* weight_grads_kernel — the weight gradients of expert e (blockIdx.y), FP32 sums over its rows in
 * row order from 0:  dW1[h][i] += x[h] da[i],  dW3[h][i] += x[h] db[i],  dW2[i][j] += h[i] d out[j].
 * One thread per element; an expert with no rows gets zeros. Grid (any, E). */
__global__ void weight_grads_kernel(epf_route_t route, epf_plan_t plan, const char* window, const uint16_t* view,
                                    int64_t expert_rows, int I, const uint16_t* saved_x, const float* rw,
                                    const float* da_rows, const float* db_rows, const float* h_rows, float* dw1, float* dw3,
                                    float* dw2) {
  const int e = (int)blockIdx.y, H = plan.hidden, EL = plan.experts_per_rank, idx = e / EL;
  int64_t begin, end;
  ex06_segment(route, plan, expert_rows, idx, e % EL, &begin, &end);
  const uint64_t base = (uint64_t)idx * expert_rows, n = (uint64_t)H * I;
  for (uint64_t q = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; q < n; q += (uint64_t)gridDim.x * blockDim.x) {
    const uint64_t h = q / I, i = q % I;  /* dW1, dW3 [H][I] */
    const uint64_t i2 = q / H, j = q % H; /* dW2 [I][H] */
    float s1 = 0.f, s3 = 0.f, s2 = 0.f;
    for (int64_t r = begin; r < end; ++r) {
      const float xv = ex06_f(saved_x[(base + r) * H + h]);
      const uint16_t* dy = ex06_arrived_row(plan, window, view, expert_rows, idx, r);
      s1 = fmaf(xv, da_rows[(base + r) * I + i], s1);
      s3 = fmaf(xv, db_rows[(base + r) * I + i], s3);
      s2 = fmaf(h_rows[(base + r) * I + i2], ex06_dout(rw[base + r], dy[j]), s2);
    }
    dw1[(uint64_t)e * n + q] = s1;
    dw3[(uint64_t)e * n + q] = s3;
    dw2[(uint64_t)e * n + q] = s2;
  }
}

/* ============================================================================================ */
/* One training step through epfuse                                                              */
/* ============================================================================================ */

/* what a step produces (host copies), in the layouts the CPU reference uses */
struct Result {
  std::vector<uint16_t> y, dx;          /* [R][Tmax][H] BF16 (rows t < T[r]) */
  std::vector<float> dtw;               /* [R][Tmax][K] d topk_weights */
  std::vector<float> dw1, dw3, dw2;     /* [E][H][I], [E][H][I], [E][I][H] */
  std::vector<uint16_t> out, dxr;       /* [R][expert_rows][H]: expert outputs, input gradients */
  std::vector<float> rw, wg;            /* [R][expert_rows]: row weights, router-weight gradients */
};

/* the device side of one case */
struct Layer {
  Case c;
  epf_plan_t plan;
  epf_team_t team;
  epf_route_t route;
  int64_t expert_rows;
  char* window = NULL;
  void* route_buf = NULL;
  epf_ht_state_t* state = NULL;
  epf_error_record_t *rec_h = NULL, *rec_d = NULL;
  /* inputs */
  int32_t *topk = NULL, *T = NULL;
  float* w = NULL;
  uint16_t *x = NULL, *dy = NULL, *w1 = NULL, *w3 = NULL, *w2 = NULL;
  /* forward */
  uint16_t *view = NULL, *saved_x = NULL, *out = NULL, *y = NULL;
  /* backward */
  float *rw = NULL, *wg = NULL, *da = NULL, *db = NULL, *hr = NULL, *dtw = NULL, *dw1 = NULL, *dw3 = NULL, *dw2 = NULL;
  uint16_t *dxr = NULL, *dx = NULL;
  epf_route_step_t rs;
  epf_ht_step_t fwd, bwd;
};

template <typename P>
static P* dev_alloc(size_t n) {
  P* p = NULL;
  EX_CK(cudaMalloc((void**)&p, std::max<size_t>(n, 1) * sizeof(P)));
  return p;
}
template <typename P>
static P* dev_upload(const std::vector<P>& v) {
  P* p = dev_alloc<P>(v.size());
  EX_CK(cudaMemcpy(p, v.data(), v.size() * sizeof(P), cudaMemcpyHostToDevice));
  return p;
}

/* the plan of a case (host only, no GPU) and the rows of the expert stage's buffers: EXPERT_MAJOR
 * one per receive row, RANK_MAJOR the expand view's */
static epf_plan_t plan_of(const Case& c, const Place& pl, int64_t* expert_rows) {
  const int R = c.R, H = c.H, E = c.E, K = c.K, Tm = c.Tmax;
  // example-begin training_plan
  epf_config_t cfg = EPF_CONFIG_INIT;
  cfg.nranks = R;
  cfg.num_experts = E;
  cfg.top_k = K;
  cfg.hidden = H;
  cfg.max_tokens_per_rank = Tm;
  cfg.mode = EPF_MODE_HT;
  cfg.layout = c.layout;
  cfg.payload = EPF_PAYLOAD_BF16;         /* the backward moves BF16 (gradients): a BF16 plan */
  cfg.combine_payload = EPF_PAYLOAD_BF16;
  cfg.flags = c.push ? EPF_FLAG_COMBINE_PUSH : 0u;
  cfg.expert_alignment = 1;
  cfg.recv_capacity = pl.max_recv_rows + 16; /* this routing fits; more would be dropped and counted */
  epf_plan_t plan;
  EX_CS(epf_plan_compute(&cfg, &plan));
  // example-end training_plan
  *expert_rows = c.layout == EPF_LAYOUT_EXPERT_MAJOR ? plan.recv_capacity : pl.max_expert_rows + 16;
  return plan;
}

/* plan, window, team, route, buffers and the two steps of one case */
static void layer_init(Layer& L, const Model& m, const Place& pl) {
  const Case& c = m.c;
  L.c = c;
  const int R = c.R, H = c.H, I = c.I, E = c.E, K = c.K, Tm = c.Tmax;
  L.plan = plan_of(c, pl, &L.expert_rows);

  EX_CK(cudaMalloc(&L.window, (size_t)R * L.plan.total_bytes));
  EX_CK(cudaMemset(L.window, 0, (size_t)R * L.plan.total_bytes)); /* epochs start at zero */
  L.team = epf_team_virtual(L.window, L.plan.total_bytes, 0, R);
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  rc.index_type = EPF_INDEX_INT32;
  uint64_t rbytes = 0;
  EX_CS(epf_route_size(&L.plan, &rc, &rbytes));
  EX_CK(cudaMalloc(&L.route_buf, (size_t)rbytes * R));
  EX_CS(epf_route_init(&L.plan, &rc, L.route_buf, rbytes * R, R, 1u, 0, &L.route));
  L.state = dev_alloc<epf_ht_state_t>(R);
  EX_CK(cudaMemset(L.state, 0, R * sizeof(epf_ht_state_t))); /* zeroed once, shared by both directions */
  EX_CK(cudaHostAlloc((void**)&L.rec_h, sizeof(epf_error_record_t), cudaHostAllocMapped));
  EX_CK(cudaHostGetDevicePointer((void**)&L.rec_d, L.rec_h, 0));
  epf_error_clear(L.rec_h);

  L.topk = dev_upload(m.topk);
  L.T = dev_upload(m.T);
  L.w = dev_upload(m.w);
  L.x = dev_upload(m.x);
  L.dy = dev_upload(m.dy);
  L.w1 = dev_upload(m.w1);
  L.w3 = dev_upload(m.w3);
  L.w2 = dev_upload(m.w2);
  const size_t rows = (size_t)R * L.expert_rows, tok = (size_t)R * Tm;
  if (c.layout == EPF_LAYOUT_RANK_MAJOR) L.view = (uint16_t*)dev_alloc<char>(rows * L.plan.row_bytes); /* [R][expert_rows] rows */
  L.saved_x = dev_alloc<uint16_t>(rows * H);
  L.out = dev_alloc<uint16_t>(rows * H);
  L.dxr = dev_alloc<uint16_t>(rows * H);
  L.rw = dev_alloc<float>(rows);
  L.wg = dev_alloc<float>(rows);
  L.da = dev_alloc<float>(rows * I);
  L.db = dev_alloc<float>(rows * I);
  L.hr = dev_alloc<float>(rows * I);
  L.y = dev_alloc<uint16_t>(tok * H);
  L.dx = dev_alloc<uint16_t>(tok * H);
  L.dtw = dev_alloc<float>(tok * K);
  L.dw1 = dev_alloc<float>((size_t)E * H * I);
  L.dw3 = dev_alloc<float>((size_t)E * H * I);
  L.dw2 = dev_alloc<float>((size_t)E * I * H);

  // example-begin training_steps
  const epf_wait_t wait = epf_wait_make(L.plan.timeout_ns, L.rec_d, NULL, 0);
  L.rs = epf_route_step_make(L.topk, Tm, wait);
  L.rs.num_tokens_dev = L.T;   /* T per rank, on the device (unequal here) */

  {
    const epf_ht_step_t init = EPF_HT_STEP_INIT; /* the versioned prefix, every operand NULL */
    L.fwd = init;
  }
  L.fwd.x = L.x;               /* [R][Tmax][H] BF16 */
  L.fwd.topk_weights = L.w;    /* [R][Tmax][K] */
  L.fwd.out = L.y;             /* y [R][Tmax][H] BF16 */
  L.fwd.expert_out = L.out;    /* the experts' outputs [R][expert_rows][H] */
  L.fwd.em_view = L.view;      /* RANK_MAJOR: the expert-major view (NULL otherwise) */
  L.fwd.state = L.state;
  L.fwd.expert_rows = L.expert_rows;
  L.fwd.wait = wait;

  L.bwd = L.fwd;               /* the same route, state, view and weights; then: */
  L.bwd.x = L.dy;              /* the backward of combine dispatches dy [R][Tmax][H] */
  L.bwd.topk_idx = L.topk;     /* the forward's ids (the backward launchers take them here) */
  L.bwd.expert_out = L.dxr;    /* the backward of dispatch combines the dx rows ... */
  L.bwd.out = L.dx;            /* ... into dx [R][Tmax][H] */
  L.bwd.weight_grad = L.wg;    /* one d w per row, in expert_out's row order ... */
  L.bwd.topk_weights_grad = L.dtw; /* ... back to d topk_weights [R][Tmax][K] */
  // example-end training_steps
}

static void layer_free(Layer& L) {
  void* bufs[] = {L.window, L.route_buf, L.state, L.topk, L.T, L.w, L.x, L.dy, L.w1, L.w3, L.w2, L.view, L.saved_x,
                  L.out, L.y, L.rw, L.wg, L.da, L.db, L.hr, L.dtw, L.dw1, L.dw3, L.dw2, L.dxr, L.dx};
  for (void* p : bufs) EX_CK(cudaFree(p));
  EX_CK(cudaFreeHost(L.rec_h));
}

/* the grid of the expert-stage kernels: enough blocks per rank for the rows at this size */
static dim3 rows_grid(const Layer& L) { return dim3((unsigned)std::min<int64_t>(std::max<int64_t>(L.expert_rows, 1), 132), (unsigned)L.c.R); }

// example-begin training_forward
static void forward(Layer& L, cudaStream_t st) {
  EX_CS(epf_route_update(&L.route, L.team, &L.plan, &L.rs, st));
  EX_CS(epf_ht_dispatch(&L.route, L.team, &L.plan, &L.fwd, L.topk, EPF_HT_BOTH, st));
  if (L.c.layout == EPF_LAYOUT_RANK_MAJOR) EX_CS(epf_ht_expand(&L.route, L.team, &L.plan, &L.fwd, st));
  experts_forward_kernel<<<rows_grid(L), 128, (size_t)L.c.I * 4, st>>>(
      L.route, L.plan, L.window, L.view, L.expert_rows, L.c.I, L.w1, L.w3, L.w2, L.saved_x, L.out);
  EX_CK(cudaGetLastError());
  EX_CS(epf_ht_combine(&L.route, L.team, &L.plan, &L.fwd, L.topk, st));
}
// example-end training_forward

// example-begin training_backward
static void backward(Layer& L, cudaStream_t st) {
  /* dy to the rows x arrived in (no route update: the forward's route) */
  EX_CS(epf_ht_combine_backward(&L.route, L.team, &L.plan, &L.bwd, EPF_HT_BOTH, st));
  if (L.c.layout == EPF_LAYOUT_RANK_MAJOR) EX_CS(epf_ht_expand(&L.route, L.team, &L.plan, &L.bwd, st));
  /* the experts' backward */
  row_weights_kernel<<<rows_grid(L), 128, 0, st>>>(L.route, L.plan, L.window, L.expert_rows, L.rw);
  experts_backward_kernel<<<rows_grid(L), 128, (size_t)L.c.I * 8, st>>>(
      L.route, L.plan, L.window, L.view, L.expert_rows, L.c.I, L.w1, L.w3, L.w2, L.saved_x, L.out, L.rw, L.dxr, L.wg,
      L.da, L.db, L.hr);
  weight_grads_kernel<<<dim3(64, (unsigned)L.c.E), 256, 0, st>>>(L.route, L.plan, L.window, L.view, L.expert_rows, L.c.I,
                                                                 L.saved_x, L.rw, L.da, L.db, L.hr, L.dw1, L.dw3, L.dw2);
  EX_CK(cudaGetLastError());
  /* dx rows back to the tokens (unit weights), the router-weight gradients with them */
  EX_CS(epf_ht_dispatch_backward(&L.route, L.team, &L.plan, &L.bwd, st));
}
// example-end training_backward

template <typename P>
static std::vector<P> download(const P* d, size_t n) {
  std::vector<P> v(n);
  EX_CK(cudaMemcpy(v.data(), d, n * sizeof(P), cudaMemcpyDeviceToHost));
  return v;
}

/* one step with every output poisoned first; returns the results (host copies) */
static Result step(Layer& L, cudaStream_t st) {
  const Case& c = L.c;
  const size_t rows = (size_t)c.R * L.expert_rows, tok = (size_t)c.R * c.Tmax;
  const size_t nw = (size_t)c.E * c.H * c.I;
  struct {
    void* p;
    size_t bytes;
  } poison[] = {{L.out, rows * c.H * 2}, {L.dxr, rows * c.H * 2}, {L.rw, rows * 4}, {L.wg, rows * 4}, {L.y, tok * c.H * 2},
                {L.dx, tok * c.H * 2}, {L.dtw, tok * c.K * 4}, {L.dw1, nw * 4}, {L.dw3, nw * 4}, {L.dw2, nw * 4}};
  for (auto& p : poison) EX_CK(cudaMemsetAsync(p.p, 0xA7, p.bytes, st));
  forward(L, st);
  backward(L, st);
  EX_CK(cudaStreamSynchronize(st));
  Result r;
  r.y = download(L.y, tok * c.H);
  r.dx = download(L.dx, tok * c.H);
  r.dtw = download(L.dtw, tok * c.K);
  r.dw1 = download(L.dw1, nw);
  r.dw3 = download(L.dw3, nw);
  r.dw2 = download(L.dw2, nw);
  r.out = download(L.out, rows * c.H);
  r.dxr = download(L.dxr, rows * c.H);
  r.rw = download(L.rw, rows);
  r.wg = download(L.wg, rows);
  return r;
}

/* ============================================================================================ */
/* The CPU reference: the same math, the documented epfuse orders                                 */
/* ============================================================================================ */

static Result reference(const Model& m, const Place& pl, int64_t expert_rows) {
  const Case& c = m.c;
  const int R = c.R, Tm = c.Tmax, H = c.H, I = c.I, E = c.E, K = c.K, EL = E / R;
  Result r;
  const size_t rows = (size_t)R * expert_rows;
  r.out.assign(rows * H, 0);
  r.dxr.assign(rows * H, 0);
  r.rw.assign(rows, 0.f);
  r.wg.assign(rows, 0.f);
  r.dw1.assign((size_t)E * H * I, 0.f);
  r.dw3.assign((size_t)E * H * I, 0.f);
  r.dw2.assign((size_t)E * I * H, 0.f);
  r.y.assign((size_t)R * Tm * H, 0);
  r.dx.assign((size_t)R * Tm * H, 0);
  r.dtw.assign((size_t)R * Tm * K, 0.f);
  std::vector<float> hv(I), da(I), db(I);
  /* the expert stage, row by row; the weight gradients summed in row order */
  for (int e = 0; e < E; ++e) {
    const int d = e / EL;
    const uint16_t *W1 = m.w1.data() + (size_t)e * H * I, *W3 = m.w3.data() + (size_t)e * H * I,
                   *W2 = m.w2.data() + (size_t)e * I * H;
    for (size_t n = 0; n < pl.rows[(size_t)e].size(); ++n) {
      const int s = pl.rows[(size_t)e][n].first, t = pl.rows[(size_t)e][n].second;
      const size_t row = (size_t)d * expert_rows + pl.begin[(size_t)e] + n, st = (size_t)s * Tm + t;
      const uint16_t *x = m.x.data() + st * H, *dy = m.dy.data() + st * H;
      const int32_t* ids = m.topk.data() + st * K;
      uint16_t* out = r.out.data() + row * H;
      float a, b, w_row = 0.f;
      for (int k = 0; k < K; ++k)
        if (ids[k] == e) w_row += m.w[st * K + k]; /* the combine weight: ascending k, from 0 */
      r.rw[row] = w_row;
      for (int i = 0; i < I; ++i) {
        ex06_gate_up(x, W1, W3, H, I, i, &a, &b);
        hv[i] = ex06_swiglu(a, b);
      }
      for (int j = 0; j < H; ++j) out[j] = ex06_bf16(ex06_down(hv.data(), W2, I, H, j));
      r.wg[row] = ex06_wgrad(dy, out, H);
      for (int i = 0; i < I; ++i) {
        ex06_gate_up(x, W1, W3, H, I, i, &a, &b);
        ex06_swiglu_backward(a, b, ex06_dh(dy, w_row, W2, H, i), &da[i], &db[i]);
      }
      for (int j = 0; j < H; ++j) r.dxr[row * H + j] = ex06_bf16(ex06_dx(da.data(), db.data(), W1, W3, I, j));
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < I; ++i) {
          const float xv = ex06_f(x[h]);
          r.dw1[((size_t)e * H + h) * I + i] = fmaf(xv, da[i], r.dw1[((size_t)e * H + h) * I + i]);
          r.dw3[((size_t)e * H + h) * I + i] = fmaf(xv, db[i], r.dw3[((size_t)e * H + h) * I + i]);
        }
      for (int i = 0; i < I; ++i)
        for (int j = 0; j < H; ++j)
          r.dw2[((size_t)e * I + i) * H + j] = fmaf(hv[i], ex06_dout(w_row, dy[j]), r.dw2[((size_t)e * I + i) * H + j]);
    }
  }
  /* the tokens: combine (forward) and the backward of dispatch, in epfuse's documented orders */
  std::vector<float> acc(H), dacc(H), part(H), dpart(H);
  for (int s = 0; s < R; ++s)
    for (int t = 0; t < m.T[s]; ++t) {
      const size_t st = (size_t)s * Tm + t;
      const int32_t* ids = m.topk.data() + st * K;
      const float* w = m.w.data() + st * K;
      auto out_of = [&](int k) { return r.out.data() + ((size_t)(ids[k] / EL) * expert_rows + pl.row_of[st * K + k]) * H; };
      auto dxr_of = [&](int k) { return r.dxr.data() + ((size_t)(ids[k] / EL) * expert_rows + pl.row_of[st * K + k]) * H; };
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(dacc.begin(), dacc.end(), 0.f);
      if (c.layout == EPF_LAYOUT_EXPERT_MAJOR) {
        /* y: fma(w_k, out, acc) over every valid k ascending (a repeat: its first occurrence's row);
         * dx: fma(1, dx_row, acc) over the first occurrences ascending */
        for (int k = 0; k < K; ++k) {
          if (ids[k] < 0) continue;
          const uint16_t *o = out_of(k), *g = dxr_of(k);
          for (int h = 0; h < H; ++h) acc[h] = fmaf(w[k], ex06_f(o[h]), acc[h]);
          if (first_k(ids, k) == k)
            for (int h = 0; h < H; ++h) dacc[h] = fmaf(1.0f, ex06_f(g[h]), dacc[h]);
        }
      } else {
        /* per destination rank, in the order the token first names it: a partial in k order,
         * rounded to BF16, then fma(1, partial, acc) */
        int order[32], nd = 0;
        for (int k = 0; k < K; ++k) {
          if (ids[k] < 0) continue;
          bool seen = false;
          for (int j = 0; j < nd; ++j) seen |= order[j] == ids[k] / EL;
          if (!seen) order[nd++] = ids[k] / EL;
        }
        for (int j = 0; j < nd; ++j) {
          std::fill(part.begin(), part.end(), 0.f);
          std::fill(dpart.begin(), dpart.end(), 0.f);
          for (int k = 0; k < K; ++k) {
            if (ids[k] < 0 || ids[k] / EL != order[j]) continue;
            const uint16_t *o = out_of(k), *g = dxr_of(k);
            for (int h = 0; h < H; ++h) part[h] = fmaf(w[k], ex06_f(o[h]), part[h]);
            if (first_k(ids, k) == k)
              for (int h = 0; h < H; ++h) dpart[h] = fmaf(1.0f, ex06_f(g[h]), dpart[h]);
          }
          for (int h = 0; h < H; ++h) {
            acc[h] = fmaf(1.0f, ex06_f(ex06_bf16(part[h])), acc[h]);
            dacc[h] = fmaf(1.0f, ex06_f(ex06_bf16(dpart[h])), dacc[h]);
          }
        }
      }
      for (int h = 0; h < H; ++h) {
        r.y[st * H + h] = ex06_bf16(acc[h]);
        r.dx[st * H + h] = ex06_bf16(dacc[h]);
      }
      /* d topk_weights: the d w of the row k reads; 0 for -1 */
      for (int k = 0; k < K; ++k)
        r.dtw[st * K + k] = ids[k] < 0 ? 0.f : r.wg[(size_t)(ids[k] / EL) * expert_rows + pl.row_of[st * K + k]];
    }
  return r;
}

/* ============================================================================================ */
/* Checks                                                                                        */
/* ============================================================================================ */

/* bit-exact comparison of n elements of `elem` bytes, over the positions `take` selects; prints the
 * first differences with `where` */
template <typename P, typename Sel, typename Where>
static bool same_bits(const char* what, const std::vector<P>& got, const std::vector<P>& want, Sel take, Where where) {
  long long bad = 0, n = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!take(i)) continue;
    ++n;
    if (memcmp(&got[i], &want[i], sizeof(P)) != 0 && bad++ < 3) {
      const double g = sizeof(P) == 2 ? ex06_f((uint16_t)got[i]) : (double)got[i];
      const double w = sizeof(P) == 2 ? ex06_f((uint16_t)want[i]) : (double)want[i];
      fprintf(stderr, "    %s %s: got %.9g, want %.9g\n", what, where(i).c_str(), g, w);
    }
  }
  printf("  %-34s %lld values %s\n", what, n, bad ? "DIFFER" : "bit-exact");
  if (bad) fprintf(stderr, "    %s: %lld of %lld values differ\n", what, bad, n);
  return bad == 0;
}

/* the route's segments against the model, then every result bit for bit against the reference */
static bool check_exact(const Layer& L, const Model& m, const Place& pl, const Result& got, const Result& want) {
  const Case& c = m.c;
  const int R = c.R, Tm = c.Tmax, H = c.H, I = c.I, K = c.K, EL = c.E / c.R;
  const int64_t ER = L.expert_rows;
  bool ok = true;
  /* 1. which rows the expert stage sees: the route's RECV_SEGMENT of every rank */
  std::vector<epf_route_segment_t> seg((size_t)R * EL);
  EX_CK(cudaMemcpy2D(seg.data(), sizeof(epf_route_segment_t) * EL,
                     (const char*)L.route.base + L.route.layout.array[EPF_ROUTE_RECV_SEGMENT].offset,
                     L.route.layout.total_bytes, sizeof(epf_route_segment_t) * EL, R, cudaMemcpyDeviceToHost));
  for (int e = 0; e < c.E && ok; ++e)
    if (seg[(size_t)e].begin != pl.begin[(size_t)e] || seg[(size_t)e].count != (int32_t)pl.rows[(size_t)e].size()) {
      fprintf(stderr, "    rank %d expert %d: route segment {%d, %d}, model {%lld, %zu}\n", e / EL, e % EL, seg[(size_t)e].begin,
              seg[(size_t)e].count, (long long)pl.begin[(size_t)e], pl.rows[(size_t)e].size());
      ok = false;
    }
  printf("  %-34s %s\n", "segments of every rank", ok ? "equal the placement model" : "DIFFER");
  /* 2. per expert row (the rows the model places), then per token */
  std::vector<char> is_row((size_t)R * ER, 0);
  for (int e = 0; e < c.E; ++e)
    for (size_t n = 0; n < pl.rows[(size_t)e].size(); ++n) is_row[(size_t)(e / EL) * ER + pl.begin[(size_t)e] + n] = 1;
  auto row_at = [&](size_t i) {
    const size_t row = i, d = row / (size_t)ER;
    const int64_t r = (int64_t)(row % (size_t)ER);
    for (int le = 0; le < EL; ++le) {
      const size_t e = d * EL + le;
      if (r >= pl.begin[e] && r < pl.begin[e] + (int64_t)pl.rows[e].size()) {
        const auto& st = pl.rows[e][(size_t)(r - pl.begin[e])];
        char b[96];
        snprintf(b, sizeof b, "at rank %zu row %lld (expert %zu, source %d token %d)", d, (long long)r, e, st.first, st.second);
        return std::string(b);
      }
    }
    return std::string("?");
  };
  auto tok_valid = [&](size_t st) { return (int)(st % (size_t)Tm) < m.T[st / (size_t)Tm]; };
  auto tok_at = [&](size_t st, const char* what, size_t j) {
    char b[96];
    snprintf(b, sizeof b, "at rank %zu token %zu %s %zu", st / (size_t)Tm, st % (size_t)Tm, what, j);
    return std::string(b);
  };
  const size_t Hs = (size_t)H, Ks = (size_t)K, HI = (size_t)H * I;
  ok = same_bits("expert outputs (BF16 rows)", got.out, want.out, [&](size_t i) { return is_row[i / Hs] != 0; },
                 [&](size_t i) { return row_at(i / Hs) + " h " + std::to_string(i % Hs); }) && ok;
  ok = same_bits("row combine weights", got.rw, want.rw, [&](size_t i) { return is_row[i] != 0; },
                 [&](size_t i) { return row_at(i); }) && ok;
  ok = same_bits("row router-weight gradients", got.wg, want.wg, [&](size_t i) { return is_row[i] != 0; },
                 [&](size_t i) { return row_at(i); }) && ok;
  ok = same_bits("row input gradients (BF16 rows)", got.dxr, want.dxr, [&](size_t i) { return is_row[i / Hs] != 0; },
                 [&](size_t i) { return row_at(i / Hs) + " h " + std::to_string(i % Hs); }) && ok;
  ok = same_bits("y (combine)", got.y, want.y, [&](size_t i) { return tok_valid(i / Hs); },
                 [&](size_t i) { return tok_at(i / Hs, "h", i % Hs); }) && ok;
  ok = same_bits("dx (backward of dispatch)", got.dx, want.dx, [&](size_t i) { return tok_valid(i / Hs); },
                 [&](size_t i) { return tok_at(i / Hs, "h", i % Hs); }) && ok;
  ok = same_bits("d topk_weights", got.dtw, want.dtw, [&](size_t i) { return tok_valid(i / Ks); },
                 [&](size_t i) { return tok_at(i / Ks, "k", i % Ks); }) && ok;
  auto all = [](size_t) { return true; };
  auto wat = [&](size_t i) { return "of expert " + std::to_string(i / HI) + " element " + std::to_string(i % HI); };
  ok = same_bits("dW1", got.dw1, want.dw1, all, wat) && ok;
  ok = same_bits("dW3", got.dw3, want.dw3, all, wat) && ok;
  ok = same_bits("dW2", got.dw2, want.dw2, all, wat) && ok;
  return ok;
}

/* the exact layer in double: L = sum over valid tokens of dy . y(x, w, W1, W3, W2); y into *y if given */
struct Params {
  std::vector<double> x, w, w1, w3, w2;
};
static double loss_double(const Model& m, const Params& p, std::vector<double>* y) {
  const Case& c = m.c;
  const int Tm = c.Tmax, H = c.H, I = c.I, K = c.K;
  std::vector<double> hv(I), yt(H);
  double L = 0.0;
  for (int s = 0; s < c.R; ++s)
    for (int t = 0; t < m.T[s]; ++t) {
      const size_t st = (size_t)s * Tm + t;
      const double* x = p.x.data() + st * H;
      std::fill(yt.begin(), yt.end(), 0.0);
      for (int k = 0; k < K; ++k) {
        const int e = m.topk[st * K + k];
        if (e < 0) continue;
        const double *W1 = p.w1.data() + (size_t)e * H * I, *W3 = p.w3.data() + (size_t)e * H * I,
                     *W2 = p.w2.data() + (size_t)e * I * H;
        for (int i = 0; i < I; ++i) {
          double a = 0, b = 0;
          for (int h = 0; h < H; ++h) a += x[h] * W1[(size_t)h * I + i], b += x[h] * W3[(size_t)h * I + i];
          hv[i] = a / (1.0 + exp(-a)) * b;
        }
        const double wk = p.w[st * K + k];
        for (int j = 0; j < H; ++j) {
          double o = 0;
          for (int i = 0; i < I; ++i) o += hv[i] * W2[(size_t)i * H + j];
          yt[j] += wk * o;
        }
      }
      for (int j = 0; j < H; ++j) {
        L += ex06_f(m.dy[st * H + j]) * yt[j];
        if (y) (*y)[st * H + j] = yt[j];
      }
    }
  return L;
}

/* the gradient check (README.md "Accuracy"): y against the exact layer, normwise; then for each
 * parameter group a central difference of L along a random direction v against sum(v * gradient)
 * of epfuse, relative to sqrt(sum (v * gradient)^2) — within 4x the group's normwise limit */
static bool check_gradients(const Model& m, const Result& g, uint64_t seed) {
  const Case& c = m.c;
  const int Tm = c.Tmax, H = c.H, K = c.K;
  const double ub = 1.0 / 256.0; /* BF16 unit roundoff: 8 significant bits, |bf16(v) - v| <= 2^-8 |v| */
  Params p;
  for (auto v : m.x) p.x.push_back(ex06_f(v));
  for (auto v : m.w) p.w.push_back(v);
  for (auto v : m.w1) p.w1.push_back(ex06_f(v));
  for (auto v : m.w3) p.w3.push_back(ex06_f(v));
  for (auto v : m.w2) p.w2.push_back(ex06_f(v));
  bool ok = true;
  {
    std::vector<double> y(m.x.size(), 0.0);
    loss_double(m, p, &y);
    double e2 = 0, r2 = 0;
    for (size_t st = 0; st < (size_t)c.R * Tm; ++st)
      if ((int)(st % Tm) < m.T[st / Tm])
        for (int h = 0; h < H; ++h) {
          const double d = ex06_f(g.y[st * H + h]) - y[st * H + h];
          e2 += d * d, r2 += y[st * H + h] * y[st * H + h];
        }
    const double nrm = sqrt(e2 / std::max(r2, 1e-300)), lim = 2 * ub;
    printf("  %-34s normwise %.3e (limit %.3e)%s\n", "y vs the exact layer", nrm, lim, nrm <= lim ? "" : "  FAILED");
    ok = nrm <= lim && ok;
  }
  struct Group {
    const char* name;
    std::vector<double>* theta;
    std::vector<double> grad;
    double limit;
  } groups[5] = {{"x", &p.x, {}, 2 * ub}, {"topk_weights", &p.w, {}, 2 * ub}, {"W1", &p.w1, {}, 0x1p-14},
                 {"W3", &p.w3, {}, 0x1p-14}, {"W2", &p.w2, {}, 0x1p-14}};
  for (size_t i = 0; i < g.dx.size(); ++i) /* only the tokens of the layer: rows t >= T are not outputs */
    groups[0].grad.push_back((int)(i / H % Tm) < m.T[i / H / Tm] ? ex06_f(g.dx[i]) : 0.0);
  for (size_t i = 0; i < g.dtw.size(); ++i) groups[1].grad.push_back((int)(i / K % Tm) < m.T[i / K / Tm] ? g.dtw[i] : 0.0);
  groups[2].grad.assign(g.dw1.begin(), g.dw1.end());
  groups[3].grad.assign(g.dw3.begin(), g.dw3.end());
  groups[4].grad.assign(g.dw2.begin(), g.dw2.end());
  uint64_t s = seed ^ 0x3c6ef372fe94f82bull;
  for (auto& G : groups) {
    std::vector<double>& th = *G.theta;
    const std::vector<double> saved = th;
    std::vector<double> v(th.size());
    double amax = 0, dir = 0, scale = 0;
    for (size_t i = 0; i < th.size(); ++i) {
      v[i] = ex06_uniform(&s);
      amax = std::max(amax, fabs(th[i]));
      dir += v[i] * G.grad[i];
      scale += v[i] * v[i] * G.grad[i] * G.grad[i];
    }
    const double eps = 1e-4 * amax;
    for (size_t i = 0; i < th.size(); ++i) th[i] = saved[i] + eps * v[i];
    const double lp = loss_double(m, p, NULL);
    for (size_t i = 0; i < th.size(); ++i) th[i] = saved[i] - eps * v[i];
    const double lm = loss_double(m, p, NULL);
    th = saved;
    const double fd = (lp - lm) / (2 * eps), rel = fabs(fd - dir) / std::max(sqrt(scale), 1e-300);
    const bool good = rel <= 4 * G.limit;
    printf("  d/d %-30s finite difference %.9e, epfuse %.9e: %.3e (limit %.3e)%s\n", G.name, fd, dir, rel, 4 * G.limit,
           good ? "" : "  FAILED");
    ok = good && ok;
  }
  return ok;
}

static bool record_clean(const Layer& L) {
  epf_error_record_t rec;
  epf_error_read(L.rec_h, &rec);
  if (rec.status != 0 || rec.recv_overflow != 0 || rec.dropped_routes != 0) {
    fprintf(stderr, "    error record: %s, peer %d, recv_overflow %u, dropped routes %u\n", epf_status_name((epf_status_t)rec.status),
            rec.peer, rec.recv_overflow, rec.dropped_routes);
    return false;
  }
  return true;
}

/* ============================================================================================ */
/* --dump: inputs and epfuse's results for scripts/moe_training_torch.py                          */
/* ============================================================================================ */

template <typename P>
static bool write_rows(const std::string& path, const Model& m, const std::vector<P>& v, size_t width) {
  /* the valid tokens only, rank by rank: [N][width] with N = sum of T */
  FILE* f = fopen(path.c_str(), "wb");
  bool ok = f != NULL;
  for (int s = 0; ok && s < m.c.R; ++s)
    ok = fwrite(v.data() + (size_t)s * m.c.Tmax * width, sizeof(P), (size_t)m.T[s] * width, f) == (size_t)m.T[s] * width;
  if (f && fclose(f) != 0) ok = false;
  if (!ok) fprintf(stderr, "--dump: cannot write %s\n", path.c_str());
  return ok;
}
template <typename P>
static bool write_all(const std::string& path, const std::vector<P>& v) {
  FILE* f = fopen(path.c_str(), "wb");
  bool ok = f != NULL && fwrite(v.data(), sizeof(P), v.size(), f) == v.size();
  if (f && fclose(f) != 0) ok = false;
  if (!ok) fprintf(stderr, "--dump: cannot write %s\n", path.c_str());
  return ok;
}

static bool dump(const std::string& dir0, const Model& m, const Result& r, uint64_t seed) {
  const Case& c = m.c;
  const std::string dir = dir0 + "/" + c.name;
  mkdir(dir0.c_str(), 0755);
  mkdir(dir.c_str(), 0755);
  FILE* f = fopen((dir + "/meta.txt").c_str(), "w");
  if (f == NULL) {
    fprintf(stderr, "--dump: cannot write %s/meta.txt\n", dir.c_str());
    return false;
  }
  int N = 0;
  std::string tl;
  for (int s = 0; s < c.R; ++s) N += m.T[s], tl += (s ? "," : "") + std::to_string(m.T[s]);
  fprintf(f, "R=%d\nN=%d\nH=%d\nI=%d\nE=%d\nK=%d\nrank_major=%d\npush=%d\nseed=%llu\ntokens=%s\n", c.R, N, c.H, c.I, c.E, c.K,
          c.layout == EPF_LAYOUT_RANK_MAJOR ? 1 : 0, c.push, (unsigned long long)seed, tl.c_str());
  fclose(f);
  const size_t H = (size_t)c.H, K = (size_t)c.K;
  return write_rows(dir + "/x.bf16", m, m.x, H) && write_rows(dir + "/topk.i32", m, m.topk, K) &&
         write_rows(dir + "/weights.f32", m, m.w, K) && write_rows(dir + "/dy.bf16", m, m.dy, H) &&
         write_all(dir + "/w1.bf16", m.w1) && write_all(dir + "/w3.bf16", m.w3) && write_all(dir + "/w2.bf16", m.w2) &&
         write_rows(dir + "/y.bf16", m, r.y, H) && write_rows(dir + "/dx.bf16", m, r.dx, H) &&
         write_rows(dir + "/dtopk_weights.f32", m, r.dtw, K) && write_all(dir + "/dw1.f32", r.dw1) &&
         write_all(dir + "/dw3.f32", r.dw3) && write_all(dir + "/dw2.f32", r.dw2);
}

/* ============================================================================================ */

static bool run_case(const Case& c, const Opts& o, cudaStream_t st) {
  const Model m = make_model(c, o.seed);
  const Place pl = place(m);
  std::string tl;
  for (int s = 0; s < c.R; ++s) tl += (s ? "," : "") + std::to_string(m.T[s]);
  printf("[%s] %s, %s combine: R=%d virtual ranks, T per rank {%s}, H=%d, I=%d, E=%d, top-%d\n", c.name.c_str(),
         c.layout == EPF_LAYOUT_EXPERT_MAJOR ? "EXPERT_MAJOR" : "RANK_MAJOR", c.push ? "push" : "pull", c.R, tl.c_str(), c.H,
         c.I, c.E, c.K);
  Layer L;
  layer_init(L, m, pl);
  const Result want = reference(m, pl, L.expert_rows);
  bool ok = true;
  Result first;
  for (int i = 0; i < o.steps; ++i) {
    Result got = step(L, st);
    printf(" step %d (route epoch advances every step):\n", i + 1);
    const bool clean = record_clean(L);
    printf("  %-34s %s\n", "error record", clean ? "clean" : "NOT CLEAN");
    ok = clean && ok;
    ok = check_exact(L, m, pl, got, want) && ok;
    if (i == 0) first = std::move(got);
  }
  ok = check_gradients(m, first, o.seed) && ok;
  if (!o.dump.empty()) {
    const bool d = dump(o.dump, m, first, o.seed);
    if (d) printf("  dumped to %s/%s\n", o.dump.c_str(), c.name.c_str());
    ok = d && ok;
  }
  layer_free(L);
  printf("[%s] %s\n\n", c.name.c_str(), ok ? "OK" : "FAILED");
  return ok;
}

/* --cpu-reference: no GPU. The CPU reference of each layout (the transports give the same bits)
 * stands in for epfuse's results: the gradient check of the expert math, and --dump of what a
 * correct GPU run produces (so scripts/moe_training_torch.py can be tried without a GPU). */
static bool run_cpu(const Opts& o) {
  bool ok = true;
  for (const Case& c : cases(o)) {
    if (c.push && o.pull) continue; /* one per layout */
    const Model m = make_model(c, o.seed);
    const Place pl = place(m);
    int64_t expert_rows;
    (void)plan_of(c, pl, &expert_rows);
    printf("[%s] CPU reference only (no GPU): R=%d, H=%d, I=%d, E=%d, top-%d\n", c.name.c_str(), c.R, c.H, c.I, c.E, c.K);
    const Result r = reference(m, pl, expert_rows);
    bool good = check_gradients(m, r, o.seed);
    if (!o.dump.empty()) {
      const bool d = dump(o.dump, m, r, o.seed);
      if (d) printf("  dumped to %s/%s\n", o.dump.c_str(), c.name.c_str());
      good = d && good;
    }
    printf("[%s] %s\n\n", c.name.c_str(), good ? "OK" : "FAILED");
    ok = good && ok;
  }
  return ok;
}

int main(int argc, char** argv) {
  const Opts o = parse(argc, argv);
  const std::vector<Case> cs = cases(o);
  if (o.cpu) {
    printf("ex06_moe_training --cpu-reference: seed %llu\n\n", (unsigned long long)o.seed);
    const bool ok = run_cpu(o);
    printf(ok ? "ex06_moe_training: OK\n" : "ex06_moe_training: FAILED\n");
    return ok ? 0 : 1;
  }
  ex_gpu_or_exit(1, o.ctest);
  printf("ex06_moe_training: seed %llu (--seed %llu repeats this run)\n\n", (unsigned long long)o.seed,
         (unsigned long long)o.seed);
  cudaStream_t st;
  EX_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  bool ok = true;
  for (const Case& c : cs) ok = run_case(c, o, st) && ok;
  EX_CK(cudaStreamDestroy(st));
  if (!o.dump.empty() && ok) printf("next: python3 scripts/moe_training_torch.py --dump %s\n", o.dump.c_str());
  printf(ok ? "ex06_moe_training: OK\n" : "ex06_moe_training: FAILED\n");
  return ok ? 0 : 1;
}
