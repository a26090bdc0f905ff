/* epfuse/combine_ll_rm.cuh — forwarding header: moved to epfuse/ll/impl/combine_rm.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling (it includes the file that
 * holds the same code); include the module's header epfuse/ll/ll.cuh instead (CHANGELOG.md,
 * "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_COMBINE_LL_RM_CUH
#define EPF_COMBINE_LL_RM_CUH

#include "ll/impl/combine_rm.cuh"
#include "ht/impl/combine.cuh" /* the HT dispatch and combine blocks, which it used to pull in too */

#endif /* EPF_COMBINE_LL_RM_CUH */
