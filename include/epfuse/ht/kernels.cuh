/* epfuse/ht/kernels.cuh — ready-made high-throughput dispatch, expand and combine kernels — part of epfuse v0.1
 *
 * What it is: the easy path and the benchmark path of high-throughput (HT) EP, with host
 * launchers. Each kernel is a short loop over the public blocks of ht/ht.cuh (which compose
 * ht/impl/dispatch.cuh, ht/impl/combine.cuh and quant/quant.cuh): a fused kernel is written the same way. One kernel serves a real rank (team from epf_nccl_team_query, one route buffer) and
 * VIRTUAL RANKS (R ranks in one grid on one GPU: route.count == plan.nranks, block b plays rank
 * b / blocks_per_rank; the grid must be co-resident, checked, else EPF_ERR_CO_RESIDENCY).
 * One HT round on every rank:
 *     epf_route_update            count exchange, slots and offsets (route/kernels.cuh)
 *     epf_ht_dispatch             rows into their final slots (+ quantize on the way), wait for peers
 *     [epf_ht_expand]             RANK_MAJOR only: the expert-major view, locally
 *     ... experts (the caller's kernels) ...
 *     epf_ht_combine              expert outputs back, weighted FP32 reduction in k order, BF16 out
 * and, for training, over the same route (no update in between; a layer's backward in reverse
 * layer order):
 *     epf_ht_combine_backward     dy into the forward's receive rows (a dispatch; [epf_ht_expand])
 *     ... the experts' backward (the caller's kernels) ...
 *     epf_ht_dispatch_backward    dx rows back to the tokens (a unit-weight combine)
 * The epoch of every signal is the route's epoch of that step (read on the device), so the whole
 * round can be captured in a CUDA graph and replayed with no host work.
 *
 * What it does NOT do: allocate (the caller owns the window, route buffers, inputs, outputs and
 * the small state), or run experts.
 *
 * Inputs with virtual ranks are packed per rank: rank r's x at r * max_tokens rows, its topk_idx
 * and topk_weights at r * max_tokens * top_k elements, its output at r * max_tokens rows, its
 * expert outputs / expert-major view at r * expert_rows rows (see epf_ht_step_t).
 *
 * Contents:
 *   epf_ht_state_t, epf_ht_step_t + EPF_HT_STEP_INIT (versioned: size / magic / version first),
 *   EPF_HT_THREADS (EPF_HT_SEND / _RECV / _BOTH: ht/ht.cuh)
 *   epf_ht_dispatch_kernel, epf_ht_expand_kernel, epf_ht_combine_kernel   the kernels the launchers run
 *   epf_status_t epf_ht_check(const epf_plan_t*, const epf_route_t*, const epf_ht_step_t*)       [host]
 *   epf_status_t epf_ht_dispatch(const epf_route_t*, epf_team_t, const epf_plan_t*, const epf_ht_step_t*,
 *                                const void* topk_idx, int halves, cudaStream_t)               [host]
 *   epf_status_t epf_ht_expand(route, team, plan, step, stream)        RANK_MAJOR -> expert view [host]
 *   epf_status_t epf_ht_combine(route, team, plan, step, topk_idx, stream)                      [host]
 * Training (the backward direction over the forward's route; docs/high-throughput.md "Training"):
 *   epf_ht_combine_backward_kernel, epf_ht_dispatch_backward_kernel
 *   epf_status_t epf_ht_combine_backward(route, team, plan, step, int halves, stream)  dy -> receive rows [host]
 *   epf_status_t epf_ht_dispatch_backward(route, team, plan, step, stream)      dx rows -> dx (unit weights) [host]
 *
 * Requirements: CUDA, sm_80+; sm_90 / sm_100 tested.
 */
#ifndef EPF_HT_KERNELS_CUH
#define EPF_HT_KERNELS_CUH

#include "../config.h"

#if !EPF_IS_CUDA
#error "epfuse/ht/kernels.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

#if !defined(__CUDACC_RTC__)
#include <cuda_runtime_api.h>
#endif

#include "../host.h"
#include "ht.cuh"
#include "../route/kernels.cuh"
#include "../quant/quant.cuh"
#include "../core/signal.cuh"
#include "../core/team.cuh"

EPF_BEGIN_DECLS

#define EPF_HT_THREADS 512 /* threads of every ready-made HT block */

/* Per-rank counters the ready-made kernels keep in device memory (zero at start; caller-owned:
 * cudaMemset once, then never touched by the host). One per rank, or per virtual rank. */
typedef struct epf_ht_state {
  uint32_t arrive[4]; /* blocks of a phase that finished, tagged with the step's epoch
                         (epf_arrive_last_block_epoch): dispatch, combine prepare, spare, spare */
  uint32_t reserved[4];
} epf_ht_state_t;

/* Most blocks per rank a ready-made HT launch takes (epf_ht_step_t.blocks_per_rank); the grid
 * must also be co-resident (EPF_ERR_CO_RESIDENCY). */
#define EPF_HT_MAX_BLOCKS_PER_RANK 1024

/* The step is a versioned struct (as epf_config_t, NCCL's ncclConfig_t): size, magic and version
 * first, set by EPF_HT_STEP_INIT (or, from a binding, epf_ht_step_init_sized of capi.h); fields are
 * only ever appended. Every launcher and epf_ht_check refuses a step whose magic is not
 * EPF_HT_STEP_MAGIC, whose version is 0 or whose size is below the first versioned layout
 * (EPF_HT_STEP_MIN_SIZE) with EPF_ERR_STRUCT_VERSION, before reading any other field: a step
 * filled by code compiled against an older, prefix-less epf_ht_step_t (120 or 144 bytes) is
 * refused instead of read past its end. A larger (newer) step is accepted; its tail is ignored. */
#define EPF_HT_STEP_MAGIC 0x53485045u /* "EPHS" little-endian */
#define EPF_HT_STEP_VERSION 1u        /* 1: the first versioned layout (160 bytes on LP64) */

