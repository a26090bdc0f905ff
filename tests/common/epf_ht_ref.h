/* epf_ht_ref.h — the CPU model of one HT round (route placement, dispatch, expert, combine) and the
 * device "experts" that tests/gpu/test_ht.cu has always checked against; shared with
 * tests/multigpu/test_mg_ht.cu so that both run the same reference (not part of the library).
 *
 *   ht_case_t, ROUTE_*            one case: shapes, layout, payloads, routing kind, push, alignment...
 *   make_plan(c, capacity, &plan) its plan (10 s timeouts); exact_capacity(c): rows that always fit
 *   model_t, model_alloc/free     inputs of all R ranks ([R][T][...]) and the derived row placement
 *   model_generate(c, plan, m, &seed)  fresh routing, x, weights (and the payload's reference
 *                                 quantization) for all R ranks from one splitmix64 state
 *   model_place(c, m)             every copy's receive row and expert-major view row (route/route.cuh)
 *   check_recv_rank / check_expand_rank   one rank's receive regions / RANK_MAJOR expand view
 *                                 against the model: 0, or 1 and the first difference in msg
 *   ref_combine_token(...)        the bit-exact BF16 combine output of one token
 *   experts_kernel                the tests' experts on the GPU: y = bf16(dequant(row) * f(le, rank))
 *                                 (also used by tests/gpu/test_shapes.cu)
 * The training direction (the backward round on the same route; x of the model = dy):
 *   check_recv_rank_ex(..., combine_weights = 1, ...)  the receive regions after the backward of
 *                                 combine (EXPERT_MAJOR metadata weight = ref_combine_weight)
 *   experts_backward_kernel       the tests' expert backward: dx = bf16(dy * grad_factor(le, rank)),
 *                                 weight_grad = dy[0] * wgrad_factor(le, rank)
 *   ref_dispatch_backward_token   the bit-exact dx of one token and its router-weight gradients
 *
 * Duplicate expert ids within a token (docs/route.md): the first occurrence carries the token to
 * the expert (one EXPERT_MAJOR row per (token, distinct expert)); in the combine every k
 * contributes in k order, a repeat with the output of its first occurrence's row (nothing if that
 * row was dropped at the capacity); RANK_MAJOR metadata lists every k whose expert lives on the
 * rank, repeats included.
 *
 * No cmocka here (the multi-GPU test calls these from its rank threads): failures are returned. */
#ifndef EPF_HT_REF_H
#define EPF_HT_REF_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epf_test_gpu.h"
#include "epfuse/epfuse.cuh"
#include "epfuse/ht/kernels.cuh"

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
  int seg_mn;       /* FP8_128 EXPERT_MAJOR: EPF_SCALE_LAYOUT_SEGMENT_MN_MAJOR receive scales */
} ht_case_t;

/* ---- host numerics ---------------------------------------------------------------------------- */

static inline uint16_t bf16_rne(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static inline float bf16_f(uint16_t b) { return epf_bf16_to_float(b); }
static inline float expert_factor(int le, int rank) { return 1.0f + 0.125f * (float)(le % 7) - 0.0625f * (float)(rank % 3); }

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
  int64_t* seg_begin;  /* [R][E / R] expert-major segment of each rank's local experts: first row */
  int64_t* seg_rows;   /* [R][E / R] its padded row count */
} model_t;

static inline int sb_per_row(const ht_case_t* c) {
  return c->payload == EPF_PAYLOAD_MXFP8 ? c->H / 32 : c->payload == EPF_PAYLOAD_FP8_128 ? c->H / 128 * 4 : 0;
}

