/* epfuse/core/signal.cuh — epoch signals, bounded waits, error records, active mask, handshake — part of epfuse v0.1
 *
 * What it is: the synchronisation layer every protocol in epfuse stands on.
 *   - Signal words are uint64_t: (epoch << 32) | value. Epochs are monotone 32-bit sequence
 *     numbers kept by the caller; nothing is ever reset between rounds, and epochs are compared
 *     wrap-safely ((int32_t)(got - want) >= 0), so CUDA-graph replays need no host work.
 *   - Publication: data stores, __syncwarp / __syncthreads, then ONE thread's .sys release store
 *     of the signal (epf_signal_set_sys). Consumption: .sys acquire load (inside epf_signal_wait_sys),
 *     then the data.
 *   - Every spin loop in epfuse is epf__wait_sys: a deadline from %globaltimer, an abort word
 *     checked every EPF_ABORT_POLL_MASK+1 polls, an optional active mask (a peer that misses the
 *     deadline is masked), and on expiry a diagnostic (waiter, address, wanted, seen) written into
 *     the host-mapped epf_error_record_t, readable with epf_error_read without a device sync.
 *   - epf_handshake_block: every rank writes its config hash into every peer's window header; ranks
 *     that disagree all return EPF_ERR_CONFIG_MISMATCH instead of corrupting memory later.
 *   - epf_barrier_block: a team barrier over the plan's SIG_BARRIER words.
 *
 * What it does NOT do: allocate, launch, include nccl_device.h, or print/trap on timeout (it
 * returns a status and records it; EPF_DEBUG does not change that).
 *
 * Usage:
 *   epf_wait_t w = epf_wait_make(plan.timeout_ns, err_record, abort_word, team.rank);
 *   // sender: rows stored, then
 *   __syncwarp();
 *   if (lane == 0) epf_signal_set_sys((uint64_t*)epf_peer_ptr(team, sig_off, dst), epoch, nrows);
 *   // receiver:
 *   uint32_t nrows;
 *   epf_status_t st = epf_signal_wait_sys((const uint64_t*)epf_local_ptr(team, sig_off), epoch, w,
 *                                         src, &nrows);
 *
 * COMPILE-TIME OPTIONS: EPF_ENABLE_TIMEOUT (0: waits never expire), EPF_ABORT_POLL_MASK.
 *
 * Contents:
 *   bool     epf_epoch_reached(uint32_t got, uint32_t want)                        [EPF_HD]
 *   uint64_t epf_signal_pack(uint32_t epoch, uint32_t value)                       [EPF_HD]
 *   uint32_t epf_signal_epoch(uint64_t word), epf_signal_value(uint64_t word)       [EPF_HD]
 *   uint64_t epf_count_word_pack(uint32_t epoch, uint32_t count)                    [EPF_HD]
 *   bool     epf_count_word_valid(uint64_t word, uint32_t epoch); uint32_t epf_count_word_count(uint64_t) [EPF_HD]
 *   EPF_MASK_WORDS; epf_mask_init_all(uint32_t* mask, int nranks)                   [EPF_HD]
 *   bool     epf_mask_is_active(const uint32_t* mask, int rank)                   [device]
 *   bool     epf_mask_deactivate_sys(uint32_t* mask, int rank)                    [device]
 *   void     epf_mask_activate_sys(uint32_t* mask, int rank)                      [device]
 *   epf_wait_t epf_wait_make(uint64_t timeout_ns, epf_error_record_t* rec, const uint32_t* abort_word, int rank)
 *   void     epf_error_report(epf_error_record_t*, epf_status_t, rank, peer, addr, wanted, seen, elapsed)
 *   void     epf_error_count_add(uint32_t* counter, uint32_t n)                   [device]
 *   void     epf_error_report_warp(const epf_wait_t*, bool bad, epf_status_t, addr, wanted, seen) [collective:warp]
 *   void     epf_signal_set_sys(uint64_t* flag, uint32_t epoch, uint32_t value)   [device]
 *   void     epf_signal_add_sys(uint64_t* flag, uint32_t value)                   [device]
 *   epf_status_t epf_signal_wait_sys(const uint64_t* flag, uint32_t epoch, epf_wait_t w, int peer, uint32_t* out_value)
 *   epf_status_t epf_count_word_wait_sys(const uint64_t* word, uint32_t epoch, epf_wait_t w, int peer, uint32_t* out_count)
 *   epf_status_t epf_epoch_wait_sys_u32(const uint32_t* word, uint32_t epoch, epf_wait_t w, int peer)
 *   epf_status_t epf_handshake_block(epf_team_t, const epf_plan_t*, uint32_t epoch, epf_wait_t)
 *   epf_status_t epf_barrier_block(epf_team_t, const epf_plan_t*, uint32_t epoch, epf_wait_t)
 *   epf_status_t epf_rank_barrier_block(uint64_t* word, uint32_t nblocks, uint32_t epoch, epf_wait_t)  the blocks of one rank
 *   bool     epf_arrive_last_block(uint32_t* counter, uint32_t nblocks, uint32_t round)     [collective:block]
 *   bool     epf_arrive_last_block_epoch(uint32_t* word, uint32_t nblocks, uint32_t epoch)  [collective:block]
 *   void     epf_signal_peers_block(epf_team_t, const epf_plan_t*, epf_region_id_t, uint32_t epoch)    [collective:block]
 *   epf_status_t epf_wait_peers_block(epf_team_t, const epf_plan_t*, epf_region_id_t, uint32_t epoch, epf_wait_t)
 *
 * Requirements: CUDA, sm_70+.
 */
