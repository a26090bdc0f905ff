/* layer.cuh — ex06_moe_training's device side of one case: plan, window, team, route and buffers
 * (Layer), the forward and backward launches of one training step, and a step with every output
 * poisoned first. Part of the example (one translation unit: main.cu includes it). */
#ifndef EX06_LAYER_CUH
#define EX06_LAYER_CUH

#include <stdint.h>

#include <algorithm>
#include <vector>

#include "epfuse/epfuse.cuh"
#include "epfuse/ht/kernels.cuh"
#include "ex_common.h"
#include "experts.cuh"
#include "model.h"

/* ============================================================================================ */
/* One training step through epfuse                                                              */
/* ============================================================================================ */

/* the device side of one case */
struct Layer {
  Case c;
  bool dx_window = false; /* --dx-out window: the dx rows over the receive rows (EXPERT_MAJOR), else in dxr */
  epf_plan_t plan;
  epf_team_t team;
  epf_route_t route;
  int64_t expert_rows;
  char* window = NULL;
  void* route_buf = NULL;
  epf_ht_state_t* state = NULL;
  epf_error_record_t *rec_h = NULL, *rec_d = NULL;
  /* inputs */
  int32_t *topk = NULL, *T = NULL;
  float* w = NULL;
  uint16_t *x = NULL, *dy = NULL, *w1 = NULL, *w3 = NULL, *w2 = NULL;
  /* forward */
  uint16_t *view = NULL, *saved_x = NULL, *out = NULL, *y = NULL;
  /* backward */
  float *rw = NULL, *wg = NULL, *da = NULL, *db = NULL, *hr = NULL, *dtw = NULL, *dw1 = NULL, *dw3 = NULL, *dw2 = NULL;
  uint16_t *dxr = NULL, *dx = NULL; /* dxr: --dx-out buffer only */
  epf_route_step_t rs;
  epf_ht_step_t fwd, bwd;
};

template <typename P>
static P* dev_alloc(size_t n) {
  P* p = NULL;
  EX_CK(cudaMalloc((void**)&p, std::max<size_t>(n, 1) * sizeof(P)));
  return p;
}
template <typename P>
static P* dev_upload(const std::vector<P>& v) {
  P* p = dev_alloc<P>(v.size());
  EX_CK(cudaMemcpy(p, v.data(), v.size() * sizeof(P), cudaMemcpyHostToDevice));
  return p;
}

/* the plan of a case (host only, no GPU) and the rows of the expert stage's buffers: EXPERT_MAJOR
 * one per receive row, RANK_MAJOR the expand view's */
static epf_plan_t plan_of(const Case& c, const Place& pl, int64_t* expert_rows) {
  const int R = c.R, H = c.H, E = c.E, K = c.K, Tm = c.Tmax;
  // example-begin training_plan
  epf_config_t cfg = EPF_CONFIG_INIT;
  cfg.nranks = R;
  cfg.num_experts = E;
  cfg.top_k = K;
  cfg.hidden = H;
  cfg.max_tokens_per_rank = Tm;
  cfg.mode = EPF_MODE_HT;
  cfg.layout = c.layout;
  cfg.payload = EPF_PAYLOAD_BF16;         /* the backward moves BF16 (gradients): a BF16 plan */
  cfg.combine_payload = EPF_PAYLOAD_BF16;
  cfg.flags = c.push ? EPF_FLAG_COMBINE_PUSH : 0u;
  cfg.expert_alignment = 1;
  cfg.recv_capacity = pl.max_recv_rows + 16; /* this routing fits; more would be dropped and counted */
  epf_plan_t plan;
  EX_CS(epf_plan_compute(&cfg, &plan));
  // example-end training_plan
  *expert_rows = c.layout == EPF_LAYOUT_EXPERT_MAJOR ? plan.recv_capacity : pl.max_expert_rows + 16;
  return plan;
}

/* plan, window, team, route, buffers and the two steps of one case; dx_window: the expert stage
 * writes its dx rows in place over the receive rows (EXPERT_MAJOR only), else into a buffer */
