/* epf_ll_rm_ref.cuh — the CPU reference of a RANK_MAJOR low-latency round (not part of the library),
 * over the inputs of tests/common/epf_ll_ref.cuh (llref_in_t, llref_fill), with a token count per
 * source (unequal T: the blocks take num_tokens per rank):
 *   llrm_dispatch           what every rank must receive: rank-major rows per (destination,
 *                           source) (token, entries in k order: local expert, weight, expert slot),
 *                           the expert-major counts and slots (llref_dispatch's, restricted to each
 *                           source's tokens), the dropped ids; `absent` ranks take no part
 *   llrm_combine            what every source must get back: per destination rank, in the order of
 *                           its first occurrence in k, the k-order FP32 partial of the token's
 *                           entries on it (fmaf(w_k, y_k, p)) rounded to the combine payload (BF16
 *                           RNE, or MXFP8 quantized from the FP32 partial), then acc = fmaf(1, p, acc)
 *                           in that order, BF16 out — the RANK_MAJOR rule of tests/common/epf_ht_ref.h
 *   llrm_dispatch_backward  the backward of the dispatch (unit weights, each view row once, per-rank
 *                           partials in first-occurrence order) and the router-weight gradients
 *   llrm_wgrad_kernel       the test's per-view-row router-weight gradient (GPU side)
 *   llrm_poison_window      poison one rank's window rows of a round (receive, meta, scales, landing)
 *   llrm_check_dispatch_rank  counts, round, rank-major rows + scales + metadata in the window
 *                           (check_rows) and the expanded expert-major view (packed: rows, scales
 *                           compact or swizzled, epf_recv_meta_em_t with k = -1)
 *   llrm_check_combine_rank   rows [0, T_s) of one source's output bit for bit; rows [T_s, Tmax)
 *                           still hold the poison (0xEEEE)
 * No cmocka calls: failures are returned with a message. */
#ifndef EPF_LL_RM_REF_CUH
#define EPF_LL_RM_REF_CUH

#include "epf_ll_ref.cuh"

typedef struct llrm_ref {
  llref_t em;     /* counts [R dst][EL][R src], row_t / row_k of every expert slot; dropped */
  int* Ts;        /* [R] tokens of each source */
  int* rows;      /* [R dst][R src] rank-major rows */
  int* row_t;     /* [R dst][R src][Tmax] token of rank-major slot j */
  int* em_slot;   /* [R src][Tmax][K] expert slot of (t, k)'s expert (its first occurrence), -1 none */
} llrm_ref_t;

/* tokens of source s: Ts[s], or (Ts NULL) in->T */
static inline int llrm_T(const llref_in_t* in, const int* Ts, int s) { return Ts != NULL ? Ts[s] : in->T; }

/* the destination ranks of a token's row (valid ids only) in the order of their first occurrence
 * in k, into order[] (at most R <= 32 entries); returns their number */
static inline int llrm_dest_order(const llref_in_t* in, const int64_t* row, int* order) {
  int nd = 0;
  for (int k = 0; k < in->K; ++k) {
    int seen = 0;
    if (row[k] < 0 || row[k] >= in->E) continue;
    for (int j = 0; j < nd; ++j) seen |= order[j] == (int)(row[k] / in->EL);
    if (!seen) order[nd++] = (int)(row[k] / in->EL);
  }
  return nd;
}

/* acc += one destination rank's FP32 partial as the far side sends it: MXFP8 (cpayload) quantized
 * then dequantize-accumulated with weight 1, or acc[h] = fmaf(1, BF16(part[h]), acc[h]) */
static inline void llrm_add_partial(int cpayload, int mx_rule, const float* part, int H, float* acc) {
  if (cpayload == EPF_PAYLOAD_MXFP8) {
    llref_mxfp8_accumulate_row(part, H, mx_rule, 1.0f, acc);
  } else {
    for (int h = 0; h < H; ++h) acc[h] = fmaf(1.0f, llref_bf2f(llref_f2bf(part[h])), acc[h]);
  }
}

