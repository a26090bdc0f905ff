# FindNCCL.cmake — fallback for NCCL releases that ship no CMake package (2.28 and older).
#
# Hints, searched in this order before the system paths: NCCL_ROOT (CMake variable or environment),
# NCCL_HOME (environment); then, when EPF_NCCL_FROM_PYTHON is ON (its default where
# scikit-build-core builds, which sets SKBUILD), the nvidia-nccl wheel of that Python (site-packages/nvidia/nccl, the
# NCCL that PyTorch loads at run time; the interpreter is Python_EXECUTABLE, Python3_EXECUTABLE or
# python3); then the CUDA toolkit's include/lib directories (where the toolkit bundles NCCL).
# Without the Python step a Python package built on a machine with a system NCCL would compile
# against that release while PyTorch loads its wheel's, which the NCCL device API refuses.
# Result: NCCL_FOUND, NCCL_VERSION, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_DEVICE_API_FOUND,
# NCCL_PYTHON_WHEEL_DIR (the wheel found by the Python step, else empty) and the imported target NCCL::nccl (the same name NCCL's own NCCLConfig.cmake exports).
include(FindPackageHandleStandardArgs)

set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME})
set(NCCL_PYTHON_WHEEL_DIR "")
if(EPF_NCCL_FROM_PYTHON OR (DEFINED SKBUILD AND NOT DEFINED EPF_NCCL_FROM_PYTHON))
  set(_nccl_py "")
  foreach(_v Python_EXECUTABLE Python3_EXECUTABLE)
    if(NOT _nccl_py AND ${_v})
      set(_nccl_py "${${_v}}")
    endif()
  endforeach()
  if(NOT _nccl_py)
    find_program(_nccl_py_found NAMES python3 python)
    set(_nccl_py "${_nccl_py_found}")
  endif()
  if(_nccl_py)
    execute_process(COMMAND "${_nccl_py}" -c "import nvidia.nccl as m; print(list(m.__path__)[0])"
                    RESULT_VARIABLE _nccl_py_rc OUTPUT_VARIABLE _nccl_py_dir
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_nccl_py_rc EQUAL 0 AND EXISTS "${_nccl_py_dir}/include/nccl.h")
      set(NCCL_PYTHON_WHEEL_DIR "${_nccl_py_dir}")
      list(APPEND _nccl_hints "${_nccl_py_dir}")
    endif()
  endif()
endif()
if(CUDAToolkit_INCLUDE_DIRS)
  foreach(_d IN LISTS CUDAToolkit_INCLUDE_DIRS)
    get_filename_component(_p "${_d}" DIRECTORY)
    list(APPEND _nccl_hints "${_p}")
  endforeach()
endif()
if(CUDAToolkit_LIBRARY_DIR)
  get_filename_component(_p "${CUDAToolkit_LIBRARY_DIR}" DIRECTORY)
  list(APPEND _nccl_hints "${_p}")
endif()

find_path(NCCL_INCLUDE_DIR NAMES nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
# NAMES_PER_DIR: the first hint with either name wins (the nvidia-nccl wheel has only libnccl.so.2;
# searched name by name, a toolkit's libnccl.so would be linked with the wheel's headers)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_nccl_hints}
             PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_ver REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  string(REGEX REPLACE ".*NCCL_MAJOR +([0-9]+).*" "\\1" _maj "${_nccl_ver}")
  string(REGEX REPLACE ".*NCCL_MINOR +([0-9]+).*" "\\1" _min "${_nccl_ver}")
  string(REGEX REPLACE ".*NCCL_PATCH +([0-9]+).*" "\\1" _pat "${_nccl_ver}")
  set(NCCL_VERSION "${_maj}.${_min}.${_pat}")
  if(EXISTS "${NCCL_INCLUDE_DIR}/nccl_device.h")
    set(NCCL_DEVICE_API_FOUND TRUE)
  else()
    set(NCCL_DEVICE_API_FOUND FALSE)
  endif()
endif()

find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
