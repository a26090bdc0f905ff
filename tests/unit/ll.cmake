# Low-latency mode (issue #6): the EPF_HD layout / state / check logic, on the CPU.
if(EPF_HAVE_CUDA)
  epf_add_test(test_ll_host SOURCES test_ll_host.cu LABELS unit TIMEOUT 60)
endif()
