"""The GGUF block decoders of cuda_src/gguf_units.cuh, compiled for the CPU (plain C++, CUDA
intrinsics emulated), against the gguf package's dequantizers and a float64 dot product."""
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest

from pocketcupy.backend.kernels import CUDA_SRC
from tests.gguf_blocks import QTYPES, dequantize_blocks, dequantize_q8_x, quantize_q8_x, random_blocks

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def host_bin(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    out = tmp_path_factory.mktemp("gguf_host") / "gguf_units_host"
    src = os.path.join(HERE, "host", "gguf_units_host.cpp")
    r = subprocess.run([cxx, "-std=c++17", "-O1", "-Wno-unknown-pragmas", f"-I{CUDA_SRC}", "-o", str(out), src],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    return str(out)


def check_decoder(host_bin, rng, qtype, nblk, align, relay=None):
    """Decodes a row of random qtype blocks with the host build (as kernel type qtype, or re-laid by
    relay(row) as kernel type RELAID[qtype]) and checks values and unit dots against the gguf package."""
    tid, qk, ts = QTYPES[qtype]
    cols = nblk * qk
    for use_quantizer in (True, False):
        blocks = random_blocks(rng, qtype, 1, cols, use_quantizer)
        stored = blocks
        if relay is not None:
            tid, stored = RELAID[qtype], relay(blocks.reshape(1, -1))
        x = rng.standard_normal((1, cols)).astype(np.float32)
        xq, ds = quantize_q8_x(x)
        payload = struct.pack("<iii", tid, nblk, align) + stored.tobytes() + xq.tobytes() + ds.tobytes()
        r = subprocess.run([host_bin], input=payload, capture_output=True)
        assert r.returncode == 0, r.returncode
        deq = np.frombuffer(r.stdout[:cols * 4], np.float32)
        dot = np.frombuffer(r.stdout[cols * 4:], np.float64)[0]
        ref = dequantize_blocks(qtype, blocks, 1, cols)[0]
        np.testing.assert_allclose(deq, ref, rtol=1e-6, atol=1e-7)
        ref_dot = float(ref.astype(np.float64) @ dequantize_q8_x(xq, ds)[0])
        scale = float(np.abs(ref).astype(np.float64) @ np.abs(dequantize_q8_x(xq, ds)[0]))
        assert abs(dot - ref_dot) <= 1e-5 * scale, (dot, ref_dot)


RELAID = {"Q6_K": 115}   # pq::Q6_KR


@pytest.mark.parametrize("align", [0, 2])
@pytest.mark.parametrize("qtype", list(QTYPES))
def test_units_match_gguf(host_bin, qtype, align):
    rng = np.random.default_rng(QTYPES[qtype][0] * 10 + align)
    check_decoder(host_bin, rng, qtype, 6 if QTYPES[qtype][1] == 256 else 40, align)


@pytest.mark.parametrize("nblk", [6, 8, 21])
def test_relaid_q6k_decodes_as_q6k(host_bin, nblk):
    """Q6_KR: a Q6_K row re-laid as weight_cuda uploads it (runs of 8 208-byte blocks, each followed
    by their d's; 6 and 21 blocks: a short last run, the row rounded up to 16 bytes)."""
    from pocketcupy.backend.weight_cuda import RELAID_QTYPES, q6k_relaid_rows

    assert RELAID_QTYPES["Q6_K"] == ("Q6_KR", RELAID["Q6_K"])
    check_decoder(host_bin, np.random.default_rng(115), "Q6_K", nblk, 0, relay=q6k_relaid_rows)


def test_tables_header_is_current():
    import sys

    script = os.path.join(os.path.dirname(HERE), "scripts", "gen_gguf_tables.py")
    assert subprocess.run([sys.executable, script, "--check"]).returncode == 0, \
        "cuda_src/gguf_tables.cuh is stale: run scripts/gen_gguf_tables.py"
