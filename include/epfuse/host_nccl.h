/* epfuse/host_nccl.h — NCCL setup helpers: communicator with a deadline, symmetric window — part of epfuse v0.1
 *
 * What it is: the host side of standing up an epfuse team over NCCL, in plain C11 (also C++17 and
 * CUDA): communicator creation in NON-BLOCKING mode that polls ncclCommGetAsyncError against a
 * deadline and aborts on expiry (no silent hang at init), symmetric allocation + window
 * registration (ncclMemAlloc + ncclCommWindowRegister(..., NCCL_WIN_COLL_SYMMETRIC)) + teardown,
 * and ncclResult_t -> epf_status_t with NCCL's own message. The device communicator
 * (ncclDevCommCreate, C++ only in NCCL) is in core/nccl.cuh.
 *
 * What it does NOT do: pick devices, create unique ids, or keep global state. Every call returns
 * an epf_status_t; on EPF_ERR_NCCL, epf_nccl_last_message() says what NCCL said; on
 * EPF_ERR_NOT_SUPPORTED, epf_nccl_runtime_check() says which NCCL releases do not match.
 *
 * Timeouts: every timeout_s is in seconds, finite and >= 0 (0: poll once); a NaN, infinite or
 * negative one is refused with EPF_ERR_INVALID_ARGUMENT before any NCCL call. Deadlines are kept
 * on the monotonic clock (CLOCK_MONOTONIC), so a wall-clock step cannot shorten or stretch them.
 *
 * Usage:
 *   ncclComm_t comm; epf_nccl_window_t win; epf_plan_t plan;
 *   epf_plan_compute(&cfg, &plan);
 *   if (epf_nccl_comm_init_rank(&comm, nranks, id, rank, 60.0) != EPF_OK) ...;
 *   if (epf_nccl_window_create(comm, plan.total_bytes, 60.0, &win) != EPF_OK) ...;  // zeroed
 *   ... kernels use win.window (core/nccl.cuh: epf_team_from_devcomm) ...
 *   epf_nccl_window_destroy(comm, &win, 60.0);
 *   epf_nccl_comm_destroy(comm, 60.0);
 *
 * Contents:
 *   epf_status_t epf_nccl_status(ncclResult_t)
 *   epf_status_t epf_nccl_version_check(int build_code, int runtime_code, char* buf, size_t n)
 *   int          epf_nccl_build_version(void)
 *   epf_status_t epf_nccl_runtime_check(char* buf, size_t n)
 *   const char*  epf_nccl_last_message(ncclComm_t comm, ncclResult_t r)
 *   epf_status_t epf_nccl_wait(ncclComm_t comm, ncclResult_t r, double timeout_s)
 *   epf_status_t epf_nccl_comm_init_rank(ncclComm_t* out_comm, int nranks, ncclUniqueId id, int rank, double timeout_s)
 *   epf_status_t epf_nccl_comm_destroy(ncclComm_t comm, double timeout_s)
 *   epf_nccl_window_t
 *   epf_status_t epf_nccl_window_create(ncclComm_t comm, size_t bytes, double timeout_s, epf_nccl_window_t* out_win)
 *   epf_status_t epf_nccl_window_destroy(ncclComm_t comm, epf_nccl_window_t* win, double timeout_s)
 *
 * Requirements: NCCL 2.28 – 2.32 (compiled against each; run with 2.28.9: README, "NCCL versions") headers (<nccl.h>), the CUDA runtime API, C11 on Linux
 * (clock_gettime(CLOCK_MONOTONIC), also under -std=c11 where <time.h> hides it) or C++17.
 * Collective calls (init, window create/destroy, comm destroy) must be made by every rank.
 */
#ifndef EPF_HOST_NCCL_H
#define EPF_HOST_NCCL_H

#include <float.h>
#include <stdio.h>
#include <time.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "host.h"

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < 22800
#error "epfuse needs NCCL >= 2.28 (symmetric windows and the device API)"
#endif

