/* bench_ht — ep_bench-style benchmark of high-throughput dispatch and combine with virtual ranks.
 *
 *   bench_ht [--ranks 8] [--tokens 4096] [--hidden 7168] [--topk 8] [--experts 256]
 *            [--payload bf16|mxfp8|fp8] [--layout em|rm] [--combine bf16|mxfp8] [--push]
 *            [--blocks N] [--iters 20]
 *
 * Each iteration runs route update -> dispatch (send + receive) -> combine on every virtual rank,
 * timed per stage with CUDA events (median). Prints µs and GB/s in the three byte conventions of
 * ANCHORS.md (received-logical, topk-logical, link), and the HBM bytes each stage must move (read
 * once + written once) as a fraction of the device-to-device copy ceiling measured in the same run.
 * With virtual ranks every "link" byte is an HBM byte on one GPU. PyTorch's version of the same job
 * is scripts/bench_ht_torch.py. Not a test: prints, never asserts on time. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epf_bench.h"
#include "epfuse/epfuse.cuh"
#include "epfuse/ht/kernels.cuh"

static uint64_t rng = 0x1234567;

__global__ void fill_kernel(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    p[i] = (uint16_t)(0x3c00u + (h & 0x7ffu) - 0x400u) | (uint16_t)((h >> 16) & 0x8000u); /* |x| in [2^-8, 2) */
  }
}

