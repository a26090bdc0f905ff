/* epfuse/kernels_ht.cuh — ready-made high-throughput dispatch, expand and combine kernels — part of epfuse v0.1
 *
 * What it is: the easy path and the benchmark path of high-throughput (HT) EP, composed only from
 * the public blocks (route.cuh's arrays, dispatch.cuh, combine.cuh, quant.cuh), with host
 * launchers. One kernel serves a real rank (team from epf_nccl_team_query, one route buffer) and
 * VIRTUAL RANKS (R ranks in one grid on one GPU: route.count == plan.nranks, block b plays rank
 * b / blocks_per_rank; the grid must be co-resident, checked, else EPF_ERR_CO_RESIDENCY).
 * One HT round on every rank:
 *     epf_route_update            count exchange, slots and offsets (kernels_route.cuh)
 *     epf_ht_dispatch             rows into their final slots (+ quantize on the way), wait for peers
 *     [epf_ht_expand]             RANK_MAJOR only: the expert-major view, locally
 *     ... experts (the caller's kernels) ...
 *     epf_ht_combine              expert outputs back, weighted FP32 reduction in k order, BF16 out
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
 *   epf_ht_state_t, epf_ht_step_t, EPF_HT_SEND, EPF_HT_RECV
 *   epf_status_t epf_ht_check(const epf_plan_t*, const epf_route_t*, const epf_ht_step_t*)       [host]
 *   epf_status_t epf_ht_dispatch(const epf_route_t*, epf_team_t, const epf_plan_t*, const epf_ht_step_t*,
 *                                int phases, cudaStream_t)                                      [host]
 *   epf_status_t epf_ht_expand(route, team, plan, step, stream)        RANK_MAJOR -> expert view [host]
 *   epf_status_t epf_ht_combine(route, team, plan, step, stream)                                [host]
 *
 * Requirements: CUDA, sm_80+; sm_90 / sm_100 tested.
 */
#ifndef EPF_KERNELS_HT_CUH
#define EPF_KERNELS_HT_CUH

#include "config.h"

#if !EPF_IS_CUDA
#error "epfuse/kernels_ht.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

#if !defined(__CUDACC_RTC__)
#include <cuda_runtime_api.h>
#endif

#include "combine.cuh"
#include "dispatch.cuh"
#include "host.h"
#include "kernels_route.cuh"
#include "quant.cuh"
#include "signal.cuh"
#include "team.cuh"

EPF_BEGIN_DECLS

#define EPF_HT_SEND 0x1 /* the send half of dispatch */
#define EPF_HT_RECV 0x2 /* the receive half: wait for every peer */
#define EPF_HT_THREADS 512

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

/* Per-step operands (captured by value in a CUDA graph). */
typedef struct epf_ht_step {
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
} epf_ht_step_t;

/* ---- device helpers ---------------------------------------------------------------------------- */

/* epf__ht_expert — entry i of topk_idx (either index type) when it is an expert id in [0, E), else
 * -1. The ids are read again after the route update: checked here, never trusted as an index. */
EPF_DEVICE_INLINE int epf__ht_expert(const void* topk, int index_type, int64_t i, int E) {
  const int64_t v = index_type == EPF_INDEX_INT32 ? (int64_t)((const int32_t*)topk)[i] : ((const int64_t*)topk)[i];
  return v >= 0 && v < (int64_t)E ? (int)v : -1;
}

/* epf__ht_report_warp — report `status` once for the warp (its lowest lane with `bad`) into the
 * error record: counted there, the first one recorded in full. [collective:warp] */
EPF_DEVICE_INLINE void epf__ht_report_warp(const epf_wait_t* w, bool bad, epf_status_t status, const void* addr,
                                           uint64_t wanted, uint64_t seen) {
  const uint32_t m = __ballot_sync(0xffffffffu, bad);
  if (m != 0u && epf_lane_id() == __ffs((int)m) - 1) epf_error_report(w->record, status, w->rank, -1, addr, wanted, seen, 0);
}


