# route (issue #4): host.h "Route memory" — sizing, offsets, header checks. Plain C11, no GPU.
epf_add_test(test_route_host SOURCES test_route_host.c LABELS unit TIMEOUT 120)
# the same with EPF_MAX_RANKS = 1024, where int32 receive offsets can overflow and must be refused
epf_add_test(test_route_host_limits SOURCES test_route_host.c LABELS unit TIMEOUT 120)
target_compile_definitions(test_route_host_limits PRIVATE EPF_MAX_RANKS=1024)
# the launch arithmetic of route/route.cuh / route/kernels.cuh (partition, default blocks, block size,
# shared memory), host-compiled CUDA, no GPU needed
if(EPF_HAVE_CUDA)
  epf_add_test(test_route_launch_host SOURCES test_route_launch_host.cu LABELS unit TIMEOUT 60)
endif()
