/* epfuse/ll/impl/slots.cuh — the LL slot pass and the private helpers of the LL blocks — part of epfuse v0.1
 *
 * What it is: epf_ll_slots_block, the one computation of where each (token, k) copy lands in
 * its expert rank's receive rows (the dispatch send runs it; the pull combine runs it again),
 * its lookup, and the small private block / warp helpers the LL blocks share.
 * Include epfuse/ll/ll.cuh, not this file (it stands alone too, for the compile tests).
 *
 * Contents: see ll/ll.cuh.
 *
 * Requirements: see ll/ll.cuh.
 */
#ifndef EPF_LL_IMPL_SLOTS_CUH
#define EPF_LL_IMPL_SLOTS_CUH

#include <cub/warp/warp_scan.cuh>

#include "../../config.h"
#include "../../host.h"
#include "../../core/ptx.cuh"
#include "../../core/signal.cuh"
#include "layout.cuh"
#include "types.cuh"

EPF_BEGIN_DECLS

/* epf__ll_topk_raw — topk_idx[i] as int64 (int32 or int64 storage). */
EPF_DEVICE_INLINE int64_t epf__ll_topk_raw(const void* topk, int is64, int64_t i) {
  return is64 ? ((const int64_t*)topk)[i] : (int64_t)((const int32_t*)topk)[i];
}

/* epf__ll_route — the normalized expert of pair (t, k): >= 0 the expert; -1 not routed; -2
 * outside [-1, E) (dropped, counted once by the dispatch send). *out_first_k: the first k' <= k of
 * the token with the same expert (LL sends one copy per (token, expert); a repeated expert id
 * reuses the first copy's output in the combine). */
EPF_DEVICE_INLINE int epf__ll_route(const void* topk, int is64, int t, int k, int K, int E, int* out_first_k) {
  const int64_t base = (int64_t)t * K;
  const int64_t v = epf__ll_topk_raw(topk, is64, base + k);
  int j;
  *out_first_k = k;
  if (v == -1) return -1;
  if (v < -1 || v >= E) return -2;
  for (j = 0; j < k; ++j) {
    if (epf__ll_topk_raw(topk, is64, base + j) == v) {
      *out_first_k = j;
      break;
    }
  }
  return (int)v;
}

/* epf__ll_scan_block — exclusive prefix sum in place over data[0, n) (uint32), data[n] = total.
 * Warp 0 runs cub::WarpScan over chunks of 32 with a carry (n is at most E + 1 <= 1025: a block
 * scan would need a compile-time block size). ws: 16 bytes of smem for the scan's temp storage.
 * [collective:block], __syncthreads before and after. */
EPF_DEVICE_INLINE void epf__ll_scan_block(uint32_t* data, int n, void* ws) {
  typedef cub::WarpScan<uint32_t> epf__ws_t;
  EPF_STATIC_ASSERT(sizeof(epf__ws_t::TempStorage) <= 16, "cub::WarpScan temp storage exceeds its scratch slot");
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = (int)threadIdx.x;
    uint32_t carry = 0u;
    int base;
    for (base = 0; base < n; base += 32) {
      const int i = base + lane;
      uint32_t v = i < n ? data[i] : 0u, excl = 0u, agg = 0u;
      epf__ws_t(*(epf__ws_t::TempStorage*)ws).ExclusiveSum(v, excl, agg);
      if (i < n) data[i] = carry + excl;
      carry += agg;
      __syncwarp();
    }
    if (lane == 0) data[n] = carry;
  }
  __syncthreads();
}

/* epf__ll_find_group — the group g in [0, n) with prefix[g] <= r < prefix[g + 1] (prefix is
 * non-decreasing, prefix[n] > r); empty groups are skipped. */
