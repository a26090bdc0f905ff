/* test_shapes — a randomized shape-space test of the whole library on one GPU (virtual ranks):
 * every run draws fresh configurations from the whole documented space, biased towards the
 * unusual (hidden 2880 / 1032 / 40, 384 experts, top-k 22, rank counts that are not powers of two,
 * per-rank token counts that differ, duplicate / -1 / out-of-range / huge int64 ids, receive
 * budgets that overflow), and checks each against CPU references written from the documented
 * semantics (tests/common: epf_route_ref.h, epf_ht_ref.h, epf_ll_ref.cuh), bit for bit:
 *   route  every array of every rank's route buffer, the header, the host-mapped receive total,
 *          the pad rows' metadata; rows past each rank's T keep their poison;
 *   ht     route + dispatch (EXPERT_MAJOR / RANK_MAJOR, BF16 / MXFP8 / FP8-128 quantized on the way
 *          or caller-quantized, compact or swizzled scales, fused or split halves) + expand + the
 *          tests' experts + combine (BF16 / MXFP8, pull / push / in place / expert_out): every byte
 *          of every rank's receive regions and expand view, the combine output, the error record
 *          (status, dropped ids, receive overflow); the refusal of an EXPERT_MAJOR expert_out with
 *          fewer rows than recv_capacity; BF16 plans also draw backward rounds (bwd=1/2) on each
 *          forward's route: epf_ht_combine_backward (dy into the receive rows, combine weights in
 *          the metadata; fused or split) + expand + the tests' expert backward +
 *          epf_ht_dispatch_backward (dx, and with bwd=2 the router-weight gradients), checked
 *          against tests/common/epf_ht_ref.h's model, whose placement is computed independently;
 *   ll     dispatch (every payload, packed outputs on / off, fused / split) + experts (every y
 *          layout) + combine (BF16 pull / push; MXFP8 pull (default) / push): counts, rows, scales,
 *          metadata, packed copies, output, error record, over several back-to-back rounds (both
 *          parities) with a new T each; in the expert-major and (lay=rm) the rank-major layout (one
 *          copy per (token, rank), the view expanded by the receive half or epf_ll_expand, y fixed /
 *          packed / packed + pull, against tests/common/epf_ll_rm_ref.cuh; MXFP8 combine: push, no
 *          EXPERT_OUT region);
 *          bwd=1 (BF16 both ways): each forward round followed by its backward
 *          (epf_ll_combine_backward of dy: rows and combine weights; experts; epf_ll_dispatch_backward:
 *          dx and, wg=1, the router-weight gradient), every byte against the CPU reference; rank-major
 *          (lay=rm, drawn where epf_ll_backward_check accepts the plan: hidden >= 2 top-k) with y
 *          fixed / packed / packed + pull: the rank-major rows of dy and the view (packed=1: expanded
 *          by the receive half, each view row's weight its combine weight; packed=0: epf_ll_expand),
 *          the per-view-row weight gradient, dx and topk_weights_grad against epf_ll_rm_ref.cuh
 *          (llrm_dispatch_backward), rows past T keep their poison; a forced bwd=1 on a plan the
 *          backward refuses (--case) checks that both launchers say EPF_ERR_NOT_SUPPORTED.
 * The semantics tested are the documented ones (docs/route.md, docs/high-throughput.md,
 * docs/low-latency.md): a REPEATED expert id within a token gets no copy of its own but
 * contributes its first occurrence's output, with its own weight, in k order; ids outside [-1, E)
 * are dropped and counted; rows past a capacity are dropped, counted and contribute nothing.
 *
 * Usage:
 *   test_shapes [--seconds N] [--seed S] [--kinds route,ht,ll] [--exclude 'k=v ...'] [--sanitize]
 *   test_shapes --case '<parameters>' --seed <data seed>        exactly one configuration
 *   test_shapes --list N [--seed S]                             what a seed draws (no GPU needed)
 * Every configuration prints one line (its parameters, its data seed, what it exercised: tokens,
 * copies, repeated ids, dropped ids, rows dropped at a capacity); a failing one also prints the
 * one-line command that reproduces it (the same configuration and data), and the run exits 1 at
 * the end. The time budget (default 60 s; --seconds or EPF_SHAPES_SECONDS) is wall time: no new
 * configuration is drawn once it is spent. A watchdog bounds every wait on the GPU (30 s per sync
 * point); on expiry the repro line and the error record are printed and the program exits 1 at
 * once; plan timeouts are 4 s, so a protocol hang shows as EPF_ERR_TIMEOUT in the error record (a
 * failure). EPF_ERR_CO_RESIDENCY is a skip (printed) when the grid asked for really cannot be
 * resident, and a failure when the kernel cannot hold one block per SM at all, when the launcher's
 * own block count was refused, or when the grid would fit; any other refusal of a configuration
 * the plan accepted is a failure. --exclude leaves out drawn configurations that match every
 * key=value given (a known failure, while another is looked at). --sanitize keeps shapes small
 * (R <= 6, T <= 64, H <= 2048; default budget 120 s; 60 s timeouts) for
 * compute-sanitizer --tool memcheck. Exits 77 when there is no GPU. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include "epf_ht_ref.h"
#include "epf_ll_ref.cuh"
#include "epf_ll_rm_ref.cuh"
#include "epf_route_ref.h"
#include "epf_test_gpu.h"
#include "epfuse/epfuse.cuh"
#include "epfuse/ht/kernels.cuh"
#include "epfuse/ll/kernels.cuh"
#include "epfuse/route/kernels.cuh"

/* ============================================================================================ */
/* globals, failure handling, watchdog                                                           */
/* ============================================================================================ */

#define POISON 0xA5

static cudaStream_t g_stream;
static epf_error_record_t* g_rec_h; /* host-mapped error record of the running configuration */
static epf_error_record_t* g_rec_d;
static int64_t* g_total_h; /* host-mapped receive totals [EPF_MAX_RANKS] */
static int64_t* g_total_d;
static std::string g_repro;       /* the running configuration's repro command */
static double g_watchdog_s = 30.0; /* per sync point */
static uint64_t g_timeout_ns = 4000000000ull;
static int g_verbose = 0;
static int g_device = 0, g_optin_smem = 0;

struct Fail {
  std::string msg;
};
struct Skip {
  std::string msg;
};

static std::string strf(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return std::string(buf);
}

#define FAIL(...) throw Fail{strf(__VA_ARGS__)}

static double now_s(void) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static void print_record(const char* prefix) {
  epf_error_record_t r;
  if (g_rec_h == NULL) return;
  epf_error_read(g_rec_h, &r);
  printf("%serror record: status %s (%u) count %u valid %u waiter rank %d block %d thread %d peer %d address 0x%llx "
         "wanted %llu seen 0x%llx elapsed %llu ns; dropped_routes %u recv_overflow %u masked_ranks %u\n",
         prefix, epf_status_name((epf_status_t)r.status), r.status, r.count, r.valid, r.waiter_rank, r.waiter_block,
         r.waiter_thread, r.peer, (unsigned long long)r.address, (unsigned long long)r.wanted,
         (unsigned long long)r.seen, (unsigned long long)r.elapsed_ns, r.dropped_routes, r.recv_overflow,
         r.masked_ranks);
}

/* A GPU that does not answer, or a CUDA error (the context may be unusable): report and leave now. */
[[noreturn]] static void die(const std::string& why) {
  printf("\nFATAL: %s\n", why.c_str());
  print_record("  ");
  printf("  REPRO: %s\n", g_repro.c_str());
  fflush(stdout);
  fflush(stderr);
  _exit(1);
}

/* Every CUDA call: an allocation failure fails the configuration; anything else is fatal. */
#define CK(call)                                                                                             \
  do {                                                                                                       \
    const cudaError_t ck_e_ = (call);                                                                        \
    if (ck_e_ != cudaSuccess) {                                                                              \
      if (ck_e_ == cudaErrorMemoryAllocation) {                                                              \
        (void)cudaGetLastError();                                                                            \
        FAIL("%s:%d: %s: out of device memory", __FILE__, __LINE__, #call);                                  \
      }                                                                                                      \
      die(strf("%s:%d: %s -> %s (%s)", __FILE__, __LINE__, #call, cudaGetErrorName(ck_e_),                    \
               cudaGetErrorString(ck_e_)));                                                                  \
    }                                                                                                        \
  } while (0)

/* Wait for everything on the stream, with a host-side deadline. */
static void sync_or_die(const char* what) {
  const double t0 = now_s();
  for (;;) {
    const cudaError_t e = cudaStreamQuery(g_stream);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady)
      die(strf("%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e)));
    if (now_s() - t0 > g_watchdog_s) die(strf("watchdog: %s did not finish within %.0f s (a hang)", what, g_watchdog_s));
    usleep(200);
  }
  {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) die(strf("%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e)));
  }
}

/* Device memory owned by a configuration; freed after the stream drained. */
struct Dev {
  void* p = nullptr;
  size_t n = 0;
  Dev() = default;
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() {
    if (p != nullptr) (void)cudaFree(p);
  }
  void alloc(size_t bytes) {
    n = bytes;
    CK(cudaMalloc(&p, bytes > 0 ? bytes : 16));
  }
  template <class T>
  T* as() const {
    return (T*)p;
  }
  char* c() const { return (char*)p; }
};

/* Declared after a configuration's Dev buffers: drains the stream (watchdog included) before they
 * are freed, also when a failure unwinds the configuration (cudaFree would wait unbounded). */
struct DrainGuard {
  DrainGuard() = default;
  DrainGuard(const DrainGuard&) = delete;
  DrainGuard& operator=(const DrainGuard&) = delete;
  ~DrainGuard() { sync_or_die("draining the stream"); }
};

static void d_set(void* p, int byte, size_t n) {
  if (n > 0) CK(cudaMemsetAsync(p, byte, n, g_stream));
}
static void h2d(void* dst, const void* src, size_t n) {
  if (n > 0) CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, g_stream));
}
static void d2h(void* dst, const void* src, size_t n) { /* waits */
  if (n > 0) CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, g_stream));
  sync_or_die("a device-to-host copy");
}

/* What a launch needs resident, for judging an EPF_ERR_CO_RESIDENCY refusal. */
struct Grid {
  int64_t ranks = 1;        /* virtual ranks in the launch */
  int64_t bpr = 0;          /* blocks per rank asked for (0: the launcher's choice) */
  const void* kernel = NULL; /* the launched kernel, when known */
  int threads = 0;
  size_t smem = 0;
};

/* A launcher's status. EPF_OK: fine. EPF_ERR_CO_RESIDENCY: a skip when the grid asked for really
 * cannot be resident; a failure when the kernel cannot hold even one block per SM (no grid can
 * run: registers or shared memory), when the launcher's own block count was refused (it picks
 * one that fits; with R <= SMs one block per rank always does), or when the grid would fit. Any
 * other refusal of a configuration the plan accepted: a failure. */
static int g_sms = 0;
static void launched(epf_status_t st, const char* what, const Grid& gr = Grid()) {
  if (st == EPF_OK) return;
  if (st != EPF_ERR_CO_RESIDENCY)
    FAIL("%s refused a valid configuration: %s (%s)", what, epf_status_name(st), epf_status_message(st));
  if (gr.kernel != NULL) {
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gr.kernel, gr.threads, gr.smem));
    if (per_sm == 0)
      FAIL("%s: EPF_ERR_CO_RESIDENCY: not even one %d-thread block of the kernel (%zu B dynamic shared memory) fits "
           "on an SM (registers or shared memory), so no grid of it can ever run",
           what, gr.threads, gr.smem);
    if (gr.bpr > 0 && (int64_t)per_sm * g_sms >= gr.ranks * gr.bpr)
      FAIL("%s refused with EPF_ERR_CO_RESIDENCY a grid of %lld blocks that fits (%d per SM x %d SMs)", what,
           (long long)(gr.ranks * gr.bpr), per_sm, g_sms);
  }
  if (gr.bpr == 0 && gr.ranks <= g_sms)
    FAIL("%s refused with EPF_ERR_CO_RESIDENCY at its own blocks per rank (%lld ranks, %d SMs)", what,
         (long long)gr.ranks, g_sms);
  throw Skip{strf("%s: EPF_ERR_CO_RESIDENCY (%lld ranks x %lld blocks)", what, (long long)gr.ranks, (long long)gr.bpr)};
}

/* the error record after a round: no error, and the counters the reference predicts; then cleared */
static void check_record(uint32_t want_dropped, uint32_t want_overflow, const char* what) {
  epf_error_record_t r;
  epf_error_read(g_rec_h, &r);
  if (r.status != 0u || r.count != 0u)
    FAIL("%s: error record status %s (%u errors; waiter rank %d block %d thread %d peer %d wanted %llu seen 0x%llx)", what,
         epf_status_name((epf_status_t)r.status), r.count, r.waiter_rank, r.waiter_block, r.waiter_thread, r.peer,
         (unsigned long long)r.wanted, (unsigned long long)r.seen);
  if (r.dropped_routes != want_dropped)
    FAIL("%s: error record dropped_routes %u, want %u", what, r.dropped_routes, want_dropped);
  if (r.recv_overflow != want_overflow)
    FAIL("%s: error record recv_overflow %u, want %u", what, r.recv_overflow, want_overflow);
  if (r.masked_ranks != 0u) FAIL("%s: error record masked_ranks %u", what, r.masked_ranks);
  epf_error_clear(g_rec_h);
}

/* run fn(i) for i in [0, n) on a few host threads (the references are pure) */
template <class F>
static void par_for(int n, F fn) {
  unsigned hw = std::thread::hardware_concurrency();
  const int nt = std::max(1, std::min(n, std::min(16, (int)(hw == 0 ? 4 : hw))));
  std::vector<std::string> errs((size_t)n);
  std::vector<std::thread> th;
  for (int j = 0; j < nt; ++j)
    th.emplace_back([&, j]() {
      for (int i = j; i < n; i += nt) {
        try {
          fn(i);
        } catch (Fail& f) {
          errs[(size_t)i] = f.msg;
        }
      }
    });
  for (auto& t : th) t.join();
  for (int i = 0; i < n; ++i)
    if (!errs[(size_t)i].empty()) throw Fail{errs[(size_t)i]};
}

/* ============================================================================================ */
/* random numbers and the configuration                                                          */
/* ============================================================================================ */

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() { return epf_rng_next(&s); }
  int64_t in(int64_t lo, int64_t hi) { return hi <= lo ? lo : lo + (int64_t)(next() % (uint64_t)(hi - lo + 1)); }
  bool pm(int64_t permille) { return (int64_t)(next() % 1000u) < permille; }
  template <class T>
  T pick(std::initializer_list<T> l) {
    return l.begin()[next() % l.size()];
  }
};

enum { KIND_ROUTE = 0, KIND_HT = 1, KIND_LL = 2, KIND_COUNT = 3 };
static const char* const k_kind_names[] = {"route", "ht", "ll", NULL};
static const char* const k_layout_names[] = {"-", "em", "rm", NULL};
static const char* const k_payload_names[] = {"-", "bf16", "mx", "fp8", NULL};
static const char* const k_mode_names[] = {"-", "ht", "ll", NULL};
static const char* const k_y_names[] = {"fixed", "packed", "inplace", "pull", "ppull", NULL};