/* The monotonic clock. <time.h> declares clock_gettime and CLOCK_MONOTONIC when POSIX is visible
 * (C++, gnu11, _POSIX_C_SOURCE). Strict ISO C (-std=c11) on glibc or musl hides both, although
 * the C library has the function: declare it as the C library does (clockid_t is int there, and
 * CLOCK_MONOTONIC is 1 in the Linux ABI). Elsewhere: the wall clock (timespec_get). */
#if defined(CLOCK_MONOTONIC)
#define EPF__MONOTONIC_CLOCK CLOCK_MONOTONIC
#elif !defined(__cplusplus) && defined(__linux__) && defined(__LP64__)
extern int clock_gettime(int, struct timespec*);
#define EPF__MONOTONIC_CLOCK 1
#endif

EPF_BEGIN_DECLS

/* epf_nccl_status — ncclSuccess -> EPF_OK, everything else -> EPF_ERR_NCCL. */
EPF_INLINE epf_status_t epf_nccl_status(ncclResult_t r) {
  return r == ncclSuccess ? EPF_OK : EPF_ERR_NCCL;
}

/* ---- the NCCL release at run time --------------------------------------------------------------
 * Built against NCCL 2.28 headers, the code runs only with that exact release: 2.28's device-API
 * structures (ncclDevCommRequirements, ncclDevComm) carry no size or version and differ between
 * 2.28 releases. Built against 2.29 or newer, any release at least as new as the headers runs it:
 * 2.29 versioned ncclDevCommRequirements, 2.30 versioned ncclDevComm (binaries built against
 * 2.29.2 - 2.30 are accepted by newer releases), 2.31 negotiates at run time. An OLDER release
 * than the headers is refused: it does not know the structures the headers filled in. */

/* the CUDA major of the nvidia-nccl-cuXX wheel the sentences below name: the toolkit's */
#if defined(CUDART_VERSION)
#define EPF__NCCL_WHEEL_CUDA (CUDART_VERSION / 1000)
#else
#define EPF__NCCL_WHEEL_CUDA 13
#endif

/* epf__nccl_version_split — NCCL_VERSION_CODE -> major, minor, patch (codes of NCCL >= 2.9 are
 *   major * 10000 + minor * 100 + patch, older ones major * 1000 + minor * 100 + patch). */
EPF_INLINE void epf__nccl_version_split(int code, int* major, int* minor, int* patch) {
  if (code >= 10000) {
    *major = code / 10000, *minor = (code / 100) % 100, *patch = code % 100;
  } else {
    *major = code / 1000, *minor = (code / 100) % 10, *patch = code % 100;
  }
}

/* epf_nccl_version_check — may a library compiled against NCCL `build_code` (NCCL_VERSION_CODE,
 *   e.g. 23007 for 2.30.7) run with the NCCL library of `runtime_code` (ncclGetVersion; <= 0 when
 *   it could not be read)? Pure: no NCCL call, no state.
 *   Returns EPF_OK when build_code < 22900 (a 2.28 build) and runtime_code == build_code, or when
 *   build_code >= 22900 and runtime_code >= build_code; else EPF_ERR_NOT_SUPPORTED.
 *   When buf != NULL and n > 0, writes one NUL-terminated sentence (truncated to n bytes; 320
 *   bytes always suffice) naming both releases and, on a refusal, what to do, e.g. "built against
 *   NCCL 2.30.7, running 2.28.9: the NCCL loaded is older than the headers epfuse was compiled
 *   with; load NCCL 2.30.7 or newer (...) or rebuild epfuse against 2.28.9 (...)".
 *   Scope: host, any thread. */
