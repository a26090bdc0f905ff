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
 *             experts_backward_kernel          d out = w_row * dy; da, db and d w = dot(dy, out_row)
 *             weight_grads_kernel              dW1, dW3, dW2 of every expert (FP32, row order)
 *             experts_dx_kernel                dx_row (BF16): --dx-out window (the default; EXPERT_MAJOR)
 *                                              over the row's receive row, where the backward of
 *                                              dispatch pulls it in place (expert_out = NULL);
 *                                              buffer: into a separate dxr buffer (RANK_MAJOR always)
 *             epf_ht_dispatch_backward         dx[t] = sum of the token's dx rows (unit weights),
 *                                              d topk_weights[t,k] = the d w of the row k reads
 *
 * Checks (exit 1 on any failure; the seed is printed, --seed repeats a run):
 *   1. the route's segments equal a CPU model of the placement (which row holds which token);
 *   2. bit-exact against the CPU reference, which runs the SAME expert math (the ex06_* functions
 *      of expert_math.h are compiled for both sides; this target is built with --fmad=false so that no
 *      multiply-add is contracted differently): every expert output row, row weight, router-weight
 *      gradient and dx row, then y, dx, d topk_weights and dW1 / dW3 / dW2;
 *   3. the gradient check: the exact layer in double; y within 2 u_bf16 normwise, and for each of
 *      x, topk_weights, W1, W3, W2 a central finite difference of L = sum(dy * y) along a random
 *      direction against epfuse's gradient (README.md "Accuracy");
 *   4. the error record is clean; --steps N runs the whole step N times on the same route buffers
 *      (epochs advance) and every step must give the same bits;
 *   5. --dx-out both (EXPERT_MAJOR): the case runs with the dx rows in the window and in a buffer,
 *      and every result of the two must be the same bits.
 *
 *   ex06_moe_training                  both layouts x both combine transports, small shapes
 *   ex06_moe_training --ctest          the same (CTest; exit 77 without a GPU)
 *   ex06_moe_training --dump DIR       also writes DIR/<case>/ for scripts/moe_training_torch.py
 *   ex06_moe_training --cpu-reference  no GPU: the CPU reference alone (its gradient check, --dump)
 *   options: --layout em|rm|both --combine pull|push|both --R --T (max tokens per rank) --H --I
 *            --E --K --steps N --seed N --dx-out window|buffer|both (where the dx rows go; default window)
 *
 * Files (one translation unit): expert_math.h (the math of both sides), model.h (options, cases,
 * inputs, the placement model), experts.cuh (the expert stage kernels), layer.cuh (the device side
 * of a case and one step: the library's launches), reference.h (the CPU reference and the checks),
 * main.cu (the runs, --dump).
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
#include "expert_math.h" /* the expert math, host and device */
#include "model.h"       /* options, cases, inputs, the placement model, Result */
#include "experts.cuh"   /* the expert stage on the GPU */
#include "layer.cuh"     /* the device side of a case, one training step */
#include "reference.h"   /* the CPU reference, the bit-exact checks, the gradient check */

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

/* one case with the dx rows in the window (dx_window) or in a buffer: its first step's results */
static bool run_case_dx(const Case& c, const Opts& o, const Model& m, const Place& pl, bool dx_window, cudaStream_t st,
                        Result* first) {
  Layer L;
  layer_init(L, m, pl, dx_window);
  printf(" dx rows: %s\n", dx_window ? "in the window, over the receive rows (--dx-out window: the backward of dispatch "
                                       "reads them in place, expert_out = NULL)"
                         : c.layout == EPF_LAYOUT_EXPERT_MAJOR ? "in a separate buffer (--dx-out buffer: expert_out = dxr)"
                                                               : "in a separate buffer, view order (RANK_MAJOR: the backward "
                                                                 "of dispatch pre-reduces them; --dx-out window is EXPERT_MAJOR only)");
  const Result want = reference(m, pl, L.expert_rows);
  bool ok = true;
  for (int i = 0; i < o.steps; ++i) {
    Result got = step(L, st);
    printf(" step %d (route epoch advances every step):\n", i + 1);
    const bool clean = record_clean(L);
    printf("  %-34s %s\n", "error record", clean ? "clean" : "NOT CLEAN");
    ok = clean && ok;
    ok = check_exact(L, m, pl, got, want) && ok;
    if (i == 0) *first = std::move(got);
  }
  layer_free(L);
  return ok;
}

/* --dx-out both: every result of the two placements, bit for bit (the dx rows: the rows the
 * placement model places; the others are the window's bytes in one run, the poison in the other) */
static bool same_results(const Result& a, const Result& b, const Place& pl, const Case& c, int64_t expert_rows) {
  const int EL = c.E / c.R;
  bool ok = a.y == b.y && a.dx == b.dx && a.out == b.out && a.dxr.size() == b.dxr.size();
  for (int e = 0; e < c.E && ok; ++e) {
    const size_t r0 = (size_t)(e / EL) * expert_rows + pl.begin[(size_t)e], n = pl.rows[(size_t)e].size() * c.H;
    ok = n == 0 || memcmp(a.dxr.data() + r0 * c.H, b.dxr.data() + r0 * c.H, n * 2) == 0;
  }
  auto same_f = [](const std::vector<float>& u, const std::vector<float>& v) {
    return u.size() == v.size() && (u.empty() || memcmp(u.data(), v.data(), u.size() * sizeof(float)) == 0);
  };
  ok = ok && same_f(a.dtw, b.dtw) && same_f(a.dw1, b.dw1) && same_f(a.dw3, b.dw3) && same_f(a.dw2, b.dw2) &&
       same_f(a.rw, b.rw) && same_f(a.wg, b.wg);
  return ok;
}

static bool run_case(const Case& c, const Opts& o, cudaStream_t st) {
  const Model m = make_model(c, o.seed);
  const Place pl = place(m);
  std::string tl;
  for (int s = 0; s < c.R; ++s) tl += (s ? "," : "") + std::to_string(m.T[s]);
  printf("[%s] %s, %s combine: R=%d virtual ranks, T per rank {%s}, H=%d, I=%d, E=%d, top-%d\n", c.name.c_str(),
         c.layout == EPF_LAYOUT_EXPERT_MAJOR ? "EXPERT_MAJOR" : "RANK_MAJOR", c.push ? "push" : "pull", c.R, tl.c_str(), c.H,
         c.I, c.E, c.K);
  /* where the dx rows go: RANK_MAJOR always a buffer (the backward of dispatch pre-reduces them in
   * the view's order; epf_ht_dispatch_backward refuses expert_out = NULL there) */
  const bool em = c.layout == EPF_LAYOUT_EXPERT_MAJOR;
  const bool win = em && o.dx_window, buf = !em || o.dx_buffer;
  bool ok = true;
  Result first, other;
  int64_t expert_rows = 0;
  (void)plan_of(c, pl, &expert_rows);
  if (win) ok = run_case_dx(c, o, m, pl, true, st, &first) && ok;
  if (buf) ok = run_case_dx(c, o, m, pl, false, st, win ? &other : &first) && ok;
  if (win && buf) {
    const bool same = same_results(first, other, pl, c, expert_rows);
    printf("  %-34s %s\n", "dx rows in the window vs a buffer", same ? "every result bit-identical" : "RESULTS DIFFER");
    ok = same && ok;
  }
  ok = check_gradients(m, first, o.seed) && ok;
  if (!o.dump.empty()) {
    const bool d = dump(o.dump, m, first, o.seed);
    if (d) printf("  dumped to %s/%s\n", o.dump.c_str(), c.name.c_str());
    ok = d && ok;
  }
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
