/* epfuse/nccl.cuh — forwarding header: moved to epfuse/core/nccl.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling; include epfuse/core/nccl.cuh instead
 * (CHANGELOG.md, "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_NCCL_CUH
#define EPF_NCCL_CUH

#include "core/nccl.cuh"

#endif /* EPF_NCCL_CUH */
