/* epf_cmocka.h — include cmocka from C, C++ and CUDA test programs alike. cmocka 1.1.5 (Debian 12)
 * has no extern "C" guard of its own, so C++/CUDA drivers get one here. */
#ifndef EPF_CMOCKA_H
#define EPF_CMOCKA_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
#include <cmocka.h>
#ifdef __cplusplus
}
#endif
#endif /* EPF_CMOCKA_H */
