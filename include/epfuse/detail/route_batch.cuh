/* epfuse/detail/route_batch.cuh — forwarding header: moved to epfuse/route/impl/batch.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling (it includes the file that
 * holds the same code); include the module's header epfuse/route/route.cuh instead (CHANGELOG.md,
 * "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_DETAIL_ROUTE_BATCH_CUH
#define EPF_DETAIL_ROUTE_BATCH_CUH

#include "../route/impl/batch.cuh"

#endif /* EPF_DETAIL_ROUTE_BATCH_CUH */