/* One HT rank-block's view: team, route arrays, shapes. */
typedef struct epf__ht_ctx {
  epf_team_t team;
  int index;      /* route buffer / packed-input index: the virtual rank, or 0 */
  int block;      /* block index within the rank */
  int nblocks;    /* blocks per rank */
  int T, K, R, E, EL;
  int index_type;
  uint32_t epoch;
  const epf_route_header_t* hdr;
  const int32_t* dst_rank;   /* [T][K] */
  const int32_t* slot;       /* [T][K] */
  const int32_t* rm_slot;    /* [T][R] */
  const int32_t* send_offset;    /* [E] */
  const int32_t* send_rm_offset; /* [R] */
  const epf_route_segment_t* seg; /* [EL] */
  const int32_t* src_offset;      /* [EL][R + 1] */
  const int32_t* rm_offset;       /* [R + 1] */
  const void* topk;
} epf__ht_ctx_t;

EPF_DEVICE_INLINE epf__ht_ctx_t epf__ht_ctx(const epf_route_t* route, epf_team_t team, const epf_plan_t* plan,
                                            int virtual_ranks, int bpr, const void* topk_idx) {
  epf__ht_ctx_t c;
  c.team = epf_team_for_block(team, virtual_ranks, bpr);
  c.index = virtual_ranks ? (int)c.team.rank : 0;
  c.block = (int)(blockIdx.x % (unsigned)bpr);
  c.nblocks = bpr;
  c.hdr = (const epf_route_header_t*)epf_route_ptr(route, c.index, EPF_ROUTE_HEADER);
  c.T = c.hdr->num_tokens;
  c.K = route->layout.top_k;
  c.R = plan->nranks;
  c.E = plan->num_experts;
  c.EL = plan->experts_per_rank;
  c.index_type = route->layout.index_type;
  c.epoch = *epf_route_epoch_ptr(route, c.index);
  c.dst_rank = (const int32_t*)epf_route_ptr(route, c.index, EPF_ROUTE_DST_RANK);
  c.slot = (const int32_t*)epf_route_ptr(route, c.index, EPF_ROUTE_SLOT);
  c.rm_slot = (const int32_t*)epf_route_ptr(route, c.index, EPF_ROUTE_RM_SLOT);
  c.send_offset = (const int32_t*)epf_route_ptr(route, c.index, EPF_ROUTE_SEND_OFFSET);
  c.send_rm_offset = (const int32_t*)epf_route_ptr(route, c.index, EPF_ROUTE_SEND_RM_OFFSET);
  c.seg = (const epf_route_segment_t*)epf_route_ptr(route, c.index, EPF_ROUTE_RECV_SEGMENT);
  c.src_offset = (const int32_t*)epf_route_ptr(route, c.index, EPF_ROUTE_RECV_SRC_OFFSET);
  c.rm_offset = (const int32_t*)epf_route_ptr(route, c.index, EPF_ROUTE_RECV_RM_OFFSET);
  c.topk = (const char*)topk_idx +
           (uint64_t)c.index * route->layout.max_tokens * c.K * (c.index_type == EPF_INDEX_INT32 ? 4u : 8u);
  return c;
}

/* epf__ht_lane_route — lane k < K of token t: its expert (-1: not routed or out of range) and the
 * destination rank of its own copy from the route (-1: no copy of its own — not routed, dropped,
 * a repeat of an earlier k, or an id that no longer matches the route: *out_stale). */
EPF_DEVICE_INLINE int epf__ht_lane_route(const epf__ht_ctx_t* c, int t, int* out_e, bool* out_stale) {
  const int lane = epf_lane_id();
  int e = -1, d = -1;
  *out_stale = false;
  if (lane < c->K) {
    const int64_t i = (int64_t)t * c->K + lane;
    e = epf__ht_expert(c->topk, c->index_type, i, c->E);
    d = c->dst_rank[i];
    if (d >= 0 && (e < 0 || e / c->EL != d)) {
      *out_stale = true;
      d = -1;
    }
  }
  *out_e = e;
  return d;
}

/* The rank-major copy list of token t: lane j holds the j-th distinct destination rank among the
 * token's top-k, in order of first occurrence in k, with its receive row there; returns the number
 * of copies. [collective:warp] */
EPF_DEVICE_INLINE int epf__ht_rm_copies(const epf__ht_ctx_t* c, int t, int* out_rank, int64_t* out_row) {
  const int lane = epf_lane_id();
  const int d = lane < c->K ? c->dst_rank[(int64_t)t * c->K + lane] : -1;
  const uint32_t same = __match_any_sync(0xffffffffu, d);
  const uint32_t firsts = __ballot_sync(0xffffffffu, d >= 0 && (__ffs((int)same) - 1) == lane);
  const int n = __popc(firsts);
  const int src = lane < n ? (int)__fns(firsts, 0u, lane + 1) : 0;
  const int dj = __shfl_sync(0xffffffffu, d, src);
  *out_rank = lane < n ? dj : -1;
  *out_row = lane < n ? (int64_t)c->send_rm_offset[dj] + c->rm_slot[(int64_t)t * c->R + dj] : -1;
  return n;
}

