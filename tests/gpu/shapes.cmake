# Randomized shape-space test (route, HT, LL on virtual ranks) against the CPU references of
# tests/common, bit for bit; a 60 s wall-time budget per run (--seconds / EPF_SHAPES_SECONDS),
# a one-line repro command for every failing configuration. Exits 77 without a GPU.
epf_add_test(test_shapes SOURCES test_shapes.cu GPUS 1 TIMEOUT 300)
