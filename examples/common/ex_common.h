/* ex_common.h — helpers shared by the epfuse examples (not part of the library).
 *   EX_CK(call)        exit(1) with file:line on a CUDA error
 *   EX_CS(call)        exit(1) with the status name and message on an epfuse error
 *   ex_gpu_or_exit()   no usable GPU: say why; exit 77 (CTest "Not Run") without a driver or GPU,
 *                      else 77 under --ctest and 1 without
 *   ex_record_make() / ex_record_check()   the host-mapped error record: make it; is it clean?
 *   ex_dev_copy() / ex_dev_zeroed()        device memory: a copy of host bytes; zeroed bytes
 *   ex_rand()          splitmix64
 *   ex_bf16_rne()      FP32 -> BF16, round to nearest even (the CPU side of the references)
 *   ex_expert_factor() the "expert" of the examples: y = bf16(x * f(local expert, rank))
 *   ex_ref_combine()   CPU reference of one token's combine output (bit-exact with ht/kernels.cuh,
 *                      and with ll/kernels.cuh for an expert-major plan); _residual: + a residual
 * and, compiled by nvcc:
 *   ex_vteam_make()    R virtual ranks of an HT plan: window, team, route buffers
 *   ex_vteam_make_strided(), ex_vteam_stride_expert_out()   the same at a stride of the caller's:
 *                      the one under which the slices' EXPERT_OUT rows form one expert_out array
 *   ex_experts.cuh     the examples' expert stage on the GPU (HT and LL)
 */
#ifndef EX_COMMON_H
#define EX_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlfcn.h>

#include <cuda_runtime.h>

#include "epfuse/host.h"
#include "epfuse/quant/quant.cuh"

#define EX_CK(call)                                                                                  \
  do {                                                                                               \
    cudaError_t ex_e_ = (call);                                                                      \
    if (ex_e_ != cudaSuccess) {                                                                      \
      fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(ex_e_));   \
      exit(1);                                                                                       \
    }                                                                                                \
  } while (0)

#define EX_CS(call)                                                                                  \
  do {                                                                                               \
    epf_status_t ex_s_ = (call);                                                                     \
    if (ex_s_ != EPF_OK) {                                                                           \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, epf_status_name(ex_s_),    \
              epf_status_message(ex_s_));                                                            \
      exit(1);                                                                                       \
    }                                                                                                \
  } while (0)

/* Why cudaGetDeviceCount found no GPU to use, in words. "no CUDA driver / no GPU found" when there
 * is none: cudaErrorNoDevice, or cudaErrorInsufficientDriver / cudaErrorStubLibrary with no
 * driver library to load (the runtime reports a missing libcuda.so.1 as an insufficient driver);
 * a libcuda.so.1 that loads but is too old for this runtime is said to be too old. */
static inline int ex_no_driver_or_gpu(cudaError_t e) {
  void* h;
  if (e == cudaErrorNoDevice) return 1;
  if (e != cudaErrorInsufficientDriver && e != cudaErrorStubLibrary) return 0;
  h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h == NULL) return 1;
  dlclose(h);
  return e == cudaErrorStubLibrary;
}

/* No usable GPU: one line that says why, then exit. Exit code 77 (CTest: "Not Run") when the
 * machine has no CUDA driver or no GPU at all; for a GPU that is there but cannot be used (a
 * driver too old for this CUDA runtime, fewer GPUs than needed, another CUDA error) 77 only under
 * --ctest, otherwise 1 so that a shell user sees a failure to fix. */
static inline void ex_gpu_or_exit(int need, int ctest) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n >= need) return;
  if (e != cudaSuccess && ex_no_driver_or_gpu(e)) {
    fprintf(stderr, "this example needs %d CUDA GPU(s): no CUDA driver / no GPU found (%s)\n", need,
            cudaGetErrorName(e));
    exit(77);
  }
  if (e == cudaErrorInsufficientDriver)
    fprintf(stderr, "this example needs %d CUDA GPU(s): the CUDA driver is too old for this CUDA runtime (%s: %s)\n",
            need, cudaGetErrorName(e), cudaGetErrorString(e));
  else
    fprintf(stderr, "this example needs %d CUDA GPU(s); found %d (%s)\n", need, e == cudaSuccess ? n : 0,
            e == cudaSuccess ? "ok" : cudaGetErrorString(e));
  exit(ctest ? 77 : 1);
}

