"""FP8 and NVFP4 weights of Hugging Face checkpoints. FP8 weights whose scales cover whole groups of
128 columns (tensor, channel and 128 x 128 block scales) stay E4M3 codes with a scale per row and
128 columns (QTensor "FP8"), NVFP4 weights of groups of 16 stay E2M1 codes with their E4M3 scales
(QTensor "NVFP4"): the CUDA backend reads the codes (gemv_fp8.cu, gemv_nvfp4.cu), the NumPy backend
rounds them to BF16. Other FP8 scale blocks and NVFP4 groups are dequantized to BF16 at load.

quantization_config (config.json, or ModelOpt's older hf_quant_config.json) -> WeightQuantization;
each quantized `X.weight` is then read with its scale tensors (never mapped as model tensors):

    quant_method "fp8" (HF FineGrainedFP8, Qwen3-FP8, DeepSeek-V3): F8_E4M3 weight [out, in] times
        X.weight_scale_inv (or AutoFP8's X.weight_scale): blocks of weight_block_size
        [ceil(out / b0), ceil(in / b1)]; without weight_block_size one scale ([] / [1]) or one a row
        ([out, 1]). Multiplied, despite the name.
    "compressed-tensors" (RedHatAI / neuralmagic FP8, formats float-quantized / naive-quantized):
        F8_E4M3 weight times X.weight_scale, per the groups' weight strategy: "tensor" [] / [1],
        "channel" [out, 1], "block" [ceil(out / b0), ceil(in / b1)] of block_structure.
    "modelopt" FP8: F8_E4M3 weight times X.weight_scale ([] / [1]).
    "modelopt" NVFP4: U8 weight [out, in / 2] of E2M1 codes (value 2i in the low nibble of byte i)
        times F8_E4M3 X.weight_scale [out, in / group_size] times X.weight_scale_2 ([] / [1]).
    "compressed-tensors" NVFP4 (llm-compressor's nvfp4-pack-quantized, groups of strategy tensor_group):
        the same codes and scales as X.weight_packed and X.weight_scale, divided by
        X.weight_global_scale ([1]); packed_as_modelopt renames them to the ModelOpt form.

Activation quantization (X.input_scale, activation_scheme) is ignored: activations stay in the
backend's precision. Layers left unquantized (ignore / exclude_modules) are simply not F8 or U8."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..quant.minifloat_weights import e2m1_values, e4m3_values, fp8_row_scales, scaled_to_bf16
from ..quant.qtensor import FP8_GROUP, NVFP4_GROUP, QTensor

QUANTIZED_DTYPES = ("F8_E4M3", "U8")   # safetensors dtypes read as raw bytes for this module
_DENSE = ("F32", "BF16", "F16")
WEIGHT_SCALES = ("weight_scale_inv", "weight_scale", "weight_scale_2")   # X.<name> scales X.weight


@dataclass(frozen=True)
class WeightQuantization:
    method: str                         # for messages: "fp8", "compressed-tensors", "modelopt NVFP4", ...
    fp8_scales: tuple[str, ...] = ()    # names of an F8 weight's scale (X.<name>), the first present used
    fp8_layouts: tuple = ()             # the scale layouts allowed: "tensor", "channel" or a block (b0, b1)
    nvfp4_group: int | None = None      # values a weight_scale covers along a row, for U8 (NVFP4) weights
    nvfp4_packed: bool = False          # compressed-tensors' NVFP4 names (packed_as_modelopt renames them)


def weight_quantization(qc, source: str) -> WeightQuantization | None:
    """The WeightQuantization of a quantization_config (None: no quantization_config)."""
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise ValueError(f"{source}: quantization_config must be an object, got {qc!r}")
    method = qc.get("quant_method")
    if method == "fp8":
        return _fp8(qc, source)
    if method == "compressed-tensors":
        return _compressed_tensors(qc, source)
    if method == "modelopt":
        return _modelopt(qc, source)
    raise ValueError(f"{source}: quantization_config.quant_method {method!r} is not supported "
                     "(supported: fp8, compressed-tensors FP8, modelopt FP8 / NVFP4)")


def _block(value, what: str, source: str) -> tuple[int, int]:
    if not (isinstance(value, list) and len(value) == 2
            and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in value)):
        raise ValueError(f"{source}: {what} must be two positive integers, got {value!r}")
    return value[0], value[1]


def _fp8(qc: dict, source: str) -> WeightQuantization:
    fmt = qc.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ValueError(f"{source}: quantization_config.fmt {fmt!r} is not supported (only e4m3)")
    size = qc.get("weight_block_size")
    layouts = ("tensor", "channel") if size is None else (_block(size, "quantization_config.weight_block_size",
                                                                 source),)
    return WeightQuantization("fp8", ("weight_scale_inv", "weight_scale"), layouts)


CT_FP8_FORMATS = (None, "float-quantized", "naive-quantized")
CT_NVFP4_FORMAT = "nvfp4-pack-quantized"


def _compressed_tensors(qc: dict, source: str) -> WeightQuantization:
    fmt = qc.get("format")
    if fmt not in CT_FP8_FORMATS + (CT_NVFP4_FORMAT, "mixed-precision"):
        raise ValueError(f"{source}: compressed-tensors format {fmt!r} is not supported (FP8: float-quantized, "
                         f"naive-quantized; NVFP4: {CT_NVFP4_FORMAT}; or mixed-precision groups of these)")
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict):
        raise ValueError(f"{source}: quantization_config.config_groups must be an object, got {groups!r}")
    layouts, nvfp4_group = [], None
    for name, group in groups.items():
        w = group.get("weights") if isinstance(group, dict) else None
        if w is None:
            continue
        where = f"{source}: quantization_config.config_groups.{name}.weights"
        kind = (w.get("type"), w.get("num_bits")) if isinstance(w, dict) else w
        group_fmt = group.get("format", fmt)
        if kind == ("float", 4) and group_fmt in (CT_NVFP4_FORMAT, "mixed-precision"):
            if w.get("strategy") != "tensor_group":
                raise ValueError(f"{where}: NVFP4 strategy {w.get('strategy')!r} is not supported (tensor_group)")
            nvfp4_group = _group_size(w.get("group_size"), where)
            continue
        if kind != ("float", 8) or group_fmt not in CT_FP8_FORMATS + ("mixed-precision",):
            raise ValueError(f"{where}: only 8-bit float (FP8) weights and {CT_NVFP4_FORMAT} 4-bit float "
                             f"(NVFP4) weights are supported, got {kind!r} ({group_fmt})")
        strategy = w.get("strategy")
        if strategy in ("tensor", "channel"):
            layouts.append(strategy)
        elif strategy == "block":
            layouts.append(_block(w.get("block_structure"), "block_structure", where))
        else:
            raise ValueError(f"{where}: strategy {strategy!r} is not supported (tensor, channel, block)")
    return WeightQuantization("compressed-tensors", ("weight_scale",), tuple(dict.fromkeys(layouts)), nvfp4_group,
                              nvfp4_packed=nvfp4_group is not None)


def _group_size(value, where: str) -> int:
    if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        raise ValueError(f"{where}: NVFP4 group_size must be a positive integer, got {value!r}")
    return value


def _modelopt(qc: dict, source: str) -> WeightQuantization:
    q = qc.get("quantization") if isinstance(qc.get("quantization"), dict) else qc   # hf_quant_config.json nests it
    algo = str(q.get("quant_algo")).upper()
    if algo == "FP8":
        return WeightQuantization("modelopt FP8", ("weight_scale",), ("tensor",))
    if algo == "NVFP4":
        return WeightQuantization("modelopt NVFP4", nvfp4_group=_group_size(q.get("group_size", 16), source))
    raise ValueError(f"{source}: modelopt quant_algo {q.get('quant_algo')!r} is not supported (supported: FP8, NVFP4)")


def read_quantized_weight(name: str, raw: dict, quant: WeightQuantization | None) -> QTensor:
    """FP8, NVFP4 or BF16 QTensor of the quantized weight raw[name] (safetensors dtype in QUANTIZED_DTYPES),
    read with its scales from raw (tensor name -> (safetensors dtype, array), all shards)."""
    dtype, data = raw[name]
    if quant is None:
        raise ValueError(f"tensor {name!r} is {dtype}, but config.json has no quantization_config")
    if data.ndim != 2:
        raise ValueError(f"tensor {name!r} is {dtype} of shape {list(data.shape)}; quantized weights must be 2-D")
    if dtype == "U8":
        return _nvfp4_weight(name, raw, quant)
    if not quant.fp8_layouts:
        raise ValueError(f"tensor {name!r} is F8_E4M3, but the {quant.method} checkpoint has no FP8 weights")
    names = [name.removesuffix("weight") + s for s in quant.fp8_scales]
    scale_name = next((n for n in names if n in raw), None)
    if scale_name is None:
        raise ValueError(f"FP8 tensor {name!r} has no scale tensor ({' or '.join(names)})")
    scales, block = _fp8_scale_blocks(name, data.shape, scale_name, _finite("FP8", scale_name, _dense(scale_name, raw)),
                                      quant)
    row_scales = fp8_row_scales(scales, block, data.shape, FP8_GROUP)
    if row_scales is not None:
        return QTensor("FP8", data.shape, data, row_scales)
    bits = scaled_to_bf16(data.shape, lambda r0, r1: e4m3_values(data[r0:r1]), scales, block)
    return QTensor("BF16", data.shape, bits)


def packed_as_modelopt(raw: dict) -> None:
    """compressed-tensors' NVFP4 tensors under ModelOpt's names, in place: X.weight_packed is X.weight,
    and X.weight_global_scale, which divides the values, becomes X.weight_scale_2 = its reciprocal
    (as vLLM reads it)."""
    for name in [n for n in raw if n.endswith(".weight_packed")]:
        prefix = name.removesuffix("weight_packed")
        g = prefix + "weight_global_scale"
        if g not in raw:
            raise ValueError(f"NVFP4 tensor {name!r} has no scale tensor {g!r}")
        divisor = _finite("NVFP4", g, _dense(g, raw))
        if not np.all(divisor):
            raise ValueError(f"NVFP4 scale {g!r} is 0; it divides the weight's values")
        raw[prefix + "weight"] = raw.pop(name)
        raw[prefix + "weight_scale_2"] = ("F32", np.float32(1.0) / divisor.astype(np.float32))
        del raw[g]


def scaled_weight(name: str, raw: dict) -> str | None:
    """For a weight scale tensor X.weight_scale(_inv, _2) whose weight X.weight is stored in a dense
    dtype (BF16, ...), that weight's name: it would be used unscaled (raw: tensor name -> (dtype, array))."""
    prefix, _, suffix = name.rpartition(".")
    weight = prefix + ".weight"
    if suffix in WEIGHT_SCALES and weight in raw and raw[weight][0] not in QUANTIZED_DTYPES:
        return weight
    return None