/* One configuration. Every field is an int64 so that one table prints and parses them all. */
struct Case {
  int64_t kind = KIND_HT;
  int64_t R = 1, E = 8, K = 1, H = 8, T = 1; /* T: the plan's max tokens per rank */
  int64_t idx64 = 1;                          /* topk_idx int64 (1) or int32 (0) */
  int64_t layout = EPF_LAYOUT_EXPERT_MAJOR;
  int64_t pay = EPF_PAYLOAD_BF16, cpay = EPF_PAYLOAD_BF16;
  int64_t swz = 0;     /* MXFP8 receive / packed scales swizzled 128x4 */
  int64_t xq = 0;      /* HT: caller-quantized x */
  int64_t push = 0;    /* HT, LL (MXFP8 combine): EPF_FLAG_COMBINE_PUSH */
  int64_t inplace = 0; /* HT: expert_out = NULL (EM, BF16 both ways) */
  int64_t split = 0;   /* dispatch (HT) / dispatch + combine (LL) halves in separate launches */
  int64_t A = 1;       /* expert_alignment */
  int64_t cap = 0;     /* HT recv_capacity (0: the plan's worst case) */
  int64_t xr = 0;      /* HT expert_rows (EM expert_out, RM view) */
  int64_t flags = 0;   /* plan flags other than COMBINE_PUSH */
  int64_t nopad = 0;   /* EPF_ROUTE_FLAG_NO_PAD_MARK */
  int64_t ep0 = 0;     /* the first epoch (route / HT signals) */
  int64_t rounds = 2;  /* rounds (steps) with fresh data */
  int64_t dup = 0, neg = 0, bad = 0; /* per mille: repeated, -1 and out-of-range ids */
  int64_t skew = 0;    /* 0 uniform, 1 a few hot experts, 2 one destination rank */
  int64_t devT = 0;    /* per-rank T from device memory (route step num_tokens_dev) */
  int64_t bpr = 0;     /* HT / LL blocks per rank (0: the launcher's) */
  int64_t rbpr = 0;    /* route update blocks per rank (0: the launcher's) */
  int64_t maxb = 0;    /* route max_blocks (0: default) */
  int64_t rK = 0, rT = 0; /* route: top_k and max_tokens of the route config (0: the plan's) */
  int64_t mode = EPF_MODE_HT; /* route: the plan's mode */
  int64_t y = EPF_LL_Y_FIXED; /* LL y layout */
  int64_t packed = 0;  /* LL packed outputs */
  int64_t ident = 0;   /* LL identity experts */
  int64_t threads = 0; /* LL threads per block (0: 512) */
  int64_t bwd = 0;     /* backward rounds after each forward round. HT (BF16 both ways): a backward
                          round on its route (1: dx only; 2: also the router-weight gradient); LL: a
                          backward pair (combine backward + dispatch backward) */
  int64_t wg = 0;      /* LL backward: the router-weight gradient carried */
};

enum { F_ROUTE = 1, F_HT = 2, F_LL = 4, F_ALL = 7 };
struct Field {
  const char* name;
  int kinds;
  size_t off; /* offsetof(Case, field) */
  const char* const* names; /* enum value names, or NULL */
  int hex;
};
static const Field k_fields[] = {
    {"kind", F_ALL, offsetof(Case, kind), k_kind_names, 0},
    {"mode", F_ROUTE, offsetof(Case, mode), k_mode_names, 0},
    {"R", F_ALL, offsetof(Case, R), NULL, 0},
    {"E", F_ALL, offsetof(Case, E), NULL, 0},
    {"K", F_ALL, offsetof(Case, K), NULL, 0},
    {"H", F_HT | F_LL, offsetof(Case, H), NULL, 0},
    {"T", F_ALL, offsetof(Case, T), NULL, 0},
    {"rK", F_ROUTE, offsetof(Case, rK), NULL, 0},
    {"rT", F_ROUTE, offsetof(Case, rT), NULL, 0},
    {"lay", F_ALL, offsetof(Case, layout), k_layout_names, 0},
    {"pay", F_HT | F_LL, offsetof(Case, pay), k_payload_names, 0},
    {"cpay", F_HT | F_LL, offsetof(Case, cpay), k_payload_names, 0},
    {"swz", F_HT | F_LL, offsetof(Case, swz), NULL, 0},
    {"xq", F_HT, offsetof(Case, xq), NULL, 0},
    {"push", F_HT | F_LL, offsetof(Case, push), NULL, 0},
    {"inplace", F_HT, offsetof(Case, inplace), NULL, 0},
    {"y", F_LL, offsetof(Case, y), k_y_names, 0},
    {"packed", F_LL, offsetof(Case, packed), NULL, 0},
    {"ident", F_LL, offsetof(Case, ident), NULL, 0},
    {"split", F_HT | F_LL, offsetof(Case, split), NULL, 0},
    {"A", F_ROUTE | F_HT, offsetof(Case, A), NULL, 0},
    {"cap", F_ROUTE | F_HT, offsetof(Case, cap), NULL, 0},
    {"xr", F_HT, offsetof(Case, xr), NULL, 0},
    {"flags", F_HT | F_LL, offsetof(Case, flags), NULL, 1},
    {"nopad", F_ROUTE | F_HT, offsetof(Case, nopad), NULL, 0},
    {"ep0", F_ROUTE | F_HT, offsetof(Case, ep0), NULL, 1},
    {"idx64", F_ALL, offsetof(Case, idx64), NULL, 0},
    {"rounds", F_ALL, offsetof(Case, rounds), NULL, 0},
    {"dup", F_ALL, offsetof(Case, dup), NULL, 0},
    {"neg", F_ALL, offsetof(Case, neg), NULL, 0},
    {"bad", F_ALL, offsetof(Case, bad), NULL, 0},
    {"skew", F_ALL, offsetof(Case, skew), NULL, 0},
    {"devT", F_ROUTE | F_HT, offsetof(Case, devT), NULL, 0},
    {"bpr", F_HT | F_LL, offsetof(Case, bpr), NULL, 0},
    {"rbpr", F_ROUTE | F_HT, offsetof(Case, rbpr), NULL, 0},
    {"maxb", F_ROUTE, offsetof(Case, maxb), NULL, 0},
    {"threads", F_LL, offsetof(Case, threads), NULL, 0},
    {"bwd", F_HT | F_LL, offsetof(Case, bwd), NULL, 0},
    {"wg", F_LL, offsetof(Case, wg), NULL, 0},
};

static int64_t& field(Case& c, const Field& f) { return *(int64_t*)((char*)&c + f.off); }
static int64_t field(const Case& c, const Field& f) { return *(const int64_t*)((const char*)&c + f.off); }

static std::string case_str(const Case& c) {
  std::string s;
  const int kb = 1 << (int)c.kind;
  for (const Field& f : k_fields) {
    const int64_t v = field(c, f);
    if (!(f.kinds & kb)) continue;
    if (!s.empty()) s += ' ';
    s += f.name;
    s += '=';
    if (f.names != NULL) {
      int n = 0;
      while (f.names[n] != NULL) ++n;
      s += v >= 0 && v < n ? std::string(f.names[v]) : strf("%lld", (long long)v);
    } else if (f.hex) {
      s += strf("0x%llx", (unsigned long long)v);
    } else {
      s += strf("%lld", (long long)v);
    }
  }
  return s;
}

/* "key=value key=value ..." -> c (other fields: defaults); set: the fields named, if not NULL.
 * false (and a message on stderr) on an unknown key or value */
static bool case_parse(const char* text, Case* c, std::vector<const Field*>* set = NULL) {
  std::string s(text);
  size_t i = 0;
  *c = Case();
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == ',')) ++i;
    if (i >= s.size()) break;
    size_t j = i;
    while (j < s.size() && s[j] != ' ' && s[j] != '\t' && s[j] != ',') ++j;
    const std::string tok = s.substr(i, j - i);
    i = j;
    const size_t eq = tok.find('=');
    if (eq == std::string::npos) {
      fprintf(stderr, "--case: '%s' is not key=value\n", tok.c_str());
      return false;
    }
    const std::string key = tok.substr(0, eq), val = tok.substr(eq + 1);
    const Field* f = NULL;
    for (const Field& g : k_fields)
      if (key == g.name) f = &g;
    if (f == NULL) {
      fprintf(stderr, "--case: unknown key '%s'\n", key.c_str());
      return false;
    }
    if (set != NULL) set->push_back(f);
    bool named = false;
    if (f->names != NULL)
      for (int n = 0; f->names[n] != NULL; ++n)
        if (val == f->names[n]) {
          field(*c, *f) = n;
          named = true;
        }
    if (!named) {
      char* end = NULL;
      const long long v = strtoll(val.c_str(), &end, 0);
      if (end == val.c_str() || *end != '\0') {
        fprintf(stderr, "--case: bad value '%s' of '%s'\n", val.c_str(), key.c_str());
        return false;
      }
      field(*c, *f) = (int64_t)v;
    }
  }
  return true;
}

/* --exclude 'key=value ...': configurations that match every pair are not drawn */
struct Exclude {
  Case c;
  std::vector<const Field*> set;
};
static std::vector<Exclude> g_excludes;
static bool excluded(const Case& c) {
  for (const Exclude& x : g_excludes) {
    bool all = true;
    for (const Field* f : x.set) all = all && field(c, *f) == field(x.c, *f);
    if (all && !x.set.empty()) return true;
  }
  return false;
}

/* what one configuration exercised (printed on its line) */
struct Stats {
  int64_t tokens = 0, copies = 0, repeats = 0, dropped = 0, overflow = 0;
};
static Stats g_st;

static int vec_width(int64_t payload) { return epf_payload_vector_width((int)payload); }

/* ============================================================================================ */
/* inputs: routing, rows, weights                                                                */
/* ============================================================================================ */

/* an id outside [-1, E): small (E, E + 1, -2, ...), or an extreme or aliasing value (int64 values
 * whose low 32 bits are a valid expert or -1; int32 values whose low 16 bits are a valid expert) */
static int64_t bad_id(Rng& g, int64_t E, bool idx64) {
  const int64_t e = g.in(0, E - 1);
  switch (g.in(0, idx64 ? 11 : 7)) {
    case 0: return E;
    case 1: return E + g.in(1, 3);
    case 2: return -2;
    case 3: return -g.in(3, 1000);
    case 4: return E + g.in(4, 100000);
    case 5: return 65536 + e;
    case 6: return idx64 ? (int64_t)INT32_MIN : (int64_t)INT32_MIN + g.in(0, 1);
    case 7: return (int64_t)INT32_MAX;
    case 8: return ((int64_t)1 << 32) + e;  /* low 32 bits: a valid expert */
    case 9: return -((int64_t)1 << 32) - 1; /* low 32 bits: -1 */
    case 10: return g.pm(500) ? INT64_MIN : INT64_MAX;
    default: return ((int64_t)1 << 40) + e;
  }
}

/* ids [R][Tmax][K] for rows t < T[s]; rows past T[s] get garbage (the kernels must not read it) */
static void gen_ids(Rng& g, const Case& c, int R, int Tmax, int K, int E, const std::vector<int>& T, int64_t* ids) {
  const int EL = E / R;
  const int64_t hot0 = g.in(0, E - 1), hot1 = g.in(0, E - 1), hot2 = g.in(0, E - 1);
  const int hot_rank = (int)g.in(0, R - 1);
  for (int s = 0; s < R; ++s)
    for (int t = 0; t < Tmax; ++t) {
      int64_t* r = ids + ((size_t)s * Tmax + t) * K;
      if (t >= T[(size_t)s]) {
        for (int k = 0; k < K; ++k) r[k] = c.idx64 ? (int64_t)g.next() : (int64_t)(int32_t)g.next();
        continue;
      }
      for (int k = 0; k < K; ++k) {
        int64_t v;
        if (g.pm(c.neg)) {
          v = -1;
        } else if (g.pm(c.bad)) {
          v = bad_id(g, E, c.idx64 != 0);
        } else if (k > 0 && g.pm(c.dup)) {
          v = r[g.in(0, k - 1)]; /* a repeat of an earlier entry (of whatever kind) */
        } else {
          int tries = 0;
          for (;;) { /* a valid expert, distinct from the token's earlier ones when it can be */
            if (c.skew == 1 && g.pm(700)) v = g.pick({hot0, hot1, hot2});
            else if (c.skew == 2 && g.pm(800)) v = (int64_t)hot_rank * EL + g.in(0, EL - 1);
            else v = g.in(0, E - 1);
            bool dup = false;
            for (int q = 0; q < k; ++q) dup |= r[q] == v;
            if (!dup || ++tries > 6) break;
          }
        }
        r[k] = v;
      }
    }
}

/* per-rank T of one round: differing per rank (devT), or one T for all */
static std::vector<int> gen_T(Rng& g, int R, int Tmax, bool per_rank) {
  std::vector<int> T((size_t)R);
  const int one = g.pm(600) ? Tmax : (int)g.in(0, Tmax);
  for (int s = 0; s < R; ++s) {
    if (!per_rank) {
      T[(size_t)s] = one;
      continue;
    }
    const int64_t u = g.in(0, 99);
    T[(size_t)s] = u < 10 ? 0 : u < 35 ? Tmax : u < 45 ? 1 : (int)g.in(0, Tmax);
  }
  return T;
}

/* finite BF16 over a wide range, some exact zeros (the combine is exact for any finite input) */
static uint16_t gen_x(Rng& g) {
  const uint64_t r = g.next();
  float f = (float)((int64_t)(r % 20001) - 10000) / 1000.0f * ldexpf(1.0f, (int)((r >> 20) % 9) - 4);
  if ((r >> 40) % 64 == 0) f = 0.0f;
  return bf16_rne(f);
}
static float gen_w(Rng& g) {
  const uint64_t r = g.next();
  if (r % 50 == 0) return 0.0f;
  return (float)((int64_t)((r >> 8) % 2001) - 500) / 997.0f;
}

/* the reference quantization (quant/quant.cuh scalar rules) of one BF16 row */
static void quantize_row(int payload, uint32_t flags, int H, const uint16_t* x, uint8_t* q, uint8_t* s) {
  float buf[128];
  if (payload == EPF_PAYLOAD_MXFP8) {
    for (int gi = 0; gi < H / 32; ++gi) {
      for (int i = 0; i < 32; ++i) buf[i] = bf16_f(x[gi * 32 + i]);
      s[gi] = epf_mxfp8_quantize_block_ref(buf, epf_mx_rule_from_flags(flags), q + gi * 32);
    }
  } else if (payload == EPF_PAYLOAD_FP8_128) {
    for (int gi = 0; gi < H / 128; ++gi) {
      for (int i = 0; i < 128; ++i) buf[i] = bf16_f(x[gi * 128 + i]);
      const float sc = epf_fp8_128_quantize_block_ref(buf, epf_fp8_128_ue8m0_from_flags(flags), q + gi * 128);
      memcpy(s + 4 * gi, &sc, 4);
    }
  }
}

/* upload ids [n] as the index type */
static void upload_ids(void* d, const int64_t* ids, size_t n, bool idx64) {
  if (idx64) {
    h2d(d, ids, n * 8);
  } else {
    std::vector<int32_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = (int32_t)ids[i];
    h2d(d, v.data(), n * 4);
    sync_or_die("an id upload"); /* v is freed on return */
  }
}

/* ============================================================================================ */
/* plans                                                                                         */
/* ============================================================================================ */

static epf_config_t config_of(const Case& c) {
  epf_config_t cfg = EPF_CONFIG_INIT;
  cfg.nranks = (int32_t)c.R;
  cfg.num_experts = (int32_t)c.E;
  cfg.top_k = (int32_t)c.K;
  cfg.max_tokens_per_rank = (int32_t)c.T;
  cfg.timeout_ns = g_timeout_ns;
  if (c.kind == KIND_ROUTE) {
    cfg.hidden = 8;
    cfg.mode = (int32_t)c.mode;
    cfg.layout = (int32_t)c.layout;
    cfg.expert_alignment = (int32_t)c.A;
    cfg.recv_capacity = c.mode == EPF_MODE_LL ? 0 : c.cap;
  } else if (c.kind == KIND_HT) {
    cfg.hidden = (int32_t)c.H;
    cfg.mode = EPF_MODE_HT;
    cfg.layout = (int32_t)c.layout;
    cfg.payload = (int32_t)c.pay;
    cfg.combine_payload = (int32_t)c.cpay;
    cfg.scale_layout = c.swz ? EPF_SCALE_LAYOUT_SWIZZLED_128X4 : EPF_SCALE_LAYOUT_COMPACT;
    cfg.expert_alignment = (int32_t)c.A;
    cfg.recv_capacity = c.cap;
    cfg.flags = (uint32_t)c.flags | (c.push ? EPF_FLAG_COMBINE_PUSH : 0u);
  } else {
    cfg.hidden = (int32_t)c.H;
    cfg.mode = EPF_MODE_LL;
    cfg.layout = (int32_t)c.layout;
    cfg.payload = (int32_t)c.pay;
    cfg.combine_payload = (int32_t)c.cpay;
    cfg.scale_layout = c.swz ? EPF_SCALE_LAYOUT_SWIZZLED_128X4 : EPF_SCALE_LAYOUT_COMPACT;
    cfg.flags = (uint32_t)c.flags | (c.push ? EPF_FLAG_COMBINE_PUSH : 0u);
  }
  return cfg;
}

static epf_plan_t plan_of(const Case& c) {
  const epf_config_t cfg = config_of(c);
  epf_plan_t p;
  const epf_status_t st = epf_plan_compute(&cfg, &p);
  if (st != EPF_OK) FAIL("epf_plan_compute refused a configuration of the documented space: %s (%s)", epf_status_name(st),
                         epf_status_message(st));
  return p;
}

/* HT: rows of the expert-major view that can never overflow */
static int64_t ht_view_worst(const Case& c) {
  const int64_t EL = c.E / c.R;
  return c.R * c.T * std::min<int64_t>(c.K, EL) + EL * (c.A - 1);
}

