# Low-latency dispatch + combine over real NCCL, one thread per GPU (issue #8): T = 1 and 128,
# BF16 and MXFP8, zero-copy and packed receive, push and pull combine, back-to-back rounds, CUDA
# graphs, fault injection. Exits 77 ("Not Run") with fewer than 2 GPUs; EPF_MG_GPUS=1 for a
# 1-GPU smoke run.
epf_add_test(test_mg_ll SOURCES test_mg_ll.cu GPUS 2 LABELS multigpu TIMEOUT 900
             LIBS epfuse::nccl Threads::Threads)