def _nvfp4_weight(name: str, raw: dict, quant: WeightQuantization) -> QTensor:
    dtype, packed = raw[name]
    if quant.nvfp4_group is None:
        raise ValueError(f"tensor {name!r} is {dtype}, which only NVFP4 checkpoints hold as weights "
                         f"(this one is {quant.method})")
    group, (rows, cols) = quant.nvfp4_group, (packed.shape[0], 2 * packed.shape[1])
    scale_name, scale2_name = (name.removesuffix("weight") + s for s in ("weight_scale", "weight_scale_2"))
    for n in (scale_name, scale2_name):
        if n not in raw:
            raise ValueError(f"NVFP4 tensor {name!r} has no scale tensor {n!r}")
    scale_dtype, scales = raw[scale_name]
    if scale_dtype != "F8_E4M3" or cols % group or scales.shape != (rows, cols // group):
        raise ValueError(f"NVFP4 scale {scale_name!r} is {scale_dtype} {list(scales.shape)}; weight {name!r} of "
                         f"{rows} x {cols} values needs F8_E4M3 [{rows}, {cols} / {group}]")
    scale2 = _finite("NVFP4", scale2_name, _dense(scale2_name, raw))
    if scale2.shape not in ((), (1,)):
        raise ValueError(f"NVFP4 scale {scale2_name!r} has shape {list(scale2.shape)}; it must be [] or [1]")
    values, scale2 = _finite("NVFP4", scale_name, e4m3_values(scales)), float(scale2.reshape(()))
    if group == NVFP4_GROUP:
        return QTensor("NVFP4", (rows, cols), packed, np.ascontiguousarray(scales, np.uint8), scale2)
    bits = scaled_to_bf16((rows, cols), lambda r0, r1: e2m1_values(packed[r0:r1]), values, (1, group), scale2)
    return QTensor("BF16", (rows, cols), bits)


def _dense(name: str, raw: dict) -> np.ndarray:
    dtype, data = raw[name]
    if dtype not in _DENSE:
        raise ValueError(f"scale tensor {name!r} is {dtype}; it must be one of {', '.join(_DENSE)}")
    return QTensor(dtype, tuple(data.shape), data).dequantize()


def _finite(kind: str, name: str, scale: np.ndarray) -> np.ndarray:
    """The scale's values, refused when one is NaN or infinite (it would make its weights NaN / inf)."""
    if not np.isfinite(scale).all():
        raise ValueError(f"{kind} scale {name!r} holds NaN or infinite values")
    return scale


def _fp8_scale_blocks(name: str, shape: tuple, scale_name: str, scale: np.ndarray,
                      quant: WeightQuantization) -> tuple[np.ndarray, tuple[int, int]]:
    """The scale as a 2-D grid and the block of weights each entry covers, by the first allowed
    layout its shape fits."""
    rows, cols = shape
    wanted = []
    for layout in quant.fp8_layouts:
        if layout == "tensor":
            fits, block, want = scale.shape in ((), (1,)), (rows, cols), "[] or [1]"
        elif layout == "channel":
            fits, block, want = scale.shape == (rows, 1), (1, cols), f"[{rows}, 1]"
        else:
            b0, b1 = layout
            grid = (-(-rows // b0), -(-cols // b1))
            fits, block, want = scale.shape == grid, layout, f"{list(grid)} (blocks of {b0} x {b1})"
        if fits:
            return (scale.reshape(1, 1) if layout == "tensor" else scale), block
        wanted.append(want)
    raise ValueError(f"FP8 scale {scale_name!r} has shape {list(scale.shape)}; weight {name!r} of shape "
                     f"[{rows}, {cols}] ({quant.method}) needs {' or '.join(wanted)}")
