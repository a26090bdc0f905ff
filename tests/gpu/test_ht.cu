/* test_ht — high-throughput dispatch + combine (kernels_ht.cuh over route, dispatch, combine and
 * quant blocks) against a CPU reference written here, bit-exact:
 *   - receive regions: every row of every rank (payload bytes, scales, metadata) where the
 *     reference says it lands (expert-major: by local expert, source, (token, k); rank-major: by
 *     source, token), for BF16, MXFP8 and per-128 FP8 quantized on the way, and caller-quantized
 *     rows forwarded byte for byte; the rank-major expand into the expert-major view;
 *   - combine output: per-expert transform y = bf16(dequant(x) * f(expert)), weighted FP32 fma
 *     reduction in k order (rank-major: per-rank partials in k order, then ranks in order), BF16
 *     or MXFP8 travel, pull and push;
 *   - virtual ranks R in {1, 2, 3, 4, 5, 6, 8} and a real 1-rank NCCL window; H in {2880, 4096, 7168};
 *     K in {1, 2, 6, 8, 22}; E in {8, 64, 160, 256, 384}; T in {1, 37, 777, 1000, 4096} (issue #14 §1's
 *     two shapes among them); random, skewed and partly -1 routing;
 *     per-128 FP8 with H = 2880 refused with EPF_ERR_HIDDEN_ALIGNMENT; an overflow case (rows past
 *     recv_capacity dropped, counted, never written);
 *   - per-128 FP8 receive scales in the GEMM-ready SEGMENT_MN_MAJOR layout (issue #18), mapped
 *     through epf_recv_scale_offset, equal to the compact reference; its refusals;
 *   - 100 back-to-back rounds with new routing; a CUDA graph of route + dispatch + experts +
 *     combine replayed 1000 times with fresh topk_idx.
 * EPF_TEST_SMALL=1 runs one small case only (for compute-sanitizer). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "epf_cmocka.h"
#include "epf_test_gpu.h"
#include "epf_ht_ref.h"
#include "epfuse/epfuse.cuh"
#include "epfuse/kernels_ht.cuh"
#if EPF_TEST_WITH_NCCL
#include "epfuse/nccl.cuh"
#endif

static uint64_t g_seed;


/* ---- one case --------------------------------------------------------------------------------- */

typedef struct {
  epf_plan_t plan;
  char* window;
  void* route_buf;
  epf_route_t route;
  epf_team_t team;
  void* d_topk;
  void* d_x;
  void* d_xs;
  float* d_w;
  uint16_t* d_out;
  uint16_t* d_expert_out;
  uint8_t* d_view;
  uint8_t* d_view_scales;
  epf_ht_state_t* d_state;
  epf_error_record_t* rec_h;
  epf_error_record_t* rec_d;
  int64_t expert_rows;
  int index64;
} ht_dev_t;

