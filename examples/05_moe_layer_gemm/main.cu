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
 *         FP8 again (same segment layout) for the down GEMM, which writes its BF16 outputs straight
 *         into the window's EXPERT_OUT rows, where the pull combine reads them: with the virtual
 *         ranks' stride rounded to a multiple of the combine row, the step's expert_out /
 *         expert_rows name exactly those rows and the combine puts nothing (--expert-out buffer:
 *         the old path, a separate buffer the combine first puts into the window; both: the two
 *         in one run, their outputs compared bit for bit).
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
 * derived from the formats (README.md); with --expert-out both, the two FP8 outputs are equal bit
 * for bit. --dump DIR writes inputs, weights and outputs for scripts/moe_layer_torch.py. Timing:
 * CUDA events, medians.
 *
 *   ex05_moe_layer_gemm                 small shape (the ctest run: --ctest)
 *   ex05_moe_layer_gemm --real          H 7168, I 2048, E 256, top-8, T 4096 per rank, 8 ranks
 *   options: --T --H --I --E --K --R --align --iters --seed --payload bf16|fp8|both --dump DIR
 *            --check-tokens N (CPU-checked tokens per path, default: all for small, 4 for --real)
 *            --expert-out window|buffer|both (FP8: where the down GEMM writes; default window)
 *
 * Files (one translation unit): layer.h (options, inputs, weights, the placement model), gemm.cuh
 * (the expert stage: weights, SiLU * up, cuBLASLt), reference.h (the CPU reference with its error
 * bound, the checks, --dump), main.cu (one path of the layer, the table).
 */
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "epfuse/epfuse.cuh"
#include "epfuse/ht/kernels.cuh"
#include "ex_common.h"
#include "gemm.cuh"      /* the expert stage: weights, SiLU * up, cuBLASLt */
#include "layer.h"       /* options, inputs, weights, the CPU model of the placement */
#include "reference.h"   /* the CPU reference, the checks, --dump */

/* ---- one path (payload) ------------------------------------------------------------------------ */

/* fp8: the payload; eo_window (FP8 only): the down GEMM writes into the window's EXPERT_OUT rows
 * (else into the separate buffer eo, which the combine then puts into the window). name: the
 * path's tag in the messages. */
