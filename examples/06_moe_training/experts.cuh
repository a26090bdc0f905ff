/* experts.cuh — ex06_moe_training's expert stage on the GPU: plain kernels between the library's
 * launches (no communication) for the forward (SwiGLU per expert row), the rows' combine weights,
 * the backward (router-weight gradients, da / db), the weight gradients and the dx rows (into a
 * buffer, or in place over the receive rows: --dx-out). Part of the example
 * (one translation unit: main.cu includes it). */
#ifndef EX06_EXPERTS_CUH
#define EX06_EXPERTS_CUH

#include <stdint.h>

#include "epfuse/epfuse.cuh"
#include "epfuse/ht/kernels.cuh"
#include "expert_math.h"

/* ============================================================================================ */
/* The expert stage on the GPU (plain kernels, no communication)                                 */
/* ============================================================================================ */
/* Every kernel covers all virtual ranks: blockIdx.y = rank (route buffer index), and walks the
 * rank's local experts' segments (the route's RECV_SEGMENT: receive rows EXPERT_MAJOR, view rows
 * RANK_MAJOR). Per-row buffers are [R][expert_rows][...] in the same row order. */

/* the row a dispatch delivered to rank idx's expert stage: EXPERT_MAJOR the receive row in the
 * window (read in place), RANK_MAJOR row r of the rank's expand view */
static __device__ const uint16_t* ex06_arrived_row(const epf_plan_t& plan, const char* window, const uint16_t* view,
                                                   int64_t expert_rows, int idx, int64_t r) {
  if (plan.layout == EPF_LAYOUT_EXPERT_MAJOR)
    return (const uint16_t*)(window + (uint64_t)idx * plan.total_bytes + epf_plan_recv_token_offset(&plan, r));
  return (const uint16_t*)((const char*)view + ((uint64_t)idx * expert_rows + r) * plan.row_bytes);
}

/* the rows [begin, end) of local expert le on rank idx, clipped at the rows that exist */
static __device__ void ex06_segment(const epf_route_t& route, const epf_plan_t& plan, int64_t expert_rows, int idx, int le,
                                    int64_t* begin, int64_t* end) {
  const epf_route_segment_t sg = ((const epf_route_segment_t*)epf_route_ptr(&route, idx, EPF_ROUTE_RECV_SEGMENT))[le];
  const int64_t cap = plan.layout == EPF_LAYOUT_EXPERT_MAJOR ? plan.recv_capacity : expert_rows;
  *begin = sg.begin;
  *end = sg.begin + sg.count < cap ? sg.begin + sg.count : cap;
}

// example-begin experts_forward
/* experts_forward_kernel — out_row = bf16(f_e(x_row)) for every row; the x row is saved for the
 * backward (EXPERT_MAJOR: the backward's dy arrives in the same receive row). One block per row,
 * h (I floats) in shared memory. Grid (any, R). */
__global__ void experts_forward_kernel(epf_route_t route, epf_plan_t plan, const char* window, const uint16_t* view,
                                       int64_t expert_rows, int I, const uint16_t* w1, const uint16_t* w3,
                                       const uint16_t* w2, uint16_t* saved_x, uint16_t* out) {
  extern __shared__ float ex06_smem[]; /* h [I] */
  const int idx = (int)blockIdx.y, H = plan.hidden, EL = plan.experts_per_rank;
  for (int le = 0; le < EL; ++le) {
    const uint64_t e = (uint64_t)idx * EL + le;
    const uint16_t *W1 = w1 + e * H * I, *W3 = w3 + e * H * I, *W2 = w2 + e * I * H;
    int64_t begin, end;
    ex06_segment(route, plan, expert_rows, idx, le, &begin, &end);
    for (int64_t r = begin + blockIdx.x; r < end; r += gridDim.x) {
      const uint16_t* x = ex06_arrived_row(plan, window, view, expert_rows, idx, r);
      const uint64_t row = (uint64_t)idx * expert_rows + r;
      for (int h = threadIdx.x; h < H; h += blockDim.x) saved_x[row * H + h] = x[h];
      for (int i = threadIdx.x; i < I; i += blockDim.x) {
        float a, b;
        ex06_gate_up(x, W1, W3, H, I, i, &a, &b);
        ex06_smem[i] = ex06_swiglu(a, b);
      }
      __syncthreads();
      for (int j = threadIdx.x; j < H; j += blockDim.x) out[row * H + j] = ex06_bf16(ex06_down(ex06_smem, W2, I, H, j));
      __syncthreads();
    }
  }
}
// example-end experts_forward

