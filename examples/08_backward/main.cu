/* 08_backward — the high-throughput training direction of an 8-rank EP team on ONE GPU (virtual
 * ranks): a forward round, then the backward of combine and of dispatch on the SAME route, dx and
 * the router-weight gradients checked bit for bit against a CPU reference.
 *
 * Learning objectives
 *   - The backward runs on the forward's route: no route update in between, the same state, view
 *     and expert_rows; the backward step is a copy of the forward's with x = dy, out = dx,
 *     expert_out = the experts' dx rows, weight_grad (one d w per row) and topk_weights_grad.
 *   - epf_ht_combine_backward (dy into the very receive rows x arrived in) -> [epf_ht_expand for
 *     rank-major: the view of dy] -> the experts' backward (dx rows and each row's router-weight
 *     gradient dot(dy, y) from the forward's output row) -> epf_ht_dispatch_backward (dx per
 *     token with unit weights; topk_weights_grad).
 *   - BF16 both ways: other payloads are refused before the GPU is touched (the launchers would
 *     return EPF_ERR_NOT_SUPPORTED).
 * Key concepts: the training direction of docs/high-throughput.md, the expert-major / rank-major
 *   reduction orders of the CPU reference (ex_ref_backward below).
 * The forward round alone: 01_virtual_ranks; a whole SwiGLU training step: 06_moe_training; the
 *   low-latency training direction: 09_low_latency_backward.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epfuse/epfuse.cuh"
#include "epfuse/ht/kernels.cuh"
#include "ex_vranks.h"

static const char* usage =
    "[--ranks 8] [--tokens 4096] [--hidden 7168] [--topk 8] [--experts 256] [--layout em|rm]\n"
    "          [--payload bf16] [--samples 512 | --verify-all] [--seed N] [--ctest]\n"
    "  The HT training direction (BF16) of an R-rank EP team as virtual ranks on one GPU: a forward\n"
    "  round (route update, dispatch, experts, combine), then epf_ht_combine_backward (dy into the\n"
    "  receive rows) -> [expand] -> the experts' backward -> epf_ht_dispatch_backward (dx and the\n"
    "  router-weight gradient) on the same route; the forward output and dx and d topk_weights of\n"
    "  --samples tokens (all with --verify-all) checked bit for bit against a CPU reference.\n"
    "  --ctest: exit 77 instead of 1 also when a GPU is there but unusable (a driver too old); with no\n"
    "           CUDA driver or no GPU at all the exit code is 77 either way (CTest reports \"Not Run\").\n";

/* ---- the training direction on the forward's route ------------------------------------------- */

/* ex_experts_backward_kernel — the demo experts' backward, over the rows ex_experts_kernel covers
 * (EXPERT_MAJOR: the receive region, where the backward of combine put dy; RANK_MAJOR: the expand
 * view of dy): dx = bf16(dy * f(le, rank)) (the expert is y = f * x; a real layer also scales dy by
 * the row's combine weight, the EXPERT_MAJOR metadata weight) into dx_rows, and the router-weight
 * gradient of the row, dot(dy, y) over the forward's output row y (expert_out, the same row
 * index), as one FP32 fma chain in h order, into wgrad. Grid (any, R). BF16 plans. */
