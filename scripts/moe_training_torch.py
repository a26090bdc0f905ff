#!/usr/bin/env python3
"""moe_training_torch.py — the gradient check of examples/06_moe_training against PyTorch autograd.

  python3 scripts/moe_training_torch.py --dump DIR
      DIR written by `ex06_moe_training --dump DIR` (one sub-folder per case, e.g. DIR/em_pull; DIR
      itself may be one case's folder). For each case the same layer is rebuilt in PyTorch from the
      same BF16 inputs and weights and the same FP32 router weights:
          y[t] = sum over k with topk[t,k] >= 0 of w[t,k] * (silu(x W1_e) * (x W3_e)) W2_e
      in float64, y.backward(dy) gives the exact gradients of x, w (topk_weights), W1, W3 and W2.
      epfuse's y, dx, d topk_weights, dW1, dW3, dW2 must then lie
        * element by element within the worst-case bound of the example's roundings, propagated
          through the layer alongside the reference (a running error analysis), and
        * normwise within the statistical limit of each quantity
      (examples/06_moe_training/README.md "Accuracy" derives both). Exit 1 on any violation.
  options: --device cpu|cuda (default: cuda when available), --verbose

Without PyTorch or NumPy the script says which is missing and exits 77 (nothing was compared:
CTest reports the test "Not Run", never "Passed").
"""
import argparse
import math
import os
import sys

SKIP = 77  # nothing compared: CTest's SKIP_RETURN_CODE

try:
    import numpy as np
except ImportError:  # reported by main(): the argument check and --help work without it
    np = None

U32 = 2.0 ** -24  # FP32 unit roundoff
UB = 2.0 ** -8    # BF16 unit roundoff: RNE with 8 significant bits, |fl(v) - v| <= 2^-8 |v|
C_SILU = 8.0      # ulps of the example's silu and sigmoid (exp <= 3, 1 + e, division, product)
L1 = 1.1          # max |silu'|  (1.0998 at a = 2.4)
L2 = 0.5          # max |silu''| (at a = 0)
# normwise limits (README "Accuracy"): results with BF16 roundings 2 u_bf16, FP32-only results 2^-14
LIMITS = {"y": 2 * UB, "dx": 2 * UB, "dtopk_weights": 2 * UB, "dW1": 2.0 ** -14, "dW3": 2.0 ** -14, "dW2": 2.0 ** -14}


def gamma(n):
    """bound of n FP32 roundings in a chain: n u / (1 - n u), with a 1 % margin for second order"""
    return 1.01 * n * U32 / (1 - n * U32)


def read_meta(d):
    meta = {}
    with open(os.path.join(d, "meta.txt")) as f:
        for line in f:
            k, _, v = line.strip().partition("=")
            if k:
                meta[k] = [int(t) for t in v.split(",")] if k == "tokens" else int(v)
    return meta


def load(torch, path, dtype, shape):
    a = np.fromfile(path, dtype={"bf16": np.int16, "f32": np.float32, "i32": np.int32}[dtype])
    if a.size != math.prod(shape):
        raise SystemExit(f"{path}: {a.size} elements, expected {math.prod(shape)} for {shape}")
    t = torch.from_numpy(a)
    if dtype == "bf16":
        t = t.view(torch.bfloat16)
    return t.reshape(shape)


