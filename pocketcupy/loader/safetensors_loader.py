"""Hugging Face checkpoint folders (config.json + single or sharded safetensors)."""
from __future__ import annotations

import json
import mmap
import os
import re

import numpy as np

from ..config import (GatedDeltaNetConfig, MLAConfig, ModelConfig, MoEConfig, RopeScaling, SparseMoEConfig, is_count,
                      is_number)
from ..quant.qtensor import QTensor
from .hf_quantized import (QUANTIZED_DTYPES, packed_as_modelopt, read_quantized_weight, scaled_weight,
                           weight_quantization)

ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
         "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3",
         "Qwen3NextForCausalLM": "qwen3_next", "Qwen3_5ForCausalLM": "qwen3_5",
         "Qwen3_5MoeForCausalLM": "qwen3_5_moe", "Qwen3_5ForConditionalGeneration": "qwen3_5",
         "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe"}
HYBRIDS = ("qwen3_next", "qwen3_5", "qwen3_5_moe")    # Gated DeltaNet + gated attention (models/qwen3_next.py)
MLA_ARCHS = ("deepseek_v2", "deepseek_v3")            # models/deepseek_v3.py

# HF name -> GGUF name (the models use GGUF names)
_LAYER_MAP = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    # DeepSeek-V3 (llama.cpp's names; routed experts: ffn_{gate,up,down}_exps.<expert>)
    "self_attn.q_a_proj": "attn_q_a", "self_attn.q_a_layernorm": "attn_q_a_norm", "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa", "self_attn.kv_a_layernorm": "attn_kv_a_norm",
    "self_attn.kv_b_proj": "attn_kv_b", "mlp.gate": "ffn_gate_inp", "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
    "mlp.shared_experts.up_proj": "ffn_up_shexp", "mlp.shared_experts.down_proj": "ffn_down_shexp",
    # Qwen3-Next / Qwen3.5: Gated DeltaNet layers (dt_bias and A_log: blk.N.ssm.dt_bias / .A_log) and MoE
    "linear_attn": "ssm", "linear_attn.in_proj_qkvz": "ssm_in_qkvz", "linear_attn.in_proj_ba": "ssm_in_ba",
    "linear_attn.in_proj_qkv": "ssm_in_qkv", "linear_attn.in_proj_z": "ssm_in_z", "linear_attn.in_proj_b": "ssm_in_b",
    "linear_attn.in_proj_a": "ssm_in_a", "linear_attn.conv1d": "ssm_conv1d", "linear_attn.norm": "ssm_norm",
    "linear_attn.out_proj": "ssm_out",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
    # DeepSeek-V3's multi-token-prediction layers (their own embed_tokens is the model's: not read)
    "enorm": "enorm", "hnorm": "hnorm", "eh_proj": "eh_proj", "shared_head.norm": "shared_head_norm",
    "shared_head.head": "shared_head_head",
}
_GLOBAL_MAP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias|e_score_correction_bias|dt_bias|A_log)$")
_EXPERT_RE = re.compile(r"^mlp\.experts\.(\d+)\.(gate|up|down)_proj$")
_DTYPES = {"BF16": ("BF16", np.uint16), "F16": ("F16", np.float16), "F32": ("F32", np.float32),
           **{q: (q, np.uint8) for q in QUANTIZED_DTYPES}}    # raw codes, dequantized by hf_quantized


def gguf_name(hf_name: str) -> str | None:
    if hf_name.startswith("model.language_model."):   # a multimodal folder's text model
        hf_name = "model." + hf_name[len("model.language_model."):]
    m = _LAYER_RE.match(hf_name)
    if m:
        layer, module, suffix = m.groups()
        expert = _EXPERT_RE.match(module)
        short = f"ffn_{expert.group(2)}_exps.{expert.group(1)}" if expert else _LAYER_MAP.get(module)
        return f"blk.{layer}.{short}.{suffix}" if short else None
    base, _, suffix = hf_name.rpartition(".")
    short = _GLOBAL_MAP.get(base) if suffix in ("weight", "bias") else None   # not lm_head.weight_scale
    return f"{short}.{suffix}" if short else None


