/* quant_shim.cu -> libepf_quant_shim.so — C launchers of quant/quant.cuh's row functions for Python
 * (ctypes): scripts/check_quant_torch.py compares our bytes with PyTorch's float8_e4m3fn cast,
 * scripts/bench_quant_torch.py times us next to PyTorch eager and torch.compile. tests/bench/
 * bench_quant.cu includes this file too, so the benchmark and the scripts time the same kernels.
 * Not part of the library and not a test (PyTorch stays out of CTest and CI).
 *
 * Every function takes device pointers and a cudaStream_t (as void*; 0 = the legacy default
 * stream; pass torch.cuda.current_stream().cuda_stream), launches asynchronously and returns an
 * epf_status_t: EPF_OK, the epf_quant_check status, or EPF_ERR_CUDA when the launch failed.
 *
 *   int     epf_shim_mxfp8_quantize_bf16(x, rows, hidden, rule, scale_layout, out_q, out_scales, stream)
 *   int     epf_shim_mxfp8_quantize_f32 (x, rows, hidden, rule, scale_layout, out_q, out_scales, stream)
 *   int     epf_shim_fp8_128_quantize_bf16(x, rows, hidden, ue8m0, out_q, out_scales, stream)
 *   int     epf_shim_fp8_128_quantize_f32 (x, rows, hidden, ue8m0, out_q, out_scales, stream)
 *   int64_t epf_shim_scale_bytes(scale_layout, rows, n_scale_cols)
 *   void    epf_shim_set_launch(threads_per_block, max_blocks)   0 = defaults (256, one row per warp)
 *   int     epf_shim_version(void)
 * Scales: MXFP8 compact [rows, hidden/32] uint8 or swizzled 128x4 (epf_shim_scale_bytes bytes, the
 * padding zeroed by the same launch); per-128 [rows, hidden/128] float32 row-major.
 */
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "epfuse/quant/quant.cuh"

/* one warp per row, grid-stride over rows; swizzled MXFP8 scales: every thread also zeroes its
 * share of the padding (disjoint bytes, no ordering needed) */
__global__ void epf_shim_k_mx_bf16(const uint16_t* x, int64_t rows, int hidden, int rule, int layout, uint8_t* q,
                                   uint8_t* sf) {
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nthreads = (int64_t)gridDim.x * blockDim.x;
  if (layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4) epf_scale_swizzle_zero_padding(sf, rows, hidden / 32, tid, nthreads);
  __syncwarp();
  for (int64_t r = tid >> 5; r < rows; r += nthreads >> 5)
    epf_mxfp8_quantize_row_bf16_warp(x + r * hidden, hidden, rule, r, layout, q + r * hidden, sf);
}

__global__ void epf_shim_k_mx_f32(const float* x, int64_t rows, int hidden, int rule, int layout, uint8_t* q,
                                  uint8_t* sf) {
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nthreads = (int64_t)gridDim.x * blockDim.x;
  if (layout == EPF_SCALE_LAYOUT_SWIZZLED_128X4) epf_scale_swizzle_zero_padding(sf, rows, hidden / 32, tid, nthreads);
  __syncwarp();
  for (int64_t r = tid >> 5; r < rows; r += nthreads >> 5)
    epf_mxfp8_quantize_row_f32_warp(x + r * hidden, hidden, rule, r, layout, q + r * hidden, sf);
}

__global__ void epf_shim_k_128_bf16(const uint16_t* x, int64_t rows, int hidden, bool ue8m0, uint8_t* q, float* sf) {
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nthreads = (int64_t)gridDim.x * blockDim.x;
  for (int64_t r = tid >> 5; r < rows; r += nthreads >> 5)
    epf_fp8_128_quantize_row_bf16_warp(x + r * hidden, hidden, ue8m0, 1, q + r * hidden, sf + r * (hidden / 128));
}

__global__ void epf_shim_k_128_f32(const float* x, int64_t rows, int hidden, bool ue8m0, uint8_t* q, float* sf) {
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nthreads = (int64_t)gridDim.x * blockDim.x;
  for (int64_t r = tid >> 5; r < rows; r += nthreads >> 5)
    epf_fp8_128_quantize_row_f32_warp(x + r * hidden, hidden, ue8m0, 1, q + r * hidden, sf + r * (hidden / 128));
}

