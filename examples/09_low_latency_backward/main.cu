/* 09_low_latency_backward — the low-latency training direction of an 8-rank EP team on ONE GPU
 * (virtual ranks): an LL round (07_low_latency), then for the same routing the backward of the
 * combine and of the dispatch, dx of every token checked bit for bit against a CPU reference.
 *
 * Learning objectives
 *   - The backward reuses the forward's launch description, state and argument structs:
 *     epf_ll_combine_backward is a dispatch of dy (da.x = dy) whose rows carry their combine
 *     weights (each row's metadata weight: the sum of the token's weights over the k that read it)
 *     -> the experts' backward (dx rows, over the same fixed slots or the rank-major view) ->
 *     epf_ll_dispatch_backward, a combine with unit weights (ca.out = dx) in which a repeated
 *     expert adds nothing.
 *   - BF16 both ways, both layouts (--layout rm: a rank-major dispatch of dy expanded into the
 *     view, the experts' backward over the view, a unit-weight pre-reduce per (token, rank));
 *     epf_ll_backward_check refuses anything else before the GPU is touched.
 *   - The second round of the state: epoch 2, parity 0 (the checks read the round back).
 * Key concepts: docs/low-latency.md, "Training: the backward direction".
 * The HT training direction: 08_backward.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epfuse/epfuse.cuh"
#include "epfuse/ll/kernels.cuh"
#include "ex_ll.h"

static const char* usage =
    "[--ranks 8] [--tokens 128] [--hidden 7168] [--topk 8] [--experts 256] [--layout em|rm]\n"
    "          [--payload bf16] [--samples 512 | --verify-all] [--seed N] [--ctest]\n"
    "  The LL training direction (BF16) of an R-rank EP team as virtual ranks on one GPU: a forward\n"
    "  round (dispatch, experts, combine; its output checked on --samples tokens, all with\n"
    "  --verify-all), then epf_ll_combine_backward -> the experts' backward -> epf_ll_dispatch_backward\n"
    "  for the same routing; every row's combine weight and dx of every token checked bit for bit.\n"
    "  --ctest: exit 77 instead of 1 also when a GPU is there but unusable (a driver too old); with no\n"
    "           CUDA driver or no GPU at all the exit code is 77 either way (CTest reports \"Not Run\").\n";

/* run_ll_backward — after the forward round of run_ll (same routing, same launch and state):
 *   1. backward of the combine: epf_ll_combine_backward with x = dy (fresh BF16 [R][T][H]): the
 *      rows land in the forward's (local expert, source, slot); each row's metadata weight is its
 *      combine weight (the sum of the token's weights over the k that read the row);
 *   2. the experts' backward: dx_row = bf16(dy_row * f(le, rank)) (the examples' expert is
 *      y = bf16(x * f); a real layer would use the row's weight here), in place or FIXED;
 *   3. backward of the dispatch: epf_ll_dispatch_backward, unit weights, repeats contribute
 *      nothing: dx[t] = sum over the token's distinct experts, k order, FP32, BF16 out.
 *   Checks: counts, the round, every row's metadata weight, and dx of every token bit for bit. */
