/* epfuse/signal.cuh — forwarding header: moved to epfuse/core/signal.cuh — part of epfuse v0.1
 *
 * Kept for one release so that existing includes keep compiling; include epfuse/core/signal.cuh instead
 * (CHANGELOG.md, "Headers in folders by module").
 */
/* SPDX-License-Identifier: Apache-2.0 */
#ifndef EPF_SIGNAL_CUH
#define EPF_SIGNAL_CUH

#include "core/signal.cuh"

#endif /* EPF_SIGNAL_CUH */
