/* epfuse/ptx.cuh — forwarding header: moved to epfuse/core/ptx.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling; include epfuse/core/ptx.cuh instead
 * (CHANGELOG.md, "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_PTX_CUH
#define EPF_PTX_CUH

#include "core/ptx.cuh"

#endif /* EPF_PTX_CUH */