#ifndef EPF_CORE_SIGNAL_CUH
#define EPF_CORE_SIGNAL_CUH

#include "../config.h"
#include "../host.h"
#include "ptx.cuh"
#include "team.cuh"

EPF_BEGIN_DECLS

/* ---- epochs and signal words ----------------------------------------------------------------- */

/* epf_epoch_reached — true when epoch `got` is at or past `want`, wrap-safe (valid while the two
 *   are less than 2^31 apart). Scope: any thread, host or device. */
EPF_HD bool epf_epoch_reached(uint32_t got, uint32_t want) { return (int32_t)(got - want) >= 0; }

EPF_HD uint64_t epf_signal_pack(uint32_t epoch, uint32_t value) {
  return ((uint64_t)epoch << 32) | (uint64_t)value;
}
EPF_HD uint32_t epf_signal_epoch(uint64_t word) { return (uint32_t)(word >> 32); }
EPF_HD uint32_t epf_signal_value(uint64_t word) { return (uint32_t)word; }

/* Count words: a count that carries the epoch of the update that wrote it, so a reader needs no
 * separate signal or fence (NCCL's LL idea: data and flag in one single-copy-atomic 8-byte store):
 * (epoch << 32) | 0x80000000 | count, count < 2^31. Bit 31 marks a written word, so zeroed memory
 * is never valid, whatever the epoch (epochs wrap through 0). The route's count exchange and its
 * per-block partial counts use them. */
EPF_HD uint64_t epf_count_word_pack(uint32_t epoch, uint32_t count) {
  return ((uint64_t)epoch << 32) | 0x80000000u | (uint64_t)(count & 0x7fffffffu);
}
/* true when `word` was written with exactly `epoch` (wrap-safe: equality) */
EPF_HD bool epf_count_word_valid(uint64_t word, uint32_t epoch) {
  return (word >> 31) == (((uint64_t)epoch << 1) | 1u);
}
EPF_HD uint32_t epf_count_word_count(uint64_t word) { return (uint32_t)word & 0x7fffffffu; }

/* ---- active mask ------------------------------------------------------------------------------ */

/* The active mask: EPF_MASK_WORDS uint32 words, bit r set = rank r takes part. Each rank keeps its
 * own copy in its own memory (device or host-mapped); a wait that times out with a mask clears the
 * late peer's bit. */
#define EPF_MASK_WORDS ((EPF_MAX_RANKS + 31) / 32)

