/* epfuse/capi.h — what only the shared library libepfuse.so adds, for bindings — part of epfuse v0.1
 *
 * What it is: the C declarations of the functions that exist only in the C-ABI library
 * (libepfuse.so.0, CMake target epfuse::capi): struct-size queries so a binding can check its
 * mirrors, one INIT function per struct for languages that cannot expand the *_INIT macros, an
 * error record turned into a sentence, and a few CUDA runtime calls (allocation, copies) so a
 * binding without a CUDA package can stand up a team. Plain C11 (also C++17 and CUDA).
 *
 * The library also exports every public host function of the headers, with C linkage and the
 * same name and signature (src/capi_api.def lists them): host.h (plans, statuses, the route
 * layout), core/team.cuh / core/signal.cuh (epf_team_virtual, epf_wait_make, epf_cuda_last_error), the
 * ready-made launchers of route/kernels.cuh, ht/kernels.cuh and ll/kernels.cuh, and with NCCL
 * host_nccl.h / core/nccl.cuh. Their contracts are in those headers. The plain-data structs they take
 * (epf_team_t, epf_wait_t, epf_route_step_t, epf_ht_step_t, epf_ll_*_args_t, epf_ll_launch_t) are
 * fixed-layout C structs; a binding mirrors them and checks each mirror with epf_abi_sizeof.
 * epf_ht_step_t is versioned (size, magic, version first, as epf_config_t): fill it with
 * epf_ht_step_init_sized(s, sizeof_your_mirror).
 *
 * Bad arguments: every export refuses NULL pointers and out-of-range ids without crashing — a
 * status (EPF_ERR_INVALID_ARGUMENT or a more specific one) or, for a value-returning accessor, the
 * sentinel its contract names (status.h: EPF_OFFSET_INVALID, EPF_ROW_INVALID, 0, NULL, a fixed
 * name); a void function does nothing. docs/bindings.md has the table.
 *
 * Building an extension safely: every inline host function of the headers is a hidden symbol
 * (config.h, EPF__VISIBILITY), so two extensions that include the headers with different limits
 * (EPF_MAX_RANKS, ...) each keep their own copy, and a program that includes the headers AND
 * links libepfuse.so calls its own copies from its own code. What crosses between builds is
 * data: a plan carries its build's signature (epf_plan_check refuses a plan from a build with
 * other limits: EPF_ERR_BUILD_MISMATCH), so compute plans with the library you launch with.
 *
 * What it does NOT do: keep global state (except the per-thread CUDA error of
 * epf_cuda_last_error), or print.
 *
 * Contents:
 *   int          epf_abi_version(void)                        EPF_VERSION the library was built with
 *   int          epf_abi_has_nccl(void)                       1 if the NCCL functions are exported
 *   size_t       epf_abi_sizeof(const char* type_name)        sizeof a public struct, 0 if unknown
 *   int          epf_abi_type_count(void); const char* epf_abi_type_name(int i)
 *   int64_t      epf_abi_constant(const char* name)             limits, phase bits, enumerators
 *   void         epf_config_init, epf_route_config_init, epf_wait_init, epf_route_step_init,
 *                epf_ll_dispatch_args_init, epf_ll_combine_args_init (struct*)
 *   epf_status_t epf_ht_step_init_sized(struct epf_ht_step*, size_t size)   the versioned HT step
 *   size_t       epf_error_describe(const epf_error_record_t*, char* buf, size_t buf_bytes)
 *   const char*  epf_cuda_error_string(int cuda_error)
 *   epf_status_t epf_cuda_set_device / _get_device / _device_count / _malloc / _free /
 *                _host_alloc_mapped / _free_host / _memset_async / _memcpy / _memcpy_async /
 *                _stream_synchronize
 *   epf_status_t epf_nccl_get_unique_id(void* out, size_t bytes); int epf_nccl_version(void)  [NCCL]
 *
 * Requirements: C11 or C++17; link libepfuse.so (CMake: epfuse::capi).
 */
#ifndef EPF_CAPI_H
#define EPF_CAPI_H

#include "host.h"

EPF_BEGIN_DECLS

/* Structs that live in the CUDA headers, named here so a C caller can pass pointers to them. */
struct epf_wait;
struct epf_route_step;
struct epf_ht_step;
struct epf_ll_dispatch_args;
struct epf_ll_combine_args;

#if defined(EPF_BUILD_CAPI) && (defined(__GNUC__) || defined(__clang__))
#define EPF_CAPI_FN __attribute__((visibility("default")))
#else
#define EPF_CAPI_FN
#endif

/* ---- ABI queries ---------------------------------------------------------------------------- */

/* epf_abi_version — EPF_VERSION of the headers the library was built with (compare with yours). */
EPF_CAPI_FN int epf_abi_version(void);

