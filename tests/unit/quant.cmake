# quant/quant.cuh: the EPF_HD reference functions on the CPU (a .cu compiled by nvcc, run on the host;
# no GPU needed). Included by tests/unit/CMakeLists.txt.
if(EPF_HAVE_CUDA)
  epf_add_test(test_quant_host SOURCES test_quant_host.cu LABELS unit TIMEOUT 300)
endif()
