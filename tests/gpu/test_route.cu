/* test_route — route/route.cuh + route/kernels.cuh on one GPU against an independent CPU reference
 * (plain loops, written here), bit-exact on every output array, the route header, the host-mapped
 * receive total and the pad rows' metadata:
 *   - one rank: T in {1, 37, 4096} x E in {8, 256, 1024} x K in {1, 8, 32} x int32/int64 x
 *     routing {random, skewed (every (t, k) to one expert), all -1, out of range (ids >= E and
 *     < -1, dropped and counted)}, both layouts, alignment 1 / 128, 1..8 blocks; repeated experts
 *     within a token (skewed routing, K > E, the out-of-range mix) routed once: the first k gets
 *     the slot, later ones -1, counted once;
 *   - virtual ranks R in {1, 2, 4, 8}: count exchange and offsets, 3 back-to-back steps per case
 *     (both COUNTS parities), per-rank T from device memory, small capacities (overflow), epochs
 *     across the 2^32 wrap;
 *   - both count paths and both offset paths (R 3 / 12 / 40 virtual ranks, K 3 / 6 / 8 / 16);
 *   - T = 65536 (E 256 / 1024, K 8 / 32, R 1 / 2 / 8);
 *   - a CUDA graph of one update replayed 1000 times with fresh topk_idx (and T) written into the
 *     captured input buffers between replays, checked every 50th replay and the last;
 *   - a real 1-rank NCCL window (when built with NCCL);
 *   - route import of a byte copy (and every rejection), bad input statuses on the host, a device
 *     T out of range (clamped, reported);
 *   - the public blocks composed by a kernel of the test (epf_route_update_block), 1..4 blocks,
 *     few entries and many: every block sees real ids only in the tokens epf_route_block_tokens
 *     gives it (garbage elsewhere), so a block that read another's tokens would fail the check.
 * Every output is poisoned before every run; rows >= T must keep the poison. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#include "epf_cmocka.h"

#include "epf_test_gpu.h"
#include "epfuse/epfuse.cuh"
#include "epfuse/route/kernels.cuh"
#include "epfuse/route/route.cuh"
#ifdef EPF_TEST_WITH_NCCL
#include "epfuse/core/nccl.cuh"
#endif

static uint64_t g_seed;

enum { PAT_RANDOM = 0, PAT_SKEWED = 1, PAT_ALL_NEG = 2, PAT_OUT_OF_RANGE = 3, PAT_COUNT = 4 };
static const char* const pat_name[] = {"random", "skewed", "all-1", "out-of-range"};

#define POISON_BYTE 0xA5
#define META_POISON_BYTE 0x5A

/* ---- the CPU reference (plain loops; shares nothing with route/route.cuh) ----------------------------- */

struct RefRank {
  std::vector<int32_t> expert_count, rank_count, dst, slot, rm_slot, send_off, send_rm, seg, src_off, rm_off;
  std::vector<uint8_t> in_rank;
  uint32_t dropped;
  int64_t rows, rows_em, overflow;
};

struct Shape {
  int R, E, K, Tmax, A, rank_major, exchange;
  int64_t capacity;
};

/* topk[r]: [Tmax * K] ids as int64 (what the device sees, converted to its index type); T[r] rows used */
static void reference(const Shape& s, const std::vector<std::vector<int64_t>>& topk, const std::vector<int>& T,
                      std::vector<RefRank>& out) {
  const int R = s.R, E = s.E, K = s.K, EL = E / R;
  out.assign(R, RefRank());
  for (int r = 0; r < R; ++r) {
    RefRank& o = out[r];
    o.expert_count.assign(E, 0);
    o.rank_count.assign(R, 0);
    o.dst.assign((size_t)T[r] * K, -1);
    o.slot.assign((size_t)T[r] * K, -1);
    o.in_rank.assign((size_t)T[r] * R, 0);
    o.rm_slot.assign((size_t)T[r] * R, -1);
    o.dropped = 0;
    for (int t = 0; t < T[r]; ++t) {
      for (int k = 0; k < K; ++k) {
        const int64_t v = topk[r][(size_t)t * K + k];
        if (v < -1 || v >= E) {
          o.dropped++;
          continue;
        }
        if (v == -1) continue;
        const int e = (int)v;
        bool repeat = false; /* an expert the token named at a lower k: no copy, no count, not dropped */
        for (int q = 0; q < k; ++q) repeat = repeat || topk[r][(size_t)t * K + q] == v;
        if (repeat) continue;
        o.slot[(size_t)t * K + k] = o.expert_count[e]++;
        o.dst[(size_t)t * K + k] = e / EL;
        o.in_rank[(size_t)t * R + e / EL] = 1;
      }
      for (int d = 0; d < R; ++d)
        if (o.in_rank[(size_t)t * R + d]) o.rm_slot[(size_t)t * R + d] = o.rank_count[d]++;
    }
  }
  if (!s.exchange) return;
  for (int d = 0; d < R; ++d) {
    int64_t running = 0;
    out[d].seg.assign((size_t)EL * 4, 0);
    out[d].src_off.assign((size_t)EL * (R + 1), 0);
    for (int j = 0; j < EL; ++j) {
      const int e = d * EL + j;
      int64_t tot = 0;
      for (int r = 0; r < R; ++r) tot += out[r].expert_count[e];
      const int64_t padded = (tot + s.A - 1) / s.A * s.A;
      int64_t before = 0;
      for (int r = 0; r < R; ++r) {
        if (out[r].send_off.empty()) out[r].send_off.assign(E, 0);
        out[r].send_off[e] = (int32_t)(running + before);
        out[d].src_off[(size_t)j * (R + 1) + r] = (int32_t)(running + before);
        before += out[r].expert_count[e];
      }
      out[d].src_off[(size_t)j * (R + 1) + R] = (int32_t)(running + before);
      out[d].seg[(size_t)j * 4 + 0] = (int32_t)running;
      out[d].seg[(size_t)j * 4 + 1] = (int32_t)tot;
      out[d].seg[(size_t)j * 4 + 2] = (int32_t)padded;
      running += padded;
    }
    out[d].rows_em = running;
  }
  for (int d = 0; d < R; ++d) {
    int64_t before = 0;
    out[d].rm_off.assign(R + 1, 0);
    for (int r = 0; r < R; ++r) {
      if (out[r].send_rm.empty()) out[r].send_rm.assign(R, 0);
      out[r].send_rm[d] = (int32_t)before;
      out[d].rm_off[r] = (int32_t)before;
      before += out[r].rank_count[d];
    }
    out[d].rm_off[R] = (int32_t)before;
    out[d].rows = s.rank_major ? before : out[d].rows_em;
    out[d].overflow = out[d].rows > s.capacity ? out[d].rows - s.capacity : 0;
  }
}

/* ---- inputs ------------------------------------------------------------------------------------ */

static int64_t rand_in(int64_t lo, int64_t hi) { return lo + (int64_t)(epf_test_rand(&g_seed) % (uint64_t)(hi - lo + 1)); }