/* epf_mask_init_all — every rank of [0, nranks) active, the rest inactive. Scope: one thread. */
EPF_HD void epf_mask_init_all(uint32_t* mask, int nranks) {
  int w;
  for (w = 0; w < EPF_MASK_WORDS; ++w) {
    int lo = w * 32, n = nranks - lo;
    mask[w] = n >= 32 ? 0xffffffffu : n <= 0 ? 0u : ((1u << n) - 1u);
  }
}

/* epf_mask_is_active — relaxed .sys read of rank's bit. NULL mask: everyone is active. */
EPF_DEVICE_INLINE bool epf_mask_is_active(const uint32_t* mask, int rank) {
  if (mask == NULL) return true;
  return (epf_ld_relaxed_sys_u32(mask + (rank >> 5)) >> (rank & 31)) & 1u;
}

/* epf_mask_deactivate_sys — clear rank's bit; returns true if this call cleared it (it was set). */
EPF_DEVICE_INLINE bool epf_mask_deactivate_sys(uint32_t* mask, int rank) {
  uint32_t bit = 1u << (rank & 31);
  return (atomicAnd_system(mask + (rank >> 5), ~bit) & bit) != 0u;
}

/* epf_mask_activate_sys — set rank's bit (re-admission; mask clean). */
EPF_DEVICE_INLINE void epf_mask_activate_sys(uint32_t* mask, int rank) {
  atomicOr_system(mask + (rank >> 5), 1u << (rank & 31));
}

/* ---- error record ----------------------------------------------------------------------------- */

/* The wait context, passed by value. */
typedef struct epf_wait {
  uint64_t timeout_ns;        /* deadline of every wait; 0 = EPF_DEFAULT_TIMEOUT_NS (10 s): there is
                                 no infinite wait (only EPF_ENABLE_TIMEOUT == 0 at compile time
                                 removes the deadline) */
  epf_error_record_t* record; /* where expiry is recorded (host-mapped), or NULL */
  const uint32_t* abort_word; /* nonzero = abort every wait, or NULL */
  uint32_t* mask;             /* active mask (fault tolerance), or NULL */
  int32_t rank;               /* the waiter's rank, for the diagnostic */
  int32_t reserved;
} epf_wait_t;

/* epf_wait_make — a wait context without fault tolerance (mask = NULL). Scope: any thread. */
EPF_HD epf_wait_t epf_wait_make(uint64_t timeout_ns, epf_error_record_t* record,
                                const uint32_t* abort_word, int rank) {
  epf_wait_t w;
  w.timeout_ns = timeout_ns;
  w.record = record;
  w.abort_word = abort_word;
  w.mask = NULL;
  w.rank = rank;
  w.reserved = 0;
  return w;
}

/* epf_error_report — count an error and, if it is the first one, record it in full.
 *   Scope: any single thread. rec may be NULL (no-op).
 *   Memory: rec is written by ONE GPU (one record per rank, or per virtual-rank group on one GPU)
 *   and read by the host, typically host-mapped. The count and the claim of the first error are
 *   .gpu-scope atomics (atomic among the GPU's threads; system-scope atomics on host memory are
 *   not supported over PCIe and compute-sanitizer rejects them); the fields are plain stores and
 *   rec->valid is .sys release-stored after them, so a host that sees valid == 1 sees the fields. */
EPF_DEVICE_INLINE void epf_error_report(epf_error_record_t* rec, epf_status_t status, int rank,
                                        int peer, const void* address, uint64_t wanted,
                                        uint64_t seen, uint64_t elapsed_ns) {
  if (rec == NULL) return;
  epf_red_add_relaxed_gpu_u32(&rec->count, 1u);
  if (epf_atom_cas_acq_rel_gpu_u32(&rec->status, 0u, (uint32_t)status) != 0u) return;
  rec->waiter_rank = rank;
  rec->waiter_block = (int32_t)blockIdx.x;
  rec->waiter_thread = (int32_t)threadIdx.x;
  rec->peer = peer;
  rec->address = (uint64_t)(uintptr_t)address;
  rec->wanted = wanted;
  rec->seen = seen;
  rec->elapsed_ns = elapsed_ns;
  epf_st_release_sys_u32(&rec->valid, 1u);
}

