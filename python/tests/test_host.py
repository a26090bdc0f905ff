"""Host parts of the Python package: no GPU needed (CI runs these)."""
import ctypes
import ctypes.util
import os

import pytest

import epfuse
from conftest import usable_gpus
from epfuse import _abi


def test_library_and_version():
    assert os.path.exists(epfuse.get_library())
    assert epfuse.version() == _abi.epf_version()
    assert epfuse.version() // 100000 == 0 and epfuse.version() % 100000 // 100 == 1


def test_struct_mirrors_match_the_library():
    # every struct the package passes to the library has the library's size
    for name, (got, want) in _abi.MIRROR_SIZES.items():
        assert got == want, name
    names = {_abi.epf_abi_type_name(i).decode() for i in range(_abi.epf_abi_type_count())}
    assert set(_abi.MIRRORS) <= names
    assert _abi.epf_abi_sizeof(b"epf_nothing_t") == 0


def test_limits():
    assert epfuse.LIMITS["EPF_MAX_RANKS"] == 72
    assert epfuse.LIMITS["EPF_MASK_WORDS"] == (72 + 31) // 32
    assert epfuse.LIMITS["EPF_ALIGN"] == 256


def test_include_and_cmake_dirs():
    if os.environ.get("EPFUSE_LIBRARY") and not os.path.isdir(epfuse.get_include()):
        pytest.skip("EPFUSE_LIBRARY with the source tree's package: no installed headers")
    assert os.path.exists(os.path.join(epfuse.get_include(), "epfuse", "host.h"))
    assert os.path.exists(os.path.join(epfuse.get_include(), "epfuse", "capi.h"))
    assert os.path.exists(os.path.join(epfuse.get_cmake_dir(), "epfuseConfig.cmake"))


def test_plan_real_shapes():
    # gpt-oss-120b-like HT plan, and an LL plan
    p = epfuse.compute_plan(nranks=8, num_experts=128, top_k=4, hidden=2880, max_tokens_per_rank=4096,
                            payload="mxfp8")
    assert p.nranks == 8 and p.experts_per_rank == 16 and p.hidden == 2880
    assert p.row_bytes == 2880 and p.scale_bytes_per_row == 2880 // 32
    assert p.total_bytes % 256 == 0
    regions = p.regions
    assert regions["HEADER"][0] == 0 and regions["RECV_TOKENS"][1] >= p.recv_capacity * p.row_bytes
    assert p.build_signature == _abi.epf_build_signature()
    q = epfuse.compute_plan(nranks=5, num_experts=160, top_k=22, hidden=5120, max_tokens_per_rank=128, mode="ll")
    assert q.mode == 2 and q.top_k == 22
    assert _abi.epf_ll_plan_check(ctypes.byref(q.c)) == 0
    # LL rank-major: an LL plan; rows [2][R][T], combine rows [2][T][R]
    r = epfuse.compute_plan(nranks=5, num_experts=160, top_k=22, hidden=5120, max_tokens_per_rank=128, mode="ll",
                            layout="rank_major")
    assert _abi.epf_ll_plan_check(ctypes.byref(r.c)) == 0 and r.recv_capacity == 5 * 128
    assert _abi.epf_ll_rm_recv_row(ctypes.byref(r.c), 3, 2, 7) == 5 * 128 + 2 * 128 + 7
    assert _abi.epf_ll_rm_combine_row(ctypes.byref(r.c), 2, 9, 4) == 9 * 5 + 4


def test_plan_staged_scales():
    # HT expert-major with GEMM-ready scales: RECV_SCALES = the layout's bytes + one 16-byte aligned
    # compact stage run per row (epf_plan_scales_staged); compact and LL plans have no stage runs
    shape = dict(nranks=8, num_experts=256, top_k=8, hidden=7168, max_tokens_per_rank=64, recv_capacity=4096)
    mn = epfuse.compute_plan(payload="fp8", scale_layout="segment_mn_major", expert_alignment=16, **shape)
    swz = epfuse.compute_plan(payload="mxfp8", scale_layout="swizzled_128x4", expert_alignment=128, **shape)
    cmp = epfuse.compute_plan(payload="fp8", **shape)
    rm = epfuse.compute_plan(payload="mxfp8", scale_layout="swizzled_128x4", layout="rank_major", **shape)
    assert mn.scales_staged and swz.scales_staged and not cmp.scales_staged and not rm.scales_staged
    assert mn.region("RECV_SCALES")[1] == 4096 * 224 + 4096 * 224 and mn.scale_layout_bytes() == 4096 * 224
    assert swz.region("RECV_SCALES")[1] == 4096 * 224 + 4096 * 224 and swz.scale_layout_bytes() == 4096 * 224
    assert cmp.region("RECV_SCALES")[1] == 4096 * 224 == cmp.scale_layout_bytes()
    odd = epfuse.compute_plan(payload="mxfp8", scale_layout="swizzled_128x4", **dict(shape, hidden=2880))
    assert odd.scales_staged  # 90 scale bytes a row: atoms pad to 92 columns, stage runs to 96 bytes
    assert odd.region("RECV_SCALES")[1] == 4096 * 92 + 4096 * 96 and odd.scale_layout_bytes() == 4096 * 92


