/* epfuse/route/impl/batch.cuh — the route passes' private warp helpers — part of epfuse v0.1
 *
 * What it is: the private helpers the passes share: id batches (load, the duplicate rule, first
 * entries), equality masks, count-word sums with bounded waits. Include epfuse/route/route.cuh, not this file (it stands alone too, for the
 * compile tests).
 *
 * Contents: see route/route.cuh.
 *
 * Requirements: see route/route.cuh.
 */
#ifndef EPF_ROUTE_IMPL_BATCH_CUH
#define EPF_ROUTE_IMPL_BATCH_CUH

#include "../../config.h"

#if !EPF_IS_CUDA
#error "epfuse/route/impl/batch.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

#include "ctx.cuh"

EPF_BEGIN_DECLS

/* ---- private helpers ------------------------------------------------------------------------ */

/* epf__route_block_status — epf__block_status with one barrier in the common case: when no
 * thread of the block failed (one __syncthreads_or) the answer is EPF_OK, exactly what
 * epf__block_status returns then; otherwise epf__block_status folds the failures by priority.
 * [collective:block] */
EPF_DEVICE_INLINE epf_status_t epf__route_block_status(epf_status_t mine) {
  if (!__syncthreads_or(mine != EPF_OK)) return EPF_OK;
  return epf__block_status(mine);
}

/* epf__route_warp_exclusive_sum — exclusive prefix sum of x over the warp's lanes in lane order,
 * the warp's total in *out_total (every lane). [collective:warp] every lane, converged. Built from
 * cub::WarpScan (shuffles; cub_temp: the warp's EPF__ROUTE_CUB_BYTES_PER_WARP bytes). */
EPF_DEVICE_INLINE int epf__route_warp_exclusive_sum(int x, int* out_total, void* cub_temp) {
  typedef cub::WarpScan<int> epf__warp_scan_t;
  typedef epf__warp_scan_t::TempStorage epf__warp_scan_temp_t;
  int incl = 0;
  EPF_STATIC_ASSERT(sizeof(epf__warp_scan_temp_t) <= EPF__ROUTE_CUB_BYTES_PER_WARP, "cub temp storage");
  epf__warp_scan_t(*(epf__warp_scan_temp_t*)((char*)cub_temp + epf_warp_id() * EPF__ROUTE_CUB_BYTES_PER_WARP))
      .InclusiveSum(x, incl);
  *out_total = __shfl_sync(0xffffffffu, incl, 31);
  return incl - x;
}

/* destination rank of expert e >= 0: e / EL without a division (exact for e * EL < 2^32, which
 * EPF_MAX_EXPERTS <= 65535 guarantees) */
EPF_DEVICE_INLINE int epf__route_dest(const epf_route_ctx_t* c, int e) {
  return c->el_inv == 0u ? e : (int)__umulhi((uint32_t)e, c->el_inv);
}

/* the offsets block's epoch acknowledgement in the private 3-block SPLIT arrangement
 * (epf__route_ctx_init): word 0 of scratch row 2 (no scratch row is used otherwise there), a count
 * word carrying the epoch it read */
EPF_DEVICE_INLINE uint64_t* epf__route_epoch_ack(const epf_route_ctx_t* c) {
  return EPF__ROUTE_ARR(c, EPF_ROUTE_SCRATCH, uint64_t) + 2 * (int64_t)(c->num_experts + c->nranks + 1);
}

/* epf__route_batch_dedup — the duplicate rule (ht/impl/dispatch.cuh: epf_topk_first_lane_warp): an entry
 * whose expert an earlier k of its token already names is a REPEAT and becomes -1 here — no copy,
 * no count, no slot, not a dropped id (the combine gives it its first occurrence's output). A
 * batch starts at a token boundary, so entry j = 32 u + lane has k = j % K. K a power of two:
 * a token's K entries are K aligned lanes of one step, compared by K - 1 shuffles per two steps
 * (ids + 1 packed 16 bits each); other K: through the warp's stage row, at most K - 1
 * shared-memory reads per entry. K == 1: nothing to do. [collective:warp] */
