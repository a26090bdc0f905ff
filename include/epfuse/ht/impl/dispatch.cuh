/* epfuse/ht/impl/dispatch.cuh — high-throughput dispatch blocks: rows straight into their final slots — part of epfuse v0.1
 *
 * What it is: the send and receive halves of high-throughput (HT) dispatch as device functions.
 *   - Send: one warp copies one token row from local memory into its FINAL slot in every
 *     destination's receive region (epf_peer_ptr + the plan's RECV_TOKENS offset), with 16-byte
 *     stores, reading the row once and writing it once per copy: no ring buffer, no second copy.
 *     The warp holds the token's copies in its lanes ("lane-held copy list": lane j < ncopies holds
 *     copy j's destination), so one call serves EXPERT_MAJOR (a copy per (token, expert)) and
 *     RANK_MAJOR (a copy per (token, destination rank)). Metadata rows travel beside the data.
 *     Rows whose slot is outside [0, recv_capacity) are dropped and counted, never written.
 *   - Completion: every block of a rank arrives on a per-rank counter (epf_arrive_last_block); the
 *     last one release-signals SIG_DISPATCH[rank] in every peer with the epoch.
 *   - Receive: one block per rank waits for every peer's SIG_DISPATCH (bounded; masked peers are
 *     skipped), after which the receive region holds every row in its final place.
 *   Where the slots come from is the route's business (route/route.cuh); these blocks take them as input.
 *
 * What it does NOT do: compute routes or offsets, allocate, launch, or order anything beyond what
 * each contract says.
 *
 * Usage (a fused router kernel; ht/kernels.cuh has the ready-made version):
 *   // lane j < K: copy j of token t
 *   int e = lane < K ? topk[t * K + lane] : -1;
 *   int dst = e >= 0 ? e / plan.experts_per_rank : -1;
 *   int64_t row = e >= 0 ? send_base[e] + slot[t * K + lane] : -1;
 *   epf_dispatch_send_row_warp(team, &plan, x + t * H, dst, row, K);
 *   epf_dispatch_meta_em(team, &plan, dst, row, t, lane, e % plan.experts_per_rank, w);  // lanes < K
 *   ...
 *   if (epf_arrive_last_block(&counters[rank], gridDim_per_rank, epoch))
 *     epf_dispatch_signal_block(team, &plan, epoch);
 *
 * Contents:
 *   int      epf_topk_first_lane_warp(int e)     the first lane holding this lane's expert (repeats)
 *   uint32_t epf_dispatch_send_row_warp(team, plan, const void* src_row, int dst_rank, int64_t dst_row, int ncopies)
 *   uint32_t epf_dispatch_send_row_quant_warp(team, plan, const void* src_bf16_row, int dst_rank, int64_t dst_row,
 *                                             int ncopies)                       quantized on the way
 *   uint32_t epf_dispatch_send_row_quant_seg_warp(..., ncopies, int seg_begin, int seg_rows)  + copies' segments
 *   void     epf_dispatch_send_scales_warp(team, plan, const uint8_t* src_scales, int dst_rank, int64_t dst_row,
 *                                          int ncopies)                          caller-quantized rows
 *   void     epf_dispatch_send_scales_seg_warp(..., ncopies, int seg_begin, int seg_rows)     + copies' segments
 *   uint64_t epf_recv_scale_offset(plan, int64_t row, int col, int64_t seg_begin, int64_t seg_rows)
 *                                                                        [EPF_HD] a receive scale's position
 *   bool     epf_recv_scale_seg_fits(plan, int64_t row, int64_t seg_begin, int64_t seg_rows)  [EPF_HD]
 *   uint64_t epf_recv_scale_col_offset(plan, int64_t row, int col)     [EPF_HD] the same, no segment
 *   uint32_t epf_dispatch_send_token_warp(team, plan, src_row, src_scales, int quantize, dst_rank, dst_row, ncopies,
 *                                         int seg_begin, int seg_rows)
 *                                                                        any payload, either way
 *   void     epf_dispatch_meta_em(team, plan, int dst_rank, int64_t dst_row, int src_token, int k, int local_expert, float weight)
 *   void     epf_dispatch_meta_rm_warp(team, plan, src_token, dst_rank, dst_row, ncopies,
 *                                      entry_rank, local_expert, weight, slot)  RANK_MAJOR metadata
 *   (epf_recv_meta_rm_read_warp, the reader of a received RANK_MAJOR metadata row that LL shares, is
 *    in core/rows.cuh)
 *   uint32_t epf_expand_row_warp(team, plan, row, src_offset, view, view_scales, expert_rows, const epf_wait_t*)
 *                                                                        RANK_MAJOR -> expert-major view
 *   (epf_arrive_last_block / _epoch, which a rank's blocks use before epf_dispatch_signal_block, are
 *    in core/signal.cuh)
 *   void     epf_dispatch_signal_block(team, plan, uint32_t epoch)                             [collective:block]
 *   epf_status_t epf_dispatch_wait_block(team, plan, uint32_t epoch, epf_wait_t w)             [collective:block]
 *   void     epf_dispatch_scales_finish_block(team, plan, const epf_route_segment_t* seg, int block, int nblocks)
 *                                                 staged scales into the GEMM-ready layout   [collective:block]
 *   void     epf_copy_row_warp(void* dst, const void* src, uint32_t bytes)                    [collective:warp]
 *
 * Requirements: CUDA, sm_70+. Rows 16-byte aligned (row_bytes is a multiple of 16 by the plan's
 * hidden-size rules).
 */
