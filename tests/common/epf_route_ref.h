/* epf_route_ref.h — a CPU reference of the whole HT route of a team (counts, slots, destination
 * ranks, is_token_in_rank, rank-major slots, send offsets, receive segments and per-source
 * starts, receive totals) from every rank's topk_idx, in plain C loops that share nothing with
 * route/route.cuh, and a check of one rank's route buffer against it (not part of the library). It
 * follows the rules of docs/route.md; used by the multi-GPU tests, whose rank threads call it, and
 * by tests/gpu/test_shapes.cu (no cmocka here: failures are returned).
 *
 * Rules (docs/route.md, "Semantics"):
 *   - id -1: not routed (skipped, not counted); ids outside [-1, E) (also huge int64 values): dropped,
 *     treated as -1 and counted (dropped[rank]);
 *   - a REPEAT — entry (t, k) whose valid id an earlier entry (t, k' < k) of the same token already
 *     has — gets no copy of its own: dst = slot = -1 and it is not counted in expert_count (so the
 *     receive counts, offsets and segments count each (token, expert) pair once); first_k[t][k]
 *     names the entry that carries it. is_token_in_rank, rank_count and rm_slot are per (token,
 *     destination rank) as always.
 *
 *   route_ref_t r;
 *   route_ref_compute(&r, R, E, K, T, alignment, rank_major, recv_capacity, topk);  // topk int32 [R][T][K]
 *   route_ref_compute_ex(&r, R, E, K, T_max, T_per_rank, alignment, rank_major, capacity, topk64);
 *                                                  // int64 ids [R][T_max][K], T_per_rank [R] (NULL: T_max)
 *   if (route_ref_check(&r, rank, &route.layout, host_copy_of_buffer, epoch, msg, sizeof msg)) ...
 *   route_ref_free(&r);
 * Per-token arrays are stored [R][T_max][...]; only rows t < T[rank] are meaningful.
 */
#ifndef EPF_ROUTE_REF_H
#define EPF_ROUTE_REF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epfuse/host.h"

typedef struct {
  int R, E, K, T, A, rank_major; /* T: T_max, the row stride of the per-token arrays */
  int64_t capacity;
  int32_t* Tr;           /* [R] tokens of each rank's update */
  /* per rank r (the source's own arrays): */
  int32_t* expert_count; /* [R][E] distinct (token, expert) pairs */
  int32_t* rank_count;   /* [R][R] */
  int32_t* dst;          /* [R][T][K] -1: not routed, dropped or a repeat */
  int32_t* slot;         /* [R][T][K] -1: likewise */
  int32_t* first_k;      /* [R][T][K] the k that carries (t, k)'s expert (k itself unless a repeat); -1 if not valid */
  uint8_t* in_rank;      /* [R][T][R] */
  int32_t* rm_slot;      /* [R][T][R] */
  int32_t* send_off;     /* [R][E] */
  int32_t* send_rm;      /* [R][R] */
  /* per rank d (the destination's view): */
  int32_t* seg;          /* [R][EL][4] begin, count, padded count, 0 */
  int32_t* src_off;      /* [R][EL][R + 1] */
  int32_t* rm_off;       /* [R][R + 1] */
  uint32_t* dropped;     /* [R] ids outside [-1, E) */
  int64_t* rows;         /* [R] receive rows in the plan's layout (EM: padded) */
  int64_t* rows_em;      /* [R] expert-major view rows (padded) */
  int64_t* overflow;     /* [R] max(0, rows - capacity) */
} route_ref_t;

static inline void route_ref_free(route_ref_t* r) {
  free(r->Tr);
  free(r->expert_count);
  free(r->rank_count);
  free(r->dst);
  free(r->slot);
  free(r->first_k);
  free(r->in_rank);
  free(r->rm_slot);
  free(r->send_off);
  free(r->send_rm);
  free(r->seg);
  free(r->src_off);
  free(r->rm_off);
  free(r->dropped);
  free(r->rows);
  free(r->rows_em);
  free(r->overflow);
  memset(r, 0, sizeof(*r));
}

