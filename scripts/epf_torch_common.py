"""epf_torch_common.py — what the PyTorch baseline scripts (scripts/*_torch.py) share.

  torch_cuda(name, skip_fmt)  PyTorch with a GPU, or None after printing why the script skips
  median_us(fn, iters, warmup) median of CUDA-event-timed runs, in microseconds
  find_quant_shim(lib, build) path of libepf_quant_shim.so (explicit path, --build, build-gpu, build)

The scripts run as `python3 scripts/<name>.py`, so this module is importable from their folder.
Nothing here is timed or checked itself; each script prints its own table or verdict.
"""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def torch_cuda(name, skip_fmt="{name}: {why}; skipped"):
    """The torch module when PyTorch and a CUDA GPU are there; else None, after printing
    skip_fmt (fields: name, why) — a skip, not a failure (the caller returns 0)."""
    try:
        import torch
    except ImportError:
        print(skip_fmt.format(name=name, why="PyTorch not available"))
        return None
    if not torch.cuda.is_available():
        print(skip_fmt.format(name=name, why="no GPU"))
        return None
    return torch


def median_us(fn, iters, warmup=3, sync_each=True):
    """Median over `iters` runs of fn(), each bracketed by CUDA events on the current stream, after
    `warmup` untimed runs; microseconds. sync_each: wait for each run before the next is queued
    (else all runs are queued back to back and waited for once)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        if sync_each:
            e.synchronize()
        ev.append((s, e))
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) * 1e3 for s, e in ev)
    return times[len(times) // 2]


def find_quant_shim(lib, build):
    """lib if given; else libepf_quant_shim.so under <build>/tests/gpu for build, build-gpu, build
    (relative to the repository root); None when there is none."""
    if lib:
        return lib
    for b in [build, "build-gpu", "build"]:
        if not b:
            continue
        p = b if os.path.isabs(b) else os.path.join(ROOT, b)
        p = os.path.join(p, "tests", "gpu", "libepf_quant_shim.so")
        if os.path.exists(p):
            return p
    return None
