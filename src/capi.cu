/* src/capi.cu — libepfuse.so: the header library's host API with C linkage, plus capi.h.
 *
 * The headers define every host function inline; with EPF_BUILD_CAPI their visibility is default
 * (config.h) and taking each one's address below emits it here. The linker version script made
 * from capi_api.def exports exactly that list; everything else (private epf__ helpers, the static
 * CUDA runtime) stays local. Kernels are static in their headers, so the ones the launchers use
 * are compiled into this library. */
#define EPF_BUILD_CAPI 1

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "epfuse/epfuse.cuh"
#include "epfuse/route/kernels.cuh"
#include "epfuse/ht/kernels.cuh"
#include "epfuse/ll/kernels.cuh"
#if EPF_CAPI_WITH_NCCL
#include "epfuse/core/nccl.cuh"
#endif
#include "epfuse/capi.h"

/* ---- legacy exports ------------------------------------------------------------------------------
 * Names the headers no longer declare, kept in the library for binaries built before they were
 * withdrawn (capi_api.def is append only). Defined below; CHANGELOG.md says what each does now. */
EPF_BEGIN_DECLS
/* was ll.cuh's epf_ll_rank_bytes(plan, which, index_type): now epf_ll_buffer_bytes */
EPF_CAPI_FN uint64_t epf_ll_rank_bytes(const epf_plan_t* plan, int which, int index_type);
/* was capi.h's epf_ht_step_init(s): now EPF_HT_STEP_INIT / epf_ht_step_init_sized */
EPF_CAPI_FN void epf_ht_step_init(struct epf_ht_step* s);
EPF_END_DECLS

/* ---- emit every exported header function (its address forces a definition) ------------------- */
#define EPF_CAPI(name) (const void*)&name,
#if EPF_CAPI_WITH_NCCL
#define EPF_CAPI_NCCL(name) (const void*)&name,
#else
#define EPF_CAPI_NCCL(name)
#endif
__attribute__((used)) static const void* const epf__capi_functions[] = {
#include "capi_api.def"
};
#undef EPF_CAPI
#undef EPF_CAPI_NCCL

EPF_BEGIN_DECLS

/* ---- ABI queries ------------------------------------------------------------------------------ */

int epf_abi_version(void) { return EPF_VERSION; }

int epf_abi_has_nccl(void) { return EPF_CAPI_WITH_NCCL ? 1 : 0; }

typedef struct {
  const char* name;
  size_t size;
} epf__abi_type_t;

#define EPF__ABI_TYPE(t) {#t, sizeof(t)}
static const epf__abi_type_t epf__abi_types[] = {
    EPF__ABI_TYPE(epf_config_t),        EPF__ABI_TYPE(epf_plan_t),
    EPF__ABI_TYPE(epf_region_t),        EPF__ABI_TYPE(epf_window_header_t),
    EPF__ABI_TYPE(epf_recv_meta_em_t),  EPF__ABI_TYPE(epf_recv_meta_rm_t),
    EPF__ABI_TYPE(epf_error_record_t),  EPF__ABI_TYPE(epf_route_config_t),
    EPF__ABI_TYPE(epf_route_header_t),  EPF__ABI_TYPE(epf_route_segment_t),
    EPF__ABI_TYPE(epf_route_layout_t),  EPF__ABI_TYPE(epf_route_t),
    EPF__ABI_TYPE(epf_team_t),          EPF__ABI_TYPE(epf_wait_t),
    EPF__ABI_TYPE(epf_route_step_t),    EPF__ABI_TYPE(epf_ht_state_t),
    EPF__ABI_TYPE(epf_ht_step_t),       EPF__ABI_TYPE(epf_ll_state_t),
    EPF__ABI_TYPE(epf_ll_launch_t),     EPF__ABI_TYPE(epf_ll_dispatch_args_t),
    EPF__ABI_TYPE(epf_ll_combine_args_t),
#if EPF_CAPI_WITH_NCCL
    EPF__ABI_TYPE(epf_nccl_window_t),   EPF__ABI_TYPE(ncclDevComm_t),
    EPF__ABI_TYPE(ncclUniqueId),        EPF__ABI_TYPE(ncclComm_t),
    EPF__ABI_TYPE(ncclWindow_t),
#endif
};
#undef EPF__ABI_TYPE
#define EPF__ABI_TYPE_COUNT ((int)(sizeof(epf__abi_types) / sizeof(epf__abi_types[0])))