static void dev_setup(const ht_case_t* c, int64_t capacity, ht_dev_t* d, char* nccl_window, epf_team_t* nccl_team) {
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  uint64_t rbytes = 0;
  memset(d, 0, sizeof(*d));
  assert_int_equal(make_plan(c, capacity, &d->plan), EPF_OK);
  if (nccl_window) {
    d->window = nccl_window;
    d->team = *nccl_team;
  } else {
    EPF_CHECK_CUDA(cudaMalloc(&d->window, (size_t)c->R * d->plan.total_bytes));
    EPF_CHECK_CUDA(cudaMemset(d->window, 0, (size_t)c->R * d->plan.total_bytes));
    d->team = epf_team_virtual(d->window, d->plan.total_bytes, 0, c->R);
  }
  d->index64 = (int)(epf_test_rand(&g_seed) & 1);
  rc.index_type = d->index64 ? EPF_INDEX_INT64 : EPF_INDEX_INT32;
  assert_int_equal(epf_route_size(&d->plan, &rc, &rbytes), EPF_OK);
  EPF_CHECK_CUDA(cudaMalloc(&d->route_buf, (size_t)rbytes * c->R));
  assert_int_equal(epf_route_init(&d->plan, &rc, d->route_buf, rbytes * c->R, c->R, 1u + (uint32_t)(epf_test_rand(&g_seed) % 1000), 0, &d->route), EPF_OK);
  EPF_CHECK_CUDA(cudaMalloc(&d->d_topk, (size_t)c->R * c->T * c->K * 8));
  EPF_CHECK_CUDA(cudaMalloc(&d->d_x, (size_t)c->R * c->T * c->H * 2));
  EPF_CHECK_CUDA(cudaMalloc(&d->d_xs, (size_t)c->R * c->T * (c->H / 32 + 4) * 4));
  EPF_CHECK_CUDA(cudaMalloc(&d->d_w, (size_t)c->R * c->T * c->K * 4));
  EPF_CHECK_CUDA(cudaMalloc(&d->d_out, (size_t)c->R * c->T * c->H * 2));
  d->expert_rows = d->plan.recv_capacity * (c->layout == EPF_LAYOUT_RANK_MAJOR ? (c->K < c->E / c->R ? c->K : c->E / c->R) : 1) +
                   (int64_t)(c->E / c->R) * c->align;
  EPF_CHECK_CUDA(cudaMalloc(&d->d_expert_out, (size_t)c->R * d->expert_rows * c->H * 2));
  if (c->layout == EPF_LAYOUT_RANK_MAJOR) {
    EPF_CHECK_CUDA(cudaMalloc(&d->d_view, (size_t)c->R * d->expert_rows * d->plan.row_bytes));
    if (d->plan.scale_bytes_per_row)
      EPF_CHECK_CUDA(cudaMalloc(&d->d_view_scales, (size_t)c->R * d->expert_rows * d->plan.scale_bytes_per_row));
  }
  EPF_CHECK_CUDA(cudaMalloc(&d->d_state, c->R * sizeof(epf_ht_state_t)));
  EPF_CHECK_CUDA(cudaMemset(d->d_state, 0, c->R * sizeof(epf_ht_state_t)));
  EPF_CHECK_CUDA(cudaHostAlloc(&d->rec_h, sizeof(epf_error_record_t), cudaHostAllocMapped));
  EPF_CHECK_CUDA(cudaHostGetDevicePointer(&d->rec_d, d->rec_h, 0));
  epf_error_clear(d->rec_h);
}

static void dev_free(ht_dev_t* d, int own_window) {
  if (own_window) EPF_CHECK_CUDA(cudaFree(d->window));
  EPF_CHECK_CUDA(cudaFree(d->route_buf));
  EPF_CHECK_CUDA(cudaFree(d->d_topk));
  EPF_CHECK_CUDA(cudaFree(d->d_x));
  EPF_CHECK_CUDA(cudaFree(d->d_xs));
  EPF_CHECK_CUDA(cudaFree(d->d_w));
  EPF_CHECK_CUDA(cudaFree(d->d_out));
  EPF_CHECK_CUDA(cudaFree(d->d_expert_out));
  if (d->d_view) EPF_CHECK_CUDA(cudaFree(d->d_view));
  if (d->d_view_scales) EPF_CHECK_CUDA(cudaFree(d->d_view_scales));
  EPF_CHECK_CUDA(cudaFree(d->d_state));
  EPF_CHECK_CUDA(cudaFreeHost(d->rec_h));
}

static epf_ht_step_t make_step(const ht_case_t* c, ht_dev_t* d) {
  epf_ht_step_t s;
  memset(&s, 0, sizeof(s));
  s.x = d->d_x; /* BF16 rows, or the caller-quantized rows (upload_inputs puts them there) */
  s.x_scales = c->x_quantized ? d->d_xs : NULL;
  s.topk_weights = d->d_w;
  s.out = d->d_out;
  s.expert_out = c->in_place ? NULL : d->d_expert_out;
  s.em_view = d->d_view;
  s.em_view_scales = d->d_view_scales;
  s.state = d->d_state;
  s.expert_rows = d->expert_rows;
  s.x_quantized = c->x_quantized;
  s.wait = epf_wait_make(d->plan.timeout_ns, d->rec_d, NULL, 0);
  return s;
}

