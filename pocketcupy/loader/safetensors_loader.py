"""Hugging Face checkpoint folders (config.json + single or sharded safetensors)."""
from __future__ import annotations

import json
import mmap
import os
import re

import numpy as np

from ..config import ModelConfig, RopeScaling
from ..quant.qtensor import QTensor

ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}

# HF name -> GGUF name (the models use GGUF names)
_LAYER_MAP = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}
_GLOBAL_MAP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
_DTYPES = {"BF16": ("BF16", np.uint16), "F16": ("F16", np.float16), "F32": ("F32", np.float32)}


def gguf_name(hf_name: str) -> str | None:
    m = _LAYER_RE.match(hf_name)
    if m:
        short = _LAYER_MAP.get(m.group(2))
        return f"blk.{m.group(1)}.{short}.{m.group(3)}" if short else None
    base, _, suffix = hf_name.rpartition(".")
    short = _GLOBAL_MAP.get(base)
    return f"{short}.{suffix}" if short else None


def config_from_hf(cfg: dict) -> ModelConfig:
    archs = cfg.get("architectures") or []
    arch = next((ARCHS[a] for a in archs if a in ARCHS), None)
    if arch is None:
        raise ValueError(f"model: unsupported architecture {archs} (supported: {', '.join(ARCHS)})")
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    scaling = RopeScaling()
    rs = cfg.get("rope_scaling") or None
    if rs:
        kind = rs.get("rope_type", rs.get("type"))
        if kind == "llama3":
            scaling = RopeScaling("llama3", float(rs["factor"]), float(rs.get("low_freq_factor", 1.0)),
                                  float(rs.get("high_freq_factor", 4.0)),
                                  int(rs.get("original_max_position_embeddings", 8192)))
        elif kind == "linear":
            scaling = RopeScaling("linear", float(rs["factor"]))
        elif kind not in ("default", None):
            raise ValueError(f"model: unsupported rope_scaling type {kind!r}")
    return ModelConfig(
        architecture=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        intermediate_size=cfg["intermediate_size"],
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
        rope_scaling=scaling,
        max_position=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qk_norm=(arch == "qwen3"),
        qkv_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
    )


def _shard_files(folder: str) -> list[str]:
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(folder, x) for x in files]
    single = os.path.join(folder, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    raise ValueError(f"model: no model.safetensors or model.safetensors.index.json in {folder}")


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
            header = json.loads(f.read(n))
        except json.JSONDecodeError as e:
            raise ValueError(f"model: {path} has a corrupt safetensors header ({e})") from e
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info["dtype"]
        if dtype not in _DTYPES:
            raise ValueError(f"model: tensor {name!r} in {path} has unsupported dtype {dtype}")
        np_dtype = _DTYPES[dtype][1]
        start, end = info["data_offsets"]
        if 8 + n + end > size:
            raise ValueError(f"model: {path} is truncated (tensor {name!r} runs past the end)")
        arr = np.frombuffer(buf, dtype=np_dtype, count=(end - start) // np.dtype(np_dtype).itemsize,
                            offset=8 + n + start)
        out[name] = (_DTYPES[dtype][0], arr.reshape(info["shape"]))
    return out


def read_safetensors_folder(folder: str) -> tuple[ModelConfig, dict[str, QTensor]]:
    cfg_path = os.path.join(folder, "config.json")
    if not os.path.isfile(cfg_path):
        raise ValueError(f"model: {folder} has no config.json")
    with open(cfg_path) as f:
        config = config_from_hf(json.load(f))
    tensors: dict[str, QTensor] = {}
    for path in _shard_files(folder):
        if not os.path.isfile(path):
            raise ValueError(f"model: shard {path} listed in the index is missing")
        for name, (qtype, data) in _read_safetensors(path).items():
            target = gguf_name(name)
            if target is not None:  # skips e.g. rotary inv_freq buffers
                tensors[target] = QTensor(qtype, tuple(data.shape), data)
    return config, tensors