/* ---- dispatch kernel --------------------------------------------------------------------------- */

static __global__ void __launch_bounds__(EPF_HT_THREADS, 2) epf__ht_dispatch_kernel(epf_route_t route, epf_team_t team, epf_plan_t plan, epf_ht_step_t step,
                                               const void* topk_idx, int virtual_ranks, int bpr, int phases) {
  const epf__ht_ctx_t c = epf__ht_ctx(&route, team, &plan, virtual_ranks, bpr, topk_idx);
  const int lane = epf_lane_id();
  const int nwarps = (int)(blockDim.x >> 5);
  const bool quant_on_the_way = plan.payload != EPF_PAYLOAD_BF16 && !step.x_quantized;
  const uint64_t x_row = quant_on_the_way ? (uint64_t)plan.hidden * 2u : plan.row_bytes;
  const uint64_t rank_rows = (uint64_t)c.index * route.layout.max_tokens;
  epf_wait_t w = step.wait;
  w.rank = c.team.rank;
  if (phases & EPF_HT_SEND) {
    uint32_t dropped = 0;
    int t;
    for (t = c.block * nwarps + epf_warp_id(); t < c.T; t += c.nblocks * nwarps) {
      const char* src = (const char*)step.x + (rank_rows + (uint64_t)t) * x_row;
      const uint8_t* src_scales =
          step.x_scales ? (const uint8_t*)step.x_scales + (rank_rows + (uint64_t)t) * plan.scale_bytes_per_row : NULL;
      int dst = -1, n, e;
      int64_t row = -1;
      bool stale;
      if (plan.layout == EPF_LAYOUT_EXPERT_MAJOR) {
        /* lane k: the copy of (t, k) unless it is a repeat (the route gave it no slot) */
        dst = epf__ht_lane_route(&c, t, &e, &stale);
        row = dst >= 0 ? (int64_t)c.send_offset[e] + c.slot[(int64_t)t * c.K + lane] : -1;
        n = c.K;
        epf__ht_report_warp(&w, stale, EPF_ERR_ROUTE_STALE, (const char*)c.dst_rank + ((int64_t)t * c.K + lane) * 4, 0, 0);
        if (dst >= 0)
          epf_dispatch_meta_em(c.team, &plan, dst, row, t, lane, e - dst * c.EL,
                               step.topk_weights[(rank_rows + (uint64_t)t) * c.K + lane]);
      } else {
        n = epf__ht_rm_copies(&c, t, &dst, &row);
        /* rank-major metadata: header, then the token's local experts / weights / expert-major slots
         * in k order — repeats included, with their first occurrence's rank and slot (they reuse
         * that copy's output in the pre-reduce, with their own weight) */
        {
          int ek;
          const int dr = epf__ht_lane_route(&c, t, &ek, &stale);
          const int first = epf_topk_first_lane_warp(ek);
          const int dk0 = __shfl_sync(0xffffffffu, dr, first);
          const int sk0 = __shfl_sync(0xffffffffu, lane < c.K ? c.slot[(int64_t)t * c.K + lane] : -1, first);
          const int dk = ek >= 0 ? dk0 : -1;
          const float wk = dk >= 0 ? step.topk_weights[(rank_rows + (uint64_t)t) * c.K + lane] : 0.f;
          const int sk = sk0;
          epf__ht_report_warp(&w, stale, EPF_ERR_ROUTE_STALE, (const char*)c.dst_rank + ((int64_t)t * c.K + lane) * 4, 0, 0);
          char* meta = lane < n && epf__row_dst(c.team, &plan, dst, row) != NULL
                           ? (char*)epf_peer_ptr(c.team, epf_plan_recv_meta_offset(&plan, row), dst)
                           : NULL;
          int k, used = 0;
          for (k = 0; k < c.K; ++k) {
            const int d_k = __shfl_sync(0xffffffffu, dk, k);
            const int e_k = __shfl_sync(0xffffffffu, ek, k);
            const float w_k = __shfl_sync(0xffffffffu, wk, k);
            const int s_k = __shfl_sync(0xffffffffu, sk, k);
            if (meta != NULL && d_k == dst) {
              ((int32_t*)(meta + 16))[used] = e_k - dst * c.EL;
              ((float*)(meta + 16 + 4 * c.K))[used] = w_k;
              ((int32_t*)(meta + 16 + 8 * c.K))[used] = s_k;
              ++used;
            }
          }
          if (meta != NULL) {
            ((int32_t*)meta)[0] = t;
            ((int32_t*)meta)[1] = c.team.rank;
            ((int32_t*)meta)[2] = used;
            ((int32_t*)meta)[3] = 0;
          }
        }
      }
      if (quant_on_the_way)
        dropped += epf_dispatch_send_row_quant_warp(c.team, &plan, src, dst, row, n);
      else {
        dropped += epf_dispatch_send_row_warp(c.team, &plan, src, dst, row, n);
        if (plan.payload != EPF_PAYLOAD_BF16 && src_scales != NULL)
          epf_dispatch_send_scales_warp(c.team, &plan, src_scales, dst, row, n);
      }
    }
    if (lane == 0 && dropped != 0u && w.record != NULL) epf_error_count_add(&w.record->recv_overflow, dropped);
    if (epf_arrive_last_block_epoch(&step.state[c.index].arrive[0], (uint32_t)c.nblocks, c.epoch))
      epf_dispatch_signal_block(c.team, &plan, c.epoch);
  }
  if ((phases & EPF_HT_RECV) && c.block == 0) {
    const epf_status_t st = epf_dispatch_wait_block(c.team, &plan, c.epoch, w);
    (void)st; /* failures are recorded in w.record by the wait itself */
  }
}

