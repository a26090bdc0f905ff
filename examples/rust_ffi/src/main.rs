//! rust_ffi — an engine with a raw NCCL FFI uses epfuse through libepfuse.so (the C ABI).
//!
//! Learning objectives
//!   - hand-written #[repr(C)] mirrors (src/ffi.rs), checked at start-up with epf_abi_sizeof and
//!     epf_abi_version: a binding that drifted from the library refuses to run instead of
//!     corrupting memory;
//!   - the window plan from Rust: epf_plan_compute, its regions and total_bytes;
//!   - statuses as a Rust `Result<_, EpfError>` carrying the status name and sentence (and the CUDA
//!     error behind EPF_ERR_CUDA); a plan that did not come from this library build is refused by
//!     epf_plan_check (EPF_ERR_BUILD_MISMATCH);
//!   - with a GPU: a non-blocking 1-rank NCCL communicator with a deadline and the symmetric window
//!     of plan.total_bytes, torn down with every status checked.
//!
//! Usage: epfuse_rust_ffi [--host-only]
//!
//! Exit status: 0 done; 1 an epfuse call failed; 2 the mirrors do not match the library (refused);
//! 64 bad arguments; 77 the GPU part was skipped (no device, or a library without NCCL; CTest
//! reports "Not Run"), never with --host-only, which stops after the host part with 0.
mod ffi;

use ffi::*;
use std::ffi::CStr;
use std::fmt;
use std::process::ExitCode;

// ---- statuses as Rust errors ---------------------------------------------------------------------

/// A failed epfuse call: which call, its status, and what the library can say about it.
#[derive(Debug, Clone)]
pub struct EpfError {
    pub call: &'static str,
    pub status: EpfStatus,
    /// the CUDA error behind EPF_ERR_CUDA, or NCCL's own words behind EPF_ERR_NCCL
    pub detail: Option<String>,
}

impl EpfError {
    pub fn name(&self) -> String {
        c_str(unsafe { epf_status_name(self.status) })
    }
    pub fn message(&self) -> String {
        c_str(unsafe { epf_status_message(self.status) })
    }
}

impl fmt::Display for EpfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}: {}", self.call, self.name(), self.message())?;
        if let Some(d) = &self.detail {
            write!(f, " ({d})")?;
        }
        Ok(())
    }
}

impl std::error::Error for EpfError {}

pub type Result<T> = std::result::Result<T, EpfError>;

/// EPF_OK -> Ok(()); anything else -> Err, with the CUDA error behind EPF_ERR_CUDA (the library
/// keeps it per thread: epf_cuda_last_error).
pub fn check(status: EpfStatus, call: &'static str) -> Result<()> {
    if status == EPF_OK {
        return Ok(());
    }
    let detail = if status == EPF_ERR_CUDA {
        let e = unsafe { epf_cuda_last_error() };
        Some(format!("CUDA error {e}: {}", c_str(unsafe { epf_cuda_error_string(e) })))
    } else {
        None
    };
    Err(EpfError { call, status, detail })
}

// ---- start-up: the mirrors and the version must match the library -------------------------------

fn version_string(v: i32) -> String {
    format!("{}.{}.{}", v / 100_000, (v / 100) % 1000, v % 100)
}

/// Every mirror's size against epf_abi_sizeof, and the library's version against the one the
/// mirrors were written for. Err: one line per problem.
fn check_abi(has_nccl: bool) -> std::result::Result<String, Vec<String>> {
    let mut problems = Vec::new();
    let lib = unsafe { epf_abi_version() };
    // 0.x: a minor release may change the structs, so major.minor must match; a patch may differ.
    if lib / 100 != EPF_VERSION / 100 {
        problems.push(format!(
            "libepfuse.so is version {} but src/ffi.rs mirrors the {} headers: update the mirrors",
            version_string(lib),
            version_string(EPF_VERSION)
        ));
    }
    let mut sizes = Vec::new();
    for (name, mine) in mirrors(has_nccl) {
        let theirs = unsafe { epf_abi_sizeof(name.as_ptr()) };
        let name = name.to_string_lossy();
        if theirs == 0 {
            problems.push(format!("libepfuse.so does not know the type {name} (epf_abi_sizeof returned 0)"));
        } else if theirs != mine {
            problems.push(format!(
                "{name} is {theirs} bytes in libepfuse.so but {mine} bytes in the Rust mirror (src/ffi.rs)"
            ));
        } else {
            sizes.push(format!("{name} {mine}"));
        }
    }
    if problems.is_empty() {
        Ok(sizes.join(", "))
    } else {
        Err(problems)
    }
}