/* Per-step operands (captured by value in a CUDA graph). Initialize with EPF_HT_STEP_INIT. */
typedef struct epf_ht_step {
  uint32_t size;              /* sizeof(epf_ht_step_t) as the caller compiled it */
  uint32_t magic;             /* EPF_HT_STEP_MAGIC */
  uint32_t version;           /* EPF_HT_STEP_VERSION */
  uint32_t reserved0;         /* must be 0 */
  const void* x;              /* [count][max_tokens] rows: BF16 [H], or plan.payload rows when x_quantized */
  const void* x_scales;       /* x_quantized with scales: [count][max_tokens][scale_bytes_per_row] compact */
  const float* topk_weights;  /* [count][max_tokens][top_k] */
  void* out;                  /* combine: [count][max_tokens][H] BF16 */
  const void* expert_out;     /* combine input, BF16 rows [count][expert_rows][H]: EXPERT_MAJOR in the
                                 receive row order, RANK_MAJOR in the expert-major view order; NULL:
                                 EXPERT_MAJOR BF16/BF16 pull only, outputs written in place over the
                                 received rows (RECV_TOKENS) */
  void* em_view;              /* RANK_MAJOR expand output: [count][expert_rows] payload rows */
  void* em_view_scales;       /* its compact scales (quantized payloads), [count][expert_rows][...],
                                 also when the window's scales are swizzled */
  epf_ht_state_t* state;      /* [count] */
  int64_t expert_rows;        /* rows per rank of expert_out / em_view. EXPERT_MAJOR with expert_out:
                                 one row per receive row, so at least plan.recv_capacity (the
                                 combine refuses less). RANK_MAJOR: rows of the expert-major view
                                 (route header recv_rows_em; always enough: recv_capacity *
                                 min(top_k, experts_per_rank) + experts_per_rank *
                                 (expert_alignment - 1)); copies whose view row is at or past it are
                                 not placed by the expand, are counted in wait.record->recv_overflow
                                 and contribute nothing to the combine */
  int32_t x_quantized;        /* 1: x (and x_scales) already in plan.payload format: forwarded byte for byte */
  int32_t blocks_per_rank;    /* 0 -> enough to fill the device; at most EPF_HT_MAX_BLOCKS_PER_RANK */
  epf_wait_t wait;            /* timeout (0 -> plan.timeout_ns), error record (host-mapped), abort
                                 word, mask */
  /* training (epf_ht_combine_backward / epf_ht_dispatch_backward; appended: the fields above keep
     their offsets) */
  const void* topk_idx;       /* the backward launchers' routing ids: the forward's topk_idx
                                 [count][max_tokens][top_k] (the route's index type), unchanged
                                 since the route update (the forward launchers take theirs as an
                                 argument) */
  const float* weight_grad;   /* backward of dispatch, optional: FP32 [count][expert_rows], one per
                                 expert_out row, in its order — the router-weight gradient of each
                                 receive row (dot(dy_row, out_row), from the expert stage); NULL:
                                 not carried */
  float* topk_weights_grad;   /* backward of dispatch, optional (with weight_grad): FP32
                                 [count][max_tokens][top_k], written for every k < top_k of every
                                 token t < T: the weight_grad of the row k reads (a repeat: its first
                                 occurrence's), 0 for -1 / invalid ids and dropped copies */
} epf_ht_step_t;

/* The smallest step a launcher reads: version 1, the first layout with the prefix. When fields are
 * appended this stays version 1's size, and a launcher reads an appended field only where
 * step->size covers it (0 = the default otherwise). */
#define EPF_HT_STEP_MIN_SIZE ((uint32_t)sizeof(epf_ht_step_t))

/* EPF_HT_STEP_INIT — the prefix set, every other field 0 / NULL (zero means default: default
 * blocks, the plan's timeout, no buffers). Every field is listed so -Wextra stays quiet. */
#define EPF_HT_STEP_INIT                                                                                   \
  {(uint32_t)sizeof(epf_ht_step_t), EPF_HT_STEP_MAGIC, EPF_HT_STEP_VERSION, 0u, NULL, NULL, NULL, NULL, NULL, \
   NULL, NULL, NULL, 0, 0, 0, {0u, NULL, NULL, NULL, 0, 0}, NULL, NULL, NULL}

/* epf__ht_kargs_t — the part of a step the kernels take by value: epf_ht_step_t up to `wait`, field
 * for field (the training fields reach the backward kernels as separate parameters). Why not the
 * whole step: a by-value kernel parameter struct above 128 bytes is compiled differently, and the
 * forward kernels' registers moved (dispatch 120 -> 116, combine 128 -> 127, expand 48 -> 56 on
 * sm_90) when the training fields made the step 144 bytes. */
typedef struct epf__ht_kargs {
  const void* x;
  const void* x_scales;
  const float* topk_weights;
  void* out;
  const void* expert_out;
  void* em_view;
  void* em_view_scales;
  epf_ht_state_t* state;
  int64_t expert_rows;
  int32_t x_quantized;
  int32_t blocks_per_rank;
  epf_wait_t wait;
} epf__ht_kargs_t;
#if defined(__cplusplus) && !defined(__CUDACC_RTC__)
static_assert(sizeof(epf__ht_kargs_t) == offsetof(epf_ht_step_t, topk_idx) - offsetof(epf_ht_step_t, x),
              "epf__ht_kargs_t: the fields of epf_ht_step_t from x to wait");
#endif

/* ---- kernels ----------------------------------------------------------------------------------- */

/* epf__ht_view_for_block — the view of the rank this block plays (virtual ranks: block b plays
 * rank b / bpr) over its packed inputs, and its place among the rank's blocks. */
