"""epfuse — MoE expert-parallel dispatch and combine from Python.

A thin layer over libepfuse.so (the project's C ABI) through ctypes; no hard dependency on PyTorch
or CuPy: device buffers are any ``__cuda_array_interface__`` / DLPack object, streams are handles
or ``torch.cuda.Stream`` / CuPy streams. The API follows NCCL EP's Python facade:

    import epfuse
    g = epfuse.Group.virtual(8, num_experts=256, top_k=8, hidden=7168, max_tokens_per_rank=4096)
    mem = torch.empty(g.handle_mem_size("expert_major", 8), dtype=torch.uint8, device="cuda")
    h = g.init_handle("expert_major", 8, mem, index_dtype="int64")
    h.update(topk_idx, stream=s)                       # route: counts, slots, offsets
    g.dispatch(h, x, topk_idx, topk_weights, stream=s)  # rows into the receive region
    ... experts on g.recv_tokens() segments (h.segments()) -> expert_out ...
    g.combine(h, out, topk_idx, topk_weights, expert_out=eo, expert_rows=g.plan.recv_capacity, stream=s)
    if (e := g.get_async_error()) is not None: raise RuntimeError(e.sentence)

Every call is stream-ordered and enqueues no host synchronisation (except the ones documented:
``Handle.header``, ``Handle.segments_host``), so a round can be captured in a CUDA graph.
"""
from __future__ import annotations

import ctypes
from ctypes import byref, c_int, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Optional

from . import _abi
from ._buffers import DeviceArray, DeviceBuffer, MappedHost, ptr, stream_handle
from ._errors import EPF_ERR_NOT_SUPPORTED, EpfError, check, status_message, status_name

__all__ = ["EpfError", "Group", "Handle", "HandleState", "PlanInfo", "AsyncError", "DeviceArray", "DeviceBuffer",
           "compute_plan", "device_count", "get_include", "get_cmake_dir", "get_library", "get_unique_id",
           "version", "status_name", "status_message", "LIMITS"]

__version__ = "0.1.0"
LIMITS = dict(_abi.LIMITS)
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
    if isinstance(value, int):
        return value
    try:
        return table[str(value).lower()]
    except KeyError:
        raise ValueError(f"epfuse: unknown {what} {value!r}; one of {sorted(table)}") from None