/* epf_abi_has_nccl — 1 if the library was built with NCCL (the epf_nccl_* functions exist). */
EPF_CAPI_FN int epf_abi_has_nccl(void);

/* epf_abi_sizeof — sizeof(type) as the library was compiled, for a binding to check its mirror:
 *   type_name is the C typedef name ("epf_plan_t", "epf_ht_step_t", ... and with NCCL
 *   "ncclDevComm_t", "ncclUniqueId", "epf_nccl_window_t"). 0 for an unknown name or NULL. */
EPF_CAPI_FN size_t epf_abi_sizeof(const char* type_name);

/* epf_abi_type_count / epf_abi_type_name — the names epf_abi_sizeof knows (i in [0, count);
 *   NULL outside). */
EPF_CAPI_FN int epf_abi_type_count(void);
EPF_CAPI_FN const char* epf_abi_type_name(int i);

/* epf_abi_constant — a compile-time constant of the library's build, by its C name, so a binding
 *   checks its copies: the limits ("EPF_MAX_RANKS", "EPF_MAX_EXPERTS", "EPF_MAX_TOPK",
 *   "EPF_MAX_TOKENS_PER_RANK", "EPF_ALIGN", "EPF_MASK_WORDS", "EPF_HT_MAX_BLOCKS_PER_RANK"), the
 *   phase bits ("EPF_HT_SEND", "EPF_HT_RECV", "EPF_HT_BOTH", "EPF_LL_SEND", "EPF_LL_RECV", "EPF_LL_BOTH") and
 *   every enumerator of epf_mode_t, epf_layout_t, epf_payload_t, epf_scale_layout_t,
 *   epf_index_type_t, epf_ll_y_layout_t and epf_ll_buffer_t, and the versioned HT step's
 *   "EPF_HT_STEP_MAGIC", "EPF_HT_STEP_VERSION", "EPF_HT_STEP_MIN_SIZE". -1 if unknown or NULL. */
EPF_CAPI_FN int64_t epf_abi_constant(const char* name);

/* ---- INIT functions: the *_INIT macros and zero-means-default structs, as calls -------------
 * Each writes exactly sizeof(its struct) bytes of this library's build (epf_abi_sizeof) and does
 * nothing for NULL; the structs without a prefix (epf_wait_t, epf_route_step_t, epf_ll_*_args_t)
 * are frozen at their size (tests/abi). epf_ht_step_t has a prefix and its init takes the size. */

/* epf_config_init — *c = EPF_CONFIG_INIT (prefix set, every other field 0 = default). */
EPF_CAPI_FN void epf_config_init(epf_config_t* c);
/* epf_route_config_init — *c = EPF_ROUTE_CONFIG_INIT. */
EPF_CAPI_FN void epf_route_config_init(epf_route_config_t* c);
/* epf_wait_init — all zero: 10 s default timeout (or the plan's, where a launcher fills it), no
 *   record, no abort word, no mask. */
EPF_CAPI_FN void epf_wait_init(struct epf_wait* w);
/* epf_route_step_init — all zero (no ids, T 0, default blocks), wait as epf_wait_init. */
EPF_CAPI_FN void epf_route_step_init(struct epf_route_step* s);
/* epf_ht_step_init_sized — *s = EPF_HT_STEP_INIT for a caller whose epf_ht_step_t is `size` bytes
 *   (pass sizeof of your struct or mirror): zeroes exactly `size` bytes, then sets size = `size`,
 *   magic and version — never a byte past what the caller owns. A larger size than this library's
 *   (a newer caller) is fine: the launchers ignore the tail. Statuses: EPF_ERR_INVALID_ARGUMENT (s
 *   NULL, size above UINT32_MAX), EPF_ERR_STRUCT_VERSION (size below EPF_HT_STEP_MIN_SIZE, e.g. a
 *   mirror of the prefix-less layout; nothing written), EPF_OK.
 *   (Replaces epf_ht_step_init(s), which wrote sizeof(epf_ht_step_t) of the LIBRARY's build into
 *   the caller's struct: 24 bytes past a caller built against the 120-byte step. The old symbol
 *   stays in the library for old binaries and zeroes only the first 120 bytes; launchers then
 *   refuse the step with EPF_ERR_STRUCT_VERSION. CHANGELOG.md.) */
EPF_CAPI_FN epf_status_t epf_ht_step_init_sized(struct epf_ht_step* s, size_t size);
/* epf_ll_dispatch_args_init / epf_ll_combine_args_init — all zero (index type DEFAULT = INT64). */
EPF_CAPI_FN void epf_ll_dispatch_args_init(struct epf_ll_dispatch_args* a);
EPF_CAPI_FN void epf_ll_combine_args_init(struct epf_ll_combine_args* a);

/* ---- diagnostics ---------------------------------------------------------------------------- */

