"""scripts/make_synthetic_model.py: one random model written as BF16 safetensors and F16 / Q8_0 /
Q4_K_M GGUF must be the same model in every format (Q/K permutation, tokenizer, metadata)."""
import importlib.util
import json
import os
import sys

import numpy as np
import pytest

from pocketcupy import Engine, SamplingParams
from pocketcupy.loader import load_checkpoint
from pocketcupy.loader.gguf import read_metadata
from pocketcupy.tokenizer import Tokenizer

from .helpers import full_logits, load_reference_model

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "make_synthetic_model.py")
GGUF_FILES = {"f16": "model-F16.gguf", "q8_0": "model-Q8_0.gguf", "q4_k_m": "model-Q4_K_M.gguf"}
# the smallest shapes whose rows are whole 256-element super-blocks (real Q4_K / Q6_K), and a
# smaller one whose Q4_K_M falls back to Q5_0 / Q8_0 as llama.cpp does
SMOL = ["--vocab", "49152", "--hidden", "256", "--layers", "2", "--heads", "4", "--kv-heads", "2",
        "--intermediate", "512", "--seed", "1"]
SMALL = ["--vocab", "512", "--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2",
         "--intermediate", "128", "--seed", "2"]
TEXTS = ["The quick brown fox jumps over the lazy dog.", "<|im_start|>user\nhi there<|im_end|>\n",
         "  spaces\tand\nnewlines 12345 ünïcödé 🙂", "def f(x):\n    return x**2  # square"]


def _script():
    if "make_synthetic_model" not in sys.modules:
        spec = importlib.util.spec_from_file_location("make_synthetic_model", SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["make_synthetic_model"] = mod   # dataclasses look their module up
        spec.loader.exec_module(mod)
    return sys.modules["make_synthetic_model"]


def _make(tmp_path_factory, name, args):
    out = str(tmp_path_factory.mktemp(name))
    return _script().main(["--out", out, *args])


@pytest.fixture(scope="module")
def smol(tmp_path_factory, smollm2_gguf):
    return _make(tmp_path_factory, "smol", SMOL)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return _make(tmp_path_factory, "small", SMALL)


def _paths(result):
    return {f: v["path"] for f, v in result["formats"].items()}


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_outputs_and_metadata(smol, smollm2_gguf):
    p = _paths(smol)
    assert set(p) == {"bf16", "f16", "q8_0", "q4_k_m"} and smol["tokenizer"] == "smollm2"
    for f, v in smol["formats"].items():
        size = (sum(os.path.getsize(os.path.join(v["path"], x)) for x in os.listdir(v["path"]))
                if f == "bf16" else os.path.getsize(v["path"]))
        assert v["bytes"] == size
    with open(os.path.join(p["bf16"], "config.json")) as fh:
        cfg = json.load(fh)
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_key_value_heads"] == 2
    assert cfg["rope_theta"] == 500000.0 and cfg["vocab_size"] == 49152 and not cfg["tie_word_embeddings"]
    meta = read_metadata(p["q4_k_m"])
    assert meta["general.architecture"] == "llama" and meta["general.file_type"] == 15
    assert meta["llama.block_count"] == 2 and meta["llama.attention.head_count_kv"] == 2
    assert meta["llama.rope.freq_base"] == 500000.0 and meta["llama.context_length"] == 8192
    real = read_metadata(smollm2_gguf)
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                "tokenizer.ggml.pre", "tokenizer.chat_template", "tokenizer.ggml.eos_token_id"):
        assert meta[key] == real[key], key
    types = {n: t.qtype for n, t in load_checkpoint(p["q4_k_m"]).tensors.items()}
    assert types["token_embd.weight"] == "Q4_K" and types["output.weight"] == "Q6_K"
    assert types["blk.1.attn_v.weight"] == types["blk.0.ffn_down.weight"] == "Q6_K"
    assert types["blk.0.attn_q.weight"] == types["blk.1.ffn_up.weight"] == "Q4_K"
    assert types["blk.0.attn_norm.weight"] == "F32"
    assert {t.qtype for t in load_checkpoint(p["q8_0"]).tensors.values()} == {"Q8_0", "F32"}
    assert {t.qtype for t in load_checkpoint(p["f16"]).tensors.values()} == {"F16", "F32"}
    ck = load_checkpoint(p["bf16"])
    assert ck.format == "safetensors" and {t.qtype for t in ck.tensors.values()} == {"BF16"}
    from safetensors import safe_open  # an independent reader of our header
    with safe_open(os.path.join(p["bf16"], "model.safetensors"), framework="numpy") as fh:
        assert "model.layers.1.self_attn.k_proj.weight" in set(fh.keys())


