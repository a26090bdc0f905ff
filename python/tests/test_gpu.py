"""GPU parts of the Python package: whole rounds over virtual ranks (and a 1-rank NCCL group),
checked bit for bit against a reference, CUDA-graph capture and replay, the mask and the error
record. Skipped without a GPU or without PyTorch (CuPy parts: without CuPy).

Inputs are chosen so every product and sum is exact in FP32 (x: multiples of 1/8 in [-8, 8];
weights: multiples of 1/8 in (0, 1]; expert scales: powers of two), so the FP32 k-order reduction
of the library and any summation order of the reference give the same FP32 value, and both round
it to BF16 the same way: the comparison is bit for bit.
"""
import pytest

import epfuse
from conftest import usable_gpus

torch = pytest.importorskip("torch")
if usable_gpus() == 0 or not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)


def inputs(R, T, H, K, E, seed, dup=False, invalid=False, dtype=torch.int64):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randint(-64, 65, (R, T, H), generator=g).float() / 8).to(torch.bfloat16)
    idx = torch.rand(R * T, E, generator=g).argsort(dim=1)[:, :K].reshape(R, T, K)
    if dup and K > 1:  # repeats: routed once, their weights still count
        rep = torch.rand(R, T, generator=g) < 0.2
        idx[..., K - 1] = torch.where(rep, idx[..., 0], idx[..., K - 1])
    if invalid:  # -1: not routed
        off = torch.rand(R, T, K, generator=g) < 0.1
        idx = torch.where(off, torch.full_like(idx, -1), idx)
    w = torch.randint(1, 9, (R, T, K), generator=g).float() / 8
    return x.cuda(), idx.to(dtype).cuda(), w.cuda()


def expert_scale(E, EL):
    return torch.tensor([2.0 ** ((e % EL) % 3) for e in range(E)], device="cuda")


