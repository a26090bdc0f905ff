/* model.h — ex06_moe_training's host side of the layer: the options and the cases (layout x combine
 * transport), the inputs of a case (Model: unequal tokens per rank, repeated experts, -1 ids, the
 * weights), the CPU model of the placement (which expert row holds which token), and what a step
 * produces (Result). Part of the example (one translation unit: main.cu includes it). */
#ifndef EX06_MODEL_H
#define EX06_MODEL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "epfuse/epfuse.cuh"
#include "ex_common.h"
#include "expert_math.h"

/* ============================================================================================ */
/* Options and inputs                                                                            */
/* ============================================================================================ */

struct Opts {
  int R = 0, T = 0, H = 0, I = 0, E = 0, K = 0, steps = 2; /* 0: the case's default */
  bool em = true, rm = true, pull = true, push = true, ctest = false, cpu = false;
  bool dx_window = true, dx_buffer = false; /* --dx-out window|buffer|both (EXPERT_MAJOR; RANK_MAJOR: buffer) */
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
                  "       [--H n] [--I n] [--E n] [--K n] [--steps n] [--seed n] [--dx-out window|buffer|both] [--dump DIR]\n"
                  "       [--ctest] [--cpu-reference]\n", why);
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
    } else if (a == "--dx-out") {
      const std::string v = next();
      o.dx_window = v == "window" || v == "both";
      o.dx_buffer = v == "buffer" || v == "both";
      if (!o.dx_window && !o.dx_buffer) usage_exit("--dx-out window|buffer|both");
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
/* What a step produces                                                                          */
/* ============================================================================================ */

/* what a step produces (host copies), in the layouts the CPU reference uses */
struct Result {
  std::vector<uint16_t> y, dx;          /* [R][Tmax][H] BF16 (rows t < T[r]) */
  std::vector<float> dtw;               /* [R][Tmax][K] d topk_weights */
  std::vector<float> dw1, dw3, dw2;     /* [E][H][I], [E][H][I], [E][I][H] */
  std::vector<uint16_t> out, dxr;       /* [R][expert_rows][H]: expert outputs, input gradients */
  std::vector<float> rw, wg;            /* [R][expert_rows]: row weights, router-weight gradients */
};

#endif /* EX06_MODEL_H */
