"""Device buffers and streams without a hard dependency on any array package.

A device buffer argument may be a PyTorch CUDA tensor (read through its attributes), any object
with ``__dlpack__`` (a DLPack capsule on a CUDA device, read without being consumed; preferred
where an object has both protocols) or ``__cuda_array_interface__`` v2/v3 (CuPy, Numba,
``DeviceArray`` below): its address, shape, strides, dtype and device are read (``describe``) and
checked against what the call will touch (``BufferChecks``). A raw device address (int) is the
pointer-level escape hatch: it is passed on as it is, with NO check. A stream may be None (the
legacy default stream), an int handle, a ``torch.cuda.Stream`` (``cuda_stream``) or a CuPy stream
(``ptr``).
"""
from __future__ import annotations

import ctypes
import math
import sys
from ctypes import c_void_p

from . import _abi
from ._errors import check


# ---- DLPack, read through the capsule without consuming it ---------------------------------------
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", c_void_p), ("deleter", c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", c_void_p), ("deleter", c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_kDLCUDA, _kDLCUDAHost, _kDLCUDAManaged = 2, 3, 13
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]
_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype = c_void_p
_capsule_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]


_DL_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal", 10: "rocm",
                    11: "rocm_host", 13: "cuda_managed", 14: "oneapi"}
_DL_CODES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool"}


