/* test_mg_ht — the high-throughput round over real NCCL on every visible GPU (at least 2; else exit
 * 77, reported "Not Run"; EPF_MG_GPUS=1 is a 1-rank smoke run): one thread per GPU, one rank each
 * (tests/common/epf_mg.h), the library's launchers used as examples/02_nccl_ranks and
 * tests/gpu/test_ht.cu use them (epf_route_update with the rank's team and route.count == 1,
 * epf_ht_dispatch, epf_ht_expand, the tests' experts_kernel, epf_ht_combine), against the CPU
 * reference test_ht has always used (tests/common/epf_ht_ref.h) and a CPU route reference of the
 * whole team (tests/common/epf_route_ref.h). Every thread generates every rank's inputs from the
 * printed seed (EPF_TEST_SEED), so it knows what its peers send. Per case, each rank:
 *   - setup handshake on its fresh window (all ranks must hold the same plan);
 *   - one round with host syncs between the halves: route update with the count exchange, its
 *     arrays against the reference (header, expert / rank counts, destination ranks, slots,
 *     is_token_in_rank, rank-major slots, send offsets, receive segments and per-source starts,
 *     receive totals); the receive regions (payload bytes, scales, metadata; pad rows' marks;
 *     the rank-major expand view); then experts + combine, the output bit-exact;
 *   - 3 rounds back to back with no host sync, each round's ids, x and weights copied into the
 *     same input buffers on the stream just before it: every round's route (a copy taken on the
 *     stream after its update) and combine output checked afterwards;
 *   - a CUDA graph of one whole round (route update + dispatch [+ expand] + experts + combine),
 *     replayed 4 times with fresh inputs copied into the captured buffers between replays, each
 *     replay's route and output checked.
 * Outputs, the window's receive / combine regions and the route arrays are poisoned before every
 * run; host barriers keep a rank from poisoning its window while a peer may still read it. The
 * error record must stay clean (no status, no dropped ids, no overflow: capacities are exact).
 * Cases: T = 256 tokens per rank, H = 2048, top-4 of 32 experts in both layouts, BF16 / MXFP8 /
 * per-128 FP8 dispatch (quantized on the way; MXFP8 also caller-quantized), BF16 / MXFP8 combine,
 * pull / push / in place, alignment 1 / 128, random / partly -1 / skewed routing, int32 / int64
 * ids; and DeepSeek-like H = 7168, top-8 of 256, T = 512 (expert- and rank-major). E is rounded
 * up to a multiple of the GPU count.
 * A rank that fails records why and aborts the host barriers; the others stop at the next one
 * (device waits are bounded by the plan's 10 s timeout); cmocka asserts on every rank after the
 * join. Run with NCCL_NVLS_ENABLE=0 (epf_mg_gpus sets it). */
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epf_cmocka.h"
#include "epf_ht_ref.h"
#include "epf_mg.h"
#include "epf_route_ref.h"
#include "epf_test_gpu.h"
#include "epfuse/epfuse.cuh"
#include "epfuse/ht/kernels.cuh"
#include "epfuse/core/nccl.cuh"

#define MG_B2B 3     /* rounds back to back without a host sync */
#define MG_REPLAYS 4 /* graph replays */
#define MG_ROUNDS (1 + MG_B2B + MG_REPLAYS)

typedef struct {
  ht_case_t c; /* c.R is set to the GPU count at run time */
  int index64;
  const char* name;
} mg_case_t;

#define BF EPF_PAYLOAD_BF16
#define MX EPF_PAYLOAD_MXFP8
#define F8 EPF_PAYLOAD_FP8_128
#define EM EPF_LAYOUT_EXPERT_MAJOR
#define RM EPF_LAYOUT_RANK_MAJOR

static const mg_case_t k_mg_cases[] = {
    /*  R  T    H     K  E    layout payload combine routing push align xq cap inplace swz   idx64 */
    {{0, 256, 2048, 4, 32, EM, BF, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0, 0}, 0, "expert-major bf16 pull"},
    {{0, 256, 2048, 4, 32, EM, MX, BF, ROUTE_PARTIAL, 0, 128, 0, 0, 0, 0, 0}, 1, "expert-major mxfp8 pull, align 128, int64 ids"},
    {{0, 256, 2048, 4, 32, EM, F8, MX, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0, 0}, 0, "expert-major fp8-128 pull, mxfp8 combine"},
    {{0, 256, 2048, 4, 32, EM, MX, BF, ROUTE_RANDOM, 1, 1, 1, 0, 0, 0, 0}, 0, "expert-major caller-quantized mxfp8 push"},
    {{0, 256, 2048, 4, 32, EM, BF, BF, ROUTE_SKEWED, 0, 1, 0, 0, 1, 0, 0}, 1, "expert-major bf16 in place, skewed, int64 ids"},
    {{0, 256, 2048, 4, 32, RM, BF, BF, ROUTE_RANDOM, 1, 1, 0, 0, 0, 0, 0}, 0, "rank-major bf16 push"},
    {{0, 256, 2048, 4, 32, RM, MX, MX, ROUTE_PARTIAL, 0, 1, 0, 0, 0, 0, 0}, 0, "rank-major mxfp8 pull, mxfp8 combine"},
    {{0, 512, 7168, 8, 256, EM, MX, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0, 0}, 0, "DeepSeek-like expert-major mxfp8 pull"},
    {{0, 512, 7168, 8, 256, RM, BF, BF, ROUTE_RANDOM, 1, 1, 0, 0, 0, 0, 0}, 1, "DeepSeek-like rank-major bf16 push, int64 ids"},
};
#define MG_NCASES ((int)(sizeof(k_mg_cases) / sizeof(k_mg_cases[0])))