/* rows [0, Tmax) of one rank; rows >= T get garbage the kernel must never read */
static void make_topk(int pattern, int E, int K, int Tmax, int T, int idx64, int skew_expert, std::vector<int64_t>& ids) {
  ids.assign((size_t)Tmax * K, 0);
  std::vector<int> pick(E);
  for (int t = 0; t < Tmax; ++t) {
    int64_t* row = &ids[(size_t)t * K];
    if (t >= T) {
      for (int k = 0; k < K; ++k) row[k] = idx64 ? (int64_t)epf_test_rand(&g_seed) : (int64_t)(int32_t)epf_test_rand(&g_seed);
      continue;
    }
    switch (pattern) {
      case PAT_RANDOM:
        if (K <= E) { /* distinct experts (DeepEP-like), a few -1 */
          for (int k = 0; k < K; ++k) {
            int e, dup;
            do {
              e = (int)rand_in(0, E - 1);
              dup = 0;
              for (int q = 0; q < k; ++q) dup |= row[q] == e;
            } while (dup);
            row[k] = e;
          }
        } else { /* K > E: duplicates are unavoidable */
          for (int k = 0; k < K; ++k) row[k] = rand_in(0, E - 1);
        }
        for (int k = 0; k < K; ++k)
          if (rand_in(0, 19) == 0) row[k] = -1;
        break;
      case PAT_SKEWED:
        for (int k = 0; k < K; ++k) row[k] = skew_expert;
        break;
      case PAT_ALL_NEG:
        for (int k = 0; k < K; ++k) row[k] = -1;
        break;
      default: { /* out of range, mixed with valid ids and -1 */
        static const int64_t bad64[] = {-2, -3, -1000, INT64_MIN, INT64_MAX, (int64_t)1 << 40, -((int64_t)1 << 40),
                                        (int64_t)INT32_MAX + 1};
        static const int64_t bad32[] = {-2, -3, -1000, INT32_MIN, INT32_MAX, 65536, -65536};
        for (int k = 0; k < K; ++k) {
          const int64_t c = rand_in(0, 5);
          if (c == 0) row[k] = -1;
          else if (c == 1) row[k] = E + rand_in(0, 3); /* >= E */
          else if (c == 2) row[k] = idx64 ? bad64[rand_in(0, 7)] : bad32[rand_in(0, 6)];
          else row[k] = rand_in(0, E - 1);
        }
      }
    }
  }
}

static void upload_topk(void* d_topk, const std::vector<std::vector<int64_t>>& ids, int idx64, size_t per_rank_elems,
                        cudaStream_t stream) {
  for (size_t r = 0; r < ids.size(); ++r) {
    if (idx64) {
      EPF_CHECK_CUDA(cudaMemcpyAsync((int64_t*)d_topk + r * per_rank_elems, ids[r].data(), per_rank_elems * 8,
                                     cudaMemcpyHostToDevice, stream));
    } else {
      std::vector<int32_t> v(per_rank_elems);
      for (size_t i = 0; i < per_rank_elems; ++i) v[i] = (int32_t)ids[r][i];
      EPF_CHECK_CUDA(cudaMemcpyAsync((int32_t*)d_topk + r * per_rank_elems, v.data(), per_rank_elems * 4,
                                     cudaMemcpyHostToDevice, stream));
    }
  }
}

/* ---- a team of virtual ranks with its route ----------------------------------------------------- */

struct Team {
  epf_plan_t plan;
  epf_route_config_t rc;
  epf_route_t route;
  uint64_t route_bytes; /* one buffer */
  char* window;         /* R * plan.total_bytes */
  void* route_buf;      /* R * route_bytes */
  void* d_topk;         /* R * Tmax * K elements */
  int32_t* d_T;         /* [R] */
  epf_error_record_t *rec_host, *rec_dev;
  int64_t *total_host, *total_dev; /* host-mapped [R] */
  Shape shape;
  int idx64;
};

static epf_plan_t make_plan(int R, int E, int K, int Tmax, int A, int layout, int64_t capacity, int mode) {
  epf_config_t c = EPF_CONFIG_INIT;
  epf_plan_t p;
  c.nranks = R;
  c.num_experts = E;
  c.top_k = K;
  c.hidden = 8; /* 16-byte rows: the test is about the route, not the payload */
  c.max_tokens_per_rank = Tmax;
  c.expert_alignment = A;
  c.layout = layout;
  c.mode = mode;
  c.recv_capacity = capacity;
  c.timeout_ns = 5000000000ull;
  const epf_status_t st = epf_plan_compute(&c, &p);
  if (st != EPF_OK) fail_msg("plan R=%d E=%d K=%d T=%d A=%d: %s", R, E, K, Tmax, A, epf_status_name(st));
  return p;
}

static void team_init(Team& tm, int R, int E, int K, int Tmax, int A, int layout, int64_t capacity, int idx64,
                      uint32_t flags, int max_blocks, uint32_t first_epoch, int mode = EPF_MODE_HT) {
  memset(&tm, 0, sizeof(tm));
  tm.plan = make_plan(R, E, K, Tmax, A, layout, capacity, mode);
  {
    const epf_route_config_t rc0 = EPF_ROUTE_CONFIG_INIT;
    tm.rc = rc0;
  }
  tm.rc.index_type = idx64 ? EPF_INDEX_INT64 : EPF_INDEX_INT32;
  tm.rc.top_k = K;
  tm.rc.max_tokens = Tmax;
  tm.rc.max_blocks = max_blocks;
  tm.rc.flags = flags;
  tm.idx64 = idx64;
  assert_int_equal(epf_route_size(&tm.plan, &tm.rc, &tm.route_bytes), EPF_OK);
  EPF_TEST_MALLOC(&tm.window, (size_t)R * tm.plan.total_bytes);
  EPF_CHECK_CUDA(cudaMemset(tm.window, 0, (size_t)R * tm.plan.total_bytes));
  if (first_epoch != 0) { /* as if the window's last count exchange had been at first_epoch */
    std::vector<uint64_t> sig(R, (uint64_t)first_epoch << 32);
    for (int r = 0; r < R; ++r)
      EPF_CHECK_CUDA(cudaMemcpy(tm.window + (size_t)r * tm.plan.total_bytes + tm.plan.region[EPF_REGION_SIG_COUNT].offset,
                                sig.data(), R * 8, cudaMemcpyHostToDevice));
  }
  EPF_TEST_MALLOC(&tm.route_buf, (size_t)R * tm.route_bytes);
  EPF_TEST_MALLOC(&tm.d_topk, (size_t)R * Tmax * K * (idx64 ? 8 : 4));
  EPF_TEST_MALLOC(&tm.d_T, R * sizeof(int32_t));
  EPF_TEST_HOST_ALLOC(&tm.rec_host, sizeof(epf_error_record_t), cudaHostAllocMapped);
  EPF_CHECK_CUDA(cudaHostGetDevicePointer(&tm.rec_dev, tm.rec_host, 0));
  epf_error_clear(tm.rec_host);
  EPF_TEST_HOST_ALLOC(&tm.total_host, R * sizeof(int64_t), cudaHostAllocMapped);
  EPF_CHECK_CUDA(cudaHostGetDevicePointer(&tm.total_dev, tm.total_host, 0));
  const epf_status_t st = epf_route_init(&tm.plan, &tm.rc, tm.route_buf, (uint64_t)R * tm.route_bytes, R, first_epoch, 0, &tm.route);
  if (st != EPF_OK) fail_msg("route init: %s", epf_status_name(st));
  EPF_CHECK_CUDA(cudaDeviceSynchronize());
  tm.shape.R = R;
  tm.shape.E = E;
  tm.shape.K = K;
  tm.shape.Tmax = Tmax;
  tm.shape.A = A;
  tm.shape.rank_major = layout == EPF_LAYOUT_RANK_MAJOR;
  tm.shape.exchange = tm.route.layout.exchange;
  tm.shape.capacity = tm.plan.recv_capacity;
}

static void team_free(Team& tm) {
  EPF_TEST_FREE(tm.window);
  EPF_TEST_FREE(tm.route_buf);
  EPF_TEST_FREE(tm.d_topk);
  EPF_TEST_FREE(tm.d_T);
  EPF_TEST_FREE(tm.rec_host);
  EPF_TEST_FREE(tm.total_host);
}

static epf_team_t virtual_team(const Team& tm) { return epf_team_virtual(tm.window, tm.plan.total_bytes, 0, tm.plan.nranks); }