/* Ts: tokens per source (NULL: in->T for all); absent: bit r = rank r takes no part. */
static inline void llrm_dispatch(const llref_in_t* in, const int* Ts, uint32_t absent, llrm_ref_t* out) {
  const int R = in->R, Tmax = in->Tmax, K = in->K, E = in->E, EL = in->EL;
  int* rc = (int*)calloc((size_t)R, sizeof(int));
  memset(out, 0, sizeof(*out));
  out->Ts = (int*)malloc((size_t)R * sizeof(int));
  for (int s = 0; s < R; ++s) out->Ts[s] = llrm_T(in, Ts, s);
  { /* the expert slots: llref_dispatch with these per-source T */
    llref_in_t in_ts = *in;
    in_ts.Ts = out->Ts;
    llref_dispatch(&in_ts, absent, &out->em);
  }
  out->em_slot = (int*)malloc((size_t)R * Tmax * K * sizeof(int));
  for (size_t i = 0; i < (size_t)R * Tmax * K; ++i) out->em_slot[i] = -1;
  for (int d = 0; d < R; ++d)
    for (int le = 0; le < EL; ++le)
      for (int s = 0; s < R; ++s) {
        const size_t g = ((size_t)d * EL + le) * R + s;
        for (int j = 0; j < out->em.counts[g]; ++j)
          out->em_slot[((size_t)s * Tmax + out->em.row_t[g * Tmax + j]) * K + out->em.row_k[g * Tmax + j]] = j;
      }
  /* the rank-major rows: one per (token, destination rank), slot = rank among the source's tokens
   * that have an expert there, in token order (reserved also for absent destinations) */
  out->rows = (int*)calloc((size_t)R * R, sizeof(int));
  out->row_t = (int*)malloc((size_t)R * R * Tmax * sizeof(int));
  for (int s = 0; s < R; ++s) {
    if ((absent >> s) & 1u) continue;
    memset(rc, 0, (size_t)R * sizeof(int));
    for (int t = 0; t < out->Ts[s]; ++t) {
      const int64_t* row = in->htopk + ((size_t)s * Tmax + t) * K;
      for (int k = 0; k < K; ++k) {
        int first = 1;
        if (row[k] < 0 || row[k] >= E) continue;
        for (int q = 0; q < k; ++q) first &= !(row[q] >= 0 && row[q] < E && row[q] / EL == row[k] / EL);
        if (!first) continue;
        {
          const int d = (int)(row[k] / EL), slot = rc[d]++;
          if ((absent >> d) & 1u) continue;
          out->row_t[((size_t)d * R + s) * Tmax + slot] = t;
          out->rows[(size_t)d * R + s] = slot + 1;
        }
      }
    }
  }
  free(rc);
}

static inline void llrm_free(llrm_ref_t* r) {
  llref_free(&r->em);
  free(r->Ts);
  free(r->rows);
  free(r->row_t);
  free(r->em_slot);
}

/* The RANK_MAJOR sum of one token (its ids row[K], the experts' input xs[H]) into acc[H] (from
 * +0.0f): per present destination rank in the order of its first occurrence in k, the FP32 partial
 * p = fmaf(w[k], y_k, p) over the token's k on it (w NULL: weight 1 and only the first occurrence
 * of each id), sent as cpayload (llrm_add_partial). part, y: [H] scratch. */