/* ---- host barrier that a failing rank can abort ------------------------------------------------ */

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int n, arrived, aborted;
  unsigned gen;
} mg_sync_t;

static int mg_sync_init(mg_sync_t* s, int n) {
  memset(s, 0, sizeof(*s));
  s->n = n;
  if (pthread_mutex_init(&s->mu, NULL) != 0) return -1;
  if (pthread_cond_init(&s->cv, NULL) != 0) {
    pthread_mutex_destroy(&s->mu);
    return -1;
  }
  return 0;
}

static void mg_sync_destroy(mg_sync_t* s) {
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
}

/* every rank's thread, at the same points; -1 when some rank aborted */
static int mg_sync_wait(mg_sync_t* s) {
  int r;
  pthread_mutex_lock(&s->mu);
  if (!s->aborted) {
    const unsigned gen = s->gen;
    if (++s->arrived == s->n) {
      s->arrived = 0;
      s->gen++;
      pthread_cond_broadcast(&s->cv);
    } else {
      while (gen == s->gen && !s->aborted) pthread_cond_wait(&s->cv, &s->mu);
    }
  }
  r = s->aborted ? -1 : 0;
  pthread_mutex_unlock(&s->mu);
  return r;
}

static void mg_sync_abort(mg_sync_t* s) {
  pthread_mutex_lock(&s->mu);
  s->aborted = 1;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* ---- one rank --------------------------------------------------------------------------------- */

typedef struct {
  int rank, nranks, case_index;
  ncclUniqueId id;
  uint64_t seed;
  ht_case_t c; /* the case with R and E resolved */
  int index64;
  mg_sync_t* sync;
  /* results */
  int failed;         /* this rank found a failure: msg */
  int aborted;        /* stopped because another rank failed */
  int rounds_checked; /* MG_ROUNDS when everything passed */
  char msg[512];
} mg_arg_t;

typedef struct {
  mg_arg_t* a;
  ht_case_t c;
  epf_plan_t plan;
  epf_mg_rank_t m;
  int me, opened;
  cudaStream_t stream;
  epf_route_config_t rc;
  epf_route_t route;
  uint64_t route_bytes;
  void* route_buf;
  void* route_snap; /* [MG_B2B] copies of the route buffer */
  void* d_topk;     /* [T][K] int32 or int64 */
  void* d_x;        /* [T][H] BF16, or payload rows when caller-quantized */
  void* d_xs;       /* [T] compact scales (caller-quantized) */
  float* d_w;       /* [T][K] */
  uint16_t* d_out;  /* [MG_B2B][T][H] */
  uint16_t* d_expert_out;
  uint8_t* d_view;
  uint8_t* d_view_scales;
  epf_ht_state_t* d_state;
  int* d_status;
  int64_t expert_rows;
  uint32_t epoch; /* epoch of the last route update */
  /* pinned staging of this rank's inputs, one per back-to-back round */
  void* h_topk[MG_B2B];
  void* h_x[MG_B2B];
  void* h_xs[MG_B2B];
  float* h_w[MG_B2B];
  model_t model[MG_B2B];
  int models;
  /* host scratch */
  uint8_t* h_route;
  uint16_t* h_out;
  float *acc, *part;
  uint16_t *y, *want;
  uint8_t* yq;
  cudaGraph_t graph;
  cudaGraphExec_t graph_exec;
} mg_ctx_t;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int mg_fail(mg_ctx_t* x, const char* fmt, ...) {
  if (!x->a->failed) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->a->msg, sizeof(x->a->msg), fmt, ap);
    va_end(ap);
  }
  x->a->failed = 1;
  mg_sync_abort(x->a->sync);
  return -1;
}