def test_ll_combine_transport():
    # the LL MXFP8 combine pulls by default (through EXPERT_OUT), pushes with the combine_push flag;
    # the BF16 combine pulls only with y_layout in_place_pull
    shape = dict(nranks=8, num_experts=256, top_k=8, hidden=7168, max_tokens_per_rank=128, mode="ll")
    mx = epfuse.compute_plan(combine_payload="mxfp8", **shape)
    push = epfuse.compute_plan(combine_payload="mxfp8", flags=_abi.FLAG["combine_push"], **shape)
    bf = epfuse.compute_plan(**shape)
    rows = 2 * mx.recv_capacity
    assert mx.region("EXPERT_OUT")[1] == rows * mx.combine_row_bytes
    assert push.region("EXPERT_OUT")[1] == 0 and bf.region("EXPERT_OUT")[1] == 0
    for y in ("fixed", "packed", "in_place", "in_place_pull"):
        assert mx.ll_combine_pulls(y) and not push.ll_combine_pulls(y)
        assert bf.ll_combine_pulls(y) == (y == "in_place_pull")
    # rank-major: never an EXPERT_OUT region; pulls only with packed_pull and BF16 both ways
    rm_mx = epfuse.compute_plan(combine_payload="mxfp8", layout="rank_major", **shape)
    rm_bf = epfuse.compute_plan(layout="rank_major", **shape)
    assert rm_mx.region("EXPERT_OUT")[1] == 0 and rm_bf.region("EXPERT_OUT")[1] == 0
    for y in ("fixed", "packed", "in_place", "in_place_pull", "packed_pull"):
        assert not rm_mx.ll_combine_pulls(y)
        assert rm_bf.ll_combine_pulls(y) == (y == "packed_pull")


SHAPE = dict(nranks=8, num_experts=256, top_k=8, hidden=7168, max_tokens_per_rank=128)


@pytest.mark.parametrize("kw,name", [
    (dict(nranks=3, num_experts=128), "EPF_ERR_EXPERTS_NOT_DIVISIBLE"),
    (dict(top_k=33), "EPF_ERR_TOPK"),
    (dict(hidden=2880, payload="fp8_128"), "EPF_ERR_HIDDEN_ALIGNMENT"),
    (dict(nranks=73, num_experts=73 * 2), "EPF_ERR_RANKS"),
    (dict(mode="ll", recv_capacity=10), "EPF_ERR_RECV_CAPACITY"),
])
def test_bad_configs_raise_with_status(kw, name):
    with pytest.raises(epfuse.EpfError) as e:
        epfuse.compute_plan(**{**SHAPE, **kw})
    assert e.value.name == name
    assert e.value.message == epfuse.status_message(e.value.status)
    assert name in str(e.value)


def test_unknown_names_are_python_errors():
    with pytest.raises(ValueError):
        epfuse.compute_plan(payload="int4", **SHAPE)
    with pytest.raises(TypeError):
        epfuse.compute_plan(hiddn=7168, **SHAPE)


def test_plan_from_another_build_is_refused():
    p = epfuse.compute_plan(nranks=2, num_experts=16, top_k=2, hidden=256, max_tokens_per_rank=8)
    assert _abi.epf_plan_check(ctypes.byref(p.c)) == 0
    p.c.build_signature ^= 1
    assert epfuse.status_name(_abi.epf_plan_check(ctypes.byref(p.c))) == "EPF_ERR_BUILD_MISMATCH"


def test_buffers_and_streams_without_a_gpu_package():
    from epfuse._buffers import ptr, stream_handle
    a = epfuse.DeviceArray(0x1000, (4, 8), "<i4", owner=None)
    assert a.__cuda_array_interface__["data"] == (0x1000, False)
    assert a.nbytes == 128
    assert ptr(a) == 0x1000 and ptr(None) == 0 and ptr(77) == 77
    assert stream_handle(None) == 0 and stream_handle(5) == 5
    with pytest.raises(TypeError):
        ptr("not a buffer")