static inline void llrm_token_sum(const llref_in_t* in, const int64_t* row, const float* w, uint32_t absent, int identity,
                                  int cpayload, const float* xs, float* part, float* y, float* acc) {
  const int K = in->K, E = in->E, EL = in->EL, H = in->H;
  int order[32];
  const int nd = llrm_dest_order(in, row, order);
  for (int h = 0; h < H; ++h) acc[h] = 0.0f;
  for (int j = 0; j < nd; ++j) {
    const int d = order[j];
    if ((absent >> d) & 1u) continue;
    for (int h = 0; h < H; ++h) part[h] = 0.0f;
    for (int k = 0; k < K; ++k) {
      if (row[k] < 0 || row[k] >= E || row[k] / EL != d) continue;
      if (w == NULL && llref_first_k(row, k) != k) continue;
      llref_expert_row((int)row[k], xs, H, identity, y);
      llref_fma_row(w != NULL ? w[k] : 1.0f, y, H, part);
    }
    llrm_add_partial(cpayload, in->mx_rule, part, H, acc);
  }
}

/* out[s][t][h] ([R][Tmax][H]) for every present source s and t < Ts[s] (or only source only_src) */
static inline void llrm_combine(const llref_in_t* in, const int* Ts, uint32_t absent, int identity, int only_src,
                                uint16_t* out) {
  const int Tmax = in->Tmax, K = in->K, H = in->H;
  float* acc = (float*)malloc((size_t)4 * H * sizeof(float)); /* acc, part, xs, y: [H] each */
  float *part = acc + H, *xs = acc + 2 * H, *y = acc + 3 * H;
  for (int s = 0; s < in->R; ++s) {
    if ((absent >> s) & 1u) continue;
    if (only_src >= 0 && s != only_src) continue;
    for (int t = 0; t < llrm_T(in, Ts, s); ++t) {
      const size_t tk = ((size_t)s * Tmax + t) * K;
      llref_x_row(in, s, t, xs);
      llrm_token_sum(in, in->htopk + tk, in->hw + tk, absent, identity, in->cpayload, xs, part, y, acc);
      llref_bf16_row(acc, H, out + ((size_t)s * Tmax + t) * H);
    }
  }
  free(acc);
}

/* The backward of a RANK_MAJOR dispatch: dx[s][t][h] ([R][Tmax][H]) = per destination rank d in
 * the order of its first occurrence in k, the partial p_d = fmaf(1, y_k, p) over the token's k on
 * d whose EXPERT id occurs first at k (a repeat adds nothing), rounded to BF16, then acc =
 * fmaf(1, BF16(p_d), acc), BF16 out (y = the test's expert of the view row, x = dy: BF16 plans
 * only); wg ([R][Tmax][K], or NULL): for every valid k on a present rank the view row's
 * llref_wgrad_value (a repeat: its first occurrence's row, the same value), else 0. */
static inline void llrm_dispatch_backward(const llref_in_t* in, const int* Ts, uint32_t absent, int identity, uint16_t* out,
                                          float* wg) {
  const int Tmax = in->Tmax, K = in->K, H = in->H;
  float* acc = (float*)malloc((size_t)4 * H * sizeof(float)); /* acc, part, xs, y: [H] each */
  float *part = acc + H, *xs = acc + 2 * H, *y = acc + 3 * H;
  for (int s = 0; s < in->R; ++s) {
    if ((absent >> s) & 1u) continue;
    for (int t = 0; t < llrm_T(in, Ts, s); ++t) {
      const size_t tk = ((size_t)s * Tmax + t) * K;
      const uint16_t* x = in->hx + ((size_t)s * Tmax + t) * H;
      for (int h = 0; h < H; ++h) xs[h] = llref_bf2f(x[h]);
      if (wg != NULL) llref_wgrad_token(in, s, t, absent, wg + tk);
      llrm_token_sum(in, in->htopk + tk, NULL, absent, identity, EPF_PAYLOAD_BF16, xs, part, y, acc);
      llref_bf16_row(acc, H, out + ((size_t)s * Tmax + t) * H);
    }
  }
  free(acc);
}

/* The test's router-weight gradient of every view row of rank i = blockIdx.y (BF16 view, packed_x
 * as the expand wrote it): llref_wgrad_value(expert, first element), into wg (per-rank
 * epf_ll_buffer_bytes(EPF_LL_BUF_WEIGHT_GRAD) strides) at the packed row (packed_order) or the fixed
 * row: the order of y. */
