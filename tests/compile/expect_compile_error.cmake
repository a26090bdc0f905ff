# cmake -DNVCC=... -DINCLUDE_DIR=... -DSOURCE=... -DOUT=... -P expect_compile_error.cmake
execute_process(COMMAND "${NVCC}" -std=c++17 -arch=sm_90 -I "${INCLUDE_DIR}" -c "${SOURCE}" -o "${OUT}/fail_overload.o"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "an overloaded public device function compiled: the C-linkage guard is broken")
endif()
if(NOT "${out}${err}" MATCHES "\"C\" linkage")
  message(FATAL_ERROR "nvcc failed, but not with the expected C-linkage overload error:\n${out}${err}")
endif()
message(STATUS "nvcc refused the overload as expected")