class BufferInfo:
    """What a buffer argument is, read without copying and without keeping a capsule: the address
    of its first element, shape, strides in BYTES (C-contiguous when the producer gave none),
    dtype name ("bfloat16", "float32", "int64", "uint8", "void16" for a raw 2-byte CAI type, ...),
    bytes per element, the CUDA device ordinal (None where the producer does not say: most
    ``__cuda_array_interface__`` objects, pinned host memory) and where it was read from
    ("torch", "dlpack" or "cai")."""

    __slots__ = ("ptr", "shape", "strides", "dtype", "itemsize", "device", "source")

    def __init__(self, ptr, shape, strides, dtype, itemsize, device, source):
        self.ptr = int(ptr)
        self.shape = tuple(int(d) for d in shape)
        self.itemsize = int(itemsize)
        self.strides = (tuple(int(s) for s in strides) if strides is not None
                        else _c_strides(self.shape, self.itemsize))
        self.dtype = dtype
        self.device = device
        self.source = source

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the elements (for a C-contiguous buffer, its extent from ptr)."""
        return self.size * self.itemsize

    @property
    def c_contiguous(self) -> bool:
        if self.size == 0:
            return True
        want = self.itemsize
        for d, s in zip(reversed(self.shape), reversed(self.strides)):
            if d != 1 and s != want:
                return False
            want *= d
        return True

    def __repr__(self):
        dev = "?" if self.device is None else self.device
        return (f"BufferInfo(0x{self.ptr:x}, shape={self.shape}, strides={self.strides}, dtype={self.dtype}, "
                f"device={dev}, source={self.source})")


def _c_strides(shape, itemsize):
    out, acc = [], itemsize
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


def _arg_error(where, text):
    from ._errors import EPF_ERR_INVALID_ARGUMENT, EpfValueError
    return EpfValueError(EPF_ERR_INVALID_ARGUMENT, f"epfuse: {where}: {text}" if where else f"epfuse: {text}")


def _from_torch(t, name, where) -> BufferInfo:
    # PyTorch tensors are read through their attributes: bfloat16 has no __cuda_array_interface__,
    # and both protocols refuse tensors that require grad; data_ptr() includes the storage offset
    dev = t.device
    if dev.type != "cuda":
        raise _arg_error(where, f"{name} is a {dev.type} tensor; it must be in CUDA device memory")
    item = t.element_size()
    return BufferInfo(t.data_ptr(), tuple(t.shape), tuple(s * item for s in t.stride()),
                      str(t.dtype).replace("torch.", ""), item, dev.index, "torch")


class _NotThroughDLPack(Exception):
    pass


def _from_dlpack(obj, name, where) -> BufferInfo:
    """Read a DLPack capsule without consuming it (the producer's capsule destructor frees it).
    stream=-1: "no synchronisation" in the array API's DLPack protocol, so nothing is enqueued
    (this runs inside CUDA graph captures too)."""
    try:
        try:
            cap = obj.__dlpack__(stream=-1)
        except TypeError:  # a producer without the stream keyword
            cap = obj.__dlpack__()
        cname = _capsule_name(cap)
        if cname not in (b"dltensor", b"dltensor_versioned"):
            raise _NotThroughDLPack(f"a DLPack capsule named {cname!r}")
        p = _capsule_ptr(cap, cname)
    except _NotThroughDLPack:
        raise
    except Exception as e:  # the producer refused
        raise _NotThroughDLPack(f"{type(e).__name__}: {e}") from None
    if cname == b"dltensor_versioned":
        t = _DLManagedTensorVersioned.from_address(p).dl_tensor
    else:
        t = _DLManagedTensor.from_address(p).dl_tensor
    dtype = t.dtype
    if dtype.lanes != 1 or dtype.bits % 8 != 0 or dtype.bits == 0:
        raise _arg_error(where, f"{name}: DLPack dtype (code {dtype.code}, {dtype.bits} bits, {dtype.lanes} lanes) "
                                "is not a whole-byte scalar type")
    item = dtype.bits // 8
    if dtype.code == 4 and dtype.bits == 16:
        dname = "bfloat16"
    elif dtype.code == 6:
        dname = "bool"
    elif dtype.code in _DL_CODES:
        dname = f"{_DL_CODES[dtype.code]}{dtype.bits}"
    else:
        dname = f"dlpack_code{dtype.code}_{dtype.bits}"
    ndim = int(t.ndim)
    shape = tuple(int(t.shape[i]) for i in range(ndim))
    strides = tuple(int(t.strides[i]) * item for i in range(ndim)) if t.strides else None
    dev_type, dev_id = int(t.device.device_type), int(t.device.device_id)
    ptr_ = (t.data or 0) + int(t.byte_offset)
    del t, cap
    if dev_type in (_kDLCUDA, _kDLCUDAManaged):
        device = dev_id
    elif dev_type == _kDLCUDAHost:
        device = None  # pinned host memory, mapped for every device
    else:
        raise _arg_error(where, f"{name} is in {_DL_DEVICE_NAMES.get(dev_type, f'DLPack device type {dev_type}')} "
                                "memory; it must be in CUDA device memory")
    return BufferInfo(ptr_, shape, strides, dname, item, device, "dlpack")


_CAI_KINDS = {"f": "float", "i": "int", "u": "uint", "c": "complex"}


def _cai_dtype(typestr: str, name, where):
    if not isinstance(typestr, str) or len(typestr) < 3 or not typestr[2:].isdigit():
        raise _arg_error(where, f"{name}: __cuda_array_interface__ typestr {typestr!r} is malformed")
    order, kind, item = typestr[0], typestr[1], int(typestr[2:])
    if order == ">" and item > 1:
        raise _arg_error(where, f"{name}: big-endian typestr {typestr!r}")
    if kind == "b":
        dname = "bool"
    elif kind == "V":
        dname = f"void{8 * item}"
    elif kind in _CAI_KINDS:
        dname = f"{_CAI_KINDS[kind]}{8 * item}"
    else:
        raise _arg_error(where, f"{name}: typestr {typestr!r} is not a numeric or raw-bytes type")
    return dname, item


def _cai_device(obj):
    dev = getattr(obj, "device", None)
    if isinstance(dev, int) and not isinstance(dev, bool):
        return dev
    dev_id = getattr(dev, "id", None)  # CuPy: cupy.cuda.Device
    if isinstance(dev_id, int) and not isinstance(dev_id, bool):
        return dev_id
    return None


def _from_cai(obj, cai, name, where) -> BufferInfo:
    if not isinstance(cai, dict) or "shape" not in cai or "typestr" not in cai or "data" not in cai:
        raise _arg_error(where, f"{name}: __cuda_array_interface__ lacks shape, typestr or data")
    if cai.get("mask") is not None:
        raise _arg_error(where, f"{name}: a masked __cuda_array_interface__ array is not supported")
    dname, item = _cai_dtype(cai["typestr"], name, where)
    data = cai["data"]
    p = int(data[0] or 0) if data is not None else 0
    return BufferInfo(p, tuple(cai["shape"]), cai.get("strides"), dname, item, _cai_device(obj), "cai")


def describe(obj, name: str = "buffer", where: str = "") -> BufferInfo:
    """BufferInfo of a buffer object. PyTorch tensors: through their attributes (no capsule);
    objects with ``__dlpack__``: through a DLPack capsule (read, not consumed), falling back to
    ``__cuda_array_interface__`` (v2/v3) when the producer refuses; then CAI. TypeError for
    anything else (raw int addresses are not described: they are the unchecked escape hatch)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, getattr(torch, "Tensor", ())):
        return _from_torch(obj, name, where)
    refused = None
    if hasattr(obj, "__dlpack__"):
        try:
            return _from_dlpack(obj, name, where)
        except _NotThroughDLPack as e:
            refused = str(e)
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        cai = None
    if cai is not None:
        return _from_cai(obj, cai, name, where)
    if refused is not None:
        raise _arg_error(where, f"{name}: its __dlpack__ failed ({refused}) and it has no __cuda_array_interface__")
    raise TypeError(f"epfuse: {where + ': ' if where else ''}{name} is a {type(obj).__name__}, not a device buffer "
                    "(an object with __dlpack__ or __cuda_array_interface__, or an int address)")


