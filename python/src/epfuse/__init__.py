"""epfuse — MoE expert-parallel dispatch and combine from Python.

A thin layer over libepfuse.so (the project's C ABI) through ctypes; no hard dependency on PyTorch
or CuPy (torch is imported only inside Group.from_torch): device buffers are PyTorch tensors or any
DLPack / ``__cuda_array_interface__`` object, streams are handles or ``torch.cuda.Stream`` / CuPy
streams. The API follows NCCL EP's Python facade:

    import epfuse
    g = epfuse.Group.virtual(8, num_experts=256, top_k=8, hidden=7168, max_tokens_per_rank=4096)
    mem = torch.empty(g.handle_mem_size("expert_major", 8), dtype=torch.uint8, device="cuda")
    h = g.init_handle("expert_major", 8, mem, index_dtype="int64")
    h.update(topk_idx, stream=s)                       # route: counts, slots, offsets
    g.dispatch(h, x, topk_idx, topk_weights, stream=s)  # rows into the receive region
    ... experts on g.recv_tokens() segments (h.segments()) -> expert_out ...
    g.combine(h, out, topk_idx, topk_weights, expert_out=eo, stream=s)
    if (e := g.get_async_error()) is not None: raise RuntimeError(e.sentence)

Every call is stream-ordered and enqueues no host synchronisation (except the ones documented:
``Handle.header``, ``Handle.segments_host``), so a round can be captured in a CUDA graph.

Arguments are checked before anything reaches C. Integers: Python ints or integer scalars
(``operator.index``), never bool / float / str (TypeError), within the C field's range and the
library's limits (EpfValueError — a ValueError and an EpfError — naming the argument and the
range); the shape of a configuration (nranks, num_experts, top_k, hidden, max_tokens_per_rank) is
required, with no silent default. Buffers: their dtype, shape, C-contiguity, device and size are
read (PyTorch attributes, DLPack, ``__cuda_array_interface__``) and checked against what the call
touches; token counts default to the tensors' rows. A raw int address is the pointer-level escape
hatch: passed on with no check at all.
"""
from __future__ import annotations

import ctypes
import warnings
from ctypes import byref, c_int, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Optional

from . import _abi, _versions
from ._buffers import (ANY, BF16, F32, I32, INDEX, WORD32, BufferChecks, BufferInfo, DeviceArray, DeviceBuffer,
                       MappedHost, describe, ptr, stream_handle)  # noqa: F401 (ptr: the unchecked address, kept)
from ._checks import (EPF_ERR_ALIGNMENT, EPF_ERR_EXPERTS, EPF_ERR_EXPERTS_NOT_DIVISIBLE, EPF_ERR_FLAGS, EPF_ERR_HIDDEN,
                      EPF_ERR_RANK, EPF_ERR_RANKS, EPF_ERR_RECV_CAPACITY, EPF_ERR_TOKENS, EPF_ERR_TOPK, INT32_MAX,
                      UINT32_MAX, UINT64_MAX, as_int, int_in, optional_int_in, positive_seconds)
from ._errors import (EPF_ERR_INVALID_ARGUMENT, EPF_ERR_NCCL, EPF_ERR_NOT_SUPPORTED, EpfError, EpfValueError,
                      NcclVersionWarning, check, status_message, status_name)

__all__ = ["EpfError", "EpfValueError", "NcclVersionWarning", "Group", "Handle", "HandleState", "PlanInfo",
           "AsyncError", "DeviceArray", "DeviceBuffer", "BufferInfo", "describe", "compute_plan", "device_count",
           "get_include", "get_cmake_dir", "get_library", "get_unique_id", "version", "versions", "show_versions",
           "status_name", "status_message", "LIMITS"]

__version__ = "0.1.0"
LIMITS = dict(_abi.LIMITS)
_MAX_HIDDEN = int(_abi.epf_abi_constant(b"EPF_MAX_HIDDEN"))
if _MAX_HIDDEN < 1:  # not reported by this library: plan_config.h's EPF_MAX_HIDDEN
    _MAX_HIDDEN = 1 << 20
_ROUTE_SEGMENT = 9  # EPF_ROUTE_RECV_SEGMENT
_ROUTE_EXPERT_COUNT = 1


def version() -> int:
    """EPF_VERSION of the loaded libepfuse.so (major * 100000 + minor * 100 + patch)."""
    return int(_abi.epf_abi_version())


def get_library() -> str:
    """Path of the loaded libepfuse.so."""
    return _abi.LIBRARY_PATH


def get_include() -> str:
    """The directory to pass as ``-I`` for the epfuse headers (kernel authors, like pybind11)."""
    import os
    return os.path.join(_abi._HERE, "include")


def get_cmake_dir() -> str:
    """The directory of epfuseConfig.cmake (``-Depfuse_DIR=...``): targets epfuse::epfuse,
    epfuse::nccl, epfuse::capi."""
    import os
    return os.path.join(_abi._HERE, "share", "cmake", "epfuse")


def device_count() -> int:
    """CUDA devices visible to the library (0 without a GPU or driver)."""
    n = c_int(0)
    check(_abi.epf_cuda_device_count(byref(n)), "cudaGetDeviceCount")
    return n.value


def _enum(table: dict, value, what: str) -> int:
    """A name of `table` (case-insensitive) or one of its int values."""
    if isinstance(value, str):
        try:
            return table[value.lower()]
        except KeyError:
            raise EpfValueError(EPF_ERR_INVALID_ARGUMENT,
                                f"epfuse: unknown {what} {value!r}; one of {sorted(table)}") from None
    v = as_int(value, what)
    if v not in table.values():
        raise EpfValueError(EPF_ERR_INVALID_ARGUMENT, f"epfuse: {what}={v} is not one of "
                                                      f"{sorted(set(table.values()))} ({sorted(table)})")
    return v


_REQUIRED = ("nranks", "num_experts", "top_k", "hidden", "max_tokens_per_rank")
_OPTIONAL = ("mode", "layout", "payload", "combine_payload", "scale_layout", "expert_alignment", "recv_capacity",
             "timeout_ns", "flags")


def _config(where: str = "compute_plan", **kw) -> _abi.Config:
    """epf_config_t from keyword arguments, every value checked (see compute_plan)."""
    if "num_topk" in kw:
        if "top_k" in kw:
            raise TypeError(f"epfuse: {where}: give top_k or num_topk (the same field), not both")
        kw["top_k"] = kw.pop("num_topk")
    for k in kw:
        if k not in _REQUIRED and k not in _OPTIONAL:
            raise TypeError(f"epfuse: {where}: unknown configuration field {k!r}; the fields are "
                            f"{', '.join(_REQUIRED + _OPTIONAL)}")
    missing = [k for k in _REQUIRED if kw.get(k) is None]
    if missing:
        raise TypeError(f"epfuse: {where} needs {', '.join(k + '=' for k in missing)} (ints >= 1). These have no "
                        "default: sent to the library as 0 they would silently mean its built-in 1-rank, 256-expert, "
                        "top-8, hidden-7168 plan")
    L = LIMITS
    c = _abi.Config()
    _abi.epf_config_init(byref(c))
    c.nranks = int_in(kw["nranks"], "nranks", 1, L["EPF_MAX_RANKS"], status=EPF_ERR_RANKS, why="EPF_MAX_RANKS",
                      where=where)
    c.num_experts = int_in(kw["num_experts"], "num_experts", 1, L["EPF_MAX_EXPERTS"], status=EPF_ERR_EXPERTS,
                           why="EPF_MAX_EXPERTS", where=where)
    c.top_k = int_in(kw["top_k"], "top_k", 1, L["EPF_MAX_TOPK"], status=EPF_ERR_TOPK, why="EPF_MAX_TOPK",
                     where=where)
    if c.num_experts % c.nranks:
        raise EpfValueError(EPF_ERR_EXPERTS_NOT_DIVISIBLE, f"epfuse: {where}: num_experts={c.num_experts} is not a "
                                                           f"multiple of nranks={c.nranks} (every rank holds "
                                                           "num_experts / nranks experts)")
    if c.top_k > c.num_experts:
        raise EpfValueError(EPF_ERR_TOPK, f"epfuse: {where}: top_k={c.top_k} is more than num_experts="
                                          f"{c.num_experts}: a token is routed to top_k distinct experts")
    c.hidden = int_in(kw["hidden"], "hidden", 1, _MAX_HIDDEN, status=EPF_ERR_HIDDEN, why="EPF_MAX_HIDDEN",
                      where=where)
    c.max_tokens_per_rank = int_in(kw["max_tokens_per_rank"], "max_tokens_per_rank", 1,
                                   L["EPF_MAX_TOKENS_PER_RANK"], status=EPF_ERR_TOKENS,
                                   why="EPF_MAX_TOKENS_PER_RANK", where=where)
    enums = {"mode": (_abi.MODE, "mode"), "layout": (_abi.LAYOUT, "layout"), "payload": (_abi.PAYLOAD, "payload"),
             "combine_payload": (_abi.PAYLOAD, "combine_payload"),
             "scale_layout": (_abi.SCALE_LAYOUT, "scale_layout")}
    for k, (table, what) in enums.items():
        if kw.get(k) is not None:  # None: the library's default
            setattr(c, k, _enum(table, kw[k], what))
    v = optional_int_in(kw.get("expert_alignment"), "expert_alignment", 1, 1024, status=EPF_ERR_ALIGNMENT,
                        why="a power of two; None: 1", where=where)
    if v is not None:
        c.expert_alignment = v
    v = optional_int_in(kw.get("recv_capacity"), "recv_capacity", 1, INT32_MAX, status=EPF_ERR_RECV_CAPACITY,
                        why="receive rows per rank; None: the worst case", where=where)
    if v is not None:
        c.recv_capacity = v
    v = optional_int_in(kw.get("timeout_ns"), "timeout_ns", 1, UINT64_MAX,
                        why="nanoseconds; None: the library's 10 s", where=where)
    if v is not None:
        c.timeout_ns = v
    v = optional_int_in(kw.get("flags"), "flags", 0, UINT32_MAX, status=EPF_ERR_FLAGS, why="epfuse.FLAG bits",
                        where=where)
    if v is not None:
        c.flags = v
    return c


