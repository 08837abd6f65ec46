"""Structure checks of the committed reference fixtures (no torch / llama_cpp needed).

See tests/fixtures/README.md for what they are and how to regenerate them.
"""
import json
import math
import os
import struct

import numpy as np
import pytest

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
TINY = ["tiny_llama", "tiny_qwen3", "tiny_qwen2"]
TINY_DTYPE = {"tiny_llama": "BF16", "tiny_qwen3": "F16", "tiny_qwen2": "F32"}


def _load(name):
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return json.load(f)


def _safetensors_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def _sha(s):
    return isinstance(s, str) and len(s) == 64 and all(c in "0123456789abcdef" for c in s)


# ------------------------------------------------------------------ llama.cpp
def test_llamacpp_tokenize():
    d = _load("llamacpp_tokenize.json")
    assert _sha(d["model_sha256"]) and d["llama_cpp_python"]
    cases = d["cases"]
    assert len(cases) >= 30
    texts = [c["text"] for c in cases]
    assert "" in texts and len(set(texts)) == len(texts)
    for c in cases:
        assert isinstance(c["text"], str)
        assert all(isinstance(i, int) and 0 <= i < 49152 for i in c["ids"])
        assert (len(c["ids"]) == 0) == (c["text"] == "")


def test_llamacpp_logits():
    d = _load("llamacpp_logits.json")
    assert _sha(d["model_sha256"]) and d["llama_cpp_python"]
    assert d["model_sha256"] == _load("llamacpp_tokenize.json")["model_sha256"]
    n_vocab = d["n_vocab"]
    paras = d["paragraphs"]
    assert 4 <= len(paras) <= 6
    for p in paras:
        n = len(p["ids"])
        assert 80 <= n <= 220
        assert all(0 <= i < n_vocab for i in p["ids"])
        assert len(p["argmax"]) == n and len(p["top5_ids"]) == n and len(p["top5_logprobs"]) == n
        assert len(p["next_logprob"]) == n - 1
        for a, ids5, lps5 in zip(p["argmax"], p["top5_ids"], p["top5_logprobs"]):
            assert len(ids5) == 5 == len(set(ids5)) and len(lps5) == 5
            assert ids5[0] == a
            assert all(math.isfinite(v) and v <= 1e-9 for v in lps5)
            assert all(x >= y for x, y in zip(lps5, lps5[1:]))
        assert all(math.isfinite(v) and v <= 1e-9 for v in p["next_logprob"])
        # the actual next token's log-prob is at most the top-1 log-prob
        assert all(lp <= t[0] + 1e-5 for lp, t in zip(p["next_logprob"], p["top5_logprobs"]))
        agree = np.mean(np.asarray(p["argmax"][:-1]) == np.asarray(p["ids"][1:]))
        assert agree > 0.25, (p["name"], agree)