/* route_ref_compute_ex — the route of every rank of an R-rank team with E experts, top-K, T_max
 * rows per rank of which rank r uses T[r] (T == NULL: all T_max), expert alignment A, from int64
 * ids topk [R][T_max][K] (rows >= T[r] are never read). Returns 0, or -1 when out of memory. */
static inline int route_ref_compute_ex(route_ref_t* o, int R, int E, int K, int T, const int* Tr, int A, int rank_major,
                                       int64_t capacity, const int64_t* topk) {
  const int EL = E / R;
  memset(o, 0, sizeof(*o));
  o->R = R;
  o->E = E;
  o->K = K;
  o->T = T;
  o->A = A;
  o->rank_major = rank_major;
  o->capacity = capacity;
  o->Tr = (int32_t*)calloc((size_t)R, 4);
  o->expert_count = (int32_t*)calloc((size_t)R * E, 4);
  o->rank_count = (int32_t*)calloc((size_t)R * R, 4);
  o->dst = (int32_t*)malloc((size_t)R * T * K * 4 + 4);
  o->slot = (int32_t*)malloc((size_t)R * T * K * 4 + 4);
  o->first_k = (int32_t*)malloc((size_t)R * T * K * 4 + 4);
  o->in_rank = (uint8_t*)calloc((size_t)R * T * R + 1, 1);
  o->rm_slot = (int32_t*)malloc((size_t)R * T * R * 4 + 4);
  o->send_off = (int32_t*)calloc((size_t)R * E, 4);
  o->send_rm = (int32_t*)calloc((size_t)R * R, 4);
  o->seg = (int32_t*)calloc((size_t)R * EL * 4, 4);
  o->src_off = (int32_t*)calloc((size_t)R * EL * (R + 1), 4);
  o->rm_off = (int32_t*)calloc((size_t)R * (R + 1), 4);
  o->dropped = (uint32_t*)calloc((size_t)R, 4);
  o->rows = (int64_t*)calloc((size_t)R, 8);
  o->rows_em = (int64_t*)calloc((size_t)R, 8);
  o->overflow = (int64_t*)calloc((size_t)R, 8);
  if (!o->Tr || !o->expert_count || !o->rank_count || !o->dst || !o->slot || !o->first_k || !o->in_rank || !o->rm_slot ||
      !o->send_off || !o->send_rm || !o->seg || !o->src_off || !o->rm_off || !o->dropped || !o->rows || !o->rows_em ||
      !o->overflow) {
    route_ref_free(o);
    return -1;
  }
  for (size_t i = 0; i < (size_t)R * T * K; ++i) o->dst[i] = o->slot[i] = o->first_k[i] = -1;
  for (size_t i = 0; i < (size_t)R * T * R; ++i) o->rm_slot[i] = -1;
  /* per source: counts, slots (first occurrences, in (t, k) order), destinations, rank-major slots */
  for (int r = 0; r < R; ++r) {
    int32_t* ec = o->expert_count + (size_t)r * E;
    int32_t* rc = o->rank_count + (size_t)r * R;
    const int Tn = Tr != NULL ? Tr[r] : T;
    o->Tr[r] = Tn;
    for (int t = 0; t < Tn; ++t) {
      const size_t tk = ((size_t)r * T + t) * K, tr = ((size_t)r * T + t) * R;
      for (int k = 0; k < K; ++k) {
        const int64_t v = topk[tk + k];
        int kf = k;
        if (v < -1 || v >= E) {
          o->dropped[r]++;
          continue;
        }
        if (v == -1) continue;
        for (int q = 0; q < k; ++q)
          if (topk[tk + q] == v) { /* an earlier entry already has this (valid) expert */
            kf = q;
            break;
          }
        o->first_k[tk + k] = kf;
        o->in_rank[tr + v / EL] = 1;
        if (kf != k) continue; /* a repeat: no copy of its own */
        o->slot[tk + k] = ec[v]++;
        o->dst[tk + k] = (int32_t)(v / EL);
      }
      for (int d = 0; d < R; ++d) o->rm_slot[tr + d] = o->in_rank[tr + d] ? rc[d]++ : -1;
    }
  }
  /* per destination: expert-major segments (aligned), per-source starts, send offsets */
  for (int d = 0; d < R; ++d) {
    int64_t running = 0;
    for (int j = 0; j < EL; ++j) {
      const int e = d * EL + j;
      int64_t tot = 0, before = 0;
      for (int r = 0; r < R; ++r) tot += o->expert_count[(size_t)r * E + e];
      for (int r = 0; r < R; ++r) {
        o->send_off[(size_t)r * E + e] = (int32_t)(running + before);
        o->src_off[((size_t)d * EL + j) * (R + 1) + r] = (int32_t)(running + before);
        before += o->expert_count[(size_t)r * E + e];
      }
      o->src_off[((size_t)d * EL + j) * (R + 1) + R] = (int32_t)(running + before);
      o->seg[((size_t)d * EL + j) * 4 + 0] = (int32_t)running;
      o->seg[((size_t)d * EL + j) * 4 + 1] = (int32_t)tot;
      o->seg[((size_t)d * EL + j) * 4 + 2] = (int32_t)((tot + A - 1) / A * A);
      running += (tot + A - 1) / A * A;
    }
    o->rows_em[d] = running;
  }
  /* rank-major: per destination, sources in rank order */
  for (int d = 0; d < R; ++d) {
    int64_t before = 0;
    for (int r = 0; r < R; ++r) {
      o->send_rm[(size_t)r * R + d] = (int32_t)before;
      o->rm_off[(size_t)d * (R + 1) + r] = (int32_t)before;
      before += o->rank_count[(size_t)r * R + d];
    }
    o->rm_off[(size_t)d * (R + 1) + R] = (int32_t)before;
    o->rows[d] = rank_major ? before : o->rows_em[d];
    o->overflow[d] = o->rows[d] > capacity ? o->rows[d] - capacity : 0;
  }
  return 0;
}