class PlanInfo:
    """A computed window plan (epf_plan_t): every field as an attribute, regions by name."""

    def __init__(self, plan: _abi.Plan):
        self.c = plan

    def __getattr__(self, name):
        return getattr(self.c, name)

    @property
    def regions(self) -> dict:
        out = {}
        for i in range(_abi.REGION_COUNT):
            name = _abi.epf_region_name(i).decode()
            out[name] = (int(self.c.region[i].offset), int(self.c.region[i].bytes))
        return out

    def region(self, name: str):
        return self.regions[name]

    @property
    def scales_staged(self) -> bool:
        """epf_plan_scales_staged: an HT expert-major plan with GEMM-ready scales (swizzled 128x4 or
        segment MN-major). Its RECV_SCALES ends with one compact stage run per row, where the sends
        store and from which the dispatch's receive half rearranges (docs/quant.md)."""
        return bool(_abi.epf_plan_scales_staged(ctypes.byref(self.c)))

    def scale_layout_bytes(self) -> int:
        """Bytes of RECV_SCALES that hold the plan's scale layout (without a staged plan's stage runs,
        which start at epf_plan_recv_scale_stage_offset(plan, 0))."""
        off, nbytes = self.region("RECV_SCALES")
        if self.scales_staged:
            return int(_abi.epf_plan_recv_scale_stage_offset(ctypes.byref(self.c), 0)) - off
        return nbytes

    def ll_combine_pulls(self, y_layout="fixed") -> bool:
        """epf_ll_combine_pulls: does an LL combine with this plan and y layout pull (the sources read
        the outputs from the expert ranks' windows) rather than push? BF16 combine: only with
        y_layout 'in_place_pull'. MXFP8 combine: by default, for every y layout (the expert side
        quantizes into its EXPERT_OUT region); flags=FLAG['combine_push'] makes it push. Rank-major
        plans (no EXPERT_OUT region): only with y_layout 'packed_pull' and BF16 both ways."""
        return bool(_abi.epf_ll_combine_pulls(byref(self.c), _enum(_abi.Y_LAYOUT, y_layout, "y layout")))

    def __repr__(self):
        c = self.c
        return (f"PlanInfo(nranks={c.nranks}, experts={c.num_experts}, top_k={c.top_k}, hidden={c.hidden}, "
                f"T={c.max_tokens_per_rank}, mode={c.mode}, layout={c.layout}, payload={c.payload}, "
                f"recv_capacity={c.recv_capacity}, total_bytes={c.total_bytes})")


def compute_plan(**config) -> PlanInfo:
    """epf_plan_compute: resolve and validate a configuration, lay out one rank's window slice.

    Required (ints >= 1; no default): nranks, num_experts, top_k (or its alias num_topk), hidden,
    max_tokens_per_rank. Optional, None meaning the library's default: mode ('ht' | 'll'), layout
    ('expert_major' | 'rank_major'), payload / combine_payload ('bf16' | 'mxfp8' | 'fp8_128'),
    scale_layout, expert_alignment (1..1024), recv_capacity (>= 1), timeout_ns (>= 1), flags
    (FLAG bits; 0 is no flag). Checked in Python first: TypeError for a non-int (bool, float, str);
    EpfValueError (a ValueError and an EpfError with the library's status, e.g. EPF_ERR_TOPK) for a
    value out of its C field or out of the library's limits (LIMITS: EPF_MAX_RANKS, ...), and for
    top_k > num_experts. Then the library: EpfError (e.g. EPF_ERR_EXPERTS_NOT_DIVISIBLE) for a
    configuration it refuses."""
    c = _config("compute_plan", **config)
    p = _abi.Plan()
    check(_abi.epf_plan_compute(byref(c), byref(p)), "epf_plan_compute")
    return PlanInfo(p)


def _need_nccl(where: str) -> None:
    if not _abi.HAS_NCCL or _abi.epf_nccl_get_unique_id is None:
        raise EpfError(EPF_ERR_NOT_SUPPORTED,
                       f"{where}: this libepfuse.so ({_abi.LIBRARY_PATH}) was built without NCCL")


def _check_nccl_release(where: str) -> None:
    """EpfError (EPF_ERR_NOT_SUPPORTED) naming both releases when the NCCL loaded at run time cannot
    serve this build: called before any collective call."""
    problem = _versions.nccl_problem()
    if problem is not None:
        raise EpfError(EPF_ERR_NOT_SUPPORTED, f"{where}: {problem}")


def get_unique_id() -> bytes:
    """ncclGetUniqueId (128 bytes), for Group.from_nccl; share it with every rank."""
    _need_nccl("get_unique_id")
    buf = ctypes.create_string_buffer(128)
    check(_abi.epf_nccl_get_unique_id(buf, 128), "ncclGetUniqueId")
    return buf.raw


@dataclass
class HandleState:
    """What a handle was made for (NCCL EP's HandleState): tokens, top-k, the id dtype."""
    num_tokens: int
    num_topk: int
    topk_idx_datatype: str = "int64"


@dataclass
class AsyncError:
    """The first device-side error of the group (epf_error_record_t) and its counters."""
    status: int
    name: str
    count: int
    dropped_routes: int
    recv_overflow: int
    masked_ranks: int
    sentence: str


def _index_type(dtype, name: str = "index_dtype") -> int:
    """INDEX_TYPE of "int32" / "int64" (also torch.int32, numpy.int64, numpy dtypes, "<i4")."""
    if isinstance(dtype, str):
        s = dtype
    elif isinstance(dtype, type):
        s = dtype.__name__  # numpy.int32
    else:
        s = str(getattr(dtype, "name", None) or dtype)  # numpy dtype, torch.int64
    s = s.lower().replace("torch.", "")
    if s in ("int32", "i4", "<i4"):
        return _abi.INDEX_TYPE["int32"]
    if s in ("int64", "i8", "<i8", "long"):
        return _abi.INDEX_TYPE["int64"]
    raise EpfValueError(EPF_ERR_INVALID_ARGUMENT, f"epfuse: {name}={dtype!r}: topk_idx ids are int32 or int64")


def _index_name(index_type: int) -> str:
    return "int32" if index_type == _abi.INDEX_TYPE["int32"] else "int64"


def _halves(h, table: dict, where: str) -> int:
    if not isinstance(h, str):
        raise TypeError(f"epfuse: {where}: halves must be 'send', 'recv' or 'both', got {type(h).__name__} {h!r}")
    try:
        return table[h]
    except KeyError:
        raise EpfValueError(EPF_ERR_INVALID_ARGUMENT,
                            f"epfuse: {where}: halves={h!r}; one of 'send', 'recv', 'both'") from None


def _ht_halves(h, where):
    L = _abi.LIMITS
    return _halves(h, {"send": L["EPF_HT_SEND"], "recv": L["EPF_HT_RECV"], "both": L["EPF_HT_BOTH"]}, where)


def _ll_halves(h, where):
    L = _abi.LIMITS
    return _halves(h, {"send": L["EPF_LL_SEND"], "recv": L["EPF_LL_RECV"], "both": L["EPF_LL_BOTH"]}, where)


def _unique_id(unique_id, where: str) -> bytes:
    if not isinstance(unique_id, (bytes, bytearray, memoryview)):
        raise TypeError(f"epfuse: {where}: unique_id must be the 128 bytes of get_unique_id(), got "
                        f"{type(unique_id).__name__}")
    b = bytes(unique_id)
    if len(b) != 128:
        raise EpfValueError(EPF_ERR_INVALID_ARGUMENT, f"epfuse: {where}: unique_id has {len(b)} bytes; "
                                                      "get_unique_id() gives 128")
    return b


def _comm_address(comm, where: str) -> int:
    """An ncclComm_t given as an int, a ctypes c_void_p, or an object holding one in ``ptr``
    (nccl4py's nccl.core.Communicator) or ``comm`` (e.g. a ctypes ncclComm_t attribute)."""
    from ._checks import address
    v = comm
    if not isinstance(v, (int, ctypes.c_void_p)) or isinstance(v, bool):
        for attr in ("ptr", "comm"):
            a = getattr(comm, attr, None)
            if isinstance(a, (int, ctypes.c_void_p)) and not isinstance(a, bool):
                v = a
                break
        else:
            raise TypeError(f"epfuse: {where}: comm must be an ncclComm_t address (an int, a ctypes.c_void_p, or an "
                            f"object with an int .ptr such as nccl4py's Communicator), got {type(comm).__name__}")
    if isinstance(v, ctypes.c_void_p):
        v = v.value or 0
    v = address(v, "comm")
    if v == 0:
        raise EpfValueError(EPF_ERR_INVALID_ARGUMENT, f"epfuse: {where}: comm is NULL (a destroyed or never "
                                                      "initialised communicator)")
    return v


def _select_device(device, where: str) -> int:
    """Make `device` (an int, or None: keep the current one) the current CUDA device; return it."""
    if device is not None:
        d = int_in(device, "device", 0, INT32_MAX, where=where)
        n = c_int(0)
        if _abi.epf_cuda_device_count(byref(n)) == 0 and n.value > 0 and d >= n.value:
            raise EpfValueError(EPF_ERR_INVALID_ARGUMENT, f"epfuse: {where}: device={d} is outside [0, {n.value - 1}] "
                                                          f"(the {n.value} CUDA devices visible)")
        check(_abi.epf_cuda_set_device(d), "cudaSetDevice")
    cur = c_int(-1)
    check(_abi.epf_cuda_get_device(byref(cur)), "cudaGetDevice")
    return cur.value