def test_error_sentence():
    rec = _abi.ErrorRecord()
    rec.status, rec.count, rec.valid, rec.peer, rec.waiter_rank = 21, 1, 1, 2, 0
    rec.wanted, rec.seen, rec.elapsed_ns = 5, 4, 10_000_000_000
    n = _abi.epf_error_describe(ctypes.byref(rec), None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    _abi.epf_error_describe(ctypes.byref(rec), buf, n + 1)
    assert "EPF_ERR_TIMEOUT" in buf.value.decode() and "waiting for rank 2" in buf.value.decode()


@pytest.mark.skipif(usable_gpus() > 0, reason="checks the no-GPU failure path")
def test_without_a_gpu_cuda_errors_say_why():
    with pytest.raises(epfuse.EpfError) as e:
        epfuse.Group.virtual(2, num_experts=16, top_k=2, hidden=256, max_tokens_per_rank=8)
    assert e.value.name == "EPF_ERR_CUDA"
    assert e.value.cuda_error not in (None, 0) and e.value.cuda_message


def test_nccl_wheel_preload_finds_the_wheel(tmp_path, monkeypatch):
    # a fake nvidia-nccl wheel (release 2.97.3) whose libnccl.so.2 is a copy of a loadable library
    # (the C runtime): the preload finds it through the import system and loads it, unless the
    # library was compiled against another release (epfuse_nccl_build.txt beside it)
    libc = ctypes.util.find_library("c")
    if libc is None:
        pytest.skip("no C library name to stand in for libnccl.so.2")
    import shutil
    src = None
    for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"):
        if os.path.exists(os.path.join(d, libc)):
            src = os.path.join(d, libc)
            break
    if src is None:
        pytest.skip("C library file not found")
    site = tmp_path / "site"
    wheel = site / "nvidia" / "nccl"
    (wheel / "lib").mkdir(parents=True)
    (wheel / "include").mkdir()
    (site / "nvidia" / "__init__.py").write_text("")
    (wheel / "__init__.py").write_text("")
    (wheel / "include" / "nccl.h").write_text("#define NCCL_MAJOR 2\n#define NCCL_MINOR 97\n#define NCCL_PATCH 3\n")
    shutil.copy(src, wheel / "lib" / "libnccl.so.2")
    libdir = tmp_path / "lib"
    libdir.mkdir()
    fake_lib = str(libdir / "libepfuse.so.0")
    import sys
    monkeypatch.syspath_prepend(str(site))
    for m in [m for m in sys.modules if m == "nvidia" or m.startswith("nvidia.")]:
        monkeypatch.delitem(sys.modules, m)
    want = str(wheel / "lib" / "libnccl.so.2")
    assert _abi._nccl_header_version(str(wheel / "include")) == "2.97.3"
    assert _abi._nccl_build_version(fake_lib) is None
    assert _abi._preload_nccl_wheel(fake_lib) == want            # no build record: as PyTorch does
    (libdir / "epfuse_nccl_build.txt").write_text("2.97.3\n")
    assert _abi._nccl_build_version(fake_lib) == "2.97.3"
    assert _abi._preload_nccl_wheel(fake_lib) == want            # built against the wheel's release
    (libdir / "epfuse_nccl_build.txt").write_text("2.28.9\n")
    assert _abi._preload_nccl_wheel(fake_lib) is None            # built against another release
    monkeypatch.setenv("EPFUSE_NCCL_PRELOAD", "0")
    (libdir / "epfuse_nccl_build.txt").write_text("2.97.3\n")
    assert _abi._preload_nccl_wheel(fake_lib) is None


def test_nccl_build_version_is_recorded():
    # the package's library records the NCCL it was compiled against (when built with NCCL)
    if not _abi.HAS_NCCL:
        pytest.skip("library built without NCCL")
    if os.environ.get("EPFUSE_LIBRARY"):
        pytest.skip("EPFUSE_LIBRARY: a library from elsewhere")
    v = _abi.NCCL_BUILD_VERSION
    assert v is not None and len(v.split(".")) == 3, v


def test_nccl_wheel_is_the_loaded_nccl():
    # next to a real nvidia-nccl wheel (PyTorch's), the library runs on that wheel's NCCL
    if not _abi.HAS_NCCL or _abi.epf_nccl_version is None:
        pytest.skip("library built without NCCL")
    if _abi.NCCL_WHEEL_LIBRARY is None:
        pytest.skip("no nvidia-nccl wheel preloaded (none here, EPFUSE_NCCL_PRELOAD=0, or built against another release)")
    inc = os.path.join(os.path.dirname(os.path.dirname(_abi.NCCL_WHEEL_LIBRARY)), "include", "nccl.h")
    code = None
    with open(inc) as f:
        for line in f:
            if line.startswith("#define NCCL_VERSION_CODE"):
                code = int(line.split()[2])
    assert code is not None
    assert _abi.epf_nccl_version() == code