/* HT expert_rows as the configuration means it */
static int64_t ht_expert_rows(const Case& c, const epf_plan_t& p) {
  if (c.xr > 0) return c.xr;
  return c.layout == EPF_LAYOUT_EXPERT_MAJOR ? p.recv_capacity : ht_view_worst(c);
}

/* the windows of all ranks + route buffers + operands, in bytes */
static uint64_t ht_bytes(const Case& c, const epf_plan_t& p) {
  const uint64_t R = (uint64_t)c.R, T = (uint64_t)c.T, H = (uint64_t)c.H, K = (uint64_t)c.K;
  const uint64_t xr = (uint64_t)ht_expert_rows(c, p);
  uint64_t b = R * p.total_bytes;
  b += R * (4096u + T * K * 8u + T * R * 5u + (uint64_t)c.E * 16u + 64u * ((uint64_t)c.E + R + 1u) * 8u);
  b += R * T * (H * 2u + H / 8u + K * 12u) + R * T * H * 2u; /* x, scales, ids, weights, out */
  if (!c.inplace) b += R * xr * H * 2u;
  if (c.layout == EPF_LAYOUT_RANK_MAJOR) b += R * xr * (p.row_bytes + p.scale_bytes_per_row);
  return b;
}

static uint64_t ll_bytes(const Case& c, const epf_plan_t& p) {
  const epf_ll_buffer_t bufs[] = {EPF_LL_BUF_X, EPF_LL_BUF_TOPK_IDX, EPF_LL_BUF_TOPK_WEIGHTS, EPF_LL_BUF_RECV_COUNTS,
                                  EPF_LL_BUF_EXPERT_COUNTS, EPF_LL_BUF_PACKED_X, EPF_LL_BUF_PACKED_SCALES,
                                  EPF_LL_BUF_PACKED_META, EPF_LL_BUF_ROUND, EPF_LL_BUF_Y, EPF_LL_BUF_X};
  uint64_t b = (uint64_t)c.R * p.total_bytes;
  for (epf_ll_buffer_t w : bufs) b += (uint64_t)c.R * epf_ll_buffer_bytes(&p, w, EPF_INDEX_INT64);
  return b;
}

/* ============================================================================================ */
/* drawing configurations (biased towards the unusual)                                           */
/* ============================================================================================ */

struct Limits {
  int maxR, maxT, maxH;
  uint64_t bytes;  /* device memory of one configuration */
  double work;     /* R * T * K * H of one round's reference */
};

static int draw_R(Rng& g, int maxR) {
  for (;;) {
    const int r = (int)g.pick({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 3, 5, 7, 11, 13, 6, 12, 8, 16, 2});
    if (r <= maxR) return r;
  }
}

static int draw_E(Rng& g, int R) {
  const int64_t u = g.in(0, 99), maxEL = 1024 / R;
  if (u < 12) return R;
  if (u < 45) {
    std::vector<int> ok;
    for (int e : {8, 16, 32, 60, 64, 72, 128, 160, 256, 288, 384, 512, 640, 768, 1024})
      if (e % R == 0 && e >= R) ok.push_back(e);
    if (!ok.empty()) return ok[(size_t)g.in(0, (int64_t)ok.size() - 1)];
  }
  /* log-uniform experts per rank */
  const double l = log((double)maxEL) * (double)(g.next() % 10000) / 10000.0;
  return R * std::max(1, std::min((int)maxEL, (int)floor(exp(l) + 0.5)));
}

static int draw_K(Rng& g, int E) {
  const int mk = std::min(32, E);
  if (g.pm(650))
    for (int i = 0; i < 20; ++i) {
      const int k = (int)g.pick({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 16, 22, 22, 24, 31, 32, 32, 8});
      if (k <= mk) return k;
    }
  return (int)g.in(1, mk);
}

static int draw_H(Rng& g, int vw, int maxH) {
  if (g.pm(700)) {
    std::vector<int> ok;
    for (int h : {8, 16, 24, 40, 72, 136, 200, 264, 520, 1032, 1544, 2056, 2880, 4104, 5120, 6152, 7168, 8200, 12296, 16392,
                  16384, 32, 96, 160, 288, 1056, 2080, 7200, 16416, 128, 384, 640, 1152, 2176, 12416, 16512, 2048, 4096})
      if (h % vw == 0 && h <= maxH) ok.push_back(h);
    if (!ok.empty()) return ok[(size_t)g.in(0, (int64_t)ok.size() - 1)];
  }
  const double l = log((double)maxH / vw) * (double)(g.next() % 10000) / 10000.0;
  return vw * std::max(1, (int)floor(exp(l)));
}

static int draw_T(Rng& g, int maxT) {
  if (g.pm(700))
    for (int i = 0; i < 20; ++i) {
      const int t = (int)g.pick({1, 2, 3, 5, 7, 17, 31, 33, 63, 64, 100, 127, 129, 255, 257, 300, 511, 777, 1000, 1023,
                                 2047, 2305, 4096, 4099});
      if (t <= maxT) return t;
    }
  return (int)g.in(1, maxT);
}

static void draw_routing(Rng& g, Case& c) {
  c.dup = g.pick<int64_t>({0, 0, 30, 100, 300});
  c.neg = g.pick<int64_t>({0, 0, 30, 100, 400});
  c.bad = g.pick<int64_t>({0, 0, 0, 20, 100});
  c.skew = g.pick<int64_t>({0, 0, 0, 1, 2});
  c.idx64 = g.pm(500);
}

static uint32_t draw_ep0(Rng& g) {
  const int64_t u = g.in(0, 99);
  if (u < 55) return 0u;
  if (u < 80) return (uint32_t)g.in(1, 1000000);
  if (u < 90) return 0x7ffffffeu + (uint32_t)g.in(0, 2); /* across the sign bit */
  return 0xffffffffu - (uint32_t)g.in(0, 2);              /* across the 2^32 wrap */
}

/* shrink T, then H, then K until the configuration fits the memory and reference budgets */
template <class Bytes>
static void fit(Rng& g, Case& c, const Limits& lim, Bytes bytes_of) {
  const int vw = std::max(vec_width(c.pay), vec_width(c.cpay));
  for (int it = 0; it < 200; ++it) {
    const epf_plan_t p = plan_of(c);
    const double quant = c.pay != EPF_PAYLOAD_BF16 || c.cpay != EPF_PAYLOAD_BF16 ? 2.0 : 1.0;
    const double work = (double)c.R * c.T * c.K * (c.kind == KIND_ROUTE ? 1 : c.H) * quant;
    const uint64_t bytes = bytes_of(c, p);
    if (bytes <= lim.bytes && work <= lim.work) return;
    if (c.T > 1 && (c.H <= 512 || g.pm(700))) {
      c.T = std::max<int64_t>(1, c.T * 3 / 5);
      if (c.T > 2 && g.pm(500)) c.T |= 1;
    } else if (c.H > vw) {
      c.H = std::max<int64_t>(vw, (c.H / 2) / vw * vw);
    } else if (c.K > 1) {
      c.K = std::max<int64_t>(1, c.K / 2);
    } else if (c.E > c.R) {
      c.E = std::max<int64_t>(c.R, (c.E / 2) / c.R * c.R);
    } else {
      return;
    }
  }
}

static Case draw_route(Rng& g, const Limits& lim) {
  Case c;
  c.kind = KIND_ROUTE;
  c.R = draw_R(g, lim.maxR);
  c.E = draw_E(g, (int)c.R);
  c.K = draw_K(g, (int)c.E);
  c.mode = g.pm(150) ? EPF_MODE_LL : EPF_MODE_HT;
  c.layout = c.mode == EPF_MODE_LL ? EPF_LAYOUT_EXPERT_MAJOR : g.pm(500) ? EPF_LAYOUT_RANK_MAJOR : EPF_LAYOUT_EXPERT_MAJOR;
  c.A = g.pick<int64_t>({1, 1, 1, 2, 4, 8, 16, 32, 64, 128});
  c.T = draw_T(g, lim.maxT >= 4099 ? (g.pm(100) ? 16384 : 4099) : lim.maxT);
  c.nopad = g.pm(150);
  c.ep0 = draw_ep0(g);
  c.rounds = g.in(2, 4);
  c.devT = g.pm(650);
  c.maxb = g.pm(700) ? 0 : g.in(1, EPF_ROUTE_MAX_BLOCKS);
  c.rbpr = g.pm(600) ? 0 : g.in(1, std::min<int64_t>(c.maxb ? c.maxb : EPF_ROUTE_DEFAULT_MAX_BLOCKS, 8));
  draw_routing(g, c);
  fit(g, c, Limits{lim.maxR, lim.maxT, lim.maxH, lim.bytes, lim.work * 0.2}, [](const Case& cc, const epf_plan_t& p) {
    return (uint64_t)cc.R * p.total_bytes;
  });
  c.rK = g.pm(800) ? 0 : g.in(1, c.K);
  c.rT = g.pm(800) ? 0 : g.in(1, c.T);
  if (c.mode == EPF_MODE_HT && g.pm(350)) { /* a receive budget below the worst case */
    Case w = c;
    w.cap = 0;
    const epf_plan_t p = plan_of(w);
    const int64_t lo = c.layout == EPF_LAYOUT_RANK_MAJOR ? 1 : c.A;
    c.cap = std::max<int64_t>(lo, p.recv_capacity * g.pick<int64_t>({1, 5, 20, 50, 200, 500}) / 1000);
  }
  return c;
}

static Case draw_ht(Rng& g, const Limits& lim) {
  Case c;
  c.kind = KIND_HT;
  c.R = draw_R(g, lim.maxR);
  c.E = draw_E(g, (int)c.R);
  c.K = draw_K(g, (int)c.E);
  c.layout = g.pm(550) ? EPF_LAYOUT_EXPERT_MAJOR : EPF_LAYOUT_RANK_MAJOR;
  c.pay = g.pick<int64_t>({EPF_PAYLOAD_BF16, EPF_PAYLOAD_BF16, EPF_PAYLOAD_MXFP8, EPF_PAYLOAD_MXFP8, EPF_PAYLOAD_FP8_128});
  c.cpay = g.pm(400) ? EPF_PAYLOAD_MXFP8 : EPF_PAYLOAD_BF16;
  c.H = draw_H(g, std::max(vec_width(c.pay), vec_width(c.cpay)), lim.maxH);
  c.T = draw_T(g, lim.maxT);
  c.xq = c.pay != EPF_PAYLOAD_BF16 && g.pm(250);
  c.swz = c.pay == EPF_PAYLOAD_MXFP8 && g.pm(300);
  c.push = g.pm(350);
  c.inplace = c.layout == EPF_LAYOUT_EXPERT_MAJOR && c.pay == EPF_PAYLOAD_BF16 && c.cpay == EPF_PAYLOAD_BF16 &&
              g.pm(c.push ? 150 : 500);
  c.split = g.pm(400);
  c.A = g.pick<int64_t>({1, 1, 1, 2, 4, 8, 16, 32, 64, 128});
  c.flags = (g.pm(250) ? EPF_FLAG_MX_SCALE_FLOOR : 0u) | (g.pm(250) ? EPF_FLAG_SCALE_UE8M0 : 0u);
  c.nopad = g.pm(100);
  c.ep0 = draw_ep0(g);
  c.rounds = g.in(2, 3);
  c.devT = g.pm(700);
  c.bpr = g.pm(700) ? 0 : g.in(1, 6);
  c.rbpr = g.pm(800) ? 0 : g.in(1, 4);
  draw_routing(g, c);
  fit(g, c, lim, [](const Case& cc, const epf_plan_t& p) { return ht_bytes(cc, p); });
  /* receive budgets below the worst case (overflow), and expert_rows */
  {
    Case w = c;
    w.cap = 0;
    const epf_plan_t p = plan_of(w);
    const int64_t lo = c.layout == EPF_LAYOUT_RANK_MAJOR ? 1 : c.A;
    if (g.pm(400)) c.cap = std::max<int64_t>(lo, p.recv_capacity * g.pick<int64_t>({5, 20, 100, 300, 600, 900}) / 1000);
    if (c.layout == EPF_LAYOUT_EXPERT_MAJOR)
      c.xr = c.inplace ? 0 : (c.cap ? c.cap : p.recv_capacity) + g.pick<int64_t>({0, 0, 1, 7});
    else
      c.xr = g.pm(600) ? ht_view_worst(c) : std::max<int64_t>(1, ht_view_worst(c) * g.pick<int64_t>({10, 100, 300, 700}) / 1000);
  }
  /* the training direction (BF16 plans): a backward round after each forward round */
  if (c.pay == EPF_PAYLOAD_BF16 && c.cpay == EPF_PAYLOAD_BF16 && !c.xq) c.bwd = g.pick<int64_t>({0, 1, 2, 2});
  return c;
}

static Case draw_ll(Rng& g, const Limits& lim) {
  Case c;
  c.kind = KIND_LL;
  c.R = draw_R(g, lim.maxR);
  c.E = draw_E(g, (int)c.R);
  c.K = draw_K(g, (int)c.E);
  c.pay = g.pick<int64_t>({EPF_PAYLOAD_BF16, EPF_PAYLOAD_BF16, EPF_PAYLOAD_MXFP8, EPF_PAYLOAD_FP8_128});
  c.cpay = g.pm(400) ? EPF_PAYLOAD_MXFP8 : EPF_PAYLOAD_BF16;
  c.H = draw_H(g, std::max(vec_width(c.pay), vec_width(c.cpay)), lim.maxH);
  c.T = draw_T(g, std::min(lim.maxT, 512));
  c.swz = c.pay == EPF_PAYLOAD_MXFP8 && g.pm(350);
  c.packed = g.pm(500);
  c.y = c.pay == EPF_PAYLOAD_BF16 ? g.in(0, 3) : g.in(0, 1);
  /* rank-major: one copy per (token, rank); packed = the receive half expands (else
   * epf_ll_expand); y in the view's order: fixed, packed or packed + pull */
  c.layout = g.pm(350) ? EPF_LAYOUT_RANK_MAJOR : EPF_LAYOUT_EXPERT_MAJOR;
  if (c.layout == EPF_LAYOUT_RANK_MAJOR) c.y = g.pick<int64_t>({EPF_LL_Y_FIXED, EPF_LL_Y_PACKED, EPF_LL_Y_PACKED_PULL});
  c.ident = g.pm(300);
  c.split = g.pm(400);
  c.flags = (g.pm(250) ? EPF_FLAG_MX_SCALE_FLOOR : 0u) | (g.pm(250) ? EPF_FLAG_SCALE_UE8M0 : 0u) |
            (g.pm(300) ? EPF_FLAG_FAULT_TOLERANT : 0u);
  c.rounds = g.in(2, 4);
  c.bpr = g.pm(750) ? 0 : g.in(1, 5);
  c.threads = g.pm(700) ? 0 : g.pick<int64_t>({96, 128, 256, 1024});
  draw_routing(g, c);
  fit(g, c, lim, [](const Case& cc, const epf_plan_t& p) { return ll_bytes(cc, p); });
  /* the blocks' scratch must fit in shared memory (else the launcher refuses: not an LL plan) */
  for (;;) {
    const epf_plan_t p = plan_of(c);
    const int th = c.threads ? (int)c.threads : EPF_LL_DEFAULT_THREADS;
    if (c.T <= 1 || epf_ll_smem_bytes(&p, th) <= (size_t)g_optin_smem) break;
    c.T = std::max<int64_t>(1, c.T / 2);
  }
  /* the training direction (BF16 both ways), drawn last so the draws above stay as they were */
  c.bwd = c.layout == EPF_LAYOUT_EXPERT_MAJOR && c.pay == EPF_PAYLOAD_BF16 && c.cpay == EPF_PAYLOAD_BF16 && g.pm(450);
  c.wg = c.bwd && g.pm(700);
  /* the MXFP8 combine pulls by default (the expert side quantizes into its own EXPERT_OUT) and
   * pushes with EPF_FLAG_COMBINE_PUSH (a rank-major plan pushes it either way: the flag changes
   * nothing there); drawn last, so the draws above stay those of older seeds */
  c.push = c.cpay == EPF_PAYLOAD_MXFP8 && g.pm(400);
  /* the rank-major training direction: BF16 both ways and a landing row that holds top_k pushed FP32
   * gradients (epf_ll_backward_check: hidden >= 2 top_k); drawn after everything else, so older
   * seeds draw the same fields (and only gain bwd / wg) */
  if (c.layout == EPF_LAYOUT_RANK_MAJOR && c.pay == EPF_PAYLOAD_BF16 && c.cpay == EPF_PAYLOAD_BF16) {
    const epf_plan_t p = plan_of(c);
    if (epf_ll_backward_check(&p) == EPF_OK) {
      c.bwd = g.pm(450);
      c.wg = c.bwd && g.pm(700);
    }
  }
  return c;
}

