/* bench_zoo — the model-zoo benchmark (issue #17): ONE table of HT and LL dispatch / combine over
 * public MoE model shapes, with virtual ranks on one GPU, and the configurations the examples and
 * the Python package run (issue #31) (a program, not a test; its CTest entries are a host-only
 * --list, a host-only check of its byte formulas and a GPU smoke run of --quick).
 *
 *   bench_zoo [--list] [--quick] [--models a,b] [--ranks 4,8,16] [--iters 10] [--reps 50]
 *             [--ht-tokens 4096] [--ll-tokens 1,128,256] [--only ht|ll] [--csv FILE] [--torch FILE]
 *             [--apps | --no-apps] [--app-tokens 4096]
 *
 *   --list       print the rows it would run (plans, minimal and HBM bytes, targets, memory)
 *                without touching CUDA
 *   --quick      a CI smoke subset: qwen3-30b and gpt-oss-120b, 4 ranks, HT T=512, LL T=1,128,
 *                application rows at T=512, 3 iterations / 10 replays (explicit options after it
 *                still apply)
 *   --apps       the application rows alone (no model matrix); --no-apps: the matrix alone;
 *                default: both, the application rows last
 *   --app-tokens HT tokens per rank of the DeepSeek-V3 application rows (examples/05 --real: 4096)
 *   --iters N    HT: timed iterations per variant (3 more untimed first); median reported
 *   --reps N     LL: timed CUDA-graph replays of [dispatch, combine] (10 more untimed first)
 *   --ht-tokens  HT tokens per rank; halved for a model / rank count whose largest case would not
 *                fit in device memory (said so on stderr; the row names carry the T that ran)
 *   --csv FILE   also write every row as CSV (written as rows finish: a run that dies keeps them);
 *                scripts/plot_zoo.py draws docs/img/perf_zoo.png from it
 *   --torch FILE the CSV of scripts/bench_zoo_torch.py (case,torch_us): the PyTorch column
 *
 * Models (hidden H, experts E, top-k K): deepseek-v3 (7168, 256, 8), kimi-k2 (7168, 384, 8),
 * qwen3-235b (4096, 128, 8), qwen3-30b (2048, 128, 8), gpt-oss-120b (2880, 128, 4),
 * llama4-maverick (5120, 128, 1), mixtral-8x22b (6144, 8, 2). Routing: K distinct uniform
 * experts per token (reproducible; HT weights in [0, 1), LL weights 1/K as bench_ll).
 *
 * Matrix, for each model x virtual ranks (a pair the plan refuses — experts not divisible by the
 * ranks — is left out, said so on stderr):
 *   HT, EXPERT_MAJOR (ht-em) and RANK_MAJOR (ht-rm) x dispatch payload bf16 / mxfp8 / fp8 (FP8-128),
 *       each where epf_quant_check allows the hidden size (BF16 input, quantized on the way;
 *       COMPACT scales, alignment 1), x
 *       combine: combine-pull   pull in place over the received rows (ht-em, BF16 both ways)
 *                combine-eo     pull through a separate expert-output buffer (BF16)
 *                combine-mxfp8  MXFP8 combine rows (through the buffer)
 *       ht-rm rows: dispatch, expand (local), dispatch+expand (sum of the two medians), combine.
 *   LL at each --ll-tokens T: bench_ll's five cases: BF16 dispatch with combine-push (in place),
 *       combine-pull (in place, EPF_LL_Y_IN_PLACE_PULL) and combine-mxfp8 (in place; the plan's
 *       default transport: pulled from the expert rank's EXPERT_OUT, the same bytes as a push); MXFP8 and
 *       FP8-128 dispatch with combine-fixed (BF16 y from a separate [expert][source][T] buffer).
 *   Row name: <model>/R<ranks>/<ht-em|ht-rm|ll>/T<tokens>/<dispatch payload>/<stage>[-<combine>].
 *
 * Application rows (issue #31 §2; zoo_app_ht_specs says each configuration and where it is read
 * from), 8 virtual ranks, named <app>/<model>/R8/<mode>/T<tokens>/<tag>/<stage> (CSV column app):
 *   ex05        examples/05_moe_layer_gemm --real (DeepSeek-V3, T 4096, --align 16): fp8-segmn (per-128
 *               FP8, GEMM-ready SEGMENT_MN_MAJOR scales) dispatch and combine-eo (the down GEMM's
 *               outputs in a separate buffer, as ex05) and combine-window (the same outputs in the
 *               window's EXPERT_OUT rows, where a GEMM can write them: nothing is put); twin
 *               fp8-compact (COMPACT scales); bf16 dispatch and combine-pull (in place)
 *   ex05-mxfp8  the same layer with MXFP8 GEMMs (no example runs it): mxfp8-swz (SWIZZLED_128X4,
 *               --align 128) and twin mxfp8-compact
 *   ex06        examples/06_moe_training's plans at the ex05 shape: BF16, pull / push (bf16-pull,
 *               bf16-push), ht-em and ht-rm: forward, then combine-backward (a dispatch of dy
 *               [+ expand]) and dispatch-backward (a unit-weight combine of the dx rows with the
 *               router-weight gradient, the dx rows in a buffer: --dx-out buffer) over the same
 *               route; ht-em also dispatch-backward-inplace (the dx rows over the receive rows,
 *               expert_out = NULL: ex06's default --dx-out window; alternate iterations with the
 *               buffer one) and, bf16-pull, the forward twin combine-pull (in place)
 *   python-moe_layer  examples/python/moe_layer.py (H 2048, E 64, top-4, T 512): HT BF16,
 *               worst-case recv_capacity, int64 ids, combine-eo; twin combine-pull
 *   ex03        examples/03_fused_moe_layer (same shape): MXFP8 dispatch, combine-window (its
 *               experts write into EXPERT_OUT); twin combine-eo
 *   python-ll   the Python package's LL path at DeepSeek-V3 and each --ll-tokens T: BF16, int64 ids,
 *               combine-fixed (Group.ll_combine's default y_layout="fixed") and combine-pull
 *               (y_layout="in_place_pull"); moe_layer.py itself has no LL path
 *
 * Timing: HT as bench_ht (per iteration: route update, dispatch, [expand], combine, [the backward
 * stages], each between CUDA events, one sync per iteration; median); the dispatch, expand and
 * backward medians pool the iterations of every combine variant of a plan. LL as bench_ll (each
 * operation one captured CUDA graph; medians of event times over back-to-back replays).
 *
 * Bytes (aggregate over the R virtual ranks, i.e. what the one GPU moved). Virtual ranks put the
 * "link" on HBM: a copy that crosses ranks is one HBM read plus one HBM write.
 *   MINIMAL (the headline; zoo_min_dispatch / zoo_min_combine / zoo_min_expand, one function per
 *   stage family): what any implementation must read and write, not what this one chose to:
 *     dispatch  R*T*2H (each token read once) + copies x (row + scales) (each delivered copy
 *               written at its stored size: a quantizing dispatch at its output size); copies:
 *               routed (token, distinct expert) for ht-em and LL, (token, rank) for an ht-rm
 *               dispatch; dispatch+expand: as ht-em (the expert-major rows it delivers);
 *               combine-backward (a dispatch of dy) the same with BF16 rows
 *     combine   routed x combine row (each routed copy's expert output read once) + R*T*2H (one
 *               output row per token written), every variant and layout alike; dispatch-backward
 *               the same + routed x 4 + R*T*K*4 (the router-weight gradient read and written)
 *     expand    ht-rm rows x (row + scales) read + routed x (row + scales) written
 *     Metadata, signals, pad rows and staging copies are choices, not musts.
 *   recv-logical / topk-logical / link: the three conventions of the peers (bench_ht, bench_ll):
 *     every row a rank receives (its own included) / tokens x top-k / rows to another rank, times
 *     the stage's row bytes (dispatch: plan.row_bytes; combine: plan.combine_row_bytes, what
 *     travels back). ht-rm receives one row per (token, destination rank).
 *   HBM: HT "moved", each byte this implementation reads or writes once (bench_ht):
 *     dispatch  R*T*2H (x) + received rows x (row + scales + metadata)
 *     expand    routed (token, k) x 2 x (row + scales) + ht-rm rows x metadata (read)
 *     combine   ht-em pull in place (and combine-window): rows x combine row + R*T*2H (out);
 *               through the buffer (pull or push): rows x (2H + combine row) more (expert side:
 *               read, write); ht-rm: routed x 2H (pre-reduce reads) + ht-rm rows x (2 combine rows
 *               + metadata) + R*T*2H (bench_ht counts ht-rm rows x 2H for the reads: fewer bytes)
 *     backward  combine-backward as a BF16 dispatch; dispatch-backward as a combine through the
 *               buffer plus the router-weight gradient's minimal bytes; dispatch-backward-inplace
 *               as the in-place pull combine (push: as the buffer) plus the same
 *   LL "issued" (bench_ll): dispatch routed x (row + scales + 16) + R*T*2H; combine push (and
 *     fixed) routed x (2H + 2 combine rows + 16) + R*T*2H, pull routed x 2H + R*T*2H; "copy-conv"
 *     (CSV only): 2 x routed x row, bench_ll's copy convention.
 *   Fractions: bytes / time / the D2D copy ceiling measured at the start of this run
 *   (cudaMemcpyAsync of 2 GiB, read + write counted; measured again at the end as a drift check):
 *   min_frac (minimal bytes: the headline, the table's first fraction, the verdicts) and
 *   frac_ceiling (HBM moved / issued, a column).
 *
 * Targets (issue #17; column 'target', 'meets' yes/no/out-of-reach), judged on min_frac: ht-em
 * dispatch >= 80 %; ht-em combine-pull (and combine-window) >= 80 %, combine-eo and combine-mxfp8 >=
 * 70 %; ht-rm dispatch+expand >= 70 % and combine >= 70 %; LL T=128 dispatch and combine >= 70 %;
 * LL T=1 <= 12 us per stage. Application rows carry their stage family's target (combine-backward:
 * the dispatch's; combine-backward+expand: dispatch+expand's; dispatch-backward: combine-eo's;
 * dispatch-backward-inplace: combine-pull's, push combine-eo's).
 * Other rows carry no target ('-'). Missing a target never changes the exit status.
 * Bound (LL fraction rows; columns 'bound', CSV floor_us and bound_frac): the best min_frac any
 *   implementation of the stage reaches on this GPU, data_us / (floor_us + data_us), where
 *   data_us = the row's minimal bytes at the copy ceiling and floor_us = one signal exchange among
 *   the R virtual ranks in a captured graph (epf_bench_floor.cuh; it includes the launch), both
 *   measured in this run: a stage launches, moves its bytes, then signals (after the data). A
 *   missed row whose bound is below its target too says out-of-reach: its bytes are too few for
 *   the target next to the fixed cost, whatever the code.
 *
 * CSV columns: case, model, ranks, tokens, hidden, experts, topk, mode, payload, stage, us,
 * recv_logical_gbs, topk_logical_gbs, link_gbs, hbm_bytes, hbm_gbs, frac_ceiling (HBM moved /
 * issued), copy_conv_frac, ceiling_gbs, target, meets, torch_us, floor_us, bound_frac, min_bytes,
 * min_frac, app (empty for a zoo row) — the last three appended by issue #31.
 *
 * Checks (nothing expensive): every CUDA call and every epf_status_t; after each plan, the error
 * record (any wait timeout, dropped route, receive overflow: the rows say ERROR); LL: rows received
 * == rows routed. A launch a launcher refuses (co-residency, shared memory) is a REFUSED row. Exit
 * status: 0; 1 on any ERROR or REFUSED row or a CUDA failure; 2 bad options; 77 no GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epf_bench.h"
#include "epf_bench_floor.cuh"
#include "epfuse/epfuse.cuh"
#include "epfuse/ht/kernels.cuh"
#include "epfuse/ll/kernels.cuh"

/* ---- the matrix -------------------------------------------------------------------------------- */

typedef struct zoo_model {
  const char* name;
  int H, E, K;
} zoo_model_t;

static const zoo_model_t zoo_models[] = {
    {"deepseek-v3", 7168, 256, 8}, {"kimi-k2", 7168, 384, 8},      {"qwen3-235b", 4096, 128, 8},
    {"qwen3-30b", 2048, 128, 8},   {"gpt-oss-120b", 2880, 128, 4}, {"llama4-maverick", 5120, 128, 1},
    {"mixtral-8x22b", 6144, 8, 2}};
#define ZOO_NMODELS ((int)(sizeof(zoo_models) / sizeof(zoo_models[0])))

static const int zoo_payloads[3] = {EPF_PAYLOAD_BF16, EPF_PAYLOAD_MXFP8, EPF_PAYLOAD_FP8_128};

static const char* zoo_payload_name(int p) {
  return p == EPF_PAYLOAD_MXFP8 ? "mxfp8" : p == EPF_PAYLOAD_FP8_128 ? "fp8" : "bf16";
}

typedef struct zoo_opts {
  int list, iters, reps, ht_tokens, do_ht, do_ll;
  int do_zoo, do_apps, app_tokens; /* the model matrix; the application rows; their HT tokens per rank */
  int ranks[8], nranks, ll_tokens[8], nll;
  int use_model[ZOO_NMODELS];
  const char *csv, *torch;
} zoo_opts_t;

/* ---- rows -------------------------------------------------------------------------------------- */

enum { ZOO_T_NONE = 0, ZOO_T_FRAC = 1, ZOO_T_US = 2 };
enum { ZOO_OK = 0, ZOO_REFUSED = 1, ZOO_ERROR = 2 };

