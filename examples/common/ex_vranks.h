/* ex_vranks.h — what the round examples over virtual ranks share (01_virtual_ranks, 07_low_latency,
 * 08_backward, 09_low_latency_backward, 10_stage_timing; not part of the library):
 *   ex_opts_t, ex_opts_parse()   the shared flags: shape, layout, payload, sample, seed, --ctest
 *   ex_inputs_t, ex_make_inputs(), ex_upload_inputs()   BF16 rows, distinct experts, weights
 *   ex_verify_out()              a combine output against ex_ref_combine, bit for bit
 *   ex_ht_rows(), ex_ht_plan_make(), ex_ht_bufs_make(), ex_ht_step_make()   HT: the receive rows
 *                                of a routing (the capacity budget), the plan, the round's buffers
 *                                (inputs, poisoned output, expert outputs, view, state, error
 *                                record), its step — what 01_virtual_ranks spells out
 * The low-latency counterparts are in ex_ll.h.
 */
#ifndef EX_VRANKS_H
#define EX_VRANKS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epfuse/ht/kernels.cuh"
#include "ex_common.h"

typedef struct {
  int mode, R, T, H, K, E, layout, payload, push, iters, samples, verify_all, ctest;
  uint64_t seed;
} ex_opts_t;

#define EX_OPT_MODE 1u  /* --mode ht|ll */
#define EX_OPT_PUSH 2u  /* --push: an MXFP8 expert-major LL combine pushes instead of pulling */
#define EX_OPT_ITERS 4u /* --iters N: timed iterations */

/* ex_opts_parse — the flags of the round examples into *o. Defaults: 8 ranks, the DeepSeek-V3 shape
 * (hidden 7168, top-8 of 256 experts), T = 4096 tokens per rank for HT and 128 for LL, expert-major,
 * BF16, 20 timed iterations, a 512-token sample, seed 12345. mode: the program's mode (with
 * EX_OPT_MODE, --mode may change it); extra: the optional flags it accepts. --help prints
 * "usage: <argv0> <usage>" and exits 0; a bad argument prints why and the usage, and returns 2. */
static inline int ex_opts_parse(int argc, char** argv, int mode, unsigned extra, const char* usage, ex_opts_t* o) {
  o->mode = mode; o->R = 8; o->T = -1; o->H = 7168; o->K = 8; o->E = 256;
  o->layout = EPF_LAYOUT_EXPERT_MAJOR; o->payload = EPF_PAYLOAD_BF16; o->push = 0;
  o->iters = 20; o->samples = 512; o->verify_all = 0; o->ctest = 0; o->seed = 12345;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    int* num = !strcmp(a, "--ranks") ? &o->R : !strcmp(a, "--tokens") ? &o->T : !strcmp(a, "--hidden") ? &o->H
             : !strcmp(a, "--topk") ? &o->K : !strcmp(a, "--experts") ? &o->E : !strcmp(a, "--samples") ? &o->samples
             : (extra & EX_OPT_ITERS) && !strcmp(a, "--iters") ? &o->iters : NULL;
    if (num && v) { *num = atoi(v); ++i; continue; }
    if (!strcmp(a, "--seed") && v) { o->seed = strtoull(v, NULL, 0); ++i; continue; }
    if (!strcmp(a, "--verify-all")) { o->verify_all = 1; continue; }
    if (!strcmp(a, "--ctest")) { o->ctest = 1; continue; }
    if ((extra & EX_OPT_PUSH) && !strcmp(a, "--push")) { o->push = 1; continue; }
    if ((extra & EX_OPT_MODE) && !strcmp(a, "--mode") && v && (!strcmp(v, "ht") || !strcmp(v, "ll"))) {
      o->mode = !strcmp(v, "ll") ? EPF_MODE_LL : EPF_MODE_HT;
      ++i;
      continue;
    }
    if (!strcmp(a, "--layout") && v && (!strcmp(v, "em") || !strcmp(v, "rm"))) {
      o->layout = !strcmp(v, "rm") ? EPF_LAYOUT_RANK_MAJOR : EPF_LAYOUT_EXPERT_MAJOR;
      ++i;
      continue;
    }
    if (!strcmp(a, "--payload") && v && (!strcmp(v, "bf16") || !strcmp(v, "mxfp8") || !strcmp(v, "fp8"))) {
      o->payload = !strcmp(v, "bf16") ? EPF_PAYLOAD_BF16 : !strcmp(v, "mxfp8") ? EPF_PAYLOAD_MXFP8 : EPF_PAYLOAD_FP8_128;
      ++i;
      continue;
    }
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      printf("usage: %s %s", argv[0], usage);
      exit(0);
    }
    fprintf(stderr, "unknown argument, or a bad or missing value: %s\n", a);
    printf("usage: %s %s", argv[0], usage);
    return 2;
  }
  if (o->T == -1) o->T = o->mode == EPF_MODE_LL ? 128 : 4096; /* decode vs prefill batch per rank */
  if (o->R < 1 || o->T < 1 || o->K < 1 || o->E < o->R || o->E % o->R || o->iters < 1) {
    fprintf(stderr, "need ranks, tokens, topk, iters >= 1 and experts a multiple of ranks\n");
    printf("usage: %s %s", argv[0], usage);
    return 2;
  }
  return 0;
}