EPF_INLINE epf_status_t epf_nccl_version_check(int build_code, int runtime_code, char* buf, size_t n) {
  char s[512]; /* formatted here, then copied (truncated) into buf */
  int bm, bn, bp, rm, rn, rp, w = 0;
  size_t i;
  const int exact = build_code < 22900;
  const bool ok = runtime_code > 0 && (exact ? runtime_code == build_code : runtime_code >= build_code);
  if (buf == NULL || n == 0) return ok ? EPF_OK : EPF_ERR_NOT_SUPPORTED;
  epf__nccl_version_split(build_code, &bm, &bn, &bp);
  epf__nccl_version_split(runtime_code, &rm, &rn, &rp);
  /* (the return values are looked at: no -Wformat-truncation in code that includes this header) */
  if (ok) {
    w = snprintf(s, sizeof(s), "built against NCCL %d.%d.%d, running %d.%d.%d: compatible", bm, bn, bp, rm, rn, rp);
  } else if (runtime_code <= 0) {
    w = snprintf(s, sizeof(s),
                 "built against NCCL %d.%d.%d, running an NCCL whose version could not be read "
                 "(ncclGetVersion failed): load the NCCL epfuse was built against",
                 bm, bn, bp);
  } else if (exact) {
    w = snprintf(s, sizeof(s),
                 "built against NCCL %d.%d.%d, running %d.%d.%d: a build against NCCL 2.28 headers runs only "
                 "with that exact release (2.28's device-API structures are unversioned); load NCCL %d.%d.%d "
                 "(nvidia-nccl-cu%d==%d.%d.%d, or its lib directory first in LD_LIBRARY_PATH) or rebuild "
                 "epfuse against %d.%d.%d (-DNCCL_ROOT=<that NCCL>)",
                 bm, bn, bp, rm, rn, rp, bm, bn, bp, EPF__NCCL_WHEEL_CUDA, bm, bn, bp, rm, rn, rp);
  } else {
    w = snprintf(s, sizeof(s),
                 "built against NCCL %d.%d.%d, running %d.%d.%d: the NCCL loaded is older than the headers "
                 "epfuse was compiled with; load NCCL %d.%d.%d or newer (nvidia-nccl-cu%d>=%d.%d.%d, or its "
                 "lib directory first in LD_LIBRARY_PATH) or rebuild epfuse against %d.%d.%d "
                 "(-DNCCL_ROOT=<that NCCL>)",
                 bm, bn, bp, rm, rn, rp, bm, bn, bp, EPF__NCCL_WHEEL_CUDA, bm, bn, bp, rm, rn, rp);
  }
  if (w < 0) s[0] = '\0';
  for (i = 0; i + 1 < n && s[i] != '\0'; ++i) buf[i] = s[i];
  buf[i] = '\0';
  return ok ? EPF_OK : EPF_ERR_NOT_SUPPORTED;
}

/* epf_nccl_build_version — NCCL_VERSION_CODE of the nccl.h this code was compiled with (e.g. 22809).
 *   In libepfuse.so: the release the library was built against. */
EPF_INLINE int epf_nccl_build_version(void) { return NCCL_VERSION_CODE; }

/* epf_nccl_runtime_check — epf_nccl_version_check(NCCL_VERSION_CODE, ncclGetVersion(), buf, n):
 *   may this code run with the NCCL library loaded in the process? epf_nccl_comm_init_rank and
 *   epf_nccl_devcomm_create refuse with EPF_ERR_NOT_SUPPORTED when it says no; call it (with a
 *   buffer of 320 bytes) for the sentence. Scope: host, any thread; no collective. */
EPF_INLINE epf_status_t epf_nccl_runtime_check(char* buf, size_t n) {
  int loaded = 0;
  if (ncclGetVersion(&loaded) != ncclSuccess) loaded = 0;
  return epf_nccl_version_check(NCCL_VERSION_CODE, loaded, buf, n);
}

/* epf_nccl_last_message — NCCL's words for a failure: ncclGetLastError(comm) when it says
 *   something, else ncclGetErrorString(r). Never NULL. */
EPF_INLINE const char* epf_nccl_last_message(ncclComm_t comm, ncclResult_t r) {
  const char* s = comm != NULL ? ncclGetLastError(comm) : NULL;
  if (s != NULL && s[0] != '\0') return s;
  s = ncclGetErrorString(r);
  return s != NULL ? s : "unknown NCCL error";
}

