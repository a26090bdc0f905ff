/* ex_ll.h — what the low-latency round examples share (07_low_latency, 09_low_latency_backward,
 * 10_stage_timing --mode ll; not part of the library), next to ex_vranks.h:
 *   ex_ll_plan_make()     the LL plan of the options, checked (host only: before the GPU check)
 *   ex_ll_want_counts()   the counts a round of this routing must deliver, and its copies
 *   ex_ll_window_make()   R window slices, signal words zeroed, data rows poisoned; the team
 *   ex_ll_bufs_make()     the round's per-rank buffers (inputs, out, counts, round, y, view, state)
 *   ex_ll_y_layout(), ex_ll_args_make()   where the experts' outputs go; the launch arguments
 *   ex_ll_check_counts()  after a round: every recv_counts entry and every rank's round output
 * 07_low_latency spells all of it out.
 */
#ifndef EX_LL_H
#define EX_LL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epfuse/ll/kernels.cuh"
#include "ex_vranks.h"

/* ex_ll_plan_make — the LL plan of the options. Nothing to budget: every (local expert, source)
 * pair owns T fixed receive slots per parity ([2][EL][R][T] rows per rank; recv_capacity stays 0 =
 * one parity), or with --layout rm every source T rows ([2][R][T]). --payload mxfp8 quantizes both
 * ways: an expert-major combine then pulls by default (the plan gets an EXPERT_OUT region, where
 * the expert side quantizes y), or pushes with --push (EPF_FLAG_COMBINE_PUSH, no EXPERT_OUT); a
 * rank-major one pushes its pre-reduced partials either way. Checked with epf_ll_plan_check. Host
 * only, pure: a program calls it before the GPU check. */
static inline epf_status_t ex_ll_plan_make(const ex_opts_t* o, epf_plan_t* plan) {
  epf_config_t cfg = EPF_CONFIG_INIT;
  cfg.nranks = o->R;
  cfg.num_experts = o->E;
  cfg.top_k = o->K;
  cfg.hidden = o->H;
  cfg.max_tokens_per_rank = o->T;
  cfg.mode = EPF_MODE_LL;
  cfg.layout = o->layout;
  cfg.payload = o->payload; /* quantized by the sender, once per token, for MXFP8 / FP8 */
  cfg.combine_payload = o->payload == EPF_PAYLOAD_MXFP8 ? EPF_PAYLOAD_MXFP8 : EPF_PAYLOAD_BF16;
  cfg.flags = o->push ? EPF_FLAG_COMBINE_PUSH : 0u;
  epf_status_t st = epf_plan_compute(&cfg, plan);
  if (st == EPF_OK) st = epf_ll_plan_check(plan);
  return st;
}

/* ex_ll_want_counts — what every rank must receive in an LL round: one copy per (token, distinct
 * expert), counted per (destination rank, local expert, source) as recv_counts holds them (both
 * layouts: the rank-major receive gives its expert-major view the same counts). Returns the
 * [R][EL][R] counts (malloc); *all_rows: those copies; *rm_rows: one per (token, distinct
 * destination rank), what a rank-major dispatch moves. */
static inline int32_t* ex_ll_want_counts(const ex_opts_t* o, const ex_inputs_t* in, int64_t* all_rows,
                                         int64_t* rm_rows) {
  const int R = o->R, T = o->T, K = o->K, EL = o->E / o->R;
  int32_t* want = (int32_t*)calloc((size_t)R * EL * R, 4);
  *all_rows = *rm_rows = 0;
  for (int s = 0; s < R; ++s)
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) {
        const int32_t* row = in->topk + ((int64_t)s * T + t) * K;
        int dup = 0, rdup = 0;
        for (int j = 0; j < k; ++j) {
          dup |= row[j] == row[k];
          rdup |= row[j] / EL == row[k] / EL;
        }
        *rm_rows += !rdup;
        if (dup) continue; /* LL sends a repeated expert once; the combine reuses that output */
        ++want[(int64_t)row[k] * R + s]; /* (d * EL + le) * R + s with e = d * EL + le */
        ++*all_rows;
      }
  return want;
}

/* ex_ll_poison_window — poison every data row of the window (receive rows, scales, metadata,
 * combine landing rows, the MXFP8 pull's EXPERT_OUT rows) of every rank; the signal words stay
 * zero. A row nobody wrote cannot pass a check. */
