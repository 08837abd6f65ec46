"""DeepSeek-V3 GGUF files (llama.cpp's "deepseek2"): the tiny checkpoints of
tests/deepseek_checkpoints.py written as llama.cpp's converter writes them (tests/deepseek_gguf.py),
loaded against the same checkpoint's safetensors folder: the same weights (float32: every tensor
equal), logits, greedy tokens and tokenizer; a Q8_0 file near them; the multi-token-prediction
layer; the file on CUDA; the refused variants, each naming its key or tensor."""
import numpy as np
import pytest

pytest.importorskip("gguf")

from pocketcupy import Engine  # noqa: E402
from pocketcupy.loader import load_checkpoint  # noqa: E402

from .deepseek_checkpoints import VARIANTS, bigram_tensors, config, write_checkpoint  # noqa: E402
from .deepseek_gguf import write_gguf  # noqa: E402
from .helpers import full_logits, load_reference_model, rel_err  # noqa: E402
from .seeded_checkpoints import BATCH, GREEDY_NEW, GREEDY_PROMPT, PROMPTS, greedy  # noqa: E402

# What a GGUF cannot say, given to both sides: llama.cpp's deepseek2 rope always rotates adjacent
# pairs (rope_interleave), and its yarn keeps only mscale_all_dim (read as mscale too)
SAME = {"ds_plain": dict(rope_interleave=True),
        "ds_lora_yarn": dict(rope_scaling={**config("ds_lora_yarn")["rope_scaling"], "mscale": 0.8})}


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    """(name, safetensors folder, F32 GGUF path)."""
    name = request.param
    d = tmp_path_factory.mktemp(name)
    return (name, write_checkpoint(d / "hf", name, config_changes=SAME[name]),
            write_gguf(d / "f32.gguf", name, "F32", SAME[name]))


def _logits(path) -> list[np.ndarray]:
    model, ops = load_reference_model(path)
    return [full_logits(model, ops, ids) for ids in PROMPTS]


def test_same_weights_as_the_folder(pair):
    """Every tensor the model reads, under its name: the experts split back out of their stacks,
    attn_kv_b joined back from attn_k_b / attn_v_b, exp_probs_b as the score correction bias."""
    _, folder, path = pair
    want, got = load_checkpoint(folder), load_checkpoint(path)
    assert got.format == "gguf" and got.config.architecture == "deepseek_v3"
    assert sorted(got.tensors) == sorted(want.tensors)
    for k, t in want.tensors.items():
        np.testing.assert_array_equal(got.tensors[k].dequantize(), t.dequantize(), err_msg=k)
    c, w = got.config, want.config
    assert (c.mla, c.moe, c.rope_interleaved, c.head_dim, c.num_kv_heads) == (w.mla, w.moe, True, 48, 1)
    assert c.rope_scaling.kind == w.rope_scaling.kind and c.num_nextn_predict_layers == 0


def test_logits_match_the_folder(pair):
    _, folder, path = pair
    for got, want in zip(_logits(path), _logits(folder)):
        assert rel_err(got, want) <= 1e-6


def test_engine_greedy_tokens_and_tokenizer(pair):
    _, folder, path = pair
    a, b = (Engine(p, device="cpu", progress=False) for p in (path, folder))
    for prompt in (GREEDY_PROMPT, BATCH[1]):
        ids = [e.generate(prompt, greedy(GREEDY_NEW))[0].outputs[0].token_ids for e in (a, b)]
        assert ids[0] == ids[1]
    text = "the history of the world, and then some"
    assert a.tokenizer.encode(text) == b.tokenizer.encode(text)
    assert a.tokenizer.eos_token_ids == b.tokenizer.eos_token_ids


