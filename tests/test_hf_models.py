"""Our safetensors path against Hugging Face transformers (fixtures from scripts/make_hf_fixtures.py)."""
import os

import numpy as np
import pytest

from pocketcupy import Engine, SamplingParams
from pocketcupy.loader import load_checkpoint

from .conftest import FIXTURES
from .helpers import full_logits, load_reference_model

MODELS = ["tiny_llama", "tiny_qwen2", "tiny_qwen3"]
REF = np.load(os.path.join(FIXTURES, "hf_logits.npz"))


@pytest.mark.parametrize("name", MODELS)
def test_logits_match_transformers(name):
    model, ops = load_reference_model(os.path.join(FIXTURES, name))
    for j in range(3):
        ids, ref = REF[f"{name}__ids{j}"], REF[f"{name}__logits{j}"]
        got = full_logits(model, ops, ids)
        rel = np.abs(got - ref).max() / np.abs(ref).max()
        assert rel <= 1e-4, f"{name} sequence {j}: relative error {rel:.2e}"


@pytest.mark.parametrize("name", MODELS)
def test_greedy_matches_transformers(name):
    engine = Engine(os.path.join(FIXTURES, name), device="cpu", progress=False)
    prompt = REF[f"{name}__greedy_prompt"].tolist()
    want = REF[f"{name}__greedy_ids"].tolist()
    out = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=len(want), ignore_eos=True))[0]
    assert out.outputs[0].token_ids == want


def test_configs_and_formats():
    llama = load_checkpoint(os.path.join(FIXTURES, "tiny_llama"))
    assert llama.config.rope_scaling.kind == "llama3" and not llama.config.rope_interleaved
    assert {t.qtype for t in llama.tensors.values()} == {"BF16"}
    qwen3 = load_checkpoint(os.path.join(FIXTURES, "tiny_qwen3"))
    assert qwen3.config.qk_norm and qwen3.config.tie_word_embeddings and qwen3.config.head_dim == 32
    assert {t.qtype for t in qwen3.tensors.values()} == {"F16"}
    qwen2 = load_checkpoint(os.path.join(FIXTURES, "tiny_qwen2"))
    assert qwen2.config.qkv_bias and "blk.0.attn_q.bias" in qwen2.tensors


def test_missing_config(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        load_checkpoint(str(tmp_path))


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["MambaForCausalLM"]}')
    with pytest.raises(ValueError, match="MambaForCausalLM"):
        load_checkpoint(str(tmp_path))


def test_missing_shard(tmp_path):
    import shutil

    src = os.path.join(FIXTURES, "tiny_qwen3")
    for f in os.listdir(src):
        if not f.startswith("model-00002"):
            shutil.copy(os.path.join(src, f), tmp_path)
    with pytest.raises(ValueError, match="missing"):
        load_checkpoint(str(tmp_path))


def test_corrupt_safetensors(tmp_path):
    import shutil

    src = os.path.join(FIXTURES, "tiny_llama")
    for f in os.listdir(src):
        shutil.copy(os.path.join(src, f), tmp_path)
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated"):
        load_checkpoint(str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ValueError, match="safetensors"):
        load_checkpoint(str(tmp_path))
