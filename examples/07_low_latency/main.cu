/* 07_low_latency — one low-latency (LL) round of an 8-rank EP team on ONE GPU (virtual ranks), the
 * decode-time path: dispatch, experts, combine, checked bit for bit against a CPU reference.
 *
 * Learning objectives
 *   - Plan an LL window (cfg.mode = EPF_MODE_LL, checked with epf_ll_plan_check): nothing to
 *     budget; every (local expert, source) pair owns T fixed receive slots per parity.
 *   - Run one round with the ready-made launchers (ll/kernels.cuh): no route update (every pair has
 *     fixed slots, so nothing is exchanged before the rows move): epf_ll_launch_make +
 *     epf_ll_state_reset -> epf_ll_dispatch (send + receive fused, all R ranks in one launch; rows
 *     stay in the window, zero copy) -> your experts (they find the round's parity in the
 *     dispatch's `round` output, on the device) -> epf_ll_combine (k-order FP32 reduction, BF16 out).
 *   - Pick where the experts' outputs go (the y layout): with the BF16 payload the experts
 *     overwrite their inputs and the sources PULL the outputs (EPF_LL_Y_IN_PLACE_PULL); quantized
 *     payloads write y to a caller buffer (EPF_LL_Y_FIXED): with --payload mxfp8 the combine
 *     carries MXFP8 too and the sources pull it (the expert side quantizes y into its own window),
 *     --push makes it push; per-128 FP8 pushes BF16 rows.
 *   - --layout rm: one copy per (token, rank) in [2 parity][source][T] rows, expanded by the receive
 *     half into the expert-major view the experts read, and one pre-reduced partial per
 *     (token, rank) on the way back (BF16: pulled, EPF_LL_Y_PACKED_PULL; else pushed); the program
 *     prints the copies and link bytes it saves against expert-major.
 *   - Check the error record, every recv_counts[rank][expert][source], the round (epoch 1), then
 *     the combine output with the same CPU reference as the HT round (ex_ref_combine).
 * Key concepts: fixed slots [2 parity][local expert][source][T] (expert-major), epochs kept in
 *   epf_ll_state_t (round e uses the buffers of parity e & 1; every dispatch is followed by exactly
 *   one combine), per-rank buffers epf_ll_buffer_bytes apart (docs/low-latency.md).
 * The training direction of this round: 09_low_latency_backward; timed: 10_stage_timing --mode ll.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epfuse/epfuse.cuh"
#include "epfuse/ll/kernels.cuh"
#include "ex_ll.h"

static const char* usage =
    "[--ranks 8] [--tokens 128] [--hidden 7168] [--topk 8] [--experts 256] [--layout em|rm]\n"
    "          [--payload bf16|mxfp8|fp8] [--push] [--samples 512 | --verify-all] [--seed N] [--ctest]\n"
    "  One low-latency round of an R-rank EP team as virtual ranks on one GPU: fixed-slot dispatch ->\n"
    "  experts (a per-expert scale) -> combine, checked bit for bit against a CPU reference on\n"
    "  --samples tokens (all tokens with --verify-all).\n"
    "  --layout rm: one copy per (token, rank) + expand, pre-reduced combine; prints the bytes it saves\n"
    "  against expert-major. --payload mxfp8: MXFP8 both ways; expert-major pulls the combine (the\n"
    "  default) or, with --push, pushes; rank-major pushes it.\n"
    "  --ctest: exit 77 instead of 1 also when a GPU is there but unusable (a driver too old); with no\n"
    "           CUDA driver or no GPU at all the exit code is 77 either way (CTest reports \"Not Run\").\n";

int main(int argc, char** argv) {
  ex_opts_t o;
  if (ex_opts_parse(argc, argv, EPF_MODE_LL, EX_OPT_PUSH, usage, &o)) return 2;
  epf_plan_t plan; /* refuse what LL cannot run before touching the GPU */
  const epf_status_t pst = ex_ll_plan_make(&o, &plan);
  if (pst != EPF_OK) {
    fprintf(stderr, "%s: %s: %s\n", o.layout == EPF_LAYOUT_RANK_MAJOR ? "--layout rm" : "LL plan",
            epf_status_name(pst), epf_status_message(pst));
    return 2;
  }
  ex_gpu_or_exit(1, o.ctest);
  const int R = o.R, T = o.T, K = o.K;
  uint64_t seed = o.seed;
  ex_inputs_t in;
  ex_make_inputs(&o, &seed, &in);
  int64_t all_rows, rm_rows; /* what every rank must receive, per (rank, local expert, source) */
  int32_t* want_counts = ex_ll_want_counts(&o, &in, &all_rows, &rm_rows);

  /* ---- window, team, per-rank buffers; everything the round writes is poisoned first ---------- */
  char* window; /* R slices of plan.total_bytes: virtual rank r owns slice r */
  EX_CK(cudaMalloc(&window, (size_t)R * plan.total_bytes));
  EX_CK(cudaMemset(window, 0, (size_t)R * plan.total_bytes)); /* signal words (epochs) start at zero */
  ex_ll_poison_window(&plan, window, R);
  epf_team_t team = epf_team_virtual(window, plan.total_bytes, 0, R);

  /* BF16: the experts overwrite their inputs and the sources pull; FP8 rows are too narrow for
   * BF16 outputs, so y goes to a caller buffer: the MXFP8 combine pulls it quantized (the expert
   * side writes it into its own window; --push: into the sources'), per-128 FP8 pushes BF16.
   * Rank-major: the experts read the expanded view and write y in its (PACKED) order; the expert
   * side pre-reduces and, with BF16, leaves the partials in its window for the sources to pull
   * (PACKED_PULL); otherwise it pushes them. */
  const int rm = plan.layout == EPF_LAYOUT_RANK_MAJOR;
  const int in_place = !rm && plan.payload == EPF_PAYLOAD_BF16;
  const int y_layout = rm ? (plan.payload == EPF_PAYLOAD_BF16 ? EPF_LL_Y_PACKED_PULL : EPF_LL_Y_PACKED)
                          : in_place ? EPF_LL_Y_IN_PLACE_PULL : EPF_LL_Y_FIXED;
  const int pulls = epf_ll_combine_pulls(&plan, y_layout); /* the transport this plan and layout select */
  ex_ll_bufs_t b; /* ex_ll.h: inputs, out, counts, round, [y], [view], state, error record */
  ex_ll_bufs_make(&o, &in, &plan, !in_place, &b);

  // example-begin ll_round
  epf_ll_launch_t L = epf_ll_launch_make(&plan, team, b.state, b.rec_d, /*virtual_ranks=*/1);
  EX_CS(epf_ll_state_reset(&L, 0)); /* epochs 0, everyone active (with the zeroed window) */
  epf_ll_dispatch_args_t da;
  memset(&da, 0, sizeof(da));
  da.x = b.x;                  /* [R][T][H] BF16: per-rank buffers, epf_ll_buffer_bytes apart */
  da.topk_idx = b.topk;        /* [R][T][K] int32 */
  da.index_type = EPF_INDEX_INT32; /* the ids' type (0 would mean int64, as for the route) */
  da.topk_weights = b.w;       /* [R][T][K], carried in the metadata rows */
  da.num_tokens = T;
  da.recv_counts = b.counts;   /* out: [R][EL][R] rows per (local expert, source) */
  da.round = b.round;          /* out: [R] epoch of the round; its parity picks the rows */
  da.packed_x = b.view;        /* rank-major: the receive half expands into this view (NULL: EM) */
  da.packed_scales = b.view_scales;
  epf_ll_combine_args_t ca;
  memset(&ca, 0, sizeof(ca));
  ca.y = b.y;                  /* FIXED / PACKED: [R][EL * R * T][H] BF16; NULL in place */
  ca.y_layout = y_layout;      /* EM: IN_PLACE_PULL (BF16) or FIXED (MXFP8: pull by the plan);
                                  RM: PACKED_PULL (BF16) or PACKED */
  ca.recv_counts = b.counts;
  ca.topk_idx = b.topk;
  ca.index_type = EPF_INDEX_INT32;
  ca.topk_weights = b.w;
  ca.out = b.out;              /* [R][T][H] BF16 combine output */
  ca.num_tokens = T;

  EX_CS(epf_ll_dispatch(&L, &da, EPF_LL_BOTH, 0)); /* send + receive fused, all R ranks */
  if (!rm)
    ex_ll_experts_kernel<<<dim3(64, (unsigned)R), 256>>>(plan, window, b.round, b.counts, b.y);
  else
    ex_ll_rm_experts_kernel<<<dim3(64, (unsigned)R), 256>>>(plan, b.view, b.view_scales, b.counts, b.y);
  EX_CK(cudaGetLastError());
  EX_CS(epf_ll_combine(&L, &ca, EPF_LL_BOTH, 0));
  // example-end ll_round
  EX_CK(cudaDeviceSynchronize());

  /* ---- verify: error record, counts and round, then the same CPU reference as HT ------------- */
  if (ex_record_check(b.rec_h)) return 1;
  if (ex_ll_check_counts(&plan, &b, want_counts, 1u)) return 1; /* the first round after the reset: epoch 1 */
  if (ex_verify_out(&o, &plan, &in, b.out, &seed,
                    rm ? (pulls ? "low-latency rank-major (expand, pre-reduce, pull combine)"
                                : "low-latency rank-major (expand, pre-reduce, push combine)")
                    : in_place ? "low-latency expert-major (y in place, pull combine)"
                    : plan.combine_payload == EPF_PAYLOAD_MXFP8
                        ? (pulls ? "low-latency expert-major (y fixed buffer, MXFP8 pull combine)"
                                 : "low-latency expert-major (y fixed buffer, MXFP8 push combine)")
                        : "low-latency expert-major (y fixed buffer, push combine)"))
    return 1;
  {
    /* the link bytes of the two layouts on this routing: a row (payload + scales + metadata) per
     * copy there, a combine row per copy back (expert-major: per (token, expert); rank-major: per
     * (token, rank), the partial) */
    const double em_meta = (double)sizeof(epf_recv_meta_em_t), rm_meta = (double)epf_recv_meta_rm_bytes(K);
    const double rowb = (double)plan.row_bytes + plan.scale_bytes_per_row, cb = plan.combine_row_bytes;
    const double em_bytes = (double)all_rows * (rowb + em_meta + cb), rm_bytes = (double)rm_rows * (rowb + rm_meta + cb);
    printf("copies: expert-major %lld (token, expert) rows, rank-major %lld (token, rank) rows; link bytes "
           "(dispatch + combine) %.2f MB vs %.2f MB: rank-major saves %.1f%%\n",
           (long long)all_rows, (long long)rm_rows, em_bytes / 1e6, rm_bytes / 1e6, 100.0 * (1.0 - rm_bytes / em_bytes));
  }
  free(want_counts);
  return 0;
}
