"""FP8 and NVFP4 Hugging Face checkpoints (loader/hf_quantized.py), built here from tiny_llama:
the loaded weights against an independent dequantization, the logits against the original's."""
import json

import numpy as np
import pytest

from pocketcupy import Engine, SamplingParams
from pocketcupy.loader import load_checkpoint
from pocketcupy.loader.safetensors_loader import gguf_name
from pocketcupy.models.registry import build_model
from pocketcupy.quant.dequant import f32_to_bf16
from pocketcupy.quant import minifloat_weights
from pocketcupy.quant.minifloat_weights import e2m1_values, e4m3_values, fp8_to_bf16, nvfp4_to_bf16, scaled_to_bf16

from .fp8_checkpoints import (TINY, bf16_reference, e2m1_reference, e4m3_decode, e4m3_reference, float_weight,
                              linear_names, pack_e2m1, quantize_fp8, quantize_nvfp4, reference_dequant, tiny_tensors,
                              write_checkpoint)
from .helpers import full_logits, load_reference_model, rel_err

PROMPT = [5, 17, 42, 101, 7, 250, 33, 64, 12, 199, 3, 88]

# case -> (quantization_config, scale tensor name, scale layout, scale dtype, shards)
_CT_GROUP = {"targets": ["Linear"], "input_activations": {"type": "float", "num_bits": 8, "strategy": "tensor",
                                                           "dynamic": False}}
