#!/usr/bin/env python3
"""bench_ht_torch.py — the PyTorch baseline for high-throughput dispatch and combine.

The same job as tests/bench/bench_ht with R virtual ranks on one GPU, written with PyTorch index
ops (eager): dispatch = build the expert-major receive order of every rank (by destination rank,
local expert, source rank, token, k) with a stable argsort and gather the rows with index_select;
combine = gather each (token, k)'s expert output back, weight it, reduce over k in FP32 and write
BF16. Also measures the device-to-device copy ceiling in the same process. Prints one table.

Usage: python3 scripts/bench_ht_torch.py [--ranks 8] [--tokens 4096] [--hidden 7168] [--topk 8]
                                         [--experts 256] [--iters 20]
"""
import argparse
import sys

from epf_torch_common import median_us, torch_cuda


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--build", default=None, help="ignored (gpu_suite.sh passes it to every script)")
    a = ap.parse_args()
    torch = torch_cuda("bench_ht_torch")
    if torch is None:
        return 0
    dev = torch.device("cuda")
    R, T, H, K, E = a.ranks, a.tokens, a.hidden, a.topk, a.experts
    EL = E // R
    g = torch.Generator(device=dev).manual_seed(1234)
    x = torch.randn(R * T, H, device=dev, dtype=torch.float32, generator=g).to(torch.bfloat16)
    # top-k without repeats per token: random scores, topk indices
    scores = torch.rand(R * T, E, device=dev, generator=g)
    topk = scores.topk(K, dim=1).indices  # [R*T, K]
    w = torch.rand(R * T, K, device=dev, generator=g)

    def timeit(fn):
        return median_us(fn, a.iters, warmup=3)

    src_rank = torch.arange(R * T, device=dev) // T
    tok = torch.arange(R * T, device=dev) % T
    state = {}

    def dispatch():
        e = topk.reshape(-1)  # (s, t, k) flattened
        d = e // EL
        s_flat = src_rank.repeat_interleave(K)
        t_flat = tok.repeat_interleave(K)
        k_flat = torch.arange(K, device=dev).repeat(R * T)
        key = ((d * EL + e % EL) * R + s_flat) * T * K + t_flat * K + k_flat
        order = torch.argsort(key, stable=True)
        rows = (s_flat * T + t_flat)[order]
        state["recv"] = x.index_select(0, rows)
        state["order"] = order

    def combine():
        y = state["recv"]  # identity experts
        inv = torch.empty_like(state["order"])
        inv[state["order"]] = torch.arange(inv.numel(), device=dev)
        yk = y.index_select(0, inv).view(R * T, K, H).float()
        state["out"] = (yk * w[:, :, None]).sum(1).to(torch.bfloat16)

    dispatch()
    combine()
    # correctness of the baseline itself: identity experts -> sum_k w_k x
    ref = (x.float() * w.sum(1, keepdim=True)).to(torch.bfloat16)
    err = (state["out"].float() - ref.float()).abs().max().item()
    buf_a = torch.empty(R * T * K * H * 2 // 2, dtype=torch.bfloat16, device=dev)
    buf_b = torch.empty_like(buf_a)
    t_copy = timeit(lambda: buf_b.copy_(buf_a))
    copy_bw = 2 * buf_a.numel() * 2 / (t_copy * 1e-6) / 1e9
    t_d = timeit(dispatch)
    t_c = timeit(combine)
    row = H * 2
    moved_d = R * T * row + R * T * K * row  # read each token once, write each copy once
    moved_c = R * T * K * row + R * T * row
    print(f"PyTorch eager baseline, {R} virtual ranks, T={T} H={H} K={K} E={E} BF16 (max |err| vs ref {err:.3g})")
    print(f"{'op':<10}{'us':>12}{'moved GB':>10}{'GB/s':>10}{'of copy':>9}")
    print(f"{'copy':<10}{t_copy:12.1f}{2 * buf_a.numel() * 2 / 1e9:10.2f}{copy_bw:10.1f}{1.0:9.1%}")
    for name, t, m in (("dispatch", t_d, moved_d), ("combine", t_c, moved_c)):
        bw = m / (t * 1e-6) / 1e9
        print(f"{name:<10}{t:12.1f}{m / 1e9:10.2f}{bw:10.1f}{bw / copy_bw:9.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
