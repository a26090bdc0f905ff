/* test_ht — high-throughput dispatch + combine (ht/kernels.cuh over route, dispatch, combine and
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
#include "epfuse/ht/kernels.cuh"
#if EPF_TEST_WITH_NCCL
#include "epfuse/core/nccl.cuh"
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
  /* the training direction (BF16 plans): dy, the expert stage's dx rows and router-weight
   * gradients, the backward outputs */
  uint16_t* d_dy;    /* [R][T][H] */
  uint16_t* d_dxr;   /* [R][expert_rows][H] dx rows (EM: receive order; RM: view order) */
  float* d_wg;       /* [R][expert_rows] */
  uint16_t* d_dx;    /* [R][T][H] */
  float* d_twg;      /* [R][T][K] */
  uint16_t* h_dy;    /* host copy of dy */
} ht_dev_t;

/* dev_setup — the device buffers of case c at `capacity` (with the training direction's buffers
 * when `train`: BF16 plans only), after checking that they fit the card: 0 (and a printed SKIP
 * with the sizes) when they do not, 1 when set up. Every buffer is owned by the running test
 * (EPF_TEST_MALLOC): a failure part-way leaves nothing behind for the next test
 * (epf_test_teardown). */
static int dev_setup(const ht_case_t* c, int64_t capacity, ht_dev_t* d, char* nccl_window, epf_team_t* nccl_team,
                     int train) {
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  uint64_t rbytes = 0;
  const size_t RT = (size_t)c->R * c->T;
  size_t need;
  char what[160];
  memset(d, 0, sizeof(*d));
  assert_int_equal(make_plan(c, capacity, &d->plan), EPF_OK);
  d->index64 = (int)(epf_test_rand(&g_seed) & 1);
  rc.index_type = d->index64 ? EPF_INDEX_INT64 : EPF_INDEX_INT32;
  assert_int_equal(epf_route_size(&d->plan, &rc, &rbytes), EPF_OK);
  d->expert_rows = d->plan.recv_capacity * (c->layout == EPF_LAYOUT_RANK_MAJOR ? (c->K < c->E / c->R ? c->K : c->E / c->R) : 1) +
                   (int64_t)(c->E / c->R) * c->align;
  train = train && c->payload == EPF_PAYLOAD_BF16 && c->combine_payload == EPF_PAYLOAD_BF16;
  /* what the allocations below take */
  need = (nccl_window ? 0u : (size_t)c->R * d->plan.total_bytes) + (size_t)rbytes * c->R + RT * c->K * 8 + RT * c->H * 2 +
         RT * (c->H / 32 + 4) * 4 + RT * c->K * 4 + RT * c->H * 2 + (size_t)c->R * d->expert_rows * c->H * 2 +
         c->R * sizeof(epf_ht_state_t);
  if (c->layout == EPF_LAYOUT_RANK_MAJOR)
    need += (size_t)c->R * d->expert_rows * (d->plan.row_bytes + d->plan.scale_bytes_per_row);
  if (train) need += RT * c->H * 2 * 2 + (size_t)c->R * d->expert_rows * (c->H * 2 + 4) + RT * c->K * 4;
  snprintf(what, sizeof(what), "HT case R=%d T=%d H=%d K=%d E=%d%s", c->R, c->T, c->H, c->K, c->E,
           train ? " (forward + backward)" : "");
  if (!epf_test_fits(need, what)) return 0;
  if (nccl_window) {
    d->window = nccl_window;
    d->team = *nccl_team;
  } else {
    EPF_TEST_MALLOC(&d->window, (size_t)c->R * d->plan.total_bytes);
    EPF_CHECK_CUDA(cudaMemset(d->window, 0, (size_t)c->R * d->plan.total_bytes));
    d->team = epf_team_virtual(d->window, d->plan.total_bytes, 0, c->R);
  }
  EPF_TEST_MALLOC(&d->route_buf, (size_t)rbytes * c->R);
  assert_int_equal(epf_route_init(&d->plan, &rc, d->route_buf, rbytes * c->R, c->R, 1u + (uint32_t)(epf_test_rand(&g_seed) % 1000), 0, &d->route), EPF_OK);
  EPF_TEST_MALLOC(&d->d_topk, RT * c->K * 8);
  EPF_TEST_MALLOC(&d->d_x, RT * c->H * 2);
  EPF_TEST_MALLOC(&d->d_xs, RT * (c->H / 32 + 4) * 4);
  EPF_TEST_MALLOC(&d->d_w, RT * c->K * 4);
  EPF_TEST_MALLOC(&d->d_out, RT * c->H * 2);
  EPF_TEST_MALLOC(&d->d_expert_out, (size_t)c->R * d->expert_rows * c->H * 2);
  if (c->layout == EPF_LAYOUT_RANK_MAJOR) {
    EPF_TEST_MALLOC(&d->d_view, (size_t)c->R * d->expert_rows * d->plan.row_bytes);
    if (d->plan.scale_bytes_per_row)
      EPF_TEST_MALLOC(&d->d_view_scales, (size_t)c->R * d->expert_rows * d->plan.scale_bytes_per_row);
  }
  EPF_TEST_MALLOC(&d->d_state, c->R * sizeof(epf_ht_state_t));
  EPF_CHECK_CUDA(cudaMemset(d->d_state, 0, c->R * sizeof(epf_ht_state_t)));
  EPF_TEST_HOST_ALLOC(&d->rec_h, sizeof(epf_error_record_t), cudaHostAllocMapped);
  EPF_CHECK_CUDA(cudaHostGetDevicePointer(&d->rec_d, d->rec_h, 0));
  epf_error_clear(d->rec_h);
  if (train) {
    EPF_TEST_MALLOC(&d->d_dy, RT * c->H * 2);
    EPF_TEST_MALLOC(&d->d_dxr, (size_t)c->R * d->expert_rows * c->H * 2);
    EPF_TEST_MALLOC(&d->d_wg, (size_t)c->R * d->expert_rows * 4);
    EPF_TEST_MALLOC(&d->d_dx, RT * c->H * 2);
    EPF_TEST_MALLOC(&d->d_twg, RT * c->K * 4);
    d->h_dy = (uint16_t*)malloc(RT * c->H * 2);
    assert_non_null(d->h_dy);
  }
  return 1;
}

