/* test_ht — high-throughput dispatch + combine (kernels_ht.cuh over route, dispatch, combine and
 * quant blocks) against a CPU reference written here, bit-exact:
 *   - receive regions: every row of every rank (payload bytes, scales, metadata) where the
 *     reference says it lands (expert-major: by local expert, source, (token, k); rank-major: by
 *     source, token), for BF16, MXFP8 and per-128 FP8 quantized on the way, and caller-quantized
 *     rows forwarded byte for byte; the rank-major expand into the expert-major view;
 *   - combine output: per-expert transform y = bf16(dequant(x) * f(expert)), weighted FP32 fma
 *     reduction in k order (rank-major: per-rank partials in k order, then ranks in order), BF16
 *     or MXFP8 travel, pull and push;
 *   - virtual ranks R in {1, 2, 4, 8} and a real 1-rank NCCL window; H in {2880, 4096, 7168};
 *     K in {1, 2, 8}; E in {8, 64, 256}; T in {1, 37, 4096}; random, skewed and partly -1 routing;
 *     per-128 FP8 with H = 2880 refused with EPF_ERR_HIDDEN_ALIGNMENT; an overflow case (rows past
 *     recv_capacity dropped, counted, never written);
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
#include "epfuse/epfuse.cuh"
#include "epfuse/kernels_ht.cuh"
#if EPF_TEST_WITH_NCCL
#include "epfuse/nccl.cuh"
#endif

static uint64_t g_seed;

enum { ROUTE_RANDOM = 0, ROUTE_SKEWED = 1, ROUTE_PARTIAL = 2 };

typedef struct {
  int R, T, H, K, E;
  int layout, payload, combine_payload;
  int routing;
  int push;
  int align;
  int x_quantized;
  int64_t capacity; /* 0: exactly enough; > 0: this many rows (overflow test) */
  int in_place;     /* EM BF16/BF16 pull: experts write over the received rows */
  int swizzled;     /* MXFP8: swizzled receive scales */
} ht_case_t;

/* ---- host numerics ---------------------------------------------------------------------------- */