/* the host-mapped error record: the device writes it, the host reads it without a sync */
static inline void ex_record_make(epf_error_record_t** rec_h, epf_error_record_t** rec_d) {
  EX_CK(cudaHostAlloc((void**)rec_h, sizeof(**rec_h), cudaHostAllocMapped));
  EX_CK(cudaHostGetDevicePointer((void**)rec_d, *rec_h, 0));
  epf_error_clear(*rec_h);
}

/* 0 when the record is clean (status, overflow, dropped routes); else print it and return 1 */
static inline int ex_record_check(const epf_error_record_t* rec_h) {
  epf_error_record_t rec;
  epf_error_read(rec_h, &rec);
  if (rec.status != 0 || rec.recv_overflow != 0 || rec.dropped_routes != 0) {
    fprintf(stderr, "error record: %s, peer %d, overflow %u, dropped routes %u\n",
            epf_status_name((epf_status_t)rec.status), rec.peer, rec.recv_overflow, rec.dropped_routes);
    return 1;
  }
  return 0;
}

/* device memory: a copy of `bytes` host bytes; `bytes` zeroed */
static inline void* ex_dev_copy(const void* host, size_t bytes) {
  void* d = NULL;
  EX_CK(cudaMalloc(&d, bytes));
  EX_CK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
  return d;
}
static inline void* ex_dev_zeroed(size_t bytes) {
  void* d = NULL;
  EX_CK(cudaMalloc(&d, bytes));
  EX_CK(cudaMemset(d, 0, bytes));
  return d;
}