static inline const char* ex_payload_name(int p) {
  return p == EPF_PAYLOAD_BF16 ? "bf16" : p == EPF_PAYLOAD_MXFP8 ? "mxfp8" : "fp8-128";
}

/* host inputs, packed per virtual rank: x [R][T][H] BF16, topk [R][T][K] int32, w [R][T][K] */
typedef struct {
  uint16_t* x;
  int32_t* topk;
  float* w;
} ex_inputs_t;

/* BF16 rows, K distinct random experts per token (repeats only if K > E), weights; from *seed */
static inline void ex_make_inputs(const ex_opts_t* o, uint64_t* seed, ex_inputs_t* in) {
  const int H = o->H, K = o->K, E = o->E;
  const int64_t n = (int64_t)o->R * o->T;
  in->x = (uint16_t*)malloc((size_t)n * H * 2);
  in->topk = (int32_t*)malloc((size_t)n * K * 4);
  in->w = (float*)malloc((size_t)n * K * 4);
  if (!in->x || !in->topk || !in->w) {
    fprintf(stderr, "out of host memory for the inputs\n");
    exit(1);
  }
  for (int64_t i = 0; i < n * H; ++i) {
    const uint64_t r = ex_rand(seed);
    in->x[i] = ex_bf16_rne((float)((int64_t)(r % 20001) - 10000) / 1000.0f);
  }
  for (int64_t t = 0; t < n; ++t)
    for (int k = 0; k < K; ++k) {
      int e, dup;
      do {
        e = (int)(ex_rand(seed) % (uint64_t)E);
        dup = 0;
        for (int j = 0; j < k; ++j) dup |= in->topk[t * K + j] == e;
      } while (dup && K <= E);
      in->topk[t * K + k] = e;
      in->w[t * K + k] = (float)(ex_rand(seed) % 1000) / 997.0f;
    }
}

/* copy the inputs into fresh device buffers of the same [R][T][...] layout */
static inline void ex_upload_inputs(const ex_opts_t* o, const ex_inputs_t* in, void** d_x, void** d_topk, float** d_w) {
  const int64_t n = (int64_t)o->R * o->T;
  EX_CK(cudaMalloc(d_topk, (size_t)n * o->K * 4));
  EX_CK(cudaMalloc((void**)d_w, (size_t)n * o->K * 4));
  EX_CK(cudaMalloc(d_x, (size_t)n * o->H * 2));
  EX_CK(cudaMemcpy(*d_topk, in->topk, (size_t)n * o->K * 4, cudaMemcpyHostToDevice));
  EX_CK(cudaMemcpy(*d_w, in->w, (size_t)n * o->K * 4, cudaMemcpyHostToDevice));
  EX_CK(cudaMemcpy(*d_x, in->x, (size_t)n * o->H * 2, cudaMemcpyHostToDevice));
}

