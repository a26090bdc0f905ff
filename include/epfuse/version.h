/* epfuse/version.h — library version — part of epfuse v0.1
 *
 * What it is: the version macros. tests/unit checks that they agree with the CMake project version.
 * Contents:
 *   EPF_VERSION_MAJOR, EPF_VERSION_MINOR, EPF_VERSION_PATCH   integers
 *   EPF_VERSION                                              MMMmmmpp (as cub/version.cuh)
 *   EPF_VERSION_STRING                                       "M.m.p"
 *   epf_version()  (host.h)                                  the version the header was built with
 * Requirements: any C or C++ compiler.
 */
#ifndef EPF_VERSION_H
#define EPF_VERSION_H

#define EPF_VERSION_MAJOR 0
#define EPF_VERSION_MINOR 1
#define EPF_VERSION_PATCH 0
#define EPF_VERSION (EPF_VERSION_MAJOR * 100000 + EPF_VERSION_MINOR * 100 + EPF_VERSION_PATCH)
#define EPF_VERSION_STRING "0.1.0"

#endif /* EPF_VERSION_H */
/* SPDX-License-Identifier: Apache-2.0 */