/* epf_error_count_add — add n to one of the record's counters (dropped_routes, recv_overflow,
 *   masked_ranks). Scope: any thread. A .gpu-scope relaxed reduction (see epf_error_report: the
 *   record belongs to one GPU; the host only reads it). */
EPF_DEVICE_INLINE void epf_error_count_add(uint32_t* counter, uint32_t n) {
  if (counter != NULL && n != 0u) epf_red_add_relaxed_gpu_u32(counter, n);
}

/* epf_error_report_warp — report `status` once for the warp: the lowest lane with `bad` records it
 *   (epf_error_report with w->record and w->rank, no peer, `address`, `wanted`, `seen`).
 *   Scope: [collective:warp] every lane, converged. No-op when no lane is bad. */
EPF_DEVICE_INLINE void epf_error_report_warp(const epf_wait_t* w, bool bad, epf_status_t status, const void* address,
                                             uint64_t wanted, uint64_t seen) {
  const uint32_t m = __ballot_sync(0xffffffffu, bad);
  if (m != 0u && epf_lane_id() == __ffs((int)m) - 1) epf_error_report(w->record, status, w->rank, -1, address, wanted, seen, 0);
}

/* ---- signal set / wait ------------------------------------------------------------------------ */

/* epf_signal_set_sys — publish (epoch, value) with a .sys release store. Everything this thread
 *   wrote before (and, after a __syncwarp/__syncthreads, what its warp/block wrote) is visible to
 *   a peer whose wait returns this epoch. Scope: one thread. flag may be a peer pointer. */
EPF_DEVICE_INLINE void epf_signal_set_sys(uint64_t* flag, uint32_t epoch, uint32_t value) {
  epf_st_release_sys_u64(flag, epf_signal_pack(epoch, value));
}

/* epf_signal_add_sys — .sys release add of `value` to the low word (several writers count into
 *   one flag; the caller owns carry into the epoch half). Scope: one thread. */
EPF_DEVICE_INLINE void epf_signal_add_sys(uint64_t* flag, uint32_t value) {
  epf_red_add_release_sys_u64(flag, (uint64_t)value);
}

/* what epf__wait_sys polls */
#define EPF__WAIT_U32_EPOCH 0 /* a plain u32 epoch word: done when it reaches the epoch */
#define EPF__WAIT_SIGNAL 1    /* a u64 signal word: done when its epoch half reaches the epoch */
#define EPF__WAIT_COUNT 2     /* a u64 count word: done when it carries exactly the epoch (epf_count_word_valid) */

/* epf__wait_sys — THE spin loop. Polls `addr` (kind: EPF__WAIT_*) with .sys acquire loads until
 * it is done.
 * Returns EPF_OK (and the word in *out_word), EPF_ERR_PEER_MASKED (peer already masked: no
 * wait, not recorded), EPF_ERR_ABORTED (recorded), or EPF_ERR_TIMEOUT (recorded; peer masked when
 * w.mask != NULL). */
