/* epfuse/ht.cuh — forwarding header: moved to epfuse/ht/impl/view.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling (it includes the file that
 * holds the same code); include the module's header epfuse/ht/ht.cuh instead (CHANGELOG.md,
 * "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_HT_CUH
#define EPF_HT_CUH

#include "ht/impl/view.cuh"

#endif /* EPF_HT_CUH */