static inline void ex_ll_poison_window(const epf_plan_t* plan, char* window, int R) {
  static const int ids[] = {EPF_REGION_RECV_TOKENS, EPF_REGION_RECV_SCALES, EPF_REGION_RECV_META, EPF_REGION_COMBINE,
                            EPF_REGION_EXPERT_OUT};
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < 5; ++i)
      if (plan->region[ids[i]].bytes != 0)
        EX_CK(cudaMemset(window + (uint64_t)r * plan->total_bytes + plan->region[ids[i]].offset, 0xA5,
                         (size_t)plan->region[ids[i]].bytes));
}

/* ex_ll_window_make — R window slices of an LL plan: signal words zeroed (epochs start at 0), every
 * data row poisoned; returns the team of R virtual ranks over them */
static inline epf_team_t ex_ll_window_make(const epf_plan_t* plan, char** window) {
  const int R = plan->nranks;
  EX_CK(cudaMalloc((void**)window, (size_t)R * plan->total_bytes));
  EX_CK(cudaMemset(*window, 0, (size_t)R * plan->total_bytes));
  ex_ll_poison_window(plan, *window, R);
  return epf_team_virtual(*window, plan->total_bytes, 0, R);
}

/* ex_ll_bufs_t — the device side of an LL round over virtual ranks: R per-rank buffers each,
 * epf_ll_buffer_bytes apart (x, topk and out are simply [R][T][...]). Everything a round writes is
 * poisoned (out 0xA7; counts, round, y and the view 0xEE); the state is set by epf_ll_state_reset. */
typedef struct {
  void *x, *topk, *out;          /* [R][T][H] BF16, [R][T][K] int32, [R][T][H] BF16 */
  float* w;                      /* [R][T][K] */
  int32_t* counts;               /* out: [R][EL][R] rows per (local expert, source) */
  uint32_t* round;               /* out: [R] the round's epoch */
  uint16_t* y;                   /* [R][EL * R * T][H] BF16 expert outputs; NULL: they overwrite the rows */
  uint8_t *view, *view_scales;   /* RANK_MAJOR: the expert-major view the receive half expands into */
  epf_ll_state_t* state;         /* [R] */
  epf_error_record_t *rec_h, *rec_d;
} ex_ll_bufs_t;

static inline void ex_ll_bufs_make(const ex_opts_t* o, const ex_inputs_t* in, const epf_plan_t* plan, int y_buffer,
                                   ex_ll_bufs_t* b) {
  const size_t R = (size_t)o->R;
  const size_t out_bytes = R * epf_ll_buffer_bytes(plan, EPF_LL_BUF_X, EPF_INDEX_DEFAULT);
  const size_t counts_bytes = R * epf_ll_buffer_bytes(plan, EPF_LL_BUF_RECV_COUNTS, EPF_INDEX_DEFAULT);
  const size_t round_bytes = R * epf_ll_buffer_bytes(plan, EPF_LL_BUF_ROUND, EPF_INDEX_DEFAULT);
  b->y = NULL;
  b->view = b->view_scales = NULL;
  ex_upload_inputs(o, in, &b->x, &b->topk, &b->w); /* [R][T][...]: the epf_ll_buffer_bytes strides */
  EX_CK(cudaMalloc(&b->out, out_bytes));
  EX_CK(cudaMalloc((void**)&b->counts, counts_bytes));
  EX_CK(cudaMalloc((void**)&b->round, round_bytes));
  if (y_buffer) {
    const size_t y_bytes = R * epf_ll_buffer_bytes(plan, EPF_LL_BUF_Y, EPF_INDEX_DEFAULT);
    EX_CK(cudaMalloc((void**)&b->y, y_bytes));
    EX_CK(cudaMemset(b->y, 0xEE, y_bytes));
  }
  if (plan->layout == EPF_LAYOUT_RANK_MAJOR) {
    const size_t view_bytes = R * epf_ll_buffer_bytes(plan, EPF_LL_BUF_PACKED_X, EPF_INDEX_DEFAULT);
    EX_CK(cudaMalloc((void**)&b->view, view_bytes));
    EX_CK(cudaMemset(b->view, 0xEE, view_bytes));
    if (plan->scale_bytes_per_row)
      EX_CK(cudaMalloc((void**)&b->view_scales, R * epf_ll_buffer_bytes(plan, EPF_LL_BUF_PACKED_SCALES, EPF_INDEX_DEFAULT)));
  }
  EX_CK(cudaMalloc((void**)&b->state, R * sizeof(epf_ll_state_t)));
  EX_CK(cudaMemset(b->out, 0xA7, out_bytes)); /* poison */
  EX_CK(cudaMemset(b->counts, 0xEE, counts_bytes));
  EX_CK(cudaMemset(b->round, 0xEE, round_bytes));
  ex_record_make(&b->rec_h, &b->rec_d);
}