EPF_DEVICE_INLINE epf_status_t epf__wait_sys(const void* addr, int kind, uint32_t epoch,
                                             epf_wait_t w, int peer, uint64_t* out_word) {
  uint64_t word = 0, start = 0;
  uint32_t polls = 0;
  const uint64_t limit = w.timeout_ns != 0u ? w.timeout_ns : (uint64_t)EPF_DEFAULT_TIMEOUT_NS; /* 0: the default */
  (void)limit;
  if (w.mask != NULL && peer >= 0 && !epf_mask_is_active(w.mask, peer)) return EPF_ERR_PEER_MASKED;
  for (;;) { /* bounded: the deadline (limit), the abort word */
    bool done;
    if (kind != EPF__WAIT_U32_EPOCH) {
      word = epf_ld_acquire_sys_u64((const uint64_t*)addr);
      done = kind == EPF__WAIT_COUNT ? epf_count_word_valid(word, epoch) : epf_epoch_reached(epf_signal_epoch(word), epoch);
    } else {
      word = epf_ld_acquire_sys_u32((const uint32_t*)addr);
      done = epf_epoch_reached((uint32_t)word, epoch);
    }
    if (done) {
      if (out_word != NULL) *out_word = word;
      return EPF_OK;
    }
    if ((polls++ & EPF_ABORT_POLL_MASK) == 0u) {
      uint64_t now = epf_globaltimer_ns();
      epf_status_t st = EPF_OK;
      if (start == 0) start = now;
      if (w.abort_word != NULL && epf_ld_volatile_u32(w.abort_word) != 0u) {
        st = EPF_ERR_ABORTED; /* recorded like a timeout: who waited on what when the abort came */
      }
#if EPF_ENABLE_TIMEOUT
      else if (now - start > limit) {
        if (w.mask != NULL && peer >= 0 && epf_mask_deactivate_sys(w.mask, peer) && w.record != NULL)
          epf_error_count_add(&w.record->masked_ranks, 1u);
        st = EPF_ERR_TIMEOUT;
      }
#endif
      if (st != EPF_OK) {
        epf_error_report(w.record, st, w.rank, peer, addr, epoch, word, now - start);
        return st;
      }
    }
  }
}

/* epf_signal_wait_sys — wait until the signal word's epoch reaches `epoch`; *out_value (may be
 *   NULL) gets its value half. `peer` is the rank expected to write it (diagnostic and mask).
 *   Scope: one thread (others of its warp/block wait at a __syncwarp/__syncthreads after it).
 *   Memory: .sys acquire: data the peer published before its set is visible after OK. */
EPF_DEVICE_INLINE epf_status_t epf_signal_wait_sys(const uint64_t* flag, uint32_t epoch, epf_wait_t w,
                                                   int peer, uint32_t* out_value) {
  uint64_t word = 0;
  epf_status_t st = epf__wait_sys(flag, EPF__WAIT_SIGNAL, epoch, w, peer, &word);
  if (out_value != NULL) *out_value = st == EPF_OK ? epf_signal_value(word) : 0u;
  return st;
}

/* epf_count_word_wait_sys — wait until the count word carries exactly `epoch`
 *   (epf_count_word_valid); *out_count (may be NULL) gets its count. Scope: one thread.
 *   Memory: .sys acquire loads; the word is self-validating, nothing else is ordered by it. */
EPF_DEVICE_INLINE epf_status_t epf_count_word_wait_sys(const uint64_t* word, uint32_t epoch, epf_wait_t w,
                                                       int peer, uint32_t* out_count) {
  uint64_t v = 0;
  const epf_status_t st = epf__wait_sys(word, EPF__WAIT_COUNT, epoch, w, peer, &v);
  if (out_count != NULL) *out_count = st == EPF_OK ? epf_count_word_count(v) : 0u;
  return st;
}

/* epf_epoch_wait_sys_u32 — the same for a plain u32 epoch word (the window header's slots). */
EPF_DEVICE_INLINE epf_status_t epf_epoch_wait_sys_u32(const uint32_t* word, uint32_t epoch,
                                                      epf_wait_t w, int peer) {
  return epf__wait_sys(word, EPF__WAIT_U32_EPOCH, epoch, w, peer, NULL);
}

/* ---- team-wide blocks ------------------------------------------------------------------------- */

/* epf__block_status — fold per-thread statuses of a block into one, by priority:
 * MISMATCH > TIMEOUT > ABORTED > MASKED > OK. [collective:block] */
EPF_DEVICE_INLINE epf_status_t epf__block_status(epf_status_t mine) {
  if (__syncthreads_or(mine == EPF_ERR_CONFIG_MISMATCH)) return EPF_ERR_CONFIG_MISMATCH;
  if (__syncthreads_or(mine == EPF_ERR_TIMEOUT)) return EPF_ERR_TIMEOUT;
  if (__syncthreads_or(mine == EPF_ERR_ABORTED)) return EPF_ERR_ABORTED;
  if (__syncthreads_or(mine == EPF_ERR_PEER_MASKED)) return EPF_ERR_PEER_MASKED;
  return EPF_OK;
}