class Handle:
    """A route (epf_route_t): per-step routing state in caller memory. ``update`` once per step;
    dispatch and combine of that step read it. ``max_tokens`` (rows of topk_idx per rank the route
    holds), ``num_topk`` and ``index_dtype`` say what it was made for; ``num_tokens`` is the token
    count of the last update (None before the first; the route's max_tokens after an update with
    device-side counts)."""

    def __init__(self, group: "Group", route: _abi.Route, mem, index_type: int, num_topk: int):
        self.group, self.route, self.mem = group, route, mem
        self.index_type, self.num_topk = index_type, num_topk
        self.num_tokens: Optional[int] = None

    @property
    def max_tokens(self) -> int:
        return int(self.route.layout.max_tokens)

    @property
    def index_dtype(self) -> str:
        return _index_name(self.index_type)

    def _ids(self, chk: BufferChecks, topk_idx, min_rows=0, required=True):
        """topk_idx checked against this handle: [count][max_tokens][num_topk] of its index dtype."""
        dt = self.index_dtype
        return chk.rows(topk_idx, "topk_idx", width=self.route.layout.top_k, family=((dt,), dt),
                        stride_rows=self.max_tokens, min_rows=min_rows, required=required, width_label="num_topk",
                        dtype_label=f"{dt} (this handle's index dtype: init_handle(index_dtype=...))")

    def update(self, topk_idx, num_tokens: Optional[int] = None, *, num_tokens_per_rank=None,
               blocks_per_rank: Optional[int] = None, stream=None) -> None:
        """epf_route_update: count exchange, slots and offsets for this step's topk_idx
        ([count][T][num_topk] of the handle's index dtype; [T][num_topk] for a group of one rank).
        num_tokens: tokens of every rank, default the tensor's rows (T; at most the handle's
        max_tokens). num_tokens_per_rank: instead, a device int32[count] array read by the kernel
        (topk_idx then needs max_tokens rows). blocks_per_rank: None (enough to fill the device) or
        1 .. the route's max_blocks."""
        where = "Handle.update"
        g = self.group
        chk = g._bufs(where)
        T = self.max_tokens
        p_idx, rows, _ = self._ids(chk, topk_idx)
        s = _abi.RouteStep()
        if num_tokens_per_rank is not None:
            if num_tokens is not None:
                raise EpfValueError(EPF_ERR_INVALID_ARGUMENT, f"epfuse: {where}: give num_tokens or "
                                                              "num_tokens_per_rank, not both")
            if rows is not None and rows < T:
                raise EpfValueError(EPF_ERR_INVALID_ARGUMENT,
                                    f"epfuse: {where}: with num_tokens_per_rank (read on the device, up to the "
                                    f"handle's max_tokens={T}) topk_idx needs {T} rows; it has {rows}")
            s.num_tokens_dev, _ = chk.sized(num_tokens_per_rank, "num_tokens_per_rank", rank_bytes=4, family=I32,
                                            required=True)
            n = T
        else:
            if num_tokens is not None:
                n = int_in(num_tokens, "num_tokens", 0, T, status=EPF_ERR_TOKENS,
                           why="the handle's max_tokens", where=where)
            else:
                n = T if rows is None else rows
                if n > T:
                    raise EpfValueError(EPF_ERR_TOKENS, f"epfuse: {where}: topk_idx has {rows} rows, more than the "
                                                        f"handle's max_tokens={T}; pass num_tokens=")
            if rows is not None and n > rows:
                raise EpfValueError(EPF_ERR_TOKENS, f"epfuse: {where}: num_tokens={n} but topk_idx has only "
                                                    f"{rows} rows")
            s.num_tokens_dev = None
        s.topk_idx = p_idx
        s.num_tokens = n
        s.blocks_per_rank = 0 if blocks_per_rank is None else int_in(
            blocks_per_rank, "blocks_per_rank", 1, int(self.route.layout.max_blocks), why="the route's max_blocks",
            where=where)
        s.recv_total_mapped = None
        s.wait = g._wait()
        check(_abi.epf_route_update(byref(self.route), g.team, byref(g.plan.c), byref(s), stream_handle(stream)),
              "epf_route_update")
        self.num_tokens = n

    def _index(self, index, where):
        return int_in(index, "index", 0, int(self.route.count) - 1, why="the route's buffers", where=where)

    def header(self, index: int = 0, stream=None) -> _abi.RouteHeader:
        """The route header of buffer `index` (synchronises `stream`)."""
        i = self._index(index, "Handle.header")
        h = _abi.RouteHeader()
        check(_abi.epf_route_read_header(byref(self.route), i, stream_handle(stream), byref(h)),
              "epf_route_read_header")
        return h

    def array(self, array_id: int, index: int = 0) -> int:
        """Device address of route array `array_id` (epf_route_array_id_t) of buffer `index`."""
        a = int_in(array_id, "array_id", 0, _abi.ROUTE_ARRAY_COUNT - 1, why="epf_route_array_id_t",
                   where="Handle.array")
        return int(_abi.epf_route_ptr(byref(self.route), self._index(index, "Handle.array"), a) or 0)

    def segments(self) -> DeviceArray:
        """[count][experts_per_rank][4] int32 (begin, count, padded_count, 0) of each rank's local
        experts in the expert-major receive layout (written by update; a device view, no sync)."""
        L = self.route.layout
        el = L.experts_per_rank
        return DeviceArray(self.array(_ROUTE_SEGMENT, 0), (self.route.count, el, 4), "<i4",
                           (L.total_bytes, 16, 4), owner=self, device=self.group.device)

    def segments_host(self, stream=None):
        """segments() copied to the host after synchronising `stream`: list per rank of
        (begin, count, padded_count) per local expert."""
        L = self.route.layout
        el, n = L.experts_per_rank, self.route.count
        check(_abi.epf_cuda_stream_synchronize(stream_handle(stream)), "cudaStreamSynchronize")
        out = []
        for r in range(n):
            buf = (ctypes.c_int32 * (4 * el))()
            check(_abi.epf_cuda_memcpy(ctypes.addressof(buf), self.array(_ROUTE_SEGMENT, r), 16 * el), "cudaMemcpy")
            out.append([(buf[4 * j], buf[4 * j + 1], buf[4 * j + 2]) for j in range(el)])
        return out