typedef struct zoo_row {
  char name[128];
  char model[24], mode[8], payload[8], stage[32];
  char app[24];                  /* "" for a model-zoo row; else the application it comes from */
  int R, T, H, E, K;
  double us;                     /* median; < 0: not measured (--list) */
  double recv_b, topk_b, link_b; /* bytes per call in the three conventions (0: not applicable) */
  double hbm_b;                  /* HT moved / LL issued bytes: the fraction's numerator */
  double copy_b;                 /* LL copy convention (0 for HT) */
  double min_b;                  /* minimal bytes (zoo_min_*): the headline fraction's numerator */
  int target_kind;
  double target;   /* fraction (ZOO_T_FRAC) or microseconds (ZOO_T_US) */
  int status;      /* ZOO_OK, ZOO_REFUSED, ZOO_ERROR */
  char why[48];    /* the status name behind REFUSED / ERROR */
  double torch_us; /* < 0: no PyTorch baseline */
  double floor_us; /* LL fraction rows: the run's latency floor for R ranks (< 0: none) */
  double bound;    /* LL fraction rows: the best fraction any stage reaches, floor + bytes at the
                      ceiling (< 0: none) */
} zoo_row_t;

static zoo_row_t* g_rows;
static int g_nrows, g_caprows;
static FILE* g_csv;
static double g_ceiling = 0.0; /* GB/s, read + write; 0 in --list */
static double g_budget;        /* bytes one plan may allocate */
static double g_est_s;         /* --list: rough run-time estimate */
static int g_list;
static char** g_torch_key;
static double* g_torch_us;
static int g_ntorch;
static epf_error_record_t *g_rec_h, *g_rec_d;

/* room for n more rows: a function that keeps pointers to its new rows reserves them first, so
 * no zoo_row_new in between moves the array */
static void zoo_rows_reserve(int n) {
  if (g_nrows + n <= g_caprows) return;
  while (g_nrows + n > g_caprows) g_caprows = g_caprows ? 2 * g_caprows : 256;
  g_rows = (zoo_row_t*)realloc(g_rows, sizeof(zoo_row_t) * (size_t)g_caprows);
  if (g_rows == NULL) {
    fprintf(stderr, "bench_zoo: out of host memory\n");
    exit(1);
  }
}

/* a row: <model>/R<ranks>/<mode>/T<tokens>/<payload>/<stage>, or for an application row
 * <app>/<model>/R<ranks>/<mode>/T<tokens>/<tag>/<stage> (tag: the payload and what sets the
 * configuration apart, e.g. fp8-segmn; NULL: the payload's name) */
static zoo_row_t* zoo_row_new(const char* app, const char* tag, const zoo_model_t* m, int R, int T, const char* mode,
                              int payload, const char* stage) {
  zoo_row_t* r;
  zoo_rows_reserve(1);
  r = &g_rows[g_nrows++];
  memset(r, 0, sizeof(*r));
  if (app != NULL)
    snprintf(r->name, sizeof(r->name), "%s/%s/R%d/%s/T%d/%s/%s", app, m->name, R, mode, T,
             tag != NULL ? tag : zoo_payload_name(payload), stage);
  else
    snprintf(r->name, sizeof(r->name), "%s/R%d/%s/T%d/%s/%s", m->name, R, mode, T, zoo_payload_name(payload), stage);
  snprintf(r->app, sizeof(r->app), "%s", app != NULL ? app : "");
  snprintf(r->model, sizeof(r->model), "%s", m->name);
  snprintf(r->mode, sizeof(r->mode), "%s", mode);
  snprintf(r->payload, sizeof(r->payload), "%s", zoo_payload_name(payload));
  snprintf(r->stage, sizeof(r->stage), "%s", stage);
  r->R = R;
  r->T = T;
  r->H = m->H;
  r->E = m->E;
  r->K = m->K;
  r->us = -1.0;
  r->torch_us = -1.0;
  r->floor_us = -1.0;
  r->bound = -1.0;
  return r;
}

static void zoo_target(zoo_row_t* r, int kind, double v) {
  r->target_kind = kind;
  r->target = v;
}

/* ---- minimal bytes (issue #31 §1) ---------------------------------------------------------------
 * What ANY implementation of the stage must read and write, whatever it chose to move; the headline
 * fraction (min_frac = minimal bytes / time / copy ceiling) and every target verdict use it. Sums
 * over the R virtual ranks. Virtual ranks put the "link" on HBM: a copy that crosses ranks costs
 * one HBM read and one HBM write like any other, so each must-byte is counted once where it is
 * read and once where it is written. Metadata, signals, pad rows and staging copies are choices,
 * not musts. One function per stage family; every row's minimum is one of these three: */

/* dispatch (HT either layout, LL; the backward of combine, a dispatch of dy): read every token once
 * as it is given (BF16: 2H bytes) + write every delivered copy at its stored size (payload row +
 * scales: a quantizing dispatch at its output size):
 *   min = tokens x 2H + copies x (row + scales)
 * copies: EXPERT_MAJOR and LL one per (token, distinct expert) = routed; a RANK_MAJOR dispatch
 * delivers one per (token, destination rank). dispatch+expand (RANK_MAJOR) delivers what an
 * EXPERT_MAJOR dispatch does (a row per routed copy at its expert's rank): its minimum is that of
 * the EXPERT_MAJOR dispatch, the rank-major intermediate being the design's choice. */
static double zoo_min_dispatch(double tokens, int H, double copies, double copy_bytes) {
  return tokens * 2.0 * H + copies * copy_bytes;
}

/* combine (HT every variant and layout, LL; the backward of dispatch, a unit-weight combine of the
 * dx rows): read the expert output of every routed copy once at the combine row size (the K rows a
 * token needs; a repeated expert is one copy) + write one BF16 output row per token:
 *   min = routed x crow + tokens x 2H (+ extra: the router-weight gradient of the backward of
 *         dispatch, one FP32 read per routed copy + tokens x K FP32 written)
 * Where the expert outputs sit (in place, a separate buffer, the window) and who moves them
 * (pull, push, a rank-major pre-reduce) is the implementation's choice, so every combine variant
 * of a shape has the same minimum. */
static double zoo_min_combine(double routed, double crow, double tokens, int H, double extra) {
  return routed * crow + tokens * 2.0 * H + extra;
}

/* expand (HT RANK_MAJOR, local): write its output rows (one per routed copy, row + scales) + read
 * their source rows once (one per (token, destination rank)):
 *   min = rm_rows x (row + scales) + routed x (row + scales) */
static double zoo_min_expand(double src_rows, double out_rows, double row_bytes) {
  return src_rows * row_bytes + out_rows * row_bytes;
}

static double zoo_frac_of(const zoo_row_t* r, double bytes) {
  if (r->us <= 0.0 || g_ceiling <= 0.0 || r->status != ZOO_OK || bytes <= 0.0) return -1.0;
  return bytes / (r->us * 1e3) / g_ceiling;
}

/* the headline: minimal bytes / time / ceiling; < 0 when not measured */
static double zoo_min_frac(const zoo_row_t* r) { return zoo_frac_of(r, r->min_b); }

/* the implementation's own bytes (HT moved / LL issued) / time / ceiling, a column */
static double zoo_frac(const zoo_row_t* r) { return zoo_frac_of(r, r->hbm_b); }

static double zoo_gbs(double bytes, double us) { return us > 0.0 && bytes > 0.0 ? bytes / (us * 1e3) : -1.0; }

/* yes / no, or out-of-reach: missed, and the row's bound (its latency floor plus its bytes at
 * the copy ceiling, both measured in this run) is below the target too: no implementation of the
 * stage on this GPU meets it, so the row carries that explanation instead */
static const char* zoo_meets(const zoo_row_t* r) {
  if (r->status == ZOO_REFUSED) return "REFUSED";
  if (r->status == ZOO_ERROR) return "ERROR";
  if (r->us < 0.0 || r->target_kind == ZOO_T_NONE) return "-";
  if (r->target_kind == ZOO_T_US) return r->us <= r->target ? "yes" : "no";
  if (zoo_min_frac(r) >= r->target) return "yes";
  return r->bound >= 0.0 && r->bound < r->target ? "out-of-reach" : "no";
}

/* The run's latency floor per rank count (epf_bench_floor.cuh: one signal exchange among the R
 * virtual ranks, the T = 1 grid of 2 blocks of 512 threads per rank: the smallest grid, so the
 * lowest floor and the most generous bound). Measured once per R, before its first LL row. */
static int g_floor_R[16], g_nfloor;
static double g_floor_us[16];

static double zoo_ll_floor_us(int R, int reps) {
  int i;
  double empty_us, signal_us;
  for (i = 0; i < g_nfloor; ++i)
    if (g_floor_R[i] == R) return g_floor_us[i];
  if (epf_bench_latency_floor(R, 2, 512, reps, &empty_us, &signal_us) != 0) {
    fprintf(stderr, "bench_zoo: the latency floor's signal exchange failed at R%d: no bound\n", R);
    signal_us = -1.0;
  } else {
    fprintf(stderr, "[ll] latency floor R%d: empty kernel %.2f us, one .sys signal exchange %.2f us\n", R, empty_us,
            signal_us);
  }
  if (g_nfloor < 16) {
    g_floor_R[g_nfloor] = R;
    g_floor_us[g_nfloor++] = signal_us;
  }
  return signal_us;
}

/* a measured LL fraction row's bound: its minimal bytes at the ceiling after the floor, over that
 * time (the same bytes as its min_frac, so the bound is the best min_frac any stage reaches) */
static void zoo_ll_bound(zoo_row_t* r, double floor_us) {
  double data_us;
  if (r->target_kind != ZOO_T_FRAC || floor_us < 0.0 || g_ceiling <= 0.0) return;
  data_us = r->min_b / (g_ceiling * 1e3);
  r->floor_us = floor_us;
  r->bound = data_us / (floor_us + data_us);
}

static void zoo_target_str(const zoo_row_t* r, char* s, size_t n) {
  if (r->target_kind == ZOO_T_FRAC) snprintf(s, n, ">=%.0f%%", 100.0 * r->target);
  else if (r->target_kind == ZOO_T_US) snprintf(s, n, "<=%.0fus", r->target);
  else snprintf(s, n, "-");
}

/* a number or an empty CSV field */
static void zoo_csv_num(FILE* f, double v, const char* fmt) {
  if (v >= 0.0) fprintf(f, fmt, v);
  fputc(',', f);
}

static void zoo_csv_header(FILE* f) {
  fprintf(f, "case,model,ranks,tokens,hidden,experts,topk,mode,payload,stage,us,recv_logical_gbs,topk_logical_gbs,"
             "link_gbs,hbm_bytes,hbm_gbs,frac_ceiling,copy_conv_frac,ceiling_gbs,target,meets,torch_us,floor_us,bound_frac,"
             "min_bytes,min_frac,app\n");
}

static void zoo_csv_row(FILE* f, const zoo_row_t* r) {
  char tgt[16];
  const double us = r->status == ZOO_OK ? r->us : -1.0;
  zoo_target_str(r, tgt, sizeof(tgt));
  fprintf(f, "%s,%s,%d,%d,%d,%d,%d,%s,%s,%s,", r->name, r->model, r->R, r->T, r->H, r->E, r->K, r->mode, r->payload,
          r->stage);
  zoo_csv_num(f, us, "%.2f");
  zoo_csv_num(f, zoo_gbs(r->recv_b, us), "%.1f");
  zoo_csv_num(f, zoo_gbs(r->topk_b, us), "%.1f");
  zoo_csv_num(f, zoo_gbs(r->link_b, us), "%.1f");
  fprintf(f, "%.0f,", r->hbm_b);
  zoo_csv_num(f, zoo_gbs(r->hbm_b, us), "%.1f");
  zoo_csv_num(f, zoo_frac(r), "%.4f");
  zoo_csv_num(f, r->copy_b > 0.0 && us > 0.0 && g_ceiling > 0.0 ? r->copy_b / (us * 1e3) / g_ceiling : -1.0, "%.4f");
  zoo_csv_num(f, g_ceiling > 0.0 ? g_ceiling : -1.0, "%.1f");
  fprintf(f, "%s,%s%s%s,", tgt, zoo_meets(r), r->why[0] ? ":" : "", r->why);
  zoo_csv_num(f, r->torch_us, "%.2f");
  zoo_csv_num(f, r->floor_us, "%.2f");
  zoo_csv_num(f, r->bound, "%.4f");
  fprintf(f, "%.0f,", r->min_b);
  zoo_csv_num(f, zoo_min_frac(r), "%.4f");
  fprintf(f, "%s\n", r->app);
}

static void zoo_torch_join(zoo_row_t* r) {
  int i;
  for (i = 0; i < g_ntorch; ++i)
    if (!strcmp(g_torch_key[i], r->name)) r->torch_us = g_torch_us[i];
}

/* a row is complete: join the baseline, append it to the CSV, say it on stderr */
static void zoo_row_done(zoo_row_t* r) {
  zoo_torch_join(r);
  if (g_csv != NULL) {
    zoo_csv_row(g_csv, r);
    fflush(g_csv);
  }
  if (!g_list) {
    const double f = zoo_min_frac(r), fh = zoo_frac(r);
    fprintf(stderr, "    %-64s %10.1f us  min %6.1f%%  moved %6.1f%%  %s%s%s\n", r->name, r->us, f >= 0.0 ? 100.0 * f : 0.0,
            fh >= 0.0 ? 100.0 * fh : 0.0, zoo_meets(r), r->why[0] ? " " : "", r->why);
  }
}

static void zoo_rows_fail(zoo_row_t* rows, int n, int status, const char* why) {
  int i;
  for (i = 0; i < n; ++i) {
    rows[i].status = status;
    snprintf(rows[i].why, sizeof(rows[i].why), "%s", why);
  }
}

