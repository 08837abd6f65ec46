"""What llama.cpp's GGUF layout of the mixture-of-experts models shares: layer names, and the
routed experts stacked into one [expert, rows, cols] tensor a projection (ffn_{gate,up,down}_exps),
which the models read one 2-D weight an expert (ffn_<part>_exps.<j>.weight)."""
from __future__ import annotations

import re

import numpy as np

from ..quant.qtensor import QTensor
from .gguf_config import MetaReader

_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")
_EXPERTS = re.compile(r"^ffn_(gate|up|down)_exps\.weight$")


def layer_of(name: str) -> tuple[int | None, str]:
    """'blk.N.rest' -> (N, rest); any other name -> (None, name)."""
    m = _LAYER.match(name)
    return (int(m.group(1)), m.group(2)) if m else (None, name)


def expert_views(name: str, prefix: str, rest: str, t: QTensor, r: MetaReader) -> dict[str, QTensor] | None:
    """A stacked expert tensor (rest: its name after the layer prefix) as one view an expert, no
    copy (each expert's rows are contiguous, whole GGUF blocks); None for any other tensor."""
    m = _EXPERTS.match(rest)
    if m is None:
        return None
    if len(t.shape) != 3:
        raise r.error(f"tensor {name!r} has shape {tuple(t.shape)}: stacked experts are 3-D (experts, rows, cols)")
    return {f"{prefix}ffn_{m.group(1)}_exps.{j}.weight": QTensor(t.qtype, tuple(t.shape[1:]), t.data[j])
            for j in range(t.shape[0])}


def as_f32(t: QTensor) -> np.ndarray:
    """Any tensor (of any rank, [..., cols]) as float32 of its shape."""
    rows = int(np.prod(t.shape[:-1])) if len(t.shape) > 1 else 1
    flat = QTensor(t.qtype, (rows, t.shape[-1]), np.asarray(t.data).reshape(rows, -1))
    return flat.dequantize().reshape(t.shape)
