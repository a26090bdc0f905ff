/* tests/nvrtc/test_nvrtc.c — the device headers compile under NVRTC (run-time compilation)
 *
 * No GPU needed: NVRTC compiles to PTX (compute_90) and to a cubin (sm_90) without a device.
 *
 *   test_nvrtc [--strict] <epfuse include dir> [<extra include dir>...]
 *
 * The extra directories are the toolkit's include directory and its CCCL directory
 * (<cuda>/include/cccl since CUDA 13): route/route.cuh and ll/ll.cuh use cub, core/bf16.cuh (and so
 * ht/ht.cuh and ll/ll.cuh) <cuda_bf16.h>.
 *
 * What it checks:
 *   1. every device header alone (twice in one program: the include guard), with all include
 *      directories, as a JIT engine would compile it (no -default-device);
 *   2. the headers that need nothing from the toolkit, with only the epfuse include directory
 *      (config.h's own fixed-width typedefs instead of libcu++'s);
 *   3. a program of kernels built from public blocks (team, wait, handshake, MXFP8 / FP8
 *      quantization, route update, HT dispatch / combine, LL dispatch / combine), to PTX for
 *      compute_90 (its entry points must be there; EPF_DEBUG on) and to a cubin for sm_90 (an ELF
 *      image; -DNDEBUG).
 * A header whose only errors are host.h's host-only inline functions (a host function is an error
 * in NVRTC) is reported as such and compiled again with -default-device, which must then succeed;
 * --strict (or EPF_NVRTC_STRICT=1) makes that a failure.
 *
 * Exit: 0 pass, 1 fail (the NVRTC log is printed), 77 when NVRTC is not available (skip).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(EPF_NO_NVRTC)
int main(void) {
  printf("SKIPPED: NVRTC not available (no CUDA::nvrtc at configure time)\n");
  return 77;
}
#else
#include <nvrtc.h>

#define MAX_OPTS 32

static const char* g_inc[MAX_OPTS];
static int g_ninc = 0;
static int g_strict = 0;
static int g_fail = 0;

/* The device headers (what epfuse.cuh includes, and epfuse.cuh), and the ready-made kernels
 * (<module>/kernels.cuh: their host launchers are left out under NVRTC, the kernels compile).
 * core/nccl.cuh is left out: NCCL's own device headers include <stdint.h> and the CUDA runtime
 * and do not compile under NVRTC. */
static const char* const k_headers[] = {
    "config.h",        "status.h",        "version.h",       "host.h",          "core/ptx.cuh",
    "core/team.cuh",   "core/signal.cuh", "core/rows.cuh",   "core/bf16.cuh",   "quant/quant.cuh",
    "route/route.cuh", "ht/ht.cuh",       "ll/ll.cuh",       "epfuse.cuh",      "route/kernels.cuh",
    "ht/kernels.cuh",  "ll/kernels.cuh"};
/* ... and those that compile with only epfuse's include directory */
static const char* const k_headers_standalone[] = {"config.h",      "status.h",        "version.h",
                                                    "host.h",        "core/ptx.cuh",    "core/team.cuh",
                                                    "core/signal.cuh", "core/rows.cuh", "quant/quant.cuh"};