static void dev_free(ht_dev_t* d, int own_window) {
  if (own_window) EPF_TEST_FREE(d->window);
  EPF_TEST_FREE(d->route_buf);
  EPF_TEST_FREE(d->d_topk);
  EPF_TEST_FREE(d->d_x);
  EPF_TEST_FREE(d->d_xs);
  EPF_TEST_FREE(d->d_w);
  EPF_TEST_FREE(d->d_out);
  EPF_TEST_FREE(d->d_expert_out);
  EPF_TEST_FREE(d->d_view);
  EPF_TEST_FREE(d->d_view_scales);
  EPF_TEST_FREE(d->d_state);
  EPF_TEST_FREE(d->rec_h);
  if (d->d_dy) {
    EPF_TEST_FREE(d->d_dy);
    EPF_TEST_FREE(d->d_dxr);
    EPF_TEST_FREE(d->d_wg);
    EPF_TEST_FREE(d->d_dx);
    EPF_TEST_FREE(d->d_twg);
    free(d->h_dy);
  }
}

static epf_ht_step_t make_step(const ht_case_t* c, ht_dev_t* d) {
  epf_ht_step_t s = EPF_HT_STEP_INIT;
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


/* ---- the training direction ------------------------------------------------------------------- */

/* the step of a backward round: dy in x, the forward's ids and weights, the expert stage's dx rows
 * (or in place) and router-weight gradients, the outputs */
static epf_ht_step_t make_backward_step(const ht_case_t* c, ht_dev_t* d, int grads) {
  epf_ht_step_t s = make_step(c, d);
  s.x = d->d_dy;
  s.x_scales = NULL;
  s.out = d->d_dx;
  s.expert_out = c->in_place ? NULL : d->d_dxr;
  s.topk_idx = d->d_topk;
  s.weight_grad = grads ? d->d_wg : NULL;
  s.topk_weights_grad = grads ? d->d_twg : NULL;
  return s;
}

/* fresh dy into d_dy (and h_dy), outputs poisoned */
static void upload_dy(const ht_case_t* c, ht_dev_t* d) {
  const int64_t n = (int64_t)c->R * c->T * c->H;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = epf_test_rand(&g_seed);
    float f = (float)((int64_t)(r % 20001) - 10000) / 1000.0f * ldexpf(1.0f, (int)((r >> 20) % 7) - 3);
    if ((r >> 40) % 64 == 0) f = 0.0f;
    d->h_dy[i] = bf16_rne(f);
  }
  EPF_CHECK_CUDA(cudaMemcpy(d->d_dy, d->h_dy, (size_t)n * 2, cudaMemcpyHostToDevice));
  EPF_CHECK_CUDA(cudaMemset(d->d_dx, 0xA9, (size_t)n * 2));
  EPF_CHECK_CUDA(cudaMemset(d->d_twg, 0xAB, (size_t)c->R * c->T * c->K * 4));
  EPF_CHECK_CUDA(cudaMemset(d->d_dxr, 0xB7, (size_t)c->R * d->expert_rows * c->H * 2));
  EPF_CHECK_CUDA(cudaMemset(d->d_wg, 0xBB, (size_t)c->R * d->expert_rows * 4));
  if (d->d_view) EPF_CHECK_CUDA(cudaMemset(d->d_view, 0xC7, (size_t)c->R * d->expert_rows * d->plan.row_bytes));
}