static inline void quantize_row_ref(const ht_case_t* c, const epf_plan_t* plan, const uint16_t* x, uint8_t* q, uint8_t* s) {
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
static inline float deq(const ht_case_t* c, const uint16_t* x, const uint8_t* q, const uint8_t* s, int h) {
  if (c->payload == EPF_PAYLOAD_BF16) return bf16_f(x[h]);
  if (c->payload == EPF_PAYLOAD_MXFP8) return epf_mxfp8_dequantize_ref(q[h], s[h / 32]);
  float sc;
  memcpy(&sc, s + 4 * (h / 128), 4);
  return epf_fp8_128_dequantize_ref(q[h], sc);
}

static inline void make_routing(const ht_case_t* c, int32_t* topk, uint64_t* seed) {
  const int EL = c->E / c->R;
  for (int s = 0; s < c->R; ++s)
    for (int t = 0; t < c->T; ++t) {
      int32_t* r = topk + ((int64_t)s * c->T + t) * c->K;
      for (int k = 0; k < c->K; ++k) {
        int e;
        if (c->routing == ROUTE_SKEWED) {
          e = (k == 0 || c->E == 1) ? 0 : (int)(epf_test_rand(seed) % (uint64_t)c->E); /* every token to expert 0 */
        } else {
          /* distinct experts per token when possible */
          for (;;) {
            e = (int)(epf_test_rand(seed) % (uint64_t)c->E);
            int dup = 0;
            for (int j = 0; j < k; ++j) dup |= r[j] == e;
            if (!dup || c->K > c->E) break;
          }
        }
        if (c->routing == ROUTE_PARTIAL && epf_test_rand(seed) % 4 == 0) e = -1;
        r[k] = e;
      }
      (void)EL;
    }
}

/* ht_ref_first_k — the k of the first entry of token row r[0..K) with the same id as r[k]: k itself
 * unless (t, k) is a REPEAT (an earlier k' has the same valid id; docs/route.md), then that k'. */
static inline int ht_ref_first_k(const int32_t* r, int k) {
  for (int q = 0; q < k; ++q)
    if (r[q] == r[k]) return q;
  return k;
}

/* row placement, exactly as documented in route/route.cuh / docs/route.md: one copy per (token, distinct
 * expert) in EXPERT_MAJOR (a repeated expert id of a token is carried by its first occurrence: its
 * own row is -1, its em_row is the first occurrence's), one per (token, destination rank) in
 * RANK_MAJOR */
static inline void model_rows(const ht_case_t* c, model_t* m) {
  const int R = c->R, T = c->T, K = c->K, E = c->E, EL = E / R;
  int64_t* cnt = (int64_t*)calloc((size_t)R * E, sizeof(int64_t));   /* [s][e] distinct (token, expert) pairs */
  int64_t* rcnt = (int64_t*)calloc((size_t)R * R, sizeof(int64_t));  /* [s][d] tokens */
  int64_t* slot = (int64_t*)malloc((size_t)R * T * K * sizeof(int64_t));
  int64_t* rslot = (int64_t*)malloc((size_t)R * T * R * sizeof(int64_t));
  for (int s = 0; s < R; ++s)
    for (int t = 0; t < T; ++t) {
      const int32_t* r = m->topk + ((int64_t)s * T + t) * K;
      for (int k = 0; k < K; ++k) {
        const int e = r[k];
        const int64_t i = ((int64_t)s * T + t) * K + k;
        slot[i] = e >= 0 && ht_ref_first_k(r, k) == k ? cnt[(int64_t)s * E + e]++ : -1;
      }
      for (int d = 0; d < R; ++d) {
        int in = 0;
        for (int k = 0; k < K; ++k) {
          const int e = r[k];
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
      m->seg_begin[(int64_t)d * EL + le] = begin;
      for (int s = 0; s < R; ++s) {
        for (int t = 0; t < T; ++t)
          for (int k = 0; k < K; ++k) {
            const int64_t i = ((int64_t)s * T + t) * K + k;
            if (m->topk[i] == e)
              m->em_row[i] = begin + tot + slot[((int64_t)s * T + t) * K + ht_ref_first_k(m->topk + ((int64_t)s * T + t) * K, k)];
          }
        tot += cnt[(int64_t)s * E + e];
      }
      m->seg_rows[(int64_t)d * EL + le] = (tot + c->align - 1) / c->align * c->align;
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
    for (int64_t i = 0; i < (int64_t)R * T * K; ++i) m->row[i] = m->topk[i] >= 0 && slot[i] >= 0 ? m->em_row[i] : -1;
  free(cnt);
  free(rcnt);
  free(slot);
  free(rslot);
}

/* ---- device-side expert stage (the "user's" experts) ------------------------------------------ */

/* y[row] = bf16(dequant(received row) * f(local expert, rank)) over the expert-major rows of each
 * rank: EM from the receive region, RM from the expand view. One warp per row. Grid (any, count):
 * blockIdx.y = route buffer / window slice / view index, rank = rank_base + index (virtual ranks:
 * rank_base 0, one index per rank; a real rank: its own slice, index 0, rank_base = its rank). */
static __global__ void experts_kernel(epf_route_t route, epf_plan_t plan, char* window, int rank_base, const uint8_t* view,
                                      const uint8_t* view_scales, int64_t expert_rows, uint16_t* out, int in_place) {
  const int index = (int)blockIdx.y, rank = rank_base + index;
  const epf_route_segment_t* seg = (const epf_route_segment_t*)epf_route_ptr(&route, index, EPF_ROUTE_RECV_SEGMENT);
  const char* base = window + (uint64_t)index * plan.total_bytes;
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
        q = view + ((uint64_t)index * expert_rows + r) * plan.row_bytes;
        s = view_scales ? view_scales + ((uint64_t)index * expert_rows + r) * plan.scale_bytes_per_row : NULL;
      }
      uint16_t* y = in_place ? (uint16_t*)((char*)window + (uint64_t)index * plan.total_bytes + epf_plan_recv_token_offset(&plan, r))
                             : out + ((uint64_t)index * expert_rows + r) * plan.hidden;
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
              /* the one owner of a receive scale's position (every layout; the segment for
               * SEGMENT_MN_MAJOR) */
              const uint64_t off = epf_recv_scale_offset(&plan, srow, col, seg[le].begin, seg[le].padded_count);
              (void)ncols;
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
        /* no __syncwarp() here: the lanes' trip counts differ when hidden / 8 is not a multiple of
         * 32 (a warp collective there is undefined behaviour), and none is needed: in place, each
         * lane rewrites only the 8 elements it has just read */
        for (int i = 0; i < 8; ++i) y[h0 + i] = vals[i];
      }
    }
  }
}