// example-begin row_weights
/* row_weights_kernel — after epf_ht_combine_backward (+ expand): the combine weight of every expert
 * row, the sum in ascending k (FP32 from 0) of w[t,k] over every k of the token that reads the
 * row (a repeated expert's k read its first occurrence's row), into rw [R][expert_rows].
 *   EXPERT_MAJOR: the backward of combine wrote exactly that into the row's metadata weight.
 *   RANK_MAJOR: the metadata of a receive row lists the token's entries on this rank in k order,
 *   each with its own weight and its view row; the entries naming the same view row are summed.
 * One warp per row. Grid (any, R). */
__global__ void row_weights_kernel(epf_route_t route, epf_plan_t plan, char* window, int64_t expert_rows, float* rw) {
  const int idx = (int)blockIdx.y, lane = epf_lane_id();
  const epf_team_t me = epf_team_virtual(window, plan.total_bytes, idx, plan.nranks);
  const int warp = (int)(blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)), nwarps = (int)(gridDim.x * (blockDim.x >> 5));
  if (plan.layout == EPF_LAYOUT_EXPERT_MAJOR) {
    for (int le = 0; le < plan.experts_per_rank; ++le) {
      int64_t begin, end;
      ex06_segment(route, plan, expert_rows, idx, le, &begin, &end);
      for (int64_t r = begin + warp; r < end; r += nwarps)
        if (lane == 0)
          rw[(uint64_t)idx * expert_rows + r] = ((const epf_recv_meta_em_t*)epf_local_ptr(me, epf_plan_recv_meta_offset(&plan, r)))->weight;
    }
    return;
  }
  const epf_ht_view_t v = epf_ht_view(&route, me, &plan, idx, NULL, NULL);
  const int64_t rows = epf_ht_recv_rows(&v, &plan);
  for (int64_t r = warp; r < rows; r += nwarps) { /* warp-uniform */
    const epf_recv_meta_rm_lane_t m = epf_recv_meta_rm_read_warp(me, &plan, r, v.src_offset);
    const int64_t er = m.token_ok ? m.em_row : -1; /* lane j: entry j's view row */
    float sum = 0.f;
    for (int j = 0; j < 32; ++j) { /* warp-uniform; entries in k order */
      const long long ej = __shfl_sync(0xffffffffu, (long long)er, j);
      const float wj = __shfl_sync(0xffffffffu, m.weight, j);
      if (er >= 0 && ej == er) sum += wj;
    }
    const uint32_t same = __match_any_sync(0xffffffffu, (unsigned long long)er);
    if (er >= 0 && er < expert_rows && __ffs((int)same) - 1 == lane) rw[(uint64_t)idx * expert_rows + er] = sum;
  }
}
// example-end row_weights

// example-begin experts_backward
/* experts_backward_kernel — per row, with dy_row where the backward of combine delivered it (the
 * row x arrived in; RANK_MAJOR its view row) and w_row = rw[row]:
 *   wg[row]  = dot(dy_row, out_row)                     the router-weight gradient of the row
 *   d out    = w_row * dy_row;  dh = d out . W2^T;  (da, db) = the SwiGLU backward at (a, b)
 * into da, db, h (FP32 [R][expert_rows][I]) for weight_grads_kernel and experts_dx_kernel. a, b are
 * recomputed from the saved x row (same bits as the forward). The dx rows come later
 * (experts_dx_kernel): --dx-out window writes them over the dy rows, which weight_grads_kernel
 * still reads. One block per row. Grid (any, R). */
__global__ void experts_backward_kernel(epf_route_t route, epf_plan_t plan, const char* window, const uint16_t* view,
                                        int64_t expert_rows, int I, const uint16_t* w1, const uint16_t* w3,
                                        const uint16_t* w2, const uint16_t* saved_x, const uint16_t* out, const float* rw,
                                        float* wg, float* da_rows, float* db_rows, float* h_rows) {
  const int idx = (int)blockIdx.y, H = plan.hidden, EL = plan.experts_per_rank;
  for (int le = 0; le < EL; ++le) {
    const uint64_t e = (uint64_t)idx * EL + le;
    const uint16_t *W1 = w1 + e * H * I, *W3 = w3 + e * H * I, *W2 = w2 + e * I * H;
    int64_t begin, end;
    ex06_segment(route, plan, expert_rows, idx, le, &begin, &end);
    for (int64_t r = begin + blockIdx.x; r < end; r += gridDim.x) {
      const uint16_t* dy = ex06_arrived_row(plan, window, view, expert_rows, idx, r);
      const uint64_t row = (uint64_t)idx * expert_rows + r;
      const uint16_t* x = saved_x + row * H;
      const float w_row = rw[row];
      if (threadIdx.x == 0) wg[row] = ex06_wgrad(dy, out + row * H, H);
      for (int i = threadIdx.x; i < I; i += blockDim.x) {
        float a, b, dai, dbi;
        ex06_gate_up(x, W1, W3, H, I, i, &a, &b);
        ex06_swiglu_backward(a, b, ex06_dh(dy, w_row, W2, H, i), &dai, &dbi);
        da_rows[row * I + i] = dai;
        db_rows[row * I + i] = dbi;
        h_rows[row * I + i] = ex06_swiglu(a, b);
      }
    }
  }
}
// example-end experts_backward

