/* epfuse/quant/quant.cuh — MXFP8 and per-128 FP8 quantization blocks, bit-exact and at memory speed — part of epfuse v0.1
 *
 * What it is: the quantization building blocks dispatch and combine use, and that users call in
 * their own kernels:
 *   - MXFP8: E4M3 elements + one E8M0 scale byte per 32 elements, scale rule RCEIL (default; cuBLAS,
 *     TransformerEngine) or FLOOR (OCP MX v1.0). BF16 or FP32 rows in.
 *   - per-128 FP8 (DeepSeek-V3 / DeepEP): E4M3 elements + one FP32 scale amax/448 per 128 elements
 *     (amax floored at 1e-4), optionally rounded up to a power of two (UE8M0).
 *   - scale writers for the compact row-major [rows, H/32] layout and the swizzled 128x4 layout
 *     Blackwell block-scaled GEMMs read; dequantize, and the fused "dequantize x weight, accumulate
 *     in FP32" step of combine.
 *   - EPF_HD scalar reference functions of every rule, usable from host code and tests; every
 *     device block is bit-identical to them (tests/gpu/test_quant, scripts/check_quant_torch.py).
 * The exact rules, edge cases (NaN, Inf, zeros, subnormals) and how they compare with torchao and
 * DeepGEMM are in docs/quant.md.
 *
 * Three levels, pick the one that matches what your code has in registers:
 *   row      epf_*_quantize_row_{bf16,f32}_warp: a warp quantizes one row in memory.
 *   lane8    epf_*_quantize_lane8[_bf16]_warp: a warp quantizes a 256-element chunk it holds, lane l
 *            with elements [8l, 8l+8) (one 16-byte BF16 load); MXFP8 groups are quads of lanes
 *            (amax by 2 shuffles), per-128 groups are half-warps (4 shuffles).
 *   thread   epf_mxfp8_quantize_block32 (one thread holds a whole 32-block), and
 *            epf_mxfp8_quantize8 / epf_fp8_128_quantize8 for code that reduced the amax itself and
 *            got the scale from epf_e8m0_from_amax / epf_fp8_128_scale.
 *
 * What it does NOT do: allocate, launch kernels, move data between ranks or order anything (the
 * stores are plain; publish with core/signal.cuh), or depend on -ftz / fast-math flags (every rounding
 * is explicit). It never reads or writes past `hidden` elements of a row.
 *
 * Usage (a fused kernel; tests/gpu/test_quant.cu "example-begin quant-fused" compiles it):
 *   // one warp per row: BF16 in, MXFP8 out, swizzled scales for a block-scaled GEMM
 *   if (epf_quant_check(H, EPF_PAYLOAD_MXFP8) != EPF_OK) ...                       // host
 *   epf_mxfp8_quantize_row_bf16_warp(x + row * H, H, EPF_MX_RCEIL, row,
 *                                    EPF_SCALE_LAYOUT_SWIZZLED_128X4, q + row * H, sf);
 *   epf_scale_swizzle_zero_padding(sf, rows, H / 32, global_thread, total_threads);
 *   // or from registers, e.g. inside a dispatch send loop:
 *   uint4 v = ((const uint4*)src_row)[chunk * 32 + lane];        // 8 BF16 per lane
 *   uint8_t sb;
 *   uint2 e4m3 = epf_mxfp8_quantize_lane8_bf16_warp(v, EPF_MX_RCEIL, &sb);
 *   ((uint2*)dst_row)[chunk * 32 + lane] = e4m3;
 *   if ((lane & 3) == 0) dst_scales[chunk * 8 + lane / 4] = sb;
 *
 * COMPILE-TIME OPTIONS (none has to agree across translation units: results never change):
 *   EPF_QUANT_UNROLL    default 4: 256-element chunks (16-byte loads per lane) in flight per warp
 *                       in the row functions.
 *   EPF_QUANT_HW_E8M0   default 1: use cvt.rp.satfinite.ue8m0x2.f32 on arch-family targets that
 *                       have it (sm_100f / sm_100a ...); 0: the integer path everywhere.
 *   EPF_DEBUG           (config.h) traps on misaligned pointers / bad hidden in the row functions.
 *
 * Contents (declared below with their contracts; the bodies are in impl/. [HD] = EPF_HD, host or
 *           device, any thread; [T] = device, any thread;
 *           [W] = [collective:warp], all 32 lanes converged):
 *   constants   epf_mx_rule_t {EPF_MX_RCEIL, EPF_MX_FLOOR}, EPF_MXFP8_GROUP (32),
 *               EPF_FP8_128_GROUP (128), EPF_E4M3_MAX, EPF_FP8_128_AMAX_MIN (1e-4)
 *   [HD] float    epf_bf16_to_float(uint16_t bits)
 *   [HD] uint8_t  epf_e4m3_from_float(float x)                       RNE, satfinite, NaN -> 0x7F
 *   [HD] float    epf_e4m3_to_float(uint8_t q)
 *   [HD] uint8_t  epf_e8m0_roundup(float v)                          smallest 2^k >= v, sat 0xFE
 *   [HD] uint8_t  epf_e8m0_from_amax_rceil(float amax) / _floor(float amax)
 *   [HD] uint8_t  epf_e8m0_from_amax(float amax, int rule)
 *   [HD] float    epf_e8m0_to_float(uint8_t b)                       2^(b-127); 0 -> 2^-127; 255 -> NaN
 *   [HD] float    epf_e8m0_quant_multiplier(uint8_t b)               2^(127-b); 254 -> 2^-127
 *   [HD] uint8_t  epf_mxfp8_quantize_ref(float x, uint8_t scale)
 *   [HD] float    epf_mxfp8_dequantize_ref(uint8_t q, uint8_t scale)
 *   [HD] float    epf_mxfp8_dequantize_accumulate_ref(uint8_t q, uint8_t scale, float w, float acc)
 *   [HD] uint8_t  epf_mxfp8_quantize_block_ref(const float* x32, int rule, uint8_t* out_q32)
 *   [HD] float    epf_fp8_128_scale(float amax, bool ue8m0)
 *   [HD] float    epf_fp8_128_recip(float scale)
 *   [HD] uint8_t  epf_fp8_128_quantize_ref(float x, float scale)
 *   [HD] float    epf_fp8_128_dequantize_ref(uint8_t q, float scale)
 *   [HD] float    epf_fp8_128_dequantize_accumulate_ref(uint8_t q, float scale, float w, float acc)
 *   [HD] float    epf_fp8_128_quantize_block_ref(const float* x128, bool ue8m0, uint8_t* out_q128)
 *   [HD] int64_t  epf_scale_swizzle_offset(int64_t row, int col, int n_scale_cols)
 *   [HD] int64_t  epf_scale_swizzle_bytes(int64_t rows, int n_scale_cols)
 *   [HD] int64_t  epf_scale_offset(int scale_layout, int64_t row, int col, int n_scale_cols)
 *   [HD] int64_t  epf_scale_bytes(int scale_layout, int64_t rows, int n_scale_cols)
 *   [HD] void     epf_scale_swizzle_zero_padding(uint8_t* scales, int64_t rows, int n_scale_cols,
 *                                                int64_t index, int64_t stride)
 *   [HD] epf_status_t epf_quant_check(int hidden, int payload)
 *   [HD] int      epf_mx_rule_from_flags(uint32_t flags); bool epf_fp8_128_ue8m0_from_flags(uint32_t)
 *   [HD] float    epf_fp8_128_scale_fast(float amax, bool ue8m0, float* out_recip)  the device's scale and RN(1/s)
 *   lane steps for fused quantizers that reduce a group's amax themselves (the HT quantizing send):
 *   [T]  void     epf_bf16x8_to_float(uint4 x8, float* out8)
 *   [T]  float    epf_amax8_bf16(uint4 x8)
 *   [T]  uint8_t  epf_e8m0_from_amax_nonneg(float amax, int rule)
 *   [T]  uint2    epf_fp8_128_quantize8_steps(const float* v8, float scale, float recip, bool two_steps)
 *   [T]  uint2    epf_mxfp8_quantize8(const float* v8, uint8_t scale)
 *   [W]  uint2    epf_mxfp8_quantize_lane8_warp(const float* v8, int rule, uint8_t* out_scale)
 *   [W]  uint2    epf_mxfp8_quantize_lane8_bf16_warp(uint4 x8, int rule, uint8_t* out_scale)
 *   [T]  uint8_t  epf_mxfp8_quantize_block32(const float* v32, int rule, uint32_t* out_q8)
 *   [W]  void     epf_mxfp8_quantize_row_bf16_warp(const void* x, int hidden, int rule, int64_t row,
 *                                                  int scale_layout, uint8_t* out_q, uint8_t* out_scales)
 *   [W]  void     epf_mxfp8_quantize_row_f32_warp(const float* x, ...same...)
 *   [T]  void     epf_mxfp8_dequantize8(uint2 q, uint8_t scale, float* out8)
 *   [T]  void     epf_mxfp8_dequantize_accumulate8(uint2 q, uint8_t scale, float w, float* acc8)
 *   [W]  void     epf_mxfp8_dequantize_row_f32_warp(const uint8_t* q, const uint8_t* scales, int hidden,
 *                                                   float* out)
 *   [W]  void     epf_mxfp8_dequantize_accumulate_row_warp(const uint8_t* q, const uint8_t* scales,
 *                                                          int hidden, float w, float* acc)
 *   [T]  uint2    epf_fp8_128_quantize8(const float* v8, float scale, float recip)
 *   [W]  uint2    epf_fp8_128_quantize_lane8_warp(const float* v8, bool ue8m0, float* out_scale)
 *   [W]  uint2    epf_fp8_128_quantize_lane8_bf16_warp(uint4 x8, bool ue8m0, float* out_scale)
 *   [W]  void     epf_fp8_128_quantize_row_bf16_warp(const void* x, int hidden, bool ue8m0,
 *                                                    int64_t scale_stride, uint8_t* out_q, float* out_scales)
 *   [W]  void     epf_fp8_128_quantize_row_f32_warp(const float* x, ...same...)
 *   [T]  void     epf_fp8_128_dequantize8(uint2 q, float scale, float* out8)
 *   [T]  void     epf_fp8_128_dequantize_accumulate8(uint2 q, float scale, float w, float* acc8)
 *   [W]  void     epf_fp8_128_dequantize_row_f32_warp(const uint8_t* q, const float* scales,
 *                                                     int64_t scale_stride, int hidden, float* out)
 *
 * Requirements: CUDA >= 12.8 (nvcc or clang-cuda), C++17. Device code: sm_70+; sm_89+ (and sm_90 /
 * sm_100, both tested) use the FP8 conversion instructions, older targets the integer reference,
 * with identical results. Row pointers 16-byte aligned (x), 8-byte aligned (E4M3 out).
 */