@pytest.mark.parametrize("which", ["smol", "small"])
def test_formats_give_the_same_model(which, request):
    """F16 GGUF (Q/K rows permuted, interleaved rope) == BF16 safetensors (rotate-half rope);
    Q8_0 and Q4_K_M close to them."""
    result = request.getfixturevalue(which)
    p = _paths(result)
    tok = Tokenizer.from_gguf(p["f16"])
    ids = tok.encode(TEXTS[0] + " " + TEXTS[3])
    logits = {}
    for f, path in p.items():
        model, ops = load_reference_model(path)
        logits[f] = full_logits(model, ops, ids)
    ref = logits["bf16"]
    assert _rel(logits["f16"], ref) < 1e-5          # same numbers: bf16 values are exact in f16
    assert np.array_equal(logits["f16"].argmax(-1), ref.argmax(-1))
    assert _rel(logits["q8_0"], ref) < 0.03           # measured ~0.010-0.013
    assert _rel(logits["q4_k_m"], ref) < 0.25         # measured ~0.05 (Q5_0 fallback) - 0.13 (Q4_K)
    assert _rel(logits["q8_0"], ref) < _rel(logits["q4_k_m"], ref)


def test_greedy_f16_gguf_equals_bf16_safetensors(smol):
    p = _paths(smol)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outs = [Engine(p[f], device="cpu", progress=False).generate("Once upon a time", params)[0] for f in ("f16", "bf16")]
    assert outs[0].prompt_token_ids == outs[1].prompt_token_ids
    assert outs[0].outputs[0].token_ids == outs[1].outputs[0].token_ids


@pytest.mark.parametrize("which", ["smol", "small"])
def test_gguf_and_hf_tokenizers_agree(which, request):
    p = _paths(request.getfixturevalue(which))
    tg, th = Tokenizer.from_gguf(p["q8_0"]), Tokenizer.from_hf_dir(p["bf16"])
    assert tg.vocab_size == th.vocab_size
    for text in TEXTS:
        ids = tg.encode(text)
        assert th.encode(text) == ids and tg.decode(ids) == text == th.decode(ids)
    assert (tg.bos_token_id, tg.eos_token_id, tg.add_bos) == (th.bos_token_id, th.eos_token_id, th.add_bos)
    msgs = [{"role": "user", "content": "hi"}]
    assert tg.apply_chat_template(msgs) == th.apply_chat_template(msgs)
    assert "<|im_start|>user\nhi<|im_end|>" in th.apply_chat_template(msgs)
    assert th.encode("<|im_end|>") == [th.eos_token_id]


def test_generated_tokenizer_compresses_text(small):
    tok = Tokenizer.from_gguf(_paths(small)["f16"])
    assert tok.vocab_size == 512
    text = "the cat sat on the mat and then it went to sleep"
    assert len(tok.encode(text)) < 0.8 * len(text.encode())


def test_same_seed_same_weights_whatever_the_formats(small, tmp_path):
    out = _script().main(["--out", str(tmp_path), *SMALL, "--formats", "q8_0"])
    assert set(out["formats"]) == {"q8_0"} and not os.path.exists(tmp_path / "hf")
    with open(out["formats"]["q8_0"]["path"], "rb") as a, open(_paths(small)["q8_0"], "rb") as b:
        assert a.read() == b.read()


def test_sharded_safetensors(small, tmp_path, monkeypatch):
    mod = _script()
    monkeypatch.setattr(mod, "SHARD_BYTES", 40_000)
    out = mod.main(["--out", str(tmp_path), *SMALL, "--formats", "bf16"])
    folder = out["formats"]["bf16"]["path"]
    with open(os.path.join(folder, "model.safetensors.index.json")) as fh:
        index = json.load(fh)
    shards = sorted(set(index["weight_map"].values()))
    assert out["formats"]["bf16"]["shards"] == len(shards) > 2
    for shard in shards:  # within the limit (plus its header) unless one tensor alone is larger
        names = [n for n, f in index["weight_map"].items() if f == shard]
        assert len(names) == 1 or os.path.getsize(os.path.join(folder, shard)) <= 40_000 + 1_000
    a, b = load_checkpoint(folder).tensors, load_checkpoint(_paths(small)["bf16"]).tensors
    assert a.keys() == b.keys() and all(np.array_equal(a[k].data, b[k].data) for k in a)


