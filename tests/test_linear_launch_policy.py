"""linear_cuda's launch shapes (pure host code; the kernels are checked by tests/test_kernels.py on a GPU):
q8_gemv_launch's batch-1 shapes for the int8 GEMV of 32-value-block types (the H200 sweeps in its
docstring: 2 rows a block, 4 on rows of more than 128 units, 8 on tall Q8_0 matrices), and the
K-quant kernels' (gemv_kquant_split for long Q4_K / Q5_K rows at batch 1)."""
from pocketcupy.backend.linear_cuda import KQUANT_SMALL_ROWS, Q8_B1_TALL_ROWS, Q8Gemv, q8_gemv_launch


def test_batch1_rows_a_block():
    assert q8_gemv_launch("Q8_0", 6144, 4096, 1) == Q8Gemv("block", 8, 128)           # q/k/v
    assert q8_gemv_launch("Q8_0", 4096, 4096, 1) == Q8Gemv("block", 2, 128)           # o
    assert q8_gemv_launch("Q8_0", 4096, 14336, 1) == Q8Gemv("block", 4, 128)          # down: 448 units
    assert q8_gemv_launch("Q8_0", 28672, 4096, 1) == Q8Gemv("block", 8, 128)          # gate / up
    assert q8_gemv_launch("Q8_0", Q8_B1_TALL_ROWS - 1, 4096, 1) == Q8Gemv("block", 2, 128)
    assert q8_gemv_launch("Q8_0", 49152, 576, 1) == Q8Gemv("block", 2, 32)            # short rows: 18 units
    assert q8_gemv_launch("Q4_0", 28672, 4096, 1) == Q8Gemv("block", 2, 128)          # measured for Q8_0 only
    assert q8_gemv_launch("Q8_0", 28672, 4096, 2) == Q8Gemv("block", 2, 32)           # batch 2 unchanged


def test_kquant_split_rows():
    assert q8_gemv_launch("Q4_K", 28672, 4096, 1) == Q8Gemv("kqsplit", 4)             # gate / up
    assert q8_gemv_launch("Q4_K", 4096, 14336, 1) == Q8Gemv("kqsplit", 4)             # llama.cpp mix's down
    assert q8_gemv_launch("Q5_K", 4096, 14336, 1) == Q8Gemv("kqsplit", 4)
    assert q8_gemv_launch("Q5_K", 4096, 4096, 1) == Q8Gemv("kquant", 2)               # measured from 8192
    assert q8_gemv_launch("Q6_K", 4096, 14336, 1) == Q8Gemv("kquant", 2)              # lost for Q6_K
    assert q8_gemv_launch("Q4_K", KQUANT_SMALL_ROWS, 4096, 1) == Q8Gemv("kquant", 1)   # short: a row a warp
    assert q8_gemv_launch("Q4_K", 28672, 4096, 2) == Q8Gemv("kquant", 2)              # batch 1 only