static void layer_init(Layer& L, const Model& m, const Place& pl, bool dx_window) {
  const Case& c = m.c;
  L.c = c;
  L.dx_window = dx_window;
  const int R = c.R, H = c.H, I = c.I, E = c.E, K = c.K, Tm = c.Tmax;
  L.plan = plan_of(c, pl, &L.expert_rows);
  /* in place: the backward of dispatch reads (pull) or pushes from each receive row's
   * epf_plan_expert_out_offset; with BF16 both ways the plan has no EXPERT_OUT region and that is
   * the receive row itself, where experts_dx_kernel writes. RANK_MAJOR pre-reduces view rows: a buffer. */
  if (dx_window && (c.layout != EPF_LAYOUT_EXPERT_MAJOR || L.plan.region[EPF_REGION_EXPERT_OUT].bytes != 0)) {
    fprintf(stderr, "[%s] --dx-out window needs EXPERT_MAJOR and a BF16 plan without EXPERT_OUT rows\n", c.name.c_str());
    exit(1);
  }

  ex_vteam_t vt; /* ex_common.h: R window slices (zeroed: epochs start at zero), team, R route buffers */
  ex_vteam_make(&L.plan, &vt);
  L.window = vt.window;
  L.route_buf = vt.route_buf;
  L.team = vt.team;
  L.route = vt.route;
  L.state = dev_alloc<epf_ht_state_t>(R);
  EX_CK(cudaMemset(L.state, 0, R * sizeof(epf_ht_state_t))); /* zeroed once, shared by both directions */
  EX_CK(cudaHostAlloc((void**)&L.rec_h, sizeof(epf_error_record_t), cudaHostAllocMapped));
  EX_CK(cudaHostGetDevicePointer((void**)&L.rec_d, L.rec_h, 0));
  epf_error_clear(L.rec_h);

  L.topk = dev_upload(m.topk);
  L.T = dev_upload(m.T);
  L.w = dev_upload(m.w);
  L.x = dev_upload(m.x);
  L.dy = dev_upload(m.dy);
  L.w1 = dev_upload(m.w1);
  L.w3 = dev_upload(m.w3);
  L.w2 = dev_upload(m.w2);
  const size_t rows = (size_t)R * L.expert_rows, tok = (size_t)R * Tm;
  if (c.layout == EPF_LAYOUT_RANK_MAJOR) L.view = (uint16_t*)dev_alloc<char>(rows * L.plan.row_bytes); /* [R][expert_rows] rows */
  L.saved_x = dev_alloc<uint16_t>(rows * H);
  L.out = dev_alloc<uint16_t>(rows * H);
  if (!dx_window) L.dxr = dev_alloc<uint16_t>(rows * H); /* window: the dx rows need no memory of their own */
  L.rw = dev_alloc<float>(rows);
  L.wg = dev_alloc<float>(rows);
  L.da = dev_alloc<float>(rows * I);
  L.db = dev_alloc<float>(rows * I);
  L.hr = dev_alloc<float>(rows * I);
  L.y = dev_alloc<uint16_t>(tok * H);
  L.dx = dev_alloc<uint16_t>(tok * H);
  L.dtw = dev_alloc<float>(tok * K);
  L.dw1 = dev_alloc<float>((size_t)E * H * I);
  L.dw3 = dev_alloc<float>((size_t)E * H * I);
  L.dw2 = dev_alloc<float>((size_t)E * I * H);

  // example-begin training_steps
  const epf_wait_t wait = epf_wait_make(L.plan.timeout_ns, L.rec_d, NULL, 0);
  L.rs = epf_route_step_make(L.topk, Tm, wait);
  L.rs.num_tokens_dev = L.T;   /* T per rank, on the device (unequal here) */

  {
    const epf_ht_step_t init = EPF_HT_STEP_INIT; /* the versioned prefix, every operand NULL */
    L.fwd = init;
  }
  L.fwd.x = L.x;               /* [R][Tmax][H] BF16 */
  L.fwd.topk_weights = L.w;    /* [R][Tmax][K] */
  L.fwd.out = L.y;             /* y [R][Tmax][H] BF16 */
  L.fwd.expert_out = L.out;    /* the experts' outputs [R][expert_rows][H] */
  L.fwd.em_view = L.view;      /* RANK_MAJOR: the expert-major view (NULL otherwise) */
  L.fwd.state = L.state;
  L.fwd.expert_rows = L.expert_rows;
  L.fwd.wait = wait;

  L.bwd = L.fwd;               /* the same route, state, view and weights; then: */
  L.bwd.x = L.dy;              /* the backward of combine dispatches dy [R][Tmax][H] */
  L.bwd.topk_idx = L.topk;     /* the forward's ids (the backward launchers take them here) */
  L.bwd.expert_out = dx_window ? NULL : L.dxr; /* the backward of dispatch combines the dx rows
                                   (NULL: in place, over the receive rows) ... */
  L.bwd.out = L.dx;            /* ... into dx [R][Tmax][H] */
  L.bwd.weight_grad = L.wg;    /* one d w per row, in expert_out's row order ... */
  L.bwd.topk_weights_grad = L.dtw; /* ... back to d topk_weights [R][Tmax][K] */
  // example-end training_steps
}

static void layer_free(Layer& L) {
  void* bufs[] = {L.window, L.route_buf, L.state, L.topk, L.T, L.w, L.x, L.dy, L.w1, L.w3, L.w2, L.view, L.saved_x,
                  L.out, L.y, L.rw, L.wg, L.da, L.db, L.hr, L.dtw, L.dw1, L.dw3, L.dw2, L.dxr, L.dx};
  for (void* p : bufs) EX_CK(cudaFree(p));
  EX_CK(cudaFreeHost(L.rec_h));
}

/* the grid of the expert-stage kernels: enough blocks per rank for the rows at this size */
static dim3 rows_grid(const Layer& L) { return dim3((unsigned)std::min<int64_t>(std::max<int64_t>(L.expert_rows, 1), 132), (unsigned)L.c.R); }