/* epf_handshake_block — setup handshake: agree on the configuration before any data moves.
 *   Scope:    [collective:block] [uniform-args] exactly one block per rank calls it, every thread,
 *             converged. With virtual ranks the grid must be co-resident [needs-co-residency].
 *   Does:     writes plan->config_hash into peer_hash[team.rank] of every peer's window header
 *             (offset 0), release-stores `epoch` into peer_epoch[team.rank]; then waits for every
 *             peer's slot in its own header to reach `epoch` and compares the hashes.
 *   Result:   [result:all] EPF_OK; EPF_ERR_CONFIG_MISMATCH if any peer's hash differs or
 *             plan->nranks != team.nranks (then every rank of the team sees the mismatch, since
 *             each compares against all); EPF_ERR_TIMEOUT / EPF_ERR_ABORTED from the waits.
 *   Memory:   peer stores + .sys release; .sys acquire loads of the own header.
 *   Epoch:    strictly increasing per handshake on the same window (start at 1 on zeroed memory).
 *   Blocking: yes (bounded by w.timeout_ns). */
EPF_DEVICE_INLINE epf_status_t epf_handshake_block(epf_team_t team, const epf_plan_t* plan,
                                                   uint32_t epoch, epf_wait_t w) {
  epf_status_t st = EPF_OK;
  const uint64_t hash = plan->config_hash;
  const uint64_t hdr = plan->region[EPF_REGION_HEADER].offset;
  int p;
  for (p = (int)threadIdx.x; p < team.nranks; p += (int)blockDim.x) {
    epf_window_header_t* h = (epf_window_header_t*)epf_peer_ptr(team, hdr, p);
    epf_st_relaxed_sys_u64(&h->peer_hash[team.rank], hash);
    epf_st_release_sys_u32(&h->peer_epoch[team.rank], epoch);
  }
  {
    epf_window_header_t* mine = (epf_window_header_t*)epf_local_ptr(team, hdr);
    for (p = (int)threadIdx.x; p < team.nranks; p += (int)blockDim.x) {
      epf_status_t s = epf_epoch_wait_sys_u32(&mine->peer_epoch[p], epoch, w, p);
      if (s == EPF_OK && epf_ld_relaxed_sys_u64(&mine->peer_hash[p]) != hash)
        s = EPF_ERR_CONFIG_MISMATCH;
      if (s != EPF_OK && st == EPF_OK) st = s;
    }
  }
  if (plan->nranks != team.nranks) st = EPF_ERR_CONFIG_MISMATCH;
  st = epf__block_status(st);
  if (st == EPF_ERR_CONFIG_MISMATCH && threadIdx.x == 0)
    epf_error_report(w.record, st, team.rank, -1, epf_local_ptr(team, hdr), hash, 0, 0);
  return st;
}

/* epf_barrier_block — team barrier on the plan's SIG_BARRIER words.
 *   Scope:    [collective:block] [uniform-args] one block per rank, every thread, converged.
 *   Does:     __syncthreads; thread p < nranks release-stores epoch into peer p's
 *             SIG_BARRIER[team.rank], then waits for SIG_BARRIER[p] of its own window.
 *   Result:   [result:all] EPF_OK, or the first failure (TIMEOUT/ABORTED/PEER_MASKED) by priority.
 *             Masked peers are skipped (w.mask).
 *   Memory:   what the block wrote before the call is visible to every peer after its call
 *             returns EPF_OK (.sys release/acquire, cumulative through __syncthreads).
 *   Epoch:    one more than the previous barrier on this window (never reset). */
