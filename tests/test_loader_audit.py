"""Broken or unusual checkpoints: a clear error naming the file and the field or tensor, never a
bare traceback from deep inside nor a silently different model."""
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from pocketcupy import Engine
from pocketcupy.loader import load_checkpoint
from pocketcupy.loader.safetensors_loader import _read_safetensors

from .test_hf_models import _copy_fixture


def _rewrite_weights(folder, edit) -> str:
    """The folder's model.safetensors as F32, edited (edit(tensors by HF name)) and written again
    with the safetensors package."""
    path = os.path.join(folder, "model.safetensors")
    tensors = {k: (a.astype(np.uint32) << 16).view(np.float32) if dt == "BF16" else np.array(a, np.float32)
               for k, (dt, a) in _read_safetensors(path).items()}
    edit(tensors)
    save_file(tensors, path)
    return folder


def test_missing_weight_names_the_folder(tmp_path):
    """A weight the model reads but the folder lacks: the error named the weight, not the checkpoint."""
    path = _rewrite_weights(_copy_fixture("tiny_llama", tmp_path),
                            lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match="'blk.1.ffn_up.weight' is missing from the checkpoint") as e:
        Engine(path, device="cpu", max_model_len=32)
    assert str(tmp_path) in str(e.value)
    assert load_checkpoint(path).config.num_layers == 2


def _biases(parts):
    sizes = {"q": 64, "k": 32, "v": 32, "o": 64, "gate": 128, "up": 128, "down": 64}
    mod = {p: f"self_attn.{p}_proj" if len(p) == 1 else f"mlp.{p}_proj" for p in parts}
    return lambda t: t.update({f"model.layers.{i}.{mod[p]}.bias": np.full(sizes[p], 0.5, np.float32)
                               for i in range(2) for p in parts})


@pytest.mark.parametrize("config, parts, name", [
    ({"attention_bias": True}, "qkvo", "blk.0.attn_output.bias"),   # Llama's attention_bias covers o_proj too
    ({"mlp_bias": True}, ("gate", "up", "down"), r"blk.0.ffn_\w+.bias"),
])
def test_bias_the_model_does_not_apply(tmp_path, config, parts, name):
    """Biases the Llama model has no place for were dropped without a word: another model's logits."""
    folder = _copy_fixture("tiny_llama", tmp_path, lambda c: c.update(config))
    path = _rewrite_weights(folder, _biases(parts))
    with pytest.raises(ValueError, match=f"'{name}' is a bias this architecture's model does not apply") as e:
        load_checkpoint(path)
    assert path in str(e.value)


def test_gguf_bias_the_model_does_not_apply(tmp_path):
    """llama.cpp applies a llama GGUF's blk.N.attn_output.bias; we dropped it."""
    from .test_gguf_loader import _LLAMA_KV, _write

    p = tmp_path / "m.gguf"
    tensors = {"token_embd.weight": np.zeros((16, 32), np.float32), "blk.0.attn_output.bias": np.ones(32, np.float32)}
    _write(p, tensors=[(k, v, None) for k, v in tensors.items()], kv=_LLAMA_KV)
    with pytest.raises(ValueError, match="'blk.0.attn_output.bias' is a bias") as e:
        load_checkpoint(str(p))
    assert str(p) in str(e.value)


@pytest.mark.parametrize("act, ok", [("gelu", False), ("gelu_pytorch_tanh", False), ("relu", False),
                                     ("silu", True), ("swish", True), (None, True)])
def test_hidden_act(tmp_path, act, ok):
    """The MLP is SiLU-gated whatever config.json said: a gelu model ran as another model."""
    path = _copy_fixture("tiny_llama", tmp_path, lambda c: c.update(hidden_act=act))
    if ok:
        assert load_checkpoint(path).config.architecture == "llama"
        return
    with pytest.raises(ValueError, match=f"hidden_act '{act}' is not supported") as e:
        load_checkpoint(path)
    assert os.path.join(path, "config.json") in str(e.value)


@pytest.mark.parametrize("key, value", [("tie_word_embeddings", "false"), ("attention_bias", "false"),
                                        ("tie_word_embeddings", 0)])
def test_flags_must_be_booleans(tmp_path, key, value):
    """bool("false") is True: tie_word_embeddings "false" tied lm_head to the embeddings (its own
    lm_head.weight unread), attention_bias "false" asked for biases the folder lacks."""
    path = _copy_fixture("tiny_llama", tmp_path, lambda c: c.update({key: value}))
    with pytest.raises(ValueError, match=f"{key} must be true or false, got {value!r}") as e:
        load_checkpoint(path)
    assert os.path.join(path, "config.json") in str(e.value)


