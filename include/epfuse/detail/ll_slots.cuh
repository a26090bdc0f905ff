/* epfuse/detail/ll_slots.cuh — the LL slot pass and the private helpers of the LL blocks — part of epfuse v0.1
 *
 * What it is: epf_ll_slots_block, the one computation of where each (token, k) copy lands in
 * its expert rank's receive rows (the dispatch send runs it; the pull combine runs it again),
 * its lookup, and the small private block / warp helpers the LL blocks share.
 * Include epfuse/ll.cuh, not this file (it stands alone too, for the compile tests).
 *
 * Contents: see ll.cuh.
 *
 * Requirements: see ll.cuh.
 */
#ifndef EPF_DETAIL_LL_SLOTS_CUH
#define EPF_DETAIL_LL_SLOTS_CUH

#include <cub/warp/warp_scan.cuh>

#include "../config.h"
#include "../host.h"
#include "../ptx.cuh"
#include "../signal.cuh"
#include "ll_layout.cuh"
#include "ll_types.cuh"

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

EPF_END_DECLS

#endif /* EPF_DETAIL_LL_SLOTS_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
