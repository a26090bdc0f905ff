/* test_capi_wrong_arch — the cudaError_t behind EPF_ERR_CUDA survives: libepfuse built for sm_100
 * only, loaded on an sm_90 GPU; its route init (a memset and a kernel launch) must return
 * EPF_ERR_CUDA, and epf_cuda_last_error must say cudaErrorNoKernelImageForDevice (209) with its
 * message. Exit 77 without a GPU, or when the GPU runs the sm_100 code. */
#define _GNU_SOURCE 1
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epfuse/host.h"

typedef void (*any_fn)(void);
static void* g_lib;
static any_fn fn(const char* name) {
  void* p = dlsym(g_lib, name);
  any_fn f;
  if (p == NULL) {
    fprintf(stderr, "missing %s\n", name);
    return NULL;
  }
  memcpy(&f, &p, sizeof(f));
  return f;
}

int main(void) {
  epf_config_t cfg = EPF_CONFIG_INIT;
  epf_route_config_t rc = EPF_ROUTE_CONFIG_INIT;
  epf_plan_t plan;
  epf_route_t route;
  uint64_t bytes = 0;
  void* buf = NULL;
  int n = 0, err;
  epf_status_t st;
  const char* path = getenv("EPF_TEST_WRONG_ARCH_LIB"); /* a copy elsewhere (e.g. a GPU machine) */
  g_lib = dlopen(path != NULL ? path : EPF_TEST_WRONG_ARCH_LIB, RTLD_NOW | RTLD_LOCAL);
  if (g_lib == NULL) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  if (((epf_status_t(*)(int*))fn("epf_cuda_device_count"))(&n) != EPF_OK || n == 0) {
    printf("no GPU: not run\n");
    return 77;
  }
  cfg.nranks = 2;
  cfg.num_experts = 16;
  cfg.top_k = 2;
  cfg.hidden = 256;
  cfg.max_tokens_per_rank = 8;
  if (((epf_status_t(*)(const epf_config_t*, epf_plan_t*))fn("epf_plan_compute"))(&cfg, &plan) != EPF_OK ||
      ((epf_status_t(*)(const epf_plan_t*, const epf_route_config_t*, uint64_t*))fn("epf_route_size"))(&plan, &rc, &bytes) != EPF_OK ||
      ((epf_status_t(*)(void**, size_t))fn("epf_cuda_malloc"))(&buf, (size_t)bytes * 2) != EPF_OK) {
    fprintf(stderr, "setup failed\n");
    return 1;
  }
  st = ((epf_status_t(*)(const epf_plan_t*, const epf_route_config_t*, void*, uint64_t, int, uint32_t, void*,
                         epf_route_t*))fn("epf_route_init"))(&plan, &rc, buf, bytes * 2, 2, 1u, NULL, &route);
  if (st == EPF_OK) {
    printf("the GPU runs the library's sm_100 code: nothing to check here\n");
    return 77;
  }
  err = ((int (*)(void))fn("epf_cuda_last_error"))();
  printf("sm_100-only library on this GPU: epf_route_init -> %s; epf_cuda_last_error() = %d: %s\n",
         epf_status_name(st), err, ((const char* (*)(int))fn("epf_cuda_error_string"))(err));
  if (st != EPF_ERR_CUDA || err != 209 /* cudaErrorNoKernelImageForDevice */) {
    printf("FAILED: want EPF_ERR_CUDA with cudaErrorNoKernelImageForDevice (209)\n");
    return 1;
  }
  printf("PASSED\n");
  return 0;
}
