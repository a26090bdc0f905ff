/* epfuse/kernels_route.cuh — forwarding header: moved to epfuse/route/kernels.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling; include epfuse/route/kernels.cuh instead
 * (CHANGELOG.md, "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_KERNELS_ROUTE_CUH
#define EPF_KERNELS_ROUTE_CUH

#include "route/kernels.cuh"

#endif /* EPF_KERNELS_ROUTE_CUH */
