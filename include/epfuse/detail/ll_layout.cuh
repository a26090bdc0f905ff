/* epfuse/detail/ll_layout.cuh — forwarding header: moved to epfuse/ll/impl/layout.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling (it includes the file that
 * holds the same code); include the module's header epfuse/ll/ll.cuh instead (CHANGELOG.md,
 * "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_DETAIL_LL_LAYOUT_CUH
#define EPF_DETAIL_LL_LAYOUT_CUH

#include "../ll/impl/layout.cuh"
#include "../ht/impl/dispatch.cuh" /* the HT dispatch blocks, which it used to pull in too */

#endif /* EPF_DETAIL_LL_LAYOUT_CUH */
