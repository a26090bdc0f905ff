//! build.rs — find libepfuse.so (the C ABI of epfuse) and link the example against it.
//!
//! Where it looks, first hit wins:
//!   1. $EPFUSE_LIB_DIR (the directory that holds libepfuse.so; nothing else is tried when it is set)
//!   2. the CMake build trees of this repository: ../../build/src, then ../../build-*/src (sorted)
//!
//! It prints the link search path, `-l epfuse` and an rpath to that directory, so `cargo run` needs
//! no LD_LIBRARY_PATH. It also reads the library's dynamic symbol table: when the library exports
//! the NCCL functions (built with NCCL), it sets `--cfg epfuse_nccl`, which compiles in the extern
//! block of the NCCL functions and the GPU part (a library without them would not link).
use std::env;
use std::fs;
use std::path::{Path, PathBuf};

const LIB_FILE: &str = "libepfuse.so";
const NCCL_PROBE: &str = "epf_nccl_comm_init_rank";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=EPFUSE_LIB_DIR");
    println!("cargo:rustc-check-cfg=cfg(epfuse_nccl)");

    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let repo = manifest.join("..").join("..");

    let (dir, tried) = match env::var_os("EPFUSE_LIB_DIR") {
        Some(d) if !d.is_empty() => {
            let d = PathBuf::from(d);
            let found = d.join(LIB_FILE).is_file();
            (if found { Some(d.clone()) } else { None }, vec![d])
        }
        _ => {
            let candidates = build_dirs(&repo);
            let found = candidates.iter().find(|d| d.join(LIB_FILE).is_file()).cloned();
            (found, candidates)
        }
    };

    let dir = match dir {
        Some(d) => fs::canonicalize(&d).unwrap_or(d),
        None => {
            let list: Vec<String> = tried.iter().map(|d| format!("    {}", d.display())).collect();
            panic!(
                "\n\nepfuse rust_ffi: {LIB_FILE} not found. Looked in:\n{}\n\
                 Build it (from the repository root):\n    \
                 cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build --target epfuse_capi\n\
                 or point EPFUSE_LIB_DIR at the directory that holds {LIB_FILE}:\n    \
                 EPFUSE_LIB_DIR=/path/to/build/src cargo run --release\n\n",
                if list.is_empty() { "    (no candidate directory)".to_string() } else { list.join("\n") }
            );
        }
    };
    let lib = dir.join(LIB_FILE);
    println!("cargo:rerun-if-changed={}", lib.display());
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=epfuse");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    println!("cargo:rustc-env=EPFUSE_LINKED_LIB={}", lib.display());

    let bytes =
        fs::read(&lib).unwrap_or_else(|e| panic!("epfuse rust_ffi: cannot read {}: {e}", lib.display()));
    let has_nccl = match exports(&bytes, NCCL_PROBE) {
        Some(v) => v,
        None => {
            println!(
                "cargo:warning={} is not an ELF64 little-endian library this script can read; \
                      assuming it has no NCCL functions",
                lib.display()
            );
            false
        }
    };
    if has_nccl {
        println!("cargo:rustc-cfg=epfuse_nccl");
    } else {
        println!(
            "cargo:warning={} has no NCCL functions (built without NCCL): the GPU part is not compiled",
            lib.display()
        );
    }
}

/// ../../build/src, then ../../build-*/src and ../../build_*/src in name order.
fn build_dirs(repo: &Path) -> Vec<PathBuf> {
    let mut out = vec![repo.join("build").join("src")];
    let mut more: Vec<PathBuf> = match fs::read_dir(repo) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .filter(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                (n.starts_with("build-") || n.starts_with("build_")) && e.path().is_dir()
            })
            .map(|e| e.path().join("src"))
            .collect(),
        Err(_) => Vec::new(),
    };
    more.sort();
    out.extend(more);
    out
}

fn rd_u16(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn rd_u32(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn rd_u64(b: &[u8], o: usize) -> Option<usize> {
    usize::try_from(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?)).ok()
}

/// Whether an ELF64 little-endian shared object defines `name` in its dynamic symbol table
/// (.dynsym: what the dynamic linker can bind). None if the file cannot be read as one.
fn exports(b: &[u8], name: &str) -> Option<bool> {
    const SHT_DYNSYM: u32 = 11;
    if b.get(0..4)? != b"\x7fELF" || *b.get(4)? != 2 || *b.get(5)? != 1 {
        return None;
    }
    let shoff = rd_u64(b, 0x28)?;
    let shentsize = rd_u16(b, 0x3a)? as usize;
    let shnum = rd_u16(b, 0x3c)? as usize;
    if shentsize < 64 {
        return None;
    }
    let section = |i: usize| shoff.checked_add(i.checked_mul(shentsize)?);
    for i in 0..shnum {
        let sh = section(i)?;
        if rd_u32(b, sh + 4)? != SHT_DYNSYM {
            continue;
        }
        let (off, size, link, entsize) =
            (rd_u64(b, sh + 24)?, rd_u64(b, sh + 32)?, rd_u32(b, sh + 40)? as usize, rd_u64(b, sh + 56)?);
        let strtab = section(link)?;
        let str_off = rd_u64(b, strtab + 24)?;
        let str_size = rd_u64(b, strtab + 32)?;
        let strings = b.get(str_off..str_off.checked_add(str_size)?)?;
        if entsize < 24 {
            return None;
        }
        for s in 0..size / entsize {
            let sym = off.checked_add(s * entsize)?;
            let st_name = rd_u32(b, sym)? as usize;
            let st_shndx = rd_u16(b, sym + 6)?;
            if st_shndx == 0 {
                continue; // undefined: imported, not exported
            }
            let tail = strings.get(st_name..)?;
            let end = tail.iter().position(|&c| c == 0)?;
            if &tail[..end] == name.as_bytes() {
                return Some(true);
            }
        }
        return Some(false);
    }
    Some(false)
}
