/* epfuse/detail/route_count.cuh — forwarding header: moved to epfuse/route/impl/count.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling (it includes the file that
 * holds the same code); include the module's header epfuse/route/route.cuh instead (CHANGELOG.md,
 * "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_DETAIL_ROUTE_COUNT_CUH
#define EPF_DETAIL_ROUTE_COUNT_CUH

#include "../route/impl/count.cuh"

#endif /* EPF_DETAIL_ROUTE_COUNT_CUH */