static int run_ll_backward(const ex_opts_t* o, const epf_plan_t* plan, const epf_ll_launch_t* L,
                           epf_ll_dispatch_args_t da, epf_ll_combine_args_t ca, const ex_inputs_t* in, char* window,
                           const int32_t* d_counts, const uint32_t* d_round, uint16_t* d_y,
                           const epf_error_record_t* rec_h, uint64_t* seed) {
  const int R = o->R, T = o->T, H = o->H, K = o->K, EL = o->E / R;
  const int64_t n = (int64_t)R * T;
  uint16_t* dy = (uint16_t*)malloc((size_t)n * H * 2);
  uint16_t* got = (uint16_t*)malloc((size_t)n * H * 2);
  float* acc = (float*)malloc((size_t)H * 4);
  void *d_dy, *d_dx;
  int bad = 0;
  epf_status_t st = epf_ll_backward_check(plan);
  if (st != EPF_OK) {
    fprintf(stderr, "LL backward: %s: %s (the training direction is BF16 both ways)\n", epf_status_name(st),
            epf_status_message(st));
    return 2;
  }
  for (int64_t i = 0; i < n * H; ++i) dy[i] = ex_bf16_rne((float)((int64_t)(ex_rand(seed) % 2001) - 1000) / 1000.0f);
  EX_CK(cudaMalloc(&d_dy, (size_t)n * H * 2));
  EX_CK(cudaMalloc(&d_dx, (size_t)n * H * 2));
  EX_CK(cudaMemcpy(d_dy, dy, (size_t)n * H * 2, cudaMemcpyHostToDevice));
  EX_CK(cudaMemset(d_dx, 0xA7, (size_t)n * H * 2)); /* poison */
  da.x = d_dy;                 /* backward of the combine: a dispatch of dy, same routing */
  EX_CS(epf_ll_combine_backward(L, &da, EPF_LL_BOTH, 0));
  if (plan->layout == EPF_LAYOUT_RANK_MAJOR) /* dx rows over the view of dy the receive half expanded */
    ex_ll_rm_experts_kernel<<<dim3(64, (unsigned)R), 256>>>(*plan, (const uint8_t*)da.packed_x,
                                                            (const uint8_t*)da.packed_scales, d_counts, d_y);
  else
    ex_ll_experts_kernel<<<dim3(64, (unsigned)R), 256>>>(*plan, window, d_round, d_counts, d_y); /* dx rows */
  EX_CK(cudaGetLastError());
  ca.out = d_dx;               /* backward of the dispatch: unit weights, repeats add nothing */
  ca.topk_weights = NULL;      /* not read */
  EX_CS(epf_ll_dispatch_backward(L, &ca, EPF_LL_BOTH, 0));
  EX_CK(cudaDeviceSynchronize());
  if (ex_record_check(rec_h)) return 1;
  /* the rows' metadata weights: the combine weight of each row (round 2: parity 0); rank-major
   * rows carry per-k entries with the forward's weights (the library's tests check them) */
  if (plan->layout == EPF_LAYOUT_EXPERT_MAJOR) {
    int32_t* counts = (int32_t*)malloc((size_t)R * EL * R * 4);
    uint32_t* rounds = (uint32_t*)malloc((size_t)R * 4);
    epf_recv_meta_em_t* meta = (epf_recv_meta_em_t*)malloc((size_t)plan->recv_capacity * sizeof(epf_recv_meta_em_t));
    EX_CK(cudaMemcpy(counts, d_counts, (size_t)R * EL * R * 4, cudaMemcpyDeviceToHost));
    EX_CK(cudaMemcpy(rounds, d_round, (size_t)R * 4, cudaMemcpyDeviceToHost));
    for (int d = 0; d < R && !bad; ++d) {
      const int64_t row0 = epf_ll_recv_row(plan, rounds[d], 0, 0, 0);
      if (rounds[d] != 2u) {
        fprintf(stderr, "MISMATCH backward round of rank %d: got %u want 2\n", d, rounds[d]);
        return 1;
      }
      EX_CK(cudaMemcpy(meta, window + (uint64_t)d * plan->total_bytes + epf_plan_recv_meta_offset(plan, row0),
                       (size_t)plan->recv_capacity * sizeof(epf_recv_meta_em_t), cudaMemcpyDeviceToHost));
      for (int le = 0; le < EL && !bad; ++le)
        for (int s = 0; s < R && !bad; ++s)
          for (int j = 0; j < counts[((int64_t)d * EL + le) * R + s]; ++j) {
            const epf_recv_meta_em_t* m = meta + epf_ll_fixed_row(plan, le, s, j);
            const int64_t tk = ((int64_t)s * T + m->src_token) * K;
            float cw = 0.0f; /* the sum of the token's weights over the k reading this row */
            for (int k = m->k; k < K; ++k)
              if (in->topk[tk + k] == in->topk[tk + m->k]) cw = cw + in->w[tk + k];
            if (memcmp(&cw, &m->weight, 4) != 0) {
              fprintf(stderr, "MISMATCH backward meta weight rank %d expert %d source %d slot %d: %g want %g\n", d,
                      le, s, j, (double)m->weight, (double)cw);
              bad = 1;
              break;
            }
          }
    }
    free(counts);
    free(rounds);
    free(meta);
  }
  /* dx of every token */
  EX_CK(cudaMemcpy(got, d_dx, (size_t)n * H * 2, cudaMemcpyDeviceToHost));
  for (int64_t t = 0; t < n && !bad; ++t) {
    const int32_t* topk = in->topk + t * K;
    for (int h = 0; h < H; ++h) acc[h] = 0.0f;
    if (plan->layout == EPF_LAYOUT_RANK_MAJOR) {
      /* per destination rank, in the order of its first occurrence in k: the BF16 partial of the
       * token's distinct experts there (unit weights), then acc = fma(1, partial, acc) */
      for (int k = 0; k < K; ++k) {
        int seen = 0;
        if (topk[k] < 0) continue;
        for (int j = 0; j < k; ++j) seen |= topk[j] >= 0 && topk[j] / EL == topk[k] / EL;
        if (seen) continue;
        for (int h = 0; h < H; ++h) {
          float p = 0.0f;
          for (int q = k; q < K; ++q) {
            int dup = 0;
            if (topk[q] < 0 || topk[q] / EL != topk[k] / EL) continue;
            for (int j = 0; j < q; ++j) dup |= topk[j] == topk[q];
            if (dup) continue;
            p = fmaf(1.0f, ex_bf16_f(ex_bf16_rne(ex_bf16_f(dy[t * H + h]) * ex_expert_factor(topk[q] % EL, topk[q] / EL))), p);
          }
          acc[h] = fmaf(1.0f, ex_bf16_f(ex_bf16_rne(p)), acc[h]);
        }
      }
    } else {
      for (int k = 0; k < K; ++k) {
        int dup = 0;
        for (int j = 0; j < k; ++j) dup |= topk[j] == topk[k];
        if (dup) continue;
        const float f = ex_expert_factor(topk[k] % EL, topk[k] / EL);
        for (int h = 0; h < H; ++h) acc[h] = fmaf(1.0f, ex_bf16_f(ex_bf16_rne(ex_bf16_f(dy[t * H + h]) * f)), acc[h]);
      }
    }
    for (int h = 0; h < H; ++h)
      if (got[t * H + h] != ex_bf16_rne(acc[h])) {
        fprintf(stderr, "MISMATCH backward dx rank %lld token %lld h %d: 0x%04x want 0x%04x\n", (long long)(t / T),
                (long long)(t % T), h, got[t * H + h], ex_bf16_rne(acc[h]));
        bad = 1;
        break;
      }
  }
  printf("backward (LL): combine backward (dy -> rows, combine weights) + dispatch backward (dx, unit weights) "
         "of %lld tokens: %s\n", (long long)n, bad ? "FAILED" : "OK (bit-exact)");
  EX_CK(cudaFree(d_dy));
  EX_CK(cudaFree(d_dx));
  free(dy);
  free(got);
  free(acc);
  return bad;
}

