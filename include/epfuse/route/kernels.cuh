/* epfuse/route/kernels.cuh — ready-made route kernels and their host launchers — part of epfuse v0.1
 *
 * What it is: the easy path to the route (the handle), NCCL EP style:
 *   - epf_route_init    binds caller-provided device memory (size from epf_route_size, host.h):
 *                       zeroes it, writes each buffer's header, checks co-residency. Outside graph
 *                       capture (it may memset).
 *   - epf_route_update  one kernel launch per step: counts + slots + count exchange + wait +
 *                       offsets (route/route.cuh's phases, as epf_route_update_block composes them;
 *                       for 2 or 3 blocks and a few entries the kernel arranges them differently,
 *                       epf_route_split_ok). CUDA-graph capturable: every
 *                       argument is captured by value (topk_idx address, T, K, index type), the
 *                       epoch lives in device memory and the update advances it itself, so a
 *                       graph replay needs no host work. T may instead come from device memory
 *                       (step.num_tokens_dev), so one captured graph serves steps of any T <= T_max.
 *   - epf_route_create  init + update.
 *   - epf_route_import  rebinds a route buffer copied from elsewhere: validates its header against
 *                       the plan (epf_route_header_check) and rebuilds the handle.
 * One kernel serves a real rank (team from epf_nccl_team_query, route.count == 1) and VIRTUAL
 * RANKS (route.count == plan.nranks buffers, team = epf_team_virtual(window, plan.total_bytes, 0,
 * R); block b plays rank b / blocks_per_rank). All blocks of a launch must be co-resident (the
 * count exchange and the rank's block barrier spin on each other): the launchers refuse a grid
 * larger than the device holds with EPF_ERR_CO_RESIDENCY.
 *
 * What it does NOT do: allocate (route memory, windows and host-mapped words are the caller's),
 * synchronize the stream (except init / import / read_header, which are outside capture), or
 * print.
 *
 * Usage (tests/gpu/test_route.cu, tests/bench/bench_route.cu):
 *   epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;  rc.index_type = EPF_INDEX_INT64;
 *   uint64_t bytes;  epf_route_size(&plan, &rc, &bytes);
 *   cudaMalloc(&buf, bytes);                                   // x nranks for virtual ranks
 *   epf_route_t route;
 *   epf_route_init(&plan, &rc, buf, bytes, 1, 0, stream, &route);
 *   epf_route_step_t step = epf_route_step_make(d_topk, T, epf_wait_make(plan.timeout_ns, rec, NULL, 0));
 *   step.recv_total_mapped = d_total;                          // host-mapped int64, optional
 *   epf_route_update(&route, team, &plan, &step, stream);      // every step; capturable
 *   int32_t* slot = (int32_t*)epf_route_ptr(&route, 0, EPF_ROUTE_SLOT);
 *
 * COMPILE-TIME OPTIONS:
 *   EPF_ROUTE_BLOCK_THREADS  default 512: most threads of an update block (fewer when the
 *                            shared memory of epf_route_smem_bytes would pass 48 KiB).
 *
 * Contents:
 *   epf_route_step_t, epf_route_step_t epf_route_step_make(const void* topk_idx, int num_tokens, epf_wait_t)
 *   int          epf_route_block_threads(const epf_route_layout_t*)                      [EPF_HD]
 *   int          epf_route_blocks_per_rank(const epf_route_t*, int num_tokens)           [EPF_HD] (0: bad arguments)
 *   int          epf_route_update_threads(const epf_route_t*, int num_tokens, int blocks_per_rank) [EPF_HD]
 *   epf_status_t epf_route_init(const epf_plan_t*, const epf_route_config_t*, void* d_buffer,
 *                               uint64_t buffer_bytes, int count, uint32_t first_epoch, cudaStream_t,
 *                               epf_route_t* out_route)
 *   epf_status_t epf_route_update(const epf_route_t*, epf_team_t, const epf_plan_t*,
 *                                 const epf_route_step_t*, cudaStream_t)
 *   epf_status_t epf_route_create(const epf_plan_t*, const epf_route_config_t*, void* d_buffer,
 *                                 uint64_t buffer_bytes, int count, uint32_t first_epoch, epf_team_t,
 *                                 const epf_route_step_t*, cudaStream_t, epf_route_t* out_route)
 *   epf_status_t epf_route_import(const epf_plan_t*, void* d_buffer, uint64_t buffer_bytes, int count,
 *                                 cudaStream_t, epf_route_t* out_route)
 *   epf_status_t epf_route_read_header(const epf_route_t*, int index, cudaStream_t, epf_route_header_t* out)
 *   static __global__ epf__route_update_kernel, epf__route_init_kernel
 *
 * Requirements: CUDA, sm_70+; the CUDA runtime API.
 */
