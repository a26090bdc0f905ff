# route (issue #4): the route blocks and kernels vs a CPU reference (virtual ranks; a real 1-rank
# NCCL window when epfuse::nccl exists). Exits 77 without a GPU (CTest: "Not Run").
if(TARGET epfuse::nccl)
  epf_add_test(test_route SOURCES test_route.cu GPUS 1 TIMEOUT 600 LIBS epfuse::nccl)
  target_compile_definitions(test_route PRIVATE EPF_TEST_WITH_NCCL=1)
else()
  epf_add_test(test_route SOURCES test_route.cu GPUS 1 TIMEOUT 600)
endif()
