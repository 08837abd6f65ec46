"""Where the K-quant launchers take the shared-memory tile kernel, and its shared memory (pure host
code; the kernel itself is checked by the q8tile / tile3 rows of tests/test_kernels.py on a GPU)."""
import pytest

from pocketcupy.backend import kquant_tile_cuda as kt
from pocketcupy.backend.kquant_tile_cuda import TILE_SHAPES, kquant_tile_shape, kquant_tile_smem
from pocketcupy.backend.weight_cuda import CudaWeight


@pytest.fixture
def device(monkeypatch):
    """An sm_90 device: 132 SMs, 227 KB of shared memory a block."""
    monkeypatch.setattr(kt, "num_sms", lambda: 132)
    monkeypatch.setattr(kt, "max_block_smem", lambda: 227 * 1024)
    return monkeypatch


def weight(qtype, rows, cols=4096, relaid=False):
    return CudaWeight(qtype, (rows, cols), None, act_q8=True, relaid=relaid)


def test_tall_weights_at_batches_33_to_64(device):
    gate_up = [weight("Q4_K", 14336), weight("Q4_K", 14336)]     # joined: 28672 rows, 128 blocks of 224
    head = weight("Q6_K", 49152, relaid=True)
    assert kquant_tile_shape(gate_up, 33) == kquant_tile_shape(gate_up, 64) == (2, 7, 1, 2)
    assert kquant_tile_shape([head], 40) == (1, 8, 1, 2)
    assert all(kquant_tile_shape(gate_up, n) is None for n in (1, 8, 32, 65))


def test_one_wave_shape_only_where_one_wave_and_its_shared_memory_fit(device):
    """224-row Q4_K blocks where they fit in one wave of the SMs and the device lets a block have
    their shared memory; else the default shape."""
    assert kquant_tile_smem([weight("Q4_K", 28672)], (2, 7, 1, 2)) == 2 * (224 * 160 + 16384 + 256 + 1024)
    assert kquant_tile_shape([weight("Q4_K", 224 * 132)], 64) == (2, 7, 1, 2)
    assert kquant_tile_shape([weight("Q4_K", 224 * 132 + 1)], 64) == (2, 4, 1, 2)       # a second wave
    # joined weights: each one's rows end in a block of their own, 67 + 66 blocks (132 for their rows together)
    assert kquant_tile_shape([weight("Q4_K", 224 * 66 + 1), weight("Q4_K", 224 * 65 + 1)], 64) == (2, 4, 1, 2)
    assert kquant_tile_shape([weight("Q4_K", 14336), weight("Q6_K", 14336, relaid=True)], 64) == (2, 4, 1, 2)
    device.setattr(kt, "max_block_smem", lambda: 99 * 1024)                             # sm_86 / sm_89
    assert kquant_tile_shape([weight("Q4_K", 28672)], 64) == (2, 4, 1, 2)


def test_short_raw_or_untimed_weights_stay_on_the_mma_kernel(device):
    qkv = [weight("Q4_K", 4096), weight("Q4_K", 1024), weight("Q6_K", 1024, relaid=True)]
    for ws in (qkv, [weight("Q4_K", 4096)], [weight("Q6_K", 4096, 14336, relaid=True)],
               [weight("Q6_K", 49152)],          # raw 210-byte Q6_K blocks: not 16-byte aligned
               [weight("Q5_K", 28672)]):         # runs, but was not timed
        assert kquant_tile_shape(ws, 64) is None


def test_default_shapes_fit_the_shared_memory_of_every_tensor_core_gpu():
    """A block of each default shape within the 99 KB a block may have on sm_86 / sm_89 (the least
    of sm_80+; the H200 has 227 KB: two Q4_K blocks an SM)."""
    q4, q6 = weight("Q4_K", 28672), weight("Q6_K", 49152, relaid=True)
    assert kquant_tile_smem([q4], TILE_SHAPES["Q4_K"]) == 2 * (128 * 160 + 16384 + 256 + 1024)
    assert kquant_tile_smem([q6], TILE_SHAPES["Q6_KR"]) == 2 * (128 * (208 + 4) + 16384 + 256 + 1024)
    assert max(kquant_tile_smem([q4], TILE_SHAPES["Q4_K"]), kquant_tile_smem([q6], TILE_SHAPES["Q6_KR"])) <= 99 * 1024


def test_groups_override_replaces_one_weight_shape_only(monkeypatch):
    """GROUPS_OVERRIDE (the launch-shape sweeps' hook) changes the shape of the (rows, cols, tiles)
    it names and nothing else."""
    from pocketcupy.backend import kquant_mma_cuda as km

    monkeypatch.setattr(km, "num_sms", lambda: 132)
    down, o = km.kquant_mma_groups(1, 14336, 4096, "Q6_K"), km.kquant_mma_groups(1, 4096, 4096, "Q4_K")
    monkeypatch.setattr(km, "GROUPS_OVERRIDE", {(4096, 4096, 1): (1, 8, 1, 0, 1)})
    assert km.kquant_mma_groups(1, 4096, 4096, "Q4_K") == (1, 8, 1, 0, 1) != o
    assert km.kquant_mma_groups(1, 14336, 4096, "Q6_K") == down
    assert km.kquant_mma_groups(2, 4096, 4096, "Q4_K") != (1, 8, 1, 0, 1)