static __global__ void llrm_wgrad_kernel(epf_plan_t plan, const int32_t* recv_counts, const char* packed_x, float* wg,
                                         int packed_order, int skip_rank) {
  const int R = plan.nranks, EL = plan.experts_per_rank, Tmax = plan.max_tokens_per_rank;
  const int i = (int)blockIdx.y;
  const int64_t rows = (int64_t)EL * R * Tmax;
  if (i == skip_rank) return;
  const int32_t* cnt = recv_counts + (int64_t)i * EL * R;
  for (int64_t fr = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; fr < rows; fr += (int64_t)gridDim.x * blockDim.x) {
    int le, s, j, pos;
    if (!llref_fixed_row_slot(&plan, cnt, fr, &le, &s, &j, &pos)) continue;
    const int64_t prow = epf_ll_packed_row(&plan, le, pos);
    const uint16_t* x = (const uint16_t*)(packed_x + ((uint64_t)i * rows + prow) * plan.row_bytes);
    wg[(uint64_t)i * rows + (packed_order ? prow : fr)] = llref_wgrad_value(i * EL + le, llref_bf2f(x[0]));
  }
}

/* Poison the window rows one rank uses in the round of `epoch` (its parity). */
static inline cudaError_t llrm_poison_window(const epf_plan_t* p, char* base, uint32_t epoch, cudaStream_t s) {
  cudaError_t e = llref_poison_recv_rows(p, base, epf_ll_rm_recv_row(p, epoch, 0, 0), s);
  if (e == cudaSuccess)
    e = cudaMemsetAsync(base + epf_plan_combine_offset(p, epf_ll_rm_combine_row(p, epoch, 0, 0)), 0xA5,
                        (size_t)p->max_tokens_per_rank * p->nranks * p->combine_row_bytes, s);
  return e;
}

/* the checks fail through epf_ll_ref.cuh's LLREF_FAIL / LLREF_CUDA (msg, goto done) */

/* Rank d: round, counts [EL][R], expert counts; the rank-major rows (payload, compact scales,
 * metadata) of the round in the window (check_rows); the expert-major view (packed: b->packed_x,
 * packed_scales, packed_meta, each checked when not NULL). 0, or -1 with msg. */
