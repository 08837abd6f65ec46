"""Every .cu file compiles with nvcc for every architecture we ship for (skips without nvcc).

The check is whether the code compiles (templates, intrinsics and instructions each architecture
has), so the front end and ptxas run at nvcc's fastest compile level (-Ofc max, which also drops the
-O0 stack bounds checks ptxas adds) and only the device code is built (-fatbin: the kernels are
NVRTC's, never host-compiled): a third of -O0's time on two cores, and it changes nothing that
could fail (each arch's SASS is still built by ptxas); the optimized build is NVRTC's, which the GPU
tests run."""
import functools
import glob
import os
import shutil
import subprocess

import pytest

from pocketcupy.backend.kernels import CUDA_SRC

ARCHS = ["75", "80", "86", "89", "90"]
SOURCES = sorted(glob.glob(os.path.join(CUDA_SRC, "*.cu")))


@functools.cache
def fastest() -> list[str]:
    """-Ofc max where nvcc has it (recent releases), else the front end and ptxas at -O0."""
    help_text = subprocess.run(["nvcc", "--help"], capture_output=True, text=True, timeout=60).stdout
    return ["-Ofc", "max"] if "--Ofast-compile" in help_text else ["-Xcicc", "-O0", "-Xptxas", "-O0"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("src", SOURCES, ids=[os.path.basename(s) for s in SOURCES])
def test_compiles_for_all_archs(src, tmp_path):
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS]
    cmd = ["nvcc", "-std=c++17", f"-I{CUDA_SRC}", "-fatbin", "--threads", "2", *fastest(),
           *gencode, "-o", str(tmp_path / "out.fatbin"), src]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]


def test_headers_digest_follows_the_headers(tmp_path, monkeypatch):
    """CuPy's disk cache keys a binary on the source text alone; module() appends headers_digest so
    that an edited .cuh misses the cache. The digest changes with a header's text and with a new
    header, and ignores other files."""
    from pocketcupy.backend import kernels

    def digest():
        kernels.headers_digest.cache_clear()
        return kernels.headers_digest()

    (tmp_path / "a.cuh").write_text("#define A 1\n")
    (tmp_path / "k.cu").write_text("__global__ void k() {}\n")
    monkeypatch.setattr(kernels, "CUDA_SRC", str(tmp_path))
    try:
        first = digest()
        (tmp_path / "k.cu").write_text("__global__ void k2() {}\n")
        assert digest() == first
        (tmp_path / "a.cuh").write_text("#define A 2\n")
        second = digest()
        assert second != first
        (tmp_path / "b.cuh").write_text("\n")
        assert digest() not in (first, second)
    finally:
        monkeypatch.undo()
        kernels.headers_digest.cache_clear()