#ifndef EPF_QUANT_QUANT_CUH
#define EPF_QUANT_QUANT_CUH

#include "../config.h"
#include "../host.h"
#include "../status.h"

#if !EPF_IS_CUDA
#error "epfuse/quant/quant.cuh is a CUDA header: compile it with nvcc or clang-cuda"
#endif

EPF_BEGIN_DECLS

/* ---- scalar references, scale layouts, checks: host or device (impl/scalar.cuh) -------------- */

/* epf_bf16_to_float — the BF16 bit pattern `bits` as a float (exact). Scope: any thread. */
EPF_HD float epf_bf16_to_float(uint16_t bits);

/* epf_e4m3_from_float — x rounded to E4M3 (OCP "fn"): round to nearest even, saturating to
 *   +-448 (satfinite). NaN of either sign -> 0x7F; +-Inf and |x| >= 448 -> 0x7E / 0xFE;
 *   |x| <= 2^-10 -> +-0 (0x00 / 0x80, the sign is kept). Exactly cvt.rn.satfinite.e4m3x2.f32,
 *   which it uses on sm_89+. Scope: any thread, host or device. */
EPF_HD uint8_t epf_e4m3_from_float(float x);

/* epf_e4m3_to_float — the value of E4M3 byte q (exact). 0x7F / 0xFF -> NaN (sign kept).
 *   Scope: any thread, host or device. */
