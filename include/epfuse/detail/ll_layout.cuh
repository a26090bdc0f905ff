/* epfuse/detail/ll_layout.cuh — forwarding header: moved to epfuse/ll/impl/layout.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling; include epfuse/ll/impl/layout.cuh instead
 * (CHANGELOG.md, "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_DETAIL_LL_LAYOUT_CUH
#define EPF_DETAIL_LL_LAYOUT_CUH

#include "../ll/impl/layout.cuh"

#endif /* EPF_DETAIL_LL_LAYOUT_CUH */
