/* epfuse/kernels_ht.cuh — forwarding header: moved to epfuse/ht/kernels.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling; include epfuse/ht/kernels.cuh instead
 * (CHANGELOG.md, "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_KERNELS_HT_CUH
#define EPF_KERNELS_HT_CUH

#include "ht/kernels.cuh"

#endif /* EPF_KERNELS_HT_CUH */