// example-begin ht_experts_backward
__global__ void ex_experts_backward_kernel(epf_route_t route, epf_plan_t plan, const char* window, const uint16_t* view,
                                           const uint16_t* expert_out, int64_t expert_rows, uint16_t* dx_rows,
                                           float* wgrad) {
  const int rank = (int)blockIdx.y;
  const epf_route_segment_t* seg = (const epf_route_segment_t*)epf_route_ptr(&route, rank, EPF_ROUTE_RECV_SEGMENT);
  const char* base = window + (uint64_t)rank * plan.total_bytes;
  const int gw = (int)(blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)), nw = (int)(gridDim.x * (blockDim.x >> 5));
  for (int le = 0; le < plan.experts_per_rank; ++le) {
    const int64_t cap = plan.layout == EPF_LAYOUT_EXPERT_MAJOR ? plan.recv_capacity : expert_rows;
    int64_t end = seg[le].begin + seg[le].count;
    if (end > cap) end = cap;
    for (int64_t r = seg[le].begin + gw; r < end; r += nw) {
      const uint64_t i = (uint64_t)rank * expert_rows + r;
      const uint16_t* dy = plan.layout == EPF_LAYOUT_EXPERT_MAJOR
                               ? (const uint16_t*)(base + epf_plan_recv_token_offset(&plan, r))
                               : view + i * plan.hidden;
      ex_expert_row_warp(&plan, (const uint8_t*)dy, NULL, ex_expert_factor(le, rank), dx_rows + i * plan.hidden);
      if (epf_lane_id() == 0) { /* d w = dot(dy, y): one chain, h ascending (the reference's order) */
        const uint16_t* y = expert_out + i * plan.hidden;
        float acc = 0.f;
        for (int h = 0; h < plan.hidden; ++h) acc = __fmaf_rn(epf_bf16_to_float(dy[h]), epf_bf16_to_float(y[h]), acc);
        wgrad[i] = acc;
      }
    }
  }
}
// example-end ht_experts_backward

/* the CPU reference of one token's backward (BF16 plan): dx[H] and its K router-weight gradients
 * (the token's ids distinct, nothing dropped: every k has its own row). EXPERT_MAJOR: dx =
 * bf16(sum over k ascending of fma(1, bf16(dy * f_k), acc)); RANK_MAJOR: per rank in first-
 * occurrence order the same chain over its k, rounded to BF16, then summed with weight 1 in that
 * order. wg[k] = dot(dy, y_k), y_k = bf16(x * f_k), one fma chain in h order. Scratch 2 * H. */
static void ex_ref_backward(const epf_plan_t* p, const uint16_t* x, const uint16_t* dy, const int32_t* topk,
                            float* scratch, uint16_t* dx, float* wg) {
  const int H = p->hidden, K = p->top_k, EL = p->experts_per_rank;
  float* acc = scratch;
  float* part = scratch + H;
  int first[64], order[64], nd = 0;
  for (int h = 0; h < H; ++h) acc[h] = 0.f;
  for (int k = 0; k < K; ++k) {
    const int e = topk[k];
    const float f = ex_expert_factor(e % EL, e / EL);
    float a = 0.f;
    int seen = 0;
    first[k] = 1; /* a repeated id (K > E) adds nothing to dx; its d w equals its first occurrence's */
    for (int j = 0; j < k; ++j) first[k] &= topk[j] != e;
    for (int h = 0; h < H; ++h) a = fmaf(ex_bf16_f(dy[h]), ex_bf16_f(ex_bf16_rne(ex_bf16_f(x[h]) * f)), a);
    wg[k] = a;
    for (int j = 0; j < nd; ++j) seen |= order[j] == e / EL;
    if (!seen) order[nd++] = e / EL;
  }
  if (p->layout == EPF_LAYOUT_EXPERT_MAJOR) {
    for (int k = 0; k < K; ++k) {
      const float f = ex_expert_factor(topk[k] % EL, topk[k] / EL);
      if (first[k])
        for (int h = 0; h < H; ++h) acc[h] = fmaf(1.0f, ex_bf16_f(ex_bf16_rne(ex_bf16_f(dy[h]) * f)), acc[h]);
    }
  } else {
    for (int j = 0; j < nd; ++j) {
      for (int h = 0; h < H; ++h) part[h] = 0.f;
      for (int k = 0; k < K; ++k) {
        const float f = ex_expert_factor(topk[k] % EL, order[j]);
        if (first[k] && topk[k] / EL == order[j])
          for (int h = 0; h < H; ++h) part[h] = fmaf(1.0f, ex_bf16_f(ex_bf16_rne(ex_bf16_f(dy[h]) * f)), part[h]);
      }
      for (int h = 0; h < H; ++h) acc[h] = fmaf(1.0f, ex_bf16_f(ex_bf16_rne(part[h])), acc[h]);
    }
  }
  for (int h = 0; h < H; ++h) dx[h] = ex_bf16_rne(acc[h]);
}

/* run_ht_backward — after the forward round of run_ht (same route, no update in between): dy in,
 * the backward of combine, [expand], the experts' backward, the backward of dispatch; then dx and
 * topk_weights_grad checked on --samples tokens (all with --verify-all). 0 when they match. */
