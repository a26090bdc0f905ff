#!/usr/bin/env python3
"""check_quant_torch.py — epfuse's MXFP8 and per-128 FP8 bytes against PyTorch's own cast.

Quantizes random BF16 (and FP32) tensors on the GPU with epfuse's row blocks, through
libepf_quant_shim.so (ctypes, device pointers, torch's current stream), and compares:
  - MXFP8: scale bytes with the RCEIL / FLOOR formula written here in torch ops, and every element
    byte with torch's float8_e4m3fn cast of the same scaled value x * 2^(127 - scale) in FP32;
    swizzled scales with torchao-style to_blocked() of the compact scales (padding must be 0);
  - per-128 FP8: the FP32 scales (max(amax, 1e-4) / 448, optionally rounded up to a power of two)
    and every element byte with torch's cast of x / s in FP32.
Torch's cast is not saturating (|v| >= 480 becomes NaN), so the scaled values are clamped to
+-448 first (NaN kept), which is what satfinite means. NaN elements must be 0x7F on our side and
a NaN on torch's (0x7F or 0xFF). Inputs carry NaN, +-Inf, +-0, subnormals and whole special blocks.

Prints one line per case and a final "check_quant_torch: PASS ..." or "check_quant_torch: FAIL ...";
exits 1 on any mismatch, 0 on PASS or when PyTorch / a GPU is missing (SKIP).

Usage: python3 scripts/check_quant_torch.py [path/to/libepf_quant_shim.so] [--build DIR] [--seed N]
       (default library: DIR/tests/gpu/libepf_quant_shim.so for DIR in --build, build-gpu, build)
"""
import argparse
import ctypes
import os
import sys

from epf_torch_common import find_quant_shim, torch_cuda

PAYLOAD_RCEIL, PAYLOAD_FLOOR = 0, 1
COMPACT, SWIZZLED = 1, 2