EPF_DEVICE_INLINE epf_status_t epf_barrier_block(epf_team_t team, const epf_plan_t* plan,
                                                 uint32_t epoch, epf_wait_t w) {
  epf_status_t st = EPF_OK;
  int p;
  __syncthreads();
  for (p = (int)threadIdx.x; p < team.nranks; p += (int)blockDim.x) {
    uint64_t off = epf_plan_signal_offset(plan, EPF_REGION_SIG_BARRIER, team.rank);
    epf_signal_set_sys((uint64_t*)epf_peer_ptr(team, off, p), epoch, 0u);
  }
  for (p = (int)threadIdx.x; p < team.nranks; p += (int)blockDim.x) {
    uint64_t off = epf_plan_signal_offset(plan, EPF_REGION_SIG_BARRIER, p);
    epf_status_t s = epf_signal_wait_sys((const uint64_t*)epf_local_ptr(team, off), epoch, w, p, NULL);
    if (s != EPF_OK && st == EPF_OK) st = s;
  }
  return epf__block_status(st);
}

/* epf_arrive_last_block — completion of a multi-block phase without a grid barrier.
 *   Scope:    [collective:block] every thread of each of the `nblocks` blocks that share `counter`
 *             calls it once per round, after its work.
 *   Result:   [result:all] true in exactly one block, the last to arrive; that block may publish
 *             the whole group's work: what every block wrote before its arrival (to local or
 *             peer memory) happens before anything the last block does after the call.
 *   Memory:   counter is a uint32 in device memory: round r completes when it reaches r * nblocks
 *             (start at 0 with round 1). Either keep counting rounds, or — what the ready-made
 *             kernels do — have the last block store 0 back (all blocks have arrived by then) and
 *             always pass round 1. __syncthreads, then thread 0's .sys acq_rel atomic add
 *             (cumulative over the block's writes).
 *   Limits:   the same nblocks every round; rounds of one counter must not overlap. */
EPF_DEVICE_INLINE bool epf_arrive_last_block(uint32_t* counter, uint32_t nblocks, uint32_t round) {
  int last = 0;
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t old = epf_atom_add_acq_rel_sys_u32(counter, 1u);
    last = old + 1u == round * nblocks;
  }
  return __syncthreads_or(last) != 0;
}

/* epf_arrive_last_block_epoch — epf_arrive_last_block for rounds named by an epoch, robust to a
 *   round that failed part-way: the counter word carries the round's tag (the low 16 bits of
 *   `epoch`) beside its count (low 16 bits), and an arrival that finds another tag starts the
 *   count afresh, so blocks of an earlier round that never all arrived (a launch with a wrong
 *   grid, a killed kernel) cannot make a later round signal early (rounds of one word must still
 *   not overlap: an arrival of an older round during a newer one would restart the newer count).
 *   Scope:    [collective:block] every thread of each of the `nblocks` blocks that share `word`
 *             calls it once per round, after its work, with the same epoch.
 *   Result:   [result:all] true in exactly one block, the last to arrive; as epf_arrive_last_block,
 *             what every block wrote before its arrival happens before anything that block does
 *             after the call. That block resets the count (word = tag | 0) when it returns, so
 *             the same epoch may run again (e.g. a dispatch repeated for one route update).
 *   Memory:   word: a uint32 in device memory, zero at start. __syncthreads, then thread 0's .sys
 *             acq_rel compare-and-swap (retried only when another block's arrival won the race:
 *             at most nblocks times).
 *   Limits:   1 <= nblocks <= 65535; rounds of one word must not overlap. */
EPF_DEVICE_INLINE bool epf_arrive_last_block_epoch(uint32_t* word, uint32_t nblocks, uint32_t epoch) {
  int last = 0;
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t tag = (epoch & 0xffffu) << 16;
    uint32_t old = epf_ld_relaxed_sys_u32(word), n;
    for (n = 0; n <= nblocks; ++n) { /* bounded: each failed CAS is another block's arrival */
      uint32_t count, got;
      count = (old & 0xffff0000u) == tag ? (old & 0xffffu) : 0u;
      got = epf_atom_cas_acq_rel_sys_u32(word, old, tag | (count + 1u));
      if (got == old) {
        last = count + 1u == nblocks;
        if (last) epf_st_relaxed_sys_u32(word, tag); /* all nblocks arrived: nobody else touches it now */
        break;
      }
      old = got;
    }
  }
  return __syncthreads_or(last) != 0;
}

