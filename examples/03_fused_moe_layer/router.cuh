/* router.cuh — the example's MoE router on tensor cores: logits = x[T][H] (BF16) . Wr[E][H]^T with
 * mma.sync m16n8k16 (BF16 in, FP32 accumulate), then top-k (ties: lowest id) and softmax over the k.
 *
 * ONE block-collective function, router_tile_block, computes a tile of ROUTER_TILE_TOKENS tokens;
 * the --unfused router_kernel and the fused kernel both call it on the same tiles (tile j of rank r
 * = tokens [r T + 64 j, ...)), so both paths select the same experts with the same weights, bit for
 * bit. The CPU check (main.cu) cannot reproduce the tensor cores' accumulation order and checks a
 * valid top-k within a tolerance instead.
 *
 * Tiling (why): a block of 8 warps owns 64 tokens and ALL E experts, so Wr is read once per 64
 * tokens (DeepSeek-V3: Wr = 3.7 MB, 32768 tokens -> 1.9 GB of L2 reads, against 7.5 TB if every
 * 16-token tile re-read it) and x once. The H loop stages k-chunks of 64 (x tile 64 x 64, Wr slice
 * E x 64) through shared memory with cp.async, double-buffered. A warp holds a 32-token x 64-expert
 * accumulator (2 m-tiles x 8 n-tiles x 4 floats = 64 registers); the 8 warps split the tile as
 * 2 (tokens) x NWN (experts, 64 each; NWN = 1, 2 or 4) x KS (k-steps of a chunk; KS = 4 / NWN), so
 * a small E (the default 64) still keeps all 8 warps busy on the same 64 tokens. The KS partial
 * sums are added into the logits tile in shared memory in a fixed order (deterministic).
 * Then one warp per token: K rounds of a warp arg-max (ties: lowest id), softmax over the k.
 *
 * Limits: E <= 256, K < 32, H % 32 == 0 (a chunk is 64 or, at the end, 32 = two k-steps of 16),
 * blockDim.x == ROUTER_THREADS, dynamic shared memory router_smem_bytes(E) (16-byte aligned).
 */
#ifndef EX03_ROUTER_CUH
#define EX03_ROUTER_CUH

#include <stdint.h>

#define ROUTER_THREADS 256    /* 8 warps per tile */
#define ROUTER_TILE_TOKENS 64 /* tokens per tile (2 warps x 32) */
#define ROUTER_KC 64          /* H elements per staged chunk */
#define ROUTER_LDS 72         /* row pitch of a staged row in BF16: 144 B, conflict-free fragment loads */

/* experts padded to the warp grid: 64 * NWN, NWN in {1, 2, 4} */
static inline __host__ __device__ int router_nwn(int E) { return E <= 64 ? 1 : E <= 128 ? 2 : 4; }

/* shared memory: two stages of (x tile + Wr slice), reused for the FP32 logits tile afterwards */
static inline __host__ __device__ size_t router_smem_bytes(int E) {
  const int ep = 64 * router_nwn(E);
  const size_t stage = (size_t)(ROUTER_TILE_TOKENS + ep) * ROUTER_LDS * 2u;
  const size_t logits = (size_t)ROUTER_TILE_TOKENS * (size_t)(ep + 4) * 4u;
  return 2u * stage > logits ? 2u * stage : logits;
}

/* ---- PTX wrappers --------------------------------------------------------------------------------- */
/* cp.async and the BF16 mma need sm_80+. A build for an older target (the library's floor is sm_70)
 * compiles them as a trap; main() refuses a GPU below compute capability 8.0 before any launch. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define ROUTER_SM80 0
#else
#define ROUTER_SM80 1
#endif
__device__ __forceinline__ void router_cp_async16(void* smem_dst, const void* gmem_src) {
#if ROUTER_SM80
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(smem_dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(gmem_src) : "memory");
#else
  (void)smem_dst;
  (void)gmem_src;
  __trap();
#endif
}
__device__ __forceinline__ void router_cp_async_commit() {
#if ROUTER_SM80
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void router_cp_async_wait_all() {
#if ROUTER_SM80
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void router_cp_async_wait_one() {
#if ROUTER_SM80
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
#endif
}

/* D = A (16x16, row) * B (16x8, col) + D. Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"),
 * g = lane >> 2, q = lane & 3, each .b32 = two BF16, the lower column / row index in the low half:
 *   a0 (g, 2q..2q+1) a1 (g+8, 2q..) a2 (g, 2q+8..) a3 (g+8, 2q+8..)     A[row][k]
 *   b0 (k 2q..2q+1, n g)  b1 (k 2q+8.., n g)                             B[k][n]
 *   c0 c1 (g, 2q, 2q+1)  c2 c3 (g+8, 2q, 2q+1)                           C[row][n]        */
