/* epfuse/epfuse.cuh — umbrella: every device header except core/nccl.cuh — part of epfuse v0.1
 *
 * What it is: one include for the building blocks: the host C headers, the primitives (core/),
 * the route (route/route.cuh), quantization (quant/quant.cuh), high-throughput (ht/ht.cuh) and
 * low-latency (ll/ll.cuh) dispatch and combine. core/nccl.cuh (the only header that pulls in
 * nccl_device.h) is left out so that code without NCCL can use everything else; include it
 * separately where a team view comes from an NCCL window.
 *
 * Contents: config.h status.h version.h host.h core/ptx.cuh core/team.cuh core/signal.cuh
 *           core/rows.cuh core/bf16.cuh quant/quant.cuh route/route.cuh ht/ht.cuh ll/ll.cuh
 *           (the ready-made kernels are route/kernels.cuh, ht/kernels.cuh, ll/kernels.cuh:
 *           include them where you launch)
 * Requirements: CUDA, sm_80+ (the BF16 conversions of the combines; sm_90 / sm_100 tested), CUB
 * from the toolkit.
 */
#ifndef EPF_EPFUSE_CUH
#define EPF_EPFUSE_CUH

#include "config.h"
#include "status.h"
#include "version.h"
#include "host.h"
#include "core/ptx.cuh"
#include "core/team.cuh"
#include "core/signal.cuh"
#include "core/rows.cuh"
#include "core/bf16.cuh"
#include "quant/quant.cuh"
#include "route/route.cuh"
#include "ht/ht.cuh"
#include "ll/ll.cuh"

#endif /* EPF_EPFUSE_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
