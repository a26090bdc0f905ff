/* epfuse/kernels_ll.cuh — forwarding header: moved to epfuse/ll/kernels.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling; include epfuse/ll/kernels.cuh instead
 * (CHANGELOG.md, "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_KERNELS_LL_CUH
#define EPF_KERNELS_LL_CUH

#include "ll/kernels.cuh"
#include "ht/impl/combine.cuh" /* the HT dispatch and combine blocks, which it used to pull in too */

#endif /* EPF_KERNELS_LL_CUH */