EPF_HD float epf_e4m3_to_float(uint8_t q);

/* epf_e8m0_roundup — the smallest E8M0 scale >= v (round toward +Inf), saturating at 0xFE
 *   (2^127): v <= 2^-127 (incl. 0) -> 0x00; +Inf -> 0xFE; NaN -> 0xFF. v must be >= 0 (negative
 *   v gives 0x00). Exactly cvt.rp.satfinite.ue8m0x2.f32, which it uses where the target has it
 *   (EPF_QUANT_HW_E8M0). Scope: any thread, host or device. */
EPF_HD uint8_t epf_e8m0_roundup(float v);

/* epf_e8m0_from_amax_rceil — RCEIL scale byte of a block whose largest |x| is amax (sign bit of
 *   amax ignored): E8M0 round-up of fl(amax * fl(1/448)), i.e. 127 + ceil(log2(amax / 448))
 *   clamped to [0, 254]. amax 0 -> 0x00; +Inf -> 0xFE; NaN -> 0xFF (a block's amax is never NaN:
 *   NaN elements do not enter it). Scope: any thread, host or device. */
EPF_HD uint8_t epf_e8m0_from_amax_rceil(float amax);

/* epf_e8m0_from_amax_floor — FLOOR (OCP) scale byte: 127 + floor(log2(amax)) - 8 clamped to
 *   [0, 254]; amax 0 or < 2^-118 -> 0x00; +Inf -> 0xFE; NaN -> 0xFF. Scope: any thread. */
