"""epf_status_t as Python exceptions."""
from __future__ import annotations

from . import _abi

EPF_OK = 0
EPF_ERR_INVALID_ARGUMENT = 1
EPF_ERR_CUDA = 24
EPF_ERR_NCCL = 25
EPF_ERR_NOT_SUPPORTED = 26


def status_name(status: int) -> str:
    return _abi.epf_status_name(int(status)).decode()


def status_message(status: int) -> str:
    return _abi.epf_status_message(int(status)).decode()


class EpfError(RuntimeError):
    """A failed epfuse call: ``status`` (int), ``name`` ("EPF_ERR_..."), ``message`` (the library's
    sentence for the status) and, for EPF_ERR_CUDA, ``cuda_error`` / ``cuda_message``."""

    def __init__(self, status: int, what: str = ""):
        self.status = int(status)
        self.name = status_name(self.status)
        self.message = status_message(self.status)
        self.what = what
        self.cuda_error = None
        self.cuda_message = None
        text = f"{what + ': ' if what else ''}{self.name}: {self.message}"
        if self.status == EPF_ERR_CUDA:
            self.cuda_error = int(_abi.epf_cuda_last_error())
            self.cuda_message = _abi.epf_cuda_error_string(self.cuda_error).decode()
            text += f" (CUDA error {self.cuda_error}: {self.cuda_message})"
        super().__init__(text)


class EpfValueError(EpfError, ValueError):
    """An argument refused in Python before any C call (out of range, a zero that would silently
    mean "default", a buffer of the wrong dtype, shape, layout, device or size). Both a ValueError
    and an EpfError: ``status`` / ``name`` are the library status of the rule (EPF_ERR_TOPK for a
    top_k out of range, EPF_ERR_INVALID_ARGUMENT for most buffer errors), and the text says which
    argument, what was expected and what was given."""

    def __init__(self, status: int, what: str):
        EpfError.__init__(self, status, what)
        self.args = (f"{what} [{self.name}]",)

    def __str__(self):
        return self.args[0]


class NcclVersionWarning(RuntimeWarning):
    """The NCCL loaded at run time is not one libepfuse.so can use (older than the release it was
    built against, or, for a build against NCCL 2.28 headers, any other release)."""


def check(status: int, what: str = "") -> None:
    if status != EPF_OK:
        raise EpfError(status, what)
