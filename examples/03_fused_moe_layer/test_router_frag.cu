/* test_router_frag — a CPU emulation of router_tile_block's addressing (router.cuh), no GPU needed.
 *
 * Why: the mma.sync fragment layouts cannot be checked on a machine without a GPU, and a wrong
 * index would still select plausible experts. This program stages the chunks with router_stage_map,
 * loads every lane's A / B registers with router_a_off / router_b_off (the functions the kernel
 * uses), emulates mma.m16n8k16 from the PTX ISA's fragment tables (written out independently
 * below), adds the k-step groups' partials with router_c_row / router_c_col into the logits tile as
 * the kernel does, and compares every logit with a double matmul; then the warp arg-max top-k.
 * Exit 0 if every case passes. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router.cuh"

static uint64_t rng = 12345;
static uint32_t rnd() {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng >> 33);
}
static uint16_t bf16(float f) { /* round to nearest even */
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float f32(uint16_t b) {
  const uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* mma.m16n8k16 .row.col, from the PTX ISA tables (g = lane >> 2, q = lane % 4; low half = first):
 *   A: a0 (g, 2q..) a1 (g + 8, 2q..) a2 (g, 2q + 8..) a3 (g + 8, 2q + 8..)
 *   B: b0 (k 2q.., n g) b1 (k 2q + 8.., n g)
 *   C: c0 (g, 2q) c1 (g, 2q + 1) c2 (g + 8, 2q) c3 (g + 8, 2q + 1) */
static void mma_emulate(float c[32][4], const uint32_t a[32][4], const uint32_t b[32][2]) {
  float A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, q = lane & 3;
    const int arow[4] = {g, g + 8, g, g + 8}, acol[4] = {2 * q, 2 * q, 2 * q + 8, 2 * q + 8};
    for (int r = 0; r < 4; ++r) {
      A[arow[r]][acol[r]] = f32((uint16_t)(a[lane][r] & 0xffffu));
      A[arow[r]][acol[r] + 1] = f32((uint16_t)(a[lane][r] >> 16));
    }
    for (int r = 0; r < 2; ++r) {
      B[2 * q + 8 * r][g] = f32((uint16_t)(b[lane][r] & 0xffffu));
      B[2 * q + 8 * r + 1][g] = f32((uint16_t)(b[lane][r] >> 16));
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, q = lane & 3;
    const int crow[4] = {g, g, g + 8, g + 8}, ccol[4] = {2 * q, 2 * q + 1, 2 * q, 2 * q + 1};
    for (int r = 0; r < 4; ++r) {
      float s = 0.f;
      for (int k = 0; k < 16; ++k) s += A[crow[r]][k] * B[k][ccol[r]];
      c[lane][r] += s;
    }
  }
}

static int run_case(int E, int H, int K, int ntok) {
  const int nwn = router_nwn(E), ks_n = 4 / nwn, ep = 64 * nwn, E8 = (E + 7) & ~7, ldl = ep + 4;
  uint16_t* x = (uint16_t*)malloc((size_t)ntok * H * 2);
  uint16_t* wr = (uint16_t*)malloc((size_t)E * H * 2);
  for (int i = 0; i < ntok * H; ++i) x[i] = bf16((float)((int)(rnd() % 2001) - 1000) / 500.0f);
  for (int i = 0; i < E * H; ++i) wr[i] = bf16((float)((int)(rnd() % 2001) - 1000) / 20000.0f);
  uint16_t* sx = (uint16_t*)calloc((size_t)ROUTER_TILE_TOKENS * ROUTER_LDS, 2);
  uint16_t* sw = (uint16_t*)calloc((size_t)ep * ROUTER_LDS, 2);
  static float acc[8][32][2][8][4]; /* [warp][lane][mt][nt][i] */
  memset(acc, 0, sizeof(acc));
  for (int k0 = 0; k0 < H; k0 += ROUTER_KC) {
    const int kc = H - k0 < ROUTER_KC ? H - k0 : ROUTER_KC, vpr = kc >> 3;
    for (int i = 0; i < (ROUTER_TILE_TOKENS + E8) * vpr; ++i) { /* router_stage */
      int isx, r, v, src;
      router_stage_map(i, vpr, ntok, E, &isx, &r, &v, &src);
      memcpy((isx ? sx : sw) + r * ROUTER_LDS + v * 8, (isx ? x : wr) + (int64_t)src * H + k0 + v * 8, 16);
    }
    for (int warp = 0; warp < 8; ++warp) {
      int wm, wn, ks;
      router_warp_role(warp, E, &wm, &wn, &ks);
      for (int s = ks; s < (kc >> 4); s += ks_n) {
        uint32_t a[2][32][4], b[32][2];
        for (int mt = 0; mt < 2; ++mt)
          for (int lane = 0; lane < 32; ++lane)
            for (int i = 0; i < 4; ++i) memcpy(&a[mt][lane][i], sx + router_a_off(wm * 32 + mt * 16, s, lane, i), 4);
        for (int nt = 0; nt < 8; ++nt) {
          const int n0 = wn * 64 + nt * 8;
          if (n0 >= E8) continue;
          for (int lane = 0; lane < 32; ++lane)
            for (int i = 0; i < 2; ++i) memcpy(&b[lane][i], sw + router_b_off(n0, s, lane, i), 4);
          for (int mt = 0; mt < 2; ++mt) {
            float c[32][4];
            for (int lane = 0; lane < 32; ++lane) memcpy(c[lane], acc[warp][lane][mt][nt], 16);
            mma_emulate(c, a[mt], b);
            for (int lane = 0; lane < 32; ++lane) memcpy(acc[warp][lane][mt][nt], c[lane], 16);
          }
        }
      }
    }
  }
  /* the logits tile: k-step group 0 stores, the others add, in order */
  float* logit = (float*)calloc((size_t)ROUTER_TILE_TOKENS * ldl, 4);
  for (int kg = 0; kg < ks_n; ++kg)
    for (int warp = 0; warp < 8; ++warp) {
      int wm, wn, ks;
      router_warp_role(warp, E, &wm, &wn, &ks);
      if (ks != kg) continue;
      for (int lane = 0; lane < 32; ++lane)
        for (int mt = 0; mt < 2; ++mt)
          for (int nt = 0; nt < 8; ++nt)
            for (int i = 0; i < 4; ++i) {
              float* l = logit + (wm * 32 + mt * 16 + router_c_row(lane, i)) * ldl + wn * 64 + nt * 8 + router_c_col(lane, i);
              *l = kg == 0 ? acc[warp][lane][mt][nt][i] : *l + acc[warp][lane][mt][nt][i];
            }
    }
  int bad = 0;
  double max_rel = 0.0;
  for (int t = 0; t < ntok; ++t)
    for (int e = 0; e < E; ++e) {
      double ref = 0.0, mag = 0.0;
      for (int h = 0; h < H; ++h) {
        const double p = (double)f32(x[(int64_t)t * H + h]) * f32(wr[(int64_t)e * H + h]);
        ref += p;
        mag += fabs(p);
      }
      const double rel = fabs(ref - logit[t * ldl + e]) / (mag > 0 ? mag : 1);
      max_rel = rel > max_rel ? rel : max_rel;
      if (rel > 1e-5 && bad++ < 3) printf("  logit (%d, %d): %g vs %g\n", t, e, (double)logit[t * ldl + e], ref);
    }
  /* top-k: the kernel's warp arg-max (lane holds experts lane + 32 j; butterfly, ties lowest id)
   * against a plain selection on the same FP32 logits */
  for (int t = 0; t < ntok; ++t) {
    const float* l = logit + t * ldl;
    uint32_t taken[32] = {0};
    int chosen[32];
    for (int k = 0; k < K; ++k) {
      float bv[32];
      int be[32];
      for (int lane = 0; lane < 32; ++lane) {
        bv[lane] = 0.f, be[lane] = -1;
        for (int j = 0; j < 8 && lane + 32 * j < E; ++j) {
          const int e = lane + 32 * j;
          if (!((taken[lane] >> j) & 1u) && (be[lane] < 0 || l[e] > bv[lane])) bv[lane] = l[e], be[lane] = e;
        }
      }
      for (int o = 16; o > 0; o >>= 1) {
        float nv[32];
        int ne[32];
        for (int lane = 0; lane < 32; ++lane) {
          const float ov = bv[lane ^ o];
          const int oe = be[lane ^ o];
          nv[lane] = bv[lane], ne[lane] = be[lane];
          if (oe >= 0 && (be[lane] < 0 || ov > bv[lane] || (ov == bv[lane] && oe < be[lane]))) nv[lane] = ov, ne[lane] = oe;
        }
        memcpy(bv, nv, sizeof(bv));
        memcpy(be, ne, sizeof(be));
      }
      for (int lane = 0; lane < 32; ++lane) {
        if (be[lane] != be[0]) bad += printf("  lanes disagree\n") > 0;
        if ((be[lane] & 31) == lane) taken[lane] |= 1u << (be[lane] >> 5);
      }
      chosen[k] = be[0];
    }
    for (int k = 0; k < K; ++k) { /* reference: k-th pick = largest not yet picked, lowest id on ties */
      int best = -1;
      for (int e = 0; e < E; ++e) {
        int used = 0;
        for (int j = 0; j < k; ++j) used |= chosen[j] == e;
        if (!used && (best < 0 || l[e] > l[best])) best = e;
      }
      if (best != chosen[k] && bad++ < 3) printf("  top-k token %d k %d: %d vs %d\n", t, k, chosen[k], best);
    }
  }
  printf("E %3d H %5d K %2d tokens %2d (NWN %d, KS %d): max |logit - ref| / sum|x w| = %.2e: %s\n", E, H, K, ntok, nwn,
         ks_n, max_rel, bad ? "FAILED" : "ok");
  free(x), free(wr), free(sx), free(sw), free(logit);
  return bad != 0;
}

int main(void) {
  int bad = 0;
  bad |= run_case(64, 2048, 4, 64);  /* the default shape's tile */
  bad |= run_case(256, 1056, 8, 64); /* DeepSeek-V3's E and K; H % 64 == 32: a last half chunk */
  bad |= run_case(128, 96, 6, 37);   /* a partial tile */
  bad |= run_case(160, 64, 8, 64);   /* E not a multiple of 64: skipped n-tiles */
  bad |= run_case(12, 32, 3, 1);     /* E not a multiple of 8, one token, one half chunk */
  bad |= run_case(256, 64, 31, 5);
  printf("%s\n", bad ? "FAILED" : "all cases ok");
  return bad;
}
