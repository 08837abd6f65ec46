"""Our safetensors path against Hugging Face transformers (fixtures from scripts/make_hf_fixtures.py)."""
import os

import numpy as np
import pytest

from pocketcupy import Engine, SamplingParams
from pocketcupy.loader import load_checkpoint

from .conftest import FIXTURES
from .helpers import full_logits, load_reference_model, write_safetensors

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


def _copy_fixture(name, dst, config_edit=None):
    import json
    import shutil

    src = os.path.join(FIXTURES, name)
    for f in os.listdir(src):
        shutil.copy(os.path.join(src, f), dst)
    if config_edit is not None:
        cfg = json.loads((dst / "config.json").read_text())
        config_edit(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return str(dst)


def test_transformers_v5_rope_parameters(tmp_path):
    """transformers >= 5 writes rope_theta and the scaling as rope_parameters; the llama3 scaling
    in it was ignored (rope_scaling only), so the logits were off."""
    def v5(cfg):
        cfg["rope_parameters"] = {**cfg.pop("rope_scaling"), "rope_theta": cfg.pop("rope_theta")}
    model, ops = load_reference_model(_copy_fixture("tiny_llama", tmp_path, v5))
    assert model.config.rope_scaling.kind == "llama3"
    ids, ref = REF["tiny_llama__ids0"], REF["tiny_llama__logits0"]
    assert np.abs(full_logits(model, ops, ids) - ref).max() / np.abs(ref).max() <= 1e-4


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.pop("num_attention_heads"), "lacks num_attention_heads"),       # was a KeyError
    (lambda c: c.update(num_key_value_heads=0), "num_key_value_heads must be a positive integer"),
    (lambda c: c.update(hidden_size="64"), "hidden_size must be a positive integer, got '64'"),
    (lambda c: c.update(rope_scaling={"rope_type": "linear"}), "'linear' needs a positive factor"),
    (lambda c: c.update(rope_scaling={"factor": 2.0}), "factor but no rope_type"),    # was ignored
    (lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "unsupported rope_scaling type 'yarn'"),
    (lambda c: c.update(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "unsupported rope_scaling type"),
    (lambda c: c.update(rope_scaling="linear"), "rope_scaling must be an object"),    # AttributeError
])
def test_bad_config_values(tmp_path, edit, match):
    path = _copy_fixture("tiny_llama", tmp_path, edit)
    with pytest.raises(ValueError, match=match) as e:
        load_checkpoint(path)
    assert "config.json" in str(e.value)


@pytest.mark.parametrize("scaling, kind", [
    ({"type": "linear", "factor": 2.0}, "linear"),
    ({"rope_type": "default"}, "none"),
    ({"rope_type": "llama3", "factor": 8.0}, "llama3"),
    (None, "none"),
])
def test_supported_rope_scaling(tmp_path, scaling, kind):
    path = _copy_fixture("tiny_llama", tmp_path, lambda c: c.update(rope_scaling=scaling))
    assert load_checkpoint(path).config.rope_scaling.kind == kind


@pytest.mark.parametrize("name, text", [
    ("config.json", "{not json"), ("config.json", "[1]"),                   # JSONDecodeError, AttributeError
    ("model.safetensors.index.json", "{"), ("model.safetensors.index.json", '{"metadata": {}}'),  # KeyError
])
def test_broken_json_files(tmp_path, name, text):
    _copy_fixture("tiny_qwen3", tmp_path)
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=name) as e:
        load_checkpoint(str(tmp_path))
    assert str(tmp_path) in str(e.value)


def _edit_header(path, edit, dumps=None):
    """Rewrite a safetensors file's JSON header with edit(header), written by dumps (default
    json.dumps) (the data stays where it was)."""
    import json

    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    edit(header)
    text = (dumps or json.dumps)(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + n:])


@pytest.mark.parametrize("edit, match", [
    (lambda h: h["model.norm.weight"].update(data_offsets=h["model.norm.weight"]["data_offsets"][::-1]),
     "corrupt safetensors header"),                # read the rest of the file as the tensor
    (lambda h: h["model.norm.weight"].update(shape=[32]), "holds 128 bytes, but shape"),   # numpy reshape error
    (lambda h: h["model.norm.weight"].pop("data_offsets"), "corrupt safetensors header"),  # KeyError
    (lambda h: h.update({"model.norm.weight": 5}), "corrupt safetensors header"),          # TypeError
    (lambda h: h["model.norm.weight"].update(dtype="F8_E5M2"), "unsupported dtype F8_E5M2"),
])
def test_corrupt_safetensors_header(tmp_path, edit, match):
    _copy_fixture("tiny_llama", tmp_path)
    _edit_header(tmp_path / "model.safetensors", edit)
    with pytest.raises(ValueError, match=match) as e:
        load_checkpoint(str(tmp_path))
    assert str(tmp_path / "model.safetensors") in str(e.value)


def test_tensor_named_twice_in_a_safetensors_header(tmp_path):
    """The last entry silently won: here the final norm would have been layer 0's."""
    import json

    def twice(h):
        layer0 = json.dumps(h["model.layers.0.input_layernorm.weight"])
        return json.dumps(h)[:-1] + f', "model.norm.weight": {layer0}}}'
    _copy_fixture("tiny_llama", tmp_path)
    _edit_header(tmp_path / "model.safetensors", lambda h: None, twice)
    with pytest.raises(ValueError, match="'model.norm.weight' appears twice in the safetensors header") as e:
        load_checkpoint(str(tmp_path))
    assert str(tmp_path / "model.safetensors") in str(e.value)