EPF_HD uint8_t epf_e8m0_from_amax_floor(float amax);

/* epf_e8m0_from_amax — the scale byte by `rule` (EPF_MX_FLOOR, anything else RCEIL). */
EPF_HD uint8_t epf_e8m0_from_amax(float amax, int rule);

/* epf_e8m0_to_float — the scale 2^(b - 127) of byte b: 0x00 -> 2^-127 (the f32 subnormal
 *   0x00400000), 0xFF -> NaN. The dequantization multiplier. Scope: any thread. */
EPF_HD float epf_e8m0_to_float(uint8_t b);

/* epf_e8m0_quant_multiplier — 2^(127 - b), the quantization multiplier of byte b (exact): the bit
 *   pattern (254 - b) << 23; 0xFE -> 2^-127 (0x00400000); 0xFF -> NaN. Scope: any thread. */
EPF_HD float epf_e8m0_quant_multiplier(uint8_t b);

/* epf_mxfp8_quantize_ref — one element: RNE_satfinite_e4m3(x * 2^(127 - scale)). */
EPF_HD uint8_t epf_mxfp8_quantize_ref(float x, uint8_t scale);

/* epf_mxfp8_dequantize_ref — one element: e4m3(q) * 2^(scale - 127), one RN rounding (exact unless
 *   the product is an f32 subnormal or overflows). NaN byte or scale 0xFF -> NaN. */
EPF_HD float epf_mxfp8_dequantize_ref(uint8_t q, uint8_t scale);

/* epf_mxfp8_dequantize_accumulate_ref — fma(dequantize(q, scale), weight, acc): the combine step. */
EPF_HD float epf_mxfp8_dequantize_accumulate_ref(uint8_t q, uint8_t scale, float weight, float acc);

/* epf_mxfp8_quantize_block_ref — quantize one 32-element block: amax = fmaxf fold of |x| from 0
 *   (NaN elements ignored), scale byte by `rule`, out_q[i] = epf_mxfp8_quantize_ref(x[i], scale).
 *   Returns the scale byte. Scope: any thread, host or device. */
EPF_HD uint8_t epf_mxfp8_quantize_block_ref(const float* x, int rule, uint8_t* out_q);

/* epf_fp8_128_scale — the FP32 scale of a 128-element group whose largest |x| is amax:
 *   s = fl(max(amax, 1e-4) / 448) (division, RN); with ue8m0, s is then rounded up to a power of
 *   two: 2^(epf_e8m0_roundup(s) - 127). amax +Inf -> s = +Inf (ue8m0: 2^127); NaN amax is treated
 *   as 0 (fmaxf). Scope: any thread, host or device. */
EPF_HD float epf_fp8_128_scale(float amax, bool ue8m0);

/* epf_fp8_128_recip — RN(1 / scale), the operand epf_fp8_128_quantize8 takes. */
EPF_HD float epf_fp8_128_recip(float scale);

/* epf_fp8_128_quantize_ref — one element: RNE_satfinite_e4m3(fl(x / scale)) (IEEE division). */
EPF_HD uint8_t epf_fp8_128_quantize_ref(float x, float scale);

/* epf_fp8_128_dequantize_ref — one element: e4m3(q) * scale, RN. */
EPF_HD float epf_fp8_128_dequantize_ref(uint8_t q, float scale);

/* epf_fp8_128_dequantize_accumulate_ref — fma(dequantize(q, scale), weight, acc). */
EPF_HD float epf_fp8_128_dequantize_accumulate_ref(uint8_t q, float scale, float weight, float acc);

/* epf_fp8_128_quantize_block_ref — quantize one 128-element group (amax = fmaxf fold of |x| from 0,
 *   scale = epf_fp8_128_scale, elements epf_fp8_128_quantize_ref). Returns the scale. */
EPF_HD float epf_fp8_128_quantize_block_ref(const float* x, bool ue8m0, uint8_t* out_q);

/* epf_fp8_128_scale_fast — epf_fp8_128_scale(amax, ue8m0) and its reciprocal RN(1/s), the way the
 *   device blocks compute them: amax / 448 by two Markstein steps with the constant RN(1/448)
 *   (exact for every amax in [1e-4, FLT_MAX]; amax = Inf gives Inf), the UE8M0 reciprocal from the
 *   byte (exact). amax >= 0 or NaN. Bit-identical to the reference (tests/unit/test_quant_host).
 *   Scope: any thread, host or device. */