# ------------------------------------------------------------------ Hugging Face tiny checkpoints
@pytest.mark.parametrize("name", TINY)
def test_tiny_hf_folder(name):
    folder = os.path.join(FIXTURES, name)
    files = os.listdir(folder)
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= set(files)
    assert sum(os.path.getsize(os.path.join(folder, f)) for f in files) < 1 << 20
    cfg = _load(os.path.join(name, "config.json"))
    tcfg = _load(os.path.join(name, "tokenizer_config.json"))
    assert tcfg["eos_token"] == "<|im_end|>" and tcfg["bos_token"] is None and tcfg["add_bos_token"] is False
    assert "<|im_start|>" in tcfg["chat_template"]
    tok = _load(os.path.join(name, "tokenizer.json"))
    n_tok = len(tok["model"]["vocab"]) + sum(1 for a in tok["added_tokens"] if a["id"] >= len(tok["model"]["vocab"]))
    assert n_tok == cfg["vocab_size"]

    if "model.safetensors.index.json" in files:
        index = _load(os.path.join(name, "model.safetensors.index.json"))
        shards = sorted(set(index["weight_map"].values()))
        assert len(shards) >= 2
    else:
        shards = ["model.safetensors"]
    tensors = {}
    for s in shards:
        hdr = _safetensors_header(os.path.join(folder, s))
        hdr.pop("__metadata__", None)
        tensors.update(hdr)
    assert {t["dtype"] for t in tensors.values()} == {TINY_DTYPE[name]}
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    assert tensors["model.embed_tokens.weight"]["shape"] == [v, h]
    assert ("lm_head.weight" in tensors) == (not cfg["tie_word_embeddings"])
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}.self_attn."
        assert tensors[pre + "q_proj.weight"]["shape"] == [cfg["num_attention_heads"] * hd, h]
        assert tensors[pre + "k_proj.weight"]["shape"] == [cfg["num_key_value_heads"] * hd, h]
        assert tensors[pre + "o_proj.weight"]["shape"] == [h, cfg["num_attention_heads"] * hd]
        if name == "tiny_qwen3":
            assert tensors[pre + "q_norm.weight"]["shape"] == [hd]
        if name == "tiny_qwen2":
            assert tensors[pre + "q_proj.bias"]["shape"] == [cfg["num_attention_heads"] * hd]
    if name == "tiny_llama":
        assert cfg["rope_scaling"]["rope_type"] == "llama3"
    if name == "tiny_qwen3":
        assert hd * cfg["num_attention_heads"] != h


def test_hf_logits_npz():
    z = np.load(os.path.join(FIXTURES, "hf_logits.npz"), allow_pickle=False)
    json.loads(str(z["versions"]))
    for name in TINY:
        v = _load(os.path.join(name, "config.json"))["vocab_size"]
        lengths = []
        for k in range(3):
            ids, logits = z[f"{name}__ids{k}"], z[f"{name}__logits{k}"]
            assert ids.dtype == np.int64 and ids.ndim == 1 and ((0 <= ids) & (ids < v)).all()
            assert logits.dtype == np.float32 and logits.shape == (len(ids), v)
            assert np.isfinite(logits).all() and logits.std() > 1e-3
            lengths.append(len(ids))
        assert lengths == [1, 7, 40]
        prompt, greedy = z[f"{name}__greedy_prompt"], z[f"{name}__greedy_ids"]
        assert prompt.ndim == 1 and greedy.shape == (16,) and ((0 <= greedy) & (greedy < v)).all()


def test_hf_tokenize():
    d = _load("hf_tokenize.json")
    assert d["cases"] and d["chat"]
    for c in d["cases"]:
        assert all(0 <= i < 320 for i in c["ids"]) and (len(c["ids"]) == 0) == (c["text"] == "")
    for c in d["chat"]:
        assert c["rendered"].startswith("<|im_start|>") and c["ids"][0] == 318


@pytest.mark.parametrize("fixture, names", [
    ("deepseek_v3_logits.npz", ("ds_lora_yarn", "ds_plain")),
    ("deepseek_v2_logits.npz", ("ds2_lite", "ds2_group")),
    ("qwen3_next_logits.npz", ("q3n_moe", "q3n_dense_mlp", "q35_dense", "q35_moe"))])
def test_seeded_checkpoint_npz(fixture, names):
    """Made by scripts/make_deepseek_fixtures.py and make_qwen3_next_fixtures.py from the checkpoints
    of tests/deepseek_checkpoints.py and qwen3_next_checkpoints.py."""
    z = np.load(os.path.join(FIXTURES, fixture), allow_pickle=False)
    json.loads(str(z["versions"]))
    for name in names:
        assert _sha(str(z[f"{name}__weights_sha256"]))
        assert [z[f"{name}__logits{k}"].shape for k in range(3)] == [(1, 320), (7, 320), (1, 320)]
        assert all(z[f"{name}__logits{k}"].dtype == np.float32 and np.isfinite(z[f"{name}__logits{k}"]).all()
                   for k in range(3))
        greedy = z[f"{name}__greedy_ids"]
        assert greedy.dtype == np.int64 and greedy.shape == (16,) and ((0 <= greedy) & (greedy < 320)).all()