def autograd_reference(torch, x, topk, w, w1, w3, w2, dy):
    """float64 layer and its exact gradients by autograd (a repeated expert counts once per k)"""
    x = x.clone().requires_grad_(True)
    w = w.clone().requires_grad_(True)
    W1, W3, W2 = (t.clone().requires_grad_(True) for t in (w1, w3, w2))
    y = torch.zeros_like(x)
    for e in range(W1.shape[0]):
        tok, kk = (topk == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        xe = x[tok]
        out = (torch.nn.functional.silu(xe @ W1[e]) * (xe @ W3[e])) @ W2[e]
        y = y.index_add(0, tok, w[tok, kk][:, None] * out)
    y.backward(dy)
    return {"y": y.detach(), "dx": x.grad, "dtopk_weights": w.grad, "dW1": W1.grad, "dW3": W3.grad, "dW2": W2.grad}


def error_bounds(torch, x, topk, w, w1, w3, w2, dy, rank_major, EL):
    """element-wise worst-case bounds of epfuse's results against the exact values (README
    "Accuracy"), by a running error analysis: every quantity q of the example's computation is
    carried with a bound e_q >= |computed q - exact q|, from the exact (float64) values."""
    N, H = x.shape
    K = topk.shape[1]
    E, _, I = w1.shape
    f64 = torch.float64
    dev = x.device
    A = torch.abs
    # per token: y and dx sums; per (token, k): the router-weight gradient of the row k reads
    ey_sum = torch.zeros(N, H, dtype=f64, device=dev)   # sum_k |w_k| e_out
    ay_sum = torch.zeros(N, H, dtype=f64, device=dev)   # sum_k |w_k| (|out| + e_out)
    edx_sum = torch.zeros(N, H, dtype=f64, device=dev)  # sum_rows e_dxrow
    adx_sum = torch.zeros(N, H, dtype=f64, device=dev)  # sum_rows (|dxrow| + e_dxrow)
    dx_rows = torch.zeros(N, H, dtype=f64, device=dev)  # the exact sum of the rows (= dx)
    y_exact = torch.zeros(N, H, dtype=f64, device=dev)
    e_dtw = torch.zeros(N, K, dtype=f64, device=dev)
    b_dw1 = torch.zeros(E, H, I, dtype=f64, device=dev)
    b_dw3 = torch.zeros(E, H, I, dtype=f64, device=dev)
    b_dw2 = torch.zeros(E, I, H, dtype=f64, device=dev)
    for e in range(E):
        hit = topk == e                                   # [N, K]: the k that read expert e's row
        rows = hit.any(1).nonzero(as_tuple=True)[0]       # one row per (token, distinct expert)
        n = rows.numel()
        if n == 0:
            continue
        wr = (w * hit).sum(1)[rows]                       # the row's combine weight
        wa = (A(w) * hit).sum(1)[rows]
        cnt = hit.sum(1)[rows].to(f64)
        X, DY = x[rows], dy[rows]
        W1, W3, W2 = w1[e], w3[e], w2[e]
        # forward: a, b over H (FP32 chains), silu, h, out over I, BF16 out
        a, b = X @ W1, X @ W3
        ea, eb = gamma(H) * (A(X) @ A(W1)), gamma(H) * (A(X) @ A(W3))
        sg = torch.sigmoid(a)
        s = a * sg
        es = L1 * ea + C_SILU * U32 * (A(s) + L1 * ea)
        h = s * b
        eh = es * (A(b) + eb) + A(s) * eb + U32 * (A(h) + es * (A(b) + eb) + A(s) * eb)
        out = h @ W2
        eo = eh @ A(W2) + gamma(I) * ((A(h) + eh) @ A(W2))
        eo = eo + UB * (A(out) + eo)                     # the BF16 output row
        # the router-weight gradient of the row: dot(dy, bf16 out) over H
        wg_err = (A(DY) * eo).sum(1) + gamma(H) * (A(DY) * (A(out) + eo)).sum(1)
        # backward: d out = w_row dy (the row weight: cnt FP32 adds; the product: one rounding)
        dout = wr[:, None] * DY
        edo = A(DY) * (gamma(cnt + 1) * wa)[:, None]
        dh = dout @ W2.T
        edh = edo @ A(W2).T + gamma(H) * ((A(dout) + edo) @ A(W2).T)
        db = dh * s
        edb = edh * A(s) + (A(dh) + edh) * es + U32 * A(db)
        ds = sg * (1 + a * (1 - sg))                      # silu'(a)
        eds = L2 * ea + 2 * C_SILU * U32 * A(ds)
        da = dh * b * ds
        eda = edh * A(b * ds) + (A(dh) + edh) * (eb * A(ds) + (A(b) + eb) * eds) + 2 * U32 * (A(da) + 1e-300)
        dxr = da @ W1.T + db @ W3.T
        edxr = eda @ A(W1).T + edb @ A(W3).T + gamma(2 * I) * ((A(da) + eda) @ A(W1).T + (A(db) + edb) @ A(W3).T)
        edxr = edxr + UB * (A(dxr) + edxr)                # the BF16 input-gradient row
        # weight gradients: FP32 sums over the expert's n rows
        b_dw1[e] = A(X).T @ eda + gamma(n) * (A(X).T @ (A(da) + eda))
        b_dw3[e] = A(X).T @ edb + gamma(n) * (A(X).T @ (A(db) + edb))
        b_dw2[e] = eh.T @ A(dout) + (A(h) + eh).T @ edo + gamma(n) * ((A(h) + eh).T @ (A(dout) + edo))
        # to the tokens
        wk = torch.where(hit, w, torch.zeros_like(w))[rows]       # [n, K]
        ey_sum[rows] += (A(wk).sum(1))[:, None] * eo
        ay_sum[rows] += (A(wk).sum(1))[:, None] * (A(out) + eo)
        y_exact[rows] += wk.sum(1)[:, None] * out
        edx_sum[rows] += edxr
        adx_sum[rows] += A(dxr) + edxr
        dx_rows[rows] += dxr
        e_dtw[rows] += torch.where(hit[rows], wg_err[:, None], torch.zeros_like(wk))
    # the token sums: FP32 fma chains over at most K terms (RANK_MAJOR: two levels, with the
    # per-rank partials rounded to BF16), then the BF16 result
    g = gamma(2 * K)
    rm = UB if rank_major else 0.0
    ey = ey_sum + (g + rm * (1 + g)) * ay_sum
    ey = ey + UB * (A(y_exact) + ey)
    edx = edx_sum + (g + rm * (1 + g)) * adx_sum
    edx = edx + UB * (A(dx_rows) + edx)
    tiny = 1e-30
    return {"y": ey + tiny, "dx": edx + tiny, "dtopk_weights": e_dtw + tiny, "dW1": b_dw1 + tiny, "dW3": b_dw3 + tiny,
            "dW2": b_dw2 + tiny}


def compare(torch, case, name, got, ref, bound, verbose):
    g = got.to(ref.device, torch.float64)
    err = (g - ref).abs()
    bad = ~(err <= bound)
    nrm = (err.norm() / ref.norm().clamp_min(1e-300)).item()
    ratio = (err / bound).max().item()
    nbad = int(bad.sum().item())
    limit = LIMITS[name]
    ok = nbad == 0 and nrm <= limit
    print(f"  {name:14s} normwise {nrm:.3e} (limit {limit:.3e}), max |error| / bound {ratio:.3f}, "
          f"{nbad} of {err.numel()} outside the bound{'' if ok else '  FAILED'}")
    if nbad and verbose:
        for idx in bad.nonzero()[:5].tolist():
            i = tuple(idx)
            print(f"      {name}{list(i)}: epfuse {g[i].item():.9g}, exact {ref[i].item():.9g}, "
                  f"|error| {err[i].item():.3g} > bound {bound[i].item():.3g}")
    return ok


def check_case(torch, d, dev, verbose):
    m = read_meta(d)
    R, N, H, I, E, K = m["R"], m["N"], m["H"], m["I"], m["E"], m["K"]
    rank_major = m["rank_major"] == 1
    f64 = torch.float64
    p = lambda n: os.path.join(d, n)  # noqa: E731
    x = load(torch, p("x.bf16"), "bf16", (N, H)).to(dev, f64)
    topk = load(torch, p("topk.i32"), "i32", (N, K)).to(dev, torch.int64)
    w = load(torch, p("weights.f32"), "f32", (N, K)).to(dev, f64)
    dy = load(torch, p("dy.bf16"), "bf16", (N, H)).to(dev, f64)
    w1 = load(torch, p("w1.bf16"), "bf16", (E, H, I)).to(dev, f64)
    w3 = load(torch, p("w3.bf16"), "bf16", (E, H, I)).to(dev, f64)
    w2 = load(torch, p("w2.bf16"), "bf16", (E, I, H)).to(dev, f64)
    got = {"y": load(torch, p("y.bf16"), "bf16", (N, H)), "dx": load(torch, p("dx.bf16"), "bf16", (N, H)),
           "dtopk_weights": load(torch, p("dtopk_weights.f32"), "f32", (N, K)),
           "dW1": load(torch, p("dw1.f32"), "f32", (E, H, I)), "dW3": load(torch, p("dw3.f32"), "f32", (E, H, I)),
           "dW2": load(torch, p("dw2.f32"), "f32", (E, I, H))}
    repeats = sum(int(((topk[:, j:j + 1] == topk[:, :j]).any(1) & (topk[:, j] >= 0)).sum().item()) for j in range(1, K))
    print(f"{os.path.basename(os.path.normpath(d))}: {'RANK_MAJOR' if rank_major else 'EXPERT_MAJOR'}"
          f"{', push' if m.get('push') else ''}, R={R} (T per rank {m.get('tokens')}), N={N}, H={H}, I={I}, E={E}, "
          f"top-{K}, seed {m.get('seed')}; repeated ids {repeats}, "
          f"-1 ids {int((topk < 0).sum().item())}; vs PyTorch autograd float64 on {dev}")
    ref = autograd_reference(torch, x, topk, w, w1, w3, w2, dy)
    bound = error_bounds(torch, x, topk, w, w1, w3, w2, dy, rank_major, E // R)
    ok = True
    for name in ("y", "dx", "dtopk_weights", "dW1", "dW3", "dW2"):
        ok = compare(torch, d, name, got[name], ref[name], bound[name], verbose) and ok
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", required=True)
    ap.add_argument("--device", default=None)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    if np is None:
        print("moe_training_torch: NumPy not available (pip install numpy); nothing compared (skipped)")
        return SKIP
    try:
        import torch
    except ImportError:
        print("moe_training_torch: PyTorch not available (pip install torch); nothing compared (skipped)")
        return SKIP
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if os.path.exists(os.path.join(args.dump, "meta.txt")):
        dirs = [args.dump]
    else:
        dirs = sorted(os.path.join(args.dump, s) for s in os.listdir(args.dump)
                      if os.path.exists(os.path.join(args.dump, s, "meta.txt")))
    if not dirs:
        print(f"moe_training_torch: no case (meta.txt) under {args.dump}")
        return 1
    ok = True
    for d in dirs:
        ok = check_case(torch, d, dev, args.verbose) and ok
    print(f"moe_training_torch: {len(dirs)} case(s): {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