static PathResult run_path(const Opts& o, const Model& m, const Placement& pl, Dev& dv, Lt& lt, bool fp8, bool eo_window,
                           const char* name) {
  const int R = o.R, T = o.T, H = o.H, I = o.I, K = o.K, E = o.E, EL = E / R;
  const int n = R * T;
  PathResult res;
  const bool in_window = fp8 && eo_window;

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

  /* the window: R slices (zeroed), the team, R route buffers (int32 ids), ex_common.h. Where the
   * expert outputs go (README.md "Where the down GEMM writes"):
   *   bf16         over the received rows (BF16/BF16 pull in place: the plan has no EXPERT_OUT);
   *   fp8 window   into the slice's EXPERT_OUT rows (epf_plan_expert_out_offset), where the pull
   *                combine reads them. The slices' stride is rounded up to a multiple of
   *                lcm(EPF_ALIGN, combine row) so that rank d's EXPERT_OUT row r is row
   *                d * (stride / combine row) + r of one array from rank 0's EXPERT_OUT: the step's
   *                expert_out / expert_rows name exactly the window rows, and the combine's expert
   *                side finds every output already where it belongs and puts nothing;
   *   fp8 buffer   into eo [R][cap][H], which the combine's expert side first puts into EXPERT_OUT
   *                (one more read and write of every routed row). */
  ex_vteam_t vt;
  ex_vteam_make_strided(&plan, in_window ? ex_vteam_stride_expert_out(&plan) : plan.total_bytes, &vt);
  char* window = vt.window;
  const uint64_t stride = vt.stride;
  const uint64_t crow = plan.combine_row_bytes;
  const int64_t eo_rows = in_window ? (int64_t)(stride / crow) : cap; /* hs.expert_rows */
  if (in_window) {
    /* by construction, checked: every rank's expert_out row r (the combine's source y) is the
     * window row the source pulls (its destination), so epf_combine_expert_row_em_warp skips it */
    bool same = plan.region[EPF_REGION_EXPERT_OUT].bytes >= (uint64_t)cap * crow && crow == (uint64_t)H * 2 &&
                stride % crow == 0 && eo_rows >= cap;
    for (int d = 0; d < R && same; ++d)
      for (int64_t r : {(int64_t)0, cap - 1})
        same = same && window + plan.region[EPF_REGION_EXPERT_OUT].offset + ((uint64_t)d * eo_rows + r) * (uint64_t)H * 2 ==
                           window + (uint64_t)d * stride + epf_plan_expert_out_offset(&plan, r);
    if (!same) {
      fprintf(stderr, "[%s] the window's EXPERT_OUT rows are not one expert_out array (region %llu bytes, row %llu, stride %llu)\n",
              name, (unsigned long long)plan.region[EPF_REGION_EXPERT_OUT].bytes, (unsigned long long)crow,
              (unsigned long long)stride);
      exit(1);
    }
  }
  const epf_team_t team = vt.team;
  const epf_route_t route = vt.route;

  /* expert-stage buffers, per rank [cap] rows */
  __nv_bfloat16 *hbuf, *abuf = NULL, *eo = NULL;
  uint8_t* aq = NULL;
  float* as = NULL;
  EX_CK(cudaMalloc(&hbuf, (size_t)R * cap * 2 * I * 2));
  EX_CK(cudaMemset(hbuf, 0, (size_t)R * cap * 2 * I * 2));
  if (fp8) {
    EX_CK(cudaMalloc(&aq, (size_t)R * cap * I));
    EX_CK(cudaMalloc(&as, (size_t)R * cap * (I / 128) * 4));
    if (!in_window) EX_CK(cudaMalloc(&eo, (size_t)R * cap * H * 2));
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
  // example-begin expert_out_window
  /* bf16: NULL (the outputs are over the received rows); fp8 window: the window's EXPERT_OUT rows
   * of all ranks as one [R][stride / combine row][H] array; fp8 buffer: eo [R][cap][H] */
  hs.expert_out = in_window ? (const void*)(window + plan.region[EPF_REGION_EXPERT_OUT].offset) : fp8 ? (const void*)eo : NULL;
  hs.expert_rows = eo_rows;
  // example-end expert_out_window
  hs.state = d_state;
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
      char* base = window + (uint64_t)idx * stride;
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
      char* base = window + (uint64_t)idx * stride;
      for (int le = 0; le < EL; ++le) {
        const epf_route_segment_t sg = seg_h[(size_t)idx * EL + le];
        if (sg.count == 0 || sg.begin + sg.padded_count > cap) continue;
        const int e = idx * EL + le, nr = sg.padded_count;
        const void* A = fp8 ? (const void*)(aq + ((uint64_t)idx * cap + sg.begin) * I) : (const void*)(abuf + ((uint64_t)idx * cap + sg.begin) * I);
        const float* As = fp8 ? as + (uint64_t)idx * cap * (I / 128) + (uint64_t)sg.begin * (I / 128) : NULL;
        // example-begin down_gemm_output
        /* D: the segment's output rows where the combine reads them — the window's EXPERT_OUT rows
         * (FP8, --expert-out window: epf_plan_expert_out_offset, row pitch combine_row_bytes =
         * H * 2) or over the received BF16 rows (BF16) — or the separate buffer (--expert-out buffer) */
        void* Y = in_window ? (void*)(base + epf_plan_expert_out_offset(&plan, sg.begin))
                  : fp8     ? (void*)(eo + ((uint64_t)idx * cap + sg.begin) * H)
                            : (void*)(base + epf_plan_recv_token_offset(&plan, sg.begin));
        // example-end down_gemm_output
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
      ok = check_placement(o, m, pl, plan, window, stride, seg_h, fp8, name);
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
  /* every memset above ran on the legacy default stream, which st (non-blocking) does not wait for */
  EX_CK(cudaDeviceSynchronize());
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
  ex_vteam_free(&vt);
  return res;
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
  /* the paths: [0] bf16; [1] fp8 with the down GEMM writing into the window's EXPERT_OUT rows
   * (--expert-out window, the default; both) or, with --expert-out buffer alone, into the separate
   * buffer; [2] fp8 into the buffer as well (--expert-out both: the old path on the same inputs) */
  struct PathSpec {
    bool run, fp8, eo_window;
    const char *name, *column;
  };
  const PathSpec spec[3] = {
      {o.run_bf16, false, false, "bf16", "bf16 (down GEMM over the received rows)"},
      {o.run_fp8, true, o.eo_window, o.eo_window ? "fp8" : "fp8/buffer",
       o.eo_window ? "fp8 (down GEMM into the window's EXPERT_OUT: combine pulls in place)"
                   : "fp8 (down GEMM into a buffer: combine puts it first)"},
      {o.run_fp8 && o.eo_window && o.eo_buffer, true, false, "fp8/buffer", "fp8 (down GEMM into a buffer: combine puts it first)"}};
  PathResult pr[3];
  for (int f = 0; f < 3; ++f) {
    if (!spec[f].run) continue;
    pr[f] = run_path(o, m, pl, dv, lt, spec[f].fp8, spec[f].eo_window, spec[f].name);
    ok = ok && pr[f].ok;
    ok = verify(o, m, pr[f].out, spec[f].fp8, spec[f].name) && ok;
  }
  if (spec[2].run) { /* the same GEMM outputs, reduced in the same order: the same bits, wherever they were written */
    const bool same = pr[1].out == pr[2].out;
    printf("[fp8] expert outputs in the window vs in a buffer: layer outputs of all %d tokens %s\n", R * T,
           same ? "bit-identical" : "DIFFER  FAILED");
    ok = ok && same;
  }

  /* ---- the timing table ------------------------------------------------------------------------ */
  const double flops = 2.0 * 3.0 * (double)R * T * K * H * I; /* unpadded rows: gate, up, down */
  printf("\n| stage (median of %d layers, us) |", o.iters);
  for (int f = 0; f < 3; ++f)
    if (spec[f].run) printf(" %s |", spec[f].column);
  printf("\n| --- |");
  for (int f = 0; f < 3; ++f)
    if (spec[f].run) printf(" ---: |");
  printf("\n");
  const char* labels[5] = {"route update", "dispatch (+ segments D2H, overlapped)", "expert GEMMs + SiLU*up (cuBLASLt)",
                           "combine", "whole layer"};
  for (int s = 0; s < 5; ++s) {
    printf("| %s |", labels[s]);
    for (int f = 0; f < 3; ++f) {
      if (!spec[f].run) continue;
      const Times& t = pr[f].tm;
      const std::vector<float>* v[5] = {&t.route, &t.dispatch, &t.gemm, &t.combine, &t.layer};
      if (v[s]->empty()) printf(" - |");
      else printf(" %.1f |", median(*v[s]));
    }
    printf("\n");
  }
  printf("| communication share (route + dispatch + combine) / layer |");
  for (int f = 0; f < 3; ++f) {
    if (!spec[f].run) continue;
    const Times& t = pr[f].tm;
    if (t.layer.empty()) printf(" - |");
    else printf(" %.1f %% |", 100.0 * (median(t.route) + median(t.dispatch) + median(t.combine)) / median(t.layer));
  }
  printf("\n| expert GEMM TFLOP/s (unpadded rows) |");
  for (int f = 0; f < 3; ++f)
    if (!spec[f].run) continue;
    else if (pr[f].tm.gemm.empty()) printf(" - |");
    else printf(" %.0f |", flops / (median(pr[f].tm.gemm) * 1e-6) / 1e12);
  printf("\n| segments D2H + sync on an idle stream (host wall, us) |");
  for (int f = 0; f < 3; ++f)
    if (!spec[f].run) continue;
    else if (pr[f].tm.sync_us.empty()) printf(" - |");
    else printf(" %.1f |", median_d(pr[f].tm.sync_us));
  printf("\n\n");

  if (!o.dump.empty() && !dump(o, m, dv, pr)) return 1; /* reference.h */

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