int main(int argc, char** argv) {
  ex_opts_t o;
  if (ex_opts_parse(argc, argv, EPF_MODE_LL, 0u, usage, &o)) return 2;
  epf_plan_t plan; /* refuse what the LL training direction cannot run before touching the GPU */
  epf_status_t st = ex_ll_plan_make(&o, &plan);
  if (st == EPF_OK) st = epf_ll_backward_check(&plan); /* BF16 both ways, both layouts */
  if (st != EPF_OK) {
    fprintf(stderr, "LL backward%s: %s: %s (the training direction is BF16 both ways)\n",
            o.layout == EPF_LAYOUT_RANK_MAJOR ? " --layout rm" : "", epf_status_name(st), epf_status_message(st));
    return 2;
  }
  ex_gpu_or_exit(1, o.ctest);
  const int R = o.R;
  const int rm = plan.layout == EPF_LAYOUT_RANK_MAJOR;
  uint64_t seed = o.seed;
  ex_inputs_t in;
  ex_make_inputs(&o, &seed, &in);

  /* ---- the forward round (07_low_latency spells it out; BF16: y in place and pulled, or the
   * rank-major view and its partials pulled) --------------------------------------------------- */
  char* window;
  const epf_team_t team = ex_ll_window_make(&plan, &window); /* ex_ll.h: zeroed signals, poisoned rows */
  ex_ll_bufs_t b; /* inputs, out, counts, round, [y: rank-major], [view], state, error record */
  ex_ll_bufs_make(&o, &in, &plan, rm, &b);
  epf_ll_launch_t L = epf_ll_launch_make(&plan, team, b.state, b.rec_d, /*virtual_ranks=*/1);
  EX_CS(epf_ll_state_reset(&L, 0));
  epf_ll_dispatch_args_t da;
  epf_ll_combine_args_t ca;
  ex_ll_args_make(&o, &b, ex_ll_y_layout(&plan), &da, &ca); /* IN_PLACE_PULL, or PACKED_PULL (rm) */
  EX_CS(epf_ll_dispatch(&L, &da, EPF_LL_BOTH, 0));
  if (!rm)
    ex_ll_experts_kernel<<<dim3(64, (unsigned)R), 256>>>(plan, window, b.round, b.counts, b.y);
  else
    ex_ll_rm_experts_kernel<<<dim3(64, (unsigned)R), 256>>>(plan, b.view, b.view_scales, b.counts, b.y);
  EX_CK(cudaGetLastError());
  EX_CS(epf_ll_combine(&L, &ca, EPF_LL_BOTH, 0));
  EX_CK(cudaDeviceSynchronize());
  if (ex_record_check(b.rec_h)) return 1;
  int64_t all_rows, rm_rows;
  int32_t* want_counts = ex_ll_want_counts(&o, &in, &all_rows, &rm_rows);
  if (ex_ll_check_counts(&plan, &b, want_counts, 1u)) return 1; /* ex_ll.h: counts, round (epoch 1) */
  free(want_counts);
  const int pulls = epf_ll_combine_pulls(&plan, ca.y_layout);
  if (ex_verify_out(&o, &plan, &in, b.out, &seed,
                    !rm ? "low-latency expert-major (y in place, pull combine)"
                    : pulls ? "low-latency rank-major (expand, pre-reduce, pull combine)"
                            : "low-latency rank-major (expand, pre-reduce, push combine)"))
    return 1;

  /* ---- then the training direction for the same routing, the same launch and state ------------- */
  return run_ll_backward(&o, &plan, &L, da, ca, &in, window, b.counts, b.round, b.y, b.rec_h, &seed);
}
