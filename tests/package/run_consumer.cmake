# cmake -DMODE=find_package|add_subdirectory|FetchContent -DCONSUMER= -DWORK= -DPREFIX= -DEPF_SOURCE= -P run_consumer.cmake
file(REMOVE_RECURSE "${WORK}")
execute_process(COMMAND ${CMAKE_COMMAND} -S "${CONSUMER}" -B "${WORK}" -G "${GENERATOR}"
                        -DEPF_CONSUME=${MODE} -DCMAKE_PREFIX_PATH=${PREFIX} -DEPF_SOURCE=${EPF_SOURCE}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer configure (${MODE}) failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer build (${MODE}) failed")
endif()
execute_process(COMMAND "${WORK}/consumer" RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message(STATUS "${out}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "plan ok")
  message(FATAL_ERROR "consumer (${MODE}) ran with rc=${rc}")
endif()