/* epf_signal_peers_block — publish `epoch` to every peer through one signal region: thread p
 *   release-stores (epoch, 0) into `region`[team.rank] of peer p (SIG_DISPATCH, SIG_COMBINE: one
 *   word per source rank).
 *   Scope: [collective:block]. Memory: .sys release per peer, ordered after what this thread wrote
 *   before, and — called after epf_arrive_last_block — after what the rank's blocks wrote. */
EPF_DEVICE_INLINE void epf_signal_peers_block(epf_team_t team, const epf_plan_t* plan, epf_region_id_t region,
                                              uint32_t epoch) {
  const uint64_t off = epf_plan_signal_offset(plan, region, team.rank);
  int p;
  for (p = (int)threadIdx.x; p < team.nranks; p += (int)blockDim.x)
    epf_signal_set_sys((uint64_t*)epf_peer_ptr(team, off, p), epoch, 0u);
}

/* epf_wait_peers_block — wait until every peer p published `epoch` in this rank's `region`[p].
 *   Scope:    [collective:block] [blocking]; any number of blocks of a rank may call it.
 *   Result:   [result:all] EPF_OK, or the first failure by priority (TIMEOUT, ABORTED,
 *             PEER_MASKED: a masked peer sent nothing this round), recorded in w.record.
 *   Memory:   .sys acquire per peer, then __syncthreads: after OK every thread of the block sees
 *             what the peers wrote before they signalled. */
EPF_DEVICE_INLINE epf_status_t epf_wait_peers_block(epf_team_t team, const epf_plan_t* plan, epf_region_id_t region,
                                                    uint32_t epoch, epf_wait_t w) {
  epf_status_t st = EPF_OK;
  int p;
  for (p = (int)threadIdx.x; p < team.nranks; p += (int)blockDim.x) {
    const uint64_t off = epf_plan_signal_offset(plan, region, p);
    const epf_status_t s = epf_signal_wait_sys((const uint64_t*)epf_local_ptr(team, off), epoch, w, p, NULL);
    if (s != EPF_OK && st == EPF_OK) st = s;
  }
  return epf__block_status(st);
}

/* epf_rank_barrier_block — the blocks that play ONE rank meet (no grid barrier, no cooperative
 *   launch): for a fused kernel whose later phase reads what other blocks of the same rank wrote
 *   (e.g. the route's send offsets, written by one block, before every block sends).
 *   Scope:    [collective:block] [uniform-args] each of the rank's `nblocks` blocks calls it once
 *             per round, every thread, converged; the blocks must be co-resident.
 *   Args:     word: a uint64 in global memory, zero before the first round, used by this rank's
 *             blocks only (one per rank). epoch: this round's number, increasing (e.g. the step's
 *             epoch); rounds are separated by a kernel boundary or another barrier.
 *   Does:     thread 0 adds one arrival with a .gpu acq_rel atomic on (epoch << 32 | arrivals);
 *             the last block release-stores epoch << 32, the others wait for it (the bounded
 *             epf_signal_wait_sys: a block that never arrives makes them time out, recorded in
 *             w.record); then a .gpu acq_rel fence and __syncthreads.
 *   Result:   [result:all] EPF_OK, or EPF_ERR_TIMEOUT / EPF_ERR_ABORTED.
 *   Memory:   every block's writes before its call (cumulative through __syncthreads) are visible
 *             at .gpu scope to every block of the rank after the call. */
EPF_DEVICE_INLINE epf_status_t epf_rank_barrier_block(uint64_t* word, uint32_t nblocks, uint32_t epoch, epf_wait_t w) {
  epf_status_t st = EPF_OK;
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint64_t old = epf_atom_add_acq_rel_gpu_u64(word, 1ull);
    if ((uint32_t)old == nblocks - 1u)
      epf_st_release_gpu_u64(word, (uint64_t)epoch << 32);
    else
      st = epf_signal_wait_sys(word, epoch, w, -1, NULL);
    epf_fence_acq_rel_gpu();
  }
  return epf__block_status(st);
}

EPF_END_DECLS

#endif /* EPF_CORE_SIGNAL_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