FP8_CASES = {
    "fp8-block-128": ({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                       "weight_block_size": [128, 128]}, "weight_scale_inv", (128, 128), "F32", 1),
    # blocks of 24 x 40 over 32-128 rows and 64-128 columns: several blocks a weight, partial ones at the edges
    "fp8-block-24x40-bf16-scales-2-shards": ({"quant_method": "fp8", "weight_block_size": [24, 40]},
                                             "weight_scale_inv", (24, 40), "BF16", 2),
    "fp8-tensor": ({"quant_method": "fp8", "activation_scheme": "static"}, "weight_scale_inv", "tensor", "F32", 1),
    "fp8-channel-autofp8-name": ({"quant_method": "fp8"}, "weight_scale", "channel", "F32", 1),
    "compressed-tensors-tensor": ({"quant_method": "compressed-tensors", "format": "float-quantized",
                                   "ignore": ["lm_head"], "config_groups": {"group_0": {**_CT_GROUP, "weights": {
                                       "type": "float", "num_bits": 8, "strategy": "tensor"}}}},
                                  "weight_scale", "tensor", "F32", 1),
    "compressed-tensors-channel": ({"quant_method": "compressed-tensors", "format": "naive-quantized",
                                    "config_groups": {"group_0": {**_CT_GROUP, "weights": {
                                        "type": "float", "num_bits": 8, "strategy": "channel"}}}},
                                   "weight_scale", "channel", "BF16", 1),
    "compressed-tensors-block": ({"quant_method": "compressed-tensors", "format": "float-quantized",
                                  "config_groups": {"group_0": {**_CT_GROUP, "weights": {
                                      "type": "float", "num_bits": 8, "strategy": "block",
                                      "block_structure": [16, 48]}}}}, "weight_scale", (16, 48), "F32", 1),
    "modelopt-fp8": ({"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["lm_head"]}, "weight_scale",
                     "tensor", "F32", 1),
}


def test_e4m3_decode_every_code():
    got = e4m3_values(np.arange(256, dtype=np.uint8))
    want = np.array([e4m3_reference(c) for c in range(256)], np.float32)
    np.testing.assert_array_equal(got, want)                                  # NaN where NaN
    assert np.flatnonzero(np.isnan(got)).tolist() == [0x7F, 0xFF]
    assert got[0x7E] == 448 and got[1] == 2.0 ** -9 and got[8] == 2.0 ** -6   # max, smallest subnormal, normal
    assert np.signbit(got[0x80]) and not np.signbit(got[0])


def test_e2m1_decode_every_byte_low_nibble_first():
    got = e2m1_values(np.arange(256, dtype=np.uint8).reshape(2, 128))
    want = np.array([[e2m1_reference(b & 15), e2m1_reference(b >> 4)] for b in range(256)], np.float32)
    np.testing.assert_array_equal(got, want.reshape(2, 256))
    assert sorted(set(np.abs(got.ravel()).tolist())) == [0, 0.5, 1, 1.5, 2, 3, 4, 6]


def test_bf16_rounding_matches_the_reference():
    """The loader's float32 -> BF16 (dequant.f32_to_bf16) against the test's frexp rounding, ties included."""
    rng = np.random.default_rng(0)
    ties = ((rng.integers(0x3000, 0x5000, 1000, dtype=np.uint32) << 16) | 0x8000).view(np.float32)
    x = np.concatenate([rng.standard_normal(10000) * 10.0 ** rng.integers(-6, 6, 10000), ties, -ties,
                        [1 + 2 ** -8, 1 + 3 * 2 ** -8, 0.0, -0.0]]).astype(np.float32)
    np.testing.assert_array_equal(f32_to_bf16(x), bf16_reference(x))


@pytest.mark.parametrize("block", [(24, 40), (1, 100), (100, 100)])
def test_row_chunks_cross_blocks(monkeypatch, block):
    """Rows go through in chunks (5 rows here) that start inside scale blocks; the result is the same."""
    monkeypatch.setattr(minifloat_weights, "_CHUNK_VALUES", 5 * 100)
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 0x7F, (53, 100), dtype=np.uint8) | rng.integers(0, 2, (53, 100), dtype=np.uint8) << 7
    scales = rng.random((-(-53 // block[0]), -(-100 // block[1]))).astype(np.float32)
    got = scaled_to_bf16(codes.shape, lambda r0, r1: e4m3_values(codes[r0:r1]), scales, block)
    np.testing.assert_array_equal(got, reference_dequant(e4m3_decode(codes), scales, block))


def build_fp8(tmp_path, case, edit_config=None, edit_tensors=None):
    """The case's FP8 checkpoint of tiny_llama in tmp_path -> (folder, {HF weight name: expected BF16 bits}),
    its quantization_config and tensors changed first by edit_config(qc) -> qc and edit_tensors(tensors)."""
    qc, scale_name, layout, scale_dtype, shards = FP8_CASES[case]
    qc = json.loads(json.dumps(qc))
    tensors, expected = tiny_tensors(), {}
    for name in linear_names(tensors):
        w = float_weight(tensors, name)
        rows, cols = w.shape
        block = {"tensor": (rows, cols), "channel": (1, cols)}.get(layout, layout)
        codes, scales = quantize_fp8(w, block)
        if scale_dtype == "BF16":
            scales = bf16_reference(scales)
            stored, scales = scales, (scales.astype(np.uint32) << 16).view(np.float32)
        else:
            stored = scales
        if layout == "tensor":
            stored = stored.reshape([1] if qc["quant_method"] == "compressed-tensors" else [])
        prefix = name.removesuffix("weight")
        tensors[name] = ("F8_E4M3", codes)
        tensors[prefix + scale_name] = (scale_dtype, stored)
        tensors[prefix + "input_scale"] = ("F32", np.array([0.02], np.float32))    # activations: ignored
        expected[name] = reference_dequant(e4m3_decode(codes), scales, block)
    if edit_tensors is not None:
        edit_tensors(tensors)
    return write_checkpoint(tmp_path, tensors, edit_config(qc) if edit_config else qc, shards), expected


@pytest.fixture(scope="module")
def original():
    model, ops = load_reference_model(TINY)
    return load_checkpoint(TINY).tensors, full_logits(model, ops, PROMPT)


def check_loaded(path, expected, original, max_rel, qtype="BF16"):
    """The loaded weights are of qtype and their BF16 rounding equals the expected bits, the rest are
    tiny_llama's own; the logits are within max_rel of the original's (relative to their largest
    magnitude)."""
    tensors, ref_logits = original
    loaded = load_checkpoint(path).tensors
    assert set(loaded) == set(tensors)          # no scale mapped as a model tensor
    for hf_name, bits in expected.items():
        t = loaded[gguf_name(hf_name)]
        assert t.qtype == qtype and t.shape == bits.shape
        to_bf16 = {"FP8": fp8_to_bf16, "NVFP4": nvfp4_to_bf16}.get(qtype, lambda t: t.data)
        np.testing.assert_array_equal(to_bf16(t), bits, err_msg=hf_name)
    quantized = {gguf_name(n) for n in expected}
    for name, t in tensors.items():
        if name not in quantized:
            assert t.qtype == loaded[name].qtype and np.array_equal(t.data, loaded[name].data), name
    model, ops = load_reference_model(path)
    err = rel_err(full_logits(model, ops, PROMPT), ref_logits)
    assert 0 < err <= max_rel, err
    return err


# The tiny model's logits move by about its weights' largest error (relative to each tensor's largest
# weight). E4M3 rounds a weight by up to 2^-4 of itself: measured 0.035-0.038 on the weights, 0.033-0.045
# on the logits over these layouts.
FP8_MAX_REL = 0.0625


@pytest.mark.parametrize("case", FP8_CASES)
def test_fp8_checkpoint(tmp_path, case, original):
    """Scales that cover whole groups of 128 columns (tensor, channel, 128-column blocks) keep the weights
    as E4M3 codes with a scale per row and 128 columns; other blocks are dequantized to BF16."""
    path, expected = build_fp8(tmp_path, case)
    layout = FP8_CASES[case][2]
    codes = layout in ("tensor", "channel") or layout[1] % 128 == 0
    check_loaded(path, expected, original, FP8_MAX_REL, "FP8" if codes else "BF16")


def test_modelopt_hf_quant_config_json(tmp_path, original):
    """Older ModelOpt exports describe the quantization only in hf_quant_config.json."""
    path, expected = build_fp8(tmp_path, "modelopt-fp8", edit_config=lambda qc: None)
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "exclude_modules": ["lm_head"]}}))
    check_loaded(path, expected, original, FP8_MAX_REL, "FP8")