EPF_DEVICE_INLINE epf_ht_view_t epf__ht_view_for_block(const epf_route_t* route, epf_team_t team, const epf_plan_t* plan,
                                                      const epf__ht_kargs_t* step, const void* topk_idx,
                                                      int virtual_ranks, int bpr, epf_wait_t* out_wait) {
  const epf_team_t t = epf_team_for_block(team, virtual_ranks, bpr);
  const int index = virtual_ranks ? (int)t.rank : 0;
  const uint64_t entries = (uint64_t)index * (uint64_t)route->layout.max_tokens * (uint64_t)route->layout.top_k;
  const void* topk = topk_idx != NULL ? (const void*)((const char*)topk_idx +
                                                      entries * (route->layout.index_type == EPF_INDEX_INT32 ? 4u : 8u))
                                      : NULL;
  *out_wait = step->wait;
  out_wait->rank = t.rank;
  return epf_ht_view(route, t, plan, index, topk, step->topk_weights != NULL ? step->topk_weights + entries : NULL);
}

/* epf_ht_dispatch_kernel — grid = ranks_in_launch * bpr blocks of EPF_HT_THREADS; `halves` as
 *   epf_ht_dispatch. */
static __global__ void __launch_bounds__(EPF_HT_THREADS, EPF_HT_DISPATCH_MIN_BLOCKS)
    epf_ht_dispatch_kernel(epf_route_t route, epf_team_t team, epf_plan_t plan, epf__ht_kargs_t step, const void* topk_idx,
                           int virtual_ranks, int bpr, int halves) {
  epf_wait_t w;
  const epf_ht_view_t v = epf__ht_view_for_block(&route, team, &plan, &step, topk_idx, virtual_ranks, bpr, &w);
  const int block = (int)(blockIdx.x % (unsigned)bpr), nwarps = (int)(blockDim.x >> 5);
  const int quantize = plan.payload != EPF_PAYLOAD_BF16 && !step.x_quantized;
  const uint64_t x_row = quantize ? (uint64_t)plan.hidden * 2u : plan.row_bytes;
  const uint64_t first = (uint64_t)v.index * route.layout.max_tokens;
  if (halves & EPF_HT_SEND) {
    uint32_t dropped = 0;
    int t;
    for (t = block * nwarps + epf_warp_id(); t < v.T; t += bpr * nwarps)
      dropped += epf_ht_dispatch_token_warp(
          &v, &plan, (const char*)step.x + (first + (uint64_t)t) * x_row,
          step.x_scales ? (const uint8_t*)step.x_scales + (first + (uint64_t)t) * plan.scale_bytes_per_row : NULL,
          quantize, t, &w);
    if (epf_lane_id() == 0 && w.record != NULL) epf_error_count_add(&w.record->recv_overflow, dropped);
    if (epf_arrive_last_block_epoch(&step.state[v.index].arrive[0], (uint32_t)bpr, v.epoch))
      epf_dispatch_signal_block(v.team, &plan, v.epoch);
  }
  if ((halves & EPF_HT_RECV) && epf_plan_scales_staged(&plan)) {
    /* GEMM-ready scales: every block waits (block 0 records a failure), then the rank's blocks
     * rearrange the staged runs together; the grid is co-resident (epf__ht_grid) */
    epf_wait_t wb = w;
    epf_status_t st;
    if (block != 0) wb.record = NULL;
    st = epf_dispatch_wait_block(v.team, &plan, v.epoch, wb);
    if (st == EPF_OK || st == EPF_ERR_PEER_MASKED) epf_dispatch_scales_finish_block(v.team, &plan, v.seg, block, bpr);
  } else if ((halves & EPF_HT_RECV) && block == 0) {
    (void)epf_dispatch_wait_block(v.team, &plan, v.epoch, w); /* recorded in w */
  }
}

/* epf_ht_expand_kernel — RANK_MAJOR receive rows into the expert-major view (step.em_view). */
static __global__ void epf_ht_expand_kernel(epf_route_t route, epf_team_t team, epf_plan_t plan, epf__ht_kargs_t step,
                                            int virtual_ranks, int bpr) {
  epf_wait_t w;
  const epf_ht_view_t v = epf__ht_view_for_block(&route, team, &plan, &step, NULL, virtual_ranks, bpr, &w);
  const int nwarps = (int)(blockDim.x >> 5);
  const int64_t rows = epf_ht_recv_rows(&v, &plan);
  const uint64_t first = (uint64_t)v.index * (uint64_t)step.expert_rows;
  char* view = (char*)step.em_view + first * plan.row_bytes;
  uint8_t* view_scales = step.em_view_scales ? (uint8_t*)step.em_view_scales + first * plan.scale_bytes_per_row : NULL;
  uint32_t over = 0u;
  int64_t r;
  for (r = (int64_t)(blockIdx.x % (unsigned)bpr) * nwarps + epf_warp_id(); r < rows; r += (int64_t)bpr * nwarps)
    over += epf_expand_row_warp(v.team, &plan, r, v.src_offset, view, view_scales, step.expert_rows, &w);
  if (epf_lane_id() == 0 && w.record != NULL) epf_error_count_add(&w.record->recv_overflow, over); /* never silent */
}

