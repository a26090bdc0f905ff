/* epfuse/error.h — status strings, version and the error record — part of epfuse v0.1
 *
 * What it is: the status strings (epf_status_name / epf_status_message, from status.h's one
 * X-macro list), the version the headers carry, and the error record — the host-mapped struct
 * device code reports into (core/signal.cuh: epf_error_report) and the host reads without a device
 * sync. Plain C11, also C++17 and CUDA; part of host.h.
 *
 * What it does NOT do: keep a "last error" (the record is the caller's memory), print or abort.
 *
 * Contents:
 *   const char*  epf_status_name(epf_status_t), epf_status_message(epf_status_t)      [EPF_HD]
 *   int          epf_version(void)
 *   epf_error_record_t, epf_error_read(rec, out), epf_error_clear(rec)   host-mapped diagnostics
 *
 * Requirements: C11 or C++17. No CUDA, no NCCL.
 */
#ifndef EPF_ERROR_H
#define EPF_ERROR_H

#include "config.h"
#include "status.h"
#include "version.h"

EPF_BEGIN_DECLS

/* ============================================================================================ */
/* Status strings and version (one X-macro list in status.h)                                      */
/* ============================================================================================ */

#define EPF__STATUS_NAME_CASE(name, value, message) \
  case name:                                        \
    return #name;
#define EPF__STATUS_MESSAGE_CASE(name, value, message) \
  case name:                                           \
    return message;

/* epf_status_name — the enumerator's name, e.g. "EPF_ERR_TOPK"; "EPF_STATUS_UNKNOWN" (the name
 *   sentinel) for a value outside the list. Scope: any thread, host or device. Never NULL. */
EPF_HD const char* epf_status_name(epf_status_t status) {
  switch (status) {
    EPF_STATUS_LIST(EPF__STATUS_NAME_CASE)
    default:
      return "EPF_STATUS_UNKNOWN";
  }
}

/* epf_status_message — one sentence that says what is wrong; "unknown status code" for a value
 *   outside the list. Never NULL. */
EPF_HD const char* epf_status_message(epf_status_t status) {
  switch (status) {
    EPF_STATUS_LIST(EPF__STATUS_MESSAGE_CASE)
    default:
      return "unknown status code";
  }
}

/* epf_version — EPF_VERSION of the headers this translation unit was compiled with. Host only
 *   (like every EPF_INLINE function: left out under NVRTC). */
#if !defined(__CUDACC_RTC__)
EPF_INLINE int epf_version(void) { return EPF_VERSION; }
#endif

/* ============================================================================================ */
/* The error record (device writes, host reads without a device sync)                            */
/* ============================================================================================ */

/* One per rank (or per virtual-rank group), in host-mapped memory (cudaHostAlloc with
 * cudaHostAllocMapped; the device uses the mapped pointer), written by that one GPU only. Device code records the FIRST error
 * in full and counts all of them (core/signal.cuh: epf_error_report). The host reads it at any time
 * with epf_error_read; fields other than the counters mean something only when valid == 1. */
typedef struct epf_error_record {
  uint32_t status;      /* epf_status_t of the first error; 0 = none. Set once (CAS from 0). */
  uint32_t count;       /* how many errors were reported, the first included */
  uint32_t valid;       /* 1 once the diagnostic below describes `status` (release-stored last) */
  int32_t waiter_rank;  /* rank whose thread reported */
  int32_t waiter_block; /* blockIdx.x of the reporting thread */
  int32_t waiter_thread;/* threadIdx.x of the reporting thread */
  int32_t peer;         /* the rank it waited for, or -1 */
  uint32_t reserved;
  uint64_t address;     /* address of the word it waited on (device virtual address) */
  uint64_t wanted;      /* the epoch it wanted */
  uint64_t seen;        /* the value it last saw there */
  uint64_t elapsed_ns;  /* how long it waited */
  uint32_t dropped_routes; /* expert ids outside [-1, E) dropped by route blocks */
  uint32_t recv_overflow;  /* received rows dropped because recv_capacity was full */
  uint32_t masked_ranks;   /* how many times a peer was masked after a timeout */
  uint32_t reserved2;
} epf_error_record_t;

#if !defined(__CUDACC_RTC__) /* host functions (NVRTC compiles device code only) */
/* zero a record field by field (no <string.h>) */
EPF_INLINE void epf__zero_record(epf_error_record_t* out) {
  out->status = 0u;
  out->count = 0u;
  out->valid = 0u;
  out->waiter_rank = 0;
  out->waiter_block = 0;
  out->waiter_thread = 0;
  out->peer = 0;
  out->reserved = 0u;
  out->address = 0u;
  out->wanted = 0u;
  out->seen = 0u;
  out->elapsed_ns = 0u;
  out->dropped_routes = 0u;
  out->recv_overflow = 0u;
  out->masked_ranks = 0u;
  out->reserved2 = 0u;
}

/* epf_error_read — copy the record the device writes, from the host, without a device sync.
 *   rec: the host pointer of host-mapped memory. Word-by-word volatile reads; `valid` is read
 *   first, so when out->valid == 1 the diagnostic fields belong to out->status. out NULL: nothing
 *   is read or written. rec NULL: *out is zeroed (no record, so nothing recorded: status 0), so
 *   *out is always fully written when out is not NULL. */
EPF_INLINE void epf_error_read(const epf_error_record_t* rec, epf_error_record_t* out) {
  const volatile epf_error_record_t* r = (const volatile epf_error_record_t*)rec;
  if (out == NULL) return;
  if (rec == NULL) {
    epf__zero_record(out);
    return;
  }
  out->valid = r->valid;
  out->status = r->status;
  out->count = r->count;
  out->waiter_rank = r->waiter_rank;
  out->waiter_block = r->waiter_block;
  out->waiter_thread = r->waiter_thread;
  out->peer = r->peer;
  out->reserved = 0;
  out->address = r->address;
  out->wanted = r->wanted;
  out->seen = r->seen;
  out->elapsed_ns = r->elapsed_ns;
  out->dropped_routes = r->dropped_routes;
  out->recv_overflow = r->recv_overflow;
  out->masked_ranks = r->masked_ranks;
  out->reserved2 = 0;
}

/* epf_error_clear — zero the record from the host. Only while no kernel that may report into it
 *   is running (after a stream or event sync). rec NULL: nothing to do. */
EPF_INLINE void epf_error_clear(epf_error_record_t* rec) {
  volatile unsigned char* b = (volatile unsigned char*)rec;
  size_t n;
  if (rec == NULL) return;
  for (n = 0; n < sizeof(*rec); ++n) b[n] = 0;
}
#endif

EPF_END_DECLS

#endif /* EPF_ERROR_H */
/* SPDX-License-Identifier: Apache-2.0 */
