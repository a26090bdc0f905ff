# MXFP8 and per-128 FP8 quantization of a [32768, 7168] BF16 tensor against the measured copy
# ceiling (a program, not a test: scripts/gpu_suite.sh runs every bench_* built here).
epf_add_bench(bench_quant bench_quant.cu)