@pytest.mark.parametrize("qtype, bound", [("F16", 3e-3), ("Q8_0", 0.1)])
def test_quantized_file(pair, tmp_path, qtype, bound):
    """Matrices stored in qtype (a row the blocks cannot take, attn_k_b's 16 values, in F16 as the
    converter does); the stacked experts' per-expert views keep the blocks. The logits stay near
    the float32 folder's but for the few rows where the rounding turns a token to other experts: the
    median row is compared."""
    name, folder, _ = pair
    path = write_gguf(tmp_path / "q.gguf", name, qtype, SAME[name])
    t = load_checkpoint(path).tensors
    assert t["blk.1.ffn_gate_exps.7.weight"].qtype == qtype and t["blk.1.ffn_gate_exps.7.weight"].shape == (32, 64)
    assert t["blk.1.ffn_gate_inp.weight"].qtype == "F32" and t["blk.1.attn_kv_b.weight"].qtype == "F32"
    for got, want in zip(_logits(path), _logits(folder)):
        assert np.median(np.abs(got - want).max(axis=1)) / np.abs(want).max() <= bound
    out = Engine(path, device="cpu", progress=False).generate(GREEDY_PROMPT, greedy(4))[0]
    assert len(out.outputs[0].token_ids) == 4


def test_older_single_kv_b(pair, tmp_path):
    """Files converted before llama.cpp split kv_b_proj hold attn_kv_b as it is."""
    name, folder, _ = pair
    path = write_gguf(tmp_path / "old.gguf", name, "F32", SAME[name], split_kv_b=False)
    assert "blk.0.attn_kv_b.weight" in load_checkpoint(path).tensors
    for got, want in zip(_logits(path), _logits(folder)):
        assert rel_err(got, want) <= 1e-6


def test_mtp_layer(tmp_path):
    """A file with the multi-token-prediction layer (block_count counts it, its own weights under
    blk.3.nextn.*): loaded as mtp.0.* only for speculative_method 'mtp', whose drafts the model's
    greedy tokens keep (bigram_tensors)."""
    name = "ds_lora_yarn"
    t = bigram_tensors(name)
    folder = write_checkpoint(tmp_path / "hf", name, t, SAME[name])
    path = write_gguf(tmp_path / "mtp.gguf", name, "F32", SAME[name], tensor_map=t, nextn=1)
    plain = load_checkpoint(path)
    assert plain.config.num_layers == 3 and plain.config.num_nextn_predict_layers == 1
    assert not any(k.startswith(("mtp.", "blk.3.")) for k in plain.tensors)
    got, want = load_checkpoint(path, mtp=True), load_checkpoint(folder, mtp=True)
    assert sorted(got.tensors) == sorted(want.tensors)
    for k in want.tensors:
        np.testing.assert_array_equal(got.tensors[k].dequantize(), want.tensors[k].dequantize(), err_msg=k)
    e = Engine(path, device="cpu", progress=False, speculative_method="mtp", num_speculative_tokens=3,
               speculative_adaptive=False)   # every step drafts (adaptive drafting follows the step times)
    ids = e.generate(GREEDY_PROMPT, greedy(16))[0].outputs[0].token_ids
    plain_ids = Engine(folder, device="cpu", progress=False).generate(GREEDY_PROMPT, greedy(16))[0].outputs[0].token_ids
    assert ids == plain_ids
    s = e.stats()
    assert s["spec_num_draft_tokens"] >= 9 and s["spec_num_accepted_tokens"] >= 0.9 * s["spec_num_draft_tokens"]


def test_deepseek_v2_lite_file(tmp_path):
    """A DeepSeek-V2-Lite-style file (softmax expert scores, no exp_probs_b, one group): transformers'
    DeepseekV2ForCausalLM logits and greedy tokens for the checkpoint."""
    from .deepseek_v2_checkpoints import REFERENCE

    ref = np.load(REFERENCE)
    path = write_gguf(tmp_path / "v2.gguf", "ds2_lite", "F32", {"rope_interleave": True})
    c = load_checkpoint(path).config
    assert (c.architecture, c.moe.scoring_func, c.moe.topk_method) == ("deepseek_v2", "softmax", "greedy")
    model, ops = load_reference_model(path)
    for k, ids in enumerate(PROMPTS):
        want = ref[f"ds2_lite__logits{k}"]
        assert rel_err(full_logits(model, ops, ids)[-len(want):], want) <= 1e-5
    engine = Engine(path, device="cpu", progress=False)
    assert engine.generate(GREEDY_PROMPT, greedy(GREEDY_NEW))[0].outputs[0].token_ids == \
        ref["ds2_lite__greedy_ids"].tolist()