// ---- host part: plans, refusals, the error record ------------------------------------------------

/// The plan for a config, through the C ABI.
fn plan_compute(cfg: &EpfConfig) -> Result<EpfPlan> {
    let mut plan = EpfPlan::default();
    check(unsafe { epf_plan_compute(cfg, &mut plan) }, "epf_plan_compute")?;
    Ok(plan)
}

fn print_plan(plan: &EpfPlan) {
    println!(
        "plan: R={} E={} (E/R={}) K={} H={} T={}, {}, {}, recv_capacity {} rows, row {} B",
        plan.nranks,
        plan.num_experts,
        plan.experts_per_rank,
        plan.top_k,
        plan.hidden,
        plan.max_tokens_per_rank,
        if plan.mode == EPF_MODE_LL { "low-latency" } else { "high-throughput" },
        if plan.layout == EPF_LAYOUT_RANK_MAJOR { "rank-major" } else { "expert-major" },
        plan.recv_capacity,
        plan.row_bytes
    );
    println!("  {:<16} {:>14} {:>14}", "region", "offset", "bytes");
    for (i, r) in plan.region.iter().enumerate() {
        let name = c_str(unsafe { epf_region_name(i as i32) });
        println!("  {:<16} {:>14} {:>14}", name, r.offset, r.bytes);
    }
    println!(
        "  total_bytes      {:>14} ({:.1} MiB per rank), config hash {:016x}, build signature {:016x}",
        plan.total_bytes,
        plan.total_bytes as f64 / (1u64 << 20) as f64,
        plan.config_hash,
        plan.build_signature
    );
}

/// The host part: runs without a GPU. Returns the plan the GPU part sizes its window with.
fn host_part() -> Result<EpfPlan> {
    // example-begin rust_plan
    let mut cfg = EpfConfig::default();
    unsafe { epf_config_init(&mut cfg) }; // size/magic/version; zero fields mean "default"
    cfg.nranks = 8; // a gpt-oss-like shape: 128 experts, top-4, hidden 2880
    cfg.num_experts = 128;
    cfg.top_k = 4;
    cfg.hidden = 2880;
    cfg.max_tokens_per_rank = 4096;
    cfg.mode = EPF_MODE_HT;
    let mut plan = EpfPlan::default();
    let st = unsafe { epf_plan_compute(&cfg, &mut plan) };
    if st != EPF_OK {
        let name = unsafe { CStr::from_ptr(epf_status_name(st)) }.to_string_lossy();
        let msg = unsafe { CStr::from_ptr(epf_status_message(st)) }.to_string_lossy();
        panic!("epf_plan_compute: {name}: {msg}");
    }
    println!("symmetric window per rank: {} bytes", plan.total_bytes);
    // example-end rust_plan
    print_plan(&plan);
    check(unsafe { epf_plan_check(&plan) }, "epf_plan_check")?;
    println!("epf_plan_check(plan): EPF_OK (computed by this library build)");

    // A bad config: the Err carries the status name and its sentence.
    let mut bad = cfg;
    bad.num_experts = 100; // not a multiple of nranks = 8
    match plan_compute(&bad) {
        Err(e) if e.status == EPF_ERR_EXPERTS_NOT_DIVISIBLE => {
            println!("128 -> 100 experts on 8 ranks: refused: {e}")
        }
        Err(e) => return Err(e),
        Ok(_) => panic!("a config with 100 experts on 8 ranks was accepted"),
    }

    // A plan that did not come from this build (here: a changed signature) is refused.
    let mut forged = plan;
    forged.build_signature ^= 1;
    match check(unsafe { epf_plan_check(&forged) }, "epf_plan_check") {
        Err(e) if e.status == EPF_ERR_BUILD_MISMATCH => {
            println!("plan with another build_signature: refused: {e}")
        }
        Err(e) => return Err(e),
        Ok(()) => panic!("a plan with a changed build_signature passed epf_plan_check"),
    }

    // What a timed-out wait leaves in the host-mapped error record, as the library words it.
    let rec = EpfErrorRecord {
        status: EPF_ERR_TIMEOUT as u32,
        count: 1,
        valid: 1,
        waiter_rank: 3,
        waiter_block: 17,
        waiter_thread: 0,
        peer: 5,
        address: 0x7f3a_0000_2040,
        wanted: 42,
        seen: 41,
        elapsed_ns: 10_000_000_000,
        ..EpfErrorRecord::default()
    };
    println!("a sample error record reads: {}", describe(&rec));
    Ok(plan)
}

