"""The CUDA backend's KV pages and how the kernels take them: fp16 arrays [blocks, block_size,
Hkv, D], or (kv_cache_dtype "int8" / "fp8" / "k8v4") QuantKVCache of device codes (int8, E4M3 as
uint8, 4-bit values two a byte) and their float32 parameters per (token, KV head) row, the layout
NumPy's reference stores (quant/kv_quant.py)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..quant.kv_quant import KV_KINDS, QuantKVCache
from .kernels import null_arg

KV_CACHE_DTYPES = ("auto", "int8", "fp8", "k8v4")
# (K, V) QuantKVCache kinds -> the kernels' name part (kv_codes.cuh)
KERNEL_TAGS = {("int8", "int8"): "i8", ("fp8", "fp8"): "e4m3", ("int8", "int4"): "k8v4"}


class KvArgs(NamedTuple):
    """A layer's pages as kernel arguments: tag names the kernels' cache type ("f16", "i8", "e4m3",
    "k8v4"); the scales (parameters) are null pointers for fp16."""
    tag: str
    k: object
    v: object
    k_scales: object
    v_scales: object

    @property
    def arrays(self) -> tuple:
        """As the attention kernels take them: codes (or values), then scales."""
        return self.k, self.v, self.k_scales, self.v_scales

    @property
    def code_arrays(self) -> tuple:
        """As the 8-bit stores take them: each cache's codes with its scales."""
        return self.k, self.k_scales, self.v, self.v_scales

    def source(self, name: str) -> str:
        """The .cu file of kernel family `name` for these pages: the kernels over codes are a module
        of their own (name_kv8.cu), so fp16 caches never compile them."""
        return f"{name}.cu" if self.tag == "f16" else f"{name}_kv8.cu"


def empty_kv_pages(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: str = "auto",
                   values: bool = True):
    """One layer's K and V pages (V None where not values), zeroed (so never-written slots hold
    finite values)."""
    import cupy

    if dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype: {dtype!r} is not implemented on the CUDA backend (have "
                         f"{', '.join(map(repr, KV_CACHE_DTYPES))})")
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    kinds = (None, None) if dtype == "auto" else KV_KINDS[dtype]
    pages = [cupy.zeros(shape, np.float16) if kind is None else QuantKVCache.zeros(shape, kind, cupy)
             for kind in kinds[:1 + values]]
    return pages[0], pages[1] if values else None


def kv_args(op: str, k_cache, v_cache) -> KvArgs:
    """The pages' kernel arguments; TypeError for pages the kernels do not read."""
    if isinstance(k_cache, QuantKVCache) and isinstance(v_cache, QuantKVCache):
        tag = KERNEL_TAGS.get((k_cache.kind, v_cache.kind))
        if tag is None:
            raise TypeError(f"{op}: no CUDA kernel for K pages of {k_cache.kind} with V pages of {v_cache.kind}")
        return KvArgs(tag, k_cache.codes, v_cache.codes, k_cache.params, v_cache.params)
    if getattr(k_cache, "dtype", None) != np.float16 or getattr(v_cache, "dtype", None) != np.float16:
        raise TypeError(f"{op}: the KV cache must be float16 pages or QuantKVCache codes, got "
                        f"{type(k_cache).__name__} {getattr(k_cache, 'dtype', '')}")
    return KvArgs("f16", k_cache, v_cache, null_arg(), null_arg())
