"""What epfuse runs on: versions, the NCCL release check, show_versions().

NCCL releases are compared as codes: major * 10000 + minor * 100 + patch from 2.9 on (22809 is
2.28.9), major * 1000 + minor * 100 + patch before (NCCL_VERSION_CODE's two encodings).
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys

from . import _abi


def format_nccl_code(code) -> str:
    """22809 -> "2.28.9" (2708 -> "2.7.8"); None -> "unknown"."""
    if code is None or code < 0:
        return "unknown"
    if code >= 20900:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def parse_nccl_release(text):
    """"2.28.9" -> 22809; None for anything else."""
    try:
        major, minor, patch = (int(p) for p in str(text).strip().split("."))
    except (TypeError, ValueError):
        return None
    if (major, minor) >= (2, 9):
        return major * 10000 + minor * 100 + patch
    return major * 1000 + minor * 100 + patch


def nccl_build_code():
    """NCCL_VERSION_CODE of the headers libepfuse.so was compiled with: epf_nccl_build_version()
    where the library has it, else epfuse_nccl_build.txt beside it; None without NCCL or unknown."""
    if not _abi.HAS_NCCL:
        return None
    f = getattr(_abi, "epf_nccl_build_version", None)
    if f is not None:
        v = int(f())
        return v if v > 0 else None
    return parse_nccl_release(_abi.NCCL_BUILD_VERSION) if _abi.NCCL_BUILD_VERSION else None


def nccl_loaded_code():
    """ncclGetVersion of the NCCL the library runs with (epf_nccl_version); None without NCCL."""
    f = getattr(_abi, "epf_nccl_version", None)
    if not _abi.HAS_NCCL or f is None:
        return None
    v = int(f())
    return v if v > 0 else None


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p), ("dli_sname", ctypes.c_char_p),
                ("dli_saddr", ctypes.c_void_p)]


def nccl_loaded_path():
    """The file of the libnccl.so the library loaded (dladdr of ncclGetVersion), or None."""
    fn = getattr(_abi, "nccl_get_version", None)
    if fn is None:
        return None
    try:
        libc = ctypes.CDLL(None)
        dladdr = libc.dladdr
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        dladdr.restype = ctypes.c_int
        info = _DlInfo()
        if dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info)) and info.dli_fname:
            return os.path.realpath(info.dli_fname.decode(errors="replace"))
    except (OSError, AttributeError):
        pass
    return None


def nccl_problem(built=None, loaded=None):
    """A sentence when the loaded NCCL cannot serve this build — older than the build's release,
    or, for a build against 2.28 headers (whose device-API structures carry no version), any
    release but the same — else None. Arguments default to the library's own codes."""
    built = nccl_build_code() if built is None else built
    loaded = nccl_loaded_code() if loaded is None else loaded
    if built is None or loaded is None or loaded == built:
        return None
    b, l = format_nccl_code(built), format_nccl_code(loaded)
    check = getattr(_abi, "epf_nccl_version_check", None)
    if check is not None:  # the library's own rule and sentence (host_nccl.h); the front adds the paths
        buf = ctypes.create_string_buffer(512)
        if check(int(built), int(loaded), buf, len(buf)) == 0:
            return None
        path = nccl_loaded_path()
        where = f" (loaded from {path})" if path else ""
        return f"libepfuse.so ({_abi.LIBRARY_PATH}) {buf.value.decode()}{where}"
    if loaded < built:  # a library without epf_nccl_version_check: the same rule here
        why = "an older release than the one it was built against"
    elif built // 100 == 228:  # 2.28.x headers: only that exact release
        why = "a build against NCCL 2.28 headers runs only with that exact release"
    else:
        return None
    path = nccl_loaded_path()
    where = f" ({path})" if path else ""
    return (f"libepfuse.so ({_abi.LIBRARY_PATH}) was built against NCCL {b}, but the NCCL loaded at run time"
            f"{where} is {l}: {why}. Build epfuse against the NCCL it will load (next to PyTorch: "
            "`pip install --no-build-isolation ./python`, which compiles against the nvidia-nccl wheel), or make "
            f"NCCL {b} the one loaded (LD_LIBRARY_PATH, or the nvidia-nccl wheel of that release)")