def reference(x, idx, w, scale, rank_major_experts_per_rank=None):
    """EXPERT_MAJOR: sum_k w_k * y_k in FP32, rounded once to BF16. RANK_MAJOR (pass the experts
    per rank): the expert side pre-reduces each token's copies on one rank into a partial that
    travels in the combine payload (BF16), and the source sums the partials — so each partial is
    rounded to BF16 first (the documented rank-major combine)."""
    valid = idx >= 0
    s = torch.where(valid, scale[idx.clamp(min=0).long()], torch.zeros((), device="cuda"))
    terms = x.float().unsqueeze(2) * (w * s).unsqueeze(-1)  # [R][T][K][H], exact
    if rank_major_experts_per_rank is None:
        return terms.sum(2).to(torch.bfloat16)
    dest = torch.where(valid, idx.long() // rank_major_experts_per_rank, torch.full_like(idx.long(), -1))
    acc = torch.zeros_like(terms[:, :, 0])
    for d in range(int(dest.max().item()) + 1):
        part = (terms * (dest == d).unsqueeze(-1)).sum(2)  # exact
        acc += part.to(torch.bfloat16).float()  # partials are BF16; their sum is exact again
    return acc.to(torch.bfloat16)


def bf16_rows(view):
    """[count][rows][row_bytes] uint8 window view -> [count][rows][H] bfloat16 tensor (no copy)."""
    return torch.as_tensor(view, device="cuda").view(torch.bfloat16)


def run_experts(rows_in, rows_out, segs, scale_j):
    """rows_out[r, seg] = rows_in[r, seg] * scale of the local expert (rows_out may be rows_in)."""
    for r, segs_r in enumerate(segs):
        for j, (b, c, _) in enumerate(segs_r):
            if c:
                rows_out[r, b:b + c] = rows_in[r, b:b + c] * scale_j[j]


def assert_same(got, want, T_per_rank=None):
    if T_per_rank is None:
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (got.float() - want.float()).abs().max()
    else:
        for r, t in enumerate(T_per_rank):
            assert torch.equal(got[r, :t].view(torch.int16), want[r, :t].view(torch.int16)), f"rank {r}"


@pytest.mark.parametrize("R,E,K,H,T,layout,dtype", [
    (4, 32, 4, 1032, 64, "expert_major", torch.int64),
    (3, 384, 6, 2880, 77, "expert_major", torch.int32),   # odd R, hidden 2880, Kimi-like E
    (5, 160, 22, 5120, 33, "expert_major", torch.int64),  # top-22
    (3, 24, 6, 2880, 50, "rank_major", torch.int64),
    (7, 56, 8, 1032, 19, "rank_major", torch.int32),      # prime R
])
def test_ht_round_bit_exact(R, E, K, H, T, layout, dtype, seed):
    EL = E // R
    g = epfuse.Group.virtual(R, num_experts=E, top_k=K, hidden=H, max_tokens_per_rank=T, layout=layout)
    mem = torch.empty(g.handle_mem_size(layout, K, dtype), dtype=torch.uint8, device="cuda")
    h = g.init_handle(layout, K, mem, index_dtype=dtype)
    x, idx, w = inputs(R, T, H, K, E, seed, dup=True, invalid=True, dtype=dtype)
    scale = expert_scale(E, EL)
    s = torch.cuda.Stream()
    out = torch.full((R, T, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    with torch.cuda.stream(s):
        h.update(idx, T, stream=s)
        g.dispatch(h, x, idx, w, stream=s)
        segs = h.segments_host(stream=s)
        if layout == "expert_major":
            rows = g.plan.recv_capacity
            eo = torch.zeros(R, rows, H, dtype=torch.bfloat16, device="cuda")
            run_experts(bf16_rows(g.recv_tokens()), eo, segs, scale[:EL])
        else:
            rows = R * T * min(K, EL) + EL
            view = torch.zeros(R, rows, H, dtype=torch.bfloat16, device="cuda")
            g.expand(h, view, rows, stream=s)
            eo = torch.zeros_like(view)
            run_experts(view, eo, segs, scale[:EL])
        g.combine(h, out, idx, w, expert_out=eo, expert_rows=rows, stream=s)
    s.synchronize()
    assert g.get_async_error() is None
    assert_same(out, reference(x, idx, w, scale, EL if layout == "rank_major" else None))


def test_ht_in_place_pull_and_tokens_per_rank(seed):
    R, E, K, H, T = 4, 64, 8, 2880, 40
    tpr = [40, 1, 0, 23]
    g = epfuse.Group.virtual(R, num_experts=E, top_k=K, hidden=H, max_tokens_per_rank=T)
    mem = torch.empty(g.handle_mem_size("expert_major", K), dtype=torch.uint8, device="cuda")
    h = g.init_handle("expert_major", K, mem)
    x, idx, w = inputs(R, T, H, K, E, seed)
    scale = expert_scale(E, E // R)
    n_dev = torch.tensor(tpr, dtype=torch.int32, device="cuda")
    out = torch.full((R, T, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    h.update(idx, num_tokens_per_rank=n_dev)
    g.dispatch(h, x, idx, w)
    recv = bf16_rows(g.recv_tokens())
    run_experts(recv, recv, h.segments_host(), scale[: E // R])  # outputs over the received rows
    g.combine(h, out, idx, w)  # expert_out None: pull
    torch.cuda.synchronize()
    assert g.get_async_error() is None
    assert_same(out, reference(x, idx, w, scale), tpr)


def test_ht_graph_replay_100(seed):
    R, E, K, H, T = 4, 32, 4, 1032, 64
    g = epfuse.Group.virtual(R, num_experts=E, top_k=K, hidden=H, max_tokens_per_rank=T)
    mem = torch.empty(g.handle_mem_size("expert_major", K), dtype=torch.uint8, device="cuda")
    h = g.init_handle("expert_major", K, mem)
    x, idx, w = inputs(R, T, H, K, E, seed)
    out = torch.zeros(R, T, H, dtype=torch.bfloat16, device="cuda")
    ones = torch.ones(E, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside capture
        h.update(idx, T, stream=s)
        g.dispatch(h, x, idx, w, stream=s)
        g.combine(h, out, idx, w, stream=s)
    s.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        h.update(idx, T, stream=s)
        g.dispatch(h, x, idx, w, stream=s)
        g.combine(h, out, idx, w, stream=s)  # identity experts: in place, pull
    for i in range(100):
        x2, idx2, w2 = inputs(R, T, H, K, E, seed + 1 + i)
        x.copy_(x2)
        idx.copy_(idx2)
        w.copy_(w2)
        graph.replay()
        torch.cuda.synchronize()
        assert_same(out, reference(x, idx, w, ones))
    assert g.get_async_error() is None


def test_import_handle(seed):
    R, E, K, H, T = 3, 24, 4, 1032, 16
    g = epfuse.Group.virtual(R, num_experts=E, top_k=K, hidden=H, max_tokens_per_rank=T)
    n = g.handle_mem_size("expert_major", K)
    mem = torch.empty(n, dtype=torch.uint8, device="cuda")
    h = g.init_handle("expert_major", K, mem)
    x, idx, w = inputs(R, T, H, K, E, seed)
    h.update(idx, T)
    torch.cuda.synchronize()
    copy = mem.clone()  # a byte copy of a handle is a handle
    h2 = g.import_handle("expert_major", epfuse.HandleState(T, K, "int64"), copy)
    out = torch.zeros(R, T, H, dtype=torch.bfloat16, device="cuda")
    g.dispatch(h2, x, idx, w)
    g.combine(h2, out, idx, w)
    torch.cuda.synchronize()
    assert_same(out, reference(x, idx, w, torch.ones(E, device="cuda")))
    with pytest.raises(epfuse.EpfError):
        g.import_handle("expert_major", epfuse.HandleState(T, K, "int32"), copy)


def test_overflow_is_counted_and_cleared(seed):
    R, E, K, H, T = 4, 32, 4, 256, 64
    g = epfuse.Group.virtual(R, num_experts=E, top_k=K, hidden=H, max_tokens_per_rank=T, recv_capacity=16)
    mem = torch.empty(g.handle_mem_size("expert_major", K), dtype=torch.uint8, device="cuda")
    h = g.init_handle("expert_major", K, mem)
    x, idx, w = inputs(R, T, H, K, E, seed)
    out = torch.zeros(R, T, H, dtype=torch.bfloat16, device="cuda")
    eo = torch.zeros(R, 16, H, dtype=torch.bfloat16, device="cuda")
    h.update(idx, T)
    g.dispatch(h, x, idx, w)
    g.combine(h, out, idx, w, expert_out=eo, expert_rows=16)
    torch.cuda.synchronize()
    e = g.get_async_error()
    assert e is not None and e.recv_overflow > 0
    assert "past the capacity" in e.sentence
    g.error_clear()
    assert g.get_async_error() is None



@pytest.mark.parametrize("R,E,K,H,T,pull", [(3, 24, 8, 1032, 16, True), (5, 40, 6, 2880, 9, False)])
def test_ll_rank_major_round(R, E, K, H, T, pull, seed):
    """LL rank-major: one copy per (token, rank), the receive half expands into the expert-major
    view (packed rows of R * T per expert); identity experts (y = the view), the combine
    pre-reduces per (token, rank) and the source sums the BF16 partials: the rank-major rule."""
    EL = E // R
    g = epfuse.Group.virtual(R, num_experts=E, top_k=K, hidden=H, max_tokens_per_rank=T, mode="ll",
                             layout="rank_major")
    x, idx, w = inputs(R, T, H, K, E, seed, dup=True, invalid=True)
    counts = torch.empty(R, EL, R, dtype=torch.int32, device="cuda")
    view = torch.full((R, EL * R * T, H), 7.0, dtype=torch.bfloat16, device="cuda")
    out = torch.zeros(R, T, H, dtype=torch.bfloat16, device="cuda")
    for i in range(3):  # both parities
        if i:
            x, idx, w = inputs(R, T, H, K, E, seed + i, dup=True, invalid=True)
        if i == 1:  # the view as a separate step
            g.ll_dispatch(x, idx, w, counts, num_tokens=T)
            g.ll_expand(counts, packed_x=view)
        else:
            g.ll_dispatch(x, idx, w, counts, num_tokens=T, packed_x=view)
        g.ll_combine(view, counts, idx, w, out, num_tokens=T, y_layout="packed_pull" if pull else "packed")
        torch.cuda.synchronize()
        assert_same(out, reference(x, idx, w, torch.ones(E, device="cuda"), EL))
    assert g.get_async_error() is None

@pytest.mark.parametrize("R,E,K,H,T", [(4, 32, 8, 1032, 32), (5, 40, 6, 2880, 17)])
def test_ll_round_graph_and_mask(R, E, K, H, T, seed):
    EL = E // R
    g = epfuse.Group.virtual(R, num_experts=E, top_k=K, hidden=H, max_tokens_per_rank=T, mode="ll")
    x, idx, w = inputs(R, T, H, K, E, seed, dup=True)
    counts = torch.empty(R, EL, R, dtype=torch.int32, device="cuda")
    rnd = torch.empty(R, dtype=torch.int32, device="cuda")
    out = torch.zeros(R, T, H, dtype=torch.bfloat16, device="cuda")
    ones = torch.ones(E, device="cuda")

    def round_(stream):
        g.ll_dispatch(x, idx, w, counts, round=rnd, num_tokens=T, stream=stream)
        g.ll_combine(None, counts, idx, w, out, num_tokens=T, y_layout="in_place_pull", stream=stream)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    round_(s)
    s.synchronize()
    assert_same(out, reference(x, idx, w, ones))
    # recv_counts: one row per (token, distinct expert), per (destination, local expert, source)
    want = torch.zeros(R, EL, R, dtype=torch.int32)
    ih = idx.cpu()
    for src in range(R):
        for t in range(T):
            for e in set(int(v) for v in ih[src, t] if v >= 0):
                want[e // EL, e % EL, src] += 1
    assert torch.equal(counts.cpu(), want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        round_(s)
    for i in range(100):
        x2, idx2, w2 = inputs(R, T, H, K, E, seed + 1 + i, dup=True)
        x.copy_(x2)
        idx.copy_(idx2)
        w.copy_(w2)
        graph.replay()
        torch.cuda.synchronize()
        assert_same(out, reference(x, idx, w, ones))
    # the mask: everyone active; query is stream-ordered, no allocation
    words = epfuse.LIMITS["EPF_MASK_WORDS"]
    m = torch.zeros(R, words, dtype=torch.int32, device="cuda")
    g.enable_mask()
    g.mask_query(m)
    torch.cuda.synchronize()
    assert all(int(m[r, 0]) & ((1 << R) - 1) == (1 << R) - 1 for r in range(R))
    g.mask_clean()
    g.mask_query(m)
    torch.cuda.synchronize()
    assert int(m[0, 0]) & ((1 << R) - 1) == (1 << R) - 1
    assert g.get_async_error() is None


@pytest.mark.parametrize("R,E,K,H,T", [(3, 24, 8, 1032, 16), (5, 40, 22, 2880, 9)])
def test_ll_backward(R, E, K, H, T, seed):
    """The LL training direction after a forward round: ll_combine_backward (a dispatch of dy into
    the forward's rows) and ll_dispatch_backward (experts in place: dx rows = dy rows, pulled; unit
    weights, a repeated expert adds nothing), so dx[t] = sum of dy[t] over the distinct experts."""
    EL = E // R
    g = epfuse.Group.virtual(R, num_experts=E, top_k=K, hidden=H, max_tokens_per_rank=T, mode="ll")
    x, idx, w = inputs(R, T, H, K, E, seed, dup=True, invalid=True)
    dy, _, _ = inputs(R, T, H, K, E, seed + 7)
    counts = torch.empty(R, EL, R, dtype=torch.int32, device="cuda")
    out = torch.zeros(R, T, H, dtype=torch.bfloat16, device="cuda")
    dx = torch.zeros(R, T, H, dtype=torch.bfloat16, device="cuda")
    twg = torch.full((R, T, K), 7.0, device="cuda")
    g.ll_dispatch(x, idx, w, counts, num_tokens=T)
    g.ll_combine(None, counts, idx, w, out, num_tokens=T, y_layout="in_place_pull")
    g.ll_combine_backward(dy, idx, w, counts, num_tokens=T)
    g.ll_dispatch_backward(None, counts, idx, dx, num_tokens=T, y_layout="in_place_pull", topk_weights_grad=twg)
    torch.cuda.synchronize()
    ones = torch.ones(E, device="cuda")
    assert_same(out, reference(x, idx, w, ones))
    first = idx.clone()  # repeats of an earlier k contribute nothing in the backward of dispatch
    for k in range(1, K):
        rep = (idx[..., :k] == idx[..., k:k + 1]).any(-1) & (idx[..., k] >= 0)
        first[..., k] = torch.where(rep, torch.full_like(idx[..., k], -1), idx[..., k])
    assert_same(dx, reference(dy, first, torch.ones_like(w), ones))
    assert torch.count_nonzero(twg) == 0  # no expert side carried gradients: 0 everywhere
    assert g.get_async_error() is None


def test_nccl_one_rank_group(seed):
    if not epfuse._abi.HAS_NCCL:
        pytest.skip("library built without NCCL")
    E, K, H, T = 8, 2, 1032, 32
    try:
        group = epfuse.Group.from_nccl(epfuse.get_unique_id(), 1, 0, timeout_s=60.0, num_experts=E, top_k=K, hidden=H,
                                       max_tokens_per_rank=T)
    except epfuse.EpfError as e:
        if e.name == "EPF_ERR_NOT_SUPPORTED":  # built against other NCCL headers than the library loaded
            pytest.skip(str(e))
        raise
    with group as g:
        mem = torch.empty(g.handle_mem_size("expert_major", K), dtype=torch.uint8, device="cuda")
        h = g.init_handle("expert_major", K, mem)
        x, idx, w = inputs(1, T, H, K, E, seed)
        out = torch.zeros(1, T, H, dtype=torch.bfloat16, device="cuda")
        h.update(idx, T)
        g.dispatch(h, x, idx, w)
        g.combine(h, out, idx, w)
        torch.cuda.synchronize()
        assert g.get_async_error() is None
        assert_same(out, reference(x, idx, w, torch.ones(E, device="cuda")))


def test_cupy_buffers_without_torch_tensors(seed):
    cp = pytest.importorskip("cupy")
    import numpy as np
    R, E, K, H, T = 3, 24, 4, 1032, 20
    rng = np.random.default_rng(seed)
    xf = (rng.integers(-64, 65, (R, T, H)) / 8).astype(np.float32)
    x = cp.asarray((xf.view(np.uint32) >> 16).astype(np.uint16))  # exact in BF16
    idx = cp.asarray(np.argsort(rng.random((R * T, E)), axis=1)[:, :K].reshape(R, T, K).astype(np.int32))
    wf = (rng.integers(1, 9, (R, T, K)) / 8).astype(np.float32)
    w = cp.asarray(wf)
    out = cp.zeros((R, T, H), dtype=cp.uint16)
    g = epfuse.Group.virtual(R, num_experts=E, top_k=K, hidden=H, max_tokens_per_rank=T)
    mem = cp.empty(g.handle_mem_size("expert_major", K, "int32"), dtype=cp.uint8)
    h = g.init_handle("expert_major", K, mem, index_dtype="int32")
    s = cp.cuda.Stream(non_blocking=True)
    h.update(idx, T, stream=s)
    g.dispatch(h, x, idx, w, stream=s)
    g.combine(h, out, idx, w, stream=s)
    s.synchronize()
    ref = (xf[:, :, None, :] * wf[..., None]).sum(2)  # exact
    bits = ref.view(np.uint32).astype(np.uint64)
    ref16 = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    assert np.array_equal(cp.asnumpy(out), ref16)


def test_readme_quickstart(seed):
    """The README's "Use from Python" code, verbatim (test_doc_snippets), on a small shape."""
    R, E, K, H, T = 4, 32, 4, 1032, 64
    def make_batch():
        return inputs(R, T, H, K, E, seed)

    # example-begin py_quickstart
    import torch
    import epfuse

    g = epfuse.Group.virtual(R, num_experts=E, top_k=K, hidden=H, max_tokens_per_rank=T)
    mem = torch.empty(g.handle_mem_size("expert_major", K), dtype=torch.uint8, device="cuda")
    h = g.init_handle("expert_major", K, mem)  # the handle (route memory): once
    x, topk_idx, topk_weights = make_batch()  # [rank][token][hidden] bf16; [rank][token][k] int64, float32
    out = torch.empty_like(x)

    h.update(topk_idx)  # every step: counts, slots, offsets (no host sync)
    g.dispatch(h, x, topk_idx, topk_weights)  # rows into the expert-major receive rows
    recv = torch.as_tensor(g.recv_tokens(), device="cuda").view(torch.bfloat16)  # [rank][row][hidden]
    for r, experts in enumerate(h.segments_host()):  # (begin, count, padded) per local expert
        for j, (begin, count, _) in enumerate(experts):
            recv[r, begin:begin + count] *= 2.0  # expert j of rank r, in place over its rows
    g.combine(h, out, topk_idx, topk_weights)  # out[t] = sum_k w_k * y_k (FP32, k order)
    torch.cuda.synchronize()
    assert g.get_async_error() is None
    # example-end py_quickstart
    assert_same(out, reference(x, topk_idx, topk_weights, torch.full((E,), 2.0, device="cuda")))


def test_bad_torch_tensors_are_refused(seed):
    """The checks of test_checks.py with real PyTorch tensors (read through their attributes:
    bfloat16 and tensors that require grad included)."""
    R, E, K, H, T = 2, 16, 4, 256, 8
    g = epfuse.Group.virtual(R, num_experts=E, top_k=K, hidden=H, max_tokens_per_rank=T)
    need = g.handle_mem_size("expert_major", K)
    with pytest.raises(ValueError, match="handle_mem has 1 bytes"):
        g.init_handle("expert_major", K, torch.empty(1, dtype=torch.uint8, device="cuda"))
    mem = torch.empty(need, dtype=torch.uint8, device="cuda")
    h = g.init_handle("expert_major", K, mem)
    x, idx, w = inputs(R, T, H, K, E, seed)
    with pytest.raises(ValueError, match="topk_idx must be int64"):
        h.update(idx.int())
    h.update(idx)
    with pytest.raises(ValueError, match="x must be bfloat16"):
        g.dispatch(h, x.float(), idx, w)
    with pytest.raises(ValueError, match="float16 is another format"):
        g.dispatch(h, x.half(), idx, w)
    with pytest.raises(ValueError, match="C-contiguous"):
        g.dispatch(h, x.transpose(1, 2).contiguous().transpose(1, 2), idx, w)
    with pytest.raises(ValueError, match="C-contiguous"):
        g.dispatch(h, x[:, :, : H // 2], idx, w)  # a slice of each row
    with pytest.raises(ValueError, match="x must be"):
        g.dispatch(h, x[:, :, : H // 2].contiguous(), idx, w)
    with pytest.raises(ValueError, match="cpu tensor"):
        g.dispatch(h, x.cpu(), idx, w)
    with pytest.raises(ValueError, match="topk_weights must be float32"):
        g.dispatch(h, x, idx, w.double())
    with pytest.raises(ValueError, match="rows per rank"):
        g.dispatch(h, x[:, : T - 1].contiguous(), idx, w)
    if torch.cuda.device_count() > 1:
        with pytest.raises(ValueError, match="is on cuda:1"):
            g.dispatch(h, x.to("cuda:1"), idx, w)
    # tensors that require grad (both protocols refuse them) and bfloat16 (no CAI) are accepted
    out = torch.zeros(R, T, H, dtype=torch.bfloat16, device="cuda")
    g.dispatch(h, x.requires_grad_(), idx, w.requires_grad_())
    g.combine(h, out, idx, w)
    torch.cuda.synchronize()
    assert g.get_async_error() is None
    assert_same(out, reference(x.detach(), idx, w.detach(), torch.ones(E, device="cuda")))
    # one rank: num_tokens is the tensor's rows, never more
    g1 = epfuse.Group.virtual(1, num_experts=E, top_k=K, hidden=H, max_tokens_per_rank=T)
    h1 = g1.init_handle("expert_major", K, torch.empty(g1.handle_mem_size("expert_major", K), dtype=torch.uint8,
                                                       device="cuda"))
    x1, idx1, w1 = inputs(1, 5, H, K, E, seed)
    with pytest.raises(ValueError, match="num_tokens=6 but topk_idx has only 5 rows"):
        h1.update(idx1, 6)
    h1.update(idx1[0])  # [T][K]: 5 tokens
    assert h1.num_tokens == 5
    out1 = torch.zeros(1, 5, H, dtype=torch.bfloat16, device="cuda")
    g1.dispatch(h1, x1[0], idx1[0], w1[0])
    g1.combine(h1, out1, idx1, w1)
    torch.cuda.synchronize()
    assert_same(out1, reference(x1, idx1, w1, torch.ones(E, device="cuda")))


def _nccl_or_skip(fn):
    if not epfuse._abi.HAS_NCCL:
        pytest.skip("library built without NCCL")
    try:
        return fn()
    except epfuse.EpfError as e:
        if e.name == "EPF_ERR_NOT_SUPPORTED":  # built against other NCCL headers than the library loaded
            pytest.skip(str(e))
        raise


def _one_round(g, E, K, H, T, seed):
    mem = torch.empty(g.handle_mem_size("expert_major", K), dtype=torch.uint8, device="cuda")
    h = g.init_handle("expert_major", K, mem)
    x, idx, w = inputs(1, T, H, K, E, seed)
    out = torch.zeros(1, T, H, dtype=torch.bfloat16, device="cuda")
    h.update(idx)
    g.dispatch(h, x, idx, w)
    g.combine(h, out, idx, w)
    torch.cuda.synchronize()
    assert g.get_async_error() is None
    assert_same(out, reference(x, idx, w, torch.ones(E, device="cuda")))


def test_from_torch_world_of_one(seed, tmp_path):
    """Group.from_torch over a gloo process group of one rank (a FileStore): the id goes through
    torch.distributed, then one dispatch / combine round."""
    import torch.distributed as dist
    E, K, H, T = 8, 2, 1032, 32
    if dist.is_initialized():
        pytest.skip("a process group is already initialised")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        g = _nccl_or_skip(lambda: epfuse.Group.from_torch(num_experts=E, top_k=K, hidden=H, max_tokens_per_rank=T))
        with g:
            assert g.nranks == 1 and g.count == 1 and g.device == torch.cuda.current_device()
            _one_round(g, E, K, H, T, seed)
    finally:
        dist.destroy_process_group()


def test_from_comm_leaves_the_communicator(seed):
    """Group.from_comm over a communicator made here: close() does not destroy it (a second group
    adopts it after the first is closed), its owner does."""
    import ctypes
    from epfuse import _abi
    E, K, H, T = 8, 2, 1032, 32
    uid = _nccl_or_skip(epfuse.get_unique_id)
    u = _abi.NcclUniqueId()
    ctypes.memmove(u.internal, uid, 128)
    comm = ctypes.c_void_p()
    assert _abi.epf_nccl_comm_init_rank(ctypes.byref(comm), 1, u, 0, 60.0) == 0
    try:
        for i in range(2):
            g = _nccl_or_skip(lambda: epfuse.Group.from_comm(comm, num_experts=E, top_k=K, hidden=H,
                                                             max_tokens_per_rank=T))
            with g:
                assert g.nranks == 1 and not g._owns_comm
                _one_round(g, E, K, H, T, seed + i)
    finally:
        assert _abi.epf_nccl_comm_destroy(comm, 60.0) == 0


def test_show_versions_sees_the_gpu(capsys):
    v = epfuse.versions()
    assert v["cuda_device_count"] == torch.cuda.device_count() and v["cuda_devices"]
    assert v["torch"] is not None
    epfuse.show_versions()
    assert torch.cuda.get_device_name(0) in capsys.readouterr().out
