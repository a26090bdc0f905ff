#!/usr/bin/env python3
"""bench_zoo_torch.py — the PyTorch baseline of tests/bench/bench_zoo (issue #17), as a CSV it joins.

For the zoo rows that have a PyTorch counterpart, the same data movement written with PyTorch index
ops (eager) on one GPU, R virtual ranks of T tokens each, BF16, K distinct uniform experts per token:
  HT expert-major (as scripts/bench_ht_torch.py):
    dispatch  the expert-major receive order of every rank (destination rank, local expert, source
              rank, token, k) by a stable argsort, then one index_select of the rows
              -> <model>/R<R>/ht-em/T<T>/bf16/dispatch
    combine   each (token, k)'s output gathered back (identity experts), weighted in FP32, summed
              over k, cast to BF16 -> .../combine-pull and .../combine-eo (one PyTorch job for both)
  LL (as scripts/bench_ll_torch.py):
    dispatch  per source rank the slot of every (token, k) (stable argsort by expert), then one
              index_copy_ into the fixed [R dst][E/R][R src][T] layout -> .../ll/T<T>/bf16/dispatch
    combine   gather, weight in FP32, sum over k, BF16 -> .../combine-push and .../combine-pull
Times: median of CUDA events (epf_torch_common.median_us). Rows with no PyTorch counterpart (quantized
payloads, rank-major, MXFP8 combine) are absent: bench_zoo prints '-' there.

Usage:
  python3 scripts/bench_zoo_torch.py [--csv zoo_torch.csv] [--quick] [--models a,b] [--ranks 4,8,16]
                                     [--ht-tokens 4096] [--ll-tokens 1,128,256] [--iters 5] [--only ht|ll]
  build/tests/bench/bench_zoo --torch zoo_torch.csv --csv docs/perf-zoo.csv
The options and the row names match bench_zoo's (--quick: qwen3-30b and gpt-oss-120b, 4 ranks, HT
T=512, LL T=1,128). Without PyTorch or a GPU it says so and exits 0 (a skip).
"""
import argparse
import sys

from epf_torch_common import median_us, torch_cuda

# name: (hidden, experts, top-k) — the same table as bench_zoo.cu
MODELS = {
    "deepseek-v3": (7168, 256, 8),
    "kimi-k2": (7168, 384, 8),
    "qwen3-235b": (4096, 128, 8),
    "qwen3-30b": (2048, 128, 8),
    "gpt-oss-120b": (2880, 128, 4),
    "llama4-maverick": (5120, 128, 1),
    "mixtral-8x22b": (6144, 8, 2),
}


def ints(s):
    return [int(v) for v in s.split(",") if v]


def ht_rows(torch, model, R, T, H, E, K, iters):
    """HT expert-major BF16 dispatch and combine (bench_ht_torch.py's jobs)."""
    dev = torch.device("cuda")
    EL = E // R
    g = torch.Generator(device=dev).manual_seed(1234)
    x = torch.randn(R * T, H, device=dev, dtype=torch.float32, generator=g).to(torch.bfloat16)
    topk = torch.rand(R * T, E, device=dev, generator=g).topk(K, dim=1).indices  # K distinct
    w = torch.rand(R * T, K, device=dev, generator=g)
    src_rank = torch.arange(R * T, device=dev) // T
    tok = torch.arange(R * T, device=dev) % T
    state = {}

    def dispatch():
        e = topk.reshape(-1)
        d = e // EL
        s_flat = src_rank.repeat_interleave(K)
        t_flat = tok.repeat_interleave(K)
        k_flat = torch.arange(K, device=dev).repeat(R * T)
        key = ((d * EL + e % EL) * R + s_flat) * T * K + t_flat * K + k_flat
        order = torch.argsort(key, stable=True)
        state["recv"] = x.index_select(0, (s_flat * T + t_flat)[order])
        state["order"] = order

    def combine():
        inv = torch.empty_like(state["order"])
        inv[state["order"]] = torch.arange(inv.numel(), device=dev)
        yk = state["recv"].index_select(0, inv).view(R * T, K, H).float()
        state["out"] = (yk * w[:, :, None]).sum(1).to(torch.bfloat16)

    dispatch()
    combine()
    t_d = median_us(dispatch, iters, warmup=2)
    t_c = median_us(combine, iters, warmup=2)
    base = f"{model}/R{R}/ht-em/T{T}/bf16"
    out = [(f"{base}/dispatch", t_d, "argsort + index_select"),
           (f"{base}/combine-pull", t_c, "index_select + FP32 weighted sum over k"),
           (f"{base}/combine-eo", t_c, "index_select + FP32 weighted sum over k")]
    del x, topk, w, state
    torch.cuda.empty_cache()
    return out


