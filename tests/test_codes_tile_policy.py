"""Where FP8 / NVFP4 linears past the GEMVs take the tile kernel, its launch shapes and shared memory, and
which 16-bit input their GEMMs read (pure host code; the kernel itself is checked by the gemm_codes_tile
rows of tests/test_kernels.py on a GPU)."""
import pytest

from pocketcupy.backend import codes_tile_cuda as ct
from pocketcupy.backend.codes_tile_cuda import CODES_TILE_SHAPES, codes_tile_plan, codes_tile_smem, codes_tile_takes
from pocketcupy.backend.linear_cuda import gemm_batch, half16_type
from pocketcupy.backend.weight_cuda import CudaWeight


@pytest.fixture
def device(monkeypatch):
    """An sm_90 device: 132 SMs."""
    monkeypatch.setattr(ct, "num_sms", lambda: 132)
    monkeypatch.setattr(ct, "has_tensor_cores", lambda: True)
    return monkeypatch


def weight(qtype, rows, cols=4096):
    return CudaWeight(qtype, (rows, cols), None)


def test_tile_kernel_between_the_gemvs_and_the_prefill_gemm(device):
    for qtype in ("FP8", "NVFP4"):
        w = weight(qtype, 4096)
        assert gemm_batch(w, 17) and not gemm_batch(w, 16)         # batches <= 16: the GEMVs
        assert codes_tile_takes(w, 17) and codes_tile_takes(w, ct.CODES_TILE_MAX_BATCH)
        assert not codes_tile_takes(w, ct.CODES_TILE_MAX_BATCH + 1)  # a prefill: dequantization + cuBLAS
    assert not codes_tile_takes(weight("BF16", 4096), 64) and not codes_tile_takes(weight("Q4_K", 4096), 64)
    assert not codes_tile_takes(weight("FP8", 4096, 4096 + 32), 64)   # K % 64 != 0
    device.setattr(ct, "has_tensor_cores", lambda: False)
    assert not codes_tile_takes(weight("FP8", 4096), 64)


def codes_tile_shape(rows, cols=4096):
    return codes_tile_plan(rows, cols)[0]


def test_shape_most_rows_a_block_that_still_fills_the_sms(device):
    assert codes_tile_shape(28672) == codes_tile_shape(49152) == codes_tile_shape(128 * 132) == (2, 4, 1, 3)
    assert codes_tile_shape(128 * 132 - 128) == (1, 4, 2, 3)           # 131 blocks of 128 rows
    assert codes_tile_shape(64 * 132) == (1, 4, 2, 3)
    assert codes_tile_shape(6144) == codes_tile_shape(4096) == (1, 2, 4, 2)   # the last: 192 / 128 blocks
    device.setattr(ct, "SHAPE_OVERRIDE", (1, 4, 2, 3))
    assert codes_tile_shape(28672) == (1, 4, 2, 3)


def test_split_k_where_blocks_leave_sms_idle_over_a_long_k(device):
    """The 8B's down projection (4096 x 14336: 128 blocks at the last shape, 56 chunks a warp) runs at the first
    shape (32 blocks of 128 rows) in 8 runs of K: 256 blocks, 2 a SM in one wave. Its other weights fill the SMs
    or have short K."""
    assert codes_tile_plan(4096, 14336) == ((2, 4, 1, 3), 8)
    for rows, cols in ((4096, 4096), (6144, 4096), (28672, 4096), (49152, 4096)):
        assert codes_tile_plan(rows, cols)[1] == 1
    assert codes_tile_plan(4096, 4096) == ((1, 2, 4, 2), 1)
    assert ct.codes_tile_splits((1, 2, 4, 2), 4096, 14336) == 2      # floor(264 / 128): one wave
    assert ct.codes_tile_splits((2, 4, 1, 3), 128 * 50, 64 * 40) == 5    # 40 chunks a warp: 8 in each split
    assert ct.codes_tile_splits((2, 4, 1, 3), 128 * 20, 64 * 40) == 5    # 13 runs fill the SMs; 8 chunks each
    device.setattr(ct, "SPLITS_OVERRIDE", 5)
    assert codes_tile_plan(28672, 4096) == ((2, 4, 1, 3), 5)
    device.setattr(ct, "SPLITS_OVERRIDE", 1)
    assert codes_tile_plan(4096, 14336) == ((1, 2, 4, 2), 1)           # before the split: the last shape
    device.setattr(ct, "SHAPE_OVERRIDE", (1, 2, 4, 2))
    device.setattr(ct, "SPLITS_OVERRIDE", None)
    assert codes_tile_plan(4096, 14336) == ((1, 2, 4, 2), 2)


def test_shared_memory_of_every_shape_fits_sm86():
    """The stages (codes, NVFP4's scale codes, 8 NT activation rows of 144 bytes a chunk) within the 99 KB a block may have on sm_86 / sm_89 (the least of sm_80+)."""
    assert codes_tile_smem("FP8", 8, (2, 4, 1, 3)) == 3 * (128 * 64 + 64 * 144)
    assert codes_tile_smem("NVFP4", 8, (2, 4, 1, 3)) == 3 * (128 * 36 + 64 * 144)
    assert codes_tile_smem("FP8", 4, (1, 2, 4, 2)) == 2 * 4 * (32 * 64 + 32 * 144)
    for qtype in ("FP8", "NVFP4"):
        for nt in (4, 8):
            assert all(codes_tile_smem(qtype, nt, s) <= 99 * 1024 for s in CODES_TILE_SHAPES)


def test_gemm_input_types():
    """The 16-bit copy a norm writes for these weights' GEMMs (Half16Rows): their own type for fp16 /
    bf16, fp16 for FP8 / NVFP4 codes, none for GGUF blocks (their GEMM rounds its own input)."""
    assert half16_type(weight("BF16", 8)) == "BF16" and half16_type(weight("F16", 8)) == "F16"
    assert half16_type(weight("FP8", 8)) == half16_type(weight("NVFP4", 8)) == "F16"
    assert half16_type(weight("Q4_K", 8)) is None and half16_type(None) is None
    assert gemm_batch(weight("BF16", 8), 9) and not gemm_batch(weight("BF16", 8), 8)