/* epf_ht_combine_kernel — expert side, arrive + signal, wait, source side (both halves). */
static __global__ void __launch_bounds__(EPF_HT_THREADS, 1)
    epf_ht_combine_kernel(epf_route_t route, epf_team_t team, epf_plan_t plan, epf__ht_kargs_t step, const void* topk_idx,
                          int virtual_ranks, int bpr) {
  epf_wait_t w;
  const epf_ht_view_t v = epf__ht_view_for_block(&route, team, &plan, &step, topk_idx, virtual_ranks, bpr, &w);
  const int nwarps = (int)(blockDim.x >> 5);
  const int warp = (int)(blockIdx.x % (unsigned)bpr) * nwarps + epf_warp_id(), nw = bpr * nwarps;
  const uint64_t first = (uint64_t)v.index * route.layout.max_tokens;
  const void* expert_out = step.expert_out != NULL ? (const void*)((const char*)step.expert_out +
                                                                   (uint64_t)v.index * (uint64_t)step.expert_rows *
                                                                       (uint64_t)plan.hidden * 2u)
                                                   : NULL;
  int t;
  epf_ht_combine_expert_warp(&v, &plan, expert_out, step.expert_rows, warp, nw, &w);
  if (epf_arrive_last_block_epoch(&step.state[v.index].arrive[1], (uint32_t)bpr, v.epoch))
    epf_combine_signal_block(v.team, &plan, v.epoch);
  /* a failed wait is recorded; masked or late peers contribute nothing under fault tolerance */
  (void)epf_combine_wait_block(v.team, &plan, v.epoch, w);
  for (t = warp; t < v.T; t += nw)
    epf_ht_combine_token_warp(&v, &plan, t, (char*)step.out + (first + (uint64_t)t) * (uint64_t)plan.hidden * 2u, &w);
}

/* epf__ht_epoch_store — the last block of a backward round stores the round's epoch back into the
 * route's epoch word (every block of the rank read the old one before it arrived). One thread. */
EPF_DEVICE_INLINE void epf__ht_epoch_store(const epf_route_t* route, int index, uint32_t epoch) {
  if (threadIdx.x == 0) *epf_route_epoch_ptr(route, index) = epoch;
}

/* epf_ht_combine_backward_kernel — the backward of combine: a dispatch of dy (step.x, BF16) over the
 *   forward's route at epoch + 1 (docs/high-throughput.md "Training"): SEND: block 0 of the rank
 *   signals SIG_COMBINE(epoch + 1) to every peer and every block waits for all of them (a team
 *   barrier: every rank finished the forward's combine, so nobody still reads the receive rows),
 *   then the sends, arrive, SIG_DISPATCH(epoch + 1) and the epoch store; RECV: wait for
 *   SIG_DISPATCH of the round's epoch (epoch + 1 in the same launch; the stored epoch alone). */
static __global__ void __launch_bounds__(EPF_HT_THREADS, EPF_HT_DISPATCH_MIN_BLOCKS)
    epf_ht_combine_backward_kernel(epf_route_t route, epf_team_t team, epf_plan_t plan, epf__ht_kargs_t step,
                                   const void* topk_idx, int virtual_ranks, int bpr, int halves) {
  epf_wait_t w;
  epf_ht_view_t v = epf__ht_view_for_block(&route, team, &plan, &step, topk_idx, virtual_ranks, bpr, &w);
  const int block = (int)(blockIdx.x % (unsigned)bpr), nwarps = (int)(blockDim.x >> 5);
  const uint64_t first = (uint64_t)v.index * route.layout.max_tokens;
  if (halves & EPF_HT_SEND) {
    uint32_t dropped = 0;
    epf_status_t st;
    int t;
    v.epoch += 1u;
    if (block == 0) epf_signal_peers_block(v.team, &plan, EPF_REGION_SIG_COMBINE, v.epoch);
    st = epf_wait_peers_block(v.team, &plan, EPF_REGION_SIG_COMBINE, v.epoch, w); /* recorded in w */
    if (st == EPF_OK || st == EPF_ERR_PEER_MASKED) /* never into a window a peer may still read */
      for (t = block * nwarps + epf_warp_id(); t < v.T; t += bpr * nwarps)
        dropped += epf_ht_combine_backward_token_warp(&v, &plan, (const char*)step.x + (first + (uint64_t)t) * plan.row_bytes,
                                                      t, &w);
    if (epf_lane_id() == 0 && w.record != NULL) epf_error_count_add(&w.record->recv_overflow, dropped);
    if (epf_arrive_last_block_epoch(&step.state[v.index].arrive[0], (uint32_t)bpr, v.epoch)) {
      epf_dispatch_signal_block(v.team, &plan, v.epoch);
      epf__ht_epoch_store(&route, v.index, v.epoch);
    }
  }
  if ((halves & EPF_HT_RECV) && block == 0) (void)epf_dispatch_wait_block(v.team, &plan, v.epoch, w); /* recorded in w */
}

/* epf_ht_dispatch_backward_kernel — the backward of dispatch: a unit-weight combine of the dx rows
 *   (step.expert_out, or in place) at the route's epoch + 1: expert side, arrive, SIG_COMBINE(epoch +
 *   1) and the epoch store, wait, source side (dx into step.out, router-weight gradients into
 *   step.topk_weights_grad when step.weight_grad is given). */
static __global__ void __launch_bounds__(EPF_HT_THREADS, 1)
    epf_ht_dispatch_backward_kernel(epf_route_t route, epf_team_t team, epf_plan_t plan, epf__ht_kargs_t step,
                                    const void* topk_idx, const float* weight_grad, float* topk_weights_grad,
                                    int virtual_ranks, int bpr) {
  epf_wait_t w;
  epf_ht_view_t v = epf__ht_view_for_block(&route, team, &plan, &step, topk_idx, virtual_ranks, bpr, &w);
  const int nwarps = (int)(blockDim.x >> 5);
  const int warp = (int)(blockIdx.x % (unsigned)bpr) * nwarps + epf_warp_id(), nw = bpr * nwarps;
  const uint64_t first = (uint64_t)v.index * route.layout.max_tokens;
  const uint64_t rows0 = (uint64_t)v.index * (uint64_t)step.expert_rows;
  const void* dx = step.expert_out != NULL ? (const void*)((const char*)step.expert_out + rows0 * (uint64_t)plan.hidden * 2u)
                                           : NULL;
  const bool grads = weight_grad != NULL && topk_weights_grad != NULL;
  int t;
  v.epoch += 1u;
  epf_ht_dispatch_backward_expert_warp(&v, &plan, dx, step.expert_rows, grads ? weight_grad + rows0 : NULL, warp, nw, &w);
  if (epf_arrive_last_block_epoch(&step.state[v.index].arrive[1], (uint32_t)bpr, v.epoch)) {
    epf_combine_signal_block(v.team, &plan, v.epoch);
    epf__ht_epoch_store(&route, v.index, v.epoch);
  }
  /* a failed wait is recorded; masked or late peers contribute nothing under fault tolerance */
  (void)epf_combine_wait_block(v.team, &plan, v.epoch, w);
  for (t = warp; t < v.T; t += nw)
    epf_ht_dispatch_backward_token_warp(&v, &plan, t, (char*)step.out + (first + (uint64_t)t) * (uint64_t)plan.hidden * 2u,
                                        grads ? topk_weights_grad + (first + (uint64_t)t) * (uint64_t)v.K : NULL, &w);
}