/* part 1: backward of combine (+ expand); part 2: the experts' backward + backward of dispatch */
static void launch_backward(const ht_case_t* c, ht_dev_t* d, cudaStream_t stream, int part, int split, int grads) {
  epf_ht_step_t hs = make_backward_step(c, d, grads);
  if (part & 1) {
    if (split) {
      assert_int_equal(epf_ht_combine_backward(&d->route, d->team, &d->plan, &hs, EPF_HT_SEND, stream), EPF_OK);
      assert_int_equal(epf_ht_combine_backward(&d->route, d->team, &d->plan, &hs, EPF_HT_RECV, stream), EPF_OK);
    } else {
      assert_int_equal(epf_ht_combine_backward(&d->route, d->team, &d->plan, &hs, EPF_HT_BOTH, stream), EPF_OK);
    }
    if (c->layout == EPF_LAYOUT_RANK_MAJOR) assert_int_equal(epf_ht_expand(&d->route, d->team, &d->plan, &hs, stream), EPF_OK);
  }
  if (!(part & 2)) return;
  experts_backward_kernel<<<dim3(64, (unsigned)c->R), 256, 0, stream>>>(d->route, d->plan, d->window, 0, (const uint16_t*)d->d_view,
                                                                        d->expert_rows, d->d_dxr, grads ? d->d_wg : NULL,
                                                                        c->in_place);
  EPF_CHECK_CUDA(cudaGetLastError());
  assert_int_equal(epf_ht_dispatch_backward(&d->route, d->team, &d->plan, &hs, stream), EPF_OK);
}

/* the copies a round drops (dispatch at the capacity, RANK_MAJOR expand past expert_rows): what
 * the forward counts, and what the backward counts again (model_place done) */
static uint64_t expected_dropped(const ht_case_t* c, const ht_dev_t* d, const model_t* m) {
  const int R = c->R, T = c->T, K = c->K;
  const int64_t cap = d->plan.recv_capacity;
  uint64_t n = 0;
  for (int64_t i = 0; i < (int64_t)R * T * (c->layout == EPF_LAYOUT_RANK_MAJOR ? R : K); ++i) n += m->row[i] >= cap;
  if (c->layout == EPF_LAYOUT_RANK_MAJOR)
    for (int64_t st = 0; st < (int64_t)R * T; ++st)
      for (int k = 0; k < K; ++k) {
        const int e = m->topk[st * K + k];
        if (e < 0 || ht_ref_first_k(m->topk + st * K, k) != k) continue;
        if (m->row[st * R + e / (c->E / R)] < cap && m->em_row[st * K + k] >= d->expert_rows) ++n;
      }
  return n;
}

/* check_backward: check_recv — the receive regions after the backward of combine (dy rows, the
 * EXPERT_MAJOR combine weights, the RANK_MAJOR expand view); check_out — dx and the router-weight
 * gradients of every token against ref_dispatch_backward_token, and the error record (the drops
 * counted again, no error) */
static void check_backward(const ht_case_t* c, ht_dev_t* d, model_t* m, int check_recv, int check_out, int grads) {
  const int R = c->R, T = c->T, K = c->K, H = c->H;
  const epf_plan_t* p = &d->plan;
  char msg[256];
  model_t mb;
  model_place(c, m);
  mb = *m;
  mb.x = d->h_dy; /* the backward dispatches dy */
  if (check_recv) {
    const size_t tok_bytes = p->region[EPF_REGION_RECV_TOKENS].bytes, meta_bytes = p->region[EPF_REGION_RECV_META].bytes;
    uint8_t* tok = (uint8_t*)malloc(tok_bytes);
    uint8_t* meta = (uint8_t*)malloc(meta_bytes);
    for (int dst = 0; dst < R; ++dst) {
      const char* b = d->window + (uint64_t)dst * p->total_bytes;
      EPF_CHECK_CUDA(cudaMemcpy(tok, b + p->region[EPF_REGION_RECV_TOKENS].offset, tok_bytes, cudaMemcpyDeviceToHost));
      EPF_CHECK_CUDA(cudaMemcpy(meta, b + p->region[EPF_REGION_RECV_META].offset, meta_bytes, cudaMemcpyDeviceToHost));
      if (check_recv_rank_ex(c, &mb, p, dst, tok, meta, NULL, 1, msg, sizeof(msg))) fail_msg("backward of combine: %s", msg);
    }
    free(tok);
    free(meta);
    if (c->layout == EPF_LAYOUT_RANK_MAJOR) {
      uint8_t* view = (uint8_t*)malloc((size_t)R * d->expert_rows * p->row_bytes);
      EPF_CHECK_CUDA(cudaMemcpy(view, d->d_view, (size_t)R * d->expert_rows * p->row_bytes, cudaMemcpyDeviceToHost));
      for (int dst = 0; dst < R; ++dst)
        if (check_expand_rank(c, &mb, p, dst, view + (uint64_t)dst * d->expert_rows * p->row_bytes, d->expert_rows, msg, sizeof(msg)))
          fail_msg("backward of combine: %s", msg);
      free(view);
    }
  }
  if (!check_out) return;
  {
    uint16_t* dx = (uint16_t*)malloc((size_t)R * T * H * 2);
    float* twg = (float*)malloc((size_t)R * T * K * 4);
    float* acc = (float*)malloc((size_t)H * 4);
    float* part = (float*)malloc((size_t)H * 4);
    uint16_t* want = (uint16_t*)malloc((size_t)H * 2);
    float wg[32];
    EPF_CHECK_CUDA(cudaMemcpy(dx, d->d_dx, (size_t)R * T * H * 2, cudaMemcpyDeviceToHost));
    EPF_CHECK_CUDA(cudaMemcpy(twg, d->d_twg, (size_t)R * T * K * 4, cudaMemcpyDeviceToHost));
    for (int64_t st = 0; st < (int64_t)R * T; ++st) {
      ref_dispatch_backward_token(c, &mb, p, d->expert_rows, st, acc, part, want, wg);
      for (int h = 0; h < H; ++h)
        if (dx[st * H + h] != want[h])
          fail_msg("backward of dispatch: rank %d token %d h %d: got %04x want %04x", (int)(st / T), (int)(st % T), h,
                   dx[st * H + h], want[h]);
      for (int k = 0; k < K && grads; ++k)
        if (memcmp(&twg[st * K + k], &wg[k], 4) != 0)
          fail_msg("router-weight gradient: rank %d token %d k %d (id %d): got %a want %a", (int)(st / T), (int)(st % T), k,
                   m->topk[st * K + k], (double)twg[st * K + k], (double)wg[k]);
    }
    if (!grads) { /* not carried: topk_weights_grad keeps its poison */
      uint32_t u;
      memcpy(&u, &twg[0], 4);
      if ((int64_t)R * T * K > 0 && u != 0xABABABABu) fail_msg("topk_weights_grad written although not carried");
    }
    free(dx);
    free(twg);
    free(acc);
    free(part);
    free(want);
  }
}

