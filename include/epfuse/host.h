/* epfuse/host.h — the host setup umbrella: configuration, plan, errors, route memory — part of epfuse v0.1
 *
 * What it is: the tiny host setup header. It turns an epf_config_t into an epf_plan_t: the byte
 * offset and size of every region of one rank's slice of the symmetric window. The plan is the
 * ONE place where epfuse does offset arithmetic; device code receives the same struct by value
 * and reads offsets out of it (the epf_plan_*_offset accessors below index inside one region).
 * Plain C11 (gcc -std=c11 -Wall -Wextra -Wpedantic -Werror clean), also C++17 and CUDA; it needs
 * no CUDA and is meant for FFI (Rust, Python ctypes/cffi): fixed-width fields, no bitfields.
 *
 * What it does NOT do: allocate, call CUDA or NCCL, launch kernels, print, abort or exit. NCCL
 * helpers (symmetric allocation, window registration, communicator creation with a deadline) are
 * in host_nccl.h; the device communicator helpers in core/nccl.cuh.
 *
 * Usage (examples/04_plan_from_c has it whole):
 *   epf_config_t cfg = EPF_CONFIG_INIT;           // zero fields mean "default"
 *   cfg.nranks = 8; cfg.num_experts = 256; cfg.top_k = 8; cfg.hidden = 7168;
 *   epf_plan_t plan;
 *   epf_status_t st = epf_plan_compute(&cfg, &plan);   // resolves, validates, plans
 *   if (st != EPF_OK) { puts(epf_status_message(st)); return 1; }
 *   // allocate plan.total_bytes per rank (host_nccl.h: epf_nccl_window_create) and pass `plan`
 *   // by value to kernels.
 *
 * COMPILE-TIME OPTIONS: see config.h (limits, EPF_ALIGN).
 *
 * Contents (declarations; each header has its own manual):
 *   plan_config.h   epf_config_t + EPF_CONFIG_INIT, epf_mode_t, epf_layout_t, epf_payload_t,
 *                   epf_scale_layout_t, EPF_FLAG_*; epf_config_resolve, epf_config_validate,
 *                   epf_config_hash, epf_config_worst_case_rows, epf_payload_vector_width
 *   plan.h          epf_plan_t, epf_region_id_t, epf_region_t, epf_window_header_t,
 *                   epf_recv_meta_em_t / _rm_t; epf_plan_compute, epf_plan_check,
 *                   epf_build_signature, epf_plan_*_offset accessors, epf_region_name
 *   error.h         epf_status_name, epf_status_message, epf_version; epf_error_record_t,
 *                   epf_error_read, epf_error_clear
 *   route_layout.h  epf_route_config_t + EPF_ROUTE_CONFIG_INIT, epf_index_type_t,
 *                   epf_route_header_t, epf_route_segment_t, epf_route_layout_t, epf_route_t;
 *                   epf_route_layout_compute, epf_route_size, epf_route_header_init,
 *                   epf_route_header_check, epf_route_ptr, epf_route_epoch_ptr, epf_route_array_name
 *
 * Requirements: C11 or C++17. No CUDA, no NCCL.
 */
#ifndef EPF_HOST_H
#define EPF_HOST_H

#include "config.h"
#include "status.h"
#include "version.h"
#include "plan_config.h"
#include "plan.h"
#include "error.h"
#include "route_layout.h"

#endif /* EPF_HOST_H */
/* SPDX-License-Identifier: Apache-2.0 */