size_t epf_abi_sizeof(const char* type_name) {
  int i;
  if (type_name == NULL) return 0;
  for (i = 0; i < EPF__ABI_TYPE_COUNT; ++i)
    if (strcmp(epf__abi_types[i].name, type_name) == 0) return epf__abi_types[i].size;
  return 0;
}

int epf_abi_type_count(void) { return EPF__ABI_TYPE_COUNT; }

const char* epf_abi_type_name(int i) { return i >= 0 && i < EPF__ABI_TYPE_COUNT ? epf__abi_types[i].name : NULL; }

int64_t epf_abi_constant(const char* name) {
  static const struct {
    const char* name;
    int64_t value;
  } limits[] = {
      {"EPF_MAX_RANKS", EPF_MAX_RANKS},
      {"EPF_MAX_EXPERTS", EPF_MAX_EXPERTS},
      {"EPF_MAX_TOPK", EPF_MAX_TOPK},
      {"EPF_MAX_TOKENS_PER_RANK", EPF_MAX_TOKENS_PER_RANK},
      {"EPF_ALIGN", EPF_ALIGN},
      {"EPF_MASK_WORDS", EPF_MASK_WORDS},
      {"EPF_HT_MAX_BLOCKS_PER_RANK", EPF_HT_MAX_BLOCKS_PER_RANK},
      {"EPF_HT_SEND", EPF_HT_SEND},
      {"EPF_HT_RECV", EPF_HT_RECV},
      {"EPF_HT_BOTH", EPF_HT_BOTH},
      {"EPF_LL_SEND", EPF_LL_SEND},
      {"EPF_LL_RECV", EPF_LL_RECV},
      {"EPF_LL_BOTH", EPF_LL_BOTH},
#define EPF__K(x) {#x, (int64_t)(x)}
      EPF__K(EPF_MODE_HT), EPF__K(EPF_MODE_LL),
      EPF__K(EPF_LAYOUT_EXPERT_MAJOR), EPF__K(EPF_LAYOUT_RANK_MAJOR),
      EPF__K(EPF_PAYLOAD_BF16), EPF__K(EPF_PAYLOAD_MXFP8), EPF__K(EPF_PAYLOAD_FP8_128),
      EPF__K(EPF_SCALE_LAYOUT_COMPACT), EPF__K(EPF_SCALE_LAYOUT_SWIZZLED_128X4), EPF__K(EPF_SCALE_LAYOUT_SEGMENT_MN_MAJOR),
      EPF__K(EPF_INDEX_DEFAULT), EPF__K(EPF_INDEX_INT32), EPF__K(EPF_INDEX_INT64),
      EPF__K(EPF_LL_Y_FIXED), EPF__K(EPF_LL_Y_PACKED), EPF__K(EPF_LL_Y_IN_PLACE), EPF__K(EPF_LL_Y_IN_PLACE_PULL), EPF__K(EPF_LL_Y_PACKED_PULL),
      EPF__K(EPF_LL_BUF_X), EPF__K(EPF_LL_BUF_TOPK_IDX), EPF__K(EPF_LL_BUF_TOPK_WEIGHTS),
      EPF__K(EPF_LL_BUF_RECV_COUNTS), EPF__K(EPF_LL_BUF_EXPERT_COUNTS), EPF__K(EPF_LL_BUF_PACKED_X),
      EPF__K(EPF_LL_BUF_PACKED_SCALES), EPF__K(EPF_LL_BUF_PACKED_META), EPF__K(EPF_LL_BUF_ROUND), EPF__K(EPF_LL_BUF_Y), EPF__K(EPF_LL_BUF_WEIGHT_GRAD),
      EPF__K(EPF_FLAG_FAULT_TOLERANT), EPF__K(EPF_FLAG_COMBINE_PUSH), EPF__K(EPF_FLAG_SCALE_UE8M0),
      EPF__K(EPF_FLAG_MX_SCALE_FLOOR),
      EPF__K(EPF_HT_STEP_MAGIC), EPF__K(EPF_HT_STEP_VERSION), EPF__K(EPF_HT_STEP_MIN_SIZE),
#undef EPF__K
  };
  size_t i;
  if (name == NULL) return -1;
  for (i = 0; i < sizeof(limits) / sizeof(limits[0]); ++i)
    if (strcmp(limits[i].name, name) == 0) return limits[i].value;
  return -1;
}

