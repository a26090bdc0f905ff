#!/usr/bin/env python3
"""moe_layer_torch.py — the MoE layer of examples/05_moe_layer_gemm in plain PyTorch: accuracy and time.

  python3 scripts/moe_layer_torch.py --dump DIR     DIR written by `ex05_moe_layer_gemm --dump DIR`:
      the same inputs, top-k, weights and the example's outputs (bf16 and fp8 paths). The layer is
      recomputed in float64 from the BF16 data, with the element-wise error bound of each path
      (examples/05_moe_layer_gemm/README.md "Accuracy": the same formula as the example's own CPU
      check), and every output element must lie within it. Exit 1 on any violation.
      Then the same layer is timed in BF16 on this GPU: eager and torch.compile.
  python3 scripts/moe_layer_torch.py --shape real   time only, random data of the real shape
                                                    (H 7168, I 2048, E 256, top-8, 8 x 4096 tokens)
  options: --iters N (timing, default 10), --no-time, --no-compile, --device cuda|cpu (reference)

The PyTorch layer is the whole EP team's work on one GPU with no communication: tokens sorted by
expert, one BF16 GEMM pair per expert (torch.matmul, FP32 accumulation), SiLU(gate) * up, the
weighted sum in FP32 by index_add_ — the same FLOPs as the example's 8 virtual ranks.
"""
import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from epf_torch_common import median_us, torch_cuda  # noqa: E402


def read_meta(d):
    meta = {}
    with open(os.path.join(d, "meta.txt")) as f:
        for line in f:
            k, _, v = line.strip().partition("=")
            if k:
                meta[k] = int(v)
    return meta


def load_bf16(torch, path, shape):
    a = np.fromfile(path, dtype=np.int16)
    if a.size != math.prod(shape):
        raise SystemExit(f"{path}: {a.size} elements, expected {math.prod(shape)} for {shape}")
    return torch.from_numpy(a).view(torch.bfloat16).reshape(shape)


