/* epfuse/detail/quant_mxfp8.cuh — forwarding header: moved to epfuse/quant/impl/mxfp8.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling (it includes the file that
 * holds the same code); include the module's header epfuse/quant/quant.cuh instead (CHANGELOG.md,
 * "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_DETAIL_QUANT_MXFP8_CUH
#define EPF_DETAIL_QUANT_MXFP8_CUH

#include "../quant/impl/mxfp8.cuh"
#include "../quant/impl/rows.cuh" /* its row quantizers, now there */

#endif /* EPF_DETAIL_QUANT_MXFP8_CUH */