#ifndef EPF_ROUTE_KERNELS_CUH
#define EPF_ROUTE_KERNELS_CUH

#include "../config.h"

#if !EPF_IS_CUDA
#error "epfuse/route/kernels.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

#if !defined(__CUDACC_RTC__)
#include <cuda_runtime_api.h>
#endif

#include "../host.h"
#include "route.cuh"
#include "../core/signal.cuh"
#include "../core/team.cuh"

EPF_BEGIN_DECLS


/* Per-step operands of epf_route_update (captured by value when the launch is captured). */
typedef struct epf_route_step {
  const void* topk_idx;          /* device [count][max_tokens][top_k] of route.layout.index_type
                                    (virtual rank r's ids at r * max_tokens * top_k elements) */
  int32_t num_tokens;            /* T of every rank, 0..max_tokens (ignored when num_tokens_dev) */
  int32_t blocks_per_rank;       /* 0 -> epf_route_blocks_per_rank; 1..layout.max_blocks */
  const int32_t* num_tokens_dev; /* NULL, or device int32[count]: T per rank, read by the kernel
                                    (a value outside [0, max_tokens] is clamped and reported as
                                    EPF_ERR_TOKENS in wait.record) */
  int64_t* recv_total_mapped;    /* NULL, or the device address of host-mapped int64[count]: the
                                    rank's receive rows, or -status on failure (host protocol:
                                    write -1, launch, poll until != -1; docs/route.md) */
  epf_wait_t wait;               /* timeout (0 -> plan.timeout_ns), error record, abort word; the
                                    rank field is set per block */
} epf_route_step_t;

/* epf_route_step_make — a step with the given ids and T, default blocks, no device T, no mapped
 *   total. Scope: any thread. */
EPF_HD epf_route_step_t epf_route_step_make(const void* topk_idx, int num_tokens, epf_wait_t wait) {
  epf_route_step_t s;
  s.topk_idx = topk_idx;
  s.num_tokens = num_tokens;
  s.blocks_per_rank = 0;
  s.num_tokens_dev = NULL;
  s.recv_total_mapped = NULL;
  s.wait = wait;
  return s;
}

/* epf_route_block_threads — threads of an update block: the largest multiple of 32 up to
 *   EPF_ROUTE_BLOCK_THREADS whose shared memory (epf_route_smem_bytes) fits in 48 KiB (no opt-in
 *   attribute needed). At least 32. Pure. */
EPF_HD int epf_route_block_threads(const epf_route_layout_t* layout) {
  int t = (EPF_ROUTE_BLOCK_THREADS / 32) * 32;
  while (t > 32 && epf_route_smem_bytes(layout, t) > EPF__ROUTE_SMEM_LIMIT) t -= 32;
  return t < 32 ? 32 : t;
}

/* (token, k) entries per token-walking block that epf_route_blocks_per_rank aims for: one batch
 * per warp of a 512-thread block (16 warps x 32 x EPF__ROUTE_STEPS entries = 2560; 2304 leaves
 * room for uneven shares). Every phase of a block is a few dependent round trips per batch, so
 * more blocks put fewer batches on the critical path, until the control block's merge of their
 * rows costs more than it saves (past ~15 token blocks). */
#define EPF__ROUTE_ENTRIES_PER_BLOCK 2304

/* epf_route_blocks_per_rank — the default number of blocks per rank of epf_route_update: one
 *   token-walking block per 2304 (token, k) entries, plus block 0, the control block (merge,
 *   publish, offsets; no tokens: epf_route_block_tokens) when there are two or more; for a few
 *   entries (1 to 2304) 3 blocks when the route exchanges counts, else 2 (the kernel's private
 *   small-update arrangement: control, slots, offsets side by side); within [1, layout.max_blocks]
 *   and within what the device holds co-resident. 0 (the count sentinel) for a NULL route or
 *   num_tokens < 0. Scope: any thread, host or device. Pure. */