EPF_DEVICE_INLINE void epf__route_batch_dedup(const epf_route_ctx_t* c, int* ev) {
  const int K = c->top_k, lane = epf_lane_id();
  int u;
  if (K == 1) return;
  if ((K & (K - 1)) == 0) {
    enum { P = (EPF__ROUTE_STEPS + 1) / 2 };
    const int kl = lane & (K - 1);
    uint32_t pk[P], rep[P];
    int o, p;
#pragma unroll
    for (p = 0; p < P; ++p) {
      const uint32_t hi = 2 * p + 1 < EPF__ROUTE_STEPS ? (uint32_t)(ev[2 * p + 1] + 1) : 0u;
      pk[p] = (uint32_t)(ev[2 * p] + 1) | (hi << 16);
      rep[p] = 0u;
    }
#pragma unroll 1
    for (o = 1; o < K; ++o) {
#pragma unroll
      for (p = 0; p < P; ++p) {
        const uint32_t eq = __shfl_up_sync(0xffffffffu, pk[p], (unsigned)o, K) ^ pk[p];
        if (kl >= o) rep[p] |= ((eq & 0xffffu) == 0u ? 1u : 0u) | ((eq >> 16) == 0u ? 2u : 0u);
      }
    }
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u)
      if ((rep[u >> 1] >> (u & 1)) & 1u) ev[u] = -1; /* an entry of -1 equal to -1 stays -1 */
  } else {
    int32_t* S = c->stage + epf_warp_id() * EPF__ROUTE_BATCH;
    const int step_k = 32 % K;
    int kk = lane % K; /* k of entry 32 u + lane */
    __syncwarp(); /* earlier reads of the stage row are done */
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) S[32 * u + lane] = ev[u];
    __syncwarp();
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) {
      const int j = 32 * u + lane, e = ev[u];
      if (e >= 0) {
        int q;
        for (q = j - kk; q < j; ++q) /* no collective inside: lanes may differ in trips */
          if (S[q] == e) {
            ev[u] = -1;
            break;
          }
      }
      kk += step_k;
      if (kk >= K) kk -= K;
    }
  }
}

/* epf__route_batch_load — this lane's entries of one batch: entry 32 u + lane of the batch that
 * starts at (token, k) entry i0 and holds nb entries, as an expert id in [-1, E) (ev[u] = -1 past
 * the batch). Ids outside [-1, E) give -1 and count into *dropped (when not NULL); repeats of an
 * expert within a token give -1 without counting (epf__route_batch_dedup). [collective:warp] */
EPF_DEVICE_INLINE void epf__route_batch_load(const epf_route_ctx_t* c, int64_t i0, int nb, int* ev, uint32_t* dropped) {
  const int lane = epf_lane_id();
  const uint32_t E = (uint32_t)c->num_experts;
  uint32_t bad = 0u;
  int u;
  /* one loop per index type (not a select per step): each step is one predicated load at an
   * immediate offset from the lane's base, then an unsigned compare (-1 <= v < E) */
  if (c->index64) {
    const int64_t* p = (const int64_t*)c->topk_idx + i0 + lane;
    int64_t v[EPF__ROUTE_STEPS];
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) v[u] = 32 * u + lane < nb ? p[32 * u] : -1;
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) {
      const bool ok = (uint64_t)v[u] + 1u <= (uint64_t)E;
      bad += ok ? 0u : 1u;
      ev[u] = ok ? (int)v[u] : -1;
    }
  } else {
    const int32_t* p = (const int32_t*)c->topk_idx + i0 + lane;
    int32_t v[EPF__ROUTE_STEPS];
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) v[u] = 32 * u + lane < nb ? p[32 * u] : -1;
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) {
      const bool ok = (uint32_t)v[u] + 1u <= E;
      bad += ok ? 0u : 1u;
      ev[u] = ok ? v[u] : -1;
    }
  }
  if (dropped != NULL) *dropped += bad;
  epf__route_batch_dedup(c, ev); /* repeats of an expert within a token: -1 (after the dropped count) */
}

/* epf__route_batch_first — which of this lane's entries are their token's FIRST entry (lowest k)
 * to their destination rank: bit u of the result for entry 32 u + lane. The batch's destination
 * ranks go through the warp's c->stage row; each entry compares with its token's earlier entries
 * (at most K - 1 shared-memory reads). Works for any K and R. [collective:warp] */
