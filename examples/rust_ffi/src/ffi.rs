//! ffi.rs — hand-written mirrors of epfuse's C structs and the extern "C" declarations of
//! libepfuse.so (the C ABI; exported names: src/capi_api.def, contracts: include/epfuse/host.h,
//! host_nccl.h, capi.h). No bindgen, no crates: an engine that already has a raw NCCL FFI adds
//! these few items.
//!
//! Rules the mirrors follow:
//!   * field for field, in the C order, with the C fixed-width types (`int32_t` -> i32, ...);
//!     `#[repr(C)]` gives the C layout, and main.rs compares every mirror's size with
//!     `epf_abi_sizeof("<C typedef name>")` before it calls anything else;
//!   * C enums (`epf_status_t`, `epf_mode_t`, `cudaError_t`, ...) cross as `c_int`, never as Rust
//!     enums (a value the mirror does not know would be undefined behaviour in a Rust enum);
//!   * opaque NCCL handles (`ncclComm_t`, `ncclWindow_t`) are pointers to zero-sized opaque types.
#![allow(dead_code)] // the constants and fields document the C side; not all are used here

use std::ffi::{c_char, c_int, c_void, CStr};

// ---- version of the headers these mirrors were written from (include/epfuse/version.h) --------
pub const EPF_VERSION_MAJOR: i32 = 0;
pub const EPF_VERSION_MINOR: i32 = 1;
pub const EPF_VERSION_PATCH: i32 = 0;
/// EPF_VERSION: MMMmmmpp as in version.h (major * 100000 + minor * 100 + patch)
pub const EPF_VERSION: i32 = EPF_VERSION_MAJOR * 100_000 + EPF_VERSION_MINOR * 100 + EPF_VERSION_PATCH;

// ---- epf_status_t (status.h; values are ABI, append only) ----------------------------------------
pub type EpfStatus = c_int;
pub const EPF_OK: EpfStatus = 0;
pub const EPF_ERR_INVALID_ARGUMENT: EpfStatus = 1;
pub const EPF_ERR_EXPERTS_NOT_DIVISIBLE: EpfStatus = 6;
pub const EPF_ERR_TIMEOUT: EpfStatus = 21;
pub const EPF_ERR_CUDA: EpfStatus = 24;
pub const EPF_ERR_NCCL: EpfStatus = 25;
pub const EPF_ERR_BUILD_MISMATCH: EpfStatus = 32;

// ---- configuration enums (host.h; stored as int32_t in the structs) -------------------------------
pub const EPF_MODE_HT: i32 = 1;
pub const EPF_MODE_LL: i32 = 2;
pub const EPF_LAYOUT_EXPERT_MAJOR: i32 = 1;
pub const EPF_LAYOUT_RANK_MAJOR: i32 = 2;
pub const EPF_PAYLOAD_BF16: i32 = 1;
pub const EPF_PAYLOAD_MXFP8: i32 = 2;
pub const EPF_PAYLOAD_FP8_128: i32 = 3;

/// EPF_REGION_COUNT: HEADER, SIG_COUNT, SIG_DISPATCH, SIG_COMBINE, SIG_BARRIER, SIG_LL_DISPATCH,
/// SIG_LL_COMBINE, COUNTS, RECV_TOKENS, RECV_SCALES, RECV_META, COMBINE, EXPERT_OUT
pub const EPF_REGION_COUNT: usize = 13;

/// epf_config_t (host.h). Start from `epf_config_init` (sets the size/magic/version prefix);
/// zero in any other field means "default".
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EpfConfig {
    pub size: u32,
    pub magic: u32,
    pub version: u32,
    pub nranks: i32,
    pub num_experts: i32,
    pub top_k: i32,
    pub hidden: i32,
    pub max_tokens_per_rank: i32,
    pub mode: i32,
    pub layout: i32,
    pub payload: i32,
    pub combine_payload: i32,
    pub scale_layout: i32,
    pub expert_alignment: i32,
    pub flags: u32,
    pub reserved0: u32,
    pub recv_capacity: i64,
    pub timeout_ns: u64,
}

/// epf_region_t (host.h): one region of a rank's window slice.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EpfRegion {
    pub offset: u64,
    pub bytes: u64,
}

/// epf_plan_t (host.h, EPF_PLAN_VERSION 2): the window plan, passed to kernels by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EpfPlan {
    pub size: u32,
    pub magic: u32,
    pub version: u32,
    pub flags: u32,
    pub nranks: i32,
    pub num_experts: i32,
    pub experts_per_rank: i32,
    pub top_k: i32,
    pub hidden: i32,
    pub max_tokens_per_rank: i32,
    pub mode: i32,
    pub layout: i32,
    pub payload: i32,
    pub combine_payload: i32,
    pub scale_layout: i32,
    pub expert_alignment: i32,
    pub recv_capacity: i64,
    pub row_bytes: u32,
    pub scale_bytes_per_row: u32,
    pub meta_bytes_per_row: u32,
    pub combine_row_bytes: u32,
    pub config_hash: u64,
    pub timeout_ns: u64,
    pub total_bytes: u64,
    pub region: [EpfRegion; EPF_REGION_COUNT],
    /// epf_build_signature() of the library build that computed the plan (epf_plan_check)
    pub build_signature: u64,
}

