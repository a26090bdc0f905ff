"""The C ABI of libepfuse.so through ctypes: the library, struct mirrors, function prototypes.

Every mirror below is checked against the library's own ``epf_abi_sizeof`` when this module is
imported, so a binding that drifted from the headers refuses to load instead of corrupting memory.
Field layouts follow include/epfuse/*.h (the struct comments there are the contract).
"""
from __future__ import annotations

import ctypes
import os
from ctypes import (POINTER, Structure, c_bool, c_char_p, c_double, c_int, c_int16, c_int32, c_int64, c_size_t,
                    c_uint8, c_uint32, c_uint64, c_void_p)

_HERE = os.path.dirname(os.path.abspath(__file__))


def _find_library() -> str:
    env = os.environ.get("EPFUSE_LIBRARY")
    if env:
        return env
    for name in ("libepfuse.so.0", "libepfuse.so"):
        for d in (os.path.join(_HERE, "lib"), os.path.join(_HERE, "lib64")):
            p = os.path.join(d, name)
            if os.path.exists(p):
                return p
    raise ImportError("epfuse: libepfuse.so not found in the package (reinstall with `pip install ./python`) "
                      "and EPFUSE_LIBRARY is not set")


def _nccl_header_version(include_dir):
    """'major.minor.patch' from include_dir/nccl.h, or None."""
    parts = {}
    try:
        with open(os.path.join(include_dir, "nccl.h")) as f:
            for line in f:
                w = line.split()
                if len(w) >= 3 and w[0] == "#define" and w[1] in ("NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH"):
                    parts[w[1]] = w[2]
    except OSError:
        return None
    if len(parts) != 3:
        return None
    return f"{parts['NCCL_MAJOR']}.{parts['NCCL_MINOR']}.{parts['NCCL_PATCH']}"


