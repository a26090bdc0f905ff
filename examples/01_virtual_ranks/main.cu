/* 01_virtual_ranks — the demo: a whole 8-rank EP team on ONE GPU, one high-throughput round:
 * route, dispatch, experts, combine, checked bit for bit against a CPU reference.
 *
 * Learning objectives
 *   - Plan a window with host.h (epf_plan_compute) and give every virtual rank its own slice of
 *     one cudaMalloc: epf_team_virtual(window, plan.total_bytes, 0, R).
 *   - Run one high-throughput (HT) round with the ready-made launchers: epf_route_update (count
 *     exchange, slots, offsets) -> epf_ht_dispatch (rows into their final slots, quantized on the
 *     way for MXFP8 / FP8) -> [epf_ht_expand for rank-major] -> your experts -> epf_ht_combine
 *     (weighted FP32 reduction in k order, BF16 out).
 *   - Check the result bit for bit against a CPU reference (examples/common/ex_common.h).
 * Key concepts: virtual ranks (docs/concepts.md), the plan's regions (docs/layouts.md), epochs
 *   (every launch reads its epoch on the device, so a round is graph-capturable), caller-owned
 *   state (epf_ht_state_t zeroed once), the error record (host-mapped, read without a sync).
 * When to use it: to develop and test MoE kernels with every protocol path exercised but no
 *   cluster.
 * The same team, one idea each: 00_first_kernel (route + dispatch in a kernel of your own),
 *   07_low_latency (the LL round), 08_backward (the HT training direction), 09_low_latency_backward,
 *   10_stage_timing (each stage timed against a device-to-device copy).
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
    "          [--payload bf16|mxfp8|fp8] [--samples 512 | --verify-all] [--seed N] [--ctest]\n"
    "  One high-throughput round of an R-rank EP team as virtual ranks on one GPU: route update ->\n"
    "  dispatch -> [expand] -> experts (a per-expert scale) -> combine, checked bit for bit against a\n"
    "  CPU reference on --samples tokens (all tokens with --verify-all).\n"
    "  --ctest: exit 77 instead of 1 also when a GPU is there but unusable (a driver too old); with no\n"
    "           CUDA driver or no GPU at all the exit code is 77 either way (CTest reports \"Not Run\").\n"
    "  The low-latency round: ex07_low_latency; the training direction: ex08_backward,\n"
    "  ex09_low_latency_backward; the timing table: ex10_stage_timing.\n";

int main(int argc, char** argv) {
  ex_opts_t o;
  if (ex_opts_parse(argc, argv, EPF_MODE_HT, 0u, usage, &o)) return 2;
  ex_gpu_or_exit(1, o.ctest);
  const int R = o.R, T = o.T, H = o.H, K = o.K, E = o.E;
  uint64_t seed = o.seed;
  ex_inputs_t in;
  ex_make_inputs(&o, &seed, &in);
  int64_t all_rows, max_rows, max_copies; /* rows each rank receives: the receive region's budget */
  ex_ht_rows(&o, &in, &all_rows, &max_rows, &max_copies);

  /* ---- plan, window, team, route ------------------------------------------------------------- */
  // example-begin plan_and_team
  epf_config_t cfg = EPF_CONFIG_INIT; /* zero = default */
  cfg.nranks = R;
  cfg.num_experts = E;
  cfg.top_k = K;
  cfg.hidden = H;
  cfg.max_tokens_per_rank = T;
  cfg.mode = EPF_MODE_HT;
  cfg.layout = o.layout;
  cfg.payload = o.payload;           /* quantized on the way for MXFP8 / FP8 */
  cfg.combine_payload = EPF_PAYLOAD_BF16;
  cfg.expert_alignment = 1;
  cfg.recv_capacity = max_rows + 64; /* budgeted rows; anything past it is dropped and counted */
  epf_plan_t plan;
  EX_CS(epf_plan_compute(&cfg, &plan));

  char* window; /* R slices of plan.total_bytes: virtual rank r owns slice r */
  EX_CK(cudaMalloc(&window, (size_t)R * plan.total_bytes));
  EX_CK(cudaMemset(window, 0, (size_t)R * plan.total_bytes)); /* epochs start at zero */
  epf_team_t team = epf_team_virtual(window, plan.total_bytes, 0, R);

  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  rc.index_type = EPF_INDEX_INT32;
  uint64_t rbytes = 0;
  EX_CS(epf_route_size(&plan, &rc, &rbytes));
  void* route_buf;
  EX_CK(cudaMalloc(&route_buf, (size_t)rbytes * R)); /* one route buffer per virtual rank */
  epf_route_t route;
  EX_CS(epf_route_init(&plan, &rc, route_buf, rbytes * R, R, 1u, 0, &route));
  // example-end plan_and_team

  /* ---- the round's buffers (ex_vranks.h): inputs, output (poisoned), expert outputs, view, state,
   * the error record --------------------------------------------------------------------------- */
  ex_ht_bufs_t b;
  ex_ht_bufs_make(&o, &in, &plan, max_copies, &b);
  const void* d_topk = b.topk;
  const int64_t expert_rows = b.expert_rows;

  // example-begin ht_round
  epf_route_step_t rs = epf_route_step_make(d_topk, T, epf_wait_make(plan.timeout_ns, b.rec_d, NULL, 0));
  epf_ht_step_t hs = EPF_HT_STEP_INIT;
  hs.x = b.x;                  /* [R][T][H] BF16, packed per virtual rank */
  hs.topk_weights = b.w;       /* [R][T][K] */
  hs.out = b.out;              /* [R][T][H] BF16 combine output */
  hs.expert_out = b.eo;        /* [R][expert_rows][H] BF16, written by the experts */
  hs.em_view = b.view;         /* rank-major only: the expert-major view */
  hs.em_view_scales = b.view_scales;
  hs.state = b.state;          /* zeroed once */
  hs.expert_rows = expert_rows;
  hs.wait = epf_wait_make(plan.timeout_ns, b.rec_d, NULL, 0);

  EX_CS(epf_route_update(&route, team, &plan, &rs, 0));
  EX_CS(epf_ht_dispatch(&route, team, &plan, &hs, d_topk, EPF_HT_BOTH, 0));
  if (plan.layout == EPF_LAYOUT_RANK_MAJOR) EX_CS(epf_ht_expand(&route, team, &plan, &hs, 0));
  ex_experts_kernel<<<dim3(64, (unsigned)R), 256>>>(route, plan, window, 0, b.view, b.view_scales, expert_rows, b.eo);
  EX_CK(cudaGetLastError());
  EX_CS(epf_ht_combine(&route, team, &plan, &hs, d_topk, 0));
  // example-end ht_round
  EX_CK(cudaDeviceSynchronize());

  /* ---- verify: the error record, then the combine output against the CPU reference ------------ */
  if (ex_record_check(b.rec_h)) return 1;
  if (ex_verify_out(&o, &plan, &in, b.out, &seed, o.layout == EPF_LAYOUT_RANK_MAJOR ? "rank-major" : "expert-major"))
    return 1;
  printf("receive rows: %lld over %d ranks, at most %lld on one rank (capacity %lld)\n", (long long)all_rows, R,
         (long long)max_rows, (long long)plan.recv_capacity);
  return 0;
}