def _cuda_devices():
    """(driver version, [device names]) through the CUDA driver API, or (None, None)."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None, None
    try:
        if cu.cuInit(0) != 0:
            return None, None
        ver, n = ctypes.c_int(0), ctypes.c_int(0)
        drv = ver.value if cu.cuDriverGetVersion(ctypes.byref(ver)) == 0 else None
        if cu.cuDeviceGetCount(ctypes.byref(n)) != 0:
            return drv, None
        names = []
        for i in range(n.value):
            d = ctypes.c_int(0)
            buf = ctypes.create_string_buffer(256)
            if cu.cuDeviceGet(ctypes.byref(d), i) == 0 and cu.cuDeviceGetName(buf, 256, d) == 0:
                names.append(buf.value.decode(errors="replace"))
            else:
                names.append("?")
        return drv, names
    except (AttributeError, OSError):
        return None, None


def _dist_version(*names):
    from importlib import metadata
    for n in names:
        try:
            return f"{metadata.version(n)} ({n})"
        except metadata.PackageNotFoundError:
            continue
        except Exception:  # a broken installation: report, don't fail
            return "?"
    return None


def versions(package_version: str) -> dict:
    """The facts show_versions() prints, as a dict."""
    built, loaded = nccl_build_code(), nccl_loaded_code()
    count = ctypes.c_int(0)
    try:
        runtime_count = count.value if _abi.epf_cuda_device_count(ctypes.byref(count)) == 0 else None
    except Exception:
        runtime_count = None
    driver, names = _cuda_devices()
    abi = int(_abi.epf_abi_version())
    return {
        "epfuse": package_version,
        "libepfuse": _abi.LIBRARY_PATH,
        "epf_abi_version": abi,
        "epf_abi_version_str": f"{abi // 100000}.{abi % 100000 // 100}.{abi % 100}",
        "has_nccl": _abi.HAS_NCCL,
        "nccl_build_code": built,
        "nccl_build": format_nccl_code(built) if built is not None else None,
        "nccl_loaded_code": loaded,
        "nccl_loaded": format_nccl_code(loaded) if loaded is not None else None,
        "nccl_loaded_path": nccl_loaded_path(),
        "nccl_wheel_preloaded": _abi.NCCL_WHEEL_LIBRARY,
        "nccl_problem": nccl_problem() if _abi.HAS_NCCL else None,
        "cuda_driver_version": driver,
        "cuda_device_count": runtime_count,
        "cuda_devices": names,
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "torch": _dist_version("torch"),
        "cupy": _dist_version("cupy", "cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x"),
        "numpy": _dist_version("numpy"),
        "nvidia-nccl": _dist_version("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"),
        "nccl4py": _dist_version("nccl4py"),
    }


def show_versions(package_version: str, file=None) -> None:
    v = versions(package_version)
    out = file if file is not None else sys.stdout
    nccl = "no (built without NCCL)"
    if v["has_nccl"]:
        nccl = f"built against {v['nccl_build'] or 'unknown'}"
        nccl += f", loaded {v['nccl_loaded'] or 'unknown'}"
        if v["nccl_loaded_path"]:
            nccl += f" ({v['nccl_loaded_path']})"
    devs = v["cuda_devices"]
    lines = [
        ("epfuse", v["epfuse"]),
        ("libepfuse.so", v["libepfuse"]),
        ("epf_abi_version", f"{v['epf_abi_version']} ({v['epf_abi_version_str']})"),
        ("NCCL", nccl),
        ("nvidia-nccl wheel preloaded", v["nccl_wheel_preloaded"] or "no"),
        ("CUDA driver", v["cuda_driver_version"] if v["cuda_driver_version"] is not None else "not found"),
        ("CUDA devices", f"{v['cuda_device_count']}" + (": " + ", ".join(devs) if devs else "")),
        ("Python", f"{v['python']} ({v['python_executable']})"),
        ("platform", v["platform"]),
        ("torch", v["torch"] or "not installed"),
        ("cupy", v["cupy"] or "not installed"),
        ("numpy", v["numpy"] or "not installed"),
        ("nvidia-nccl", v["nvidia-nccl"] or "not installed"),
        ("nccl4py", v["nccl4py"] or "not installed"),
    ]
    w = max(len(k) for k, _ in lines)
    for k, val in lines:
        print(f"{k:>{w}}: {val}", file=out)
    if v["nccl_problem"]:
        print(f"{'WARNING':>{w}}: {v['nccl_problem']}", file=out)