class Group:
    """An EP team: the plan, the window (one slice per rank), the team view, the error record and
    the per-rank state the ready-made kernels keep. ``Group.virtual`` plays every rank on one GPU;
    ``Group.from_nccl`` is one real rank of an NCCL communicator it creates, ``Group.from_comm``
    one rank of a communicator the caller owns, ``Group.from_torch`` one rank of a
    ``torch.distributed`` process group. ``count``: ranks this process plays (nranks for virtual
    ranks, 1 otherwise) — the leading dimension of every buffer argument; ``device``: the CUDA
    device the group was made on (buffers on another device are refused)."""

    def __init__(self):
        raise TypeError("use Group.virtual(...), Group.from_nccl(...), Group.from_comm(...) or Group.from_torch(...)")

    @classmethod
    def _bare(cls, plan: PlanInfo, count: int, team: _abi.Team, virtual: bool, device: Optional[int]) -> "Group":
        """A group object with no device resources (what the checks need: plan, count, device)."""
        g = object.__new__(cls)
        g.plan, g.count, g.team, g._window_owner, g.virtual = plan, count, team, None, virtual
        g.nranks, g.device = plan.nranks, device
        g._record, g._mask, g._state, g._ll = None, None, None, None
        g._nccl, g._owns_comm, g._comm_owner = None, False, None
        g._closed = False
        return g

    @classmethod
    def _make(cls, plan: PlanInfo, count: int, team: _abi.Team, window_owner, virtual: bool,
              device: Optional[int]) -> "Group":
        g = cls._bare(plan, count, team, virtual, device)
        g._window_owner = window_owner
        g._record = MappedHost(ctypes.sizeof(_abi.ErrorRecord))
        if plan.mode == _abi.MODE["ht"]:
            g._state = DeviceBuffer(count * _abi.SIZEOF_HT_STATE)
        else:
            check(_abi.epf_ll_plan_check(byref(plan.c)), "epf_ll_plan_check")
            g._state = DeviceBuffer(count * _abi.SIZEOF_LL_STATE)
            g._ll = _abi.epf_ll_launch_make(byref(plan.c), team, g._state.ptr, g._record.device, 1 if virtual else 0)
            check(_abi.epf_ll_state_reset(byref(g._ll), None), "epf_ll_state_reset")
            check(_abi.epf_cuda_stream_synchronize(None), "cudaStreamSynchronize")
        return g

    def _bufs(self, where: str) -> BufferChecks:
        return BufferChecks(f"Group.{where}" if "." not in where else where, self.count, self.device)

    @classmethod
    def virtual(cls, nranks: int, *, device: Optional[int] = None, **config) -> "Group":
        """All `nranks` ranks as virtual ranks on one GPU (one allocation of nranks window slices).
        `config`: the epf_config_t fields as compute_plan takes them — num_experts, top_k (or
        num_topk), hidden and max_tokens_per_rank required; mode 'ht'|'ll', layout
        'expert_major'|'rank_major', payload 'bf16'|'mxfp8'|'fp8_128', combine_payload,
        scale_layout, expert_alignment, recv_capacity, timeout_ns, flags optional (None: the
        library's default). device: the CUDA ordinal (None: the current device)."""
        plan = _plan_for("Group.virtual", nranks, config)
        dev = _select_device(device, "Group.virtual")
        win = DeviceBuffer(plan.total_bytes * plan.nranks)  # zeroed: epochs start at 0
        team = _abi.epf_team_virtual(win.ptr, plan.total_bytes, 0, plan.nranks)
        return cls._make(plan, plan.nranks, team, win, True, dev)

    # ---- one real rank over NCCL --------------------------------------------------------------------
    @staticmethod
    def _rank_args(where, nranks, rank, timeout_s, lsa_barrier_count):
        n = int_in(nranks, "nranks", 1, LIMITS["EPF_MAX_RANKS"], status=EPF_ERR_RANKS, why="EPF_MAX_RANKS",
                   where=where)
        r = int_in(rank, "rank", 0, n - 1, status=EPF_ERR_RANK, why="[0, nranks)", where=where)
        t = positive_seconds(timeout_s, "timeout_s")
        lsa = int_in(lsa_barrier_count, "lsa_barrier_count", 0, INT32_MAX, where=where)
        return n, r, t, lsa

    @classmethod
    def _over_comm(cls, where: str, plan: PlanInfo, comm: int, owned: bool, timeout: float, lsa: int, device: int,
                   keep=None) -> "Group":
        """The group over an NCCL communicator: its symmetric window, the device communicator, the
        team view. Collective. On failure everything made here is undone, and the communicator is
        destroyed only when `owned`."""
        win = _abi.NcclWindow()
        dev = ctypes.create_string_buffer(max(_abi.SIZEOF_DEVCOMM, 1))
        team = _abi.Team()
        have_win = have_dev = False
        try:
            check(_abi.epf_nccl_window_create(comm, plan.total_bytes, timeout, byref(win)), "epf_nccl_window_create")
            have_win = True
            st = _abi.epf_nccl_devcomm_create(comm, lsa, timeout, ctypes.addressof(dev))
            what = "epf_nccl_devcomm_create"
            if st == EPF_ERR_NOT_SUPPORTED and _abi.epf_nccl_version is not None:  # a 2.28 build, another release
                built = _versions.nccl_build_code()
                what += (f" (the NCCL library loaded is {_versions.format_nccl_code(_abi.epf_nccl_version())}; a "
                         f"library built against NCCL {_versions.format_nccl_code(built)} (2.28 headers) needs "
                         "exactly that release at run time: build epfuse against the NCCL it will load, e.g. "
                         "`pip install --no-build-isolation ./python` next to PyTorch)")
            check(st, what)
            have_dev = True
            check(_abi.epf_nccl_team_query(ctypes.addressof(dev), win.window, None, byref(team)), "epf_nccl_team_query")
            g = cls._make(plan, 1, team, None, False, device)
        except BaseException:
            if have_dev:
                _abi.epf_nccl_devcomm_destroy(comm, ctypes.addressof(dev))
            if have_win:
                _abi.epf_nccl_window_destroy(comm, byref(win), timeout)
            if owned:
                _abi.epf_nccl_comm_destroy(comm, timeout)
            raise
        g._nccl = (comm, win, dev, timeout)
        g._owns_comm = owned
        g._comm_owner = keep
        return g

    @classmethod
    def from_nccl(cls, unique_id: bytes, nranks: int, rank: int, *, timeout_s: float = 60.0, device=None,
                  lsa_barrier_count: int = 1, **config) -> "Group":
        """One rank of an NCCL communicator created from `unique_id` (get_unique_id on one rank,
        shared by the caller) in non-blocking mode with a deadline (timeout_s > 0, finite); the
        window is an NCCL symmetric allocation registered for the team. Collective: every rank
        calls it. `config` as Group.virtual. Raises EpfError before any collective call when the
        NCCL loaded at run time cannot serve this build (show_versions() tells both releases).
        close() destroys the communicator."""
        where = "Group.from_nccl"
        _need_nccl(where)
        uid = _unique_id(unique_id, where)
        nranks, rank, timeout, lsa = cls._rank_args(where, nranks, rank, timeout_s, lsa_barrier_count)
        plan = _plan_for(where, nranks, config)
        _check_nccl_release(where)
        return cls._from_unique_id(where, plan, uid, rank, timeout, lsa, device)

    @classmethod
    def _from_unique_id(cls, where, plan, uid: bytes, rank: int, timeout: float, lsa: int, device) -> "Group":
        dev = _select_device(device, where)
        u = _abi.NcclUniqueId()
        ctypes.memmove(u.internal, uid, 128)
        comm = c_void_p()
        check(_abi.epf_nccl_comm_init_rank(byref(comm), plan.nranks, u, rank, timeout), "epf_nccl_comm_init_rank")
        return cls._over_comm(where, plan, comm.value, True, timeout, lsa, dev)

    @classmethod
    def from_comm(cls, comm, *, nranks: Optional[int] = None, rank: Optional[int] = None, device=None,
                  timeout_s: float = 60.0, lsa_barrier_count: int = 1, **config) -> "Group":
        """One rank over an NCCL communicator the caller already has (NCCL EP's
        ``Group.create(comm)``): epfuse makes only its window and device communicator on it, and
        close() leaves the communicator alone (destroy it after the group). Collective.

        comm: the ncclComm_t address — an int, a ctypes.c_void_p, or an object holding it in an
        int ``.ptr`` (nccl4py: ``nccl.core.Communicator.ptr``) or ``.comm``. CuPy's
        ``cupy.cuda.nccl.NcclCommunicator`` does not expose its handle; PyTorch's process groups:
        use Group.from_torch. The communicator must come from the same libnccl.so libepfuse.so
        loaded (``show_versions()`` prints its path), and must not be used by another thread
        during the call. nranks / rank / device: read from the communicator (ncclCommCount,
        ncclCommUserRank, ncclCommCuDevice) where that NCCL is reachable (then a value given must
        agree), else required. `config` as Group.virtual."""
        where = "Group.from_comm"
        _need_nccl(where)
        addr = _comm_address(comm, where)
        _check_nccl_release(where)
        info = _abi.nccl_comm_info(addr)
        if info is None:
            if nranks is None or rank is None:
                raise TypeError(f"epfuse: {where}: pass nranks= and rank= (the communicator could not be asked: "
                                "ncclCommCount / ncclCommUserRank are not reachable through libepfuse.so)")
        else:
            for name, given, got in (("nranks", nranks, info[0]), ("rank", rank, info[1]), ("device", device, info[2])):
                if given is not None and as_int(given, name) != got:
                    raise EpfValueError(EPF_ERR_INVALID_ARGUMENT, f"epfuse: {where}: {name}={given} but the "
                                                                  f"communicator says {got}")
            nranks, rank = info[0], info[1]
            device = info[2] if device is None else device
        nranks, rank, timeout, lsa = cls._rank_args(where, nranks, rank, timeout_s, lsa_barrier_count)
        plan = _plan_for(where, nranks, config)
        dev = _select_device(device, where)
        return cls._over_comm(where, plan, addr, False, timeout, lsa, dev, keep=comm)

    @classmethod
    def from_torch(cls, process_group=None, *, device=None, timeout_s: float = 60.0, lsa_barrier_count: int = 1,
                   **config) -> "Group":
        """One rank per process of a ``torch.distributed`` process group (None: the default group),
        as DeepEP's ``Buffer(group)`` bootstraps: rank 0 of the group makes an NCCL unique id, the
        group shares it (``all_gather_object``, which also carries every rank's readiness, so a rank
        that cannot go on makes every rank raise instead of leaving the others waiting), then every
        rank builds the group as from_nccl does with nranks = the group's size and rank = its rank
        in the group. The process group's own backend may be anything (gloo, nccl); epfuse's
        communicator is its own and close() destroys it. device: the CUDA ordinal (None:
        torch.cuda.current_device(); given, it becomes the current device of torch too). `config`
        as Group.virtual. Collective over the process group."""
        where = "Group.from_torch"
        _need_nccl(where)
        import torch
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise EpfError(EPF_ERR_INVALID_ARGUMENT, f"{where}: torch.distributed is not initialised "
                                                     "(init_process_group first)")
        nranks = dist.get_world_size(process_group)
        rank = dist.get_rank(process_group)
        if rank < 0:
            raise EpfError(EPF_ERR_INVALID_ARGUMENT, f"{where}: this process is not a member of process_group")
        nranks, rank, timeout, lsa = cls._rank_args(where, nranks, rank, timeout_s, lsa_barrier_count)
        plan = _plan_for(where, nranks, config)  # the same on every rank: every rank refuses, nobody waits
        failure, uid, dev = None, None, None
        try:
            _check_nccl_release(where)
            if device is not None:
                torch.cuda.set_device(int_in(device, "device", 0, INT32_MAX, where=where))
            dev = _select_device(torch.cuda.current_device(), where)
            if rank == 0:
                uid = get_unique_id()
        except Exception as e:  # told to every rank below, so none is left waiting in a collective
            failure = e
        gathered = [None] * nranks
        dist.all_gather_object(gathered, (None if failure is None else str(failure), uid), group=process_group)
        if failure is not None:
            raise failure
        for r, (msg, _) in enumerate(gathered):
            if msg is not None:
                raise EpfError(EPF_ERR_NCCL, f"{where}: rank {r} of the process group could not go on: {msg}")
        uid = gathered[0][1]
        if not isinstance(uid, (bytes, bytearray)) or len(uid) != 128:
            raise EpfError(EPF_ERR_NCCL, f"{where}: rank 0 shared no NCCL unique id ({type(uid).__name__})")
        return cls._from_unique_id(where, plan, bytes(uid), rank, timeout, lsa, dev)

    # ---- handles ---------------------------------------------------------------------------------
    def _check_layout(self, layout, num_topk, where) -> int:
        if _enum(_abi.LAYOUT, layout, "layout") != self.plan.layout:
            raise EpfError(14, f"{where}: the group was planned for layout {self.plan.layout}, not {layout!r}")
        return int_in(num_topk, "num_topk", 1, int(self.plan.top_k), status=EPF_ERR_TOPK, why="the plan's top_k",
                      where=where)

    def _route_config(self, num_topk: int, index_dtype, max_tokens, where) -> _abi.RouteConfig:
        rc = _abi.RouteConfig()
        _abi.epf_route_config_init(byref(rc))
        rc.index_type = _index_type(index_dtype)
        rc.top_k = num_topk
        rc.max_tokens = 0 if max_tokens is None else int_in(
            max_tokens, "max_tokens", 1, int(self.plan.max_tokens_per_rank), status=EPF_ERR_TOKENS,
            why="the plan's max_tokens_per_rank; None: that", where=where)
        return rc

    def _route_bytes(self, rc) -> int:
        n = c_uint64(0)
        check(_abi.epf_route_size(byref(self.plan.c), byref(rc), byref(n)), "epf_route_size")
        return int(n.value) * self.count

    def handle_mem_size(self, layout, num_topk: int, index_dtype="int64", max_tokens: Optional[int] = None) -> int:
        """Bytes of handle memory init_handle needs (all of this group's ranks). max_tokens: rows of
        topk_idx per rank the handle holds (None: the plan's max_tokens_per_rank)."""
        where = "Group.handle_mem_size"
        k = self._check_layout(layout, num_topk, where)
        return self._route_bytes(self._route_config(k, index_dtype, max_tokens, where))

    def _handle_mem(self, chk, mem, need, name="handle_mem"):
        p, nbytes = chk.sized(mem, name, rank_bytes=need, count=1, required=True)
        align = LIMITS["EPF_ALIGN"]
        if nbytes is not None and p % align:  # (a raw address: the library's EPF_ERR_ALIGNMENT)
            raise EpfValueError(EPF_ERR_ALIGNMENT, f"epfuse: {chk.where}: {name} at 0x{p:x} is not {align}-byte "
                                                   "aligned (EPF_ALIGN)")
        return p, (need if nbytes is None else nbytes)

    def init_handle(self, layout, num_topk: int, handle_mem, index_dtype="int64", max_tokens: Optional[int] = None,
                    stream=None) -> Handle:
        """epf_route_init over `handle_mem` (a device buffer of at least handle_mem_size bytes,
        256-byte aligned; its own size is what the library is told). Not capturable (it enqueues a
        memset and a kernel; call it once)."""
        where = "Group.init_handle"
        k = self._check_layout(layout, num_topk, where)
        rc = self._route_config(k, index_dtype, max_tokens, where)
        p, nbytes = self._handle_mem(self._bufs(where), handle_mem, self._route_bytes(rc))
        r = _abi.Route()
        check(_abi.epf_route_init(byref(self.plan.c), byref(rc), p, nbytes, self.count, 1, stream_handle(stream),
                                  byref(r)), "epf_route_init")
        return Handle(self, r, handle_mem, rc.index_type, k)

    def import_handle(self, layout, state: HandleState, mem, stream=None, *,
                      max_tokens: Optional[int] = None) -> Handle:
        """epf_route_import: a handle over `mem`, a byte copy of another handle's memory (e.g. kept
        from a forward step). Checks every buffer's header against this group's plan and `state`
        (synchronises `stream`); mem's own size is what the library is told. max_tokens: the
        handle's (None: not checked here; the header says)."""
        where = "Group.import_handle"
        if not isinstance(state, HandleState):
            raise TypeError(f"epfuse: {where}: state must be a HandleState, got {type(state).__name__}")
        k = self._check_layout(layout, state.num_topk, where)
        n = int_in(state.num_tokens, "state.num_tokens", 0, int(self.plan.max_tokens_per_rank), status=EPF_ERR_TOKENS,
                   where=where)
        # the smallest handle that holds state.num_tokens tokens: a buffer below it cannot be one
        least = self._route_config(k, state.topk_idx_datatype,
                                   max(n, 1) if max_tokens is None else max_tokens, where)
        p, nbytes = self._handle_mem(self._bufs(where), mem, self._route_bytes(least), "mem")
        r = _abi.Route()
        check(_abi.epf_route_import(byref(self.plan.c), p, nbytes, self.count, stream_handle(stream), byref(r)),
              "epf_route_import")
        if r.layout.top_k != k or r.layout.index_type != least.index_type or (
                max_tokens is not None and r.layout.max_tokens != least.max_tokens):
            raise EpfError(20, f"the imported handle was made for top-{r.layout.top_k}, index type "
                               f"{_index_name(r.layout.index_type)}, max_tokens {r.layout.max_tokens}; the "
                               f"HandleState says {state}" + (f", max_tokens {max_tokens}" if max_tokens else ""))
        if n > r.layout.max_tokens:
            raise EpfError(EPF_ERR_TOKENS, f"the HandleState's num_tokens {n} is more than the imported handle's "
                                           f"max_tokens {r.layout.max_tokens}")
        h = Handle(self, r, mem, r.layout.index_type, k)
        h.num_tokens = n
        return h

    # ---- the wait context: timeout from the plan, this group's record and mask -------------------
    def _wait(self) -> _abi.Wait:
        w = _abi.epf_wait_make(0, self._record.device if self._record is not None else None, None, 0)
        w.mask = self._mask.ptr if self._mask is not None else None
        return w

    # ---- HT --------------------------------------------------------------------------------------
    def _ht_step(self) -> _abi.HtStep:
        s = _abi.HtStep()
        check(_abi.epf_ht_step_init_sized(byref(s), ctypes.sizeof(s)), "epf_ht_step_init_sized")  # size, magic, version
        s.state = self._state.ptr if self._state is not None else None
        s.wait = self._wait()
        return s

    def _blocks(self, blocks_per_rank, where) -> int:
        if blocks_per_rank is None:
            return 0
        return int_in(blocks_per_rank, "blocks_per_rank", 1, LIMITS["EPF_HT_MAX_BLOCKS_PER_RANK"],
                      why="EPF_HT_MAX_BLOCKS_PER_RANK; None: enough to fill the device", where=where)

    def _handle(self, handle, where) -> Handle:
        if not isinstance(handle, Handle):
            raise TypeError(f"epfuse: {where}: handle must be a Handle (init_handle / import_handle), got "
                            f"{type(handle).__name__}")
        if handle.group is not self:
            raise EpfValueError(EPF_ERR_INVALID_ARGUMENT, f"epfuse: {where}: the handle belongs to another group")
        return handle

    def _ht_tokens(self, chk, h: Handle, name, obj, *, width, family=BF16, width_bytes=False, required=True,
                   width_label="H", align=16):
        """A [count][T][...] token buffer of an HT call: T = the handle's max_tokens per rank with
        virtual ranks; at least the last update's num_tokens rows."""
        return chk.rows(obj, name, width=width, family=family, stride_rows=h.max_tokens, min_rows=h.num_tokens or 0,
                        width_bytes=width_bytes, required=required, width_label=width_label, align=align)[0]

    def _ht_ids_weights(self, chk, h: Handle, topk_idx, topk_weights, s, *, weights_required=True):
        n = h.num_tokens or 0
        p_idx = h._ids(chk, topk_idx, n)[0]
        s.topk_weights = chk.rows(topk_weights, "topk_weights", width=h.route.layout.top_k, family=F32,
                                  stride_rows=h.max_tokens, min_rows=n, required=weights_required,
                                  width_label="num_topk")[0]
        return p_idx

    def _expert_rows(self, chk, obj, name, expert_rows, *, family=BF16, width="H", width_bytes=False,
                     width_label="H", required=False, min_rows=1):
        """A [count][expert_rows][width] expert-side buffer (width None: [count][expert_rows]) and
        its rows per rank: expert_rows defaults to the buffer's rows (with virtual ranks they are
        the per-rank stride, so a value given must equal them; with one rank it may be less)."""
        where = chk.where
        width = int(self.plan.hidden) if width == "H" else width
        if obj is None and not required:
            if expert_rows is not None:
                raise EpfValueError(EPF_ERR_INVALID_ARGUMENT, f"epfuse: {where}: expert_rows without {name}")
            return 0, 0
        want = None if expert_rows is None else int_in(expert_rows, "expert_rows", 1, 2**63 - 1, where=where)
        p, rows, _ = chk.rows(obj, name, width=width, family=family, width_bytes=width_bytes, required=True,
                              stride_rows=want, row_label="expert_rows", width_label=width_label,
                              align=16 if width is not None else 0)
        if rows is None:  # a raw address: the caller says
            if want is None:
                raise TypeError(f"epfuse: {where}: {name} is a raw address: pass expert_rows=")
            rows = want
        if want is None:
            want = rows
        elif want > rows:
            raise EpfValueError(EPF_ERR_INVALID_ARGUMENT, f"epfuse: {where}: expert_rows={want} but {name} has "
                                                          f"{rows} rows")
        if want < min_rows:
            raise EpfValueError(EPF_ERR_INVALID_ARGUMENT, f"epfuse: {where}: {name} has {want} rows per rank; the "
                                                          f"call needs at least {min_rows}")
        return p, want

    def dispatch(self, handle: Handle, x, topk_idx, topk_weights, *, x_scales=None, x_quantized: bool = False,
                 halves: str = "both", blocks_per_rank: Optional[int] = None, stream=None,
                 phases: Optional[str] = None) -> None:
        """HT dispatch (epf_ht_dispatch): every rank's rows into their final receive rows
        (quantized on the way for MXFP8 / FP8-128). x: [count][T][H] BF16 (or the payload's
        row_bytes per row with x_quantized, x_scales [count][T][scale_bytes_per_row]); topk_idx:
        [count][T][num_topk] of the handle's index dtype; topk_weights: [count][T][num_topk]
        float32. T: the handle's max_tokens with virtual ranks (the per-rank stride); for a group
        of one rank at least the update's num_tokens, and the leading [1] may be left out.
        halves: 'send', 'recv' or 'both' (`phases` is the older spelling of the same argument)."""
        where = "Group.dispatch"
        h = self._handle(handle, where)
        p = _ht_halves(phases if phases is not None else halves, where)
        chk = self._bufs(where)
        s = self._ht_step()
        p_idx = self._ht_ids_weights(chk, h, topk_idx, topk_weights, s)
        pl = self.plan
        if x_quantized and pl.payload == _abi.PAYLOAD["bf16"]:
            raise EpfValueError(13, f"epfuse: {where}: x_quantized=True needs a quantized payload; this plan's is bf16")
        if x_quantized:
            s.x = self._ht_tokens(chk, h, "x", x, width=int(pl.row_bytes), family=ANY, width_bytes=True,
                                  width_label="row_bytes")
            s.x_scales = self._ht_tokens(chk, h, "x_scales", x_scales, width=int(pl.scale_bytes_per_row), family=ANY,
                                         width_bytes=True, required=True, width_label="scale_bytes_per_row", align=0)
        else:
            if x_scales is not None:
                raise EpfValueError(EPF_ERR_INVALID_ARGUMENT, f"epfuse: {where}: x_scales goes with x_quantized=True")
            s.x = self._ht_tokens(chk, h, "x", x, width=int(pl.hidden))
        s.x_quantized = 1 if x_quantized else 0
        s.blocks_per_rank = self._blocks(blocks_per_rank, where)
        check(_abi.epf_ht_dispatch(byref(h.route), self.team, byref(pl.c), byref(s), p_idx, p,
                                   stream_handle(stream)), "epf_ht_dispatch")

    def expand(self, handle: Handle, em_view, expert_rows: Optional[int] = None, em_view_scales=None, *,
               blocks_per_rank: Optional[int] = None, stream=None) -> None:
        """RANK_MAJOR: epf_ht_expand, the received rows into the expert-major view em_view
        [count][expert_rows][row_bytes of the payload] (rows at handle.segments()); expert_rows
        defaults to em_view's rows. em_view_scales: [count][expert_rows][scale_bytes_per_row]."""
        where = "Group.expand"
        h = self._handle(handle, where)
        chk = self._bufs(where)
        pl = self.plan
        s = self._ht_step()
        s.em_view, rows = self._expert_rows(chk, em_view, "em_view", expert_rows, family=ANY, width=int(pl.row_bytes),
                                            width_bytes=True, width_label="row_bytes", required=True)
        s.expert_rows = rows
        if em_view_scales is not None:
            s.em_view_scales = chk.rows(em_view_scales, "em_view_scales", width=int(pl.scale_bytes_per_row),
                                        family=ANY, width_bytes=True, stride_rows=rows, min_rows=rows,
                                        row_label="expert_rows", width_label="scale_bytes_per_row")[0]
        s.blocks_per_rank = self._blocks(blocks_per_rank, where)
        check(_abi.epf_ht_expand(byref(h.route), self.team, byref(pl.c), byref(s), stream_handle(stream)),
              "epf_ht_expand")

    def combine(self, handle: Handle, out, topk_idx, topk_weights, *, expert_out=None,
                expert_rows: Optional[int] = None, blocks_per_rank: Optional[int] = None, stream=None) -> None:
        """HT combine (epf_ht_combine): out[t] = sum_k w[t][k] * expert output of (t, k), FP32 in
        k order, BF16 out [count][T][H] (T as dispatch). expert_out: [count][expert_rows][H] BF16
        in the receive (expert-major) row order, expert_rows (default: its rows) at least
        plan.recv_capacity there; RANK_MAJOR: in the expert-major view order. None: BF16
        expert-major outputs written in place over the received rows (pull)."""
        where = "Group.combine"
        h = self._handle(handle, where)
        chk = self._bufs(where)
        pl = self.plan
        s = self._ht_step()
        p_idx = self._ht_ids_weights(chk, h, topk_idx, topk_weights, s)
        s.out = self._ht_tokens(chk, h, "out", out, width=int(pl.hidden))
        least = int(pl.recv_capacity) if pl.layout == _abi.LAYOUT["expert_major"] else 1
        if expert_out is None and not (pl.layout == _abi.LAYOUT["expert_major"] and pl.payload == _abi.PAYLOAD["bf16"]
                                       and pl.combine_payload == _abi.PAYLOAD["bf16"]):
            raise EpfValueError(EPF_ERR_INVALID_ARGUMENT, f"epfuse: {where}: expert_out is required (the in-place pull "
                                                          "needs an expert-major plan with BF16 payloads both ways)")
        s.expert_out, s.expert_rows = self._expert_rows(chk, expert_out, "expert_out", expert_rows, min_rows=least)
        s.blocks_per_rank = self._blocks(blocks_per_rank, where)
        check(_abi.epf_ht_combine(byref(h.route), self.team, byref(pl.c), byref(s), p_idx, stream_handle(stream)),
              "epf_ht_combine")

    # ---- HT training: the backward direction on the forward's route (docs/high-throughput.md) ------
    def combine_backward(self, handle: Handle, dy, topk_idx, topk_weights, *, halves: str = "both",
                         blocks_per_rank: Optional[int] = None, stream=None) -> None:
        """Backward of the HT combine (epf_ht_combine_backward): dy [count][T][H] BF16 into the very
        receive rows of the forward (same handle, no update in between), unweighted; expert-major
        metadata weights become each row's combine weight. Rank-major: then expand() as in the
        forward. BF16 plans only."""
        where = "Group.combine_backward"
        h = self._handle(handle, where)
        p = _ht_halves(halves, where)
        chk = self._bufs(where)
        s = self._ht_step()
        s.topk_idx = self._ht_ids_weights(chk, h, topk_idx, topk_weights, s)
        s.x = self._ht_tokens(chk, h, "dy", dy, width=int(self.plan.hidden))
        s.blocks_per_rank = self._blocks(blocks_per_rank, where)
        check(_abi.epf_ht_combine_backward(byref(h.route), self.team, byref(self.plan.c), byref(s), p,
                                           stream_handle(stream)), "epf_ht_combine_backward")

    def dispatch_backward(self, handle: Handle, dx, topk_idx, topk_weights, *, expert_out=None,
                          expert_rows: Optional[int] = None, weight_grad=None, topk_weights_grad=None,
                          blocks_per_rank: Optional[int] = None, stream=None) -> None:
        """Backward of the HT dispatch (epf_ht_dispatch_backward): the experts' input gradients
        (expert_out: [count][expert_rows][H] BF16 in the forward's expert_out order; None: in place,
        expert-major) back to the tokens with unit weights, repeats adding nothing: dx
        [count][T][H] BF16. weight_grad ([count][expert_rows] float32, d w per row) together with
        topk_weights_grad ([count][T][num_topk] float32, written): the router-weight gradient."""
        where = "Group.dispatch_backward"
        h = self._handle(handle, where)
        chk = self._bufs(where)
        pl = self.plan
        s = self._ht_step()
        s.topk_idx = self._ht_ids_weights(chk, h, topk_idx, topk_weights, s, weights_required=False)
        s.out = self._ht_tokens(chk, h, "dx", dx, width=int(pl.hidden))
        least = int(pl.recv_capacity) if pl.layout == _abi.LAYOUT["expert_major"] else 1
        if expert_out is None and pl.layout != _abi.LAYOUT["expert_major"]:
            raise EpfValueError(EPF_ERR_INVALID_ARGUMENT, f"epfuse: {where}: expert_out is required for a rank-major "
                                                          "plan (in place is expert-major only)")
        if (weight_grad is None) != (topk_weights_grad is None):
            raise EpfValueError(EPF_ERR_INVALID_ARGUMENT, f"epfuse: {where}: weight_grad and topk_weights_grad go "
                                                          "together (both or neither)")
        if expert_out is not None:
            s.expert_out, s.expert_rows = self._expert_rows(chk, expert_out, "expert_out", expert_rows,
                                                            min_rows=least)
            if weight_grad is not None:  # one per expert_out row, in its order
                s.weight_grad = chk.rows(weight_grad, "weight_grad", width=None, family=F32,
                                         stride_rows=s.expert_rows, min_rows=s.expert_rows, row_label="expert_rows")[0]
        elif weight_grad is not None:  # in place: one per receive row
            s.weight_grad, s.expert_rows = self._expert_rows(chk, weight_grad, "weight_grad", expert_rows, family=F32,
                                                             width=None, required=True, min_rows=least)
        elif expert_rows is not None:
            raise EpfValueError(EPF_ERR_INVALID_ARGUMENT, f"epfuse: {where}: expert_rows without expert_out or "
                                                          "weight_grad")
        s.topk_weights_grad = self._ht_tokens(chk, h, "topk_weights_grad", topk_weights_grad,
                                              width=h.route.layout.top_k, family=F32, required=False,
                                              width_label="num_topk", align=0)
        s.blocks_per_rank = self._blocks(blocks_per_rank, where)
        check(_abi.epf_ht_dispatch_backward(byref(h.route), self.team, byref(pl.c), byref(s),
                                            stream_handle(stream)), "epf_ht_dispatch_backward")

    # ---- views of this group's window --------------------------------------------------------------
    def _region_view(self, name: str, row_bytes: int, typestr="|u1", rows=None) -> DeviceArray:
        off, nbytes = self.plan.region(name)
        base = self.team.base if self.virtual else None
        if base is None:
            raise EpfError(26, "window views need virtual ranks (an NCCL group's slice: Group.window_ptr)")
        if rows is None:
            rows = nbytes // row_bytes if row_bytes else 0
        item = int(typestr[2:])
        return DeviceArray(base + off, (self.count, rows, row_bytes // item), typestr,
                           (self.plan.total_bytes, row_bytes, item), owner=self, device=self.device)

    def recv_tokens(self) -> DeviceArray:
        """[count][recv rows][row_bytes] uint8 view of every rank's RECV_TOKENS (BF16 rows: view
        as bfloat16 [.., H])."""
        return self._region_view("RECV_TOKENS", self.plan.row_bytes)

    def recv_scales(self) -> DeviceArray:
        """Every rank's received scales, uint8. COMPACT plans: [count][rows][scale_bytes_per_row],
        row r's scales. Other scale layouts (swizzled 128x4, segment MN-major): [count][1][bytes], the
        layout's bytes (a scale's position: epf_recv_scale_offset), without the stage runs a staged
        plan keeps after them (PlanInfo.scales_staged)."""
        pl = self.plan
        if int(pl.scale_layout) == _abi.SCALE_LAYOUT["compact"] or not int(pl.scale_bytes_per_row):
            return self._region_view("RECV_SCALES", pl.scale_bytes_per_row)
        n = pl.scale_layout_bytes()
        return self._region_view("RECV_SCALES", n, rows=1 if n else 0)

    def recv_meta(self) -> DeviceArray:
        return self._region_view("RECV_META", self.plan.meta_bytes_per_row)

    # ---- LL --------------------------------------------------------------------------------------
    def ll_rank_bytes(self, which, index_dtype="int64") -> int:
        """epf_ll_buffer_bytes: bytes of one rank's LL buffer `which` (an LL_BUFFER name such as
        "recv_counts", or its epf_ll_buffer_t value) — the per-rank stride of LL buffer arguments."""
        if isinstance(which, str):
            w = _enum(_abi.LL_BUFFER, which, "LL buffer")
        else:
            w = int_in(which, "which", 0, max(_abi.LL_BUFFER.values()), why="epf_ll_buffer_t",
                       where="Group.ll_rank_bytes")
        return int(_abi.epf_ll_buffer_bytes(byref(self.plan.c), w, _index_type(index_dtype)))

    def _ll_launch(self, where):
        if self._ll is None:
            raise EpfError(15, f"{where}: this group was planned for mode 'ht'; the LL calls need mode='ll'")
        return self._ll

    def _ll_tokens(self, chk, topk_idx, index_dtype, num_tokens, *, ids_required=True, first=None):
        """topk_idx of an LL call ([count][T][top_k], T = max_tokens_per_rank with virtual ranks),
        its index type (from the tensor; index_dtype must agree) and the call's num_tokens (given,
        else topk_idx's rows, else `first`'s rows — (obj, name, width, family) — else T)."""
        where = chk.where
        pl = self.plan
        T, K = int(pl.max_tokens_per_rank), int(pl.top_k)
        p_idx, rows, dt = chk.rows(topk_idx, "topk_idx", width=K, family=INDEX, stride_rows=T, required=ids_required,
                                   width_label="top_k")
        if dt is not None:
            it = _abi.INDEX_TYPE[dt]
            if index_dtype is not None and _index_type(index_dtype) != it:
                raise EpfValueError(EPF_ERR_INVALID_ARGUMENT, f"epfuse: {where}: index_dtype={index_dtype!r} but "
                                                              f"topk_idx is {dt}")
        else:
            it = _index_type("int64" if index_dtype is None else index_dtype)
        if rows is None and first is not None:
            rows = chk.rows(first[0], first[1], width=first[2], family=first[3], stride_rows=T, required=False)[1]
        if num_tokens is not None:
            n = int_in(num_tokens, "num_tokens", 0, T, status=EPF_ERR_TOKENS, why="max_tokens_per_rank", where=where)
            if rows is not None and n > rows:
                raise EpfValueError(EPF_ERR_TOKENS, f"epfuse: {where}: num_tokens={n} but the token buffers have "
                                                    f"{rows} rows")
        else:
            n = T if rows is None else rows
            if n > T:
                raise EpfValueError(EPF_ERR_TOKENS, f"epfuse: {where}: topk_idx has {rows} rows, more than "
                                                    f"max_tokens_per_rank={T}; pass num_tokens=")
        return p_idx, it, n

    def _ll_rows(self, chk, obj, name, n, *, width=None, family=BF16, required=True, width_label="H"):
        pl = self.plan
        align = 16 if width is None else 0  # BF16 rows: moved 16 bytes at a time
        width = int(pl.hidden) if width is None else width
        return chk.rows(obj, name, width=width, family=family, stride_rows=int(pl.max_tokens_per_rank), min_rows=n,
                        required=required, width_label=width_label, align=align)[0]

    def _ll_sized(self, chk, obj, name, which, it=0, family=ANY, required=False):
        align = 16 if which in ("y", "packed_x", "packed_meta") else 0
        return chk.sized(obj, name, rank_bytes=int(_abi.epf_ll_buffer_bytes(byref(self.plan.c), _abi.LL_BUFFER[which],
                                                                          it)),
                         family=family, required=required, align=align)[0]

    def ll_dispatch(self, x, topk_idx, topk_weights, recv_counts, *, num_tokens: Optional[int] = None,
                    index_dtype=None, expert_counts=None, packed_x=None, packed_scales=None, packed_meta=None,
                    round=None, halves: str = "both", stream=None) -> None:
        """LL dispatch (epf_ll_dispatch), every rank of the group in one launch. x: [count][T][H]
        BF16, topk_idx [count][T][top_k] int32 / int64 (the index dtype is the tensor's;
        index_dtype, if given, must agree), topk_weights [count][T][top_k] float32 or None (1.0);
        T = max_tokens_per_rank with virtual ranks, and the leading [1] may be left out for a group
        of one rank. num_tokens: default topk_idx's rows. recv_counts ([count][EL][R] int32),
        expert_counts, packed_x, packed_scales, packed_meta, round: `count` per-rank buffers of
        ll_rank_bytes each."""
        where = "Group.ll_dispatch"
        launch = self._ll_launch(where)
        chk = self._bufs(where)
        pl = self.plan
        a = _abi.LlDispatchArgs()
        a.topk_idx, a.index_type, a.num_tokens = self._ll_tokens(chk, topk_idx, index_dtype, num_tokens,
                                                                 first=(x, "x", int(pl.hidden), BF16))
        n = a.num_tokens
        a.x = self._ll_rows(chk, x, "x", n)
        a.topk_weights = self._ll_rows(chk, topk_weights, "topk_weights", n, width=int(pl.top_k), family=F32,
                                       required=False, width_label="top_k")
        a.recv_counts = self._ll_sized(chk, recv_counts, "recv_counts", "recv_counts", family=I32)
        a.expert_counts = self._ll_sized(chk, expert_counts, "expert_counts", "expert_counts", family=I32)
        a.packed_x = self._ll_sized(chk, packed_x, "packed_x", "packed_x")
        a.packed_scales = self._ll_sized(chk, packed_scales, "packed_scales", "packed_scales")
        a.packed_meta = self._ll_sized(chk, packed_meta, "packed_meta", "packed_meta")
        a.round = self._ll_sized(chk, round, "round", "round", family=WORD32)
        check(_abi.epf_ll_dispatch(byref(launch), byref(a), _ll_halves(halves, where), stream_handle(stream)),
              "epf_ll_dispatch")

    def ll_expand(self, recv_counts, packed_x=None, packed_scales=None, packed_meta=None, *, stream=None) -> None:
        """LL rank-major expand (epf_ll_expand): the rank-major rows of the last dispatch round each
        rank received, into the expert-major view (packed_x / packed_scales / packed_meta, the packed
        rows of an expert-major receive), with the recv_counts its receive half wrote. A receive half
        given packed outputs expands by itself; this is the separate step."""
        where = "Group.ll_expand"
        launch = self._ll_launch(where)
        chk = self._bufs(where)
        a = _abi.LlDispatchArgs()
        a.recv_counts = self._ll_sized(chk, recv_counts, "recv_counts", "recv_counts", family=I32, required=True)
        a.packed_x = self._ll_sized(chk, packed_x, "packed_x", "packed_x")
        a.packed_scales = self._ll_sized(chk, packed_scales, "packed_scales", "packed_scales")
        a.packed_meta = self._ll_sized(chk, packed_meta, "packed_meta", "packed_meta")
        check(_abi.epf_ll_expand(byref(launch), byref(a), stream_handle(stream)), "epf_ll_expand")

    def ll_combine(self, y, recv_counts, topk_idx, topk_weights, out, *, num_tokens: Optional[int] = None,
                   index_dtype=None, y_layout="fixed", halves: str = "both", stream=None) -> None:
        """LL combine (epf_ll_combine): out[t] = sum_k w * y of (t, k), FP32 in k order, BF16 (an
        expert-major plan); a rank-major plan (layout="rank_major") pre-reduces each token's experts
        on the expert side and sums one partial per (token, rank): y in the view's order,
        y_layout "fixed", "packed" or "packed_pull". y: `count` per-rank BF16 buffers of
        ll_rank_bytes("y") (None for the in-place layouts); topk_idx, topk_weights, out as
        ll_dispatch (out BF16 [count][T][H]); num_tokens: default topk_idx's rows."""
        where = "Group.ll_combine"
        launch = self._ll_launch(where)
        chk = self._bufs(where)
        pl = self.plan
        a = _abi.LlCombineArgs()
        a.y_layout = _enum(_abi.Y_LAYOUT, y_layout, "y_layout")
        a.topk_idx, a.index_type, a.num_tokens = self._ll_tokens(chk, topk_idx, index_dtype, num_tokens,
                                                                 first=(out, "out", int(pl.hidden), BF16))
        n = a.num_tokens
        a.y = self._ll_sized(chk, y, "y", "y", family=BF16)
        a.recv_counts = self._ll_sized(chk, recv_counts, "recv_counts", "recv_counts", family=I32)
        a.topk_weights = self._ll_rows(chk, topk_weights, "topk_weights", n, width=int(pl.top_k), family=F32,
                                       required=False, width_label="top_k")
        a.out = self._ll_rows(chk, out, "out", n)
        check(_abi.epf_ll_combine(byref(launch), byref(a), _ll_halves(halves, where), stream_handle(stream)),
              "epf_ll_combine")

    def ll_combine_backward(self, dy, topk_idx, topk_weights, recv_counts, *, num_tokens: Optional[int] = None,
                            index_dtype=None, expert_counts=None, packed_x=None, packed_meta=None, round=None,
                            halves: str = "both", stream=None) -> None:
        """Backward of the LL combine (epf_ll_combine_backward): an LL dispatch of dy with the
        forward's routing; each row's metadata weight is its combine weight (rank-major: the rows
        carry per-k entries with the forward's weights, and the expand into packed_x / packed_meta
        gives each view row its combine weight). BF16 plans, both layouts. Buffers as ll_dispatch."""
        where = "Group.ll_combine_backward"
        launch = self._ll_launch(where)
        chk = self._bufs(where)
        pl = self.plan
        a = _abi.LlDispatchArgs()
        a.topk_idx, a.index_type, a.num_tokens = self._ll_tokens(chk, topk_idx, index_dtype, num_tokens,
                                                                 first=(dy, "dy", int(pl.hidden), BF16))
        n = a.num_tokens
        a.x = self._ll_rows(chk, dy, "dy", n)
        a.topk_weights = self._ll_rows(chk, topk_weights, "topk_weights", n, width=int(pl.top_k), family=F32,
                                       required=False, width_label="top_k")
        a.recv_counts = self._ll_sized(chk, recv_counts, "recv_counts", "recv_counts", family=I32)
        a.expert_counts = self._ll_sized(chk, expert_counts, "expert_counts", "expert_counts", family=I32)
        a.packed_x = self._ll_sized(chk, packed_x, "packed_x", "packed_x")
        a.packed_meta = self._ll_sized(chk, packed_meta, "packed_meta", "packed_meta")
        a.round = self._ll_sized(chk, round, "round", "round", family=WORD32)
        check(_abi.epf_ll_combine_backward(byref(launch), byref(a), _ll_halves(halves, where), stream_handle(stream)),
              "epf_ll_combine_backward")

    def ll_dispatch_backward(self, dx_rows, recv_counts, topk_idx, dx, *, num_tokens: Optional[int] = None,
                             index_dtype=None, y_layout="fixed", weight_grad=None, topk_weights_grad=None,
                             halves: str = "both", stream=None) -> None:
        """Backward of the LL dispatch (epf_ll_dispatch_backward): dx[t] = sum over the first
        occurrences k of dx_rows of (t, k), FP32 in k order, BF16; optionally the router-weight
        gradient: weight_grad (one FP32 per row, y_layout order) -> topk_weights_grad [T][K].
        Rank-major plans: dx_rows in the view's order (y_layout "fixed", "packed" or
        "packed_pull"); per-rank unit-weight partials, weight_grad one FP32 per view row.
        dx_rows as ll_combine's y, dx as its out."""
        where = "Group.ll_dispatch_backward"
        launch = self._ll_launch(where)
        chk = self._bufs(where)
        pl = self.plan
        a = _abi.LlCombineArgs()
        a.y_layout = _enum(_abi.Y_LAYOUT, y_layout, "y_layout")
        a.topk_idx, a.index_type, a.num_tokens = self._ll_tokens(chk, topk_idx, index_dtype, num_tokens,
                                                                 first=(dx, "dx", int(pl.hidden), BF16))
        n = a.num_tokens
        a.y = self._ll_sized(chk, dx_rows, "dx_rows", "y", family=BF16)
        a.recv_counts = self._ll_sized(chk, recv_counts, "recv_counts", "recv_counts", family=I32)
        a.out = self._ll_rows(chk, dx, "dx", n)
        a.weight_grad = self._ll_sized(chk, weight_grad, "weight_grad", "weight_grad", family=F32)
        a.topk_weights_grad = self._ll_rows(chk, topk_weights_grad, "topk_weights_grad", n, width=int(pl.top_k),
                                            family=F32, required=False, width_label="top_k")
        check(_abi.epf_ll_dispatch_backward(byref(launch), byref(a), _ll_halves(halves, where), stream_handle(stream)),
              "epf_ll_dispatch_backward")

    @staticmethod
    def _halves(h: str) -> int:
        return _ll_halves(h, "Group._halves")

    # ---- fault tolerance: the active mask ----------------------------------------------------------
    def enable_mask(self) -> None:
        """Turn on the active mask: a peer that times out is masked instead of failing every later
        wait. LL keeps the mask in its state; HT in a device word array this group owns."""
        if self._ll is None and self._mask is None:
            words = _abi.LIMITS["EPF_MASK_WORDS"]
            self._mask = DeviceBuffer(4 * words, zero=False)
            self.mask_clean()

    def mask_query(self, out, stream=None) -> None:
        """Copy the mask words into `out` (device, [count][EPF_MASK_WORDS] int32 / uint32 for LL,
        [EPF_MASK_WORDS] for HT). No allocation, no sync: capturable."""
        words = _abi.LIMITS["EPF_MASK_WORDS"]
        chk = self._bufs("Group.mask_query")
        if self._ll is not None:
            p, _ = chk.sized(out, "out", rank_bytes=4 * words, family=WORD32, required=True)
            check(_abi.epf_ll_mask_query_async(byref(self._ll), p, stream_handle(stream)), "epf_ll_mask_query_async")
        else:
            self._need_mask()
            p, _ = chk.sized(out, "out", rank_bytes=4 * words, family=WORD32, required=True, count=1)
            check(_abi.epf_cuda_memcpy_async(p, self._mask.ptr, self._mask.nbytes, stream_handle(stream)),
                  "cudaMemcpyAsync")

    def mask_update(self, mask, stream=None) -> None:
        """Set the mask from host values: a sequence of at most EPF_MASK_WORDS uint32 words (bit r
        = rank r takes part), or the active ranks given as a set (each in [0, nranks))."""
        where = "Group.mask_update"
        words = _abi.LIMITS["EPF_MASK_WORDS"]
        w = (c_uint32 * words)()
        if isinstance(mask, (set, frozenset)):
            for r in mask:
                r = int_in(r, "rank in mask", 0, self.nranks - 1, status=EPF_ERR_RANK, why="[0, nranks)", where=where)
                w[r >> 5] |= 1 << (r & 31)
        else:
            vals = list(mask)
            if len(vals) > words:
                raise EpfValueError(EPF_ERR_INVALID_ARGUMENT, f"epfuse: {where}: {len(vals)} mask words; at most "
                                                              f"EPF_MASK_WORDS={words}")
            for i, v in enumerate(vals):
                w[i] = int_in(v, f"mask[{i}]", 0, UINT32_MAX, why="a uint32 word", where=where)
        if self._ll is not None:
            check(_abi.epf_ll_mask_update(byref(self._ll), w, stream_handle(stream)), "epf_ll_mask_update")
        else:
            self._need_mask()
            check(_abi.epf_cuda_stream_synchronize(stream_handle(stream)), "cudaStreamSynchronize")
            check(_abi.epf_cuda_memcpy(self._mask.ptr, ctypes.addressof(w), 4 * words), "cudaMemcpy")

    def mask_clean(self, stream=None) -> None:
        """Re-admit every rank (LL: epf_ll_mask_clean, collective over the group)."""
        if self._ll is not None:
            check(_abi.epf_ll_mask_clean(byref(self._ll), stream_handle(stream)), "epf_ll_mask_clean")
        else:
            self._need_mask()
            self.mask_update({r for r in range(self.nranks)}, stream)

    def _need_mask(self):
        if self._mask is None:
            raise EpfError(1, "enable_mask() first")

    # ---- errors ------------------------------------------------------------------------------------
    def get_async_error(self) -> Optional[AsyncError]:
        """The error record the device writes (no sync): None while nothing was reported."""
        rec = _abi.ErrorRecord()
        _abi.epf_error_read(ctypes.cast(self._record.host, ctypes.POINTER(_abi.ErrorRecord)), byref(rec))
        if rec.status == 0 and not (rec.dropped_routes or rec.recv_overflow or rec.masked_ranks):
            return None
        n = _abi.epf_error_describe(byref(rec), None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        _abi.epf_error_describe(byref(rec), buf, n + 1)
        return AsyncError(int(rec.status), status_name(rec.status), int(rec.count), int(rec.dropped_routes),
                          int(rec.recv_overflow), int(rec.masked_ranks), buf.value.decode())

    def error_clear(self, stream=None) -> None:
        """Zero the error record after `stream` finished (host write)."""
        check(_abi.epf_cuda_stream_synchronize(stream_handle(stream)), "cudaStreamSynchronize")
        _abi.epf_error_clear(ctypes.cast(self._record.host, ctypes.POINTER(_abi.ErrorRecord)))

    # ---- teardown ----------------------------------------------------------------------------------
    @property
    def window_ptr(self) -> int:
        """Device address of rank 0's slice (virtual) or this rank's slice (NCCL)."""
        return int(self.team.base or 0) if self.virtual else int(self._nccl[1].ptr or 0)

    def close(self) -> None:
        """Release what the group made: for an NCCL group its device communicator and window
        (collective), and the communicator itself unless it was adopted (Group.from_comm)."""
        if self._closed:
            return
        self._closed = True
        nccl = self._nccl
        if nccl is not None:
            comm, win, dev, t = nccl
            _abi.epf_cuda_stream_synchronize(None)
            _abi.epf_nccl_devcomm_destroy(comm, ctypes.addressof(dev))
            st = _abi.epf_nccl_window_destroy(comm, byref(win), t)
            if self._owns_comm:
                st2 = _abi.epf_nccl_comm_destroy(comm, t)
                check(st, "epf_nccl_window_destroy")
                check(st2, "epf_nccl_comm_destroy")
            else:
                check(st, "epf_nccl_window_destroy")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _plan_for(where: str, nranks, config: dict) -> PlanInfo:
    if "nranks" in config:
        raise TypeError(f"epfuse: {where}: nranks is given twice")
    c = _config(where, nranks=nranks, **config)
    p = _abi.Plan()
    check(_abi.epf_plan_compute(byref(c), byref(p)), "epf_plan_compute")
    return PlanInfo(p)


def versions() -> dict:
    """What epfuse runs on, as a dict: the package version, libepfuse.so's path and
    epf_abi_version, the NCCL release it was built against (``nccl_build``, epf_nccl_build_version
    or epfuse_nccl_build.txt) and the one loaded at run time (``nccl_loaded``, its path, and
    ``nccl_problem`` when the two do not go together), CUDA driver and devices, Python, and the
    versions of torch, cupy, numpy, nvidia-nccl and nccl4py where installed (read from their
    metadata: nothing is imported)."""
    return _versions.versions(__version__)


def show_versions(file=None) -> None:
    """Print versions() (like ``nccl.show_versions()``): paste it into bug reports."""
    _versions.show_versions(__version__, file)


def _warn_nccl_mismatch(stacklevel: int = 2) -> Optional[str]:
    """Warn (NcclVersionWarning) when the NCCL loaded at run time cannot serve this build; return
    the sentence, or None. Never raises: importing epfuse must work without NCCL working."""
    try:
        problem = _versions.nccl_problem() if _abi.HAS_NCCL else None
    except Exception:  # a library without the version functions: nothing to say
        return None
    if problem is not None:
        warnings.warn(f"epfuse: {problem}. Group.from_nccl / from_comm / from_torch will refuse to start; "
                      "epfuse.show_versions() shows what was found.", NcclVersionWarning, stacklevel=stacklevel)
    return problem


_warn_nccl_mismatch(stacklevel=2)
