# EpfTesting.cmake — epf_add_test: one place for labels, timeouts, skip code 77 and GPU resources.
#
#   epf_add_test(<name> SOURCES <files...> [LABELS <labels...>] [GPUS <n>] [TIMEOUT <s>]
#                [LIBS <targets...>] [ARGS <args...>])
#
# GPUS n > 0 adds the label "gpu" and RESOURCE_GROUPS "gpus:1" n times, so
# `ctest --resource-spec-file gpus.json -j` never oversubscribes a device. Every test gets
# SKIP_RETURN_CODE 77: a GPU program on a machine without the GPUs it needs exits 77 and CTest
# reports it "Not Run" (skipped), never "Passed".
function(epf_add_test name)
  cmake_parse_arguments(T "" "GPUS;TIMEOUT" "SOURCES;LABELS;LIBS;ARGS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  if(NOT T_GPUS)
    set(T_GPUS 0)
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE epf_test_options ${T_LIBS})
  add_test(NAME ${name} COMMAND ${name} ${T_ARGS})
  set(labels ${T_LABELS})
  if(T_GPUS GREATER 0)
    list(APPEND labels gpu)
    set(groups "")
    foreach(i RANGE 1 ${T_GPUS})
      list(APPEND groups "gpus:1")
    endforeach()
    string(JOIN "," groups ${groups})
    set_tests_properties(${name} PROPERTIES RESOURCE_GROUPS "${groups}")
  endif()
  list(REMOVE_DUPLICATES labels)
  set_tests_properties(${name} PROPERTIES LABELS "${labels}" TIMEOUT ${T_TIMEOUT} SKIP_RETURN_CODE 77
                       ENVIRONMENT "CMOCKA_MESSAGE_OUTPUT=stdout")
endfunction()
