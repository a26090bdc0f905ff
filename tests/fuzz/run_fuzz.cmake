# run_fuzz.cmake — run the libFuzzer harnesses of this folder (CTest and campaigns).
#
#   cmake -DFUZZERS=<bin>[,<bin>...] -DCORPUS=<seed dir> -DWORK=<scratch dir>
#         [-DSECONDS=<s>[,<s>...]] [-DSEED=<n>] [-DJOBS=<n>] [-DKEEP=ON] -P run_fuzz.cmake
#
# Without SECONDS: replay every file of CORPUS through each fuzzer once (-runs=0) and stop.
# With SECONDS: fuzz each fuzzer for its number of seconds (one value for all, or one per fuzzer)
# from a fixed SEED (default 1), starting from CORPUS; new inputs go to WORK/<name>/corpus (wiped
# first unless KEEP=ON, so a campaign can resume), never into CORPUS. JOBS > 1 fuzzes in that many
# processes (-fork). Crashing inputs are written to WORK/<name>/ (crash-*, leak-*, timeout-*).
# Fails when a fuzzer reports anything.
if(NOT FUZZERS OR NOT CORPUS OR NOT WORK)
  message(FATAL_ERROR "run_fuzz.cmake: FUZZERS, CORPUS and WORK are required")
endif()
if(NOT DEFINED SEED)
  set(SEED 1)
endif()
# relative paths are relative to where cmake runs (the fuzzers run inside WORK)
get_filename_component(CORPUS "${CORPUS}" ABSOLUTE)
get_filename_component(WORK "${WORK}" ABSOLUTE)
string(REPLACE "," ";" fuzzers_in "${FUZZERS}")
set(fuzzers "")
foreach(f IN LISTS fuzzers_in)
  get_filename_component(f "${f}" ABSOLUTE)
  list(APPEND fuzzers "${f}")
endforeach()
string(REPLACE "," ";" seconds "${SECONDS}")
list(LENGTH fuzzers n)
list(LENGTH seconds n_seconds)
math(EXPR last "${n} - 1")
foreach(i RANGE ${last})
  list(GET fuzzers ${i} fuzzer)
  get_filename_component(name "${fuzzer}" NAME)
  set(dir "${WORK}/${name}")
  file(MAKE_DIRECTORY "${dir}")
  if(n_seconds EQUAL 0)
    message(STATUS "${name}: replaying ${CORPUS}")
    execute_process(COMMAND "${fuzzer}" -runs=0 -timeout=10 "-artifact_prefix=${dir}/" "${CORPUS}"
                    WORKING_DIRECTORY "${dir}" RESULT_VARIABLE rc)
  else()
    if(n_seconds EQUAL 1)
      list(GET seconds 0 s)
    else()
      list(GET seconds ${i} s)
    endif()
    if(NOT KEEP)
      file(REMOVE_RECURSE "${dir}/corpus")
    endif()
    file(MAKE_DIRECTORY "${dir}/corpus")
    set(fork "")
    if(JOBS AND JOBS GREATER 1)
      set(fork "-fork=${JOBS}")
    endif()
    message(STATUS "${name}: fuzzing ${s} s from seed ${SEED} (corpus ${CORPUS}, new inputs in ${dir}/corpus)")
    execute_process(COMMAND "${fuzzer}" -seed=${SEED} -max_total_time=${s} -max_len=256 -timeout=10
                            -print_final_stats=1 ${fork} "-artifact_prefix=${dir}/" "${dir}/corpus" "${CORPUS}"
                    WORKING_DIRECTORY "${dir}" RESULT_VARIABLE rc)
  endif()
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name}: the fuzzer failed (${rc}); the input is in ${dir}/")
  endif()
endforeach()
