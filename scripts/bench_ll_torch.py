#!/usr/bin/env python3
"""bench_ll_torch.py — PyTorch baseline for tests/bench/bench_ll (low-latency dispatch / combine).

The same job as bench_ll on one GPU, written with PyTorch index ops: R virtual ranks, each with
T tokens, top-k of E experts, hidden H, BF16.

  dispatch (eager):   per source rank, the deterministic slot of every (token, k) (stable argsort by
                      expert, position minus the expert's start), then one index_copy_ of the
                      repeated rows into the fixed receive layout [R dst][E/R][R src][T][H];
  dispatch (indices given): only the index_copy_, i.e. the data movement with routing precomputed;
  combine (eager):    gather every (token, k) output row from the receive layout, weight in FP32,
                      sum over k, cast to BF16.

Times are medians of CUDA events. Bytes: the copy convention of bench_ll (2 x delivered rows x
row bytes) and topk-logical (R x T x K x row bytes).

Usage: python3 scripts/bench_ll_torch.py [--ranks 8] [--hidden 7168] [--topk 8] [--experts 256]
                                         [--tokens 1,128] [--reps 100] [--build DIR (ignored)]
"""
import argparse
import sys

from epf_torch_common import median_us as _median_us
from epf_torch_common import torch_cuda


def median_us(fn, reps):
    """runs queued back to back, one wait at the end (this script's method since v1)"""
    return _median_us(fn, reps, warmup=5, sync_each=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--tokens", default="1,128")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--build", default=None, help="ignored (scripts/gpu_suite.sh passes it)")
    args = ap.parse_args()
    torch = torch_cuda("bench_ll_torch", "SKIP: {why}")
    if torch is None:
        return 0

    R, H, K, E = args.ranks, args.hidden, args.topk, args.experts
    EL = E // R
    dev = "cuda"
    n = 1 << 28
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    copy_us = median_us(lambda: b.copy_(a), 20)
    ceiling = 2.0 * n / (copy_us * 1e-6) / 1e9
    print(f"bench_ll_torch on {torch.cuda.get_device_name()}: copy ceiling {ceiling:.0f} GB/s (256 MiB D2D, read + write)")
    del a, b

    for T in [int(v) for v in args.tokens.split(",") if v]:
        g = torch.Generator(device=dev)
        g.manual_seed(1234)
        x = torch.randn(R, T, H, device=dev, generator=g).to(torch.bfloat16)
        # K distinct uniform experts per token
        topk = torch.rand(R, T, E, device=dev, generator=g).topk(K, dim=-1).indices
        w = torch.full((R, T, K), 1.0 / K, device=dev)
        recv = torch.empty(R * EL * R * T, H, dtype=torch.bfloat16, device=dev)
        out = torch.empty(R, T, H, dtype=torch.bfloat16, device=dev)

        def rows_of_routing():
            rows = []
            for s in range(R):
                e = topk[s].reshape(-1)                       # (t, k) order
                order = torch.argsort(e, stable=True)         # token order within an expert
                counts = torch.bincount(e, minlength=E)
                start = torch.cumsum(counts, 0) - counts
                slot = torch.empty_like(e)
                slot[order] = torch.arange(e.numel(), device=dev) - start[e[order]]
                d, le = e // EL, e % EL
                rows.append(((d * EL + le) * R + s) * T + slot)
            return torch.stack(rows)                          # [R, T*K]

        dest = rows_of_routing()
        src = x.reshape(R, T, H).repeat_interleave(K, dim=1)  # [R, T*K, H] in (t, k) order

        def dispatch_eager():
            d = rows_of_routing()
            recv.index_copy_(0, d.reshape(-1), x.repeat_interleave(K, dim=1).reshape(-1, H))

        def dispatch_indices():
            recv.index_copy_(0, dest.reshape(-1), src.reshape(-1, H))

        def combine_eager():
            y = recv.index_select(0, dest.reshape(-1)).reshape(R, T, K, H).float()
            out.copy_((y * w[..., None]).sum(dim=2).to(torch.bfloat16))

        rows = R * T * K
        copy_bytes = 2.0 * rows * H * 2
        for name, fn in (("dispatch eager", dispatch_eager), ("dispatch (indices given)", dispatch_indices),
                         ("combine eager", combine_eager)):
            us = median_us(fn, args.reps)
            print(f"  T={T:<4d} {name:26s} {us:9.1f} us | copy-conv {copy_bytes / us * 1e-3:8.1f} GB/s "
                  f"({100.0 * copy_bytes / us * 1e-3 / ceiling:5.1f}% of ceiling) | topk-logical "
                  f"{rows * H * 2 / us * 1e-3:8.1f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