EPF_HD float epf_fp8_128_scale_fast(float amax, bool ue8m0, float* out_recip);

/* epf_scale_swizzle_offset — byte offset of scale (row, col) in the swizzled 128x4 layout
 *   (Blackwell block-scaled GEMMs, cuBLASLt VEC32_UE8M0, CUTLASS SfKMajorAtom): 512-byte atoms of
 *   128 rows x 4 scale columns, K-atom index fastest, n_katoms = ceil(n_scale_cols / 4):
 *   ((row/128)*n_katoms + col/4)*512 + (row%32)*16 + ((row%128)/32)*4 + col%4.
 *   Scope: any thread, host or device. */
EPF_HD int64_t epf_scale_swizzle_offset(int64_t row, int col, int n_scale_cols);

/* epf_scale_swizzle_bytes — bytes of a swizzled scale matrix: rows padded to 128, scale columns
 *   to 4 (the padding must be zero: epf_scale_swizzle_zero_padding writes it). */
EPF_HD int64_t epf_scale_swizzle_bytes(int64_t rows, int n_scale_cols);

/* epf_scale_offset — byte offset of MXFP8 scale (row, col) in `scale_layout`:
 *   EPF_SCALE_LAYOUT_SWIZZLED_128X4 -> epf_scale_swizzle_offset; otherwise compact row-major
 *   [rows, n_scale_cols]: row * n_scale_cols + col. */
EPF_HD int64_t epf_scale_offset(int scale_layout, int64_t row, int col, int n_scale_cols);

/* epf_scale_bytes — bytes of an MXFP8 scale matrix of `rows` rows in `scale_layout`. */
EPF_HD int64_t epf_scale_bytes(int scale_layout, int64_t rows, int n_scale_cols);

/* epf_scale_swizzle_zero_padding — write 0 to every padding byte of a swizzled scale matrix of
 *   `rows` rows (rows [rows, pad128(rows)) x all columns, and columns [n_scale_cols, pad4) of
 *   every row); never touches a real scale. Threads index, index + stride, ... together cover each
 *   padding byte exactly once: call it from any set of threads with index in [0, stride), e.g. a
 *   grid-stride loop (index = global thread id, stride = total threads), or one thread (0, 1).
 *   Scope: any thread, host or device; no ordering with the scale writers is needed (disjoint). */
EPF_HD void epf_scale_swizzle_zero_padding(uint8_t* scales, int64_t rows, int n_scale_cols, int64_t index,
                                           int64_t stride);

/* epf_quant_check — can rows of `hidden` elements travel as `payload`?
 *   EPF_OK; EPF_ERR_PAYLOAD for an unknown payload (anything but EPF_PAYLOAD_MXFP8,
 *   EPF_PAYLOAD_FP8_128 and EPF_PAYLOAD_BF16, the unquantized one; EPF_PAYLOAD_DEFAULT included);
 *   EPF_ERR_HIDDEN unless 1 <= hidden <= EPF_MAX_HIDDEN; EPF_ERR_HIDDEN_ALIGNMENT unless hidden is
 *   a multiple of the group (32 MXFP8, 128 per-128 — so 2880 is refused for FP8_128 — and the
 *   8-element vector for BF16: epf_payload_vector_width).
 *   Call it on the host before launching anything that uses the blocks; they assume it passed.
 *   Scope: any thread, host or device. Pure. */
EPF_HD epf_status_t epf_quant_check(int hidden, int payload);

/* epf_mx_rule_from_flags — the MXFP8 rule a config's flags ask for (EPF_FLAG_MX_SCALE_FLOOR). */
EPF_HD int epf_mx_rule_from_flags(uint32_t flags);

/* epf_fp8_128_ue8m0_from_flags — whether a config's flags ask for power-of-two per-128 scales. */
EPF_HD bool epf_fp8_128_ue8m0_from_flags(uint32_t flags);

/* ---- MXFP8 device blocks and the lane steps (impl/mxfp8.cuh) --------------------------------- */

/* epf_bf16x8_to_float — eight BF16 (one uint4, element i in bits [16i, 16i+16) of the 128-bit word,
 *   i.e. what a 16-byte load of a row gives) -> eight floats, exactly. Scope: any thread. */
EPF_DEVICE_INLINE void epf_bf16x8_to_float(uint4 x, float* v);