#ifndef EPF_HT_IMPL_DISPATCH_CUH
#define EPF_HT_IMPL_DISPATCH_CUH

#include "../../config.h"
#include "../../host.h"
#include "../../core/ptx.cuh"
#include "../../core/rows.cuh"
#include "../../quant/quant.cuh"
#include "../../core/signal.cuh"
#include "../../core/team.cuh"

EPF_BEGIN_DECLS

/* The quantizing send's common path double-buffers: EPF_QSEND_UNROLL chunks quantized and stored
 * while the next EPF_QSEND_UNROLL chunks load (2 x EPF_QSEND_UNROLL vectors in registers). Fixed at
 * 4: a group's scales then fill one warp-wide run (MXFP8: 4 chunks x 8 scales = 32 lanes), and the
 * payload goes out as 16-byte stores of chunk pairs. */
#define EPF_QSEND_UNROLL 4

EPF_DEVICE_INLINE void epf_copy_row_warp(void* dst, const void* src, uint32_t bytes) {
  const uint4* s = (const uint4*)src;
  uint4* d = (uint4*)dst;
  const int nvec = (int)(bytes >> 4), lane = epf_lane_id();
  int base;
  for (base = 0; base < nvec; base += 32 * EPF_COPY_UNROLL) {
    uint4 v[EPF_COPY_UNROLL];
    int u;
#pragma unroll
    for (u = 0; u < EPF_COPY_UNROLL; ++u)
      if (base + u * 32 + lane < nvec) v[u] = epf_ld_v4_u32(s + base + u * 32 + lane);
#pragma unroll
    for (u = 0; u < EPF_COPY_UNROLL; ++u)
      if (base + u * 32 + lane < nvec) epf_st_v4_u32(d + base + u * 32 + lane, v[u]);
  }
}

/* epf__copy_row_send_warp — epf_copy_row_warp of nvec 16-byte vectors with EPF_SEND_UNROLL loads in
 * flight (the combine's put and push, in a kernel of 16 warps per SM). [collective:warp] */
EPF_DEVICE_INLINE void epf__copy_row_send_warp(void* dst, const void* src, int nvec) {
  const uint4* s = (const uint4*)src;
  uint4* d = (uint4*)dst;
  const int lane = epf_lane_id();
  int base, u;
  for (base = 0; base < nvec; base += 32 * EPF_SEND_UNROLL) {
    uint4 v[EPF_SEND_UNROLL];
#pragma unroll
    for (u = 0; u < EPF_SEND_UNROLL; ++u)
      if (base + u * 32 + lane < nvec) v[u] = epf_ld_v4_u32(s + base + u * 32 + lane);
#pragma unroll
    for (u = 0; u < EPF_SEND_UNROLL; ++u)
      if (base + u * 32 + lane < nvec) epf_st_v4_u32(d + base + u * 32 + lane, v[u]);
  }
}

/* epf__row_dst — this lane's destination row pointer in `region`, or NULL when the copy is absent
 *   (dst_rank < 0) or its slot is outside [0, recv_capacity). */
EPF_DEVICE_INLINE char* epf__row_dst(epf_team_t team, const epf_plan_t* plan, int dst_rank, int64_t dst_row) {
  if (dst_rank < 0 || dst_rank >= team.nranks || dst_row < 0 || dst_row >= plan->recv_capacity) return NULL;
  return (char*)epf_peer_ptr(team, epf_plan_recv_token_offset(plan, dst_row), dst_rank);
}

EPF_DEVICE_INLINE int epf_topk_first_lane_warp(int e) {
  const int lane = epf_lane_id();
  const uint32_t same = __match_any_sync(0xffffffffu, e >= 0 ? e : -1 - lane);
  return __ffs((int)same) - 1;
}

EPF_DEVICE_INLINE uint32_t epf_dispatch_send_row_warp(epf_team_t team, const epf_plan_t* plan, const void* src_row,
                                                      int dst_rank, int64_t dst_row, int ncopies) {
  const int lane = epf_lane_id();
  const int nvec = (int)(plan->row_bytes >> 4);
  const uint4* src = (const uint4*)src_row;
  char* my_dst = lane < ncopies ? epf__row_dst(team, plan, dst_rank, dst_row) : NULL;
  const uint32_t dropped =
      (uint32_t)__popc(__ballot_sync(0xffffffffu, lane < ncopies && dst_rank >= 0 && my_dst == NULL));
  const uint32_t present = __ballot_sync(0xffffffffu, my_dst != NULL);
  int base;
  if (present == 0u) return dropped;
  for (base = 0; base < nvec; base += 32 * EPF_SEND_UNROLL) {
    uint4 v[EPF_SEND_UNROLL];
    int u;
    uint32_t m;
#pragma unroll
    for (u = 0; u < EPF_SEND_UNROLL; ++u) {
      const int i = base + u * 32 + lane;
      if (i < nvec) v[u] = epf_ld_nc_v4_u32(src + i);
    }
    for (m = present; m != 0u; m &= m - 1u) {
      const int j = __ffs((int)m) - 1;
      uint4* d = (uint4*)__shfl_sync(0xffffffffu, (unsigned long long)(uintptr_t)my_dst, j);
#pragma unroll
      for (u = 0; u < EPF_SEND_UNROLL; ++u) {
        const int i = base + u * 32 + lane;
        if (i < nvec) epf_st_v4_u32(d + i, v[u]);
      }
    }
  }
  return dropped;
}