def reference(torch, x, topk, w, wgu, wd, fp8, dev):
    """float64 layer output and its element-wise bound (README.md "Accuracy"). x [N,H], topk [N,K],
    w [N,K], wgu [E,2I,H], wd [E,H,I] (BF16 values)."""
    N, H = x.shape
    K = topk.shape[1]
    E, I2, _ = wgu.shape
    I = I2 // 2
    ub = 2.0 ** -8
    u8 = 2.0 ** -4 if fp8 else 0.0
    sub = 2.2e-6 if fp8 else 0.0
    Ls = 1.1
    gH = H * 2.0 ** -24 + (128 * 2.0 ** -14 if fp8 else 0.0)
    gI = I * 2.0 ** -24 + (128 * 2.0 ** -14 if fp8 else 0.0)
    sgu, sd = 1.0 / math.sqrt(H), 1.0 / math.sqrt(I)
    f64 = torch.float64
    X = x.to(dev, f64)
    out = torch.zeros(N, H, dtype=f64, device=dev)
    bound = torch.zeros(N, H, dtype=f64, device=dev)
    wabs = torch.zeros(N, H, dtype=f64, device=dev)
    xmax = X.abs().amax(1)
    X1 = X.abs().sum(1)
    for e in range(E):
        tok, kk = (topk == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        tok = tok.to(dev)
        we = w[tok.cpu(), kk].to(dev, f64)
        Xe = X[tok]
        Wg = wgu[e].to(dev, f64)
        Wd = wd[e].to(dev, f64)
        G = Xe @ Wg.T
        A = Xe.abs() @ Wg.abs().T
        W1 = Wg.abs().sum(1)
        err = (2 * u8 + u8 * u8) * A + sub * (W1[None, :] * xmax[tok, None] + X1[tok, None] * sgu) * (1 + u8) + gH * A * (1 + 2 * u8)
        err = err + ub * (G.abs() + err)
        g, u, eg, eu = G[:, :I], G[:, I:], err[:, :I], err[:, I:]
        sg = g * torch.sigmoid(g)
        a = sg * u
        ea = Ls * eg * (u.abs() + eu) + sg.abs() * eu + 1e-7 * a.abs()
        amax = (a.abs() + ea).amax(1).clamp_min(1e-4)
        ea = ea + (u8 if fp8 else ub) * (a.abs() + ea) + sub * amax[:, None]
        Y = a @ Wd.T
        A2 = a.abs() @ Wd.abs().T
        Ae = ea @ Wd.abs().T
        A1 = (a.abs() + ea).sum(1)
        err2 = (1 + u8) * Ae + u8 * A2 + sub * A1[:, None] * sd + gI * (A2 + Ae) * (1 + u8)
        err2 = err2 + ub * (Y.abs() + err2)
        out.index_add_(0, tok, we[:, None] * Y)
        bound.index_add_(0, tok, we.abs()[:, None] * err2)
        wabs.index_add_(0, tok, we.abs()[:, None] * (Y.abs() + err2))
    bound = bound + K * 2.0 ** -24 * wabs + ub * (out.abs() + bound) + 1e-30
    return out, bound


def check(torch, name, got, ref, bound):
    g = got.to(ref.device, torch.float64)
    err = (g - ref).abs()
    bad = ~(err <= bound)
    nrm = (err.norm() / ref.norm().clamp_min(1e-300)).item()
    ratio = (err / bound).max().item()
    nbad = int(bad.sum().item())
    # the normwise error against its statistical expectation (the example's README, "Accuracy"):
    # FP8 2 u_8 = 2^-3, BF16 4 u_b = 2^-6
    limit = 2.0 ** -3 if name == "fp8" else 2.0 ** -6
    print(f"[{name}] vs PyTorch float64 reference: normwise relative error {nrm:.3e} (limit {limit:.3e}), "
          f"max |error| / bound {ratio:.3f}, {nbad} element(s) outside the bound"
          + ("" if nrm <= limit else "  NORMWISE LIMIT EXCEEDED"))
    if nrm > limit:
        nbad += 1
    if nbad:
        idx = bad.nonzero()[:5].tolist()
        for t, h in idx:
            print(f"    token {t} h {h}: got {g[t, h].item():.6g} ref {ref[t, h].item():.6g} "
                  f"|err| {err[t, h].item():.3g} bound {bound[t, h].item():.3g}")
    return nbad == 0


def moe_layer(torch, x, topk, w, wgu, wd):
    """plain PyTorch MoE layer (BF16 GEMMs, FP32 accumulation and combine)"""
    N, K = topk.shape
    E, I2, H = wgu.shape
    I = I2 // 2
    flat = topk.reshape(-1)
    order = torch.argsort(flat, stable=True)
    tok = order // K
    ws = w.reshape(-1)[order]
    counts = torch.bincount(flat, minlength=E).tolist()  # host sync, as the example's segment copy
    xs = x[tok]
    out = torch.zeros(N, H, dtype=torch.float32, device=x.device)
    b = 0
    for e in range(E):
        n = counts[e]
        if n == 0:
            continue
        h = xs[b:b + n] @ wgu[e].T
        a = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
        y = a @ wd[e].T
        out.index_add_(0, tok[b:b + n], y.float() * ws[b:b + n, None])
        b += n
    return out.to(torch.bfloat16)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump")
    ap.add_argument("--shape", choices=["real", "small"])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--device", default=None)
    args = ap.parse_args()
    if not args.dump and not args.shape:
        ap.error("--dump DIR or --shape real|small")
    try:
        import torch
    except ImportError:
        print("moe_layer_torch: PyTorch not available; skipped")
        return 0
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    ok = True
    if args.dump:
        m = read_meta(args.dump)
        R, T, H, I, E, K = m["R"], m["T"], m["H"], m["I"], m["E"], m["K"]
        N = R * T
        x = load_bf16(torch, os.path.join(args.dump, "x.bf16"), (N, H))
        topk = torch.from_numpy(np.fromfile(os.path.join(args.dump, "topk.i32"), dtype=np.int32).astype(np.int64)).reshape(N, K)
        w = torch.from_numpy(np.fromfile(os.path.join(args.dump, "weights.f32"), dtype=np.float32)).reshape(N, K)
        wgu = load_bf16(torch, os.path.join(args.dump, "w_gate_up.bf16"), (E, 2 * I, H))
        wd = load_bf16(torch, os.path.join(args.dump, "w_down.bf16"), (E, H, I))
        print(f"moe_layer_torch: {args.dump}: R={R} T={T} H={H} I={I} E={E} K={K} (seed {m.get('seed')})")
        for name, fp8 in (("bf16", False), ("fp8", True)):
            if not m.get(name, 0):
                continue
            got = load_bf16(torch, os.path.join(args.dump, f"out_{name}.bf16"), (N, H))
            ref, bound = reference(torch, x, topk, w, wgu, wd, fp8, dev)
            ok = check(torch, name, got, ref, bound) and ok
    else:
        if args.shape == "real":
            R, T, H, I, E, K = 8, 4096, 7168, 2048, 256, 8
        else:
            R, T, H, I, E, K = 8, 64, 512, 256, 32, 4
        N = R * T
        x = topk = w = wgu = wd = None
    if args.no_time:
        return 0 if ok else 1
    torch = torch_cuda("moe_layer_torch timing")
    if torch is None:
        return 0 if ok else 1
    g = torch.Generator(device="cuda").manual_seed(0)
    if x is None:
        x = (torch.rand(N, H, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
        topk = torch.stack([torch.randperm(E, device="cuda", generator=g)[:K] for _ in range(N)]) if N <= 4096 else \
            torch.rand(N, E, device="cuda", generator=g).topk(K, dim=1).indices
        w = torch.softmax(torch.rand(N, K, device="cuda", generator=g) * 4, dim=1)
        wgu = ((torch.rand(E, 2 * I, H, device="cuda", generator=g) * 2 - 1) / math.sqrt(H)).to(torch.bfloat16)
        wd = ((torch.rand(E, H, I, device="cuda", generator=g) * 2 - 1) / math.sqrt(I)).to(torch.bfloat16)
    x, topk, w, wgu, wd = (t.cuda() for t in (x, topk, w, wgu, wd))
    rows = [("PyTorch eager (BF16, per-expert matmul loop)", lambda: moe_layer(torch, x, topk, w, wgu, wd))]
    if not args.no_compile:
        try:
            comp = torch.compile(lambda: moe_layer(torch, x, topk, w, wgu, wd))
            comp()
            rows.append(("PyTorch torch.compile (same function)", comp))
        except Exception as ex:  # a compile failure is reported, not fatal
            print(f"torch.compile failed: {type(ex).__name__}: {ex}")
    flops = 2.0 * 3.0 * N * K * H * I
    print(f"\n| PyTorch layer, N={N} tokens, H={H}, I={I}, E={E}, top-{K} ({torch.cuda.get_device_name()}) | us (median of {args.iters}) | TFLOP/s |")
    print("| --- | ---: | ---: |")
    for name, fn in rows:
        us = median_us(fn, args.iters)
        print(f"| {name} | {us:.1f} | {flops / (us * 1e-6) / 1e12:.0f} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