/* ex_verify_out — the combine output d_out ([R][T][H] BF16) against ex_ref_combine on --samples
 * tokens (all with --verify-all; sampled tokens drawn from *seed). Prints the banner and the
 * verdict ("verify: ... OK"); returns the number of tokens that differ. */
static inline int64_t ex_verify_out(const ex_opts_t* o, const epf_plan_t* plan, const ex_inputs_t* in,
                                    const void* d_out, uint64_t* seed, const char* what) {
  const int T = o->T, H = o->H, K = o->K;
  const int64_t n = (int64_t)o->R * T;
  uint16_t* out = (uint16_t*)malloc((size_t)n * H * 2);
  float* scratch = (float*)malloc((size_t)3 * H * 4);
  uint16_t* want = (uint16_t*)malloc((size_t)H * 2);
  EX_CK(cudaMemcpy(out, d_out, (size_t)n * H * 2, cudaMemcpyDeviceToHost));
  const int64_t nver = o->verify_all || o->samples >= n ? n : o->samples;
  int64_t bad = 0;
  for (int64_t i = 0; i < nver; ++i) {
    const int64_t t = o->verify_all || o->samples >= n ? i : (int64_t)(ex_rand(seed) % (uint64_t)n);
    ex_ref_combine(plan, in->x + t * H, in->topk + t * K, in->w + t * K, scratch, want);
    if (memcmp(want, out + t * H, (size_t)H * 2) != 0) {
      if (bad < 5) {
        int h = 0;
        while (want[h] == out[t * H + h]) ++h;
        fprintf(stderr, "MISMATCH rank %lld token %lld h %d: got %04x want %04x\n", (long long)(t / T),
                (long long)(t % T), h, out[t * H + h], want[h]);
      }
      ++bad;
    }
  }
  printf("epfuse demo: %d virtual ranks on one GPU, T=%d H=%d top-%d of %d experts, %s, payload %s\n", o->R, T, H, K,
         o->E, what, ex_payload_name(o->payload));
  printf("verify: %lld of %lld tokens bit-exact vs CPU reference%s: %s\n", (long long)(nver - bad), (long long)nver,
         nver < n ? " (sample; --verify-all for all)" : "", bad ? "FAILED" : "OK");
  free(out);
  free(scratch);
  free(want);
  return bad;
}

/* ex_ht_rows — what an HT round of this routing delivers: per rank, the receive rows (expert-major:
 * one per (token, expert); rank-major: one per (token, destination rank)) and the copies per
 * (token, expert); out: all receive rows, the most receive rows and the most copies on one rank. */
static inline void ex_ht_rows(const ex_opts_t* o, const ex_inputs_t* in, int64_t* all_rows, int64_t* max_rows,
                              int64_t* max_copies) {
  const int R = o->R, K = o->K, EL = o->E / o->R;
  const int64_t n = (int64_t)R * o->T;
  int64_t* rows = (int64_t*)calloc((size_t)R, 8);
  int64_t* copies = (int64_t*)calloc((size_t)R, 8);
  *all_rows = *max_rows = *max_copies = 0;
  for (int64_t t = 0; t < n; ++t)
    for (int k = 0; k < K; ++k) {
      const int d = in->topk[t * K + k] / EL;
      int first = 1; /* rank-major: one row per (token, destination rank) */
      for (int j = 0; j < k; ++j) first &= in->topk[t * K + j] / EL != d;
      ++copies[d];
      rows[d] += first;
    }
  for (int d = 0; d < R; ++d) {
    if (o->layout == EPF_LAYOUT_EXPERT_MAJOR) rows[d] = copies[d];
    *all_rows += rows[d];
    *max_rows = rows[d] > *max_rows ? rows[d] : *max_rows;
    *max_copies = copies[d] > *max_copies ? copies[d] : *max_copies;
  }
  free(rows);
  free(copies);
}

/* ex_ht_bufs_t — the device side of an HT round of the options over virtual ranks, [R][...] per
 * rank: inputs, the combine output (poisoned 0xA7: a row nobody wrote cannot pass), the experts'
 * outputs (expert_rows per rank: the receive capacity, or for rank-major the most copies on one
 * rank, plus room for the segments' padding), the rank-major view, the state (zeroed once) and the
 * host-mapped error record. */