/* The program of step 3, one line per string (C11 limits a literal to 4095 characters). */
static const char* const k_program[] = {
    "#include \"epfuse/epfuse.cuh\"", /* every block, HT and LL */
    /* team views, the bounded wait, the setup handshake, MXFP8 and per-128 FP8 quantization */
    "extern \"C\" __global__ void epf_nvrtc_quant(void* base, const epf_plan_t* plan, int nranks,",
    "    epf_error_record_t* rec, const uint32_t* abort_word, const void* x, int hidden,",
    "    uint8_t* q, uint8_t* scales, float* fp8_scales, epf_status_t* out) {",
    "  epf_team_t team = epf_team_virtual(base, plan->total_bytes, (int)blockIdx.x, nranks);",
    "  epf_wait_t w = epf_wait_make(plan->timeout_ns, rec, abort_word, team.rank);",
    "  epf_status_t st = epf_handshake_block(team, plan, 1u, w);",
    "  int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;",
    "  const char* xr = (const char*)x + row * hidden * 2;",
    "  epf_mxfp8_quantize_row_bf16_warp(xr, hidden, EPF_MX_RCEIL, row, EPF_SCALE_LAYOUT_COMPACT,",
    "                                   q + row * hidden, scales);",
    "  epf_fp8_128_quantize_row_bf16_warp(xr, hidden, true, 1, q + row * hidden,",
    "                                     fp8_scales + row * (hidden / EPF_FP8_128_GROUP));",
    "  if (threadIdx.x == 0) out[blockIdx.x] = st;",
    "}",
    /* the route update (cub warp scans) */
    "extern \"C\" __global__ void epf_nvrtc_route(const epf_route_t* route, void* base,",
    "    const epf_plan_t* plan, const void* topk_idx, int num_tokens, epf_error_record_t* rec,",
    "    int64_t* recv_total, epf_status_t* out) {",
    "  extern __shared__ char smem[];",
    "  epf_team_t team = epf_team_virtual(base, plan->total_bytes, (int)blockIdx.x, plan->nranks);",
    "  epf_wait_t w = epf_wait_make(plan->timeout_ns, rec, NULL, team.rank);",
    "  epf_status_t st = epf_route_update_block(route, 0, team, plan, topk_idx, num_tokens, 0, 1, w,",
    "                                          recv_total, smem);",
    "  if (threadIdx.x == 0) out[blockIdx.x] = st;",
    "}",
    /* high-throughput dispatch / combine blocks */
    "extern \"C\" __global__ void epf_nvrtc_ht(void* base, const epf_plan_t* plan, const void* row,",
    "    void* out_row, uint32_t epoch, epf_error_record_t* rec, epf_status_t* out) {",
    "  epf_team_t team = epf_team_virtual(base, plan->total_bytes, (int)blockIdx.x, plan->nranks);",
    "  epf_wait_t w = epf_wait_make(plan->timeout_ns, rec, NULL, team.rank);",
    "  int dst = (team.rank + 1) % team.nranks;",
    "  if (threadIdx.x < 32) epf_dispatch_send_row_warp(team, plan, row, dst, 0, 1);",
    "  epf_dispatch_signal_block(team, plan, epoch);",
    "  epf_status_t st = epf_dispatch_wait_block(team, plan, epoch, w);",
    "  if (threadIdx.x < 32) epf_combine_pull_row_warp(team, plan, dst, 0, 1.0f, 1, out_row);",
    "  epf_combine_signal_block(team, plan, epoch);",
    "  if (st == EPF_OK) st = epf_combine_wait_block(team, plan, epoch, w);",
    "  if (threadIdx.x == 0) out[blockIdx.x] = st;",
    "}",
    /* low-latency dispatch / combine blocks */
    "extern \"C\" __global__ void epf_nvrtc_ll(void* base, const epf_plan_t* plan,",
    "    epf_ll_state_t* state, epf_error_record_t* rec, const epf_ll_dispatch_args_t* d,",
    "    const epf_ll_combine_args_t* c, epf_status_t* out) {",
    "  extern __shared__ char smem[];",
    "  epf_team_t team = epf_team_virtual(base, plan->total_bytes, (int)blockIdx.x, plan->nranks);",
    "  epf_ll_ctx_t ctx = epf_ll_ctx_make(team, state + blockIdx.x, rec, NULL, 0, 1);",
    "  epf_ll_dispatch_send_block(plan, ctx, d, smem);",
    "  epf_status_t st = epf_ll_dispatch_recv_block(plan, ctx, d, smem);",
    "  epf_ll_combine_send_block(plan, ctx, c, smem);",
    "  if (st == EPF_OK) st = epf_ll_combine_recv_block(plan, ctx, c, smem);",
    "  if (threadIdx.x == 0) out[blockIdx.x] = st;",
    "}",
};
static const char* const k_entries[] = {"epf_nvrtc_quant", "epf_nvrtc_route", "epf_nvrtc_ht",
                                        "epf_nvrtc_ll"};

#define COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))

typedef struct result {
  nvrtcResult rc;
  char* log;
  char* code; /* PTX or cubin */
  size_t code_size;
} result_t;

static void result_free(result_t* r) {
  free(r->log);
  free(r->code);
  memset(r, 0, sizeof(*r));
}

/* Compile `src` with the include directories [0, ninc), `arch` and the `extra` options. With
 * want_cubin the code is the cubin, else the PTX. */
