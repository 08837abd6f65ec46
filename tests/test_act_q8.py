"""Int8 activations of quantized linears (quant/act_q8.py): which weights take them, the
rounding, and the NumPy reference's linear with them."""
import numpy as np
import pytest

from pocketcupy import EngineArgs
from pocketcupy.backend.ops_ref import NumpyOps
from pocketcupy.quant.act_q8 import Q8ActWeight, q8_roundtrip, q8k_roundtrip, uses_q8
from pocketcupy.quant.qtensor import QTensor
from pocketcupy.quant.quantize import quantize_tensor


def test_which_weights_take_int8_activations():
    assert uses_q8("Q4_K", 4096, "auto") and uses_q8("Q8_0", 14336, "q8")
    assert not uses_q8("Q4_K", 2048, "auto")            # short rows stay fp32 under auto
    assert uses_q8("Q4_1", 576, "q8") and not uses_q8("Q4_K", 4096, "f32")
    assert not any(uses_q8(q, 4096, "q8") for q in ("F32", "F16", "BF16", "FP8"))
    assert uses_q8("IQ1_M", 4096, "q8") and uses_q8("IQ4_NL", 4096, "auto")
    with pytest.raises(ValueError, match="quant_activations"):
        uses_q8("Q4_K", 4096, "int8")


def test_int8_types_are_those_the_cuda_gemvs_read():
    from pocketcupy.backend.weight_cuda import GGUF_QTYPES
    from pocketcupy.quant.act_q8 import INT8_QTYPES

    assert INT8_QTYPES == set(GGUF_QTYPES)


def test_roundtrip_is_blockwise_int8():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 96)).astype(np.float32) * np.float32(5)
    x[1, 32:64] = 0.0                                       # an all-zero block stays zero
    y = q8_roundtrip(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    blocks, got = x.reshape(-1, 32), y.reshape(-1, 32)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    q = np.divide(got, d, out=np.zeros_like(got), where=d > 0)
    assert np.allclose(q, np.rint(q), atol=1e-3) and np.abs(q).max() <= 127 + 1e-3
    assert np.all(np.abs(got - blocks) <= d / 2 * (1 + 1e-5))   # round to nearest
    assert not got[4].any()
    # the block's largest value is kept exactly (q = +-127)
    i = np.abs(blocks).argmax(axis=1)
    assert np.allclose(got[np.arange(len(i)), i], blocks[np.arange(len(i)), i], rtol=1e-6)


def test_q8k_roundtrip_shares_one_scale_per_256():
    """The K-quant tensor-core path's rounding (act_q8.q8k_roundtrip): one scale per 256 values, so
    a block's small values lose precision next to a large one that a per-32 scale would have kept."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 512)).astype(np.float32)
    x[0, 300] = 50.0                                        # an outlier in the second super-block of row 0
    y = q8k_roundtrip(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    for blk, got in zip(x.reshape(-1, 256), y.reshape(-1, 256)):
        d = np.abs(blk).max() / np.float32(127)
        q = got / d
        assert np.allclose(q, np.rint(q), atol=1e-3) and np.abs(q).max() <= 127 + 1e-3
        assert np.all(np.abs(got - blk) <= d / 2 * (1 + 1e-5))
    # next to the outlier its whole super-block is rounded on a 50 / 127 grid, far coarser than
    # per-32 scales (only the outlier's own 32 values pay that there)
    err256 = np.abs(y[0, 256:] - x[0, 256:]).mean()
    err32 = np.abs(q8_roundtrip(x)[0, 256:] - x[0, 256:]).mean()
    assert err256 > 5 * err32
    assert np.array_equal(q8k_roundtrip(x[:, :256]), y[:, :256])   # super-blocks are independent


def test_reference_linear_rounds_activations_of_flagged_weights():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 4096)).astype(np.float32)
    t = quantize_tensor(w, "Q8_0")
    x = rng.standard_normal((2, 4096)).astype(np.float32)
    auto, f32 = NumpyOps("auto"), NumpyOps("f32")
    wa, wf = auto.weight(t), f32.weight(t)
    assert isinstance(wa, Q8ActWeight) and not isinstance(wf, Q8ActWeight)
    deq = t.dequantize()
    np.testing.assert_allclose(auto.linear(x, wa), q8_roundtrip(x) @ deq.T, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(f32.linear(x, wf), x @ deq.T, rtol=1e-5, atol=1e-4)
    assert type(auto.linear(x, wa)) is np.ndarray
    # fused projections keep the flag; parts that differ are not joined
    joined = auto.concat_rows([wa, wa])
    assert isinstance(joined, Q8ActWeight) and joined.shape == (16, 4096)
    assert auto.concat_rows([wa, wf]) is None
    # an embedding lookup from a flagged table is a plain array
    assert type(auto.embedding(wa, np.array([1, 2]))) is np.ndarray
    # dense weights never take int8 activations
    dense = QTensor("F16", (8, 4096), w.astype(np.float16))
    assert not isinstance(NumpyOps("q8").weight(dense), Q8ActWeight)


def test_engine_args_validate_quant_activations():
    assert EngineArgs(quant_activations="q8").quant_activations == "q8"
    assert EngineArgs.from_env({"POCKETCUPY_QUANT_ACTIVATIONS": "f32"}).quant_activations == "f32"
    with pytest.raises(ValueError, match="quant_activations"):
        EngineArgs(quant_activations="int4")
