/* reference.h — ex06_moe_training's checks: the CPU reference (the same expert math, the documented
 * epfuse orders), the bit-exact comparison of every result with it, and the gradient check against
 * the exact layer in double (central finite differences; README.md "Accuracy"). Part of the
 * example (one translation unit: main.cu includes it). */
#ifndef EX06_REFERENCE_H
#define EX06_REFERENCE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "epfuse/epfuse.cuh"
#include "expert_math.h"
#include "layer.cuh"
#include "model.h"

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

#endif /* EX06_REFERENCE_H */