EPF_DEVICE_INLINE int epf__ll_find_group(const uint32_t* prefix, int n, uint32_t r) {
  int lo = 0, hi = n; /* invariant: prefix[lo] <= r < prefix[hi] */
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (prefix[mid] <= r)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

EPF_DEVICE_INLINE void* epf__ll_shfl_ptr(void* p, int src_lane) {
  return (void*)(uintptr_t)__shfl_sync(0xffffffffu, (unsigned long long)(uintptr_t)p, src_lane);
}

/* epf__ll_first_k_warp — the first k' <= k of the lane's token whose key equals the lane's key
 *   (key = the expert id, EL = 1; or its rank, EL = experts per rank), for pairs p = base + lane of
 *   one 32-pair step of a slot pass (consecutive pairs, pair = t * K + k, row = t * K).
 *   The token's earlier pairs inside the step are compared by shuffles (no memory access); only
 *   the ones in an earlier step (k > lane: a token that straddles the step boundary, when 32 % K
 *   != 0 or K > 32) are read from topk again. key < 0: no key (returns k).
 *   Scope:    [collective:warp] every lane, converged; K warp-uniform. */
EPF_DEVICE_INLINE int epf__ll_first_k_warp(int key, int k, int K, const void* topk, int is64, int64_t row, int E,
                                           int EL) {
  const int lane = epf_lane_id();
  const int dmax = K - 1 < 31 ? K - 1 : 31;
  int first = k, d;
  for (d = 1; d <= dmax; ++d) { /* warp-uniform trip count */
    const int o = __shfl_sync(0xffffffffu, key, (lane - d) & 31);
    if (d <= k && d <= lane && key >= 0 && o == key) first = k - d; /* pair p - d: same token, same step */
  }
  if (key >= 0 && k > lane) { /* pairs row + j, j < k - lane, lie in an earlier step */
    const int jend = k - lane;
    int j;
    for (j = 0; j < jend; ++j) {
      const int64_t v = epf__ll_topk_raw(topk, is64, row + j);
      if (v >= 0 && v < E && (int)(v / EL) == key) {
        first = j;
        break;
      }
    }
  }
  return first;
}

/* epf__ll_slot_keys_t — the keys of EPF__LL_SLOT_PREFETCH consecutive 32-pair steps of one warp
 * of a slot pass, loaded at once (every id in flight together) and consumed in step order. A key is
 * topk[p] / EL for a valid id (EL = 1: the expert; experts per rank: the rank), -1 for id -1 or a
 * pair at or past the segment end `hi`, and `invalid` for an id outside [-1, E). Private to the two
 * slot passes (epf_ll_slots_block, epf_ll_rm_slots_block); kept in registers after inlining. */
typedef struct {
  int key[EPF__LL_SLOT_PREFETCH];
} epf__ll_slot_keys_t;

EPF_DEVICE_INLINE epf__ll_slot_keys_t epf__ll_slot_keys_load(const void* topk, int is64, int base0, int hi, int E,
                                                           int EL, int invalid) {
  epf__ll_slot_keys_t ks;
  int st;
#pragma unroll
  for (st = 0; st < EPF__LL_SLOT_PREFETCH; ++st) {
    const int p = base0 + st * 32 + epf_lane_id();
    const int64_t v = p < hi ? epf__ll_topk_raw(topk, is64, p) : -1;
    /* the same value either way; each form is the one its pass compiled best with (the rank
     * pass folds `invalid` = -1 into one range test) */
    if (invalid == -1)
      ks.key[st] = v >= 0 && v < E ? (int)(v / EL) : -1;
    else
      ks.key[st] = v == -1 ? -1 : (v < -1 || v >= E ? invalid : (int)(v / EL));
  }
  return ks;
}

/* epf__ll_slot_keys_pop — the key of the next step; the later steps shift down by one. */
EPF_DEVICE_INLINE int epf__ll_slot_keys_pop(epf__ll_slot_keys_t* ks) {
  const int key = ks->key[0];
  int j;
#pragma unroll
  for (j = 0; j + 1 < EPF__LL_SLOT_PREFETCH; ++j) ks->key[j] = ks->key[j + 1];
  return key;
}

/* epf__ll_slot_assign_warp — one 32-pair step of a slot pass: each lane whose key is >= 0 takes
 *   the next slot of its key in the warp's segment histogram h (lanes with the same key in lane
 *   order) and writes code[p] = key << 16 | slot; h[key] advances by the key's lanes. Lanes with
 *   key < 0 write nothing here (the caller wrote their code).
 *   Scope: [collective:warp] every lane, converged; h private to the warp. */
EPF_DEVICE_INLINE void epf__ll_slot_assign_warp(int key, int p, uint32_t* code, uint32_t* h) {
  const int lane = epf_lane_id();
  const uint32_t peers = __match_any_sync(0xffffffffu, key);
  const uint32_t before = (uint32_t)__popc(peers & ((1u << lane) - 1u));
  uint32_t cur = 0u;
  if (key >= 0) {
    cur = h[key];
    code[p] = ((uint32_t)key << 16) | (cur + before);
  }
  __syncwarp();
  if (key >= 0 && before == 0u) h[key] = cur + (uint32_t)__popc(peers);
  __syncwarp();
}

/* epf__ll_slot_hist_scan_block — the end of a slot pass: hist[g][i] (nseg segments of n keys)
 *   becomes the exclusive prefix over g of the segment counts, count[i] the total.
 *   Scope: [collective:block], __syncthreads before and after. */
EPF_DEVICE_INLINE void epf__ll_slot_hist_scan_block(uint32_t* hist, int nseg, int n, uint32_t* count) {
  int i;
  __syncthreads();
  for (i = (int)threadIdx.x; i < n; i += (int)blockDim.x) {
    uint32_t acc = 0u;
    int g;
    for (g = 0; g < nseg; ++g) {
      const uint32_t v = hist[g * n + i];
      hist[g * n + i] = acc;
      acc += v;
    }
    count[i] = acc;
  }
  __syncthreads();
}

/* epf__ll_slot_step — one 32-pair step of a slot pass: pairs p = t * K + k (p < hi: in the
 * warp's segment) with key `key` (epf__ll_slot_keys_t). by_rank (a literal) picks the pass:
 *   0, the expert pass (epf_ll_slots_block): counts the dropped ids (key -2) into dropped_routes,
 *      marks a repeated expert of its token EPF__LL_CODE_REPEAT | first k, the pairs without a
 *      copy EPF__LL_CODE_NONE, and assigns the slots;
 *   1, the rank pass (epf_ll_rm_slots_block, EL = experts per rank): a pair whose token named
 *      its rank at an earlier k carries no copy; assigns the slots, marks the rest NONE.
 * [collective:warp] every lane, converged. */
EPF_DEVICE_INLINE void epf__ll_slot_step(int p, int t, int k, int hi, int key, int K, int E, int EL, int by_rank,
                                         const void* topk_idx, int is64, uint32_t* code, uint32_t* h,
                                         uint32_t* dropped_routes) {
  if (by_rank) {
    /* an earlier entry of the token on the same rank carries the copy */
    if (epf__ll_first_k_warp(key, k, K, topk_idx, is64, (int64_t)t * K, E, EL) != k) key = -1;
    epf__ll_slot_assign_warp(key, p, code, h);
    if (key < 0 && p < hi) code[p] = EPF__LL_CODE_NONE;
  } else {
    const int first_k = epf__ll_first_k_warp(key, k, K, topk_idx, is64, (int64_t)t * K, E, 1);
    {
      const uint32_t dropped = __ballot_sync(0xffffffffu, key == -2);
      if (dropped_routes != NULL && dropped != 0u && epf_lane_id() == 0)
        epf_error_count_add(dropped_routes, (uint32_t)__popc(dropped));
    }
    if (key >= 0 && first_k != k) { /* repeated expert of the token: one copy, the first k's */
      code[p] = EPF__LL_CODE_REPEAT | (uint32_t)first_k;
      key = -1;
    } else if (key < 0 && p < hi) {
      code[p] = EPF__LL_CODE_NONE;
    }
    epf__ll_slot_assign_warp(key, p, code, h);
  }
}

/* epf__ll_slot_pass_block — the body of both slot passes: by_rank 0, epf_ll_slots_block (keys:
 * experts, E of them; dropped_routes counted); 1, epf_ll_rm_slots_block (keys: ranks, R of them;
 * dropped_routes unused). The steps of a prefetch run as one rolled body (unrolling them made the
 * dispatch sends of both layouts larger and no faster on sm_90). Scope and result: as the two. */
EPF_DEVICE_INLINE void epf__ll_slot_pass_block(const epf_plan_t* plan, const void* topk_idx, int index_type,
                                               int num_tokens, epf_ll_slots_t s, uint32_t* dropped_routes,
                                               int by_rank) {
  const int K = plan->top_k, E = plan->num_experts;
  const int EL = by_rank ? plan->experts_per_rank : 1, nkeys = by_rank ? plan->nranks : E;
  const int TK = num_tokens * K;
  const int is64 = epf_ll_index_is64(index_type);
  const int lane = epf_lane_id(), warp = epf_warp_id();
  const int seg_len = s.seg_len, nseg = s.nseg;
  int i;
  for (i = (int)threadIdx.x; i < nseg * nkeys; i += (int)blockDim.x) s.hist[i] = 0u;
  __syncthreads();
  if (warp < nseg) {
    const int lo = warp * seg_len;
    const int hi = lo + seg_len < TK ? lo + seg_len : TK;
    uint32_t* h = s.hist + warp * nkeys;
    int base0;
    for (base0 = lo; base0 < hi; base0 += 32 * EPF__LL_SLOT_PREFETCH) { /* warp-uniform bounds */
      /* the steps' keys: -1 none; an id outside [-1, E): -2 (experts, counted) or -1 (ranks) */
      epf__ll_slot_keys_t ks = epf__ll_slot_keys_load(topk_idx, is64, base0, hi, E, EL, by_rank ? -1 : -2);
      int st;
#pragma unroll 1
      for (st = 0; st < EPF__LL_SLOT_PREFETCH; ++st) { /* one body: the steps shift through ks */
        const int base = base0 + st * 32;
        const int p = base + lane;
        const int t = p / K, k = p - t * K;
        if (base >= hi) break; /* warp-uniform */
        epf__ll_slot_step(p, t, k, hi, epf__ll_slot_keys_pop(&ks), K, E, EL, by_rank, topk_idx, is64, s.code, h,
                          dropped_routes);
      }
    }
  }
  epf__ll_slot_hist_scan_block(s.hist, nseg, nkeys, s.count);
}

EPF_DEVICE_INLINE void epf_ll_slots_block(const epf_plan_t* plan, const void* topk_idx, int index_type, int num_tokens,
                                          epf_ll_slots_t s, uint32_t* dropped_routes) {
  epf__ll_slot_pass_block(plan, topk_idx, index_type, num_tokens, s, dropped_routes, 0);
}

EPF_DEVICE_INLINE uint32_t epf_ll_slot(const epf_plan_t* plan, epf_ll_slots_t s, int pair, int* out_expert) {
  const uint32_t cd = s.code[pair];
  int e;
  if ((cd >> 16) == 0xffffu) { /* EPF__LL_CODE_NONE or a repeat */
    *out_expert = -1;
    return EPF_LL_SLOT_NONE;
  }
  e = (int)(cd >> 16);
  *out_expert = e;
  return (cd & 0xffffu) + s.hist[(pair / s.seg_len) * plan->num_experts + e];
}

/* epf__ll_slot_route — the route of pair (t, k) (pair = t * K + k) from a filled slot table, as
 *   epf__ll_route gives it from topk_idx but without reading it: the expert (>= 0), or -1 for an
 *   id -1 or a dropped id; *out_first_k = the first k' <= k of the token naming the same expert.
 *   Scope: any thread, after the pass returned. */
EPF_DEVICE_INLINE int epf__ll_slot_route(epf_ll_slots_t s, int pair, int k, int* out_first_k) {
  uint32_t cd = s.code[pair];
  *out_first_k = k;
  if (cd == EPF__LL_CODE_NONE) return -1;
  if ((cd >> 16) == 0xffffu) { /* a repeat: its first occurrence carries the expert */
    *out_first_k = (int)(cd & 0xffffu);
    cd = s.code[pair - k + *out_first_k];
  }
  return (int)(cd >> 16);
}

EPF_END_DECLS

#endif /* EPF_LL_IMPL_SLOTS_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