#define MG_CK(call)                                                                                                  \
  do {                                                                                                               \
    const cudaError_t mg_e_ = (call);                                                                                \
    if (mg_e_ != cudaSuccess) return mg_fail(x, "line %d: %s -> %s", __LINE__, #call, cudaGetErrorString(mg_e_));  \
  } while (0)
#define MG_CS(call)                                                                                                  \
  do {                                                                                                               \
    const epf_status_t mg_s_ = (call);                                                                               \
    if (mg_s_ != EPF_OK) return mg_fail(x, "line %d: %s -> %s", __LINE__, #call, epf_status_name(mg_s_));          \
  } while (0)
#define MG_DO(call)             \
  do {                          \
    if ((call) != 0) return -1; \
  } while (0)
/* host barrier over the ranks; a rank that sees another's abort stops here */
#define MG_SYNC()                                    \
  do {                                               \
    if (mg_sync_wait(x->a->sync) != 0) {             \
      if (!x->a->failed) x->a->aborted = 1;          \
      return -1;                                     \
    }                                                \
  } while (0)

/* the same on every rank: inputs of (case, round) */
static uint64_t mg_seed(const mg_ctx_t* x, int round) {
  uint64_t s = x->a->seed ^ ((uint64_t)(x->a->case_index + 1) * 0x9e3779b97f4a7c15ull);
  s += (uint64_t)(round + 1) * 0xbf58476d1ce4e5b9ull;
  return epf_test_rand(&s);
}

static __global__ void mg_handshake_kernel(epf_team_t team, epf_plan_t plan, epf_wait_t w, int* out_status) {
  const epf_status_t st = epf_handshake_block(team, &plan, 1u, w); /* epoch 1 on a fresh window */
  if (threadIdx.x == 0) *out_status = (int)st;
}

static int mg_setup(mg_ctx_t* x) {
  const ht_case_t* c = &x->c;
  const int T = c->T, H = c->H, K = c->K, EL = c->E / c->R;
  const size_t xs_bytes = (size_t)T * (H / 32 + 4) * 4;
  int hs_status = -1;
  MG_CS(make_plan(c, exact_capacity(c), &x->plan));
  x->opened = 1;
  if (epf_mg_rank_open(&x->m, x->me, c->R, x->a->id, x->plan.total_bytes) != EPF_OK)
    return mg_fail(x, "rank open: %s", x->m.msg);
  MG_CK(cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking));
  {
    const epf_route_config_t rc0 = EPF_ROUTE_CONFIG_INIT;
    x->rc = rc0;
  }
  x->rc.index_type = x->a->index64 ? EPF_INDEX_INT64 : EPF_INDEX_INT32;
  MG_CS(epf_route_size(&x->plan, &x->rc, &x->route_bytes));
  MG_CK(cudaMalloc(&x->route_buf, x->route_bytes));
  MG_CK(cudaMalloc(&x->route_snap, MG_B2B * x->route_bytes));
  x->epoch = 1u + (uint32_t)(mg_seed(x, 1000) % 1000u); /* the window's "last" count exchange: same on every rank */
  MG_CS(epf_route_init(&x->plan, &x->rc, x->route_buf, x->route_bytes, 1, x->epoch, x->stream, &x->route));
  x->expert_rows = x->plan.recv_capacity * (c->layout == EPF_LAYOUT_RANK_MAJOR ? (K < EL ? K : EL) : 1) + (int64_t)EL * c->align;
  MG_CK(cudaMalloc(&x->d_topk, (size_t)T * K * 8));
  MG_CK(cudaMalloc(&x->d_x, (size_t)T * H * 2));
  MG_CK(cudaMalloc(&x->d_xs, xs_bytes));
  MG_CK(cudaMalloc(&x->d_w, (size_t)T * K * 4));
  MG_CK(cudaMalloc(&x->d_out, (size_t)MG_B2B * T * H * 2));
  MG_CK(cudaMalloc(&x->d_expert_out, (size_t)x->expert_rows * H * 2));
  if (c->layout == EPF_LAYOUT_RANK_MAJOR) {
    MG_CK(cudaMalloc(&x->d_view, (size_t)x->expert_rows * x->plan.row_bytes));
    if (x->plan.scale_bytes_per_row) MG_CK(cudaMalloc(&x->d_view_scales, (size_t)x->expert_rows * x->plan.scale_bytes_per_row));
  }
  MG_CK(cudaMalloc(&x->d_state, sizeof(epf_ht_state_t)));
  MG_CK(cudaMemsetAsync(x->d_state, 0, sizeof(epf_ht_state_t), x->stream));
  MG_CK(cudaMalloc(&x->d_status, sizeof(int)));
  for (int i = 0; i < MG_B2B; ++i) {
    MG_CK(cudaHostAlloc(&x->h_topk[i], (size_t)T * K * 8, cudaHostAllocDefault));
    MG_CK(cudaHostAlloc(&x->h_x[i], (size_t)T * H * 2, cudaHostAllocDefault));
    MG_CK(cudaHostAlloc(&x->h_xs[i], xs_bytes, cudaHostAllocDefault));
    MG_CK(cudaHostAlloc((void**)&x->h_w[i], (size_t)T * K * 4, cudaHostAllocDefault));
    model_alloc(c, &x->model[i]);
    x->models = i + 1;
    if (!x->model[i].x || !x->model[i].xq || !x->model[i].xs || !x->model[i].topk || !x->model[i].w || !x->model[i].row ||
        !x->model[i].em_row || !x->model[i].rows_total || !x->model[i].em_total)
      return mg_fail(x, "out of host memory (model)");
  }
  x->h_route = (uint8_t*)malloc(x->route_bytes);
  x->h_out = (uint16_t*)malloc((size_t)MG_B2B * T * H * 2);
  x->acc = (float*)malloc((size_t)H * 4);
  x->part = (float*)malloc((size_t)H * 4);
  x->y = (uint16_t*)malloc((size_t)H * 2);
  x->want = (uint16_t*)malloc((size_t)H * 2);
  x->yq = (uint8_t*)malloc((size_t)H + H / 32);
  if (!x->h_route || !x->h_out || !x->acc || !x->part || !x->y || !x->want || !x->yq) return mg_fail(x, "out of host memory");
  /* the setup handshake: every rank must hold the same plan */
  MG_SYNC();
  mg_handshake_kernel<<<1, 128, 0, x->stream>>>(x->m.team, x->plan, epf_wait_make(x->plan.timeout_ns, x->m.rec_d, NULL, x->me),
                                                x->d_status);
  MG_CK(cudaGetLastError());
  MG_CK(cudaMemcpyAsync(&hs_status, x->d_status, sizeof(int), cudaMemcpyDeviceToHost, x->stream));
  MG_CK(cudaStreamSynchronize(x->stream));
  if (hs_status != EPF_OK) return mg_fail(x, "handshake: %s", epf_status_name((epf_status_t)hs_status));
  return 0;
}

#define MG_FREE_DEV(p)                                                                        \
  do {                                                                                        \
    if ((p) != NULL && cudaFree(p) != cudaSuccess && !x->a->failed) mg_fail(x, "cudaFree(%s) failed", #p); \
    (p) = NULL;                                                                               \
  } while (0)
#define MG_FREE_PINNED(p)                                                                          \
  do {                                                                                             \
    if ((p) != NULL && cudaFreeHost(p) != cudaSuccess && !x->a->failed) mg_fail(x, "cudaFreeHost(%s) failed", #p); \
    (p) = NULL;                                                                                    \
  } while (0)

static void mg_teardown(mg_ctx_t* x) {
  /* a failed rank's kernels end at their timeouts */
  if (x->stream != NULL && cudaStreamSynchronize(x->stream) != cudaSuccess && !x->a->failed) mg_fail(x, "teardown: stream sync failed");
  if (x->graph_exec != NULL && cudaGraphExecDestroy(x->graph_exec) != cudaSuccess && !x->a->failed) mg_fail(x, "cudaGraphExecDestroy failed");
  if (x->graph != NULL && cudaGraphDestroy(x->graph) != cudaSuccess && !x->a->failed) mg_fail(x, "cudaGraphDestroy failed");
  MG_FREE_DEV(x->route_buf);
  MG_FREE_DEV(x->route_snap);
  MG_FREE_DEV(x->d_topk);
  MG_FREE_DEV(x->d_x);
  MG_FREE_DEV(x->d_xs);
  MG_FREE_DEV(x->d_w);
  MG_FREE_DEV(x->d_out);
  MG_FREE_DEV(x->d_expert_out);
  MG_FREE_DEV(x->d_view);
  MG_FREE_DEV(x->d_view_scales);
  MG_FREE_DEV(x->d_state);
  MG_FREE_DEV(x->d_status);
  for (int i = 0; i < MG_B2B; ++i) {
    MG_FREE_PINNED(x->h_topk[i]);
    MG_FREE_PINNED(x->h_x[i]);
    MG_FREE_PINNED(x->h_xs[i]);
    MG_FREE_PINNED(x->h_w[i]);
  }
  for (int i = 0; i < x->models; ++i) model_free(&x->model[i]);
  free(x->h_route);
  free(x->h_out);
  free(x->acc);
  free(x->part);
  free(x->y);
  free(x->want);
  free(x->yq);
  if (x->stream != NULL && cudaStreamDestroy(x->stream) != cudaSuccess && !x->a->failed) mg_fail(x, "cudaStreamDestroy failed");
  if (x->opened) epf_mg_rank_close(&x->m);
}

/* fresh inputs of all ranks for round `round` into model i, and this rank's slice into staging i */
static void mg_generate(mg_ctx_t* x, int i, int round) {
  const ht_case_t* c = &x->c;
  const model_t* m = &x->model[i];
  const int64_t T = c->T, K = c->K, H = c->H, t0 = (int64_t)x->me * T;
  const int sbr = sb_per_row(c);
  uint64_t s = mg_seed(x, round);
  model_generate(c, &x->plan, &x->model[i], &s);
  if (x->a->index64) {
    for (int64_t j = 0; j < T * K; ++j) ((int64_t*)x->h_topk[i])[j] = m->topk[t0 * K + j];
  } else {
    memcpy(x->h_topk[i], m->topk + t0 * K, (size_t)(T * K * 4));
  }
  if (c->x_quantized) {
    memcpy(x->h_x[i], m->xq + t0 * H, (size_t)(T * H));
    memcpy(x->h_xs[i], m->xs + t0 * sbr, (size_t)(T * sbr));
  } else {
    memcpy(x->h_x[i], m->x + t0 * H, (size_t)(T * H * 2));
  }
  memcpy(x->h_w[i], m->w + t0 * K, (size_t)(T * K * 4));
}

/* staging i -> the device inputs, ordered on stream s */
static int mg_upload(mg_ctx_t* x, int i, cudaStream_t s) {
  const ht_case_t* c = &x->c;
  const size_t T = (size_t)c->T, K = (size_t)c->K, H = (size_t)c->H;
  MG_CK(cudaMemcpyAsync(x->d_topk, x->h_topk[i], T * K * (x->a->index64 ? 8 : 4), cudaMemcpyHostToDevice, s));
  MG_CK(cudaMemcpyAsync(x->d_x, x->h_x[i], T * H * (c->x_quantized ? 1 : 2), cudaMemcpyHostToDevice, s));
  if (c->x_quantized) MG_CK(cudaMemcpyAsync(x->d_xs, x->h_xs[i], T * (size_t)sb_per_row(c), cudaMemcpyHostToDevice, s));
  MG_CK(cudaMemcpyAsync(x->d_w, x->h_w[i], T * K * 4, cudaMemcpyHostToDevice, s));
  return 0;
}

/* poison every output: combine outputs, expert outputs, the expand view, this rank's receive /
 * expert-out / combine regions of the window, and the route arrays (not the header or scratch) */
static int mg_poison(mg_ctx_t* x) {
  const ht_case_t* c = &x->c;
  const epf_plan_t* p = &x->plan;
  const epf_region_t* g = p->region;
  char* b = (char*)x->m.win.ptr;
  cudaStream_t s = x->stream;
  MG_CK(cudaMemsetAsync(x->d_out, 0xA7, (size_t)MG_B2B * c->T * c->H * 2, s));
  MG_CK(cudaMemsetAsync(x->d_expert_out, 0xB3, (size_t)x->expert_rows * c->H * 2, s));
  if (x->d_view) MG_CK(cudaMemsetAsync(x->d_view, 0xC5, (size_t)x->expert_rows * p->row_bytes, s));
  if (x->d_view_scales) MG_CK(cudaMemsetAsync(x->d_view_scales, 0xC6, (size_t)x->expert_rows * p->scale_bytes_per_row, s));
  MG_CK(cudaMemsetAsync(b + g[EPF_REGION_RECV_TOKENS].offset, 0xD1, g[EPF_REGION_RECV_TOKENS].bytes, s));
  MG_CK(cudaMemsetAsync(b + g[EPF_REGION_RECV_META].offset, 0xD2, g[EPF_REGION_RECV_META].bytes, s));
  if (g[EPF_REGION_RECV_SCALES].bytes) MG_CK(cudaMemsetAsync(b + g[EPF_REGION_RECV_SCALES].offset, 0xD3, g[EPF_REGION_RECV_SCALES].bytes, s));
  if (g[EPF_REGION_EXPERT_OUT].bytes) MG_CK(cudaMemsetAsync(b + g[EPF_REGION_EXPERT_OUT].offset, 0xD4, g[EPF_REGION_EXPERT_OUT].bytes, s));
  if (g[EPF_REGION_COMBINE].bytes) MG_CK(cudaMemsetAsync(b + g[EPF_REGION_COMBINE].offset, 0xD5, g[EPF_REGION_COMBINE].bytes, s));
  for (int id = EPF_ROUTE_EXPERT_COUNT; id < EPF_ROUTE_SCRATCH; ++id) {
    const epf_region_t* r = &x->route.layout.array[id];
    if (r->bytes) MG_CK(cudaMemsetAsync((char*)x->route_buf + r->offset, 0xA5, r->bytes, s));
  }
  return 0;
}

static epf_ht_step_t mg_step(mg_ctx_t* x, int out_round) {
  const ht_case_t* c = &x->c;
  epf_ht_step_t s = EPF_HT_STEP_INIT;
  s.x = x->d_x;
  s.x_scales = c->x_quantized ? x->d_xs : NULL;
  s.topk_weights = x->d_w;
  s.out = x->d_out + (size_t)out_round * c->T * c->H;
  s.expert_out = c->in_place ? NULL : x->d_expert_out;
  s.em_view = x->d_view;
  s.em_view_scales = x->d_view_scales;
  s.state = x->d_state;
  s.expert_rows = x->expert_rows;
  s.x_quantized = c->x_quantized;
  s.wait = epf_wait_make(x->plan.timeout_ns, x->m.rec_d, NULL, x->me);
  return s;
}

/* part 1: route update (+ a copy of the route buffer into snapshot `snap` >= 0) + dispatch
 * (+ expand); part 2: experts + combine into output `out_round`; 3: both. On stream s. */
static int mg_launch(mg_ctx_t* x, cudaStream_t s, int part, int out_round, int snap) {
  const ht_case_t* c = &x->c;
  const epf_route_step_t rs = epf_route_step_make(x->d_topk, c->T, epf_wait_make(x->plan.timeout_ns, x->m.rec_d, NULL, x->me));
  const epf_ht_step_t hs = mg_step(x, out_round);
  if (part & 1) {
    MG_CS(epf_route_update(&x->route, x->m.team, &x->plan, &rs, s));
    if (snap >= 0)
      MG_CK(cudaMemcpyAsync((char*)x->route_snap + (size_t)snap * x->route_bytes, x->route_buf, x->route_bytes,
                            cudaMemcpyDeviceToDevice, s));
    MG_CS(epf_ht_dispatch(&x->route, x->m.team, &x->plan, &hs, x->d_topk, EPF_HT_BOTH, s));
    if (c->layout == EPF_LAYOUT_RANK_MAJOR) MG_CS(epf_ht_expand(&x->route, x->m.team, &x->plan, &hs, s));
  }
  if (part & 2) {
    /* the experts read this rank's own window slice (route index 0, rank = this rank) */
    experts_kernel<<<dim3(64, 1), 256, 0, s>>>(x->route, x->plan, (char*)x->m.win.ptr, x->me, x->d_view, x->d_view_scales,
                                               x->expert_rows, x->d_expert_out, c->in_place);
    MG_CK(cudaGetLastError());
    MG_CS(epf_ht_combine(&x->route, x->m.team, &x->plan, &hs, x->d_topk, s));
  }
  return 0;
}

static int mg_check_record(mg_ctx_t* x, const char* what) {
  epf_error_record_t rec;
  epf_error_read(x->m.rec_h, &rec);
  if (rec.status != 0 || rec.count != 0 || rec.recv_overflow != 0 || rec.dropped_routes != 0 || rec.masked_ranks != 0)
    return mg_fail(x, "%s: error record %s (count %u, waiter rank %d block %d thread %d, peer %d, wanted %llu seen %llu after %llu ns), "
                   "overflow %u, dropped %u, masked %u",
                   what, epf_status_name((epf_status_t)rec.status), rec.count, rec.waiter_rank, rec.waiter_block, rec.waiter_thread,
                   rec.peer, (unsigned long long)rec.wanted, (unsigned long long)rec.seen, (unsigned long long)rec.elapsed_ns,
                   rec.recv_overflow, rec.dropped_routes, rec.masked_ranks);
  epf_error_clear(x->m.rec_h);
  return 0;
}

/* the route buffer `dev` (the live one or a snapshot) after the update of `epoch`, against the
 * reference of the whole team built from model i */
static int mg_check_route(mg_ctx_t* x, const void* dev, int i, uint32_t epoch, const char* what) {
  const ht_case_t* c = &x->c;
  route_ref_t ref;
  char msg[384];
  int bad;
  MG_CK(cudaMemcpyAsync(x->h_route, dev, x->route_bytes, cudaMemcpyDeviceToHost, x->stream));
  MG_CK(cudaStreamSynchronize(x->stream));
  if (route_ref_compute(&ref, c->R, c->E, c->K, c->T, c->align, c->layout == EPF_LAYOUT_RANK_MAJOR, x->plan.recv_capacity,
                        x->model[i].topk) != 0)
    return mg_fail(x, "%s: out of host memory (route reference)", what);
  bad = route_ref_check(&ref, x->me, &x->route.layout, x->h_route, epoch, msg, sizeof(msg));
  route_ref_free(&ref);
  if (bad) return mg_fail(x, "%s: %s", what, msg);
  return 0;
}

/* this rank's receive regions (payload, scales, metadata), EM pad rows' marks, the RM expand view,
 * against model i (model_place done); after the dispatch, before the combine */
static int mg_check_recv(mg_ctx_t* x, int i, const char* what) {
  const ht_case_t* c = &x->c;
  const epf_plan_t* p = &x->plan;
  const epf_region_t* g = p->region;
  const char* b = (const char*)x->m.win.ptr;
  const int EL = c->E / c->R;
  const size_t tok_bytes = g[EPF_REGION_RECV_TOKENS].bytes, meta_bytes = g[EPF_REGION_RECV_META].bytes,
               sc_bytes = g[EPF_REGION_RECV_SCALES].bytes;
  uint8_t* tok = (uint8_t*)malloc(tok_bytes);
  uint8_t* meta = (uint8_t*)malloc(meta_bytes);
  uint8_t* sc = (uint8_t*)malloc(sc_bytes + 1);
  uint8_t* view = NULL;
  char msg[384];
  int bad = 0;
  if (tok == NULL || meta == NULL || sc == NULL) {
    free(tok);
    free(meta);
    free(sc);
    return mg_fail(x, "%s: out of host memory (receive regions)", what);
  }
  if (cudaMemcpyAsync(tok, b + g[EPF_REGION_RECV_TOKENS].offset, tok_bytes, cudaMemcpyDeviceToHost, x->stream) != cudaSuccess ||
      cudaMemcpyAsync(meta, b + g[EPF_REGION_RECV_META].offset, meta_bytes, cudaMemcpyDeviceToHost, x->stream) != cudaSuccess ||
      (sc_bytes && cudaMemcpyAsync(sc, b + g[EPF_REGION_RECV_SCALES].offset, sc_bytes, cudaMemcpyDeviceToHost, x->stream) != cudaSuccess) ||
      cudaStreamSynchronize(x->stream) != cudaSuccess) {
    snprintf(msg, sizeof(msg), "copying the receive regions failed");
    bad = 1;
  }
  if (!bad) bad = check_recv_rank(c, &x->model[i], p, x->me, tok, meta, sc, msg, sizeof(msg));
  /* EXPERT_MAJOR with alignment > 1: the route marks its pad rows (src_token = -1) */
  if (!bad && c->layout == EPF_LAYOUT_EXPERT_MAJOR && c->align > 1) {
    route_ref_t ref;
    if (route_ref_compute(&ref, c->R, c->E, c->K, c->T, c->align, 0, p->recv_capacity, x->model[i].topk) != 0) {
      snprintf(msg, sizeof(msg), "out of host memory (route reference)");
      bad = 1;
    } else {
      for (int j = 0; j < EL && !bad; ++j) {
        const int32_t* sg = ref.seg + ((size_t)x->me * EL + j) * 4;
        for (int64_t row = (int64_t)sg[0] + sg[1]; row < (int64_t)sg[0] + sg[2] && row < p->recv_capacity; ++row) {
          const epf_recv_meta_em_t* me = (const epf_recv_meta_em_t*)(meta + (uint64_t)row * p->meta_bytes_per_row);
          if (me->src_token != -1 || me->src_rank != -1 || me->k != -1 || me->local_expert != j || me->weight != 0.0f) {
            snprintf(msg, sizeof(msg), "rank %d pad row %lld (local expert %d): metadata is not a pad mark", x->me, (long long)row, j);
            bad = 1;
            break;
          }
        }
      }
      route_ref_free(&ref);
    }
  }
  if (!bad && c->layout == EPF_LAYOUT_RANK_MAJOR) {
    view = (uint8_t*)malloc((size_t)x->expert_rows * p->row_bytes);
    if (view == NULL ||
        cudaMemcpyAsync(view, x->d_view, (size_t)x->expert_rows * p->row_bytes, cudaMemcpyDeviceToHost, x->stream) != cudaSuccess ||
        cudaStreamSynchronize(x->stream) != cudaSuccess) {
      snprintf(msg, sizeof(msg), "copying the expand view failed");
      bad = 1;
    }
    if (!bad) bad = check_expand_rank(c, &x->model[i], p, x->me, view, x->expert_rows, msg, sizeof(msg));
  }
  free(tok);
  free(meta);
  free(sc);
  free(view);
  if (bad) return mg_fail(x, "%s: %s", what, msg);
  return 0;
}

/* this rank's combine output `out_round` against the reference of model i (model_place done) */
static int mg_check_combine(mg_ctx_t* x, int i, int out_round, const char* what) {
  const ht_case_t* c = &x->c;
  const int64_t T = c->T, H = c->H;
  const uint16_t* out = x->h_out + (size_t)out_round * T * H;
  MG_CK(cudaMemcpyAsync(x->h_out + (size_t)out_round * T * H, x->d_out + (size_t)out_round * T * H, (size_t)(T * H * 2),
                        cudaMemcpyDeviceToHost, x->stream));
  MG_CK(cudaStreamSynchronize(x->stream));
  for (int64_t t = 0; t < T; ++t) {
    ref_combine_token(c, &x->model[i], &x->plan, x->expert_rows, (int64_t)x->me * T + t, x->acc, x->part, x->y, x->yq, x->want);
    if (memcmp(out + t * H, x->want, (size_t)H * 2) != 0)
      for (int64_t h = 0; h < H; ++h)
        if (out[t * H + h] != x->want[h])
          return mg_fail(x, "%s: combine output of rank %d token %lld h %lld: got %04x want %04x", what, x->me, (long long)t,
                         (long long)h, out[t * H + h], x->want[h]);
  }
  return 0;
}

/* one round with host syncs between the halves: route, receive regions, then the combine */
static int mg_single_round(mg_ctx_t* x) {
  mg_generate(x, 0, 0);
  MG_DO(mg_poison(x));
  MG_DO(mg_upload(x, 0, x->stream));
  MG_CK(cudaStreamSynchronize(x->stream));
  MG_SYNC(); /* every rank poisoned its window before any dispatch writes into it */
  MG_DO(mg_launch(x, x->stream, 1, 0, -1));
  MG_CK(cudaStreamSynchronize(x->stream));
  x->epoch++;
  MG_DO(mg_check_record(x, "single round, route + dispatch"));
  MG_DO(mg_check_route(x, x->route_buf, 0, x->epoch, "single round"));
  model_place(&x->c, &x->model[0]);
  MG_DO(mg_check_recv(x, 0, "single round"));
  MG_SYNC(); /* every rank checked its receive regions before any combine touches them */
  MG_DO(mg_launch(x, x->stream, 2, 0, -1));
  MG_CK(cudaStreamSynchronize(x->stream));
  MG_SYNC(); /* no peer reads this rank's window any more */
  MG_DO(mg_check_record(x, "single round, experts + combine"));
  MG_DO(mg_check_combine(x, 0, 0, "single round"));
  x->a->rounds_checked++;
  return 0;
}

/* MG_B2B rounds back to back, no host sync: each round's inputs copied on the stream before it */
static int mg_back_to_back(mg_ctx_t* x) {
  char what[64];
  for (int i = 0; i < MG_B2B; ++i) mg_generate(x, i, 1 + i);
  MG_DO(mg_poison(x));
  MG_CK(cudaStreamSynchronize(x->stream));
  MG_SYNC();
  for (int i = 0; i < MG_B2B; ++i) {
    MG_DO(mg_upload(x, i, x->stream));
    MG_DO(mg_launch(x, x->stream, 3, i, i));
  }
  MG_CK(cudaStreamSynchronize(x->stream));
  MG_SYNC();
  MG_DO(mg_check_record(x, "back-to-back rounds"));
  for (int i = 0; i < MG_B2B; ++i) {
    snprintf(what, sizeof(what), "back-to-back round %d", i);
    MG_DO(mg_check_route(x, (const char*)x->route_snap + (size_t)i * x->route_bytes, i, x->epoch + 1u + (uint32_t)i, what));
    model_place(&x->c, &x->model[i]);
    MG_DO(mg_check_combine(x, i, i, what));
    x->a->rounds_checked++;
  }
  x->epoch += MG_B2B;
  return 0;
}

/* a CUDA graph of one whole round, replayed with fresh inputs in the captured buffers */
static int mg_graph(mg_ctx_t* x) {
  char what[64];
  int rc;
  cudaError_t e;
  MG_CK(cudaStreamBeginCapture(x->stream, cudaStreamCaptureModeThreadLocal));
  rc = mg_launch(x, x->stream, 3, 0, -1);
  e = cudaStreamEndCapture(x->stream, &x->graph);
  if (rc != 0) return rc;
  MG_CK(e);
  MG_CK(cudaGraphInstantiate(&x->graph_exec, x->graph, 0));
  for (int r = 0; r < MG_REPLAYS; ++r) {
    snprintf(what, sizeof(what), "graph replay %d", r);
    mg_generate(x, 0, 1 + MG_B2B + r);
    MG_DO(mg_poison(x));
    MG_DO(mg_upload(x, 0, x->stream));
    MG_CK(cudaStreamSynchronize(x->stream));
    MG_SYNC();
    MG_CK(cudaGraphLaunch(x->graph_exec, x->stream));
    MG_CK(cudaStreamSynchronize(x->stream));
    x->epoch++;
    MG_SYNC();
    MG_DO(mg_check_record(x, what));
    MG_DO(mg_check_route(x, x->route_buf, 0, x->epoch, what));
    model_place(&x->c, &x->model[0]);
    MG_DO(mg_check_combine(x, 0, 0, what));
    x->a->rounds_checked++;
  }
  return 0;
}

static void* mg_thread(void* p) {
  mg_arg_t* a = (mg_arg_t*)p;
  mg_ctx_t x;
  memset(&x, 0, sizeof(x));
  x.a = a;
  x.c = a->c;
  x.me = a->rank;
  if (cudaSetDevice(a->rank) != cudaSuccess) {
    mg_fail(&x, "cudaSetDevice(%d) failed", a->rank);
    return NULL;
  }
  if (mg_setup(&x) == 0 && mg_single_round(&x) == 0 && mg_back_to_back(&x) == 0) mg_graph(&x);
  mg_teardown(&x);
  return NULL;
}

/* ---- the cmocka side --------------------------------------------------------------------------- */

static int g_ngpus;
static uint64_t g_seed;

static void test_mg_case(void** state) {
  const mg_case_t* mc = (const mg_case_t*)*state;
  const int n = g_ngpus;
  mg_arg_t args[EPF_MG_MAX];
  mg_sync_t sync;
  ncclUniqueId id;
  ht_case_t c = mc->c;
  int first_bad = -1;
  c.R = n;
  c.E = (c.E + n - 1) / n * n; /* experts divisible by the ranks */
  assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
  assert_int_equal(mg_sync_init(&sync, n), 0);
  for (int r = 0; r < n; ++r) {
    memset(&args[r], 0, sizeof(args[r]));
    args[r].rank = r;
    args[r].nranks = n;
    args[r].case_index = (int)(mc - k_mg_cases);
    args[r].id = id;
    args[r].seed = g_seed;
    args[r].c = c;
    args[r].index64 = mc->index64;
    args[r].sync = &sync;
  }
  const int run = epf_mg_run(n, mg_thread, args, sizeof(args[0]));
  mg_sync_destroy(&sync);
  for (int r = 0; r < n; ++r) {
    if (args[r].failed) printf("  rank %d FAILED: %s\n", r, args[r].msg);
    else if (args[r].aborted) printf("  rank %d stopped: another rank failed\n", r);
    if (first_bad < 0 && (args[r].failed || args[r].rounds_checked != MG_ROUNDS)) first_bad = r;
  }
  assert_int_equal(run, 0);
  if (first_bad >= 0) {
    for (int r = 0; r < n; ++r)
      if (args[r].failed) fail_msg("%s: rank %d: %s", mc->name, r, args[r].msg);
    fail_msg("%s: rank %d checked %d of %d rounds", mc->name, first_bad, args[first_bad].rounds_checked, MG_ROUNDS);
  }
  for (int r = 0; r < n; ++r) assert_int_equal(args[r].rounds_checked, MG_ROUNDS);
  printf("HT over NCCL, %d GPU(s): %s (T=%d H=%d top-%d of %d experts, %s/%s%s%s, align %d, %s ids): route, receive "
         "regions and combine of 1 round, %d back-to-back rounds, %d graph replays bit-exact on every rank\n",
         n, mc->name, c.T, c.H, c.K, c.E, c.payload == BF ? "bf16" : c.payload == MX ? "mxfp8" : "fp8-128",
         c.combine_payload == BF ? "bf16" : "mxfp8", c.push ? " push" : " pull", c.in_place ? " in place" : "", c.align,
         mc->index64 ? "int64" : "int32", MG_B2B, MG_REPLAYS);
}

int main(void) {
  struct CMUnitTest tests[MG_NCASES];
  const int n = epf_mg_gpus(2);
  if (n == 77) return 77;
  g_ngpus = n;
  g_seed = epf_test_seed();
  for (int i = 0; i < MG_NCASES; ++i) {
    const struct CMUnitTest t = cmocka_unit_test_prestate(test_mg_case, (void*)&k_mg_cases[i]);
    tests[i] = t;
  }
  return cmocka_run_group_tests(tests, NULL, NULL);
}