#if !defined(__CUDACC_RTC__) /* host launchers: nvcc only (NVRTC compiles the kernels above) */
/* ---- host launchers ---------------------------------------------------------------------------- */

/* epf_ht_check — validate a step against the plan and route before a launch (host; no CUDA calls).
 *   Statuses, in this order: EPF_ERR_INVALID_ARGUMENT (NULL plan / route / step),
 *   EPF_ERR_STRUCT_VERSION (the step's prefix: magic EPF_HT_STEP_MAGIC, version >= 1, size >=
 *   EPF_HT_STEP_MIN_SIZE; nothing else of the step is read before it passes),
 *   EPF_ERR_INVALID_ARGUMENT (step reserved0 != 0, NULL state),
 *   EPF_ERR_STRUCT_VERSION (plan prefix), EPF_ERR_MODE (not an HT plan), those of epf_route_check
 *   (route handle or layout prefix; route without memory, count not 1 or plan.nranks; base
 *   alignment; EPF_ERR_CONFIG_MISMATCH: a layout that is not the plan's, byte for byte — laid out
 *   for another plan, or damaged since), EPF_ERR_CONFIG_MISMATCH (laid out without the count
 *   exchange), the
 *   payloads' hidden-size rules, EPF_ERR_PAYLOAD (x_quantized with a BF16 payload),
 *   EPF_ERR_INVALID_ARGUMENT (blocks_per_rank outside [0, EPF_HT_MAX_BLOCKS_PER_RANK], negative
 *   expert_rows). */
EPF_INLINE epf_status_t epf_ht_check(const epf_plan_t* plan, const epf_route_t* route, const epf_ht_step_t* step) {
  epf_status_t st;
  if (plan == NULL || route == NULL || step == NULL) return EPF_ERR_INVALID_ARGUMENT;
  st = epf__check_prefix(step->size, step->magic, step->version, EPF_HT_STEP_MAGIC, EPF_HT_STEP_MIN_SIZE);
  if (st != EPF_OK) return st;
  if (step->reserved0 != 0u || step->state == NULL) return EPF_ERR_INVALID_ARGUMENT;
  st = epf_plan_check(plan);
  if (st != EPF_OK) return st;
  if (plan->mode != EPF_MODE_HT) return EPF_ERR_MODE;
  st = epf_route_check(route, plan); /* the handle, its layout re-derived from the plan */
  if (st != EPF_OK) return st;
  if (!route->layout.exchange) return EPF_ERR_CONFIG_MISMATCH; /* laid out without the count exchange */
  st = epf_quant_check(plan->hidden, plan->payload);
  if (st != EPF_OK) return st;
  if (plan->combine_payload != EPF_PAYLOAD_BF16) {
    st = epf_quant_check(plan->hidden, plan->combine_payload);
    if (st != EPF_OK) return st;
  }
  if (step->x_quantized && plan->payload == EPF_PAYLOAD_BF16) return EPF_ERR_PAYLOAD;
  if (step->blocks_per_rank < 0 || step->blocks_per_rank > EPF_HT_MAX_BLOCKS_PER_RANK || step->expert_rows < 0)
    return EPF_ERR_INVALID_ARGUMENT;
  return EPF_OK;
}

/* epf__ht_launch_check — epf_ht_check, then the team: its size (EPF_ERR_CONFIG_MISMATCH), its
 * memory (EPF_ERR_INVALID_ARGUMENT: no base and no table, or an affine stride below the plan's
 * slice), a real rank's rank (EPF_ERR_RANK). Host; no CUDA calls. */
EPF_INLINE epf_status_t epf__ht_launch_check(const epf_route_t* route, epf_team_t team, const epf_plan_t* plan,
                                             const epf_ht_step_t* step) {
  const epf_status_t st = epf_ht_check(plan, route, step);
  if (st != EPF_OK) return st;
  if (team.nranks != plan->nranks) return EPF_ERR_CONFIG_MISMATCH;
  if (team.peers == NULL && (team.base == NULL || (team.nranks > 1 && team.stride < plan->total_bytes)))
    return EPF_ERR_INVALID_ARGUMENT; /* slices would overlap (a team of one has no stride: NCCL gives 0) */
  if (route->count == 1 && (team.rank < 0 || team.rank >= plan->nranks)) return EPF_ERR_RANK;
  return EPF_OK;
}

/* epf__ht_step_for_launch — the step as the kernel gets it: a zero wait timeout means the plan's */
EPF_INLINE epf__ht_kargs_t epf__ht_step_for_launch(const epf_ht_step_t* step, const epf_plan_t* plan) {
  epf__ht_kargs_t s;
  s.x = step->x;
  s.x_scales = step->x_scales;
  s.topk_weights = step->topk_weights;
  s.out = step->out;
  s.expert_out = step->expert_out;
  s.em_view = step->em_view;
  s.em_view_scales = step->em_view_scales;
  s.state = step->state;
  s.expert_rows = step->expert_rows;
  s.x_quantized = step->x_quantized;
  s.blocks_per_rank = step->blocks_per_rank;
  s.wait = step->wait;
  if (s.wait.timeout_ns == 0u) s.wait.timeout_ns = plan->timeout_ns;
  return s;
}