def check_engine_greedy(path, n=8):
    """Engine on the folder: greedy generation runs, each token the argmax of the quantized model's own
    full-prefill logits (tiny_llama's top two logits lie too close to expect the original's tokens)."""
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    got = Engine(path, device="cpu", progress=False).generate([PROMPT], params)[0].outputs[0].token_ids
    model, ops = load_reference_model(path)
    want = full_logits(model, ops, PROMPT + got[:-1])[len(PROMPT) - 1:].argmax(axis=1).tolist()
    assert len(got) == n and got == want


def test_fp8_checkpoint_engine_greedy(tmp_path):
    check_engine_greedy(build_fp8(tmp_path, "fp8-block-24x40-bf16-scales-2-shards")[0])


K0 = "model.layers.0.self_attn.k_proj."       # weight [32, 64]
D1 = "model.layers.1.mlp.down_proj."           # weight [64, 128]


def _set(name, dtype, value):
    return lambda t: t.update({name: (dtype, np.asarray(value))})


@pytest.mark.parametrize("case, edit_config, edit_tensors, match", [
    ("fp8-block-128", None, lambda t: t.pop(D1 + "weight_scale_inv"),
     rf"FP8 tensor '{D1}weight' has no scale tensor \({D1}weight_scale_inv or {D1}weight_scale\)"),
    ("compressed-tensors-tensor", None, lambda t: t.pop(K0 + "weight_scale"), rf"'{K0}weight' has no scale tensor"),
    ("fp8-block-24x40-bf16-scales-2-shards", None, _set(K0 + "weight_scale_inv", "F32", np.ones((3, 2), np.float32)),
     rf"FP8 scale '{K0}weight_scale_inv' has shape \[3, 2\]; weight '{K0}weight' of shape \[32, 64\] \(fp8\) "
     r"needs \[2, 2\] \(blocks of 24 x 40\)"),
    ("compressed-tensors-tensor", None, _set(K0 + "weight_scale", "F32", np.ones((32, 1), np.float32)),
     r"has shape \[32, 1\]; .* needs \[\] or \[1\]"),                 # a channel scale, config says tensor
    ("fp8-channel-autofp8-name", None, _set(K0 + "weight_scale", "F32", np.ones((64, 1), np.float32)),
     r"has shape \[64, 1\]; .* needs \[\] or \[1\] or \[32, 1\]"),
    ("fp8-tensor", None, _set(K0 + "weight_scale_inv", "F8_E4M3", np.array(56, np.uint8)),
     rf"scale tensor '{K0}weight_scale_inv' is F8_E4M3; it must be one of F32, BF16, F16"),
    ("fp8-tensor", lambda qc: None, None, r"tensor 'model\.layers\.\d\.\w+\.\w+\.weight' is F8_E4M3, but "
                                          r"config.json has no quantization_config"),
    ("fp8-tensor", lambda qc: {"quant_method": "gptq", "bits": 4}, None,
     r"config.json: quantization_config.quant_method 'gptq' is not supported"),
    ("modelopt-fp8", lambda qc: {**qc, "quant_algo": "W4A8_AWQ"}, None,
     r"modelopt quant_algo 'W4A8_AWQ' is not supported"),
    ("fp8-tensor", lambda qc: {**qc, "fmt": "e5m2"}, None, r"fmt 'e5m2' is not supported \(only e4m3\)"),
    ("fp8-block-128", lambda qc: {**qc, "weight_block_size": [128]}, None,
     r"weight_block_size must be two positive integers, got \[128\]"),
    ("compressed-tensors-tensor", lambda qc: {**qc, "format": "pack-quantized"}, None,
     r"compressed-tensors format 'pack-quantized' is not supported"),
    ("compressed-tensors-tensor", lambda qc: {**qc, "config_groups": {"group_0": {"weights": {
        "type": "int", "num_bits": 4, "strategy": "group"}}}}, None,
     r"config_groups.group_0.weights: only 8-bit float \(FP8\) weights and nvfp4-pack-quantized 4-bit float "
     r"\(NVFP4\) weights are supported, got \('int', 4\)"),
    ("compressed-tensors-tensor", lambda qc: {**qc, "config_groups": {"group_0": {"weights": {
        "type": "float", "num_bits": 8, "strategy": "group"}}}}, None, r"strategy 'group' is not supported"),
    ("fp8-tensor", None, _set(K0 + "weight_scale_inv", "F32", np.array(np.nan, np.float32)),
     rf"FP8 scale '{K0}weight_scale_inv' holds NaN or infinite values"),
    ("fp8-block-24x40-bf16-scales-2-shards", None, lambda t: t[D1 + "weight_scale_inv"][1].__setitem__((1, 2), 0x7F80),
     rf"FP8 scale '{D1}weight_scale_inv' holds NaN or infinite values"),           # BF16 +inf
], ids=["missing-block-scale", "missing-tensor-scale", "block-scale-shape", "channel-scale-for-tensor-strategy",
        "scale-rows-not-weight-rows", "fp8-scale-dtype", "no-quantization-config", "unknown-quant-method",
        "modelopt-unknown-algo", "fmt-e5m2", "bad-weight-block-size", "compressed-tensors-packed", "compressed-tensors-int4",
        "compressed-tensors-group-strategy", "nan-tensor-scale", "inf-block-scale"])
