"""Every .cu file compiles with nvcc for every architecture we ship for (skips without nvcc).

The check is whether the code compiles (templates, intrinsics and instructions each architecture
has), so the front end and ptxas run without optimization (-O0): that halves the time on CI's two
cores and changes nothing that could fail; the optimized build is NVRTC's, which the GPU tests run."""
import glob
import os
import shutil
import subprocess

import pytest

from pocketcupy.backend.kernels import CUDA_SRC

ARCHS = ["75", "80", "86", "89", "90"]
SOURCES = sorted(glob.glob(os.path.join(CUDA_SRC, "*.cu")))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("src", SOURCES, ids=[os.path.basename(s) for s in SOURCES])
def test_compiles_for_all_archs(src, tmp_path):
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS]
    cmd = ["nvcc", "-std=c++17", f"-I{CUDA_SRC}", "-c", "--threads", "2", "-Xcicc", "-O0", "-Xptxas", "-O0",
           *gencode, "-o", str(tmp_path / "out.o"), src]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
