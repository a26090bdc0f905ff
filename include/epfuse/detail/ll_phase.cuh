/* epfuse/detail/ll_phase.cuh — forwarding header: moved to epfuse/ll/impl/phase.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling; include epfuse/ll/impl/phase.cuh instead
 * (CHANGELOG.md, "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_DETAIL_LL_PHASE_CUH
#define EPF_DETAIL_LL_PHASE_CUH

#include "../ll/impl/phase.cuh"

#endif /* EPF_DETAIL_LL_PHASE_CUH */
