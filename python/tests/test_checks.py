"""Arguments refused in Python before anything reaches C (issue #30): integers (wrap-around, zeros
that would silently mean "default", floats, strings, bools, limits), buffers (dtype, shape,
contiguity, device, size, index dtype, rows), the NCCL bootstraps (from_comm, from_torch) and the
NCCL release check. No GPU: buffers are small fakes carrying __cuda_array_interface__ or a DLPack
capsule, groups are made without device memory (Group._bare) and the C launchers are replaced by
recorders, so every check runs here (CI) and a passing check is seen to hand C the right values.
"""
import ctypes
import math
import os
import shutil
import subprocess
import sys
import types

import pytest

import epfuse
from epfuse import _abi, _buffers, _versions

_real_nccl_problem = _versions.nccl_problem
SHAPE = dict(num_experts=32, top_k=4, hidden=256, max_tokens_per_rank=16)
R, E, K, H, T = 4, 32, 4, 256, 16


# ---- fakes -------------------------------------------------------------------------------------------
class CAI:
    """A device buffer through __cuda_array_interface__ v3 (address never dereferenced)."""

    def __init__(self, shape, typestr, strides=None, ptr=0x7f0000000000, device=None, nbytes=None):
        self.shape, self.typestr, self.strides, self.ptr = tuple(shape), typestr, strides, ptr
        if device is not None:
            self.device = device

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.typestr, "data": (self.ptr, False), "version": 3,
                "strides": self.strides, "stream": None}


def cai(shape, dtype="bf16", **kw):
    typestr = {"bf16": "<u2", "f32": "<f4", "f16": "<f2", "f64": "<f8", "i32": "<i4", "i64": "<i8", "u8": "|u1",
               "V2": "|V2", "u32": "<u4"}[dtype]
    return CAI(shape, typestr, **kw)


def transposed(shape, dtype="bf16"):
    """A view of logical `shape` [.., a, b] over a [.., b, a] buffer: the last two axes swapped."""
    item = {"bf16": 2, "f32": 4, "i32": 4, "i64": 8}[dtype]
    phys = tuple(shape[:-2]) + (shape[-1], shape[-2])
    st = list(_buffers._c_strides(phys, item))
    st[-1], st[-2] = st[-2], st[-1]
    return cai(shape, dtype, strides=tuple(st))


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DLPack:
    """A DLPack producer (legacy "dltensor" capsule, no deleter) for dtype (code, bits)."""

    def __init__(self, shape, code, bits, strides=None, device_type=2, device_id=0, ptr=0x7f0000100000,
                 fail=False, with_cai=False):
        n = len(shape)
        self._shape = (ctypes.c_int64 * n)(*shape)
        self._strides = (ctypes.c_int64 * n)(*strides) if strides is not None else None
        mt = _buffers._DLManagedTensor()
        t = mt.dl_tensor
        t.data, t.ndim, t.byte_offset = ptr, n, 0
        t.device.device_type, t.device.device_id = device_type, device_id
        t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, 1
        t.shape = ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64)) if strides is not None else None
        self._mt, self.calls, self.fail = mt, [], fail
        if with_cai:
            self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": "<u2", "data": (ptr, False),
                                             "version": 3, "strides": None}

    def __dlpack__(self, stream=None):
        self.calls.append(stream)
        if self.fail:
            raise BufferError("this producer refuses")
        return _capsule_new(ctypes.addressof(self._mt), b"dltensor", None)

    def __dlpack_device__(self):
        return (self._mt.dl_tensor.device.device_type, self._mt.dl_tensor.device.device_id)


BF16_DL, I32_DL, I64_DL, F32_DL = (4, 16), (0, 32), (0, 64), (2, 32)


class Recorder:
    """Stands in for a C launcher: records its arguments, returns `status`."""

    def __init__(self, status=0):
        self.calls, self.status = [], status

    def __call__(self, *args):
        self.calls.append(args)
        return self.status


def fake_group(count=R, mode="ht", device=0, nranks=R, **kw):
    plan = epfuse.compute_plan(nranks=nranks, mode=mode, **{**SHAPE, **kw})
    g = epfuse.Group._bare(plan, count, _abi.Team(), count > 1, device)
    if mode == "ll":
        g._ll = _abi.LlLaunch()
    return g


def fake_handle(g, index_dtype="int64", num_topk=K, max_tokens=None):
    rc = g._route_config(num_topk, index_dtype, max_tokens, "test")
    r = _abi.Route()
    assert _abi.epf_route_layout_compute(ctypes.byref(g.plan.c), ctypes.byref(rc), ctypes.byref(r.layout)) == 0
    r.count = g.count
    return epfuse.Handle(g, r, None, rc.index_type, num_topk)


@pytest.fixture
def launchers(monkeypatch):
    """Every C launcher the checks lead to, replaced by a recorder."""
    names = ["epf_route_update", "epf_route_init", "epf_route_import", "epf_ht_dispatch", "epf_ht_combine",
             "epf_ht_expand", "epf_ht_combine_backward", "epf_ht_dispatch_backward", "epf_ll_dispatch",
             "epf_ll_combine", "epf_ll_expand", "epf_ll_combine_backward", "epf_ll_dispatch_backward",
             "epf_ll_mask_query_async", "epf_ll_mask_update", "epf_cuda_memcpy_async"]
    rec = types.SimpleNamespace()
    for n in names:
        r = Recorder()
        setattr(rec, n, r)
        monkeypatch.setattr(_abi, n, r)
    return rec


def struct_arg(call, cls):
    """The ctypes struct of type `cls` a recorded call got by reference."""
    for a in call:
        obj = getattr(a, "_obj", None)
        if isinstance(obj, cls):
            return obj
    raise AssertionError(f"no {cls.__name__} argument")


def raises(exc, *words):
    """pytest.raises(exc) whose message contains every word."""
    class _Ctx:
        def __enter__(self):
            self.cm = pytest.raises(exc)
            self.info = self.cm.__enter__()
            return self.info

        def __exit__(self, *a):
            r = self.cm.__exit__(*a)
            msg = str(self.info.value)
            for w in words:
                assert w in msg, f"{w!r} not in {msg!r}"
            return r
    return _Ctx()


# ---- integers -------------------------------------------------------------------------------------------
BASE = dict(nranks=8, num_experts=256, top_k=8, hidden=7168, max_tokens_per_rank=128)