/* poison every route array (not the header), the receive metadata, the mapped totals */
static void poison(Team& tm, cudaStream_t stream) {
  const int R = tm.plan.nranks;
  const uint64_t hdr = tm.route.layout.array[1].offset;
  for (int r = 0; r < tm.route.count; ++r)
    EPF_CHECK_CUDA(cudaMemsetAsync((char*)tm.route_buf + (size_t)r * tm.route_bytes + hdr, POISON_BYTE,
                                   tm.route_bytes - hdr, stream));
  if (tm.plan.mode == EPF_MODE_HT)
    for (int r = 0; r < R; ++r)
      EPF_CHECK_CUDA(cudaMemsetAsync(tm.window + (size_t)r * tm.plan.total_bytes + tm.plan.region[EPF_REGION_RECV_META].offset,
                                     META_POISON_BYTE, tm.plan.region[EPF_REGION_RECV_META].bytes, stream));
  EPF_CHECK_CUDA(cudaStreamSynchronize(stream));
  for (int r = 0; r < R; ++r) tm.total_host[r] = -1;
}

/* ---- checking ---------------------------------------------------------------------------------- */

static char g_case[256];

static void cmp_i32(const char* what, int rank, const int32_t* got, const int32_t* want, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (got[i] != want[i]) fail_msg("%s: rank %d %s[%zu] = %d, want %d", g_case, rank, what, i, got[i], want[i]);
}

static bool g_check_poison = true;

static void check_poison(const char* what, int rank, const void* p, size_t bytes) {
  const uint8_t* b = (const uint8_t*)p;
  if (!g_check_poison) return;
  for (size_t i = 0; i < bytes; ++i)
    if (b[i] != POISON_BYTE) fail_msg("%s: rank %d %s: byte %zu past the last token was written", g_case, rank, what, i);
}

/* Compare everything one route buffer (and the window's metadata) holds against the reference.
 * `epoch`: the epoch this update must have used. `buffer`: route buffer index; `rank`: team rank. */
static void check_rank(const Team& tm, const epf_route_t& route, int buffer, int rank, int T, const RefRank& ref,
                       uint32_t epoch, char* window_slice, const int64_t* mapped_total, bool poisoned = true) {
  const epf_route_layout_t& L = route.layout;
  const int R = L.nranks, E = L.num_experts, K = L.top_k, EL = L.experts_per_rank, Tmax = L.max_tokens;
  std::vector<uint8_t> buf(L.total_bytes);
  EPF_CHECK_CUDA(cudaMemcpy(buf.data(), (char*)route.base + (size_t)buffer * L.total_bytes, L.total_bytes,
                            cudaMemcpyDeviceToHost));
#define ARR(id, type) ((const type*)(buf.data() + L.array[id].offset))
  const epf_route_header_t* h = ARR(EPF_ROUTE_HEADER, epf_route_header_t);
  g_check_poison = poisoned;
  if (h->epoch != epoch) fail_msg("%s: rank %d epoch %u, want %u", g_case, rank, h->epoch, epoch);
  assert_int_equal(h->magic, EPF_ROUTE_MAGIC);
  assert_int_equal(h->rank, rank);
  assert_int_equal(h->num_tokens, T);
  if (h->status != EPF_OK) fail_msg("%s: rank %d status %s", g_case, rank, epf_status_name((epf_status_t)h->status));
  if (h->dropped_routes != ref.dropped)
    fail_msg("%s: rank %d dropped %u, want %u", g_case, rank, h->dropped_routes, ref.dropped);
  cmp_i32("expert_count", rank, ARR(EPF_ROUTE_EXPERT_COUNT, int32_t), ref.expert_count.data(), E);
  cmp_i32("rank_count", rank, ARR(EPF_ROUTE_RANK_COUNT, int32_t), ref.rank_count.data(), R);
  cmp_i32("dst_rank", rank, ARR(EPF_ROUTE_DST_RANK, int32_t), ref.dst.data(), (size_t)T * K);
  cmp_i32("slot", rank, ARR(EPF_ROUTE_SLOT, int32_t), ref.slot.data(), (size_t)T * K);
  check_poison("dst_rank", rank, ARR(EPF_ROUTE_DST_RANK, int32_t) + (size_t)T * K, (size_t)(Tmax - T) * K * 4);
  check_poison("slot", rank, ARR(EPF_ROUTE_SLOT, int32_t) + (size_t)T * K, (size_t)(Tmax - T) * K * 4);
  {
    const uint8_t* itr = ARR(EPF_ROUTE_TOKEN_IN_RANK, uint8_t);
    for (size_t i = 0; i < (size_t)T * R; ++i)
      if (itr[i] != ref.in_rank[i]) fail_msg("%s: rank %d is_token_in_rank[%zu] = %u, want %u", g_case, rank, i, itr[i], ref.in_rank[i]);
    check_poison("is_token_in_rank", rank, itr + (size_t)T * R, (size_t)(Tmax - T) * R);
  }
  if (L.plan_layout == EPF_LAYOUT_RANK_MAJOR) {
    cmp_i32("rm_slot", rank, ARR(EPF_ROUTE_RM_SLOT, int32_t), ref.rm_slot.data(), (size_t)T * R);
    check_poison("rm_slot", rank, ARR(EPF_ROUTE_RM_SLOT, int32_t) + (size_t)T * R, (size_t)(Tmax - T) * R * 4);
  }
  if (!L.exchange) return;
  cmp_i32("send_offset", rank, ARR(EPF_ROUTE_SEND_OFFSET, int32_t), ref.send_off.data(), E);
  cmp_i32("recv_segment", rank, ARR(EPF_ROUTE_RECV_SEGMENT, int32_t), ref.seg.data(), (size_t)EL * 4);
  cmp_i32("recv_src_offset", rank, ARR(EPF_ROUTE_RECV_SRC_OFFSET, int32_t), ref.src_off.data(), (size_t)EL * (R + 1));
  if (L.plan_layout == EPF_LAYOUT_RANK_MAJOR) {
    cmp_i32("send_rm_offset", rank, ARR(EPF_ROUTE_SEND_RM_OFFSET, int32_t), ref.send_rm.data(), R);
    cmp_i32("recv_rm_offset", rank, ARR(EPF_ROUTE_RECV_RM_OFFSET, int32_t), ref.rm_off.data(), R + 1);
  }
  if (h->recv_rows != ref.rows || h->recv_rows_em != ref.rows_em || h->recv_overflow != ref.overflow)
    fail_msg("%s: rank %d rows %lld/%lld/%lld, want %lld/%lld/%lld", g_case, rank, (long long)h->recv_rows,
             (long long)h->recv_rows_em, (long long)h->recv_overflow, (long long)ref.rows, (long long)ref.rows_em,
             (long long)ref.overflow);
  if (mapped_total != NULL && *(volatile const int64_t*)mapped_total != ref.rows)
    fail_msg("%s: rank %d host-mapped total %lld, want %lld", g_case, rank, (long long)*mapped_total, (long long)ref.rows);
  /* pad rows' metadata: marked exactly, every other row untouched (kept small: <= 64 MiB) */
  if (window_slice != NULL && tm.plan.region[EPF_REGION_RECV_META].bytes <= (64u << 20)) {
    const bool marks = L.plan_layout == EPF_LAYOUT_EXPERT_MAJOR && L.expert_alignment > 1 &&
                       (L.flags & EPF_ROUTE_FLAG_NO_PAD_MARK) == 0;
    const int64_t cap = tm.plan.recv_capacity;
    std::vector<uint8_t> meta(tm.plan.region[EPF_REGION_RECV_META].bytes);
    std::vector<uint8_t> want(meta.size(), META_POISON_BYTE);
    EPF_CHECK_CUDA(cudaMemcpy(meta.data(), window_slice + tm.plan.region[EPF_REGION_RECV_META].offset, meta.size(),
                              cudaMemcpyDeviceToHost));
    if (marks) {
      for (int j = 0; j < EL; ++j) {
        for (int64_t row = (int64_t)ref.seg[j * 4] + ref.seg[j * 4 + 1]; row < (int64_t)ref.seg[j * 4] + ref.seg[j * 4 + 2]; ++row) {
          if (row >= cap) break;
          epf_recv_meta_em_t m;
          m.src_token = -1;
          m.src_rank = -1;
          m.k = -1;
          m.local_expert = j;
          m.weight = 0.0f;
          memcpy(&want[(size_t)row * sizeof(m)], &m, sizeof(m));
        }
      }
    }
    if (memcmp(meta.data(), want.data(), meta.size()) != 0) {
      for (size_t i = 0; i < meta.size(); ++i)
        if (meta[i] != want[i])
          fail_msg("%s: rank %d RECV_META byte %zu (row %zu) = 0x%02x, want 0x%02x", g_case, rank, i, i / 16, meta[i], want[i]);
    }
  }
#undef ARR
}

