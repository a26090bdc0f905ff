#!/usr/bin/env python3
"""bench_quant_torch.py — MXFP8 and per-128 FP8 quantization of a [32768, 7168] BF16 tensor:
epfuse (through libepf_quant_shim.so) next to PyTorch eager and torch.compile, and the copy ceiling,
all measured in the same process. Prints one side-by-side table.

  bytes moved  = BF16 input read + E4M3 written + scales written (the same count for every column)
  copy ceiling = 2 x input bytes / time of dst.copy_(src) of an input-sized tensor
  time         = median of CUDA-event timings over --iters calls; 3 input tensors are rotated so
                 the L2 never holds the next call's input.
The PyTorch versions compute the same rules (RCEIL scale byte from the FP32 bit pattern, elements
cast after multiplying by 2^-e; per-128: max(amax, 1e-4) / 448 and x / s), so they do the same work;
they are not bit-checked here (scripts/check_quant_torch.py checks epfuse against torch's cast).

Usage: python3 scripts/bench_quant_torch.py [path/to/libepf_quant_shim.so] [--build DIR]
                                            [--rows 32768] [--hidden 7168] [--iters 50] [--no-compile]
"""
import argparse
import ctypes
import sys

from epf_torch_common import find_quant_shim, median_us, torch_cuda


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib", nargs="?", default=None)
    ap.add_argument("--build", default=None)
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    torch = torch_cuda("bench_quant_torch")
    if torch is None:
        return 0
    dev = torch.device("cuda")
    M, H = a.rows, a.hidden
    f32, i32, u8 = torch.float32, torch.int32, torch.uint8
    g = torch.Generator(device=dev).manual_seed(1234)
    xs = [torch.randn(M, H, device=dev, generator=g, dtype=f32).to(torch.bfloat16) for _ in range(3)]
    in_bytes = M * H * 2

    def mxfp8_rceil(x):
        xb = x.view(M, H // 32, 32).float()
        amax = xb.abs().amax(-1)
        bits = (amax * (1.0 / 448.0)).view(i32)
        e, m = bits >> 23, bits & 0x7FFFFF
        b = torch.where(e == 0, (m > 0x400000).to(i32), e + (m != 0).to(i32)).clamp(max=254)
        mult = torch.where(b == 254, torch.full_like(b, 0x00400000), (254 - b) << 23).view(f32)
        q = (xb * mult.unsqueeze(-1)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        return q.view(M, H), b.to(u8)

    def fp8_128(x):
        xb = x.view(M, H // 128, 128).float()
        s = xb.abs().amax(-1).clamp(min=1e-4) / 448.0
        q = (xb / s.unsqueeze(-1)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        return q.view(M, H), s

    def timeit(fn):
        """fn(x) over the three inputs in turn (no run finds its input in L2)"""
        turn = iter(range(1 << 62))
        return median_us(lambda: fn(xs[next(turn) % 3]), a.iters, warmup=3)

    dst = torch.empty_like(xs[0])
    copy_us = timeit(lambda x: dst.copy_(x))
    ceiling = 2.0 * in_bytes / (copy_us * 1e-6) / 1e9

    rows = []  # (job, impl, bytes, us)
    mx_bytes = in_bytes + M * H + M * (H // 32)
    f128_bytes = in_bytes + M * H + M * (H // 128) * 4
    rows.append(("MXFP8 RCEIL", "torch eager", mx_bytes, timeit(mxfp8_rceil)))
    rows.append(("FP8 per-128", "torch eager", f128_bytes, timeit(fp8_128)))
    if not a.no_compile:
        try:
            cm = torch.compile(mxfp8_rceil)
            cf = torch.compile(fp8_128)
            rows.append(("MXFP8 RCEIL", "torch.compile", mx_bytes, timeit(cm)))
            rows.append(("FP8 per-128", "torch.compile", f128_bytes, timeit(cf)))
        except Exception as ex:  # no Triton / compiler: still print the rest
            print(f"bench_quant_torch: torch.compile unavailable ({type(ex).__name__}: {ex})")

    path = find_quant_shim(a.lib, a.build)
    if path is None:
        print("bench_quant_torch: libepf_quant_shim.so not found; epfuse column skipped")
    else:
        lib = ctypes.CDLL(path)
        P, I, L = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
        lib.epf_shim_mxfp8_quantize_bf16.argtypes = [P, L, I, I, I, P, P, P]
        lib.epf_shim_mxfp8_quantize_bf16.restype = I
        lib.epf_shim_fp8_128_quantize_bf16.argtypes = [P, L, I, I, P, P, P]
        lib.epf_shim_fp8_128_quantize_bf16.restype = I
        lib.epf_shim_set_launch.argtypes = [I, I]
        lib.epf_shim_set_launch(256, 0)
        q = torch.empty(M, H, dtype=u8, device=dev)
        sf8 = torch.empty(M * (H // 32), dtype=u8, device=dev)
        sf32 = torch.empty(M, H // 128, dtype=f32, device=dev)

        def stream():
            return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

        def ours_mx(x):
            st = lib.epf_shim_mxfp8_quantize_bf16(x.data_ptr(), M, H, 0, 1, q.data_ptr(), sf8.data_ptr(), stream())
            if st:
                raise RuntimeError(f"epf_shim_mxfp8_quantize_bf16: status {st}")

        def ours_128(x):
            st = lib.epf_shim_fp8_128_quantize_bf16(x.data_ptr(), M, H, 0, q.data_ptr(), sf32.data_ptr(), stream())
            if st:
                raise RuntimeError(f"epf_shim_fp8_128_quantize_bf16: status {st}")

        rows.append(("MXFP8 RCEIL", "epfuse", mx_bytes, timeit(ours_mx)))
        rows.append(("FP8 per-128", "epfuse", f128_bytes, timeit(ours_128)))

    print(f"bench_quant_torch: [{M} x {H}] BF16 ({in_bytes / 1e6:.1f} MB), {torch.cuda.get_device_name(0)}, "
          f"torch {torch.__version__}, median of {a.iters} CUDA-event timings, 3 rotating inputs")
    print(f"copy ceiling (dst.copy_(src), read + write counted): {copy_us:.1f} us, {ceiling:.1f} GB/s")
    print(f"{'job':<14} {'implementation':<15} {'MB moved':>9} {'us':>9} {'GB/s':>9} {'% ceiling':>10}")
    for job, impl, nbytes, us in sorted(rows, key=lambda r: (r[0], r[3])):
        gbs = nbytes / (us * 1e-6) / 1e9
        print(f"{job:<14} {impl:<15} {nbytes / 1e6:9.1f} {us:9.1f} {gbs:9.1f} {100.0 * gbs / ceiling:9.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
