/* test_abi — freezes the layout of every struct that crosses host -> device or an FFI boundary.
 * Compiling this file is the test (C11 and, as test_abi.cpp, C++17; the CUDA-side structs in
 * test_abi.cu). A layout change fails here and must come with a version bump of the struct. */
#include <stddef.h>

#include "epfuse/host.h"

#define EPF_ABI(cond) EPF_STATIC_ASSERT(cond, #cond)

/* epf_config_t v1 */
EPF_ABI(offsetof(epf_config_t, size) == 0);
EPF_ABI(offsetof(epf_config_t, magic) == 4);
EPF_ABI(offsetof(epf_config_t, version) == 8);
EPF_ABI(offsetof(epf_config_t, nranks) == 12);
EPF_ABI(offsetof(epf_config_t, num_experts) == 16);
EPF_ABI(offsetof(epf_config_t, top_k) == 20);
EPF_ABI(offsetof(epf_config_t, hidden) == 24);
EPF_ABI(offsetof(epf_config_t, max_tokens_per_rank) == 28);
EPF_ABI(offsetof(epf_config_t, mode) == 32);
EPF_ABI(offsetof(epf_config_t, layout) == 36);
EPF_ABI(offsetof(epf_config_t, payload) == 40);
EPF_ABI(offsetof(epf_config_t, combine_payload) == 44);
EPF_ABI(offsetof(epf_config_t, scale_layout) == 48);
EPF_ABI(offsetof(epf_config_t, expert_alignment) == 52);
EPF_ABI(offsetof(epf_config_t, flags) == 56);
EPF_ABI(offsetof(epf_config_t, reserved0) == 60);
EPF_ABI(offsetof(epf_config_t, recv_capacity) == 64);
EPF_ABI(offsetof(epf_config_t, timeout_ns) == 72);
EPF_ABI(sizeof(epf_config_t) == 80);

/* epf_plan_t v2 */
EPF_ABI(offsetof(epf_plan_t, size) == 0);
EPF_ABI(offsetof(epf_plan_t, magic) == 4);
EPF_ABI(offsetof(epf_plan_t, version) == 8);
EPF_ABI(offsetof(epf_plan_t, flags) == 12);
EPF_ABI(offsetof(epf_plan_t, nranks) == 16);
EPF_ABI(offsetof(epf_plan_t, expert_alignment) == 60);
EPF_ABI(offsetof(epf_plan_t, recv_capacity) == 64);
EPF_ABI(offsetof(epf_plan_t, row_bytes) == 72);
EPF_ABI(offsetof(epf_plan_t, combine_row_bytes) == 84);
EPF_ABI(offsetof(epf_plan_t, config_hash) == 88);
EPF_ABI(offsetof(epf_plan_t, timeout_ns) == 96);
EPF_ABI(offsetof(epf_plan_t, total_bytes) == 104);
EPF_ABI(offsetof(epf_plan_t, region) == 112);
EPF_ABI(EPF_REGION_COUNT == 13);
EPF_ABI(sizeof(epf_region_t) == 16);
EPF_ABI(offsetof(epf_plan_t, build_signature) == 112 + 16 * 13); /* v2 */
EPF_ABI(sizeof(epf_plan_t) == 120 + 16 * 13);

/* window header: fixed for a given EPF_MAX_RANKS, independent of the config */
EPF_ABI(offsetof(epf_window_header_t, peer_hash) == 0);
EPF_ABI(offsetof(epf_window_header_t, peer_epoch) == 8 * EPF_MAX_RANKS);
EPF_ABI(EPF_HEADER_BYTES % EPF_ALIGN == 0);

/* receive metadata rows */
EPF_ABI(sizeof(epf_recv_meta_em_t) == 16);
EPF_ABI(offsetof(epf_recv_meta_em_t, k) == 6);
EPF_ABI(offsetof(epf_recv_meta_em_t, weight) == 12);
EPF_ABI(sizeof(epf_recv_meta_rm_t) == 16);

/* host-mapped error record */
EPF_ABI(offsetof(epf_error_record_t, status) == 0);
EPF_ABI(offsetof(epf_error_record_t, count) == 4);
EPF_ABI(offsetof(epf_error_record_t, valid) == 8);
EPF_ABI(offsetof(epf_error_record_t, peer) == 24);
EPF_ABI(offsetof(epf_error_record_t, address) == 32);
EPF_ABI(offsetof(epf_error_record_t, wanted) == 40);
EPF_ABI(offsetof(epf_error_record_t, seen) == 48);
EPF_ABI(offsetof(epf_error_record_t, elapsed_ns) == 56);
EPF_ABI(offsetof(epf_error_record_t, dropped_routes) == 64);
EPF_ABI(offsetof(epf_error_record_t, recv_overflow) == 68);
EPF_ABI(offsetof(epf_error_record_t, masked_ranks) == 72);
EPF_ABI(sizeof(epf_error_record_t) == 80);