EPF_INLINE int epf__ht_blocks_per_rank(const epf_ht_step_t* step, int count, const void* kernel) {
  int per_sm = 0, sms = 0, dev = 0, bpr;
  if (step->blocks_per_rank > 0) return step->blocks_per_rank;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, EPF_HT_THREADS, 0);
  bpr = (per_sm * sms) / count;
  if (bpr > 2 * sms / count + 1) bpr = 2 * sms / count + 1; /* about two resident blocks per SM */
  return bpr < 1 ? 1 : bpr;
}

/* epf__ht_grid — blocks per rank, and the co-residency check (ranks of one grid wait on each other). */
EPF_INLINE epf_status_t epf__ht_grid(const epf_route_t* route, const epf_plan_t* plan, const epf_ht_step_t* step,
                                     const void* kernel, int* out_bpr, int* out_virtual) {
  int dev = 0;
  const int virtual_ranks = route->count == plan->nranks;
  const int count = route->count;
  const int bpr = epf__ht_blocks_per_rank(step, count, kernel);
  int per_sm = 0;
  if (!epf__cuda_ok(cudaGetDevice(&dev))) return EPF_ERR_CUDA;
  /* a kernel that cannot hold one block on an SM (registers, shared memory) is not a co-residency
   * question: this build of it does not run here */
  if (!epf__cuda_ok(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, EPF_HT_THREADS, 0))) return EPF_ERR_CUDA;
  if (per_sm < 1) return EPF_ERR_NOT_SUPPORTED;
  if (epf_virtual_grid_check(kernel, EPF_HT_THREADS, 0, bpr * count, dev) != EPF_OK) return EPF_ERR_CO_RESIDENCY;
  *out_bpr = bpr;
  *out_virtual = virtual_ranks;
  return EPF_OK;
}

/* epf_ht_dispatch — launch the dispatch of this step: `halves` = EPF_HT_SEND, EPF_HT_RECV or EPF_HT_BOTH
 *   (separate launches let compute run between the halves). The route must have been updated for
 *   this step on the same stream (its epoch is the dispatch's epoch). Graph-capturable.
 *   Scope: host, on `stream`. Returns EPF_OK or a validation status; wait failures at run time go
 *   to step->wait.record. */
EPF_INLINE epf_status_t epf_ht_dispatch(const epf_route_t* route, epf_team_t team, const epf_plan_t* plan,
                                        const epf_ht_step_t* step, const void* topk_idx, int halves,
                                        cudaStream_t stream) {
  int bpr, virt;
  epf__ht_kargs_t s;
  epf_status_t st = epf__ht_launch_check(route, team, plan, step);
  if (st != EPF_OK) return st;
  if (step->x == NULL || step->topk_weights == NULL || topk_idx == NULL || (halves & EPF_HT_BOTH) == 0 || (halves & ~EPF_HT_BOTH) != 0)
    return EPF_ERR_INVALID_ARGUMENT;
  if (step->x_quantized && plan->payload != EPF_PAYLOAD_BF16 && step->x_scales == NULL) return EPF_ERR_INVALID_ARGUMENT;
  st = epf__ht_grid(route, plan, step, (const void*)epf_ht_dispatch_kernel, &bpr, &virt);
  if (st != EPF_OK) return st;
  s = epf__ht_step_for_launch(step, plan);
  epf_ht_dispatch_kernel<<<(unsigned)(bpr * route->count), EPF_HT_THREADS, 0, stream>>>(*route, team, *plan, s,
                                                                                         topk_idx, virt, bpr, halves);
  return epf__cuda_status(cudaGetLastError());
}

/* epf_ht_expand — RANK_MAJOR: copy every received row into its expert-major view rows
 *   (step->em_view, step->expert_rows rows per rank; rows beyond are skipped). After the dispatch's
 *   receive half, on the same stream. Local only. */
EPF_INLINE epf_status_t epf_ht_expand(const epf_route_t* route, epf_team_t team, const epf_plan_t* plan,
                                      const epf_ht_step_t* step, cudaStream_t stream) {
  int bpr, virt;
  epf__ht_kargs_t s;
  epf_status_t st = epf__ht_launch_check(route, team, plan, step);
  if (st != EPF_OK) return st;
  if (plan->layout != EPF_LAYOUT_RANK_MAJOR) return EPF_ERR_LAYOUT;
  if (step->em_view == NULL || step->expert_rows <= 0) return EPF_ERR_INVALID_ARGUMENT;
  st = epf__ht_grid(route, plan, step, (const void*)epf_ht_expand_kernel, &bpr, &virt);
  if (st != EPF_OK) return st;
  s = epf__ht_step_for_launch(step, plan);
  epf_ht_expand_kernel<<<(unsigned)(bpr * route->count), EPF_HT_THREADS, 0, stream>>>(*route, team, *plan, s,
                                                                                       virt, bpr);
  return epf__cuda_status(cudaGetLastError());
}

/* epf__ht_expert_out_in_window — does [expert_out, + count * expert_rows * H * 2) overlap the
 *   EXPERT_OUT region of any rank's slice of an affine team (virtual ranks, or an affine mapping)?
 *   Only a BF16 combine may read its outputs there in place (the put is skipped where source and
 *   destination coincide); an MXFP8 combine must quantize them into that region, so the launcher
 *   refuses the overlap. A table team's slices are not known on the host: 0. Host; pure. */