/* ============================================================================================ */
/* route checks (shared by the route and HT configurations)                                      */
/* ============================================================================================ */

/* as if the window's last round had been at ep0: every signal word of every rank carries it (a
 * zeroed word would count as reached for an epoch >= 2^31) */
static void init_signals(char* win, const epf_plan_t& p, int R, uint32_t ep0) {
  if (ep0 == 0u) return;
  std::vector<uint64_t> sig((size_t)R, (uint64_t)ep0 << 32);
  for (int r = 0; r < R; ++r)
    for (epf_region_id_t reg : {EPF_REGION_SIG_COUNT, EPF_REGION_SIG_DISPATCH, EPF_REGION_SIG_COMBINE, EPF_REGION_SIG_BARRIER})
      h2d(win + (uint64_t)r * p.total_bytes + p.region[reg].offset, sig.data(), (size_t)R * 8);
  sync_or_die("the signal words");
}

/* poison every route array (not the header, not the scratch rows) of every buffer */
static void route_poison(const epf_route_t& route) {
  const epf_route_layout_t& L = route.layout;
  const uint64_t a = L.array[EPF_ROUTE_EXPERT_COUNT].offset, b = L.array[EPF_ROUTE_SCRATCH].offset;
  for (int r = 0; r < route.count; ++r) d_set((char*)route.base + (uint64_t)r * L.total_bytes + a, POISON, b - a);
}

static void expect_poison(const uint8_t* p, size_t n, const char* what, int rank) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != POISON) FAIL("rank %d %s: byte %zu past the rank's last token was written (0x%02x)", rank, what, i, p[i]);
}

/* every rank's route buffer against the reference, rows past T keep their poison, the mapped totals */
static void route_check_all(const epf_route_t& route, const route_ref_t& rr, uint32_t epoch, bool mapped) {
  const epf_route_layout_t& L = route.layout;
  const int R = rr.R, K = rr.K, Tm = L.max_tokens;
  std::vector<uint8_t> buf(L.total_bytes);
  char msg[512];
  for (int r = 0; r < R; ++r) {
    const int Tn = rr.Tr[r];
    d2h(buf.data(), (const char*)route.base + (uint64_t)r * L.total_bytes, L.total_bytes);
    if (route_ref_check(&rr, r, &L, buf.data(), epoch, msg, sizeof(msg))) FAIL("%s", msg);
    expect_poison(buf.data() + L.array[EPF_ROUTE_DST_RANK].offset + (size_t)Tn * K * 4, (size_t)(Tm - Tn) * K * 4, "DST_RANK", r);
    expect_poison(buf.data() + L.array[EPF_ROUTE_SLOT].offset + (size_t)Tn * K * 4, (size_t)(Tm - Tn) * K * 4, "SLOT", r);
    expect_poison(buf.data() + L.array[EPF_ROUTE_TOKEN_IN_RANK].offset + (size_t)Tn * R, (size_t)(Tm - Tn) * R,
                  "TOKEN_IN_RANK", r);
    if (L.array[EPF_ROUTE_RM_SLOT].bytes)
      expect_poison(buf.data() + L.array[EPF_ROUTE_RM_SLOT].offset + (size_t)Tn * R * 4, (size_t)(Tm - Tn) * R * 4,
                    "RM_SLOT", r);
    if (mapped && L.exchange) {
      const int64_t got = *(volatile const int64_t*)(g_total_h + r);
      if (got != rr.rows[r]) FAIL("rank %d host-mapped receive total %lld, want %lld", r, (long long)got, (long long)rr.rows[r]);
    }
  }
}

/* what the round's routing holds */
static void count_route(const route_ref_t& rr) {
  for (int r = 0; r < rr.R; ++r) {
    g_st.tokens += rr.Tr[r];
    g_st.dropped += rr.dropped[r];
    for (int t = 0; t < rr.Tr[r]; ++t)
      for (int k = 0; k < rr.K; ++k) {
        const int32_t f = rr.first_k[((size_t)r * rr.T + t) * rr.K + k];
        g_st.repeats += f >= 0 && f != k;
        g_st.copies += f == k;
      }
  }
}

/* EXPERT_MAJOR pad rows of rank d (alignment > 1, marks on): their metadata in an image */
static void put_pad_marks(const route_ref_t& rr, int d, int64_t cap, uint8_t* meta_img, uint32_t meta_bytes) {
  const int EL = rr.E / rr.R;
  for (int j = 0; j < EL; ++j) {
    const int32_t* sg = rr.seg + ((size_t)d * EL + j) * 4;
    for (int64_t row = (int64_t)sg[0] + sg[1]; row < (int64_t)sg[0] + sg[2] && row < cap; ++row) {
      const epf_recv_meta_em_t m = epf_recv_meta_em_make(-1, -1, -1, j, 0.0f);
      memcpy(meta_img + (size_t)row * meta_bytes, &m, sizeof(m));
    }
  }
}

/* first differing byte of two images, or -1 */
static int64_t first_diff(const uint8_t* a, const uint8_t* b, size_t n) {
  if (memcmp(a, b, n) == 0) return -1;
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return (int64_t)i;
  return -1;
}

/* ============================================================================================ */
/* route configurations                                                                          */
/* ============================================================================================ */

static void run_route(const Case& c, uint64_t seed) {
  Rng g(seed);
  const epf_plan_t plan = plan_of(c);
  const int R = (int)c.R, E = (int)c.E;
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  rc.index_type = c.idx64 ? EPF_INDEX_INT64 : EPF_INDEX_INT32;
  rc.top_k = (int32_t)c.rK;
  rc.max_tokens = (int32_t)c.rT;
  rc.max_blocks = (int32_t)c.maxb;
  rc.flags = c.nopad ? EPF_ROUTE_FLAG_NO_PAD_MARK : 0u;
  uint64_t rbytes = 0;
  epf_status_t st = epf_route_size(&plan, &rc, &rbytes);
  if (st != EPF_OK) FAIL("epf_route_size: %s", epf_status_name(st));
  Dev win, rbuf, ids, dT;
  DrainGuard drain;
  win.alloc((size_t)R * plan.total_bytes);
  d_set(win.p, 0, win.n);
  init_signals(win.c(), plan, R, (uint32_t)c.ep0);
  rbuf.alloc((size_t)rbytes * R);
  epf_route_t route;
  st = epf_route_init(&plan, &rc, rbuf.p, rbytes * R, R, (uint32_t)c.ep0, g_stream, &route);
  {
    Grid gr;
    gr.ranks = R;
    launched(st, "epf_route_init", gr);
  }
  const int K = route.layout.top_k, Tm = route.layout.max_tokens;
  ids.alloc((size_t)R * Tm * K * (c.idx64 ? 8 : 4));
  dT.alloc((size_t)R * 4);
  const epf_team_t team = epf_team_virtual(win.p, plan.total_bytes, 0, R);
  const epf_region_t meta_reg = plan.region[EPF_REGION_RECV_META];
  std::vector<int64_t> hids((size_t)R * Tm * K);
  std::vector<uint8_t> meta(meta_reg.bytes), want(meta_reg.bytes);
  uint32_t epoch = (uint32_t)c.ep0;
  for (int round = 0; round < c.rounds; ++round) {
    const std::vector<int> T = gen_T(g, R, Tm, c.devT != 0);
    gen_ids(g, c, R, Tm, K, E, T, hids.data());
    upload_ids(ids.p, hids.data(), hids.size(), c.idx64 != 0);
    h2d(dT.p, T.data(), (size_t)R * 4);
    route_poison(route);
    if (meta_reg.bytes)
      for (int r = 0; r < R; ++r) d_set(win.c() + (uint64_t)r * plan.total_bytes + meta_reg.offset, POISON, meta_reg.bytes);
    sync_or_die("poisoning");
    for (int r = 0; r < R; ++r) g_total_h[r] = -1;
    epf_route_step_t step = epf_route_step_make(ids.p, c.devT ? 0 : T[0], epf_wait_make(plan.timeout_ns, g_rec_d, NULL, 0));
    step.blocks_per_rank = (int32_t)c.rbpr;
    step.num_tokens_dev = c.devT ? dT.as<int32_t>() : NULL;
    step.recv_total_mapped = g_total_d;
    {
      Grid gr;
      gr.ranks = R;
      gr.bpr = c.rbpr;
      launched(epf_route_update(&route, team, &plan, &step, g_stream), "epf_route_update", gr);
    }
    sync_or_die("the route update");
    ++epoch;
    route_ref_t rr;
    if (route_ref_compute_ex(&rr, R, E, K, Tm, T.data(), (int)c.A, c.layout == EPF_LAYOUT_RANK_MAJOR, plan.recv_capacity,
                             hids.data()) != 0)
      FAIL("out of host memory (route reference)");
    uint32_t dropped = 0;
    for (int r = 0; r < R; ++r) dropped += rr.dropped[r];
    count_route(rr);
    try {
      route_check_all(route, rr, epoch, true);
      /* the window's RECV_META: the pad rows' marks (EM, alignment > 1, marks on), nothing else */
      if (meta_reg.bytes)
        for (int d = 0; d < R; ++d) {
          d2h(meta.data(), win.c() + (uint64_t)d * plan.total_bytes + meta_reg.offset, meta.size());
          memset(want.data(), POISON, want.size());
          if (route.layout.exchange && c.layout == EPF_LAYOUT_EXPERT_MAJOR && c.A > 1 && !c.nopad)
            put_pad_marks(rr, d, plan.recv_capacity, want.data(), plan.meta_bytes_per_row);
          const int64_t i = first_diff(meta.data(), want.data(), meta.size());
          if (i >= 0)
            FAIL("rank %d RECV_META byte %lld (row %lld): 0x%02x, want 0x%02x", d, (long long)i,
                 (long long)(i / plan.meta_bytes_per_row), meta[(size_t)i], want[(size_t)i]);
        }
    } catch (...) {
      route_ref_free(&rr);
      throw;
    }
    route_ref_free(&rr);
    check_record(dropped, 0u, strf("step %d", round).c_str());
  }
}

/* ============================================================================================ */
/* HT configurations                                                                             */
/* ============================================================================================ */

/* the host inputs of one HT round */
struct HtIn {
  int R, Tm, K, H, E, EL, sbr, pay;
  std::vector<int> T;
  std::vector<int64_t> ids; /* [R][Tm][K] */
  std::vector<float> w;     /* [R][Tm][K] */
  std::vector<uint16_t> xb; /* [R][Tm][H] */
  std::vector<uint8_t> xq;  /* [R][Tm][H]: the payload bytes of quantized payloads */
  std::vector<uint8_t> xs;  /* [R][Tm][sbr]: their compact scales */
  const uint8_t* payload(int s, int t) const {
    const size_t i = (size_t)s * Tm + t;
    return pay == EPF_PAYLOAD_BF16 ? (const uint8_t*)(xb.data() + i * H) : xq.data() + i * H;
  }
  const uint8_t* scales(int s, int t) const { return xs.data() + ((size_t)s * Tm + t) * sbr; }
  /* element h of (s, t) as the experts see it */
  float deq(int s, int t, int h) const {
    const size_t i = (size_t)s * Tm + t;
    if (pay == EPF_PAYLOAD_BF16) return bf16_f(xb[i * H + h]);
    if (pay == EPF_PAYLOAD_MXFP8) return epf_mxfp8_dequantize_ref(xq[i * H + h], xs[i * sbr + h / 32]);
    float sc;
    memcpy(&sc, &xs[i * sbr + (h / 128) * 4], 4);
    return epf_fp8_128_dequantize_ref(xq[i * H + h], sc);
  }
};

/* rank d's receive regions (copied to the host) against the reference: exact images of
 * RECV_TOKENS and RECV_SCALES (rows that hold no copy keep their poison), RECV_META (EM: exact,
 * with the pad rows' marks; RM: header and the used entries of every data row, rows without data
 * keep their poison). Adds the copies dropped at the capacity to *over. */
static void ht_check_recv(const Case& c, const epf_plan_t& p, const HtIn& in, const route_ref_t& rr, int d,
                          const uint8_t* tok, const uint8_t* sc, const uint8_t* meta, uint64_t* over) {
  const int R = in.R, Tm = in.Tm, K = in.K, EL = in.EL, H = in.H, sbr = in.sbr;
  const int64_t cap = p.recv_capacity;
  const size_t tok_n = p.region[EPF_REGION_RECV_TOKENS].bytes, sc_n = p.region[EPF_REGION_RECV_SCALES].bytes,
               meta_n = p.region[EPF_REGION_RECV_META].bytes;
  const uint32_t rb = p.row_bytes, mb = p.meta_bytes_per_row;
  const bool em = c.layout == EPF_LAYOUT_EXPERT_MAJOR, swz = c.swz != 0;
  std::vector<uint8_t> wt(tok_n, POISON), ws(sc_n, POISON), wm(meta_n, POISON);
  std::vector<uint8_t> mcare(em ? 0 : (size_t)cap, 0); /* RM: rows that hold data */
  const bool staged = epf_plan_scales_staged(&p) != 0; /* EM swizzled: the send's stage runs, then the atoms */
  auto put_scales = [&](int64_t row, int s, int t) {
    if (sbr == 0) return;
    if (!swz) {
      memcpy(&ws[(size_t)row * sbr], in.scales(s, t), (size_t)sbr);
    } else {
      for (int col = 0; col < H / 32; ++col) ws[(size_t)epf_scale_swizzle_offset(row, col, H / 32)] = in.scales(s, t)[col];
    }
    if (staged) { /* the stage run, and the zero padding columns of the row's last atom */
      memcpy(&ws[(size_t)(epf_plan_recv_scale_stage_offset(&p, row) - p.region[EPF_REGION_RECV_SCALES].offset)],
             in.scales(s, t), (size_t)sbr);
      for (int col = H / 32; col % 4 != 0; ++col) ws[(size_t)epf_scale_swizzle_offset(row, col, H / 32)] = 0;
    }
  };
  for (int s = 0; s < R; ++s)
    for (int t = 0; t < in.T[(size_t)s]; ++t) {
      const size_t st = (size_t)s * Tm + t;
      if (em) {
        for (int k = 0; k < K; ++k) {
          if (rr.dst[st * K + k] != d) continue;
          const int e = (int)in.ids[st * K + k];
          const int64_t row = (int64_t)rr.send_off[(size_t)s * in.E + e] + rr.slot[st * K + k];
          if (row >= cap) {
            ++*over;
            continue;
          }
          memcpy(&wt[(size_t)row * rb], in.payload(s, t), rb);
          put_scales(row, s, t);
          const epf_recv_meta_em_t m = epf_recv_meta_em_make(t, s, k, e - d * EL, in.w[st * K + k]);
          memcpy(&wm[(size_t)row * mb], &m, sizeof(m));
        }
      } else if (rr.in_rank[st * R + d]) {
        const int64_t row = (int64_t)rr.send_rm[(size_t)s * R + d] + rr.rm_slot[st * R + d];
        if (row >= cap) {
          ++*over;
          continue;
        }
        memcpy(&wt[(size_t)row * rb], in.payload(s, t), rb);
        put_scales(row, s, t);
        uint8_t* m = &wm[(size_t)row * mb];
        int n = 0;
        for (int k = 0; k < K; ++k) { /* every k on d, repeats included, k order */
          const int kf = rr.first_k[st * K + k];
          if (kf < 0) continue;
          const int e = (int)in.ids[st * K + k];
          if (e / EL != d) continue;
          const int32_t le = e - d * EL, sl = rr.slot[st * K + kf];
          memcpy(m + epf_recv_meta_rm_expert_at(K, n), &le, 4);
          memcpy(m + epf_recv_meta_rm_weight_at(K, n), &in.w[st * K + k], 4);
          memcpy(m + epf_recv_meta_rm_slot_at(K, n), &sl, 4);
          ++n;
        }
        epf_recv_meta_rm_t h = {t, s, n, 0};
        memcpy(m, &h, sizeof(h));
        mcare[(size_t)row] = (uint8_t)(1 + n); /* compare the header and n entries */
      }
    }
  if (em && c.A > 1 && !c.nopad) put_pad_marks(rr, d, cap, wm.data(), mb);
  int64_t i = first_diff(tok, wt.data(), tok_n);
  if (i >= 0)
    FAIL("rank %d RECV_TOKENS row %lld byte %lld: 0x%02x, want 0x%02x%s", d, (long long)(i / rb), (long long)(i % rb),
         tok[i], wt[(size_t)i], wt[(size_t)i] == POISON ? " (the poison: no copy lands there)" : "");
  i = first_diff(sc, ws.data(), sc_n);
  if (i >= 0)
    FAIL("rank %d RECV_SCALES byte %lld (%s): 0x%02x, want 0x%02x", d, (long long)i, swz ? "swizzled" : "compact", sc[i],
         ws[(size_t)i]);
  if (em) {
    i = first_diff(meta, wm.data(), meta_n);
    if (i >= 0)
      FAIL("rank %d RECV_META row %lld byte %lld: 0x%02x, want 0x%02x", d, (long long)(i / mb), (long long)(i % mb), meta[i],
           wm[(size_t)i]);
  } else {
    for (int64_t row = 0; row < cap; ++row) {
      const uint8_t* g = meta + (size_t)row * mb;
      const uint8_t* w = &wm[(size_t)row * mb];
      const int care = mcare[(size_t)row];
      if (care == 0) {
        if ((i = first_diff(g, w, mb)) >= 0)
          FAIL("rank %d RECV_META (rank-major) row %lld holds no copy but byte %lld was written", d, (long long)row, (long long)i);
        continue;
      }
      const int n = care - 1;
      const int32_t* gi = (const int32_t*)g;
      const int32_t* wi = (const int32_t*)w;
      if (gi[0] != wi[0] || gi[1] != wi[1] || gi[2] != wi[2])
        FAIL("rank %d rank-major row %lld: header (token %d, src %d, n %d), want (%d, %d, %d)", d, (long long)row, gi[0], gi[1],
             gi[2], wi[0], wi[1], wi[2]);
      for (int j = 0; j < n; ++j) {
        const uint32_t at[3] = {epf_recv_meta_rm_expert_at(K, j), epf_recv_meta_rm_weight_at(K, j), epf_recv_meta_rm_slot_at(K, j)};
        int32_t gv[3], wv[3];
        for (int f = 0; f < 3; ++f) {
          memcpy(&gv[f], g + at[f], 4);
          memcpy(&wv[f], w + at[f], 4);
        }
        if (gv[0] != wv[0] || gv[1] != wv[1] || gv[2] != wv[2])
          FAIL("rank %d rank-major row %lld (token %d of src %d) entry %d: (expert %d, w bits %08x, slot %d), want (%d, %08x, %d)",
               d, (long long)row, wi[0], wi[1], j, gv[0], gv[1], gv[2], wv[0], wv[1], wv[2]);
      }
    }
  }
}

