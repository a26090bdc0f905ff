/* Must NOT compile: two public (non-static, C-linkage) device functions with one name. This is
 * what keeps epfuse template- and overload-free (STYLE.md §8). expect_compile_error.cmake runs
 * nvcc on it and passes only if nvcc reports the C-linkage overload error. */
#include "epfuse/config.h"
EPF_BEGIN_DECLS
EPF_DEVICE_INLINE int epf_test_overloaded(int x) { return x; }
EPF_DEVICE_INLINE float epf_test_overloaded(float x) { return x; }
EPF_END_DECLS
__global__ void k(int* o) { *o = epf_test_overloaded(1); }