EPF_DEVICE_INLINE uint32_t epf__route_batch_first(const epf_route_ctx_t* c, const int* ev) {
  const int lane = epf_lane_id(), K = c->top_k;
  int32_t* S = c->stage + epf_warp_id() * EPF__ROUTE_BATCH;
  uint32_t first = 0u;
  int u;
  __syncwarp(); /* the previous batch's reads of S are done */
#pragma unroll
  for (u = 0; u < EPF__ROUTE_STEPS; ++u) S[32 * u + lane] = ev[u] >= 0 ? epf__route_dest(c, ev[u]) : -1;
  __syncwarp();
#pragma unroll
  for (u = 0; u < EPF__ROUTE_STEPS; ++u) {
    const int j = 32 * u + lane;
    const int d = S[j];
    if (d >= 0) {
      int q = j - j % K;
      while (q < j && S[q] != d) ++q;
      if (q == j) first |= 1u << u;
    }
  }
  return first;
}

/* epf__route_match — for each step u, the mask of the warp's lanes whose v[u] equals this lane's
 * (among lanes with v[u] >= 0; meaningless for a lane with v[u] < 0): one ballot of the valid lanes,
 * then one ballot per bit of v (v < 2^nbits), ANDed as equal / complemented. Deterministic;
 * plain votes, not __match_any_sync (a MIO-queue instruction, whose queue throttles the slot pass;
 * tests/bench/bench_match.cu compares the two). [collective:warp] */
EPF_DEVICE_INLINE void epf__route_match(const int* v, int nbits, uint32_t* m) {
  int u, bit;
#pragma unroll
  for (u = 0; u < EPF__ROUTE_STEPS; ++u) m[u] = __ballot_sync(0xffffffffu, v[u] >= 0);
#pragma unroll 1
  for (bit = 0; bit < nbits; ++bit) {
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) {
      const bool one = ((v[u] >> bit) & 1) != 0;
      const uint32_t b = __ballot_sync(0xffffffffu, one);
      m[u] &= one ? b : ~b;
    }
  }
}

/* epf__route_match_tags — epf__route_match for ids v in [-1, E) by shared-memory tags, a handful
 * of instructions per step instead of one vote per bit: in each step every lane with v >= 0
 * stores its lane id at tags[v] (one of the equal lanes wins), reads the winner back — the same
 * lane for all equal lanes — and ORs its bit into the winner's word of the step, grp[32 u +
 * winner]; those words are the masks. Which lane wins changes no mask: the result is the same
 * set of lanes as epf__route_match's, on every run. A lane with v < 0 ORs into its own word
 * (it wins no tag, so no valid lane reads that word) and gets mask 0.
 * tags: the warp's [E] row (no initial value needed); grp: the warp's EPF__ROUTE_BATCH-word stage
 * row, zeroed here first. [collective:warp] */
EPF_DEVICE_INLINE void epf__route_match_tags(const int* v, int32_t* tags, uint32_t* grp, uint32_t* m) {
  const int lane = epf_lane_id();
  int lead[EPF__ROUTE_STEPS], u;
  __syncwarp(); /* earlier reads of grp (another use of the stage row) are done */
#pragma unroll
  for (u = 0; u < EPF__ROUTE_STEPS; ++u) grp[32 * u + lane] = 0u;
#pragma unroll
  for (u = 0; u < EPF__ROUTE_STEPS; ++u) {
    if (v[u] >= 0) tags[v[u]] = lane;
    __syncwarp();
    lead[u] = v[u] >= 0 ? tags[v[u]] : lane;
    __syncwarp(); /* every read of this step's tags before the next step's stores */
    atomicOr(&grp[32 * u + lead[u]], 1u << lane);
  }
  __syncwarp();
#pragma unroll
  for (u = 0; u < EPF__ROUTE_STEPS; ++u) m[u] = v[u] >= 0 ? grp[32 * u + lead[u]] : 0u;
}