@pytest.mark.gpu
def test_cuda_logits_match_the_folder(pair):
    """On CUDA too the F32 file computes what the folder does (kv_b_proj joined back from attn_k_b /
    attn_v_b, the experts as views of the stacked blocks): to float32 rounding where the folder is
    float32 too; a bfloat16 folder takes bf16 activations on the GPU and the file fp16 ones, so
    there the two are held to the median bound of tests/cuda_rounding.py."""
    from pocketcupy.backend.ops_cuda import CudaOps

    from .cuda_rounding import MEDIAN_TOL, median_error, prompts_logits

    name, folder, gguf_path = pair
    ops = CudaOps()
    got, want = prompts_logits(gguf_path, ops), prompts_logits(folder, ops)
    if VARIANTS[name][1] == "F32":
        assert max(rel_err(a, b) for a, b in zip(got, want)) <= 1e-5
    else:
        assert median_error(np.concatenate(got), np.concatenate(want)) <= MEDIAN_TOL["BF16"]


@pytest.mark.parametrize("metadata, drop, match", [
    ({"deepseek2.expert_gating_func": 3}, (), r"deepseek2.expert_gating_func is 3: only softmax \(1, DeepSeek-V2's\) "
                                              r"and sigmoid \(2, DeepSeek-V3's\)"),
    ({"deepseek2.expert_gating_func": 1}, (), r"deepseek2.expert_group_count is 2: group-limited softmax routing"),
    ({"deepseek2.expert_gating_func": None}, (), r"deepseek2.expert_group_count is 2: group-limited softmax"),
    ({"deepseek2.attention.kv_lora_rank": None}, (), "lacks deepseek2.attention.kv_lora_rank"),
    ({"deepseek2.expert_count": None}, (), "lacks deepseek2.expert_count"),
    ({"deepseek2.attention.key_length_mla": 16}, (), "key_length_mla 16 must exceed the rope dimension 16"),
    ({"deepseek2.nextn_predict_layers": 3}, (), "nextn_predict_layers 3 leaves no decoder layers"),
    ({"deepseek2.leading_dense_block_count": "1"}, (), "leading_dense_block_count must be an integer >= 0, got '1'"),
    ({"deepseek2.expert_weights_norm": 1}, (), "expert_weights_norm must be true or false, got 1"),
    ({"deepseek2.expert_group_count": 3}, (), "n_group 3 must divide n_routed_experts 8"),
    ({"deepseek2.rope.scaling.type": "longrope"}, (), r"unsupported rope scaling type 'longrope' \(deepseek2"),
    ({"deepseek2.rope.scaling.original_context_length": None}, (), "lacks deepseek2.rope.scaling.original_context"),
    ({}, ("blk.1.attn_v_b.weight",), r"'blk.1.attn_v_b.weight' is missing \(attn_k_b and attn_v_b come in pairs"),
    ({}, ("blk.2.exp_probs_b.bias",), "'blk.2.exp_probs_b.bias' is missing"),
    ({"deepseek2.attention.value_length_mla": 8}, (), r"'blk.0.attn_v_b.weight' has shape \(4, 16, 32\), but the "
                                                     r"metadata needs \(4, 8, 32\)"),
    ({"deepseek2.expert_feed_forward_length": 16}, (), r"'blk.1.ffn_gate_shexp.weight' has shape \(32, 64\), "
                                                      r"but the config needs \(16, 64\)"),
])
def test_refused_variants_name_the_key_or_tensor(tmp_path, metadata, drop, match):
    path = write_gguf(tmp_path / "m.gguf", "ds_lora_yarn", metadata=metadata, drop=drop)
    with pytest.raises(ValueError, match=match) as e:
        load_checkpoint(path)
    assert path in str(e.value)