static result_t compile(const char* src, const char* name, int ninc, const char* arch,
                        const char* const* extra, int nextra, int want_cubin) {
  static char inc_opts[MAX_OPTS][4096];
  const char* opts[MAX_OPTS * 2];
  int n = 0, i;
  nvrtcProgram prog;
  result_t r;
  size_t sz = 0;
  memset(&r, 0, sizeof(r));
  opts[n++] = arch;
  opts[n++] = "-std=c++17";
  for (i = 0; i < ninc; ++i) {
    snprintf(inc_opts[i], sizeof(inc_opts[i]), "--include-path=%s", g_inc[i]);
    opts[n++] = inc_opts[i];
  }
  for (i = 0; i < nextra; ++i) opts[n++] = extra[i];
  r.rc = nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL);
  if (r.rc != NVRTC_SUCCESS) return r;
  r.rc = nvrtcCompileProgram(prog, n, opts);
  if (nvrtcGetProgramLogSize(prog, &sz) == NVRTC_SUCCESS && sz > 0) {
    r.log = (char*)calloc(sz + 1, 1);
    if (r.log) nvrtcGetProgramLog(prog, r.log);
  }
  if (r.rc == NVRTC_SUCCESS) {
    nvrtcResult e = want_cubin ? nvrtcGetCUBINSize(prog, &r.code_size) : nvrtcGetPTXSize(prog, &r.code_size);
    if (e == NVRTC_SUCCESS && r.code_size > 0) {
      r.code = (char*)calloc(r.code_size + 1, 1);
      if (r.code) e = want_cubin ? nvrtcGetCUBIN(prog, r.code) : nvrtcGetPTX(prog, r.code);
    }
    if (e != NVRTC_SUCCESS || r.code == NULL) r.rc = e != NVRTC_SUCCESS ? e : NVRTC_ERROR_OUT_OF_MEMORY;
  }
  nvrtcDestroyProgram(&prog);
  return r;
}

/* every error in the log is in epfuse/host.h (its host-only inline functions) */
static int only_host_h_errors(const char* log) {
  const char* line = log;
  int errors = 0;
  if (log == NULL) return 0;
  while (*line) {
    const char* end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    char buf[1024];
    if (len >= sizeof(buf)) len = sizeof(buf) - 1;
    memcpy(buf, line, len);
    buf[len] = 0;
    if (strstr(buf, "error: ") != NULL && strstr(buf, "errors detected") == NULL) {
      ++errors;
      if (strstr(buf, "epfuse/host.h(") == NULL) return 0;
    }
    if (!end) break;
    line = end + 1;
  }
  return errors > 0;
}

static void print_log(const char* what, const result_t* r) {
  printf("---- NVRTC log (%s): %s\n%s\n----\n", what, nvrtcGetErrorString(r->rc), r->log ? r->log : "");
}

/* Step 1 / 2: one header alone. */
static void check_header(const char* h, int ninc, const char* mode) {
  static const char* const dd[] = {"-default-device"};
  char src[512], name[256];
  result_t r;
  snprintf(src, sizeof(src),
           "#include \"epfuse/%s\"\n#include \"epfuse/%s\"\n"
           "extern \"C\" __global__ void epf_nvrtc_anchor(int* p) { if (p) *p = 0; }\n",
           h, h);
  snprintf(name, sizeof(name), "nvrtc_%s.cu", h);
  r = compile(src, name, ninc, "-arch=compute_90", NULL, 0, 0);
  if (r.rc == NVRTC_SUCCESS) {
    printf("  %-16s %s: ok\n", h, mode);
  } else if (only_host_h_errors(r.log)) {
    result_t r2 = compile(src, name, ninc, "-arch=compute_90", dd, 1, 0);
    if (r2.rc == NVRTC_SUCCESS && !g_strict) {
      printf("  %-16s %s: ok with -default-device only (host.h: host-only inline functions "
             "without a __CUDACC_RTC__ guard)\n", h, mode);
    } else {
      printf("  %-16s %s: FAIL\n", h, mode);
      print_log(h, r2.rc == NVRTC_SUCCESS ? &r : &r2);
      g_fail = 1;
    }
    result_free(&r2);
  } else {
    printf("  %-16s %s: FAIL\n", h, mode);
    print_log(h, &r);
    g_fail = 1;
  }
  result_free(&r);
}