/* epf__route_batch_first_shfl — epf__route_batch_first for K a power of two <= 32 and R <= 32
 * (c->shfl_first): a token's K entries are K aligned lanes of one step, so an entry is its token's
 * first to rank d when no lower lane of its group has d (epf__route_match over the ranks' bits).
 * With rows != NULL the token's R-byte is_token_in_rank row is written too: the group ORs (1 << d)
 * by log2 K xor-shuffles and lane k of the group writes bytes k, k + K, ... (batch of nb entries
 * starting at token tb). [collective:warp] */
EPF_DEVICE_INLINE uint32_t epf__route_batch_first_shfl(const epf_route_ctx_t* c, const int* ev, uint8_t* rows, int tb, int nb) {
  const int lane = epf_lane_id(), K = c->top_k, R = c->nranks, kl = lane & (K - 1);
  const int kshift = __ffs(K) - 1;
  const uint32_t grp = K == 32 ? 0xffffffffu : ((1u << K) - 1u) << (lane & ~(K - 1));
  const uint32_t lt = (1u << lane) - 1u;
  uint32_t first = 0u, m[EPF__ROUTE_STEPS];
  int d[EPF__ROUTE_STEPS], u;
#pragma unroll
  for (u = 0; u < EPF__ROUTE_STEPS; ++u) d[u] = ev[u] >= 0 ? epf__route_dest(c, ev[u]) : -1;
  epf__route_match(d, c->rbits, m);
#pragma unroll
  for (u = 0; u < EPF__ROUTE_STEPS; ++u)
    if (d[u] >= 0 && (m[u] & grp & lt) == 0u) first |= 1u << u;
  if (rows != NULL) {
    uint32_t bits[EPF__ROUTE_STEPS];
    int o;
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) /* one rank: m[u] is the ballot of valid entries */
      bits[u] = R == 1 ? (m[u] & grp) != 0u : d[u] >= 0 ? 1u << d[u] : 0u;
#pragma unroll 1
    for (o = R == 1 ? K : 1; o < K; o <<= 1) {
#pragma unroll
      for (u = 0; u < EPF__ROUTE_STEPS; ++u) bits[u] |= __shfl_xor_sync(0xffffffffu, bits[u], o);
    }
#pragma unroll
    for (u = 0; u < EPF__ROUTE_STEPS; ++u) {
      const int j = 32 * u + lane;
      if (j < nb && kl < R) {
        uint8_t* row = rows + (int64_t)(tb + (j >> kshift)) * R;
        int r = kl;
        do { /* R <= K (the common case): one byte per lane */
          row[r] = (uint8_t)((bits[u] >> r) & 1u);
          r += K;
        } while (r < R);
      }
    }
  }
  return first;
}

/* epf__route_fill_warp — the warp stores `n` bytes of value `byte` at p (4-byte stores where p and
 * n allow). [collective:warp]; ends with __syncwarp (the stores are ordered before the warp's
 * later stores to the same bytes). */
EPF_DEVICE_INLINE void epf__route_fill_warp(void* p, int64_t n, uint8_t byte) {
  const int lane = epf_lane_id();
  int64_t x;
  if (((uintptr_t)p & 3u) == 0u && (n & 3) == 0) {
    const uint32_t w = 0x01010101u * byte;
#pragma unroll 1
    for (x = lane; x < (n >> 2); x += 32) ((uint32_t*)p)[x] = w;
  } else {
#pragma unroll 1
    for (x = lane; x < n; x += 32) ((uint8_t*)p)[x] = byte;
  }
  __syncwarp();
}

/* epf__route_wait_word — slow path of epf__route_sum_words: wait (bounded by w) until the word at p
 * carries `epoch` (epf_count_word_wait_sys; peer for the diagnostic, -1 for none). Out of line:
 * one copy of the spin loop and its diagnostics, whatever the number of call sites. */
EPF__DEVICE_NOINLINE epf_status_t epf__route_wait_word(const uint64_t* p, uint32_t epoch, int peer, epf_wait_t w) {
  return epf_count_word_wait_sys(p, epoch, w, peer, NULL);
}

/* epf__route_sum_words_rows — epf__route_sum_words with `rows` words per round trip (a literal
 * at each call site: the loops unroll, v[] stays in registers; rows <= EPF__ROUTE_ROWS). */
