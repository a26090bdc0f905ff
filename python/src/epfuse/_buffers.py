"""Device buffers and streams without a hard dependency on any array package.

A device buffer argument may be any object with ``__cuda_array_interface__`` (PyTorch CUDA
tensors, CuPy arrays, Numba, ``DeviceArray`` below), any object with ``__dlpack__`` (DLPack
capsule on a CUDA device), or a raw device address (int). A stream may be None (the legacy default
stream), an int handle, a ``torch.cuda.Stream`` (``cuda_stream``) or a CuPy stream (``ptr``).
"""
from __future__ import annotations

import ctypes
import math
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


def _dlpack_ptr(obj) -> int:
    cap = obj.__dlpack__()
    name = _capsule_name(cap)
    p = _capsule_ptr(cap, name)
    if name == b"dltensor_versioned":
        t = _DLManagedTensorVersioned.from_address(p).dl_tensor
    else:
        t = _DLManagedTensor.from_address(p).dl_tensor
    if t.device.device_type not in (_kDLCUDA, _kDLCUDAHost, _kDLCUDAManaged):
        raise ValueError(f"epfuse: a DLPack tensor on device type {t.device.device_type} is not CUDA memory")
    return (t.data or 0) + t.byte_offset


def ptr(obj) -> int:
    """The device address of a buffer argument (0 for None)."""
    if obj is None:
        return 0
    if isinstance(obj, int):
        return obj
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0] or 0)
    if hasattr(obj, "__dlpack__"):
        return _dlpack_ptr(obj)
    raise TypeError(f"epfuse: {type(obj).__name__} is not a device buffer (no __cuda_array_interface__ or __dlpack__)")


def stream_handle(s) -> int:
    """A cudaStream_t value for a stream argument."""
    if s is None:
        return 0
    if isinstance(s, int):
        return s
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(s, attr, None)
        if isinstance(v, int):
            return v
    raise TypeError(f"epfuse: {type(s).__name__} is not a CUDA stream")


class DeviceArray:
    """A view of device memory that PyTorch (``torch.as_tensor(a, device='cuda')``), CuPy
    (``cupy.asarray(a)``) and Numba read without a copy (``__cuda_array_interface__`` v3).
    ``owner`` keeps whatever owns the memory alive."""

    def __init__(self, address: int, shape, typestr: str = "|u1", strides=None, owner=None):
        self.ptr = int(address)
        self.shape = tuple(int(s) for s in shape)
        self.typestr = typestr
        self.strides = None if strides is None else tuple(int(s) for s in strides)
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
        p = c_void_p()
        check(_abi.epf_cuda_malloc(ctypes.byref(p), max(int(nbytes), 1)), "cudaMalloc")
        super().__init__(p.value or 0, (int(nbytes),), "|u1")
        if zero:
            check(_abi.epf_cuda_memset_async(self.ptr, 0, max(int(nbytes), 1), None), "cudaMemsetAsync")
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
        h, d = c_void_p(), c_void_p()
        check(_abi.epf_cuda_host_alloc_mapped(ctypes.byref(h), ctypes.byref(d), int(nbytes)), "cudaHostAlloc")
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