def ptr(obj) -> int:
    """The device address of a buffer argument (0 for None). No checks: the pointer-level escape
    hatch (Group's methods check their buffers through BufferChecks instead)."""
    if obj is None:
        return 0
    if isinstance(obj, int) and not isinstance(obj, bool):
        return obj
    return describe(obj).ptr


def stream_handle(s) -> int:
    """A cudaStream_t value for a stream argument: None (the legacy default stream), an int handle,
    or an object with an int ``cuda_stream`` (torch.cuda.Stream), ``ptr`` (CuPy) or ``handle``."""
    from ._checks import UINT64_MAX, int_in
    if s is None:
        return 0
    if isinstance(s, int) and not isinstance(s, bool):
        return int_in(s, "stream", 0, UINT64_MAX, why="a cudaStream_t handle")
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(s, attr, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return int_in(v, f"stream.{attr}", 0, UINT64_MAX, why="a cudaStream_t handle")
    raise TypeError(f"epfuse: {type(s).__name__} is not a CUDA stream (None, an int handle, or an object with an int "
                    "cuda_stream / ptr / handle)")


# ---- per-argument checks ---------------------------------------------------------------------------
# dtype families: name -> (accepted dtype names, label for messages)
BF16 = (("bfloat16", "uint16", "int16", "void16"), "bfloat16 (or its bits as uint16 / int16)")
F32 = (("float32",), "float32")
INDEX = (("int32", "int64"), "int32 or int64")
I32 = (("int32",), "int32")
WORD32 = (("int32", "uint32"), "int32 or uint32")
ANY = (None, "any dtype")

_DTYPE_HINTS = {
    ("float16", BF16[1]): " (float16 is another format than bfloat16; BF16 bits held in a 2-byte integer "
                          "tensor are accepted)",
}


class BufferChecks:
    """The buffer arguments of one call, checked against what the call will touch: `where` names
    the call in messages, `count` is the number of ranks the buffers hold (the group's count),
    `device` the group's CUDA device (None: not checked)."""

    def __init__(self, where: str, count: int, device):
        self.where, self.count, self.device = where, count, device

    # -- common part ------------------------------------------------------------------------------
    def _get(self, obj, name, required):
        """(address, BufferInfo or None): None -> (0, None) unless required; an int -> the address
        unchecked; anything else described and checked for device and contiguity."""
        from ._checks import address
        if obj is None:
            if required:
                raise _arg_error(self.where, f"{name} is required (got None)")
            return 0, None
        if isinstance(obj, int) and not isinstance(obj, bool):
            a = address(obj, name)
            if a == 0 and required:
                raise _arg_error(self.where, f"{name} is required (got the address 0)")
            return a, None
        info = describe(obj, name, self.where)
        if self.device is not None and info.device is not None and info.device != self.device:
            raise _arg_error(self.where, f"{name} is on cuda:{info.device}; this group runs on cuda:{self.device}")
        if not info.c_contiguous:
            raise _arg_error(self.where, f"{name} must be C-contiguous (row-major, no gaps); got shape {info.shape} "
                                         f"with byte strides {info.strides} (a transposed or sliced view? "
                                         "pass .contiguous())")
        if info.ptr == 0 and info.size > 0:
            raise _arg_error(self.where, f"{name} has a NULL data pointer")
        if info.ptr % info.itemsize:
            raise _arg_error(self.where, f"{name} at 0x{info.ptr:x} is not aligned to its {info.itemsize}-byte "
                                         f"{info.dtype} elements")
        return info.ptr, info

    def _align(self, p, name, align):
        if align and p % align:
            from ._errors import EpfValueError
            raise EpfValueError(12, f"epfuse: {self.where}: {name} at 0x{p:x} is not {align}-byte aligned (its rows "
                                    f"are moved {align} bytes at a time; a view starting mid-row? pass a copy)")

    def _dtype(self, info, name, family, label=None):
        names, flabel = family
        if names is not None and info.dtype not in names:
            hint = _DTYPE_HINTS.get((info.dtype, flabel), "")
            raise _arg_error(self.where, f"{name} must be {label or flabel}; got {info.dtype}{hint}")

    # -- [count][rows][width] buffers ------------------------------------------------------------------
    def rows(self, obj, name, *, width, family, stride_rows, min_rows=0, width_bytes=False, required=True,
             row_label="T", width_label=None, dtype_label=None, align=0):
        """A buffer of `count` blocks of rows: [count][rows][width] (or [count][rows] for width None).
        With count > 1 the library finds block r at r * stride_rows rows, so rows must equal
        stride_rows (None: the buffer's rows are the stride); with count 1 the leading [1] may be
        left out and rows >= min_rows is enough.
        width_bytes: `width` is the row's bytes (payload rows of any dtype), not elements. align:
        the byte alignment the kernels need of the address (row buffers: 16).
        Returns (address, rows, dtype name) — rows and dtype None for a raw address or an absent
        optional (address 0)."""
        p, info = self._get(obj, name, required)
        if info is None:
            return p, None, None
        self._dtype(info, name, family, dtype_label)
        self._align(p, name, align)
        wl = width_label or (f"{width} bytes" if width_bytes else str(width))
        tail = 1 if width is not None else 0
        lead = f"[{self.count}]" if self.count > 1 else "[1]"
        want = f"{lead}[{row_label}]" + (f"[{wl}]" if width is not None else "")
        if self.count == 1:
            want += " (the leading [1] may be left out)"
        elif stride_rows is not None:
            want += f" with {row_label} = {stride_rows} (the per-rank stride)"
        bad = None
        nd = info.ndim
        if self.count > 1:
            if nd != 2 + tail or info.shape[0] != self.count:
                bad = "shape"
        elif not (nd == 1 + tail or (nd == 2 + tail and info.shape[0] == 1)):
            bad = "shape"
        if bad is None and width is not None:
            got_w = info.shape[-1] * info.itemsize if width_bytes else info.shape[-1]
            if got_w != width:
                bad = "width"
        if bad is not None:
            raise _arg_error(self.where, f"{name} must be {want} {dtype_label or family[1]}; got shape "
                                         f"{info.shape} {info.dtype}")
        rows = info.shape[-1 - tail]
        if self.count > 1 and stride_rows is not None and rows != stride_rows:
            raise _arg_error(self.where, f"{name} has {rows} rows per rank; with {self.count} ranks in one buffer it "
                                         f"must have exactly {stride_rows} ({want})")
        if rows < min_rows:
            raise _arg_error(self.where, f"{name} has {rows} rows; this call reads or writes {min_rows}")
        return p, rows, info.dtype

    # -- flat per-rank buffers -------------------------------------------------------------------------
    def sized(self, obj, name, *, rank_bytes, family=ANY, required=False, dtype_label=None, count=None, align=0):
        """A buffer of `count` per-rank parts of rank_bytes each (LL operand buffers, handle memory,
        mask words): any shape, C-contiguous, at least count * rank_bytes bytes; with count > 1 and
        two or more dimensions, the leading dimension must be the ranks (count of them,
        rank_bytes apart). Returns (address, nbytes) — nbytes None for a raw address."""
        count = self.count if count is None else count
        p, info = self._get(obj, name, required)
        if info is None:
            return p, None
        self._dtype(info, name, family, dtype_label)
        self._align(p, name, align)
        need = count * rank_bytes
        if count > 1 and info.ndim >= 2 and (info.shape[0] != count or info.strides[0] != rank_bytes):
            raise _arg_error(self.where, f"{name}: its leading dimension must be the {count} ranks, {rank_bytes} bytes "
                                         f"apart; got shape {info.shape} with byte strides {info.strides}")
        if info.nbytes < need:
            per = f" ({count} x {rank_bytes})" if count > 1 else ""
            raise _arg_error(self.where, f"{name} has {info.nbytes} bytes; the call touches {need}{per}")
        return p, info.nbytes


class DeviceArray:
    """A view of device memory that PyTorch (``torch.as_tensor(a, device='cuda')``), CuPy
    (``cupy.asarray(a)``) and Numba read without a copy (``__cuda_array_interface__`` v3).
    ``owner`` keeps whatever owns the memory alive; ``device`` (the CUDA ordinal, or None when
    unknown) lets epfuse refuse the view on another group's device."""

    def __init__(self, address: int, shape, typestr: str = "|u1", strides=None, owner=None, device=None):
        from ._checks import UINT64_MAX, as_int, int_in
        self.ptr = int_in(address, "address", 0, UINT64_MAX, why="a device address")
        self.shape = tuple(int_in(d, "shape[i]", 0, 2**63 - 1) for d in shape)
        _cai_dtype(typestr, "typestr", "DeviceArray")
        self.typestr = typestr
        self.strides = None if strides is None else tuple(as_int(st, "strides[i]") for st in strides)
        if self.strides is not None and len(self.strides) != len(self.shape):
            raise ValueError(f"epfuse: DeviceArray: {len(self.strides)} strides for {len(self.shape)} dimensions")
        self.device = None if device is None else int_in(device, "device", 0, 2**31 - 1)
        self._owner = owner

    @property
    def itemsize(self) -> int:
        return int(self.typestr[2:])

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.typestr, "data": (self.ptr, False), "version": 3,
                "strides": self.strides, "stream": None}

    def __repr__(self):
        return f"DeviceArray(0x{self.ptr:x}, shape={self.shape}, typestr={self.typestr!r})"