def _nccl_build_version(library_path):
    """The NCCL release libepfuse.so was compiled against (epfuse_nccl_build.txt beside it), or
    None (built without NCCL, or a library from elsewhere)."""
    try:
        with open(os.path.join(os.path.dirname(os.path.realpath(library_path)), "epfuse_nccl_build.txt")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _preload_nccl_wheel(library_path):
    """Load the ``nvidia-nccl`` wheel's libnccl.so.2 (RTLD_GLOBAL) before libepfuse.so, as PyTorch
    does, so libepfuse.so binds to the NCCL it was built against when the package was built next to
    that wheel (CMake takes it first in a Python build) rather than to a system NCCL found by the
    loader. Skipped when the library says it was compiled against another release (then the
    loader's choice stands, and epf_nccl_devcomm_create refuses a mismatch by itself), or when
    EPFUSE_NCCL_PRELOAD=0. Returns the loaded path, or None."""
    if os.environ.get("EPFUSE_NCCL_PRELOAD", "1") == "0":
        return None
    try:
        import importlib.util
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    built = _nccl_build_version(library_path)
    for d in spec.submodule_search_locations:
        p = os.path.join(d, "lib", "libnccl.so.2")
        if os.path.exists(p):
            wheel = _nccl_header_version(os.path.join(d, "include"))
            if built is not None and wheel is not None and wheel != built:
                return None
            try:
                ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                return None
            return p
    return None


LIBRARY_PATH = _find_library()
NCCL_BUILD_VERSION = _nccl_build_version(LIBRARY_PATH)
NCCL_WHEEL_LIBRARY = _preload_nccl_wheel(LIBRARY_PATH)
lib = ctypes.CDLL(LIBRARY_PATH)

# ---- enumerations and constants (host.h) ---------------------------------------------------------
# (values checked against the library's epf_abi_constant at import, below)
MODE = {"ht": 1, "ll": 2}
LAYOUT = {"expert_major": 1, "rank_major": 2, "em": 1, "rm": 2}
PAYLOAD = {"bf16": 1, "mxfp8": 2, "fp8_128": 3, "fp8": 3}
SCALE_LAYOUT = {"compact": 1, "swizzled": 2, "swizzled_128x4": 2, "segment_mn_major": 3}
INDEX_TYPE = {"default": 0, "int32": 1, "int64": 2}
Y_LAYOUT = {"fixed": 0, "packed": 1, "in_place": 2, "in_place_pull": 3, "packed_pull": 4}
LL_BUFFER = {"x": 0, "topk_idx": 1, "topk_weights": 2, "recv_counts": 3, "expert_counts": 4, "packed_x": 5,
             "packed_scales": 6, "packed_meta": 7, "round": 8, "y": 9, "weight_grad": 10}
# config flags (epf_config_t.flags, OR them): combine_push forces the push combine (HT; LL with an
# MXFP8 combine payload, which pulls by default)
FLAG = {"fault_tolerant": 0x1, "combine_push": 0x2, "scale_ue8m0": 0x4, "mx_scale_floor": 0x8}
_C_NAMES = [(MODE, "EPF_MODE_"), (LAYOUT, "EPF_LAYOUT_"), (PAYLOAD, "EPF_PAYLOAD_"),
            (SCALE_LAYOUT, "EPF_SCALE_LAYOUT_"), (INDEX_TYPE, "EPF_INDEX_"), (Y_LAYOUT, "EPF_LL_Y_"),
            (LL_BUFFER, "EPF_LL_BUF_"), (FLAG, "EPF_FLAG_")]
_C_SPELLING = {"em": None, "rm": None, "fp8": None, "swizzled": None, "fp8_128": "FP8_128",
               "swizzled_128x4": "SWIZZLED_128X4"}
REGION_COUNT = 13
ROUTE_ARRAY_COUNT = 14


# ---- struct mirrors ---------------------------------------------------------------------------------
class Config(Structure):  # epf_config_t
    _fields_ = [("size", c_uint32), ("magic", c_uint32), ("version", c_uint32), ("nranks", c_int32),
                ("num_experts", c_int32), ("top_k", c_int32), ("hidden", c_int32),
                ("max_tokens_per_rank", c_int32), ("mode", c_int32), ("layout", c_int32), ("payload", c_int32),
                ("combine_payload", c_int32), ("scale_layout", c_int32), ("expert_alignment", c_int32),
                ("flags", c_uint32), ("reserved0", c_uint32), ("recv_capacity", c_int64), ("timeout_ns", c_uint64)]


class Region(Structure):  # epf_region_t
    _fields_ = [("offset", c_uint64), ("bytes", c_uint64)]


class Plan(Structure):  # epf_plan_t (version 2)
    _fields_ = [("size", c_uint32), ("magic", c_uint32), ("version", c_uint32), ("flags", c_uint32),
                ("nranks", c_int32), ("num_experts", c_int32), ("experts_per_rank", c_int32), ("top_k", c_int32),
                ("hidden", c_int32), ("max_tokens_per_rank", c_int32), ("mode", c_int32), ("layout", c_int32),
                ("payload", c_int32), ("combine_payload", c_int32), ("scale_layout", c_int32),
                ("expert_alignment", c_int32), ("recv_capacity", c_int64), ("row_bytes", c_uint32),
                ("scale_bytes_per_row", c_uint32), ("meta_bytes_per_row", c_uint32), ("combine_row_bytes", c_uint32),
                ("config_hash", c_uint64), ("timeout_ns", c_uint64), ("total_bytes", c_uint64),
                ("region", Region * REGION_COUNT), ("build_signature", c_uint64)]


class ErrorRecord(Structure):  # epf_error_record_t
    _fields_ = [("status", c_uint32), ("count", c_uint32), ("valid", c_uint32), ("waiter_rank", c_int32),
                ("waiter_block", c_int32), ("waiter_thread", c_int32), ("peer", c_int32), ("reserved", c_uint32),
                ("address", c_uint64), ("wanted", c_uint64), ("seen", c_uint64), ("elapsed_ns", c_uint64),
                ("dropped_routes", c_uint32), ("recv_overflow", c_uint32), ("masked_ranks", c_uint32),
                ("reserved2", c_uint32)]


class RouteConfig(Structure):  # epf_route_config_t
    _fields_ = [("size", c_uint32), ("magic", c_uint32), ("version", c_uint32), ("index_type", c_int32),
                ("top_k", c_int32), ("max_tokens", c_int32), ("max_blocks", c_int32), ("flags", c_uint32)]


class RouteHeader(Structure):  # epf_route_header_t
    _fields_ = [("size", c_uint32), ("magic", c_uint32), ("version", c_uint32), ("epoch", c_uint32),
                ("config_hash", c_uint64), ("total_bytes", c_uint64), ("nranks", c_int32), ("num_experts", c_int32),
                ("top_k", c_int32), ("max_tokens", c_int32), ("index_type", c_int32), ("max_blocks", c_int32),
                ("flags", c_uint32), ("rank", c_int32), ("num_tokens", c_int32), ("dropped_routes", c_uint32),
                ("status", c_uint32), ("reserved0", c_uint32), ("recv_rows", c_int64), ("recv_rows_em", c_int64),
                ("recv_overflow", c_int64), ("barrier", c_uint64)]


class RouteLayout(Structure):  # epf_route_layout_t
    _fields_ = [("size", c_uint32), ("magic", c_uint32), ("version", c_uint32), ("flags", c_uint32),
                ("nranks", c_int32), ("num_experts", c_int32), ("experts_per_rank", c_int32), ("top_k", c_int32),
                ("max_tokens", c_int32), ("index_type", c_int32), ("max_blocks", c_int32), ("plan_layout", c_int32),
                ("plan_mode", c_int32), ("expert_alignment", c_int32), ("exchange", c_int32), ("reserved0", c_int32),
                ("recv_capacity", c_int64), ("config_hash", c_uint64), ("total_bytes", c_uint64),
                ("array", Region * ROUTE_ARRAY_COUNT)]


class Route(Structure):  # epf_route_t (the handle)
    _fields_ = [("size", c_uint32), ("magic", c_uint32), ("version", c_uint32), ("count", c_int32),
                ("base", c_void_p), ("epoch_words", c_void_p), ("device", c_int32), ("resident_blocks", c_int32),
                ("layout", RouteLayout)]


class Team(Structure):  # epf_team_t
    _fields_ = [("base", c_void_p), ("stride", c_uint64), ("peers", c_void_p), ("rank", c_int32),
                ("nranks", c_int32)]


class Wait(Structure):  # epf_wait_t
    _fields_ = [("timeout_ns", c_uint64), ("record", c_void_p), ("abort_word", c_void_p), ("mask", c_void_p),
                ("rank", c_int32), ("reserved", c_int32)]


class RouteStep(Structure):  # epf_route_step_t
    _fields_ = [("topk_idx", c_void_p), ("num_tokens", c_int32), ("blocks_per_rank", c_int32),
                ("num_tokens_dev", c_void_p), ("recv_total_mapped", c_void_p), ("wait", Wait)]


class HtStep(Structure):  # epf_ht_step_t (versioned: size / magic / version first; epf_ht_step_init_sized)
    _fields_ = [("size", c_uint32), ("magic", c_uint32), ("version", c_uint32), ("reserved0", c_uint32),
                ("x", c_void_p), ("x_scales", c_void_p), ("topk_weights", c_void_p), ("out", c_void_p),
                ("expert_out", c_void_p), ("em_view", c_void_p), ("em_view_scales", c_void_p), ("state", c_void_p),
                ("expert_rows", c_int64), ("x_quantized", c_int32), ("blocks_per_rank", c_int32), ("wait", Wait),
                ("topk_idx", c_void_p), ("weight_grad", c_void_p), ("topk_weights_grad", c_void_p)]


class LlDispatchArgs(Structure):  # epf_ll_dispatch_args_t
    _fields_ = [("x", c_void_p), ("topk_idx", c_void_p), ("topk_weights", c_void_p), ("num_tokens", c_int32),
                ("index_type", c_int32), ("recv_counts", c_void_p), ("expert_counts", c_void_p),
                ("packed_x", c_void_p), ("packed_scales", c_void_p), ("packed_meta", c_void_p), ("round", c_void_p)]


class LlCombineArgs(Structure):  # epf_ll_combine_args_t
    _fields_ = [("y", c_void_p), ("recv_counts", c_void_p), ("topk_idx", c_void_p), ("topk_weights", c_void_p),
                ("out", c_void_p), ("num_tokens", c_int32), ("index_type", c_int32), ("y_layout", c_int32),
                ("reserved", c_int32), ("weight_grad", c_void_p), ("topk_weights_grad", c_void_p)]


class LlLaunch(Structure):  # epf_ll_launch_t
    _fields_ = [("plan", Plan), ("team", Team), ("state", c_void_p), ("record", c_void_p), ("abort_word", c_void_p),
                ("virtual_ranks", c_int32), ("blocks_per_rank", c_int32), ("threads", c_int32), ("device", c_int32)]


class NcclWindow(Structure):  # epf_nccl_window_t
    _fields_ = [("ptr", c_void_p), ("bytes", c_size_t), ("window", c_void_p)]


class NcclUniqueId(Structure):  # ncclUniqueId (passed by value)
    _fields_ = [("internal", c_uint8 * 128)]


MIRRORS = {
    "epf_config_t": Config, "epf_region_t": Region, "epf_plan_t": Plan, "epf_error_record_t": ErrorRecord,
    "epf_route_config_t": RouteConfig, "epf_route_header_t": RouteHeader, "epf_route_layout_t": RouteLayout,
    "epf_route_t": Route, "epf_team_t": Team, "epf_wait_t": Wait, "epf_route_step_t": RouteStep,
    "epf_ht_step_t": HtStep, "epf_ll_dispatch_args_t": LlDispatchArgs, "epf_ll_combine_args_t": LlCombineArgs,
    "epf_ll_launch_t": LlLaunch,
}

# ---- prototypes -------------------------------------------------------------------------------------
P = POINTER
_S = c_int  # epf_status_t


def _proto(name, restype, *argtypes, optional=False):
    try:
        f = getattr(lib, name)
    except AttributeError:
        if optional:
            return None
        raise
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


epf_abi_version = _proto("epf_abi_version", c_int)
epf_abi_has_nccl = _proto("epf_abi_has_nccl", c_int)
epf_abi_sizeof = _proto("epf_abi_sizeof", c_size_t, c_char_p)
epf_abi_type_count = _proto("epf_abi_type_count", c_int)
epf_abi_type_name = _proto("epf_abi_type_name", c_char_p, c_int)
epf_abi_constant = _proto("epf_abi_constant", c_int64, c_char_p)
epf_build_signature = _proto("epf_build_signature", c_uint64)
epf_version = _proto("epf_version", c_int)
epf_status_name = _proto("epf_status_name", c_char_p, c_int)
epf_status_message = _proto("epf_status_message", c_char_p, c_int)
epf_config_init = _proto("epf_config_init", None, P(Config))
epf_config_resolve = _proto("epf_config_resolve", _S, P(Config), P(Config))
epf_plan_compute = _proto("epf_plan_compute", _S, P(Config), P(Plan))
epf_plan_check = _proto("epf_plan_check", _S, P(Plan))
epf_plan_scales_staged = _proto("epf_plan_scales_staged", c_int, P(Plan))
epf_plan_recv_scale_stage_offset = _proto("epf_plan_recv_scale_stage_offset", c_uint64, P(Plan), c_int64)
epf_region_name = _proto("epf_region_name", c_char_p, c_int)
epf_error_read = _proto("epf_error_read", None, P(ErrorRecord), P(ErrorRecord))
epf_error_clear = _proto("epf_error_clear", None, P(ErrorRecord))
epf_error_describe = _proto("epf_error_describe", c_size_t, P(ErrorRecord), c_char_p, c_size_t)
epf_route_config_init = _proto("epf_route_config_init", None, P(RouteConfig))
epf_route_size = _proto("epf_route_size", _S, P(Plan), P(RouteConfig), P(c_uint64))
epf_route_layout_compute = _proto("epf_route_layout_compute", _S, P(Plan), P(RouteConfig), P(RouteLayout))
epf_route_init = _proto("epf_route_init", _S, P(Plan), P(RouteConfig), c_void_p, c_uint64, c_int, c_uint32, c_void_p,
                        P(Route))
epf_route_update = _proto("epf_route_update", _S, P(Route), Team, P(Plan), P(RouteStep), c_void_p)
epf_route_import = _proto("epf_route_import", _S, P(Plan), c_void_p, c_uint64, c_int, c_void_p, P(Route))
epf_route_read_header = _proto("epf_route_read_header", _S, P(Route), c_int, c_void_p, P(RouteHeader))
epf_route_ptr = _proto("epf_route_ptr", c_void_p, P(Route), c_int, c_int)
epf_team_virtual = _proto("epf_team_virtual", Team, c_void_p, c_uint64, c_int, c_int)
epf_wait_make = _proto("epf_wait_make", Wait, c_uint64, c_void_p, c_void_p, c_int)
epf_ht_step_init_sized = _proto("epf_ht_step_init_sized", _S, P(HtStep), c_size_t)
epf_ht_check = _proto("epf_ht_check", _S, P(Plan), P(Route), P(HtStep))
epf_ht_dispatch = _proto("epf_ht_dispatch", _S, P(Route), Team, P(Plan), P(HtStep), c_void_p, c_int, c_void_p)
epf_ht_expand = _proto("epf_ht_expand", _S, P(Route), Team, P(Plan), P(HtStep), c_void_p)
epf_ht_combine = _proto("epf_ht_combine", _S, P(Route), Team, P(Plan), P(HtStep), c_void_p, c_void_p)
epf_ht_combine_backward = _proto("epf_ht_combine_backward", _S, P(Route), Team, P(Plan), P(HtStep), c_int, c_void_p)
epf_ht_dispatch_backward = _proto("epf_ht_dispatch_backward", _S, P(Route), Team, P(Plan), P(HtStep), c_void_p)
epf_ll_plan_check = _proto("epf_ll_plan_check", _S, P(Plan))
epf_ll_combine_pulls = _proto("epf_ll_combine_pulls", c_bool, P(Plan), c_int)
epf_ll_buffer_bytes = _proto("epf_ll_buffer_bytes", c_uint64, P(Plan), c_int, c_int)
epf_ll_launch_make = _proto("epf_ll_launch_make", LlLaunch, P(Plan), Team, c_void_p, c_void_p, c_int)
epf_ll_dispatch = _proto("epf_ll_dispatch", _S, P(LlLaunch), P(LlDispatchArgs), c_int, c_void_p)
epf_ll_combine = _proto("epf_ll_combine", _S, P(LlLaunch), P(LlCombineArgs), c_int, c_void_p)
epf_ll_expand = _proto("epf_ll_expand", _S, P(LlLaunch), P(LlDispatchArgs), c_void_p)
epf_ll_rm_recv_row = _proto("epf_ll_rm_recv_row", c_int64, P(Plan), c_uint32, c_int, c_int)
epf_ll_rm_combine_row = _proto("epf_ll_rm_combine_row", c_int64, P(Plan), c_uint32, c_int, c_int)
epf_ll_combine_backward = _proto("epf_ll_combine_backward", _S, P(LlLaunch), P(LlDispatchArgs), c_int, c_void_p)
epf_ll_dispatch_backward = _proto("epf_ll_dispatch_backward", _S, P(LlLaunch), P(LlCombineArgs), c_int, c_void_p)
epf_ll_state_reset = _proto("epf_ll_state_reset", _S, P(LlLaunch), c_void_p)
epf_ll_mask_query_async = _proto("epf_ll_mask_query_async", _S, P(LlLaunch), c_void_p, c_void_p)
epf_ll_mask_update = _proto("epf_ll_mask_update", _S, P(LlLaunch), P(c_uint32), c_void_p)
epf_ll_mask_clean = _proto("epf_ll_mask_clean", _S, P(LlLaunch), c_void_p)
epf_ll_error_clear_async = _proto("epf_ll_error_clear_async", _S, c_void_p, c_void_p)
epf_cuda_last_error = _proto("epf_cuda_last_error", c_int)
epf_cuda_last_error_clear = _proto("epf_cuda_last_error_clear", None)
epf_cuda_error_string = _proto("epf_cuda_error_string", c_char_p, c_int)
epf_cuda_set_device = _proto("epf_cuda_set_device", _S, c_int)
epf_cuda_get_device = _proto("epf_cuda_get_device", _S, P(c_int))
epf_cuda_device_count = _proto("epf_cuda_device_count", _S, P(c_int))
epf_cuda_malloc = _proto("epf_cuda_malloc", _S, P(c_void_p), c_size_t)
epf_cuda_free = _proto("epf_cuda_free", _S, c_void_p)
epf_cuda_host_alloc_mapped = _proto("epf_cuda_host_alloc_mapped", _S, P(c_void_p), P(c_void_p), c_size_t)
epf_cuda_free_host = _proto("epf_cuda_free_host", _S, c_void_p)
epf_cuda_memset_async = _proto("epf_cuda_memset_async", _S, c_void_p, c_int, c_size_t, c_void_p)
epf_cuda_memcpy = _proto("epf_cuda_memcpy", _S, c_void_p, c_void_p, c_size_t)
epf_cuda_memcpy_async = _proto("epf_cuda_memcpy_async", _S, c_void_p, c_void_p, c_size_t, c_void_p)
epf_cuda_stream_synchronize = _proto("epf_cuda_stream_synchronize", _S, c_void_p)

HAS_NCCL = bool(epf_abi_has_nccl())
epf_nccl_get_unique_id = _proto("epf_nccl_get_unique_id", _S, c_void_p, c_size_t, optional=True)
epf_nccl_version = _proto("epf_nccl_version", c_int, optional=True)
epf_nccl_comm_init_rank = _proto("epf_nccl_comm_init_rank", _S, P(c_void_p), c_int, NcclUniqueId, c_int, c_double,
                                 optional=True)
epf_nccl_comm_destroy = _proto("epf_nccl_comm_destroy", _S, c_void_p, c_double, optional=True)
epf_nccl_window_create = _proto("epf_nccl_window_create", _S, c_void_p, c_size_t, c_double, P(NcclWindow),
                                optional=True)
epf_nccl_window_destroy = _proto("epf_nccl_window_destroy", _S, c_void_p, P(NcclWindow), c_double, optional=True)
epf_nccl_devcomm_create = _proto("epf_nccl_devcomm_create", _S, c_void_p, c_int, c_double, c_void_p, optional=True)
epf_nccl_devcomm_destroy = _proto("epf_nccl_devcomm_destroy", _S, c_void_p, c_void_p, optional=True)
epf_nccl_team_query = _proto("epf_nccl_team_query", _S, c_void_p, c_void_p, c_void_p, P(Team), optional=True)
epf_nccl_last_message = _proto("epf_nccl_last_message", c_char_p, c_void_p, c_int, optional=True)
# NCCL_VERSION_CODE of the headers the library was compiled with (-1 without NCCL); newer
# libraries only: without it, NCCL_BUILD_VERSION (epfuse_nccl_build.txt) says the same
epf_nccl_build_version = _proto("epf_nccl_build_version", c_int, optional=True)
epf_nccl_version_check = _proto("epf_nccl_version_check", _S, c_int, c_int, c_char_p, c_size_t, optional=True)

# NCCL's own queries, found through libepfuse.so's dependencies (the libnccl.so it loaded), for an
# adopted communicator (Group.from_comm) and for show_versions. None where not resolvable.
if HAS_NCCL:
    nccl_get_version = _proto("ncclGetVersion", c_int, P(c_int), optional=True)
    nccl_comm_count = _proto("ncclCommCount", c_int, c_void_p, P(c_int), optional=True)
    nccl_comm_user_rank = _proto("ncclCommUserRank", c_int, c_void_p, P(c_int), optional=True)
    nccl_comm_cu_device = _proto("ncclCommCuDevice", c_int, c_void_p, P(c_int), optional=True)
else:
    nccl_get_version = nccl_comm_count = nccl_comm_user_rank = nccl_comm_cu_device = None


def nccl_comm_info(comm: int):
    """(nranks, rank, CUDA device) of an NCCL communicator, asked from the libnccl.so this library
    loaded; None where those functions are not reachable or fail."""
    if not comm or nccl_comm_count is None or nccl_comm_user_rank is None or nccl_comm_cu_device is None:
        return None
    n, r, d = c_int(-1), c_int(-1), c_int(-1)
    if (nccl_comm_count(comm, ctypes.byref(n)) != 0 or nccl_comm_user_rank(comm, ctypes.byref(r)) != 0
            or nccl_comm_cu_device(comm, ctypes.byref(d)) != 0):
        return None
    return n.value, r.value, d.value


def check_mirrors() -> dict:
    """{type: (python size, library size)} for every mirror; raises ImportError on a mismatch."""
    sizes = {}
    for name, cls in MIRRORS.items():
        want = epf_abi_sizeof(name.encode())
        got = ctypes.sizeof(cls)
        sizes[name] = (got, want)
        if want != got:
            raise ImportError(f"epfuse: the Python mirror of {name} is {got} bytes, libepfuse.so says {want}: "
                              f"the package and {LIBRARY_PATH} are from different versions")
    return sizes


def check_constants() -> None:
    """Every enumerator this module spells has the library's value; raises ImportError otherwise."""
    for table, prefix in _C_NAMES:
        for key, value in table.items():
            spelled = _C_SPELLING.get(key, key.upper())
            if spelled is None:  # an alias of another key
                continue
            want = epf_abi_constant((prefix + spelled).encode())
            if want != value:
                raise ImportError(f"epfuse: {prefix + spelled} is {want} in libepfuse.so, {value} here")


MIRROR_SIZES = check_mirrors()
check_constants()
LIMITS = {k: int(epf_abi_constant(k.encode())) for k in (
    "EPF_MAX_RANKS", "EPF_MAX_EXPERTS", "EPF_MAX_TOPK", "EPF_MAX_TOKENS_PER_RANK", "EPF_ALIGN", "EPF_MASK_WORDS",
    "EPF_HT_MAX_BLOCKS_PER_RANK", "EPF_HT_SEND", "EPF_HT_RECV", "EPF_HT_BOTH", "EPF_LL_SEND", "EPF_LL_RECV", "EPF_LL_BOTH")}
SIZEOF_HT_STATE = int(epf_abi_sizeof(b"epf_ht_state_t"))
SIZEOF_LL_STATE = int(epf_abi_sizeof(b"epf_ll_state_t"))
SIZEOF_DEVCOMM = int(epf_abi_sizeof(b"ncclDevComm_t")) if HAS_NCCL else 0
