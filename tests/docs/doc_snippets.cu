/* doc_snippets.cu — code shown in the docs that no example runs, compiled here (never run) so a
 * renamed or changed API breaks the build, not the reader. scripts/check_doc_snippets.py checks that
 * the docs quote these regions verbatim. */
#include <string.h>

#include "epfuse/epfuse.cuh"
#include "epfuse/ht/kernels.cuh"
#include "epfuse/ll/kernels.cuh"

/* docs/route.md — the route lifecycle */
epf_status_t epf_doc_route_lifecycle(const epf_plan_t* plan_in, epf_team_t team, const void* d_topk, int T,
                                     epf_error_record_t* rec, int64_t* d_total, cudaStream_t stream) {
  const epf_plan_t plan = *plan_in;
  void* buf = NULL;
  // example-begin route_lifecycle
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;     // zero = default
  rc.index_type = EPF_INDEX_INT64;                    // or INT32; K, T_max default to the plan's
  uint64_t bytes;
  epf_route_size(&plan, &rc, &bytes);                 // host.h, pure C
  cudaMalloc(&buf, bytes);                            // x plan.nranks for virtual ranks
  epf_route_t route;
  epf_route_init(&plan, &rc, buf, bytes, 1, 0, stream, &route);        // outside graph capture
  epf_route_step_t step = epf_route_step_make(d_topk, T, epf_wait_make(plan.timeout_ns, rec, NULL, 0));
  step.recv_total_mapped = d_total;                   // optional host-mapped int64
  epf_route_update(&route, team, &plan, &step, stream);                // every step; capturable
  // example-end route_lifecycle
  return EPF_OK;
}

/* docs/low-latency.md — usage of the ready-made LL launchers */
epf_status_t epf_doc_ll_usage(epf_team_t team, epf_ll_state_t* d_state, epf_error_record_t* d_err_record,
                              cudaStream_t stream) {
  // example-begin ll_usage
  epf_config_t cfg = EPF_CONFIG_INIT;
  cfg.nranks = 8; cfg.num_experts = 256; cfg.top_k = 8; cfg.hidden = 7168;
  cfg.max_tokens_per_rank = 128; cfg.mode = EPF_MODE_LL; cfg.flags = EPF_FLAG_FAULT_TOLERANT;
  epf_plan_t plan;  epf_plan_compute(&cfg, &plan);        // per-128 FP8 + hidden 2880 -> EPF_ERR_HIDDEN_ALIGNMENT
  // real rank: window from host_nccl.h, team from epf_nccl_team_query; state: cudaMalloc(1 state)
  epf_ll_launch_t L = epf_ll_launch_make(&plan, team, d_state, d_err_record, /*virtual_ranks=*/0);
  epf_ll_state_reset(&L, stream);
  epf_ll_dispatch_args_t d;  /* x, topk_idx, topk_weights, num_tokens, recv_counts, expert_counts, ... */
  memset(&d, 0, sizeof(d));
  epf_ll_dispatch(&L, &d, EPF_LL_SEND, stream);           // send half
  /* ... overlap: other kernels (e.g. attention of the next micro-batch) ... */
  epf_ll_dispatch(&L, &d, EPF_LL_RECV, stream);           // receive half: counts (+ packed copy)
  /* ... grouped GEMM, masked by recv_counts / expert_counts ... */
  epf_ll_combine_args_t c;   /* y, y_layout, recv_counts, topk_idx, topk_weights, out, num_tokens */
  memset(&c, 0, sizeof(c));
  epf_ll_combine(&L, &c, EPF_LL_BOTH, stream);
  // example-end ll_usage
  return EPF_OK;
}