@pytest.mark.parametrize("field,value,words", [
    ("hidden", 2**32 + 256, ["hidden=4294967552", "[1, 1048576]"]),            # was: a plan with hidden 256
    ("max_tokens_per_rank", 2**32 + 1, ["max_tokens_per_rank=4294967297", "65536"]),  # was: T = 1
    ("nranks", 2**32 + 8, ["nranks=4294967304", "EPF_MAX_RANKS"]),
    ("hidden", 0, ["hidden=0"]),
    ("nranks", 0, ["nranks=0"]),
    ("num_experts", 0, ["num_experts=0"]),
    ("top_k", 0, ["top_k=0"]),
    ("max_tokens_per_rank", 0, ["max_tokens_per_rank=0"]),
    ("hidden", -7168, ["hidden=-7168"]),
    ("top_k", 33, ["top_k=33", "EPF_MAX_TOPK"]),
    ("num_experts", 1025, ["num_experts=1025", "EPF_MAX_EXPERTS"]),
    ("expert_alignment", 0, ["expert_alignment=0"]),
    ("expert_alignment", 2048, ["expert_alignment=2048"]),
    ("recv_capacity", 0, ["recv_capacity=0"]),
    ("recv_capacity", 2**31, ["recv_capacity=2147483648"]),
    ("timeout_ns", 0, ["timeout_ns=0"]),
    ("timeout_ns", 2**64, ["timeout_ns="]),
    ("flags", -1, ["flags=-1"]),
    ("flags", 2**32, ["flags=4294967296"]),
    ("mode", 7, ["mode=7"]),
    ("payload", "int4", ["payload", "int4"]),
])
def test_config_out_of_range_is_a_value_error(field, value, words):
    with raises(ValueError, *words) as e:
        epfuse.compute_plan(**{**BASE, field: value})
    assert isinstance(e.value, epfuse.EpfError)  # both: except EpfError keeps working
    assert e.value.name.startswith("EPF_ERR_")


def test_config_statuses_name_the_rule():
    with pytest.raises(epfuse.EpfValueError) as e:
        epfuse.compute_plan(**{**BASE, "hidden": 2**32 + 256})
    assert e.value.name == "EPF_ERR_HIDDEN"
    with pytest.raises(epfuse.EpfValueError) as e:
        epfuse.compute_plan(**{**BASE, "nranks": 73, "num_experts": 146})
    assert e.value.name == "EPF_ERR_RANKS"


@pytest.mark.parametrize("value", [7168.5, 7168.0, "7168", b"7168", True, False, None, [7168], 7168j])
def test_config_non_ints_are_type_errors(value):
    with raises(TypeError, "hidden"):
        epfuse.compute_plan(**{**BASE, "hidden": value})


@pytest.mark.parametrize("field", ["nranks", "num_experts", "top_k", "hidden", "max_tokens_per_rank"])
def test_config_shape_is_required(field):
    kw = dict(BASE)
    del kw[field]
    with raises(TypeError, field + "=", "no default"):
        epfuse.compute_plan(**kw)


def test_config_nothing_given_is_not_a_deepseek_plan():
    with raises(TypeError, "nranks=", "num_experts=", "top_k=", "hidden=", "max_tokens_per_rank="):
        epfuse.compute_plan()


def test_top_k_more_than_experts():
    with raises(ValueError, "top_k=16", "num_experts=8") as e:
        epfuse.compute_plan(nranks=1, num_experts=8, top_k=16, hidden=256, max_tokens_per_rank=8)
    assert e.value.name == "EPF_ERR_TOPK"


def test_integer_like_scalars_are_accepted():
    class Index:
        def __index__(self):
            return 256
    np = pytest.importorskip("numpy")
    p = epfuse.compute_plan(nranks=np.int64(8), num_experts=np.int32(256), top_k=8, hidden=Index(),
                            max_tokens_per_rank=np.uint16(128))
    assert p.nranks == 8 and p.hidden == 256 and p.max_tokens_per_rank == 128
    with raises(TypeError, "hidden"):
        epfuse.compute_plan(**{**BASE, "hidden": np.float64(7168)})
    with raises(TypeError, "hidden"):
        epfuse.compute_plan(**{**BASE, "hidden": np.bool_(True)})


def test_optional_fields_none_means_default():
    p = epfuse.compute_plan(**BASE, mode=None, layout=None, payload=None, expert_alignment=None, recv_capacity=None,
                            timeout_ns=None, flags=None)
    q = epfuse.compute_plan(**BASE)
    assert (p.mode, p.layout, p.payload, p.recv_capacity, p.timeout_ns) == (q.mode, q.layout, q.payload,
                                                                           q.recv_capacity, q.timeout_ns)
    assert p.expert_alignment == 1 and p.timeout_ns == 10_000_000_000
    assert epfuse.compute_plan(**BASE, flags=0).flags == 0  # no flag: not a surprise


def test_num_topk_alias_and_fields_given_twice():
    assert epfuse.compute_plan(nranks=8, num_experts=256, num_topk=6, hidden=7168, max_tokens_per_rank=8).top_k == 6
    with raises(TypeError, "not both"):
        epfuse.compute_plan(**BASE, num_topk=8)
    with raises(TypeError, "nranks"):
        epfuse.Group.virtual(8, nranks=8, num_experts=256, top_k=8, hidden=7168, max_tokens_per_rank=8)


def test_enums_strict():
    with raises(TypeError, "mode"):
        epfuse.compute_plan(**BASE, mode=True)
    with raises(ValueError, "layout"):
        epfuse.compute_plan(**BASE, layout=0)
    assert epfuse.compute_plan(**BASE, mode=2).mode == 2 and epfuse.compute_plan(**BASE, mode="LL").mode == 2


def test_group_virtual_checks_before_touching_the_gpu():
    # refused in Python: no CUDA call, so the same error with or without a GPU
    with raises(ValueError, "hidden=4294967552"):
        epfuse.Group.virtual(8, num_experts=256, top_k=8, hidden=2**32 + 256, max_tokens_per_rank=8)
    with raises(TypeError, "hidden="):
        epfuse.Group.virtual(8, num_experts=256, top_k=8, max_tokens_per_rank=8)
    with raises(TypeError, "device"):
        epfuse.Group.virtual(2, device=0.0, **SHAPE)
    with raises(ValueError, "device=-1"):
        epfuse.Group.virtual(2, device=-1, **SHAPE)


# ---- NCCL group arguments ------------------------------------------------------------------------------
@pytest.fixture
def no_nccl_calls(monkeypatch):
    """from_nccl / from_comm must fail before any NCCL or CUDA call; the release check passes."""
    def boom(*a):
        raise AssertionError("reached C")
    for n in ("epf_nccl_comm_init_rank", "epf_nccl_window_create", "epf_nccl_devcomm_create",
              "epf_nccl_get_unique_id", "epf_cuda_set_device"):
        monkeypatch.setattr(_abi, n, boom)
    monkeypatch.setattr(_abi, "HAS_NCCL", True)
    monkeypatch.setattr(_versions, "nccl_problem", lambda *a: None)