EPF_HD uint64_t epf_recv_scale_offset(const epf_plan_t* plan, int64_t row, int col, int64_t seg_begin, int64_t seg_rows) {
  const int ncols = plan->payload == EPF_PAYLOAD_MXFP8 ? plan->hidden / 32 : plan->hidden / 128;
  if (plan->scale_layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4)
    return plan->region[EPF_REGION_RECV_SCALES].offset + (uint64_t)epf_scale_swizzle_offset(row, col, ncols);
  if (plan->scale_layout == EPF_SCALE_LAYOUT_SEGMENT_MN_MAJOR)
    return plan->region[EPF_REGION_RECV_SCALES].offset +
           ((uint64_t)seg_begin * (uint64_t)ncols + (uint64_t)col * (uint64_t)seg_rows + (uint64_t)(row - seg_begin)) * 4u;
  return epf_plan_recv_scale_offset(plan, row) +
         (uint64_t)col * (plan->payload == EPF_PAYLOAD_MXFP8 ? 1u : 4u);
}

EPF_HD bool epf_recv_scale_seg_fits(const epf_plan_t* plan, int64_t row, int64_t seg_begin, int64_t seg_rows) {
  if (plan->scale_layout != EPF_SCALE_LAYOUT_SEGMENT_MN_MAJOR) return true;
  return seg_begin >= 0 && row >= seg_begin && row < seg_begin + seg_rows && seg_begin + seg_rows <= plan->recv_capacity;
}

EPF_HD uint64_t epf_recv_scale_col_offset(const epf_plan_t* plan, int64_t row, int col) {
  return epf_recv_scale_offset(plan, row, col, 0, 0);
}

/* epf__send_scale_offset — where a send stores scale column col of receive row `row`: the row's
 * stage run when the plan stages its scales (epf_plan_scales_staged: GEMM-ready layouts of HT
 * EXPERT_MAJOR), else the layout's position (compact; RANK_MAJOR swizzled). */
EPF_HD uint64_t epf__send_scale_offset(const epf_plan_t* plan, int64_t row, int col) {
  if (epf_plan_scales_staged(plan))
    return epf_plan_recv_scale_stage_offset(plan, row) + (uint64_t)col * (plan->payload == EPF_PAYLOAD_MXFP8 ? 1u : 4u);
  return epf_recv_scale_col_offset(plan, row, col);
}

/* The quantizing send's scale rules, as a constant for epf__qsend_compact_row (one straight-line
 * copy of the row loop per rule). */
#define EPF__QK_MX_RCEIL 0
#define EPF__QK_MX_FLOOR 1
#define EPF__QK_FP8 2
#define EPF__QK_FP8_UE8M0 3
/* epf__qsend_group_amax — the scale groups' amax of EPF_QSEND_UNROLL 256-element chunks held in the
 * lane8 layout (x[u]: this lane's 8 BF16 of chunk u; zeros past the row), each phase over all chunks
 * at once (every chunk's lane amax, then every chunk's first shuffle step, ...), so the chunks'
 * shuffle chains overlap instead of running one after another. a[u]: the amax of the lane's
 * group (MXFP8: its quad, 32 elements; FP8-128: its half-warp, 128), exactly the value the
 * lane8 quantizers reduce. kind: EPF__QK_*, a constant. [collective:warp] */
EPF_DEVICE_INLINE void epf__qsend_group_amax(const uint4* x, int kind, float* a) {
  const bool mx = kind == EPF__QK_MX_RCEIL || kind == EPF__QK_MX_FLOOR;
  int u;
#pragma unroll
  for (u = 0; u < EPF_QSEND_UNROLL; ++u) a[u] = epf_amax8_bf16(x[u]);
#pragma unroll
  for (u = 0; u < EPF_QSEND_UNROLL; ++u) a[u] = fmaxf(a[u], __shfl_xor_sync(0xffffffffu, a[u], 1));
#pragma unroll
  for (u = 0; u < EPF_QSEND_UNROLL; ++u) a[u] = fmaxf(a[u], __shfl_xor_sync(0xffffffffu, a[u], 2));
  if (!mx) { /* a 128-element group is a half-warp */
#pragma unroll
    for (u = 0; u < EPF_QSEND_UNROLL; ++u) a[u] = fmaxf(a[u], __shfl_xor_sync(0xffffffffu, a[u], 4));
#pragma unroll
    for (u = 0; u < EPF_QSEND_UNROLL; ++u) a[u] = fmaxf(a[u], __shfl_xor_sync(0xffffffffu, a[u], 8));
  }
}

/* epf__qsend_chunk — one chunk's bytes from its reduced amax (epf__qsend_group_amax): the lane's 8
 * E4M3 bytes, *sc = the group's scale (MXFP8: the E8M0 byte; FP8-128: the FP32 bits). Exactly what
 * epf_mxfp8_quantize_lane8_bf16_warp / epf_fp8_128_quantize_lane8_bf16_warp give (the same
 * functions after the same reduction). kind: EPF__QK_*, a constant. Any lane. */