def test_fp8_checkpoint_errors(tmp_path, case, edit_config, edit_tensors, match):
    path, _ = build_fp8(tmp_path, case, edit_config, edit_tensors)
    with pytest.raises(ValueError, match=match) as e:
        load_checkpoint(path)
    assert str(e.value).startswith("model: ") and path in str(e.value)


def _bf16_weight_with_scale(scale_name, weight=K0 + "weight"):
    """The weight back to tiny_llama's BF16, its scale (scale_name) left in place."""
    def edit(t):
        t[weight] = tiny_tensors()[weight]
        t.setdefault(weight.removesuffix("weight") + scale_name, ("F32", np.array(2.0, np.float32)))
    return edit


@pytest.mark.parametrize("case, scale_name", [("fp8-tensor", "weight_scale_inv"),
                                              ("compressed-tensors-tensor", "weight_scale"),
                                              ("fp8-channel-autofp8-name", "weight_scale")])
def test_scale_of_a_dense_weight_is_refused(tmp_path, case, scale_name):
    """A weight scale whose weight is BF16, not F8_E4M3, was ignored: the weight ran unscaled."""
    path, _ = build_fp8(tmp_path, case, edit_tensors=_bf16_weight_with_scale(scale_name))
    with pytest.raises(ValueError, match=rf"^model: .*: scale tensor '{K0}{scale_name}' belongs to '{K0}weight', "
                                         r"which is BF16, not F8_E4M3: the weight would be used unscaled"):
        load_checkpoint(path)


