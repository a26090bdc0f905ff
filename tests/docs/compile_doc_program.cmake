# compile_doc_program.cmake — build a program straight from the docs: the code block that follows
# the line <!-- snippet: SNIPPET --> in DOC, written out as it stands and compiled and linked with
# the command the doc shows (nvcc -std=c++17 -arch=sm_90 -I include <file> -o <binary>), so "the
# first program compiles as shown" is a test (test_doc_snippets keeps the block verbatim).
#   cmake -DNVCC=... -DROOT=<repository> -DDOC=docs/getting-started.md
#         -DSNIPPET=examples/00_first_kernel/main.cu#first_kernel -DOUT=<dir> -P compile_doc_program.cmake
file(READ "${ROOT}/${DOC}" text)
string(FIND "${text}" "<!-- snippet: ${SNIPPET} -->" at)
if(at LESS 0)
  message(FATAL_ERROR "${DOC}: no <!-- snippet: ${SNIPPET} --> block")
endif()
string(SUBSTRING "${text}" ${at} -1 rest)
string(FIND "${rest}" "\n```" open)
if(open LESS 0)
  message(FATAL_ERROR "${DOC}: no code block after <!-- snippet: ${SNIPPET} -->")
endif()
math(EXPR open "${open} + 1")
string(SUBSTRING "${rest}" ${open} -1 rest)
string(FIND "${rest}" "\n" eol) # the end of the opening fence line
math(EXPR eol "${eol} + 1")
string(SUBSTRING "${rest}" ${eol} -1 rest)
string(FIND "${rest}" "\n```" close)
if(close LESS 0)
  message(FATAL_ERROR "${DOC}: the code block after <!-- snippet: ${SNIPPET} --> is not closed")
endif()
string(SUBSTRING "${rest}" 0 ${close} code)
file(MAKE_DIRECTORY "${OUT}")
file(WRITE "${OUT}/doc_program.cu" "${code}\n")
execute_process(COMMAND "${NVCC}" -std=c++17 -arch=sm_90 -I "${ROOT}/include" "${OUT}/doc_program.cu" -o "${OUT}/doc_program"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the program of ${DOC} (${SNIPPET}) does not compile as shown:\n${out}${err}")
endif()
message(STATUS "${DOC}: the program after <!-- snippet: ${SNIPPET} --> compiles and links as shown")
