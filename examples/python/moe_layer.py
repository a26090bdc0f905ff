#!/usr/bin/env python3
"""A PyTorch MoE layer whose token exchange is epfuse, over 8 virtual ranks on one GPU, checked
against the same layer in plain PyTorch, and both timed.

    pip install ./python          # builds libepfuse.so and the package
    python examples/python/moe_layer.py [--ranks 8] [--tokens 512] [--hidden 2048] [--experts 64]
                                        [--topk 4] [--ffn 1024] [--iters 20] [--seed N]

Per virtual rank r: a router (linear, softmax, top-k, renormalised weights) over its tokens
x[r] -> epfuse route update + HT dispatch (every token row copied into the receive rows of the
ranks that hold its experts, grouped by local expert) -> each rank's local experts run a PyTorch
MLP (SiLU(x W1) W2, BF16) on their expert-major segment of the received rows -> epfuse combine
(out[t] = sum_k w_k * y_k, FP32 in k order, BF16).

The reference is the same layer without any communication: every token's top-k experts, the same
BF16 MLP weights, the sum in k order in FP32. What may differ, and the tolerance: the expert GEMMs
see different batches (a segment of received rows vs the reference's per-expert batch), so cuBLAS
may pick a different kernel and accumulate the FP32 dot products in another order; each expert
output can then differ by one BF16 rounding step (2^-8 relative), and the k-sum of top-k such
outputs by at most sum_k w_k * 2^-8 |y_k| <= 2^-8 * max|y|. The check is
|epfuse - reference| <= 2^-7 * (|reference| + max|reference| * 2^-4) elementwise (two BF16 steps
relative, plus a floor for sums that cancel), and the script also reports the bit-exact fraction.

Timing: CUDA events, median of --iters iterations, the same stream for both layers. The epfuse
layer's expert stage needs each expert's row count on the host (the route publishes the segments
on the device; reading them is one device-to-host copy and a stream sync per layer call: timed
as part of the layer, and shown on its own line).
"""
import argparse
import statistics

import torch

import epfuse


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--topk", type=int, default=4)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=None)
    return p.parse_args()


class Experts:
    """E expert MLPs (BF16): y = SiLU(x W1[e]) W2[e]."""

    def __init__(self, E, H, F, gen):
        self.w1 = (torch.randn(E, H, F, generator=gen) / H ** 0.5).to(torch.bfloat16).cuda()
        self.w2 = (torch.randn(E, F, H, generator=gen) / F ** 0.5).to(torch.bfloat16).cuda()

    def __call__(self, e, x):
        return torch.nn.functional.silu(x @ self.w1[e]) @ self.w2[e]


def router(x, wr, K):
    logits = (x.float() @ wr)  # [..., E]
    p = torch.softmax(logits, dim=-1)
    w, idx = torch.topk(p, K, dim=-1)
    return idx, (w / w.sum(-1, keepdim=True)).float()


def reference_layer(x, idx, w, experts):
    """Plain PyTorch: per expert, the tokens that chose it; outputs summed in k order in FP32."""
    R, T, H = x.shape
    K = idx.shape[-1]
    xf, idf, wf = x.reshape(-1, H), idx.reshape(-1, K), w.reshape(-1, K)
    y = torch.zeros(xf.shape[0], K, H, dtype=torch.bfloat16, device=x.device)
    for e in range(experts.w1.shape[0]):
        tok, k = (idf == e).nonzero(as_tuple=True)
        if tok.numel():
            y[tok, k] = experts(e, xf[tok])
    acc = torch.zeros(xf.shape[0], H, dtype=torch.float32, device=x.device)
    for k in range(K):
        acc = acc + wf[:, k:k + 1] * y[:, k].float()
    return acc.to(torch.bfloat16).reshape(R, T, H)