EPF_HD int epf_route_blocks_per_rank(const epf_route_t* route, int num_tokens) {
  int64_t entries;
  int b, fit;
  if (route == NULL || num_tokens < 0) return 0;
  entries = (int64_t)num_tokens * route->layout.top_k;
  b = (int)((entries + EPF__ROUTE_ENTRIES_PER_BLOCK - 1) / EPF__ROUTE_ENTRIES_PER_BLOCK);
  fit = route->count > 0 ? route->resident_blocks / route->count : 1;
  if (entries > 0 && epf_route_split_ok(2, num_tokens, route->layout.top_k))
    b = route->layout.exchange ? 3 : 2;
  else if (b > 1)
    b += 1;
  if (b > route->layout.max_blocks) b = route->layout.max_blocks;
  if (b > fit) b = fit;
  return b < 1 ? 1 : b;
}

/* epf_route_update_threads — threads of an update block of epf_route_update for num_tokens
 *   tokens over blocks_per_rank blocks: one warp per batch of 160 (token, k) entries of a
 *   token-walking block's share, at least 256 (the offsets' block scan covers E = 256 in one
 *   step) and at most epf_route_block_threads(&route->layout). Scope: any thread, host or
 *   device. Pure. */
EPF_HD int epf_route_update_threads(const epf_route_t* route, int num_tokens, int blocks_per_rank) {
  const int most = epf_route_block_threads(&route->layout);
  const int64_t all = (int64_t)num_tokens * route->layout.top_k;
  const bool split = epf_route_split_ok(blocks_per_rank, num_tokens, route->layout.top_k) != 0;
  /* block 0 walks no tokens when B > 1, except in the SPLIT arrangement, where every block walks
   * all */
  const int workers = blocks_per_rank > 1 && !split ? blocks_per_rank - 1 : 1;
  const int64_t entries = (all + workers - 1) / workers;
  int64_t t = 32 * ((entries + EPF__ROUTE_BATCH - 1) / EPF__ROUTE_BATCH);
  if (t < 256) t = 256;
  return t > most ? most : (int)t;
}

/* The update kernel: grid = (blocks_per_rank, route.count): blockIdx.x is the block of the rank,
 * blockIdx.y the buffer of the group (the virtual rank; 0 for a real rank), so no block divides
 * its index; epf_route_update_threads threads, epf_route_smem_bytes dynamic shared memory. It
 * owns the whole topk_idx before it starts, so it takes the SPLIT arrangement
 * (epf_route_update_split_block) where that applies. */
static __global__ void __launch_bounds__(EPF_ROUTE_BLOCK_THREADS, 1) epf__route_update_kernel(epf_route_t route, epf_team_t team, epf_plan_t plan,
                                                epf_route_step_t step, int virtual_ranks) {
  extern __shared__ uint4 epf__route_kernel_smem[];
  const int index = (int)blockIdx.y, block_index = (int)blockIdx.x, blocks_per_rank = (int)gridDim.x;
  epf_team_t me = team;
  if (virtual_ranks) me.rank = index;
  const int64_t elems = (int64_t)route.layout.max_tokens * route.layout.top_k;
  const char* topk = (const char*)step.topk_idx +
                     (int64_t)index * elems * (route.layout.index_type == EPF_INDEX_INT64 ? 8 : 4);
  int T = step.num_tokens;
  if (step.num_tokens_dev != NULL) {
    const int want = step.num_tokens_dev[index];
    T = want < 0 ? 0 : want > route.layout.max_tokens ? route.layout.max_tokens : want;
    if (T != want && block_index == 0 && threadIdx.x == 0)
      epf_error_report(step.wait.record, EPF_ERR_TOKENS, me.rank, -1, step.num_tokens_dev + index,
                       (uint64_t)route.layout.max_tokens, (uint64_t)(int64_t)want, 0);
  }
  epf_route_update_split_block(&route, index, me, &plan, topk, T, block_index, blocks_per_rank, step.wait,
                               step.recv_total_mapped != NULL ? step.recv_total_mapped + index : NULL,
                               (void*)epf__route_kernel_smem);
}

