/* test_mg_ll — low-latency dispatch + combine (ll/kernels.cuh launchers, virtual_ranks = 0) over
 * real NCCL on every visible GPU, one thread per GPU (tests/common/epf_mg.h), against the CPU
 * reference of tests/common/epf_ll_ref.cuh (the one tests/gpu/test_ll.cu checks virtual ranks
 * with). Needs 2 GPUs (else exit 77, "Not Run"); EPF_MG_GPUS=1 makes a 1-rank smoke run. Hidden
 * 7168, top-8 of 256 experts (E = 256 - 256 % R, so that E % R == 0), fresh random inputs from
 * EPF_TEST_SEED (printed). Rank 0's thread draws the inputs of every rank; each thread uploads its
 * rank's share, poisons every output and its window rows of the round, and checks its own rank.
 *   1. dispatch + combine: T in {1, 128} x {BF16, MXFP8 (compact / swizzled scales)}; zero-copy
 *      and packed receive; expert stage; push combine (y fixed, y packed) and, with BF16, pull
 *      (experts in place, EPF_LL_Y_IN_PLACE_PULL); the MXFP8 combine pulled over the LSA window
 *      from the expert rank's EXPERT_OUT (the default) and pushed (EPF_FLAG_COMBINE_PUSH), every
 *      y layout; fused and split halves; int32 / int64 ids;
 *      ids outside [-1, E) dropped and counted. Counts, expert counts, round, every received row,
 *      scale and metadata row, the packed copy, and the combine output bit-exact.
 *   2. back to back: bursts of 5 and 6 rounds enqueued with no host sync between them (ranks
 *      run ahead of each other by up to a round; both parities), new ids and token counts every
 *      round, push / pull / in place / packed mixed; every round's outputs checked afterwards.
 *   3. CUDA graphs: one round captured per rank (packed receive, push combine, dispatch and
 *      combine in split halves; and zero copy with the pull combine), each replayed 10 times
 *      with fresh inputs written into the captured buffers.
 *   4. fault injection, EPF_FLAG_FAULT_TOLERANT, timeout 200 ms: the last rank's thread stops
 *      launching (neither dispatch nor combine); the others finish within the timeout, find it
 *      in their error record while their round still runs (epf_error_read, no device sync), mask
 *      it, and are exact for the live ranks' tokens; the next round skips it at once;
 *      epf_ll_mask_clean re-admits it and the next rounds (fused, split after
 *      epf_ll_mask_update, pull) are exact; a pull round with the rank silent again. Without the
 *      flag: timeouts recorded, nobody masked, results as if absent, the clean re-synchronises.
 * Threads report into their arg struct (no cmocka calls off the main thread); each cmocka test
 * asserts on every rank after the join. Rank 0 prints one line per case.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "epf_cmocka.h"

#include "epf_ll_ref.cuh"
#include "epf_mg.h"
#include "epf_test_gpu.h"
#include "epfuse/epfuse.cuh"
#include "epfuse/ll/kernels.cuh"

#define MG_H 7168
#define MG_K 8
#define MG_SETS 6                          /* operand sets: rounds of one burst */
#define MG_TIMEOUT_NS 10000000000ull       /* rounds where every rank takes part: 10 s */
#define MG_FT_TIMEOUT_NS 200000000ull      /* the fault cases: 200 ms */
#define MG_GRAPH_REPLAYS 10
#define MG_BARRIER_S 300                   /* a host barrier that waits longer than this breaks */

static int g_R;         /* ranks = GPUs */
static uint64_t g_seed; /* advanced by rank 0's thread, test after test */

static int mg_experts(int R) { return 256 - 256 % R; }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ============================================================================================ */
/* threads: shared state, a breakable barrier, failure reports                                   */
/* ============================================================================================ */

/* A host barrier that also carries the "stop" decision: the last thread to arrive snapshots the
 * abort flag, so every thread leaves with the same answer. A thread that waits MG_BARRIER_S
 * breaks it (a rank's thread stopped arriving); from then on every wait returns "stop" at once. */
typedef struct mg_barrier {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int n, count, broken, abort_flag, snapshot;
  unsigned gen;
} mg_barrier_t;

typedef struct mg_case {
  int Tmax, H, K, payload, scale_layout, topk64;
  uint32_t flags;
  uint64_t timeout_ns;
} mg_case_t;

/* a test-only bit of mg_case_t.flags (never passed to the library): the MXFP8 combine payload (it
 * pulls unless the flags also hold EPF_FLAG_COMBINE_PUSH); without it the combine is BF16 */
#define MG_CASE_MX_COMBINE 0x80000000u

struct mg_ctx;

typedef struct mg_shared {
  int R;
  ncclUniqueId id;
  uint64_t window_bytes;
  void (*body)(struct mg_ctx*);
  mg_barrier_t bar;
  uint64_t seed;           /* rank 0's generator */
  llref_in_t in[MG_SETS];  /* inputs of every rank; rank 0 writes them between syncs */
} mg_shared_t;

typedef struct mg_arg {
  mg_shared_t* sh;
  int rank;
  int failed;
  char msg[LLREF_MSG + 128]; /* the first failure */
} mg_arg_t;

typedef struct mg_ctx {
  mg_shared_t* sh;
  mg_arg_t* a;
  int rank, R;
  epf_mg_rank_t m;
  cudaStream_t s;
  float* sink;
} mg_ctx_t;

/* Record this thread's first failure and ask every thread to stop at the next mg_sync. -1. */
static int mg_fail(mg_ctx_t* c, const char* fmt, ...) {
  va_list ap;
  if (!c->a->failed) {
    va_start(ap, fmt);
    vsnprintf(c->a->msg, sizeof(c->a->msg), fmt, ap);
    va_end(ap);
    c->a->failed = 1;
  }
  pthread_mutex_lock(&c->sh->bar.mu);
  c->sh->bar.abort_flag = 1;
  pthread_mutex_unlock(&c->sh->bar.mu);
  return -1;
}

/* Every thread arrives; nonzero (on every thread alike) when the test must stop. Rule of the
 * bodies: every thread makes the same sequence of mg_sync calls, and a function returns "stop"
 * only straight from an mg_sync result; failures in between are recorded (mg_fail) and only skip
 * the thread's own work up to the next mg_sync. */
static int mg_sync(mg_ctx_t* c) {
  mg_barrier_t* b = &c->sh->bar;
  int rc, broke = 0;
  pthread_mutex_lock(&b->mu);
  if (b->broken) {
    pthread_mutex_unlock(&b->mu);
    return 1;
  }
  {
    const unsigned gen = b->gen;
    if (++b->count == b->n) {
      b->count = 0;
      b->snapshot = b->abort_flag;
      b->gen++;
      pthread_cond_broadcast(&b->cv);
      rc = b->snapshot;
    } else {
      struct timespec dl;
      clock_gettime(CLOCK_REALTIME, &dl);
      dl.tv_sec += MG_BARRIER_S;
      while (b->gen == gen && !b->broken)
        if (pthread_cond_timedwait(&b->cv, &b->mu, &dl) == ETIMEDOUT && b->gen == gen && !b->broken) {
          b->broken = 1;
          b->abort_flag = 1;
          broke = 1;
          pthread_cond_broadcast(&b->cv);
        }
      rc = b->gen != gen ? b->snapshot : 1;
    }
  }
  pthread_mutex_unlock(&b->mu);
  if (broke)
    (void)mg_fail(c, "rank %d: host barrier timed out after %d s (a rank's thread stopped)", c->rank, MG_BARRIER_S);
  return rc;
}

/* checks that record and return -1 from a helper (between two mg_sync calls) */
#define MG_CUDA(c, call)                                                                                            \
  do {                                                                                                              \
    cudaError_t mg_e_ = (call);                                                                                     \
    if (mg_e_ != cudaSuccess)                                                                                       \
      return mg_fail(c, "rank %d: %s:%d: %s -> %s (%s)", (c)->rank, __FILE__, __LINE__, #call, cudaGetErrorName(mg_e_), \
                     cudaGetErrorString(mg_e_));                                                                    \
  } while (0)
