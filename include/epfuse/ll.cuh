/* epfuse/ll.cuh — forwarding header: moved to epfuse/ll/ll.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling; include epfuse/ll/ll.cuh instead
 * (CHANGELOG.md, "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_LL_CUH
#define EPF_LL_CUH

#include "ll/ll.cuh"
#include "ht/impl/dispatch.cuh" /* the HT dispatch blocks, which it used to pull in too */

#endif /* EPF_LL_CUH */
