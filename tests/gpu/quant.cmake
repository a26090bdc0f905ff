# quant/quant.cuh on one GPU (label gpu; exits 77 without a GPU, so CTest reports "Not Run" there).
epf_add_test(test_quant SOURCES test_quant.cu GPUS 1 TIMEOUT 300)

# libepf_quant_shim.so: extern "C" launchers of the quantization blocks for
# scripts/check_quant_torch.py and scripts/bench_quant_torch.py (ctypes). A build target only,
# not a test: PyTorch stays out of CTest and CI.
add_library(epf_quant_shim SHARED quant_shim.cu)
target_link_libraries(epf_quant_shim PRIVATE epfuse)
target_compile_options(epf_quant_shim PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Wall,-Wextra>)
set_target_properties(epf_quant_shim PROPERTIES OUTPUT_NAME epf_quant_shim CUDA_VISIBILITY_PRESET default)
