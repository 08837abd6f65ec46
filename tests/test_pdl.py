"""Programmatic dependent launch: every kernel keeps pdl.cuh's contract (checked in the source),
and pdl.py's ctypes structs match cuda.h (checked against the C compiler where cuda.h is)."""
import ctypes
import glob
import os
import re
import shutil
import subprocess

import pytest

from pocketcupy.backend import pdl
from pocketcupy.backend.kernels import CUDA_SRC


def _body(src: str, after: int) -> str:
    """The brace-matched body of the function whose signature starts before `after`."""
    start = src.index("{", after)
    depth, i = 0, start
    while True:
        depth += {"{": 1, "}": -1}.get(src[i], 0)
        if depth == 0:
            return src[start + 1:i]
        i += 1


def _with_headers(src: str, seen=None) -> str:
    """src followed by the cuda_src headers it includes, transitively (where device functions a
    kernel calls may be defined)."""
    seen = set() if seen is None else seen
    out = [src]
    for name in re.findall(r'#include "([\w.]+)"', src):
        path = os.path.join(CUDA_SRC, name)
        if name not in seen and os.path.exists(path):
            seen.add(name)
            out.append(_with_headers(open(path).read(), seen))
    return "\n".join(out)


def _waiting_body(src: str, body: str) -> str:
    """body, or where it has no pdl_wait() the body of the first device function of this file or
    its headers it calls that has one (a kernel whose body function waits inside, after its
    pre-wait reads)."""
    if "pdl_wait();" in body:
        return body
    for called in re.findall(r"(\w+)\s*(?:<[^<>()]*>)?\s*\(", body):
        m = re.search(r"(?:__device__|PQ_DEV)[^;{]*?\b" + called + r"\s*\(", src)
        if m and "pdl_wait();" in (inner := _body(src, m.end())):
            return inner
    return body


def _kernel_bodies():
    for path in sorted(glob.glob(os.path.join(CUDA_SRC, "*.cu"))):
        src = open(path).read()
        for m in re.finditer(r"__global__", src):
            line = src[src.rfind("\n", 0, m.start()) + 1:m.end()]
            if "template __global__" in line:
                continue
            start = src.index("{", m.end())
            name = [w for w in re.findall(r"(\w+)\s*\(", src[m.end():start]) if w != "__launch_bounds__"][0]
            yield f"{os.path.basename(path)}:{name}", _waiting_body(_with_headers(src), _body(src, m.end()))


def test_every_kernel_waits_for_its_predecessor_before_returning():
    bodies = list(_kernel_bodies())
    assert len(bodies) >= 30
    for name, body in bodies:
        assert "pdl_wait();" in body, f"{name}: no pdl_wait()"
        before = body[:body.index("pdl_wait();")]
        assert "return" not in before, f"{name}: returns before pdl_wait()"


def _cuda_include():
    homes = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"))]
    return next((os.path.join(h, "include") for h in homes if h and os.path.exists(os.path.join(h, "include", "cuda.h"))),
                None)


@pytest.mark.skipif(_cuda_include() is None or shutil.which("cc") is None, reason="no cuda.h / C compiler")
def test_ctypes_structs_match_cuda_h(tmp_path):
    prog = tmp_path / "sizes.c"
    prog.write_text("""
#include <stdio.h>
#include <stddef.h>
#include <cuda.h>
int main(void) {
    printf("%zu %zu %zu %zu %zu %zu %zu %d\\n", sizeof(CUlaunchAttribute), offsetof(CUlaunchAttribute, value),
           sizeof(CUlaunchConfig), offsetof(CUlaunchConfig, sharedMemBytes), offsetof(CUlaunchConfig, hStream),
           offsetof(CUlaunchConfig, attrs), offsetof(CUlaunchConfig, numAttrs),
           (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
    return 0;
}""")
    exe = tmp_path / "sizes"
    subprocess.run(["cc", f"-I{_cuda_include()}", str(prog), "-o", str(exe)], check=True)
    got = [int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    C = pdl._Config
    assert got == [ctypes.sizeof(pdl._Attr), pdl._Attr.value.offset, ctypes.sizeof(C), C.shared_mem.offset,
                   C.stream.offset, C.attrs.offset, C.num_attrs.offset, pdl._PROGRAMMATIC_STREAM_SERIALIZATION]


@pytest.mark.gpu
def test_dependent_chain_in_a_graph_matches_eager():
    """200 kernels, each reading the previous one's output, captured with programmatic launches."""
    import cupy as cp
    import numpy as np

    from pocketcupy.backend.kernels import kernel

    add = kernel("act.cu", "add_f32")
    n = 1 << 20
    step = cp.asarray(np.random.default_rng(0).integers(-8, 8, n).astype(np.float32))
    ys = [cp.zeros(n, cp.float32), cp.zeros(n, cp.float32)]
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        with pdl.enabled():
            for i in range(200):
                add(((n + 255) // 256,), (256,), (ys[i % 2], step, ys[(i + 1) % 2], np.int64(n)))
        graph = stream.end_capture()
        graph.launch()
    stream.synchronize()
    np.testing.assert_array_equal(ys[0].get(), 200 * step.get())