/* route memory (host.h "Route memory"): the header every route buffer starts with is read back
 * from copied buffers (epf_route_import), so its layout is frozen too */
EPF_ABI(offsetof(epf_route_config_t, size) == 0);
EPF_ABI(offsetof(epf_route_config_t, magic) == 4);
EPF_ABI(offsetof(epf_route_config_t, version) == 8);
EPF_ABI(offsetof(epf_route_config_t, index_type) == 12);
EPF_ABI(offsetof(epf_route_config_t, flags) == 28);
EPF_ABI(sizeof(epf_route_config_t) == 32);
EPF_ABI(offsetof(epf_route_header_t, size) == 0);
EPF_ABI(offsetof(epf_route_header_t, magic) == 4);
EPF_ABI(offsetof(epf_route_header_t, version) == 8);
EPF_ABI(offsetof(epf_route_header_t, epoch) == 12);
EPF_ABI(offsetof(epf_route_header_t, config_hash) == 16);
EPF_ABI(offsetof(epf_route_header_t, total_bytes) == 24);
EPF_ABI(offsetof(epf_route_header_t, nranks) == 32);
EPF_ABI(offsetof(epf_route_header_t, recv_rows) == 80);
EPF_ABI(offsetof(epf_route_header_t, barrier) == 104);
EPF_ABI(sizeof(epf_route_header_t) == 112);
EPF_ABI(sizeof(epf_route_segment_t) == 16);
EPF_ABI(offsetof(epf_route_layout_t, size) == 0);
EPF_ABI(offsetof(epf_route_layout_t, magic) == 4);
EPF_ABI(offsetof(epf_route_layout_t, version) == 8);
EPF_ABI(offsetof(epf_route_t, size) == 0);
EPF_ABI(offsetof(epf_route_t, magic) == 4);
EPF_ABI(offsetof(epf_route_t, version) == 8);
/* route array ids are ABI (append only): the appended SEND_SEGMENT, and the scale layouts */
EPF_ABI(EPF_ROUTE_SCRATCH == 12);
EPF_ABI(EPF_ROUTE_SEND_SEGMENT == 13);
EPF_ABI(EPF_ROUTE_ARRAY_COUNT == 14);
EPF_ABI(EPF_SCALE_LAYOUT_SWIZZLED_128X4 == 2);
EPF_ABI(EPF_SCALE_LAYOUT_SEGMENT_MN_MAJOR == 3);

/* status values are ABI: spot-check the ends of the list */
EPF_ABI(EPF_OK == 0);
EPF_ABI(EPF_ERR_CONFIG_MISMATCH == 20);
EPF_ABI(EPF_ERR_TIMEOUT == 21);
EPF_ABI(EPF_ERR_BUILD_MISMATCH == 32);
EPF_ABI(EPF_STATUS_COUNT == 33);

/* the sentinels of value-returning accessors (status.h) are ABI: bindings compare with them */
EPF_ABI(EPF_OFFSET_INVALID == UINT64_MAX);
EPF_ABI(EPF_ROW_INVALID == -1);

/* EPF_CONFIG_SIGNATURE's fields (config.h): plans carry a hash of it across builds and FFIs */
EPF_ABI(EPF__SIG_RANKS_SHIFT == 0 && EPF__SIG_RANKS_BITS == 10);
EPF_ABI(EPF__SIG_EXPERTS_SHIFT == 10 && EPF__SIG_EXPERTS_BITS == 16);
EPF_ABI(EPF__SIG_TOPK_SHIFT == 26 && EPF__SIG_TOPK_BITS == 6);
EPF_ABI(EPF__SIG_TOKENS_SHIFT == 32 && EPF__SIG_TOKENS_BITS == 24);
EPF_ABI(EPF__SIG_ALIGN_SHIFT == 56 && EPF__SIG_ALIGN_BITS == 5);
EPF_ABI(EPF__SIG_TIMEOUT_SHIFT == 61 && EPF__SIG_TIMEOUT_BITS == 1);

int epf_abi_test_anchor(void);
int epf_abi_test_anchor(void) { return 0; }