def _read_json(path: str, what: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"model: {path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"model: {path} must hold a JSON object ({what})")
    return data


def _rope_scaling(rs, source: str, kinds: tuple[str, ...], max_position: int) -> RopeScaling:
    """rope_scaling, or transformers v5's rope_parameters (which also holds rope_theta); kinds: the
    scaling types the architecture supports."""
    if not rs:
        return RopeScaling()
    if not isinstance(rs, dict):
        raise ValueError(f"model: {source}: rope_scaling must be an object, got {rs!r}")
    kind = rs.get("rope_type", rs.get("type"))

    def num(key, default=None):
        v = rs.get(key, default)
        if not is_number(v) or v <= 0:
            raise ValueError(f"model: {source}: rope_scaling {kind!r} needs a positive {key}, got {v!r}")
        return v

    def optional(key, default):   # as transformers: a missing, null or zero value means the default
        return float(num(key)) if rs.get(key) else default

    if kind == "default" or (kind is None and "factor" not in rs):
        return RopeScaling()
    if kind is None:
        raise ValueError(f"model: {source}: rope_scaling has a factor but no rope_type")
    if kind not in kinds:
        raise ValueError(f"model: {source}: unsupported rope_scaling type {kind!r} (supported: {', '.join(kinds)})")
    if kind == "llama3":
        return RopeScaling("llama3", float(num("factor")), float(num("low_freq_factor", 1.0)),
                           float(num("high_freq_factor", 4.0)), int(num("original_max_position_embeddings", 8192)))
    if kind == "yarn":
        return RopeScaling("yarn", float(num("factor")), original_max_position=int(
            num("original_max_position_embeddings", max_position)), beta_fast=optional("beta_fast", 32.0),
            beta_slow=optional("beta_slow", 1.0), mscale=optional("mscale", 0.0),
            mscale_all_dim=optional("mscale_all_dim", 0.0), attention_factor=optional("attention_factor", None),
            truncate=bool(rs.get("truncate", True)))
    return RopeScaling("linear", float(num("factor")))


# DeepSeek-V3's MLA and MoE fields with transformers' defaults, checked by MLAConfig / MoEConfig
_MLA_FIELDS = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "v_head_dim": 128,
               "attention_bias": False}
_MOE_FIELDS = {"n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "n_shared_experts": 1,
               "first_k_dense_replace": 3, "n_group": 8, "topk_group": 4, "norm_topk_prob": True,
               "routed_scaling_factor": 2.5}
# DeepSeek-V2's (transformers' DeepseekV2Config: n_group / topk_group None where not group-limited;
# its router never renormalises the top-k weights, whatever norm_topk_prob says)
_MOE_V2_FIELDS = {**_MOE_FIELDS, "first_k_dense_replace": 0, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0,
                  "topk_method": "greedy"}


def _deepseek_v3(cfg: dict, count, arch: str) -> dict:
    """ModelConfig's DeepSeek-V3 (and V2) fields: one KV head whose row is the latent, kv_lora_rank +
    qk_rope_head_dim values (models/deepseek_v3.py), and the MLA and MoE numbers."""
    rope_dim, kv_rank = count("qk_rope_head_dim", 64), count("kv_lora_rank", 512)
    if arch == "deepseek_v2":
        moe = {k: d if cfg.get(k) is None else cfg[k] for k, d in _MOE_V2_FIELDS.items()}
        moe.update(norm_topk_prob=False, scoring_func="softmax")
    else:
        moe = {k: cfg.get(k, d) for k, d in _MOE_FIELDS.items()}
    return dict(num_kv_heads=1, head_dim=kv_rank + rope_dim, rope_dim=rope_dim,
                rope_interleaved=bool(cfg.get("rope_interleave", True)),
                mla=MLAConfig(**{k: cfg.get(k, d) for k, d in _MLA_FIELDS.items()}), moe=MoEConfig(**moe))


# Qwen3-Next's Gated DeltaNet and MoE fields with transformers' defaults, checked by
# GatedDeltaNetConfig / SparseMoEConfig
_GDN_FIELDS = {"linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
               "linear_num_key_heads": 16, "linear_num_value_heads": 32}
_SPARSE_MOE_FIELDS = {"num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
                      "shared_expert_intermediate_size": 512, "norm_topk_prob": True, "decoder_sparse_step": 1,
                      "mlp_only_layers": []}