/* Step 3: the program, to PTX or a cubin. */
static void check_program(const char* arch, int want_cubin, int ndebug) {
  const char* opts[2];
  int nopts = 0;
  char* src;
  size_t len = 1;
  int i, ok = 1;
  result_t r;
  char what[128];
  for (i = 0; i < COUNT(k_program); ++i) len += strlen(k_program[i]) + 1;
  src = (char*)calloc(len, 1);
  if (!src) {
    printf("out of memory\n");
    g_fail = 1;
    return;
  }
  for (i = 0; i < COUNT(k_program); ++i) {
    strcat(src, k_program[i]);
    strcat(src, "\n");
  }
  snprintf(what, sizeof(what), "program %s%s -> %s", arch, ndebug ? " -DNDEBUG" : "",
           want_cubin ? "cubin" : "PTX");
  if (ndebug) opts[nopts++] = "-DNDEBUG";
  r = compile(src, "epf_nvrtc_program.cu", g_ninc, arch, opts, nopts, want_cubin);
  if (r.rc != NVRTC_SUCCESS && only_host_h_errors(r.log) && !g_strict) {
    printf("  %s: only host.h's host-only functions fail; compiled again with -default-device\n", what);
    result_free(&r);
    opts[nopts++] = "-default-device";
    r = compile(src, "epf_nvrtc_program.cu", g_ninc, arch, opts, nopts, want_cubin);
  }
  if (r.rc != NVRTC_SUCCESS) {
    printf("  %s: FAIL\n", what);
    print_log(what, &r);
    g_fail = 1;
  } else if (want_cubin) {
    ok = r.code_size > 4 && memcmp(r.code, "\177ELF", 4) == 0;
    printf("  %s: %s (%zu bytes)\n", what, ok ? "ok" : "FAIL: not an ELF image", r.code_size);
  } else {
    for (i = 0; i < COUNT(k_entries); ++i) {
      char entry[128];
      snprintf(entry, sizeof(entry), ".entry %s(", k_entries[i]);
      if (strstr(r.code, entry) == NULL) {
        printf("  %s: FAIL: no '%s' in the PTX\n", what, entry);
        ok = 0;
      }
    }
    if (ok) printf("  %s: ok (%zu bytes, %d entries)\n", what, r.code_size, COUNT(k_entries));
  }
  if (!ok) g_fail = 1;
  result_free(&r);
  free(src);
}

int main(int argc, char** argv) {
  int major = 0, minor = 0, i;
  const char* env = getenv("EPF_NVRTC_STRICT");
  if (env && env[0] && strcmp(env, "0") != 0) g_strict = 1;
  for (i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--strict") == 0) {
      g_strict = 1;
    } else if (g_ninc < MAX_OPTS) {
      g_inc[g_ninc++] = argv[i];
    }
  }
  if (g_ninc == 0) {
    fprintf(stderr, "usage: %s [--strict] <epfuse include dir> [<extra include dir>...]\n", argv[0]);
    return 2;
  }
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) {
    printf("SKIPPED: NVRTC not available\n");
    return 77;
  }
  printf("NVRTC %d.%d; include directories:", major, minor);
  for (i = 0; i < g_ninc; ++i) printf(" %s", g_inc[i]);
  printf("%s\n", g_strict ? " (strict)" : "");

  printf("1. each device header alone, all include directories, compute_90:\n");
  for (i = 0; i < COUNT(k_headers); ++i) check_header(k_headers[i], g_ninc, "full");
  printf("2. headers that need nothing from the toolkit, epfuse include directory only:\n");
  for (i = 0; i < COUNT(k_headers_standalone); ++i) check_header(k_headers_standalone[i], 1, "epfuse-only");
  printf("3. a program of kernels built from the public blocks:\n");
  check_program("-arch=compute_90", 0, 0); /* debug (EPF_DEBUG 1) to PTX */
  check_program("-arch=sm_90", 1, 1);      /* -DNDEBUG to a cubin */

  printf("%s\n", g_fail ? "FAIL" : "PASS");
  return g_fail ? 1 : 0;
}
#endif
/* SPDX-License-Identifier: Apache-2.0 */