static int run_ht_backward(const ex_opts_t* o, const ex_inputs_t* in, uint64_t* seed, const epf_route_t* route, epf_team_t team,
                           const epf_plan_t* plan, const epf_ht_step_t* fwd, const void* d_topk, const char* window,
                           const epf_error_record_t* rec_h) {
  const int T = o->T, H = o->H, K = o->K, R = o->R;
  const int64_t n = (int64_t)R * T, xr = fwd->expert_rows;
  uint16_t* dy = (uint16_t*)malloc((size_t)n * H * 2);
  for (int64_t i = 0; i < n * H; ++i) {
    const uint64_t r = ex_rand(seed);
    dy[i] = ex_bf16_rne((float)((int64_t)(r % 20001) - 10000) / 4000.0f);
  }
  void *d_dy, *d_dx;
  uint16_t* d_dxr;
  float *d_wg, *d_twg;
  EX_CK(cudaMalloc(&d_dy, (size_t)n * H * 2));
  EX_CK(cudaMalloc(&d_dx, (size_t)n * H * 2));
  EX_CK(cudaMalloc(&d_dxr, (size_t)R * xr * H * 2));
  EX_CK(cudaMalloc(&d_wg, (size_t)R * xr * 4));
  EX_CK(cudaMalloc(&d_twg, (size_t)n * K * 4));
  EX_CK(cudaMemcpy(d_dy, dy, (size_t)n * H * 2, cudaMemcpyHostToDevice));
  EX_CK(cudaMemset(d_dx, 0xA7, (size_t)n * H * 2));
  EX_CK(cudaMemset(d_twg, 0xA7, (size_t)n * K * 4));

  // example-begin ht_backward
  epf_ht_step_t bs = *fwd;          /* the forward's step: weights, state, view, expert_rows, wait */
  bs.x = d_dy;                      /* [R][T][H] BF16: the gradient of the combine output */
  bs.topk_idx = d_topk;             /* the forward's ids (the backward launchers read them here) */
  bs.out = d_dx;                    /* [R][T][H] BF16: the gradient of the dispatch input */
  bs.expert_out = d_dxr;            /* the experts' dx rows, in the forward's expert_out order */
  bs.weight_grad = d_wg;            /* one FP32 per expert_out row: d w of that row */
  bs.topk_weights_grad = d_twg;     /* [R][T][K] FP32 out */
  EX_CS(epf_ht_combine_backward(route, team, plan, &bs, EPF_HT_BOTH, 0));
  if (plan->layout == EPF_LAYOUT_RANK_MAJOR) EX_CS(epf_ht_expand(route, team, plan, &bs, 0)); /* view of dy */
  ex_experts_backward_kernel<<<dim3(64, (unsigned)R), 256>>>(*route, *plan, window, (const uint16_t*)bs.em_view,
                                                              (const uint16_t*)fwd->expert_out, xr, d_dxr, d_wg);
  EX_CK(cudaGetLastError());
  EX_CS(epf_ht_dispatch_backward(route, team, plan, &bs, 0));
  // example-end ht_backward
  EX_CK(cudaDeviceSynchronize());
  if (ex_record_check(rec_h)) return 1;

  uint16_t* dx = (uint16_t*)malloc((size_t)n * H * 2);
  float* twg = (float*)malloc((size_t)n * K * 4);
  float* scratch = (float*)malloc((size_t)2 * H * 4);
  uint16_t* want = (uint16_t*)malloc((size_t)H * 2);
  float wg[64];
  EX_CK(cudaMemcpy(dx, d_dx, (size_t)n * H * 2, cudaMemcpyDeviceToHost));
  EX_CK(cudaMemcpy(twg, d_twg, (size_t)n * K * 4, cudaMemcpyDeviceToHost));
  const int64_t nver = o->verify_all || o->samples >= n ? n : o->samples;
  int64_t bad = 0;
  for (int64_t i = 0; i < nver; ++i) {
    const int64_t t = o->verify_all || o->samples >= n ? i : (int64_t)(ex_rand(seed) % (uint64_t)n);
    ex_ref_backward(plan, in->x + t * H, dy + t * H, in->topk + t * K, scratch, want, wg);
    if (memcmp(want, dx + t * H, (size_t)H * 2) != 0 || memcmp(wg, twg + t * K, (size_t)K * 4) != 0) {
      if (bad < 5) fprintf(stderr, "BACKWARD MISMATCH rank %lld token %lld\n", (long long)(t / T), (long long)(t % T));
      ++bad;
    }
  }
  printf("backward: epf_ht_combine_backward -> %sexperts' backward -> epf_ht_dispatch_backward\n",
         plan->layout == EPF_LAYOUT_RANK_MAJOR ? "expand -> " : "");
  printf("verify backward: %lld of %lld tokens bit-exact (dx and router-weight gradients)%s: %s\n", (long long)(nver - bad),
         (long long)nver, nver < n ? " (sample; --verify-all for all)" : "", bad ? "FAILED" : "OK");
  free(dy);
  free(dx);
  free(twg);
  free(scratch);
  free(want);
  EX_CK(cudaFree(d_dy));
  EX_CK(cudaFree(d_dx));
  EX_CK(cudaFree(d_dxr));
  EX_CK(cudaFree(d_wg));
  EX_CK(cudaFree(d_twg));
  return bad != 0;
}