/* upload fresh inputs of one round into the device buffers */
static void upload_inputs(const ht_case_t* c, ht_dev_t* d, model_t* m) {
  const int64_t n = (int64_t)c->R * c->T;
  model_generate(c, &d->plan, m, &g_seed);
  if (c->x_quantized) {
    EPF_CHECK_CUDA(cudaMemcpy(d->d_x, m->xq, (size_t)n * c->H, cudaMemcpyHostToDevice));
    EPF_CHECK_CUDA(cudaMemcpy(d->d_xs, m->xs, (size_t)n * sb_per_row(c), cudaMemcpyHostToDevice));
  } else {
    EPF_CHECK_CUDA(cudaMemcpy(d->d_x, m->x, (size_t)n * c->H * 2, cudaMemcpyHostToDevice));
  }
  if (d->index64) {
    int64_t* t64 = (int64_t*)malloc((size_t)n * c->K * 8);
    for (int64_t i = 0; i < n * c->K; ++i) t64[i] = m->topk[i];
    EPF_CHECK_CUDA(cudaMemcpy(d->d_topk, t64, (size_t)n * c->K * 8, cudaMemcpyHostToDevice));
    free(t64);
  } else {
    EPF_CHECK_CUDA(cudaMemcpy(d->d_topk, m->topk, (size_t)n * c->K * 4, cudaMemcpyHostToDevice));
  }
  EPF_CHECK_CUDA(cudaMemcpy(d->d_w, m->w, (size_t)n * c->K * 4, cudaMemcpyHostToDevice));
  /* poison every output */
  EPF_CHECK_CUDA(cudaMemset(d->d_out, 0xA7, (size_t)n * c->H * 2));
  EPF_CHECK_CUDA(cudaMemset(d->d_expert_out, 0xB3, (size_t)c->R * d->expert_rows * c->H * 2));
  if (d->d_view) EPF_CHECK_CUDA(cudaMemset(d->d_view, 0xC5, (size_t)c->R * d->expert_rows * d->plan.row_bytes));
  for (int r = 0; r < c->R; ++r) {
    char* b = d->window + (uint64_t)r * d->plan.total_bytes;
    const epf_region_t* g = d->plan.region;
    EPF_CHECK_CUDA(cudaMemset(b + g[EPF_REGION_RECV_TOKENS].offset, 0xD1, g[EPF_REGION_RECV_TOKENS].bytes));
    EPF_CHECK_CUDA(cudaMemset(b + g[EPF_REGION_RECV_META].offset, 0xD2, g[EPF_REGION_RECV_META].bytes));
    if (g[EPF_REGION_RECV_SCALES].bytes) EPF_CHECK_CUDA(cudaMemset(b + g[EPF_REGION_RECV_SCALES].offset, 0xD3, g[EPF_REGION_RECV_SCALES].bytes));
    if (g[EPF_REGION_EXPERT_OUT].bytes) EPF_CHECK_CUDA(cudaMemset(b + g[EPF_REGION_EXPERT_OUT].offset, 0xD4, g[EPF_REGION_EXPERT_OUT].bytes));
    if (g[EPF_REGION_COMBINE].bytes) EPF_CHECK_CUDA(cudaMemset(b + g[EPF_REGION_COMBINE].offset, 0xD5, g[EPF_REGION_COMBINE].bytes));
  }
}