/* rank d's expand view [xr][row_bytes] and its compact scales [xr][sbr]: every distinct (token,
 * expert) copy whose rank-major row arrived sits at its expert-major row (the rest keeps the
 * poison). Adds the copies past xr to *over. */
static void ht_check_view(const Case& c, const epf_plan_t& p, const HtIn& in, const route_ref_t& rr, int d, int64_t xr,
                          const uint8_t* view, const uint8_t* vsc, uint64_t* over) {
  const int R = in.R, Tm = in.Tm, K = in.K, EL = in.EL, sbr = in.sbr;
  const uint32_t rb = p.row_bytes;
  std::vector<uint8_t> wv((size_t)xr * rb, POISON), wsc((size_t)xr * sbr, POISON);
  (void)c;
  for (int s = 0; s < R; ++s)
    for (int t = 0; t < in.T[(size_t)s]; ++t) {
      const size_t st = (size_t)s * Tm + t;
      if (!rr.in_rank[st * R + d]) continue;
      if ((int64_t)rr.send_rm[(size_t)s * R + d] + rr.rm_slot[st * R + d] >= p.recv_capacity) continue; /* not received */
      for (int k = 0; k < K; ++k) {
        if (rr.dst[st * K + k] != d) continue; /* first occurrences on d: one per (token, expert) */
        const int le = (int)in.ids[st * K + k] - d * EL;
        const int64_t vr = (int64_t)rr.src_off[((size_t)d * EL + le) * (R + 1) + s] + rr.slot[st * K + k];
        if (vr >= xr) {
          ++*over;
          continue;
        }
        memcpy(&wv[(size_t)vr * rb], in.payload(s, t), rb);
        if (sbr) memcpy(&wsc[(size_t)vr * sbr], in.scales(s, t), (size_t)sbr);
      }
    }
  int64_t i = first_diff(view, wv.data(), wv.size());
  if (i >= 0)
    FAIL("rank %d expand view row %lld byte %lld: 0x%02x, want 0x%02x%s", d, (long long)(i / rb), (long long)(i % rb), view[i],
         wv[(size_t)i], wv[(size_t)i] == POISON ? " (the poison: no copy belongs there)" : "");
  if (sbr && (i = first_diff(vsc, wsc.data(), wsc.size())) >= 0)
    FAIL("rank %d expand view scales (compact) row %lld byte %lld: 0x%02x, want 0x%02x", d, (long long)(i / sbr),
         (long long)(i % sbr), vsc[i], wsc[(size_t)i]);
}

/* the combine output of source s (out: its [Tm][H] rows, copied to the host): rows t < T[s]
 * bit-exact (docs/high-throughput.md), rows past T[s] keep their poison */
static void ht_check_out(const Case& c, const epf_plan_t& p, const HtIn& in, const route_ref_t& rr, int64_t xr, int s,
                         const uint16_t* out) {
  const int R = in.R, Tm = in.Tm, K = in.K, EL = in.EL, H = in.H, E = in.E;
  const int64_t cap = p.recv_capacity;
  const bool mxc = c.cpay == EPF_PAYLOAD_MXFP8;
  const int rule = epf_mx_rule_from_flags(p.flags);
  std::vector<float> acc((size_t)H), part((size_t)H), yv((size_t)K * H);
  std::vector<uint8_t> yq((size_t)K * H), ysb((size_t)K * (H / 32 + 1)), pq((size_t)H), psb((size_t)H / 32 + 1);
  std::vector<uint8_t> have((size_t)K);
  std::vector<uint16_t> want((size_t)H);
  for (int t = 0; t < in.T[(size_t)s]; ++t) {
    const size_t st = (size_t)s * Tm + t;
    /* the expert output of every first occurrence: y = bf16(dequant(x) * f(le, d)) (and its MXFP8
     * form when it travels back quantized, EM) */
    for (int k = 0; k < K; ++k) {
      have[(size_t)k] = 0;
      if (rr.first_k[st * K + k] != k) continue;
      const int e = (int)in.ids[st * K + k], d = e / EL;
      const float f = expert_factor(e % EL, d);
      float* y = &yv[(size_t)k * H];
      for (int h = 0; h < H; ++h) y[h] = bf16_f(bf16_rne(in.deq(s, t, h) * f));
      if (mxc && c.layout == EPF_LAYOUT_EXPERT_MAJOR)
        for (int gi = 0; gi < H / 32; ++gi)
          ysb[(size_t)k * (H / 32 + 1) + gi] = epf_mxfp8_quantize_block_ref(y + gi * 32, rule, &yq[(size_t)k * H + gi * 32]);
      have[(size_t)k] = 1;
    }
    std::fill(acc.begin(), acc.end(), 0.0f);
    if (c.layout == EPF_LAYOUT_EXPERT_MAJOR) {
      for (int k = 0; k < K; ++k) {
        const int kf = rr.first_k[st * K + k];
        if (kf < 0) continue;
        const int e = (int)in.ids[st * K + k];
        const int64_t row = (int64_t)rr.send_off[(size_t)s * E + e] + rr.slot[st * K + kf];
        if (row >= cap) continue; /* its copy was dropped at the capacity: nothing */
        const float wk = in.w[st * K + k];
        if (!mxc) {
          const float* y = &yv[(size_t)kf * H];
          for (int h = 0; h < H; ++h) acc[(size_t)h] = fmaf(wk, y[h], acc[(size_t)h]);
        } else {
          for (int h = 0; h < H; ++h)
            acc[(size_t)h] = epf_mxfp8_dequantize_accumulate_ref(yq[(size_t)kf * H + h], ysb[(size_t)kf * (H / 32 + 1) + h / 32],
                                                                 wk, acc[(size_t)h]);
        }
      }
    } else {
      int order[32], nd = 0;
      for (int k = 0; k < K; ++k) { /* destination ranks in order of first occurrence in k */
        if (rr.first_k[st * K + k] < 0) continue;
        const int d = (int)(in.ids[st * K + k] / EL);
        bool seen = false;
        for (int j = 0; j < nd; ++j) seen |= order[j] == d;
        if (!seen) order[nd++] = d;
      }
      for (int j = 0; j < nd; ++j) {
        const int d = order[j];
        if ((int64_t)rr.send_rm[(size_t)s * R + d] + rr.rm_slot[st * R + d] >= cap) continue; /* never received */
        std::fill(part.begin(), part.end(), 0.0f);
        for (int k = 0; k < K; ++k) { /* every entry on d, repeats included, k order */
          const int kf = rr.first_k[st * K + k];
          if (kf < 0) continue;
          const int e = (int)in.ids[st * K + k];
          if (e / EL != d) continue;
          const int64_t vr = (int64_t)rr.src_off[((size_t)d * EL + e % EL) * (R + 1) + s] + rr.slot[st * K + kf];
          if (vr >= xr) continue; /* not placed by the expand: nothing */
          const float wk = in.w[st * K + k];
          const float* y = &yv[(size_t)kf * H];
          for (int h = 0; h < H; ++h) part[(size_t)h] = fmaf(wk, y[h], part[(size_t)h]);
        }
        if (!mxc) {
          for (int h = 0; h < H; ++h) acc[(size_t)h] = fmaf(1.0f, bf16_f(bf16_rne(part[(size_t)h])), acc[(size_t)h]);
        } else {
          for (int gi = 0; gi < H / 32; ++gi) psb[(size_t)gi] = epf_mxfp8_quantize_block_ref(&part[(size_t)gi * 32], rule, &pq[(size_t)gi * 32]);
          for (int h = 0; h < H; ++h)
            acc[(size_t)h] = epf_mxfp8_dequantize_accumulate_ref(pq[(size_t)h], psb[(size_t)h / 32], 1.0f, acc[(size_t)h]);
        }
      }
    }
    for (int h = 0; h < H; ++h) want[(size_t)h] = bf16_rne(acc[(size_t)h]);
    const uint16_t* got = out + (size_t)t * H;
    if (memcmp(got, want.data(), (size_t)H * 2) != 0) {
      int h = 0;
      while (got[h] == want[(size_t)h]) ++h;
      std::string ids;
      for (int k = 0; k < K && k < 32; ++k) ids += strf("%s%lld", k ? "," : "", (long long)in.ids[st * K + k]);
      FAIL("combine: rank %d token %d h %d: 0x%04x, want 0x%04x (ids %s)", s, t, h, got[h], want[(size_t)h], ids.c_str());
    }
  }
  expect_poison((const uint8_t*)(out + (size_t)in.T[(size_t)s] * H), (size_t)(Tm - in.T[(size_t)s]) * H * 2,
                "combine output", s);
}

/* the backward round of an HT configuration (docs/high-throughput.md "Training"), checked through
 * the model of tests/common/epf_ht_ref.h: its placement is computed independently of the route
 * reference above, from the same ids (invalid ids and tokens past each rank's T as -1) */
static void ht_model_of(const Case& c, const epf_plan_t& p, const HtIn& in, const std::vector<uint16_t>& dy, ht_case_t* hc,
                        model_t* m) {
  const int R = in.R, Tm = in.Tm, K = in.K, H = in.H, E = in.E;
  memset(hc, 0, sizeof(*hc));
  hc->R = R;
  hc->T = Tm;
  hc->H = H;
  hc->K = K;
  hc->E = E;
  hc->layout = (int)c.layout;
  hc->payload = EPF_PAYLOAD_BF16;
  hc->combine_payload = EPF_PAYLOAD_BF16;
  hc->push = (int)c.push;
  hc->align = (int)c.A;
  hc->capacity = p.recv_capacity;
  hc->in_place = (int)c.inplace;
  model_alloc(hc, m);
  for (int s = 0; s < R; ++s)
    for (int t = 0; t < Tm; ++t)
      for (int k = 0; k < K; ++k) {
        const size_t i = ((size_t)s * Tm + t) * K + k;
        const int64_t e = in.ids[i];
        m->topk[i] = t < in.T[(size_t)s] && e >= 0 && e < E ? (int32_t)e : -1;
        m->w[i] = in.w[i];
      }
  memcpy(m->x, dy.data(), dy.size() * 2);
  model_place(hc, m);
}