static inline uint64_t ex_rand(uint64_t* s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline uint16_t ex_bf16_rne(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static inline float ex_bf16_f(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* the examples' "expert": a per-(local expert, rank) scale, exact in BF16 arithmetic */
EPF_HD float ex_expert_factor(int le, int rank) {
  return 1.0f + 0.125f * (float)(le % 7) - 0.0625f * (float)(rank % 3);
}

/* dequantized copy of one BF16 row as it arrives in plan.payload (BF16: itself) */
static inline void ex_ref_payload_row(const epf_plan_t* p, const uint16_t* x, float* out) {
  const int H = p->hidden;
  float buf[128];
  uint8_t q[128];
  if (p->payload == EPF_PAYLOAD_BF16) {
    for (int h = 0; h < H; ++h) out[h] = ex_bf16_f(x[h]);
  } else if (p->payload == EPF_PAYLOAD_MXFP8) {
    for (int g = 0; g < H / 32; ++g) {
      for (int i = 0; i < 32; ++i) buf[i] = ex_bf16_f(x[g * 32 + i]);
      const uint8_t s = epf_mxfp8_quantize_block_ref(buf, epf_mx_rule_from_flags(p->flags), q);
      for (int i = 0; i < 32; ++i) out[g * 32 + i] = epf_mxfp8_dequantize_ref(q[i], s);
    }
  } else {
    for (int g = 0; g < H / 128; ++g) {
      for (int i = 0; i < 128; ++i) buf[i] = ex_bf16_f(x[g * 128 + i]);
      const float s = epf_fp8_128_quantize_block_ref(buf, epf_fp8_128_ue8m0_from_flags(p->flags), q);
      for (int i = 0; i < 128; ++i) out[g * 128 + i] = epf_fp8_128_dequantize_ref(q[i], s);
    }
  }
}

/* ex_ref_combine — the BF16 combine output of one token whose BF16 input row is x, routed to
 * topk[0..K) with weights w[0..K), after the expert y = bf16(deq(x) * f(le, rank)) (BF16 combine
 * payload, pull or push). EXPERT_MAJOR: acc = fma(w_k, y_k, acc) in k order; with an MXFP8
 * combine payload (EXPERT_MAJOR) y_k travels quantized (E4M3 + E8M0 per 32, the plan's rule) and
 * acc = epf_mxfp8_dequantize_accumulate_ref(q, scale, w_k, acc), the library's per-element step. RANK_MAJOR: per
 * destination rank (in order of first occurrence in k) a partial in k order rounded to BF16, then
 * acc = fma(1, partial, acc) in that rank order; with an MXFP8 combine payload (LL rank-major) the
 * FP32 partial travels quantized (E4M3 + E8M0 per 32) and is dequantized into acc with weight 1.
 * ex_ref_combine_residual: the same with a residual row (BF16 [hidden]) added with weight 1 after
 * the K experts, in the same FP32 chain, before the one rounding (NULL: none).
 * Scratch: 3 * hidden floats. */
static inline void ex_ref_combine_residual(const epf_plan_t* p, const uint16_t* x, const int32_t* topk, const float* w,
                                           const uint16_t* residual, float* scratch, uint16_t* out) {
  const int H = p->hidden, K = p->top_k, EL = p->experts_per_rank;
  float* dq = scratch;
  float* acc = scratch + H;
  float* part = scratch + 2 * H;
  ex_ref_payload_row(p, x, dq);
  for (int h = 0; h < H; ++h) acc[h] = 0.f;
  if (p->layout == EPF_LAYOUT_EXPERT_MAJOR && p->combine_payload == EPF_PAYLOAD_MXFP8) {
    for (int k = 0; k < K; ++k) {
      const int e = topk[k];
      if (e < 0) continue;
      const float f = ex_expert_factor(e % EL, e / EL);
      for (int g = 0; g < H / 32; ++g) {
        float y32[32];
        uint8_t q32[32];
        for (int i = 0; i < 32; ++i) y32[i] = ex_bf16_f(ex_bf16_rne(dq[g * 32 + i] * f));
        const uint8_t sb = epf_mxfp8_quantize_block_ref(y32, epf_mx_rule_from_flags(p->flags), q32);
        for (int i = 0; i < 32; ++i)
          acc[g * 32 + i] = epf_mxfp8_dequantize_accumulate_ref(q32[i], sb, w[k], acc[g * 32 + i]);
      }
    }
  } else if (p->layout == EPF_LAYOUT_EXPERT_MAJOR) {
    for (int k = 0; k < K; ++k) {
      const int e = topk[k];
      if (e < 0) continue;
      const float f = ex_expert_factor(e % EL, e / EL);
      for (int h = 0; h < H; ++h) acc[h] = fmaf(w[k], ex_bf16_f(ex_bf16_rne(dq[h] * f)), acc[h]);
    }
  } else {
    int order[64], nd = 0;
    for (int k = 0; k < K; ++k) {
      const int e = topk[k];
      int seen = 0;
      if (e < 0) continue;
      for (int j = 0; j < nd; ++j) seen |= order[j] == e / EL;
      if (!seen) order[nd++] = e / EL;
    }
    for (int j = 0; j < nd; ++j) {
      for (int h = 0; h < H; ++h) part[h] = 0.f;
      for (int k = 0; k < K; ++k) {
        const int e = topk[k];
        if (e < 0 || e / EL != order[j]) continue;
        const float f = ex_expert_factor(e % EL, order[j]);
        for (int h = 0; h < H; ++h) part[h] = fmaf(w[k], ex_bf16_f(ex_bf16_rne(dq[h] * f)), part[h]);
      }
      if (p->combine_payload == EPF_PAYLOAD_MXFP8) { /* LL: the FP32 partial travels as an MXFP8 row */
        for (int g = 0; g < H / 32; ++g) {
          uint8_t q32[32];
          const uint8_t sb = epf_mxfp8_quantize_block_ref(part + g * 32, epf_mx_rule_from_flags(p->flags), q32);
          for (int i = 0; i < 32; ++i)
            acc[g * 32 + i] = epf_mxfp8_dequantize_accumulate_ref(q32[i], sb, 1.0f, acc[g * 32 + i]);
        }
      } else {
        for (int h = 0; h < H; ++h) acc[h] = fmaf(1.0f, ex_bf16_f(ex_bf16_rne(part[h])), acc[h]);
      }
    }
  }
  if (residual != NULL) /* one more row of weight 1 in the same FP32 chain, after the K experts */
    for (int h = 0; h < H; ++h) acc[h] = fmaf(1.0f, ex_bf16_f(residual[h]), acc[h]);
  for (int h = 0; h < H; ++h) out[h] = ex_bf16_rne(acc[h]);
}

static inline void ex_ref_combine(const epf_plan_t* p, const uint16_t* x, const int32_t* topk, const float* w,
                                  float* scratch, uint16_t* out) {
  ex_ref_combine_residual(p, x, topk, w, NULL, scratch, out);
}

#ifdef __CUDACC__
#include "epfuse/route/kernels.cuh"

/* ex_vteam_t — R = plan.nranks virtual ranks of an HT plan on this GPU: one cudaMalloc of R window
 * slices of `stride` bytes (zeroed: epochs start at 0; virtual rank r owns slice r, at
 * window + r * stride), the team over them and one route buffer per rank (int32 expert ids) — the
 * steps examples/01_virtual_ranks/main.cu shows. */
typedef struct {
  char* window;
  void* route_buf;
  epf_team_t team;
  epf_route_t route;
  uint64_t stride; /* bytes from one rank's slice to the next: plan.total_bytes or the caller's */
} ex_vteam_t;

/* ex_vteam_stride_expert_out — a virtual-rank stride under which the R slices' EXPERT_OUT regions
 * are one array of expert outputs: plan.total_bytes rounded up to a multiple of lcm(EPF_ALIGN,
 * plan.combine_row_bytes). Rank d's EXPERT_OUT row r (epf_plan_expert_out_offset) is then row
 * d * (stride / combine_row_bytes) + r of the rows starting at rank 0's EXPERT_OUT, so a step with
 * expert_out = window + region[EPF_REGION_EXPERT_OUT].offset and expert_rows = stride /
 * combine_row_bytes names every output row where the pull combine reads it, and the combine's
 * expert side has nothing to put (epf_combine_expert_row_em_warp skips a row already there). For a
 * BF16 combine (combine_row_bytes = hidden * 2, the step's row pitch). A real rank needs no such
 * stride: its expert_out is its own slice's EXPERT_OUT. */
static inline uint64_t ex_vteam_stride_expert_out(const epf_plan_t* plan) {
  uint64_t a = (uint64_t)EPF_ALIGN, b = plan->combine_row_bytes, l;
  while (b != 0u) { /* gcd(EPF_ALIGN, combine row) */
    const uint64_t t = a % b;
    a = b;
    b = t;
  }
  l = (uint64_t)EPF_ALIGN / a * plan->combine_row_bytes;
  return (plan->total_bytes + l - 1u) / l * l;
}

/* ex_vteam_make_strided — ex_vteam_make with slices of `stride` bytes: at least plan.total_bytes,
 * a multiple of EPF_ALIGN (exit(1) otherwise) */
static inline void ex_vteam_make_strided(const epf_plan_t* plan, uint64_t stride, ex_vteam_t* v) {
  const int R = plan->nranks;
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  uint64_t rbytes = 0;
  if (stride < plan->total_bytes || stride % (uint64_t)EPF_ALIGN != 0u) {
    fprintf(stderr, "ex_vteam_make_strided: stride %llu is below the plan's %llu bytes or not a multiple of %d\n",
            (unsigned long long)stride, (unsigned long long)plan->total_bytes, (int)EPF_ALIGN);
    exit(1);
  }
  rc.index_type = EPF_INDEX_INT32;
  v->stride = stride;
  EX_CK(cudaMalloc((void**)&v->window, (size_t)R * stride));
  EX_CK(cudaMemset(v->window, 0, (size_t)R * stride));
  v->team = epf_team_virtual(v->window, stride, 0, R);
  EX_CS(epf_route_size(plan, &rc, &rbytes));
  EX_CK(cudaMalloc(&v->route_buf, (size_t)rbytes * R));
  EX_CS(epf_route_init(plan, &rc, v->route_buf, rbytes * R, R, 1u, 0, &v->route));
  /* the memsets above run on the legacy default stream, which a non-blocking stream does not wait
   * for: finish them before any kernel of the caller's stream touches the window */
  EX_CK(cudaDeviceSynchronize());
}

static inline void ex_vteam_make(const epf_plan_t* plan, ex_vteam_t* v) {
  ex_vteam_make_strided(plan, plan->total_bytes, v);
}

static inline void ex_vteam_free(ex_vteam_t* v) {
  EX_CK(cudaFree(v->window));
  EX_CK(cudaFree(v->route_buf));
}

#include "ex_experts.cuh"
#endif /* __CUDACC__ */

#endif /* EX_COMMON_H */