/* epf_amax8_bf16 — the largest |x| of the 8 BF16 values in one uint4 (a NaN ignored, as the
 *   quantizers' amax does), without unpacking them: |x| by clearing the sign bits, then max.bf16x2
 *   (sm_80+), which ignores a NaN operand as max.f32 does, and the two halves' max in FP32. The
 *   same value as the amax of the unpacked floats (epf__amax8), except that a subnormal |x| is kept
 *   where -ftz FMNMX flushes it to 0 (a scale byte never changes: see epf__amax8). 4 + 3 + 3
 *   instructions and no unpacked floats held. Scope: any thread. */
EPF_DEVICE_INLINE float epf_amax8_bf16(uint4 x);

/* epf_e8m0_from_amax_nonneg — epf_e8m0_from_amax(a, rule) for an amax already >= 0 (or NaN-free),
 *   without re-taking |amax|: the scale byte of a block. Scope: any thread. */
EPF_DEVICE_INLINE uint8_t epf_e8m0_from_amax_nonneg(float a, int rule);

/* epf_mxfp8_quantize8 — 8 elements with a known scale byte: byte i of the result (little endian)
 *   is epf_mxfp8_quantize_ref(v[i], scale).
 *   Scope: any thread. For fused code that reduced the block's amax itself (any lane layout) and
 *   took the scale from epf_e8m0_from_amax. */
EPF_DEVICE_INLINE uint2 epf_mxfp8_quantize8(const float* v, uint8_t scale);

/* epf_mxfp8_quantize_lane8_warp — quantize one 256-element chunk held in the lane8 layout.
 *   Scope:    [collective:warp] all 32 lanes call it, converged, with the same `rule`. Each quad
 *             (lanes 4g..4g+3) is one scale group: lane 4g+j passes elements [8j, 8j+8) of the
 *             group in v[0..7]. A lane with nothing to quantize (row tail) still calls it, with
 *             zeros, and ignores the result (a quad is independent of the other quads).
 *   Result:   the lane's 8 E4M3 bytes (uint2, element i in byte i); *out_scale = the group's E8M0
 *             byte in all 4 lanes of the quad (by convention lane 4g writes it out).
 *   Numerics: exactly epf_mxfp8_quantize_block_ref of the quad's 32 elements.
 *   Memory:   registers and 2 shuffles only. */
EPF_DEVICE_INLINE uint2 epf_mxfp8_quantize_lane8_warp(const float* v, int rule, uint8_t* out_scale);

/* epf_mxfp8_quantize_lane8_bf16_warp — the same for 8 BF16 values in one uint4 (element i in bits
 *   [16i, 16i + 16), i.e. what a 16-byte load of the row gives). [collective:warp] as above. */
EPF_DEVICE_INLINE uint2 epf_mxfp8_quantize_lane8_bf16_warp(uint4 x, int rule, uint8_t* out_scale);

/* epf_mxfp8_quantize_block32 — one whole 32-element block held by one thread (v[0..31] in
 *   registers): out_q[j] gets elements 4j..4j+3 (byte i = element 4j+i). Returns the scale byte.
 *   Scope: any thread. Numerics: exactly epf_mxfp8_quantize_block_ref. */
EPF_DEVICE_INLINE uint8_t epf_mxfp8_quantize_block32(const float* v, int rule, uint32_t* out_q);

/* epf_mxfp8_dequantize8 — 8 E4M3 bytes (uint2, element i in byte i) with scale byte `scale`:
 *   out[i] = epf_mxfp8_dequantize_ref(byte i, scale). Scope: any thread. */
EPF_DEVICE_INLINE void epf_mxfp8_dequantize8(uint2 q, uint8_t scale, float* out);

/* epf_mxfp8_dequantize_accumulate8 — the combine step on 8 elements: acc[i] = fma(dequantize(byte
 *   i, scale), weight, acc[i]) (= epf_mxfp8_dequantize_accumulate_ref). Scope: any thread.
 *   Accumulating k sources in a fixed order gives a bitwise deterministic sum. */
EPF_DEVICE_INLINE void epf_mxfp8_dequantize_accumulate8(uint2 q, uint8_t scale, float weight, float* acc);