/* weight_grads_kernel — the weight gradients of expert e (blockIdx.y), FP32 sums over its rows in
 * row order from 0:  dW1[h][i] += x[h] da[i],  dW3[h][i] += x[h] db[i],  dW2[i][j] += h[i] d out[j].
 * One thread per element; an expert with no rows gets zeros. Grid (any, E). */
__global__ void weight_grads_kernel(epf_route_t route, epf_plan_t plan, const char* window, const uint16_t* view,
                                    int64_t expert_rows, int I, const uint16_t* saved_x, const float* rw,
                                    const float* da_rows, const float* db_rows, const float* h_rows, float* dw1, float* dw3,
                                    float* dw2) {
  const int e = (int)blockIdx.y, H = plan.hidden, EL = plan.experts_per_rank, idx = e / EL;
  int64_t begin, end;
  ex06_segment(route, plan, expert_rows, idx, e % EL, &begin, &end);
  const uint64_t base = (uint64_t)idx * expert_rows, n = (uint64_t)H * I;
  for (uint64_t q = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; q < n; q += (uint64_t)gridDim.x * blockDim.x) {
    const uint64_t h = q / I, i = q % I;  /* dW1, dW3 [H][I] */
    const uint64_t i2 = q / H, j = q % H; /* dW2 [I][H] */
    float s1 = 0.f, s3 = 0.f, s2 = 0.f;
    for (int64_t r = begin; r < end; ++r) {
      const float xv = ex06_f(saved_x[(base + r) * H + h]);
      const uint16_t* dy = ex06_arrived_row(plan, window, view, expert_rows, idx, r);
      s1 = fmaf(xv, da_rows[(base + r) * I + i], s1);
      s3 = fmaf(xv, db_rows[(base + r) * I + i], s3);
      s2 = fmaf(h_rows[(base + r) * I + i2], ex06_dout(rw[base + r], dy[j]), s2);
    }
    dw1[(uint64_t)e * n + q] = s1;
    dw3[(uint64_t)e * n + q] = s3;
    dw2[(uint64_t)e * n + q] = s2;
  }
}

// example-begin experts_dx
/* experts_dx_kernel — the gradient of every row's input, dx_row = bf16(da . W1^T + db . W3^T), from
 * experts_backward_kernel's da, db rows, written where epf_ht_dispatch_backward reads it:
 *   dxr == NULL (--dx-out window, EXPERT_MAJOR): over the row's own receive row in the window, where
 *     x and then dy arrived. A BF16 plan has no EXPERT_OUT region, so that row IS where a pull
 *     source reads (epf_plan_expert_out_offset) and where a push starts from: the backward step
 *     says expert_out = NULL and the backward of dispatch moves nothing before its sources pull.
 *     It overwrites dy: run it after the last reader of dy (weight_grads_kernel).
 *   dxr != NULL (--dx-out buffer): row `row` of dxr [R][expert_rows][H] (step expert_out = dxr),
 *     which the backward of dispatch first puts into the window (pull) or pushes from.
 * The same bits either way. One block per row. Grid (any, R). */
__global__ void experts_dx_kernel(epf_route_t route, epf_plan_t plan, char* window, int64_t expert_rows, int I,
                                  const uint16_t* w1, const uint16_t* w3, const float* da_rows, const float* db_rows,
                                  uint16_t* dxr) {
  const int idx = (int)blockIdx.y, H = plan.hidden, EL = plan.experts_per_rank;
  for (int le = 0; le < EL; ++le) {
    const uint64_t e = (uint64_t)idx * EL + le;
    const uint16_t *W1 = w1 + e * H * I, *W3 = w3 + e * H * I;
    int64_t begin, end;
    ex06_segment(route, plan, expert_rows, idx, le, &begin, &end);
    for (int64_t r = begin + blockIdx.x; r < end; r += gridDim.x) {
      const uint64_t row = (uint64_t)idx * expert_rows + r;
      uint16_t* dx = dxr != NULL ? dxr + row * H
                                 : (uint16_t*)(window + (uint64_t)idx * plan.total_bytes + epf_plan_recv_token_offset(&plan, r));
      for (int j = threadIdx.x; j < H; j += blockDim.x) dx[j] = ex06_bf16(ex06_dx(da_rows + row * I, db_rows + row * I, W1, W3, I, j));
    }
  }
}
// example-end experts_dx

#endif /* EX06_EXPERTS_CUH */
