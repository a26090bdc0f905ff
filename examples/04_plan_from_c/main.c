/* 04_plan_from_c — plan an epfuse window from plain C (no CUDA, no NCCL).
 *
 * Learning objectives
 *   - host.h is a C11 header an engine can bind through FFI (Rust, Python ctypes/cffi): fixed-width
 *     fields, versioned structs, no allocation, one status enum.
 *   - epf_plan_compute resolves defaults, validates every limit and lays out every region of one
 *     rank's window slice; the same struct goes to the device by value.
 *   - bad input gets a named status and a sentence, never an abort.
 * Key concepts: zero = default (EPF_CONFIG_INIT), the plan's regions, the receive capacity.
 * When to use: at engine start-up, to size the symmetric window before ncclMemAlloc.
 * Performance notes: none; this is pure arithmetic.
 */
#include <stdio.h>

#include <epfuse/host.h>

static void print_plan(const char* title, const epf_plan_t* p) {
  int i;
  printf("%s: R=%d E=%d K=%d H=%d T=%d, %s, %s\n", title, p->nranks, p->num_experts, p->top_k, p->hidden,
         p->max_tokens_per_rank, p->mode == EPF_MODE_LL ? "low-latency" : "high-throughput",
         p->layout == EPF_LAYOUT_RANK_MAJOR ? "rank-major" : "expert-major");
  printf("  %-16s %14s %14s\n", "region", "offset", "bytes");
  for (i = 0; i < EPF_REGION_COUNT; ++i)
    printf("  %-16s %14llu %14llu\n", epf_region_name((epf_region_id_t)i),
           (unsigned long long)p->region[i].offset, (unsigned long long)p->region[i].bytes);
  printf("  total per rank   %14llu bytes (%.1f MiB), config hash %016llx\n\n",
         (unsigned long long)p->total_bytes, (double)p->total_bytes / (1 << 20),
         (unsigned long long)p->config_hash);
}

int main(void) {
  /* example-begin plan_from_c */
  epf_config_t cfg = EPF_CONFIG_INIT; /* zero fields mean "default" */
  epf_plan_t plan;
  epf_status_t st;
  cfg.nranks = 8;
  cfg.num_experts = 256;
  cfg.top_k = 8;
  cfg.hidden = 7168;
  cfg.max_tokens_per_rank = 4096;
  cfg.recv_capacity = 8 * 4096 * 2; /* budget rows instead of the worst case; overflow is counted */
  cfg.expert_alignment = 128;       /* grouped-GEMM friendly expert segments */
  st = epf_plan_compute(&cfg, &plan);
  if (st != EPF_OK) {
    fprintf(stderr, "%s: %s\n", epf_status_name(st), epf_status_message(st));
    return 1;
  }
  /* example-end plan_from_c */
  print_plan("HT, BF16", &plan);

  cfg.mode = EPF_MODE_LL;
  cfg.max_tokens_per_rank = 128;
  cfg.recv_capacity = 0; /* LL regions are fixed: [2][local expert][source][T] */
  cfg.payload = EPF_PAYLOAD_MXFP8;
  if (epf_plan_compute(&cfg, &plan) == EPF_OK) print_plan("LL, MXFP8", &plan);

  /* bad input: a named status and a sentence */
  cfg.payload = EPF_PAYLOAD_FP8_128;
  cfg.hidden = 2880; /* not a multiple of 128 */
  st = epf_plan_compute(&cfg, &plan);
  printf("per-128 FP8 with hidden 2880 -> %s: %s\n", epf_status_name(st), epf_status_message(st));
  return st == EPF_ERR_HIDDEN_ALIGNMENT ? 0 : 1;
}
