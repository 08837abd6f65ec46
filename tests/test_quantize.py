"""NumPy quantizers (pocketcupy.quant.quantize) against independent decoders and encoders:
the `gguf` package's dequantizers and quantizers, and llama.cpp's own reference quantizers
(quantize_row_*_ref in libggml) when llama-cpp-python is installed."""
import ctypes
import os

import numpy as np
import pytest

from pocketcupy.loader.gguf import GGML_TYPES
from pocketcupy.quant.qtensor import QTensor
from pocketcupy.quant.quantize import BLOCK_QUANTIZERS, quantize, quantize_tensor, row_bytes

# measured relative RMS error on standard-normal data (same as llama.cpp's reference
# quantizers, which these reproduce byte for byte), with ~15% margin
ERROR_BOUNDS = {
    "Q8_0": (0.00535, 0.0062), "Q6_K": (0.0177, 0.0205), "Q5_1": (0.0378, 0.0435),
    "Q5_K": (0.0361, 0.0415), "Q5_0": (0.0427, 0.049), "Q4_K": (0.0714, 0.082),
    "Q4_1": (0.0783, 0.090), "Q4_0": (0.0859, 0.099),
}
GGUF_PACKAGE_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]
LLAMA_REF_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]


def _normal(rows, cols, seed=0, std=1.0):
    return np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32) * np.float32(std)


def _awkward_rows(cols=1024):
    """Rows that stress the corner cases of the reference code: zeros, constants, outliers,
    tiny sub-blocks next to large ones (a scale that rounds to 0), one sign only, ties."""
    rng = np.random.default_rng(1)
    rows = [np.zeros(cols), np.full(cols, 0.5), np.full(cols, -0.25)]
    r = rng.standard_normal(cols); r[::37] *= 1000; rows.append(r)
    r = rng.standard_normal(cols); r[:32] *= 1e-5; r[256:272] *= 1e-6; rows.append(r)
    rows.append(np.abs(rng.standard_normal(cols)))
    rows.append(-np.abs(rng.standard_normal(cols)))
    r = rng.standard_normal(cols); r[rng.random(cols) < 0.7] = 0; rows.append(r)
    rows.append(np.round(rng.standard_normal(cols) * 4))
    rows.append(rng.standard_normal(cols) * 1e-3)
    rows.append(rng.standard_normal(cols) * 100)
    return np.stack(rows).astype(np.float32)


def _rel_rms(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


@pytest.mark.parametrize("qtype", sorted(ERROR_BOUNDS))
def test_error_within_bound(qtype):
    x = _normal(64, 4096, seed=3, std=0.02)
    t = quantize_tensor(x, qtype)
    assert t.qtype == qtype and t.shape == x.shape and t.data.dtype == np.uint8
    y = t.dequantize()                      # the gguf package's dequantizer
    assert y.shape == x.shape
    expected, bound = ERROR_BOUNDS[qtype]
    err = _rel_rms(y, x)
    assert 0.8 * expected < err < bound, f"{qtype}: relative RMS error {err:.4%}"


def test_error_ordering():
    x = _normal(16, 4096, seed=4)
    err = {q: _rel_rms(quantize_tensor(x, q).dequantize(), x) for q in ("Q8_0", "Q6_K", "Q5_K", "Q4_K")}
    assert err["Q8_0"] < err["Q6_K"] < err["Q5_K"] < err["Q4_K"]


@pytest.mark.parametrize("qtype", sorted(BLOCK_QUANTIZERS))
def test_row_layout_matches_loader(qtype):
    block, size, _ = BLOCK_QUANTIZERS[qtype]
    assert next(v for v in GGML_TYPES.values() if v[0] == qtype)[1:] == (block, size)
    x = _normal(3, 512, seed=5)
    q = quantize(x, qtype)
    assert q.shape == (3, row_bytes(qtype, 512)) == (3, 512 // block * size)
    # a 3-D input quantizes row by row
    q3 = quantize(x.reshape(3, 1, 512), qtype)
    assert q3.shape == (3, 1, q.shape[1]) and np.array_equal(q3.reshape(q.shape), q)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_requantizing_dequantized_blocks_is_exact(qtype):
    x = _normal(32, 2048, seed=6, std=0.02)
    q = quantize(x, qtype)
    again = quantize(QTensor(qtype, x.shape, q).dequantize(), qtype)
    assert np.array_equal(again, q)


@pytest.mark.parametrize("qtype", GGUF_PACKAGE_TYPES)
def test_bytes_match_gguf_package(qtype):
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize as gguf_quantize

    for x in (_normal(32, 1024, seed=7, std=0.02), _awkward_rows()):
        want = gguf_quantize(x, GGMLQuantizationType[qtype])
        assert np.array_equal(quantize(x, qtype), want)


def _libggml():
    try:
        import llama_cpp
    except Exception:
        return None
    path = os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so")
    return ctypes.CDLL(path) if os.path.isfile(path) else None


@pytest.mark.parametrize("qtype", LLAMA_REF_TYPES)
def test_bytes_match_llama_cpp_reference(qtype):
    lib = _libggml()
    if lib is None:
        pytest.skip("llama-cpp-python (libggml-base) not installed")
    fn = getattr(lib, f"quantize_row_{qtype.lower().replace('_k', '_K')}_ref")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None
    block, size, _ = BLOCK_QUANTIZERS[qtype]
    cases = [_normal(48, 2048, seed=8, std=0.02), _awkward_rows(), _normal(1, 256, seed=11)]
    for x in cases:  # the last one: a single super-block, the smallest NumPy loops
        x = np.ascontiguousarray(x)
        want = np.zeros(x.size // block * size, np.uint8)
        fn(x.ctypes.data, want.ctypes.data, x.size)
        got = quantize(x, qtype).reshape(-1)
        bad = np.flatnonzero(~(got.reshape(-1, size) == want.reshape(-1, size)).all(1))
        assert bad.size == 0, f"{qtype}: {bad.size} of {x.size // block} blocks differ (first {bad[:5]})"


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q6_K"])
def test_threads_and_chunks_do_not_change_bytes(qtype):
    x = _normal(40, 1024, seed=9)
    assert np.array_equal(quantize(x, qtype, threads=1), quantize(x, qtype, threads=4))


def test_dense_types():
    x = _normal(4, 64, seed=10)
    assert quantize(x, "F32").dtype == np.float32
    assert np.array_equal(quantize(x, "F16"), x.astype(np.float16))
    bf = quantize(x, "BF16")
    assert bf.dtype == np.uint16
    assert np.abs(QTensor("BF16", x.shape, bf).dequantize() - x).max() <= np.abs(x).max() * 2 ** -8


def test_bad_input():
    with pytest.raises(ValueError, match="multiple"):
        quantize(np.zeros((2, 100), np.float32), "Q4_K")
    with pytest.raises(ValueError, match="unsupported"):
        quantize(np.zeros((2, 256), np.float32), "Q3_K")