/* Writes the header of each of the route group's buffers (thread i: buffer i). */
static __global__ void epf__route_init_kernel(epf_route_t route, epf_route_header_t hdr) {
  const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < route.count) *(epf_route_header_t*)epf_route_ptr(&route, i, EPF_ROUTE_HEADER) = hdr;
}

#if !defined(__CUDACC_RTC__) /* host launchers: nvcc only (NVRTC compiles the kernels above) */
/* epf__route_bind — fill a handle and measure co-residency on the current device. */
EPF_INLINE epf_status_t epf__route_bind(const epf_route_layout_t* layout, void* d_buffer, int count,
                                        epf_route_t* out) {
  const int threads = epf_route_block_threads(layout);
  const size_t smem = epf_route_smem_bytes(layout, threads);
  int dev = 0, per_sm = 0, sms = 0;
  epf_status_t st;
  if (!epf__cuda_ok(cudaGetDevice(&dev)) ||
      !epf__cuda_ok(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, epf__route_update_kernel, threads, smem)) ||
      !epf__cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)))
    return EPF_ERR_CUDA;
  /* one block per rank at least must fit (the virtual ranks spin on each other) */
  st = epf_virtual_grid_check((const void*)epf__route_update_kernel, threads, smem, count, dev);
  if (st != EPF_OK) return st;
  out->size = (uint32_t)sizeof(epf_route_t);
  out->magic = EPF_ROUTE_HANDLE_MAGIC;
  out->version = EPF_ROUTE_HANDLE_VERSION;
  out->count = count;
  out->base = d_buffer;
  out->epoch_words = NULL;
  out->device = dev;
  out->resident_blocks = per_sm * sms;
  out->layout = *layout;
  return EPF_OK;
}

EPF_INLINE epf_status_t epf__route_check_buffer(const epf_plan_t* plan, const void* d_buffer, uint64_t buffer_bytes,
                                                int count, const epf_route_t* out) {
  if (plan == NULL || d_buffer == NULL || out == NULL) return EPF_ERR_INVALID_ARGUMENT;
  if (count < 1 || (count != 1 && count != plan->nranks)) return EPF_ERR_INVALID_ARGUMENT;
  if (((uintptr_t)d_buffer & (uintptr_t)(EPF_ALIGN - 1)) != 0u) return EPF_ERR_ALIGNMENT;
  (void)buffer_bytes;
  return EPF_OK;
}

/* epf_route_init — bind `count` route buffers at d_buffer (buffer i at d_buffer + i *
 *   layout.total_bytes) to `plan`: zero them and write their headers at epoch `first_epoch`.
 *   count: 1 (a real rank) or plan->nranks (virtual ranks). first_epoch: the epoch of the window's
 *   last count exchange, the same on every rank (0 for a fresh, zeroed window).
 *   Statuses: EPF_ERR_INVALID_ARGUMENT (NULL, count, buffer_bytes < count * route size), those of
 *   epf_route_layout_compute, EPF_ERR_ALIGNMENT (d_buffer not EPF_ALIGN-aligned),
 *   EPF_ERR_CO_RESIDENCY (count blocks cannot be co-resident), EPF_ERR_CUDA.
 *   Scope: host, outside graph capture. Stream-ordered (memset + one small kernel on `stream`); the
 *   handle is valid when the call returns. */
EPF_INLINE epf_status_t epf_route_init(const epf_plan_t* plan, const epf_route_config_t* cfg, void* d_buffer,
                                       uint64_t buffer_bytes, int count, uint32_t first_epoch, cudaStream_t stream,
                                       epf_route_t* out_route) {
  epf_route_layout_t L;
  epf_route_header_t hdr;
  epf_route_t r;
  epf_status_t st = epf__route_check_buffer(plan, d_buffer, buffer_bytes, count, out_route);
  if (st != EPF_OK) return st;
  st = epf_route_layout_compute(plan, cfg, &L);
  if (st != EPF_OK) return st;
  if (buffer_bytes / (uint64_t)count < L.total_bytes) return EPF_ERR_INVALID_ARGUMENT;
  st = epf__route_bind(&L, d_buffer, count, &r);
  if (st != EPF_OK) return st;
  epf_route_header_init(&L, first_epoch, &hdr);
  if (!epf__cuda_ok(cudaMemsetAsync(d_buffer, 0, (size_t)(L.total_bytes * (uint64_t)count), stream)))
    return EPF_ERR_CUDA;
  epf__route_init_kernel<<<(unsigned)((count + 127) / 128), 128, 0, stream>>>(r, hdr);
  if (!epf__cuda_ok(cudaGetLastError())) return EPF_ERR_CUDA;
  *out_route = r;
  return EPF_OK;
}