def test_flags_null_is_the_default(tmp_path):
    path = _copy_fixture("tiny_llama", tmp_path, lambda c: c.update(tie_word_embeddings=None, attention_bias=None))
    c = load_checkpoint(path).config
    assert not c.tie_word_embeddings and not c.qkv_bias


def _qwen2(edit):
    def f(c):
        c.pop("layer_types")
        c.update(edit)
    return f


@pytest.mark.parametrize("edit", [
    {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1},
    {"use_sliding_window": True, "sliding_window": 16, "layer_types": ["full_attention", "sliding_attention"]},
])
def test_sliding_window_refused(tmp_path, edit):
    """Qwen2 / Qwen3 with use_sliding_window: the window was ignored, so past it every layer saw
    tokens transformers and vLLM mask (another model's logits on long prompts)."""
    path = _copy_fixture("tiny_qwen2", tmp_path, _qwen2(edit))
    with pytest.raises(ValueError, match="sliding-window attention") as e:
        load_checkpoint(path)
    assert os.path.join(path, "config.json") in str(e.value)


@pytest.mark.parametrize("edit", [
    {"use_sliding_window": False, "sliding_window": 16, "max_window_layers": 1},     # as released
    {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2},      # no layer from 2 on
    {"use_sliding_window": True, "sliding_window": 16},                              # max_window_layers 28
    {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1,
     "layer_types": ["full_attention"] * 2},                                          # layer_types decide
    {"use_sliding_window": False, "sliding_window": None, "layer_types": ["sliding_attention"] * 2},  # no window
])
def test_sliding_window_off_loads(tmp_path, edit):
    """Every layer full attention, as transformers reads these configs."""
    path = _copy_fixture("tiny_qwen2", tmp_path, _qwen2(edit))
    assert load_checkpoint(path).config.architecture == "qwen2"


def test_bad_number_names_the_file_once(tmp_path):
    path = _copy_fixture("tiny_llama", tmp_path, lambda c: c.update(rms_norm_eps=None))
    cfg = os.path.join(path, "config.json")
    with pytest.raises(ValueError, match="rms_norm_eps must be a number, got None") as e:
        load_checkpoint(path)
    assert str(e.value) == f"model: {cfg}: rms_norm_eps must be a number, got None"


def test_gguf_llama_with_experts(tmp_path):
    """llama.cpp writes Mixtral as architecture llama with llama.expert_count: the error was a
    missing blk.0.ffn_gate.weight."""
    from .test_gguf_loader import _LLAMA_KV, _write

    p = tmp_path / "m.gguf"
    tensors = {"token_embd.weight": np.zeros((16, 32), np.float32),
               "blk.0.ffn_gate_exps.weight": np.zeros((4, 64, 32), np.float32)}
    _write(p, tensors=[(k, v, None) for k, v in tensors.items()],
           kv={**_LLAMA_KV, "llama.expert_count": 4, "llama.expert_used_count": 2})
    with pytest.raises(ValueError, match=r"llama.expert_count is 4: mixture-of-experts llama models \(Mixtral\)") as e:
        load_checkpoint(str(p))
    assert str(p) in str(e.value)


@pytest.mark.parametrize("no, arch", [(0, "llama"), (1, None)])
def test_gguf_split_part(tmp_path, no, arch):
    """A part of llama-gguf-split's output: the first one loaded a model lacking the other parts'
    weights (a missing weight at build), a later one was an 'unsupported GGUF architecture None'."""
    import gguf

    p = tmp_path / f"m-0000{no + 1}-of-00002.gguf"
    w = gguf.GGUFWriter(str(p), arch)
    if arch is None:   # later parts hold split.* keys alone
        w.kv_data[0].pop("general.architecture", None)
    w.add_uint16("split.no", no)
    w.add_uint16("split.count", 2)
    w.add_int32("split.tensors.count", 2)
    if arch:
        for k, v in {"llama.context_length": 64, "llama.embedding_length": 32, "llama.block_count": 1,
                     "llama.feed_forward_length": 64, "llama.attention.head_count": 4}.items():
            w.add_uint32(k, v)
    w.add_tensor("token_embd.weight", np.zeros((16, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=rf"is part {no + 1} of a split GGUF \(split.count 2\)") as e:
        load_checkpoint(str(p))
    assert str(p) in str(e.value)