// example-begin training_forward
static void forward(Layer& L, cudaStream_t st) {
  EX_CS(epf_route_update(&L.route, L.team, &L.plan, &L.rs, st));
  EX_CS(epf_ht_dispatch(&L.route, L.team, &L.plan, &L.fwd, L.topk, EPF_HT_BOTH, st));
  if (L.c.layout == EPF_LAYOUT_RANK_MAJOR) EX_CS(epf_ht_expand(&L.route, L.team, &L.plan, &L.fwd, st));
  experts_forward_kernel<<<rows_grid(L), 128, (size_t)L.c.I * 4, st>>>(
      L.route, L.plan, L.window, L.view, L.expert_rows, L.c.I, L.w1, L.w3, L.w2, L.saved_x, L.out);
  EX_CK(cudaGetLastError());
  EX_CS(epf_ht_combine(&L.route, L.team, &L.plan, &L.fwd, L.topk, st));
}
// example-end training_forward

// example-begin training_backward
static void backward(Layer& L, cudaStream_t st) {
  /* dy to the rows x arrived in (no route update: the forward's route) */
  EX_CS(epf_ht_combine_backward(&L.route, L.team, &L.plan, &L.bwd, EPF_HT_BOTH, st));
  if (L.c.layout == EPF_LAYOUT_RANK_MAJOR) EX_CS(epf_ht_expand(&L.route, L.team, &L.plan, &L.bwd, st));
  /* the experts' backward */
  row_weights_kernel<<<rows_grid(L), 128, 0, st>>>(L.route, L.plan, L.window, L.expert_rows, L.rw);
  experts_backward_kernel<<<rows_grid(L), 128, 0, st>>>(L.route, L.plan, L.window, L.view, L.expert_rows, L.c.I, L.w1,
                                                         L.w3, L.w2, L.saved_x, L.out, L.rw, L.wg, L.da, L.db, L.hr);
  weight_grads_kernel<<<dim3(64, (unsigned)L.c.E), 256, 0, st>>>(L.route, L.plan, L.window, L.view, L.expert_rows, L.c.I,
                                                                 L.saved_x, L.rw, L.da, L.db, L.hr, L.dw1, L.dw3, L.dw2);
  /* the dx rows last: in place (L.dxr == NULL) they overwrite dy, which weight_grads_kernel read */
  experts_dx_kernel<<<rows_grid(L), 128, 0, st>>>(L.route, L.plan, L.window, L.expert_rows, L.c.I, L.w1, L.w3, L.da, L.db,
                                                  L.dxr);
  EX_CK(cudaGetLastError());
  /* dx rows back to the tokens (unit weights), the router-weight gradients with them */
  EX_CS(epf_ht_dispatch_backward(&L.route, L.team, &L.plan, &L.bwd, st));
}
// example-end training_backward

template <typename P>
static std::vector<P> download(const P* d, size_t n) {
  std::vector<P> v(n);
  EX_CK(cudaMemcpy(v.data(), d, n * sizeof(P), cudaMemcpyDeviceToHost));
  return v;
}

/* one step with every output poisoned first; returns the results (host copies) */
static Result step(Layer& L, cudaStream_t st) {
  const Case& c = L.c;
  const size_t rows = (size_t)c.R * L.expert_rows, tok = (size_t)c.R * c.Tmax;
  const size_t nw = (size_t)c.E * c.H * c.I;
  struct {
    void* p;
    size_t bytes;
  } poison[] = {{L.out, rows * c.H * 2}, {L.dxr, rows * c.H * 2}, {L.rw, rows * 4}, {L.wg, rows * 4}, {L.y, tok * c.H * 2},
                {L.dx, tok * c.H * 2}, {L.dtw, tok * c.K * 4}, {L.dw1, nw * 4}, {L.dw3, nw * 4}, {L.dw2, nw * 4}};
  for (auto& p : poison)
    if (p.p != NULL) EX_CK(cudaMemsetAsync(p.p, 0xA7, p.bytes, st)); /* in place, the dx rows land on dy: a missed row shows dy */
  forward(L, st);
  backward(L, st);
  EX_CK(cudaStreamSynchronize(st));
  Result r;
  r.y = download(L.y, tok * c.H);
  r.dx = download(L.dx, tok * c.H);
  r.dtw = download(L.dtw, tok * c.K);
  r.dw1 = download(L.dw1, nw);
  r.dw3 = download(L.dw3, nw);
  r.dw2 = download(L.dw2, nw);
  r.out = download(L.out, rows * c.H);
  if (L.dx_window) { /* the dx rows where they are: every rank's receive rows [0, expert_rows) */
    r.dxr.resize(rows * c.H);
    for (int d = 0; d < c.R; ++d)
      EX_CK(cudaMemcpy2D(r.dxr.data() + (size_t)d * L.expert_rows * c.H, (size_t)c.H * 2,
                         L.window + (uint64_t)d * L.plan.total_bytes + epf_plan_recv_token_offset(&L.plan, 0), L.plan.row_bytes,
                         (size_t)c.H * 2, (size_t)L.expert_rows, cudaMemcpyDeviceToHost));
  } else {
    r.dxr = download(L.dxr, rows * c.H);
  }
  r.rw = download(L.rw, rows);
  r.wg = download(L.wg, rows);
  return r;
}

#endif /* EX06_LAYER_CUH */