class EpfuseLayer:
    def __init__(self, R, T, H, E, K, experts):
        self.R, self.T, self.H, self.E, self.K, self.EL = R, T, H, E, K, E // R
        self.g = epfuse.Group.virtual(R, num_experts=E, top_k=K, hidden=H, max_tokens_per_rank=T)
        self.mem = torch.empty(self.g.handle_mem_size("expert_major", K), dtype=torch.uint8, device="cuda")
        self.h = self.g.init_handle("expert_major", K, self.mem, index_dtype="int64")
        self.rows = self.g.plan.recv_capacity
        self.eo = torch.zeros(R, self.rows, H, dtype=torch.bfloat16, device="cuda")
        self.recv = torch.as_tensor(self.g.recv_tokens(), device="cuda").view(torch.bfloat16)
        self.experts = experts
        self.t = {}

    def __call__(self, x, idx, w, out, timing=None):
        s = torch.cuda.current_stream()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(6)] if timing is not None else None
        mark = (lambda i: ev[i].record(s)) if ev else (lambda i: None)
        mark(0)
        self.h.update(idx, self.T, stream=s)
        mark(1)
        self.g.dispatch(self.h, x, idx, w, stream=s)
        mark(2)
        segs = self.h.segments_host(stream=s)  # the host needs the GEMM sizes: one copy + sync
        mark(3)
        for r in range(self.R):
            for j, (b, c, _) in enumerate(segs[r]):
                if c:
                    self.eo[r, b:b + c] = self.experts(r * self.EL + j, self.recv[r, b:b + c])
        mark(4)
        self.g.combine(self.h, out, idx, w, expert_out=self.eo, expert_rows=self.rows, stream=s)
        mark(5)
        if ev:
            torch.cuda.synchronize()
            for i, name in enumerate(["route update", "dispatch", "segments to host", "experts", "combine"]):
                timing.setdefault(name, []).append(ev[i].elapsed_time(ev[i + 1]) * 1e3)


def median_us(fn, iters):
    ts = []
    for _ in range(iters + 3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts[3:])


def main():
    o = parse()
    seed = o.seed if o.seed is not None else torch.seed() % (1 << 31)
    print(f"seed {seed}")
    gen = torch.Generator().manual_seed(seed)
    R, T, H, E, K, F = o.ranks, o.tokens, o.hidden, o.experts, o.topk, o.ffn
    experts = Experts(E, H, F, gen)
    wr = (torch.randn(H, E, generator=gen) / H ** 0.5).cuda()
    x = torch.randn(R, T, H, generator=gen).to(torch.bfloat16).cuda()
    idx, w = router(x, wr, K)

    layer = EpfuseLayer(R, T, H, E, K, experts)
    out = torch.full((R, T, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    layer(x, idx, w, out)
    torch.cuda.synchronize()
    err = layer.g.get_async_error()
    if err is not None:
        raise SystemExit(f"epfuse reported: {err.sentence}")
    ref = reference_layer(x, idx, w, experts)
    diff = (out.float() - ref.float()).abs()
    bound = 2.0 ** -7 * (ref.float().abs() + ref.float().abs().max() * 2.0 ** -4)
    exact = (out.view(torch.int16) == ref.view(torch.int16)).float().mean().item()
    ok = bool((diff <= bound).all())
    print(f"epfuse MoE layer: {R} virtual ranks, T={T} per rank, H={H}, E={E}, top-{K}, FFN {F}, BF16")
    print(f"accuracy vs PyTorch: max |diff| {diff.max().item():.3g} (bound 2^-7 relative + floor), "
          f"{100 * exact:.2f}% of elements bit-exact: {'OK' if ok else 'FAILED'}")

    timing = {}
    us_epf = median_us(lambda: layer(x, idx, w, out), o.iters)
    for _ in range(o.iters):
        layer(x, idx, w, out, timing)
    us_ref = median_us(lambda: reference_layer(x, idx, w, experts), o.iters)
    print("| layer | us (median of %d) |" % o.iters)
    print("| --- | ---: |")
    print(f"| epfuse layer (route + dispatch + experts + combine) | {us_epf:.0f} |")
    for name, ts in timing.items():
        print(f"|   {name} | {statistics.median(ts):.0f} |")
    print(f"| PyTorch reference layer (no communication) | {us_ref:.0f} |")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