/* route_ref_compute — as route_ref_compute_ex with int32 ids topk [R][T][K], every rank T tokens. */
static inline int route_ref_compute(route_ref_t* o, int R, int E, int K, int T, int A, int rank_major, int64_t capacity,
                                    const int32_t* topk) {
  const size_t n = (size_t)R * T * K;
  int64_t* t64 = (int64_t*)malloc(n * 8 + 8);
  int rc;
  if (t64 == NULL) {
    memset(o, 0, sizeof(*o));
    return -1;
  }
  for (size_t i = 0; i < n; ++i) t64[i] = topk[i];
  rc = route_ref_compute_ex(o, R, E, K, T, NULL, A, rank_major, capacity, t64);
  free(t64);
  return rc;
}

/* route_ref_cmp_i32 — the first index where got and want differ, or -1 */
static inline int64_t route_ref_cmp_i32(const int32_t* got, const int32_t* want, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (got[i] != want[i]) return (int64_t)i;
  return -1;
}

/* route_ref_check — rank `rank`'s route buffer (buf: a host copy of its L->total_bytes, a real
 * rank's single buffer) after the update of epoch `epoch`, against the reference: the header
 * (epoch, magic, rank, T, status OK, dropped ids, and with a count exchange the receive rows /
 * expert-major rows / overflow), expert and rank counts, destination ranks, slots,
 * is_token_in_rank, rank-major slots, and with a count exchange the send offsets (both layouts' as
 * the plan has them), receive segments, per-source starts. Rows t >= T[rank] are not compared.
 * Returns 0, or 1 with the first difference in msg. */