/* ---- INIT functions ----------------------------------------------------------------------------- */

void epf_config_init(epf_config_t* c) {
  const epf_config_t init = EPF_CONFIG_INIT;
  if (c != NULL) *c = init;
}

void epf_route_config_init(epf_route_config_t* c) {
  const epf_route_config_t init = EPF_ROUTE_CONFIG_INIT;
  if (c != NULL) *c = init;
}

void epf_wait_init(struct epf_wait* w) {
  if (w != NULL) *w = epf_wait_make(0, NULL, NULL, 0);
}

void epf_route_step_init(struct epf_route_step* s) {
  if (s != NULL) *s = epf_route_step_make(NULL, 0, epf_wait_make(0, NULL, NULL, 0));
}

epf_status_t epf_ht_step_init_sized(struct epf_ht_step* s, size_t size) {
  if (s == NULL || size > (size_t)UINT32_MAX) return EPF_ERR_INVALID_ARGUMENT;
  if (size < (size_t)EPF_HT_STEP_MIN_SIZE) return EPF_ERR_STRUCT_VERSION; /* nothing written */
  memset(s, 0, size);
  s->size = (uint32_t)size;
  s->magic = EPF_HT_STEP_MAGIC;
  s->version = EPF_HT_STEP_VERSION;
  return EPF_OK;
}

/* The legacy epf_ht_step_init: the caller's struct may be any prefix-less epf_ht_step_t ever
 * shipped (120 bytes in v0.1, 144 with the training fields), so it zeroes the smallest of them and
 * nothing past it. A zero magic then makes every launcher refuse the step with
 * EPF_ERR_STRUCT_VERSION: the caller has to move to EPF_HT_STEP_INIT / epf_ht_step_init_sized. */
#define EPF__HT_STEP_PREFIXLESS_BYTES 120u
EPF_STATIC_ASSERT(EPF__HT_STEP_PREFIXLESS_BYTES < sizeof(epf_ht_step_t), "the legacy init writes less than a step");
void epf_ht_step_init(struct epf_ht_step* s) {
  if (s != NULL) memset(s, 0, EPF__HT_STEP_PREFIXLESS_BYTES);
}

/* The legacy epf_ll_rank_bytes: its third argument meant "ids are int64" (0 int32, nonzero int64)
 * until it became an epf_index_type_t (0 DEFAULT = int64, 1 INT32, 2 INT64), with no change of
 * name, so a binary may mean either. For the ids' buffer, 0 and 1 are ambiguous and get the size
 * sentinel 0 (nothing to allocate, instead of a buffer of half the size); 2 is int64 in both
 * meanings. The other buffers never depended on it. Everything else as epf_ll_buffer_bytes. */
uint64_t epf_ll_rank_bytes(const epf_plan_t* plan, int which, int index_type) {
  if (which < 0 || which > (int)EPF_LL_BUF_WEIGHT_GRAD) return 0u;
  if (which == (int)EPF_LL_BUF_TOPK_IDX)
    return index_type == (int)EPF_INDEX_INT64 ? epf_ll_buffer_bytes(plan, EPF_LL_BUF_TOPK_IDX, EPF_INDEX_INT64) : 0u;
  return epf_ll_buffer_bytes(plan, (epf_ll_buffer_t)which, EPF_INDEX_DEFAULT);
}

