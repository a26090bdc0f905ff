/* ex_experts.cuh — the examples' expert stage on the GPU (not part of the library): a plain kernel
 * between dispatch and combine, no communication. The "expert" is a per-(local expert, rank)
 * scale, y = bf16(dequant(row) * ex_expert_factor(le, rank)), exact in BF16 arithmetic, so the CPU
 * references (ex_common.h: ex_ref_combine) match the GPU bit for bit.
 *   ex_expert_row_warp()      one row, one warp (any payload)
 *   ex_experts_kernel         HT: every received row of every local expert (route's segments)
 *   ex_ll_experts_kernel      LL expert-major: the rows the dispatch counted, in the window
 *   ex_ll_rm_experts_kernel   LL rank-major: the expert-major view the receive half expanded
 * Included by ex_common.h under nvcc. */
#ifndef EX_EXPERTS_CUH
#define EX_EXPERTS_CUH

#include <stdint.h>

#include "epfuse/ht/kernels.cuh"
#include "epfuse/ll/ll.cuh"
#include "ex_common.h"

/* ex_expert_row_warp — the examples' expert on ONE received row, one warp: y[h] =
 * bf16(dequant(q)[h] * f) for h in [0, plan.hidden) (8 elements per lane per step; hidden is a
 * multiple of 8). q: the row (plan.row_bytes: BF16, or E4M3 bytes); s: its compact scales (MXFP8:
 * one E8M0 byte per 32, per-128 FP8: one float per 128; unused for BF16). y may alias q (BF16 in
 * place): every lane reads its 8 elements before it writes them, and no other lane touches them. */
static inline __device__ void ex_expert_row_warp(const epf_plan_t* plan, const uint8_t* q, const uint8_t* s, float f,
                                                 uint16_t* y) {
  const int lane = epf_lane_id();
  const int mx = plan->payload == EPF_PAYLOAD_MXFP8;
  for (int h0 = lane * 8; h0 < plan->hidden; h0 += 256) {
    uint16_t vals[8];
    for (int i = 0; i < 8; ++i) {
      const int h = h0 + i;
      float v;
      if (plan->payload == EPF_PAYLOAD_BF16) {
        v = epf_bf16_to_float(((const uint16_t*)q)[h]);
      } else {
        const int col = mx ? h / 32 : h / 128;
        v = mx ? epf_mxfp8_dequantize_ref(q[h], s[col]) : epf_fp8_128_dequantize_ref(q[h], ((const float*)s)[col]);
      }
      vals[i] = __bfloat16_as_ushort(__float2bfloat16_rn(__fmul_rn(v, f)));
    }
    for (int i = 0; i < 8; ++i) y[h0 + i] = vals[i];
  }
}

/* ex_experts_kernel — the examples' HT expert stage (a plain kernel, no communication): for every
 * received copy of local expert le, y = bf16(dequant(row) * f(le, rank)) into expert_out
 * ([count][expert_rows][H] BF16, in the receive row order (EXPERT_MAJOR) or the expand view order
 * (RANK_MAJOR)). Grid (any, count); blockIdx.y = route index; rank = rank_base + index.
 * EXPERT_MAJOR reads the receive region in place (window + index * total_bytes: the local slice). */
// example-begin ht_experts
__global__ void ex_experts_kernel(epf_route_t route, epf_plan_t plan, const char* window, int rank_base,
                                  const uint8_t* view, const uint8_t* view_scales, int64_t expert_rows,
                                  uint16_t* expert_out) {
  const int index = (int)blockIdx.y, rank = rank_base + index;
  const epf_route_segment_t* seg = (const epf_route_segment_t*)epf_route_ptr(&route, index, EPF_ROUTE_RECV_SEGMENT);
  const char* base = window + (uint64_t)index * plan.total_bytes;
  const int gw = (int)(blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)), nw = (int)(gridDim.x * (blockDim.x >> 5));
  for (int le = 0; le < plan.experts_per_rank; ++le) {
    const float f = ex_expert_factor(le, rank);
    const int64_t cap = plan.layout == EPF_LAYOUT_EXPERT_MAJOR ? plan.recv_capacity : expert_rows;
    int64_t end = seg[le].begin + seg[le].count;
    if (end > cap) end = cap;
    for (int64_t r = seg[le].begin + gw; r < end; r += nw) {
      const uint8_t* q;
      const uint8_t* s = NULL;
      if (plan.layout == EPF_LAYOUT_EXPERT_MAJOR) {
        q = (const uint8_t*)base + epf_plan_recv_token_offset(&plan, r);
        if (plan.scale_bytes_per_row) s = (const uint8_t*)base + epf_plan_recv_scale_offset(&plan, r);
      } else {
        q = view + ((uint64_t)index * expert_rows + r) * plan.row_bytes;
        s = view_scales ? view_scales + ((uint64_t)index * expert_rows + r) * plan.scale_bytes_per_row : NULL;
      }
      ex_expert_row_warp(&plan, q, s, f, expert_out + ((uint64_t)index * expert_rows + r) * plan.hidden);
    }
  }
}
// example-end ht_experts