/* One step on a virtual-rank team: fresh ids, poison, update, check every rank. */
static uint32_t run_step(Team& tm, int pattern, const std::vector<int>& T, int use_dev_T, int B, uint32_t expect_epoch,
                         cudaStream_t stream) {
  uint32_t dropped = 0;
  const Shape& s = tm.shape;
  const int R = s.R;
  std::vector<std::vector<int64_t>> ids(R);
  std::vector<RefRank> ref;
  const int skew = (int)rand_in(0, s.E - 1);
  for (int r = 0; r < R; ++r) make_topk(pattern, s.E, s.K, s.Tmax, T[r], tm.idx64, skew, ids[r]);
  upload_topk(tm.d_topk, ids, tm.idx64, (size_t)s.Tmax * s.K, stream);
  EPF_CHECK_CUDA(cudaMemcpyAsync(tm.d_T, T.data(), R * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  poison(tm, stream);
  epf_route_step_t step = epf_route_step_make(tm.d_topk, use_dev_T ? 0 : T[0], epf_wait_make(tm.plan.timeout_ns, tm.rec_dev, NULL, 0));
  step.blocks_per_rank = B;
  step.num_tokens_dev = use_dev_T ? tm.d_T : NULL;
  step.recv_total_mapped = tm.total_dev;
  const epf_status_t st = epf_route_update(&tm.route, virtual_team(tm), &tm.plan, &step, stream);
  if (st != EPF_OK) fail_msg("%s: update: %s", g_case, epf_status_name(st));
  EPF_CHECK_CUDA(cudaGetLastError());
  EPF_CHECK_CUDA(cudaStreamSynchronize(stream));
  reference(s, ids, T, ref);
  for (int r = 0; r < R; ++r) {
    check_rank(tm, tm.route, r, r, T[r], ref[r], expect_epoch, tm.window + (size_t)r * tm.plan.total_bytes,
               s.exchange ? tm.total_host + r : NULL);
    dropped += ref[r].dropped;
  }
  return dropped;
}

/* ---- tests ------------------------------------------------------------------------------------- */

/* One rank, the full matrix of T x E x K x index type x routing pattern. */
static void test_one_rank_matrix(void** state) {
  static const int Ts[] = {1, 37, 4096}, Es[] = {8, 256, 1024}, Ks[] = {1, 8, 32}, Bs[] = {1, 2, 3, 8};
  int runs = 0;
  cudaStream_t stream;
  (void)state;
  EPF_CHECK_CUDA(cudaStreamCreate(&stream));
  for (int ti = 0; ti < 3; ++ti)
    for (int ei = 0; ei < 3; ++ei)
      for (int ki = 0; ki < 3; ++ki)
        for (int idx64 = 0; idx64 < 2; ++idx64) {
          const int T = Ts[ti], E = Es[ei], K = Ks[ki];
          const int Tmax = T + (int)rand_in(0, 7); /* rows past T stay poisoned */
          const int layout = runs % 2 ? EPF_LAYOUT_RANK_MAJOR : EPF_LAYOUT_EXPERT_MAJOR;
          const int A = runs % 3 == 0 ? 128 : 1;
          Team tm;
          uint32_t dropped = 0;
          team_init(tm, 1, E, K, Tmax, A, layout, 0, idx64, 0u, 8, 0u);
          for (int p = 0; p < PAT_COUNT; ++p) {
            const int B = Bs[rand_in(0, 3)];
            snprintf(g_case, sizeof(g_case), "R=1 T=%d/%d E=%d K=%d %s %s A=%d B=%d %s", T, Tmax, E, K,
                     idx64 ? "int64" : "int32", layout == EPF_LAYOUT_RANK_MAJOR ? "RM" : "EM", A, B, pat_name[p]);
            std::vector<int> Tv(1, T);
            dropped += run_step(tm, p, Tv, 0, B, (uint32_t)(p + 1), stream);
            ++runs;
          }
          assert_int_equal(tm.rec_host->dropped_routes, dropped); /* the error record's counter */
          assert_int_equal(tm.rec_host->count, 0);
          team_free(tm);
        }
  printf("one rank: %d runs (3 T x 3 E x 3 K x 2 index types x 4 patterns), bit-exact\n", runs);
  EPF_CHECK_CUDA(cudaStreamDestroy(stream));
}

/* Virtual ranks: exchange + offsets, 3 steps per case, per-rank T, overflow, epoch wrap. */
static void test_virtual_ranks(void** state) {
  static const int ranks[] = {1, 2, 4, 8};
  int runs = 0;
  cudaStream_t stream;
  (void)state;
  EPF_CHECK_CUDA(cudaStreamCreate(&stream));
  for (int ri = 0; ri < 4; ++ri) {
    const int R = ranks[ri];
    for (int c = 0; c < 16; ++c) {
      static const int Es[] = {8, 256, 1024}, Ks[] = {1, 8, 32};
      int E = Es[rand_in(0, 2)];
      if (E % R != 0) E = R;
      const int K = Ks[rand_in(0, 2)];
      const int Tmax = c % 4 == 3 ? 4096 : (int)rand_in(1, 300);
      const int layout = c % 2 ? EPF_LAYOUT_RANK_MAJOR : EPF_LAYOUT_EXPERT_MAJOR;
      const int A = (c / 2) % 2 ? 128 : (int)(1 << rand_in(0, 3));
      const int idx64 = (int)rand_in(0, 1);
      /* capacity: the plan's worst case, or small enough to overflow */
      const int64_t capacity = c % 5 == 4 ? (int64_t)(E / R) * A + rand_in(0, 64) : 0;
      const uint32_t flags = c % 7 == 6 ? EPF_ROUTE_FLAG_NO_PAD_MARK : 0u;
      const uint32_t first_epoch = c % 3 == 2 ? 0xfffffffeu : c % 3 == 1 ? (uint32_t)rand_in(1, 1000000) : 0u;
      Team tm;
      uint32_t dropped = 0;
      team_init(tm, R, E, K, Tmax, A, layout, capacity, idx64, flags, 8, first_epoch);
      for (int stepi = 0; stepi < 3; ++stepi) {
        const int pattern = (int)rand_in(0, PAT_COUNT - 1);
        const int B = (int)rand_in(0, 4); /* 0: the launcher's default */
        const int use_dev_T = (int)rand_in(0, 1);
        std::vector<int> T(R);
        for (int r = 0; r < R; ++r) T[r] = use_dev_T ? (int)rand_in(0, Tmax) : Tmax;
        if (!use_dev_T && stepi == 1) for (int r = 0; r < R; ++r) T[r] = Tmax / 2; /* host T < Tmax */
        snprintf(g_case, sizeof(g_case), "R=%d E=%d K=%d Tmax=%d %s %s A=%d cap=%lld flags=%u epoch0=%u step=%d B=%d %s%s", R,
                 E, K, Tmax, idx64 ? "int64" : "int32", layout == EPF_LAYOUT_RANK_MAJOR ? "RM" : "EM", A,
                 (long long)tm.plan.recv_capacity, flags, first_epoch, stepi, B, pat_name[pattern],
                 use_dev_T ? " devT" : "");
        dropped += run_step(tm, pattern, T, use_dev_T, B, first_epoch + 1u + (uint32_t)stepi, stream);
        ++runs;
      }
      assert_int_equal(tm.rec_host->dropped_routes, dropped);
      assert_int_equal(tm.rec_host->count, 0);
      team_free(tm);
    }
  }
  printf("virtual ranks R in {1,2,4,8}: %d steps checked (exchange, offsets, overflow, epoch wrap)\n", runs);
  EPF_CHECK_CUDA(cudaStreamDestroy(stream));
}

/* Both count paths and both offset paths: K a power of two <= 32 with R <= 32 derives the
 * destination masks from the entry pass, any other K or R > 32 walks the tokens again; R <= 8
 * keeps every source's count in registers for the receive offsets, R > 8 loads them in batches. */
static void test_count_paths(void** state) {
  static const int ranks[] = {3, 12, 40}, Ks[] = {3, 6, 8, 16};
  int runs = 0;
  cudaStream_t stream;
  (void)state;
  EPF_CHECK_CUDA(cudaStreamCreate(&stream));
  for (int ri = 0; ri < 3; ++ri)
    for (int ki = 0; ki < 4; ++ki) {
      const int R = ranks[ri], K = Ks[ki], E = R * (ki + 2), Tmax = (int)rand_in(100, 400);
      const int layout = (ri + ki) % 2 ? EPF_LAYOUT_RANK_MAJOR : EPF_LAYOUT_EXPERT_MAJOR;
      const int A = ki % 2 ? 16 : 1;
      const int idx64 = (ri + ki) % 2;
      Team tm;
      uint32_t dropped = 0;
      team_init(tm, R, E, K, Tmax, A, layout, 0, idx64, 0u, 3, 0u);
      for (int stepi = 0; stepi < 2; ++stepi) {
        const int pattern = stepi == 0 ? PAT_RANDOM : PAT_OUT_OF_RANGE;
        const int B = R <= 12 ? (int)rand_in(1, 3) : 1; /* R = 40: 40 blocks, surely co-resident */
        std::vector<int> T(R);
        for (int r = 0; r < R; ++r) T[r] = (int)rand_in(0, Tmax);
        snprintf(g_case, sizeof(g_case), "paths R=%d E=%d K=%d Tmax=%d %s %s A=%d B=%d %s", R, E, K, Tmax,
                 idx64 ? "int64" : "int32", layout == EPF_LAYOUT_RANK_MAJOR ? "RM" : "EM", A, B, pat_name[pattern]);
        dropped += run_step(tm, pattern, T, 1, B, 1u + (uint32_t)stepi, stream);
        ++runs;
      }
      assert_int_equal(tm.rec_host->dropped_routes, dropped);
      assert_int_equal(tm.rec_host->count, 0);
      team_free(tm);
    }
  printf("count paths: %d steps (R 3/12/40, K 3/6/8/16) bit-exact\n", runs);
  EPF_CHECK_CUDA(cudaStreamDestroy(stream));
}

/* The public composition: one rank-block per CTA, grid (B, R), each block with its OWN copy of
 * topk_idx in which only its tokens (epf_route_block_tokens) hold the real ids. */
__global__ void public_update_kernel(epf_route_t route, epf_team_t team, epf_plan_t plan, const char* topk,
                                     size_t block_bytes, int T, epf_wait_t w, int64_t* total) {
  extern __shared__ uint4 smem[];
  const int index = (int)blockIdx.y, b = (int)blockIdx.x, B = (int)gridDim.x;
  epf_team_t me = team;
  me.rank = index;
  (void)epf_route_update_block(&route, index, me, &plan, topk + ((size_t)index * B + b) * block_bytes, T, b, B, w,
                               total + index, (void*)smem);
}

static void test_public_blocks(void** state) {
  static const int ranks[] = {1, 2, 4}, Ts[] = {1, 37, 200, 700};
  int runs = 0;
  cudaStream_t stream;
  (void)state;
  EPF_CHECK_CUDA(cudaStreamCreate(&stream));
  for (int ri = 0; ri < 3; ++ri)
    for (int ti = 0; ti < 4; ++ti) {
      const int R = ranks[ri], E = 64, K = 8, T = Ts[ti], Tmax = T + 3;
      const int layout = (ri + ti) % 2 ? EPF_LAYOUT_RANK_MAJOR : EPF_LAYOUT_EXPERT_MAJOR;
      const int A = ti % 2 ? 16 : 1, idx64 = ri % 2;
      const size_t elems = (size_t)Tmax * K, esz = idx64 ? 8 : 4;
      Team tm;
      uint32_t dropped = 0;
      team_init(tm, R, E, K, Tmax, A, layout, 0, idx64, 0u, 8, 0u);
      for (int B = 1; B <= 4; ++B) {
        const int pattern = (B + ti) % PAT_COUNT, skew = (int)rand_in(0, E - 1);
        const int threads = 256;
        const size_t smem = epf_route_smem_bytes(&tm.route.layout, threads);
        std::vector<std::vector<int64_t>> ids(R), copies((size_t)R * B);
        std::vector<int> Tv(R, T);
        std::vector<RefRank> ref;
        void* d_copies;
        for (int r = 0; r < R; ++r) {
          make_topk(pattern, E, K, Tmax, T, idx64, skew, ids[r]);
          for (int b = 0; b < B; ++b) {
            std::vector<int64_t>& c = copies[(size_t)r * B + b];
            int t0, t1;
            epf_route_block_tokens(T, b, B, &t0, &t1);
            c = ids[r];
            for (int t = 0; t < T; ++t) /* another block's token: a different, valid expert */
              if (t < t0 || t >= t1)
                for (int k = 0; k < K; ++k) {
                  int64_t& e = c[(size_t)t * K + k];
                  e = e >= 0 && e < E ? (e + 1) % E : (int64_t)((t + k) % E);
                }
          }
        }
        EPF_TEST_MALLOC(&d_copies, copies.size() * elems * esz);
        upload_topk(d_copies, copies, idx64, elems, stream);
        poison(tm, stream);
        snprintf(g_case, sizeof(g_case), "public blocks R=%d T=%d E=%d K=%d %s %s A=%d B=%d %s", R, T, E, K,
                 idx64 ? "int64" : "int32", layout == EPF_LAYOUT_RANK_MAJOR ? "RM" : "EM", A, B, pat_name[pattern]);
        public_update_kernel<<<dim3((unsigned)B, (unsigned)R), threads, smem, stream>>>(
            tm.route, virtual_team(tm), tm.plan, (const char*)d_copies, elems * esz, T,
            epf_wait_make(tm.plan.timeout_ns, tm.rec_dev, NULL, 0), tm.total_dev);
        EPF_CHECK_CUDA(cudaGetLastError());
        EPF_CHECK_CUDA(cudaStreamSynchronize(stream));
        EPF_TEST_FREE(d_copies);
        reference(tm.shape, ids, Tv, ref);
        for (int r = 0; r < R; ++r) {
          check_rank(tm, tm.route, r, r, T, ref[r], (uint32_t)B, tm.window + (size_t)r * tm.plan.total_bytes,
                     tm.shape.exchange ? tm.total_host + r : NULL);
          dropped += ref[r].dropped;
        }
        ++runs;
      }
      assert_int_equal(tm.rec_host->dropped_routes, dropped);
      assert_int_equal(tm.rec_host->count, 0);
      team_free(tm);
    }
  printf("public blocks: %d updates (R 1/2/4, T 1..700, 1..4 blocks, each block its own tokens only) bit-exact\n", runs);
  EPF_CHECK_CUDA(cudaStreamDestroy(stream));
}

/* T = 65536. */
static void test_large_T(void** state) {
  struct { int R, E, K, idx64, layout, B; } cases[] = {
      {1, 256, 8, 1, EPF_LAYOUT_EXPERT_MAJOR, 8},
      {1, 1024, 32, 0, EPF_LAYOUT_RANK_MAJOR, 16},
      {2, 1024, 32, 1, EPF_LAYOUT_EXPERT_MAJOR, 4},
      {8, 256, 8, 0, EPF_LAYOUT_RANK_MAJOR, 4},
  };
  cudaStream_t stream;
  (void)state;
  EPF_CHECK_CUDA(cudaStreamCreate(&stream));
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
    const int T = 65536, R = cases[i].R;
    Team tm;
    /* capacity: twice the expected rows per rank (random routing), with alignment 128 */
    team_init(tm, R, cases[i].E, cases[i].K, T, 128, cases[i].layout, 2ll * T * cases[i].K + 128ll * cases[i].E, cases[i].idx64,
              0u, 16, 0u);
    snprintf(g_case, sizeof(g_case), "R=%d T=65536 E=%d K=%d %s B=%d", R, cases[i].E, cases[i].K,
             cases[i].idx64 ? "int64" : "int32", cases[i].B);
    std::vector<int> Tv(R, T);
    run_step(tm, PAT_RANDOM, Tv, 0, cases[i].B, 1u, stream);
    run_step(tm, PAT_OUT_OF_RANGE, Tv, 1, cases[i].B / 2 + 1, 2u, stream);
    printf("%s: OK\n", g_case);
    team_free(tm);
  }
  EPF_CHECK_CUDA(cudaStreamDestroy(stream));
}

/* A CUDA graph of one update, replayed 1000 times with fresh ids and T. */
static void test_graph_replay(void** state) {
  const int R = 4, E = 256, K = 8, Tmax = 512, reps = 1000;
  Team tm;
  cudaStream_t stream;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  int checked = 0;
  (void)state;
  EPF_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  team_init(tm, R, E, K, Tmax, 128, EPF_LAYOUT_EXPERT_MAJOR, 0, 1, 0u, 8, 0u);
  epf_route_step_t step = epf_route_step_make(tm.d_topk, 0, epf_wait_make(tm.plan.timeout_ns, tm.rec_dev, NULL, 0));
  step.blocks_per_rank = 2;
  step.num_tokens_dev = tm.d_T;
  step.recv_total_mapped = tm.total_dev;
  EPF_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const epf_status_t st = epf_route_update(&tm.route, virtual_team(tm), &tm.plan, &step, stream);
  EPF_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  assert_int_equal(st, EPF_OK);
  EPF_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 1; i <= reps; ++i) {
    const bool check = i % 50 == 0 || i == reps || i == 1;
    const int pattern = i % 17 == 0 ? PAT_OUT_OF_RANGE : i % 13 == 0 ? PAT_SKEWED : PAT_RANDOM;
    std::vector<std::vector<int64_t>> ids(R);
    std::vector<int> T(R);
    const int skew = (int)rand_in(0, E - 1);
    for (int r = 0; r < R; ++r) {
      T[r] = (int)rand_in(0, Tmax);
      make_topk(pattern, E, K, Tmax, T[r], 1, skew, ids[r]);
    }
    upload_topk(tm.d_topk, ids, 1, (size_t)Tmax * K, stream); /* into the captured input buffers */
    EPF_CHECK_CUDA(cudaMemcpyAsync(tm.d_T, T.data(), R * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    if (check) poison(tm, stream);
    EPF_CHECK_CUDA(cudaGraphLaunch(exec, stream));
    if (check) {
      std::vector<RefRank> ref;
      EPF_CHECK_CUDA(cudaStreamSynchronize(stream));
      reference(tm.shape, ids, T, ref);
      snprintf(g_case, sizeof(g_case), "graph replay %d (%s)", i, pat_name[pattern]);
      for (int r = 0; r < R; ++r)
        check_rank(tm, tm.route, r, r, T[r], ref[r], (uint32_t)i, tm.window + (size_t)r * tm.plan.total_bytes,
                   tm.total_host + r);
      ++checked;
    }
  }
  EPF_CHECK_CUDA(cudaStreamSynchronize(stream));
  assert_int_equal(tm.rec_host->count, 0);
  printf("graph: %d replays (fresh ids and T each), %d checked bit-exact, epoch %d\n", reps, checked, reps);
  EPF_CHECK_CUDA(cudaGraphExecDestroy(exec));
  EPF_CHECK_CUDA(cudaGraphDestroy(graph));
  team_free(tm);
  EPF_CHECK_CUDA(cudaStreamDestroy(stream));
}

/* LL plans: local-only route (no exchange), fixed receive slots use the same per-expert slot. */
static void test_local_only(void** state) {
  cudaStream_t stream;
  (void)state;
  EPF_CHECK_CUDA(cudaStreamCreate(&stream));
  for (int R = 1; R <= 8; R *= 2) {
    Team tm;
    team_init(tm, R, 256, 8, 128, 1, EPF_LAYOUT_EXPERT_MAJOR, 0, 1, 0u, 4, 0u, EPF_MODE_LL);
    assert_int_equal(tm.route.layout.exchange, 0);
    snprintf(g_case, sizeof(g_case), "LL R=%d local-only", R);
    std::vector<int> T(R, 128);
    run_step(tm, PAT_RANDOM, T, 0, 1, 1u, stream);
    run_step(tm, PAT_OUT_OF_RANGE, T, 0, 3, 2u, stream);
    team_free(tm);
  }
  EPF_CHECK_CUDA(cudaStreamDestroy(stream));
}

/* Import of a byte copy; every rejection; the imported handle continues on the same window. */
static void test_import(void** state) {
  const int R = 2, E = 64, K = 4, Tmax = 300;
  Team tm;
  epf_route_t imp;
  void* copy;
  uint64_t bytes;
  cudaStream_t stream;
  (void)state;
  EPF_CHECK_CUDA(cudaStreamCreate(&stream));
  team_init(tm, R, E, K, Tmax, 16, EPF_LAYOUT_RANK_MAJOR, 0, 0, 0u, 6, 0u);
  snprintf(g_case, sizeof(g_case), "import: original");
  std::vector<int> T(R, 250);
  run_step(tm, PAT_RANDOM, T, 0, 2, 1u, stream);
  bytes = (uint64_t)R * tm.route_bytes;
  EPF_TEST_MALLOC(&copy, bytes);
  EPF_CHECK_CUDA(cudaMemcpy(copy, tm.route_buf, bytes, cudaMemcpyDeviceToDevice));
  assert_int_equal(epf_route_import(&tm.plan, copy, bytes, R, stream, &imp), EPF_OK);
  assert_true(imp.base == copy);
  assert_int_equal(imp.count, R);
  assert_null(imp.epoch_words);
  assert_memory_equal(&imp.layout, &tm.route.layout, sizeof(imp.layout));
  {
    epf_route_header_t h;
    assert_int_equal(epf_route_read_header(&imp, 1, stream, &h), EPF_OK);
    assert_int_equal(h.epoch, 1);
    assert_int_equal(h.num_tokens, 250);
    assert_int_equal(h.rank, 1);
    std::vector<uint8_t> a(bytes), b(bytes);
    EPF_CHECK_CUDA(cudaMemcpy(a.data(), tm.route_buf, bytes, cudaMemcpyDeviceToHost));
    EPF_CHECK_CUDA(cudaMemcpy(b.data(), copy, bytes, cudaMemcpyDeviceToHost));
    assert_memory_equal(a.data(), b.data(), bytes);
  }
  /* the imported handle continues at epoch 2 on the same window */
  {
    Team t2 = tm;
    t2.route = imp;
    t2.route_buf = copy;
    snprintf(g_case, sizeof(g_case), "import: continued");
    run_step(t2, PAT_SKEWED, T, 0, 1, 2u, stream);
    run_step(t2, PAT_OUT_OF_RANGE, T, 1, 3, 3u, stream);
  }
  /* rejections */
  {
    const epf_plan_t other = make_plan(R, E, K, Tmax, 32, EPF_LAYOUT_RANK_MAJOR, 0, EPF_MODE_HT);
    epf_route_header_t h;
    assert_int_equal(epf_route_import(NULL, copy, bytes, R, stream, &imp), EPF_ERR_INVALID_ARGUMENT);
    assert_int_equal(epf_route_import(&tm.plan, NULL, bytes, R, stream, &imp), EPF_ERR_INVALID_ARGUMENT);
    assert_int_equal(epf_route_import(&tm.plan, copy, bytes, R, stream, NULL), EPF_ERR_INVALID_ARGUMENT);
    assert_int_equal(epf_route_import(&tm.plan, copy, bytes, 3, stream, &imp), EPF_ERR_INVALID_ARGUMENT);
    assert_int_equal(epf_route_import(&tm.plan, (char*)copy + 16, bytes - 16, R, stream, &imp), EPF_ERR_ALIGNMENT);
    assert_int_equal(epf_route_import(&tm.plan, copy, bytes - 1, R, stream, &imp), EPF_ERR_INVALID_ARGUMENT);
    assert_int_equal(epf_route_import(&other, copy, bytes, R, stream, &imp), EPF_ERR_CONFIG_MISMATCH);
    /* buffer 1's epoch differs from buffer 0's */
    EPF_CHECK_CUDA(cudaMemcpy(&h, (char*)copy + tm.route_bytes, sizeof(h), cudaMemcpyDeviceToHost));
    h.epoch += 1;
    EPF_CHECK_CUDA(cudaMemcpy((char*)copy + tm.route_bytes, &h, sizeof(h), cudaMemcpyHostToDevice));
    assert_int_equal(epf_route_import(&tm.plan, copy, bytes, R, stream, &imp), EPF_ERR_CONFIG_MISMATCH);
    /* a corrupt magic */
    EPF_CHECK_CUDA(cudaMemset(copy, 0, 16));
    assert_int_equal(epf_route_import(&tm.plan, copy, bytes, R, stream, &imp), EPF_ERR_STRUCT_VERSION);
  }
  printf("import: byte copy rebound (arrays identical), continued 2 steps, 8 rejections\n");
  EPF_TEST_FREE(copy);
  team_free(tm);
  EPF_CHECK_CUDA(cudaStreamDestroy(stream));
}

/* Host statuses for bad input; nothing is launched. A device T out of range is clamped and reported. */
static void test_bad_input(void** state) {
  Team tm;
  epf_route_t r;
  epf_status_t st;
  cudaStream_t stream = 0;
  (void)state;
  team_init(tm, 4, 64, 4, 100, 1, EPF_LAYOUT_EXPERT_MAJOR, 0, 1, 0u, 4, 0u);
  const epf_team_t team = virtual_team(tm);
  const uint64_t bytes = 4 * tm.route_bytes;
  epf_route_step_t step = epf_route_step_make(tm.d_topk, 100, epf_wait_make(tm.plan.timeout_ns, tm.rec_dev, NULL, 0));
  epf_route_step_t s;
  /* init */
  assert_int_equal(epf_route_init(NULL, &tm.rc, tm.route_buf, bytes, 4, 0, stream, &r), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_route_init(&tm.plan, &tm.rc, NULL, bytes, 4, 0, stream, &r), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_route_init(&tm.plan, &tm.rc, tm.route_buf, bytes, 4, 0, stream, NULL), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_route_init(&tm.plan, &tm.rc, tm.route_buf, bytes, 3, 0, stream, &r), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_route_init(&tm.plan, &tm.rc, tm.route_buf, bytes, 0, 0, stream, &r), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_route_init(&tm.plan, &tm.rc, tm.route_buf, bytes - 1, 4, 0, stream, &r), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_route_init(&tm.plan, &tm.rc, (char*)tm.route_buf + 128, bytes, 4, 0, stream, &r), EPF_ERR_ALIGNMENT);
  {
    epf_route_config_t rc = tm.rc;
    rc.top_k = 5;
    assert_int_equal(epf_route_init(&tm.plan, &rc, tm.route_buf, bytes, 4, 0, stream, &r), EPF_ERR_TOPK);
    rc = tm.rc;
    rc.magic = 0;
    assert_int_equal(epf_route_init(&tm.plan, &rc, tm.route_buf, bytes, 4, 0, stream, &r), EPF_ERR_STRUCT_VERSION);
  }
  /* update */
  assert_int_equal(epf_route_update(NULL, team, &tm.plan, &step, stream), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_route_update(&tm.route, team, NULL, &step, stream), EPF_ERR_INVALID_ARGUMENT);
  assert_int_equal(epf_route_update(&tm.route, team, &tm.plan, NULL, stream), EPF_ERR_INVALID_ARGUMENT);
  s = step; s.topk_idx = NULL;
  assert_int_equal(epf_route_update(&tm.route, team, &tm.plan, &s, stream), EPF_ERR_INVALID_ARGUMENT);
  s = step; s.num_tokens = 101;
  assert_int_equal(epf_route_update(&tm.route, team, &tm.plan, &s, stream), EPF_ERR_TOKENS);
  s = step; s.num_tokens = -1;
  assert_int_equal(epf_route_update(&tm.route, team, &tm.plan, &s, stream), EPF_ERR_TOKENS);
  s = step; s.blocks_per_rank = 5;
  assert_int_equal(epf_route_update(&tm.route, team, &tm.plan, &s, stream), EPF_ERR_INVALID_ARGUMENT);
  s = step; s.blocks_per_rank = -1;
  assert_int_equal(epf_route_update(&tm.route, team, &tm.plan, &s, stream), EPF_ERR_INVALID_ARGUMENT);
  {
    epf_route_t bad = tm.route;
    bad.magic = 0;
    assert_int_equal(epf_route_update(&bad, team, &tm.plan, &step, stream), EPF_ERR_STRUCT_VERSION);
    bad = tm.route;
    bad.count = 2;
    assert_int_equal(epf_route_update(&bad, team, &tm.plan, &step, stream), EPF_ERR_INVALID_ARGUMENT);
    bad = tm.route;
    bad.count = 1; /* a real rank: its team rank must be in range */
    epf_team_t t = team;
    t.rank = 4;
    assert_int_equal(epf_route_update(&bad, t, &tm.plan, &step, stream), EPF_ERR_RANK);
    t.rank = -1;
    assert_int_equal(epf_route_update(&bad, t, &tm.plan, &step, stream), EPF_ERR_RANK);
    bad = tm.route;
    bad.resident_blocks = 7; /* 4 ranks x 2 blocks do not fit */
    s = step;
    s.blocks_per_rank = 2;
    assert_int_equal(epf_route_update(&bad, team, &tm.plan, &s, stream), EPF_ERR_CO_RESIDENCY);
  }
  {
    const epf_plan_t other = make_plan(4, 64, 4, 100, 2, EPF_LAYOUT_EXPERT_MAJOR, 0, EPF_MODE_HT);
    assert_int_equal(epf_route_update(&tm.route, team, &other, &step, stream), EPF_ERR_CONFIG_MISMATCH);
    epf_team_t t = team;
    t.nranks = 2;
    assert_int_equal(epf_route_update(&tm.route, t, &tm.plan, &step, stream), EPF_ERR_CONFIG_MISMATCH);
    t = team;
    t.base = NULL;
    assert_int_equal(epf_route_update(&tm.route, t, &tm.plan, &step, stream), EPF_ERR_INVALID_ARGUMENT);
  }
  /* co-residency: 72 virtual ranks x 64 blocks is more than any GPU holds */
  {
    Team big;
    team_init(big, 72, 72, 1, 8, 1, EPF_LAYOUT_EXPERT_MAJOR, 0, 1, 0u, 64, 0u);
    epf_route_step_t bs = epf_route_step_make(big.d_topk, 8, epf_wait_make(big.plan.timeout_ns, big.rec_dev, NULL, 0));
    bs.blocks_per_rank = 64;
    assert_int_equal(epf_route_update(&big.route, virtual_team(big), &big.plan, &bs, stream), EPF_ERR_CO_RESIDENCY);
    team_free(big);
  }
  EPF_CHECK_CUDA(cudaDeviceSynchronize());
  /* create = init + update, then a device T out of range: clamped to T_max, reported once per rank */
  {
    std::vector<std::vector<int64_t>> ids(4);
    std::vector<int> T(4, 100), Tdev(4);
    std::vector<RefRank> ref;
    for (int rr = 0; rr < 4; ++rr) make_topk(PAT_RANDOM, 64, 4, 100, 100, 1, 0, ids[rr]);
    upload_topk(tm.d_topk, ids, 1, 400, stream);
    Tdev[0] = 101;
    Tdev[1] = -5;
    Tdev[2] = 100;
    Tdev[3] = 1 << 30;
    EPF_CHECK_CUDA(cudaMemcpy(tm.d_T, Tdev.data(), 4 * sizeof(int32_t), cudaMemcpyHostToDevice));
    s = step;
    s.num_tokens_dev = tm.d_T;
    st = epf_route_create(&tm.plan, &tm.rc, tm.route_buf, bytes, 4, 0u, team, &s, stream, &r);
    assert_int_equal(st, EPF_OK);
    EPF_CHECK_LAUNCH();
    T[1] = 0;
    reference(tm.shape, ids, T, ref);
    snprintf(g_case, sizeof(g_case), "create + device T out of range");
    for (int rr = 0; rr < 4; ++rr) check_rank(tm, r, rr, rr, T[rr], ref[rr], 1u, NULL, NULL, false); /* init zeroed */
    epf_error_record_t rec;
    epf_error_read(tm.rec_host, &rec);
    assert_int_equal(rec.count, 3);
    assert_int_equal(rec.status, EPF_ERR_TOKENS);
    assert_int_equal(rec.valid, 1);
  }
  team_free(tm);
}

#ifdef EPF_TEST_WITH_NCCL
/* A real 1-rank NCCL window: team from epf_nccl_team_query, route.count == 1. */
static void test_nccl_one_rank(void** state) {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  ncclDevComm_t dev;
  epf_nccl_window_t win;
  epf_team_t team;
  Team tm;
  epf_status_t st;
  cudaStream_t stream;
  const int E = 256, K = 8, Tmax = 4096;
  (void)state;
  EPF_CHECK_CUDA(cudaSetDevice(0));
  EPF_CHECK_CUDA(cudaStreamCreate(&stream));
  /* the virtual-rank fixture for buffers and the plan; its window is replaced by the NCCL one */
  team_init(tm, 1, E, K, Tmax, 128, EPF_LAYOUT_EXPERT_MAJOR, 0, 1, 0u, 8, 0u);
  assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
  st = epf_nccl_comm_init_rank(&comm, 1, id, 0, 60.0);
  if (st != EPF_OK) fail_msg("comm init: %s (%s)", epf_status_name(st), epf_nccl_last_message(comm, ncclInternalError));
  st = epf_nccl_window_create(comm, tm.plan.total_bytes, 60.0, &win);
  if (st != EPF_OK) fail_msg("window: %s (%s)", epf_status_name(st), epf_nccl_last_message(comm, ncclInternalError));
  st = epf_nccl_devcomm_create(comm, 1, 60.0, &dev);
  if (st != EPF_OK) fail_msg("devcomm: %s", epf_status_name(st));
  assert_int_equal(epf_nccl_team_query(&dev, win.window, stream, &team), EPF_OK);
  EPF_TEST_FREE(tm.window);
  tm.window = (char*)win.ptr;
  /* a real rank: one route buffer */
  assert_int_equal(epf_route_init(&tm.plan, &tm.rc, tm.route_buf, tm.route_bytes, 1, 0u, stream, &tm.route), EPF_OK);
  for (int stepi = 0; stepi < 4; ++stepi) {
    std::vector<std::vector<int64_t>> ids(1);
    std::vector<int> T(1, stepi == 2 ? 1000 : Tmax);
    std::vector<RefRank> ref;
    make_topk(stepi == 3 ? PAT_OUT_OF_RANGE : PAT_RANDOM, E, K, Tmax, T[0], 1, 0, ids[0]);
    upload_topk(tm.d_topk, ids, 1, (size_t)Tmax * K, stream);
    poison(tm, stream);
    epf_route_step_t step = epf_route_step_make(tm.d_topk, T[0], epf_wait_make(tm.plan.timeout_ns, tm.rec_dev, NULL, 0));
    step.recv_total_mapped = tm.total_dev;
    step.blocks_per_rank = stepi + 1;
    assert_int_equal(epf_route_update(&tm.route, team, &tm.plan, &step, stream), EPF_OK);
    EPF_CHECK_CUDA(cudaStreamSynchronize(stream));
    reference(tm.shape, ids, T, ref);
    snprintf(g_case, sizeof(g_case), "NCCL 1-rank step %d", stepi);
    check_rank(tm, tm.route, 0, 0, T[0], ref[0], (uint32_t)stepi + 1u, tm.window, tm.total_host);
  }
  assert_int_equal(tm.rec_host->count, 0);
  printf("1-rank NCCL window: 4 route updates bit-exact (counts exchanged through the window)\n");
  tm.window = NULL;
  EPF_TEST_FREE(tm.route_buf);
  EPF_TEST_FREE(tm.d_topk);
  EPF_TEST_FREE(tm.d_T);
  EPF_TEST_FREE(tm.rec_host);
  EPF_TEST_FREE(tm.total_host);
  assert_int_equal(epf_nccl_devcomm_destroy(comm, &dev), EPF_OK);
  assert_int_equal(epf_nccl_window_destroy(comm, &win, 60.0), EPF_OK);
  assert_int_equal(epf_nccl_comm_destroy(comm, 60.0), EPF_OK);
  EPF_CHECK_CUDA(cudaStreamDestroy(stream));
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_bad_input, epf_test_teardown),     cmocka_unit_test_teardown(test_one_rank_matrix, epf_test_teardown),
      cmocka_unit_test_teardown(test_virtual_ranks, epf_test_teardown), cmocka_unit_test_teardown(test_count_paths, epf_test_teardown),
      cmocka_unit_test_teardown(test_local_only, epf_test_teardown),
      cmocka_unit_test_teardown(test_large_T, epf_test_teardown),       cmocka_unit_test_teardown(test_graph_replay, epf_test_teardown),
      cmocka_unit_test_teardown(test_import, epf_test_teardown),        cmocka_unit_test_teardown(test_public_blocks, epf_test_teardown),
#ifdef EPF_TEST_WITH_NCCL
      cmocka_unit_test_teardown(test_nccl_one_rank, epf_test_teardown),
#endif
  };
  int rc = epf_test_gpus_or_skip(1);
  if (rc) return rc;
  g_seed = epf_test_seed();
  return cmocka_run_group_tests(tests, NULL, NULL);
}
/* SPDX-License-Identifier: Apache-2.0 */
