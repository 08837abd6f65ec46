"""Tiny FP8 / NVFP4 Hugging Face checkpoints built from the tiny_llama fixture, and independent
references for their dequantization: bit-level decoders of the codes, a BF16 rounding through
frexp, and block-by-block loops (not the loader's table lookups and index grids)."""
import json
import os
import shutil

import numpy as np

from pocketcupy.loader.safetensors_loader import _read_safetensors
from pocketcupy.quant.dequant import bf16_to_f32
from pocketcupy.quant.kv_quant import encode_e4m3, round_e4m3

from .conftest import FIXTURES
from .helpers import write_safetensors

TINY = os.path.join(FIXTURES, "tiny_llama")
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def e4m3_reference(code: int) -> float:
    """OCP E4M3FN: sign, 4 exponent bits of bias 7, 3 mantissa bits; exponent 0 subnormal; S.1111.111 NaN."""
    sign = -1.0 if code & 0x80 else 1.0
    exp, man = (code >> 3) & 0xF, code & 7
    if exp == 15 and man == 7:
        return float("nan")
    return sign * (man / 8 * 2.0 ** -6 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7))


def e2m1_reference(code: int) -> float:
    """FP4 E2M1: sign, 2 exponent bits of bias 1, 1 mantissa bit; exponent 0 subnormal (0, 0.5)."""
    sign = -1.0 if code & 8 else 1.0
    exp, man = (code >> 1) & 3, code & 1
    return sign * (man * 0.5 if exp == 0 else (1 + man / 2) * 2.0 ** (exp - 1))


def bf16_reference(x: np.ndarray) -> np.ndarray:
    """BF16 bits of float32 values, rounded to 8 significant bits half to even (normal range)."""
    m, e = np.frexp(np.asarray(x, np.float64))
    rounded = np.ldexp(np.rint(np.ldexp(m, 8)), e - 8).astype(np.float32)
    return (rounded.view(np.uint32) >> 16).astype(np.uint16)


def reference_dequant(values: np.ndarray, scales: np.ndarray, block, factor=None) -> np.ndarray:
    """BF16 bits of values (float32 [rows, cols]) times scales[block row, block col] (times factor),
    block by block."""
    out = np.empty(values.shape, np.float32)
    (b0, b1), (rows, cols) = block, values.shape
    for i in range(0, rows, b0):
        for j in range(0, cols, b1):
            out[i:i + b0, j:j + b1] = values[i:i + b0, j:j + b1] * np.float32(scales[i // b0, j // b1])
    if factor is not None:
        out *= np.float32(factor)
    return bf16_reference(out)


def e4m3_decode(codes: np.ndarray) -> np.ndarray:
    table = np.array([e4m3_reference(c) for c in range(256)], np.float32)
    return table[codes]


def quantize_fp8(w: np.ndarray, block) -> tuple[np.ndarray, np.ndarray]:
    """E4M3 codes of w (float32 [rows, cols]) and their float32 scales, one a block (amax / 448)."""
    (b0, b1), (rows, cols) = block, w.shape
    scales = np.empty((-(-rows // b0), -(-cols // b1)), np.float32)
    codes = np.empty(w.shape, np.uint8)
    for i in range(0, rows, b0):
        for j in range(0, cols, b1):
            part = w[i:i + b0, j:j + b1]
            s = np.float32(np.abs(part).max() / 448) or np.float32(1)
            scales[i // b0, j // b1] = s
            codes[i:i + b0, j:j + b1] = encode_e4m3(round_e4m3(part / s))
    return codes, scales


def quantize_nvfp4(w: np.ndarray, group: int = 16):
    """ModelOpt NVFP4 of w (float32 [rows, cols]) -> (E2M1 codes [rows, cols], E4M3 codes of the
    per-group scales [rows, cols / group], the per-tensor scale_2 = amax / (6 * 448))."""
    table = np.array([e2m1_reference(c) for c in range(16)], np.float32)
    scale2 = np.float32(np.abs(w).max() / (6 * 448))
    rows, cols = w.shape
    groups = w.reshape(rows, cols // group, group)
    scale_codes = encode_e4m3(round_e4m3(np.abs(groups).max(axis=2) / 6 / scale2))
    step = e4m3_decode(scale_codes)[:, :, None] * scale2
    target = (groups / np.where(step > 0, step, 1)).reshape(rows, cols)
    return np.abs(target[:, :, None] - table).argmin(axis=2).astype(np.uint8), scale_codes, scale2


def pack_e2m1(codes: np.ndarray) -> np.ndarray:
    """Two 4-bit codes a byte, value 2i in the low nibble of byte i."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def tiny_tensors() -> dict:
    """tiny_llama's tensors: name -> (safetensors dtype, array copy)."""
    return {k: (dt, np.array(a)) for k, (dt, a) in _read_safetensors(os.path.join(TINY, "model.safetensors")).items()}


def linear_names(tensors: dict) -> list[str]:
    return [k for k in tensors if k.endswith(".weight") and any(f".{m}." in k for m in LINEARS)]


def float_weight(tensors: dict, name: str) -> np.ndarray:
    dt, a = tensors[name]
    return bf16_to_f32(a) if dt == "BF16" else a.astype(np.float32)


def write_checkpoint(dst, tensors: dict, quantization_config=None, shards: int = 1, extra_files=None) -> str:
    """tiny_llama's config, tokenizer and the given tensors in dst; the second of 2 shards takes
    every scale tensor (a weight's scale may be stored in another shard)."""
    for f in os.listdir(TINY):
        if not f.startswith("model.safetensors"):
            shutil.copy(os.path.join(TINY, f), dst)
    cfg = json.loads(open(os.path.join(TINY, "config.json")).read())
    if quantization_config is not None:
        cfg["quantization_config"] = quantization_config
    (dst / "config.json").write_text(json.dumps(cfg))
    for name, data in (extra_files or {}).items():
        (dst / name).write_text(json.dumps(data))
    if shards == 1:
        write_safetensors(dst / "model.safetensors", tensors)
        return str(dst)
    files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    parts = [{k: v for k, v in tensors.items() if ("_scale" in k) == second} for second in (False, True)]
    for f, part in zip(files, parts):
        write_safetensors(dst / f, part)
    weight_map = {k: f for f, part in zip(files, parts) for k in part}
    (dst / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return str(dst)