static inline int llrm_check_dispatch_rank(const llref_in_t* in, const epf_plan_t* p, const llrm_ref_t* ref, int d,
                                           const llref_rank_bufs_t* b, uint32_t want_round, int check_rows, int packed,
                                           const char* what, char* msg) {
  const int R = in->R, EL = in->EL, Tmax = in->Tmax, K = in->K, sb = in->sbytes;
  const size_t rb = p->row_bytes, mb = p->meta_bytes_per_row;
  const int swizzled = p->scale_layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4 && p->payload == EPF_PAYLOAD_MXFP8;
  const uint64_t psb = b->packed_scales != NULL ? epf_ll_buffer_bytes(p, EPF_LL_BUF_PACKED_SCALES, EPF_INDEX_DEFAULT) : 0;
  llref_host_bufs_t hb;
  uint32_t round = 0;
  int rc = -1;
  if (llref_host_bufs_alloc(&hb, in, rb, psb, mb) != 0) LLREF_FAIL("%s: out of host memory", what);
  LLREF_CUDA(cudaMemcpy(hb.counts, b->recv_counts, (size_t)EL * R * 4, cudaMemcpyDeviceToHost));
  if (b->expert_counts != NULL) LLREF_CUDA(cudaMemcpy(hb.ecounts, b->expert_counts, (size_t)EL * 4, cudaMemcpyDeviceToHost));
  if (b->round != NULL) {
    LLREF_CUDA(cudaMemcpy(&round, b->round, 4, cudaMemcpyDeviceToHost));
    if (round != want_round) LLREF_FAIL("%s: rank %d round %u, want %u", what, d, round, want_round);
  }
  if (packed && sb > 0 && b->packed_scales != NULL) LLREF_CUDA(cudaMemcpy(hb.pscales, b->packed_scales, psb, cudaMemcpyDeviceToHost));
  /* the counts of the expert-major view, and the view itself */
  for (int le = 0; le < EL; ++le) {
    int tot = 0, pos = 0;
    for (int s = 0; s < R; ++s) tot += ref->em.counts[((size_t)d * EL + le) * R + s];
    if (b->expert_counts != NULL && hb.ecounts[le] != tot)
      LLREF_FAIL("%s: rank %d expert %d: expert_counts %d, want %d", what, d, le, hb.ecounts[le], tot);
    for (int s = 0; s < R; ++s) {
      const size_t g = ((size_t)d * EL + le) * R + s;
      const int n = ref->em.counts[g];
      if (hb.counts[le * R + s] != n)
        LLREF_FAIL("%s: rank %d expert %d src %d: count %d, want %d", what, d, le, s, hb.counts[le * R + s], n);
      if (packed && n > 0) {
        const int64_t pr = epf_ll_packed_row(p, le, pos);
        if (b->packed_x != NULL)
          LLREF_CUDA(cudaMemcpy(hb.rows, (const char*)b->packed_x + (uint64_t)pr * rb, (size_t)n * rb, cudaMemcpyDeviceToHost));
        if (b->packed_meta != NULL)
          LLREF_CUDA(cudaMemcpy(hb.pmeta, b->packed_meta + pr, (size_t)n * 16, cudaMemcpyDeviceToHost));
        for (int j = 0; j < n; ++j) {
          const int t = ref->em.row_t[g * Tmax + j], k = ref->em.row_k[g * Tmax + j];
          /* the view row's weight: its first entry's (forward), or its combine weight (in->combine_weights:
           * the backward of combine's expand) */
          const float wview = llref_meta_weight(in, s, t, k);
          const epf_recv_meta_em_t* pm = hb.pmeta + j;
          if (b->packed_x != NULL && memcmp(hb.rows + (size_t)j * rb, llref_want_row(in, s, t), rb) != 0)
            LLREF_FAIL("%s: view rank %d expert %d row %d (src %d token %d) differs", what, d, le, pos + j, s, t);
          if (b->packed_meta != NULL &&
              (pm->src_token != t || pm->src_rank != s || pm->k != -1 || pm->local_expert != le ||
               memcmp(&pm->weight, &wview, 4) != 0))
            LLREF_FAIL("%s: view rank %d expert %d row %d: meta (%d,%d,%d,%d,%g), want (%d,%d,-1,%d)", what, d, le, pos + j,
                       pm->src_token, pm->src_rank, pm->k, pm->local_expert, (double)pm->weight, t, s, le);
          if (b->packed_scales != NULL) {
            const int c = llref_packed_scales_diff(hb.pscales, swizzled, pr + j, sb, llref_want_scales(in, s, t));
            if (c >= 0) LLREF_FAIL("%s: view rank %d expert %d row %d scale byte %d differs", what, d, le, pos + j, c);
          }
        }
      }
      pos += n;
    }
  }
  /* the rank-major rows in the window */
  if (check_rows)
    for (int s = 0; s < R; ++s) {
      const int n = ref->rows[(size_t)d * R + s];
      const int64_t row0 = epf_ll_rm_recv_row(p, want_round, s, 0);
      if (n == 0) continue;
      LLREF_CUDA(cudaMemcpy(hb.rows, b->win + epf_plan_recv_token_offset(p, row0), (size_t)n * rb, cudaMemcpyDeviceToHost));
      LLREF_CUDA(cudaMemcpy(hb.meta, b->win + epf_plan_recv_meta_offset(p, row0), (size_t)n * mb, cudaMemcpyDeviceToHost));
      if (sb > 0)
        LLREF_CUDA(cudaMemcpy(hb.scales, b->win + epf_plan_recv_scale_offset(p, row0), (size_t)n * sb, cudaMemcpyDeviceToHost));
      for (int j = 0; j < n; ++j) {
        const int t = ref->row_t[((size_t)d * R + s) * Tmax + j];
        const char* m = hb.meta + (size_t)j * mb;
        const epf_recv_meta_rm_t* hd = (const epf_recv_meta_rm_t*)m;
        const int64_t* row = in->htopk + ((size_t)s * Tmax + t) * K;
        int used = 0;
        if (memcmp(hb.rows + (size_t)j * rb, llref_want_row(in, s, t), rb) != 0)
          LLREF_FAIL("%s: rank %d src %d rm slot %d: row differs from token %d", what, d, s, j, t);
        if (sb > 0 && memcmp(hb.scales + (size_t)j * sb, llref_want_scales(in, s, t), (size_t)sb) != 0)
          LLREF_FAIL("%s: rank %d src %d rm slot %d: scales differ from token %d", what, d, s, j, t);
        for (int k = 0; k < K; ++k) {
          if (row[k] < 0 || row[k] >= in->E || row[k] / EL != d) continue;
          {
            const int le = (int)(row[k] % EL);
            const int slot = ref->em_slot[((size_t)s * Tmax + t) * K + llref_first_k(row, k)];
            int32_t ge, gs;
            float gw;
            memcpy(&ge, m + epf_recv_meta_rm_expert_at(K, used), 4);
            memcpy(&gw, m + epf_recv_meta_rm_weight_at(K, used), 4);
            memcpy(&gs, m + epf_recv_meta_rm_slot_at(K, used), 4);
            if (ge != le || gs != slot || memcmp(&gw, in->hw + ((size_t)s * Tmax + t) * K + k, 4) != 0)
              LLREF_FAIL("%s: rank %d src %d rm slot %d (token %d) entry %d: (%d, %g, %d), want (%d, %g, %d)", what, d, s, j,
                         t, used, ge, (double)gw, gs, le, (double)in->hw[((size_t)s * Tmax + t) * K + k], slot);
            ++used;
          }
        }
        if (hd->src_token != t || hd->src_rank != s || hd->num_local != used)
          LLREF_FAIL("%s: rank %d src %d rm slot %d: header (%d, %d, %d), want (%d, %d, %d)", what, d, s, j, hd->src_token,
                     hd->src_rank, hd->num_local, t, s, used);
      }
    }
  rc = 0;
done:
  llref_host_bufs_free(&hb);
  return rc;
}