@pytest.mark.parametrize("kw,exc,words", [
    (dict(unique_id=b"x" * 127), ValueError, ["127 bytes"]),
    (dict(unique_id="x" * 128), TypeError, ["unique_id"]),
    (dict(rank=2), ValueError, ["rank=2", "[0, 1]"]),
    (dict(rank=-1), ValueError, ["rank=-1"]),
    (dict(nranks=0), ValueError, ["nranks=0"]),
    (dict(nranks=2**32 + 2), ValueError, ["nranks=4294967298"]),
    (dict(rank=1.0), TypeError, ["rank"]),
    (dict(timeout_s=0), ValueError, ["timeout_s=0"]),
    (dict(timeout_s=-1.0), ValueError, ["timeout_s"]),
    (dict(timeout_s=math.inf), ValueError, ["timeout_s"]),
    (dict(timeout_s=math.nan), ValueError, ["timeout_s"]),
    (dict(timeout_s="60"), TypeError, ["timeout_s"]),
    (dict(timeout_s=True), TypeError, ["timeout_s"]),
    (dict(lsa_barrier_count=-1), ValueError, ["lsa_barrier_count=-1"]),
    (dict(hidden=0), ValueError, ["hidden=0"]),
    (dict(device=2**31), ValueError, ["device="]),
])
def test_from_nccl_arguments(no_nccl_calls, kw, exc, words):
    args = dict(unique_id=b"\0" * 128, nranks=2, rank=0)
    args.update({k: kw.pop(k) for k in list(kw) if k in args})
    with raises(exc, *words):
        epfuse.Group.from_nccl(args["unique_id"], args["nranks"], args["rank"], **{**SHAPE, **kw})


@pytest.mark.parametrize("comm,exc,words", [
    (0, ValueError, ["NULL"]),
    (ctypes.c_void_p(), ValueError, ["NULL"]),
    ("0x1234", TypeError, ["comm"]),
    (True, TypeError, ["comm"]),
    (-5, ValueError, ["comm=-5"]),
    (types.SimpleNamespace(ptr=0), ValueError, ["NULL"]),
    (types.SimpleNamespace(handle=5), TypeError, ["comm"]),
])
def test_from_comm_address(no_nccl_calls, comm, exc, words):
    with raises(exc, *words):
        epfuse.Group.from_comm(comm, nranks=2, rank=0, **SHAPE)


# ---- buffers: descriptors --------------------------------------------------------------------------------
def test_describe_cai_and_dlpack():
    d = epfuse.describe(cai((4, 16, 256)))
    assert d.shape == (4, 16, 256) and d.dtype == "uint16" and d.strides == (8192, 512, 2) and d.c_contiguous
    assert d.device is None and d.source == "cai"
    assert epfuse.describe(cai((2, 3), "V2")).dtype == "void16"
    dl = DLPack((4, 16, 256), *BF16_DL, device_id=3)
    d = epfuse.describe(dl)
    assert (d.dtype, d.itemsize, d.device, d.source, d.shape) == ("bfloat16", 2, 3, "dlpack", (4, 16, 256))
    assert dl.calls == [-1]  # "no synchronisation": nothing enqueued, capture-safe
    d = epfuse.describe(DLPack((3, 5), *I64_DL, strides=(1, 3)))
    assert d.strides == (8, 24) and not d.c_contiguous
    # a producer that refuses DLPack but has CAI: read through CAI
    d = epfuse.describe(DLPack((4, 8), *BF16_DL, fail=True, with_cai=True))
    assert d.source == "cai"
    with raises(ValueError, "refuses"):
        epfuse.describe(DLPack((4, 8), *BF16_DL, fail=True))
    with raises(ValueError, "cpu memory"):
        epfuse.describe(DLPack((4, 8), *F32_DL, device_type=1))
    with raises(TypeError, "not a device buffer"):
        epfuse.describe("x")
    with raises(TypeError, "not a device buffer"):
        epfuse.describe(b"\0" * 16)


def test_device_array_checks():
    with raises(ValueError, "typestr"):
        epfuse.DeviceArray(0x1000, (4,), "float32")
    with raises(ValueError, "address=-1"):
        epfuse.DeviceArray(-1, (4,))
    with raises(TypeError, "address"):
        epfuse.DeviceArray(4096.0, (4,))
    with raises(ValueError, "strides"):
        epfuse.DeviceArray(0x1000, (4, 4), "<i4", strides=(16,))
    a = epfuse.DeviceArray(0x1000, (4, 4), "<i4", device=1)
    assert epfuse.describe(a).device == 1


# ---- buffers: HT ------------------------------------------------------------------------------------------
def ht_inputs(count=R, rows=T, idx="i64", k=K):
    lead = (count,) if count > 1 else ()
    return (cai(lead + (rows, H)), cai(lead + (rows, k), idx), cai(lead + (rows, k), "f32"))


def test_ht_dispatch_good_inputs_reach_c(launchers):
    g = fake_group()
    h = fake_handle(g)
    x, idx, w = ht_inputs()
    h.update(idx)
    s = struct_arg(launchers.epf_route_update.calls[0], _abi.RouteStep)
    assert s.num_tokens == T and s.topk_idx == idx.ptr and h.num_tokens == T
    g.dispatch(h, x, idx, w)
    call = launchers.epf_ht_dispatch.calls[0]
    s = struct_arg(call, _abi.HtStep)
    assert s.x == x.ptr and s.topk_weights == w.ptr and call[4] == idx.ptr and s.blocks_per_rank == 0
    # the same through DLPack (PyTorch's bfloat16 route)
    g.dispatch(h, DLPack((R, T, H), *BF16_DL), DLPack((R, T, K), *I64_DL), DLPack((R, T, K), *F32_DL))
    assert len(launchers.epf_ht_dispatch.calls) == 2


@pytest.mark.parametrize("which,bad,words", [
    ("x", cai((R, T, H), "f32"), ["x must be bfloat16", "float32"]),
    ("x", cai((R, T, H), "f16"), ["float16 is another format"]),
    ("x", cai((R, T, H + 8)), ["x must be [4][T][H]", "(4, 16, 264)"]),
    ("x", cai((R * T, H)), ["x must be [4][T][H]"]),
    ("x", cai((R, T - 1, H)), ["x has 15 rows per rank", "exactly 16"]),
    ("x", transposed((R, T, H)), ["C-contiguous", "transposed"]),
    ("x", cai((R, T, H), device=1), ["x is on cuda:1", "cuda:0"]),
    ("x", DLPack((R, T, H), *BF16_DL, device_id=1), ["cuda:1"]),
    ("x", DLPack((R, T, H), *BF16_DL, device_type=1), ["cpu memory"]),
    ("x", DLPack((R, H, T), *BF16_DL, strides=(H * T, 1, H)), ["C-contiguous"]),
    ("x", cai((R, T, H), ptr=0x7f0000000008), ["x at 0x7f0000000008 is not 16-byte aligned"]),
    ("x", cai((R, T, H), ptr=0x7f0000000001), ["not aligned to its 2-byte uint16 elements"]),
    ("topk_weights", cai((R, T, K), "f32", ptr=0x7f0000000002), ["not aligned to its 4-byte float32"]),
    ("x", None, ["x is required"]),
    ("x", 0, ["x is required"]),
    ("topk_idx", cai((R, T, K), "i32"), ["topk_idx must be int64", "handle's index dtype", "int32"]),
    ("topk_idx", DLPack((R, T, K), *I32_DL), ["topk_idx must be int64"]),
    ("topk_idx", cai((R, T, K + 1), "i64"), ["topk_idx must be"]),
    ("topk_weights", cai((R, T, K), "f64"), ["topk_weights must be float32"]),
    ("topk_weights", cai((R, T, K - 1), "f32"), ["topk_weights must be"]),
    ("topk_weights", None, ["topk_weights is required"]),
])
def test_ht_dispatch_bad_buffers(launchers, which, bad, words):
    g = fake_group()
    h = fake_handle(g)
    args = dict(zip(("x", "topk_idx", "topk_weights"), ht_inputs()))
    args[which] = bad
    with raises(ValueError, "Group.dispatch", *words):
        g.dispatch(h, args["x"], args["topk_idx"], args["topk_weights"])
    assert not launchers.epf_ht_dispatch.calls