static inline epf_status_t make_plan(const ht_case_t* c, int64_t capacity, epf_plan_t* plan) {
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
  cfg.scale_layout = c->seg_mn ? EPF_SCALE_LAYOUT_SEGMENT_MN_MAJOR : c->swizzled ? EPF_SCALE_LAYOUT_SWIZZLED_128X4 : 0;
  cfg.flags = c->push ? EPF_FLAG_COMBINE_PUSH : 0u;
  cfg.timeout_ns = 10000000000ull;
  return epf_plan_compute(&cfg, plan);
}

static inline void model_alloc(const ht_case_t* c, model_t* m) {
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
  m->seg_begin = (int64_t*)malloc((size_t)c->E * 8); /* R * (E / R) */
  m->seg_rows = (int64_t*)malloc((size_t)c->E * 8);
}
static inline void model_free(model_t* m) {
  free(m->x);
  free(m->xq);
  free(m->xs);
  free(m->topk);
  free(m->w);
  free(m->row);
  free(m->em_row);
  free(m->rows_total);
  free(m->em_total);
  free(m->seg_begin);
  free(m->seg_rows);
}

/* capacity that fits every row of this routing exactly (0 = worst case would be huge) */
static inline int64_t exact_capacity(const ht_case_t* c) {
  const int64_t per = (int64_t)c->R * c->T * (c->layout == EPF_LAYOUT_RANK_MAJOR ? 1 : (c->K < c->E / c->R ? c->K : c->E / c->R));
  return per + (int64_t)(c->E / c->R) * (c->align - 1);
}