EPF_DEVICE_INLINE uint2 epf__qsend_chunk(uint4 x, float a, int kind, uint32_t* sc) {
  float f[8];
  epf_bf16x8_to_float(x, f);
  if (kind == EPF__QK_MX_RCEIL || kind == EPF__QK_MX_FLOOR) {
    const uint8_t b = epf_e8m0_from_amax_nonneg(fmaxf(a, 0.0f), kind == EPF__QK_MX_FLOOR ? EPF_MX_FLOOR : EPF_MX_RCEIL);
    *sc = b;
    return epf_mxfp8_quantize8(f, b);
  } else {
    float y;
    const float s = epf_fp8_128_scale_fast(a, kind == EPF__QK_FP8_UE8M0, &y);
    *sc = __float_as_uint(s);
    return epf_fp8_128_quantize8_steps(f, s, y, false);
  }
}

/* epf__qsend_compact_row — the quantizing send's register-held row loop: nvec 16-byte vectors of
 * BF16 from src into the n copies dp[c] (rows) / sp[c] (the copy's compact scale run: its compact
 * scales, or its stage run when the plan stages GEMM-ready scales), EPF_QSEND_UNROLL chunks per
 * group,
 * the next group's loads in flight while this one is quantized and stored (loading everything
 * first, then quantizing and storing, would leave the loads idle during the stores).
 * kind: EPF__QK_*, a constant. [collective:warp] */
EPF_DEVICE_INLINE void epf__qsend_compact_row(const uint4* src, int nvec, int n, char* const* dp, char* const* sp,
                                              int kind) {
  const int lane = epf_lane_id();
  const bool mx = kind == EPF__QK_MX_RCEIL || kind == EPF__QK_MX_FLOOR;
  /* A group's scales go out as one run per copy: lane p gathers the p-th scale of the group
   * (MXFP8: 32 bytes, chunk p / 8, quad p % 8; FP8-128: 8 floats, chunk p / 2, half p % 2) and the
   * warp stores the run with one instruction instead of one small store per chunk. */
  const int gather_lane = mx ? 4 * (lane & 7) : 16 * (lane & 1);
  const int gather_chunk = mx ? lane >> 3 : lane >> 1;
  const int ncols = mx ? nvec >> 2 : nvec >> 4; /* scales per row */
  uint4 v[EPF_QSEND_UNROLL];
  int base, u, c;
#pragma unroll
  for (u = 0; u < EPF_QSEND_UNROLL; ++u) {
    const int i = u * 32 + lane;
    v[u] = i < nvec ? epf_ld_nc_v4_u32(src + i) : make_uint4(0u, 0u, 0u, 0u);
  }
  for (base = 0; base < nvec; base += 32 * EPF_QSEND_UNROLL) {
    uint4 nx[EPF_QSEND_UNROLL];
    float a[EPF_QSEND_UNROLL];
    uint32_t run = 0; /* this lane's scale of the group's run */
    uint2 qprev = make_uint2(0u, 0u); /* the even chunk's bytes, stored with the odd one's */
#pragma unroll
    for (u = 0; u < EPF_QSEND_UNROLL; ++u) {
      const int i = base + (EPF_QSEND_UNROLL + u) * 32 + lane;
      nx[u] = i < nvec ? epf_ld_nc_v4_u32(src + i) : make_uint4(0u, 0u, 0u, 0u);
    }
    epf__qsend_group_amax(v, kind, a); /* chunks past the row reduce zeros: nothing is stored */
#pragma unroll
    for (u = 0; u < EPF_QSEND_UNROLL; ++u) {
      uint32_t sc;
      const uint2 q = epf__qsend_chunk(v[u], a[u], kind, &sc);
      const uint32_t t = __shfl_sync(0xffffffffu, sc, gather_lane);
      if (gather_chunk == u) run = t;
      /* chunks u - 1 and u as 16-byte stores: the even lane of a pair stores its own and its
       * partner's bytes of chunk u - 1, the odd lane those of chunk u (the partner's by one
       * shuffle each way); nvec is a multiple of 4, so a pair is in the row or past it whole */
      if (u & 1) {
        const uint2 send = (lane & 1) ? qprev : q; /* what the partner lacks */
        const uint2 got = make_uint2(__shfl_xor_sync(0xffffffffu, send.x, 1), __shfl_xor_sync(0xffffffffu, send.y, 1));
        const uint4 w = (lane & 1) ? make_uint4(got.x, got.y, q.x, q.y) : make_uint4(qprev.x, qprev.y, got.x, got.y);
        const int j = base + (u - 1 + (lane & 1)) * 32 + (lane & ~1); /* the pair's first vector */
        if (j < nvec) {
#pragma unroll
          for (c = 0; c < 8; ++c)
            if (c < n) epf_st_v4_u32(dp[c] + (uint64_t)j * 8u, w);
        }
      } else {
        qprev = q;
      }
    }
    const int col = (mx ? base >> 2 : base >> 4) + lane; /* this lane's scale column of the run */
    if ((mx || lane < 2 * EPF_QSEND_UNROLL) && col < ncols) {
#pragma unroll
      for (c = 0; c < 8; ++c) {
        if (c < n) {
          const uint64_t off = (uint64_t)col * (mx ? 1u : 4u);
          if (mx)
            *(sp[c] + off) = (char)run;
          else
            *(uint32_t*)(sp[c] + off) = run;
        }
      }
    }
#pragma unroll
    for (u = 0; u < EPF_QSEND_UNROLL; ++u) v[u] = nx[u];
  }
}

