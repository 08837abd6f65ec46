"""The CUDA kernel test table: every KernelRow of every tests/kernel_rows_*.py module runs on fresh
random inputs against its NumPy reference, with the output buffers poisoned beforehand, compared
by normalised error. Every op registered with @cuda_op (after importing all launcher modules,
pocketcupy/backend/*_cuda.py) must have at least one row; that check needs no GPU."""
import copy
import glob
import importlib
import os
import pkgutil
import zlib

import numpy as np
import pytest

import pocketcupy.backend as backend
from pocketcupy.backend.kernels import REGISTERED_OPS

HERE = os.path.dirname(os.path.abspath(__file__))


def import_launchers() -> list[str]:
    names = [m.name for m in pkgutil.iter_modules(backend.__path__) if m.name.endswith("_cuda")]
    for name in names:
        importlib.import_module(f"pocketcupy.backend.{name}")
    return names


def collect_rows() -> list:
    rows = []
    for path in sorted(glob.glob(os.path.join(HERE, "kernel_rows_*.py"))):
        rows.extend(importlib.import_module(f"tests.{os.path.basename(path)[:-3]}").ROWS)
    return rows


import_launchers()
ROWS = collect_rows()


def poison(shape, dtype):
    """An output buffer full of NaN (floats) or 0xFF bytes (everything else), on the GPU."""
    import cupy

    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return cupy.full(shape, np.nan, dtype)
    a = cupy.empty(shape, dtype)
    a.view(cupy.uint8).fill(0xFF)
    return a


def normalised_error(got, ref) -> float:
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        return float("inf")
    got, ref = got.astype(np.float64), ref.astype(np.float64)
    err, norm = np.linalg.norm(got - ref), np.linalg.norm(ref)
    return float(err / norm) if norm > 0 else float(err)


def run_row(row):
    """The normalised error of each output of one row."""
    import cupy

    rng = np.random.default_rng(zlib.crc32(f"{row.op}-{row.id}".encode()))
    inputs = row.make(rng)
    ref = row.ref(copy.deepcopy(inputs))
    got = row.cuda(inputs, poison)
    cupy.cuda.Device().synchronize()
    refs, gots = (ref, got) if isinstance(ref, (tuple, list)) else ((ref,), (got,))
    assert isinstance(got, (tuple, list)) == isinstance(ref, (tuple, list)) and len(refs) == len(gots), \
        f"{row.op}-{row.id}: the CUDA op returned {type(got)}, the reference {type(ref)}"
    return [normalised_error(cupy.asnumpy(g) if isinstance(g, cupy.ndarray) else g, r) for g, r in zip(gots, refs)]


def test_every_registered_op_has_a_row():
    missing = sorted(REGISTERED_OPS - {r.op for r in ROWS})
    assert not missing, f"CUDA ops without a row in tests/kernel_rows_*.py: {missing}"


def test_row_ids_are_unique():
    ids = [f"{r.op}-{r.id}" for r in ROWS]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})


@pytest.mark.gpu
@pytest.mark.parametrize("row", ROWS, ids=[f"{r.op}-{r.id}" for r in ROWS])
def test_kernel_row(row):
    errs = run_row(row)
    tols = row.tol if isinstance(row.tol, tuple) else (row.tol,) * len(errs)
    for i, (err, tol) in enumerate(zip(errs, tols, strict=True)):
        assert err <= tol, f"output {i}: normalised error {err:.3e} > {tol:.1e}"