void epf_ll_dispatch_args_init(struct epf_ll_dispatch_args* a) {
  if (a != NULL) memset(a, 0, sizeof(*a));
}

void epf_ll_combine_args_init(struct epf_ll_combine_args* a) {
  if (a != NULL) memset(a, 0, sizeof(*a));
}

/* ---- diagnostics -------------------------------------------------------------------------------- */

/* append to buf like snprintf, keeping the total length the whole text needs in *len */
static void epf__cat(char* buf, size_t n, size_t* len, const char* fmt, ...) __attribute__((format(printf, 4, 5)));
static void epf__cat(char* buf, size_t n, size_t* len, const char* fmt, ...) {
  va_list ap;
  int w;
  va_start(ap, fmt);
  w = vsnprintf(*len < n ? buf + *len : NULL, *len < n ? n - *len : 0, fmt, ap);
  va_end(ap);
  if (w > 0) *len += (size_t)w;
}

size_t epf_error_describe(const epf_error_record_t* rec, char* buf, size_t buf_bytes) {
  size_t len = 0;
  if (buf != NULL && buf_bytes > 0) buf[0] = '\0';
  else buf_bytes = 0;
  if (rec == NULL) {
    epf__cat(buf, buf_bytes, &len, "no error record");
    return len;
  }
  if (rec->status == 0) {
    epf__cat(buf, buf_bytes, &len, "no error");
  } else {
    const epf_status_t st = (epf_status_t)rec->status;
    epf__cat(buf, buf_bytes, &len, "%s (%s)", epf_status_name(st), epf_status_message(st));
    if (rec->valid == 1) {
      epf__cat(buf, buf_bytes, &len, ": reported by rank %d (block %d, thread %d)", rec->waiter_rank,
               rec->waiter_block, rec->waiter_thread);
      if (rec->peer >= 0)
        epf__cat(buf, buf_bytes, &len, " waiting for rank %d at address 0x%llx (wanted epoch %llu, saw %llu, after %.3f ms)",
                 rec->peer, (unsigned long long)rec->address, (unsigned long long)rec->wanted,
                 (unsigned long long)rec->seen, (double)rec->elapsed_ns / 1e6);
    }
    if (rec->count > 1) epf__cat(buf, buf_bytes, &len, "; %u errors in all", rec->count);
  }
  if (rec->dropped_routes) epf__cat(buf, buf_bytes, &len, "; %u expert ids outside [-1, E) dropped", rec->dropped_routes);
  if (rec->recv_overflow) epf__cat(buf, buf_bytes, &len, "; %u received rows past the capacity dropped", rec->recv_overflow);
  if (rec->masked_ranks) epf__cat(buf, buf_bytes, &len, "; %u times a peer was masked after a timeout", rec->masked_ranks);
  return len;
}

/* no CUDA driver or no GPU at all, as opposed to one that cannot be used: cudaErrorNoDevice, or an
 * insufficient driver / stub library with no libcuda.so.1 to load (the runtime's word for a
 * missing driver). A libcuda.so.1 that loads but is older than this runtime is a driver too old. */
static int epf__no_driver_or_gpu(cudaError_t e) {
  void* h;
  if (e == cudaErrorNoDevice) return 1;
  if (e != cudaErrorInsufficientDriver && e != cudaErrorStubLibrary) return 0;
  h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h == NULL) return 1;
  dlclose(h);
  return e == cudaErrorStubLibrary;
}

const char* epf_cuda_error_string(int cuda_error) {
  const cudaError_t e = (cudaError_t)cuda_error;
  if (epf__no_driver_or_gpu(e)) {
    if (e == cudaErrorNoDevice) return "no CUDA driver / no GPU found (cudaErrorNoDevice)";
    if (e == cudaErrorStubLibrary) return "no CUDA driver / no GPU found (cudaErrorStubLibrary)";
    return "no CUDA driver / no GPU found (cudaErrorInsufficientDriver)";
  }
  if (e == cudaErrorInsufficientDriver)
    return "the CUDA driver is too old for this CUDA runtime (cudaErrorInsufficientDriver: CUDA driver version is "
           "insufficient for CUDA runtime version)";
  return cudaGetErrorString(e);
}