EPF_DEVICE_INLINE uint32_t epf_dispatch_send_row_quant_seg_warp(epf_team_t team, const epf_plan_t* plan, const void* src_row,
                                                                int dst_rank, int64_t dst_row, int ncopies, int seg_begin,
                                                                int seg_rows) {
  const int lane = epf_lane_id();
  const int nvec = plan->hidden >> 3;
  const uint4* src = (const uint4*)src_row;
  char* my_dst = lane < ncopies ? epf__row_dst(team, plan, dst_rank, dst_row) : NULL;
  const uint32_t dropped =
      (uint32_t)__popc(__ballot_sync(0xffffffffu, lane < ncopies && dst_rank >= 0 && my_dst == NULL));
  const uint32_t present = __ballot_sync(0xffffffffu, my_dst != NULL);
  const bool mx = plan->payload == EPF_PAYLOAD_MXFP8;
  const int rule = epf_mx_rule_from_flags(plan->flags);
  const bool ue8m0 = epf_fp8_128_ue8m0_from_flags(plan->flags);
  int base;
  (void)seg_begin; /* the segments matter to the receive half only (epf_dispatch_scales_finish_block) */
  (void)seg_rows;
  if (present == 0u) return dropped;
  /* Two loops with the same load-and-quantize lines, deliberately: the common case below keeps
   * every copy's addresses in registers, the general one recomputes them per copy. One loop with
   * both store paths (or a shared load-then-quantize helper that holds a whole chunk's results)
   * raised the HT dispatch kernel's spills from 84 / 132 to 236 / 416 bytes (ptxas -v, sm_90). */
  /* every copy's scales as one compact run: COMPACT, and the stage runs of GEMM-ready layouts
   * (epf_plan_scales_staged; the receive half rearranges them). Only RANK_MAJOR swizzled scales
   * take the general loop below. */
  if ((plan->scale_layout == EPF_SCALE_LAYOUT_COMPACT || epf_plan_scales_staged(plan)) && __popc(present) <= 8) {
    /* The common case: every copy's row and scale addresses in registers, computed once per token
     * instead of once per chunk and copy (that address arithmetic, not the bytes, bounded the
     * quantizing dispatch at 57 % of the copy ceiling). One loop per scale rule, so that each is
     * straight-line code. */
    const int kind = mx ? (rule == EPF_MX_FLOOR ? EPF__QK_MX_FLOOR : EPF__QK_MX_RCEIL) : (ue8m0 ? EPF__QK_FP8_UE8M0 : EPF__QK_FP8);
    const int n = __popc(present);
    const int src_lane = lane < n ? (int)__fns(present, 0u, lane + 1) : 0;
    char* my_sc = my_dst != NULL ? (char*)epf_peer_ptr(team, epf__send_scale_offset(plan, dst_row, 0), dst_rank) : NULL;
    const unsigned long long dj = __shfl_sync(0xffffffffu, (unsigned long long)(uintptr_t)my_dst, src_lane);
    const unsigned long long sj = __shfl_sync(0xffffffffu, (unsigned long long)(uintptr_t)my_sc, src_lane);
    char* dp[8];
    char* sp[8];
    int c;
#pragma unroll
    for (c = 0; c < 8; ++c) {
      dp[c] = (char*)__shfl_sync(0xffffffffu, dj, c);
      sp[c] = (char*)__shfl_sync(0xffffffffu, sj, c);
    }
    if (kind == EPF__QK_MX_RCEIL)
      epf__qsend_compact_row(src, nvec, n, dp, sp, EPF__QK_MX_RCEIL);
    else if (kind == EPF__QK_MX_FLOOR)
      epf__qsend_compact_row(src, nvec, n, dp, sp, EPF__QK_MX_FLOOR);
    else if (kind == EPF__QK_FP8)
      epf__qsend_compact_row(src, nvec, n, dp, sp, EPF__QK_FP8);
    else
      epf__qsend_compact_row(src, nvec, n, dp, sp, EPF__QK_FP8_UE8M0);
    return dropped;
  }
  /* EPF_SEND_UNROLL 256-element chunks per step: their loads are all in flight before the first
   * quantization (one load at a time left the warp latency-bound) */
  for (base = 0; base < nvec; base += 32 * EPF_SEND_UNROLL) {
    uint4 v[EPF_SEND_UNROLL];
    int u;
#pragma unroll
    for (u = 0; u < EPF_SEND_UNROLL; ++u) {
      const int i = base + u * 32 + lane;
      v[u] = i < nvec ? epf_ld_nc_v4_u32(src + i) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (u = 0; u < EPF_SEND_UNROLL; ++u) {
      const int i = base + u * 32 + lane;
      uint8_t sb = 0;
      float sf = 0.f;
      uint2 q;
      uint32_t m;
      if (base + u * 32 >= nvec) break; /* warp-uniform */
      q = mx ? epf_mxfp8_quantize_lane8_bf16_warp(v[u], rule, &sb) : epf_fp8_128_quantize_lane8_bf16_warp(v[u], ue8m0, &sf);
      for (m = present; m != 0u; m &= m - 1u) {
        const int j = __ffs((int)m) - 1;
        const int r = __shfl_sync(0xffffffffu, dst_rank, j);
        const int64_t row = __shfl_sync(0xffffffffu, (long long)dst_row, j);
        char* d = (char*)__shfl_sync(0xffffffffu, (unsigned long long)(uintptr_t)my_dst, j);
        if (i < nvec) {
          *(uint2*)(d + (uint64_t)i * 8u) = q;
          if (mx && (lane & 3) == 0) *(uint8_t*)epf_peer_ptr(team, epf__send_scale_offset(plan, row, i >> 2), r) = sb;
          if (!mx && (lane & 15) == 0) *(float*)epf_peer_ptr(team, epf__send_scale_offset(plan, row, i >> 4), r) = sf;
        }
      }
    }
  }
  return dropped;
}

EPF_DEVICE_INLINE uint32_t epf_dispatch_send_row_quant_warp(epf_team_t team, const epf_plan_t* plan, const void* src_row,
                                                            int dst_rank, int64_t dst_row, int ncopies) {
  return epf_dispatch_send_row_quant_seg_warp(team, plan, src_row, dst_rank, dst_row, ncopies, 0, 0);
}

EPF_DEVICE_INLINE void epf_dispatch_send_scales_seg_warp(epf_team_t team, const epf_plan_t* plan, const uint8_t* src_scales,
                                                         int dst_rank, int64_t dst_row, int ncopies, int seg_begin,
                                                         int seg_rows) {
  const int lane = epf_lane_id();
  const bool mx = plan->payload == EPF_PAYLOAD_MXFP8;
  const int ncols = mx ? plan->hidden / 32 : plan->hidden / 128;
  const bool ok = lane < ncopies && epf__row_dst(team, plan, dst_rank, dst_row) != NULL;
  uint32_t m;
  (void)seg_begin; /* the segments matter to the receive half only (epf_dispatch_scales_finish_block) */
  (void)seg_rows;
  for (m = __ballot_sync(0xffffffffu, ok); m != 0u; m &= m - 1u) {
    const int j = __ffs((int)m) - 1;
    const int r = __shfl_sync(0xffffffffu, dst_rank, j);
    const int64_t row = __shfl_sync(0xffffffffu, (long long)dst_row, j);
    int c;
    for (c = lane; c < ncols; c += 32) {
      if (mx)
        *(uint8_t*)epf_peer_ptr(team, epf__send_scale_offset(plan, row, c), r) = src_scales[c];
      else
        *(float*)epf_peer_ptr(team, epf__send_scale_offset(plan, row, c), r) = ((const float*)src_scales)[c];
    }
  }
}

EPF_DEVICE_INLINE void epf_dispatch_send_scales_warp(epf_team_t team, const epf_plan_t* plan, const uint8_t* src_scales,
                                                     int dst_rank, int64_t dst_row, int ncopies) {
  epf_dispatch_send_scales_seg_warp(team, plan, src_scales, dst_rank, dst_row, ncopies, 0, 0);
}

EPF_DEVICE_INLINE void epf_dispatch_meta_em(epf_team_t team, const epf_plan_t* plan, int dst_rank, int64_t dst_row,
                                            int src_token, int k, int local_expert, float weight) {
  union {
    epf_recv_meta_em_t m;
    uint4 v;
  } row; /* registers only: one 16-byte store below */
  if (dst_rank < 0 || dst_rank >= team.nranks || dst_row < 0 || dst_row >= plan->recv_capacity) return;
  row.m = epf_recv_meta_em_make(src_token, team.rank, k, local_expert, weight);
  epf_st_v4_u32(epf_peer_ptr(team, epf_plan_recv_meta_offset(plan, dst_row), dst_rank), row.v);
}

EPF_DEVICE_INLINE uint32_t epf_dispatch_send_token_warp(epf_team_t team, const epf_plan_t* plan, const void* src_row,
                                                        const uint8_t* src_scales, int quantize, int dst_rank,
                                                        int64_t dst_row, int ncopies, int seg_begin, int seg_rows) {
  uint32_t dropped;
  if (quantize && plan->payload != EPF_PAYLOAD_BF16)
    return epf_dispatch_send_row_quant_seg_warp(team, plan, src_row, dst_rank, dst_row, ncopies, seg_begin, seg_rows);
  dropped = epf_dispatch_send_row_warp(team, plan, src_row, dst_rank, dst_row, ncopies);
  if (plan->payload != EPF_PAYLOAD_BF16 && src_scales != NULL)
    epf_dispatch_send_scales_seg_warp(team, plan, src_scales, dst_rank, dst_row, ncopies, seg_begin, seg_rows);
  return dropped;
}

EPF_DEVICE_INLINE void epf_dispatch_meta_rm_warp(epf_team_t team, const epf_plan_t* plan, int src_token, int dst_rank,
                                                 int64_t dst_row, int ncopies, int entry_rank, int local_expert,
                                                 float weight, int slot) {
  const int lane = epf_lane_id(), K = plan->top_k;
  char* meta = lane < ncopies && epf__row_dst(team, plan, dst_rank, dst_row) != NULL
                   ? (char*)epf_peer_ptr(team, epf_plan_recv_meta_offset(plan, dst_row), dst_rank)
                   : NULL;
  int k, used = 0;
  for (k = 0; k < K; ++k) { /* warp-uniform: every lane walks the K entries */
    const int d_k = __shfl_sync(0xffffffffu, entry_rank, k);
    const int e_k = __shfl_sync(0xffffffffu, local_expert, k);
    const float w_k = __shfl_sync(0xffffffffu, weight, k);
    const int s_k = __shfl_sync(0xffffffffu, slot, k);
    if (meta != NULL && d_k >= 0 && d_k == dst_rank) {
      *(int32_t*)(meta + epf_recv_meta_rm_expert_at(K, used)) = e_k;
      *(float*)(meta + epf_recv_meta_rm_weight_at(K, used)) = w_k;
      *(int32_t*)(meta + epf_recv_meta_rm_slot_at(K, used)) = s_k;
      ++used;
    }
  }
  if (meta != NULL) {
    epf_recv_meta_rm_t* h = (epf_recv_meta_rm_t*)meta;
    h->src_token = src_token;
    h->src_rank = team.rank;
    h->num_local = used;
    h->reserved = 0;
  }
}

EPF_DEVICE_INLINE uint32_t epf_expand_row_warp(epf_team_t team, const epf_plan_t* plan, int64_t row,
                                               const int32_t* src_offset, char* view, uint8_t* view_scales,
                                               int64_t expert_rows, const epf_wait_t* w) {
  const int lane = epf_lane_id();
  const epf_recv_meta_rm_lane_t m = epf_recv_meta_rm_read_warp(team, plan, row, src_offset);
  const int64_t em_row = m.em_row;
  const uint32_t same = __match_any_sync(0xffffffffu, em_row >= 0 ? (unsigned long long)em_row : ~(unsigned long long)lane);
  const bool lead = em_row >= 0 && __ffs((int)same) - 1 == lane;
  const char* src = (const char*)epf_local_ptr(team, epf_plan_recv_token_offset(plan, row));
  const uint32_t over = (uint32_t)__popc(__ballot_sync(0xffffffffu, lead && em_row >= expert_rows));
  uint32_t pending;
  epf_error_report_warp(w, m.header_ok ? m.entry_bad : lane == 0, EPF_ERR_BAD_METADATA,
                        epf_local_ptr(team, epf_plan_recv_meta_offset(plan, row)), 0, 0);
  for (pending = __ballot_sync(0xffffffffu, lead && em_row < expert_rows); pending != 0u; pending &= pending - 1u) {
    const int j = __ffs((int)pending) - 1;
    const int64_t er = __shfl_sync(0xffffffffu, (long long)em_row, j);
    uint32_t b;
    epf_copy_row_warp(view + (uint64_t)er * plan->row_bytes, src, plan->row_bytes);
    if (view_scales == NULL) continue;
    for (b = (uint32_t)lane; b < plan->scale_bytes_per_row; b += 32) { /* compact, byte by byte */
      const int col = plan->payload == EPF_PAYLOAD_MXFP8 ? (int)b : (int)(b >> 2);
      const uint8_t* sc = (const uint8_t*)epf_local_ptr(team, epf_recv_scale_col_offset(plan, row, col));
      view_scales[(uint64_t)er * plan->scale_bytes_per_row + b] = plan->payload == EPF_PAYLOAD_MXFP8 ? *sc : sc[b & 3u];
    }
  }
  return over;
}

EPF_DEVICE_INLINE void epf_dispatch_signal_block(epf_team_t team, const epf_plan_t* plan, uint32_t epoch) {
  epf_signal_peers_block(team, plan, EPF_REGION_SIG_DISPATCH, epoch);
}

/* 16-byte stage chunks of each row that a lane loads before its first store in the rearrangement */
#define EPF__FINISH_CHUNKS 2
/* epf__scales_finish_chunks_warp — stage bytes [16 q0, 16 (q0 + EPF__FINISH_CHUNKS)) of the rows
 * r0 + l + 32 j (j < 4) of one 128-row tile that lie in [lo, hi): every load first (4 rows x
 * EPF__FINISH_CHUNKS 16-byte chunks in flight per lane), then the stores.
 * SEGMENT_MN_MAJOR (FP8-128, FP32 scales): column c of rows r0 + 32 j .. r0 + 32 j + 31 are 32
 * consecutive floats of the segment's matrix: one 128-byte store per (column, j).
 * SWIZZLED_128X4 (MXFP8, r0 a multiple of 128): rows r0 + l + 32 j, columns 4 p .. 4 p + 3 are the
 * 16 bytes at epf_scale_swizzle_offset(r0 + l, 4 p): one 16-byte store per lane per column quad
 * when all four rows are received. [collective:warp] */
EPF_DEVICE_INLINE void epf__scales_finish_chunks_warp(epf_team_t team, const epf_plan_t* plan, int64_t r0, int64_t lo,
                                                      int64_t hi, int64_t seg_begin, int64_t seg_rows, int q0) {
  const int lane = epf_lane_id();
  const bool mx = plan->payload == EPF_PAYLOAD_MXFP8;
  const int ncols = mx ? plan->hidden / 32 : plan->hidden / 128;
  const int nq = (int)((plan->scale_bytes_per_row + 15u) >> 4);
  const uint64_t stride = (plan->scale_bytes_per_row + 15u) & ~(uint64_t)15u;
  const char* stage = (const char*)epf_local_ptr(team, epf_plan_recv_scale_stage_offset(plan, 0));
  char* base = (char*)epf_local_ptr(team, plan->region[EPF_REGION_RECV_SCALES].offset);
  uint4 v[EPF__FINISH_CHUNKS][4];
  bool ok[4];
  int j, c;
#pragma unroll
  for (j = 0; j < 4; ++j) {
    const int64_t r = r0 + lane + 32 * j;
    ok[j] = r >= lo && r < hi;
  }
#pragma unroll
  for (c = 0; c < EPF__FINISH_CHUNKS; ++c)
#pragma unroll
    for (j = 0; j < 4; ++j)
      v[c][j] = ok[j] && q0 + c < nq ? *(const uint4*)(stage + (uint64_t)(r0 + lane + 32 * j) * stride + 16u * (uint64_t)(q0 + c))
                                     : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (c = 0; c < EPF__FINISH_CHUNKS; ++c) {
    const int q = 16 * (q0 + c); /* the chunk's first stage byte */
    int i;
    if (q0 + c >= nq) break;
    if (!mx) {
      /* column q/4 + i of row r0 + lane + 32 j: float (seg_begin * ncols + col * seg_rows + row - seg_begin) */
      float* m = (float*)base + (uint64_t)seg_begin * (uint64_t)ncols + (uint64_t)(r0 + lane - seg_begin);
#pragma unroll
      for (i = 0; i < 4; ++i) {
        const int col = (q >> 2) + i;
        if (col < ncols) {
          uint32_t* d = (uint32_t*)(m + (uint64_t)col * (uint64_t)seg_rows);
#pragma unroll
          for (j = 0; j < 4; ++j)
            if (ok[j]) d[32 * j] = i == 0 ? v[c][j].x : i == 1 ? v[c][j].y : i == 2 ? v[c][j].z : v[c][j].w;
        }
      }
    } else {
#pragma unroll
      for (i = 0; i < 4; ++i) {
        const int col = q + 4 * i; /* the quad's first column */
        if (col < ncols) {
          /* bytes of columns >= ncols (the row's next stage bytes) become the atom's zero padding */
          const uint32_t keep = ncols - col >= 4 ? 0xffffffffu : (1u << (8 * (ncols - col))) - 1u;
          uint32_t w[4];
          char* d = base + epf_scale_swizzle_offset(r0 + lane, col, ncols);
#pragma unroll
          for (j = 0; j < 4; ++j) w[j] = (i == 0 ? v[c][j].x : i == 1 ? v[c][j].y : i == 2 ? v[c][j].z : v[c][j].w) & keep;
          if (ok[0] && ok[1] && ok[2] && ok[3]) {
            epf_st_v4_u32(d, make_uint4(w[0], w[1], w[2], w[3]));
          } else {
#pragma unroll
            for (j = 0; j < 4; ++j)
              if (ok[j]) *(uint32_t*)(d + 4 * j) = w[j];
          }
        }
      }
    }
  }
}

EPF_DEVICE_INLINE void epf_dispatch_scales_finish_block(epf_team_t team, const epf_plan_t* plan,
                                                        const epf_route_segment_t* seg, int block, int nblocks) {
  const int nw = (int)(blockDim.x >> 5);
  const int64_t gw = (int64_t)block * nw + epf_warp_id(), stride = (int64_t)nblocks * nw;
  const bool mx = plan->payload == EPF_PAYLOAD_MXFP8;
  const int ngroups = ((int)((plan->scale_bytes_per_row + 15u) >> 4) + EPF__FINISH_CHUNKS - 1) / EPF__FINISH_CHUNKS;
  int64_t first = 0; /* items of the segments before this one */
  int le;
  if (!epf_plan_scales_staged(plan) || seg == NULL || nblocks < 1) return;
  for (le = 0; le < plan->experts_per_rank; ++le) {
    const int64_t begin = seg[le].begin, rows = seg[le].padded_count;
    int64_t end = begin + seg[le].count, t0, nitems, k;
    if (end > plan->recv_capacity) end = plan->recv_capacity;
    if (begin < 0 || end <= begin || (!mx && !epf_recv_scale_seg_fits(plan, begin, begin, rows))) continue;
    t0 = mx ? begin & ~(int64_t)127 : begin; /* swizzled atoms: 128 rows from a multiple of 128 */
    nitems = (end - t0 + 127) / 128 * ngroups;
    for (k = ((gw - first) % stride + stride) % stride; k < nitems; k += stride) /* warp-uniform */
      epf__scales_finish_chunks_warp(team, plan, t0 + 128 * (k / ngroups), begin, end, begin, rows,
                                     (int)(k % ngroups) * EPF__FINISH_CHUNKS);
    first += nitems;
  }
}

EPF_DEVICE_INLINE epf_status_t epf_dispatch_wait_block(epf_team_t team, const epf_plan_t* plan, uint32_t epoch,
                                                       epf_wait_t w) {
  return epf_wait_peers_block(team, plan, EPF_REGION_SIG_DISPATCH, epoch, w);
}

EPF_END_DECLS

#endif /* EPF_HT_IMPL_DISPATCH_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
