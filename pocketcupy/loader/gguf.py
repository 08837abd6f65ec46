"""GGUF files: metadata as plain Python values and tensors kept as their raw blocks.

Our own parser (the format is small): the `gguf` package's reader builds an object per
vocabulary string and takes seconds on a 49k-token vocabulary.
"""
from __future__ import annotations

import mmap
import os
import struct
from typing import Any

import numpy as np

from ..quant.qtensor import QTensor

# ggml type id -> (name, elements per block, bytes per block)
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2),
}
SUPPORTED_TYPES = {
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
    "IQ4_NL", "IQ4_XS",
}
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NP = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
       7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}


_U64 = struct.Struct("<Q")


class GGUFError(ValueError):
    pass


class _Cursor:
    def __init__(self, buf, path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int):
        if self.pos + n > len(self.buf):
            raise GGUFError(f"model: {self.path} is truncated (header ends early at byte {self.pos})")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def scalar(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        return bytes(self.take(n)).decode("utf-8", errors="replace")

    def strings(self, n: int) -> list[str]:
        """n strings in a row (a vocabulary's tokens: string() each took a third of a load's parse)."""
        buf, pos, end, out = self.buf, self.pos, len(self.buf), []
        for _ in range(n):
            if pos + 8 > end:
                break
            k = _U64.unpack_from(buf, pos)[0]
            if pos + 8 + k > end:
                break
            out.append(str(buf[pos + 8:pos + 8 + k], "utf-8", "replace"))
            pos += 8 + k
        self.pos = pos
        return out if len(out) == n else out + [self.string() for _ in range(n - len(out))]

    def value(self, vtype: int):
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, n = self.scalar("<I"), self.scalar("<Q")
            if etype == 8:
                return self.strings(n)
            if etype in _NP:
                arr = np.frombuffer(self.take(n * np.dtype(_NP[etype]).itemsize), dtype=_NP[etype])
                return arr.tolist()
            return [self.value(etype) for _ in range(n)]
        if vtype in _SCALAR:
            return self.scalar(_SCALAR[vtype])
        raise GGUFError(f"model: {self.path} has an unknown metadata value type {vtype}")


def _parse(path: str):
    if not os.path.isfile(path):
        raise GGUFError(f"model: GGUF file not found: {path}")
    with open(path, "rb") as f:
        if os.path.getsize(path) < 24 or f.read(4) != b"GGUF":
            raise GGUFError(f"model: {path} is not a GGUF file (bad magic)")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    cur = _Cursor(memoryview(buf), path)
    cur.take(4)
    version = cur.scalar("<I")
    if version not in (2, 3):
        raise GGUFError(f"model: {path} has unsupported GGUF version {version}")
    n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        if key in meta:   # llama.cpp and the gguf package refuse it too
            raise GGUFError(f"model: {path}: metadata key {key!r} appears twice")
        meta[key] = cur.value(cur.scalar("<I"))
    infos, seen = [], set()
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.scalar("<I")
        if not 1 <= n_dims <= 4:  # GGML_MAX_DIMS
            raise GGUFError(f"model: {path}: tensor {name!r} has {n_dims} dimensions (GGUF allows 1 to 4)")
        if name in seen:
            raise GGUFError(f"model: {path}: tensor {name!r} appears twice")
        seen.add(name)
        dims = [cur.scalar("<Q") for _ in range(n_dims)]
        infos.append((name, dims, cur.scalar("<I"), cur.scalar("<Q")))
    align = meta.get("general.alignment", 32)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise GGUFError(f"model: {path}: general.alignment {align!r} is not a power of 2")
    data_start = (cur.pos + align - 1) // align * align
    return buf, meta, infos, data_start


def _type_name(type_id: int) -> str:
    """A ggml type's name, also for the types we do not list (e.g. TQ2_0, MXFP4): the gguf package knows them."""
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"id {type_id}"


def read_metadata(path: str) -> dict[str, Any]:
    """All key/value pairs of a GGUF file, arrays as lists."""
    return _parse(path)[1]


def read_gguf(path: str) -> tuple[dict[str, Any], dict[str, QTensor]]:
    """Metadata and tensors. Shapes are torch order (rows, cols) = GGUF's (ne1, ne0);
    quantized data is uint8 shaped (rows, bytes per row), zero-copy over the memory map."""
    buf, meta, infos, data_start = _parse(path)
    tensors: dict[str, QTensor] = {}
    for name, dims, type_id, offset in infos:
        if GGML_TYPES.get(type_id, ("",))[0] not in SUPPORTED_TYPES:
            raise GGUFError(f"model: {path}: tensor {name!r} has unsupported GGUF type {_type_name(type_id)} "
                            f"(supported: {', '.join(sorted(SUPPORTED_TYPES))})")
        qtype, block, type_size = GGML_TYPES[type_id]
        if dims[0] % block:
            raise GGUFError(f"model: {path}: tensor {name!r} ({qtype}) row length {dims[0]} is not a multiple "
                            f"of {block}")
        shape = tuple(int(d) for d in reversed(dims))
        row_bytes = dims[0] // block * type_size
        n_rows = int(np.prod(dims[1:])) if len(dims) > 1 else 1
        start = data_start + offset
        if start + row_bytes * n_rows > len(buf):
            raise GGUFError(f"model: {path} is truncated (tensor {name!r} runs past the end of the file)")
        raw = np.frombuffer(buf, dtype=np.uint8, count=row_bytes * n_rows, offset=start)
        if qtype == "F32":
            data = raw.view(np.float32).reshape(shape)
        elif qtype in ("F16", "BF16"):
            data = raw.view(np.float16 if qtype == "F16" else np.uint16).reshape(shape)
        else:
            data = raw.reshape(shape[:-1] + (row_bytes,))
        tensors[name] = QTensor(qtype, shape, data)
    return meta, tensors