static void zoo_load_torch(const char* path) {
  char line[512];
  FILE* f = fopen(path, "r");
  if (f == NULL) {
    fprintf(stderr, "bench_zoo: cannot read %s\n", path);
    exit(2);
  }
  while (fgets(line, sizeof(line), f)) {
    char* comma = strchr(line, ',');
    char* end;
    double v;
    if (line[0] == '#' || comma == NULL || !strncmp(line, "case,", 5)) continue;
    *comma = '\0';
    v = strtod(comma + 1, &end);
    if (end == comma + 1) continue;
    g_torch_key = (char**)realloc(g_torch_key, sizeof(char*) * (size_t)(g_ntorch + 1));
    g_torch_us = (double*)realloc(g_torch_us, sizeof(double) * (size_t)(g_ntorch + 1));
    g_torch_key[g_ntorch] = strdup(line);
    g_torch_us[g_ntorch] = v;
    ++g_ntorch;
  }
  fclose(f);
  fprintf(stderr, "bench_zoo: %d PyTorch baselines from %s\n", g_ntorch, path);
}

/* ---- small CUDA helpers ------------------------------------------------------------------------ */

static void* zoo_malloc(size_t bytes) {
  void* p = NULL;
  if (bytes == 0) return NULL;
  EPF_BENCH_CUDA(cudaMalloc(&p, bytes));
  return p;
}

static void zoo_free(void* p) {
  if (p != NULL) EPF_BENCH_CUDA(cudaFree(p));
}

static void zoo_fill(void* p, size_t elems, uint32_t seed) {
  if (p == NULL) return;
  epf_bench_fill_bf16<<<1024, 256>>>((uint16_t*)p, elems, seed);
  EPF_BENCH_CUDA(cudaGetLastError());
}

/* the error record after a plan's runs (device synchronized): "" when clean, else the reason */
static const char* zoo_record_problem(void) {
  epf_error_record_t rec;
  epf_error_read(g_rec_h, &rec);
  if (rec.status != 0u || rec.count != 0u) return epf_status_name((epf_status_t)rec.status);
  if (rec.recv_overflow != 0u) return "recv_overflow";
  if (rec.dropped_routes != 0u) return "dropped_routes";
  return "";
}

/* ---- HT ---------------------------------------------------------------------------------------- */

/* what the host routing implies for each layout (totals over all ranks) */
typedef struct zoo_ht_stats {
  int64_t valid;                    /* routed (token, k) */
  int64_t em_rows, em_max, em_link; /* EXPERT_MAJOR: rows received, most on one rank, crossing ranks */
  int64_t rm_rows, rm_max, rm_link; /* RANK_MAJOR: one row per (token, destination rank) */
} zoo_ht_stats_t;

static void zoo_ht_stats(const int32_t* topk, int R, int T, int K, int E, zoo_ht_stats_t* s) {
  const int EL = E / R;
  int64_t* em = (int64_t*)calloc((size_t)R, 8);
  int64_t* rm = (int64_t*)calloc((size_t)R, 8);
  int64_t i;
  int r;
  memset(s, 0, sizeof(*s));
  for (i = 0; i < (int64_t)R * T; ++i) {
    const int src = (int)(i / T);
    unsigned char seen[EPF_MAX_RANKS];
    int k;
    memset(seen, 0, sizeof(seen));
    for (k = 0; k < K; ++k) {
      const int e = topk[i * K + k];
      int d;
      if (e < 0 || e >= E) continue;
      d = e / EL;
      ++s->valid;
      ++em[d];
      s->em_link += d != src;
      if (!seen[d]) {
        seen[d] = 1;
        ++rm[d];
        s->rm_link += d != src;
      }
    }
  }
  for (r = 0; r < R; ++r) {
    s->em_rows += em[r];
    s->rm_rows += rm[r];
    if (em[r] > s->em_max) s->em_max = em[r];
    if (rm[r] > s->rm_max) s->rm_max = rm[r];
  }
  free(em);
  free(rm);
}

/* EXPERT_MAJOR receive rows of the fullest rank when every local expert's segment is padded to
 * `align` rows (what examples/05 sizes its recv_capacity from) */
static int64_t zoo_ht_em_max_aligned(const int32_t* topk, int R, int T, int K, int E, int align) {
  const int EL = E / R;
  int64_t* cnt = (int64_t*)calloc((size_t)E, 8);
  int64_t i, best = 0;
  int d, le;
  for (i = 0; i < (int64_t)R * T * K; ++i)
    if (topk[i] >= 0 && topk[i] < E) ++cnt[topk[i]];
  for (d = 0; d < R; ++d) {
    int64_t rows = 0;
    for (le = 0; le < EL; ++le) rows += (cnt[d * EL + le] + align - 1) / align * align;
    if (rows > best) best = rows;
  }
  free(cnt);
  return best;
}

/* the model's shape at R ranks and T tokens per rank; everything else at its default */
static epf_config_t zoo_config(const zoo_model_t* m, int R, int T) {
  epf_config_t cfg = EPF_CONFIG_INIT;
  cfg.nranks = R;
  cfg.num_experts = m->E;
  cfg.top_k = m->K;
  cfg.hidden = m->H;
  cfg.max_tokens_per_rank = T;
  return cfg;
}

/* the combine variants a plan runs, each its own series of iterations */
enum {
  ZOO_CV_PULL = 0,  /* combine-pull: expert_out NULL, the outputs in place over the received BF16 rows */
  ZOO_CV_EO = 1,    /* combine-eo (combine-mxfp8): a separate expert-output buffer [R][expert_rows][H] */
  ZOO_CV_WINDOW = 2 /* combine-window: the outputs already in the window's EXPERT_OUT rows (where a GEMM
                       may write them, epf_plan_expert_out_offset): expert_out = that region, the
                       virtual ranks' stride a multiple of the combine row, so the put is skipped */
};

/* One HT plan of the matrix or of an application: its configuration and what runs on it. */
typedef struct zoo_ht_spec {
  const char* app;       /* NULL: a model-zoo row; else the application (row name prefix, CSV app) */
  const char* tag;       /* the payload field of an application row's name (NULL: the payload) */
  int layout, payload, cpayload;
  int scale_layout;      /* 0: COMPACT */
  int align;             /* expert_alignment (0: 1) */
  uint32_t flags;        /* EPF_FLAG_COMBINE_PUSH or 0 */
  int index_type;        /* EPF_INDEX_INT32 / EPF_INDEX_INT64: the routing ids */
  int64_t recv_capacity; /* 0: the zoo's (most rows a rank receives + 64); -1: the library's worst case */
  int64_t expert_rows;   /* rows per rank of expert_out / the view; 0: zoo_ht_expert_rows's rule */
  int dispatch_rows;     /* rows for the dispatch (and RANK_MAJOR expand) */
  int nvar, var[3];      /* the combine variants (ZOO_CV_*), in order */
  int backward;          /* the training stages after each forward (examples/06): combine_backward
                            (+ expand) and dispatch_backward with the router-weight gradient */
  int bwd_in_place;      /* with backward, EXPERT_MAJOR BF16: every other iteration's dispatch_backward
                            reads the dx rows in place (expert_out = NULL: examples/06 --dx-out
                            window), the others through the buffer: row dispatch-backward-inplace */
} zoo_ht_spec_t;

/* a model-zoo plan: BF16 combine: dispatch rows, pull in place (EXPERT_MAJOR BF16 only) and the
 * buffer; MXFP8 combine: combine-mxfp8 (through the buffer) only */
static zoo_ht_spec_t zoo_spec(int layout, int payload, int cpayload) {
  zoo_ht_spec_t sp;
  memset(&sp, 0, sizeof(sp));
  sp.layout = layout;
  sp.payload = payload;
  sp.cpayload = cpayload;
  sp.index_type = EPF_INDEX_INT32;
  sp.dispatch_rows = cpayload == EPF_PAYLOAD_BF16;
  if (cpayload == EPF_PAYLOAD_BF16 && layout == EPF_LAYOUT_EXPERT_MAJOR && payload == EPF_PAYLOAD_BF16)
    sp.var[sp.nvar++] = ZOO_CV_PULL;
  sp.var[sp.nvar++] = ZOO_CV_EO;
  return sp;
}

static epf_config_t zoo_ht_config(const zoo_model_t* m, int R, int T, const zoo_ht_spec_t* sp, const zoo_ht_stats_t* s) {
  epf_config_t cfg = zoo_config(m, R, T);
  cfg.layout = sp->layout;
  cfg.payload = sp->payload;
  cfg.combine_payload = sp->cpayload;
  cfg.scale_layout = sp->scale_layout;
  cfg.expert_alignment = sp->align;
  cfg.flags = sp->flags;
  cfg.recv_capacity = sp->recv_capacity > 0   ? sp->recv_capacity
                      : sp->recv_capacity < 0 ? 0
                                              : (sp->layout == EPF_LAYOUT_RANK_MAJOR ? s->rm_max : s->em_max) + 64;
  return cfg;
}

/* rows per rank of the expert-output buffer / expert-major view */
static int64_t zoo_ht_expert_rows(const epf_plan_t* plan, const zoo_ht_stats_t* s, const zoo_ht_spec_t* sp) {
  /* EXPERT_MAJOR: one per receive row (the combine requires recv_capacity); RANK_MAJOR: the view
   * holds one row per (token, local expert) copy: at most em_max on a rank (alignment 1) */
  if (sp->expert_rows > 0) return sp->expert_rows;
  return plan->layout == EPF_LAYOUT_RANK_MAJOR ? s->em_max + plan->experts_per_rank + 64 : plan->recv_capacity;
}