def test_not_a_buffer_is_a_type_error(launchers):
    g = fake_group()
    h = fake_handle(g)
    x, idx, w = ht_inputs()
    with raises(TypeError, "x is a str"):
        g.dispatch(h, "x", idx, w)
    with raises(TypeError, "x is a list"):
        g.dispatch(h, [0] * 16, idx, w)


def test_raw_addresses_are_the_unchecked_escape_hatch(launchers):
    g = fake_group()
    h = fake_handle(g)
    h.update(0x2000)
    assert struct_arg(launchers.epf_route_update.calls[0], _abi.RouteStep).num_tokens == T  # the handle's max
    g.dispatch(h, 0x1000, 0x2000, 0x3000)
    s = struct_arg(launchers.epf_ht_dispatch.calls[0], _abi.HtStep)
    assert s.x == 0x1000 and s.topk_weights == 0x3000
    with raises(ValueError, "x=-1"):
        g.dispatch(h, -1, 0x2000, 0x3000)
    with raises(ValueError, "18446744073709551616"):
        g.dispatch(h, 2**64, 0x2000, 0x3000)


def test_update_num_tokens_from_rows_one_rank(launchers):
    g = fake_group(count=1, nranks=R)
    h = fake_handle(g)
    x, idx, w = ht_inputs(count=1, rows=5)
    h.update(idx)  # [T][K] without the leading [1]
    assert struct_arg(launchers.epf_route_update.calls[-1], _abi.RouteStep).num_tokens == 5  # not the plan's 16
    h.update(cai((1, 5, K), "i64"), 3)
    assert struct_arg(launchers.epf_route_update.calls[-1], _abi.RouteStep).num_tokens == 3
    with raises(ValueError, "num_tokens=6", "only 5 rows"):
        h.update(idx, 6)
    with raises(ValueError, "num_tokens=17", "[0, 16]"):
        h.update(cai((20, K), "i64"), 17)
    with raises(ValueError, "20 rows", "max_tokens=16"):
        h.update(cai((20, K), "i64"))
    with raises(TypeError, "num_tokens"):
        h.update(idx, 5.0)
    h.update(idx, 0)  # no tokens this step is valid
    # dispatch then needs the update's rows, not the plan's maximum
    h.update(idx)
    g.dispatch(h, cai((5, H)), idx, cai((5, K), "f32"))
    with raises(ValueError, "x has 4 rows", "reads or writes 5"):
        g.dispatch(h, cai((4, H)), idx, cai((5, K), "f32"))
    with raises(ValueError, "x must be [1][T][H]"):
        g.dispatch(h, cai((2, 5, H)), idx, cai((5, K), "f32"))


def test_update_with_device_token_counts(launchers):
    g = fake_group()
    h = fake_handle(g)
    _, idx, _ = ht_inputs()
    n = cai((R,), "i32")
    h.update(idx, num_tokens_per_rank=n)
    s = struct_arg(launchers.epf_route_update.calls[-1], _abi.RouteStep)
    assert s.num_tokens_dev == n.ptr and h.num_tokens == T
    with raises(ValueError, "not both"):
        h.update(idx, 3, num_tokens_per_rank=n)
    with raises(ValueError, "num_tokens_per_rank must be int32"):
        h.update(idx, num_tokens_per_rank=cai((R,), "i64"))
    with raises(ValueError, "num_tokens_per_rank has 12 bytes"):
        h.update(idx, num_tokens_per_rank=cai((R - 1,), "i32"))


def test_int32_ids_on_an_int64_handle(launchers):
    g = fake_group()
    h64, h32 = fake_handle(g, "int64"), fake_handle(g, "int32")
    ids32, ids64 = cai((R, T, K), "i32"), cai((R, T, K), "i64")
    with raises(ValueError, "topk_idx must be int64", "got int32"):
        h64.update(ids32)
    with raises(ValueError, "topk_idx must be int32", "got int64"):
        h32.update(ids64)
    h32.update(ids32)
    assert launchers.epf_route_update.calls


def test_handle_arguments(launchers):
    g = fake_group()
    h = fake_handle(g)
    with raises(ValueError, "blocks_per_rank=0"):
        h.update(ht_inputs()[1], blocks_per_rank=0)
    with raises(ValueError, "blocks_per_rank=33", "max_blocks"):
        h.update(ht_inputs()[1], blocks_per_rank=33)
    with raises(ValueError, "index=4", "[0, 3]"):
        h.header(4)
    with raises(ValueError, "array_id=99"):
        h.array(99)
    with raises(TypeError, "handle must be a Handle"):
        g.dispatch(None, *ht_inputs())
    with raises(ValueError, "another group"):
        fake_group().dispatch(h, *ht_inputs())
    with raises(ValueError, "halves='sideways'"):
        g.dispatch(h, *ht_inputs(), halves="sideways")
    with raises(ValueError, "blocks_per_rank=0"):
        g.dispatch(h, *ht_inputs(), blocks_per_rank=0)
    with raises(ValueError, "blocks_per_rank=1025"):
        g.dispatch(h, *ht_inputs(), blocks_per_rank=1025)
    with raises(TypeError, "stream"):
        g.dispatch(h, *ht_inputs(), stream=True)
    with raises(ValueError, "stream=-1"):
        g.dispatch(h, *ht_inputs(), stream=-1)
    with raises(TypeError, "not a CUDA stream"):
        g.dispatch(h, *ht_inputs(), stream="default")
    g.dispatch(h, *ht_inputs(), stream=types.SimpleNamespace(cuda_stream=0x55))
    assert launchers.epf_ht_dispatch.calls[-1][-1] == 0x55


def test_ht_combine_expert_rows_from_the_buffer(launchers):
    g = fake_group()
    h = fake_handle(g)
    x, idx, w = ht_inputs()
    cap = g.plan.recv_capacity
    out = cai((R, T, H))
    g.combine(h, out, idx, w, expert_out=cai((R, cap, H)))
    s = struct_arg(launchers.epf_ht_combine.calls[-1], _abi.HtStep)
    assert s.expert_rows == cap and s.out == out.ptr  # was: 0 unless the caller repeated it
    g.combine(h, out, idx, w)  # pull: no expert_out
    assert struct_arg(launchers.epf_ht_combine.calls[-1], _abi.HtStep).expert_out is None
    gm = fake_group(combine_payload="mxfp8")
    with raises(ValueError, "expert_out is required"):
        gm.combine(fake_handle(gm), out, idx, w)
    with raises(ValueError, "expert_out has 16 rows per rank", f"at least {cap}"):
        g.combine(h, out, idx, w, expert_out=cai((R, 16, H)))
    with raises(ValueError, "expert_rows without expert_out"):
        g.combine(h, out, idx, w, expert_rows=cap)
    with raises(ValueError, "expert_out has"):
        g.combine(h, out, idx, w, expert_out=cai((R, cap + 8, H)), expert_rows=cap)  # virtual ranks: the stride
    with raises(ValueError, "expert_out must be bfloat16"):
        g.combine(h, out, idx, w, expert_out=cai((R, cap, H), "f32"))
    with raises(ValueError, "out must be bfloat16"):
        g.combine(h, cai((R, T, H), "f32"), idx, w)
    with raises(TypeError, "pass expert_rows="):
        g.combine(h, out, idx, w, expert_out=0x5000)
    g.combine(h, out, idx, w, expert_out=0x5000, expert_rows=cap)