static uint16_t bf16_rne(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float bf16_f(uint16_t b) { return epf_bf16_to_float(b); }
static float expert_factor(int le, int rank) { return 1.0f + 0.125f * (float)(le % 7) - 0.0625f * (float)(rank % 3); }

/* ---- the CPU model of one round --------------------------------------------------------------- */

typedef struct {
  /* inputs */
  uint16_t* x;      /* [R][T][H] BF16 */
  uint8_t* xq;      /* [R][T][H] quantized (x_quantized or reference of on-the-way quantization) */
  uint8_t* xs;      /* [R][T][scale bytes] compact scales */
  int32_t* topk;    /* [R][T][K] as ints */
  float* w;         /* [R][T][K] */
  /* derived */
  int64_t* row;     /* EM: [R][T][K] receive row at dst (or -1); RM: [R][T][R] receive row at d (or -1) */
  int64_t* em_row;  /* [R][T][K] row in the destination's expert-major view (or -1) */
  int64_t* rows_total; /* [R] rows each rank receives (its layout, padded for EM) */
  int64_t* em_total;   /* [R] expert-major view rows */
} model_t;

static int sb_per_row(const ht_case_t* c) {
  return c->payload == EPF_PAYLOAD_MXFP8 ? c->H / 32 : c->payload == EPF_PAYLOAD_FP8_128 ? c->H / 128 * 4 : 0;
}

static void quantize_row_ref(const ht_case_t* c, const epf_plan_t* plan, const uint16_t* x, uint8_t* q, uint8_t* s) {
  float buf[128];
  if (c->payload == EPF_PAYLOAD_MXFP8) {
    for (int g = 0; g < c->H / 32; ++g) {
      for (int i = 0; i < 32; ++i) buf[i] = bf16_f(x[g * 32 + i]);
      s[g] = epf_mxfp8_quantize_block_ref(buf, epf_mx_rule_from_flags(plan->flags), q + g * 32);
    }
  } else if (c->payload == EPF_PAYLOAD_FP8_128) {
    for (int g = 0; g < c->H / 128; ++g) {
      for (int i = 0; i < 128; ++i) buf[i] = bf16_f(x[g * 128 + i]);
      float sc = epf_fp8_128_quantize_block_ref(buf, epf_fp8_128_ue8m0_from_flags(plan->flags), q + g * 128);
      memcpy(s + 4 * g, &sc, 4);
    }
  }
}

/* dequantized value of element h of a received row (payload format) */
static float deq(const ht_case_t* c, const uint16_t* x, const uint8_t* q, const uint8_t* s, int h) {
  if (c->payload == EPF_PAYLOAD_BF16) return bf16_f(x[h]);
  if (c->payload == EPF_PAYLOAD_MXFP8) return epf_mxfp8_dequantize_ref(q[h], s[h / 32]);
  float sc;
  memcpy(&sc, s + 4 * (h / 128), 4);
  return epf_fp8_128_dequantize_ref(q[h], sc);
}

static void make_routing(const ht_case_t* c, int32_t* topk) {
  const int EL = c->E / c->R;
  for (int s = 0; s < c->R; ++s)
    for (int t = 0; t < c->T; ++t) {
      int32_t* r = topk + ((int64_t)s * c->T + t) * c->K;
      for (int k = 0; k < c->K; ++k) {
        int e;
        if (c->routing == ROUTE_SKEWED) {
          e = (k == 0 || c->E == 1) ? 0 : (int)(epf_test_rand(&g_seed) % (uint64_t)c->E); /* every token to expert 0 */
        } else {
          /* distinct experts per token when possible */
          for (;;) {
            e = (int)(epf_test_rand(&g_seed) % (uint64_t)c->E);
            int dup = 0;
            for (int j = 0; j < k; ++j) dup |= r[j] == e;
            if (!dup || c->K > c->E) break;
          }
        }
        if (c->routing == ROUTE_PARTIAL && epf_test_rand(&g_seed) % 4 == 0) e = -1;
        r[k] = e;
      }
      (void)EL;
    }
}

/* row placement, exactly as documented in route.cuh / docs/route.md */
static void model_rows(const ht_case_t* c, model_t* m) {
  const int R = c->R, T = c->T, K = c->K, E = c->E, EL = E / R;
  int64_t* cnt = (int64_t*)calloc((size_t)R * E, sizeof(int64_t));   /* [s][e] */
  int64_t* rcnt = (int64_t*)calloc((size_t)R * R, sizeof(int64_t));  /* [s][d] tokens */
  int64_t* slot = (int64_t*)malloc((size_t)R * T * K * sizeof(int64_t));
  int64_t* rslot = (int64_t*)malloc((size_t)R * T * R * sizeof(int64_t));
  for (int s = 0; s < R; ++s)
    for (int t = 0; t < T; ++t) {
      for (int k = 0; k < K; ++k) {
        const int e = m->topk[((int64_t)s * T + t) * K + k];
        slot[((int64_t)s * T + t) * K + k] = e >= 0 ? cnt[(int64_t)s * E + e]++ : -1;
      }
      for (int d = 0; d < R; ++d) {
        int in = 0;
        for (int k = 0; k < K; ++k) {
          const int e = m->topk[((int64_t)s * T + t) * K + k];
          in |= e >= 0 && e / EL == d;
        }
        rslot[((int64_t)s * T + t) * R + d] = in ? rcnt[(int64_t)s * R + d]++ : -1;
      }
    }
  for (int d = 0; d < R; ++d) {
    /* expert-major segments of rank d (used by EM receive and by the RM expand view) */
    int64_t begin = 0;
    for (int le = 0; le < EL; ++le) {
      const int e = d * EL + le;
      int64_t tot = 0;
      begin = (begin + c->align - 1) / c->align * c->align;
      for (int s = 0; s < R; ++s) {
        for (int t = 0; t < T; ++t)
          for (int k = 0; k < K; ++k) {
            const int64_t i = ((int64_t)s * T + t) * K + k;
            if (m->topk[i] == e) m->em_row[i] = begin + tot + slot[i];
          }
        tot += cnt[(int64_t)s * E + e];
      }
      begin += tot;
    }
    m->em_total[d] = (begin + c->align - 1) / c->align * c->align;
    /* rank-major rows */
    int64_t rm = 0;
    for (int s = 0; s < R; ++s) {
      for (int t = 0; t < T; ++t) {
        const int64_t rs = rslot[((int64_t)s * T + t) * R + d];
        if (c->layout == EPF_LAYOUT_RANK_MAJOR) m->row[((int64_t)s * T + t) * R + d] = rs >= 0 ? rm + rs : -1;
      }
      rm += rcnt[(int64_t)s * R + d];
    }
    m->rows_total[d] = c->layout == EPF_LAYOUT_RANK_MAJOR ? rm : m->em_total[d];
  }
  if (c->layout == EPF_LAYOUT_EXPERT_MAJOR)
    for (int64_t i = 0; i < (int64_t)R * T * K; ++i) m->row[i] = m->topk[i] >= 0 ? m->em_row[i] : -1;
  free(cnt);
  free(rcnt);
  free(slot);
  free(rslot);
}

/* ---- device-side expert stage (the "user's" experts) ------------------------------------------ */

/* y[row] = bf16(dequant(received row) * f(local expert, rank)) over the expert-major rows of each
 * rank: EM from the receive region, RM from the expand view. One warp per row. */
__global__ void experts_kernel(epf_route_t route, epf_plan_t plan, char* window, const uint8_t* view,
                               const uint8_t* view_scales, int64_t expert_rows, uint16_t* out, int in_place) {
  const int rank = (int)blockIdx.y;
  const epf_route_segment_t* seg = (const epf_route_segment_t*)epf_route_ptr(&route, rank, EPF_ROUTE_RECV_SEGMENT);
  const char* base = window + (uint64_t)rank * plan.total_bytes;
  const int lane = epf_lane_id();
  const int gw = (int)(blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)), nw = (int)(gridDim.x * (blockDim.x >> 5));
  for (int le = 0; le < plan.experts_per_rank; ++le) {
    const float f = 1.0f + 0.125f * (float)(le % 7) - 0.0625f * (float)(rank % 3);
    const int64_t cap = plan.layout == EPF_LAYOUT_EXPERT_MAJOR ? plan.recv_capacity : expert_rows;
    int64_t end = seg[le].begin + seg[le].count;
    if (end > cap) end = cap;
    for (int64_t r = seg[le].begin + gw; r < end; r += nw) {
      const uint8_t* q;
      const uint8_t* s = NULL;
      int64_t srow = r;
      if (plan.layout == EPF_LAYOUT_EXPERT_MAJOR) {
        q = (const uint8_t*)base + epf_plan_recv_token_offset(&plan, r);
      } else {
        q = view + ((uint64_t)rank * expert_rows + r) * plan.row_bytes;
        s = view_scales ? view_scales + ((uint64_t)rank * expert_rows + r) * plan.scale_bytes_per_row : NULL;
      }
      uint16_t* y = in_place ? (uint16_t*)((char*)window + (uint64_t)rank * plan.total_bytes + epf_plan_recv_token_offset(&plan, r))
                             : out + ((uint64_t)rank * expert_rows + r) * plan.hidden;
      for (int h0 = lane * 8; h0 < plan.hidden; h0 += 256) {
        uint16_t vals[8];
        for (int i = 0; i < 8; ++i) {
          const int h = h0 + i;
          float v;
          if (plan.payload == EPF_PAYLOAD_BF16) {
            v = epf_bf16_to_float(((const uint16_t*)q)[h]);
          } else {
            uint8_t sc8 = 0;
            float sc = 0.f;
            const int ncols = plan.payload == EPF_PAYLOAD_MXFP8 ? plan.hidden / 32 : plan.hidden / 128;
            const int col = plan.payload == EPF_PAYLOAD_MXFP8 ? h / 32 : h / 128;
            if (plan.layout == EPF_LAYOUT_EXPERT_MAJOR) {
              const uint64_t off = plan.scale_layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4
                                       ? plan.region[EPF_REGION_RECV_SCALES].offset + (uint64_t)epf_scale_swizzle_offset(srow, col, ncols)
                                       : epf_plan_recv_scale_offset(&plan, srow) + (uint64_t)col * (plan.payload == EPF_PAYLOAD_MXFP8 ? 1u : 4u);
              if (plan.payload == EPF_PAYLOAD_MXFP8) sc8 = *((const uint8_t*)base + off);
              else sc = *(const float*)((const uint8_t*)base + off);
            } else {
              if (plan.payload == EPF_PAYLOAD_MXFP8) sc8 = s[col];
              else sc = ((const float*)s)[col];
            }
            v = plan.payload == EPF_PAYLOAD_MXFP8 ? epf_mxfp8_dequantize_ref(q[h], sc8) : epf_fp8_128_dequantize_ref(q[h], sc);
          }
          vals[i] = __bfloat16_as_ushort(__float2bfloat16_rn(__fmul_rn(v, f)));
        }
        __syncwarp();
        for (int i = 0; i < 8; ++i) y[h0 + i] = vals[i];
      }
    }
  }
}

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