/* ---- inputs, placement, checks ---------------------------------------------------------------- */

/* model_generate — fresh inputs of one round for all R ranks from the splitmix64 state *seed, in
 * this order: routing, x (finite BF16 over a wide range, some exact zeros), weights; then the
 * reference quantization of every row in plan->payload (xq, xs). Host only; no device work. */
static inline void model_generate(const ht_case_t* c, const epf_plan_t* plan, model_t* m, uint64_t* seed) {
  const int64_t n = (int64_t)c->R * c->T;
  make_routing(c, m->topk, seed);
  for (int64_t i = 0; i < n * c->H; ++i) {
    /* finite values over a wide range, some exact zeros */
    const uint64_t r = epf_test_rand(seed);
    float f = (float)((int64_t)(r % 20001) - 10000) / 1000.0f * ldexpf(1.0f, (int)((r >> 20) % 9) - 4);
    if ((r >> 40) % 64 == 0) f = 0.0f;
    m->x[i] = bf16_rne(f);
  }
  for (int64_t i = 0; i < n * c->K; ++i) m->w[i] = (float)(epf_test_rand(seed) % 1000) / 997.0f;
  if (c->payload != EPF_PAYLOAD_BF16)
    for (int64_t t = 0; t < n; ++t) {
      epf_plan_t p = *plan;
      quantize_row_ref(c, &p, m->x + t * c->H, m->xq + t * c->H, m->xs + t * sb_per_row(c));
    }
}

/* model_place — m->row / m->em_row / rows_total / em_total from m->topk (model_rows; -1 where a
 * copy does not exist). */
static inline void model_place(const ht_case_t* c, model_t* m) {
  const int R = c->R, T = c->T, K = c->K;
  memset(m->row, 0xff, (size_t)R * T * (K > R ? K : R) * sizeof(int64_t));
  memset(m->em_row, 0xff, (size_t)R * T * K * sizeof(int64_t));
  model_rows(c, m);
}

#define HT_REF_FAIL(...)                   \
  do {                                     \
    snprintf(msg, msg_bytes, __VA_ARGS__); \
    return 1;                              \
  } while (0)

/* check_recv_rank — the receive regions of rank dst, copied to the host (tok: RECV_TOKENS, meta:
 * RECV_META, sc: RECV_SCALES or unused for BF16), against the model (model_place done): every row
 * the model places below the capacity holds its payload bytes, scales (compact or swizzled) and
 * metadata. Returns 0, or 1 with the first difference in msg. */
static inline float ref_combine_weight(const ht_case_t* c, const model_t* m, int64_t st, int k);

