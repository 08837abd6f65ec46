"""The split-KV prefill launcher's split count (pure host code; the kernels are checked by the
attn_prefill *split* rows of tests/test_kernels.py on a GPU)."""
import math

import pytest

from pocketcupy.backend.attn_cuda import (PREFILL_MAX_SPLITS, PREFILL_SPLIT_ALIGN, PREFILL_SPLIT_MIN_CHUNK,
                                          PREFILL_TILE, prefill_splits)


def kernel_chunk(kend: int, splits: int) -> int:
    """split_keys in cuda_src/attn_prefill.cuh: keys per split of a tile that needs kend keys."""
    return -(-math.ceil(kend / splits) // PREFILL_SPLIT_ALIGN) * PREFILL_SPLIT_ALIGN


def test_no_split_when_the_launch_fills_the_gpu_or_the_context_is_short():
    assert prefill_splits(tiles=16, num_heads=32, max_context=8192, sms=132) == 1   # 512 blocks
    assert prefill_splits(tiles=1, num_heads=32, max_context=1024, sms=132) == 1


def test_short_chunk_over_8k_prefix_on_h200():
    """48 new tokens over an 8064-token prefix, Llama-3-8B heads, 132 SMs: 16 splits of 512 keys."""
    ctx = 8064 + 48
    tiles = 48 // PREFILL_TILE["mma"] + 1
    assert prefill_splits(tiles, 32, ctx, 132) == 16
    assert kernel_chunk(ctx, 16) == 512


@pytest.mark.parametrize("sms", [40, 108, 132])
@pytest.mark.parametrize("max_context", [1025, 2128, 4000, 8112, 32768, 131072])
@pytest.mark.parametrize("tiles,heads", [(1, 8), (1, 32), (4, 32), (3, 9), (20, 4)])
def test_split_count_bounds(sms, max_context, tiles, heads):
    s = prefill_splits(tiles, heads, max_context, sms)
    assert 1 <= s <= PREFILL_MAX_SPLITS
    if tiles * heads >= 2 * sms:
        assert s == 1
    if s > 1:
        chunk = kernel_chunk(max_context, s)
        assert chunk >= PREFILL_SPLIT_MIN_CHUNK
        assert (s - 1) * chunk < max_context <= s * chunk    # a full-length tile leaves no split empty
