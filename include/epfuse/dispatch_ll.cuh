/* epfuse/dispatch_ll.cuh — forwarding header: moved to epfuse/ll/impl/dispatch.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling; include epfuse/ll/impl/dispatch.cuh instead
 * (CHANGELOG.md, "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_DISPATCH_LL_CUH
#define EPF_DISPATCH_LL_CUH

#include "ll/impl/dispatch.cuh"

#endif /* EPF_DISPATCH_LL_CUH */