static inline int route_ref_check(const route_ref_t* o, int rank, const epf_route_layout_t* L, const uint8_t* buf,
                                  uint32_t epoch, char* msg, size_t msg_bytes) {
  const int R = o->R, E = o->E, K = o->K, T = o->T, EL = E / R, Tn = o->Tr[rank];
  const epf_route_header_t* h = (const epf_route_header_t*)(buf + L->array[EPF_ROUTE_HEADER].offset);
  int64_t i;
#define RR_ARR(id, type) ((const type*)(buf + L->array[id].offset))
#define RR_CMP(what, id, want, n)                                                                                   \
  do {                                                                                                              \
    if ((i = route_ref_cmp_i32(RR_ARR(id, int32_t), (want), (size_t)(n))) >= 0) {                                   \
      snprintf(msg, msg_bytes, "rank %d route %s[%lld] = %d, want %d", rank, what, (long long)i, RR_ARR(id, int32_t)[i], \
               (want)[i]);                                                                                          \
      return 1;                                                                                                     \
    }                                                                                                               \
  } while (0)
  if (L->nranks != R || L->num_experts != E || L->top_k != K || L->max_tokens < Tn) {
    snprintf(msg, msg_bytes, "rank %d route layout (R %d E %d K %d T_max %d) does not match the reference", rank,
             L->nranks, L->num_experts, L->top_k, L->max_tokens);
    return 1;
  }
  if (h->magic != EPF_ROUTE_MAGIC || h->epoch != epoch || h->rank != rank || h->num_tokens != Tn || h->status != 0u ||
      h->dropped_routes != o->dropped[rank]) {
    snprintf(msg, msg_bytes, "rank %d route header: magic %08x epoch %u (want %u) rank %d T %d (want %d) status %s dropped %u (want %u)",
             rank, h->magic, h->epoch, epoch, h->rank, h->num_tokens, Tn, epf_status_name((epf_status_t)h->status),
             h->dropped_routes, o->dropped[rank]);
    return 1;
  }
  RR_CMP("expert_count", EPF_ROUTE_EXPERT_COUNT, o->expert_count + (size_t)rank * E, E);
  RR_CMP("rank_count", EPF_ROUTE_RANK_COUNT, o->rank_count + (size_t)rank * R, R);
  RR_CMP("dst_rank", EPF_ROUTE_DST_RANK, o->dst + (size_t)rank * T * K, (size_t)Tn * K);
  RR_CMP("slot", EPF_ROUTE_SLOT, o->slot + (size_t)rank * T * K, (size_t)Tn * K);
  {
    const uint8_t* itr = RR_ARR(EPF_ROUTE_TOKEN_IN_RANK, uint8_t);
    const uint8_t* want = o->in_rank + (size_t)rank * T * R;
    for (i = 0; i < (int64_t)Tn * R; ++i)
      if (itr[i] != want[i]) {
        snprintf(msg, msg_bytes, "rank %d route is_token_in_rank[%lld] = %u, want %u", rank, (long long)i, itr[i], want[i]);
        return 1;
      }
  }
  if (o->rank_major) RR_CMP("rm_slot", EPF_ROUTE_RM_SLOT, o->rm_slot + (size_t)rank * T * R, (size_t)Tn * R);
  if (!L->exchange) return 0; /* local-only (LL plans, EPF_ROUTE_FLAG_LOCAL_ONLY): no offsets */
  RR_CMP("send_offset", EPF_ROUTE_SEND_OFFSET, o->send_off + (size_t)rank * E, E);
  RR_CMP("recv_segment", EPF_ROUTE_RECV_SEGMENT, o->seg + (size_t)rank * EL * 4, (size_t)EL * 4);
  RR_CMP("recv_src_offset", EPF_ROUTE_RECV_SRC_OFFSET, o->src_off + (size_t)rank * EL * (R + 1), (size_t)EL * (R + 1));
  if (o->rank_major) {
    RR_CMP("send_rm_offset", EPF_ROUTE_SEND_RM_OFFSET, o->send_rm + (size_t)rank * R, R);
    RR_CMP("recv_rm_offset", EPF_ROUTE_RECV_RM_OFFSET, o->rm_off + (size_t)rank * (R + 1), R + 1);
  }
  if (h->recv_rows != o->rows[rank] || h->recv_rows_em != o->rows_em[rank] || h->recv_overflow != o->overflow[rank]) {
    snprintf(msg, msg_bytes, "rank %d route rows %lld/%lld/%lld, want %lld/%lld/%lld", rank, (long long)h->recv_rows,
             (long long)h->recv_rows_em, (long long)h->recv_overflow, (long long)o->rows[rank], (long long)o->rows_em[rank],
             (long long)o->overflow[rank]);
    return 1;
  }
#undef RR_CMP
#undef RR_ARR
  return 0;
}

#endif /* EPF_ROUTE_REF_H */
