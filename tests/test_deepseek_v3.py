"""DeepSeek-V3 (MLA attention + MoE) on the NumPy backend: tiny random checkpoints written here
(tests/deepseek_checkpoints.py) against transformers' logits and greedy tokens
(scripts/make_deepseek_fixtures.py), batching over the latent KV cache, FP8 and refused cases."""
import numpy as np
import pytest

from pocketcupy import Engine
from pocketcupy.loader import load_checkpoint

from .deepseek_checkpoints import REFERENCE, VARIANTS, tensors, write_checkpoint
from .fp8_checkpoints import e4m3_decode, quantize_fp8, reference_dequant
from .helpers import full_logits, load_reference_model
from .seeded_checkpoints import (BATCH, GREEDY_NEW, GREEDY_PROMPT, MAX_TOKENS, PREFIX, PROMPTS, batch_alone, batch_tiny,
                                 greedy, greedy_ids, logits_error, variant_fixture)

REF = np.load(REFERENCE)


variant = variant_fixture(VARIANTS, write_checkpoint)     # (name, folder) of each variant


def test_logits_match_transformers(variant):
    name, folder = variant
    err = logits_error(folder, REF, name)
    assert err <= 1e-5, f"{name}: relative error {err:.1e}"   # float32 rounding: ~1e-6


def test_greedy_matches_transformers(variant):
    name, folder = variant
    engine = Engine(folder, device="cpu", progress=False)
    assert engine.config.num_kv_heads == 1 and engine.config.head_dim == 48      # the latent: 32 + 16
    assert engine.runner.kv_caches[0][0].shape[1:] == (16, 1, 48)
    assert engine.runner.kv_caches[0][1] is None                                  # no V pages: the latents serve
    assert engine._kv_block_bytes() == engine.config.num_layers * 16 * 48 * 4     # K pages only, float32
    out = engine.generate(GREEDY_PROMPT, greedy(GREEDY_NEW))[0]
    assert out.outputs[0].token_ids == REF[f"{name}__greedy_ids"].tolist()


def test_chunked_prefill_over_the_cached_latents(variant):
    """A prompt prefilled 3 tokens a step: each chunk attends to the latents the earlier ones cached."""
    name, folder = variant
    assert greedy_ids(folder, max_num_batched_tokens=3, block_size=4) == REF[f"{name}__greedy_ids"].tolist()


def test_concurrent_requests_with_preemption_and_prefix_cache_match_alone(variant):
    _, folder = variant
    alone = batch_alone(folder)
    tiny, got = batch_tiny(folder)
    assert got == alone
    st = tiny.stats()
    assert st["num_preemptions"] > 0 and st["prefix_cache_hits"] > 0
    tiny.generate(BATCH[1], greedy(1))
    again = tiny.generate(BATCH[3], greedy(MAX_TOKENS[3]))[0]    # on the latents BATCH[1] left cached
    assert again.num_cached_tokens == len(PREFIX) and again.outputs[0].token_ids == alone[3]


@pytest.mark.parametrize("dtype, bound", [("int8", 0.03), ("fp8", 0.1)])
def test_quantized_latent_cache(variant, dtype, bound):
    """kv_cache_dtype quantizes each token's latent row (one scale a row) as it would a K row. The
    logits stay near the float32 cache's, but for the few rows where the error turns a token to
    other experts: the median row is compared."""
    _, folder = variant
    model, ops = load_reference_model(folder)
    exact = full_logits(model, ops, PROMPTS[2])
    got = full_logits(model, ops, PROMPTS[2], kv_cache_dtype=dtype)
    assert np.median(np.abs(got - exact).max(axis=1)) / np.abs(exact).max() < bound
    engine = Engine(folder, device="cpu", progress=False, kv_cache_dtype=dtype)
    assert len(engine.generate(GREEDY_PROMPT, greedy(4))[0].outputs[0].token_ids) == 4


def test_config_and_names(tmp_path):
    ck = load_checkpoint(write_checkpoint(tmp_path, "ds_lora_yarn"))
    c = ck.config
    assert c.architecture == "deepseek_v3" and c.rope_interleaved and c.rope_dim == 16
    assert c.rope_scaling.kind == "yarn" and c.rope_scaling.mscale_all_dim == 0.8
    assert c.mla.q_lora_rank == 32 and c.moe.first_k_dense_replace == 1 and c.moe.routed_scaling_factor == 2.5
    assert {"blk.1.ffn_gate_exps.7.weight", "blk.2.ffn_gate_inp.e_score_correction_bias", "blk.0.ffn_gate.weight",
            "blk.2.attn_kv_b.weight", "blk.2.attn_q_a.bias", "blk.1.ffn_down_shexp.weight"} <= set(ck.tensors)
    assert not any(k.startswith("blk.3.") for k in ck.tensors)   # the MTP layer is not loaded
    assert ck.tensors["blk.1.ffn_gate_inp.e_score_correction_bias"].qtype == "F32"