/* ---- expand (RANK_MAJOR -> expert-major view, local) ------------------------------------------ */

static __global__ void epf__ht_expand_kernel(epf_route_t route, epf_team_t team, epf_plan_t plan, epf_ht_step_t step,
                                             int virtual_ranks, int bpr) {
  const epf__ht_ctx_t c = epf__ht_ctx(&route, team, &plan, virtual_ranks, bpr, NULL);
  const int nwarps = (int)(blockDim.x >> 5);
  const int lane = epf_lane_id();
  const int64_t rows = c.rm_offset[c.R] < plan.recv_capacity ? c.rm_offset[c.R] : plan.recv_capacity;
  char* view = (char*)step.em_view + (uint64_t)c.index * (uint64_t)step.expert_rows * plan.row_bytes;
  uint8_t* view_scales = step.em_view_scales
                             ? (uint8_t*)step.em_view_scales + (uint64_t)c.index * (uint64_t)step.expert_rows * plan.scale_bytes_per_row
                             : NULL;
  epf_wait_t w = step.wait;
  uint32_t over = 0u;
  int64_t r;
  w.rank = c.team.rank;
  for (r = (int64_t)c.block * nwarps + epf_warp_id(); r < rows; r += (int64_t)c.nblocks * nwarps) {
    const int32_t* meta = (const int32_t*)epf_local_ptr(c.team, epf_plan_recv_meta_offset(&plan, r));
    const int s = meta[1], n = meta[2];
    /* received metadata is checked before it forms an address: source, entry count, then each
     * entry's local expert and slot */
    const bool hdr_ok = s >= 0 && s < c.R && n >= 0 && n <= c.K;
    const int le = hdr_ok && lane < n ? meta[4 + lane] : -1;
    const int sl = hdr_ok && lane < n ? meta[4 + 2 * c.K + lane] : -1;
    const bool ent_ok = le >= 0 && le < c.EL && sl >= 0;
    const int64_t em_row = ent_ok ? (int64_t)c.src_offset[le * (c.R + 1) + s] + sl : -1;
    /* a repeated expert lists its first occurrence's view row again: place each row once */
    const uint32_t same = __match_any_sync(0xffffffffu, em_row >= 0 ? (unsigned long long)em_row
                                                                    : ~(unsigned long long)lane);
    const bool lead = em_row >= 0 && __ffs((int)same) - 1 == lane;
    const char* src = (const char*)epf_local_ptr(c.team, epf_plan_recv_token_offset(&plan, r));
    uint32_t m;
    epf__ht_report_warp(&w, hdr_ok ? lane < n && !ent_ok : lane == 0, EPF_ERR_BAD_METADATA, meta, 0, 0);
    over += (uint32_t)__popc(__ballot_sync(0xffffffffu, lead && em_row >= step.expert_rows));
    for (m = __ballot_sync(0xffffffffu, lead && em_row < step.expert_rows); m != 0u; m &= m - 1u) {
      const int j = __ffs((int)m) - 1;
      const int64_t er = __shfl_sync(0xffffffffu, (long long)em_row, j);
      epf_copy_row_warp(view + (uint64_t)er * plan.row_bytes, src, plan.row_bytes);
      if (view_scales != NULL) { /* the view's scales are compact, whatever the window's layout */
        uint32_t b;
        if (plan.scale_layout == EPF_SCALE_LAYOUT_COMPACT) {
          const uint8_t* ss = (const uint8_t*)epf_local_ptr(c.team, epf_plan_recv_scale_offset(&plan, r));
          for (b = (uint32_t)lane; b < plan.scale_bytes_per_row; b += 32)
            view_scales[(uint64_t)er * plan.scale_bytes_per_row + b] = ss[b];
        } else { /* swizzled 128x4 (MXFP8: one byte per column) */
          for (b = (uint32_t)lane; b < plan.scale_bytes_per_row; b += 32)
            view_scales[(uint64_t)er * plan.scale_bytes_per_row + b] =
                *(const uint8_t*)epf_local_ptr(c.team, epf_recv_scale_col_offset(&plan, r, (int)b));
        }
      }
    }
  }
  /* copies past the view's expert_rows: dropped here, counted (never silent) */
  if (lane == 0 && over != 0u && w.record != NULL) epf_error_count_add(&w.record->recv_overflow, over);
}