static int epf_shim_threads = 256; /* per block */
static int epf_shim_max_blocks = 0; /* 0: one row per warp (up to 2^31 - 1 blocks) */

static unsigned epf_shim_grid(int64_t rows) {
  const int64_t warps = epf_shim_threads / 32;
  int64_t g = (rows + warps - 1) / warps;
  if (epf_shim_max_blocks > 0 && g > epf_shim_max_blocks) g = epf_shim_max_blocks;
  if (g > 0x7fffffff) g = 0x7fffffff;
  return (unsigned)(g < 1 ? 1 : g);
}

static int epf_shim_launched(void) { return cudaGetLastError() == cudaSuccess ? (int)EPF_OK : (int)EPF_ERR_CUDA; }

extern "C" {

int epf_shim_version(void) { return EPF_VERSION; }

void epf_shim_set_launch(int threads_per_block, int max_blocks) {
  epf_shim_threads = threads_per_block >= 32 && threads_per_block <= 1024 && threads_per_block % 32 == 0
                         ? threads_per_block
                         : 256;
  epf_shim_max_blocks = max_blocks > 0 ? max_blocks : 0;
}

int64_t epf_shim_scale_bytes(int scale_layout, int64_t rows, int n_scale_cols) {
  return epf_scale_bytes(scale_layout, rows, n_scale_cols);
}

int epf_shim_mxfp8_quantize_bf16(const void* x, int64_t rows, int hidden, int rule, int scale_layout, void* out_q,
                                 void* out_scales, void* stream) {
  const epf_status_t st = epf_quant_check(hidden, EPF_PAYLOAD_MXFP8);
  if (st != EPF_OK) return (int)st;
  if (rows < 1) return rows == 0 ? (int)EPF_OK : (int)EPF_ERR_INVALID_ARGUMENT;
  epf_shim_k_mx_bf16<<<epf_shim_grid(rows), epf_shim_threads, 0, (cudaStream_t)stream>>>(
      (const uint16_t*)x, rows, hidden, rule, scale_layout, (uint8_t*)out_q, (uint8_t*)out_scales);
  return epf_shim_launched();
}

int epf_shim_mxfp8_quantize_f32(const void* x, int64_t rows, int hidden, int rule, int scale_layout, void* out_q,
                                void* out_scales, void* stream) {
  const epf_status_t st = epf_quant_check(hidden, EPF_PAYLOAD_MXFP8);
  if (st != EPF_OK) return (int)st;
  if (rows < 1) return rows == 0 ? (int)EPF_OK : (int)EPF_ERR_INVALID_ARGUMENT;
  epf_shim_k_mx_f32<<<epf_shim_grid(rows), epf_shim_threads, 0, (cudaStream_t)stream>>>(
      (const float*)x, rows, hidden, rule, scale_layout, (uint8_t*)out_q, (uint8_t*)out_scales);
  return epf_shim_launched();
}

int epf_shim_fp8_128_quantize_bf16(const void* x, int64_t rows, int hidden, int ue8m0, void* out_q, void* out_scales,
                                   void* stream) {
  const epf_status_t st = epf_quant_check(hidden, EPF_PAYLOAD_FP8_128);
  if (st != EPF_OK) return (int)st;
  if (rows < 1) return rows == 0 ? (int)EPF_OK : (int)EPF_ERR_INVALID_ARGUMENT;
  epf_shim_k_128_bf16<<<epf_shim_grid(rows), epf_shim_threads, 0, (cudaStream_t)stream>>>(
      (const uint16_t*)x, rows, hidden, ue8m0 != 0, (uint8_t*)out_q, (float*)out_scales);
  return epf_shim_launched();
}

int epf_shim_fp8_128_quantize_f32(const void* x, int64_t rows, int hidden, int ue8m0, void* out_q, void* out_scales,
                                  void* stream) {
  const epf_status_t st = epf_quant_check(hidden, EPF_PAYLOAD_FP8_128);
  if (st != EPF_OK) return (int)st;
  if (rows < 1) return rows == 0 ? (int)EPF_OK : (int)EPF_ERR_INVALID_ARGUMENT;
  epf_shim_k_128_f32<<<epf_shim_grid(rows), epf_shim_threads, 0, (cudaStream_t)stream>>>(
      (const float*)x, rows, hidden, ue8m0 != 0, (uint8_t*)out_q, (float*)out_scales);
  return epf_shim_launched();
}

} /* extern "C" */