def test_ht_backward_and_quantized_buffers(launchers):
    g = fake_group(payload="mxfp8")
    h = fake_handle(g)
    x, idx, w = ht_inputs()
    rb, sb = g.plan.row_bytes, g.plan.scale_bytes_per_row
    g.dispatch(h, cai((R, T, rb), "u8"), idx, w, x_quantized=True, x_scales=cai((R, T, sb), "u8"))
    with raises(ValueError, "x_scales is required"):
        g.dispatch(h, cai((R, T, rb), "u8"), idx, w, x_quantized=True)
    gq = fake_group()
    with raises(ValueError, "x_quantized=True needs a quantized payload"):
        gq.dispatch(fake_handle(gq), x, idx, w, x_quantized=True)
    with raises(ValueError, "x_scales goes with x_quantized"):
        g.dispatch(h, x, idx, w, x_scales=cai((R, T, sb), "u8"))
    with raises(ValueError, "x must be"):
        g.dispatch(h, cai((R, T, rb + 1), "u8"), idx, w, x_quantized=True, x_scales=cai((R, T, sb), "u8"))
    gb = fake_group()
    hb = fake_handle(gb)
    cap = gb.plan.recv_capacity
    gb.dispatch_backward(hb, x, idx, w, expert_out=cai((R, cap, H)), weight_grad=cai((R, cap), "f32"),
                         topk_weights_grad=cai((R, T, K), "f32"))
    s = struct_arg(launchers.epf_ht_dispatch_backward.calls[-1], _abi.HtStep)
    assert s.expert_rows == cap and s.topk_idx == idx.ptr
    with raises(ValueError, "weight_grad must be float32"):
        gb.dispatch_backward(hb, x, idx, w, expert_out=cai((R, cap, H)), weight_grad=cai((R, cap), "bf16"),
                             topk_weights_grad=cai((R, T, K), "f32"))
    with raises(ValueError, "topk_weights_grad must be"):
        gb.dispatch_backward(hb, x, idx, w, weight_grad=cai((R, cap), "f32"),
                             topk_weights_grad=cai((R, T, K + 1), "f32"))
    with raises(ValueError, "both or neither"):
        gb.dispatch_backward(hb, x, idx, w, topk_weights_grad=cai((R, T, K), "f32"))
    # in place (no expert_out): the rows come from weight_grad, at least recv_capacity of them
    gb.dispatch_backward(hb, x, idx, None, weight_grad=cai((R, cap), "f32"), topk_weights_grad=cai((R, T, K), "f32"))
    assert struct_arg(launchers.epf_ht_dispatch_backward.calls[-1], _abi.HtStep).expert_rows == cap
    with raises(ValueError, "weight_grad has 8 rows per rank", f"at least {cap}"):
        gb.dispatch_backward(hb, x, idx, None, weight_grad=cai((R, 8), "f32"), topk_weights_grad=cai((R, T, K), "f32"))
    grm = fake_group(layout="rank_major")
    with raises(ValueError, "expert_out is required for a rank-major plan"):
        grm.dispatch_backward(fake_handle(grm), x, idx, w)
    gb.combine_backward(hb, x, idx, w)
    with raises(ValueError, "dy must be bfloat16"):
        gb.combine_backward(hb, cai((R, T, H), "f32"), idx, w)


def test_ht_expand_rows_from_the_view(launchers):
    g = fake_group(layout="rank_major")
    h = fake_handle(g)
    view = cai((R, 100, g.plan.row_bytes), "u8")
    g.expand(h, view)
    assert struct_arg(launchers.epf_ht_expand.calls[-1], _abi.HtStep).expert_rows == 100
    with raises(ValueError, "em_view"):
        g.expand(h, cai((R, 100, H), "f32"))  # 4 * 256 bytes per row, not the payload's 512
    with raises(ValueError, "expert_rows=0"):
        g.expand(h, view, 0)