/* part 1: route update + dispatch (+ expand); part 2: experts + combine; 3: both */
static void launch_round(const ht_case_t* c, ht_dev_t* d, cudaStream_t stream, int part) {
  epf_route_step_t rs = epf_route_step_make(d->d_topk, c->T, epf_wait_make(d->plan.timeout_ns, d->rec_d, NULL, 0));
  epf_ht_step_t hs = make_step(c, d);
  dim3 eg(64, (unsigned)c->R);
  if (part & 1) {
    assert_int_equal(epf_route_update(&d->route, d->team, &d->plan, &rs, stream), EPF_OK);
    assert_int_equal(epf_ht_dispatch(&d->route, d->team, &d->plan, &hs, d->d_topk, EPF_HT_BOTH, stream), EPF_OK);
    if (c->layout == EPF_LAYOUT_RANK_MAJOR) assert_int_equal(epf_ht_expand(&d->route, d->team, &d->plan, &hs, stream), EPF_OK);
  }
  if (!(part & 2)) return;
  experts_kernel<<<eg, 256, 0, stream>>>(d->route, d->plan, d->window, 0, d->d_view, d->d_view_scales, d->expert_rows,
                                         d->d_expert_out, c->in_place);
  EPF_CHECK_CUDA(cudaGetLastError());
  assert_int_equal(epf_ht_combine(&d->route, d->team, &d->plan, &hs, d->d_topk, stream), EPF_OK);
}

/* check the receive regions (data, scales, metadata) and the combine output against the model */
/* check_recv: the receive regions (call after part 1: the combine may overwrite them in place);
 * check_comb: the combine output and the error record (after part 2) */