/* seconds on the monotonic clock (an arbitrary origin): only differences mean something */
EPF_INLINE double epf__now_s(void) {
  struct timespec ts;
#if defined(EPF__MONOTONIC_CLOCK)
  if (clock_gettime(EPF__MONOTONIC_CLOCK, &ts) == 0) return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#endif
  if (timespec_get(&ts, TIME_UTC) != TIME_UTC) return 0.0;
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* a usable timeout: finite and >= 0 (false for NaN, +-inf and negatives) */
EPF_INLINE bool epf__timeout_ok(double timeout_s) { return timeout_s >= 0.0 && timeout_s <= DBL_MAX; }

/* epf_nccl_wait — finish a call on a non-blocking communicator: unless the call already failed,
 *   poll ncclCommGetAsyncError(comm) until the communicator leaves ncclInProgress or timeout_s
 *   passes on the monotonic clock (it is polled at least once). (A non-blocking call may return
 *   ncclSuccess while its work is still in progress; the next call on the communicator would then
 *   fail, so the state is always polled.)
 *   Returns EPF_ERR_INVALID_ARGUMENT first for a NaN, infinite or negative timeout_s (nothing
 *   polled), EPF_ERR_NCCL when r is a failure; then, for comm NULL, the status of r; else EPF_OK,
 *   EPF_ERR_NCCL (the call failed) or EPF_ERR_TIMEOUT (still in progress; the caller decides
 *   whether to ncclCommAbort). Scope: host thread owning comm. */
EPF_INLINE epf_status_t epf_nccl_wait(ncclComm_t comm, ncclResult_t r, double timeout_s) {
  double deadline;
  if (!epf__timeout_ok(timeout_s)) return EPF_ERR_INVALID_ARGUMENT;
  if (r != ncclSuccess && r != ncclInProgress) return EPF_ERR_NCCL;
  if (comm == NULL) return epf_nccl_status(r);
  deadline = epf__now_s() + timeout_s;
  for (;;) {
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return EPF_ERR_NCCL;
    if (r != ncclInProgress) return epf_nccl_status(r);
    if (epf__now_s() > deadline) return EPF_ERR_TIMEOUT;
  }
}

/* epf_nccl_comm_init_rank — ncclCommInitRankConfig in non-blocking mode, finished against a
 *   deadline. On expiry the communicator is aborted, *out_comm = NULL and EPF_ERR_TIMEOUT is
 *   returned (a peer that never arrives is diagnosed, not waited on forever).
 *   Argument statuses, before any NCCL call, in this order: EPF_ERR_INVALID_ARGUMENT (out_comm
 *   NULL), EPF_ERR_RANKS (nranks < 1), EPF_ERR_RANK, EPF_ERR_INVALID_ARGUMENT (timeout_s NaN,
 *   infinite or negative); *out_comm = NULL on every error. Then EPF_ERR_NOT_SUPPORTED, before
 *   joining the collective, when the NCCL loaded cannot run code built against these headers
 *   (epf_nccl_runtime_check says why: an older release, or another 2.28 release).
 *   Scope: host; collective over the nranks ranks of `id`. The calling thread's current CUDA
 *   device is the rank's device. */
EPF_INLINE epf_status_t epf_nccl_comm_init_rank(ncclComm_t* out_comm, int nranks, ncclUniqueId id,
                                                int rank, double timeout_s) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclComm_t comm = NULL;
  ncclResult_t r;
  epf_status_t st;
  if (out_comm == NULL) return EPF_ERR_INVALID_ARGUMENT;
  *out_comm = NULL;
  if (nranks < 1) return EPF_ERR_RANKS;
  if (rank < 0 || rank >= nranks) return EPF_ERR_RANK;
  if (!epf__timeout_ok(timeout_s)) return EPF_ERR_INVALID_ARGUMENT;
  if (epf_nccl_runtime_check(NULL, 0) != EPF_OK) return EPF_ERR_NOT_SUPPORTED; /* no collective joined */
  config.blocking = 0;
  r = ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm != NULL) ncclCommAbort(comm);
    return EPF_ERR_NCCL;
  }
  st = epf_nccl_wait(comm, r, timeout_s);
  if (st != EPF_OK) {
    ncclCommAbort(comm);
    return st;
  }
  *out_comm = comm;
  return EPF_OK;
}

/* epf_nccl_comm_destroy — ncclCommFinalize (waited on against the deadline), then
 *   ncclCommDestroy; ncclCommAbort if finalize fails or expires. EPF_ERR_INVALID_ARGUMENT for a
 *   NaN, infinite or negative timeout_s (nothing destroyed), then EPF_OK for comm NULL.
 *   Scope: host; collective. */