/* the error record after a whole forward + backward round: no error, every dropped copy counted
 * twice (forward and backward) */
static void check_record_round(const ht_case_t* c, ht_dev_t* d, model_t* m, int directions) {
  epf_error_record_t rec;
  model_place(c, m);
  const uint64_t want = expected_dropped(c, d, m) * (uint64_t)directions;
  epf_error_read(d->rec_h, &rec);
  if (rec.status != 0) fail_msg("error record: %s (peer %d)", epf_status_name((epf_status_t)rec.status), rec.peer);
  if (rec.recv_overflow != want) fail_msg("recv_overflow %u, expected %llu", rec.recv_overflow, (unsigned long long)want);
  epf_error_clear(d->rec_h);
}

/* cases skipped because the card has too little free memory for them (printed at the end) */
static int g_skipped;

/* the device buffers (with the training direction's when `train`) and the model of case c at its
 * capacity (c->capacity, or exact); returns it, or 0 when the case does not fit the card (skipped) */
static int64_t case_setup(const ht_case_t* c, ht_dev_t* d, model_t* m, int train) {
  const int64_t cap = c->capacity ? c->capacity : exact_capacity(c);
  if (!dev_setup(c, cap, d, NULL, NULL, train)) {
    ++g_skipped;
    return 0;
  }
  model_alloc(c, m);
  return cap;
}

/* a forward round in one go, its output and record checked (the record cleared) */
static void fwd_round_checked(const ht_case_t* c, ht_dev_t* d, model_t* m) {
  launch_round(c, d, 0, 3);
  EPF_CHECK_LAUNCH();
  check_round(c, d, m, 0, 1);
}

/* the backward of the forward round in its two parts, each checked (the backward of combine's
 * receive rows, then dx and the gradients), then the record: the drops counted again */
static void bwd_round_checked(const ht_case_t* c, ht_dev_t* d, model_t* m, int split, int grads) {
  launch_backward(c, d, 0, 1, split, grads);
  EPF_CHECK_LAUNCH();
  check_backward(c, d, m, 1, 0, grads);
  launch_backward(c, d, 0, 2, split, grads);
  EPF_CHECK_LAUNCH();
  check_backward(c, d, m, 0, 1, grads);
  check_record_round(c, d, m, 1);
}

/* forward then backward on the same route, `rounds` times with fresh routing, x, weights and dy;
 * split: the backward of combine in two launches; grads: the router-weight gradient carried */
static void run_backward_case(const ht_case_t* c, int rounds, int split, int grads) {
  ht_dev_t d;
  model_t m;
  const int64_t cap = case_setup(c, &d, &m, 1);
  if (cap == 0) return;
  for (int r = 0; r < rounds; ++r) {
    upload_inputs(c, &d, &m);
    fwd_round_checked(c, &d, &m);
    upload_dy(c, &d);
    bwd_round_checked(c, &d, &m, split, grads);
  }
  printf("HT backward R=%d T=%d H=%d K=%d E=%d %s%s%s%s%s routing=%d cap=%lld: %d forward+backward round(s) OK\n", c->R, c->T,
         c->H, c->K, c->E, c->layout == EPF_LAYOUT_RANK_MAJOR ? "rank-major" : "expert-major", c->push ? " push" : " pull",
         c->in_place ? " in-place" : "", split ? " split" : "", grads ? " +weight-grad" : "", c->routing, (long long)cap, rounds);
  model_free(&m);
  dev_free(&d, 1);
}

