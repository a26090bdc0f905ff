/* epfuse/detail/quant_fp8_128.cuh — forwarding header: moved to epfuse/quant/impl/fp8_128.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling (it includes the file that
 * holds the same code); include the module's header epfuse/quant/quant.cuh instead (CHANGELOG.md,
 * "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_DETAIL_QUANT_FP8_128_CUH
#define EPF_DETAIL_QUANT_FP8_128_CUH

#include "../quant/impl/fp8_128.cuh"
#include "../quant/impl/rows.cuh" /* its row quantizers, now there */

#endif /* EPF_DETAIL_QUANT_FP8_128_CUH */