static epf_status_t make_plan(const ht_case_t* c, int64_t capacity, epf_plan_t* plan) {
  epf_config_t cfg = EPF_CONFIG_INIT;
  cfg.nranks = c->R;
  cfg.num_experts = c->E;
  cfg.top_k = c->K;
  cfg.hidden = c->H;
  cfg.max_tokens_per_rank = c->T;
  cfg.mode = EPF_MODE_HT;
  cfg.layout = c->layout;
  cfg.payload = c->payload;
  cfg.combine_payload = c->combine_payload;
  cfg.expert_alignment = c->align;
  cfg.recv_capacity = capacity;
  cfg.scale_layout = c->swizzled ? EPF_SCALE_LAYOUT_SWIZZLED_128X4 : 0;
  cfg.flags = c->push ? EPF_FLAG_COMBINE_PUSH : 0u;
  cfg.timeout_ns = 10000000000ull;
  return epf_plan_compute(&cfg, plan);
}

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
  make_routing(c, m->topk);
  for (int64_t i = 0; i < n * c->H; ++i) {
    /* finite values over a wide range, some exact zeros */
    const uint64_t r = epf_test_rand(&g_seed);
    float f = (float)((int64_t)(r % 20001) - 10000) / 1000.0f * ldexpf(1.0f, (int)((r >> 20) % 9) - 4);
    if ((r >> 40) % 64 == 0) f = 0.0f;
    m->x[i] = bf16_rne(f);
  }
  for (int64_t i = 0; i < n * c->K; ++i) m->w[i] = (float)(epf_test_rand(&g_seed) % 1000) / 997.0f;
  if (c->payload != EPF_PAYLOAD_BF16)
    for (int64_t t = 0; t < n; ++t) {
      epf_plan_t p = d->plan;
      quantize_row_ref(c, &p, m->x + t * c->H, m->xq + t * c->H, m->xs + t * sb_per_row(c));
    }
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
    assert_int_equal(epf_ht_dispatch(&d->route, d->team, &d->plan, &hs, d->d_topk, EPF_HT_SEND | EPF_HT_RECV, stream), EPF_OK);
    if (c->layout == EPF_LAYOUT_RANK_MAJOR) assert_int_equal(epf_ht_expand(&d->route, d->team, &d->plan, &hs, stream), EPF_OK);
  }
  if (!(part & 2)) return;
  experts_kernel<<<eg, 256, 0, stream>>>(d->route, d->plan, d->window, d->d_view, d->d_view_scales, d->expert_rows,
                                         d->d_expert_out, c->in_place);
  EPF_CHECK_CUDA(cudaGetLastError());
  assert_int_equal(epf_ht_combine(&d->route, d->team, &d->plan, &hs, d->d_topk, stream), EPF_OK);
}