__device__ __forceinline__ void router_mma_bf16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
#if ROUTER_SM80
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  (void)c;
  (void)a;
  (void)b0;
  (void)b1;
  __trap();
#endif
}

/* ---- addressing, host + device (test_router_frag.cu emulates the tile on the CPU with these) ------ */
/* warp -> (token half wm, expert block wn of 64, k-step group ks of KS = 4 / NWN) */
static inline __host__ __device__ void router_warp_role(int warp, int E, int* wm, int* wn, int* ks) {
  const int nwn = router_nwn(E);
  *wm = warp & 1;
  *wn = (warp >> 1) % nwn;
  *ks = (warp >> 1) / nwn;
}
/* element offset (in a stage's x tile, pitch ROUTER_LDS) of A register `reg` (0..3) of `lane` for the
 * 16 x 16 block at rows [row0, row0 + 16), k-step s: row g + 8 (reg & 1), column 2q + 8 (reg >> 1) */
static inline __host__ __device__ int router_a_off(int row0, int s, int lane, int reg) {
  return (row0 + (lane >> 2) + 8 * (reg & 1)) * ROUTER_LDS + s * 16 + 2 * (lane & 3) + 8 * (reg >> 1);
}
/* element offset (in the Wr slice, row = expert) of B register `reg` (0..1) of `lane` for experts
 * [n0, n0 + 8), k-step s: B[k][n] = Wr[n][k], k = 2q + 8 reg, n = g */
static inline __host__ __device__ int router_b_off(int n0, int s, int lane, int reg) {
  return (n0 + (lane >> 2)) * ROUTER_LDS + s * 16 + 2 * (lane & 3) + 8 * reg;
}
/* row / column (within the 16 x 8 tile) of accumulator i (0..3) of `lane` */
static inline __host__ __device__ int router_c_row(int lane, int i) { return (lane >> 2) + 8 * (i >> 1); }
static inline __host__ __device__ int router_c_col(int lane, int i) { return 2 * (lane & 3) + (i & 1); }
/* staging: vector i of a chunk (vpr 16-byte vectors per row; the x tile's rows first, then Wr's
 * rows [0, E8)) -> which matrix, the staged row r, vector v, and the source row (rows past the last
 * token / expert are clamped to a valid row: their results are never used) */
static inline __host__ __device__ void router_stage_map(int i, int vpr, int ntok, int E, int* isx, int* r, int* v,
                                                         int* src_row) {
  const int nx = ROUTER_TILE_TOKENS * vpr;
  const int j = i < nx ? i : i - nx;
  *isx = i < nx;
  *r = j / vpr;
  *v = j - *r * vpr;
  *src_row = *isx ? (*r < ntok ? *r : ntok - 1) : (*r < E ? *r : E - 1);
}

/* stage chunk [k0, k0 + kc) of the tile's x rows and of Wr's rows [0, E8) (E8 = E rounded up to 8,
 * the rows the n-tiles read) */
__device__ __forceinline__ void router_stage(uint16_t* sx, uint16_t* sw, const uint16_t* x, const uint16_t* wr,
                                             int H, int E, int E8, int ntok, int k0, int kc) {
  const int vpr = kc >> 3; /* 16-byte vectors per row: 8 or 4 */
  const int nall = (ROUTER_TILE_TOKENS + E8) * vpr;
  for (int i = (int)threadIdx.x; i < nall; i += ROUTER_THREADS) {
    int isx, r, v, src_row;
    router_stage_map(i, vpr, ntok, E, &isx, &r, &v, &src_row);
    router_cp_async16((isx ? sx : sw) + r * ROUTER_LDS + v * 8, (isx ? x : wr) + (int64_t)src_row * H + k0 + v * 8);
  }
  router_cp_async_commit();
}

/* router_tile_block — [collective:block] (ROUTER_THREADS threads, converged, uniform arguments).
 *   x: the tile's first token row ([ntok][H] BF16, 1 <= ntok <= ROUTER_TILE_TOKENS); wr: [E][H];
 *   writes out_idx[i * K + k] (int32) and out_w[i * K + k] for i < ntok. smem: router_smem_bytes(E).
 *   Ends with __syncthreads (the caller may reuse smem and read the outputs it wrote).
 *   __noinline__: its 64 accumulators get their own register allocation (ptxas -v: no spills), so
 *   the fused kernel's other phases (the route update spills at 128 registers, as the library's own
 *   update kernel does) cannot push spills into the mma loop. */