static inline int check_recv_rank_ex(const ht_case_t* c, const model_t* m, const epf_plan_t* p, int dst, const uint8_t* tok,
                                     const uint8_t* meta, const uint8_t* sc, int combine_weights, char* msg,
                                     size_t msg_bytes) {
  const int R = c->R, T = c->T, K = c->K, H = c->H, EL = c->E / c->R;
  const int64_t cap = p->recv_capacity;
  const int sbr = sb_per_row(c);
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
        if (memcmp(tok + (uint64_t)row * p->row_bytes, want, p->row_bytes) != 0)
          HT_REF_FAIL("rank %d row %lld: payload of (src %d, token %d, k %d) differs", dst, (long long)row, s, t, k);
        if (sbr) {
          /* every layout through the one owner of a receive scale's position (ht/impl/dispatch.cuh), the
           * expert-major segment of the row's expert for SEGMENT_MN_MAJOR; the bytes must equal
           * the reference's compact scales of the row */
          const int esz = c->payload == EPF_PAYLOAD_MXFP8 ? 1 : 4, ncols = sbr / esz;
          int64_t sb = 0, sr = 0;
          if (c->layout == EPF_LAYOUT_EXPERT_MAJOR) {
            const int le = m->topk[st * K + k] - dst * EL;
            sb = m->seg_begin[(int64_t)dst * EL + le];
            sr = m->seg_rows[(int64_t)dst * EL + le];
          }
          if (!epf_recv_scale_seg_fits(p, row, sb, sr)) {
            if (sb + sr <= cap) HT_REF_FAIL("rank %d row %lld: outside its segment [%lld, +%lld)", dst, (long long)row, (long long)sb, (long long)sr);
          } else {
            for (int col = 0; col < ncols; ++col) {
              const uint64_t off = epf_recv_scale_offset(p, row, col, sb, sr) - p->region[EPF_REGION_RECV_SCALES].offset;
              if (off + (uint64_t)esz > p->region[EPF_REGION_RECV_SCALES].bytes)
                HT_REF_FAIL("rank %d row %lld col %d: scale offset %llu past RECV_SCALES", dst, (long long)row, col, (unsigned long long)off);
              if (memcmp(sc + off, m->xs + st * sbr + (int64_t)col * esz, (size_t)esz) != 0)
                HT_REF_FAIL("rank %d row %lld col %d: scale differs (%s)", dst, (long long)row, col,
                            c->seg_mn ? "segment MN-major" : c->swizzled ? "swizzled" : "compact");
            }
          }
        }
        const int32_t* mt = (const int32_t*)(meta + (uint64_t)row * p->meta_bytes_per_row);
        if (c->layout == EPF_LAYOUT_EXPERT_MAJOR) {
          const epf_recv_meta_em_t* me = (const epf_recv_meta_em_t*)mt;
          const int e = m->topk[st * K + k];
          const float want_w = combine_weights ? ref_combine_weight(c, m, st, k) : m->w[st * K + k];
          if (me->src_token != t || me->src_rank != s || me->k != k || me->local_expert != e - dst * EL ||
              memcmp(&me->weight, &want_w, 4) != 0)
            HT_REF_FAIL("rank %d row %lld: metadata differs (token %d/%d, src %d/%d, k %d/%d, expert %d/%d, weight %a/%a)", dst,
                        (long long)row, me->src_token, t, me->src_rank, s, me->k, k, me->local_expert, e - dst * EL,
                        (double)me->weight, (double)want_w);
        } else {
          int n = 0;
          for (int kk = 0; kk < K; ++kk) {
            const int e = m->topk[st * K + kk];
            if (e < 0 || e / EL != dst) continue;
            const char* mb = (const char*)mt;
            if (*(const int32_t*)(mb + epf_recv_meta_rm_expert_at(K, n)) != e - dst * EL ||
                *(const float*)(mb + epf_recv_meta_rm_weight_at(K, n)) != m->w[st * K + kk])
              HT_REF_FAIL("rank %d row %lld entry %d: rank-major metadata differs", dst, (long long)row, n);
            ++n;
          }
          const epf_recv_meta_rm_t* mh = (const epf_recv_meta_rm_t*)mt;
          if (mh->src_token != t || mh->src_rank != s || mh->num_local != n) HT_REF_FAIL("rank %d row %lld: rank-major header differs", dst, (long long)row);
        }
      }
    }
  return 0;
}

/* check_recv_rank — check_recv_rank_ex for a forward dispatch (metadata weight = topk_weights[t][k]) */
static inline int check_recv_rank(const ht_case_t* c, const model_t* m, const epf_plan_t* p, int dst, const uint8_t* tok,
                                  const uint8_t* meta, const uint8_t* sc, char* msg, size_t msg_bytes) {
  return check_recv_rank_ex(c, m, p, dst, tok, meta, sc, 0, msg, msg_bytes);
}

