/* test_abi.cu — the layout freeze of the structs that live in the CUDA headers and cross the C ABI
 * (libepfuse.so) by pointer or by value: the versioned HT step, and the prefix-less structs that
 * are frozen at their size (an INIT function of capi.h writes exactly sizeof of the library's build
 * into the caller's struct, and a by-value struct must match its mirror byte for byte, so growing
 * one of these is an ABI break: give it a size / magic / version prefix first, as epf_ht_step_t).
 * Compiling this file is the test (nvcc). */
#include <stddef.h>

#include "epfuse/ht/kernels.cuh"
#include "epfuse/ll/kernels.cuh"
#include "epfuse/route/kernels.cuh"

#define EPF_ABI(cond) EPF_STATIC_ASSERT(cond, #cond)

/* epf_ht_step_t version 1: the prefix first (issue #30; before it, 120 and then 144 bytes) */
EPF_ABI(offsetof(epf_ht_step_t, size) == 0);
EPF_ABI(offsetof(epf_ht_step_t, magic) == 4);
EPF_ABI(offsetof(epf_ht_step_t, version) == 8);
EPF_ABI(offsetof(epf_ht_step_t, reserved0) == 12);
EPF_ABI(offsetof(epf_ht_step_t, x) == 16);
EPF_ABI(offsetof(epf_ht_step_t, state) == 72);
EPF_ABI(offsetof(epf_ht_step_t, expert_rows) == 80);
EPF_ABI(offsetof(epf_ht_step_t, x_quantized) == 88);
EPF_ABI(offsetof(epf_ht_step_t, blocks_per_rank) == 92);
EPF_ABI(offsetof(epf_ht_step_t, wait) == 96);
EPF_ABI(offsetof(epf_ht_step_t, topk_idx) == 136);
EPF_ABI(offsetof(epf_ht_step_t, topk_weights_grad) == 152);
EPF_ABI(sizeof(epf_ht_step_t) == 160);
EPF_ABI(EPF_HT_STEP_MAGIC == 0x53485045u && EPF_HT_STEP_VERSION == 1u && EPF_HT_STEP_MIN_SIZE == 160u);

/* frozen, prefix-less */
EPF_ABI(sizeof(epf_team_t) == 32);
EPF_ABI(sizeof(epf_wait_t) == 40);
EPF_ABI(sizeof(epf_route_step_t) == 72);
EPF_ABI(offsetof(epf_route_step_t, wait) == 32);
EPF_ABI(sizeof(epf_ht_state_t) == 32);
EPF_ABI(sizeof(epf_ll_dispatch_args_t) == 80);
EPF_ABI(sizeof(epf_ll_combine_args_t) == 72);
EPF_ABI(sizeof(epf_ll_launch_t) == sizeof(epf_plan_t) + 72);

/* enumerations the C ABI takes as int */
EPF_ABI(EPF_LL_BUF_X == 0 && EPF_LL_BUF_TOPK_IDX == 1 && EPF_LL_BUF_WEIGHT_GRAD == 10);
EPF_ABI(EPF_INDEX_DEFAULT == 0 && EPF_INDEX_INT32 == 1 && EPF_INDEX_INT64 == 2);

int epf_abi_cuda_test_anchor(void);
int epf_abi_cuda_test_anchor(void) { return 0; }