int main(int argc, char** argv) {
  ex_opts_t o;
  if (ex_opts_parse(argc, argv, EPF_MODE_HT, 0u, usage, &o)) return 2;
  if (o.payload != EPF_PAYLOAD_BF16) { /* before the GPU check */
    fprintf(stderr, "the HT training direction moves BF16 gradients: use --payload bf16 "
                    "(epf_ht_combine_backward / epf_ht_dispatch_backward refuse other payloads with %s)\n",
            epf_status_name(EPF_ERR_NOT_SUPPORTED));
    return 2;
  }
  ex_gpu_or_exit(1, o.ctest);
  const int R = o.R, T = o.T;
  uint64_t seed = o.seed;
  ex_inputs_t in;
  ex_make_inputs(&o, &seed, &in);
  int64_t all_rows, max_rows, max_copies; /* the receive region's budget */
  ex_ht_rows(&o, &in, &all_rows, &max_rows, &max_copies);

  /* ---- the forward round (01_virtual_ranks spells it out; BF16) -------------------------------- */
  epf_plan_t plan;
  ex_ht_plan_make(&o, max_rows, &plan); /* ex_vranks.h: o.payload is BF16 here */
  ex_vteam_t v; /* ex_common.h: window (R slices), team, route */
  ex_vteam_make(&plan, &v);
  ex_ht_bufs_t b; /* ex_vranks.h: inputs, output, expert outputs, view, state, error record */
  ex_ht_bufs_make(&o, &in, &plan, max_copies, &b);
  epf_route_step_t rs = epf_route_step_make(b.topk, T, epf_wait_make(plan.timeout_ns, b.rec_d, NULL, 0));
  epf_ht_step_t hs = ex_ht_step_make(&plan, &b);
  EX_CS(epf_route_update(&v.route, v.team, &plan, &rs, 0));
  EX_CS(epf_ht_dispatch(&v.route, v.team, &plan, &hs, b.topk, EPF_HT_BOTH, 0));
  if (plan.layout == EPF_LAYOUT_RANK_MAJOR) EX_CS(epf_ht_expand(&v.route, v.team, &plan, &hs, 0));
  ex_experts_kernel<<<dim3(64, (unsigned)R), 256>>>(v.route, plan, v.window, 0, b.view, b.view_scales, b.expert_rows, b.eo);
  EX_CK(cudaGetLastError());
  EX_CS(epf_ht_combine(&v.route, v.team, &plan, &hs, b.topk, 0));
  EX_CK(cudaDeviceSynchronize());
  if (ex_record_check(b.rec_h)) return 1;
  if (ex_verify_out(&o, &plan, &in, b.out, &seed, o.layout == EPF_LAYOUT_RANK_MAJOR ? "rank-major" : "expert-major"))
    return 1;

  /* ---- then the backward on the same route ------------------------------------------------------ */
  return run_ht_backward(&o, &in, &seed, &v.route, v.team, &plan, &hs, b.topk, v.window, b.rec_h);
}