/* ---- combine ---------------------------------------------------------------------------------- */

/* The expert output row for receive row `r` (EM) or expert-major view row (RM), BF16, local. */
EPF_DEVICE_INLINE const void* epf__ht_expert_row(const epf__ht_ctx_t* c, const epf_plan_t* plan,
                                                 const epf_ht_step_t* step, int64_t row) {
  if (step->expert_out == NULL) return epf_local_ptr(c->team, epf_plan_recv_token_offset(plan, row));
  return (const char*)step->expert_out + ((uint64_t)c->index * (uint64_t)step->expert_rows + (uint64_t)row) *
                                             (uint64_t)plan->hidden * 2u;
}

static __global__ void __launch_bounds__(EPF_HT_THREADS, 1) epf__ht_combine_kernel(epf_route_t route, epf_team_t team, epf_plan_t plan, epf_ht_step_t step,
                                              const void* topk_idx, int virtual_ranks, int bpr) {
  const epf__ht_ctx_t c = epf__ht_ctx(&route, team, &plan, virtual_ranks, bpr, topk_idx);
  const int lane = epf_lane_id();
  const int nwarps = (int)(blockDim.x >> 5);
  const int gw = c.block * nwarps + epf_warp_id(), nw = c.nblocks * nwarps;
  const bool push = (plan.flags & EPF_FLAG_COMBINE_PUSH) != 0u;
  const bool em = plan.layout == EPF_LAYOUT_EXPERT_MAJOR;
  const uint64_t rank_rows = (uint64_t)c.index * route.layout.max_tokens;
  epf_wait_t w = step.wait;
  w.rank = c.team.rank;

  /* phase A, expert side: put every received row's output where its source will read it */
  if (em) {
    /* the received rows of all local experts form one sequence, dealt round-robin over the
     * rank's warps: warp gw takes sequence positions gw, gw + nw, ... (o: its next position,
     * relative to the current expert's first row). Restarting at warp 0 for every expert left
     * all but `count` warps idle per expert: 128 of 4,240 on one H200 at EP 1, a 15x slower
     * combine whenever this phase copies (expert_out given, or push) */
    int64_t o = gw;
    int le;
    for (le = 0; le < c.EL; ++le) {
      const int64_t begin = c.seg[le].begin;
      int64_t end = begin + c.seg[le].count, n, i;
      if (end > plan.recv_capacity) end = plan.recv_capacity;
      n = end > begin ? end - begin : 0;
      for (i = o; i < n; i += nw) {
        const int64_t r = begin + i;
        const void* y = epf__ht_expert_row(&c, &plan, &step, r);
        if (push) {
          /* the metadata names the source's combine row: checked before it forms an address */
          const int32_t* meta = (const int32_t*)epf_local_ptr(c.team, epf_plan_recv_meta_offset(&plan, r));
          const int t = meta[0], s = (int)(int16_t)(meta[1] & 0xffff), k = (int)(int16_t)((uint32_t)meta[1] >> 16);
          const bool ok = t >= 0 && t < plan.max_tokens_per_rank && s >= 0 && s < c.R && k >= 0 && k < c.K;
          epf__ht_report_warp(&w, !ok && lane == 0, EPF_ERR_BAD_METADATA, meta, 0, 0);
          if (ok) epf_combine_push_row_warp(c.team, &plan, y, s, (int64_t)t * c.K + k);
        } else if (step.expert_out != NULL) {
          epf_combine_put_row_warp(&plan, y, (char*)epf_local_ptr(c.team, epf_plan_expert_out_offset(&plan, r)));
        }
      }
      o = i - n; /* i >= n: the position after this expert's rows, relative to the next one's */
    }
  } else {
    /* RANK_MAJOR: pre-reduce this rank's local experts of each received row, in k order */
    const int64_t rows = c.rm_offset[c.R] < plan.recv_capacity ? c.rm_offset[c.R] : plan.recv_capacity;
    int64_t r;
    const int mx_rule = epf_mx_rule_from_flags(plan.flags);
    for (r = gw; r < rows; r += nw) {
      const int32_t* meta = (const int32_t*)epf_local_ptr(c.team, epf_plan_recv_meta_offset(&plan, r));
      const int t = meta[0], s = meta[1], n = meta[2];
      /* received metadata is checked before it forms an address (the whole warp reads one row,
       * so hdr_ok is warp-uniform) */
      const bool hdr_ok = t >= 0 && t < plan.max_tokens_per_rank && s >= 0 && s < c.R && n >= 0 && n <= c.K;
      const int le = hdr_ok && lane < n ? meta[4 + lane] : -1;
      const float wk = hdr_ok && lane < n ? ((const float*)meta)[4 + c.K + lane] : 0.f;
      const int sl = hdr_ok && lane < n ? meta[4 + 2 * c.K + lane] : -1;
      const bool ent_ok = le >= 0 && le < c.EL && sl >= 0;
      const int64_t er = ent_ok ? (int64_t)c.src_offset[le * (c.R + 1) + s] + sl : -1;
      const bool ok = er >= 0 && er < step.expert_rows;
      const char* y = ok ? (const char*)step.expert_out +
                               ((uint64_t)c.index * (uint64_t)step.expert_rows + (uint64_t)er) * (uint64_t)plan.hidden * 2u
                         : NULL;
      epf__ht_report_warp(&w, hdr_ok ? lane < n && !ent_ok : lane == 0, EPF_ERR_BAD_METADATA, meta, 0, 0);
      if (!hdr_ok) continue; /* warp-uniform */
      /* the partial over this rank's entries of the token, in k order (repeats included: they
       * list their first occurrence's view row), as one combine-payload row */
      epf__combine_reduce_warp(y, wk, __ballot_sync(0xffffffffu, ok), plan.hidden, 0,
                               plan.combine_payload == EPF_PAYLOAD_MXFP8, mx_rule,
                               push ? (char*)epf_peer_ptr(c.team, epf_plan_combine_offset(&plan, (int64_t)t * c.R + c.team.rank), s)
                                    : (char*)epf_local_ptr(c.team, epf_plan_expert_out_offset(&plan, r)));
    }
  }
  if (epf_arrive_last_block_epoch(&step.state[c.index].arrive[1], (uint32_t)c.nblocks, c.epoch))
    epf_combine_signal_block(c.team, &plan, c.epoch);

  /* phase B, source side: wait for every peer, then reduce each token in k (or rank) order */
  if (epf_combine_wait_block(c.team, &plan, c.epoch, w) != EPF_OK) {
    /* recorded by the wait; masked or late peers contribute nothing below (their rows are skipped
     * only under fault tolerance: without it the rows are read as they are) */
  }
  {
    int t;
    for (t = gw; t < c.T; t += nw) {
      char* out = (char*)step.out + (rank_rows + (uint64_t)t) * (uint64_t)plan.hidden * 2u;
      const char* my_row = NULL;
      float my_w = 0.f;
      if (em) {
        /* lane k: its own copy's row, or for a repeat its first occurrence's (same output, own
         * weight), in k order */
        int e;
        bool stale;
        const int d = epf__ht_lane_route(&c, t, &e, &stale);
        const int first = epf_topk_first_lane_warp(e);
        const char* first_row;
        if (d >= 0) {
          const int64_t row = (int64_t)c.send_offset[e] + c.slot[(int64_t)t * c.K + lane];
          if (row < plan.recv_capacity) { /* else dropped at dispatch: contributes nothing */
            if (push)
              my_row = (const char*)epf_local_ptr(c.team, epf_plan_combine_offset(&plan, (int64_t)t * c.K + lane));
            else if (w.mask == NULL || epf_mask_is_active(w.mask, d))
              my_row = (const char*)epf_peer_ptr(c.team, epf_plan_expert_out_offset(&plan, row), d);
          }
        }
        first_row = (const char*)__shfl_sync(0xffffffffu, (unsigned long long)(uintptr_t)my_row, first);
        if (e >= 0 && first != lane) my_row = first_row;
        if (my_row != NULL) my_w = step.topk_weights[(rank_rows + (uint64_t)t) * c.K + lane];
        epf__ht_report_warp(&w, stale, EPF_ERR_ROUTE_STALE, (const char*)c.dst_rank + ((int64_t)t * c.K + lane) * 4, 0, 0);
      } else {
        /* lane j: the j-th destination rank in ascending rank order */
        int d = -1;
        int64_t row = -1;
        const int n = epf__ht_rm_copies(&c, t, &d, &row);
        (void)n;
        my_w = 1.0f;
        if (d >= 0 && row < plan.recv_capacity) {
          if (push)
            my_row = (const char*)epf_local_ptr(c.team, epf_plan_combine_offset(&plan, (int64_t)t * c.R + d));
          else if (w.mask == NULL || epf_mask_is_active(w.mask, d))
            my_row = (const char*)epf_peer_ptr(c.team, epf_plan_expert_out_offset(&plan, row), d);
        }
      }
      epf_combine_reduce_rows_warp(my_row, my_w, __ballot_sync(0xffffffffu, my_row != NULL), plan.hidden,
                                   plan.combine_payload == EPF_PAYLOAD_MXFP8, out);
    }
  }
}