/* check the receive regions (data, scales, metadata) and the combine output against the model */
/* check_recv: the receive regions (call after part 1: the combine may overwrite them in place);
 * check_comb: the combine output and the error record (after part 2) */
static void check_round(const ht_case_t* c, ht_dev_t* d, model_t* m, int check_recv, int check_comb) {
  const int R = c->R, T = c->T, K = c->K, H = c->H, EL = c->E / c->R;
  const epf_plan_t* p = &d->plan;
  const int64_t cap = p->recv_capacity;
  const int sbr = sb_per_row(c);
  uint64_t expected_dropped = 0;
  memset(m->row, 0xff, (size_t)R * T * (K > R ? K : R) * sizeof(int64_t));
  memset(m->em_row, 0xff, (size_t)R * T * K * sizeof(int64_t));
  model_rows(c, m);
  /* dropped copies: rows at or past the capacity */
  for (int64_t i = 0; i < (int64_t)R * T * (c->layout == EPF_LAYOUT_RANK_MAJOR ? R : K); ++i) expected_dropped += m->row[i] >= cap;

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
      int64_t written = 0;
      for (int s = 0; s < R; ++s)
        for (int t = 0; t < T; ++t) {
          const int64_t st = (int64_t)s * T + t;
          const uint8_t* want = c->payload == EPF_PAYLOAD_BF16 ? (const uint8_t*)(m->x + st * H) : m->xq + st * H;
          const int ncopy = c->layout == EPF_LAYOUT_RANK_MAJOR ? 1 : K;
          for (int k = 0; k < ncopy; ++k) {
            int64_t row;
            if (c->layout == EPF_LAYOUT_RANK_MAJOR) row = m->row[st * R + dst];
            else {
              const int e = m->topk[st * K + k];
              row = e >= 0 && e / EL == dst ? m->row[st * K + k] : -1;
            }
            if (row < 0 || row >= cap) continue;
            ++written;
            if (memcmp(tok + (uint64_t)row * p->row_bytes, want, p->row_bytes) != 0)
              fail_msg("rank %d row %lld: payload of (src %d, token %d, k %d) differs", dst, (long long)row, s, t, k);
            if (sbr && !c->swizzled && memcmp(sc + (uint64_t)row * sbr, m->xs + st * sbr, sbr) != 0)
              fail_msg("rank %d row %lld: scales differ", dst, (long long)row);
            if (sbr && c->swizzled)
              for (int col = 0; col < H / 32; ++col)
                if (sc[epf_scale_swizzle_offset(row, col, H / 32)] != m->xs[st * sbr + col])
                  fail_msg("rank %d row %lld col %d: swizzled scale differs", dst, (long long)row, col);
            const int32_t* mt = (const int32_t*)(meta + (uint64_t)row * p->meta_bytes_per_row);
            if (c->layout == EPF_LAYOUT_EXPERT_MAJOR) {
              const epf_recv_meta_em_t* me = (const epf_recv_meta_em_t*)mt;
              const int e = m->topk[st * K + k];
              if (me->src_token != t || me->src_rank != s || me->k != k || me->local_expert != e - dst * EL ||
                  me->weight != m->w[st * K + k])
                fail_msg("rank %d row %lld: metadata differs", dst, (long long)row);
            } else {
              int n = 0;
              for (int kk = 0; kk < K; ++kk) {
                const int e = m->topk[st * K + kk];
                if (e < 0 || e / EL != dst) continue;
                if (mt[4 + n] != e - dst * EL || ((const float*)mt)[4 + K + n] != m->w[st * K + kk])
                  fail_msg("rank %d row %lld entry %d: rank-major metadata differs", dst, (long long)row, n);
                ++n;
              }
              if (mt[0] != t || mt[1] != s || mt[2] != n) fail_msg("rank %d row %lld: rank-major header differs", dst, (long long)row);
            }
          }
        }
      /* EM pad rows carry src_token = -1 */
      (void)written;
    }
    free(tok);
    free(meta);
    free(sc);
    /* RANK_MAJOR: the expand view holds every (token, k) copy at its expert-major row */
    if (c->layout == EPF_LAYOUT_RANK_MAJOR) {
      uint8_t* view = (uint8_t*)malloc((size_t)R * d->expert_rows * p->row_bytes);
      EPF_CHECK_CUDA(cudaMemcpy(view, d->d_view, (size_t)R * d->expert_rows * p->row_bytes, cudaMemcpyDeviceToHost));
      for (int s = 0; s < R; ++s)
        for (int t = 0; t < T; ++t)
          for (int k = 0; k < K; ++k) {
            const int64_t i = ((int64_t)s * T + t) * K + k;
            const int e = m->topk[i];
            if (e < 0 || m->row[((int64_t)s * T + t) * R + e / EL] >= cap || m->em_row[i] >= d->expert_rows) continue;
            const uint8_t* want = c->payload == EPF_PAYLOAD_BF16 ? (const uint8_t*)(m->x + ((int64_t)s * T + t) * H)
                                                                 : m->xq + ((int64_t)s * T + t) * H;
            if (memcmp(view + ((uint64_t)(e / EL) * d->expert_rows + m->em_row[i]) * p->row_bytes, want, p->row_bytes) != 0)
              fail_msg("expand: (src %d, token %d, k %d) not at view row %lld of rank %d", s, t, k, (long long)m->em_row[i], e / EL);
          }
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
    EPF_CHECK_CUDA(cudaMemcpy(out, d->d_out, (size_t)R * T * H * 2, cudaMemcpyDeviceToHost));
    const int mx_rule = epf_mx_rule_from_flags(p->flags);
    for (int s = 0; s < R; ++s)
      for (int t = 0; t < T; ++t) {
        const int64_t st = (int64_t)s * T + t;
        for (int h = 0; h < H; ++h) acc[h] = 0.f;
        /* expert output of copy k (BF16): f(le, dst) * dequant(x) */
        int order[32], nd = 0;
        if (c->layout == EPF_LAYOUT_EXPERT_MAJOR) {
          for (int k = 0; k < K; ++k) {
            const int e = m->topk[st * K + k];
            if (e < 0 || m->row[st * K + k] >= cap) continue;
            const float f = expert_factor(e % EL, e / EL);
            for (int h = 0; h < H; ++h)
              y[h] = bf16_rne(deq(c, m->x + st * H, m->xq + st * H, m->xs + st * sbr, h) * f);
            if (c->combine_payload == EPF_PAYLOAD_BF16) {
              for (int h = 0; h < H; ++h) acc[h] = fmaf(m->w[st * K + k], bf16_f(y[h]), acc[h]);
            } else {
              float buf[32];
              for (int g = 0; g < H / 32; ++g) {
                for (int i = 0; i < 32; ++i) buf[i] = bf16_f(y[g * 32 + i]);
                const uint8_t sb = epf_mxfp8_quantize_block_ref(buf, mx_rule, yq + g * 32);
                for (int i = 0; i < 32; ++i)
                  acc[g * 32 + i] = epf_mxfp8_dequantize_accumulate_ref(yq[g * 32 + i], sb, m->w[st * K + k], acc[g * 32 + i]);
              }
            }
          }
        } else {
          /* destination ranks in order of first occurrence in k */
          for (int k = 0; k < K; ++k) {
            const int e = m->topk[st * K + k];
            if (e < 0) continue;
            int seen = 0;
            for (int j = 0; j < nd; ++j) seen |= order[j] == e / EL;
            if (!seen) order[nd++] = e / EL;
          }
          for (int j = 0; j < nd; ++j) {
            const int dst = order[j];
            if (m->row[st * R + dst] >= cap) continue;
            for (int h = 0; h < H; ++h) part[h] = 0.f;
            for (int k = 0; k < K; ++k) {
              const int e = m->topk[st * K + k];
              if (e < 0 || e / EL != dst || m->em_row[st * K + k] >= d->expert_rows) continue;
              const float f = expert_factor(e % EL, dst);
              for (int h = 0; h < H; ++h)
                part[h] = fmaf(m->w[st * K + k], bf16_f(bf16_rne(deq(c, m->x + st * H, m->xq + st * H, m->xs + st * sbr, h) * f)), part[h]);
            }
            if (c->combine_payload == EPF_PAYLOAD_BF16) {
              for (int h = 0; h < H; ++h) acc[h] = fmaf(1.0f, bf16_f(bf16_rne(part[h])), acc[h]);
            } else {
              for (int g = 0; g < H / 32; ++g) {
                const uint8_t sb = epf_mxfp8_quantize_block_ref(part + g * 32, mx_rule, yq + g * 32);
                for (int i = 0; i < 32; ++i)
                  acc[g * 32 + i] = epf_mxfp8_dequantize_accumulate_ref(yq[g * 32 + i], sb, 1.0f, acc[g * 32 + i]);
              }
            }
          }
        }
        for (int h = 0; h < H; ++h) {
          const uint16_t want = bf16_rne(acc[h]);
          if (out[st * H + h] != want)
            fail_msg("combine: rank %d token %d h %d: got %04x want %04x", s, t, h, out[st * H + h], want);
        }
      }
    free(out);
    free(acc);
    free(part);
    free(y);
    free(yq);
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

static void model_alloc(const ht_case_t* c, model_t* m) {
  const int64_t n = (int64_t)c->R * c->T;
  m->x = (uint16_t*)malloc((size_t)n * c->H * 2);
  m->xq = (uint8_t*)malloc((size_t)n * c->H);
  m->xs = (uint8_t*)malloc((size_t)n * (c->H / 32 + 4) * 4);
  m->topk = (int32_t*)malloc((size_t)n * c->K * 4);
  m->w = (float*)malloc((size_t)n * c->K * 4);
  m->row = (int64_t*)malloc((size_t)n * (c->K > c->R ? c->K : c->R) * 8);
  m->em_row = (int64_t*)malloc((size_t)n * c->K * 8);
  m->rows_total = (int64_t*)malloc((size_t)c->R * 8);
  m->em_total = (int64_t*)malloc((size_t)c->R * 8);
}
static void model_free(model_t* m) {
  free(m->x);
  free(m->xq);
  free(m->xs);
  free(m->topk);
  free(m->w);
  free(m->row);
  free(m->em_row);
  free(m->rows_total);
  free(m->em_total);
}

/* capacity that fits every row of this routing exactly (0 = worst case would be huge) */
static int64_t exact_capacity(const ht_case_t* c) {
  const int64_t per = (int64_t)c->R * c->T * (c->layout == EPF_LAYOUT_RANK_MAJOR ? 1 : (c->K < c->E / c->R ? c->K : c->E / c->R));
  return per + (int64_t)(c->E / c->R) * (c->align - 1);
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
         c->x_quantized ? " prequantized" : "", c->swizzled ? " swizzled" : "", c->routing, (long long)cap, rounds);
  model_free(&m);
  dev_free(&d, 1);
}