/* epf_mxfp8_quantize_row_bf16_warp — quantize one BF16 row of `hidden` elements to MXFP8.
 *   Scope:    [collective:warp] [uniform-args] all 32 lanes, converged.
 *   Input:    x: `hidden` BF16 values, 16-byte aligned. hidden a positive multiple of 32
 *             (epf_quant_check). rule: EPF_MX_RCEIL or EPF_MX_FLOOR.
 *   Output:   out_q: hidden E4M3 bytes, 8-byte aligned. The scale of group c (elements
 *             [32c, 32c+32)) goes to out_scales[epf_scale_offset(scale_layout, row, c, hidden/32)]:
 *             compact row-major [rows, hidden/32] (pass the matrix base and the row index, or the
 *             row's own scale pointer and row 0) or swizzled 128x4 (matrix base and row index; the
 *             padding is epf_scale_swizzle_zero_padding's job).
 *   Numerics: each group exactly epf_mxfp8_quantize_block_ref.
 *   Memory:   16-byte loads, 8-byte stores (a warp stores 256 contiguous bytes per instruction),
 *             1-byte scale stores; plain weak accesses, no fence. out_q and out_scales may be peer
 *             pointers (epf_peer_ptr); publish with the signal protocol afterwards. x must not
 *             overlap the outputs.
 *   Debug:    EPF_DEBUG traps on misaligned pointers or a bad hidden. */
EPF_DEVICE_INLINE void epf_mxfp8_quantize_row_bf16_warp(const void* x, int hidden, int rule, int64_t row,
                                                       int scale_layout, uint8_t* out_q, uint8_t* out_scales);

/* epf_mxfp8_quantize_row_f32_warp — the same for an FP32 row (x: `hidden` floats, 16-byte aligned;
 *   a lane loads its 8 consecutive floats as two 16-byte vectors). Contract as
 *   epf_mxfp8_quantize_row_bf16_warp. */
EPF_DEVICE_INLINE void epf_mxfp8_quantize_row_f32_warp(const float* x, int hidden, int rule, int64_t row,
                                                      int scale_layout, uint8_t* out_q, uint8_t* out_scales);

/* epf_mxfp8_dequantize_row_f32_warp — out[i] = epf_mxfp8_dequantize_ref(q[i], scales[i / 32]) for
 *   one row. scales: the row's compact scales (hidden/32 bytes; the travelling layout).
 *   Scope: [collective:warp] [uniform-args]. q 8-byte aligned, out 16-byte aligned, hidden a
 *   multiple of 32. Memory: 8-byte loads, 16-byte stores, plain. */
EPF_DEVICE_INLINE void epf_mxfp8_dequantize_row_f32_warp(const uint8_t* q, const uint8_t* scales, int hidden,
                                                        float* out);

/* epf_mxfp8_dequantize_accumulate_row_warp — acc[i] = fma(dequantize(q[i], scales[i / 32]),
 *   weight, acc[i]) for one row: the combine step with the accumulator in memory (FP32, e.g. a
 *   shared-memory or global row). Calling it for k = 0..K-1 in a fixed order gives a bitwise
 *   deterministic weighted sum. Scope: [collective:warp] [uniform-args]; alignment as
 *   epf_mxfp8_dequantize_row_f32_warp (acc 16-byte aligned). Memory: plain read-modify-write of
 *   acc by the lane that owns each element (no other lane touches it). */
EPF_DEVICE_INLINE void epf_mxfp8_dequantize_accumulate_row_warp(const uint8_t* q, const uint8_t* scales, int hidden,
                                                               float weight, float* acc);

/* ---- per-128 FP8 device blocks (impl/fp8_128.cuh) -------------------------------------------- */

/* epf_fp8_128_quantize8_steps — epf_fp8_128_quantize8 with the division's Markstein steps chosen:
 *   8 elements with scale s and y = RN(1/s); `two_steps` (a constant after inlining) picks the
 *   variant: two for arbitrary FP32 inputs (what epf_fp8_128_quantize8 does), one for inputs that
 *   are BF16 values (exact there, and shorter; see epf__fdiv_markstein1).
 *   Scope: any thread. For fused code that reduced the group's amax itself and took s and y from
 *   epf_fp8_128_scale_fast (the HT dispatch's quantizing send). */
EPF_DEVICE_INLINE uint2 epf_fp8_128_quantize8_steps(const float* v, float s, float y, bool two_steps);

/* epf_fp8_128_quantize8 — 8 elements of a group with scale s and y = epf_fp8_128_recip(s): byte
 *   i of the result is epf_fp8_128_quantize_ref(v[i], s).
 *   Scope: any thread. For fused code that reduced the group's amax itself and took s from
 *   epf_fp8_128_scale. Requires: s > 0 and normal, or +Inf; |v[i] / s| finite unless s is a power
 *   of two or Inf (always true for s = epf_fp8_128_scale(amax of the group, ...)). */