/* ex_ll_experts_kernel — the LL expert stage (no communication), every virtual rank in one grid
 * (blockIdx.y = rank): for each row the dispatch receive counted (fixed slot (le, src, j),
 * j < recv_counts[rank][le][src]), y = bf16(dequant(row) * f(le, rank)), one warp per row.
 * The rows stay in the window (zero copy) at epf_ll_recv_row(plan, round, le, src, j); the round
 * (its parity) is the dispatch's `round` output, read here on the device. y == NULL: y overwrites
 * the BF16 row in place (EPF_LL_Y_IN_PLACE / _PULL); else y is [R][recv_capacity][H] BF16 in the
 * fixed order (EPF_LL_Y_FIXED: row epf_ll_fixed_row(plan, le, src, j)). */
// example-begin ll_experts
__global__ void ex_ll_experts_kernel(epf_plan_t plan, char* window, const uint32_t* round, const int32_t* recv_counts,
                                     uint16_t* y) {
  const int R = plan.nranks, EL = plan.experts_per_rank;
  const int rank = (int)blockIdx.y;
  const int64_t rows = plan.recv_capacity; /* EL * R * T: one parity */
  const uint32_t epoch = round[rank];
  const int32_t* cnt = recv_counts + (int64_t)rank * EL * R;
  char* base = window + (uint64_t)rank * plan.total_bytes;
  const int64_t gw = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int64_t nw = (int64_t)gridDim.x * (blockDim.x >> 5);
  for (int64_t fr = gw; fr < rows; fr += nw) { /* warp-uniform; fr = epf_ll_fixed_row(&plan, le, src, j) */
    int le, src, j;
    epf_ll_fixed_row_split(&plan, fr, &le, &src, &j);
    if (j >= cnt[le * R + src]) continue;
    const int64_t wrow = epf_ll_recv_row(&plan, epoch, le, src, j);
    uint8_t* q = (uint8_t*)base + epf_plan_recv_token_offset(&plan, wrow);
    const uint8_t* s = plan.scale_bytes_per_row ? (const uint8_t*)base + epf_plan_recv_scale_offset(&plan, wrow) : NULL;
    uint16_t* out = y != NULL ? y + ((uint64_t)rank * rows + fr) * plan.hidden : (uint16_t*)q;
    ex_expert_row_warp(&plan, q, s, ex_expert_factor(le, rank), out);
  }
}
// example-end ll_experts

/* ex_ll_rm_experts_kernel — the same experts for a RANK_MAJOR LL plan: the receive half expanded
 * the rank-major rows into the expert-major view (packed_x / packed_scales: [R][EL * R * T] rows,
 * expert le's copies from source 0, then 1, ..., epf_ll_packed_row), exactly the view an
 * expert-major receive's packed output is; y goes to [R][EL * R * T][H] in the same (PACKED)
 * order. One warp per view row. */
__global__ void ex_ll_rm_experts_kernel(epf_plan_t plan, const uint8_t* view, const uint8_t* view_scales,
                                        const int32_t* recv_counts, uint16_t* y) {
  const int R = plan.nranks, EL = plan.experts_per_rank;
  const int rank = (int)blockIdx.y;
  const int64_t rows = (int64_t)EL * R * plan.max_tokens_per_rank; /* the view's rows per rank */
  const int32_t* cnt = recv_counts + (int64_t)rank * EL * R;
  const int64_t gw = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int64_t nw = (int64_t)gridDim.x * (blockDim.x >> 5);
  for (int64_t fr = gw; fr < rows; fr += nw) { /* fr = epf_ll_fixed_row(&plan, le, src, j) */
    int le, src, j, pos;
    epf_ll_fixed_row_split(&plan, fr, &le, &src, &j);
    if (j >= cnt[le * R + src]) continue;
    pos = j;
    for (int q = 0; q < src; ++q) pos += cnt[le * R + q]; /* copies of the sources before */
    const int64_t vr = (int64_t)rank * rows + epf_ll_packed_row(&plan, le, pos);
    ex_expert_row_warp(&plan, view + vr * plan.row_bytes,
                       view_scales ? view_scales + vr * plan.scale_bytes_per_row : NULL, ex_expert_factor(le, rank),
                       y + vr * plan.hidden);
  }
}

#endif /* EX_EXPERTS_CUH */