/// epf_error_describe, sized like snprintf: ask for the length, then fill.
fn describe(rec: &EpfErrorRecord) -> String {
    let need = unsafe { epf_error_describe(rec, std::ptr::null_mut(), 0) };
    let mut buf = vec![0u8; need + 1];
    unsafe { epf_error_describe(rec, buf.as_mut_ptr().cast(), buf.len()) };
    buf.truncate(need);
    String::from_utf8_lossy(&buf).into_owned()
}

// ---- GPU part: communicator and symmetric window over NCCL ---------------------------------------

#[cfg(epfuse_nccl)]
mod gpu {
    use super::{check, EpfError, Result};
    use crate::ffi::*;

    /// Deadline of every NCCL setup call (seconds): a missing peer is a diagnosed error, never a hang.
    const NCCL_TIMEOUT_S: f64 = 60.0;

    /// EPF_ERR_NCCL also says what NCCL said on this communicator.
    fn check_nccl(status: EpfStatus, call: &'static str, comm: NcclComm) -> Result<()> {
        check(status, call).map_err(|mut e: EpfError| {
            if e.status == EPF_ERR_NCCL && !comm.is_null() {
                // ncclResult_t 0 (ncclSuccess): ask for ncclGetLastError(comm) only
                let said = c_str(unsafe { epf_nccl_last_message(comm, 0) });
                if !said.is_empty() && said != "no error" {
                    e.detail = Some(format!("NCCL: {said}"));
                }
            }
            e
        })
    }

    /// A communicator; destroy() checks the status, Drop only cleans up after an error.
    pub struct Comm {
        raw: NcclComm,
    }

    impl Comm {
        /// epf_nccl_comm_init_rank: non-blocking init, finished against the deadline.
        pub fn init(nranks: i32, id: NcclUniqueId, rank: i32) -> Result<Comm> {
            let mut raw: NcclComm = std::ptr::null_mut();
            check_nccl(
                unsafe { epf_nccl_comm_init_rank(&mut raw, nranks, id, rank, NCCL_TIMEOUT_S) },
                "epf_nccl_comm_init_rank",
                std::ptr::null_mut(),
            )?;
            Ok(Comm { raw })
        }
        pub fn raw(&self) -> NcclComm {
            self.raw
        }
        pub fn destroy(mut self) -> Result<()> {
            let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
            check_nccl(unsafe { epf_nccl_comm_destroy(raw, NCCL_TIMEOUT_S) }, "epf_nccl_comm_destroy", raw)
        }
    }

    impl Drop for Comm {
        fn drop(&mut self) {
            if !self.raw.is_null() {
                let _ = unsafe { epf_nccl_comm_destroy(self.raw, NCCL_TIMEOUT_S) };
            }
        }
    }

