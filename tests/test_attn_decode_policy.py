"""The decode attention's choice of K path over 8-bit pages (pure host code; the kernels are checked
by the attn_decode rows of tests/test_kernels.py on a GPU, both paths forced)."""
import math

import numpy as np
import pytest

from pocketcupy.backend.attn_cuda import (DECODE_RING_MIN_KEYS, DECODE_SHORT_CONTEXT, decode_k_ring,
                                          graph_short_context, split_keys)
from pocketcupy.quant.kv_quant import QuantKVCache


def kernel_chunk(ctx: int, splits: int) -> int:
    """split_chunk in cuda_src/attn_decode_mma.cuh (DM_MIN_CHUNK 64, DM_KEYS 16)."""
    return max(64, -(-math.ceil(ctx / splits) // 16) * 16)


@pytest.mark.parametrize("ctx", [1, 63, 64, 65, 513, 1024, 4095, 4096, 32768])
@pytest.mark.parametrize("splits", [1, 2, 7, 8, 16, 64])
def test_split_keys_is_the_kernels_chunk(ctx, splits):
    assert split_keys(ctx, splits) == kernel_chunk(ctx, splits)


def test_ring_only_for_long_splits_of_8bit_pages():
    # batch 1 of Llama-3-8B heads on 132 SMs launches 16 splits: 64-key splits up to 1,024 tokens
    assert not decode_k_ring("i8", 1024, 16)
    assert not decode_k_ring("e4m3", 3840, 16)          # 240 keys a split
    assert decode_k_ring("i8", 4096, 16) and decode_k_ring("k8v4", 32768, 16)
    assert decode_k_ring("i8", DECODE_RING_MIN_KEYS, 1)
    assert not decode_k_ring("f16", 32768, 1)          # fp16 K has no ring


def test_graph_short_context_for_8bit_pages_only():
    pages = QuantKVCache.zeros((4, 16, 2, 64), "int8")
    assert graph_short_context(pages, pages) == DECODE_SHORT_CONTEXT
    assert graph_short_context(pages, None) is None            # MLA: K pages only, no mma decode kernel
    f16 = np.zeros((4, 16, 2, 64), np.float16)
    assert graph_short_context(f16, f16) is None
    # the short class's bound makes batch 1's 16 splits short, so its graphs take the register path
    assert not decode_k_ring("i8", DECODE_SHORT_CONTEXT, 16)
