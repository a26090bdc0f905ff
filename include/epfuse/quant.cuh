/* epfuse/quant.cuh — forwarding header: moved to epfuse/quant/quant.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling; include epfuse/quant/quant.cuh instead
 * (CHANGELOG.md, "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_QUANT_CUH
#define EPF_QUANT_CUH

#include "quant/quant.cuh"

#endif /* EPF_QUANT_CUH */