/* epf_error_describe — one sentence for an error record (as read by epf_error_read): the first
 *   error's status name and message, who reported it (rank, block, thread), what it waited for
 *   (peer, address, wanted and seen epoch, elapsed time) and every nonzero counter (dropped
 *   routes, receive overflow, masked ranks). Writes at most buf_bytes bytes, always
 *   NUL-terminated when buf_bytes > 0; returns the length the whole sentence needs (without the
 *   NUL), like snprintf. rec NULL: "no error record". buf NULL (any buf_bytes): nothing is
 *   written, the length is still returned. Scope: host. */
EPF_CAPI_FN size_t epf_error_describe(const epf_error_record_t* rec, char* buf, size_t buf_bytes);

/* epf_cuda_error_string — cudaGetErrorString of a cudaError_t value (e.g. epf_cuda_last_error()),
 *   except on a machine without a CUDA driver or GPU: "no CUDA driver / no GPU found (<error name>)"
 *   for cudaErrorNoDevice, and for cudaErrorInsufficientDriver / cudaErrorStubLibrary when no
 *   libcuda.so.1 loads (the runtime's word for a missing driver); with a libcuda.so.1 that loads,
 *   cudaErrorInsufficientDriver reads "the CUDA driver is too old for this CUDA runtime (...)".
 *   Never NULL: a value CUDA does not know gives its "unrecognized error code". No GPU needed. */
EPF_CAPI_FN const char* epf_cuda_error_string(int cuda_error);

/* ---- CUDA runtime calls for bindings (each EPF_OK or EPF_ERR_CUDA with epf_cuda_last_error) --
 * Bad arguments are refused with EPF_ERR_INVALID_ARGUMENT before any CUDA call (so they need no
 * GPU): a NULL out-pointer, a negative device, a NULL buffer with bytes > 0. A NULL stream is
 * CUDA's legacy default stream (valid). */

EPF_CAPI_FN epf_status_t epf_cuda_set_device(int device); /* device < 0: EPF_ERR_INVALID_ARGUMENT */
EPF_CAPI_FN epf_status_t epf_cuda_get_device(int* device);
/* no CUDA driver or no GPU: EPF_OK with *count 0; a driver too old for the runtime: EPF_ERR_CUDA */
EPF_CAPI_FN epf_status_t epf_cuda_device_count(int* count);
EPF_CAPI_FN epf_status_t epf_cuda_malloc(void** out, size_t bytes);
EPF_CAPI_FN epf_status_t epf_cuda_free(void* p); /* p NULL: EPF_OK, nothing to free (no CUDA call) */
/* pinned, mapped host memory (error records, host-mapped totals): *host and its *device address;
 * EPF_ERR_INVALID_ARGUMENT for host or device NULL or bytes 0 */
EPF_CAPI_FN epf_status_t epf_cuda_host_alloc_mapped(void** host, void** device, size_t bytes);
EPF_CAPI_FN epf_status_t epf_cuda_free_host(void* host); /* host NULL: EPF_OK (no CUDA call) */
/* bytes 0: EPF_OK, nothing done (no CUDA call); p NULL: EPF_ERR_INVALID_ARGUMENT */
EPF_CAPI_FN epf_status_t epf_cuda_memset_async(void* p, int value, size_t bytes, void* stream);
/* cudaMemcpy with cudaMemcpyDefault (unified addressing: any direction), synchronous. bytes 0:
 * EPF_OK, nothing done; dst or src NULL: EPF_ERR_INVALID_ARGUMENT (both without a CUDA call) */
EPF_CAPI_FN epf_status_t epf_cuda_memcpy(void* dst, const void* src, size_t bytes);
/* cudaMemcpyAsync with cudaMemcpyDefault on `stream` (capturable for device-to-device copies);
 * bytes 0 and NULL buffers as epf_cuda_memcpy */
EPF_CAPI_FN epf_status_t epf_cuda_memcpy_async(void* dst, const void* src, size_t bytes, void* stream);
EPF_CAPI_FN epf_status_t epf_cuda_stream_synchronize(void* stream);

/* ---- NCCL (only in a library built with NCCL: epf_abi_has_nccl() == 1) ----------------------- */

/* epf_nccl_get_unique_id — ncclGetUniqueId into out (bytes >= sizeof(ncclUniqueId), 128).
 *   EPF_ERR_INVALID_ARGUMENT for out NULL or fewer bytes, before any NCCL call. */
EPF_CAPI_FN epf_status_t epf_nccl_get_unique_id(void* out, size_t bytes);
/* epf_nccl_version — ncclGetVersion of the NCCL library loaded at run time (e.g. 22809), or -1. */
EPF_CAPI_FN int epf_nccl_version(void);

EPF_END_DECLS

#endif /* EPF_CAPI_H */
/* SPDX-License-Identifier: Apache-2.0 */
