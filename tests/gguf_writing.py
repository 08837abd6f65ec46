"""What the tests' llama.cpp-layout GGUF writers share (tests/deepseek_gguf.py,
tests/qwen3_next_gguf.py): tiny_llama's byte-level BPE as a "gpt2" tokenizer, the type the
converter stores each tensor in, and the file itself."""
import json
import os

import gguf
import numpy as np

from pocketcupy.quant.dequant import bf16_to_f32
from pocketcupy.quant.quantize import quantize

from .seeded_checkpoints import TOKENIZER


def as_f32(hf: dict) -> dict[str, np.ndarray]:
    """{HF name: (safetensors dtype, array)} as float32 arrays (the converter reads BF16 exactly)."""
    return {k: (bf16_to_f32(a) if dt == "BF16" else a).astype(np.float32) for k, (dt, a) in hf.items()}


def _tokenizer(w) -> None:
    with open(os.path.join(TOKENIZER, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    vocab = {**tok["model"]["vocab"], **{a["content"]: a["id"] for a in tok["added_tokens"]}}
    special = {a["id"] for a in tok["added_tokens"] if a["special"]}
    tokens = sorted(vocab, key=vocab.get)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if vocab[t] in special else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]])
    w.add_eos_token_id(319)
    w.add_pad_token_id(317)
    w.add_add_bos_token(False)


def _stored(name: str, a: np.ndarray, qtype: str, keep_f32: tuple[str, ...]):
    """(array, raw GGML type or None) as the converter stores it in qtype: 1-D tensors, norms and
    those ending in keep_f32 in F32, a row the block type cannot take in F16."""
    if a.ndim <= 1 or name.endswith(("_norm.weight", *keep_f32)) or qtype == "F32":
        return a.astype(np.float32), None
    if qtype == "F16" or a.shape[-1] % 32:
        return a.astype(np.float16), None
    return quantize(a, qtype), gguf.GGMLQuantizationType[qtype]


def write_file(path, arch: str, add_metadata, tensors: dict[str, np.ndarray], qtype: str, keep_f32=(),
               metadata=None, drop=()) -> str:
    """A GGUF of arch at path: add_metadata(writer) writes the model's keys, then the tokenizer's;
    metadata: keys overridden (None: removed); tensors {GGUF name: float32 array} stored in qtype;
    drop: names left out."""
    w = gguf.GGUFWriter(str(path), arch)
    add_metadata(w)
    _tokenizer(w)
    for key, value in (metadata or {}).items():
        w.kv_data[0].pop(key, None)
        if value is not None:
            adder = {int: w.add_uint32, float: w.add_float32, bool: w.add_bool, str: w.add_string}[type(value)]
            adder(key, value)
    for name, a in tensors.items():
        if name not in drop:
            data, raw = _stored(name, a, qtype, tuple(keep_f32))
            w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)
