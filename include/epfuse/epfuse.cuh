/* epfuse/epfuse.cuh — umbrella: every device header except nccl.cuh — part of epfuse v0.1
 *
 * What it is: one include for the building blocks. nccl.cuh (the only header that pulls in
 * nccl_device.h) is left out so that code without NCCL can use everything else; include it
 * separately where a team view comes from an NCCL window.
 *
 * Contents: config.h status.h version.h host.h ptx.cuh team.cuh signal.cuh quant.cuh route.cuh
 *           dispatch.cuh combine.cuh ht.cuh (the ready-made kernels are kernels_route.cuh, kernels_ht.cuh,
 *           kernels_ll.cuh: include them where you launch)
 * Requirements: CUDA, sm_70+ (sm_90 / sm_100 tested).
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
#include "quant/quant.cuh"
#include "route/route.cuh"
#include "ht/ht.cuh"

#endif /* EPF_EPFUSE_CUH */
/* SPDX-License-Identifier: Apache-2.0 */