static void check_round(const ht_case_t* c, ht_dev_t* d, model_t* m, int check_recv, int check_comb) {
  const int R = c->R, T = c->T, K = c->K, H = c->H;
  const epf_plan_t* p = &d->plan;
  const int64_t cap = p->recv_capacity;
  uint64_t expected_dropped = 0;
  char msg[256];
  model_place(c, m);
  /* dropped copies: rows at or past the capacity */
  for (int64_t i = 0; i < (int64_t)R * T * (c->layout == EPF_LAYOUT_RANK_MAJOR ? R : K); ++i) expected_dropped += m->row[i] >= cap;
  /* RANK_MAJOR: a received copy whose expert-major view row is at or past expert_rows is dropped by
   * the expand and counted too (the view's offsets count every copy, received or not, so skewed
   * routing over a small capacity can place a received copy past the view) */
  if (c->layout == EPF_LAYOUT_RANK_MAJOR)
    for (int64_t st = 0; st < (int64_t)R * T; ++st)
      for (int k = 0; k < K; ++k) {
        const int e = m->topk[st * K + k];
        if (e < 0 || ht_ref_first_k(m->topk + st * K, k) != k) continue;
        if (m->row[st * R + e / (c->E / R)] < cap && m->em_row[st * K + k] >= d->expert_rows) ++expected_dropped;
      }

  if (check_recv) {
    const size_t tok_bytes = d->plan.region[EPF_REGION_RECV_TOKENS].bytes, meta_bytes = d->plan.region[EPF_REGION_RECV_META].bytes,
                 sc_bytes = d->plan.region[EPF_REGION_RECV_SCALES].bytes;
    uint8_t* tok = (uint8_t*)malloc(tok_bytes);
    uint8_t* meta = (uint8_t*)malloc(meta_bytes);
    uint8_t* sc = (uint8_t*)malloc(sc_bytes + 1);
    for (int dst = 0; dst < R; ++dst) {
      const char* b = d->window + (uint64_t)dst * p->total_bytes;
      EPF_CHECK_CUDA(cudaMemcpy(tok, b + p->region[EPF_REGION_RECV_TOKENS].offset, tok_bytes, cudaMemcpyDeviceToHost));
      EPF_CHECK_CUDA(cudaMemcpy(meta, b + p->region[EPF_REGION_RECV_META].offset, meta_bytes, cudaMemcpyDeviceToHost));
      if (sc_bytes) EPF_CHECK_CUDA(cudaMemcpy(sc, b + p->region[EPF_REGION_RECV_SCALES].offset, sc_bytes, cudaMemcpyDeviceToHost));
      if (check_recv_rank(c, m, p, dst, tok, meta, sc, msg, sizeof(msg))) fail_msg("%s", msg);
      /* EM pad rows carry src_token = -1 */
    }
    free(tok);
    free(meta);
    free(sc);
    /* RANK_MAJOR: the expand view holds every (token, k) copy at its expert-major row */
    if (c->layout == EPF_LAYOUT_RANK_MAJOR) {
      uint8_t* view = (uint8_t*)malloc((size_t)R * d->expert_rows * p->row_bytes);
      EPF_CHECK_CUDA(cudaMemcpy(view, d->d_view, (size_t)R * d->expert_rows * p->row_bytes, cudaMemcpyDeviceToHost));
      for (int dst = 0; dst < R; ++dst)
        if (check_expand_rank(c, m, p, dst, view + (uint64_t)dst * d->expert_rows * p->row_bytes, d->expert_rows, msg, sizeof(msg)))
          fail_msg("%s", msg);
      free(view);
    }
  }

  if (!check_comb) return;
  /* combine reference */
  {
    uint16_t* out = (uint16_t*)malloc((size_t)R * T * H * 2);
    float* acc = (float*)malloc((size_t)H * 4);
    float* part = (float*)malloc((size_t)H * 4);
    uint16_t* y = (uint16_t*)malloc((size_t)H * 2);
    uint8_t* yq = (uint8_t*)malloc((size_t)H + H / 32);
    uint16_t* want = (uint16_t*)malloc((size_t)H * 2);
    EPF_CHECK_CUDA(cudaMemcpy(out, d->d_out, (size_t)R * T * H * 2, cudaMemcpyDeviceToHost));
    for (int s = 0; s < R; ++s)
      for (int t = 0; t < T; ++t) {
        const int64_t st = (int64_t)s * T + t;
        ref_combine_token(c, m, p, d->expert_rows, st, acc, part, y, yq, want);
        for (int h = 0; h < H; ++h) {
          if (out[st * H + h] != want[h])
            fail_msg("combine: rank %d token %d h %d: got %04x want %04x", s, t, h, out[st * H + h], want[h]);
        }
      }
    free(out);
    free(acc);
    free(part);
    free(y);
    free(yq);
    free(want);
  }
  {
    epf_error_record_t rec;
    epf_error_read(d->rec_h, &rec);
    if (rec.status != 0) fail_msg("error record: %s (peer %d)", epf_status_name((epf_status_t)rec.status), rec.peer);
    if (rec.recv_overflow != expected_dropped)
      fail_msg("recv_overflow %u, expected %llu", rec.recv_overflow, (unsigned long long)expected_dropped);
    epf_error_clear(d->rec_h);
  }
}


static void run_case(const ht_case_t* c, int rounds) {
  ht_dev_t d;
  model_t m;
  const int64_t cap = c->capacity ? c->capacity : exact_capacity(c);
  dev_setup(c, cap, &d, NULL, NULL);
  model_alloc(c, &m);
  for (int r = 0; r < rounds; ++r) {
    upload_inputs(c, &d, &m);
    launch_round(c, &d, 0, 1);
    EPF_CHECK_LAUNCH();
    if (c->T <= 64 || r == 0) check_round(c, &d, &m, 1, 0); /* large shapes: receive regions in round 0 */
    launch_round(c, &d, 0, 2);
    EPF_CHECK_LAUNCH();
    check_round(c, &d, &m, 0, 1);
  }
  printf("HT R=%d T=%d H=%d K=%d E=%d %s %s/%s%s%s%s routing=%d cap=%lld: %d round(s) OK\n", c->R, c->T, c->H, c->K, c->E,
         c->layout == EPF_LAYOUT_RANK_MAJOR ? "rank-major" : "expert-major",
         c->payload == EPF_PAYLOAD_BF16 ? "bf16" : c->payload == EPF_PAYLOAD_MXFP8 ? "mxfp8" : "fp8-128",
         c->combine_payload == EPF_PAYLOAD_BF16 ? "bf16" : "mxfp8", c->push ? " push" : " pull",
         c->x_quantized ? " prequantized" : "", c->swizzled ? " swizzled" : c->seg_mn ? " segment-mn-major" : "", c->routing,
         (long long)cap, rounds);
  model_free(&m);
  dev_free(&d, 1);
}