/* ex_ll_y_layout — where the experts' outputs go: BF16 expert-major overwrites the rows in place and
 * the sources pull (EPF_LL_Y_IN_PLACE_PULL); other expert-major payloads write a y buffer in the
 * fixed order (EPF_LL_Y_FIXED); rank-major writes y in the view's order and BF16 leaves the
 * pre-reduced partials for the sources to pull (EPF_LL_Y_PACKED_PULL), else pushes (EPF_LL_Y_PACKED) */
static inline int ex_ll_y_layout(const epf_plan_t* plan) {
  if (plan->layout == EPF_LAYOUT_RANK_MAJOR)
    return plan->payload == EPF_PAYLOAD_BF16 ? EPF_LL_Y_PACKED_PULL : EPF_LL_Y_PACKED;
  return plan->payload == EPF_PAYLOAD_BF16 ? EPF_LL_Y_IN_PLACE_PULL : EPF_LL_Y_FIXED;
}

/* ex_ll_args_make — the dispatch and combine arguments of an LL round over the buffers b, int32 ids,
 * T = o->T tokens per rank, the experts' outputs in y_layout */
static inline void ex_ll_args_make(const ex_opts_t* o, const ex_ll_bufs_t* b, int y_layout, epf_ll_dispatch_args_t* da,
                                   epf_ll_combine_args_t* ca) {
  memset(da, 0, sizeof(*da));
  da->x = b->x;
  da->topk_idx = b->topk;
  da->index_type = EPF_INDEX_INT32;
  da->topk_weights = b->w;
  da->num_tokens = o->T;
  da->recv_counts = b->counts;
  da->round = b->round;
  da->packed_x = b->view;
  da->packed_scales = b->view_scales;
  memset(ca, 0, sizeof(*ca));
  ca->y = b->y;
  ca->y_layout = y_layout;
  ca->recv_counts = b->counts;
  ca->topk_idx = b->topk;
  ca->index_type = EPF_INDEX_INT32;
  ca->topk_weights = b->w;
  ca->out = b->out;
  ca->num_tokens = o->T;
}

/* ex_ll_check_counts — after the round of epoch want_round (1: the first after epf_ll_state_reset):
 * every recv_counts[rank][local expert][source] against want_counts (ex_ll_want_counts) and every
 * rank's round output. 0 when they match; else prints the first mismatch and returns 1. */
static inline int ex_ll_check_counts(const epf_plan_t* plan, const ex_ll_bufs_t* b, const int32_t* want_counts,
                                     uint32_t want_round) {
  const int R = plan->nranks, EL = plan->experts_per_rank;
  const size_t cbytes = (size_t)R * epf_ll_buffer_bytes(plan, EPF_LL_BUF_RECV_COUNTS, EPF_INDEX_DEFAULT);
  int32_t* counts = (int32_t*)malloc(cbytes);
  uint32_t* rounds = (uint32_t*)malloc((size_t)R * 4);
  int bad = 0;
  EX_CK(cudaMemcpy(counts, b->counts, cbytes, cudaMemcpyDeviceToHost));
  EX_CK(cudaMemcpy(rounds, b->round, (size_t)R * 4, cudaMemcpyDeviceToHost));
  for (int i = 0; i < R * EL * R && !bad; ++i)
    if (counts[i] != want_counts[i]) {
      fprintf(stderr, "MISMATCH recv_counts rank %d expert %d source %d: got %d want %d\n", i / (EL * R), i / R % EL,
              i % R, counts[i], want_counts[i]);
      bad = 1;
    }
  for (int r = 0; r < R && !bad; ++r)
    if (rounds[r] != want_round) {
      fprintf(stderr, "MISMATCH round of rank %d: got %u want %u\n", r, rounds[r], want_round);
      bad = 1;
    }
  free(counts);
  free(rounds);
  return bad;
}

#endif /* EX_LL_H */
