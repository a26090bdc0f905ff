#!/usr/bin/env python3
"""bench_route_torch.py — the PyTorch eager baseline for the route (tests/bench/bench_route).

DeepEP's get_dispatch_layout written with PyTorch ops, at the shapes bench_route uses:
  layout:  tokens per expert (bincount over (token, k) pairs, -1 skipped), tokens per destination
           rank (deduplicated), is_token_in_rank [T, R];
  + slots: additionally every (token, k)'s rank within its expert group in (token, k) order (a
           stable sort) and its destination rank — what epf_route_update also produces.
Median of CUDA events over --iters runs after a warm-up. Prints one table in microseconds, so the
numbers sit beside bench_route's.

Usage: python3 scripts/bench_route_torch.py [--experts 256] [--topk 8] [--iters 200]
"""
import argparse
import sys

from epf_torch_common import median_us, torch_cuda


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--build", default=None, help="ignored (gpu_suite.sh passes it to every script)")
    a = ap.parse_args()
    torch = torch_cuda("bench_route_torch")
    if torch is None:
        return 0
    dev = torch.device("cuda")
    E, K = a.experts, a.topk

    def timeit(fn):
        return median_us(fn, a.iters, warmup=10)

    def layout(topk_idx, R):
        """DeepEP get_dispatch_layout: per-expert counts, per-rank dedup counts, is_token_in_rank."""
        T = topk_idx.shape[0]
        EL = E // R
        valid = topk_idx >= 0
        idx = torch.where(valid, topk_idx, torch.full_like(topk_idx, E))  # -1 -> a dump bucket
        per_expert = torch.bincount(idx.flatten(), minlength=E + 1)[:E]
        rank_idx = torch.div(idx, EL, rounding_mode="floor")  # the dump bucket lands on rank R
        in_rank = torch.zeros(T, R + 1, dtype=torch.bool, device=dev)
        in_rank.scatter_(1, rank_idx, True)
        in_rank = in_rank[:, :R]
        per_rank = in_rank.sum(dim=0)
        return per_expert, per_rank, in_rank, idx, rank_idx

    def layout_and_slots(topk_idx, R):
        per_expert, per_rank, in_rank, idx, rank_idx = layout(topk_idx, R)
        flat = idx.flatten()
        order = torch.sort(flat, stable=True).indices  # (t, k) order inside each expert
        starts = torch.cumsum(torch.bincount(flat, minlength=E + 1), 0) - torch.bincount(flat, minlength=E + 1)
        pos = torch.empty_like(order)
        pos[order] = torch.arange(order.numel(), device=dev)
        slot = (pos - starts[flat]).view_as(topk_idx)
        slot = torch.where(topk_idx >= 0, slot, torch.full_like(slot, -1))
        dst = torch.where(topk_idx >= 0, rank_idx, torch.full_like(rank_idx, -1))
        return per_expert, per_rank, in_rank, slot, dst

    print("bench_route_torch on %s: PyTorch %s eager, E = %d, K = %d, int64 topk_idx, "
          "median of %d (us)" % (torch.cuda.get_device_name(0), torch.__version__, E, K, a.iters))
    print("| case                                   | ranks | T/rank | torch eager us |")
    print("|----------------------------------------|-------|--------|----------------|")
    g = torch.Generator(device=dev).manual_seed(1234)
    for T in (4096, 128):
        for R in (1, 8):
            scores = torch.rand(T, E, device=dev, generator=g)
            topk_idx = scores.topk(K, dim=1).indices.to(torch.int64)  # K distinct experts per token
            us = timeit(lambda: layout(topk_idx, R))
            print("| %-38s | %5d | %6d | %14.2f |" % ("layout (get_dispatch_layout)", R, T, us))
            us = timeit(lambda: layout_and_slots(topk_idx, R))
            print("| %-38s | %5d | %6d | %14.2f |" % ("layout + slots + dst rank", R, T, us))
    print("(one rank's share: the layout of T tokens; epfuse's full update adds the count exchange "
          "and the receive offsets on top)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