class DeviceBuffer(DeviceArray):
    """cudaMalloc'd bytes (through libepfuse.so), freed with the object or by close()."""

    def __init__(self, nbytes: int, zero: bool = True):
        from ._checks import INT64_MAX, int_in
        nbytes = int_in(nbytes, "nbytes", 0, INT64_MAX)
        p = c_void_p()
        check(_abi.epf_cuda_malloc(ctypes.byref(p), max(nbytes, 1)), "cudaMalloc")
        dev = ctypes.c_int(-1)
        if _abi.epf_cuda_get_device(ctypes.byref(dev)) != 0:
            dev.value = -1
        super().__init__(p.value or 0, (nbytes,), "|u1", device=dev.value if dev.value >= 0 else None)
        if zero:
            check(_abi.epf_cuda_memset_async(self.ptr, 0, max(nbytes, 1), None), "cudaMemsetAsync")
            check(_abi.epf_cuda_stream_synchronize(None), "cudaStreamSynchronize")

    def close(self):
        if self.ptr:
            _abi.epf_cuda_free(self.ptr)
            self.ptr = 0

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


class MappedHost:
    """Pinned, mapped host memory: ``host`` (the CPU address) and ``device`` (its GPU address)."""

    def __init__(self, nbytes: int):
        from ._checks import INT64_MAX, int_in
        nbytes = int_in(nbytes, "nbytes", 1, INT64_MAX)
        h, d = c_void_p(), c_void_p()
        check(_abi.epf_cuda_host_alloc_mapped(ctypes.byref(h), ctypes.byref(d), nbytes), "cudaHostAlloc")
        self.host, self.device, self.nbytes = h.value, d.value, int(nbytes)

    def close(self):
        if self.host:
            _abi.epf_cuda_free_host(self.host)
            self.host = self.device = 0

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
