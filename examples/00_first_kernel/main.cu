// example-begin first_kernel
/* 00_first_kernel — your own fused kernel from epfuse's device blocks: the route update and the
 * dispatch of a 4-rank team in ONE launch, as virtual ranks on one GPU (block r plays rank r).
 *   nvcc -std=c++17 -arch=sm_90 -I include examples/00_first_kernel/main.cu -o first && ./first */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epfuse/epfuse.cuh"        /* the device blocks */
#include "epfuse/route/kernels.cuh" /* epf_route_init */

#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { puts(cudaGetErrorString(e_)); exit(1); } } while (0)
enum { R = 4, T = 64, H = 256, E = 32, K = 4, EL = E / R }; /* ranks, tokens per rank, hidden, experts, top-k */

__global__ void route_and_dispatch(epf_route_t route, epf_team_t team, epf_plan_t plan, const uint16_t* x,
                                   const int32_t* topk, uint32_t* arrive, epf_wait_t w) {
  extern __shared__ uint4 smem[];                       /* epf_route_smem_bytes(&route.layout, blockDim.x) */
  const epf_team_t me = epf_team_for_block(team, 1, 1); /* virtual ranks, one block each */
  const int rank = me.rank, lane = epf_lane_id();
  const int32_t* ids = topk + rank * T * K;             /* this rank's [T][K] expert ids */
  const uint32_t epoch = *epf_route_epoch_ptr(&route, rank) + 1u; /* this step's: read before the update */
  w.rank = rank;
  /* 1. counts exchanged with every peer, then this rank's slots and send offsets */
  if (epf_route_update_block(&route, rank, me, &plan, ids, T, 0, 1, w, NULL, smem) != EPF_OK) return;
  const int32_t* send_off = (const int32_t*)epf_route_ptr(&route, rank, EPF_ROUTE_SEND_OFFSET); /* [E] */
  const int32_t* dst = (const int32_t*)epf_route_ptr(&route, rank, EPF_ROUTE_DST_RANK);         /* [T][K] */
  const int32_t* slot = (const int32_t*)epf_route_ptr(&route, rank, EPF_ROUTE_SLOT);            /* [T][K] */
  /* 2. a warp per token, lane k holds copy k: the row straight into its final row on rank d */
  for (int t = epf_warp_id(); t < T; t += blockDim.x / 32) {
    const int d = lane < K ? dst[t * K + lane] : -1;
    const int64_t row = d >= 0 ? (int64_t)send_off[ids[t * K + lane]] + slot[t * K + lane] : -1;
    epf_dispatch_send_row_warp(me, &plan, x + (rank * T + t) * H, d, row, K);
  }
  /* 3. publish this rank's rows to every peer, then wait until every peer's rows are here */
  if (epf_arrive_last_block(&arrive[rank], 1, 1)) epf_dispatch_signal_block(me, &plan, epoch);
  (void)epf_dispatch_wait_block(me, &plan, epoch, w);
}

int main(void) {
  int ngpu = 0;
  const cudaError_t ge = cudaGetDeviceCount(&ngpu);
  if (ge != cudaSuccess || ngpu < 1) {
    fprintf(stderr, "this example needs 1 CUDA GPU(s): no CUDA driver / no GPU found (%s)\n", cudaGetErrorName(ge));
    return 77;
  }
  epf_config_t cfg = EPF_CONFIG_INIT; /* host.h (plain C): zero fields are defaults */
  cfg.nranks = R, cfg.num_experts = E, cfg.top_k = K, cfg.hidden = H, cfg.max_tokens_per_rank = T;
  cfg.expert_alignment = 1;           /* expert-major BF16 rows, each expert's right after the previous one's */
  epf_plan_t plan;
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  rc.index_type = EPF_INDEX_INT32;
  uint64_t rbytes = 0;
  if (epf_plan_compute(&cfg, &plan) != EPF_OK || epf_route_size(&plan, &rc, &rbytes) != EPF_OK) return 1;
  char *window, *route_buf; /* R slices of plan.total_bytes (rank r owns slice r); R route buffers */
  CK(cudaMalloc(&window, R * plan.total_bytes));
  CK(cudaMemset(window, 0, R * plan.total_bytes)); /* signals at epoch 0; a row nobody writes stays 0 */
  CK(cudaMalloc(&route_buf, R * rbytes));
  epf_route_t route;
  if (epf_route_init(&plan, &rc, route_buf, R * rbytes, R, 1u, 0, &route) != EPF_OK) return 1;

  uint16_t* x;      /* [R][T][H] BF16 rows, never 0 */
  int32_t* topk;    /* [R][T][K]: K distinct experts per token */
  uint32_t* arrive; /* one counter per rank, zeroed */
  CK(cudaMallocManaged(&x, R * T * H * sizeof(uint16_t)));
  CK(cudaMallocManaged(&topk, R * T * K * sizeof(int32_t)));
  CK(cudaMallocManaged(&arrive, R * sizeof(uint32_t)));
  for (int i = 0; i < R * T * H; ++i) x[i] = (uint16_t)(0x3f80 + i % 4093);
  for (int i = 0; i < R * T * K; ++i) topk[i] = (i / K * 5 + i % K * (E / K)) % E;
  memset(arrive, 0, R * sizeof(uint32_t));
  route_and_dispatch<<<R, 256, epf_route_smem_bytes(&route.layout, 256)>>>(
      route, epf_team_virtual(window, plan.total_bytes, 0, R), plan, x, topk, arrive,
      epf_wait_make(plan.timeout_ns, NULL, NULL, 0));
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());

  /* the check: rank d's receive rows are local expert by expert, source by source, in token order */
  char* got = (char*)malloc(plan.recv_capacity * plan.row_bytes);
  long long rows = 0, bad = 0;
  for (int d = 0; d < R; ++d) {
    CK(cudaMemcpy(got, window + d * plan.total_bytes + epf_plan_recv_token_offset(&plan, 0),
                  plan.recv_capacity * plan.row_bytes, cudaMemcpyDeviceToHost));
    int64_t r = 0; /* rank d's next receive row */
    for (int e = d * EL; e < (d + 1) * EL; ++e)
      for (int i = 0; i < R * T * K; ++i) /* copy i % K of token i / K (source rank i / K / T) */
        if (topk[i] == e) bad += memcmp(got + r++ * plan.row_bytes, x + i / K * H, H * 2) != 0;
    rows += r;
  }
  printf("route + dispatch in one kernel: %lld rows on %d virtual ranks, %lld misplaced: %s\n", rows, (int)R, bad,
         bad || rows != R * T * K ? "FAILED" : "OK");
  return bad || rows != R * T * K;
}
// example-end first_kernel