def test_chunks_cutting_through_heads(tmp_path, monkeypatch):
    """Chunks of 3 rows, written by worker processes out of order, cut through the Q/K heads
    whose rows GGUF permutes: every GGUF tensor must still be the safetensors one, permuted and
    quantized whole."""
    from pocketcupy.quant.dequant import bf16_to_f32
    from pocketcupy.quant.quantize import quantize

    mod = _script()
    monkeypatch.setattr(mod, "GEN_CHUNK", 3 * 256)
    out = mod.main(["--out", str(tmp_path), "--vocab", "512", "--hidden", "256", "--layers", "1", "--heads", "4",
                    "--kv-heads", "2", "--intermediate", "256", "--threads", "2"])
    p = _paths(out)
    hf = load_checkpoint(p["bf16"]).tensors
    assert not [f for f in os.listdir(tmp_path) if f.endswith(mod.PARTIAL)]
    for f in ("f16", "q8_0", "q4_k_m"):
        for name, t in load_checkpoint(p[f]).tensors.items():
            want = bf16_to_f32(hf[name].data)
            if name.endswith(("attn_q.weight", "attn_k.weight")):
                want = mod.permute_qk(want, 4 if "attn_q" in name else 2)
            assert np.array_equal(t.data, quantize(want, t.qtype)), (f, name)
    assert {t.qtype for t in load_checkpoint(p["q4_k_m"]).tensors.values()} == {"Q4_K", "Q6_K", "F32"}


def test_q4_k_m_type_rules():
    mod = _script()
    s = mod.Spec()                                  # Llama-3-8B shape
    plan = {t.gguf: t for t in mod.tensor_plan(s)}
    six = [i for i in range(32) if mod.gguf_type("q4_k_m", plan[f"blk.{i}.ffn_down.weight"], s, "llama.cpp") == "Q6_K"]
    assert six == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert all(mod.gguf_type("q4_k_m", plan[f"blk.{i}.attn_v.weight"], s, "all") == "Q6_K" for i in range(32))
    tiny = mod.Spec(hidden=64, heads=4, kv_heads=2, intermediate=128, layers=1, vocab=512)
    tp = {t.gguf: t for t in mod.tensor_plan(tiny)}
    assert mod.gguf_type("q4_k_m", tp["blk.0.attn_q.weight"], tiny) == "Q5_0"     # llama.cpp's fallbacks
    assert mod.gguf_type("q4_k_m", tp["output.weight"], tiny) == "Q8_0"


def test_llama3_8b_sizes_fit_the_benchmark_disk():
    mod = _script()
    est = mod.estimate_bytes(mod.Spec(vocab=49152), mod.FORMATS, "all")
    gb = {f: round(b / 1e9, 1) for f, b in est.items()}
    assert gb == {"bf16": 14.8, "f16": 14.8, "q8_0": 7.8, "q4_k_m": 4.7}
    assert sum(est.values()) < 45e9
    # llama.cpp's own mix on the real vocabulary gives the size of the published Llama-3-8B Q4_K_M
    assert round(mod.estimate_bytes(mod.Spec(), ["q4_k_m"], "llama.cpp")["q4_k_m"] / 1e9, 2) == 4.91


def test_bad_arguments(tmp_path):
    mod = _script()
    with pytest.raises(SystemExit):
        mod.main(["--out", str(tmp_path), *SMALL, "--formats", "q3_k"])
    with pytest.raises(SystemExit):
        mod.main(["--out", str(tmp_path), "--vocab", "100", "--hidden", "64", "--layers", "1", "--heads", "4",
                  "--kv-heads", "2", "--intermediate", "128"])


def test_tokenizer_from_another_gguf(small, tmp_path):
    src = _paths(small)["f16"]
    out = _script().main(["--out", str(tmp_path), *SMALL, "--seed", "5", "--formats", "q8_0",
                          "--tokenizer-gguf", src])
    assert out["tokenizer"] == "gguf:model-F16.gguf"
    a, b = read_metadata(out["formats"]["q8_0"]["path"]), read_metadata(src)
    assert all(a[k] == b[k] for k in b if k.startswith("tokenizer."))
    with pytest.raises(SystemExit, match="tokens"):
        _script().main(["--out", str(tmp_path / "x"), *SMALL[2:], "--vocab", "600", "--tokenizer-gguf", src])


def test_engine_runs_every_format(small):
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for f, path in _paths(small).items():
        out = Engine(path, device="cpu", progress=False).generate("the cat", params)[0]
        assert len(out.outputs[0].token_ids) == 4, f