#define BF EPF_PAYLOAD_BF16
#define MX EPF_PAYLOAD_MXFP8
#define F8 EPF_PAYLOAD_FP8_128
#define EM EPF_LAYOUT_EXPERT_MAJOR
#define RM EPF_LAYOUT_RANK_MAJOR

static const ht_case_t k_cases[] = {
    /* R  T     H     K  E    layout payload combine routing push align xq cap inplace swz [seg_mn] */
    {1, 37, 2880, 2, 8, EM, BF, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0, 0},
    {2, 37, 4096, 8, 64, EM, BF, BF, ROUTE_PARTIAL, 0, 1, 0, 0, 1, 0, 0},
    {4, 37, 7168, 8, 256, EM, BF, BF, ROUTE_RANDOM, 1, 1, 0, 0, 0, 0, 0},
    {8, 37, 2880, 8, 64, EM, MX, BF, ROUTE_PARTIAL, 0, 128, 0, 0, 0, 0, 0},
    {8, 1, 7168, 8, 256, EM, F8, MX, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0, 0},
    {8, 37, 4096, 2, 8, EM, BF, MX, ROUTE_SKEWED, 0, 1, 0, 0, 0, 0, 0},
    {4, 37, 4096, 1, 8, RM, BF, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0, 0},
    {8, 37, 7168, 8, 256, RM, MX, BF, ROUTE_PARTIAL, 1, 1, 0, 0, 0, 0, 0},
    {8, 37, 2880, 8, 64, RM, BF, MX, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0, 0},
    {2, 37, 7168, 8, 64, RM, F8, BF, ROUTE_SKEWED, 0, 1, 0, 0, 0, 0, 0},
    {4, 37, 4096, 8, 64, EM, MX, BF, ROUTE_RANDOM, 0, 1, 1, 0, 0, 0, 0},  /* caller-quantized MXFP8 */
    {4, 37, 4096, 8, 64, EM, F8, BF, ROUTE_RANDOM, 1, 1, 1, 0, 0, 0, 0},  /* caller-quantized FP8 */
    {4, 37, 4096, 8, 64, EM, MX, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 1, 0},  /* swizzled scales */
    {8, 37, 4096, 8, 64, EM, BF, BF, ROUTE_SKEWED, 0, 1, 0, 200, 0, 0, 0}, /* overflow: rows dropped */
    {8, 37, 4096, 8, 64, RM, BF, BF, ROUTE_SKEWED, 1, 1, 0, 60, 0, 0, 0},  /* overflow, rank-major */
    {8, 4096, 7168, 8, 256, EM, BF, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0, 0}, /* the standard shape */
    /* issue #14 §1: hidden / 8 not a multiple of 32 with top-k > 8 (wild reads in the combine) and
     * rank-major BF16 (a hang in the pre-reduce) */
    {6, 777, 2880, 22, 384, EM, BF, BF, ROUTE_RANDOM, 1, 1, 0, 0, 0, 0, 0},
    {5, 777, 2880, 22, 160, EM, BF, BF, ROUTE_PARTIAL, 0, 1, 0, 0, 0, 0, 0},
    {3, 1000, 2880, 6, 384, RM, BF, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0, 0},
    {4, 1000, 2880, 8, 384, RM, MX, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0, 0},
    /* issue #18: per-128 FP8 receive scales in EPF_SCALE_LAYOUT_SEGMENT_MN_MAJOR (each expert
     * segment's [H/128][padded] matrix, what a cuBLASLt VEC128_32F GEMM reads): the payload bytes
     * and, mapped through epf_recv_scale_offset, the scales equal the compact reference's; the
     * experts read them back through the same owner, so the combine checks them too */
    {8, 37, 7168, 8, 256, EM, F8, BF, ROUTE_PARTIAL, 0, 8, 0, 0, 0, 0, 1},    /* quantized on the way */
    {8, 777, 4096, 8, 64, EM, F8, BF, ROUTE_RANDOM, 1, 128, 0, 0, 0, 0, 1},  /* long segments, push */
    {4, 37, 4096, 22, 64, EM, F8, MX, ROUTE_SKEWED, 0, 16, 0, 0, 0, 0, 1},   /* > 8 copies, repeats */
    {4, 37, 4096, 8, 64, EM, F8, BF, ROUTE_RANDOM, 0, 32, 1, 0, 0, 0, 1},    /* caller-quantized: forwarded */
};

