"""One rank's part of a stored weight, cut before it is materialised.

The loaders hand out QTensors over memory maps, so a row shard is a view (only its pages are
ever read) and a column shard copies just its own columns. GGUF block types are cut per row of
blocks: rows anywhere, columns only on block boundaries (32 or 256 values). FP8 and NVFP4 codes are cut
with their scales; a column split off the scales' groups (128 / 16 columns) gets the columns as BF16."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..loader.gguf import GGML_TYPES
from ..quant.minifloat_weights import fp8_to_bf16, nvfp4_to_bf16
from ..quant.qtensor import FP8_GROUP, NVFP4_GROUP, QTensor
from .layout import ShardLayout

BLOCKS = {name: (per_block, nbytes) for name, per_block, nbytes in GGML_TYPES.values()}
BLOCKS["FP8"] = BLOCKS["NVFP4"] = (1, 1)      # any column (take_cols)
COLUMN_SPLITS = ("q_cols", "ffn_cols", "cols", "gdn_out_cols")
CODE_GROUPS = {"FP8": (FP8_GROUP, 1, fp8_to_bf16), "NVFP4": (NVFP4_GROUP, 2, nvfp4_to_bf16)}   # group, codes a byte


def take_rows(t: QTensor, start: int, stop: int) -> QTensor:
    """Rows [start, stop) of a 2-D weight, or elements of a 1-D one (a bias): a view."""
    return replace(t, shape=(stop - start,) + tuple(t.shape[1:]), data=t.data[start:stop],
                   scales=None if t.scales is None else t.scales[start:stop])


def take_cols(t: QTensor, start: int, stop: int, name: str = "weight") -> QTensor:
    """Columns [start, stop) of a 2-D weight (contiguous copy of the shard only)."""
    problem = _column_split_problem(t, start, stop, name)
    if problem:
        raise ValueError(problem)
    per_block, nbytes = BLOCKS[t.qtype]
    scales = None
    if t.qtype in CODE_GROUPS:
        group, per_byte, to_bf16 = CODE_GROUPS[t.qtype]
        if start % group or stop % group and stop != t.shape[1]:
            return QTensor("BF16", (t.shape[0], stop - start), np.ascontiguousarray(to_bf16(t)[:, start:stop]))
        data = t.data[:, start // per_byte:stop // per_byte]
        scales = np.ascontiguousarray(t.scales[:, start // group:-(-stop // group)])
    elif t.is_dense:
        data = t.data[:, start:stop]
    else:
        data = t.data[:, start // per_block * nbytes:stop // per_block * nbytes]
    return replace(t, shape=(t.shape[0], stop - start), data=np.ascontiguousarray(data), scales=scales)


def pad_rows(t: QTensor, rows: int) -> QTensor:
    """`rows` rows: t's rows followed by zero rows (all-zero bytes decode to 0 in every GGUF type, and
    in FP8 and NVFP4 codes)."""
    if t.shape[0] == rows:
        return t
    data = np.zeros((rows,) + t.data.shape[1:], t.data.dtype)
    data[:t.shape[0]] = t.data
    scales = None
    if t.scales is not None:
        scales = np.zeros((rows,) + t.scales.shape[1:], t.scales.dtype)
        scales[:t.shape[0]] = t.scales
    return replace(t, shape=(rows,) + tuple(t.shape[1:]), data=data, scales=scales)


def shard_tensor(t: QTensor, kind: str | None, layout: ShardLayout, name: str = "weight") -> QTensor:
    """This rank's part of t for a split kind (see ShardLayout.spans); None or one rank: all of t."""
    if kind is None or layout.world == 1:
        return t
    spans = _spans(t, kind, layout, name)
    parts = [take_cols(t, start, stop, name) if axis == 1 else take_rows(t, start, stop) for axis, start, stop in spans]
    if len(parts) > 1:
        return join(parts, spans[0][0])
    return pad_rows(parts[0], layout.vocab_shard) if kind == "vocab_rows" else parts[0]


def join(parts: list[QTensor], axis: int) -> QTensor:
    """Pieces of one weight (rows, or columns of whole blocks) side by side along axis: copied; as
    float32 where the pieces came out in different formats (a column piece off the FP8 groups)."""
    if len({p.qtype for p in parts}) > 1:
        parts = [QTensor("F32", p.shape, p.dequantize()) for p in parts]
    shape = list(parts[0].shape)
    shape[axis] = sum(p.shape[axis] for p in parts)
    scales = None if parts[0].scales is None else np.concatenate([p.scales for p in parts], axis)
    return replace(parts[0], shape=tuple(shape), data=np.concatenate([p.data for p in parts], axis), scales=scales)


def check_shardable(tensors: dict, splits: dict[str, str], layout: ShardLayout) -> None:
    """Raises the ValueError shard_tensor would, for every split weight and every piece of it, without
    cutting anything."""
    for name, t in tensors.items():
        kind = split_kind(name, t, splits)
        if kind is None or layout.world == 1:
            continue
        for axis, start, stop in _spans(t, kind, layout, name):
            problem = _column_split_problem(t, start, stop, name) if axis == 1 else None
            if problem:
                raise ValueError(problem)


def _spans(t: QTensor, kind: str, layout: ShardLayout, name: str) -> list[tuple[int, int, int]]:
    try:
        return layout.spans(kind, tuple(t.shape))
    except ValueError as e:
        raise ValueError(f"{e}: {name} has shape {tuple(t.shape)}") from None


def _column_split_problem(t: QTensor, start: int, stop: int, name: str) -> str | None:
    if len(t.shape) != 2:
        return f"tensor_parallel_size: {name} has shape {t.shape}; only 2-D weights split by column"
    per_block = BLOCKS[t.qtype][0]
    if start % per_block or stop % per_block:
        return (f"tensor_parallel_size: {name} ({t.qtype}, {per_block}-value blocks) cannot be split at column "
                f"{start if start % per_block else stop}; each rank's columns must be whole blocks "
                "(use fewer ranks or another quantization)")
    return None


def split_kind(name: str, t: QTensor, splits: dict[str, str]) -> str | None:
    """How the stored tensor `name` splits (splits: tensor kind -> ShardLayout split); None: whole on
    every rank, as is a row-parallel layer's bias (1-D under a column split), added after the all-reduce."""
    kind = splits.get(split_key(name))
    return None if kind in COLUMN_SPLITS and len(t.shape) == 1 else kind


def split_key(name: str) -> str:
    """'blk.3.attn_q.weight' -> 'attn_q'; 'token_embd.weight' -> 'token_embd'; a routed expert's
    'blk.3.ffn_up_exps.7.weight' -> 'ffn_up_exps'."""
    parts = [p for p in name.split(".") if not p.isdigit()]
    return parts[-2] if len(parts) >= 2 else name
