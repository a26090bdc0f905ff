# Multi-GPU benchmark (issue #8): HT and LL dispatch / combine over a real NCCL team, one thread per
# GPU, against NCCL's own all-to-all of the same bytes (a program, not a test). Builds everywhere;
# exits 77 with fewer than 2 GPUs (EPF_MG_GPUS=1: a 1-GPU smoke run).
#   build-*/tests/bench/bench_mg [--ep 2,4,8] [--iters 20] [--reps 200]
if(TARGET epfuse::nccl)
  find_package(Threads REQUIRED)
  epf_add_bench(bench_mg bench_mg.cu)
  target_link_libraries(bench_mg PRIVATE epfuse::nccl Threads::Threads)
endif()