#if !defined(__CUDACC_RTC__) /* host launchers: nvcc only (NVRTC compiles the kernels above) */
/* ---- host launchers ---------------------------------------------------------------------------- */

/* epf_ht_check — validate a step against the plan and route before a launch (host; no CUDA calls).
 *   Statuses, in this order: EPF_ERR_INVALID_ARGUMENT (NULL plan / route / step / state),
 *   EPF_ERR_STRUCT_VERSION (plan or route handle prefix), EPF_ERR_MODE (not an HT plan),
 *   EPF_ERR_INVALID_ARGUMENT (route without memory, route count not 1 or plan.nranks),
 *   EPF_ERR_CONFIG_MISMATCH (route laid out for another plan, or without count exchange), the
 *   payloads' hidden-size rules, EPF_ERR_PAYLOAD (x_quantized with a BF16 payload),
 *   EPF_ERR_INVALID_ARGUMENT (blocks_per_rank outside [0, EPF_HT_MAX_BLOCKS_PER_RANK], negative
 *   expert_rows). */
EPF_INLINE epf_status_t epf_ht_check(const epf_plan_t* plan, const epf_route_t* route, const epf_ht_step_t* step) {
  epf_status_t st;
  if (plan == NULL || route == NULL || step == NULL || step->state == NULL) return EPF_ERR_INVALID_ARGUMENT;
  st = epf_plan_check(plan);
  if (st != EPF_OK) return st;
  st = epf__check_prefix(route->size, route->magic, route->version, EPF_ROUTE_HANDLE_MAGIC, (uint32_t)sizeof(epf_route_t));
  if (st != EPF_OK) return st;
  if (plan->mode != EPF_MODE_HT) return EPF_ERR_MODE;
  if (route->base == NULL || (route->count != 1 && route->count != plan->nranks)) return EPF_ERR_INVALID_ARGUMENT;
  if (route->layout.config_hash != plan->config_hash || route->layout.nranks != plan->nranks ||
      route->layout.num_experts != plan->num_experts || !route->layout.exchange)
    return EPF_ERR_CONFIG_MISMATCH;
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
EPF_INLINE epf_ht_step_t epf__ht_step_for_launch(const epf_ht_step_t* step, const epf_plan_t* plan) {
  epf_ht_step_t s = *step;
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

/* epf_ht_dispatch — launch the dispatch of this step: `phases` = EPF_HT_SEND, EPF_HT_RECV or both
 *   (separate launches let compute run between the halves). The route must have been updated for
 *   this step on the same stream (its epoch is the dispatch's epoch). Graph-capturable.
 *   Scope: host, on `stream`. Returns EPF_OK or a validation status; wait failures at run time go
 *   to step->wait.record. */
EPF_INLINE epf_status_t epf_ht_dispatch(const epf_route_t* route, epf_team_t team, const epf_plan_t* plan,
                                        const epf_ht_step_t* step, const void* topk_idx, int phases,
                                        cudaStream_t stream) {
  int bpr, virt;
  epf_ht_step_t s;
  epf_status_t st = epf__ht_launch_check(route, team, plan, step);
  if (st != EPF_OK) return st;
  if (step->x == NULL || step->topk_weights == NULL || topk_idx == NULL || (phases & 3) == 0 || (phases & ~3) != 0)
    return EPF_ERR_INVALID_ARGUMENT;
  if (step->x_quantized && plan->payload != EPF_PAYLOAD_BF16 && step->x_scales == NULL) return EPF_ERR_INVALID_ARGUMENT;
  st = epf__ht_grid(route, plan, step, (const void*)epf__ht_dispatch_kernel, &bpr, &virt);
  if (st != EPF_OK) return st;
  s = epf__ht_step_for_launch(step, plan);
  epf__ht_dispatch_kernel<<<(unsigned)(bpr * route->count), EPF_HT_THREADS, 0, stream>>>(*route, team, *plan, s,
                                                                                         topk_idx, virt, bpr, phases);
  return epf__cuda_status(cudaGetLastError());
}

/* epf_ht_expand — RANK_MAJOR: copy every received row into its expert-major view rows
 *   (step->em_view, step->expert_rows rows per rank; rows beyond are skipped). After the dispatch's
 *   receive half, on the same stream. Local only. */
EPF_INLINE epf_status_t epf_ht_expand(const epf_route_t* route, epf_team_t team, const epf_plan_t* plan,
                                      const epf_ht_step_t* step, cudaStream_t stream) {
  int bpr, virt;
  epf_ht_step_t s;
  epf_status_t st = epf__ht_launch_check(route, team, plan, step);
  if (st != EPF_OK) return st;
  if (plan->layout != EPF_LAYOUT_RANK_MAJOR) return EPF_ERR_LAYOUT;
  if (step->em_view == NULL || step->expert_rows <= 0) return EPF_ERR_INVALID_ARGUMENT;
  st = epf__ht_grid(route, plan, step, (const void*)epf__ht_expand_kernel, &bpr, &virt);
  if (st != EPF_OK) return st;
  s = epf__ht_step_for_launch(step, plan);
  epf__ht_expand_kernel<<<(unsigned)(bpr * route->count), EPF_HT_THREADS, 0, stream>>>(*route, team, *plan, s,
                                                                                       virt, bpr);
  return epf__cuda_status(cudaGetLastError());
}

/* epf_ht_combine — launch the combine of this step (pull, or push with EPF_FLAG_COMBINE_PUSH):
 *   expert side puts its outputs in place and signals; source side waits and reduces in k order
 *   (RANK_MAJOR: pre-reduced per rank, then summed in rank order). Graph-capturable. */
EPF_INLINE epf_status_t epf_ht_combine(const epf_route_t* route, epf_team_t team, const epf_plan_t* plan,
                                       const epf_ht_step_t* step, const void* topk_idx, cudaStream_t stream) {
  int bpr, virt;
  epf_ht_step_t s;
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
  st = epf__ht_grid(route, plan, step, (const void*)epf__ht_combine_kernel, &bpr, &virt);
  if (st != EPF_OK) return st;
  s = epf__ht_step_for_launch(step, plan);
  epf__ht_combine_kernel<<<(unsigned)(bpr * route->count), EPF_HT_THREADS, 0, stream>>>(*route, team, *plan, s,
                                                                                        topk_idx, virt, bpr);
  return epf__cuda_status(cudaGetLastError());
}

#endif /* !__CUDACC_RTC__ */
EPF_END_DECLS

#endif /* EPF_KERNELS_HT_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