/* ---- CUDA runtime calls ------------------------------------------------------------------------- */

epf_status_t epf_cuda_set_device(int device) {
  if (device < 0) return EPF_ERR_INVALID_ARGUMENT;
  return epf__cuda_status(cudaSetDevice(device));
}

epf_status_t epf_cuda_get_device(int* device) {
  if (device == NULL) return EPF_ERR_INVALID_ARGUMENT;
  return epf__cuda_status(cudaGetDevice(device));
}

epf_status_t epf_cuda_device_count(int* count) {
  cudaError_t e;
  if (count == NULL) return EPF_ERR_INVALID_ARGUMENT;
  *count = 0;
  e = cudaGetDeviceCount(count);
  if (epf__no_driver_or_gpu(e)) { /* no driver or no GPU: zero devices (a driver too old: the error) */
    (void)cudaGetLastError();
    *count = 0;
    return EPF_OK;
  }
  return epf__cuda_status(e);
}

epf_status_t epf_cuda_malloc(void** out, size_t bytes) {
  if (out == NULL) return EPF_ERR_INVALID_ARGUMENT;
  *out = NULL;
  return epf__cuda_status(cudaMalloc(out, bytes));
}

epf_status_t epf_cuda_free(void* p) {
  if (p == NULL) return EPF_OK; /* like free(NULL); no CUDA call (cudaFree(NULL) would create a context) */
  return epf__cuda_status(cudaFree(p));
}

epf_status_t epf_cuda_host_alloc_mapped(void** host, void** device, size_t bytes) {
  cudaError_t e;
  if (host == NULL || device == NULL || bytes == 0) return EPF_ERR_INVALID_ARGUMENT;
  *host = NULL;
  *device = NULL;
  e = cudaHostAlloc(host, bytes, cudaHostAllocMapped);
  if (e == cudaSuccess) {
    memset(*host, 0, bytes);
    e = cudaHostGetDevicePointer(device, *host, 0);
    if (e != cudaSuccess) {
      cudaFreeHost(*host);
      *host = NULL;
    }
  }
  return epf__cuda_status(e);
}

epf_status_t epf_cuda_free_host(void* host) {
  if (host == NULL) return EPF_OK;
  return epf__cuda_status(cudaFreeHost(host));
}

epf_status_t epf_cuda_memset_async(void* p, int value, size_t bytes, void* stream) {
  if (bytes == 0) return EPF_OK;
  if (p == NULL) return EPF_ERR_INVALID_ARGUMENT;
  return epf__cuda_status(cudaMemsetAsync(p, value, bytes, (cudaStream_t)stream));
}

epf_status_t epf_cuda_memcpy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return EPF_OK;
  if (dst == NULL || src == NULL) return EPF_ERR_INVALID_ARGUMENT;
  return epf__cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

epf_status_t epf_cuda_memcpy_async(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return EPF_OK;
  if (dst == NULL || src == NULL) return EPF_ERR_INVALID_ARGUMENT;
  return epf__cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream));
}

epf_status_t epf_cuda_stream_synchronize(void* stream) {
  return epf__cuda_status(cudaStreamSynchronize((cudaStream_t)stream));
}

/* ---- NCCL ------------------------------------------------------------------------------------------ */
#if EPF_CAPI_WITH_NCCL
epf_status_t epf_nccl_get_unique_id(void* out, size_t bytes) {
  ncclUniqueId id;
  epf_status_t st;
  if (out == NULL || bytes < sizeof(id)) return EPF_ERR_INVALID_ARGUMENT;
  st = epf_nccl_status(ncclGetUniqueId(&id));
  if (st == EPF_OK) memcpy(out, &id, sizeof(id));
  return st;
}

int epf_nccl_version(void) {
  int v = -1;
  return ncclGetVersion(&v) == ncclSuccess ? v : -1;
}
#endif

EPF_END_DECLS