static uint64_t zoo_gcd(uint64_t a, uint64_t b) {
  while (b != 0u) {
    const uint64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

/* the virtual ranks' window stride: plan.total_bytes, or with a combine-window variant the next
 * multiple of lcm(EPF_ALIGN, combine row), so that rank d's EXPERT_OUT row r is row
 * d * (stride / crow) + r of one [R][stride / crow][H] expert_out array starting at rank 0's
 * EXPERT_OUT: the ready-made combine's per-rank expert_out then IS the window (nothing is put) */
static uint64_t zoo_ht_stride(const epf_plan_t* plan, const zoo_ht_spec_t* sp) {
  const uint64_t crow = plan->combine_row_bytes;
  uint64_t l;
  int v;
  for (v = 0; v < sp->nvar && sp->var[v] != ZOO_CV_WINDOW; ++v) {
  }
  if (v == sp->nvar) return plan->total_bytes;
  l = (uint64_t)EPF_ALIGN / zoo_gcd((uint64_t)EPF_ALIGN, crow) * crow;
  return (plan->total_bytes + l - 1u) / l * l;
}

static int zoo_ht_has(const zoo_ht_spec_t* sp, int var) {
  int v;
  for (v = 0; v < sp->nvar; ++v)
    if (sp->var[v] == var) return 1;
  return 0;
}

/* device bytes of one plan's run, the group's inputs included */
static double zoo_ht_plan_bytes(const epf_plan_t* plan, const zoo_ht_stats_t* s, int T, const zoo_ht_spec_t* sp) {
  const double R = plan->nranks, H = plan->hidden, K = plan->top_k;
  const double er = (double)zoo_ht_expert_rows(plan, s, sp);
  const double ib = sp->index_type == EPF_INDEX_INT64 ? 8.0 : 4.0;
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  uint64_t rbytes = 0;
  double b = R * (double)zoo_ht_stride(plan, sp) + R * T * (K * (4.0 + ib) + 2.0 * 2.0 * H);
  rc.index_type = sp->index_type;
  if (epf_route_size(plan, &rc, &rbytes) == EPF_OK) b += R * (double)rbytes;
  b += R * er * 2.0 * H; /* expert outputs */
  if (plan->layout == EPF_LAYOUT_RANK_MAJOR) b += R * er * ((double)plan->row_bytes + plan->scale_bytes_per_row);
  if (sp->backward) b += R * T * (2.0 * 2.0 * H + K * 4.0) + R * er * (2.0 * H + 4.0); /* dy, dx, d w; dx rows, w grads */
  return b;
}

typedef struct zoo_ht_in {
  int32_t* topk;   /* device [R][T][K] */
  int64_t* topk64; /* the same ids as int64 (NULL unless a plan of the group takes them) */
  float* w;        /* device [R][T][K] */
  void* x;         /* device [R][T][H] BF16 */
  void* out;       /* device [R][T][H] BF16 */
} zoo_ht_in_t;

static cudaEvent_t g_ev[8];

/* "app " for an application plan's messages */
static const char* zoo_app_prefix(const char* app, char* buf, size_t n) {
  snprintf(buf, n, "%s%s", app != NULL ? app : "", app != NULL ? " " : "");
  return buf;
}

/* One plan: its rows, and with a GPU its run. Per iteration (bench_ht): route update, dispatch,
 * [expand], combine (the variant of the series), then with spec->backward combine_backward,
 * [expand], dispatch_backward — each between CUDA events, one sync per iteration; each variant
 * iters + 3 iterations, the first 3 untimed; dispatch / expand / backward medians pool the series. */
static void zoo_ht_plan(const zoo_opts_t* o, const zoo_model_t* m, int R, int T, const zoo_ht_stats_t* s,
                        const zoo_ht_in_t* in, const zoo_ht_spec_t* spec) {
  zoo_ht_spec_t sp = *spec; /* its variants filtered below */
  const int rm = sp.layout == EPF_LAYOUT_RANK_MAJOR;
  const char* mode = rm ? "ht-rm" : "ht-em";
  const epf_config_t cfg = zoo_ht_config(m, R, T, &sp, s);
  const double H2 = 2.0 * m->H, RT = (double)R * T, valid = (double)s->valid;
  epf_plan_t plan;
  epf_status_t st = epf_plan_compute(&cfg, &plan);
  int v, n, first, nrows;
  zoo_row_t *rd = NULL, *re = NULL, *rde = NULL, *rc[3] = {NULL, NULL, NULL}, *rcb = NULL, *rcbe = NULL, *rdb = NULL,
            *rdbi = NULL;
  double row, sc, meta, crow, rows, link, wgrad;
  char pre[32];
  const char* tag = sp.tag != NULL ? sp.tag : zoo_payload_name(sp.payload);
  zoo_app_prefix(sp.app, pre, sizeof(pre));
  if (st != EPF_OK) {
    fprintf(stderr, "  skip %s%s R%d %s %s combine %s: epf_plan_compute -> %s\n", pre, m->name, R, mode, tag,
            zoo_payload_name(sp.cpayload), epf_status_name(st));
    return;
  }
  for (v = n = 0; v < sp.nvar; ++v) {
    if (sp.var[v] == ZOO_CV_PULL && (rm || plan.payload != EPF_PAYLOAD_BF16 || plan.combine_payload != EPF_PAYLOAD_BF16)) {
      fprintf(stderr, "  skip %s%s R%d %s %s combine-pull: in place needs EXPERT_MAJOR BF16 both ways\n", pre, m->name, R,
              mode, tag);
      continue;
    }
    if (sp.var[v] == ZOO_CV_WINDOW && (plan.region[EPF_REGION_EXPERT_OUT].bytes == 0u ||
                                       plan.combine_payload != EPF_PAYLOAD_BF16 || (plan.flags & EPF_FLAG_COMBINE_PUSH))) {
      fprintf(stderr, "  skip %s%s R%d %s %s combine-window: the plan has no BF16 EXPERT_OUT rows to pull from\n", pre,
              m->name, R, mode, tag);
      continue;
    }
    sp.var[n++] = sp.var[v];
  }
  sp.nvar = n;
  if (sp.nvar == 0) return;
  row = plan.row_bytes;
  sc = plan.scale_bytes_per_row;
  meta = plan.meta_bytes_per_row;
  crow = plan.combine_row_bytes;
  rows = (double)(rm ? s->rm_rows : s->em_rows);
  link = (double)(rm ? s->rm_link : s->em_link);
  /* the router-weight gradient of the backward of dispatch: one FP32 per routed copy read, one per
   * (token, k) written (both in the minimum; the moved count adds it as it is) */
  wgrad = valid * 4.0 + RT * m->K * 4.0;
  zoo_rows_reserve(10); /* the row pointers stay valid to the end of this function */

  first = g_nrows;
  if (sp.dispatch_rows) {
    rd = zoo_row_new(sp.app, sp.tag, m, R, T, mode, sp.payload, "dispatch");
    rd->recv_b = rows * row;
    rd->topk_b = valid * row;
    rd->link_b = link * row;
    rd->hbm_b = RT * H2 + rows * (row + sc + meta);
    rd->min_b = zoo_min_dispatch(RT, m->H, rows, row + sc);
    if (!rm) zoo_target(rd, ZOO_T_FRAC, 0.80);
    if (rm) {
      re = zoo_row_new(sp.app, sp.tag, m, R, T, mode, sp.payload, "expand");
      re->hbm_b = valid * 2.0 * (row + sc) + rows * meta;
      re->min_b = zoo_min_expand(rows, valid, row + sc);
      rde = zoo_row_new(sp.app, sp.tag, m, R, T, mode, sp.payload, "dispatch+expand");
      rde->recv_b = rd->recv_b;
      rde->topk_b = rd->topk_b;
      rde->link_b = rd->link_b;
      rde->hbm_b = rd->hbm_b + re->hbm_b;
      rde->min_b = zoo_min_dispatch(RT, m->H, valid, row + sc); /* what an EXPERT_MAJOR dispatch delivers */
      zoo_target(rde, ZOO_T_FRAC, 0.70);
    }
  }
  for (v = 0; v < sp.nvar; ++v) {
    const int var = sp.var[v];
    zoo_row_t* r = rc[v] = zoo_row_new(sp.app, sp.tag, m, R, T, mode, sp.payload,
                                       sp.cpayload == EPF_PAYLOAD_MXFP8 ? "combine-mxfp8"
                                       : var == ZOO_CV_PULL             ? "combine-pull"
                                       : var == ZOO_CV_WINDOW           ? "combine-window"
                                                                        : "combine-eo");
    r->recv_b = rows * crow;
    r->topk_b = valid * crow;
    r->link_b = link * crow;
    if (rm) /* pre-reduce: every (token, k) output read, one partial written and read per row */
      r->hbm_b = valid * H2 + rows * (2.0 * crow + meta) + RT * H2;
    else /* through the buffer: the expert side reads each output and puts (or pushes) a combine row */
      r->hbm_b = rows * crow + RT * H2 + (var == ZOO_CV_EO ? rows * (H2 + crow) : 0.0);
    r->min_b = zoo_min_combine(valid, crow, RT, m->H, 0.0);
    zoo_target(r, ZOO_T_FRAC, !rm && var != ZOO_CV_EO ? 0.80 : 0.70);
  }
  if (sp.backward) { /* BF16 plans (the launchers refuse others): row = crow = 2H */
    rcb = zoo_row_new(sp.app, sp.tag, m, R, T, mode, sp.payload, "combine-backward");
    rcb->recv_b = rows * row;
    rcb->topk_b = valid * row;
    rcb->link_b = link * row;
    rcb->hbm_b = RT * H2 + rows * (row + meta);
    rcb->min_b = zoo_min_dispatch(RT, m->H, rows, row);
    if (!rm) zoo_target(rcb, ZOO_T_FRAC, 0.80); /* a dispatch: the dispatch's target */
    if (rm) {
      rcbe = zoo_row_new(sp.app, sp.tag, m, R, T, mode, sp.payload, "combine-backward+expand");
      rcbe->recv_b = rcb->recv_b;
      rcbe->topk_b = rcb->topk_b;
      rcbe->link_b = rcb->link_b;
      rcbe->hbm_b = rcb->hbm_b + valid * 2.0 * row + rows * meta;
      rcbe->min_b = zoo_min_dispatch(RT, m->H, valid, row);
      zoo_target(rcbe, ZOO_T_FRAC, 0.70);
    }
    rdb = zoo_row_new(sp.app, sp.tag, m, R, T, mode, sp.payload, "dispatch-backward");
    rdb->recv_b = rows * crow;
    rdb->topk_b = valid * crow;
    rdb->link_b = link * crow;
    rdb->hbm_b = (rm ? valid * H2 + rows * (2.0 * crow + meta) : rows * crow + rows * (H2 + crow)) + RT * H2 + wgrad;
    rdb->min_b = zoo_min_combine(valid, crow, RT, m->H, wgrad);
    zoo_target(rdb, ZOO_T_FRAC, 0.70); /* a combine through a buffer (the dx rows): its target */
    if (sp.bwd_in_place && !rm) { /* the dx rows over the receive rows (expert_out = NULL) */
      const int push = (plan.flags & EPF_FLAG_COMBINE_PUSH) != 0u;
      rdbi = zoo_row_new(sp.app, sp.tag, m, R, T, mode, sp.payload, "dispatch-backward-inplace");
      rdbi->recv_b = rdb->recv_b;
      rdbi->topk_b = rdb->topk_b;
      rdbi->link_b = rdb->link_b;
      /* pull: nothing put, the sources read every row where it is (+ the router-weight gradient);
       * push: the expert side reads the receive row instead of the buffer's, the same bytes */
      rdbi->hbm_b = push ? rdb->hbm_b : rows * crow + RT * H2 + wgrad;
      rdbi->min_b = rdb->min_b; /* the minimum of a stage does not depend on where its rows are */
      zoo_target(rdbi, ZOO_T_FRAC, push ? 0.70 : 0.80); /* an in-place pull combine's target; push: a buffer's */
    }
  }
  nrows = g_nrows - first;

  if (g_list) {
    const double bytes = zoo_ht_plan_bytes(&plan, s, T, &sp);
    double per_iter = 0.0;
    int i;
    for (i = first; i < g_nrows; ++i) {
      char tgt[16];
      zoo_target_str(&g_rows[i], tgt, sizeof(tgt));
      printf("%-68s min %11.3f MB  HBM %11.3f MB  target %-7s\n", g_rows[i].name, g_rows[i].min_b / 1e6,
             g_rows[i].hbm_b / 1e6, tgt);
      if (strchr(g_rows[i].stage, '+') == NULL) per_iter += g_rows[i].hbm_b;
    }
    printf("    plan: window %.2f GB x %d ranks, recv_capacity %lld, alignment %d, device memory %.2f GB%s\n",
           zoo_ht_stride(&plan, &sp) / 1e9, R, (long long)plan.recv_capacity, plan.expert_alignment, bytes / 1e9,
           bytes > g_budget ? "  ** over the memory budget **" : "");
    /* rough: every variant runs iters + 3 rounds at ~2/3 of a 4 TB/s ceiling, plus set-up */
    g_est_s += sp.nvar * (o->iters + 3) * per_iter / (0.66 * 4.0e12) + 0.05 + bytes / 2.0e12;
    for (i = first; i < g_nrows; ++i) zoo_row_done(&g_rows[i]);
    return;
  }

  {
    const int64_t expert_rows = zoo_ht_expert_rows(&plan, s, &sp);
    const uint64_t stride = zoo_ht_stride(&plan, &sp);
    const uint64_t eo_off = plan.region[EPF_REGION_EXPERT_OUT].offset;
    const int total = o->iters + 3, ntot = sp.nvar * total;
    const void* topk = sp.index_type == EPF_INDEX_INT64 ? (const void*)in->topk64 : (const void*)in->topk;
    char* win = (char*)zoo_malloc((size_t)R * stride);
    epf_team_t team = epf_team_virtual(win, stride, 0, R);
    epf_route_config_t rcfg = EPF_ROUTE_CONFIG_INIT;
    uint64_t rbytes = 0;
    void* rbuf;
    epf_route_t route;
    epf_ht_state_t* state;
    void *eo = NULL, *view = NULL, *view_sc = NULL, *dy = NULL, *dx = NULL, *dxr = NULL;
    float *wg = NULL, *dtw = NULL;
    epf_route_step_t rs;
    epf_ht_step_t hs, bs;
    float* t[6]; /* dispatch, expand, combine-backward, its expand, dispatch-backward (buffer, in place): pooled */
    float* tc[3];
    int nt[6] = {0, 0, 0, 0, 0, 0}, nc[3] = {0, 0, 0}, i;
    const char* problem = "";
    char why[48] = "";
    for (i = 0; i < 6; ++i) t[i] = (float*)malloc(sizeof(float) * (size_t)ntot);
    for (i = 0; i < 3; ++i) tc[i] = (float*)malloc(sizeof(float) * (size_t)total);
    EPF_BENCH_CUDA(cudaMemset(win, 0, (size_t)R * stride));
    if (zoo_ht_has(&sp, ZOO_CV_WINDOW)) /* the "GEMM outputs" where the GEMM wrote them */
      for (i = 0; i < R; ++i) zoo_fill(win + (uint64_t)i * stride + eo_off, (size_t)plan.recv_capacity * m->H, 7u + (uint32_t)i);
    rcfg.index_type = sp.index_type;
    EPF_BENCH_OK(epf_route_size(&plan, &rcfg, &rbytes));
    rbuf = zoo_malloc((size_t)rbytes * R);
    EPF_BENCH_OK(epf_route_init(&plan, &rcfg, rbuf, rbytes * R, R, 1u, 0, &route));
    state = (epf_ht_state_t*)zoo_malloc((size_t)R * sizeof(epf_ht_state_t));
    EPF_BENCH_CUDA(cudaMemset(state, 0, (size_t)R * sizeof(epf_ht_state_t)));
    if (zoo_ht_has(&sp, ZOO_CV_EO)) {
      eo = zoo_malloc((size_t)R * expert_rows * m->H * 2);
      zoo_fill(eo, (size_t)R * expert_rows * m->H, 7u);
    }
    if (rm) {
      view = zoo_malloc((size_t)R * expert_rows * plan.row_bytes);
      if (plan.scale_bytes_per_row != 0u) view_sc = zoo_malloc((size_t)R * expert_rows * plan.scale_bytes_per_row);
    }
    if (sp.backward) { /* dy in; dx rows and their router-weight gradients from "the experts"; dx, d w out */
      dy = zoo_malloc((size_t)R * T * m->H * 2);
      dx = zoo_malloc((size_t)R * T * m->H * 2);
      dxr = zoo_malloc((size_t)R * expert_rows * m->H * 2);
      wg = (float*)zoo_malloc((size_t)R * expert_rows * 4);
      dtw = (float*)zoo_malloc((size_t)R * T * m->K * 4);
      zoo_fill(dy, (size_t)R * T * m->H, 3u);
      zoo_fill(dxr, (size_t)R * expert_rows * m->H, 5u);
      EPF_BENCH_CUDA(cudaMemset(wg, 0, (size_t)R * expert_rows * 4));
    }
    EPF_BENCH_CUDA(cudaDeviceSynchronize());
    epf_error_clear(g_rec_h);
    rs = epf_route_step_make(topk, T, epf_wait_make(plan.timeout_ns, g_rec_d, NULL, 0));
    {
      const epf_ht_step_t init = EPF_HT_STEP_INIT;
      hs = init;
    }
    hs.x = in->x;
    hs.topk_weights = in->w;
    hs.out = in->out;
    hs.em_view = view;
    hs.em_view_scales = view_sc;
    hs.state = state;
    hs.expert_rows = expert_rows;
    hs.wait = epf_wait_make(plan.timeout_ns, g_rec_d, NULL, 0);
    bs = hs; /* examples/06: the backward step is the forward's with these operands */
    bs.x = dy;
    bs.topk_idx = topk;
    bs.expert_out = dxr; /* every other iteration NULL with bwd_in_place (below) */
    bs.out = dx;
    bs.weight_grad = wg;
    bs.topk_weights_grad = dtw;

    for (v = 0; v < sp.nvar && !why[0]; ++v) {
      const int var = sp.var[v];
      hs.expert_out = var == ZOO_CV_PULL ? NULL : var == ZOO_CV_EO ? eo : (const void*)(win + eo_off);
      hs.expert_rows = var == ZOO_CV_WINDOW ? (int64_t)(stride / plan.combine_row_bytes) : expert_rows;
      for (i = 0; i < total && !why[0]; ++i) {
        float ms[7];
        int j;
        EPF_BENCH_CUDA(cudaEventRecord(g_ev[0]));
        st = epf_route_update(&route, team, &plan, &rs, 0);
        EPF_BENCH_CUDA(cudaEventRecord(g_ev[1]));
        if (st == EPF_OK) st = epf_ht_dispatch(&route, team, &plan, &hs, topk, EPF_HT_SEND | EPF_HT_RECV, 0);
        EPF_BENCH_CUDA(cudaEventRecord(g_ev[2]));
        if (st == EPF_OK && rm) st = epf_ht_expand(&route, team, &plan, &hs, 0);
        EPF_BENCH_CUDA(cudaEventRecord(g_ev[3]));
        if (st == EPF_OK) st = epf_ht_combine(&route, team, &plan, &hs, topk, 0);
        EPF_BENCH_CUDA(cudaEventRecord(g_ev[4]));
        if (sp.backward) { /* over the same route, no update in between (docs/high-throughput.md "Training") */
          if (st == EPF_OK) st = epf_ht_combine_backward(&route, team, &plan, &bs, EPF_HT_BOTH, 0);
          EPF_BENCH_CUDA(cudaEventRecord(g_ev[5]));
          if (st == EPF_OK && rm) st = epf_ht_expand(&route, team, &plan, &bs, 0);
          EPF_BENCH_CUDA(cudaEventRecord(g_ev[6]));
          bs.expert_out = rdbi != NULL && (i & 1) ? NULL : dxr; /* in place: the receive rows (dy's bytes) */
          if (st == EPF_OK) st = epf_ht_dispatch_backward(&route, team, &plan, &bs, 0);
          EPF_BENCH_CUDA(cudaEventRecord(g_ev[7]));
        }
        EPF_BENCH_CUDA(cudaEventSynchronize(g_ev[sp.backward ? 7 : 4]));
        if (st != EPF_OK) { /* a launcher refused: nothing of this call ran, the ones before did */
          snprintf(why, sizeof(why), "%s", epf_status_name(st));
          break;
        }
        for (j = 0; j < (sp.backward ? 7 : 4); ++j) EPF_BENCH_CUDA(cudaEventElapsedTime(&ms[j], g_ev[j], g_ev[j + 1]));
        if (i < 3) continue; /* warm-up */
        t[0][nt[0]++] = ms[1];
        t[1][nt[1]++] = ms[2];
        tc[v][nc[v]++] = ms[3];
        if (sp.backward) {
          t[2][nt[2]++] = ms[4];
          t[3][nt[3]++] = ms[5];
          if (rdbi != NULL && (i & 1))
            t[5][nt[5]++] = ms[6];
          else
            t[4][nt[4]++] = ms[6];
        }
      }
    }
    EPF_BENCH_CUDA(cudaDeviceSynchronize());
    problem = zoo_record_problem();
    if (why[0]) {
      fprintf(stderr, "bench_zoo: REFUSED %s%s R%d %s %s combine %s: %s\n", pre, m->name, R, mode, tag,
              zoo_payload_name(sp.cpayload), why);
      zoo_rows_fail(&g_rows[first], nrows, ZOO_REFUSED, why);
    } else if (problem[0]) {
      fprintf(stderr, "bench_zoo: ERROR %s%s R%d %s %s combine %s: error record says %s\n", pre, m->name, R, mode, tag,
              zoo_payload_name(sp.cpayload), problem);
      zoo_rows_fail(&g_rows[first], nrows, ZOO_ERROR, problem);
    } else {
      double med[6];
      for (i = 0; i < 6; ++i) med[i] = nt[i] > 0 ? epf_bench_median(t[i], nt[i]) * 1e3 : -1.0;
      if (rd != NULL) rd->us = med[0];
      if (re != NULL) re->us = med[1];
      if (rde != NULL) rde->us = med[0] + med[1];
      for (v = 0; v < sp.nvar; ++v) rc[v]->us = epf_bench_median(tc[v], nc[v]) * 1e3;
      if (rcb != NULL) rcb->us = med[2];
      if (rcbe != NULL) rcbe->us = med[2] + med[3];
      if (rdb != NULL) rdb->us = med[4];
      if (rdbi != NULL) rdbi->us = med[5];
    }
    for (i = first; i < g_nrows; ++i) zoo_row_done(&g_rows[i]);
    for (i = 0; i < 6; ++i) free(t[i]);
    for (i = 0; i < 3; ++i) free(tc[i]);
    zoo_free(win);
    zoo_free(rbuf);
    zoo_free(state);
    zoo_free(eo);
    zoo_free(view);
    zoo_free(view_sc);
    zoo_free(dy);
    zoo_free(dx);
    zoo_free(dxr);
    zoo_free(wg);
    zoo_free(dtw);
  }
}

/* the group's device inputs: ids (int32, and int64 when a plan takes them), weights, x, out */
static void zoo_ht_inputs(zoo_ht_in_t* in, const int32_t* topk, const float* w, int R, int T, const zoo_model_t* m,
                          int need64) {
  const size_t n = (size_t)R * T * m->K;
  memset(in, 0, sizeof(*in));
  in->topk = (int32_t*)zoo_malloc(n * 4);
  in->w = (float*)zoo_malloc(n * 4);
  in->x = zoo_malloc((size_t)R * T * m->H * 2);
  in->out = zoo_malloc((size_t)R * T * m->H * 2);
  EPF_BENCH_CUDA(cudaMemcpy(in->topk, topk, n * 4, cudaMemcpyHostToDevice));
  EPF_BENCH_CUDA(cudaMemcpy(in->w, w, n * 4, cudaMemcpyHostToDevice));
  if (need64) {
    int64_t* h = (int64_t*)malloc(n * 8);
    size_t i;
    for (i = 0; i < n; ++i) h[i] = topk[i];
    in->topk64 = (int64_t*)zoo_malloc(n * 8);
    EPF_BENCH_CUDA(cudaMemcpy(in->topk64, h, n * 8, cudaMemcpyHostToDevice));
    free(h);
  }
  zoo_fill(in->x, (size_t)R * T * m->H, 1u);
}

static void zoo_ht_inputs_free(zoo_ht_in_t* in) {
  zoo_free(in->topk);
  zoo_free(in->topk64);
  zoo_free(in->w);
  zoo_free(in->x);
  zoo_free(in->out);
}

/* One model at one rank count: routing, then every plan of the HT matrix. */
static void zoo_ht_group(const zoo_opts_t* o, const zoo_model_t* m, int R, uint64_t seed) {
  int T = o->ht_tokens, li, pi;
  int32_t* topk = NULL;
  float* w = NULL;
  zoo_ht_stats_t s;
  zoo_ht_in_t in;
  { /* the library says whether this model fits these ranks at all (before E / R is divided) */
    const zoo_ht_spec_t sp = zoo_spec(EPF_LAYOUT_EXPERT_MAJOR, EPF_PAYLOAD_BF16, EPF_PAYLOAD_BF16);
    epf_plan_t plan;
    epf_status_t st;
    memset(&s, 0, sizeof(s));
    {
      const epf_config_t cfg = zoo_ht_config(m, R, T, &sp, &s);
      st = epf_plan_compute(&cfg, &plan);
    }
    if (st != EPF_OK) {
      fprintf(stderr, "  skip %s R%d HT: %s\n", m->name, R, epf_status_name(st));
      return;
    }
  }
  for (;;) { /* the routing; fewer tokens while the largest plan would not fit */
    uint64_t rng = seed;
    double need = 0.0;
    epf_status_t st = EPF_OK;
    topk = (int32_t*)realloc(topk, (size_t)R * T * m->K * 4);
    w = (float*)realloc(w, (size_t)R * T * m->K * 4);
    epf_bench_topk_distinct(&rng, (int64_t)R * T, m->K, m->E, 0, topk, w);
    zoo_ht_stats(topk, R, T, m->K, m->E, &s);
    for (li = 0; li < 2 && st == EPF_OK; ++li)
      for (pi = 0; pi < 3; ++pi) {
        const zoo_ht_spec_t sp = zoo_spec(li ? EPF_LAYOUT_RANK_MAJOR : EPF_LAYOUT_EXPERT_MAJOR, zoo_payloads[pi], EPF_PAYLOAD_BF16);
        const epf_config_t cfg = zoo_ht_config(m, R, T, &sp, &s);
        epf_plan_t plan;
        if (epf_quant_check(m->H, zoo_payloads[pi]) != EPF_OK) continue;
        st = epf_plan_compute(&cfg, &plan);
        if (st != EPF_OK) break;
        if (zoo_ht_plan_bytes(&plan, &s, T, &sp) > need) need = zoo_ht_plan_bytes(&plan, &s, T, &sp);
      }
    if (st != EPF_OK) {
      fprintf(stderr, "  skip %s R%d HT: %s\n", m->name, R, epf_status_name(st));
      free(topk);
      free(w);
      return;
    }
    if (need <= g_budget || T <= 128) break;
    fprintf(stderr, "  note %s R%d: HT tokens per rank %d -> %d (%.1f GB > %.1f GB of device memory)\n", m->name, R, T,
            T / 2, need / 1e9, g_budget / 1e9);
    T /= 2;
  }
  fprintf(stderr, "[ht] %s R%d T%d H%d E%d K%d: %lld (token, k), %lld ht-rm rows\n", m->name, R, T, m->H, m->E, m->K,
          (long long)s.valid, (long long)s.rm_rows);
  memset(&in, 0, sizeof(in));
  if (!g_list) zoo_ht_inputs(&in, topk, w, R, T, m, 0);
  for (li = 0; li < 2; ++li)
    for (pi = 0; pi < 3; ++pi) {
      const int layout = li ? EPF_LAYOUT_RANK_MAJOR : EPF_LAYOUT_EXPERT_MAJOR;
      const epf_status_t q = epf_quant_check(m->H, zoo_payloads[pi]);
      if (q != EPF_OK) {
        if (li == 0) fprintf(stderr, "  skip %s %s: epf_quant_check(%d) -> %s\n", m->name, zoo_payload_name(zoo_payloads[pi]), m->H, epf_status_name(q));
        continue;
      }
      {
        const zoo_ht_spec_t sp = zoo_spec(layout, zoo_payloads[pi], EPF_PAYLOAD_BF16);
        zoo_ht_plan(o, m, R, T, &s, &in, &sp);
      }
      if (epf_quant_check(m->H, EPF_PAYLOAD_MXFP8) == EPF_OK) {
        const zoo_ht_spec_t sp = zoo_spec(layout, zoo_payloads[pi], EPF_PAYLOAD_MXFP8);
        zoo_ht_plan(o, m, R, T, &s, &in, &sp);
      }
    }
  if (!g_list) zoo_ht_inputs_free(&in);
  free(topk);
  free(w);
}

/* ---- LL ---------------------------------------------------------------------------------------- */

/* One LL case: a plan and the y layout of its combine. */
typedef struct zoo_ll_spec {
  const char* app;  /* NULL: a model-zoo row; else the application (row name prefix, CSV app) */
  int payload, cpayload;
  int y_layout;     /* EPF_LL_Y_IN_PLACE (push), EPF_LL_Y_IN_PLACE_PULL, EPF_LL_Y_FIXED (separate y) */
  int index_type;   /* EPF_INDEX_INT32 / EPF_INDEX_INT64: the routing ids */
  int dispatch_row; /* its own dispatch row (0: the dispatch repeats an earlier case's) */
} zoo_ll_spec_t;

/* bench_ll's five cases */
static const zoo_ll_spec_t zoo_ll_cases[5] = {
    {NULL, EPF_PAYLOAD_BF16, EPF_PAYLOAD_BF16, EPF_LL_Y_IN_PLACE, EPF_INDEX_INT32, 1},
    {NULL, EPF_PAYLOAD_BF16, EPF_PAYLOAD_BF16, EPF_LL_Y_IN_PLACE_PULL, EPF_INDEX_INT32, 0},
    {NULL, EPF_PAYLOAD_BF16, EPF_PAYLOAD_MXFP8, EPF_LL_Y_IN_PLACE, EPF_INDEX_INT32, 0},
    {NULL, EPF_PAYLOAD_MXFP8, EPF_PAYLOAD_BF16, EPF_LL_Y_FIXED, EPF_INDEX_INT32, 1},
    {NULL, EPF_PAYLOAD_FP8_128, EPF_PAYLOAD_BF16, EPF_LL_Y_FIXED, EPF_INDEX_INT32, 1}};

static double zoo_ll_plan_bytes(const epf_plan_t* plan, const zoo_ll_spec_t* sp) {
  const double R = plan->nranks;
  double b = R * (double)plan->total_bytes + 2.0 * R * (double)epf_ll_buffer_bytes(plan, EPF_LL_BUF_X, EPF_INDEX_DEFAULT) +
             R * (double)epf_ll_buffer_bytes(plan, EPF_LL_BUF_TOPK_IDX, (epf_index_type_t)sp->index_type) +
             R * (double)epf_ll_buffer_bytes(plan, EPF_LL_BUF_TOPK_WEIGHTS, EPF_INDEX_DEFAULT) +
             R * (double)epf_ll_buffer_bytes(plan, EPF_LL_BUF_RECV_COUNTS, EPF_INDEX_DEFAULT) + R * 4.0;
  if (sp->y_layout == EPF_LL_Y_FIXED) b += R * (double)epf_ll_buffer_bytes(plan, EPF_LL_BUF_Y, EPF_INDEX_DEFAULT);
  return b;
}

/* One LL case: its rows, and with a GPU its run (mirrors bench_ll's bl_run). */
static void zoo_ll_case(const zoo_opts_t* o, const zoo_model_t* m, int R, int T, const zoo_ll_spec_t* sp,
                        const int32_t* h_topk, const float* h_w, int64_t local_rows, double floor_us) {
  const int payload = sp->payload, cpayload = sp->cpayload, pull = sp->y_layout == EPF_LL_Y_IN_PLACE_PULL;
  const int64_t delivered = (int64_t)R * T * m->K; /* K distinct experts per token, all routed */
  const double H2 = 2.0 * m->H;
  epf_config_t cfg = zoo_config(m, R, T);
  epf_plan_t plan;
  epf_status_t st;
  zoo_row_t *rd = NULL, *rc;
  double row, crow;
  int first, nrows;
  cfg.mode = EPF_MODE_LL;
  cfg.payload = payload;
  cfg.combine_payload = cpayload;
  st = epf_plan_compute(&cfg, &plan);
  if (st != EPF_OK) {
    fprintf(stderr, "  skip %s%s%s R%d LL T%d %s combine %s: epf_plan_compute -> %s\n", sp->app ? sp->app : "",
            sp->app ? " " : "", m->name, R, T, zoo_payload_name(payload), zoo_payload_name(cpayload), epf_status_name(st));
    return;
  }
  row = (double)plan.row_bytes + plan.scale_bytes_per_row;
  crow = plan.combine_row_bytes;
  zoo_rows_reserve(2); /* rd, rc stay valid to the end of this function */
  first = g_nrows;
  if (sp->dispatch_row) {
    rd = zoo_row_new(sp->app, NULL, m, R, T, "ll", payload, "dispatch");
    rd->recv_b = (double)delivered * row;
    rd->topk_b = (double)R * T * m->K * row;
    rd->link_b = (double)(delivered - local_rows) * row;
    rd->copy_b = 2.0 * (double)delivered * row;
    rd->hbm_b = (double)delivered * (row + 16.0) + (double)R * T * H2;
    rd->min_b = zoo_min_dispatch((double)R * T, m->H, (double)delivered, row);
  }
  rc = zoo_row_new(sp->app, NULL, m, R, T, "ll", payload,
                   payload != EPF_PAYLOAD_BF16          ? "combine-fixed"
                   : cpayload == EPF_PAYLOAD_MXFP8     ? "combine-mxfp8"
                   : pull                              ? "combine-pull"
                   : sp->y_layout == EPF_LL_Y_FIXED    ? "combine-fixed"
                                                       : "combine-push");
  rc->recv_b = (double)delivered * crow;
  rc->topk_b = (double)R * T * m->K * crow;
  rc->link_b = (double)(delivered - local_rows) * crow;
  rc->copy_b = 2.0 * (double)delivered * crow;
  rc->hbm_b = pull ? (double)delivered * H2 + (double)R * T * H2
                   : (double)delivered * (H2 + 2.0 * crow + 16.0) + (double)R * T * H2;
  rc->min_b = zoo_min_combine((double)delivered, crow, (double)R * T, m->H, 0.0);
  {
    int i;
    for (i = first; i < g_nrows; ++i) {
      if (T == 1) zoo_target(&g_rows[i], ZOO_T_US, 12.0);
      else if (T == 128) zoo_target(&g_rows[i], ZOO_T_FRAC, 0.70);
    }
  }
  nrows = g_nrows - first;

  if (g_list) {
    const double bytes = zoo_ll_plan_bytes(&plan, sp);
    int i;
    for (i = first; i < g_nrows; ++i) {
      char tgt[16];
      zoo_target_str(&g_rows[i], tgt, sizeof(tgt));
      printf("%-68s min %11.3f MB  HBM %11.3f MB  target %-7s\n", g_rows[i].name, g_rows[i].min_b / 1e6,
             g_rows[i].hbm_b / 1e6, tgt);
    }
    const size_t smem = epf_ll_smem_bytes(&plan, EPF_LL_DEFAULT_THREADS);
    printf("    plan: window %.2f GB x %d ranks, device memory %.2f GB, %.1f KiB shared memory per block%s%s\n",
           plan.total_bytes / 1e9, R, bytes / 1e9, smem / 1024.0,
           bytes > g_budget ? "  ** over the memory budget: skipped **" : "",
           smem > 227u * 1024u ? "  ** over an H200 block's 227 KiB: the launcher will refuse **" : "");
    /* rough: set-up + memset, graph capture, replays at ~15 us + bytes at ~40 % of 4 TB/s */
    g_est_s += 0.05 + bytes / 2.0e12 +
               (o->reps + 11) * (2 * 15e-6 + (rc->hbm_b + (rd ? rd->hbm_b : rc->hbm_b)) / (0.4 * 4.0e12));
    for (i = first; i < g_nrows; ++i) zoo_row_done(&g_rows[i]);
    return;
  }
  if (zoo_ll_plan_bytes(&plan, sp) > g_budget) {
    fprintf(stderr, "bench_zoo: REFUSED %s R%d LL T%d: %.1f GB > %.1f GB of device memory\n", m->name, R, T,
            zoo_ll_plan_bytes(&plan, sp) / 1e9, g_budget / 1e9);
    zoo_rows_fail(&g_rows[first], nrows, ZOO_REFUSED, "device_memory");
    for (int i = first; i < g_nrows; ++i) zoo_row_done(&g_rows[i]);
    return;
  }
  {
    const int reps = o->reps;
    char* win = (char*)zoo_malloc((size_t)R * plan.total_bytes);
    epf_ll_state_t* state = (epf_ll_state_t*)zoo_malloc((size_t)R * sizeof(epf_ll_state_t));
    uint16_t* x = (uint16_t*)zoo_malloc((size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_X, EPF_INDEX_DEFAULT));
    uint16_t* out = (uint16_t*)zoo_malloc((size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_X, EPF_INDEX_DEFAULT));
    const int is64 = sp->index_type == EPF_INDEX_INT64;
    void* topk = zoo_malloc((size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_TOPK_IDX, (epf_index_type_t)sp->index_type));
    float* w = (float*)zoo_malloc((size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_TOPK_WEIGHTS, EPF_INDEX_DEFAULT));
    int32_t* recv_counts = (int32_t*)zoo_malloc((size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_RECV_COUNTS, EPF_INDEX_DEFAULT));
    uint32_t* round = (uint32_t*)zoo_malloc((size_t)R * 4);
    uint16_t* y = NULL;
    epf_ll_launch_t L;
    epf_ll_dispatch_args_t da;
    epf_ll_combine_args_t ca;
    cudaStream_t s;
    cudaGraph_t gd = NULL, gc = NULL;
    cudaGraphExec_t xd = NULL, xc = NULL;
    cudaEvent_t* ev = (cudaEvent_t*)malloc(sizeof(cudaEvent_t) * (size_t)(2 * reps + 1));
    float *td = (float*)malloc(sizeof(float) * (size_t)reps), *tc = (float*)malloc(sizeof(float) * (size_t)reps);
    const char* problem = "";
    char why[48] = "";
    int i;
    EPF_BENCH_CUDA(cudaMemset(win, 0, (size_t)R * plan.total_bytes));
    if (sp->y_layout == EPF_LL_Y_FIXED) { /* quantized rows cannot be overwritten in place by BF16 y */
      y = (uint16_t*)zoo_malloc((size_t)R * epf_ll_buffer_bytes(&plan, EPF_LL_BUF_Y, EPF_INDEX_DEFAULT));
      zoo_fill(y, (size_t)R * plan.recv_capacity * m->H, 777u);
    }
    zoo_fill(x, (size_t)R * T * m->H, 12345u);
    if (is64) { /* the ids as a torch.int64 tensor holds them (the Python package) */
      const size_t nid = (size_t)R * T * m->K;
      int64_t* h64 = (int64_t*)malloc(nid * 8);
      size_t j;
      for (j = 0; j < nid; ++j) h64[j] = h_topk[j];
      EPF_BENCH_CUDA(cudaMemcpy(topk, h64, nid * 8, cudaMemcpyHostToDevice));
      free(h64);
    } else {
      EPF_BENCH_CUDA(cudaMemcpy(topk, h_topk, (size_t)R * T * m->K * 4, cudaMemcpyHostToDevice));
    }
    EPF_BENCH_CUDA(cudaMemcpy(w, h_w, (size_t)R * T * m->K * 4, cudaMemcpyHostToDevice));
    EPF_BENCH_CUDA(cudaDeviceSynchronize());
    epf_error_clear(g_rec_h);
    EPF_BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    L = epf_ll_launch_make(&plan, epf_team_virtual(win, plan.total_bytes, 0, R), state, g_rec_d, 1);
    EPF_BENCH_OK(epf_ll_state_reset(&L, s));
    memset(&da, 0, sizeof(da));
    da.x = x;
    da.topk_idx = topk;
    da.index_type = sp->index_type;
    da.topk_weights = w;
    da.num_tokens = T;
    da.recv_counts = recv_counts;
    da.round = round;
    memset(&ca, 0, sizeof(ca));
    ca.y = y;
    ca.y_layout = sp->y_layout;
    ca.recv_counts = recv_counts;
    ca.topk_idx = topk;
    ca.index_type = sp->index_type;
    ca.topk_weights = w;
    ca.out = out;
    ca.num_tokens = T;
    /* one round outside capture: the launchers' checks (a refusal is a row, not a crash) */
    st = epf_ll_dispatch(&L, &da, EPF_LL_BOTH, s);
    if (st == EPF_OK) st = epf_ll_combine(&L, &ca, EPF_LL_BOTH, s);
    EPF_BENCH_CUDA(cudaStreamSynchronize(s));
    if (st != EPF_OK) snprintf(why, sizeof(why), "%s", epf_status_name(st));
    if (!why[0]) {
      EPF_BENCH_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      EPF_BENCH_OK(epf_ll_dispatch(&L, &da, EPF_LL_BOTH, s));
      EPF_BENCH_CUDA(cudaStreamEndCapture(s, &gd));
      EPF_BENCH_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      EPF_BENCH_OK(epf_ll_combine(&L, &ca, EPF_LL_BOTH, s));
      EPF_BENCH_CUDA(cudaStreamEndCapture(s, &gc));
      EPF_BENCH_CUDA(cudaGraphInstantiate(&xd, gd, 0));
      EPF_BENCH_CUDA(cudaGraphInstantiate(&xc, gc, 0));
      for (i = 0; i < 2 * reps + 1; ++i) EPF_BENCH_CUDA(cudaEventCreate(&ev[i]));
      for (i = 0; i < 10; ++i) { /* warm-up */
        EPF_BENCH_CUDA(cudaGraphLaunch(xd, s));
        EPF_BENCH_CUDA(cudaGraphLaunch(xc, s));
      }
      EPF_BENCH_CUDA(cudaStreamSynchronize(s));
      EPF_BENCH_CUDA(cudaEventRecord(ev[0], s));
      for (i = 0; i < reps; ++i) {
        EPF_BENCH_CUDA(cudaGraphLaunch(xd, s));
        EPF_BENCH_CUDA(cudaEventRecord(ev[2 * i + 1], s));
        EPF_BENCH_CUDA(cudaGraphLaunch(xc, s));
        EPF_BENCH_CUDA(cudaEventRecord(ev[2 * i + 2], s));
      }
      EPF_BENCH_CUDA(cudaStreamSynchronize(s));
      for (i = 0; i < reps; ++i) {
        EPF_BENCH_CUDA(cudaEventElapsedTime(&td[i], ev[2 * i], ev[2 * i + 1]));
        EPF_BENCH_CUDA(cudaEventElapsedTime(&tc[i], ev[2 * i + 1], ev[2 * i + 2]));
      }
      for (i = 0; i < 2 * reps + 1; ++i) EPF_BENCH_CUDA(cudaEventDestroy(ev[i]));
    }
    EPF_BENCH_CUDA(cudaDeviceSynchronize());
    problem = zoo_record_problem();
    if (!why[0] && !problem[0]) { /* every routed row arrived (the last round's counts) */
      int64_t got = 0;
      const int n = R * plan.experts_per_rank * R;
      int32_t* hc = (int32_t*)malloc(sizeof(int32_t) * (size_t)n);
      EPF_BENCH_CUDA(cudaMemcpy(hc, recv_counts, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost));
      for (i = 0; i < n; ++i) got += hc[i];
      free(hc);
      if (got != delivered) {
        fprintf(stderr, "bench_zoo: %s R%d LL T%d: %lld rows received, %lld routed\n", m->name, R, T, (long long)got,
                (long long)delivered);
        problem = "rows_received";
      }
    }
    if (why[0]) {
      fprintf(stderr, "bench_zoo: REFUSED %s R%d LL T%d %s combine %s: %s\n", m->name, R, T, zoo_payload_name(payload),
              zoo_payload_name(cpayload), why);
      zoo_rows_fail(&g_rows[first], nrows, ZOO_REFUSED, why);
    } else if (problem[0]) {
      fprintf(stderr, "bench_zoo: ERROR %s R%d LL T%d %s combine %s: %s\n", m->name, R, T, zoo_payload_name(payload),
              zoo_payload_name(cpayload), problem);
      zoo_rows_fail(&g_rows[first], nrows, ZOO_ERROR, problem);
    } else {
      if (rd != NULL) rd->us = epf_bench_median(td, reps) * 1e3;
      rc->us = epf_bench_median(tc, reps) * 1e3;
      for (i = first; i < g_nrows; ++i) zoo_ll_bound(&g_rows[i], floor_us);
    }
    for (i = first; i < g_nrows; ++i) zoo_row_done(&g_rows[i]);
    if (xd != NULL) EPF_BENCH_CUDA(cudaGraphExecDestroy(xd));
    if (xc != NULL) EPF_BENCH_CUDA(cudaGraphExecDestroy(xc));
    if (gd != NULL) EPF_BENCH_CUDA(cudaGraphDestroy(gd));
    if (gc != NULL) EPF_BENCH_CUDA(cudaGraphDestroy(gc));
    EPF_BENCH_CUDA(cudaStreamDestroy(s));
    free(ev);
    free(td);
    free(tc);
    zoo_free(win);
    zoo_free(state);
    zoo_free(x);
    zoo_free(out);
    zoo_free(topk);
    zoo_free(w);
    zoo_free(recv_counts);
    zoo_free(round);
    zoo_free(y);
  }
}

/* One model at R ranks and T tokens: routing (K distinct uniform experts, weights 1/K), the
 * latency floor, then the cases (the zoo's five, or an application's). */
static void zoo_ll_group(const zoo_opts_t* o, const zoo_model_t* m, int R, int T, uint64_t seed, const zoo_ll_spec_t* cases,
                         int ncases) {
  int EL;
  int32_t* topk;
  float* w;
  int64_t local_rows = 0, i;
  int ci;
  double floor_us = -1.0;
  { /* the library says whether this model fits these ranks at all (before E / R is divided) */
    epf_config_t cfg = zoo_config(m, R, T);
    epf_plan_t plan;
    epf_status_t st;
    cfg.mode = EPF_MODE_LL;
    st = epf_plan_compute(&cfg, &plan);
    if (st != EPF_OK) {
      fprintf(stderr, "  skip %s R%d LL T%d: %s\n", m->name, R, T, epf_status_name(st));
      return;
    }
  }
  EL = m->E / R;
  topk = (int32_t*)malloc((size_t)R * T * m->K * 4);
  w = (float*)malloc((size_t)R * T * m->K * 4);
  epf_bench_topk_distinct(&seed, (int64_t)R * T, m->K, m->E, 1, topk, w);
  for (i = 0; i < (int64_t)R * T * m->K; ++i) local_rows += topk[i] / EL == (int)(i / ((int64_t)T * m->K));
  fprintf(stderr, "[ll] %s%s%s R%d T%d H%d E%d K%d\n", cases[0].app ? cases[0].app : "", cases[0].app ? " " : "", m->name,
          R, T, m->H, m->E, m->K);
  if (!g_list) floor_us = zoo_ll_floor_us(R, o->reps);
  for (ci = 0; ci < ncases; ++ci) {
    if (epf_quant_check(m->H, cases[ci].payload) != EPF_OK || epf_quant_check(m->H, cases[ci].cpayload) != EPF_OK) continue;
    zoo_ll_case(o, m, R, T, &cases[ci], topk, w, local_rows, floor_us);
  }
  free(topk);
  free(w);
}

/* ---- application rows (issue #31 §2) ------------------------------------------------------------
 * The configurations the examples and the Python package run, as rows named after their source
 * (<app>/<model>/R<ranks>/<mode>/T<tokens>/<tag>/<stage>), each beside a twin that isolates what the
 * application changes. Virtual ranks R = 8 as the examples; K distinct uniform experts per token
 * (examples/05's routing; the others' routers are near-uniform at random weights). */

static const zoo_model_t zoo_app_small = {"h2048-e64-k4", 2048, 64, 4}; /* examples/03 and python defaults */

static zoo_ht_spec_t zoo_app_spec(const char* app, const char* tag, int layout, int payload, int scale_layout, int align,
                                  int64_t recv_capacity) {
  zoo_ht_spec_t sp;
  memset(&sp, 0, sizeof(sp));
  sp.app = app;
  sp.tag = tag;
  sp.layout = layout;
  sp.payload = payload;
  sp.cpayload = EPF_PAYLOAD_BF16;
  sp.scale_layout = scale_layout;
  sp.align = align;
  sp.index_type = EPF_INDEX_INT32;
  sp.recv_capacity = recv_capacity;
  sp.dispatch_rows = 1;
  return sp;
}

static void zoo_var(zoo_ht_spec_t* sp, int var) { sp->var[sp->nvar++] = var; }

#define ZOO_APP_MAX 12

/* The HT plans of application group g from its routing:
 *   g 0, DeepSeek-V3 (examples/05 --real's shape, T = --app-tokens):
 *     ex05 fp8-segmn     examples/05_moe_layer_gemm fp8 path: per-128 FP8 dispatch quantized on the
 *                        way, scales EPF_SCALE_LAYOUT_SEGMENT_MN_MAJOR (cuBLASLt VEC128_32F reads them
 *                        in place), --align 16, recv_capacity = the fullest rank's padded rows +
 *                        E/R x 16, int32 ids; combine-eo: from the down GEMM's BF16 outputs in a
 *                        separate buffer [R][recv_capacity][H] (hs.expert_out = eo), as ex05 does;
 *                        combine-window: the same outputs written into the window's EXPERT_OUT rows
 *                        instead (epf_plan_expert_out_offset: where the GEMM could write them; the
 *                        plan offers it, ex05 does not use it)
 *     ex05 fp8-compact   twin: the same plan with COMPACT scales (what the zoo's fp8 rows use)
 *     ex05 bf16          ex05 bf16 path: BF16, --align 16, the down GEMM writes over the received
 *                        rows, pull in place (combine-pull)
 *     ex05-mxfp8 mxfp8-swz  ex05's layer with MXFP8 GEMMs (no example runs it yet): scales
 *                        EPF_SCALE_LAYOUT_SWIZZLED_128X4 (Blackwell block-scaled GEMMs), segments
 *                        padded to 128 rows so each expert's scales are whole 128-row atoms;
 *                        combine-eo and combine-window as ex05; twin mxfp8-compact
 *     ex06 bf16-pull / bf16-push, ht-em and ht-rm   examples/06_moe_training's plans (its own
 *                        shapes are small correctness shapes; its configuration at this one): BF16,
 *                        alignment 1, recv_capacity = the fullest rank's receive rows + 16, the
 *                        experts' outputs in a separate buffer (RANK_MAJOR: expert_rows = the fullest
 *                        rank's expert rows + 16), pull or EPF_FLAG_COMBINE_PUSH; forward (dispatch,
 *                        [expand], combine-eo) then backward over the same route: combine-backward
 *                        (a dispatch of dy [+ expand]) and dispatch-backward (a unit-weight combine
 *                        of the dx rows, with the router-weight gradient); ht-em: the dx rows from
 *                        the buffer (dispatch-backward, ex06 --dx-out buffer) and, every other
 *                        iteration, in place over the receive rows (dispatch-backward-inplace,
 *                        expert_out = NULL, ex06's default --dx-out window); ht-em bf16-pull also
 *                        runs the forward combine in place (combine-pull): the in-place
 *                        dispatch-backward's forward twin on the same plan
 *   g 1, H 2048, E 64, top-4, T 512 (the defaults of examples/03 and examples/python/moe_layer.py):
 *     python-moe_layer bf16   moe_layer.py's EpfuseLayer: Group.virtual defaults (EXPERT_MAJOR
 *                        BF16, worst-case recv_capacity), torch.int64 ids, combine(expert_out=eo,
 *                        expert_rows=recv_capacity): combine-eo; twin: expert_out=None (combine-pull)
 *     ex03 mxfp8         examples/03_fused_moe_layer: MXFP8 dispatch (its --unfused path's
 *                        epf_ht_dispatch), recv_capacity R*T*min(K, E/R); its experts write BF16
 *                        outputs into EXPERT_OUT and its combine pulls them there: combine-window
 *                        (the ready-made combine, without ex03's fused residual); twin: combine-eo */
static int zoo_app_ht_specs(int g, const zoo_model_t* m, int R, int T, const int32_t* topk, const zoo_ht_stats_t* s,
                            zoo_ht_spec_t* out) {
  const int EL = m->E / R;
  int n = 0;
  if (g == 0) {
    const int64_t cap16 = zoo_ht_em_max_aligned(topk, R, T, m->K, m->E, 16) + (int64_t)EL * 16;
    const int64_t cap128 = zoo_ht_em_max_aligned(topk, R, T, m->K, m->E, 128) + (int64_t)EL * 128;
    int l, push;
    out[n] = zoo_app_spec("ex05", "fp8-segmn", EPF_LAYOUT_EXPERT_MAJOR, EPF_PAYLOAD_FP8_128,
                          EPF_SCALE_LAYOUT_SEGMENT_MN_MAJOR, 16, cap16);
    zoo_var(&out[n], ZOO_CV_EO);
    zoo_var(&out[n++], ZOO_CV_WINDOW);
    out[n] = zoo_app_spec("ex05", "fp8-compact", EPF_LAYOUT_EXPERT_MAJOR, EPF_PAYLOAD_FP8_128, EPF_SCALE_LAYOUT_COMPACT, 16,
                          cap16);
    zoo_var(&out[n++], ZOO_CV_EO);
    out[n] = zoo_app_spec("ex05", "bf16", EPF_LAYOUT_EXPERT_MAJOR, EPF_PAYLOAD_BF16, EPF_SCALE_LAYOUT_COMPACT, 16, cap16);
    zoo_var(&out[n++], ZOO_CV_PULL);
    out[n] = zoo_app_spec("ex05-mxfp8", "mxfp8-swz", EPF_LAYOUT_EXPERT_MAJOR, EPF_PAYLOAD_MXFP8,
                          EPF_SCALE_LAYOUT_SWIZZLED_128X4, 128, cap128);
    zoo_var(&out[n], ZOO_CV_EO);
    zoo_var(&out[n++], ZOO_CV_WINDOW);
    out[n] = zoo_app_spec("ex05-mxfp8", "mxfp8-compact", EPF_LAYOUT_EXPERT_MAJOR, EPF_PAYLOAD_MXFP8,
                          EPF_SCALE_LAYOUT_COMPACT, 128, cap128);
    zoo_var(&out[n++], ZOO_CV_EO);
    for (l = 0; l < 2; ++l)
      for (push = 0; push < 2; ++push) {
        out[n] = zoo_app_spec("ex06", push ? "bf16-push" : "bf16-pull",
                              l ? EPF_LAYOUT_RANK_MAJOR : EPF_LAYOUT_EXPERT_MAJOR, EPF_PAYLOAD_BF16,
                              EPF_SCALE_LAYOUT_COMPACT, 1, (l ? s->rm_max : s->em_max) + 16);
        out[n].flags = push ? EPF_FLAG_COMBINE_PUSH : 0u;
        out[n].expert_rows = l ? s->em_max + 16 : 0; /* EXPERT_MAJOR: recv_capacity */
        out[n].backward = 1;
        out[n].bwd_in_place = !l; /* ht-em: the dx rows through the buffer and in place (--dx-out) */
        zoo_var(&out[n], ZOO_CV_EO);
        if (!l && !push) zoo_var(&out[n], ZOO_CV_PULL); /* the in-place dispatch-backward's forward twin */
        ++n;
      }
  } else {
    out[n] = zoo_app_spec("python-moe_layer", "bf16", EPF_LAYOUT_EXPERT_MAJOR, EPF_PAYLOAD_BF16, EPF_SCALE_LAYOUT_COMPACT,
                          1, -1);
    out[n].index_type = EPF_INDEX_INT64;
    zoo_var(&out[n], ZOO_CV_EO);
    zoo_var(&out[n++], ZOO_CV_PULL);
    out[n] = zoo_app_spec("ex03", "mxfp8", EPF_LAYOUT_EXPERT_MAJOR, EPF_PAYLOAD_MXFP8, EPF_SCALE_LAYOUT_COMPACT, 1,
                          (int64_t)R * T * (m->K < EL ? m->K : EL));
    zoo_var(&out[n], ZOO_CV_WINDOW);
    zoo_var(&out[n++], ZOO_CV_EO);
  }
  return n;
}

/* One HT application group: its routing (fewer tokens while its largest plan would not fit), then
 * its plans. */
static void zoo_app_ht_group(const zoo_opts_t* o, int g, const zoo_model_t* m, int R, int T, uint64_t seed) {
  zoo_ht_spec_t specs[ZOO_APP_MAX];
  int32_t* topk = NULL;
  float* w = NULL;
  zoo_ht_stats_t s;
  zoo_ht_in_t in;
  int n = 0, i, need64 = 0;
  for (;;) {
    uint64_t rng = seed;
    double need = 0.0;
    topk = (int32_t*)realloc(topk, (size_t)R * T * m->K * 4);
    w = (float*)realloc(w, (size_t)R * T * m->K * 4);
    epf_bench_topk_distinct(&rng, (int64_t)R * T, m->K, m->E, 0, topk, w);
    zoo_ht_stats(topk, R, T, m->K, m->E, &s);
    n = zoo_app_ht_specs(g, m, R, T, topk, &s, specs);
    for (i = 0; i < n; ++i) {
      const epf_config_t cfg = zoo_ht_config(m, R, T, &specs[i], &s);
      epf_plan_t plan;
      if (epf_quant_check(m->H, specs[i].payload) != EPF_OK || epf_plan_compute(&cfg, &plan) != EPF_OK) continue;
      if (zoo_ht_plan_bytes(&plan, &s, T, &specs[i]) > need) need = zoo_ht_plan_bytes(&plan, &s, T, &specs[i]);
    }
    if (need <= g_budget || T <= 128) break;
    fprintf(stderr, "  note apps %s R%d: HT tokens per rank %d -> %d (%.1f GB > %.1f GB of device memory)\n", m->name, R,
            T, T / 2, need / 1e9, g_budget / 1e9);
    T /= 2;
  }
  fprintf(stderr, "[app] %s R%d T%d H%d E%d K%d: %lld (token, k), %lld ht-rm rows\n", m->name, R, T, m->H, m->E, m->K,
          (long long)s.valid, (long long)s.rm_rows);
  for (i = 0; i < n; ++i) need64 |= specs[i].index_type == EPF_INDEX_INT64;
  memset(&in, 0, sizeof(in));
  if (!g_list) zoo_ht_inputs(&in, topk, w, R, T, m, need64);
  for (i = 0; i < n; ++i) {
    const epf_status_t q = epf_quant_check(m->H, specs[i].payload);
    if (q != EPF_OK) {
      fprintf(stderr, "  skip %s %s: epf_quant_check(%d) -> %s\n", specs[i].app, specs[i].tag, m->H, epf_status_name(q));
      continue;
    }
    zoo_ht_plan(o, m, R, T, &s, &in, &specs[i]);
  }
  if (!g_list) zoo_ht_inputs_free(&in);
  free(topk);
  free(w);
}

/* the Python package's LL path (Group.ll_dispatch / Group.ll_combine; examples/python/moe_layer.py
 * itself runs HT): a BF16 plan with Group.virtual's defaults, torch.int64 ids, ll_combine's default
 * y_layout="fixed" (the experts' outputs in a separate y [R][recv_capacity][H], pushed: combine-fixed),
 * and the package tests' y_layout="in_place_pull" (combine-pull) beside it */
static const zoo_ll_spec_t zoo_ll_python[2] = {
    {"python-ll", EPF_PAYLOAD_BF16, EPF_PAYLOAD_BF16, EPF_LL_Y_FIXED, EPF_INDEX_INT64, 1},
    {"python-ll", EPF_PAYLOAD_BF16, EPF_PAYLOAD_BF16, EPF_LL_Y_IN_PLACE_PULL, EPF_INDEX_INT64, 0}};

static void zoo_apps(const zoo_opts_t* o) {
  const zoo_model_t* ds = &zoo_models[0]; /* deepseek-v3 */
  int ti;
  if (o->do_ht) {
    zoo_app_ht_group(o, 0, ds, 8, o->app_tokens, 0x5eed05ull);
    zoo_app_ht_group(o, 1, &zoo_app_small, 8, 512, 0x5eed03ull);
  }
  if (o->do_ll)
    for (ti = 0; ti < o->nll; ++ti) zoo_ll_group(o, ds, 8, o->ll_tokens[ti], 0x5eed11ull + (uint64_t)ti, zoo_ll_python, 2);
}

/* ---- the table --------------------------------------------------------------------------------- */

static void zoo_cell(double v, const char* fmt) {
  if (v >= 0.0) printf(fmt, v);
  else printf(" - |");
}

static void zoo_print_table(const zoo_opts_t* o) {
  int i, with_target = 0, met = 0, out_of_reach = 0, refused = 0, errors = 0;
  printf("| case | us | min GB | **%% of copy ceiling (min bytes)** | HBM GB (HT moved, LL issued) | %% (moved, issued) |"
         " recv-logical GB/s | topk-logical GB/s | link GB/s | bound | target | meets | PyTorch us |\n");
  printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |\n");
  for (i = 0; i < g_nrows; ++i) {
    const zoo_row_t* r = &g_rows[i];
    const double us = r->status == ZOO_OK ? r->us : -1.0;
    const double f = zoo_min_frac(r), fh = zoo_frac(r);
    char tgt[16];
    zoo_target_str(r, tgt, sizeof(tgt));
    printf("| %s |", r->name);
    zoo_cell(us, " %.1f |");
    zoo_cell(r->min_b / 1e9, " %.3f |");
    zoo_cell(f >= 0.0 ? 100.0 * f : -1.0, " %.1f%% |");
    zoo_cell(r->hbm_b / 1e9, " %.3f |");
    zoo_cell(fh >= 0.0 ? 100.0 * fh : -1.0, " %.1f%% |");
    zoo_cell(zoo_gbs(r->recv_b, us), " %.0f |");
    zoo_cell(zoo_gbs(r->topk_b, us), " %.0f |");
    zoo_cell(zoo_gbs(r->link_b, us), " %.0f |");
    zoo_cell(r->bound >= 0.0 ? 100.0 * r->bound : -1.0, " %.0f%% |");
    printf(" %s | %s%s%s |", tgt, zoo_meets(r), r->why[0] ? " " : "", r->why);
    zoo_cell(r->torch_us, " %.1f |");
    printf("\n");
    if (r->status == ZOO_REFUSED) ++refused;
    if (r->status == ZOO_ERROR) ++errors;
    if (r->target_kind != ZOO_T_NONE && r->status == ZOO_OK && r->us >= 0.0) {
      ++with_target;
      met += !strcmp(zoo_meets(r), "yes");
      out_of_reach += !strcmp(zoo_meets(r), "out-of-reach");
    }
  }
  printf("\n%d rows; targets (on the minimal-bytes fraction): %d of %d met, %d out of reach (bound below the target: "
         "the run's latency floor plus the row's minimal bytes at the copy ceiling), %d missed; refused: %d; errors: %d\n",
         g_nrows, met, with_target, out_of_reach, with_target - met - out_of_reach, refused, errors);
  if (met + out_of_reach < with_target) {
    printf("missed:");
    for (i = 0; i < g_nrows; ++i)
      if (!strcmp(zoo_meets(&g_rows[i]), "no")) printf(" %s", g_rows[i].name);
    printf("\n");
  }
  (void)o;
}

/* ---- main -------------------------------------------------------------------------------------- */

static void zoo_usage(void) {
  fprintf(stderr,
          "usage: bench_zoo [--list] [--quick] [--models a,b] [--ranks 4,8,16] [--iters 10] [--reps 50]\n"
          "                 [--ht-tokens 4096] [--ll-tokens 1,128,256] [--only ht|ll] [--csv FILE] [--torch FILE]\n"
          "                 [--apps | --no-apps] [--app-tokens 4096]\n"
          "models:");
  for (int i = 0; i < ZOO_NMODELS; ++i) fprintf(stderr, " %s", zoo_models[i].name);
  fprintf(stderr, "\n");
}

int main(int argc, char** argv) {
  zoo_opts_t o;
  int i, mi, ri, ti, ndev = 0;
  memset(&o, 0, sizeof(o));
  o.iters = 10;
  o.reps = 50;
  o.ht_tokens = 4096;
  o.do_ht = o.do_ll = 1;
  o.do_zoo = o.do_apps = 1;
  o.app_tokens = 4096;
  o.ranks[0] = 8, o.ranks[1] = 4, o.ranks[2] = 16, o.nranks = 3;
  o.ll_tokens[0] = 1, o.ll_tokens[1] = 128, o.ll_tokens[2] = 256, o.nll = 3;
  for (mi = 0; mi < ZOO_NMODELS; ++mi) o.use_model[mi] = 1;
  for (i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    const int takes = strcmp(a, "--list") && strcmp(a, "--quick") && strcmp(a, "--help") && strcmp(a, "-h") &&
                      strcmp(a, "--apps") && strcmp(a, "--no-apps");
    if (takes && v == NULL) {
      fprintf(stderr, "bench_zoo: %s needs a value\n", a);
      return 2;
    }
    if (!strcmp(a, "--list")) o.list = 1;
    else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      zoo_usage();
      return 0;
    } else if (!strcmp(a, "--quick")) {
      for (mi = 0; mi < ZOO_NMODELS; ++mi)
        o.use_model[mi] = !strcmp(zoo_models[mi].name, "qwen3-30b") || !strcmp(zoo_models[mi].name, "gpt-oss-120b");
      o.ranks[0] = 4, o.nranks = 1;
      o.ll_tokens[0] = 1, o.ll_tokens[1] = 128, o.nll = 2;
      o.ht_tokens = 512;
      o.app_tokens = 512;
      o.iters = 3;
      o.reps = 10;
    } else if (!strcmp(a, "--apps")) { /* the application rows alone */
      o.do_zoo = 0;
      o.do_apps = 1;
    } else if (!strcmp(a, "--no-apps")) {
      o.do_zoo = 1;
      o.do_apps = 0;
    } else if (!strcmp(a, "--app-tokens")) {
      if ((o.app_tokens = atoi(v)) < 1) return fprintf(stderr, "bench_zoo: bad --app-tokens\n"), 2;
      ++i;
    } else if (!strcmp(a, "--models")) {
      char buf[256], *tok, *save = NULL;
      snprintf(buf, sizeof(buf), "%s", v);
      for (mi = 0; mi < ZOO_NMODELS; ++mi) o.use_model[mi] = 0;
      for (tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        for (mi = 0; mi < ZOO_NMODELS && strcmp(zoo_models[mi].name, tok) != 0; ++mi) {
        }
        if (mi == ZOO_NMODELS) {
          fprintf(stderr, "bench_zoo: unknown model %s\n", tok);
          zoo_usage();
          return 2;
        }
        o.use_model[mi] = 1;
      }
      ++i;
    } else if (!strcmp(a, "--ranks")) {
      if ((o.nranks = epf_bench_parse_ints(v, o.ranks, 8)) < 1) return fprintf(stderr, "bench_zoo: bad --ranks\n"), 2;
      for (ri = 0; ri < o.nranks; ++ri)
        if (o.ranks[ri] > EPF_MAX_RANKS) return fprintf(stderr, "bench_zoo: --ranks above %d\n", EPF_MAX_RANKS), 2;
      ++i;
    } else if (!strcmp(a, "--ll-tokens")) {
      if ((o.nll = epf_bench_parse_ints(v, o.ll_tokens, 8)) < 1) return fprintf(stderr, "bench_zoo: bad --ll-tokens\n"), 2;
      ++i;
    } else if (!strcmp(a, "--iters")) {
      if ((o.iters = atoi(v)) < 1) return fprintf(stderr, "bench_zoo: bad --iters\n"), 2;
      ++i;
    } else if (!strcmp(a, "--reps")) {
      if ((o.reps = atoi(v)) < 1) return fprintf(stderr, "bench_zoo: bad --reps\n"), 2;
      ++i;
    } else if (!strcmp(a, "--ht-tokens")) {
      if ((o.ht_tokens = atoi(v)) < 1) return fprintf(stderr, "bench_zoo: bad --ht-tokens\n"), 2;
      ++i;
    } else if (!strcmp(a, "--only")) {
      o.do_ht = !strcmp(v, "ht");
      o.do_ll = !strcmp(v, "ll");
      if (!o.do_ht && !o.do_ll) return fprintf(stderr, "bench_zoo: --only ht or ll\n"), 2;
      ++i;
    } else if (!strcmp(a, "--csv")) {
      o.csv = v;
      ++i;
    } else if (!strcmp(a, "--torch")) {
      o.torch = v;
      ++i;
    } else {
      fprintf(stderr, "bench_zoo: unknown option %s\n", a);
      zoo_usage();
      return 2;
    }
  }
  g_list = o.list;
  if (o.torch != NULL) zoo_load_torch(o.torch);
  if (o.csv != NULL) {
    g_csv = fopen(o.csv, "w");
    if (g_csv == NULL) {
      fprintf(stderr, "bench_zoo: cannot write %s\n", o.csv);
      return 2;
    }
    zoo_csv_header(g_csv);
  }

  if (g_list) {
    g_budget = 137.0 * 1073741824.0; /* an H200 (139 GiB), less a little */
    printf("bench_zoo --list: the rows a run would measure (no CUDA), with their minimal bytes (the headline fraction's) "
           "and their HBM bytes (HT moved, LL issued); memory budget %.1f GB per plan\n",
           g_budget / 1e9);
  } else {
    cudaDeviceProp prop;
    size_t free_b = 0, total_b = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
      printf("SKIP: bench_zoo needs a GPU\n");
      return 77;
    }
    EPF_BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
    g_ceiling = epf_bench_copy_ceiling_gbs((size_t)1 << 31, 10);
    EPF_BENCH_CUDA(cudaMemGetInfo(&free_b, &total_b));
    g_budget = (double)free_b - 3.0 * 1073741824.0;
    EPF_BENCH_CUDA(cudaHostAlloc(&g_rec_h, sizeof(*g_rec_h), cudaHostAllocMapped));
    EPF_BENCH_CUDA(cudaHostGetDevicePointer(&g_rec_d, g_rec_h, 0));
    epf_error_clear(g_rec_h);
    for (i = 0; i < 8; ++i) EPF_BENCH_CUDA(cudaEventCreate(&g_ev[i]));
    printf("bench_zoo on %s (%d SMs, %.0f GB free): copy ceiling %.0f GB/s (cudaMemcpyAsync D2D of 2 GiB, read + "
           "write counted)\n",
           prop.name, prop.multiProcessorCount, free_b / 1e9, g_ceiling);
    printf("HT: median of %d iterations per variant (events per stage, as bench_ht); LL: median of %d CUDA-graph "
           "replays (as bench_ll)\n",
           o.iters, o.reps);
  }

  for (mi = 0; mi < ZOO_NMODELS && o.do_zoo; ++mi) {
    if (!o.use_model[mi]) continue;
    for (ri = 0; ri < o.nranks; ++ri) {
      const int R = o.ranks[ri];
      const uint64_t seed = 0x200f00dull + 1000003ull * (uint64_t)mi + 7919ull * (uint64_t)R;
      if (o.do_ht) zoo_ht_group(&o, &zoo_models[mi], R, seed);
      if (o.do_ll)
        for (ti = 0; ti < o.nll; ++ti)
          zoo_ll_group(&o, &zoo_models[mi], R, o.ll_tokens[ti], seed + (uint64_t)ti, zoo_ll_cases, 5);
    }
  }
  if (o.do_apps) zoo_apps(&o);

  if (g_list) {
    printf("\n%d rows; rough run time on one H200: %.0f s\n", g_nrows, g_est_s);
  } else {
    const double end_ceiling = epf_bench_copy_ceiling_gbs((size_t)1 << 31, 10);
    printf("\n");
    zoo_print_table(&o);
    printf("copy ceiling at the end of the run: %.0f GB/s (%+.1f%% against the start)\n", end_ceiling,
           100.0 * (end_ceiling / g_ceiling - 1.0));
  }
  if (g_csv != NULL) fclose(g_csv);
  for (i = 0; i < g_nrows; ++i)
    if (g_rows[i].status != ZOO_OK) return 1;
  return 0;
}
