# Low-latency dispatch / combine (issue #6): virtual ranks, CUDA graphs, fault injection, and a
# 1-rank NCCL window when epfuse::nccl exists.
if(TARGET epfuse::nccl)
  epf_add_test(test_ll SOURCES test_ll.cu GPUS 1 TIMEOUT 600 LIBS epfuse::nccl)
  target_compile_definitions(test_ll PRIVATE EPF_TEST_WITH_NCCL=1)
else()
  epf_add_test(test_ll SOURCES test_ll.cu GPUS 1 TIMEOUT 600)
endif()
