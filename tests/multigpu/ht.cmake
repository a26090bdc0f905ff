# HT route + dispatch + experts + combine over real NCCL, one thread per GPU (issue #8): exits 77
# ("Not Run") with fewer than 2 GPUs; EPF_MG_GPUS=1 makes it a 1-GPU smoke run.
epf_add_test(test_mg_ht SOURCES test_mg_ht.cu GPUS 2 LABELS multigpu TIMEOUT 900
             LIBS epfuse::nccl Threads::Threads)
