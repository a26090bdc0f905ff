# Model-zoo benchmark (issue #17): one table of HT / LL dispatch and combine over public MoE shapes
# (DeepSeek-V3, Kimi-K2, Qwen3-235B / 30B, gpt-oss-120b, Llama-4-Maverick, Mixtral-8x22B) x layouts x
# payloads x combine modes x 4 / 8 / 16 virtual ranks, and the configurations the examples and the
# Python package run (issue #31), against the copy ceiling of the same run.
#   build-*/tests/bench/bench_zoo [--csv docs/perf-zoo.csv] [--torch zoo_torch.csv]   (~4 min, H200)
#   build-*/tests/bench/bench_zoo --list        the rows, minimal and HBM bytes and targets, no CUDA
#   build-*/tests/bench/bench_zoo --apps        the application rows alone
# Unlike the other benchmarks it has CTest entries, all quick: the host-only listing and the
# host-only check of its minimal-bytes formulas against hand-worked values (label unit: they run
# without a GPU), and a GPU smoke run of --quick (label gpu, skip code 77 without one).
epf_add_bench(bench_zoo bench_zoo.cu)
add_test(NAME bench_zoo_list COMMAND bench_zoo --list --quick)
set_tests_properties(bench_zoo_list PROPERTIES LABELS "unit;bench" TIMEOUT 60)
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  add_test(NAME bench_zoo_min_bytes
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/check_zoo_bytes.py $<TARGET_FILE:bench_zoo>)
  set_tests_properties(bench_zoo_min_bytes PROPERTIES LABELS "unit;bench" TIMEOUT 60)
endif()
add_test(NAME bench_zoo_quick COMMAND bench_zoo --quick)
set_tests_properties(bench_zoo_quick PROPERTIES LABELS "gpu;bench" TIMEOUT 300 SKIP_RETURN_CODE 77
                     RESOURCE_GROUPS "gpus:1")