def test_fp8_block_checkpoint(tmp_path):
    """DeepSeek-V3's FP8 layout (F8_E4M3 weights, X.weight_scale_inv per block): its tensor names
    pass through the dequantizing loader; the MTP layer's weights are not dequantized at all."""
    block = (16, 16)
    src = tensors("ds_plain")
    fp8, bf16 = dict(src), dict(src)
    quantized = [k for k, (_, a) in src.items() if a.ndim == 2 and "proj" in k]
    for k in quantized:
        codes, scales = quantize_fp8(src[k][1], block)
        fp8[k] = ("F8_E4M3", codes)
        fp8[k.removesuffix("weight") + "weight_scale_inv"] = ("F32", scales)
        bf16[k] = ("BF16", reference_dequant(e4m3_decode(codes), scales, block))
    qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(block)}
    fp8_dir = write_checkpoint(tmp_path / "fp8", "ds_plain", fp8, {"quantization_config": qc})
    ck = load_checkpoint(fp8_dir)
    assert ck.tensors["blk.1.ffn_up_exps.3.weight"].qtype == "BF16"
    assert not any(k.startswith("blk.3.") for k in ck.tensors)
    model, ops = load_reference_model(fp8_dir)
    want_model, want_ops = load_reference_model(write_checkpoint(tmp_path / "bf16", "ds_plain", bf16))
    assert np.array_equal(full_logits(model, ops, PROMPTS[1]), full_logits(want_model, want_ops, PROMPTS[1]))


@pytest.mark.parametrize("changes, match", [
    (dict(n_group=3), "n_group 3 must divide n_routed_experts 8"),
    (dict(n_group=8), "into groups of at least 2 experts"),
    (dict(topk_group=3), "topk_group 3 exceeds n_group 2"),
    (dict(num_experts_per_tok=5), "num_experts_per_tok 5 exceeds the 4 experts"),
    (dict(kv_lora_rank="32"), "kv_lora_rank must be a positive integer, got '32'"),
    (dict(q_lora_rank=0), "q_lora_rank must be a positive integer or null, got 0"),
    (dict(v_head_dim=None), "v_head_dim must be a positive integer, got None"),
    (dict(first_k_dense_replace=-1), "first_k_dense_replace must be an integer >= 0"),
    (dict(routed_scaling_factor=0), "routed_scaling_factor must be a positive number"),
    (dict(norm_topk_prob="yes"), "norm_topk_prob must be true or false"),
    (dict(attention_bias=1), "attention_bias must be true or false"),
    (dict(qk_rope_head_dim=15), "rope dimension 15 must be even"),
    (dict(num_nextn_predict_layers=-1), "num_nextn_predict_layers must be an integer >= 0"),
    (dict(num_nextn_predict_layers=0), "weight 'blk.3.* belongs to layer 3, but the config has 3 layers"),
    (dict(kv_lora_rank=16), r"'blk.0.attn_kv_a_mqa.weight' has shape \(48, 64\), but the config needs \(32, 64\)"),
    (dict(n_routed_experts=16, n_group=4), r"'blk.1.ffn_gate_inp.weight' has shape \(8, 64\)"),
    (dict(q_lora_rank=16), r"'blk.0.attn_q_a.weight' has shape \(32, 64\)"),
    (dict(rope_scaling={"type": "yarn", "beta_fast": 32}), "rope_scaling 'yarn' needs a positive factor"),
    (dict(rope_scaling={"type": "yarn", "factor": 4, "mscale": -1}), "needs a positive mscale"),
    (dict(rope_scaling={"type": "dynamic", "factor": 4}), "unsupported rope_scaling type 'dynamic'"),
])
def test_bad_config_fields(tmp_path, changes, match):
    folder = write_checkpoint(tmp_path, "ds_lora_yarn", config_changes=changes)
    with pytest.raises(ValueError, match=match) as e:
        load_checkpoint(folder)
    assert folder in str(e.value)


def test_missing_weight_named(tmp_path):
    folder = write_checkpoint(tmp_path, "ds_plain", config_changes=dict(attention_bias=True))   # no biases stored
    with pytest.raises(ValueError, match="'blk.0.attn_kv_a_mqa.bias' is missing from the checkpoint"):
        load_reference_model(folder)


def test_synthetic_benchmark_checkpoint_loads_and_generates(tmp_path):
    """scripts/make_synthetic_deepseek.py (the CUDA benchmark's DeepSeek-V2-Lite widths), made small:
    it loads as deepseek_v3 with a 576-value latent row and 6 of the experts a token, and generates."""
    from .helpers import load_script

    script = load_script("make_synthetic_deepseek")
    folder = script.main(["--out", str(tmp_path), "--layers", "2", "--experts", "8", "--hidden", "256",
                          "--vocab", "1000"])
    engine = Engine(folder, device="cpu", progress=False, max_num_seqs=2)
    c = engine.config
    assert (c.architecture, c.head_dim, c.moe.num_experts_per_tok, c.num_nextn_predict_layers) == \
        ("deepseek_v3", 576, 6, 0)
    assert len(engine.generate([5, 6, 7], greedy(4))[0].outputs[0].token_ids) == 4
    with pytest.raises(SystemExit):
        script.main(["--out", str(tmp_path / "x"), "--experts", "4"])