#define BF EPF_PAYLOAD_BF16
#define MX EPF_PAYLOAD_MXFP8
#define F8 EPF_PAYLOAD_FP8_128
#define EM EPF_LAYOUT_EXPERT_MAJOR
#define RM EPF_LAYOUT_RANK_MAJOR

static const ht_case_t k_cases[] = {
    /* R  T     H     K  E    layout payload combine routing push align xq cap inplace swz */
    {1, 37, 2880, 2, 8, EM, BF, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0},
    {2, 37, 4096, 8, 64, EM, BF, BF, ROUTE_PARTIAL, 0, 1, 0, 0, 1, 0},
    {4, 37, 7168, 8, 256, EM, BF, BF, ROUTE_RANDOM, 1, 1, 0, 0, 0, 0},
    {8, 37, 2880, 8, 64, EM, MX, BF, ROUTE_PARTIAL, 0, 128, 0, 0, 0, 0},
    {8, 1, 7168, 8, 256, EM, F8, MX, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0},
    {8, 37, 4096, 2, 8, EM, BF, MX, ROUTE_SKEWED, 0, 1, 0, 0, 0, 0},
    {4, 37, 4096, 1, 8, RM, BF, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0},
    {8, 37, 7168, 8, 256, RM, MX, BF, ROUTE_PARTIAL, 1, 1, 0, 0, 0, 0},
    {8, 37, 2880, 8, 64, RM, BF, MX, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0},
    {2, 37, 7168, 8, 64, RM, F8, BF, ROUTE_SKEWED, 0, 1, 0, 0, 0, 0},
    {4, 37, 4096, 8, 64, EM, MX, BF, ROUTE_RANDOM, 0, 1, 1, 0, 0, 0},  /* caller-quantized MXFP8 */
    {4, 37, 4096, 8, 64, EM, F8, BF, ROUTE_RANDOM, 1, 1, 1, 0, 0, 0},  /* caller-quantized FP8 */
    {4, 37, 4096, 8, 64, EM, MX, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 1},  /* swizzled scales */
    {8, 37, 4096, 8, 64, EM, BF, BF, ROUTE_SKEWED, 0, 1, 0, 200, 0, 0}, /* overflow: rows dropped */
    {8, 37, 4096, 8, 64, RM, BF, BF, ROUTE_SKEWED, 1, 1, 0, 60, 0, 0},  /* overflow, rank-major */
    {8, 4096, 7168, 8, 256, EM, BF, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0}, /* the standard shape */
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
  ht_case_t c = {2, 8, 2880, 2, 8, EM, F8, BF, ROUTE_RANDOM, 0, 1, 0, 0, 0, 0};
  epf_plan_t p;
  (void)state;
  assert_int_equal(make_plan(&c, 64, &p), EPF_ERR_HIDDEN_ALIGNMENT); /* per-128 FP8 with H = 2880 */
  assert_int_equal(epf_quant_check(2880, EPF_PAYLOAD_FP8_128), EPF_ERR_HIDDEN_ALIGNMENT);
  c.payload = BF;
  c.H = 2884;
  assert_int_equal(make_plan(&c, 64, &p), EPF_ERR_HIDDEN_ALIGNMENT);
}

static void test_back_to_back(void** state) {
  const ht_case_t c = {4, 64, 1024, 4, 16, EM, BF, BF, ROUTE_PARTIAL, 0, 1, 0, 0, 0, 0};
  const ht_case_t c2 = {4, 64, 1024, 4, 16, RM, MX, MX, ROUTE_RANDOM, 1, 1, 0, 0, 0, 0};
  (void)state;
  if (getenv("EPF_TEST_SMALL")) return;
  run_case(&c, 100);
  run_case(&c2, 100);
}

/* a CUDA graph of route + dispatch + experts + combine, replayed 1000 times with fresh topk_idx */
static void test_graph(void** state) {
  const ht_case_t c = {4, 32, 512, 4, 16, EM, BF, BF, ROUTE_PARTIAL, 0, 1, 0, 0, 0, 0};
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
  const ht_case_t cases[2] = {{1, 37, 2880, 2, 8, EM, MX, BF, ROUTE_PARTIAL, 0, 1, 0, 0, 0, 0},
                              {1, 37, 4096, 8, 8, RM, BF, BF, ROUTE_RANDOM, 1, 1, 0, 0, 0, 0}};
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