static void run_ht(const Case& c, uint64_t seed) {
  Rng g(seed);
  const epf_plan_t plan = plan_of(c);
  const int R = (int)c.R, E = (int)c.E, K = (int)c.K, H = (int)c.H, Tm = (int)c.T;
  const bool em = c.layout == EPF_LAYOUT_EXPERT_MAJOR, quant = c.pay != EPF_PAYLOAD_BF16;
  const int64_t xr = ht_expert_rows(c, plan);
  const int sbr = (int)plan.scale_bytes_per_row;
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  rc.index_type = c.idx64 ? EPF_INDEX_INT64 : EPF_INDEX_INT32;
  rc.flags = c.nopad ? EPF_ROUTE_FLAG_NO_PAD_MARK : 0u;
  uint64_t rbytes = 0;
  epf_status_t st = epf_route_size(&plan, &rc, &rbytes);
  if (st != EPF_OK) FAIL("epf_route_size: %s", epf_status_name(st));
  if (em && !c.inplace && xr < plan.recv_capacity) FAIL("test bug: EXPERT_MAJOR expert_rows %lld < recv_capacity", (long long)xr);

  Dev win, rbuf, ids, dT, x, xs, w, out, eout, view, vsc, state, wgd, twg;
  DrainGuard drain;
  win.alloc((size_t)R * plan.total_bytes);
  d_set(win.p, 0, win.n);
  init_signals(win.c(), plan, R, (uint32_t)c.ep0);
  rbuf.alloc((size_t)rbytes * R);
  epf_route_t route;
  Grid rgrid, hgrid;
  rgrid.ranks = R;
  launched(epf_route_init(&plan, &rc, rbuf.p, rbytes * R, R, (uint32_t)c.ep0, g_stream, &route), "epf_route_init", rgrid);
  rgrid.bpr = c.rbpr;
  hgrid.ranks = R;
  hgrid.bpr = c.bpr;
  hgrid.threads = EPF_HT_THREADS;
  Grid hg_dispatch = hgrid, hg_expand = hgrid, hg_combine = hgrid;
  hg_dispatch.kernel = (const void*)epf_ht_dispatch_kernel;
  hg_expand.kernel = (const void*)epf_ht_expand_kernel;
  hg_combine.kernel = (const void*)epf_ht_combine_kernel;
  Grid hg_cbwd = hgrid, hg_dbwd = hgrid;
  hg_cbwd.kernel = (const void*)epf_ht_combine_backward_kernel;
  hg_dbwd.kernel = (const void*)epf_ht_dispatch_backward_kernel;
  ids.alloc((size_t)R * Tm * K * (c.idx64 ? 8 : 4));
  dT.alloc((size_t)R * 4);
  x.alloc((size_t)R * Tm * (c.xq ? plan.row_bytes : (uint64_t)H * 2));
  xs.alloc((size_t)R * Tm * (sbr > 0 ? sbr : 1));
  w.alloc((size_t)R * Tm * K * 4);
  out.alloc((size_t)R * Tm * H * 2);
  if (!c.inplace) eout.alloc((size_t)R * xr * H * 2);
  if (!em) {
    view.alloc((size_t)R * xr * plan.row_bytes);
    if (sbr) vsc.alloc((size_t)R * xr * sbr);
  }
  state.alloc((size_t)R * sizeof(epf_ht_state_t));
  d_set(state.p, 0, state.n);
  if (c.bwd) {
    wgd.alloc((size_t)R * xr * 4);
    twg.alloc((size_t)R * Tm * K * 4);
  }
  const epf_team_t team = epf_team_virtual(win.p, plan.total_bytes, 0, R);

  HtIn in;
  in.R = R;
  in.Tm = Tm;
  in.K = K;
  in.H = H;
  in.E = E;
  in.EL = E / R;
  in.sbr = sbr;
  in.pay = (int)c.pay;
  in.ids.resize((size_t)R * Tm * K);
  in.w.resize((size_t)R * Tm * K);
  in.xb.resize((size_t)R * Tm * H);
  in.xq.resize(quant ? (size_t)R * Tm * H : 0);
  in.xs.resize((size_t)R * Tm * sbr);

  epf_ht_step_t hs = EPF_HT_STEP_INIT;
  hs.x = x.p;
  hs.x_scales = c.xq ? xs.p : NULL;
  hs.topk_weights = w.as<float>();
  hs.out = out.p;
  hs.expert_out = c.inplace ? NULL : eout.p;
  hs.em_view = em ? NULL : view.p;
  hs.em_view_scales = em || !sbr ? NULL : vsc.p;
  hs.state = state.as<epf_ht_state_t>();
  hs.expert_rows = c.inplace ? 0 : xr;
  hs.x_quantized = (int32_t)c.xq;
  hs.blocks_per_rank = (int32_t)c.bpr;
  hs.wait = epf_wait_make(plan.timeout_ns, g_rec_d, NULL, 0);

  const epf_region_t* reg = plan.region;
  std::vector<uint8_t> htok(reg[EPF_REGION_RECV_TOKENS].bytes), hsc(reg[EPF_REGION_RECV_SCALES].bytes),
      hmeta(reg[EPF_REGION_RECV_META].bytes);
  std::vector<uint8_t> hview(em ? 0 : (size_t)xr * plan.row_bytes), hvsc(em ? 0 : (size_t)xr * sbr);
  std::vector<uint16_t> hout((size_t)R * Tm * H);
  uint32_t epoch = (uint32_t)c.ep0;
  for (int round = 0; round < c.rounds; ++round) {
    /* fresh inputs */
    in.T = gen_T(g, R, Tm, c.devT != 0);
    gen_ids(g, c, R, Tm, K, E, in.T, in.ids.data());
    for (auto& v : in.xb) v = gen_x(g);
    for (auto& v : in.w) v = gen_w(g);
    if (quant)
      for (int s = 0; s < R; ++s)
        for (int t = 0; t < in.T[(size_t)s]; ++t) {
          const size_t i = (size_t)s * Tm + t;
          quantize_row((int)c.pay, plan.flags, H, &in.xb[i * H], &in.xq[i * H], &in.xs[i * sbr]);
        }
    upload_ids(ids.p, in.ids.data(), in.ids.size(), c.idx64 != 0);
    if (c.xq) {
      h2d(x.p, in.xq.data(), in.xq.size());
      h2d(xs.p, in.xs.data(), in.xs.size());
    } else {
      h2d(x.p, in.xb.data(), in.xb.size() * 2);
    }
    h2d(w.p, in.w.data(), in.w.size() * 4);
    h2d(dT.p, in.T.data(), (size_t)R * 4);
    /* poison every output */
    route_poison(route);
    for (int r = 0; r < R; ++r)
      for (epf_region_id_t rg : {EPF_REGION_RECV_TOKENS, EPF_REGION_RECV_SCALES, EPF_REGION_RECV_META, EPF_REGION_COMBINE,
                                 EPF_REGION_EXPERT_OUT})
        d_set(win.c() + (uint64_t)r * plan.total_bytes + reg[rg].offset, POISON, reg[rg].bytes);
    d_set(out.p, POISON, out.n);
    if (!c.inplace) d_set(eout.p, POISON, eout.n);
    if (!em) {
      d_set(view.p, POISON, view.n);
      if (sbr) d_set(vsc.p, POISON, vsc.n);
    }
    sync_or_die("uploads and poisoning");
    for (int r = 0; r < R; ++r) g_total_h[r] = -1;

    /* route, dispatch (fused or split), expand */
    epf_route_step_t rs = epf_route_step_make(ids.p, c.devT ? 0 : in.T[0], epf_wait_make(plan.timeout_ns, g_rec_d, NULL, 0));
    rs.blocks_per_rank = (int32_t)c.rbpr;
    rs.num_tokens_dev = c.devT ? dT.as<int32_t>() : NULL;
    rs.recv_total_mapped = g_total_d;
    launched(epf_route_update(&route, team, &plan, &rs, g_stream), "epf_route_update", rgrid);
    if (c.split) {
      launched(epf_ht_dispatch(&route, team, &plan, &hs, ids.p, EPF_HT_SEND, g_stream), "epf_ht_dispatch (send)", hg_dispatch);
      launched(epf_ht_dispatch(&route, team, &plan, &hs, ids.p, EPF_HT_RECV, g_stream), "epf_ht_dispatch (receive)",
               hg_dispatch);
    } else {
      launched(epf_ht_dispatch(&route, team, &plan, &hs, ids.p, EPF_HT_BOTH, g_stream), "epf_ht_dispatch",
               hg_dispatch);
    }
    if (!em) launched(epf_ht_expand(&route, team, &plan, &hs, g_stream), "epf_ht_expand", hg_expand);
    sync_or_die("route update + dispatch + expand");
    ++epoch;

    route_ref_t rr;
    if (route_ref_compute_ex(&rr, R, E, K, Tm, in.T.data(), (int)c.A, !em, plan.recv_capacity, in.ids.data()) != 0)
      FAIL("out of host memory (route reference)");
    try {
      uint32_t dropped = 0;
      uint64_t over = 0;
      for (int r = 0; r < R; ++r) dropped += rr.dropped[r];
      count_route(rr);
      route_check_all(route, rr, epoch, true);
      for (int d = 0; d < R; ++d) {
        const char* b = win.c() + (uint64_t)d * plan.total_bytes;
        d2h(htok.data(), b + reg[EPF_REGION_RECV_TOKENS].offset, htok.size());
        d2h(hsc.data(), b + reg[EPF_REGION_RECV_SCALES].offset, hsc.size());
        d2h(hmeta.data(), b + reg[EPF_REGION_RECV_META].offset, hmeta.size());
        ht_check_recv(c, plan, in, rr, d, htok.data(), hsc.data(), hmeta.data(), &over);
        if (!em) {
          d2h(hview.data(), view.c() + (uint64_t)d * xr * plan.row_bytes, hview.size());
          if (sbr) d2h(hvsc.data(), vsc.c() + (uint64_t)d * xr * sbr, hvsc.size());
          ht_check_view(c, plan, in, rr, d, xr, hview.data(), hvsc.data(), &over);
        }
      }

      /* experts (tests/common/epf_ht_ref.h), combine */
      experts_kernel<<<dim3(64, (unsigned)R), 256, 0, g_stream>>>(route, plan, win.c(), 0, view.as<uint8_t>(),
                                                                   vsc.as<uint8_t>(), xr, eout.as<uint16_t>(),
                                                                   c.inplace ? 1 : 0);
      CK(cudaGetLastError());
      launched(epf_ht_combine(&route, team, &plan, &hs, ids.p, g_stream), "epf_ht_combine", hg_combine);
      sync_or_die("experts + combine");
      d2h(hout.data(), out.p, hout.size() * 2);
      par_for(R, [&](int s) { ht_check_out(c, plan, in, rr, xr, s, hout.data() + (size_t)s * Tm * H); });
      g_st.overflow += (int64_t)over;
      check_record(dropped, (uint32_t)over, strf("round %d", round).c_str());

      if (c.bwd) {
        /* backward of combine: dy into the forward's receive rows; experts' backward; backward of
         * dispatch: dx and (bwd 2) the router-weight gradients */
        std::vector<uint16_t> dy((size_t)R * Tm * H), hdx((size_t)R * Tm * H);
        std::vector<float> htw((size_t)R * Tm * K);
        for (auto& v : dy) v = gen_x(g);
        h2d(x.p, dy.data(), dy.size() * 2);
        d_set(out.p, POISON, out.n);
        if (!c.inplace) d_set(eout.p, POISON, eout.n);
        if (!em) d_set(view.p, POISON, view.n);
        d_set(wgd.p, POISON, wgd.n);
        d_set(twg.p, POISON, twg.n);
        epf_ht_step_t hb = hs;
        hb.x = x.p;
        hb.x_scales = NULL;
        hb.expert_rows = xr;
        hb.topk_idx = ids.p;
        hb.weight_grad = c.bwd == 2 ? wgd.as<float>() : NULL;
        hb.topk_weights_grad = c.bwd == 2 ? twg.as<float>() : NULL;
        if (c.split) {
          launched(epf_ht_combine_backward(&route, team, &plan, &hb, EPF_HT_SEND, g_stream), "epf_ht_combine_backward (send)", hg_cbwd);
          launched(epf_ht_combine_backward(&route, team, &plan, &hb, EPF_HT_RECV, g_stream), "epf_ht_combine_backward (receive)",
                   hg_cbwd);
        } else {
          launched(epf_ht_combine_backward(&route, team, &plan, &hb, EPF_HT_BOTH, g_stream), "epf_ht_combine_backward", hg_cbwd);
        }
        if (!em) launched(epf_ht_expand(&route, team, &plan, &hb, g_stream), "epf_ht_expand (backward)", hg_expand);
        sync_or_die("backward of combine + expand");
        ht_case_t hc;
        model_t mb;
        ht_model_of(c, plan, in, dy, &hc, &mb);
        struct ModelFree {
          model_t* m;
          ~ModelFree() { model_free(m); }
        } mfree{&mb};
        for (int d = 0; d < R; ++d) {
          char msg[256];
          const char* b = win.c() + (uint64_t)d * plan.total_bytes;
          d2h(htok.data(), b + reg[EPF_REGION_RECV_TOKENS].offset, htok.size());
          d2h(hmeta.data(), b + reg[EPF_REGION_RECV_META].offset, hmeta.size());
          if (check_recv_rank_ex(&hc, &mb, &plan, d, htok.data(), hmeta.data(), NULL, 1, msg, sizeof(msg)))
            FAIL("backward of combine: %s", msg);
          if (!em) {
            d2h(hview.data(), view.c() + (uint64_t)d * xr * plan.row_bytes, hview.size());
            if (check_expand_rank(&hc, &mb, &plan, d, hview.data(), xr, msg, sizeof(msg))) FAIL("backward of combine: %s", msg);
          }
        }
        experts_backward_kernel<<<dim3(64, (unsigned)R), 256, 0, g_stream>>>(route, plan, win.c(), 0, view.as<uint16_t>(), xr,
                                                                              eout.as<uint16_t>(), hb.weight_grad == NULL ? NULL : wgd.as<float>(),
                                                                              c.inplace ? 1 : 0);
        CK(cudaGetLastError());
        launched(epf_ht_dispatch_backward(&route, team, &plan, &hb, g_stream), "epf_ht_dispatch_backward", hg_dbwd);
        sync_or_die("experts' backward + backward of dispatch");
        epoch += 2; /* the backward round ran at epoch + 1 (combine) and + 2 (dispatch) */
        d2h(hdx.data(), out.p, hdx.size() * 2);
        d2h(htw.data(), twg.p, htw.size() * 4);
        par_for(R, [&](int s) {
          std::vector<float> acc((size_t)H), part((size_t)H);
          std::vector<uint16_t> want((size_t)H);
          std::vector<float> wgv((size_t)K);
          float* wg = wgv.data();
          for (int t = 0; t < in.T[(size_t)s]; ++t) {
            const int64_t st = (int64_t)s * Tm + t;
            ref_dispatch_backward_token(&hc, &mb, &plan, xr, st, acc.data(), part.data(), want.data(), wg);
            const uint16_t* got = hdx.data() + (size_t)st * H;
            if (memcmp(got, want.data(), (size_t)H * 2) != 0) {
              int h = 0;
              while (got[h] == want[(size_t)h]) ++h;
              FAIL("backward of dispatch: rank %d token %d h %d: 0x%04x, want 0x%04x", s, t, h, got[h], want[(size_t)h]);
            }
            for (int k = 0; k < K && c.bwd == 2; ++k)
              if (memcmp(&htw[(size_t)st * K + k], &wg[k], 4) != 0)
                FAIL("router-weight gradient: rank %d token %d k %d (id %lld): %a, want %a", s, t, k,
                     (long long)in.ids[(size_t)st * K + k], (double)htw[(size_t)st * K + k], (double)wg[k]);
          }
          expect_poison((const uint8_t*)(hdx.data() + ((size_t)s * Tm + in.T[(size_t)s]) * H),
                        (size_t)(Tm - in.T[(size_t)s]) * H * 2, "backward of dispatch output", s);
          expect_poison((const uint8_t*)(htw.data() + ((size_t)s * Tm + (c.bwd == 2 ? in.T[(size_t)s] : 0)) * K),
                        (size_t)(Tm - (c.bwd == 2 ? in.T[(size_t)s] : 0)) * K * 4, "topk_weights_grad", s);
        });
        check_record(0, (uint32_t)over, strf("round %d backward", round).c_str());
      }
    } catch (...) {
      route_ref_free(&rr);
      throw;
    }
    route_ref_free(&rr);
  }

  /* EXPERT_MAJOR with expert_out: fewer expert_rows than recv_capacity is refused */
  if (em && !c.inplace) {
    epf_ht_step_t bad = hs;
    bad.expert_rows = plan.recv_capacity - 1;
    st = epf_ht_combine(&route, team, &plan, &bad, ids.p, g_stream);
    if (st != EPF_ERR_INVALID_ARGUMENT) {
      if (st == EPF_OK) sync_or_die("a combine that should have been refused");
      FAIL("epf_ht_combine with expert_rows %lld < recv_capacity %lld: %s, want EPF_ERR_INVALID_ARGUMENT",
           (long long)bad.expert_rows, (long long)plan.recv_capacity, epf_status_name(st));
    }
  }
}

/* ============================================================================================ */
/* LL configurations                                                                             */
/* ============================================================================================ */

struct LlIn { /* llref_in_t, freed with it */
  llref_in_t in;
  LlIn() { memset(&in, 0, sizeof(in)); }
  ~LlIn() { llref_in_free(&in); }
  LlIn(const LlIn&) = delete;
  LlIn& operator=(const LlIn&) = delete;
};
struct LlRef {
  llref_t r;
  LlRef() { memset(&r, 0, sizeof(r)); }
  ~LlRef() { llref_free(&r); }
  LlRef(const LlRef&) = delete;
  LlRef& operator=(const LlRef&) = delete;
};

/* The backward of LL round epoch - 1 (same routing in `in`, fresh dy): epf_ll_combine_backward
 * (rows + combine weights checked on every rank), the experts over dy (dx rows in c.y), the
 * per-row weight gradient (c.wg), epf_ll_dispatch_backward: dx and topk_weights_grad bit for bit.
 * RANK_MAJOR (rm): the combine backward is a rank-major dispatch of dy (the rank-major rows with the
 * forward's metadata, the view expanded by the receive half when c.packed, its packed_meta weight
 * = the view row's combine weight, else by epf_ll_expand with the forward's rule: the first
 * entry's weight), checked against llrm_dispatch; the experts and the per-view-row weight gradient
 * (llrm_wgrad_kernel) read the view, y in the view's order (FIXED, PACKED, PACKED_PULL); dx and
 * topk_weights_grad against llrm_dispatch_backward, rows past T keep their poison. */