    /// A symmetric window; borrows its communicator, so it is always destroyed first.
    pub struct Window<'c> {
        comm: &'c Comm,
        pub raw: EpfNcclWindow,
    }

    impl<'c> Window<'c> {
        /// epf_nccl_window_create: ncclMemAlloc + zero + ncclCommWindowRegister (symmetric).
        pub fn create(comm: &'c Comm, bytes: u64) -> Result<Window<'c>> {
            let mut raw = EpfNcclWindow { ptr: std::ptr::null_mut(), bytes: 0, window: std::ptr::null_mut() };
            check_nccl(
                unsafe { epf_nccl_window_create(comm.raw(), bytes as usize, NCCL_TIMEOUT_S, &mut raw) },
                "epf_nccl_window_create",
                comm.raw(),
            )?;
            Ok(Window { comm, raw })
        }
        pub fn destroy(mut self) -> Result<()> {
            let st = unsafe { epf_nccl_window_destroy(self.comm.raw(), &mut self.raw, NCCL_TIMEOUT_S) };
            check_nccl(st, "epf_nccl_window_destroy", self.comm.raw())
        }
    }

    impl Drop for Window<'_> {
        fn drop(&mut self) {
            if !self.raw.ptr.is_null() {
                let _ = unsafe { epf_nccl_window_destroy(self.comm.raw(), &mut self.raw, NCCL_TIMEOUT_S) };
            }
        }
    }

    /// One rank on device 0: unique id, communicator, the plan's window, teardown.
    pub fn run(plan: &EpfPlan) -> Result<()> {
        check(unsafe { epf_cuda_set_device(0) }, "epf_cuda_set_device(0)")?;
        let mut id = NcclUniqueId { internal: [0; 128] };
        check(
            unsafe {
                epf_nccl_get_unique_id(id.internal.as_mut_ptr().cast(), std::mem::size_of::<NcclUniqueId>())
            },
            "epf_nccl_get_unique_id",
        )?;
        let comm = Comm::init(1, id, 0)?;
        println!(
            "NCCL communicator: 1 rank, non-blocking, created within {NCCL_TIMEOUT_S} s: {:p}",
            comm.raw()
        );
        let win = Window::create(&comm, plan.total_bytes)?;
        println!(
            "symmetric window: ptr {:p}, {} bytes ({:.1} MiB), ncclWindow_t {:p}",
            win.raw.ptr,
            win.raw.bytes,
            win.raw.bytes as f64 / (1u64 << 20) as f64,
            win.raw.window
        );
        win.destroy()?;
        println!("window destroyed: EPF_OK");
        comm.destroy()?;
        println!("communicator destroyed: EPF_OK");
        Ok(())
    }
}

/// Ok(true): the GPU part ran; Ok(false): skipped (a line says why); Err: a call failed.
fn gpu_part(plan: &EpfPlan, has_nccl: bool) -> Result<bool> {
    if !has_nccl {
        println!("GPU part skipped: libepfuse.so was built without NCCL (epf_abi_has_nccl() == 0)");
        return Ok(false);
    }
    let mut devices = 0;
    check(unsafe { epf_cuda_device_count(&mut devices) }, "epf_cuda_device_count")?;
    if devices == 0 {
        println!("GPU part skipped: no CUDA device (epf_cuda_device_count reports 0)");
        return Ok(false);
    }
    println!("{devices} CUDA device(s); the GPU part uses device 0");
    #[cfg(epfuse_nccl)]
    {
        gpu::run(plan)?;
        Ok(true)
    }
    #[cfg(not(epfuse_nccl))]
    {
        let _ = plan;
        println!("GPU part skipped: this binary was linked against a libepfuse.so without NCCL; rebuild it");
        Ok(false)
    }
}

fn main() -> ExitCode {
    let mut host_only = false;
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--host-only" => host_only = true,
            "-h" | "--help" => {
                println!("usage: epfuse_rust_ffi [--host-only]");
                return ExitCode::SUCCESS;
            }
            _ => {
                eprintln!("unknown argument {a:?}; usage: epfuse_rust_ffi [--host-only]");
                return ExitCode::from(64);
            }
        }
    }

    // 1. The library: is it the one the mirrors were written for?
    let has_nccl = unsafe { epf_abi_has_nccl() } == 1;
    println!("libepfuse.so: {}", env!("EPFUSE_LINKED_LIB"));
    #[cfg(epfuse_nccl)]
    let nccl = if has_nccl {
        let v = unsafe { epf_nccl_version() };
        format!("yes (NCCL {}.{}.{} loaded)", v / 10000, (v / 100) % 100, v % 100)
    } else {
        "no".to_string()
    };
    #[cfg(not(epfuse_nccl))]
    let nccl = if has_nccl { "yes (not compiled into this binary)" } else { "no" }.to_string();
    println!(
        "  version {}, NCCL: {}, build signature {:016x}",
        version_string(unsafe { epf_abi_version() }),
        nccl,
        unsafe { epf_build_signature() }
    );
    match check_abi(has_nccl) {
        Ok(sizes) => println!("  ABI: the Rust mirrors match the library (bytes: {sizes})"),
        Err(problems) => {
            for p in problems {
                eprintln!("ABI mismatch: {p}");
            }
            eprintln!("refusing to run: the mirrors in src/ffi.rs do not describe this libepfuse.so");
            return ExitCode::from(2);
        }
    }

    // 2. Host part: always.
    let plan = match host_part() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if host_only {
        println!("GPU part not run (--host-only)");
        return ExitCode::SUCCESS;
    }

    // 3. GPU part: a device and a library with NCCL, else exit 77 (CTest: "Not Run").
    match gpu_part(&plan, has_nccl) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(77),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
