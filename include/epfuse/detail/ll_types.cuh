/* epfuse/detail/ll_types.cuh — forwarding header: moved to epfuse/ll/impl/types.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling; include epfuse/ll/impl/types.cuh instead
 * (CHANGELOG.md, "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_DETAIL_LL_TYPES_CUH
#define EPF_DETAIL_LL_TYPES_CUH

#include "../ll/impl/types.cuh"

#endif /* EPF_DETAIL_LL_TYPES_CUH */