static void test_cases(void** state) {
  (void)state;
  const int small = getenv("EPF_TEST_SMALL") != NULL;
  for (size_t i = 0; i < sizeof(k_cases) / sizeof(k_cases[0]); ++i) {
    if (small && i != 1) continue;
    run_case(&k_cases[i], 1);
  }
}

static void test_refusals(void** state) {
  ht_case_t c = {2, 8, 2880, 2, 8, EM, F8, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0, 0};
  epf_plan_t p;
  (void)state;
  assert_int_equal(make_plan(&c, 64, &p), EPF_ERR_HIDDEN_ALIGNMENT); /* per-128 FP8 with H = 2880 */
  assert_int_equal(epf_quant_check(2880, EPF_PAYLOAD_FP8_128), EPF_ERR_HIDDEN_ALIGNMENT);
  c.payload = BF;
  c.H = 2884;
  assert_int_equal(make_plan(&c, 64, &p), EPF_ERR_HIDDEN_ALIGNMENT);
  /* SEGMENT_MN_MAJOR: per-128 FP8, expert-major, alignment >= 8 only */
  c.H = 4096;
  c.seg_mn = 1;
  c.payload = F8;
  c.align = 8;
  assert_int_equal(make_plan(&c, 64, &p), EPF_OK);
  c.align = 4;
  assert_int_equal(make_plan(&c, 64, &p), EPF_ERR_SCALE_LAYOUT);
  c.align = 8;
  c.payload = MX;
  assert_int_equal(make_plan(&c, 64, &p), EPF_ERR_SCALE_LAYOUT);
  c.payload = F8;
  c.layout = RM;
  assert_int_equal(make_plan(&c, 64, &p), EPF_ERR_SCALE_LAYOUT);
}

static void test_back_to_back(void** state) {
  const ht_case_t c = {4, 64, 1024, 4, 16, EM, BF, BF, ROUTE_PARTIAL, 0, 1, 0, 0, 0, 0, 0};
  const ht_case_t c2 = {4, 64, 1024, 4, 16, RM, MX, MX, ROUTE_RANDOM, 1, 1, 0, 0, 0, 0, 0};
  (void)state;
  if (getenv("EPF_TEST_SMALL")) return;
  run_case(&c, 100);
  run_case(&c2, 100);
}