/// epf_error_record_t (host.h): what device code reports into host-mapped memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EpfErrorRecord {
    pub status: u32,
    pub count: u32,
    pub valid: u32,
    pub waiter_rank: i32,
    pub waiter_block: i32,
    pub waiter_thread: i32,
    pub peer: i32,
    pub reserved: u32,
    pub address: u64,
    pub wanted: u64,
    pub seen: u64,
    pub elapsed_ns: u64,
    pub dropped_routes: u32,
    pub recv_overflow: u32,
    pub masked_ranks: u32,
    pub reserved2: u32,
}

/// ncclUniqueId (nccl.h): `typedef struct { char internal[128]; } ncclUniqueId;`, passed BY VALUE
/// to epf_nccl_comm_init_rank exactly as the C declaration takes it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclUniqueId {
    pub internal: [u8; 128],
}

/// ncclComm_t and ncclWindow_t: opaque pointers.
#[repr(C)]
pub struct NcclCommOpaque {
    _private: [u8; 0],
}
pub type NcclComm = *mut NcclCommOpaque;
#[repr(C)]
pub struct NcclWindowOpaque {
    _private: [u8; 0],
}
pub type NcclWindow = *mut NcclWindowOpaque;

/// epf_nccl_window_t (host_nccl.h): a registered symmetric window and the memory behind it.
#[repr(C)]
#[derive(Debug)]
pub struct EpfNcclWindow {
    pub ptr: *mut c_void,
    pub bytes: usize,
    pub window: NcclWindow,
}

// Linked by build.rs (cargo:rustc-link-lib=dylib=epfuse), so no #[link] attribute here.
// example-begin rust_extern
extern "C" {
    pub fn epf_config_init(c: *mut EpfConfig);
    pub fn epf_plan_compute(cfg: *const EpfConfig, out_plan: *mut EpfPlan) -> EpfStatus;
    pub fn epf_status_name(status: EpfStatus) -> *const c_char;
    pub fn epf_status_message(status: EpfStatus) -> *const c_char;
}
// example-end rust_extern

extern "C" {
    // host.h
    pub fn epf_plan_check(plan: *const EpfPlan) -> EpfStatus;
    pub fn epf_build_signature() -> u64;
    pub fn epf_region_name(region: c_int) -> *const c_char;
    // capi.h: ABI queries, diagnostics, CUDA runtime calls
    pub fn epf_abi_version() -> c_int;
    pub fn epf_abi_has_nccl() -> c_int;
    pub fn epf_abi_sizeof(type_name: *const c_char) -> usize;
    pub fn epf_error_describe(rec: *const EpfErrorRecord, buf: *mut c_char, buf_bytes: usize) -> usize;
    pub fn epf_cuda_device_count(count: *mut c_int) -> EpfStatus;
    pub fn epf_cuda_set_device(device: c_int) -> EpfStatus;
    // core/team.cuh: the cudaError_t behind the last EPF_ERR_CUDA of this thread
    pub fn epf_cuda_last_error() -> c_int;
    pub fn epf_cuda_error_string(cuda_error: c_int) -> *const c_char;
}

// Only in a library built with NCCL (build.rs sets --cfg epfuse_nccl after reading its symbols).
#[cfg(epfuse_nccl)]
extern "C" {
    pub fn epf_nccl_get_unique_id(out: *mut c_void, bytes: usize) -> EpfStatus;
    pub fn epf_nccl_version() -> c_int;
    pub fn epf_nccl_comm_init_rank(
        out_comm: *mut NcclComm,
        nranks: c_int,
        id: NcclUniqueId,
        rank: c_int,
        timeout_s: f64,
    ) -> EpfStatus;
    pub fn epf_nccl_comm_destroy(comm: NcclComm, timeout_s: f64) -> EpfStatus;
    pub fn epf_nccl_window_create(
        comm: NcclComm,
        bytes: usize,
        timeout_s: f64,
        out_win: *mut EpfNcclWindow,
    ) -> EpfStatus;
    pub fn epf_nccl_window_destroy(comm: NcclComm, win: *mut EpfNcclWindow, timeout_s: f64) -> EpfStatus;
    /// NCCL's words for a failure (ncclResult_t crosses as c_int); never NULL.
    pub fn epf_nccl_last_message(comm: NcclComm, result: c_int) -> *const c_char;
}

/// A C string from the library (static, never freed) as a Rust String; "" for NULL.
pub fn c_str(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the library returns NUL-terminated static strings
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// (C typedef name, size of this file's mirror), for the start-up check against epf_abi_sizeof.
pub fn mirrors(library_has_nccl: bool) -> Vec<(&'static CStr, usize)> {
    use std::mem::size_of;
    let mut v: Vec<(&'static CStr, usize)> = vec![
        (c"epf_config_t", size_of::<EpfConfig>()),
        (c"epf_plan_t", size_of::<EpfPlan>()),
        (c"epf_region_t", size_of::<EpfRegion>()),
        (c"epf_error_record_t", size_of::<EpfErrorRecord>()),
    ];
    if library_has_nccl {
        v.push((c"epf_nccl_window_t", size_of::<EpfNcclWindow>()));
        v.push((c"ncclUniqueId", size_of::<NcclUniqueId>()));
        v.push((c"ncclComm_t", size_of::<NcclComm>()));
        v.push((c"ncclWindow_t", size_of::<NcclWindow>()));
    }
    v
}
