/* epfuse/dispatch_ll_rm.cuh — forwarding header: moved to epfuse/ll/impl/dispatch_rm.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling (it includes the file that
 * holds the same code); include the module's header epfuse/ll/ll.cuh instead (CHANGELOG.md,
 * "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_DISPATCH_LL_RM_CUH
#define EPF_DISPATCH_LL_RM_CUH

#include "ll/impl/dispatch_rm.cuh"
#include "ht/impl/dispatch.cuh" /* the HT dispatch blocks, which it used to pull in too */

#endif /* EPF_DISPATCH_LL_RM_CUH */
