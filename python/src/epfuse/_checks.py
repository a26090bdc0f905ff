"""Scalar arguments checked before they reach C: no wrap-around, no silent zero defaults.

ctypes converts a Python int into a C int32 field modulo 2**32 (``hidden=2**32 + 256`` becomes
256), and the library reads 0 in most configuration fields as "the default": so every integer the
package hands to C is checked here first. Integers are Python ints or objects with ``__index__``
(NumPy / PyTorch integer scalars); bool, float, str and anything else raise TypeError. A value
out of the C field's range, or out of the library's limits, raises EpfValueError (a ValueError and
an EpfError) naming the argument, the allowed range and the value given.
"""
from __future__ import annotations

import math
import operator

from ._errors import EPF_ERR_INVALID_ARGUMENT, EpfValueError

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1

# epf_status_t values used for range errors (include/epfuse/status.h; stable ABI)
EPF_ERR_RANKS = 3
EPF_ERR_RANK = 4
EPF_ERR_EXPERTS = 5
EPF_ERR_EXPERTS_NOT_DIVISIBLE = 6
EPF_ERR_TOPK = 7
EPF_ERR_HIDDEN = 8
EPF_ERR_TOKENS = 10
EPF_ERR_RECV_CAPACITY = 11
EPF_ERR_ALIGNMENT = 12
EPF_ERR_FLAGS = 17


def _is_bool(value) -> bool:
    # bool, numpy.bool_ (its __index__ is refused by recent NumPy, older ones accepted it)
    return isinstance(value, bool) or type(value).__name__ in ("bool_", "bool8")


def as_int(value, name: str) -> int:
    """`value` as a Python int: int or an integer-like scalar (operator.index); TypeError for
    bool, float, str, None and anything else."""
    if _is_bool(value):
        raise TypeError(f"epfuse: {name} must be an int, not a bool ({value!r})")
    if isinstance(value, int):
        return int(value)
    if isinstance(value, (float, complex, str, bytes)) or value is None:
        raise TypeError(f"epfuse: {name} must be an int, got {type(value).__name__} {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"epfuse: {name} must be an int, got {type(value).__name__} {value!r}") from None


def int_in(value, name: str, lo: int, hi: int, *, status: int = EPF_ERR_INVALID_ARGUMENT, why: str = "",
           where: str = "") -> int:
    """as_int(value) within [lo, hi] (inclusive), else EpfValueError(status)."""
    v = as_int(value, name)
    if not lo <= v <= hi:
        prefix = f"epfuse: {where}: " if where else "epfuse: "
        raise EpfValueError(status, f"{prefix}{name}={v} is outside [{lo}, {hi}]{' (' + why + ')' if why else ''}")
    return v


def optional_int_in(value, name: str, lo: int, hi: int, **kw):
    """None stays None (the library's default); anything else as int_in."""
    return None if value is None else int_in(value, name, lo, hi, **kw)


def positive_seconds(value, name: str = "timeout_s") -> float:
    """A positive, finite number of seconds (int or float; not bool, not str)."""
    if _is_bool(value) or isinstance(value, (str, bytes)) or value is None:
        raise TypeError(f"epfuse: {name} must be a number of seconds, got {type(value).__name__} {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"epfuse: {name} must be a number of seconds, got {type(value).__name__} {value!r}") from None
    if not math.isfinite(v) or v <= 0.0:
        raise EpfValueError(EPF_ERR_INVALID_ARGUMENT, f"epfuse: {name}={value!r} must be a positive, finite "
                                                      "number of seconds")
    return v


def address(value, name: str) -> int:
    """A raw device address given as an int: 0 <= value < 2**64."""
    return int_in(value, name, 0, UINT64_MAX, why="a device address")