EPF_DEVICE_INLINE uint2 epf_fp8_128_quantize8(const float* v, float s, float y);

/* epf_fp8_128_quantize_lane8_warp — quantize one 256-element chunk (two groups) in the lane8
 *   layout.
 *   Scope:    [collective:warp] all 32 lanes call it, converged, with the same `ue8m0`. Each
 *             half-warp is one group: lane 16h+j passes elements [8j, 8j+8) of group h in v[0..7].
 *             Lanes with nothing to quantize pass zeros and ignore the result.
 *   Result:   the lane's 8 E4M3 bytes; *out_scale = the group's FP32 scale in all 16 lanes of the
 *             half-warp (by convention lanes 0 and 16 write it out).
 *   Numerics: exactly epf_fp8_128_quantize_block_ref of the half-warp's 128 elements. */
EPF_DEVICE_INLINE uint2 epf_fp8_128_quantize_lane8_warp(const float* v, bool ue8m0, float* out_scale);

/* epf_fp8_128_quantize_lane8_bf16_warp — the same for 8 BF16 values in one uint4 (one Markstein
 *   step per element suffices for BF16 inputs; see epf__fdiv_markstein1). */
EPF_DEVICE_INLINE uint2 epf_fp8_128_quantize_lane8_bf16_warp(uint4 x, bool ue8m0, float* out_scale);

/* epf_fp8_128_dequantize8 — out[i] = epf_fp8_128_dequantize_ref(byte i of q, s). Any thread. */
EPF_DEVICE_INLINE void epf_fp8_128_dequantize8(uint2 q, float s, float* out);

/* epf_fp8_128_dequantize_accumulate8 — acc[i] = fma(dequantize(byte i, s), weight, acc[i]). */
EPF_DEVICE_INLINE void epf_fp8_128_dequantize_accumulate8(uint2 q, float s, float weight, float* acc);

/* epf_fp8_128_quantize_row_bf16_warp — quantize one BF16 row to per-128 FP8.
 *   Scope:    [collective:warp] [uniform-args] all 32 lanes, converged.
 *   Input:    x: `hidden` BF16 values, 16-byte aligned; hidden a positive multiple of 128
 *             (epf_quant_check(hidden, EPF_PAYLOAD_FP8_128)).
 *   Output:   out_q: hidden E4M3 bytes, 8-byte aligned. Group g's FP32 scale goes to
 *             out_scales[g * scale_stride]: scale_stride 1 with the row's pointer into a row-major
 *             [rows, hidden/128] matrix (DeepEP), or the column pointer base + row and stride
 *             rows (MN-major, as DeepGEMM reads them).
 *   Numerics: each group exactly epf_fp8_128_quantize_block_ref(.., ue8m0, ..).
 *   Memory:   16-byte loads, 8-byte stores, 4-byte scale stores, plain; no fence. Outputs may be
 *             peer pointers. x must not overlap the outputs.
 *   Debug:    EPF_DEBUG traps on misaligned pointers or a bad hidden. */
EPF_DEVICE_INLINE void epf_fp8_128_quantize_row_bf16_warp(const void* x, int hidden, bool ue8m0, int64_t scale_stride,
                                                         uint8_t* out_q, float* out_scales);

/* epf_fp8_128_quantize_row_f32_warp — the same for an FP32 row (16-byte aligned). */
EPF_DEVICE_INLINE void epf_fp8_128_quantize_row_f32_warp(const float* x, int hidden, bool ue8m0, int64_t scale_stride,
                                                        uint8_t* out_q, float* out_scales);

/* epf_fp8_128_dequantize_row_f32_warp — out[i] = epf_fp8_128_dequantize_ref(q[i],
 *   scales[(i / 128) * scale_stride]) for one row. [collective:warp] [uniform-args]; q 8-byte and
 *   out 16-byte aligned, hidden a multiple of 128. */
EPF_DEVICE_INLINE void epf_fp8_128_dequantize_row_f32_warp(const uint8_t* q, const float* scales, int64_t scale_stride,
                                                          int hidden, float* out);

EPF_END_DECLS

/* the definitions, by part: */
#include "impl/scalar.cuh"   /* EPF_HD reference rules, scale layouts, epf_quant_check */
#include "impl/mxfp8.cuh"    /* MXFP8 device blocks */
#include "impl/fp8_128.cuh"  /* per-128 FP8 device blocks */
#include "impl/rows.cuh"     /* the row quantizers of both formats (one row loop) */

#endif /* EPF_QUANT_QUANT_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