typedef struct {
  void *x, *topk, *out;          /* [R][T][H] BF16, [R][T][K] int32, [R][T][H] BF16 */
  float* w;                      /* [R][T][K] */
  uint16_t* eo;                  /* [R][expert_rows][H] BF16 */
  uint8_t *view, *view_scales;   /* RANK_MAJOR: [R][expert_rows] rows (+ scales); NULL otherwise */
  epf_ht_state_t* state;         /* [R] */
  int64_t expert_rows;
  epf_error_record_t *rec_h, *rec_d;
} ex_ht_bufs_t;

static inline void ex_ht_bufs_make(const ex_opts_t* o, const ex_inputs_t* in, const epf_plan_t* plan,
                                   int64_t max_copies, ex_ht_bufs_t* b) {
  const int R = o->R;
  const int64_t n = (int64_t)R * o->T, H = o->H;
  const int rm = plan->layout == EPF_LAYOUT_RANK_MAJOR;
  b->expert_rows = (rm ? max_copies : plan->recv_capacity) + plan->experts_per_rank + 64;
  b->view = b->view_scales = NULL;
  ex_upload_inputs(o, in, &b->x, &b->topk, &b->w);
  EX_CK(cudaMalloc(&b->out, (size_t)(n * H * 2)));
  EX_CK(cudaMalloc((void**)&b->eo, (size_t)(R * b->expert_rows * H * 2)));
  if (rm) {
    EX_CK(cudaMalloc((void**)&b->view, (size_t)R * b->expert_rows * plan->row_bytes));
    if (plan->scale_bytes_per_row)
      EX_CK(cudaMalloc((void**)&b->view_scales, (size_t)R * b->expert_rows * plan->scale_bytes_per_row));
  }
  EX_CK(cudaMalloc((void**)&b->state, R * sizeof(epf_ht_state_t)));
  EX_CK(cudaMemset(b->state, 0, R * sizeof(epf_ht_state_t)));
  EX_CK(cudaMemset(b->out, 0xA7, (size_t)(n * H * 2)));
  ex_record_make(&b->rec_h, &b->rec_d);
}

/* ex_ht_plan_make — the HT plan of the options: o->layout, o->payload on the way, a BF16 combine,
 * expert_alignment 1, room for max_rows + 64 received rows (ex_ht_rows) */
static inline void ex_ht_plan_make(const ex_opts_t* o, int64_t max_rows, epf_plan_t* plan) {
  epf_config_t cfg = EPF_CONFIG_INIT;
  cfg.nranks = o->R;
  cfg.num_experts = o->E;
  cfg.top_k = o->K;
  cfg.hidden = o->H;
  cfg.max_tokens_per_rank = o->T;
  cfg.mode = EPF_MODE_HT;
  cfg.layout = o->layout;
  cfg.payload = o->payload;
  cfg.combine_payload = EPF_PAYLOAD_BF16;
  cfg.expert_alignment = 1;
  cfg.recv_capacity = max_rows + 64;
  EX_CS(epf_plan_compute(&cfg, plan));
}

/* ex_ht_step_make — the step of an HT round over the buffers b: inputs, output, expert outputs,
 * view, state, and a wait bounded by plan->timeout_ns that reports into b's error record */
static inline epf_ht_step_t ex_ht_step_make(const epf_plan_t* plan, const ex_ht_bufs_t* b) {
  epf_ht_step_t hs = EPF_HT_STEP_INIT;
  hs.x = b->x;
  hs.topk_weights = b->w;
  hs.out = b->out;
  hs.expert_out = b->eo;
  hs.em_view = b->view;
  hs.em_view_scales = b->view_scales;
  hs.state = b->state;
  hs.expert_rows = b->expert_rows;
  hs.wait = epf_wait_make(plan->timeout_ns, b->rec_d, NULL, 0);
  return hs;
}

#endif /* EX_VRANKS_H */