int main(int argc, char** argv) {
  int R = 8, T = 4096, H = 7168, K = 8, E = 256, iters = 20, push = 0, blocks = 0;
  int payload = EPF_PAYLOAD_BF16, layout = EPF_LAYOUT_EXPERT_MAJOR, combine = EPF_PAYLOAD_BF16;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (!strcmp(a, "--ranks")) R = atoi(v), ++i;
    else if (!strcmp(a, "--tokens")) T = atoi(v), ++i;
    else if (!strcmp(a, "--hidden")) H = atoi(v), ++i;
    else if (!strcmp(a, "--topk")) K = atoi(v), ++i;
    else if (!strcmp(a, "--experts")) E = atoi(v), ++i;
    else if (!strcmp(a, "--iters")) iters = atoi(v), ++i;
    else if (!strcmp(a, "--blocks")) blocks = atoi(v), ++i;
    else if (!strcmp(a, "--push")) push = 1;
    else if (!strcmp(a, "--payload")) {
      payload = !strcmp(v, "mxfp8") ? EPF_PAYLOAD_MXFP8 : !strcmp(v, "fp8") ? EPF_PAYLOAD_FP8_128 : EPF_PAYLOAD_BF16;
      ++i;
    } else if (!strcmp(a, "--combine")) {
      combine = !strcmp(v, "mxfp8") ? EPF_PAYLOAD_MXFP8 : EPF_PAYLOAD_BF16;
      ++i;
    } else if (!strcmp(a, "--layout")) {
      layout = !strcmp(v, "rm") ? EPF_LAYOUT_RANK_MAJOR : EPF_LAYOUT_EXPERT_MAJOR;
      ++i;
    } else {
      fprintf(stderr, "unknown flag %s\n", a);
      return 2;
    }
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("bench_ht: no GPU\n");
    return 1;
  }
  const int EL = E / R;
  /* routing: K distinct random experts per token (uniform) */
  int32_t* topk = (int32_t*)malloc((size_t)R * T * K * 4);
  float* w = (float*)malloc((size_t)R * T * K * 4);
  int64_t* recv_rows = (int64_t*)calloc(R, 8);
  int64_t link_rows = 0, valid = 0, rm_rows = 0;
  for (int64_t i = 0; i < (int64_t)R * T; ++i) {
    uint8_t seen_rank[1024] = {0};
    for (int k = 0; k < K; ++k) {
      int e, dup;
      do {
        e = (int)(epf_bench_splitmix(&rng) % (uint64_t)E);
        dup = 0;
        for (int j = 0; j < k; ++j) dup |= topk[i * K + j] == e;
      } while (dup && K <= E);
      topk[i * K + k] = e;
      w[i * K + k] = (float)(epf_bench_splitmix(&rng) % 1000) / 1000.f;
      ++valid;
      if (layout == EPF_LAYOUT_EXPERT_MAJOR) {
        ++recv_rows[e / EL];
        link_rows += e / EL != (int)(i / T);
      } else if (!seen_rank[e / EL]) {
        seen_rank[e / EL] = 1;
        ++recv_rows[e / EL];
        ++rm_rows;
        link_rows += e / EL != (int)(i / T);
      }
    }
  }
  int64_t max_rows = 0, all_rows = 0;
  for (int r = 0; r < R; ++r) {
    max_rows = recv_rows[r] > max_rows ? recv_rows[r] : max_rows;
    all_rows += recv_rows[r];
  }
  epf_config_t cfg = EPF_CONFIG_INIT;
  cfg.nranks = R;
  cfg.num_experts = E;
  cfg.top_k = K;
  cfg.hidden = H;
  cfg.max_tokens_per_rank = T;
  cfg.layout = layout;
  cfg.payload = payload;
  cfg.combine_payload = combine;
  cfg.flags = push ? EPF_FLAG_COMBINE_PUSH : 0u;
  cfg.recv_capacity = max_rows + 64;
  epf_plan_t plan;
  EPF_BENCH_OK(epf_plan_compute(&cfg, &plan));
  char* window;
  EPF_BENCH_CUDA(cudaMalloc(&window, (size_t)R * plan.total_bytes));
  EPF_BENCH_CUDA(cudaMemset(window, 0, (size_t)R * plan.total_bytes));
  epf_team_t team = epf_team_virtual(window, plan.total_bytes, 0, R);
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  rc.index_type = EPF_INDEX_INT32;
  uint64_t rbytes;
  EPF_BENCH_OK(epf_route_size(&plan, &rc, &rbytes));
  void* rbuf;
  EPF_BENCH_CUDA(cudaMalloc(&rbuf, rbytes * R));
  epf_route_t route;
  EPF_BENCH_OK(epf_route_init(&plan, &rc, rbuf, rbytes * R, R, 1u, 0, &route));
  void *d_topk, *d_x, *d_out, *d_eo = NULL, *d_view = NULL;
  float* d_w;
  epf_ht_state_t* d_state;
  const int64_t expert_rows = plan.recv_capacity * (layout == EPF_LAYOUT_RANK_MAJOR ? (K < EL ? K : EL) : 1) + EL;
  EPF_BENCH_CUDA(cudaMalloc(&d_topk, (size_t)R * T * K * 4));
  EPF_BENCH_CUDA(cudaMalloc(&d_w, (size_t)R * T * K * 4));
  EPF_BENCH_CUDA(cudaMalloc(&d_x, (size_t)R * T * H * 2));
  EPF_BENCH_CUDA(cudaMalloc(&d_out, (size_t)R * T * H * 2));
  EPF_BENCH_CUDA(cudaMalloc(&d_state, R * sizeof(epf_ht_state_t)));
  EPF_BENCH_CUDA(cudaMemset(d_state, 0, R * sizeof(epf_ht_state_t)));
  const int need_eo = layout == EPF_LAYOUT_RANK_MAJOR || payload != EPF_PAYLOAD_BF16 || combine != EPF_PAYLOAD_BF16 || push;
  if (need_eo) {
    EPF_BENCH_CUDA(cudaMalloc(&d_eo, (size_t)R * expert_rows * H * 2));
    fill_kernel<<<1024, 256>>>((uint16_t*)d_eo, (size_t)R * expert_rows * H, 7u);
  }
  if (layout == EPF_LAYOUT_RANK_MAJOR) EPF_BENCH_CUDA(cudaMalloc(&d_view, (size_t)R * expert_rows * plan.row_bytes));
  EPF_BENCH_CUDA(cudaMemcpy(d_topk, topk, (size_t)R * T * K * 4, cudaMemcpyHostToDevice));
  EPF_BENCH_CUDA(cudaMemcpy(d_w, w, (size_t)R * T * K * 4, cudaMemcpyHostToDevice));
  fill_kernel<<<1024, 256>>>((uint16_t*)d_x, (size_t)R * T * H, 1u);
  EPF_BENCH_CUDA(cudaGetLastError());
  epf_error_record_t *rec_h, *rec_d;
  EPF_BENCH_CUDA(cudaHostAlloc(&rec_h, sizeof(*rec_h), cudaHostAllocMapped));
  EPF_BENCH_CUDA(cudaHostGetDevicePointer(&rec_d, rec_h, 0));
  epf_error_clear(rec_h);

  epf_route_step_t rs = epf_route_step_make(d_topk, T, epf_wait_make(plan.timeout_ns, rec_d, NULL, 0));
  epf_ht_step_t hs = EPF_HT_STEP_INIT;
  hs.x = d_x;
  hs.topk_weights = d_w;
  hs.out = d_out;
  hs.expert_out = d_eo;
  hs.em_view = d_view;
  hs.state = d_state;
  hs.expert_rows = expert_rows;
  hs.blocks_per_rank = blocks;
  hs.wait = epf_wait_make(plan.timeout_ns, rec_d, NULL, 0);

  /* copy ceiling: a device-to-device copy of 2 GiB, read + write counted */
  const size_t cbytes = (size_t)1 << 31;
  void *ca, *cb;
  EPF_BENCH_CUDA(cudaMalloc(&ca, cbytes));
  EPF_BENCH_CUDA(cudaMalloc(&cb, cbytes));
  EPF_BENCH_CUDA(cudaMemset(ca, 1, cbytes));
  cudaEvent_t ev[5];
  for (int i = 0; i < 5; ++i) EPF_BENCH_CUDA(cudaEventCreate(&ev[i]));
  float* te = (float*)malloc(sizeof(float) * (iters + 3));
  float* tc = (float*)malloc(sizeof(float) * (iters + 3));
  float *tr = (float*)malloc(sizeof(float) * (iters + 3)), *td = (float*)malloc(sizeof(float) * (iters + 3)),
        *tx = (float*)malloc(sizeof(float) * (iters + 3));
  for (int i = 0; i < iters + 3; ++i) {
    EPF_BENCH_CUDA(cudaEventRecord(ev[0]));
    EPF_BENCH_CUDA(cudaMemcpyAsync(cb, ca, cbytes, cudaMemcpyDeviceToDevice));
    EPF_BENCH_CUDA(cudaEventRecord(ev[1]));
    EPF_BENCH_CUDA(cudaEventSynchronize(ev[1]));
    EPF_BENCH_CUDA(cudaEventElapsedTime(&tc[i], ev[0], ev[1]));
  }
  for (int i = 0; i < iters + 3; ++i) {
    EPF_BENCH_CUDA(cudaEventRecord(ev[0]));
    EPF_BENCH_OK(epf_route_update(&route, team, &plan, &rs, 0));
    EPF_BENCH_CUDA(cudaEventRecord(ev[1]));
    EPF_BENCH_OK(epf_ht_dispatch(&route, team, &plan, &hs, d_topk, EPF_HT_BOTH, 0));
    EPF_BENCH_CUDA(cudaEventRecord(ev[2]));
    if (layout == EPF_LAYOUT_RANK_MAJOR) EPF_BENCH_OK(epf_ht_expand(&route, team, &plan, &hs, 0));
    EPF_BENCH_CUDA(cudaEventRecord(ev[3]));
    EPF_BENCH_OK(epf_ht_combine(&route, team, &plan, &hs, d_topk, 0));
    EPF_BENCH_CUDA(cudaEventRecord(ev[4]));
    EPF_BENCH_CUDA(cudaEventSynchronize(ev[4]));
    EPF_BENCH_CUDA(cudaEventElapsedTime(&tr[i], ev[0], ev[1]));
    EPF_BENCH_CUDA(cudaEventElapsedTime(&td[i], ev[1], ev[2]));
    EPF_BENCH_CUDA(cudaEventElapsedTime(&te[i], ev[2], ev[3]));
    EPF_BENCH_CUDA(cudaEventElapsedTime(&tx[i], ev[3], ev[4]));
  }
  EPF_BENCH_CUDA(cudaDeviceSynchronize());
  epf_error_record_t rec;
  epf_error_read(rec_h, &rec);
  /* medians of the timed iterations (the first 3 are warm-up) */
  const double us_e = epf_bench_median(te + 3, iters) * 1e3;
  const double us_copy = epf_bench_median(tc + 3, iters) * 1e3, us_r = epf_bench_median(tr + 3, iters) * 1e3,
               us_d = epf_bench_median(td + 3, iters) * 1e3, us_c = epf_bench_median(tx + 3, iters) * 1e3;
  const double copy_bw = 2.0 * cbytes / (us_copy * 1e-6) / 1e9;
  const double row = plan.row_bytes, crow = plan.combine_row_bytes;
  const double x_row = payload == EPF_PAYLOAD_BF16 ? 2.0 * H : 2.0 * H; /* BF16 input, quantized on the way */
  const double recv_bytes = (double)all_rows * row;                     /* received-logical */
  const double topk_bytes = (double)valid * row;                        /* topk-logical */
  const double link_bytes = (double)link_rows * row;
  const double d_moved = (double)R * T * x_row + (double)all_rows * (row + plan.scale_bytes_per_row + plan.meta_bytes_per_row);
  /* combine: the source reads every returned row and writes its BF16 output; with an expert-output
   * buffer the expert side first reads it (BF16) and writes the travelling row (push or EXPERT_OUT) */
  const double c_moved = (double)all_rows * crow + (double)R * T * 2.0 * H + (need_eo ? (double)all_rows * (2.0 * H + crow) : 0.0);
  printf("bench_ht: %d virtual ranks, T=%d H=%d K=%d E=%d, %s, dispatch %s, combine %s %s, %d iters (median)\n", R, T, H, K, E,
         layout == EPF_LAYOUT_RANK_MAJOR ? "rank-major" : "expert-major",
         payload == EPF_PAYLOAD_BF16 ? "BF16" : payload == EPF_PAYLOAD_MXFP8 ? "MXFP8" : "FP8-128",
         combine == EPF_PAYLOAD_BF16 ? "BF16" : "MXFP8", push ? "push" : "pull", iters);
  printf("rows received: %lld (max per rank %lld), crossing ranks: %lld; errors: status=%s overflow=%u\n",
         (long long)all_rows, (long long)max_rows, (long long)link_rows, epf_status_name((epf_status_t)rec.status),
         rec.recv_overflow);
  printf("| stage | us | recv-logical GB/s | topk-logical GB/s | link GB/s | HBM bytes moved | GB/s moved | of copy ceiling |\n");
  printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  printf("| copy ceiling (D2D) | %.1f | | | | %.2f GB | %.0f | 100%% |\n", us_copy, 2.0 * cbytes / 1e9, copy_bw);
  printf("| route update | %.1f | | | | | | |\n", us_r);
  printf("| dispatch | %.1f | %.0f | %.0f | %.0f | %.2f GB | %.0f | %.1f%% |\n", us_d, recv_bytes / (us_d * 1e3),
         topk_bytes / (us_d * 1e3), link_bytes / (us_d * 1e3), d_moved / 1e9, d_moved / (us_d * 1e3),
         100.0 * d_moved / (us_d * 1e3) / copy_bw);
  if (layout == EPF_LAYOUT_RANK_MAJOR) /* local: every (token, k) copy read from its rank-major row, written to the view */
    printf("| expand (local) | %.1f | | | | %.2f GB | %.0f | %.1f%% |\n", us_e, (double)valid * 2.0 * row / 1e9,
           (double)valid * 2.0 * row / (us_e * 1e3), 100.0 * (double)valid * 2.0 * row / (us_e * 1e3) / copy_bw);
  printf("| combine | %.1f | %.0f | %.0f | %.0f | %.2f GB | %.0f | %.1f%% |\n", us_c, recv_bytes / (us_c * 1e3),
         topk_bytes / (us_c * 1e3), link_bytes / (us_c * 1e3), c_moved / 1e9, c_moved / (us_c * 1e3),
         100.0 * c_moved / (us_c * 1e3) / copy_bw);
  return rec.status == 0 ? 0 : 1;
}
