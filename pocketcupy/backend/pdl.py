"""Programmatic dependent launch (sm_90+): inside a captured decode graph our kernels are
launched through cuLaunchKernelEx with the programmatic-stream-serialization attribute, so
each kernel's blocks start (and prefetch their weights) while the kernel before it drains,
instead of after it has finished. The kernels' side of the contract is cuda_src/pdl.cuh.

CuPy's RawKernel only launches through cuLaunchKernel, so this calls the driver through
ctypes; it costs more host time than CuPy's launch, which is why only graph capture (where
launch cost is paid once) uses it. POCKETCUPY_PDL=0 turns it off (for A/B measurements)."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os

import numpy as np

_PROGRAMMATIC_STREAM_SERIALIZATION = 6      # CUlaunchAttributeID
_active = False


class _AttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("align", ctypes.c_uint64), ("flag", ctypes.c_int)]


class _Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttrValue)]


class _Config(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_Attr)), ("num_attrs", ctypes.c_uint)]


def supported() -> bool:
    """sm_90 or newer, and not turned off by POCKETCUPY_PDL=0."""
    from .kernels import compute_capability

    return os.environ.get("POCKETCUPY_PDL", "1") != "0" and compute_capability() >= 90


@functools.lru_cache(maxsize=None)
def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                     ctypes.c_void_p]
    lib.cuLaunchKernelEx.restype = ctypes.c_int
    return lib


@contextlib.contextmanager
def enabled():
    """Launch our kernels with programmatic dependencies inside this block (where supported)."""
    global _active
    old, _active = _active, supported()
    try:
        yield
    finally:
        _active = old


def _dims(d) -> tuple[int, int, int]:
    d = (d,) if isinstance(d, int) else tuple(d)
    return tuple(int(v) for v in d) + (1,) * (3 - len(d))


def _arg_value(a) -> np.ndarray:
    """A kernel argument as a 0-d array holding its bytes, by CuPy's rules: arrays and None as
    pointers, NumPy scalars as themselves, Python int / float as int64 / float64."""
    import cupy

    if a is None:
        return np.array(0, np.uint64)
    if isinstance(a, cupy.ndarray):
        return np.array(a.data.ptr, np.uint64)
    if isinstance(a, np.generic):
        return np.array(a)
    if isinstance(a, bool):
        return np.array(a, np.bool_)
    if isinstance(a, int):
        return np.array(a, np.int64)
    if isinstance(a, float):
        return np.array(a, np.float64)
    raise TypeError(f"kernel argument of type {type(a).__name__} is not supported")


def launch(fn, grid, block, args, shared_mem: int = 0) -> None:
    """fn (a cupy RawKernel) on the current stream, allowed to overlap the kernel before it."""
    import cupy

    values = [_arg_value(a) for a in args]
    params = (ctypes.c_void_p * max(1, len(values)))(*[v.ctypes.data for v in values])
    attr = _Attr(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value.flag = 1
    cfg = _Config((ctypes.c_uint * 3)(*_dims(grid)), (ctypes.c_uint * 3)(*_dims(block)), int(shared_mem),
                  cupy.cuda.get_current_stream().ptr, ctypes.pointer(attr), 1)
    rc = _driver().cuLaunchKernelEx(ctypes.byref(cfg), fn.kernel.ptr, params, None)
    if rc != 0:
        raise RuntimeError(f"cuLaunchKernelEx failed with CUresult {rc}")


class Kernel:
    """A compiled kernel, called like CuPy's Function: k(grid, block, args, shared_mem=0)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, grid, block, args, shared_mem: int = 0):
        if _active:
            launch(self.fn, grid, block, args, shared_mem)
        else:
            self.fn(grid, block, args, shared_mem=shared_mem)