EPF_INLINE epf_status_t epf_nccl_comm_destroy(ncclComm_t comm, double timeout_s) {
  epf_status_t st;
  if (!epf__timeout_ok(timeout_s)) return EPF_ERR_INVALID_ARGUMENT;
  if (comm == NULL) return EPF_OK;
  st = epf_nccl_wait(comm, ncclCommFinalize(comm), timeout_s);
  if (st != EPF_OK) {
    ncclCommAbort(comm);
    return st;
  }
  return epf_nccl_status(ncclCommDestroy(comm));
}

/* A registered symmetric window and the memory behind it. */
typedef struct epf_nccl_window {
  void* ptr;           /* this rank's slice (ncclMemAlloc), zero-filled at creation */
  size_t bytes;        /* its size: use epf_plan_t.total_bytes */
  ncclWindow_t window; /* handle for ncclGetLsaPointer / epf_team_from_devcomm */
} epf_nccl_window_t;

/* epf_nccl_window_create — ncclMemAlloc(bytes), zero it (cudaMemset, synchronous: epochs start at
 *   0), then ncclCommWindowRegister(..., NCCL_WIN_COLL_SYMMETRIC), finished against the deadline.
 *   On failure nothing stays allocated. EPF_ERR_INVALID_ARGUMENT, before any call, for comm or
 *   out_win NULL, bytes 0, or a NaN, infinite or negative timeout_s.
 *   Scope: host; collective (same bytes on every rank). */
EPF_INLINE epf_status_t epf_nccl_window_create(ncclComm_t comm, size_t bytes, double timeout_s,
                                               epf_nccl_window_t* out_win) {
  epf_status_t st;
  if (comm == NULL || out_win == NULL || bytes == 0 || !epf__timeout_ok(timeout_s))
    return EPF_ERR_INVALID_ARGUMENT;
  out_win->ptr = NULL;
  out_win->bytes = 0;
  out_win->window = NULL;
  if (ncclMemAlloc(&out_win->ptr, bytes) != ncclSuccess) return EPF_ERR_NCCL;
  if (cudaMemset(out_win->ptr, 0, bytes) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
    ncclMemFree(out_win->ptr);
    out_win->ptr = NULL;
    return EPF_ERR_CUDA;
  }
  st = epf_nccl_wait(comm,
                     ncclCommWindowRegister(comm, out_win->ptr, bytes, &out_win->window,
                                            NCCL_WIN_COLL_SYMMETRIC),
                     timeout_s);
  if (st != EPF_OK) {
    ncclMemFree(out_win->ptr);
    out_win->ptr = NULL;
    out_win->window = NULL;
    return st;
  }
  out_win->bytes = bytes;
  return EPF_OK;
}

/* epf_nccl_window_destroy — deregister (finished against the deadline), then ncclMemFree.
 *   EPF_ERR_INVALID_ARGUMENT, with *win untouched, for win NULL, a NaN, infinite or negative
 *   timeout_s, or comm NULL while win holds a registered window (NCCL would dereference it).
 *   Scope: host; collective. Safe on a zeroed struct (then comm may be NULL). */
EPF_INLINE epf_status_t epf_nccl_window_destroy(ncclComm_t comm, epf_nccl_window_t* win,
                                                double timeout_s) {
  epf_status_t st = EPF_OK;
  if (win == NULL || !epf__timeout_ok(timeout_s) || (comm == NULL && win->window != NULL))
    return EPF_ERR_INVALID_ARGUMENT;
  if (win->window != NULL) st = epf_nccl_wait(comm, ncclCommWindowDeregister(comm, win->window), timeout_s);
  if (win->ptr != NULL && ncclMemFree(win->ptr) != ncclSuccess && st == EPF_OK) st = EPF_ERR_NCCL;
  win->ptr = NULL;
  win->window = NULL;
  win->bytes = 0;
  return st;
}

EPF_END_DECLS

#endif /* EPF_HOST_NCCL_H */
/* SPDX-License-Identifier: Apache-2.0 */
