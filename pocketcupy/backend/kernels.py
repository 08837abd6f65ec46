"""Loading our CUDA kernels: reads cuda_src/*.cu, prefixes a #line directive so compiler errors
name the real file and line, compiles with NVRTC through cupy.RawModule for the current device's
architecture, and caches the modules (CuPy also caches the binaries on disk, keyed on the source,
which carries a hash of the headers).

Launchers register the op names they implement with @cuda_op; the kernel test table fails for
any registered op without a row."""
from __future__ import annotations

import functools
import hashlib
import os

import numpy as np

CUDA_SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "cuda_src")
REGISTERED_OPS: set[str] = set()


def cuda_op(name: str):
    """Mark a launcher as implementing the CUDA op `name` (one row per op in tests/test_kernels.py)."""
    def wrap(fn):
        REGISTERED_OPS.add(name)
        fn.cuda_op_name = name
        return fn
    return wrap


@functools.lru_cache(maxsize=None)
def compute_capability() -> int:
    """The current device's, e.g. 90 for sm_90."""
    import cupy

    return int(cupy.cuda.Device().compute_capability)


def device_arch() -> str:
    return f"sm_{compute_capability()}"


@functools.lru_cache(maxsize=None)
def num_sms() -> int:
    """The current device's streaming multiprocessors."""
    import cupy

    return int(cupy.cuda.Device().attributes["MultiProcessorCount"])


@functools.lru_cache(maxsize=None)
def max_block_smem() -> int:
    """The dynamic shared memory a block may opt in to on the current device (bytes)."""
    import cupy

    return int(cupy.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"])


def has_tensor_cores() -> bool:
    """mma.sync m16n8k16 (the *_mma kernels) needs sm_80+."""
    return compute_capability() >= 80


def read_source(filename: str) -> str:
    path = os.path.join(CUDA_SRC, filename)
    with open(path) as f:
        return f'#line 1 "{path}"\n' + f.read()


@functools.lru_cache(maxsize=None)
def headers_digest() -> str:
    """A hash of every cuda_src/*.cuh: CuPy's disk cache keys a binary on the source it was given,
    not on the headers that source includes, so the source carries this to miss the cache when a
    header changes."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(CUDA_SRC)):
        if name.endswith(".cuh"):
            with open(os.path.join(CUDA_SRC, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def module(filename: str, name_expressions: tuple[str, ...] = (), defines: tuple[str, ...] = ()):
    """The compiled RawModule of cuda_src/<filename> (templates instantiated by name_expressions)."""
    import cupy

    options = ("-std=c++17", f"-I{CUDA_SRC}", f"--gpu-architecture={device_arch()}") + \
        tuple(f"-D{d}" for d in defines)
    code = read_source(filename) + f"\n// cuda_src headers {headers_digest()}\n"
    mod = cupy.RawModule(code=code, options=options,
                         name_expressions=list(name_expressions) or None)
    mod.compile()
    return mod


def kernel(filename: str, name: str, name_expressions: tuple[str, ...] = (), defines: tuple[str, ...] = ()):
    """One kernel function; `name` may be a template instantiation listed in name_expressions.
    Called like CuPy's Function; inside pdl.enabled() it launches with programmatic dependencies."""
    from .pdl import Kernel

    return Kernel(module(filename, name_expressions, defines).get_function(name))


def smem_kernel(filename: str, expr: str, smem: int):
    """kernel() of a template instance `expr` that takes `smem` bytes of dynamic shared memory, its opt-in
    raised to that the first time (a ValueError where the device allows less)."""
    fn = kernel(filename, expr, name_expressions=(expr,))
    if fn.fn.max_dynamic_shared_size_bytes < smem:
        if smem > max_block_smem():
            raise ValueError(f"{expr}: needs {smem} bytes of shared memory a block, this device allows "
                             f"{max_block_smem()}")
        fn.fn.max_dynamic_shared_size_bytes = smem
    return fn


def null_arg():
    """A null pointer kernel argument."""
    return np.uint64(0)


def opt_arg(a):
    """An optional array kernel argument: a null pointer for None."""
    return null_arg() if a is None else a


def grid_blocks(n: int, threads: int, cap: int = 1 << 16) -> int:
    """Blocks of `threads` covering n work items, at least 1 and at most cap."""
    return max(1, min((n + threads - 1) // threads, cap))
