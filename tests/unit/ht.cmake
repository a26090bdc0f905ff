# High-throughput launchers (issue #14 §3): the host-side checks, on the CPU.
if(EPF_HAVE_CUDA)
  epf_add_test(test_ht_host SOURCES test_ht_host.cu LABELS unit TIMEOUT 60)
endif()