static void ll_backward_round(const Case& c, Rng& g, const epf_plan_t& plan, const epf_ll_launch_t& L, llref_in_t& in,
                              Dev& win, Dev& x, Dev& counts, Dev& ecounts, Dev& px, Dev& ps, Dev& pm, Dev& round,
                              Dev& y, Dev& out, Dev& wgr, Dev& twg, epf_ll_dispatch_args_t da, epf_ll_dispatch_args_t dv,
                              epf_ll_combine_args_t ca, const Grid& lg_bdispatch, const Grid& lg_bcombine, uint32_t epoch,
                              uint32_t dropped) {
  const int R = (int)c.R, E = (int)c.E, K = (int)c.K, H = (int)c.H, Tm = (int)c.T, T = in.T;
  const bool rm = c.layout == EPF_LAYOUT_RANK_MAJOR;
  const std::vector<int> Tv((size_t)R, T);
  char msg[LLREF_MSG];
  for (size_t i = 0; i < (size_t)R * Tm * H; ++i) in.hx[i] = gen_x(g); /* dy */
  h2d(x.p, in.hx, (size_t)R * Tm * H * 2);
  for (int r = 0; r < R; ++r)
    CK(rm ? llrm_poison_window(&plan, win.c() + (uint64_t)r * plan.total_bytes, epoch, g_stream)
          : llref_poison_window(&plan, win.c() + (uint64_t)r * plan.total_bytes, epoch, g_stream));
  for (Dev* b : {&counts, &ecounts, &px, &ps, &pm, &round, &y, &out, &wgr, &twg})
    if (b->p != nullptr) d_set(b->p, POISON, b->n);
  sync_or_die("backward uploads and poisoning");
  epf_error_clear(g_rec_h);
  if (c.split) {
    launched(epf_ll_combine_backward(&L, &da, EPF_LL_SEND, g_stream), "epf_ll_combine_backward (send)", lg_bdispatch);
    launched(epf_ll_combine_backward(&L, &da, EPF_LL_RECV, g_stream), "epf_ll_combine_backward (receive)", lg_bdispatch);
  } else {
    launched(epf_ll_combine_backward(&L, &da, EPF_LL_BOTH, g_stream), "epf_ll_combine_backward", lg_bdispatch);
  }
  if (rm && !c.packed) launched(epf_ll_expand(&L, &dv, g_stream), "epf_ll_expand (backward)");
  sync_or_die("the LL combine backward");
  if (rm) { /* the rank-major rows (the forward's metadata) and the view */
    llrm_ref_t rr;
    in.combine_weights = c.packed ? 1 : 0; /* the receive half's expand: combine weights; epf_ll_expand: the first entry's */
    llrm_dispatch(&in, Tv.data(), 0u, &rr);
    for (int d = 0; d < R; ++d) {
      llref_rank_bufs_t b;
      b.win = win.c() + (uint64_t)d * plan.total_bytes;
      b.recv_counts = counts.as<int32_t>() + (size_t)d * (E / R) * R;
      b.expert_counts = ecounts.as<int32_t>() + (size_t)d * (E / R);
      b.round = round.as<uint32_t>() + d;
      b.packed_x = px.c() + (uint64_t)d * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_PACKED_X, EPF_INDEX_DEFAULT);
      b.packed_scales = NULL; /* BF16 */
      b.packed_meta = (const epf_recv_meta_em_t*)(pm.c() + (uint64_t)d * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_PACKED_META, EPF_INDEX_DEFAULT));
      if (llrm_check_dispatch_rank(&in, &plan, &rr, d, &b, epoch, 1, 1, "rank-major combine backward", msg) != 0) {
        in.combine_weights = 0;
        llrm_free(&rr);
        FAIL("%s", msg);
      }
    }
    in.combine_weights = 0;
    llrm_free(&rr);
  } else {
    LlRef ref;
    in.combine_weights = 1;
    llref_dispatch(&in, 0u, &ref.r);
    for (int d = 0; d < R; ++d) {
      llref_rank_bufs_t b;
      b.win = win.c() + (uint64_t)d * plan.total_bytes;
      b.recv_counts = counts.as<int32_t>() + (size_t)d * (E / R) * R;
      b.expert_counts = ecounts.as<int32_t>() + (size_t)d * (E / R);
      b.round = round.as<uint32_t>() + d;
      b.packed_x = c.packed ? px.c() + (uint64_t)d * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_PACKED_X, EPF_INDEX_DEFAULT) : NULL;
      b.packed_scales = NULL;
      b.packed_meta = c.packed ? pm.as<epf_recv_meta_em_t>() + (uint64_t)d * plan.recv_capacity : NULL;
      const int bad = llref_check_dispatch_rank(&in, &plan, &ref.r, d, &b, epoch, 1, c.packed != 0, "combine backward", msg);
      if (bad != 0) {
        in.combine_weights = 0;
        FAIL("%s", msg);
      }
    }
    in.combine_weights = 0;
  }
  if (c.wg && rm) {
    llrm_wgrad_kernel<<<dim3(64, (unsigned)R), 256, 0, g_stream>>>(plan, counts.as<int32_t>(), px.c(), wgr.as<float>(),
                                                                    c.y != EPF_LL_Y_FIXED ? 1 : 0, -1);
    CK(cudaGetLastError());
  } else if (c.wg) {
    llref_wgrad_kernel<<<dim3(64, (unsigned)R), 256, 0, g_stream>>>(plan, win.c(), 0, round.as<uint32_t>(),
                                                                    counts.as<int32_t>(), wgr.as<float>(),
                                                                    c.y == EPF_LL_Y_PACKED ? 1 : 0, -1);
    CK(cudaGetLastError());
  }
  if (rm) /* dx rows from the view, in the view's order (PACKED_PULL: packed rows) */
    llref_experts_kernel<<<dim3(256, (unsigned)R), 256, 0, g_stream>>>(
        plan, win.c(), 0, round.as<uint32_t>(), counts.as<int32_t>(), px.c(), ps.as<uint8_t>(), y.as<uint16_t>(), 1,
        c.y == EPF_LL_Y_FIXED ? EPF_LL_Y_FIXED : EPF_LL_Y_PACKED, (int)c.ident, -1);
  else
    llref_experts_kernel<<<dim3(256, (unsigned)R), 256, 0, g_stream>>>(
        plan, win.c(), 0, round.as<uint32_t>(), counts.as<int32_t>(), px.c(), ps.as<uint8_t>(), y.as<uint16_t>(),
        c.packed && c.y == EPF_LL_Y_PACKED ? 1 : 0, (int)c.y, (int)c.ident, -1);
  CK(cudaGetLastError());
  ca.topk_weights = NULL; /* unit weights: never read */
  ca.weight_grad = c.wg ? wgr.as<float>() : NULL;
  ca.topk_weights_grad = twg.as<float>();
  if (c.split) {
    launched(epf_ll_dispatch_backward(&L, &ca, EPF_LL_SEND, g_stream), "epf_ll_dispatch_backward (send)", lg_bcombine);
    launched(epf_ll_dispatch_backward(&L, &ca, EPF_LL_RECV, g_stream), "epf_ll_dispatch_backward (receive)", lg_bcombine);
  } else {
    launched(epf_ll_dispatch_backward(&L, &ca, EPF_LL_BOTH, g_stream), "epf_ll_dispatch_backward", lg_bcombine);
  }
  sync_or_die("experts + the LL dispatch backward");
  std::vector<uint16_t> want((size_t)R * Tm * H);
  std::vector<float> wantg((size_t)R * Tm * K);
  if (rm)
    llrm_dispatch_backward(&in, Tv.data(), 0u, (int)c.ident, want.data(), wantg.data());
  else
    llref_dispatch_backward(&in, 0u, (int)c.ident, want.data(), wantg.data());
  if (!c.wg) std::fill(wantg.begin(), wantg.end(), 0.0f);
  const char* what = rm ? "LL rank-major dispatch backward" : "LL dispatch backward";
  for (int s = 0; s < R; ++s) {
    if (llref_check_combine_rank(&in, s, out.as<uint16_t>() + (size_t)s * Tm * H, want.data(), what, msg) != 0)
      FAIL("%s", msg);
    if (llref_check_wgrad_rank(&in, s, twg.as<float>() + (size_t)s * Tm * K, wantg.data(), what, msg) != 0)
      FAIL("%s", msg);
  }
  if (rm) { /* num_tokens bounds what is written: rows past T keep their poison */
    std::vector<uint8_t> hb((size_t)Tm * std::max(H * 2, K * 4));
    for (int s = 0; s < R; ++s) {
      d2h(hb.data(), out.c() + ((size_t)s * Tm + T) * H * 2, (size_t)(Tm - T) * H * 2);
      expect_poison(hb.data(), (size_t)(Tm - T) * H * 2, "LL rank-major dispatch backward dx", s);
      d2h(hb.data(), twg.c() + ((size_t)s * Tm + T) * K * 4, (size_t)(Tm - T) * K * 4);
      expect_poison(hb.data(), (size_t)(Tm - T) * K * 4, "LL rank-major dispatch backward topk_weights_grad", s);
    }
  }
  check_record(dropped, 0u, "backward round");
}

/* A forced (--case) bwd=1 on a plan the LL backward refuses (a quantized payload; RANK_MAJOR with
 * combine_row_bytes < 4 top_k, i.e. hidden < 2 top_k): both launchers must say
 * EPF_ERR_NOT_SUPPORTED before launching anything (the forward rounds then run without backward). */
static void ll_backward_refused(const epf_plan_t& plan, const epf_ll_launch_t& L, const epf_ll_dispatch_args_t& da,
                                const epf_ll_combine_args_t& ca) {
  const epf_status_t want = epf_ll_backward_check(&plan);
  const epf_status_t s1 = epf_ll_combine_backward(&L, &da, EPF_LL_BOTH, g_stream);
  const epf_status_t s2 = epf_ll_dispatch_backward(&L, &ca, EPF_LL_BOTH, g_stream);
  if (want != EPF_ERR_NOT_SUPPORTED || s1 != want || s2 != want)
    FAIL("LL backward on a plan it cannot run: epf_ll_backward_check %s, epf_ll_combine_backward %s, "
         "epf_ll_dispatch_backward %s (want EPF_ERR_NOT_SUPPORTED)",
         epf_status_name(want), epf_status_name(s1), epf_status_name(s2));
}

static void run_ll(const Case& c, uint64_t seed) {
  Rng g(seed);
  const epf_plan_t plan = plan_of(c);
  const int R = (int)c.R, E = (int)c.E, K = (int)c.K, H = (int)c.H, Tm = (int)c.T;
  const epf_index_type_t it = c.idx64 ? EPF_INDEX_INT64 : EPF_INDEX_INT32;
  const bool rm = c.layout == EPF_LAYOUT_RANK_MAJOR; /* the view is always written (packed: by the receive half) */
  LlIn li;
  llref_in_t& in = li.in;
  if (llref_in_init(&in, R, Tm, H, K, E, (int)c.pay, (int)c.cpay, plan.flags, (int)plan.scale_bytes_per_row) != 0)
    FAIL("out of host memory");
  Dev win, state, x, ids, w, counts, ecounts, px, ps, pm, round, y, out, wgr, twg;
  DrainGuard drain;
  win.alloc((size_t)R * plan.total_bytes);
  d_set(win.p, 0, win.n);
  state.alloc((size_t)R * sizeof(epf_ll_state_t));
#define LL_ALLOC(buf, which) buf.alloc((size_t)R * epf_ll_buffer_bytes(&plan, which, it))
  LL_ALLOC(x, EPF_LL_BUF_X);
  LL_ALLOC(ids, EPF_LL_BUF_TOPK_IDX);
  LL_ALLOC(w, EPF_LL_BUF_TOPK_WEIGHTS);
  LL_ALLOC(counts, EPF_LL_BUF_RECV_COUNTS);
  LL_ALLOC(ecounts, EPF_LL_BUF_EXPERT_COUNTS);
  LL_ALLOC(round, EPF_LL_BUF_ROUND);
  LL_ALLOC(out, EPF_LL_BUF_X);
  if (c.packed || rm) {
    LL_ALLOC(px, EPF_LL_BUF_PACKED_X);
    LL_ALLOC(pm, EPF_LL_BUF_PACKED_META);
    if (plan.scale_bytes_per_row) LL_ALLOC(ps, EPF_LL_BUF_PACKED_SCALES);
  }
  if (!llref_y_in_place((int)c.y)) LL_ALLOC(y, EPF_LL_BUF_Y);
  if (c.bwd) {
    LL_ALLOC(wgr, EPF_LL_BUF_WEIGHT_GRAD);
    LL_ALLOC(twg, EPF_LL_BUF_TOPK_WEIGHTS);
  }
#undef LL_ALLOC
  const epf_team_t team = epf_team_virtual(win.p, plan.total_bytes, 0, R);
  epf_ll_launch_t L = epf_ll_launch_make(&plan, team, state.as<epf_ll_state_t>(), g_rec_d, 1);
  L.threads = (int32_t)c.threads;
  L.blocks_per_rank = (int32_t)c.bpr;
  launched(epf_ll_state_reset(&L, g_stream), "epf_ll_state_reset");
  Grid lg_dispatch, lg_combine;
  lg_dispatch.ranks = lg_combine.ranks = R;
  lg_dispatch.bpr = lg_combine.bpr = c.bpr;
  lg_dispatch.threads = lg_combine.threads = c.threads ? (int)c.threads : EPF_LL_DEFAULT_THREADS;
  lg_dispatch.smem = lg_combine.smem = epf_ll_smem_bytes(&plan, lg_dispatch.threads);
  lg_dispatch.kernel = rm ? (const void*)epf_ll_rm_dispatch_kernel : (const void*)epf_ll_dispatch_kernel;
  lg_combine.kernel = rm ? (const void*)epf_ll_rm_combine_kernel : (const void*)epf_ll_combine_kernel;
  Grid lg_bdispatch = lg_dispatch, lg_bcombine = lg_combine; /* the backward's kernels */
  lg_bdispatch.kernel = rm ? (const void*)epf_ll_rm_combine_backward_kernel : (const void*)epf_ll_combine_backward_kernel;
  lg_bcombine.kernel = rm ? (const void*)epf_ll_rm_dispatch_backward_kernel : (const void*)epf_ll_dispatch_backward_kernel;
  /* c.bwd on a plan the backward refuses (only a forced --case draws that): the refusal is checked */
  const bool bwd = c.bwd && epf_ll_backward_check(&plan) == EPF_OK;

  epf_ll_dispatch_args_t da;
  memset(&da, 0, sizeof(da));
  da.x = x.p;
  da.topk_idx = ids.p;
  da.topk_weights = w.as<float>();
  da.index_type = it;
  da.recv_counts = counts.as<int32_t>();
  da.expert_counts = ecounts.as<int32_t>();
  da.packed_x = c.packed ? px.p : NULL;
  da.packed_scales = c.packed ? ps.p : NULL;
  da.packed_meta = c.packed ? pm.as<epf_recv_meta_em_t>() : NULL;
  da.round = round.as<uint32_t>();
  epf_ll_dispatch_args_t dv = da; /* rank-major: the view, by epf_ll_expand when not by the receive half */
  dv.packed_x = px.p;
  dv.packed_scales = ps.p;
  dv.packed_meta = pm.as<epf_recv_meta_em_t>();
  epf_ll_combine_args_t ca;
  memset(&ca, 0, sizeof(ca));
  ca.y = llref_y_in_place((int)c.y) ? NULL : y.p;
  ca.recv_counts = counts.as<int32_t>();
  ca.topk_idx = ids.p;
  ca.topk_weights = w.as<float>();
  ca.out = out.p;
  ca.index_type = it;
  ca.y_layout = (int32_t)c.y;

  const uint64_t tk = epf_ll_buffer_bytes(&plan, EPF_LL_BUF_TOPK_IDX, it) / (it == EPF_INDEX_INT64 ? 8 : 4);
  std::vector<uint16_t> hout((size_t)R * Tm * H), want((size_t)R * Tm * H);
  char msg[LLREF_MSG];
  for (int rd = 0; rd < c.rounds; ++rd) {
    const uint32_t epoch = bwd ? 2u * (uint32_t)rd + 1u : (uint32_t)rd + 1u; /* bwd: a backward round after each */
    const int T = g.pm(400) ? Tm : (int)g.in(0, Tm); /* one T per launch; a new one each round */
    std::vector<int> Tv((size_t)R, T);
    gen_ids(g, c, R, Tm, K, E, Tv, in.htopk);
    for (size_t i = 0; i < (size_t)R * Tm * H; ++i) in.hx[i] = gen_x(g);
    for (size_t i = 0; i < (size_t)R * Tm * K; ++i) in.hw[i] = gen_w(g);
    in.T = T;
    if (c.pay != EPF_PAYLOAD_BF16)
      for (int s = 0; s < R; ++s)
        for (int t = 0; t < T; ++t) llref_quantize_row(&in, s, t);
    da.num_tokens = T;
    ca.num_tokens = T;
    upload_ids(ids.p, in.htopk, (size_t)R * tk, c.idx64 != 0);
    h2d(x.p, in.hx, (size_t)R * Tm * H * 2);
    h2d(w.p, in.hw, (size_t)R * Tm * K * 4);
    for (int r = 0; r < R; ++r)
      CK(rm ? llrm_poison_window(&plan, win.c() + (uint64_t)r * plan.total_bytes, epoch, g_stream)
            : llref_poison_window(&plan, win.c() + (uint64_t)r * plan.total_bytes, epoch, g_stream));
    for (Dev* b : {&counts, &ecounts, &px, &ps, &pm, &round, &y, &out})
      if (b->p != nullptr) d_set(b->p, POISON, b->n);
    sync_or_die("uploads and poisoning");

    if (c.split) {
      launched(epf_ll_dispatch(&L, &da, EPF_LL_SEND, g_stream), "epf_ll_dispatch (send)", lg_dispatch);
      launched(epf_ll_dispatch(&L, &da, EPF_LL_RECV, g_stream), "epf_ll_dispatch (receive)", lg_dispatch);
    } else {
      launched(epf_ll_dispatch(&L, &da, EPF_LL_BOTH, g_stream), "epf_ll_dispatch", lg_dispatch);
    }
    if (rm && !c.packed) launched(epf_ll_expand(&L, &dv, g_stream), "epf_ll_expand");
    sync_or_die("the LL dispatch");
    LlRef ref;
    llref_dispatch(&in, 0u, &ref.r);
    if (rm) { /* rows, metadata and the view against the rank-major reference */
      llrm_ref_t rr;
      llrm_dispatch(&in, Tv.data(), 0u, &rr);
      for (int d = 0; d < R; ++d) {
        llref_rank_bufs_t b;
        b.win = win.c() + (uint64_t)d * plan.total_bytes;
        b.recv_counts = counts.as<int32_t>() + (size_t)d * (E / R) * R;
        b.expert_counts = ecounts.as<int32_t>() + (size_t)d * (E / R);
        b.round = round.as<uint32_t>() + d;
        b.packed_x = px.c() + (uint64_t)d * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_PACKED_X, EPF_INDEX_DEFAULT);
        b.packed_scales = ps.p ? ps.c() + (uint64_t)d * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_PACKED_SCALES, EPF_INDEX_DEFAULT) : NULL;
        b.packed_meta = (const epf_recv_meta_em_t*)(pm.c() + (uint64_t)d * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_PACKED_META, EPF_INDEX_DEFAULT));
        if (llrm_check_dispatch_rank(&in, &plan, &rr, d, &b, epoch, 1, 1, "rank-major dispatch", msg) != 0) {
          llrm_free(&rr);
          FAIL("%s", msg);
        }
      }
      llrm_free(&rr);
    }
    g_st.tokens += (int64_t)R * T;
    g_st.dropped += ref.r.dropped;
    for (size_t i = 0; i < (size_t)R * (E / R) * R; ++i) g_st.copies += ref.r.counts[i];
    for (int s = 0; s < R; ++s)
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k) {
          const int64_t* row = in.htopk + ((size_t)s * Tm + t) * K;
          bool rep = false;
          for (int q = 0; q < k && row[k] >= 0 && row[k] < E; ++q) rep = rep || row[q] == row[k];
          g_st.repeats += rep;
        }
    for (int d = 0; d < R && !rm; ++d) {
      llref_rank_bufs_t b;
      b.win = win.c() + (uint64_t)d * plan.total_bytes;
      b.recv_counts = counts.as<int32_t>() + (size_t)d * (E / R) * R;
      b.expert_counts = ecounts.as<int32_t>() + (size_t)d * (E / R);
      b.round = round.as<uint32_t>() + d;
      b.packed_x = c.packed ? px.c() + (uint64_t)d * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_PACKED_X, EPF_INDEX_DEFAULT) : NULL;
      b.packed_scales = c.packed && ps.p ? ps.c() + (uint64_t)d * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_PACKED_SCALES, EPF_INDEX_DEFAULT) : NULL;
      b.packed_meta = c.packed ? pm.as<epf_recv_meta_em_t>() + (uint64_t)d * plan.recv_capacity : NULL;
      if (llref_check_dispatch_rank(&in, &plan, &ref.r, d, &b, epoch, 1, c.packed != 0, "dispatch", msg) != 0)
        FAIL("%s", msg);
    }

    llref_experts_kernel<<<dim3(256, (unsigned)R), 256, 0, g_stream>>>(
        plan, win.c(), 0, round.as<uint32_t>(), counts.as<int32_t>(), px.c(), ps.as<uint8_t>(), y.as<uint16_t>(),
        rm || (c.packed && c.y == EPF_LL_Y_PACKED) ? 1 : 0, rm && c.y == EPF_LL_Y_PACKED_PULL ? EPF_LL_Y_PACKED : (int)c.y,
        (int)c.ident, -1);
    CK(cudaGetLastError());
    if (c.split) {
      launched(epf_ll_combine(&L, &ca, EPF_LL_SEND, g_stream), "epf_ll_combine (send)", lg_combine);
      launched(epf_ll_combine(&L, &ca, EPF_LL_RECV, g_stream), "epf_ll_combine (receive)", lg_combine);
    } else {
      launched(epf_ll_combine(&L, &ca, EPF_LL_BOTH, g_stream), "epf_ll_combine", lg_combine);
    }
    sync_or_die("experts + the LL combine");
    d2h(hout.data(), out.p, hout.size() * 2);
    par_for(R, [&](int s) {
      if (rm)
        llrm_combine(&in, Tv.data(), 0u, (int)c.ident, s, want.data());
      else
        llref_combine(&in, 0u, (int)c.ident, s, want.data());
    });
    for (int s = 0; s < R; ++s) {
      const uint16_t* o = hout.data() + (size_t)s * Tm * H;
      for (int t = 0; t < T; ++t) {
        const uint16_t* gt = o + (size_t)t * H;
        const uint16_t* wt = want.data() + ((size_t)s * Tm + t) * H;
        if (memcmp(gt, wt, (size_t)H * 2) != 0) {
          int h = 0;
          while (gt[h] == wt[h]) ++h;
          std::string is;
          for (int k = 0; k < K; ++k) is += strf("%s%lld", k ? "," : "", (long long)in.htopk[((size_t)s * Tm + t) * K + k]);
          FAIL("LL combine: rank %d token %d h %d: 0x%04x, want 0x%04x (ids %s)", s, t, h, gt[h], wt[h], is.c_str());
        }
      }
      expect_poison((const uint8_t*)(o + (size_t)T * H), (size_t)(Tm - T) * H * 2, "LL combine output", s);
    }
    check_record(ref.r.dropped, 0u, strf("round %d", rd).c_str());
    if (bwd)
      ll_backward_round(c, g, plan, L, in, win, x, counts, ecounts, px, ps, pm, round, y, out, wgr, twg, da, dv, ca,
                        lg_bdispatch, lg_bcombine, epoch + 1u, ref.r.dropped);
    else if (c.bwd)
      ll_backward_refused(plan, L, da, ca);
  }
}