EPF_DEVICE_INLINE void epf__route_sum_words_rows(const uint64_t* p, int64_t stride, int n, int split, uint32_t epoch,
                                                 int peer0, int self, int self_count, epf_wait_t w, epf_status_t* st,
                                                 int* tot, int* pre, int* keep, const int rows) {
  int i0, u, a = 0, b = 0;
  for (i0 = 0; i0 < n; i0 += rows) {
    uint64_t v[EPF__ROUTE_ROWS];
    int spins = 0;
    for (;;) { /* bounded: after EPF__ROUTE_QUICK_SPINS reloads, the bounded wait (core/signal.cuh) */
      int late = -1; /* the first word of the batch without the epoch */
#pragma unroll
      for (u = 0; u < rows; ++u)
        v[u] = i0 + u < n && i0 + u != self ? epf_ld_relaxed_sys_u64(p + (int64_t)(i0 + u) * stride)
                                            : epf_count_word_pack(epoch, i0 + u == self ? (uint32_t)self_count : 0u);
#pragma unroll
      for (u = rows - 1; u >= 0; --u)
        if (!epf_count_word_valid(v[u], epoch)) late = u;
      if (late < 0 || *st != EPF_OK) break;
      /* the first EPF__ROUTE_QUICK_SPINS times: load the whole batch again at once (relaxed, every
       * word checked in one round trip); then the bounded wait (deadline, abort word, diagnostic)
       * for that one word, and the batch again */
      if (++spins > EPF__ROUTE_QUICK_SPINS)
        *st = epf__route_wait_word(p + (int64_t)(i0 + late) * stride, epoch, peer0 < 0 ? -1 : peer0 + i0 + late, w);
    }
#pragma unroll
    for (u = 0; u < rows; ++u) {
      const int cnt = epf_count_word_valid(v[u], epoch) ? (int)epf_count_word_count(v[u]) : 0;
      if (keep != NULL && i0 == 0 && u < EPF__ROUTE_KEEP) keep[u] = cnt;
      a += cnt;
      if (i0 + u < split) b += cnt;
    }
  }
  *tot = a;
  *pre = b;
}

/* epf__route_sum_words — sum of the counts of n words p[i * stride] (i < n), each an
 * count word (epf_count_word_pack) that must carry `epoch`: *tot = all, *pre = those with i < split;
 * keep (may be NULL): the first min(n, EPF__ROUTE_KEEP) counts. Word `self` (-1: none) is not
 * loaded: its count is self_count (the rank's own published word, which the caller holds in
 * shared memory: one memory round trip less). n == 1 with self == 0 (a team of one) returns
 * self_count at once: no load, no check. Loads up to EPF__ROUTE_ROWS words per round trip (4
 * when n <= 4) with ld.relaxed.sys (peers' words, or the rank's own scratch); while
 * a word does not carry the epoch yet, loads the whole batch again (up to EPF__ROUTE_QUICK_SPINS
 * times, a few tens of us), then waits for that word with the bounded wait (epf__route_wait_word:
 * deadline, abort, diagnostic) and loads the batch again. After a failure (kept in *st; later
 * batches do not wait) words without the epoch count 0. */
EPF_DEVICE_INLINE void epf__route_sum_words(const uint64_t* p, int64_t stride, int n, int split, uint32_t epoch,
                                            int peer0, int self, int self_count, epf_wait_t w, epf_status_t* st,
                                            int* tot, int* pre, int* keep) {
  if (n == 1 && self == 0) { /* the rank's own word only (a team of one): nothing to load or check */
    *tot = self_count;
    *pre = split > 0 ? self_count : 0;
    if (keep != NULL) keep[0] = self_count;
  } else if (n <= 4)
    epf__route_sum_words_rows(p, stride, n, split, epoch, peer0, self, self_count, w, st, tot, pre, keep, 4);
  else
    epf__route_sum_words_rows(p, stride, n, split, epoch, peer0, self, self_count, w, st, tot, pre, keep,
                              EPF__ROUTE_ROWS);
}

EPF_END_DECLS

#endif /* EPF_ROUTE_IMPL_BATCH_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