def _qwen3_next(cfg: dict, count, rope: dict, arch: str) -> dict:
    """ModelConfig's Qwen3-Next and Qwen3.5 fields: the layer types (layer_types, or every
    full_attention_interval-th layer), the rotary dims (head_dim x partial_rotary_factor), the Gated
    DeltaNet sizes and the MoE: none for Qwen3.5 (dense) and where num_experts is 0 (every MLP
    dense); Qwen3.5-MoE's on every layer, its top-k weights normalised."""
    layers, head_dim = count("num_hidden_layers"), count("head_dim", 256)
    types = cfg.get("layer_types")
    if types is None:
        interval = count("full_attention_interval", 4)
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    factor = cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.25))
    if not (is_number(factor) and 0 < factor <= 1):
        raise ValueError(f"model: partial_rotary_factor must be a number in (0, 1], got {factor!r}")
    moe = {k: cfg.get(k, d) for k, d in _SPARSE_MOE_FIELDS.items()}
    if arch == "qwen3_5_moe":
        moe.update(norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
    return dict(head_dim=head_dim, rope_dim=int(head_dim * factor), qk_norm=True,
                gdn=GatedDeltaNetConfig(types, **{k: cfg.get(k, d) for k, d in _GDN_FIELDS.items()}),
                moe=None if arch == "qwen3_5" or moe["num_experts"] == 0 else SparseMoEConfig(**moe))


def _sliding_window(cfg: dict) -> bool:
    """Whether a Qwen2 / Qwen3 layer attends within a sliding window, as transformers reads their
    configs: a window only where use_sliding_window; then the sliding_attention layers of
    layer_types where given, else the layers from max_window_layers (28) on."""
    if cfg.get("use_sliding_window") is not True or not cfg.get("sliding_window"):
        return False
    types = cfg.get("layer_types")
    if isinstance(types, list):
        return "sliding_attention" in types
    layers, first = cfg.get("num_hidden_layers"), cfg.get("max_window_layers", 28)
    return not (is_count(layers) and isinstance(first, int) and layers <= first)


def config_from_hf(cfg: dict, source: str = "config.json") -> ModelConfig:
    archs = cfg.get("architectures") or []
    arch = next((ARCHS[a] for a in archs if a in ARCHS), None) if isinstance(archs, list) else None
    if arch is None:
        raise ValueError(f"model: {source}: unsupported architecture {archs} (supported: {', '.join(ARCHS)})")
    text = cfg.get("text_config")
    if arch in HYBRIDS and isinstance(text, dict):
        # a multimodal folder (Qwen3.5 as released): its text model's config (the vision tower is not
        # read); whether lm_head is tied, the top level alone says, as transformers reads it
        cfg = {**text, "tie_word_embeddings": cfg.get("tie_word_embeddings", False)}

    def count(key, default=None):
        v = cfg.get(key)
        if v is None and default is None:
            raise ValueError(f"model: {source} lacks {key}")
        v = default if v is None else v
        if not is_count(v):
            raise ValueError(f"model: {source}: {key} must be a positive integer, got {v!r}")
        return v

    def number(key, default):
        v = cfg.get(key, default)
        if not is_number(v):
            raise ValueError(f"model: {source}: {key} must be a number, got {v!r}")
        return float(v)

    act = cfg.get("hidden_act") or "silu"
    if act not in ("silu", "swish"):   # transformers' names of one function; vLLM refuses others too
        raise ValueError(f"model: {source}: hidden_act {act!r} is not supported (the {arch} model's MLP is SiLU-gated)")
    if arch in ("qwen2", "qwen3") and _sliding_window(cfg):
        raise ValueError(f"model: {source}: sliding-window attention (use_sliding_window, sliding_window "
                         f"{cfg.get('sliding_window')!r}, layer_types) is not supported: every layer attends to all")

    def flag(key, default: bool) -> bool:
        """true or false (null: the default); bool() made the string "false" true."""
        v = cfg.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise ValueError(f"model: {source}: {key} must be true or false, got {v!r}")
        return v

    hidden, heads = count("hidden_size"), count("num_attention_heads")
    # Qwen3.5-MoE has no dense MLP, nor intermediate_size: its experts' size stands in
    dense = cfg.get("moe_intermediate_size") if arch == "qwen3_5_moe" else None
    sizes = dict(vocab_size=count("vocab_size"), num_layers=count("num_hidden_layers"),
                 num_kv_heads=count("num_key_value_heads", heads), head_dim=count("head_dim", hidden // heads or 1),
                 intermediate_size=count("intermediate_size", dense),
                 max_position=count("max_position_embeddings", 4096))
    rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    rope_theta = number("rope_theta", rope.get("rope_theta", 10000.0))
    kinds = ("llama3", "linear", "yarn") if arch in MLA_ARCHS else ("linear",) if arch in HYBRIDS else (
        "llama3", "linear")
    scaling = _rope_scaling(cfg.get("rope_scaling") or rope, source, kinds, sizes["max_position"])
    try:
        sizes["qk_norm"] = arch == "qwen3"
        if arch in MLA_ARCHS:
            sizes.update(_deepseek_v3(cfg, count, arch))
        elif arch in HYBRIDS:
            sizes.update(_qwen3_next(cfg, count, rope, arch))
        return ModelConfig(
            architecture=arch, hidden_size=hidden, num_heads=heads, **sizes,
            rms_eps=number("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=scaling,
            num_nextn_predict_layers=cfg.get("num_nextn_predict_layers", 0),
            tie_word_embeddings=flag("tie_word_embeddings", False),
            qkv_bias=flag("attention_bias", arch == "qwen2"),
        )
    except ValueError as e:   # ModelConfig's checks (and number()'s, which name the file already)
        raise ValueError(f"model: {source}: {str(e).removeprefix('model: ').removeprefix(f'{source}: ')}") from None


def _mtp_layers(config: ModelConfig) -> dict[str, str]:
    """DeepSeek-V3's multi-token-prediction layers, stored after the decoder layers: the prefix of
    each (blk.N.) -> the one its weights are loaded under (mtp.0. for the first)."""
    n = config.num_layers
    return {f"blk.{n + i}.": f"mtp.{i}." for i in range(config.num_nextn_predict_layers)}


def _read_checkpoint(folder: str) -> dict[str, tuple[str, np.ndarray]]:
    """Every tensor of model.safetensors or of the shards the index names. As in transformers and
    vLLM, a shard's tensor the index does not list is read too; a name two shards hold, or one the
    index places in a shard that lacks it, is refused (which copy won depended on the reading order)."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.isfile(index):
        single = os.path.join(folder, "model.safetensors")
        if os.path.isfile(single):
            return _read_safetensors(single)
        raise ValueError(f"model: no model.safetensors or model.safetensors.index.json in {folder}")
    weight_map = _read_json(index, "with a weight_map").get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"model: {index} has no weight_map (tensor name -> shard file)")
    raw, shard_of = {}, {}
    for shard in sorted(set(map(str, weight_map.values()))):
        path = os.path.join(folder, shard)
        if not os.path.isfile(path):
            raise ValueError(f"model: shard {path} listed in the index is missing")
        for name, tensor in _read_safetensors(path).items():
            if name in raw:
                raise ValueError(f"model: tensor {name!r} is in two shards, {shard_of[name]} and {path}")
            raw[name], shard_of[name] = tensor, path
    for name, shard in weight_map.items():
        if shard_of.get(name) != os.path.join(folder, str(shard)):
            where = f" (it is in {shard_of[name]})" if name in shard_of else ""
            raise ValueError(f"model: {index} places tensor {name!r} in {shard}, which does not hold it{where}")
    return raw


def _unique_keys(path: str):
    """json.loads' object_pairs_hook: a key written twice is refused (dict() kept the last)."""
    def pairs_to_dict(pairs):
        out = dict(pairs)
        if len(out) < len(pairs):
            seen: set = set()
            key = next(k for k, _ in pairs if k in seen or seen.add(k))
            raise ValueError(f"model: {path}: {key!r} appears twice in the safetensors header")
        return out
    return pairs_to_dict


def _read_safetensors(path: str) -> dict[str, tuple[str, np.ndarray]]:
    """Zero-copy views over a memory-mapped safetensors file: name -> (dtype, array).
    Read directly because NumPy has no bfloat16 (kept as uint16 bits)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n <= 0 or 8 + n > size:
            raise ValueError(f"model: {path} is not a readable safetensors file")
        try:
            header = json.loads(f.read(n), object_pairs_hook=_unique_keys(path))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"model: {path} has a corrupt safetensors header ({e})") from e
        if not isinstance(header, dict):
            raise ValueError(f"model: {path} has a corrupt safetensors header (not a JSON object)")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, offsets = (info.get(k) for k in ("dtype", "shape", "data_offsets")) if isinstance(
            info, dict) else (None, None, None)
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)
                and isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise ValueError(f"model: {path} has a corrupt safetensors header (tensor {name!r}: {info!r})")
        if dtype not in _DTYPES:
            raise ValueError(f"model: tensor {name!r} in {path} has unsupported dtype {dtype} "
                             f"(supported: {', '.join(_DTYPES)})")
        np_dtype = np.dtype(_DTYPES[dtype][1])
        start, end = offsets
        if 8 + n + end > size:
            raise ValueError(f"model: {path} is truncated (tensor {name!r} runs past the end)")
        if end - start != int(np.prod(shape)) * np_dtype.itemsize:
            raise ValueError(f"model: {path}: tensor {name!r} holds {end - start} bytes, but shape {shape} "
                             f"of {dtype} needs {int(np.prod(shape)) * np_dtype.itemsize}")
        arr = np.frombuffer(buf, dtype=np_dtype, count=(end - start) // np_dtype.itemsize, offset=8 + n + start)
        out[name] = (_DTYPES[dtype][0], arr.reshape(shape))
    return out


def _quantization_config(folder: str, cfg: dict, cfg_path: str) -> tuple[dict | None, str]:
    """config.json's quantization_config, or ModelOpt's hf_quant_config.json (older exports keep
    it only there)."""
    if "quantization_config" in cfg:
        return cfg["quantization_config"], cfg_path
    path = os.path.join(folder, "hf_quant_config.json")
    if os.path.isfile(path):
        return {"quant_method": "modelopt", **_read_json(path, "ModelOpt's quantization")}, path
    return None, cfg_path


def _loaded_name(target: str | None, mtp_prefixes: dict[str, str], mtp: bool) -> str | None:
    """The name a mapped tensor is loaded as (an MTP layer's as mtp.<i>.*), or None where it is
    not loaded (unmapped, or an MTP layer without mtp)."""
    if target is None:
        return None
    prefix = target[:target.index(".", 4) + 1] if target.startswith("blk.") else ""
    if prefix in mtp_prefixes:
        return mtp_prefixes[prefix] + target[len(prefix):] if mtp else None
    return target


def read_safetensors_folder(folder: str, mtp: bool = False) -> tuple[ModelConfig, dict[str, QTensor]]:
    """mtp: load the multi-token-prediction layers too (as mtp.<i>.*); else they are neither loaded
    nor dequantized."""
    cfg_path = os.path.join(folder, "config.json")
    if not os.path.isfile(cfg_path):
        raise ValueError(f"model: {folder} has no config.json")
    cfg = _read_json(cfg_path, "the model's configuration")
    config = config_from_hf(cfg, cfg_path)
    try:
        quant = weight_quantization(*_quantization_config(folder, cfg, cfg_path))
    except ValueError as e:
        raise ValueError(f"model: {e}") from None
    mtp_prefixes = _mtp_layers(config)
    raw = _read_checkpoint(folder)     # every shard's tensors: a weight's scales may sit in another
    if quant is not None and quant.nvfp4_packed:
        try:
            packed_as_modelopt(raw)
        except ValueError as e:
            raise ValueError(f"model: {folder}: {e}") from None
    tensors: dict[str, QTensor] = {}
    read_from: dict[str, str] = {}     # loaded name -> the tensor's name in the checkpoint
    for name, (qtype, data) in raw.items():
        target = gguf_name(name)
        if target is None:   # e.g. rotary inv_freq buffers, and scales (read with their weight)
            weight = scaled_weight(name, raw)
            if weight is not None and _loaded_name(gguf_name(weight), mtp_prefixes, mtp) is not None:
                raise ValueError(f"model: {folder}: scale tensor {name!r} belongs to {weight!r}, which is "
                                 f"{raw[weight][0]}, not F8_E4M3: the weight would be used unscaled")
            continue
        target = _loaded_name(target, mtp_prefixes, mtp)
        if target is None:
            continue
        if target in read_from:   # e.g. model.norm.weight and model.language_model.norm.weight
            raise ValueError(f"model: {folder}: tensors {read_from[target]!r} and {name!r} are the same weight")
        read_from[target] = name
        if qtype in QUANTIZED_DTYPES:
            try:
                tensors[target] = read_quantized_weight(name, raw, quant)
            except ValueError as e:
                raise ValueError(f"model: {folder}: {e}") from None
        else:
            tensors[target] = QTensor(qtype, tuple(data.shape), data)
    return config, tensors