/* Source s: out ([Tmax][H] BF16, device): rows [0, T_s) against want ([R][Tmax][H], llrm_combine),
 * rows [T_s, Tmax) still 0xEEEE (poisoned before the round; num_tokens bounds what is written). */
static inline int llrm_check_combine_rank(const llref_in_t* in, int s, int Ts, const uint16_t* out, const uint16_t* want,
                                          const char* what, char* msg) {
  const size_t n = (size_t)in->Tmax * in->H;
  uint16_t* got = (uint16_t*)malloc(n * 2);
  int rc = -1;
  if (got == NULL) LLREF_FAIL("%s: out of host memory", what);
  LLREF_CUDA(cudaMemcpy(got, out, n * 2, cudaMemcpyDeviceToHost));
  for (int t = 0; t < in->Tmax; ++t) {
    const uint16_t* g = got + (size_t)t * in->H;
    const uint16_t* w = want + ((size_t)s * in->Tmax + t) * in->H;
    for (int h = 0; h < in->H; ++h) {
      const uint16_t want_h = t < Ts ? w[h] : (uint16_t)0xEEEEu;
      if (g[h] != want_h)
        LLREF_FAIL("%s: combine rank %d token %d%s h %d: 0x%04x, want 0x%04x", what, s, t, t < Ts ? "" : " (past T)", h,
                   g[h], want_h);
    }
  }
  rc = 0;
done:
  free(got);
  return rc;
}

#endif /* EPF_LL_RM_REF_CUH */