__device__ __noinline__ void router_tile_block(const uint16_t* x, const uint16_t* wr, int H, int E, int K, int ntok,
                                               int32_t* out_idx, float* out_w, void* smem) {
  const int nwn = router_nwn(E), ks_n = 4 / nwn, ep = 64 * nwn, E8 = (E + 7) & ~7, ldl = ep + 4;
  const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31);
  int wm, wn, ks;
  router_warp_role(warp, E, &wm, &wn, &ks);
  const size_t stage = (size_t)(ROUTER_TILE_TOKENS + ep) * ROUTER_LDS;           /* BF16 elements */
  uint16_t* sbase = (uint16_t*)smem;
  float acc[2][8][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;

  const int nchunks = (H + ROUTER_KC - 1) / ROUTER_KC;
  router_stage(sbase, sbase + ROUTER_TILE_TOKENS * ROUTER_LDS, x, wr, H, E, E8, ntok, 0,
               H < ROUTER_KC ? H : ROUTER_KC);
  for (int c = 0; c < nchunks; ++c) {
    const int k0 = c * ROUTER_KC, kc = H - k0 < ROUTER_KC ? H - k0 : ROUTER_KC;
    if (c + 1 < nchunks) { /* prefetch the next chunk into the other stage, then wait for this one */
      uint16_t* nb = sbase + (size_t)((c + 1) & 1) * stage;
      const int k1 = k0 + ROUTER_KC;
      router_stage(nb, nb + ROUTER_TILE_TOKENS * ROUTER_LDS, x, wr, H, E, E8, ntok, k1,
                   H - k1 < ROUTER_KC ? H - k1 : ROUTER_KC);
      router_cp_async_wait_one();
    } else {
      router_cp_async_wait_all();
    }
    __syncthreads(); /* every thread's copies of chunk c have landed */
    const uint16_t* sx = sbase + (size_t)(c & 1) * stage;
    const uint16_t* sw = sx + ROUTER_TILE_TOKENS * ROUTER_LDS;
    for (int s = ks; s < (kc >> 4); s += ks_n) { /* this warp's k-steps of 16 in the chunk */
      uint32_t a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) a[mt][i] = *(const uint32_t*)(sx + router_a_off(wm * 32 + mt * 16, s, lane, i));
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int n0 = wn * 64 + nt * 8;
        if (n0 < E8) { /* warp-uniform: n-tiles past the last expert are skipped */
          const uint32_t b0 = *(const uint32_t*)(sw + router_b_off(n0, s, lane, 0));
          const uint32_t b1 = *(const uint32_t*)(sw + router_b_off(n0, s, lane, 1));
          router_mma_bf16(acc[0][nt], a[0], b0, b1);
          router_mma_bf16(acc[1][nt], a[1], b0, b1);
        }
      }
    }
    __syncthreads(); /* chunk c is consumed before the next iteration prefetches into its stage */
  }

  /* logits tile [64][ldl] FP32 over the staging buffers: k-step group 0 stores, 1..KS-1 add, in order */
  float* logit = (float*)smem;
  for (int kg = 0; kg < ks_n; ++kg) {
    if (ks == kg) {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int row = wm * 32 + mt * 16 + router_c_row(lane, i), col = wn * 64 + nt * 8 + router_c_col(lane, i);
            float* l = logit + row * ldl + col;
            *l = kg == 0 ? acc[mt][nt][i] : *l + acc[mt][nt][i];
          }
    }
    __syncthreads();
  }

  /* top-k + softmax: a warp per token; lane holds experts lane + 32 j */
  for (int t = warp; t < ntok; t += ROUTER_THREADS / 32) {
    const float* l = logit + t * ldl;
    uint32_t taken = 0u; /* bit j: expert lane + 32 j already selected */
    int my_e = -1;
    float my_l = 0.f;
    for (int k = 0; k < K; ++k) {
      float bv = 0.f;
      int be = -1;
      for (int j = 0; j < 8 && lane + 32 * j < E; ++j) {
        const int e = lane + 32 * j;
        if (!((taken >> j) & 1u) && (be < 0 || l[e] > bv)) { /* increasing e: ties keep the lowest */
          bv = l[e];
          be = e;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) { /* arg-max over the warp, ties: lowest id */
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oe = __shfl_xor_sync(0xffffffffu, be, o);
        if (oe >= 0 && (be < 0 || ov > bv || (ov == bv && oe < be))) {
          bv = ov;
          be = oe;
        }
      }
      if ((be & 31) == lane) taken |= 1u << (be >> 5);
      if (lane == k) {
        my_e = be;
        my_l = bv;
      }
    }
    /* softmax over the k, relative to the largest (lane 0's); the sum in k order, the same on every lane */
    const float top = __shfl_sync(0xffffffffu, my_l, 0);
    const float ex = lane < K ? expf(my_l - top) : 0.f;
    float sum = 0.f;
    for (int k = 0; k < K; ++k) sum += __shfl_sync(0xffffffffu, ex, k);
    if (lane < K) {
      out_idx[t * K + lane] = my_e;
      out_w[t * K + lane] = ex / sum;
    }
  }
  __syncthreads(); /* logits read before the caller reuses smem */
}

#endif /* EX03_ROUTER_CUH */