# ---- handle memory -----------------------------------------------------------------------------------------
def test_init_handle_passes_the_buffers_real_size(launchers):
    g = fake_group()
    need = g.handle_mem_size("expert_major", K)
    mem = cai((need + 4096,), "u8", ptr=0x7f0000200000)
    h = g.init_handle("expert_major", K, mem)
    call = launchers.epf_route_init.calls[-1]
    assert call[2] == mem.ptr and call[3] == need + 4096 and isinstance(h, epfuse.Handle)
    # a 1-byte buffer: was a 33,792-byte memset into it; now refused before C
    with raises(ValueError, "handle_mem has 1 bytes", f"touches {need}"):
        g.init_handle("expert_major", K, cai((1,), "u8"))
    with raises(ValueError, "handle_mem has"):
        g.init_handle("expert_major", K, cai((need // 8 - 1,), "i64"))
    with raises(ValueError, "256-byte aligned"):
        g.init_handle("expert_major", K, cai((need,), "u8", ptr=0x7f0000200010))
    with raises(ValueError, "C-contiguous"):
        g.init_handle("expert_major", K, cai((need // 2, 2), "u8", strides=(1, need // 2)))
    with raises(ValueError, "num_topk=5", "[1, 4]"):
        g.init_handle("expert_major", 5, mem)
    with raises(ValueError, "num_topk=0"):
        g.handle_mem_size("expert_major", 0)
    with raises(ValueError, "max_tokens=0"):
        g.handle_mem_size("expert_major", K, max_tokens=0)
    with raises(ValueError, "max_tokens=17"):
        g.handle_mem_size("expert_major", K, max_tokens=17)
    with raises(ValueError, "index_dtype='int16'"):
        g.handle_mem_size("expert_major", K, "int16")
    np = pytest.importorskip("numpy")
    assert g.handle_mem_size("expert_major", K, np.int32) == g.handle_mem_size("expert_major", K, "int32")
    assert len(launchers.epf_route_init.calls) == 1


def test_import_handle_passes_the_buffers_real_size(launchers, monkeypatch):
    g = fake_group()
    need = g.handle_mem_size("expert_major", K)

    def fake_import(plan, p, nbytes, count, stream, out):
        launchers.epf_route_import.calls.append((p, nbytes, count))
        rc = g._route_config(K, "int64", None, "t")
        _abi.epf_route_layout_compute(plan, ctypes.byref(rc), ctypes.byref(out._obj.layout))
        out._obj.count = count
        return 0
    monkeypatch.setattr(_abi, "epf_route_import", fake_import)
    mem = cai((need + 512,), "u8")
    h = g.import_handle("expert_major", epfuse.HandleState(T, K, "int64"), mem)
    assert launchers.epf_route_import.calls[-1] == (mem.ptr, need + 512, R) and h.num_tokens == T
    with raises(ValueError, "mem has 1 bytes"):
        g.import_handle("expert_major", epfuse.HandleState(T, K, "int64"), cai((1,), "u8"))
    with raises(ValueError, "state.num_tokens=17"):
        g.import_handle("expert_major", epfuse.HandleState(17, K, "int64"), mem)
    with raises(TypeError, "HandleState"):
        g.import_handle("expert_major", (T, K, "int64"), mem)


# ---- buffers: LL ------------------------------------------------------------------------------------------
def ll_inputs(g, rows=T, idx="i64"):
    lead = (g.count,) if g.count > 1 else ()
    EL = E // g.nranks
    return (cai(lead + (rows, H)), cai(lead + (rows, K), idx), cai(lead + (rows, K), "f32"),
            cai((g.count, EL, g.nranks), "i32"))


def test_ll_index_dtype_and_tokens_come_from_the_tensors(launchers):
    g = fake_group(mode="ll")
    x, idx, w, counts = ll_inputs(g, idx="i32")
    g.ll_dispatch(x, idx, w, counts)
    a = struct_arg(launchers.epf_ll_dispatch.calls[-1], _abi.LlDispatchArgs)
    assert a.index_type == _abi.INDEX_TYPE["int32"] and a.num_tokens == T  # was: int64 unless told
    with raises(ValueError, "index_dtype='int64'", "topk_idx is int32"):
        g.ll_dispatch(x, idx, w, counts, index_dtype="int64")
    with raises(ValueError, "topk_idx must be int32 or int64"):
        g.ll_dispatch(x, cai((R, T, K), "u32"), w, counts)
    g1 = fake_group(mode="ll", count=1)
    x1, idx1, w1, c1 = ll_inputs(g1, rows=7)
    g1.ll_dispatch(x1, idx1, w1, c1)
    assert struct_arg(launchers.epf_ll_dispatch.calls[-1], _abi.LlDispatchArgs).num_tokens == 7
    with raises(ValueError, "num_tokens=8", "7 rows"):
        g1.ll_dispatch(x1, idx1, w1, c1, num_tokens=8)
    with raises(ValueError, "x has 6 rows", "7"):
        g1.ll_dispatch(cai((6, H)), idx1, w1, c1)
    g1.ll_combine(None, c1, idx1, w1, cai((7, H)), y_layout="in_place_pull")
    a = struct_arg(launchers.epf_ll_combine.calls[-1], _abi.LlCombineArgs)
    assert a.num_tokens == 7 and a.index_type == _abi.INDEX_TYPE["int64"]
    with raises(ValueError, "out has 5 rows"):
        g1.ll_combine(None, c1, idx1, w1, cai((5, H)), y_layout="in_place_pull")


def test_ll_per_rank_buffers(launchers):
    g = fake_group(mode="ll")
    x, idx, w, counts = ll_inputs(g)
    EL = E // R
    with raises(ValueError, "recv_counts must be int32"):
        g.ll_dispatch(x, idx, w, cai((R, EL, R), "i64"))
    with raises(ValueError, "recv_counts has", "touches"):
        g.ll_dispatch(x, idx, w, cai((R * EL * R - 1,), "i32"))
    with raises(ValueError, "leading dimension must be the 4 ranks", "128 bytes apart"):
        g.ll_dispatch(x, idx, w, cai((R, EL * R + 1), "i32"))
    with raises(ValueError, "leading dimension must be the 4 ranks"):
        g.ll_dispatch(x, idx, w, cai((2, 2 * EL * R), "i32"))
    g.ll_dispatch(x, idx, w, cai((R * EL * R,), "i32"))  # flat: fine
    rows = EL * R * T
    y = cai((R, rows, H))
    g.ll_combine(y, counts, idx, w, cai((R, T, H)))
    with raises(ValueError, "y must be bfloat16"):
        g.ll_combine(cai((R, rows, H), "f32"), counts, idx, w, cai((R, T, H)))
    with raises(ValueError, "y: its leading dimension", "262144 bytes apart"):
        g.ll_combine(cai((R, rows - 1, H)), counts, idx, w, cai((R, T, H)))
    with raises(ValueError, "y has", "touches"):
        g.ll_combine(cai((R * rows * H - 1,)), counts, idx, w, cai((R, T, H)))
    with raises(ValueError, "y_layout"):
        g.ll_combine(y, counts, idx, w, cai((R, T, H)), y_layout="sideways")
    with raises(ValueError, "round must be int32 or uint32"):
        g.ll_dispatch(x, idx, w, counts, round=cai((R,), "f32"))
    with raises(ValueError, "halves='none'"):
        g.ll_dispatch(x, idx, w, counts, halves="none")
    with raises(ValueError, "which=11"):
        g.ll_rank_bytes(11)
    assert g.ll_rank_bytes("recv_counts") == EL * R * 4 == g.ll_rank_bytes(3)
    # LL backward buffers
    g.ll_dispatch_backward(None, counts, idx, cai((R, T, H)), y_layout="in_place_pull",
                           topk_weights_grad=cai((R, T, K), "f32"))
    with raises(ValueError, "topk_weights_grad must be float32"):
        g.ll_dispatch_backward(None, counts, idx, cai((R, T, H)), y_layout="in_place_pull",
                               topk_weights_grad=cai((R, T, K), "bf16"))
    g.ll_combine_backward(x, idx, w, counts)
    with raises(ValueError, "dy must be bfloat16"):
        g.ll_combine_backward(cai((R, T, H), "f32"), idx, w, counts)
    # an HT group has no LL calls
    with raises(epfuse.EpfError, "mode='ll'"):
        fake_group().ll_dispatch(x, idx, w, counts)


def test_mask_arguments(launchers):
    g = fake_group(mode="ll")
    words = epfuse.LIMITS["EPF_MASK_WORDS"]
    g.mask_query(cai((R, words), "i32"))
    with raises(ValueError, "out has"):
        g.mask_query(cai((R * words - 1,), "i32"))
    with raises(ValueError, "leading dimension"):
        g.mask_query(cai((R, words - 1), "i32"))
    with raises(ValueError, "out must be int32 or uint32"):
        g.mask_query(cai((R, words), "f32"))
    with raises(ValueError, "rank in mask=4", "[0, 3]"):
        g.mask_update({0, 4})
    with raises(ValueError, "mask[0]=-1"):
        g.mask_update([-1])
    with raises(ValueError, "mask words"):
        g.mask_update([1] * (words + 1))
    g.mask_update({0, 1, 2, 3})
    assert launchers.epf_ll_mask_update.calls


# ---- NCCL bootstraps without a GPU -------------------------------------------------------------------------
@pytest.fixture
def fake_nccl(monkeypatch):
    """The NCCL and CUDA calls of from_nccl / from_comm / close, recorded; groups made bare."""
    rec = types.SimpleNamespace(calls=[])

    def log(name, status=0):
        def f(*a):
            rec.calls.append(name)
            return status
        return f
    monkeypatch.setattr(_abi, "HAS_NCCL", True)
    monkeypatch.setattr(_versions, "nccl_problem", lambda *a: None)
    for n in ("epf_nccl_window_create", "epf_nccl_devcomm_create", "epf_nccl_team_query", "epf_nccl_devcomm_destroy",
              "epf_nccl_window_destroy", "epf_nccl_comm_destroy", "epf_cuda_set_device", "epf_cuda_stream_synchronize"):
        monkeypatch.setattr(_abi, n, log(n))

    def init_rank(out, nranks, uid, rank, timeout):
        rec.calls.append("epf_nccl_comm_init_rank")
        rec.init = (nranks, bytes(uid.internal), rank, timeout)
        out._obj.value = 0xC0FFEE
        return 0

    def get_uid(buf, n):
        rec.calls.append("epf_nccl_get_unique_id")
        ctypes.memmove(buf, b"U" * 128, 128)
        return 0

    def get_device(p):
        p._obj.value = 0
        return 0

    def device_count(p):
        p._obj.value = 2
        return 0
    monkeypatch.setattr(_abi, "epf_nccl_comm_init_rank", init_rank)
    monkeypatch.setattr(_abi, "epf_nccl_get_unique_id", get_uid)
    monkeypatch.setattr(_abi, "epf_cuda_get_device", get_device)
    monkeypatch.setattr(_abi, "epf_cuda_device_count", device_count)
    monkeypatch.setattr(epfuse.Group, "_make", classmethod(
        lambda cls, plan, count, team, owner, virtual, device: cls._bare(plan, count, team, virtual, device)))
    return rec


def test_from_nccl_owns_its_communicator(fake_nccl):
    g = epfuse.Group.from_nccl(b"\1" * 128, 2, 1, timeout_s=5, **SHAPE)
    assert fake_nccl.init == (2, b"\1" * 128, 1, 5.0) and g.count == 1 and g.nranks == 2 and g.device == 0
    g.close()
    assert fake_nccl.calls[-3:] == ["epf_nccl_devcomm_destroy", "epf_nccl_window_destroy", "epf_nccl_comm_destroy"]


@pytest.mark.parametrize("comm", [0xABC, ctypes.c_void_p(0xABC), types.SimpleNamespace(ptr=0xABC),
                                  types.SimpleNamespace(comm=ctypes.c_void_p(0xABC))])
def test_from_comm_adopts_and_never_destroys(fake_nccl, monkeypatch, comm):
    asked = []
    monkeypatch.setattr(_abi, "nccl_comm_info", lambda c: asked.append(c) or (4, 3, 1))
    g = epfuse.Group.from_comm(comm, **SHAPE)
    assert asked == [0xABC] and g.nranks == 4 and g.count == 1 and g._nccl[0] == 0xABC and not g._owns_comm
    assert "epf_nccl_comm_init_rank" not in fake_nccl.calls and "epf_cuda_set_device" in fake_nccl.calls
    with g:
        pass
    assert "epf_nccl_comm_destroy" not in fake_nccl.calls
    assert fake_nccl.calls[-2:] == ["epf_nccl_devcomm_destroy", "epf_nccl_window_destroy"]
    g.close()  # twice: nothing more
    assert fake_nccl.calls.count("epf_nccl_window_destroy") == 1


def test_from_comm_checks_what_the_communicator_says(fake_nccl, monkeypatch):
    monkeypatch.setattr(_abi, "nccl_comm_info", lambda c: (4, 3, 1))
    with raises(ValueError, "nranks=8", "communicator says 4"):
        epfuse.Group.from_comm(0xABC, nranks=8, **SHAPE)
    with raises(ValueError, "device=0", "says 1"):
        epfuse.Group.from_comm(0xABC, device=0, **SHAPE)
    with raises(ValueError, "num_experts=30", "nranks=4", "EPF_ERR_EXPERTS_NOT_DIVISIBLE"):
        epfuse.Group.from_comm(0xABC, nranks=4, num_experts=30, top_k=4, hidden=256, max_tokens_per_rank=16)
    monkeypatch.setattr(_abi, "nccl_comm_info", lambda c: None)
    with raises(TypeError, "pass nranks= and rank="):
        epfuse.Group.from_comm(0xABC, **SHAPE)
    g = epfuse.Group.from_comm(0xABC, nranks=2, rank=1, **SHAPE)
    assert g.nranks == 2


def test_from_comm_failure_leaves_the_communicator(fake_nccl, monkeypatch):
    monkeypatch.setattr(_abi, "nccl_comm_info", lambda c: (2, 0, 0))
    monkeypatch.setattr(_abi, "epf_nccl_team_query", lambda *a: 25)  # EPF_ERR_NCCL
    with pytest.raises(epfuse.EpfError):
        epfuse.Group.from_comm(0xABC, **SHAPE)
    assert "epf_nccl_devcomm_destroy" in fake_nccl.calls and "epf_nccl_window_destroy" in fake_nccl.calls
    assert "epf_nccl_comm_destroy" not in fake_nccl.calls
    # the same failure on an owned communicator destroys it
    with pytest.raises(epfuse.EpfError):
        epfuse.Group.from_nccl(b"\1" * 128, 2, 0, **SHAPE)
    assert fake_nccl.calls[-1] == "epf_nccl_comm_destroy"


def fake_torch(monkeypatch, world, rank, gathered_from_others=None):
    """torch / torch.distributed / torch.cuda stand-ins for one rank of a `world`-rank group."""
    log = types.SimpleNamespace(gathers=[], set_device=[])
    dist = types.ModuleType("torch.distributed")
    dist.is_available = lambda: True
    dist.is_initialized = lambda: True
    dist.get_world_size = lambda group=None: world
    dist.get_rank = lambda group=None: rank

    def all_gather_object(out, obj, group=None):
        log.gathers.append((obj, group))
        others = gathered_from_others or {}
        for r in range(world):
            out[r] = obj if r == rank else others.get(r, (None, b"U" * 128 if r == 0 else None))
    dist.all_gather_object = all_gather_object
    cuda = types.SimpleNamespace(current_device=lambda: 0, set_device=lambda d: log.set_device.append(d))
    torch = types.ModuleType("torch")
    torch.distributed, torch.cuda = dist, cuda
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    return log


def test_from_torch_rank0_makes_and_shares_the_id(fake_nccl, monkeypatch):
    log = fake_torch(monkeypatch, world=2, rank=0)
    pg = object()
    g = epfuse.Group.from_torch(pg, **SHAPE)
    assert log.gathers == [((None, b"U" * 128), pg)]
    assert fake_nccl.calls.count("epf_nccl_get_unique_id") == 1
    assert fake_nccl.init == (2, b"U" * 128, 0, 60.0) and g.nranks == 2 and g._owns_comm


def test_from_torch_other_ranks_take_rank0s_id(fake_nccl, monkeypatch):
    log = fake_torch(monkeypatch, world=4, rank=3, gathered_from_others={0: (None, b"Z" * 128)})
    epfuse.Group.from_torch(device=1, **SHAPE)
    assert "epf_nccl_get_unique_id" not in fake_nccl.calls
    assert log.gathers[0][0] == (None, None) and log.set_device == [1]
    assert fake_nccl.init == (4, b"Z" * 128, 3, 60.0)


def test_from_torch_a_failing_rank_fails_every_rank(fake_nccl, monkeypatch):
    fake_torch(monkeypatch, world=2, rank=0, gathered_from_others={1: ("NCCL release mismatch on node b", None)})
    with raises(epfuse.EpfError, "rank 1", "node b"):
        epfuse.Group.from_torch(**SHAPE)
    assert "epf_nccl_comm_init_rank" not in fake_nccl.calls
    # a config error: refused on every rank before the gather
    log = fake_torch(monkeypatch, world=2, rank=1)
    with raises(ValueError, "hidden=0"):
        epfuse.Group.from_torch(num_experts=32, top_k=4, hidden=0, max_tokens_per_rank=16)
    assert log.gathers == []


# ---- the NCCL release check -------------------------------------------------------------------------------
def test_nccl_codes():
    assert _versions.format_nccl_code(22809) == "2.28.9" and _versions.format_nccl_code(23001) == "2.30.1"
    assert _versions.format_nccl_code(2708) == "2.7.8" and _versions.format_nccl_code(None) == "unknown"
    assert _versions.parse_nccl_release("2.28.9") == 22809 and _versions.parse_nccl_release("2.7.8") == 2708
    assert _versions.parse_nccl_release("x") is None


@pytest.mark.parametrize("built,loaded,bad", [
    (22809, 22809, False), (22809, 22803, True), (22809, 22901, True), (22903, 23001, False),
    (22903, 22901, True), (23001, 22809, True),
])
@pytest.mark.parametrize("library_rule", [True, False])
def test_nccl_problem_rule(monkeypatch, built, loaded, bad, library_rule):
    """The library's rule (epf_nccl_version_check) where it exports it, the same rule in Python for
    a library that does not."""
    monkeypatch.setattr(_versions, "nccl_loaded_path", lambda: "/x/libnccl.so.2")
    if not library_rule:
        monkeypatch.setattr(_abi, "epf_nccl_version_check", None, raising=False)
    elif getattr(_abi, "epf_nccl_version_check", None) is None:
        pytest.skip("this libepfuse.so has no epf_nccl_version_check")
    p = _versions.nccl_problem(built, loaded)
    assert (p is not None) == bad
    if bad:
        b, l = _versions.format_nccl_code(built), _versions.format_nccl_code(loaded)
        said = f"running {l}" if library_rule else f"is {l}"
        assert f"built against NCCL {b}" in p and said in p and "/x/libnccl.so.2" in p


@pytest.fixture
def nccl_mismatch(monkeypatch):
    """The loaded NCCL 2.28.3, the build 2.28.9 (through epf_nccl_build_version)."""
    monkeypatch.setattr(_abi, "HAS_NCCL", True)
    monkeypatch.setattr(_abi, "epf_nccl_version", lambda: 22803)
    monkeypatch.setattr(_abi, "epf_nccl_build_version", lambda: 22809, raising=False)


def test_import_warning_names_both_releases(nccl_mismatch):
    with pytest.warns(epfuse.NcclVersionWarning) as w:
        assert epfuse._warn_nccl_mismatch() is not None
    msg = str(w[0].message)
    assert issubclass(epfuse.NcclVersionWarning, RuntimeWarning)
    assert "2.28.9" in msg and "2.28.3" in msg and "show_versions" in msg


def test_nccl_groups_refuse_a_mismatch_before_any_collective(nccl_mismatch, fake_nccl, monkeypatch):
    monkeypatch.setattr(_versions, "nccl_problem", _real_nccl_problem)  # fake_nccl had made it pass
    with raises(epfuse.EpfError, "Group.from_nccl", "2.28.9", "2.28.3"):
        epfuse.Group.from_nccl(b"\0" * 128, 2, 0, **SHAPE)
    with raises(epfuse.EpfError, "Group.from_comm", "2.28.9", "2.28.3"):
        epfuse.Group.from_comm(0xABC, nranks=2, rank=0, **SHAPE)
    log = fake_torch(monkeypatch, world=1, rank=0)
    with raises(epfuse.EpfError, "Group.from_torch", "2.28.9", "2.28.3") as e:
        epfuse.Group.from_torch(**SHAPE)
    assert e.value.name == "EPF_ERR_NOT_SUPPORTED"
    assert not [c for c in fake_nccl.calls if c.startswith("epf_nccl")]
    assert log.gathers[0][0][0] is not None  # the other ranks are told, not left waiting



def test_build_version_falls_back_to_the_file(monkeypatch):
    monkeypatch.setattr(_abi, "HAS_NCCL", True)
    monkeypatch.setattr(_abi, "epf_nccl_build_version", None, raising=False)
    monkeypatch.setattr(_abi, "NCCL_BUILD_VERSION", "2.28.9")
    assert _versions.nccl_build_code() == 22809
    monkeypatch.setattr(_abi, "epf_nccl_build_version", lambda: -1, raising=False)
    assert _versions.nccl_build_code() is None
    monkeypatch.setattr(_abi, "epf_nccl_build_version", lambda: 23001, raising=False)
    assert _versions.nccl_build_code() == 23001


def test_import_warns_in_a_fresh_interpreter(tmp_path):
    # a copy of the library whose build record says 2.28.3 while the NCCL loaded is another release
    if not _abi.HAS_NCCL or _abi.epf_nccl_version is None:
        pytest.skip("library built without NCCL")
    if getattr(_abi, "epf_nccl_build_version", None) is not None:
        pytest.skip("the library reports its build release itself (epfuse_nccl_build.txt not read)")
    loaded = _versions.nccl_loaded_code()
    fake = "2.28.3" if loaded != 22803 else "2.28.4"
    lib = tmp_path / "libepfuse.so.0"
    shutil.copy(os.path.realpath(_abi.LIBRARY_PATH), lib)
    (tmp_path / "epfuse_nccl_build.txt").write_text(fake + "\n")
    env = dict(os.environ, EPFUSE_LIBRARY=str(lib), EPFUSE_NCCL_PRELOAD="0",
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(epfuse.__file__))] + sys.path))
    r = subprocess.run([sys.executable, "-W", "always", "-c", "import epfuse"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "NcclVersionWarning" in r.stderr and fake in r.stderr and _versions.format_nccl_code(loaded) in r.stderr


def test_versions_and_show_versions(capsys):
    v = epfuse.versions()
    assert v["epfuse"] == epfuse.__version__ and v["libepfuse"] == epfuse.get_library()
    assert v["epf_abi_version"] == epfuse.version()
    if _abi.HAS_NCCL:
        assert v["nccl_loaded_code"] == _abi.epf_nccl_version()
        assert v["nccl_build"] == _abi.NCCL_BUILD_VERSION or _abi.NCCL_BUILD_VERSION is None
    assert v["python"] == sys.version.split()[0]
    epfuse.show_versions()
    out = capsys.readouterr().out
    for key in ("epfuse", "libepfuse.so", "epf_abi_version", "NCCL", "CUDA devices", "Python", "torch", "cupy"):
        assert key in out