/* epf_route_update — one step: launch the update kernel on `stream`.
 *   team: a real rank's view (epf_nccl_team_query, or epf_team_affine / _from_table; route->count
 *   == 1), or for virtual ranks epf_team_virtual(window, plan->total_bytes, 0, plan->nranks) with
 *   route->count == plan->nranks. Every rank of the team updates once per step, in lockstep.
 *   Statuses (host checks; nothing is launched on error): EPF_ERR_INVALID_ARGUMENT (NULL, no
 *   topk_idx, bad blocks_per_rank, team without memory), those of epf_route_check (route or plan
 *   prefix, a handle damaged since it was made, a route laid out for another plan:
 *   EPF_ERR_CONFIG_MISMATCH), EPF_ERR_CONFIG_MISMATCH (team size != plan),
 *   EPF_ERR_RANK (real rank outside [0, nranks)), EPF_ERR_TOKENS (num_tokens outside
 *   [0, max_tokens]), EPF_ERR_CO_RESIDENCY (grid larger than the device holds), EPF_ERR_CUDA (the
 *   launch failed). Device-side failures (wait timeouts) land in step->wait.record, the route
 *   header's status and *recv_total_mapped.
 *   Scope: host; CUDA-graph capturable (no allocation, no sync, no attribute calls). */
EPF_INLINE epf_status_t epf_route_update(const epf_route_t* route, epf_team_t team, const epf_plan_t* plan,
                                         const epf_route_step_t* step, cudaStream_t stream) {
  int threads, B, virtual_ranks;
  size_t smem;
  epf_status_t st;
  epf_route_step_t s;
  if (route == NULL || plan == NULL || step == NULL || step->topk_idx == NULL || route->base == NULL)
    return EPF_ERR_INVALID_ARGUMENT;
  st = epf_route_check(route, plan); /* the handle, its layout re-derived from the plan */
  if (st != EPF_OK) return st;
  if (team.nranks != plan->nranks) return EPF_ERR_CONFIG_MISMATCH;
  if (team.base == NULL && team.peers == NULL) return EPF_ERR_INVALID_ARGUMENT;
  virtual_ranks = route->count == plan->nranks;
  if (!virtual_ranks && (team.rank < 0 || team.rank >= plan->nranks)) return EPF_ERR_RANK;
  if (step->num_tokens < 0 || step->num_tokens > route->layout.max_tokens) return EPF_ERR_TOKENS;
  if (step->blocks_per_rank < 0 || step->blocks_per_rank > route->layout.max_blocks)
    return EPF_ERR_INVALID_ARGUMENT;
  B = step->blocks_per_rank != 0
          ? step->blocks_per_rank
          : epf_route_blocks_per_rank(route, step->num_tokens_dev != NULL ? route->layout.max_tokens : step->num_tokens);
  if ((int64_t)B * route->count > (int64_t)route->resident_blocks) return EPF_ERR_CO_RESIDENCY;
  threads = epf_route_update_threads(route, step->num_tokens_dev != NULL ? route->layout.max_tokens : step->num_tokens, B);
  smem = epf_route_smem_bytes(&route->layout, threads);
  s = *step;
  if (s.wait.timeout_ns == 0u) s.wait.timeout_ns = plan->timeout_ns; /* zero: the plan's timeout */
  epf__route_update_kernel<<<dim3((unsigned)B, (unsigned)route->count), (unsigned)threads, smem, stream>>>(
      *route, team, *plan, s, virtual_ranks);
  return epf__cuda_status(cudaGetLastError());
}

/* epf_route_create — epf_route_init, then epf_route_update (NCCL EP's fused create). Outside graph
 *   capture. Statuses: those of init, then those of update. */