def _add_tensor(path, name, source, as_name=None):
    """The safetensors file at path with one more tensor: source's tensor name, as as_name (default: name)."""
    from pocketcupy.loader.safetensors_loader import _read_safetensors

    tensors = {k: (dt, np.ascontiguousarray(a)) for k, (dt, a) in _read_safetensors(str(path)).items()}
    write_safetensors(path, {**tensors, as_name or name: _read_safetensors(str(source))[name]})


def _edit_weight_map(folder, edit):
    import json

    index = json.loads((folder / "model.safetensors.index.json").read_text())
    edit(index["weight_map"])
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


@pytest.mark.parametrize("edit, match", [
    # a second copy in the other shard: which one was loaded depended on the order the shards were read
    (lambda d: _add_tensor(d / SHARDS[1], "model.embed_tokens.weight", d / SHARDS[0]),
     f"'model.embed_tokens.weight' is in two shards, .*{SHARDS[0]} and .*{SHARDS[1]}"),
    (lambda d: _edit_weight_map(d, lambda m: m.update({"model.norm.weight": SHARDS[0]})),     # was ignored
     rf"places tensor 'model.norm.weight' in {SHARDS[0]}, which does not hold it \(it is in .*{SHARDS[1]}\)"),
    (lambda d: _edit_weight_map(d, lambda m: m.update({"model.layers.0.mlp.gate_proj.bias": SHARDS[0]})),
     f"places tensor 'model.layers.0.mlp.gate_proj.bias' in {SHARDS[0]}, which does not hold it$"),
])
def test_shards_disagreeing_with_the_index(tmp_path, edit, match):
    _copy_fixture("tiny_qwen3", tmp_path)
    edit(tmp_path)
    with pytest.raises(ValueError, match=match) as e:
        load_checkpoint(str(tmp_path))
    assert str(tmp_path) in str(e.value)


def test_shard_tensor_the_index_omits_is_loaded(tmp_path):
    """As transformers and vLLM read a sharded checkpoint: every tensor of the shards the index names."""
    _copy_fixture("tiny_qwen3", tmp_path)
    _edit_weight_map(tmp_path, lambda m: m.pop("model.norm.weight"))
    assert load_checkpoint(str(tmp_path)).tensors["output_norm.weight"].shape == (64,)


def test_two_names_of_one_weight(tmp_path):
    """model.X and a multimodal folder's model.language_model.X are loaded as the same weight: the
    one read last silently won."""
    _copy_fixture("tiny_llama", tmp_path)
    path = tmp_path / "model.safetensors"
    _add_tensor(path, "model.layers.0.input_layernorm.weight", path, "model.language_model.norm.weight")
    with pytest.raises(ValueError, match="'model.norm.weight' and 'model.language_model.norm.weight' are the same"):
        load_checkpoint(str(tmp_path))


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.update(num_key_value_heads=4), r"'blk.0.attn_k.weight' has shape \(32, 64\), but the config needs \(64, 64\)"),
    (lambda c: c.pop("num_key_value_heads"), r"'blk.0.attn_k.weight' has shape"),   # defaults to the head count
    (lambda c: c.update(vocab_size=400), r"'token_embd.weight' has shape \(320, 64\)"),
    (lambda c: c.update(intermediate_size=256), r"'blk.0.ffn_gate.weight' has shape"),   # loaded, never checked
    (lambda c: c.update(num_hidden_layers=1), "belongs to layer 1, but the config has 1 layers"),  # ran 1 layer
])
def test_weight_shapes_checked_against_config(tmp_path, edit, match):
    path = _copy_fixture("tiny_llama", tmp_path, edit)
    with pytest.raises(ValueError, match=match) as e:
        load_checkpoint(path)
    assert path in str(e.value)


def test_embedding_rows_past_the_tokenizer(tmp_path):
    """Qwen2.5-style padding: vocab_size (embedding rows) above the tokenizer's size. An id in the
    padding, sampled or given in the prompt, raised in the detokenizer mid-generation; it now
    decodes to nothing, as the [PAD] tokens of a GGUF do."""
    from pocketcupy.loader.safetensors_loader import _read_safetensors

    path = _copy_fixture("tiny_llama", tmp_path, lambda c: c.update(vocab_size=336))
    tensors = {k: (dt, np.ascontiguousarray(a)) for k, (dt, a) in _read_safetensors(str(tmp_path / "model.safetensors")).items()}
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        dt, a = tensors[k]
        tensors[k] = (dt, np.concatenate([a, np.zeros((16, a.shape[1]), a.dtype)]))
    write_safetensors(tmp_path / "model.safetensors", tensors)

    engine = Engine(path, device="cpu", progress=False, max_model_len=64)
    assert engine.tokenizer.vocab_size == 336 and engine.tokenizer.id_to_token(330) == "[PAD330]"
    out = engine.generate([[5, 330]], SamplingParams(temperature=0, max_tokens=2, logit_bias={333: 100},
                                                      logprobs=1))[0].outputs[0]
    assert out.token_ids == [333, 333] and out.text == "" and out.logprobs[0][333].decoded_token == ""