static void run_case(const ht_case_t* c, int rounds) {
  ht_dev_t d;
  model_t m;
  const int64_t cap = case_setup(c, &d, &m, 0); /* forward only: no training buffers */
  if (cap == 0) return;
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
    /* issue #31: GEMM-ready scales travel as compact stage runs and the receive half rearranges
     * them (epf_dispatch_scales_finish_block): off the tuned grid, and swizzled atoms cut by the
     * capacity. (A SEGMENT_MN_MAJOR segment cut by the capacity gets no scales at all, so this
     * harness's combine reference, which dequantizes every received row, cannot check one.) */
    {5, 1, 2880, 22, 160, EM, MX, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 1, 0},    /* swizzled: 90 columns, T 1 */
    {3, 53, 5120, 22, 96, EM, F8, BF, ROUTE_SKEWED, 0, 8, 0, 0, 0, 0, 1},    /* MN: 3 ranks, top-22 */
    {4, 37, 2880, 8, 64, EM, MX, BF, ROUTE_SKEWED, 0, 128, 0, 200, 0, 1, 0}, /* swizzled, overflow */
    {5, 41, 2880, 8, 40, EM, MX, BF, ROUTE_PARTIAL, 0, 1, 1, 0, 0, 1, 0},    /* swizzled, caller-quantized */
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

/* A CUDA graph of one step of case c captured once: route + dispatch + experts + combine, and (bwd)
 * the backward (backward of combine, [expand], the experts' backward, backward of dispatch), then
 * replayed `replays` times with fresh routing, weights, x (and dy) in the captured buffers: the
 * epochs advance on the device only. Checked at every `every`-th replay and the last (receive
 * regions: test_cases); bwd: the record is cleared after the other replays. */
static void run_graph(const ht_case_t* c, int bwd, int replays, int every) {
  ht_dev_t d;
  model_t m;
  cudaStream_t s;
  cudaGraph_t g;
  cudaGraphExec_t ge;
  if (!dev_setup(c, exact_capacity(c), &d, NULL, NULL, bwd)) {
    ++g_skipped;
    return;
  }
  model_alloc(c, &m);
  EPF_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  upload_inputs(c, &d, &m);
  if (bwd) upload_dy(c, &d);
  EPF_CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  launch_round(c, &d, s, 3);
  if (bwd) launch_backward(c, &d, s, 3, 0, 1);
  EPF_CHECK_CUDA(cudaStreamEndCapture(s, &g));
  EPF_CHECK_CUDA(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < replays; ++i) {
    if (i > 0) {
      upload_inputs(c, &d, &m);
      if (bwd) upload_dy(c, &d);
    }
    EPF_CHECK_CUDA(cudaGraphLaunch(ge, s));
    EPF_CHECK_CUDA(cudaStreamSynchronize(s));
    if (i % every == 0 || i == replays - 1) {
      check_round(c, &d, &m, 0, 1); /* forward output; with bwd the record holds forward + backward drops */
      if (bwd) check_backward(c, &d, &m, 0, 1, 1);
    } else if (bwd) {
      epf_error_clear(d.rec_h);
    }
  }
  if (bwd)
    printf("graph: %d replays of a forward + backward step (%s) with fresh routing OK\n", replays,
           c->layout == EPF_LAYOUT_RANK_MAJOR ? "rank-major push" : "expert-major pull");
  else
    printf("graph: %d replays of route+dispatch+experts+combine with fresh routing OK\n", replays);
  EPF_CHECK_CUDA(cudaGraphExecDestroy(ge));
  EPF_CHECK_CUDA(cudaGraphDestroy(g));
  EPF_CHECK_CUDA(cudaStreamDestroy(s));
  model_free(&m);
  dev_free(&d, 1);
}

/* a CUDA graph of route + dispatch + experts + combine, replayed 1000 times with fresh topk_idx */
static void test_graph(void** state) {
  const ht_case_t c = {4, 32, 512, 4, 16, EM, BF, BF, ROUTE_PARTIAL, 0, 1, 0, 0, 0, 0, 0};
  (void)state;
  if (getenv("EPF_TEST_SMALL")) return;
  run_graph(&c, 0, 1000, 50);
}

/* ---- the training direction: forward then backward on the same route -------------------------- */

static const ht_case_t k_backward_cases[] = {
    /* R  T     H     K   E    layout payload combine routing push align xq cap inplace swz seg */
    {3, 37, 2880, 6, 48, EM, BF, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0, 0},
    {5, 37, 1032, 22, 40, EM, BF, BF, ROUTE_PARTIAL, 1, 1, 0, 0, 0, 0, 0},  /* push, > 8 copies, -1 */
    {8, 1, 7168, 8, 256, EM, BF, BF, ROUTE_RANDOM, 0, 1, 0, 0, 1, 0, 0},    /* in place, T = 1 */
    {13, 37, 5120, 1, 52, EM, BF, BF, ROUTE_RANDOM, 0, 128, 0, 0, 0, 0, 0}, /* top-1, aligned segments */
    {8, 37, 2880, 22, 16, EM, BF, BF, ROUTE_SKEWED, 0, 1, 0, 0, 0, 0, 0},   /* K > E: repeats */
    {5, 64, 1032, 8, 20, EM, BF, BF, ROUTE_SKEWED, 1, 1, 0, 0, 0, 0, 0},    /* repeats, push */
    {8, 37, 4096, 8, 64, EM, BF, BF, ROUTE_SKEWED, 0, 1, 0, 200, 0, 0, 0},  /* overflow: dropped again */
    {3, 37, 2880, 6, 48, RM, BF, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0, 0},
    {5, 37, 1032, 22, 40, RM, BF, BF, ROUTE_PARTIAL, 1, 1, 0, 0, 0, 0, 0},
    {8, 1, 7168, 8, 256, RM, BF, BF, ROUTE_RANDOM, 1, 1, 0, 0, 0, 0, 0},
    {13, 37, 5120, 1, 52, RM, BF, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0, 0},
    {8, 37, 2880, 22, 16, RM, BF, BF, ROUTE_SKEWED, 0, 1, 0, 0, 0, 0, 0},
    {8, 37, 4096, 8, 64, RM, BF, BF, ROUTE_SKEWED, 1, 1, 0, 60, 0, 0, 0},   /* overflow, rank-major push */
    {5, 37, 2880, 8, 40, EM, BF, BF, ROUTE_PARTIAL, 1, 1, 0, 0, 1, 0, 0},   /* in place, push */
    {13, 300, 2880, 22, 416, EM, BF, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0, 0},
    {8, 1000, 7168, 8, 256, RM, BF, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0, 0},
};

/* the dx rows in place over the receive rows (expert_out = NULL; examples/06 --dx-out window), always
 * with the router-weight gradient (the expert side then writes only the metadata slot of each row) */
static const ht_case_t k_backward_in_place_cases[] = {
    /* R  T     H     K   E    layout payload combine routing push align xq cap inplace swz seg */
    {3, 37, 2880, 22, 48, EM, BF, BF, ROUTE_PARTIAL, 0, 1, 0, 0, 1, 0, 0},  /* pull, 3 ranks, > 8 copies, -1 ids */
    {5, 37, 5120, 8, 40, EM, BF, BF, ROUTE_SKEWED, 0, 1, 0, 0, 1, 0, 0},    /* pull, repeats */
    {8, 37, 4096, 8, 64, EM, BF, BF, ROUTE_SKEWED, 0, 1, 0, 200, 1, 0, 0},  /* pull, overflow: gradients 0 */
    {3, 1, 5120, 6, 48, EM, BF, BF, ROUTE_RANDOM, 0, 1, 0, 0, 1, 0, 0},     /* pull, T = 1 */
    {5, 1, 2880, 22, 40, EM, BF, BF, ROUTE_RANDOM, 1, 1, 0, 0, 1, 0, 0},    /* push, T = 1, top-22 */
};

static void test_backward(void** state) {
  const int small = getenv("EPF_TEST_SMALL") != NULL;
  (void)state;
  for (size_t i = 0; i < sizeof(k_backward_cases) / sizeof(k_backward_cases[0]); ++i) {
    if (small && i != 0 && i != 7) continue;
    /* alternate: router-weight gradient carried or not, fused or split backward of combine */
    run_backward_case(&k_backward_cases[i], k_backward_cases[i].T > 64 ? 1 : 2, (int)(i % 3 == 1), (int)(i % 4 != 3));
  }
  for (size_t i = 0; i < sizeof(k_backward_in_place_cases) / sizeof(k_backward_in_place_cases[0]); ++i) {
    if (small && i != 0) continue;
    run_backward_case(&k_backward_in_place_cases[i], 2, (int)(i % 2), 1);
  }
}

/* what the backward launchers refuse, before any CUDA work */
static void test_backward_refusals(void** state) {
  const ht_case_t c = {2, 8, 1024, 2, 8, EM, BF, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0, 0};
  const ht_case_t cr = {2, 8, 1024, 2, 8, RM, BF, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0, 0};
  const ht_case_t cm = {2, 8, 1024, 2, 8, EM, MX, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0, 0};
  ht_dev_t d, dr, dm;
  epf_ht_step_t s;
  (void)state;
  assert_true(dev_setup(&c, exact_capacity(&c), &d, NULL, NULL, 1));
  s = make_backward_step(&c, &d, 1);
  assert_int_equal(epf_ht_combine_backward(&d.route, d.team, &d.plan, &s, 0, 0), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_ht_combine_backward(&d.route, d.team, &d.plan, &s, 4, 0), EPF_ERR_INVALID_ARGUMENT);
  s.topk_idx = NULL;
  assert_int_equal(epf_ht_combine_backward(&d.route, d.team, &d.plan, &s, EPF_HT_BOTH, 0), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_ht_dispatch_backward(&d.route, d.team, &d.plan, &s, 0), EPF_ERR_INVALID_ARGUMENT);
  s = make_backward_step(&c, &d, 1);
  s.x = NULL;
  assert_int_equal(epf_ht_combine_backward(&d.route, d.team, &d.plan, &s, EPF_HT_BOTH, 0), EPF_ERR_INVALID_ARGUMENT);
  s = make_backward_step(&c, &d, 1);
  s.topk_weights = NULL;
  assert_int_equal(epf_ht_combine_backward(&d.route, d.team, &d.plan, &s, EPF_HT_BOTH, 0), EPF_ERR_INVALID_ARGUMENT);
  EPF_CHECK_CUDA(cudaGetLastError()); /* nothing was launched by the refusals above */
  s = make_backward_step(&c, &d, 1);
  s.weight_grad = NULL; /* one of the two */
  assert_int_equal(epf_ht_dispatch_backward(&d.route, d.team, &d.plan, &s, 0), EPF_ERR_INVALID_ARGUMENT);
  s = make_backward_step(&c, &d, 1);
  s.out = NULL;
  assert_int_equal(epf_ht_dispatch_backward(&d.route, d.team, &d.plan, &s, 0), EPF_ERR_INVALID_ARGUMENT);
  s = make_backward_step(&c, &d, 1);
  s.expert_rows = d.plan.recv_capacity - 1;
  assert_int_equal(epf_ht_dispatch_backward(&d.route, d.team, &d.plan, &s, 0), EPF_ERR_INVALID_ARGUMENT);
  s = make_backward_step(&c, &d, 1);
  s.x_quantized = 1;
  assert_int_equal(epf_ht_combine_backward(&d.route, d.team, &d.plan, &s, EPF_HT_BOTH, 0), EPF_ERR_PAYLOAD);
  s = make_backward_step(&c, &d, 1);
  s.state = NULL;
  assert_int_equal(epf_ht_dispatch_backward(&d.route, d.team, &d.plan, &s, 0), EPF_ERR_INVALID_ARGUMENT);
  s = make_backward_step(&c, &d, 1);
  s.blocks_per_rank = EPF_HT_MAX_BLOCKS_PER_RANK + 1;
  assert_int_equal(epf_ht_dispatch_backward(&d.route, d.team, &d.plan, &s, 0), EPF_ERR_INVALID_ARGUMENT);
  /* rank-major: no in-place dx rows */
  assert_true(dev_setup(&cr, exact_capacity(&cr), &dr, NULL, NULL, 1));
  s = make_backward_step(&cr, &dr, 0);
  s.expert_out = NULL;
  assert_int_equal(epf_ht_dispatch_backward(&dr.route, dr.team, &dr.plan, &s, 0), EPF_ERR_INVALID_ARGUMENT);
  /* gradients are BF16: a quantized plan is refused by both */
  assert_true(dev_setup(&cm, exact_capacity(&cm), &dm, NULL, NULL, 1));
  s = make_backward_step(&cm, &dm, 0);
  s.x = dm.d_x;
  s.out = dm.d_out;
  s.expert_out = dm.d_expert_out;
  assert_int_equal(epf_ht_combine_backward(&dm.route, dm.team, &dm.plan, &s, EPF_HT_BOTH, 0), EPF_ERR_NOT_SUPPORTED);
  assert_int_equal(epf_ht_dispatch_backward(&dm.route, dm.team, &dm.plan, &s, 0), EPF_ERR_NOT_SUPPORTED);
  dev_free(&d, 1);
  dev_free(&dr, 1);
  dev_free(&dm, 1);
}

/* two layers on ONE window, their routes sharing the window's epoch words (docs/route.md), a
 * training step interleaved as a model runs it: forward L1, forward L2, backward L2, backward L1 —
 * every output checked; several steps in a row */
static void run_two_layers(const ht_case_t* c1, const ht_case_t* c2, int steps) {
  ht_dev_t d1, d2;
  model_t m1, m2;
  uint32_t* d_epoch;
  uint32_t first;
  assert_true(dev_setup(c1, exact_capacity(c1), &d1, NULL, NULL, 1));
  assert_true(dev_setup(c2, exact_capacity(c2), &d2, d1.window, &d1.team, 1)); /* layer 2: the same window (and plan) */
  assert_int_equal(d1.plan.config_hash, d2.plan.config_hash);
  EPF_TEST_MALLOC(&d_epoch, (size_t)c1->R * 4);
  {
    epf_route_header_t h;
    uint32_t* e = (uint32_t*)malloc((size_t)c1->R * 4);
    assert_int_equal(epf_route_read_header(&d1.route, 0, 0, &h), EPF_OK);
    first = h.epoch;
    for (int r = 0; r < c1->R; ++r) e[r] = first;
    EPF_CHECK_CUDA(cudaMemcpy(d_epoch, e, (size_t)c1->R * 4, cudaMemcpyHostToDevice));
    free(e);
  }
  d1.route.epoch_words = d_epoch;
  d2.route.epoch_words = d_epoch;
  model_alloc(c1, &m1);
  model_alloc(c2, &m2);
  for (int step = 0; step < steps; ++step) {
    upload_inputs(c1, &d1, &m1);
    upload_inputs(c2, &d2, &m2);
    upload_dy(c1, &d1);
    upload_dy(c2, &d2);
    /* forward L1, forward L2 (L2's dispatch overwrites L1's receive rows: the backward sends dy again) */
    fwd_round_checked(c1, &d1, &m1);
    fwd_round_checked(c2, &d2, &m2);
    /* backward L2, backward L1 (the two records are one: d1.rec_d / d2.rec_d are separate) */
    launch_backward(c2, &d2, 0, 3, step & 1, 1);
    EPF_CHECK_LAUNCH();
    check_backward(c2, &d2, &m2, 0, 1, 1);
    check_record_round(c2, &d2, &m2, 1);
    bwd_round_checked(c1, &d1, &m1, 0, 1);
  }
  {
    /* every route update advanced the shared word by one, every backward round by two */
    uint32_t* e = (uint32_t*)malloc((size_t)c1->R * 4);
    EPF_CHECK_CUDA(cudaMemcpy(e, d_epoch, (size_t)c1->R * 4, cudaMemcpyDeviceToHost));
    for (int r = 0; r < c1->R; ++r)
      if (e[r] != first + 6u * (uint32_t)steps) fail_msg("rank %d epoch word %u, want %u", r, e[r], first + 6u * (uint32_t)steps);
    free(e);
  }
  printf("two layers on one window (%s / %s), shared epoch words: %d steps of forward L1, L2, backward L2, L1 OK\n",
         c1->layout == EPF_LAYOUT_RANK_MAJOR ? "rank-major" : "expert-major",
         c2->layout == EPF_LAYOUT_RANK_MAJOR ? "rank-major" : "expert-major", steps);
  model_free(&m1);
  model_free(&m2);
  dev_free(&d2, 0);
  dev_free(&d1, 1);
  EPF_TEST_FREE(d_epoch);
}

static void test_two_layers(void** state) {
  /* one plan (window) for both layers: same shapes and flags; different routing per layer */
  const ht_case_t em1 = {5, 64, 2880, 8, 40, EM, BF, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0, 0};
  const ht_case_t em2 = {5, 64, 2880, 8, 40, EM, BF, BF, ROUTE_SKEWED, 0, 1, 0, 0, 0, 0, 0};
  const ht_case_t rm1 = {8, 64, 1032, 6, 64, RM, BF, BF, ROUTE_PARTIAL, 1, 1, 0, 0, 0, 0, 0};
  const ht_case_t rm2 = {8, 64, 1032, 6, 64, RM, BF, BF, ROUTE_RANDOM, 1, 1, 0, 0, 0, 0, 0};
  (void)state;
  run_two_layers(&em1, &em2, getenv("EPF_TEST_SMALL") ? 1 : 3);
  if (!getenv("EPF_TEST_SMALL")) run_two_layers(&rm1, &rm2, 3);
}

/* a CUDA graph of a whole training step of one layer (route update, dispatch, experts, combine,
 * backward of combine, [expand], the experts' backward, backward of dispatch), replayed with fresh
 * routing, x, weights and dy: the epochs advance on the device only */
static void test_backward_graph(void** state) {
  const ht_case_t cases[2] = {{4, 32, 1032, 6, 16, EM, BF, BF, ROUTE_PARTIAL, 0, 1, 0, 0, 0, 0, 0},
                              {5, 32, 2880, 8, 40, RM, BF, BF, ROUTE_RANDOM, 1, 1, 0, 0, 0, 0, 0}};
  (void)state;
  if (getenv("EPF_TEST_SMALL")) return;
  for (int ci = 0; ci < 2; ++ci) run_graph(&cases[ci], 1, 200, 25);
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
    assert_true(dev_setup(c, exact_capacity(c), &d, (char*)win.ptr, &team, 0)); /* host-side ops use the allocation's address */
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
#define T_(f) cmocka_unit_test_teardown(f, epf_test_teardown) /* frees what a failed test left */
  const struct CMUnitTest tests[] = {
      T_(test_refusals), T_(test_cases), T_(test_back_to_back),
      T_(test_graph), T_(test_backward_refusals), T_(test_backward),
      T_(test_two_layers), T_(test_backward_graph),
#if EPF_TEST_WITH_NCCL
      T_(test_nccl_one_rank),
#endif
  };
#undef T_
  int rc = epf_test_gpus_or_skip(1);
  if (rc) return rc;
  g_seed = epf_test_seed();
  rc = cmocka_run_group_tests(tests, NULL, NULL);
  if (g_skipped) printf("%d case(s) skipped: too little free device memory on this card (SKIP lines above)\n", g_skipped);
  return rc;
}