EPF_INLINE epf_status_t epf_route_create(const epf_plan_t* plan, const epf_route_config_t* cfg, void* d_buffer,
                                         uint64_t buffer_bytes, int count, uint32_t first_epoch, epf_team_t team,
                                         const epf_route_step_t* step, cudaStream_t stream, epf_route_t* out_route) {
  epf_status_t st = epf_route_init(plan, cfg, d_buffer, buffer_bytes, count, first_epoch, stream, out_route);
  if (st != EPF_OK) return st;
  return epf_route_update(out_route, team, plan, step, stream);
}

/* epf_route_read_header — copy buffer `index`'s header to the host (waits for `stream`).
 *   Statuses: EPF_ERR_INVALID_ARGUMENT, EPF_ERR_CUDA. Scope: host, outside graph capture. */
EPF_INLINE epf_status_t epf_route_read_header(const epf_route_t* route, int index, cudaStream_t stream,
                                              epf_route_header_t* out_header) {
  if (route == NULL || out_header == NULL || route->base == NULL || index < 0 || index >= route->count)
    return EPF_ERR_INVALID_ARGUMENT;
  if (!epf__cuda_ok(cudaMemcpyAsync(out_header, epf_route_ptr(route, index, EPF_ROUTE_HEADER), sizeof(*out_header),
                      cudaMemcpyDeviceToHost, stream)) ||
      !epf__cuda_ok(cudaStreamSynchronize(stream)))
    return EPF_ERR_CUDA;
  return EPF_OK;
}

/* epf_route_import — rebind `count` route buffers at d_buffer that were prepared elsewhere (e.g.
 *   copied byte for byte from another route group, or restored from a checkpoint): reads every
 *   header (waits for `stream`), validates it against `plan` (epf_route_header_check; the buffers
 *   of a group must agree on T_max, K, index type, blocks, flags and epoch) and rebuilds the
 *   handle. The arrays are used as they are: dispatch / combine may run on them without an update,
 *   and the next update continues from the recorded epoch (which must match the window's).
 *   Statuses: EPF_ERR_INVALID_ARGUMENT, EPF_ERR_ALIGNMENT, those of epf_route_header_check,
 *   EPF_ERR_CONFIG_MISMATCH (buffers of the group disagree), EPF_ERR_CO_RESIDENCY, EPF_ERR_CUDA.
 *   Scope: host, outside graph capture. */
EPF_INLINE epf_status_t epf_route_import(const epf_plan_t* plan, void* d_buffer, uint64_t buffer_bytes, int count,
                                         cudaStream_t stream, epf_route_t* out_route) {
  epf_route_header_t h0, hi;
  epf_route_layout_t L, Li;
  epf_route_t r;
  int i;
  epf_status_t st = epf__route_check_buffer(plan, d_buffer, buffer_bytes, count, out_route);
  if (st != EPF_OK) return st;
  if (!epf__cuda_ok(cudaMemcpyAsync(&h0, d_buffer, sizeof(h0), cudaMemcpyDeviceToHost, stream)) ||
      !epf__cuda_ok(cudaStreamSynchronize(stream)))
    return EPF_ERR_CUDA;
  st = epf_route_header_check(&h0, plan, buffer_bytes / (uint64_t)count, &L);
  if (st != EPF_OK) return st;
  for (i = 1; i < count; ++i) {
    if (!epf__cuda_ok(cudaMemcpyAsync(&hi, (char*)d_buffer + (uint64_t)i * L.total_bytes, sizeof(hi), cudaMemcpyDeviceToHost,
                        stream)) ||
        !epf__cuda_ok(cudaStreamSynchronize(stream)))
      return EPF_ERR_CUDA;
    st = epf_route_header_check(&hi, plan, L.total_bytes, &Li);
    if (st != EPF_OK) return st;
    if (hi.top_k != h0.top_k || hi.max_tokens != h0.max_tokens || hi.index_type != h0.index_type ||
        hi.max_blocks != h0.max_blocks || hi.flags != h0.flags || hi.epoch != h0.epoch)
      return EPF_ERR_CONFIG_MISMATCH;
  }
  st = epf__route_bind(&L, d_buffer, count, &r);
  if (st != EPF_OK) return st;
  *out_route = r;
  return EPF_OK;
}

#endif /* !__CUDACC_RTC__ */
EPF_END_DECLS

#endif /* EPF_ROUTE_KERNELS_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