def test_scale_of_a_skipped_weight_is_ignored(tmp_path, original):
    """A scale beside a weight the loader does not load (no model tensor of that name) stays ignored."""
    skipped = "model.layers.0.self_attn.rotary_emb.weight"
    assert gguf_name(skipped) is None

    def edit(t):
        t[skipped] = ("BF16", np.zeros(4, np.uint16))
        t[skipped + "_scale"] = ("F32", np.array(2.0, np.float32))
    path, expected = build_fp8(tmp_path, "fp8-tensor", edit_tensors=edit)
    check_loaded(path, expected, original, FP8_MAX_REL, "FP8")


def test_scale_names_are_not_model_tensors():
    assert gguf_name("lm_head.weight_scale") is None and gguf_name("lm_head.input_scale") is None
    assert gguf_name("model.layers.3.mlp.up_proj.weight_scale_inv") is None
    assert gguf_name("model.layers.3.mlp.up_proj.weight_scale_2") is None
    assert gguf_name("lm_head.weight") == "output.weight" and gguf_name("model.norm.weight") == "output_norm.weight"


NVFP4_CONFIG = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ["lm_head"],
                "kv_cache_quant_algo": None}
_CT_FP4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True,
           "dynamic": False}
# llm-compressor's NVFP4 (as RedHatAI's *-NVFP4 checkpoints): 4-bit activations too (ignored here)
CT_NVFP4_CONFIG = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "ignore": ["lm_head"],
                   "config_groups": {"group_0": {"targets": ["Linear"], "weights": _CT_FP4,
                                                 "input_activations": {**_CT_FP4, "dynamic": "local"}}}}


def build_nvfp4(tmp_path, hf_quant_config_json=False, edit_tensors=None, group=16, compressed_tensors=False):
    """NVFP4 tiny_llama in tmp_path (scales of `group` columns) -> (folder, {HF weight name: expected BF16
    bits}): ModelOpt's, the quantization in config.json or (older exports) only in hf_quant_config.json;
    or compressed-tensors' (X.weight_packed, and X.weight_global_scale dividing the values)."""
    tensors, expected = tiny_tensors(), {}
    for name in linear_names(tensors):
        codes, scale_codes, scale2 = quantize_nvfp4(float_weight(tensors, name), group)
        prefix = name.removesuffix("weight")
        tensors[prefix + "weight_scale"] = ("F8_E4M3", scale_codes)
        if compressed_tensors:
            del tensors[name]
            tensors[prefix + "weight_packed"] = ("U8", pack_e2m1(codes))
            divisor = np.float32(1) / np.float32(scale2)
            tensors[prefix + "weight_global_scale"] = ("F32", np.array([divisor], np.float32))
            tensors[prefix + "input_global_scale"] = ("F32", np.array([100.0], np.float32))   # ignored
            scale2 = float(np.float32(1) / divisor)                                           # as read
        else:
            tensors[name] = ("U8", pack_e2m1(codes))
            tensors[prefix + "weight_scale_2"] = ("F32", np.array(scale2, np.float32))
            tensors[prefix + "input_scale"] = ("F32", np.array(0.01, np.float32))       # activations: ignored
        values = np.array([[e2m1_reference(c) for c in row] for row in codes], np.float32)
        expected[name] = reference_dequant(values, e4m3_decode(scale_codes), (1, group), scale2)
    if edit_tensors is not None:
        edit_tensors(tensors)
    if compressed_tensors:
        return write_checkpoint(tmp_path, tensors, CT_NVFP4_CONFIG), expected
    if not hf_quant_config_json:
        return write_checkpoint(tmp_path, tensors, {**NVFP4_CONFIG, "group_size": group}), expected
    nested = {"producer": {"name": "modelopt", "version": "0.27.0"},
              "quantization": {"quant_algo": "NVFP4", "group_size": group, "exclude_modules": ["lm_head"],
                               "kv_cache_quant_algo": None}}
    return write_checkpoint(tmp_path, tensors, extra_files={"hf_quant_config.json": nested}), expected