EPF_INLINE int epf__ht_expert_out_in_window(const epf_route_t* route, epf_team_t team, const epf_plan_t* plan,
                                            const epf_ht_step_t* step) {
  const epf_region_t r = plan->region[EPF_REGION_EXPERT_OUT];
  const uintptr_t b = (uintptr_t)step->expert_out;
  const uintptr_t e = b + (uintptr_t)route->count * (uintptr_t)step->expert_rows * (uintptr_t)plan->hidden * 2u;
  int p;
  if (team.base == NULL || step->expert_out == NULL || r.bytes == 0) return 0;
  for (p = 0; p < team.nranks; ++p) {
    const uintptr_t a = (uintptr_t)team.base + (uintptr_t)p * (uintptr_t)team.stride + (uintptr_t)r.offset;
    if (a < e && a + (uintptr_t)r.bytes > b) return 1;
  }
  return 0;
}

/* epf_ht_combine — launch the combine of this step (pull, or push with EPF_FLAG_COMBINE_PUSH):
 *   expert side puts its outputs in place and signals; source side waits and reduces in k order
 *   (RANK_MAJOR: pre-reduced per rank, then summed in rank order). Graph-capturable. A BF16
 *   combine may find its outputs already in the window (expert_out = the window's EXPERT_OUT
 *   rows, where the expert GEMM wrote them): nothing is put. With an MXFP8 combine an expert_out
 *   that overlaps an EXPERT_OUT region of an affine team is refused (EPF_ERR_INVALID_ARGUMENT). */
EPF_INLINE epf_status_t epf_ht_combine(const epf_route_t* route, epf_team_t team, const epf_plan_t* plan,
                                       const epf_ht_step_t* step, const void* topk_idx, cudaStream_t stream) {
  int bpr, virt;
  epf__ht_kargs_t s;
  epf_status_t st = epf__ht_launch_check(route, team, plan, step);
  if (st != EPF_OK) return st;
  if (step->out == NULL || step->topk_weights == NULL || topk_idx == NULL) return EPF_ERR_INVALID_ARGUMENT;
  if (step->expert_out == NULL && (plan->layout != EPF_LAYOUT_EXPERT_MAJOR || plan->payload != EPF_PAYLOAD_BF16 ||
                                   plan->combine_payload != EPF_PAYLOAD_BF16))
    return EPF_ERR_INVALID_ARGUMENT;
  /* expert_out's rows: one per receive row (EXPERT_MAJOR), at least one (RANK_MAJOR view) */
  if (step->expert_out != NULL &&
      (plan->layout == EPF_LAYOUT_EXPERT_MAJOR ? step->expert_rows < plan->recv_capacity : step->expert_rows < 1))
    return EPF_ERR_INVALID_ARGUMENT;
  /* outputs already in the window: a BF16 combine reads them in place; an MXFP8 one cannot */
  if (plan->combine_payload != EPF_PAYLOAD_BF16 && epf__ht_expert_out_in_window(route, team, plan, step))
    return EPF_ERR_INVALID_ARGUMENT;
  st = epf__ht_grid(route, plan, step, (const void*)epf_ht_combine_kernel, &bpr, &virt);
  if (st != EPF_OK) return st;
  s = epf__ht_step_for_launch(step, plan);
  epf_ht_combine_kernel<<<(unsigned)(bpr * route->count), EPF_HT_THREADS, 0, stream>>>(*route, team, *plan, s,
                                                                                        topk_idx, virt, bpr);
  return epf__cuda_status(cudaGetLastError());
}

/* epf__ht_backward_check — what both backward launchers need beyond epf__ht_launch_check: a BF16
 *   plan (payload and combine payload: EPF_ERR_NOT_SUPPORTED otherwise; gradients travel as BF16
 *   and accumulate in FP32), no caller-quantized rows (EPF_ERR_PAYLOAD), the routing ids
 *   (EPF_ERR_INVALID_ARGUMENT). Host; no CUDA calls. */
EPF_INLINE epf_status_t epf__ht_backward_check(const epf_route_t* route, epf_team_t team, const epf_plan_t* plan,
                                               const epf_ht_step_t* step) {
  const epf_status_t st = epf__ht_launch_check(route, team, plan, step);
  if (st != EPF_OK) return st;
  if (plan->payload != EPF_PAYLOAD_BF16 || plan->combine_payload != EPF_PAYLOAD_BF16) return EPF_ERR_NOT_SUPPORTED;
  if (step->x_quantized) return EPF_ERR_PAYLOAD;
  if (step->topk_idx == NULL) return EPF_ERR_INVALID_ARGUMENT;
  return EPF_OK;
}

/* epf_ht_combine_backward — the backward of combine for the step of `route` (its forward ran on this
 *   route; no route update in between): a dispatch of dy (step->x: BF16 [count][max_tokens][H])
 *   into the very receive rows the forward dispatch filled, unweighted, with metadata whose
 *   EXPERT_MAJOR weight is each row's combine weight (the sum of the token's weights of every k that
 *   reads the row, ascending k, FP32 from 0; RANK_MAJOR metadata lists every k with its weight, as
 *   the forward's). RANK_MAJOR then runs epf_ht_expand as in the forward. Copies the forward dropped
 *   at the capacity are dropped again and counted (recv_overflow).
 *   Epochs (docs/high-throughput.md "Training"): the send half runs at the route's epoch + 1 and
 *   stores it back (graph-capturable, no host work): it first meets every rank in a barrier at that
 *   epoch over SIG_COMBINE (every rank has finished its forward combine, so no peer still reads the
 *   rows it overwrites), then signals SIG_DISPATCH(epoch + 1). A separate EPF_HT_RECV launch
 *   follows the EPF_HT_SEND launch of the same round and waits at the stored epoch.
 *   halves: EPF_HT_SEND, EPF_HT_RECV or EPF_HT_BOTH. Uses step->x, topk_idx (the forward's ids),
 *   topk_weights, state, blocks_per_rank, wait.
 *   Statuses: those of epf_ht_check and the team checks, EPF_ERR_NOT_SUPPORTED (payload or combine
 *   payload not BF16), EPF_ERR_PAYLOAD (x_quantized), EPF_ERR_INVALID_ARGUMENT (NULL x, topk_idx or
 *   topk_weights; bad halves), EPF_ERR_CO_RESIDENCY / EPF_ERR_CUDA from the launch.
 *   Scope: host, on `stream`; every rank of the team calls it once per backward round. Wait
 *   failures at run time go to step->wait.record. */