/* check_expand_rank — RANK_MAJOR: rank dst's expand view (view: its [expert_rows][row_bytes],
 * copied to the host) holds every (token, k) copy sent to dst at its expert-major row (model_place
 * done). Returns 0, or 1 with the first difference in msg. */
static inline int check_expand_rank(const ht_case_t* c, const model_t* m, const epf_plan_t* p, int dst, const uint8_t* view,
                                    int64_t expert_rows, char* msg, size_t msg_bytes) {
  const int R = c->R, T = c->T, K = c->K, H = c->H, EL = c->E / c->R;
  const int64_t cap = p->recv_capacity;
  for (int s = 0; s < R; ++s)
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) {
        const int64_t i = ((int64_t)s * T + t) * K + k;
        const int e = m->topk[i];
        if (e < 0 || e / EL != dst || m->row[((int64_t)s * T + t) * R + e / EL] >= cap || m->em_row[i] >= expert_rows) continue;
        const uint8_t* want = c->payload == EPF_PAYLOAD_BF16 ? (const uint8_t*)(m->x + ((int64_t)s * T + t) * H)
                                                             : m->xq + ((int64_t)s * T + t) * H;
        if (memcmp(view + (uint64_t)m->em_row[i] * p->row_bytes, want, p->row_bytes) != 0)
          HT_REF_FAIL("expand: (src %d, token %d, k %d) not at view row %lld of rank %d", s, t, k, (long long)m->em_row[i], e / EL);
      }
  return 0;
}

#undef HT_REF_FAIL

/* ref_combine_token — the BF16 combine output of token st = s * T + t (source rank s) into want[H]
 * (model_place done): expert output of copy k y = bf16(dequant(x) * f(le, dst)); EXPERT_MAJOR:
 * acc = fma(w_k, y_k, acc) in k order (MXFP8 combine payload: y quantized per 32, dequantize-fma);
 * RANK_MAJOR: per destination rank (order of first occurrence in k) a partial in k order, rounded
 * to the combine payload, then acc = fma(1, partial, acc) in that order. Copies dropped at the
 * capacity (or past expert_rows in the expand view) contribute nothing. Scratch: acc, part [H]
 * floats, y [H], yq [H + H / 32] bytes. */