#define MG_EPF(c, call)                                                                                            \
  do {                                                                                                             \
    epf_status_t mg_s_ = (call);                                                                                   \
    if (mg_s_ != EPF_OK)                                                                                           \
      return mg_fail(c, "rank %d: %s:%d: %s -> %s", (c)->rank, __FILE__, __LINE__, #call, epf_status_name(mg_s_)); \
  } while (0)
#define MG_TRUE(c, cond, ...)                  \
  do {                                         \
    if (!(cond)) return mg_fail(c, __VA_ARGS__); \
  } while (0)

/* ============================================================================================ */
/* the case fixture of one rank                                                                  */
/* ============================================================================================ */

typedef struct mg_fix {
  mg_case_t cs;
  epf_plan_t plan;
  int nsets;
  epf_ll_state_t* state;
  epf_ll_launch_t L;
  /* per operand set: this rank's buffers (epf_ll_buffer_bytes) */
  uint16_t* x[MG_SETS];
  void* topk[MG_SETS];
  float* w[MG_SETS];
  int32_t* recv_counts[MG_SETS];
  int32_t* expert_counts[MG_SETS];
  uint32_t* round[MG_SETS];
  uint16_t* out[MG_SETS];
  /* shared by the sets (used within a round, stream-ordered) */
  void* packed_x;
  void* packed_scales;
  epf_recv_meta_em_t* packed_meta;
  uint16_t* y;
  uint32_t* d_masks; /* [EPF_MASK_WORDS] */
} mg_fix_t;

static epf_status_t mg_plan(const mg_case_t* cs, int R, epf_plan_t* out) {
  epf_config_t c = EPF_CONFIG_INIT;
  epf_status_t st;
  c.nranks = R;
  c.num_experts = mg_experts(R);
  c.top_k = cs->K;
  c.hidden = cs->H;
  c.max_tokens_per_rank = cs->Tmax;
  c.mode = EPF_MODE_LL;
  c.payload = cs->payload;
  c.combine_payload = (cs->flags & MG_CASE_MX_COMBINE) ? EPF_PAYLOAD_MXFP8 : EPF_PAYLOAD_BF16;
  c.scale_layout = cs->scale_layout;
  c.flags = cs->flags & ~MG_CASE_MX_COMBINE;
  c.timeout_ns = cs->timeout_ns;
  st = epf_plan_compute(&c, out);
  return st == EPF_OK ? epf_ll_plan_check(out) : st;
}

static const char* payload_name(int p) {
  return p == EPF_PAYLOAD_MXFP8 ? "mxfp8" : p == EPF_PAYLOAD_FP8_128 ? "fp8x128" : "bf16";
}

static int mg_fix_setup(mg_ctx_t* c, mg_fix_t* f) {
  const mg_case_t* cs = &f->cs;
  const epf_plan_t* p = &f->plan;
  MG_EPF(c, mg_plan(cs, c->R, &f->plan));
  MG_TRUE(c, p->total_bytes <= c->m.win.bytes, "rank %d: plan needs %llu window bytes, the window has %llu", c->rank,
          (unsigned long long)p->total_bytes, (unsigned long long)c->m.win.bytes);
  MG_TRUE(c, c->m.team.nranks == c->R && c->m.team.rank == c->rank,
          "rank %d: the NCCL LSA team is rank %d of %d, want %d of %d (GPUs not all peer-connected?)", c->rank,
          c->m.team.rank, c->m.team.nranks, c->rank, c->R);
  if (c->rank == 0)
    for (int i = 0; i < f->nsets; ++i)
      MG_TRUE(c,
              llref_in_init(&c->sh->in[i], c->R, cs->Tmax, cs->H, cs->K, mg_experts(c->R), cs->payload,
                            p->combine_payload, p->flags, (int)p->scale_bytes_per_row) == 0,
              "rank 0: out of host memory for the inputs");
#define MG_ALLOC(ptr, which) MG_CUDA(c, cudaMalloc((void**)&(ptr), epf_ll_buffer_bytes(p, which, cs->topk64 ? EPF_INDEX_INT64 : EPF_INDEX_INT32)))
  for (int i = 0; i < f->nsets; ++i) {
    MG_ALLOC(f->x[i], EPF_LL_BUF_X);
    MG_ALLOC(f->topk[i], EPF_LL_BUF_TOPK_IDX);
    MG_ALLOC(f->w[i], EPF_LL_BUF_TOPK_WEIGHTS);
    MG_ALLOC(f->recv_counts[i], EPF_LL_BUF_RECV_COUNTS);
    MG_ALLOC(f->expert_counts[i], EPF_LL_BUF_EXPERT_COUNTS);
    MG_ALLOC(f->round[i], EPF_LL_BUF_ROUND);
    MG_ALLOC(f->out[i], EPF_LL_BUF_X);
  }
  MG_ALLOC(f->packed_x, EPF_LL_BUF_PACKED_X);
  if (p->scale_bytes_per_row > 0) MG_ALLOC(f->packed_scales, EPF_LL_BUF_PACKED_SCALES);
  MG_ALLOC(f->packed_meta, EPF_LL_BUF_PACKED_META);
  MG_ALLOC(f->y, EPF_LL_BUF_Y);
#undef MG_ALLOC
  MG_CUDA(c, cudaMalloc((void**)&f->state, sizeof(epf_ll_state_t)));
  MG_CUDA(c, cudaMalloc((void**)&f->d_masks, EPF_MASK_WORDS * 4));
  /* a fresh start: zeroed window (no epochs from an earlier case), epochs 0, everyone active.
   * Safe: every peer finished its rounds before the mg_sync that led here, and none starts
   * before the mg_sync after it. */
  MG_CUDA(c, cudaMemsetAsync(c->m.win.ptr, 0, c->m.win.bytes, c->s));
  f->L = epf_ll_launch_make(p, c->m.team, f->state, c->m.rec_d, /*virtual_ranks=*/0);
  MG_EPF(c, epf_ll_state_reset(&f->L, c->s));
  MG_CUDA(c, cudaStreamSynchronize(c->s));
  epf_error_clear(c->m.rec_h);
  return 0;
}

/* Start a case on every rank. -1 (uniform): stop; call mg_fix_end all the same. */
static int mg_fix_begin(mg_ctx_t* c, mg_fix_t* f, const mg_case_t* cs, int nsets) {
  memset(f, 0, sizeof(*f));
  f->cs = *cs;
  f->nsets = nsets;
  if (mg_sync(c)) return -1; /* everybody finished the previous case */
  (void)mg_fix_setup(c, f);
  return mg_sync(c) ? -1 : 0;
}

/* End a case on every rank; 0 when every rank is still fine. */
static int mg_fix_end(mg_ctx_t* c, mg_fix_t* f) {
  cudaError_t e = cudaStreamSynchronize(c->s), e2;
  int rc;
#define MG_FREE(ptr)                         \
  do {                                       \
    e2 = cudaFree(ptr);                      \
    if (e == cudaSuccess) e = e2;            \
  } while (0)
  for (int i = 0; i < MG_SETS; ++i) {
    MG_FREE(f->x[i]);
    MG_FREE(f->topk[i]);
    MG_FREE(f->w[i]);
    MG_FREE(f->recv_counts[i]);
    MG_FREE(f->expert_counts[i]);
    MG_FREE(f->round[i]);
    MG_FREE(f->out[i]);
  }
  MG_FREE(f->packed_x);
  MG_FREE(f->packed_scales);
  MG_FREE(f->packed_meta);
  MG_FREE(f->y);
  MG_FREE(f->state);
  MG_FREE(f->d_masks);
#undef MG_FREE
  if (e != cudaSuccess) (void)mg_fail(c, "rank %d: end of case: %s", c->rank, cudaGetErrorName(e));
  rc = mg_sync(c); /* nobody reads the inputs any more */
  if (c->rank == 0)
    for (int i = 0; i < MG_SETS; ++i) llref_in_free(&c->sh->in[i]);
  memset(f, 0, sizeof(*f));
  return rc;
}

/* ============================================================================================ */
/* one rank's round: upload, poison, launch, check                                               */
/* ============================================================================================ */

typedef struct mg_round {
  int set;                /* operand set */
  int T, bad_ids;
  int split, packed, y_layout, identity;
  int silent;             /* this rank launches nothing (-1: everybody takes part) */
  cudaGraphExec_t graph;  /* replay this instead of enqueueing (NULL: enqueue) */
} mg_round_t;

/* this rank's share of input set `set` into its device buffers */
static int mg_upload(mg_ctx_t* c, mg_fix_t* f, int set) {
  const llref_in_t* in = &c->sh->in[set];
  const int Tmax = in->Tmax, H = in->H, K = in->K;
  const size_t r0 = (size_t)c->rank * Tmax;
  MG_CUDA(c, cudaMemcpyAsync(f->x[set], in->hx + r0 * H, (size_t)Tmax * H * 2, cudaMemcpyHostToDevice, c->s));
  MG_CUDA(c, cudaMemcpyAsync(f->w[set], in->hw + r0 * K, (size_t)Tmax * K * 4, cudaMemcpyHostToDevice, c->s));
  if (f->cs.topk64) {
    MG_CUDA(c, cudaMemcpyAsync(f->topk[set], in->htopk + r0 * K, (size_t)Tmax * K * 8, cudaMemcpyHostToDevice, c->s));
  } else {
    int32_t* t32 = (int32_t*)malloc((size_t)Tmax * K * 4);
    cudaError_t e;
    MG_TRUE(c, t32 != NULL, "rank %d: out of host memory", c->rank);
    for (size_t i = 0; i < (size_t)Tmax * K; ++i) t32[i] = (int32_t)in->htopk[r0 * K + i];
    e = cudaMemcpyAsync(f->topk[set], t32, (size_t)Tmax * K * 4, cudaMemcpyHostToDevice, c->s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->s);
    free(t32);
    MG_CUDA(c, e);
  }
  return 0;
}

/* poison set `set`'s outputs and the shared ones */
static int mg_poison_outputs(mg_ctx_t* c, mg_fix_t* f, int set) {
  const epf_plan_t* p = &f->plan;
#define MG_POISON(ptr, which) \
  MG_CUDA(c, cudaMemsetAsync(ptr, 0xEE, epf_ll_buffer_bytes(p, which, f->cs.topk64 ? EPF_INDEX_INT64 : EPF_INDEX_INT32), c->s))
  MG_POISON(f->recv_counts[set], EPF_LL_BUF_RECV_COUNTS);
  MG_POISON(f->expert_counts[set], EPF_LL_BUF_EXPERT_COUNTS);
  MG_POISON(f->round[set], EPF_LL_BUF_ROUND);
  MG_POISON(f->out[set], EPF_LL_BUF_X);
  MG_POISON(f->packed_x, EPF_LL_BUF_PACKED_X);
  MG_POISON(f->packed_meta, EPF_LL_BUF_PACKED_META);
  if (f->packed_scales != NULL) MG_POISON(f->packed_scales, EPF_LL_BUF_PACKED_SCALES);
  MG_POISON(f->y, EPF_LL_BUF_Y);
#undef MG_POISON
  return 0;
}

static epf_ll_dispatch_args_t mg_dargs(const mg_fix_t* f, int set, int T, int packed) {
  epf_ll_dispatch_args_t a;
  memset(&a, 0, sizeof(a));
  a.x = f->x[set];
  a.topk_idx = f->topk[set];
  a.topk_weights = f->w[set];
  a.num_tokens = T;
  a.index_type = f->cs.topk64 ? EPF_INDEX_INT64 : EPF_INDEX_INT32;
  a.recv_counts = f->recv_counts[set];
  a.expert_counts = f->expert_counts[set];
  a.packed_x = packed ? f->packed_x : NULL;
  a.packed_meta = packed ? f->packed_meta : NULL;
  a.packed_scales = packed ? f->packed_scales : NULL;
  a.round = f->round[set];
  return a;
}

static epf_ll_combine_args_t mg_cargs(const mg_fix_t* f, int set, int T, int y_layout) {
  epf_ll_combine_args_t a;
  memset(&a, 0, sizeof(a));
  a.y = llref_y_in_place(y_layout) ? NULL : f->y;
  a.recv_counts = f->recv_counts[set];
  a.topk_idx = f->topk[set];
  a.topk_weights = f->w[set];
  a.out = f->out[set];
  a.num_tokens = T;
  a.index_type = f->cs.topk64 ? EPF_INDEX_INT64 : EPF_INDEX_INT32;
  a.y_layout = y_layout;
  return a;
}

/* "other work" between split halves */
__global__ void mg_busy_kernel(float* sink, int iters) {
  float v = (float)threadIdx.x;
  for (int i = 0; i < iters; ++i) v = v * 1.0000001f + 0.5f;
  if (v == -1.0f) sink[0] = v;
}

/* Enqueue one round on c->s (capturable): dispatch (fused, or split with other work between),
 * the experts (llref_experts_kernel: this rank only), combine (fused or split). */
static int mg_enqueue(mg_ctx_t* c, mg_fix_t* f, const epf_ll_launch_t* L, const mg_round_t* r) {
  const epf_ll_dispatch_args_t da = mg_dargs(f, r->set, r->T, r->packed);
  const epf_ll_combine_args_t ca = mg_cargs(f, r->set, r->T, r->y_layout);
  if (r->split) {
    MG_EPF(c, epf_ll_dispatch(L, &da, EPF_LL_SEND, c->s));
    mg_busy_kernel<<<132, 128, 0, c->s>>>(c->sink, 2000);
    MG_CUDA(c, cudaGetLastError());
    MG_EPF(c, epf_ll_dispatch(L, &da, EPF_LL_RECV, c->s));
  } else {
    MG_EPF(c, epf_ll_dispatch(L, &da, EPF_LL_BOTH, c->s));
  }
  llref_experts_kernel<<<dim3(256, 1), 256, 0, c->s>>>(f->plan, (char*)c->m.win.ptr, c->rank, f->round[r->set],
                                                        f->recv_counts[r->set], (const char*)f->packed_x,
                                                        (const uint8_t*)f->packed_scales, f->y,
                                                        r->packed && r->y_layout == EPF_LL_Y_PACKED, r->y_layout,
                                                        r->identity, -1);
  MG_CUDA(c, cudaGetLastError());
  if (r->split) {
    MG_EPF(c, epf_ll_combine(L, &ca, EPF_LL_SEND, c->s));
    mg_busy_kernel<<<132, 128, 0, c->s>>>(c->sink, 2000);
    MG_CUDA(c, cudaGetLastError());
    MG_EPF(c, epf_ll_combine(L, &ca, EPF_LL_RECV, c->s));
  } else {
    MG_EPF(c, epf_ll_combine(L, &ca, EPF_LL_BOTH, c->s));
  }
  return 0;
}

/* Launch (or replay) a round and wait for it. poll: read the error record while the round runs
 * (epf_error_read, no sync) until it is valid or 10 s pass; *rec_async gets what was read and
 * *t_rec when. *dt: seconds from the launch to the end of the stream sync. */
static int mg_launch_wait(mg_ctx_t* c, mg_fix_t* f, const epf_ll_launch_t* L, const mg_round_t* r, double* dt,
                          int poll, epf_error_record_t* rec_async, double* t_rec, int* busy_at_rec) {
  const double t0 = now_s();
  if (r->graph != NULL)
    MG_CUDA(c, cudaGraphLaunch(r->graph, c->s));
  else if (mg_enqueue(c, f, L, r) != 0)
    return -1;
  if (poll) {
    memset(rec_async, 0, sizeof(*rec_async));
    for (;;) {
      epf_error_read(c->m.rec_h, rec_async);
      if (rec_async->valid || now_s() - t0 > 10.0) break;
    }
    *t_rec = now_s() - t0;
    *busy_at_rec = cudaStreamQuery(c->s) == cudaErrorNotReady;
    /* NotReady is no error; keep it from lingering as the last error, which the library's
     * launchers read after their launches (every launch above was already checked) */
    (void)cudaGetLastError();
  }
  MG_CUDA(c, cudaStreamSynchronize(c->s));
  *dt = now_s() - t0;
  return 0;
}

/* One round on every rank: rank 0 draws the inputs; every rank uploads its share, poisons its
 * outputs and its window rows of `epoch` (parity) and clears its error record; a sync (nobody
 * sends into a window before its owner poisoned it); then every rank but r->silent launches and
 * waits. -1 (uniform): stop. A failure of this rank's launch is recorded (stop at the next sync). */
static int mg_round(mg_ctx_t* c, mg_fix_t* f, const epf_ll_launch_t* L, const mg_round_t* r, uint32_t epoch,
                    double* dt, int poll, epf_error_record_t* rec_async, double* t_rec, int* busy_at_rec) {
  *dt = 0.0;
  if (mg_sync(c)) return -1; /* nobody reads the inputs of the last round any more */
  if (c->rank == 0) llref_fill(&c->sh->in[r->set], r->T, r->bad_ids, &c->sh->seed);
  if (mg_sync(c)) return -1;
  if (mg_upload(c, f, r->set) == 0 && mg_poison_outputs(c, f, r->set) == 0) {
    const cudaError_t e = llref_poison_window(&f->plan, (char*)c->m.win.ptr, epoch, c->s);
    if (e != cudaSuccess) (void)mg_fail(c, "rank %d: poison window: %s", c->rank, cudaGetErrorName(e));
    else if (cudaStreamSynchronize(c->s) != cudaSuccess) (void)mg_fail(c, "rank %d: sync after poison", c->rank);
  }
  epf_error_clear(c->m.rec_h);
  if (mg_sync(c)) return -1; /* every window poisoned */
  if (c->rank != r->silent) (void)mg_launch_wait(c, f, L, r, dt, poll, rec_async, t_rec, busy_at_rec);
  return 0;
}

/* This rank's outputs of a round against the reference: round, counts, expert counts, rows +
 * scales + metadata (check_rows), the packed copy (packed), the combine output. *dropped: the
 * ids outside [-1, E) this rank sent (its record counts them). 0, or -1 (recorded). */
static int mg_check(mg_ctx_t* c, mg_fix_t* f, int set, uint32_t absent, uint32_t epoch, int check_rows, int packed,
                    int identity, uint32_t* dropped, const char* what) {
  const llref_in_t* in = &c->sh->in[set];
  llref_rank_bufs_t b;
  llref_t ref;
  char msg[LLREF_MSG];
  uint16_t* want = (uint16_t*)malloc((size_t)in->R * in->Tmax * in->H * 2);
  int rc;
  MG_TRUE(c, want != NULL, "rank %d: out of host memory", c->rank);
  llref_dispatch(in, absent, &ref);
  b.win = (const char*)c->m.win.ptr;
  b.recv_counts = f->recv_counts[set];
  b.expert_counts = f->expert_counts[set];
  b.round = f->round[set];
  b.packed_x = f->packed_x;
  b.packed_scales = f->packed_scales;
  b.packed_meta = f->packed_meta;
  rc = llref_check_dispatch_rank(in, &f->plan, &ref, c->rank, &b, epoch, check_rows, packed, what, msg);
  if (rc == 0) {
    llref_combine(in, absent, identity, c->rank, want);
    rc = llref_check_combine_rank(in, c->rank, f->out[set], want, what, msg);
  }
  if (dropped != NULL) *dropped = ref.dropped_src[c->rank];
  llref_free(&ref);
  free(want);
  return rc == 0 ? 0 : mg_fail(c, "%s", msg);
}

/* the record after rounds every rank took part in: no error, the dropped ids counted */
static int mg_check_record_clean(mg_ctx_t* c, uint32_t dropped, const char* what) {
  epf_error_record_t rec;
  epf_error_read(c->m.rec_h, &rec);
  MG_TRUE(c, rec.count == 0, "%s: rank %d: %u errors recorded (first %s, waiter %d, peer %d)", what, c->rank, rec.count,
          epf_status_name((epf_status_t)rec.status), rec.waiter_rank, rec.peer);
  MG_TRUE(c, rec.dropped_routes == dropped, "%s: rank %d: dropped_routes %u, want %u", what, c->rank, rec.dropped_routes,
          dropped);
  return 0;
}

static int mg_read_mask(mg_ctx_t* c, mg_fix_t* f, uint32_t* mask) {
  MG_EPF(c, epf_ll_mask_query_async(&f->L, f->d_masks, c->s));
  MG_CUDA(c, cudaMemcpyAsync(mask, f->d_masks, EPF_MASK_WORDS * 4, cudaMemcpyDeviceToHost, c->s));
  MG_CUDA(c, cudaStreamSynchronize(c->s));
  return 0;
}

static int mg_check_epochs(mg_ctx_t* c, mg_fix_t* f, uint32_t want, const char* what) {
  epf_ll_state_t st;
  MG_CUDA(c, cudaMemcpy(&st, f->state, sizeof(st), cudaMemcpyDeviceToHost));
  for (int ph = 0; ph < EPF_LL_PHASE_COUNT; ++ph) {
    MG_TRUE(c, st.epoch[ph] == want, "%s: rank %d phase %d epoch %u, want %u", what, c->rank, ph, st.epoch[ph], want);
    MG_TRUE(c, st.arrive[ph] == 0, "%s: rank %d phase %d arrive %u, want 0", what, c->rank, ph, st.arrive[ph]);
  }
  return 0;
}

/* ============================================================================================ */
/* 1. dispatch + combine                                                                         */
/* ============================================================================================ */

static const mg_case_t k_dc_cases[] = {
    {1, MG_H, MG_K, EPF_PAYLOAD_BF16, 0, 0, 0u, MG_TIMEOUT_NS},
    {1, MG_H, MG_K, EPF_PAYLOAD_MXFP8, 0, 1, 0u, MG_TIMEOUT_NS},
    {128, MG_H, MG_K, EPF_PAYLOAD_BF16, 0, 1, 0u, MG_TIMEOUT_NS},
    {128, MG_H, MG_K, EPF_PAYLOAD_MXFP8, EPF_SCALE_LAYOUT_SWIZZLED_128X4, 0, 0u, MG_TIMEOUT_NS},
    /* the MXFP8 combine: pulled over NVLink from the expert rank's EXPERT_OUT (the default), or pushed */
    {1, MG_H, MG_K, EPF_PAYLOAD_BF16, 0, 0, MG_CASE_MX_COMBINE, MG_TIMEOUT_NS},
    {128, MG_H, MG_K, EPF_PAYLOAD_BF16, 0, 1, MG_CASE_MX_COMBINE, MG_TIMEOUT_NS},
    {128, MG_H, MG_K, EPF_PAYLOAD_BF16, 0, 0, MG_CASE_MX_COMBINE | EPF_FLAG_COMBINE_PUSH, MG_TIMEOUT_NS},
    {128, MG_H, MG_K, EPF_PAYLOAD_MXFP8, 0, 1, MG_CASE_MX_COMBINE, MG_TIMEOUT_NS},
};

/* rounds of a BF16 case (an MXFP8 case runs the first two: quantized rows cannot hold y in place) */
static const mg_round_t k_dc_rounds[] = {
    /* set T bad split packed y_layout identity silent graph */
    {0, 0, 1, 0, 0, EPF_LL_Y_FIXED, 0, -1, NULL},         /* zero copy, push from a fixed y */
    {0, 0, 0, 1, 1, EPF_LL_Y_PACKED, 1, -1, NULL},        /* packed, experts on the packed copy, push */
    {0, 0, 0, 0, 0, EPF_LL_Y_IN_PLACE_PULL, 0, -1, NULL}, /* zero copy, experts in place, pull */
    {0, 0, 1, 1, 1, EPF_LL_Y_IN_PLACE_PULL, 1, -1, NULL}, /* packed receive, in place, pull, split */
};

static void mg_body_dispatch_combine(mg_ctx_t* c) {
  for (size_t ci = 0; ci < sizeof(k_dc_cases) / sizeof(k_dc_cases[0]); ++ci) {
    const mg_case_t* cs = &k_dc_cases[ci];
    const int nrounds = cs->payload == EPF_PAYLOAD_BF16 ? 4 : 2;
    mg_fix_t f;
    char what[200];
    int stop = mg_fix_begin(c, &f, cs, 1);
    for (int i = 0; i < nrounds && !stop; ++i) {
      mg_round_t r = k_dc_rounds[i];
      const uint32_t epoch = (uint32_t)i + 1u;
      uint32_t dropped = 0;
      double dt;
      r.T = cs->Tmax;
      snprintf(what, sizeof(what),
               "dispatch+combine R=%d T=%d %s%s -> %s %s round %u (packed %d y %d split %d identity %d int64 %d)", c->R,
               r.T, payload_name(cs->payload), cs->scale_layout ? " swizzled" : "", payload_name(f.plan.combine_payload),
               epf_ll_combine_pulls(&f.plan, r.y_layout) ? "pull" : "push", epoch, r.packed, r.y_layout, r.split,
               r.identity, cs->topk64);
      if (mg_round(c, &f, &f.L, &r, epoch, &dt, 0, NULL, NULL, NULL)) {
        stop = 1;
        break;
      }
      if (mg_check(c, &f, 0, 0u, epoch, !llref_y_in_place(r.y_layout), r.packed, r.identity, &dropped, what) == 0)
        (void)mg_check_record_clean(c, dropped, what);
    }
    if (mg_fix_end(c, &f) || stop) return;
    if (c->rank == 0 && (cs->flags & MG_CASE_MX_COMBINE))
      printf("ok  dispatch+combine R=%d T=%d H=%d K=%d E=%d %s -> mxfp8 combine %s int%d ids: %d rounds (y fixed / "
             "packed%s; fused + split) exact on every rank\n",
             c->R, cs->Tmax, cs->H, cs->K, mg_experts(c->R), payload_name(cs->payload),
             (cs->flags & EPF_FLAG_COMBINE_PUSH) ? "PUSH" : "PULL (EXPERT_OUT)", cs->topk64 ? 64 : 32, nrounds,
             cs->payload == EPF_PAYLOAD_BF16 ? " / in place" : "");
    else if (c->rank == 0)
      printf("ok  dispatch+combine R=%d T=%d H=%d K=%d E=%d %s%s int%d ids: %d rounds (zero copy + packed receive; push "
             "from fixed / packed y%s; fused + split) exact on every rank\n",
             c->R, cs->Tmax, cs->H, cs->K, mg_experts(c->R), payload_name(cs->payload),
             cs->payload == EPF_PAYLOAD_MXFP8 ? (cs->scale_layout ? " (swizzled scales)" : " (compact scales)") : "",
             cs->topk64 ? 64 : 32, nrounds, cs->payload == EPF_PAYLOAD_BF16 ? "; pull with experts in place" : "");
  }
}

/* ============================================================================================ */
/* 2. back to back: rounds enqueued with no host sync between them                               */
/* ============================================================================================ */

static const mg_case_t k_b2b_case = {128, MG_H, MG_K, EPF_PAYLOAD_BF16, 0, 0, 0u, MG_TIMEOUT_NS};

static const mg_round_t k_b2b_sched[MG_SETS] = {
    /* set T bad split packed y_layout identity silent graph */
    {0, 128, 0, 0, 0, EPF_LL_Y_FIXED, 0, -1, NULL},
    {1, 77, 1, 1, 1, EPF_LL_Y_PACKED, 1, -1, NULL},
    {2, 128, 0, 0, 0, EPF_LL_Y_IN_PLACE_PULL, 0, -1, NULL},
    {3, 1, 1, 1, 0, EPF_LL_Y_IN_PLACE, 1, -1, NULL},
    {4, 128, 1, 1, 0, EPF_LL_Y_FIXED, 0, -1, NULL},
    {5, 100, 0, 0, 1, EPF_LL_Y_PACKED, 1, -1, NULL},
};

/* One burst of n rounds (epochs base + 1 ..): inputs for all, poison all, one sync, then every
 * rank enqueues the n rounds and waits once. Rows are checked for the last two rounds (the
 * window keeps two parities) unless the experts overwrote them; the packed copy for the last. */
static int mg_burst(mg_ctx_t* c, mg_fix_t* f, int n, uint32_t base) {
  uint32_t dropped = 0;
  if (mg_sync(c)) return -1;
  if (c->rank == 0)
    for (int i = 0; i < n; ++i) llref_fill(&c->sh->in[i], k_b2b_sched[i].T, k_b2b_sched[i].bad_ids, &c->sh->seed);
  if (mg_sync(c)) return -1;
  {
    int ok = 1;
    for (int i = 0; i < n && ok; ++i) ok = mg_upload(c, f, i) == 0 && mg_poison_outputs(c, f, i) == 0;
    if (ok && (llref_poison_window(&f->plan, (char*)c->m.win.ptr, base + 1u, c->s) != cudaSuccess ||
               llref_poison_window(&f->plan, (char*)c->m.win.ptr, base + 2u, c->s) != cudaSuccess ||
               cudaStreamSynchronize(c->s) != cudaSuccess))
      (void)mg_fail(c, "rank %d: poison before the burst failed", c->rank);
  }
  epf_error_clear(c->m.rec_h);
  if (mg_sync(c)) return -1;
  {
    const double t0 = now_s();
    int ok = 1;
    for (int i = 0; i < n && ok; ++i) ok = mg_enqueue(c, f, &f->L, &k_b2b_sched[i]) == 0;
    if (ok && cudaStreamSynchronize(c->s) != cudaSuccess) ok = mg_fail(c, "rank %d: burst failed", c->rank) == 0;
    if (ok && c->rank == 0)
      printf("    burst of %d rounds (epochs %u..%u): %.2f ms on rank 0\n", n, base + 1u, base + (uint32_t)n,
             (now_s() - t0) * 1e3);
    for (int i = 0; i < n && ok; ++i) {
      const mg_round_t* r = &k_b2b_sched[i];
      const int rows = i >= n - 2 && !llref_y_in_place(r->y_layout);
      uint32_t d = 0;
      char what[160];
      snprintf(what, sizeof(what), "back-to-back round %u of a burst of %d (T=%d packed %d y %d split %d)",
               base + 1u + (uint32_t)i, n, r->T, r->packed, r->y_layout, r->split);
      ok = mg_check(c, f, r->set, 0u, base + 1u + (uint32_t)i, rows, rows && r->packed && i == n - 1, r->identity, &d,
                    what) == 0;
      dropped += d;
    }
    if (ok) (void)mg_check_record_clean(c, dropped, "back-to-back burst");
  }
  return 0;
}

static void mg_body_back_to_back(mg_ctx_t* c) {
  mg_fix_t f;
  int stop = mg_fix_begin(c, &f, &k_b2b_case, MG_SETS);
  if (!stop) stop = mg_burst(c, &f, MG_SETS - 1, 0u); /* epochs 1..5 */
  if (!stop) stop = mg_burst(c, &f, MG_SETS, MG_SETS - 1u); /* epochs 6..11: the other parity first */
  if (!stop) {
    double dt;
    mg_round_t r = k_b2b_sched[0];
    r.T = 128; /* and one more round after the bursts, host-synchronised, exact */
    if (mg_round(c, &f, &f.L, &r, 2u * MG_SETS, &dt, 0, NULL, NULL, NULL))
      stop = 1;
    else {
      uint32_t d = 0;
      if (mg_check(c, &f, 0, 0u, 2u * MG_SETS, 1, 0, r.identity, &d, "round after the bursts") == 0)
        (void)mg_check_record_clean(c, d, "round after the bursts");
    }
  }
  if (mg_fix_end(c, &f) || stop) return;
  if (c->rank == 0)
    printf("ok  back-to-back R=%d T<=128 H=%d K=%d E=%d bf16: bursts of %d and %d rounds without host sync "
           "(fixed / packed / in place / pull, fused + split, new ids and token counts each round) + 1 round, exact\n",
           c->R, MG_H, MG_K, mg_experts(c->R), MG_SETS - 1, MG_SETS);
}

/* ============================================================================================ */
/* 3. CUDA graphs                                                                                */
/* ============================================================================================ */

static const mg_case_t k_graph_case = {128, MG_H, MG_K, EPF_PAYLOAD_BF16, 0, 1, 0u, MG_TIMEOUT_NS};

/* capture one round on c->s (thread-local capture: the other threads keep calling CUDA) */
static int mg_capture(mg_ctx_t* c, mg_fix_t* f, const mg_round_t* r, cudaGraphExec_t* exec) {
  cudaGraph_t g = NULL;
  int rc;
  MG_CUDA(c, cudaStreamBeginCapture(c->s, cudaStreamCaptureModeThreadLocal));
  rc = mg_enqueue(c, f, &f->L, r);
  {
    const cudaError_t e = cudaStreamEndCapture(c->s, &g);
    if (rc == 0 && e != cudaSuccess) rc = mg_fail(c, "rank %d: end capture: %s", c->rank, cudaGetErrorName(e));
  }
  if (rc == 0) {
    const cudaError_t e = cudaGraphInstantiate(exec, g, 0);
    if (e != cudaSuccess) rc = mg_fail(c, "rank %d: instantiate: %s", c->rank, cudaGetErrorName(e));
  }
  if (g != NULL && cudaGraphDestroy(g) != cudaSuccess && rc == 0)
    rc = mg_fail(c, "rank %d: cudaGraphDestroy failed", c->rank);
  return rc;
}

static void mg_body_graph(mg_ctx_t* c) {
  /* graph A: packed receive, experts on the packed copy, y packed, push combine; dispatch and
   * combine in split halves with other work between (inside the graph); graph B: zero copy,
   * experts in place, pull combine, fused */
  const mg_round_t ra = {0, 128, 0, 1, 1, EPF_LL_Y_PACKED, 0, -1, NULL};
  const mg_round_t rb = {0, 128, 0, 0, 0, EPF_LL_Y_IN_PLACE_PULL, 1, -1, NULL};
  cudaGraphExec_t ga = NULL, gb = NULL;
  mg_fix_t f;
  uint32_t epoch = 0;
  int stop = mg_fix_begin(c, &f, &k_graph_case, 1);
  /* captured after the state reset; nothing runs until the first replay */
  if (!stop && mg_capture(c, &f, &ra, &ga) == 0) (void)mg_capture(c, &f, &rb, &gb);
  for (int g = 0; g < 2 && !stop; ++g)
    for (int i = 1; i <= MG_GRAPH_REPLAYS && !stop; ++i) {
      mg_round_t r = g == 0 ? ra : rb;
      uint32_t d = 0;
      double dt;
      char what[120];
      r.graph = g == 0 ? ga : gb;
      r.bad_ids = i % 3 == 0;
      ++epoch;
      snprintf(what, sizeof(what), "graph %s replay %d (epoch %u)", g == 0 ? "A (packed, push)" : "B (pull)", i, epoch);
      if (r.graph == NULL) (void)mg_fail(c, "rank %d: no graph", c->rank);
      if (mg_round(c, &f, &f.L, &r, epoch, &dt, 0, NULL, NULL, NULL)) {
        stop = 1;
        break;
      }
      if (mg_check(c, &f, 0, 0u, epoch, g == 0, g == 0, r.identity, &d, what) == 0)
        (void)mg_check_record_clean(c, d, what);
    }
  if ((ga != NULL && cudaGraphExecDestroy(ga) != cudaSuccess) || (gb != NULL && cudaGraphExecDestroy(gb) != cudaSuccess))
    (void)mg_fail(c, "rank %d: cudaGraphExecDestroy failed", c->rank);
  if (mg_fix_end(c, &f) || stop) return;
  if (c->rank == 0)
    printf("ok  graphs R=%d T=128 H=%d K=%d E=%d bf16: %d replays of a captured round (packed, push, split halves) and "
           "%d of another (zero copy, pull), fresh inputs each, exact\n",
           c->R, MG_H, MG_K, mg_experts(c->R), MG_GRAPH_REPLAYS, MG_GRAPH_REPLAYS);
}

/* ============================================================================================ */
/* 4. fault injection                                                                            */
/* ============================================================================================ */

static const mg_case_t k_ft_case = {32, MG_H, MG_K, EPF_PAYLOAD_BF16, 0, 0, EPF_FLAG_FAULT_TOLERANT, MG_FT_TIMEOUT_NS};
static const mg_case_t k_noft_case = {16, MG_H, MG_K, EPF_PAYLOAD_BF16, 0, 1, 0u, MG_FT_TIMEOUT_NS};

/* after a round with `silent` not taking part: a survivor found it in its record (first while
 * the round ran, without a sync; then after the sync), within the time limits */
static int mg_check_silent_seen(mg_ctx_t* c, const mg_fix_t* f, int silent, const epf_error_record_t* early,
                                double t_rec, int busy, double dt, int ft, const char* what) {
  epf_error_record_t rec;
  const uint64_t timeout = f->plan.timeout_ns;
  MG_TRUE(c, early->valid == 1 && early->status == EPF_ERR_TIMEOUT && early->peer == silent,
          "%s: rank %d: the record read during the round (%.1f ms) says valid %u status %s peer %d", what, c->rank,
          t_rec * 1e3, early->valid, epf_status_name((epf_status_t)early->status), early->peer);
  epf_error_read(c->m.rec_h, &rec);
  MG_TRUE(c, rec.valid == 1 && rec.status == EPF_ERR_TIMEOUT && rec.peer == silent && rec.waiter_rank == c->rank,
          "%s: rank %d: record valid %u status %s peer %d waiter %d", what, c->rank, rec.valid,
          epf_status_name((epf_status_t)rec.status), rec.peer, rec.waiter_rank);
  MG_TRUE(c, rec.elapsed_ns >= timeout, "%s: rank %d: waited %llu ns, the timeout is %llu", what, c->rank,
          (unsigned long long)rec.elapsed_ns, (unsigned long long)timeout);
  MG_TRUE(c, rec.masked_ranks == (ft ? 1u : 0u), "%s: rank %d: masked_ranks %u, want %u", what, c->rank, rec.masked_ranks,
          ft ? 1u : 0u);
  MG_TRUE(c, dt < 3.0, "%s: rank %d: the round took %.3f s", what, c->rank, dt);
  if (c->rank == 0)
    printf("    %s: rank 0 read the timeout on rank %d from its record %.1f ms after the launch without a sync (round "
           "%s then), round done in %.1f ms\n",
           what, silent, t_rec * 1e3, busy ? "still running" : "already done", dt * 1e3);
  return 0;
}

/* this rank's active mask: bit p cleared exactly where want_cleared has it set */
static int mg_check_mask(mg_ctx_t* c, mg_fix_t* f, uint32_t want_cleared, const char* what) {
  uint32_t mask[EPF_MASK_WORDS];
  if (mg_read_mask(c, f, mask) != 0) return -1;
  for (int p = 0; p < c->R; ++p)
    MG_TRUE(c, ((mask[p >> 5] >> (p & 31)) & 1u) == (((want_cleared >> p) & 1u) ? 0u : 1u),
            "%s: rank %d: mask word 0x%08x, bit %d should be %d", what, c->rank, mask[0], p, ((want_cleared >> p) & 1u) ? 0 : 1);
  return 0;
}

/* the clean: every rank (the silent one too), after every rank finished its rounds */
static int mg_clean(mg_ctx_t* c, mg_fix_t* f, const epf_ll_launch_t* L, uint32_t want_epoch, const char* what) {
  if (mg_sync(c)) return -1; /* every rank's earlier rounds are over (they synced) */
  epf_error_clear(c->m.rec_h);
  if (epf_ll_mask_clean(L, c->s) != EPF_OK)
    (void)mg_fail(c, "rank %d: epf_ll_mask_clean refused", c->rank);
  else if (cudaStreamSynchronize(c->s) != cudaSuccess)
    (void)mg_fail(c, "rank %d: clean failed", c->rank);
  else if (mg_check_record_clean(c, 0u, what) == 0 && mg_check_mask(c, f, 0u, what) == 0)
    (void)mg_check_epochs(c, f, want_epoch, what);
  return 0;
}

static void mg_body_fault_tolerant(mg_ctx_t* c) {
  const int R = c->R, silent = R - 1, me = c->rank, survivor = me != silent;
  const uint32_t gone = 1u << silent;
  mg_fix_t f;
  epf_ll_launch_t Lwarm;
  epf_error_record_t early;
  double dt = 0, t_rec = 0;
  int busy = 0, stop;
  mg_round_t r = {0, 32, 0, 0, 0, EPF_LL_Y_FIXED, 0, -1, NULL};
  stop = mg_fix_begin(c, &f, &k_ft_case, 1);
  Lwarm = f.L;
  Lwarm.plan.timeout_ns = MG_TIMEOUT_NS; /* round 1 also loads the kernels: no short deadline there */

  /* round 1: everybody */
  if (!stop && !(stop = mg_round(c, &f, &Lwarm, &r, 1, &dt, 0, NULL, NULL, NULL)))
    if (mg_check(c, &f, 0, 0u, 1, 1, 0, 0, NULL, "FT round 1") == 0) (void)mg_check_record_clean(c, 0u, "FT round 1");

  /* round 2: the last rank's thread stops launching -> the others finish within the timeout,
   * see it in their record during the round, mask it, and are exact for the live ranks */
  r.silent = silent;
  r.identity = 1;
  if (!stop && !(stop = mg_round(c, &f, &f.L, &r, 2, &dt, survivor, &early, &t_rec, &busy))) {
    if (survivor) {
      if (mg_check_silent_seen(c, &f, silent, &early, t_rec, busy, dt, 1, "FT round 2 (last rank silent)") == 0 &&
          mg_check_mask(c, &f, gone, "FT round 2") == 0)
        (void)mg_check(c, &f, 0, gone, 2, 1, 0, 1, NULL, "FT round 2 (last rank silent)");
    } else {
      (void)mg_check_mask(c, &f, 0u, "FT round 2 (the silent rank's own mask)");
    }
  }

  /* round 3: still silent -> skipped at once, no new errors */
  r.identity = 0;
  r.packed = 1;
  if (!stop && !(stop = mg_round(c, &f, &f.L, &r, 3, &dt, 0, NULL, NULL, NULL)) && survivor) {
    epf_error_record_t rec;
    epf_error_read(c->m.rec_h, &rec);
    if (rec.count != 0)
      (void)mg_fail(c, "FT round 3: rank %d recorded %u errors with the silent rank masked", me, rec.count);
    else if (dt >= (double)k_ft_case.timeout_ns * 1e-9)
      (void)mg_fail(c, "FT round 3: rank %d took %.1f ms with the silent rank masked (timeout %.0f ms)", me, dt * 1e3,
                    (double)k_ft_case.timeout_ns * 1e-6);
    else if (mg_check(c, &f, 0, gone, 3, 1, 1, 0, NULL, "FT round 3 (last rank masked)") == 0 && me == 0)
      printf("    FT round 3: the masked rank skipped at once (%.2f ms on rank 0)\n", dt * 1e3);
  }

  /* clean: every rank -> masks full again, epochs agree (the silent rank was 2 rounds behind) */
  if (!stop) stop = mg_clean(c, &f, &Lwarm, 3u, "FT clean");

  /* round 4: everybody again, exact */
  r.silent = -1;
  r.packed = 0;
  if (!stop && !(stop = mg_round(c, &f, &f.L, &r, 4, &dt, 0, NULL, NULL, NULL)))
    if (mg_check(c, &f, 0, 0u, 4, 1, 0, 0, NULL, "FT round 4 (after clean)") == 0)
      (void)mg_check_record_clean(c, 0u, "FT round 4");

  /* round 5: the mask update from host memory, then split halves */
  if (!stop) {
    uint32_t m[EPF_MASK_WORDS];
    epf_mask_init_all(m, R);
    if (epf_ll_mask_update(&f.L, m, c->s) != EPF_OK || cudaStreamSynchronize(c->s) != cudaSuccess)
      (void)mg_fail(c, "rank %d: epf_ll_mask_update failed", me);
    r.split = 1;
    r.packed = 1;
    r.y_layout = EPF_LL_Y_PACKED;
    if (!(stop = mg_round(c, &f, &f.L, &r, 5, &dt, 0, NULL, NULL, NULL)))
      if (mg_check(c, &f, 0, 0u, 5, 1, 1, 0, NULL, "FT round 5 (split, after mask update)") == 0)
        (void)mg_check_record_clean(c, 0u, "FT round 5");
  }

  /* round 6: the pull combine, everybody; round 7: pull with the last rank silent again */
  r.split = 0;
  r.packed = 0;
  r.y_layout = EPF_LL_Y_IN_PLACE_PULL;
  if (!stop && !(stop = mg_round(c, &f, &f.L, &r, 6, &dt, 0, NULL, NULL, NULL)))
    if (mg_check(c, &f, 0, 0u, 6, 0, 0, 0, NULL, "FT round 6 (pull)") == 0) (void)mg_check_record_clean(c, 0u, "FT round 6");
  r.silent = silent;
  if (!stop && !(stop = mg_round(c, &f, &f.L, &r, 7, &dt, survivor, &early, &t_rec, &busy)) && survivor)
    if (mg_check_silent_seen(c, &f, silent, &early, t_rec, busy, dt, 1, "FT round 7 (pull, last rank silent)") == 0 &&
        mg_check_mask(c, &f, gone, "FT round 7") == 0)
      (void)mg_check(c, &f, 0, gone, 7, 0, 0, 0, NULL, "FT round 7 (pull, last rank silent)");

  if (mg_fix_end(c, &f) || stop) return;
  if (me == 0)
    printf("ok  fault tolerant R=%d T=32 H=%d K=%d E=%d, timeout %.0f ms: rank %d silent -> masked by every survivor "
           "within the timeout, seen in the record without a sync, survivors exact; skipped at once next round; "
           "re-admitted by clean (fused, split, pull exact); silent again under pull -> masked, exact\n",
           R, MG_H, MG_K, mg_experts(R), (double)k_ft_case.timeout_ns * 1e-6, silent);
}

static void mg_body_not_fault_tolerant(mg_ctx_t* c) {
  const int R = c->R, silent = R - 1, me = c->rank, survivor = me != silent;
  mg_fix_t f;
  epf_ll_launch_t Lwarm;
  double dt = 0;
  int stop;
  mg_round_t r = {0, 16, 1, 0, 0, EPF_LL_Y_FIXED, 0, -1, NULL};
  stop = mg_fix_begin(c, &f, &k_noft_case, 1);
  Lwarm = f.L;
  Lwarm.plan.timeout_ns = MG_TIMEOUT_NS;
  if (!stop && !(stop = mg_round(c, &f, &Lwarm, &r, 1, &dt, 0, NULL, NULL, NULL))) {
    uint32_t d = 0;
    if (mg_check(c, &f, 0, 0u, 1, 1, 0, 0, &d, "no-FT round 1") == 0) (void)mg_check_record_clean(c, d, "no-FT round 1");
  }
  /* round 2: the last rank silent: timeouts recorded, nobody masked, results as if it were absent */
  r.silent = silent;
  r.bad_ids = 0;
  if (!stop && !(stop = mg_round(c, &f, &f.L, &r, 2, &dt, 0, NULL, NULL, NULL)) && survivor) {
    epf_error_record_t rec;
    epf_error_read(c->m.rec_h, &rec);
    if (rec.status != EPF_ERR_TIMEOUT || rec.masked_ranks != 0 || dt >= 3.0)
      (void)mg_fail(c, "no-FT round 2: rank %d: status %s masked_ranks %u, %.3f s", me,
                    epf_status_name((epf_status_t)rec.status), rec.masked_ranks, dt);
    else if (mg_check_mask(c, &f, 0u, "no-FT round 2 (no mask without the flag)") == 0)
      (void)mg_check(c, &f, 0, 1u << silent, 2, 1, 0, 0, NULL, "no-FT round 2 (last rank silent)");
  }
  /* the silent rank is one round behind: the clean re-synchronises every rank */
  if (!stop) stop = mg_clean(c, &f, &Lwarm, 2u, "no-FT clean");
  r.silent = -1;
  if (!stop && !(stop = mg_round(c, &f, &f.L, &r, 3, &dt, 0, NULL, NULL, NULL)))
    if (mg_check(c, &f, 0, 0u, 3, 1, 0, 0, NULL, "no-FT round 3 (after clean)") == 0)
      (void)mg_check_record_clean(c, 0u, "no-FT round 3");
  if (mg_fix_end(c, &f) || stop) return;
  if (me == 0)
    printf("ok  not fault tolerant R=%d T=16 H=%d K=%d E=%d: rank %d silent -> timeouts recorded, nobody masked, "
           "survivors exact; clean re-synchronises, next round exact\n",
           R, MG_H, MG_K, mg_experts(R), silent);
}

/* ============================================================================================ */
/* the driver: one thread per GPU                                                                */
/* ============================================================================================ */

static void* mg_thread(void* p) {
  mg_arg_t* a = (mg_arg_t*)p;
  mg_ctx_t c;
  epf_status_t st;
  memset(&c, 0, sizeof(c));
  c.sh = a->sh;
  c.a = a;
  c.rank = a->rank;
  c.R = a->sh->R;
  st = epf_mg_rank_open(&c.m, c.rank, c.R, c.sh->id, c.sh->window_bytes);
  if (st != EPF_OK)
    (void)mg_fail(&c, "rank %d: open: %s (%s)", c.rank, epf_status_name(st), c.m.msg);
  else if (cudaStreamCreateWithFlags(&c.s, cudaStreamNonBlocking) != cudaSuccess || cudaMalloc((void**)&c.sink, 64) != cudaSuccess)
    (void)mg_fail(&c, "rank %d: stream / scratch allocation failed", c.rank);
  if (mg_sync(&c) == 0) c.sh->body(&c);
  /* after the last mg_sync: failures here are reported after the join */
  if (c.s != NULL && (cudaStreamSynchronize(c.s) != cudaSuccess || cudaStreamDestroy(c.s) != cudaSuccess))
    (void)mg_fail(&c, "rank %d: stream teardown failed", c.rank);
  if (cudaFree(c.sink) != cudaSuccess) (void)mg_fail(&c, "rank %d: cudaFree failed", c.rank);
  epf_mg_rank_close(&c.m);
  return NULL;
}

/* Run `body` on every GPU (communicators, windows sized for the largest of `cases`), then assert
 * on every rank. */
static void mg_run(void (*body)(mg_ctx_t*), const mg_case_t* cases, int ncases) {
  mg_shared_t* sh = (mg_shared_t*)calloc(1, sizeof(mg_shared_t));
  mg_arg_t args[EPF_MG_MAX];
  int rc, failed = -1;
  assert_non_null(sh);
  for (int i = 0; i < ncases; ++i) {
    epf_plan_t p;
    assert_int_equal(mg_plan(&cases[i], g_R, &p), EPF_OK);
    if (p.total_bytes > sh->window_bytes) sh->window_bytes = p.total_bytes;
  }
  sh->R = g_R;
  sh->body = body;
  sh->seed = g_seed;
  assert_int_equal(pthread_mutex_init(&sh->bar.mu, NULL), 0);
  assert_int_equal(pthread_cond_init(&sh->bar.cv, NULL), 0);
  sh->bar.n = g_R;
  assert_int_equal(ncclGetUniqueId(&sh->id), ncclSuccess);
  memset(args, 0, sizeof(args));
  for (int r = 0; r < g_R; ++r) {
    args[r].sh = sh;
    args[r].rank = r;
  }
  rc = epf_mg_run(g_R, mg_thread, args, sizeof(mg_arg_t));
  g_seed = sh->seed;
  for (int i = 0; i < MG_SETS; ++i) llref_in_free(&sh->in[i]);
  pthread_cond_destroy(&sh->bar.cv);
  pthread_mutex_destroy(&sh->bar.mu);
  free(sh);
  assert_int_equal(rc, 0);
  for (int r = 0; r < g_R; ++r)
    if (args[r].failed) {
      printf("FAILED rank %d: %s\n", r, args[r].msg);
      if (failed < 0) failed = r;
    }
  if (failed >= 0) fail_msg("rank %d: %s", failed, args[failed].msg);
}

static void test_mg_ll_dispatch_combine(void** state) {
  (void)state;
  mg_run(mg_body_dispatch_combine, k_dc_cases, (int)(sizeof(k_dc_cases) / sizeof(k_dc_cases[0])));
}

static void test_mg_ll_back_to_back(void** state) {
  (void)state;
  mg_run(mg_body_back_to_back, &k_b2b_case, 1);
}

static void test_mg_ll_graph(void** state) {
  (void)state;
  mg_run(mg_body_graph, &k_graph_case, 1);
}

static void test_mg_ll_fault_tolerant(void** state) {
  (void)state;
  if (g_R < 2) {
    printf("fault injection needs 2 ranks (EPF_MG_GPUS=1 smoke run): skipped\n");
    skip();
  }
  mg_run(mg_body_fault_tolerant, &k_ft_case, 1);
}

static void test_mg_ll_not_fault_tolerant(void** state) {
  (void)state;
  if (g_R < 2) {
    printf("fault injection needs 2 ranks (EPF_MG_GPUS=1 smoke run): skipped\n");
    skip();
  }
  mg_run(mg_body_not_fault_tolerant, &k_noft_case, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mg_ll_dispatch_combine), cmocka_unit_test(test_mg_ll_back_to_back),
      cmocka_unit_test(test_mg_ll_graph),            cmocka_unit_test(test_mg_ll_fault_tolerant),
      cmocka_unit_test(test_mg_ll_not_fault_tolerant),
  };
  const int n = epf_mg_gpus(2);
  if (n == 77) return 77;
  g_R = n;
  g_seed = epf_test_seed();
  printf("test_mg_ll: %d ranks, one thread per GPU; H=%d, top-%d of E=%d experts\n", g_R, MG_H, MG_K, mg_experts(g_R));
  return cmocka_run_group_tests(tests, NULL, NULL);
}