# E2M1's widest step (4 to 6) rounds a weight by up to 1/6 of its group's largest: measured 0.164 on the
# weights (relative to each tensor's largest), 0.140 on the logits.
NVFP4_MAX_REL = 0.2


@pytest.mark.parametrize("hf_quant_config_json, compressed_tensors", [(False, False), (True, False), (False, True)],
                         ids=["config.json", "hf_quant_config.json", "compressed-tensors"])
def test_nvfp4_checkpoint(tmp_path, hf_quant_config_json, compressed_tensors, original):
    path, expected = build_nvfp4(tmp_path, hf_quant_config_json, compressed_tensors=compressed_tensors)
    check_loaded(path, expected, original, NVFP4_MAX_REL, qtype="NVFP4")


def test_nvfp4_checkpoint_engine_greedy(tmp_path):
    check_engine_greedy(build_nvfp4(tmp_path)[0])


def test_nvfp4_groups_of_32_load_as_bf16(tmp_path, original):
    """Groups other than 16 have no kernel: the weights are dequantized to BF16 at load."""
    path, expected = build_nvfp4(tmp_path, group=32)
    check_loaded(path, expected, original, NVFP4_MAX_REL)


@pytest.mark.parametrize("edit_tensors, match", [
    (lambda t: t.pop(D1 + "weight_scale_2"), rf"NVFP4 tensor '{D1}weight' has no scale tensor '{D1}weight_scale_2'"),
    (lambda t: t.pop(D1 + "weight_scale"), rf"NVFP4 tensor '{D1}weight' has no scale tensor '{D1}weight_scale'"),
    (lambda t: t.update({K0 + "weight_scale": ("F8_E4M3", t[K0 + "weight_scale"][1][:, :2])}),
     rf"NVFP4 scale '{K0}weight_scale' is F8_E4M3 \[32, 2\]; weight '{K0}weight' of 32 x 64 values needs "
     r"F8_E4M3 \[32, 64 / 16\]"),
    (lambda t: t.update({K0 + "weight_scale": ("F32", np.ones((32, 4), np.float32))}),
     rf"NVFP4 scale '{K0}weight_scale' is F32 \[32, 4\]"),
    (lambda t: t.update({K0 + "weight_scale_2": ("F32", np.ones(2, np.float32))}),
     rf"'{K0}weight_scale_2' has shape \[2\]; it must be \[\] or \[1\]"),
    (lambda t: t.update({K0 + "weight": ("F8_E4M3", np.zeros((32, 64), np.uint8))}),
     rf"'{K0}weight' is F8_E4M3, but the modelopt NVFP4 checkpoint has no FP8 weights"),
    (lambda t: t[K0 + "weight_scale"][1].__setitem__((3, 1), 0xFF),                   # an E4M3 NaN code
     rf"NVFP4 scale '{K0}weight_scale' holds NaN or infinite values"),
    (lambda t: t.update({K0 + "weight_scale_2": ("F32", np.array([np.inf], np.float32))}),
     rf"NVFP4 scale '{K0}weight_scale_2' holds NaN or infinite values"),
], ids=["missing-scale-2", "missing-group-scale", "group-scale-shape", "group-scale-dtype", "scale-2-shape",
        "fp8-weight-in-nvfp4", "nan-group-scale", "inf-scale-2"])
def test_nvfp4_checkpoint_errors(tmp_path, edit_tensors, match):
    path, _ = build_nvfp4(tmp_path, edit_tensors=edit_tensors)
    with pytest.raises(ValueError, match=match) as e:
        load_checkpoint(path)
    assert path in str(e.value)


