/* ll_switches.cu — the LL build switches for measurement (EPF_LL_SLOT_UNROLL_SEND,
 * EPF_LL_COMBINE_EARLY_SIGNAL, EPF_LL_COMBINE_LOADS_FIRST; docs/dev/perf-log/ll.md, v7)
 * compiled on, so that the
 * code behind them keeps compiling while they are off by default. Building is the test: the
 * kernels whose code the switches change are referenced, so nvcc compiles them. */
#include "epfuse/kernels_ll.cuh"

#if !EPF_LL_SLOT_UNROLL_SEND || !EPF_LL_COMBINE_EARLY_SIGNAL || !EPF_LL_COMBINE_LOADS_FIRST
#error "ll_switches.cu is compiled with every LL build switch on"
#endif

const void* epf_compile_ll_switches_kernels[] = {
    (const void*)epf_ll_dispatch_kernel,          (const void*)epf_ll_rm_dispatch_kernel,
    (const void*)epf_ll_combine_kernel,           (const void*)epf_ll_combine_backward_kernel,
    (const void*)epf_ll_dispatch_backward_kernel, (const void*)epf_ll_rm_combine_backward_kernel,
};