/* ============================================================================================ */
/* the driver                                                                                    */
/* ============================================================================================ */

enum { RES_PASS = 0, RES_FAIL = 1, RES_SKIP = 2 };

static int run_one(const Case& c, uint64_t seed, std::string* why) {
  g_st = Stats();
  try {
    epf_error_clear(g_rec_h);
    switch ((int)c.kind) {
      case KIND_ROUTE: run_route(c, seed); break;
      case KIND_HT: run_ht(c, seed); break;
      case KIND_LL: run_ll(c, seed); break;
      default: throw Fail{"unknown kind"};
    }
  } catch (Fail& f) {
    sync_or_die("draining after a failure");
    *why = f.msg;
    return RES_FAIL;
  } catch (Skip& s) {
    sync_or_die("draining after a skip");
    *why = s.msg;
    return RES_SKIP;
  } catch (std::exception& e) {
    sync_or_die("draining after a failure");
    *why = strf("exception: %s", e.what());
    return RES_FAIL;
  }
  return RES_PASS;
}

static void usage(const char* argv0) {
  printf("usage: %s [--seconds N] [--seed S] [--kinds route,ht,ll] [--sanitize] [--verbose]\n"
         "       %s --case '<key=value ...>' --seed <data seed>\n"
         "  --seconds N   wall-time budget (default 60, --sanitize 120; env EPF_SHAPES_SECONDS)\n"
         "  --seed S      the run's seed (default: EPF_TEST_SEED, else fresh); with --case the data seed\n"
         "  --case STR    run exactly one configuration (as printed in a REPRO line)\n"
         "  --kinds LIST  draw only these kinds\n"
         "  --sanitize    small shapes only (R <= 6, T <= 64, H <= 2048), for compute-sanitizer\n"
         "  --list N      print the first N configurations the seed draws (no GPU needed)\n"
         "  --exclude STR do not run drawn configurations that match every key=value of STR (repeatable),\n"
         "                e.g. --exclude 'kind=ht lay=rm swz=1'\n",
         argv0, argv0);
}

int main(int argc, char** argv) {
  double budget = -1.0;
  const char* case_text = NULL;
  const char* seed_text = NULL;
  int sanitize = 0, list = 0;
  bool kinds[KIND_COUNT] = {true, true, true};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) budget = atof(argv[++i]);
    else if (a == "--seed" && i + 1 < argc) seed_text = argv[++i];
    else if (a == "--case" && i + 1 < argc) case_text = argv[++i];
    else if (a == "--sanitize") sanitize = 1;
    else if (a == "--verbose") g_verbose = 1;
    else if (a == "--list" && i + 1 < argc) list = atoi(argv[++i]);
    else if (a == "--exclude" && i + 1 < argc) {
      Exclude x;
      if (!case_parse(argv[++i], &x.c, &x.set)) return 2;
      g_excludes.push_back(x);
    }
    else if (a == "--kinds" && i + 1 < argc) {
      const std::string l = argv[++i];
      for (int k = 0; k < KIND_COUNT; ++k) kinds[k] = l.find(k_kind_names[k]) != std::string::npos;
    } else if (a == "--help" || a == "-h") {
      usage(argv[0]);
      return 0;
    } else {
      usage(argv[0]);
      return 2;
    }
  }
  if (!kinds[KIND_ROUTE] && !kinds[KIND_HT] && !kinds[KIND_LL]) {
    usage(argv[0]);
    return 2;
  }
  if (budget < 0) {
    const char* env = getenv("EPF_SHAPES_SECONDS");
    budget = env != NULL ? atof(env) : sanitize ? 120.0 : 60.0;
  }
  Case one;
  if (case_text != NULL && !case_parse(case_text, &one)) return 2;

  setvbuf(stdout, NULL, _IOLBF, 0);
  /* the seed first */
  uint64_t seed;
  if (seed_text != NULL) {
    seed = strtoull(seed_text, NULL, 0);
    printf("EPF_TEST_SEED=%llu\n", (unsigned long long)seed);
  } else {
    seed = epf_test_seed(); /* prints it */
  }
  if (sanitize) {
    g_watchdog_s = 300.0;
    g_timeout_ns = 60000000000ull;
  }
  const Limits lim = sanitize ? Limits{6, 64, 2048, (uint64_t)1 << 30, 2e6} : Limits{16, 4099, 16512, (uint64_t)4 << 30, 4e7};
  if (list > 0) { /* no GPU needed: the configurations this seed draws (and a parse round trip) */
    Rng master(seed);
    g_optin_smem = 227 * 1024;
    for (int i = 0; i < list; ++i) {
      const int64_t u = master.in(0, 99);
      const int kind = u < 25 ? KIND_ROUTE : u < 70 ? KIND_HT : KIND_LL;
      const uint64_t dseed = master.next();
      Rng dg(master.next());
      try {
        const Case c = kind == KIND_ROUTE ? draw_route(dg, lim) : kind == KIND_HT ? draw_ht(dg, lim) : draw_ll(dg, lim);
        if (excluded(c)) continue;
        Case back;
        const bool ok = case_parse(case_str(c).c_str(), &back) && case_str(back) == case_str(c);
        const epf_plan_t p = plan_of(c);
        printf("%s --case '%s' --seed %llu   # %.1f MiB%s\n", argv[0], case_str(c).c_str(), (unsigned long long)dseed,
               (double)(kind == KIND_HT ? ht_bytes(c, p) : kind == KIND_LL ? ll_bytes(c, p) : (uint64_t)c.R * p.total_bytes) /
                   1048576.0,
               ok ? "" : "  PARSE ROUND TRIP FAILED");
      } catch (Fail& f) {
        printf("drawing failed: %s\n", f.msg.c_str());
      }
    }
    return 0;
  }
  {
    const int rc = epf_test_gpus_or_skip(1);
    if (rc) return rc;
  }
  CK(cudaGetDevice(&g_device));
  CK(cudaDeviceGetAttribute(&g_optin_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, g_device));
  CK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, g_device));
  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  CK(cudaHostAlloc((void**)&g_rec_h, sizeof(epf_error_record_t), cudaHostAllocMapped));
  CK(cudaHostGetDevicePointer((void**)&g_rec_d, g_rec_h, 0));
  CK(cudaHostAlloc((void**)&g_total_h, EPF_MAX_RANKS * sizeof(int64_t), cudaHostAllocMapped));
  CK(cudaHostGetDevicePointer((void**)&g_total_d, g_total_h, 0));
  epf_error_clear(g_rec_h);

  if (case_text != NULL) {
    std::string why;
    g_repro = strf("%s --case '%s' --seed %llu%s", argv[0], case_str(one).c_str(), (unsigned long long)seed,
                   sanitize ? " --sanitize" : "");
    printf("case: %s\n", case_str(one).c_str());
    const double t0 = now_s();
    const int res = run_one(one, seed, &why);
    printf("%s %.2fs%s%s  [tokens %lld copies %lld repeats %lld dropped %lld overflow %lld]\n",
           res == RES_PASS ? "PASS" : res == RES_SKIP ? "SKIP" : "FAIL", now_s() - t0, why.empty() ? "" : ": ", why.c_str(),
           (long long)g_st.tokens, (long long)g_st.copies, (long long)g_st.repeats, (long long)g_st.dropped,
           (long long)g_st.overflow);
    if (res == RES_FAIL) printf("  REPRO: %s\n", g_repro.c_str());
    return res == RES_FAIL ? 1 : 0;
  }

  Rng master(seed);
  const double start = now_s();
  int ran[KIND_COUNT] = {0, 0, 0}, passed[KIND_COUNT] = {0, 0, 0}, failed[KIND_COUNT] = {0, 0, 0},
      skipped[KIND_COUNT] = {0, 0, 0};
  std::vector<std::string> failures;
  int n = 0;
  while (now_s() - start < budget) {
    int kind;
    do {
      const int64_t u = master.in(0, 99);
      kind = u < 25 ? KIND_ROUTE : u < 70 ? KIND_HT : KIND_LL;
    } while (!kinds[kind]);
    const uint64_t dseed = master.next();
    Case c;
    std::string why;
    int res;
    try {
      Rng dg(master.next());
      c = kind == KIND_ROUTE ? draw_route(dg, lim) : kind == KIND_HT ? draw_ht(dg, lim) : draw_ll(dg, lim);
      if (excluded(c)) continue;
    } catch (Fail& f) {
      printf("[%4d] %-5s FAIL   drawing a configuration: %s\n", n, k_kind_names[kind], f.msg.c_str());
      ++ran[kind];
      ++failed[kind];
      failures.push_back(strf("drawing: %s", f.msg.c_str()));
      ++n;
      continue;
    }
    g_repro = strf("%s --case '%s' --seed %llu%s", argv[0], case_str(c).c_str(), (unsigned long long)dseed,
                   sanitize ? " --sanitize" : "");
    if (g_verbose) printf("[%4d] %-5s ...    %s\n", n, k_kind_names[kind], case_str(c).c_str());
    const double t0 = now_s();
    res = run_one(c, dseed, &why);
    ++ran[kind];
    if (res == RES_PASS) ++passed[kind];
    if (res == RES_FAIL) ++failed[kind];
    if (res == RES_SKIP) ++skipped[kind];
    printf("[%4d] %-5s %s %6.2fs  %s  seed=%llu  [tokens %lld copies %lld repeats %lld dropped %lld overflow %lld]\n", n,
           k_kind_names[kind], res == RES_PASS ? "PASS" : res == RES_SKIP ? "SKIP" : "FAIL", now_s() - t0, case_str(c).c_str(),
           (unsigned long long)dseed, (long long)g_st.tokens, (long long)g_st.copies, (long long)g_st.repeats, (long long)g_st.dropped,
           (long long)g_st.overflow);
    if (res == RES_SKIP) printf("         skipped: %s\n", why.c_str());
    if (res == RES_FAIL) {
      printf("         reason: %s\n         REPRO: %s\n", why.c_str(), g_repro.c_str());
      failures.push_back(g_repro + "\n           (" + why + ")");
    }
    ++n;
  }
  printf("\ntest_shapes: seed %llu, %d configurations in %.1f s\n", (unsigned long long)seed, n, now_s() - start);
  for (int k = 0; k < KIND_COUNT; ++k)
    printf("  %-5s ran %d, passed %d, failed %d, skipped %d\n", k_kind_names[k], ran[k], passed[k], failed[k], skipped[k]);
  if (!failures.empty()) {
    const size_t show = std::min<size_t>(failures.size(), 25);
    printf("FAILED (%zu configurations; the first %zu again):\n", failures.size(), show);
    for (size_t i = 0; i < show; ++i) printf("  %s\n", failures[i].c_str());
    return 1;
  }
  printf("all passed\n");
  return 0;
}
