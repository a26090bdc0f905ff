/* epfuse/route.cuh — forwarding header: moved to epfuse/route/route.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling; include epfuse/route/route.cuh instead
 * (CHANGELOG.md, "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_ROUTE_CUH
#define EPF_ROUTE_CUH

#include "route/route.cuh"

#endif /* EPF_ROUTE_CUH */