/* a CUDA graph of route + dispatch + experts + combine, replayed 1000 times with fresh topk_idx */
static void test_graph(void** state) {
  const ht_case_t c = {4, 32, 512, 4, 16, EM, BF, BF, ROUTE_PARTIAL, 0, 1, 0, 0, 0, 0, 0};
  ht_dev_t d;
  model_t m;
  cudaStream_t s;
  cudaGraph_t g;
  cudaGraphExec_t ge;
  (void)state;
  if (getenv("EPF_TEST_SMALL")) return;
  dev_setup(&c, exact_capacity(&c), &d, NULL, NULL);
  model_alloc(&c, &m);
  EPF_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  upload_inputs(&c, &d, &m);
  EPF_CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  launch_round(&c, &d, s, 3);
  EPF_CHECK_CUDA(cudaStreamEndCapture(s, &g));
  EPF_CHECK_CUDA(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 1000; ++i) {
    if (i > 0) upload_inputs(&c, &d, &m); /* fresh routing, weights and x into the captured buffers */
    EPF_CHECK_CUDA(cudaGraphLaunch(ge, s));
    EPF_CHECK_CUDA(cudaStreamSynchronize(s));
    if (i % 50 == 0 || i == 999) check_round(&c, &d, &m, 0, 1); /* receive regions: test_cases */
  }
  printf("graph: 1000 replays of route+dispatch+experts+combine with fresh routing OK\n");
  EPF_CHECK_CUDA(cudaGraphExecDestroy(ge));
  EPF_CHECK_CUDA(cudaGraphDestroy(g));
  EPF_CHECK_CUDA(cudaStreamDestroy(s));
  model_free(&m);
  dev_free(&d, 1);
}

#if EPF_TEST_WITH_NCCL
static void test_nccl_one_rank(void** state) {
  const ht_case_t cases[2] = {{1, 37, 2880, 2, 8, EM, MX, BF, ROUTE_PARTIAL, 0, 1, 0, 0, 0, 0, 0},
                              {1, 37, 4096, 8, 8, RM, BF, BF, ROUTE_RANDOM, 1, 1, 0, 0, 0, 0, 0}};
  (void)state;
  if (getenv("EPF_TEST_SMALL")) return;
  for (int ci = 0; ci < 2; ++ci) {
    const ht_case_t* c = &cases[ci];
    ncclUniqueId id;
    ncclComm_t comm;
    ncclDevComm_t dev;
    epf_nccl_window_t win;
    epf_team_t team;
    epf_plan_t plan;
    ht_dev_t d;
    model_t m;
    assert_int_equal(make_plan(c, exact_capacity(c), &plan), EPF_OK);
    assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
    assert_int_equal(epf_nccl_comm_init_rank(&comm, 1, id, 0, 60.0), EPF_OK);
    assert_int_equal(epf_nccl_window_create(comm, plan.total_bytes, 60.0, &win), EPF_OK);
    assert_int_equal(epf_nccl_devcomm_create(comm, 1, 60.0, &dev), EPF_OK);
    assert_int_equal(epf_nccl_team_query(&dev, win.window, 0, &team), EPF_OK);
    dev_setup(c, exact_capacity(c), &d, (char*)win.ptr, &team); /* host-side ops use the allocation's address */
    model_alloc(c, &m);
    for (int r = 0; r < 3; ++r) {
      upload_inputs(c, &d, &m);
      launch_round(c, &d, 0, 1);
      EPF_CHECK_LAUNCH();
      check_round(c, &d, &m, 1, 0);
      launch_round(c, &d, 0, 2);
      EPF_CHECK_LAUNCH();
      check_round(c, &d, &m, 0, 1);
    }
    printf("HT over a 1-rank NCCL window (%s): 3 rounds OK\n", ci ? "rank-major push" : "expert-major MXFP8");
    model_free(&m);
    dev_free(&d, 0);
    assert_int_equal(epf_nccl_devcomm_destroy(comm, &dev), EPF_OK);
    assert_int_equal(epf_nccl_window_destroy(comm, &win, 60.0), EPF_OK);
    assert_int_equal(epf_nccl_comm_destroy(comm, 60.0), EPF_OK);
  }
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refusals), cmocka_unit_test(test_cases), cmocka_unit_test(test_back_to_back),
      cmocka_unit_test(test_graph),
#if EPF_TEST_WITH_NCCL
      cmocka_unit_test(test_nccl_one_rank),
#endif
  };
  int rc = epf_test_gpus_or_skip(1);
  if (rc) return rc;
  g_seed = epf_test_seed();
  return cmocka_run_group_tests(tests, NULL, NULL);
}
