"""When linear_norm_cuda.linear_add_rms_norm runs a linear with the norm after it in one launch
(pure host code; the kernel is checked by tests/test_kernels.py and tests/test_linear_norm_model.py
on a GPU): batch 1, a weight of a NORM_GEMV_LAUNCH type (K-quants of whole super-blocks, Q8_0) with
rows in blocks of 32, and a norm read only by int8 GEMVs of as many columns."""
from pocketcupy.backend.linear_norm_cuda import norm_epilogue_applies, norm_gemv_launch
from pocketcupy.backend.weight_cuda import CudaWeight


def _w(qtype: str, rows: int, cols: int, act_q8: bool = True) -> CudaWeight:
    return CudaWeight(qtype, (rows, cols), None, act_q8=act_q8)


def test_o_and_down_projections_of_an_8b_q4_k_m():
    o, down = _w("Q4_K", 4096, 4096), _w("Q6_K", 4096, 14336)
    gate_up, q, k, v = _w("Q4_K", 28672, 4096), _w("Q4_K", 4096, 4096), _w("Q4_K", 1024, 4096), _w("Q6_K", 1024, 4096)
    assert norm_epilogue_applies(o, 1, [gate_up])
    assert norm_epilogue_applies(down, 1, [q, k, v])


def test_o_and_down_projections_of_an_8b_q8_0():
    o, down, qkv, gate_up = _w("Q8_0", 4096, 4096), _w("Q8_0", 4096, 14336), _w("Q8_0", 6144, 4096), \
        _w("Q8_0", 28672, 4096)
    assert norm_epilogue_applies(o, 1, [gate_up])
    assert norm_epilogue_applies(down, 1, [qkv])
    assert norm_epilogue_applies(_w("Q8_0", 4096, 4064), 1, [gate_up])           # rows of whole 32-value blocks
    assert not norm_epilogue_applies(o, 2, [gate_up])
    assert not norm_epilogue_applies(_w("Q8_0", 4080, 4096), 1, [_w("Q8_0", 6144, 4080)])   # rows % 32


def test_launch_shapes():
    """(rows, threads) a row group: Q8_0 takes 4 rows on 128 threads on rows of at most 128 units
    (the o projection), one row a warp on longer ones (the down projection); K-quants by type."""
    assert norm_gemv_launch(_w("Q8_0", 4096, 4096)) == (4, 128)
    assert norm_gemv_launch(_w("Q8_0", 4096, 4128)) == (1, 32)
    assert norm_gemv_launch(_w("Q8_0", 4096, 14336)) == (1, 32)
    assert norm_gemv_launch(_w("Q4_K", 4096, 4096)) == (4, 128)
    assert norm_gemv_launch(_w("Q6_K", 4096, 14336)) == (2, 32)


def test_not_applied():
    o, gate_up = _w("Q4_K", 4096, 4096), _w("Q4_K", 28672, 4096)
    assert not norm_epilogue_applies(o, 2, [gate_up])                            # batch 1 only
    assert not norm_epilogue_applies(o, 1, [])                                   # nothing reads the blocks
    assert not norm_epilogue_applies(o, 1, [_w("F16", 28672, 4096, False)])      # a reader of floats
    assert not norm_epilogue_applies(o, 1, [_w("Q4_K", 28672, 4096, False)])     # fp32 activations
    assert not norm_epilogue_applies(o, 1, [_w("Q4_K", 28672, 2048)])            # other widths
    assert not norm_epilogue_applies(_w("Q4_K", 4080, 4096), 1, [_w("Q4_K", 28672, 4080)])   # rows % 32
    assert not norm_epilogue_applies(_w("Q4_K", 4096, 4000), 1, [gate_up])       # part of a super-block
    assert not norm_epilogue_applies(_w("Q4_1", 4096, 4096), 1, [gate_up])       # no such launch
    assert not norm_epilogue_applies(_w("Q4_K", 4096, 4096, False), 1, [gate_up])