static inline void ref_combine_token(const ht_case_t* c, const model_t* m, const epf_plan_t* p, int64_t expert_rows,
                                     int64_t st, float* acc, float* part, uint16_t* y, uint8_t* yq, uint16_t* want) {
  const int R = c->R, K = c->K, H = c->H, EL = c->E / c->R;
  const int64_t cap = p->recv_capacity;
  const int sbr = sb_per_row(c);
  const int mx_rule = epf_mx_rule_from_flags(p->flags);
  for (int h = 0; h < H; ++h) acc[h] = 0.f;
  /* expert output of copy k (BF16): f(le, dst) * dequant(x) */
  int order[32], nd = 0;
  if (c->layout == EPF_LAYOUT_EXPERT_MAJOR) {
    for (int k = 0; k < K; ++k) {
      const int e = m->topk[st * K + k];
      /* a repeated expert id contributes the output of its first occurrence's row (nothing if that
       * row was dropped at the capacity) with its own weight */
      if (e < 0 || m->row[st * K + ht_ref_first_k(m->topk + st * K, k)] >= cap) continue;
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
        if (e < 0 || e / EL != dst || m->em_row[st * K + k] >= expert_rows) continue;
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
  for (int h = 0; h < H; ++h) want[h] = bf16_rne(acc[h]);
}


/* ---- the training direction (docs/high-throughput.md "Training") ------------------------------ */
/* The backward round on the same route: the model's x holds dy (BF16 [R][T][H]); the test's expert
 * backward (experts_backward_kernel) turns each received dy row of local expert le on rank d into
 *   dx_row[h]      = bf16(dy[h] * grad_factor(le, d))
 *   weight_grad    = dy[0] * wgrad_factor(le, d)           (FP32, one multiply)
 * so that every value names its token (dy) and its expert (le, d). */

static inline float grad_factor(int le, int rank) { return 0.75f + 0.0625f * (float)(le % 5) + 0.125f * (float)(rank % 4); }
static inline float wgrad_factor(int le, int rank) { return 1.5f - 0.25f * (float)(le % 3) + 0.03125f * (float)(rank % 7); }

/* ref_combine_weight — the EXPERT_MAJOR metadata weight of the row (t, k) owns after the backward of
 * combine: the sum in ascending k' (FP32 adds from 0) of w[t][k'] over every k' whose first
 * occurrence is k (k itself and its repeats). */
static inline float ref_combine_weight(const ht_case_t* c, const model_t* m, int64_t st, int k) {
  const int32_t* r = m->topk + st * c->K;
  float s = 0.f;
  for (int q = 0; q < c->K; ++q)
    if (r[q] >= 0 && ht_ref_first_k(r, q) == k) s += m->w[st * c->K + q];
  return s;
}

/* ref_dispatch_backward_token — the backward of dispatch for token st = s * T + t (model_place done,
 * m->x = dy): want[H] = dx of the token, wg[K] = its router-weight gradients.
 *   EXPERT_MAJOR: acc = fma(1, dx_k, acc) over first-occurrence k ascending whose row was received
 *                 (row < capacity); a repeat adds nothing.
 *   RANK_MAJOR:   per destination rank in first-occurrence order, if the token's row there was
 *                 received: part = fma(1, dx_k, part) over the first-occurrence k on that rank
 *                 ascending whose view row is below expert_rows; acc = fma(1, bf16(part), acc).
 *   wg[k]: for a valid id, the weight_grad of the row k reads (its first occurrence's; 0 when that
 *   copy was dropped at the capacity or, RANK_MAJOR, not placed in the view); 0 for -1.
 * Scratch: acc, part [H] floats. */
static inline void ref_dispatch_backward_token(const ht_case_t* c, const model_t* m, const epf_plan_t* p, int64_t expert_rows,
                                               int64_t st, float* acc, float* part, uint16_t* want, float* wg) {
  const int R = c->R, K = c->K, H = c->H, EL = c->E / c->R;
  const int64_t cap = p->recv_capacity;
  const uint16_t* dy = m->x + st * H;
  const int32_t* r = m->topk + st * K;
  for (int h = 0; h < H; ++h) acc[h] = 0.f;
  for (int k = 0; k < K; ++k) {
    wg[k] = 0.f;
    if (r[k] < 0) continue;
    const int kf = ht_ref_first_k(r, k), e = r[kf], d = e / EL;
    const int recv = c->layout == EPF_LAYOUT_EXPERT_MAJOR ? m->row[st * K + kf] < cap
                                                          : m->row[st * R + d] < cap && m->em_row[st * K + kf] < expert_rows;
    if (recv) wg[k] = bf16_f(dy[0]) * wgrad_factor(e % EL, d);
  }
  if (c->layout == EPF_LAYOUT_EXPERT_MAJOR) {
    for (int k = 0; k < K; ++k) {
      const int e = r[k];
      if (e < 0 || ht_ref_first_k(r, k) != k || m->row[st * K + k] >= cap) continue;
      const float g = grad_factor(e % EL, e / EL);
      for (int h = 0; h < H; ++h) acc[h] = fmaf(1.0f, bf16_f(bf16_rne(bf16_f(dy[h]) * g)), acc[h]);
    }
  } else {
    int order[32], nd = 0;
    for (int k = 0; k < K; ++k) {
      if (r[k] < 0) continue;
      int seen = 0;
      for (int j = 0; j < nd; ++j) seen |= order[j] == r[k] / EL;
      if (!seen) order[nd++] = r[k] / EL;
    }
    for (int j = 0; j < nd; ++j) {
      const int d = order[j];
      if (m->row[st * R + d] >= cap) continue;
      for (int h = 0; h < H; ++h) part[h] = 0.f;
      for (int k = 0; k < K; ++k) {
        const int e = r[k];
        if (e < 0 || e / EL != d || ht_ref_first_k(r, k) != k || m->em_row[st * K + k] >= expert_rows) continue;
        const float g = grad_factor(e % EL, d);
        for (int h = 0; h < H; ++h) part[h] = fmaf(1.0f, bf16_f(bf16_rne(bf16_f(dy[h]) * g)), part[h]);
      }
      for (int h = 0; h < H; ++h) acc[h] = fmaf(1.0f, bf16_f(bf16_rne(part[h])), acc[h]);
    }
  }
  for (int h = 0; h < H; ++h) want[h] = bf16_rne(acc[h]);
}

/* experts_backward_kernel — the tests' expert backward on the GPU, over the rows experts_kernel
 * covers (EM: the receive region's segments below the capacity; RM: the expand view's segments
 * below expert_rows): dx = bf16(dy * grad_factor(le, rank)) into dx_out ([index][expert_rows][H])
 * or, in_place (EM), over the received row; weight_grad[index][row] = dy[0] * wgrad_factor(le,
 * rank) when wgrad_out != NULL. Grid (any, count) as experts_kernel. BF16 plans. */
static __global__ void experts_backward_kernel(epf_route_t route, epf_plan_t plan, char* window, int rank_base,
                                               const uint16_t* view, int64_t expert_rows, uint16_t* dx_out,
                                               float* wgrad_out, int in_place) {
  const int index = (int)blockIdx.y, rank = rank_base + index;
  const epf_route_segment_t* seg = (const epf_route_segment_t*)epf_route_ptr(&route, index, EPF_ROUTE_RECV_SEGMENT);
  char* base = window + (uint64_t)index * plan.total_bytes;
  const int lane = epf_lane_id();
  const int gw = (int)(blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)), nw = (int)(gridDim.x * (blockDim.x >> 5));
  for (int le = 0; le < plan.experts_per_rank; ++le) {
    const float g = 0.75f + 0.0625f * (float)(le % 5) + 0.125f * (float)(rank % 4);
    const float gw8 = 1.5f - 0.25f * (float)(le % 3) + 0.03125f * (float)(rank % 7);
    const int64_t cap = plan.layout == EPF_LAYOUT_EXPERT_MAJOR ? plan.recv_capacity : expert_rows;
    int64_t end = seg[le].begin + seg[le].count;
    if (end > cap) end = cap;
    for (int64_t r = seg[le].begin + gw; r < end; r += nw) {
      const uint16_t* dy = plan.layout == EPF_LAYOUT_EXPERT_MAJOR
                               ? (const uint16_t*)(base + epf_plan_recv_token_offset(&plan, r))
                               : view + ((uint64_t)index * expert_rows + r) * plan.hidden;
      uint16_t* dx = in_place ? (uint16_t*)(base + epf_plan_recv_token_offset(&plan, r))
                              : dx_out + ((uint64_t)index * expert_rows + r) * plan.hidden;
      if (wgrad_out != NULL && lane == 0) /* element 0 is rewritten (in place) by lane 0 only, below */
        wgrad_out[(uint64_t)index * expert_rows + r] = __fmul_rn(epf_bf16_to_float(dy[0]), gw8);
      for (int h0 = lane * 8; h0 < plan.hidden; h0 += 256) {
        uint16_t vals[8];
        for (int i = 0; i < 8; ++i)
          vals[i] = __bfloat16_as_ushort(__float2bfloat16_rn(__fmul_rn(epf_bf16_to_float(dy[h0 + i]), g)));
        for (int i = 0; i < 8; ++i) dx[h0 + i] = vals[i];
      }
    }
  }
}

#endif /* EPF_HT_REF_H */