def _config(**kw) -> _abi.Config:
    c = _abi.Config()
    _abi.epf_config_init(byref(c))
    names = {"nranks", "num_experts", "top_k", "hidden", "max_tokens_per_rank", "expert_alignment", "flags",
             "recv_capacity", "timeout_ns"}
    for k, v in kw.items():
        if k == "num_topk":
            k = "top_k"
        if k == "mode":
            c.mode = _enum(_abi.MODE, v, "mode")
        elif k == "layout":
            c.layout = _enum(_abi.LAYOUT, v, "layout")
        elif k in ("payload", "combine_payload"):
            setattr(c, k, _enum(_abi.PAYLOAD, v, k))
        elif k == "scale_layout":
            c.scale_layout = _enum(_abi.SCALE_LAYOUT, v, "scale layout")
        elif k in names:
            setattr(c, k, int(v))
        else:
            raise TypeError(f"epfuse: unknown configuration field {k!r}")
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
    Raises EpfError (e.g. EPF_ERR_EXPERTS_NOT_DIVISIBLE) for a configuration the library refuses."""
    c = _config(**config)
    p = _abi.Plan()
    check(_abi.epf_plan_compute(byref(c), byref(p)), "epf_plan_compute")
    return PlanInfo(p)


def get_unique_id() -> bytes:
    """ncclGetUniqueId (128 bytes), for Group.from_nccl; share it with every rank."""
    if not _abi.HAS_NCCL:
        raise EpfError(26, "this libepfuse.so was built without NCCL")
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


def _index_type(dtype) -> int:
    s = str(dtype).lower().replace("torch.", "")
    if s in ("int32", "i4", "<i4"):
        return _abi.INDEX_TYPE["int32"]
    if s in ("int64", "i8", "<i8", "long"):
        return _abi.INDEX_TYPE["int64"]
    raise ValueError(f"epfuse: topk_idx dtype {dtype!r}: int32 or int64")


class Handle:
    """A route (epf_route_t): per-step routing state in caller memory. ``update`` once per step;
    dispatch and combine of that step read it."""

    def __init__(self, group: "Group", route: _abi.Route, mem, index_type: int, num_topk: int):
        self.group, self.route, self.mem = group, route, mem
        self.index_type, self.num_topk = index_type, num_topk

    def update(self, topk_idx, num_tokens: Optional[int] = None, *, num_tokens_per_rank=None,
               blocks_per_rank: int = 0, stream=None) -> None:
        """epf_route_update: count exchange, slots and offsets for this step's topk_idx
        ([count][T][top_k] of the handle's dtype; num_tokens defaults to max_tokens_per_rank;
        num_tokens_per_rank: a device int32[count] array read by the kernel instead)."""
        g = self.group
        s = _abi.RouteStep()
        s.topk_idx = ptr(topk_idx)
        s.num_tokens = g.plan.max_tokens_per_rank if num_tokens is None else int(num_tokens)
        s.blocks_per_rank = int(blocks_per_rank)
        s.num_tokens_dev = ptr(num_tokens_per_rank)
        s.recv_total_mapped = None
        s.wait = g._wait()
        check(_abi.epf_route_update(byref(self.route), g.team, byref(g.plan.c), byref(s), stream_handle(stream)),
              "epf_route_update")

    def header(self, index: int = 0, stream=None) -> _abi.RouteHeader:
        """The route header of buffer `index` (synchronises `stream`)."""
        h = _abi.RouteHeader()
        check(_abi.epf_route_read_header(byref(self.route), int(index), stream_handle(stream), byref(h)),
              "epf_route_read_header")
        return h

    def array(self, array_id: int, index: int = 0) -> int:
        """Device address of route array `array_id` (epf_route_array_id_t) of buffer `index`."""
        return int(_abi.epf_route_ptr(byref(self.route), int(index), int(array_id)) or 0)

    def segments(self) -> DeviceArray:
        """[count][experts_per_rank][4] int32 (begin, count, padded_count, 0) of each rank's local
        experts in the expert-major receive layout (written by update; a device view, no sync)."""
        L = self.route.layout
        el = L.experts_per_rank
        return DeviceArray(self.array(_ROUTE_SEGMENT, 0), (self.route.count, el, 4), "<i4",
                           (L.total_bytes, 16, 4), owner=self)

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
    ``Group.from_nccl`` is one real rank of an NCCL communicator."""

    def __init__(self):
        raise TypeError("use Group.virtual(...) or Group.from_nccl(...)")

    @classmethod
    def _make(cls, plan: PlanInfo, count: int, team: _abi.Team, window_owner, virtual: bool):
        g = object.__new__(cls)
        g.plan, g.count, g.team, g._window_owner, g.virtual = plan, count, team, window_owner, virtual
        g.nranks = plan.nranks
        g._record = MappedHost(ctypes.sizeof(_abi.ErrorRecord))
        g._mask = None
        g._closed = False
        if plan.mode == _abi.MODE["ht"]:
            g._state = DeviceBuffer(count * _abi.SIZEOF_HT_STATE)
            g._ll = None
        else:
            check(_abi.epf_ll_plan_check(byref(plan.c)), "epf_ll_plan_check")
            g._state = DeviceBuffer(count * _abi.SIZEOF_LL_STATE)
            g._ll = _abi.epf_ll_launch_make(byref(plan.c), team, g._state.ptr, g._record.device, 1 if virtual else 0)
            check(_abi.epf_ll_state_reset(byref(g._ll), None), "epf_ll_state_reset")
            check(_abi.epf_cuda_stream_synchronize(None), "cudaStreamSynchronize")
        return g

    @classmethod
    def virtual(cls, nranks: int, *, device: Optional[int] = None, **config) -> "Group":
        """All `nranks` ranks as virtual ranks on one GPU (one allocation of nranks window slices).
        `config`: the epf_config_t fields (num_experts, top_k / num_topk, hidden,
        max_tokens_per_rank, mode 'ht'|'ll', layout 'expert_major'|'rank_major', payload
        'bf16'|'mxfp8'|'fp8_128', combine_payload, scale_layout, expert_alignment, recv_capacity,
        timeout_ns, flags)."""
        if device is not None:
            check(_abi.epf_cuda_set_device(int(device)), "cudaSetDevice")
        plan = compute_plan(nranks=nranks, **config)
        win = DeviceBuffer(plan.total_bytes * plan.nranks)  # zeroed: epochs start at 0
        team = _abi.epf_team_virtual(win.ptr, plan.total_bytes, 0, plan.nranks)
        return cls._make(plan, plan.nranks, team, win, True)

    @classmethod
    def from_nccl(cls, unique_id: bytes, nranks: int, rank: int, *, timeout_s: float = 60.0, device=None,
                  lsa_barrier_count: int = 1, **config) -> "Group":
        """One rank of an NCCL communicator created from `unique_id` (get_unique_id on one rank,
        shared by the caller) in non-blocking mode with a deadline; the window is an NCCL symmetric
        allocation registered for the team. Collective: every rank calls it."""
        if not _abi.HAS_NCCL:
            raise EpfError(26, "this libepfuse.so was built without NCCL")
        if device is not None:
            check(_abi.epf_cuda_set_device(int(device)), "cudaSetDevice")
        plan = compute_plan(nranks=nranks, **config)
        uid = _abi.NcclUniqueId()
        ctypes.memmove(uid.internal, bytes(unique_id), 128)
        comm = c_void_p()
        check(_abi.epf_nccl_comm_init_rank(byref(comm), int(nranks), uid, int(rank), float(timeout_s)),
              "epf_nccl_comm_init_rank")
        win = _abi.NcclWindow()
        dev = ctypes.create_string_buffer(max(_abi.SIZEOF_DEVCOMM, 1))
        team = _abi.Team()
        try:
            check(_abi.epf_nccl_window_create(comm, plan.total_bytes, float(timeout_s), byref(win)),
                  "epf_nccl_window_create")
            st = _abi.epf_nccl_devcomm_create(comm, int(lsa_barrier_count), float(timeout_s), ctypes.addressof(dev))
            what = "epf_nccl_devcomm_create"
            if st == EPF_ERR_NOT_SUPPORTED and _abi.epf_nccl_version is not None:  # a 2.28 build, another release
                built = f" {_abi.NCCL_BUILD_VERSION}" if _abi.NCCL_BUILD_VERSION else ""
                what += (f" (the NCCL library loaded is {_abi.epf_nccl_version()}; a library built against NCCL"
                         f"{built} 2.28 headers needs exactly that release at run time: build epfuse against the NCCL "
                         "it will load, e.g. `pip install --no-build-isolation ./python` next to PyTorch)")
            check(st, what)
            check(_abi.epf_nccl_team_query(ctypes.addressof(dev), win.window, None, byref(team)), "epf_nccl_team_query")
        except Exception:
            _abi.epf_nccl_window_destroy(comm, byref(win), float(timeout_s))
            _abi.epf_nccl_comm_destroy(comm, float(timeout_s))
            raise
        g = cls._make(plan, 1, team, None, False)
        g._nccl = (comm, win, dev, float(timeout_s))
        return g

    # ---- handles ---------------------------------------------------------------------------------
    def _check_layout(self, layout, num_topk):
        if _enum(_abi.LAYOUT, layout, "layout") != self.plan.layout:
            raise EpfError(14, f"the group was planned for layout {self.plan.layout}, not {layout!r}")
        if not 1 <= int(num_topk) <= self.plan.top_k:
            raise EpfError(7, f"num_topk {num_topk} is outside [1, {self.plan.top_k}]")

    def _route_config(self, num_topk, index_dtype, max_tokens=None) -> _abi.RouteConfig:
        rc = _abi.RouteConfig()
        _abi.epf_route_config_init(byref(rc))
        rc.index_type = _index_type(index_dtype)
        rc.top_k = int(num_topk)
        rc.max_tokens = 0 if max_tokens is None else int(max_tokens)
        return rc

    def handle_mem_size(self, layout, num_topk: int, index_dtype="int64", max_tokens: Optional[int] = None) -> int:
        """Bytes of handle memory init_handle needs (all of this group's ranks)."""
        self._check_layout(layout, num_topk)
        rc = self._route_config(num_topk, index_dtype, max_tokens)
        n = c_uint64(0)
        check(_abi.epf_route_size(byref(self.plan.c), byref(rc), byref(n)), "epf_route_size")
        return int(n.value) * self.count

    def init_handle(self, layout, num_topk: int, handle_mem, index_dtype="int64", max_tokens: Optional[int] = None,
                    stream=None) -> Handle:
        """epf_route_init over `handle_mem` (a device buffer of handle_mem_size bytes, 256-byte
        aligned). Not capturable (it enqueues a memset and a kernel; call it once)."""
        self._check_layout(layout, num_topk)
        rc = self._route_config(num_topk, index_dtype, max_tokens)
        need = self.handle_mem_size(layout, num_topk, index_dtype, max_tokens)
        r = _abi.Route()
        check(_abi.epf_route_init(byref(self.plan.c), byref(rc), ptr(handle_mem), need, self.count, 1,
                                  stream_handle(stream), byref(r)), "epf_route_init")
        return Handle(self, r, handle_mem, rc.index_type, int(num_topk))

    def import_handle(self, layout, state: HandleState, mem, stream=None) -> Handle:
        """epf_route_import: a handle over `mem`, a byte copy of another handle's memory (e.g. kept
        from a forward step). Checks every buffer's header against this group's plan and `state`
        (synchronises `stream`)."""
        self._check_layout(layout, state.num_topk)
        nbytes = self.handle_mem_size(layout, state.num_topk, state.topk_idx_datatype)
        r = _abi.Route()
        check(_abi.epf_route_import(byref(self.plan.c), ptr(mem), nbytes, self.count, stream_handle(stream), byref(r)),
              "epf_route_import")
        if r.layout.top_k != int(state.num_topk) or r.layout.index_type != _index_type(state.topk_idx_datatype):
            raise EpfError(20, f"the imported handle was made for top-{r.layout.top_k}, index type "
                               f"{r.layout.index_type}; the HandleState says {state}")
        return Handle(self, r, mem, r.layout.index_type, int(state.num_topk))

    # ---- the wait context: timeout from the plan, this group's record and mask -------------------
    def _wait(self) -> _abi.Wait:
        w = _abi.epf_wait_make(0, self._record.device, None, 0)
        w.mask = self._mask.ptr if self._mask is not None else None
        return w

    # ---- HT --------------------------------------------------------------------------------------
    def _ht_step(self, *, x=None, x_scales=None, topk_weights=None, out=None, expert_out=None, em_view=None,
                 em_view_scales=None, expert_rows=0, x_quantized=False, blocks_per_rank=0, topk_idx=None,
                 weight_grad=None, topk_weights_grad=None) -> _abi.HtStep:
        s = _abi.HtStep()
        check(_abi.epf_ht_step_init_sized(byref(s), ctypes.sizeof(s)), "epf_ht_step_init_sized")  # size, magic, version
        s.x, s.x_scales, s.topk_weights, s.out = ptr(x), ptr(x_scales), ptr(topk_weights), ptr(out)
        s.expert_out, s.em_view, s.em_view_scales = ptr(expert_out), ptr(em_view), ptr(em_view_scales)
        s.state = self._state.ptr
        s.expert_rows = int(expert_rows)
        s.x_quantized = 1 if x_quantized else 0
        s.blocks_per_rank = int(blocks_per_rank)
        s.wait = self._wait()
        s.topk_idx, s.weight_grad, s.topk_weights_grad = ptr(topk_idx), ptr(weight_grad), ptr(topk_weights_grad)
        return s

    def dispatch(self, handle: Handle, x, topk_idx, topk_weights, *, x_scales=None, x_quantized: bool = False,
                 halves: str = "both", blocks_per_rank: int = 0, stream=None, phases: Optional[str] = None) -> None:
        """HT dispatch (epf_ht_dispatch): every rank's rows into their final receive rows
        (quantized on the way for MXFP8 / FP8-128). x: [count][T][H] BF16 (or the payload with
        x_quantized); topk_weights: [count][T][top_k] float32. halves: 'send', 'recv' or 'both'
        (`phases` is the older spelling of the same argument)."""
        h = phases if phases is not None else halves
        p = {"send": _abi.LIMITS["EPF_HT_SEND"], "recv": _abi.LIMITS["EPF_HT_RECV"], "both": _abi.LIMITS["EPF_HT_BOTH"]}[h]
        s = self._ht_step(x=x, x_scales=x_scales, topk_weights=topk_weights, x_quantized=x_quantized,
                          blocks_per_rank=blocks_per_rank)
        check(_abi.epf_ht_dispatch(byref(handle.route), self.team, byref(self.plan.c), byref(s), ptr(topk_idx), p,
                                   stream_handle(stream)), "epf_ht_dispatch")

    def expand(self, handle: Handle, em_view, expert_rows: int, em_view_scales=None, *, blocks_per_rank: int = 0,
               stream=None) -> None:
        """RANK_MAJOR: epf_ht_expand, the received rows into the expert-major view
        [count][expert_rows] (rows at handle.segments())."""
        s = self._ht_step(em_view=em_view, em_view_scales=em_view_scales, expert_rows=expert_rows,
                          blocks_per_rank=blocks_per_rank)
        check(_abi.epf_ht_expand(byref(handle.route), self.team, byref(self.plan.c), byref(s), stream_handle(stream)),
              "epf_ht_expand")

    def combine(self, handle: Handle, out, topk_idx, topk_weights, *, expert_out=None, expert_rows: int = 0,
                blocks_per_rank: int = 0, stream=None) -> None:
        """HT combine (epf_ht_combine): out[t] = sum_k w[t][k] * expert output of (t, k), FP32 in
        k order, BF16 out [count][T][H]. expert_out: [count][expert_rows][H] BF16 in the receive
        (expert-major) row order; None: BF16 expert-major outputs written in place over the
        received rows (pull)."""
        s = self._ht_step(topk_weights=topk_weights, out=out, expert_out=expert_out, expert_rows=expert_rows,
                          blocks_per_rank=blocks_per_rank)
        check(_abi.epf_ht_combine(byref(handle.route), self.team, byref(self.plan.c), byref(s), ptr(topk_idx),
                                  stream_handle(stream)), "epf_ht_combine")

    # ---- HT training: the backward direction on the forward's route (docs/high-throughput.md) ------
    def combine_backward(self, handle: Handle, dy, topk_idx, topk_weights, *, halves: str = "both",
                         blocks_per_rank: int = 0, stream=None) -> None:
        """Backward of the HT combine (epf_ht_combine_backward): dy [count][T][H] BF16 into the very
        receive rows of the forward (same handle, no update in between), unweighted; expert-major
        metadata weights become each row's combine weight. Rank-major: then expand() as in the
        forward. BF16 plans only."""
        p = {"send": _abi.LIMITS["EPF_HT_SEND"], "recv": _abi.LIMITS["EPF_HT_RECV"], "both": _abi.LIMITS["EPF_HT_BOTH"]}[halves]
        s = self._ht_step(x=dy, topk_weights=topk_weights, topk_idx=topk_idx, blocks_per_rank=blocks_per_rank)
        check(_abi.epf_ht_combine_backward(byref(handle.route), self.team, byref(self.plan.c), byref(s), p,
                                           stream_handle(stream)), "epf_ht_combine_backward")

    def dispatch_backward(self, handle: Handle, dx, topk_idx, topk_weights, *, expert_out=None, expert_rows: int = 0,
                          weight_grad=None, topk_weights_grad=None, blocks_per_rank: int = 0, stream=None) -> None:
        """Backward of the HT dispatch (epf_ht_dispatch_backward): the experts' input gradients
        (expert_out: [count][expert_rows][H] BF16 in the forward's expert_out order; None: in place,
        expert-major) back to the tokens with unit weights, repeats adding nothing: dx
        [count][T][H] BF16. weight_grad ([count][expert_rows] float32, d w per row) together with
        topk_weights_grad ([count][T][top_k] float32, written): the router-weight gradient."""
        s = self._ht_step(topk_weights=topk_weights, out=dx, expert_out=expert_out, expert_rows=expert_rows,
                          topk_idx=topk_idx, weight_grad=weight_grad, topk_weights_grad=topk_weights_grad,
                          blocks_per_rank=blocks_per_rank)
        check(_abi.epf_ht_dispatch_backward(byref(handle.route), self.team, byref(self.plan.c), byref(s),
                                            stream_handle(stream)), "epf_ht_dispatch_backward")

    # ---- views of this group's window --------------------------------------------------------------
    def _region_view(self, name: str, row_bytes: int, typestr="|u1") -> DeviceArray:
        off, nbytes = self.plan.region(name)
        base = self.team.base if self.virtual else None
        if base is None:
            raise EpfError(26, "window views need virtual ranks (an NCCL group's slice: Group.window_ptr)")
        rows = nbytes // row_bytes if row_bytes else 0
        item = int(typestr[2:])
        return DeviceArray(base + off, (self.count, rows, row_bytes // item), typestr,
                           (self.plan.total_bytes, row_bytes, item), owner=self)

    def recv_tokens(self) -> DeviceArray:
        """[count][recv rows][row_bytes] uint8 view of every rank's RECV_TOKENS (BF16 rows: view
        as bfloat16 [.., H])."""
        return self._region_view("RECV_TOKENS", self.plan.row_bytes)

    def recv_scales(self) -> DeviceArray:
        return self._region_view("RECV_SCALES", self.plan.scale_bytes_per_row)

    def recv_meta(self) -> DeviceArray:
        return self._region_view("RECV_META", self.plan.meta_bytes_per_row)

    # ---- LL --------------------------------------------------------------------------------------
    def ll_rank_bytes(self, which: int, index_dtype="int64") -> int:
        """epf_ll_buffer_bytes: bytes of one rank's LL buffer `which` (epf_ll_buffer_t)."""
        return int(_abi.epf_ll_buffer_bytes(byref(self.plan.c), int(which), _index_type(index_dtype)))

    def ll_dispatch(self, x, topk_idx, topk_weights, recv_counts, *, num_tokens: Optional[int] = None,
                    index_dtype="int64", expert_counts=None, packed_x=None, packed_scales=None, packed_meta=None,
                    round=None, halves: str = "both", stream=None) -> None:
        """LL dispatch (epf_ll_dispatch), every rank of the group in one launch; buffers are the
        bases of `count` per-rank buffers of ll_rank_bytes each."""
        a = _abi.LlDispatchArgs()
        a.x, a.topk_idx, a.topk_weights = ptr(x), ptr(topk_idx), ptr(topk_weights)
        a.num_tokens = self.plan.max_tokens_per_rank if num_tokens is None else int(num_tokens)
        a.index_type = _index_type(index_dtype)
        a.recv_counts, a.expert_counts = ptr(recv_counts), ptr(expert_counts)
        a.packed_x, a.packed_scales, a.packed_meta, a.round = ptr(packed_x), ptr(packed_scales), ptr(packed_meta), ptr(round)
        check(_abi.epf_ll_dispatch(byref(self._ll), byref(a), self._halves(halves), stream_handle(stream)),
              "epf_ll_dispatch")

    def ll_expand(self, recv_counts, packed_x=None, packed_scales=None, packed_meta=None, *, stream=None) -> None:
        """LL rank-major expand (epf_ll_expand): the rank-major rows of the last dispatch round each
        rank received, into the expert-major view (packed_x / packed_scales / packed_meta, the packed
        rows of an expert-major receive), with the recv_counts its receive half wrote. A receive half
        given packed outputs expands by itself; this is the separate step."""
        a = _abi.LlDispatchArgs()
        a.recv_counts = ptr(recv_counts)
        a.packed_x, a.packed_scales, a.packed_meta = ptr(packed_x), ptr(packed_scales), ptr(packed_meta)
        check(_abi.epf_ll_expand(byref(self._ll), byref(a), stream_handle(stream)), "epf_ll_expand")

    def ll_combine(self, y, recv_counts, topk_idx, topk_weights, out, *, num_tokens: Optional[int] = None,
                   index_dtype="int64", y_layout="fixed", halves: str = "both", stream=None) -> None:
        """LL combine (epf_ll_combine): out[t] = sum_k w * y of (t, k), FP32 in k order, BF16 (an
        expert-major plan); a rank-major plan (layout="rank_major") pre-reduces each token's experts
        on the expert side and sums one partial per (token, rank): y in the view's order,
        y_layout "fixed", "packed" or "packed_pull"."""
        a = _abi.LlCombineArgs()
        a.y, a.recv_counts, a.topk_idx, a.topk_weights, a.out = ptr(y), ptr(recv_counts), ptr(topk_idx), ptr(topk_weights), ptr(out)
        a.num_tokens = self.plan.max_tokens_per_rank if num_tokens is None else int(num_tokens)
        a.index_type = _index_type(index_dtype)
        a.y_layout = _enum(_abi.Y_LAYOUT, y_layout, "y layout")
        check(_abi.epf_ll_combine(byref(self._ll), byref(a), self._halves(halves), stream_handle(stream)),
              "epf_ll_combine")

    def ll_combine_backward(self, dy, topk_idx, topk_weights, recv_counts, *, num_tokens: Optional[int] = None,
                            index_dtype="int64", expert_counts=None, packed_x=None, packed_meta=None, round=None,
                            halves: str = "both", stream=None) -> None:
        """Backward of the LL combine (epf_ll_combine_backward): an LL dispatch of dy with the
        forward's routing; each row's metadata weight is its combine weight (rank-major: the rows
        carry per-k entries with the forward's weights, and the expand into packed_x / packed_meta
        gives each view row its combine weight). BF16 plans, both layouts."""
        a = _abi.LlDispatchArgs()
        a.x, a.topk_idx, a.topk_weights = ptr(dy), ptr(topk_idx), ptr(topk_weights)
        a.num_tokens = self.plan.max_tokens_per_rank if num_tokens is None else int(num_tokens)
        a.index_type = _index_type(index_dtype)
        a.recv_counts, a.expert_counts = ptr(recv_counts), ptr(expert_counts)
        a.packed_x, a.packed_meta, a.round = ptr(packed_x), ptr(packed_meta), ptr(round)
        check(_abi.epf_ll_combine_backward(byref(self._ll), byref(a), self._halves(halves), stream_handle(stream)),
              "epf_ll_combine_backward")

    def ll_dispatch_backward(self, dx_rows, recv_counts, topk_idx, dx, *, num_tokens: Optional[int] = None,
                             index_dtype="int64", y_layout="fixed", weight_grad=None, topk_weights_grad=None,
                             halves: str = "both", stream=None) -> None:
        """Backward of the LL dispatch (epf_ll_dispatch_backward): dx[t] = sum over the first
        occurrences k of dx_rows of (t, k), FP32 in k order, BF16; optionally the router-weight
        gradient: weight_grad (one FP32 per row, y_layout order) -> topk_weights_grad [T][K].
        Rank-major plans: dx_rows in the view's order (y_layout "fixed", "packed" or
        "packed_pull"); per-rank unit-weight partials, weight_grad one FP32 per view row."""
        a = _abi.LlCombineArgs()
        a.y, a.recv_counts, a.topk_idx, a.out = ptr(dx_rows), ptr(recv_counts), ptr(topk_idx), ptr(dx)
        a.num_tokens = self.plan.max_tokens_per_rank if num_tokens is None else int(num_tokens)
        a.index_type = _index_type(index_dtype)
        a.y_layout = _enum(_abi.Y_LAYOUT, y_layout, "y layout")
        a.weight_grad, a.topk_weights_grad = ptr(weight_grad), ptr(topk_weights_grad)
        check(_abi.epf_ll_dispatch_backward(byref(self._ll), byref(a), self._halves(halves), stream_handle(stream)),
              "epf_ll_dispatch_backward")

    @staticmethod
    def _halves(h: str) -> int:
        return {"send": _abi.LIMITS["EPF_LL_SEND"], "recv": _abi.LIMITS["EPF_LL_RECV"],
                "both": _abi.LIMITS["EPF_LL_BOTH"]}[h]

    # ---- fault tolerance: the active mask ----------------------------------------------------------
    def enable_mask(self) -> None:
        """Turn on the active mask: a peer that times out is masked instead of failing every later
        wait. LL keeps the mask in its state; HT in a device word array this group owns."""
        if self._ll is None and self._mask is None:
            words = _abi.LIMITS["EPF_MASK_WORDS"]
            self._mask = DeviceBuffer(4 * words, zero=False)
            self.mask_clean()

    def mask_query(self, out, stream=None) -> None:
        """Copy the mask words into `out` (device, [count][EPF_MASK_WORDS] uint32 for LL,
        [EPF_MASK_WORDS] for HT). No allocation, no sync: capturable."""
        if self._ll is not None:
            check(_abi.epf_ll_mask_query_async(byref(self._ll), ptr(out), stream_handle(stream)), "epf_ll_mask_query_async")
        else:
            self._need_mask()
            check(_abi.epf_cuda_memcpy_async(ptr(out), self._mask.ptr, self._mask.nbytes, stream_handle(stream)),
                  "cudaMemcpyAsync")

    def mask_update(self, mask, stream=None) -> None:
        """Set the mask from host values: a sequence of EPF_MASK_WORDS uint32 words (bit r = rank r
        takes part), or an iterable of active ranks given as a set."""
        words = _abi.LIMITS["EPF_MASK_WORDS"]
        w = (c_uint32 * words)()
        if isinstance(mask, (set, frozenset)):
            for r in mask:
                w[r >> 5] |= 1 << (r & 31)
        else:
            for i, v in enumerate(mask):
                w[i] = int(v)
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
        if self._closed:
            return
        self._closed = True
        nccl = getattr(self, "_nccl", None)
        if nccl is not None:
            comm, win, dev, t = nccl
            _abi.epf_cuda_stream_synchronize(None)
            _abi.epf_nccl_devcomm_destroy(comm, ctypes.addressof(dev))
            check(_abi.epf_nccl_window_destroy(comm, byref(win), t), "epf_nccl_window_destroy")
            check(_abi.epf_nccl_comm_destroy(comm, t), "epf_nccl_comm_destroy")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