def load(path):
    lib = ctypes.CDLL(path)
    P, I, L = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    for name in ("epf_shim_mxfp8_quantize_bf16", "epf_shim_mxfp8_quantize_f32"):
        f = getattr(lib, name)
        f.argtypes = [P, L, I, I, I, P, P, P]
        f.restype = I
    for name in ("epf_shim_fp8_128_quantize_bf16", "epf_shim_fp8_128_quantize_f32"):
        f = getattr(lib, name)
        f.argtypes = [P, L, I, I, P, P, P]
        f.restype = I
    lib.epf_shim_scale_bytes.argtypes = [I, L, I]
    lib.epf_shim_scale_bytes.restype = L
    lib.epf_shim_set_launch.argtypes = [I, I]
    lib.epf_shim_set_launch.restype = None
    return lib


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib", nargs="?", default=None, help="path to libepf_quant_shim.so")
    ap.add_argument("--build", default=None, help="build directory (gpu_suite.sh passes it)")
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    torch = torch_cuda("check_quant_torch", "{name}: SKIP ({why})")
    if torch is None:
        return 0
    path = find_quant_shim(a.lib, a.build)
    if path is None:
        print("check_quant_torch: FAIL (libepf_quant_shim.so not found; build the epf_quant_shim target)")
        return 1
    lib = load(path)
    dev = torch.device("cuda")
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"check_quant_torch: {path}, torch {torch.__version__}, seed {seed}")
    g = torch.Generator(device=dev).manual_seed(seed)
    f32, i32, u8 = torch.float32, torch.int32, torch.uint8

    def stream():
        return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def make_input(rows, H, dtype):
        """values spread over many binades per 32-block, with specials injected"""
        n = rows * H
        blocks = (n + 31) // 32
        base = torch.randint(-40, 40, (blocks, 1), device=dev, generator=g).float()
        base[torch.rand(blocks, 1, device=dev, generator=g) < 0.02] = 120.0  # near the top
        base[torch.rand(blocks, 1, device=dev, generator=g) < 0.02] = -130.0  # subnormal blocks
        mant = torch.rand(blocks, 32, device=dev, generator=g) + 0.5
        sign = torch.where(torch.rand(blocks, 32, device=dev, generator=g) < 0.5, -1.0, 1.0)
        down = torch.randint(0, 20, (blocks, 32), device=dev, generator=g).float()
        x = (sign * mant * torch.exp2(base - down)).view(-1)[:n].clone()
        r = torch.rand(n, device=dev, generator=g)
        x[r < 0.004] = float("nan")
        x[(r >= 0.004) & (r < 0.006)] = float("inf")
        x[(r >= 0.006) & (r < 0.008)] = float("-inf")
        x[(r >= 0.008) & (r < 0.012)] = 0.0
        x[(r >= 0.012) & (r < 0.016)] = -0.0
        x[(r >= 0.016) & (r < 0.02)] = 1e-39  # subnormal
        x = x.view(-1, 32)
        kind = torch.rand(x.shape[0], device=dev, generator=g)
        x[kind < 0.02] = 0.0
        x[(kind >= 0.02) & (kind < 0.03)] = float("nan")
        return x.reshape(rows, H).to(dtype).contiguous()

    def cast_e4m3(v):
        """torch's float8_e4m3fn cast of v (FP32), saturated to +-448 first, NaN kept"""
        sat = torch.where(torch.isnan(v), v, v.clamp(-448.0, 448.0))
        return sat.to(torch.float8_e4m3fn).view(u8)

    def e8m0_roundup(v):
        """smallest 2^(b-127) >= v for v >= 0 (FP32): from the bit pattern, saturating at 254"""
        bits = v.view(i32)
        e, m = bits >> 23, bits & 0x7FFFFF
        b = torch.where(e == 0, (m > 0x400000).to(i32), e + (m != 0).to(i32))
        return b.clamp(max=254)

    def ref_mxfp8(x, rule):
        rows, H = x.shape
        xf = x.float().view(rows, H // 32, 32)
        ax = xf.abs()
        amax = torch.where(torch.isnan(ax), torch.zeros_like(ax), ax).amax(-1)
        if rule == PAYLOAD_RCEIL:
            b = e8m0_roundup(amax * torch.tensor(1.0 / 448.0, dtype=f32, device=dev))
        else:
            e = amax.view(i32) >> 23
            b = torch.where(e == 255, torch.full_like(e, 254), (e - 8).clamp(min=0))
        mult = torch.where(b == 254, torch.full_like(b, 0x00400000), (254 - b) << 23).view(f32)
        q = cast_e4m3(xf * mult.unsqueeze(-1))
        return b.to(u8), q.view(rows, H), torch.isnan(xf).view(rows, H)

    def to_blocked(sf, rows, ncols):
        """torchao's to_blocked: pad to [128k, 4m], 128x4 blocks, block.reshape(4,32,4).transpose(0,1)"""
        rb, cb = (rows + 127) // 128, (ncols + 3) // 4
        p = torch.zeros(rb * 128, cb * 4, dtype=u8, device=dev)
        p[:rows, :ncols] = sf
        blocks = p.view(rb, 128, cb, 4).permute(0, 2, 1, 3)
        return blocks.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1)

    def ref_fp8_128(x, ue8m0):
        rows, H = x.shape
        xf = x.float().view(rows, H // 128, 128)
        ax = xf.abs()
        amax = torch.where(torch.isnan(ax), torch.zeros_like(ax), ax).amax(-1)
        # IEEE division by a tensor: PyTorch computes `tensor / python_scalar` as a multiplication by
        # the scalar's reciprocal, which is 1 ulp off RN(amax / 448) for some amax (seen on the H200).
        s = amax.clamp(min=1e-4) / torch.full_like(amax, 448.0)
        if ue8m0:
            s = (e8m0_roundup(s) << 23).view(f32)
        q = cast_e4m3(xf / s.unsqueeze(-1))
        return s, q.view(rows, H), torch.isnan(xf).view(rows, H)

    failures, cases, compared = 0, 0, 0

    def compare_bytes(name, ours, ref, nan):
        nonlocal failures, compared
        compared += ours.numel()
        bad = (ours != ref) & ~nan
        bad |= nan & ((ours != 0x7F) | ((ref & 0x7F) != 0x7F))
        n = int(bad.sum())
        if n:
            failures += 1
            idx = bad.nonzero()[0].tolist()
            print(f"  MISMATCH {name}: {n} bytes, first at {idx}: ours 0x{int(ours[tuple(idx)]):02x} "
                  f"torch 0x{int(ref[tuple(idx)]):02x}")
        return n == 0

    lib.epf_shim_set_launch(256, 0)
    for dtype in (torch.bfloat16, torch.float32):
        tn = "bf16" if dtype == torch.bfloat16 else "f32"
        for H in (32, 2880, 4096, 7168):
            for rows in (1, 37, 1000):
                failures_before = failures
                x = make_input(rows, H, dtype)
                ncols = H // 32
                for rule in (PAYLOAD_RCEIL, PAYLOAD_FLOOR):
                    rb, rq, rnan = ref_mxfp8(x, rule)
                    for layout in (COMPACT, SWIZZLED):
                        nbytes = lib.epf_shim_scale_bytes(layout, rows, ncols)
                        q = torch.full((rows, H), 0xAA, dtype=u8, device=dev)
                        sf = torch.full((nbytes,), 0xAA, dtype=u8, device=dev)
                        fn = lib.epf_shim_mxfp8_quantize_bf16 if dtype == torch.bfloat16 else lib.epf_shim_mxfp8_quantize_f32
                        st = fn(x.data_ptr(), rows, H, rule, layout, q.data_ptr(), sf.data_ptr(), stream())
                        torch.cuda.synchronize()
                        name = f"MXFP8 {tn} H={H} rows={rows} {'RCEIL' if rule == 0 else 'FLOOR'} {'compact' if layout == 1 else 'swizzled'}"
                        cases += 1
                        if st != 0:
                            failures += 1
                            print(f"  FAIL {name}: status {st}")
                            continue
                        ok = compare_bytes(name + " elements", q, rq, rnan)
                        want_sf = rb.view(-1) if layout == COMPACT else to_blocked(rb, rows, ncols)
                        ok &= compare_bytes(name + " scales", sf, want_sf, torch.zeros_like(sf, dtype=torch.bool))
                print(f"MXFP8   {tn} H={H:5d} rows={rows:5d}: RCEIL+FLOOR, compact+swizzled  {'ok' if failures == failures_before else 'FAILURES'}")
        for H in (128, 4096, 7168):
            for rows in (1, 37, 1000):
                failures_before = failures
                x = make_input(rows, H, dtype)
                for ue in (0, 1):
                    rs, rq, rnan = ref_fp8_128(x, ue)
                    q = torch.full((rows, H), 0xAA, dtype=u8, device=dev)
                    sf = torch.full((rows, H // 128), float("nan"), dtype=f32, device=dev)
                    fn = lib.epf_shim_fp8_128_quantize_bf16 if dtype == torch.bfloat16 else lib.epf_shim_fp8_128_quantize_f32
                    st = fn(x.data_ptr(), rows, H, ue, q.data_ptr(), sf.data_ptr(), stream())
                    torch.cuda.synchronize()
                    name = f"FP8-128 {tn} H={H} rows={rows} ue8m0={ue}"
                    cases += 1
                    if st != 0:
                        failures += 1
                        print(f"  FAIL {name}: status {st}")
                        continue
                    compare_bytes(name + " elements", q, rq, rnan)
                    sbad = int((sf.view(i32) != rs.view(i32)).sum())
                    if sbad:
                        failures += 1
                        print(f"  MISMATCH {name} scales: {sbad}")
                print(f"FP8-128 {tn} H={H:5d} rows={rows:5d}: FP32 + UE8M0 scales             {'ok' if failures == failures_before else 'FAILURES'}")
    # the refusal: 2880 is not a multiple of 128
    x = make_input(4, 2880, torch.bfloat16)
    q = torch.empty((4, 2880), dtype=u8, device=dev)
    sf = torch.empty((4, 23), dtype=f32, device=dev)
    st = lib.epf_shim_fp8_128_quantize_bf16(x.data_ptr(), 4, 2880, 0, q.data_ptr(), sf.data_ptr(), stream())
    cases += 1
    if st != 9:  # EPF_ERR_HIDDEN_ALIGNMENT
        failures += 1
        print(f"  FAIL per-128 H=2880 returned {st}, want 9 (EPF_ERR_HIDDEN_ALIGNMENT)")
    if failures:
        print(f"check_quant_torch: FAIL ({failures} mismatching comparisons in {cases} cases, seed {seed})")
        return 1
    print(f"check_quant_torch: PASS ({cases} cases, {compared} bytes equal to torch.float8_e4m3fn casts, seed {seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
