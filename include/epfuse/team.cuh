/* epfuse/team.cuh — forwarding header: moved to epfuse/core/team.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling; include epfuse/core/team.cuh instead
 * (CHANGELOG.md, "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_TEAM_CUH
#define EPF_TEAM_CUH

#include "core/team.cuh"

#endif /* EPF_TEAM_CUH */