@pytest.mark.parametrize("edit_config, edit_tensors, match", [
    (None, lambda t: t.pop(K0 + "weight_global_scale"),
     rf"NVFP4 tensor '{K0}weight_packed' has no scale tensor '{K0}weight_global_scale'"),
    (None, lambda t: t.update({K0 + "weight_global_scale": ("F32", np.zeros(1, np.float32))}),
     rf"NVFP4 scale '{K0}weight_global_scale' is 0; it divides the weight's values"),
    (None, lambda t: t.update({K0 + "weight_global_scale": ("F32", np.array([np.nan], np.float32))}),
     rf"NVFP4 scale '{K0}weight_global_scale' holds NaN or infinite values"),
    (lambda qc: {**qc, "config_groups": {"group_0": {"weights": {**_CT_FP4, "strategy": "group"}}}}, None,
     r"config_groups.group_0.weights: NVFP4 strategy 'group' is not supported \(tensor_group\)"),
    (lambda qc: {**qc, "config_groups": {"group_0": {"weights": {**_CT_FP4, "group_size": 0}}}}, None,
     r"config_groups.group_0.weights: NVFP4 group_size must be a positive integer, got 0"),
], ids=["missing-global-scale", "zero-global-scale", "nan-global-scale", "group-strategy", "group-size-0"])
def test_compressed_tensors_nvfp4_errors(tmp_path, edit_config, edit_tensors, match):
    path, _ = build_nvfp4(tmp_path, edit_tensors=edit_tensors, compressed_tensors=True)
    if edit_config is not None:
        cfg_path = tmp_path / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["quantization_config"] = edit_config(cfg["quantization_config"])
        cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=match) as e:
        load_checkpoint(path)
    assert path in str(e.value)


def test_u8_weight_in_an_fp8_checkpoint(tmp_path):
    path, _ = build_fp8(tmp_path, "fp8-tensor", edit_tensors=lambda t: t.update(
        {K0 + "weight": ("U8", np.zeros((32, 32), np.uint8))}))
    with pytest.raises(ValueError, match=rf"'{K0}weight' is U8, which only NVFP4 checkpoints hold as weights"):
        load_checkpoint(path)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["fp8-block-128", "fp8-channel-autofp8-name", "nvfp4"])
def test_codes_on_cuda(tmp_path, case):
    """The CUDA backend keeps the FP8 / NVFP4 codes (gemv_fp8.cu / gemv_nvfp4.cu for up to 16 rows, fp16
    tiles into cuBLAS past them) and its logits agree with the NumPy backend's BF16-rounded weights over a
    12- and a 36-token prefill and the 12 single-token decode steps after one."""
    from pocketcupy.backend.ops_cuda import CudaOps
    from pocketcupy.backend.weight_cuda import CudaWeight

    from .helpers import PagedRun

    path = build_nvfp4(tmp_path)[0] if case == "nvfp4" else build_fp8(tmp_path, case)[0]
    ck = load_checkpoint(path)
    ops = CudaOps()
    model = build_model(ck.config, ck.tensors, ops)
    layer = model.layers[0]
    qtype = "NVFP4" if case == "nvfp4" else "FP8"
    assert all(isinstance(w, CudaWeight) and w.qtype == qtype for w in (layer.w_gate_up, layer.w_down, layer.wo))
    ref_model, ref_ops = load_reference_model(path)
    long = PROMPT * 3
    for ids in (PROMPT, long):
        err = rel_err(full_logits(model, ops, ids), full_logits(ref_model, ref_ops, ids))
        assert err <= 1e-2, f"{len(ids)} tokens: relative error {err:.2e}"
    run = PagedRun(model, ops)
    got = run.step([("a", long[:24], 0)])
    for p in range(24, 36):
        got += run.step([("a", long[p:p + 1], p)], decode_only=True)
    err = rel_err(np.concatenate(got), full_logits(ref_model, ref_ops, long))
    assert err <= 1e-2, f"prefill + decode: relative error {err:.2e}"


@pytest.mark.parametrize("case", ["fp8-block-128", "nvfp4"])
def test_codes_tensor_parallel_equals_one_rank(tmp_path, case):
    """Two ranks cut the FP8 / NVFP4 codes with their scales (tiny_llama's row-parallel columns, 32 and 64
    of them a rank, fall off FP8's 128-column groups and are cut as BF16; NVFP4's groups of 16 stay codes):
    the same greedy tokens."""
    path = build_nvfp4(tmp_path)[0] if case == "nvfp4" else build_fp8(tmp_path, case)[0]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    want = Engine(path, device="cpu", progress=False).generate([PROMPT], params)[0].outputs[0].token_ids
    e = Engine(path, device="cpu", progress=False, tensor_parallel_size=2)
    try:
        got = e.generate([PROMPT], params)[0].outputs[0].token_ids
    finally:
        e.close()
    assert got == want
