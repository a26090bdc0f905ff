/* reference.h — ex05_moe_layer_gemm's checks: the CPU reference of a token's layer output with its
 * element-wise error bound (README.md "Accuracy"), the placement after the dispatch against the
 * CPU model (bit-exact), the output of the checked tokens against the reference, and --dump. Part
 * of the example (one translation unit: main.cu includes it). */
#ifndef EX05_REFERENCE_H
#define EX05_REFERENCE_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "epfuse/epfuse.cuh"
#include "ex_common.h"
#include "layer.h"

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
 * MN-major layout). Rank d's slice is at window + d * stride. Pad rows are not looked at. name: the
 * path's tag in the messages. Returns true when everything matches. */
static bool check_placement(const Opts& o, const Model& m, const Placement& pl, const epf_plan_t& plan, const char* window,
                            uint64_t stride, const epf_route_segment_t* seg_h, bool fp8, const char* name) {
  const int R = o.R, H = o.H, EL = o.E / o.R, G = H / 128;
  std::vector<uint8_t> tok(plan.region[EPF_REGION_RECV_TOKENS].bytes), sc(plan.region[EPF_REGION_RECV_SCALES].bytes + 1);
  std::vector<uint8_t> q(H);
  std::vector<float> qs(G), buf(128);
  long long rows = 0;
  for (int d = 0; d < R; ++d) {
    const char* b = window + (uint64_t)d * stride;
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
            fprintf(stderr, "[%s] rank %d expert %d row %lld: not (source %d, token %d)'s row\n", name, d, le, (long long)r,
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
          fprintf(stderr, "[%s] rank %d expert %d row %lld: FP8 bytes differ from the CPU quantization\n", name, d, le, (long long)r);
          return false;
        }
        for (int gi = 0; gi < G; ++gi) {
          const uint64_t off = epf_recv_scale_offset(&plan, r, gi, w.begin, w.padded_count) - plan.region[EPF_REGION_RECV_SCALES].offset;
          float s;
          memcpy(&s, sc.data() + off, 4);
          if (!epf_recv_scale_seg_fits(&plan, r, w.begin, w.padded_count) || memcmp(&s, &qs[gi], 4) != 0) {
            fprintf(stderr, "[%s] rank %d expert %d row %lld group %d: GEMM-ready scale %g, want %g\n", name, d, le, (long long)r,
                    gi, (double)s, (double)qs[gi]);
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

/* the output of sampled tokens against the CPU reference and its bound; the normwise relative error.
 * name: the path's tag in the messages. */
static bool verify(const Opts& o, const Model& m, const std::vector<uint16_t>& out, bool fp8, const char* name) {
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
          fprintf(stderr, "[%s] token %d h %d: got %.6g, reference %.6g, |error| %.3g > bound %.3g\n", name, st, h, got, ref[h],
                  err, bound[h]);
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
         name, ntok, nrm, nrm_limit, worst, bad || !nrm_ok ? "  FAILED" : "");
  return bad == 0 && nrm_ok;
}

static bool write_file(const std::string& path, const void* p, size_t bytes) {
  FILE* f = fopen(path.c_str(), "wb");
  if (f == NULL || fwrite(p, 1, bytes, f) != bytes || fclose(f) != 0) {
    fprintf(stderr, "--dump: cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}


/* --dump DIR: the inputs, the weights and the outputs of both paths, for scripts/moe_layer_torch.py */
static bool dump(const Opts& o, const Model& m, const Dev& dv, const PathResult* pr) {
  const int R = o.R, T = o.T, H = o.H, I = o.I, E = o.E, K = o.K;
  const uint64_t ngu = (uint64_t)E * 2 * I * H, nd = (uint64_t)E * H * I;
  const std::string d = o.dump + "/";
  std::vector<uint16_t> wgu(ngu), wd(nd);
  EX_CK(cudaMemcpy(wgu.data(), dv.wgu, ngu * 2, cudaMemcpyDeviceToHost));
  EX_CK(cudaMemcpy(wd.data(), dv.wd, nd * 2, cudaMemcpyDeviceToHost));
  FILE* f = fopen((d + "meta.txt").c_str(), "w");
  if (f == NULL) {
    fprintf(stderr, "--dump: cannot write %smeta.txt (does the directory exist?)\n", d.c_str());
    return false;
  }
  fprintf(f, "R=%d\nT=%d\nH=%d\nI=%d\nE=%d\nK=%d\nalign=%d\nseed=%llu\nbf16=%d\nfp8=%d\n", R, T, H, I, E, K, o.align,
          (unsigned long long)o.seed, o.run_bf16 ? 1 : 0, o.run_fp8 ? 1 : 0);
  fclose(f);
  bool w = write_file(d + "x.bf16", m.x.data(), m.x.size() * 2) && write_file(d + "topk.i32", m.topk.data(), m.topk.size() * 4) &&
           write_file(d + "weights.f32", m.w.data(), m.w.size() * 4) && write_file(d + "w_gate_up.bf16", wgu.data(), ngu * 2) &&
           write_file(d + "w_down.bf16", wd.data(), nd * 2);
  if (o.run_bf16) w = w && write_file(d + "out_bf16.bf16", pr[0].out.data(), pr[0].out.size() * 2);
  if (o.run_fp8) w = w && write_file(d + "out_fp8.bf16", pr[1].out.data(), pr[1].out.size() * 2);
  if (!w) return false;
  printf("dumped inputs, weights and outputs to %s (scripts/moe_layer_torch.py --dump %s)\n", o.dump.c_str(), o.dump.c_str());
  return true;
}

#endif /* EX05_REFERENCE_H */