def ll_rows(torch, model, R, T, H, E, K, iters):
    """LL BF16 dispatch and combine (bench_ll_torch.py's eager jobs)."""
    dev = "cuda"
    EL = E // R
    g = torch.Generator(device=dev)
    g.manual_seed(1234)
    x = torch.randn(R, T, H, device=dev, generator=g).to(torch.bfloat16)
    topk = torch.rand(R, T, E, device=dev, generator=g).topk(K, dim=-1).indices
    w = torch.full((R, T, K), 1.0 / K, device=dev)
    recv = torch.empty(R * EL * R * T, H, dtype=torch.bfloat16, device=dev)
    out = torch.empty(R, T, H, dtype=torch.bfloat16, device=dev)

    def rows_of_routing():
        rows = []
        for s in range(R):
            e = topk[s].reshape(-1)
            order = torch.argsort(e, stable=True)
            counts = torch.bincount(e, minlength=E)
            start = torch.cumsum(counts, 0) - counts
            slot = torch.empty_like(e)
            slot[order] = torch.arange(e.numel(), device=dev) - start[e[order]]
            rows.append(((e // EL * EL + e % EL) * R + s) * T + slot)
        return torch.stack(rows)

    dest = rows_of_routing()

    def dispatch():
        d = rows_of_routing()
        recv.index_copy_(0, d.reshape(-1), x.repeat_interleave(K, dim=1).reshape(-1, H))

    def combine():
        y = recv.index_select(0, dest.reshape(-1)).reshape(R, T, K, H).float()
        out.copy_((y * w[..., None]).sum(dim=2).to(torch.bfloat16))

    t_d = median_us(dispatch, iters, warmup=5, sync_each=False)
    t_c = median_us(combine, iters, warmup=5, sync_each=False)
    base = f"{model}/R{R}/ll/T{T}/bf16"
    res = [(f"{base}/dispatch", t_d, "argsort slots + index_copy_"),
           (f"{base}/combine-push", t_c, "index_select + FP32 weighted sum over k"),
           (f"{base}/combine-pull", t_c, "index_select + FP32 weighted sum over k")]
    del x, topk, w, recv, out
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=None, help="write here (default: stdout)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--ranks", default="8,4,16")
    ap.add_argument("--ht-tokens", type=int, default=4096)
    ap.add_argument("--ll-tokens", default="1,128,256")
    ap.add_argument("--iters", type=int, default=5, help="HT iterations (LL: 10x as many replays)")
    ap.add_argument("--only", choices=["ht", "ll"], default=None)
    ap.add_argument("--build", default=None, help="ignored (scripts/gpu_suite.sh passes it)")
    a = ap.parse_args()
    if a.quick:
        a.models, a.ranks, a.ht_tokens, a.ll_tokens, a.iters = "qwen3-30b,gpt-oss-120b", "4", 512, "1,128", 3
    models = [m for m in a.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            print(f"bench_zoo_torch: unknown model {m} (known: {', '.join(MODELS)})", file=sys.stderr)
            return 2
    torch = torch_cuda("bench_zoo_torch")
    if torch is None:
        return 0
    rows = []
    for m in models:
        H, E, K = MODELS[m]
        for R in ints(a.ranks):
            if E % R != 0:
                print(f"  skip {m} R{R}: experts not divisible by ranks", file=sys.stderr)
                continue
            if a.only != "ll":
                print(f"[ht] {m} R{R} T{a.ht_tokens}", file=sys.stderr)
                rows += ht_rows(torch, m, R, a.ht_tokens, H, E, K, a.iters)
            if a.only != "ht":
                for T in ints(a.ll_tokens):
                    print(f"[ll] {m} R{R} T{T}", file=sys.stderr)
                    rows += ll_rows(torch, m, R, T, H, E, K, 10 * a.iters)
    f = open(a.csv, "w") if a.csv else sys.stdout
    f.write(f"# bench_zoo_torch on {torch.cuda.get_device_name()}, torch {torch.__version__}, eager\n")
    f.write("case,torch_us,method\n")
    for name, us, how in rows:
        f.write(f"{name},{us:.2f},{how}\n")
    if a.csv:
        f.close()
        print(f"bench_zoo_torch: {len(rows)} rows -> {a.csv}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