EPF_INLINE epf_status_t epf_ht_combine_backward(const epf_route_t* route, epf_team_t team, const epf_plan_t* plan,
                                                const epf_ht_step_t* step, int halves, cudaStream_t stream) {
  int bpr, virt;
  epf__ht_kargs_t s;
  epf_status_t st = epf__ht_backward_check(route, team, plan, step);
  if (st != EPF_OK) return st;
  if (step->x == NULL || step->topk_weights == NULL || (halves & EPF_HT_BOTH) == 0 || (halves & ~EPF_HT_BOTH) != 0)
    return EPF_ERR_INVALID_ARGUMENT;
  st = epf__ht_grid(route, plan, step, (const void*)epf_ht_combine_backward_kernel, &bpr, &virt);
  if (st != EPF_OK) return st;
  s = epf__ht_step_for_launch(step, plan);
  epf_ht_combine_backward_kernel<<<(unsigned)(bpr * route->count), EPF_HT_THREADS, 0, stream>>>(
      *route, team, *plan, s, step->topk_idx, virt, bpr, halves);
  return epf__cuda_status(cudaGetLastError());
}

/* epf_ht_dispatch_backward — the backward of dispatch for the step of `route`, after
 *   epf_ht_combine_backward of the same round and the expert stage's backward: a combine of the
 *   gradients of the expert inputs back to their tokens with UNIT weights, where a repeat adds
 *   nothing: step->out (BF16 [count][max_tokens][H]) gets, for each token, the fma chain
 *   acc = fma(1, dx_row, acc) in FP32 from 0 over its first-occurrence copies in ascending k
 *   (EXPERT_MAJOR) or, RANK_MAJOR, over the per-rank partials (each the unit-weight chain over the
 *   rank's distinct view rows of the token in k order, rounded to BF16) in the order the token
 *   first names each rank; RNE to BF16. Pull, or push with EPF_FLAG_COMBINE_PUSH, as the forward.
 *   step->expert_out: the dx rows, BF16 [count][expert_rows][H] — EXPERT_MAJOR in receive-row order
 *   (expert_rows >= recv_capacity), RANK_MAJOR in the expert-major view's order (expert_rows >= 1);
 *   NULL: EXPERT_MAJOR only, the dx rows written in place over the receive rows (pulled from there,
 *   or pushed from there with EPF_FLAG_COMBINE_PUSH, as the forward combine does).
 *   Router-weight gradient (optional): step->weight_grad (FP32 [count][expert_rows], in expert_out's
 *   row order — EXPERT_MAJOR in place: expert_rows >= recv_capacity) and step->topk_weights_grad
 *   (FP32 [count][max_tokens][top_k]) both given: topk_weights_grad[t][k] = the weight_grad of the
 *   row k reads (a repeat: its first occurrence's), 0 for -1 / invalid ids and dropped copies. Both
 *   NULL: not carried. It travels in each receive row's metadata (epf_combine_weight_grad_ptr):
 *   both transports carry it.
 *   Epochs: the route's epoch + 1, stored back by the round (docs/high-throughput.md "Training").
 *   Uses step->expert_out, out, topk_idx (the forward's ids), expert_rows, weight_grad,
 *   topk_weights_grad, state, blocks_per_rank, wait (topk_weights is not read).
 *   Statuses: as epf_ht_combine_backward, and EPF_ERR_INVALID_ARGUMENT (NULL out; expert_out NULL
 *   outside EXPERT_MAJOR; too few expert_rows; only one of weight_grad / topk_weights_grad).
 *   Scope: host, on `stream`; every rank of the team calls it once per backward round.
 *   Graph-capturable. */
EPF_INLINE epf_status_t epf_ht_dispatch_backward(const epf_route_t* route, epf_team_t team, const epf_plan_t* plan,
                                                 const epf_ht_step_t* step, cudaStream_t stream) {
  int bpr, virt;
  epf__ht_kargs_t s;
  epf_status_t st = epf__ht_backward_check(route, team, plan, step);
  if (st != EPF_OK) return st;
  if (step->out == NULL) return EPF_ERR_INVALID_ARGUMENT;
  if (step->expert_out == NULL && plan->layout != EPF_LAYOUT_EXPERT_MAJOR) return EPF_ERR_INVALID_ARGUMENT;
  if ((step->weight_grad == NULL) != (step->topk_weights_grad == NULL)) return EPF_ERR_INVALID_ARGUMENT;
  /* rows of expert_out / weight_grad: one per receive row (EXPERT_MAJOR), at least one (RANK_MAJOR view) */
  if ((step->expert_out != NULL || step->weight_grad != NULL) &&
      (plan->layout == EPF_LAYOUT_EXPERT_MAJOR ? step->expert_rows < plan->recv_capacity : step->expert_rows < 1))
    return EPF_ERR_INVALID_ARGUMENT;
  st = epf__ht_grid(route, plan, step, (const void*)epf_ht_dispatch_backward_kernel, &bpr, &virt);
  if (st != EPF_OK) return st;
  s = epf__ht_step_for_launch(step, plan);
  epf_ht_dispatch_backward_kernel<<<(unsigned)(bpr * route->count), EPF_HT_THREADS, 0, stream>>>(
      *route, team, *plan, s, step->topk_idx, step->weight_grad, step->topk_weights_grad, virt, bpr);
  return epf__cuda_status(cudaGetLastError());
}

#endif /* !__CUDACC_RTC__ */
EPF_END_DECLS

#endif /* EPF_HT_KERNELS_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
