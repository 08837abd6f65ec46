"""Qwen3-Next and Qwen3.5 (Gated DeltaNet + gated attention hybrids, MoE) on the NumPy backend: tiny random
checkpoints written here (tests/qwen3_next_checkpoints.py) against transformers' logits and greedy
tokens (scripts/make_qwen3_next_fixtures.py), the recurrent state slots under chunked prefill,
batching, preemption and speculative decoding (the state rolled back), and refused cases."""
import logging

import numpy as np
import pytest

from pocketcupy import Engine
from pocketcupy.backend.ops_ref import CHUNK, CHUNKED_FROM, NumpyOps
from pocketcupy.loader import load_checkpoint
from pocketcupy.sched.output import ScheduledRequest, SchedulerOutput
from pocketcupy.server.state import _kv_text

from .helpers import full_logits, load_reference_model, load_script, rel_err
from .qwen3_next_checkpoints import REFERENCE, VARIANTS, config, tensors, write_checkpoint
from .seeded_checkpoints import (BATCH, GREEDY_NEW, GREEDY_PROMPT, MAX_TOKENS, PROMPTS, batch_alone, batch_tiny, greedy,
                                 greedy_ids, logits_error, variant_fixture, write_folder)
from .seeded_checkpoints import TOKENIZER as TINY_LLAMA    # a Llama model (fixture) of the same vocabulary

REF = np.load(REFERENCE)
variant = variant_fixture(VARIANTS, write_checkpoint)     # (name, folder) of each variant


def test_logits_match_transformers(variant):
    name, folder = variant
    err = logits_error(folder, REF, name)
    # float32 rounding: up to 6e-6, but 2e-5 for q35_moe's 40-token prompt, where transformers' own
    # chunked prefill and its token-by-token recurrence differ by 1.6e-5 (ours: 8e-7)
    assert err <= 3e-5, f"{name}: relative error {err:.1e}"


def test_greedy_matches_transformers(variant, caplog):
    name, folder = variant
    with caplog.at_level(logging.INFO, logger="pocketcupy"):
        engine = Engine(folder, device="cpu", progress=False, max_num_seqs=4)
    assert f"prefix caching is off for architecture {engine.config.architecture!r}" in caplog.text
    # 2 DeltaNet layers x 4 slots x (128 x 3 conv + 4 x 16 x 16 recurrent) float32 values
    assert "recurrent state 4 slots (0 MiB)" in caplog.text and engine.runner.states.nbytes == 2 * 4 * 1408 * 4
    assert not engine.args.enable_prefix_caching
    assert len(engine.runner.kv_caches) == 2                # the full-attention layers only
    conv, state = engine.runner.states.layers[0]
    assert conv.shape == (4, 128, 3) and state.shape == (4, 4, 16, 16)
    out = engine.generate(GREEDY_PROMPT, greedy(GREEDY_NEW))[0]
    assert out.outputs[0].token_ids == REF[f"{name}__greedy_ids"].tolist()


def test_chunked_delta_rule_matches_token_by_token():
    """A batch of sequences of 1 to 200 tokens, some a whole number of chunks, from nonzero states
    (the longer ones in the chunked form) against each token alone (the decode recurrence): outputs
    and states equal to float32 rounding. Value heads decaying from slowly to fast; q and k are
    L2-normalised by the op, as the model has them."""
    ops, rng = NumpyOps(), np.random.default_rng(0)
    lens = [1, CHUNKED_FROM - 1, CHUNKED_FROM, CHUNK, 130, 2 * CHUNK, 200]
    hk, hv, dk, dv = 2, 4, 16, 24
    n, query_start = sum(lens), np.cumsum([0, *lens])
    q, k = rng.standard_normal((2, n, hk, dk), dtype=np.float32)
    v = rng.standard_normal((n, hv, dv), dtype=np.float32)
    b, a = rng.standard_normal((2, n, hv), dtype=np.float32)
    a_log = np.log(np.array([0.005, 0.05, 0.5, 4], np.float32))
    dt_bias = 1 + 0.1 * rng.standard_normal(hv, dtype=np.float32)
    initial = rng.standard_normal((len(lens) + 1, hv, dk, dv), dtype=np.float32)
    slots = np.arange(len(lens))[::-1] + 1                    # row 0 unused
    states = initial.copy()
    out = ops.gated_delta_rule(q, k, v, b, a, a_log, dt_bias, states, slots, query_start)
    want, want_states = np.empty_like(out), initial.copy()
    for i, slot in enumerate(slots):
        for t in range(query_start[i], query_start[i + 1]):
            want[t:t + 1] = ops.gated_delta_rule(q[t:t + 1], k[t:t + 1], v[t:t + 1], b[t:t + 1], a[t:t + 1], a_log,
                                                 dt_bias, want_states, np.array([slot]), np.array([0, 1]))
    for i, slot in enumerate(slots):
        rows = slice(query_start[i], query_start[i + 1])
        assert rel_err(out[rows], want[rows]) < 1e-5, lens[i]
        assert rel_err(states[slot], want_states[slot]) < 1e-5, lens[i]
    assert np.array_equal(states[0], initial[0])


def test_multimodal_folder_reads_its_text_model(tmp_path):
    """Qwen3.5 as released (Qwen3_5ForConditionalGeneration): the text model's config in text_config,
    its weights under model.language_model. beside the vision tower's and MTP's (not read), lm_head
    tied by the top level's tie_word_embeddings alone. (transformers, checked once: the text
    logits of such a folder equal the text-only model's, to the bit.)"""
    text = {k: v for k, v in config("q35_dense").items() if k != "architectures"}
    cfg = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "tie_word_embeddings": True,
           "text_config": {**text, "tie_word_embeddings": False}, "vision_config": {"depth": 1, "hidden_size": 32}}
    stored = {k.replace("model.", "model.language_model.", 1): v for k, v in tensors("q35_dense").items()}
    stored.update({"model.visual.merger.linear_fc1.weight": ("F32", np.ones((4, 4), np.float32)),
                   "mtp.fc.weight": ("F32", np.ones((4, 4), np.float32))})
    folder = write_folder(tmp_path / "vl", cfg, stored)
    model, ops = load_reference_model(folder)
    text_model, text_ops = load_reference_model(write_checkpoint(tmp_path / "text", "q35_dense"))
    assert np.array_equal(full_logits(model, ops, PROMPTS[1]), full_logits(text_model, text_ops, PROMPTS[1]))
    assert greedy_ids(folder) == REF["q35_dense__greedy_ids"].tolist()


def test_kv_pool_counts_attention_layers_only_beside_the_state_slots(variant):
    """kv_cache_memory holds the state slots and the KV blocks: the pool has the slots' bytes / a
    block's bytes (here 11) fewer blocks than the same memory alone would give."""
    _, folder = variant
    memory = 1 << 20
    engine = Engine(folder, device="cpu", progress=False, kv_cache_memory=memory, block_size=16, max_num_seqs=8)
    # 2 attention layers x 16 tokens x 2 KV heads x (K + V) 16 float32 values
    block = engine._kv_block_bytes()
    assert block == 2 * 16 * 2 * 2 * 16 * 4
    slots = engine.runner.states
    assert slots.nbytes == sum(a.nbytes for arrays in slots.layers for a in arrays) == 2 * 8 * 1408 * 4 == 11 * block
    assert engine.scheduler.num_blocks_total + 1 == memory // block - slots.nbytes // block    # + the null block
    assert engine.stats()["recurrent_state_bytes"] == slots.nbytes
    assert _kv_text(engine) == "116 blocks x 16 tokens = 1 MiB + recurrent state slots 0 MiB"


def test_state_slots_beyond_kv_cache_memory_refused(tmp_path):
    folder = write_checkpoint(tmp_path, "q3n_moe")
    with pytest.raises(ValueError, match=r"kv_cache_memory: 90000 bytes cannot hold the recurrent state slots of "
                                         r"max_num_seqs=8 sequences \(90112 bytes, 11264 a sequence\); raise "
                                         r"kv_cache_memory or lower max_num_seqs"):
        Engine(folder, device="cpu", progress=False, kv_cache_memory=90000, max_num_seqs=8)
    # 16 blocks of 8192 bytes beside the slots: one 256-token sequence needs 17
    with pytest.raises(ValueError, match=r"kv_cache_memory: 16 KV blocks beside the recurrent state slots of "
                                         r"max_num_seqs=8 sequences cannot hold one max_model_len=256 sequence "
                                         r"\(17 blocks\); raise kv_cache_memory or lower max_model_len or "
                                         r"max_num_seqs"):
        Engine(folder, device="cpu", progress=False, kv_cache_memory=90112 + 16 * 8192, max_num_seqs=8, block_size=16)


def test_chunked_prefill_carries_the_state(variant):
    """A prompt prefilled 3 tokens a step: each chunk starts from the state the one before left."""
    name, folder = variant
    assert greedy_ids(folder, max_num_batched_tokens=3, block_size=4) == REF[f"{name}__greedy_ids"].tolist()


@pytest.mark.parametrize("async_scheduling", ["off", "on"])
def test_concurrent_requests_with_preemption_match_alone(variant, async_scheduling):
    """With async scheduling, a request that stopped computes one step in vain: its state is
    dropped with its slot."""
    _, folder = variant
    alone = batch_alone(folder)
    tiny, got = batch_tiny(folder, max_num_seqs=4, enable_prefix_caching=True, async_scheduling=async_scheduling)
    assert got == alone
    st = tiny.stats()
    assert st["num_preemptions"] > 0 and st["prefix_cache_hits"] == 0
    slots = tiny.runner.states
    assert slots.num_used > 0      # the last requests' slots: freed with the next step's output
    tiny.step()
    assert slots.num_used == 0 and sorted(slots.free) == list(range(4))
    # n > 1: each sample prefills its own state
    two = tiny.generate(BATCH[1], greedy(MAX_TOKENS[1], n=2))[0]
    assert [o.token_ids for o in two.outputs] == [alone[1]] * 2


def test_abort_frees_the_slot(variant):
    _, folder = variant
    engine = Engine(folder, device="cpu", progress=False, max_num_seqs=2)
    engine.add_request("a", GREEDY_PROMPT, greedy(8))
    engine.add_request("b", PROMPTS[1], greedy(8))
    engine.step()
    assert engine.runner.states.num_used == 2
    engine.abort_request("a")
    while engine.has_unfinished_requests():
        engine.step()
    engine.step()
    assert engine.runner.states.num_used == 0


def test_state_slot_refuses_a_sequence_not_started_at_zero(variant):
    _, folder = variant
    engine = Engine(folder, device="cpu", progress=False)
    item = ScheduledRequest("x", [5, 6], 8, [1], sample=True, prompt_logits=False)
    with pytest.raises(RuntimeError, match="x: a recurrent state must be computed from position 0, not 8"):
        engine.runner.states.prepare(SchedulerOutput([item]))


def test_config_and_names(tmp_path):
    ck = load_checkpoint(write_checkpoint(tmp_path, "q3n_dense_mlp"))
    c = ck.config
    assert c.architecture == "qwen3_next" and c.rope_dim == 8 and c.rope_theta == 1000.0 and c.num_kv_layers == 2
    assert c.gdn.layer_types == ("linear_attention", "full_attention", "full_attention", "linear_attention")
    assert [c.moe.is_sparse(i) for i in range(4)] == [False, True, False, False]
    assert {"blk.0.ssm_in_qkvz.weight", "blk.0.ssm.A_log", "blk.0.ssm.dt_bias", "blk.3.ssm_conv1d.weight",
            "blk.1.ffn_gate_inp_shexp.weight", "blk.1.ffn_up_shexp.weight", "blk.1.ffn_down_exps.7.weight",
            "blk.2.attn_q_norm.weight", "blk.2.attn_output.bias"} <= set(ck.tensors)
    c = load_checkpoint(write_checkpoint(tmp_path / "moe", "q3n_moe")).config
    assert c.rope_dim == 4 and c.gdn.layer_types[1::2] == ("full_attention",) * 2
    ck = load_checkpoint(write_checkpoint(tmp_path / "q35", "q35_dense"))
    assert ck.config.architecture == "qwen3_5" and ck.config.moe is None and ck.config.rope_dim == 8
    assert {"blk.0.ssm_in_qkv.weight", "blk.0.ssm_in_z.weight", "blk.0.ssm_in_b.weight", "blk.0.ssm_in_a.weight",
            "blk.3.ffn_down.weight"} <= set(ck.tensors)
    c = load_checkpoint(write_checkpoint(tmp_path / "q35_moe", "q35_moe")).config
    assert c.architecture == "qwen3_5_moe" and c.intermediate_size == 32       # none given: the experts'
    assert c.moe.norm_topk_prob and all(c.moe.is_sparse(i) for i in range(4))


class OracleDrafts:
    """Drafts the tokens each request is known to draw (expected: prompt -> output), the second one
    made wrong every other step: steps keep all their drafts, or one and reject the rest."""

    def __init__(self, expected: dict, vocab: int):
        self.expected, self.vocab, self.calls = expected, vocab, 0

    @staticmethod
    def install(alone: list[list[int]]):
        """batch_tiny's prepare: the engine's proposer made an oracle of BATCH's tokens alone."""
        def prepare(engine):
            engine.proposer = OracleDrafts({tuple(p): out for p, out in zip(BATCH, alone)}, engine.config.vocab_size)
        return prepare

    def propose(self, reqs, ks):
        for r in reqs:
            self.calls += 1
            n = len(r.output_token_ids)
            drafts = list(self.expected[tuple(r.prompt_token_ids)][n:n + 3])
            if self.calls % 2 and len(drafts) > 1:
                drafts[1] = (drafts[1] + 1) % self.vocab
            r.draft_token_ids = drafts


@pytest.mark.parametrize("method", ["oracle", "draft_model"])
def test_speculative_decoding_rolls_the_state_back(variant, method):
    """Drafts verified in one forward: a request whose drafts were not all kept gets its recurrent
    state back as saved before the step and its kept tokens run again (ModelRunner.roll_back), so
    every request draws the tokens it draws without drafts, batched with preemption. The oracle's
    drafts are kept whole or in part; tiny_llama's, drafting for a model it knows nothing of, are
    mostly rejected."""
    _, folder = variant
    alone = batch_alone(folder)
    spec = (dict(speculative_method="ngram", num_speculative_tokens=3) if method == "oracle" else
            dict(speculative_method="draft_model", speculative_model=TINY_LLAMA, num_speculative_tokens=2))
    engine, got = batch_tiny(folder, max_num_seqs=4, prepare=OracleDrafts.install(alone) if method == "oracle" else None,
                             **spec)
    assert got == alone
    st = engine.stats()
    assert st["num_preemptions"] > 0 and st["spec_num_accepted_tokens"] < st["spec_num_draft_tokens"]
    if method == "oracle":
        assert st["spec_num_accepted_tokens"] > st["spec_num_drafts"]      # some steps kept several


def test_mtp_refused(tmp_path):
    with pytest.raises(ValueError, match="speculative_method: 'mtp' needs a model with multi-token-prediction layers "
                                         r"\(DeepSeek-V3's num_nextn_predict_layers\); architecture 'qwen3_next' has none"):
        Engine(write_checkpoint(tmp_path, "q3n_moe"), device="cpu", progress=False, speculative_method="mtp")


def test_as_draft_model_refused(tmp_path):
    with pytest.raises(ValueError, match="speculative_model: architecture 'qwen3_next' cannot draft"):
        Engine(TINY_LLAMA, device="cpu", progress=False, speculative_method="draft_model",
               speculative_model=write_checkpoint(tmp_path, "q3n_moe"))


@pytest.mark.parametrize("changes, match", [
    (dict(linear_num_key_heads=3), "linear_num_value_heads 4 is not a multiple of linear_num_key_heads 3"),
    (dict(linear_key_head_dim="16"), "linear_key_head_dim must be a positive integer, got '16'"),
    (dict(linear_conv_kernel_dim=0), "linear_conv_kernel_dim must be a positive integer, got 0"),
    (dict(layer_types=["linear_attention"] * 3 + ["sliding"]), "layer_types must be a list of 'linear_attention'"),
    (dict(layer_types=["linear_attention"] * 4), "layer_types has no 'full_attention' layer"),
    (dict(layer_types=["full_attention"] * 3), "layer_types has 3 entries for 4 layers"),
    (dict(full_attention_interval=0), "full_attention_interval must be a positive integer, got 0"),
    (dict(partial_rotary_factor=0), r"partial_rotary_factor must be a number in \(0, 1\], got 0"),
    (dict(partial_rotary_factor=0.1), "rope dimension 1 must be even"),
    (dict(num_experts_per_tok=9), "num_experts_per_tok 9 exceeds num_experts 8"),
    (dict(decoder_sparse_step=0), "decoder_sparse_step must be a positive integer, got 0"),
    (dict(mlp_only_layers=[-1]), "mlp_only_layers must be a list of layer indices"),
    (dict(norm_topk_prob="yes"), "norm_topk_prob must be true or false"),
    (dict(shared_expert_intermediate_size=None), "shared_expert_intermediate_size must be a positive integer"),
    (dict(linear_value_head_dim=8), r"'blk.0.ssm_in_qkvz.weight' has shape \(192, 64\), but the config needs \(128"),
    (dict(rope_scaling={"type": "yarn", "factor": 4}), "unsupported rope_scaling type 'yarn'"),
])
def test_bad_config_fields(tmp_path, changes, match):
    folder = write_checkpoint(tmp_path, "q3n_moe", config_changes=changes)
    with pytest.raises(ValueError, match=match) as e:
        load_reference_model(folder)
    assert folder in str(e.value)


@pytest.mark.parametrize("changes, match", [
    (dict(attention_bias=True), "'blk.1.attn_q.bias'"),                   # no biases stored
    (dict(full_attention_interval=4), "'blk.1.ssm_in_qkvz.weight'"),     # layer 1 is full attention
])
def test_missing_weight_named(tmp_path, changes, match):
    folder = write_checkpoint(tmp_path, "q3n_moe", config_changes=changes)
    with pytest.raises(ValueError, match=match + " is missing from the checkpoint"):
        load_reference_model(folder)


def test_split_projection_missing_named(tmp_path):
    stored = {k: v for k, v in tensors("q35_dense").items() if k != "model.layers.2.linear_attn.in_proj_z.weight"}
    with pytest.raises(ValueError, match="'blk.2.ssm_in_z.weight' is missing from the checkpoint"):
        load_reference_model(write_checkpoint(tmp_path, "q35_dense", stored))


def test_synthetic_benchmark_checkpoint_loads_and_generates(tmp_path):
    """scripts/make_synthetic_qwen35.py (the CUDA benchmark's Qwen3.5-dense shape), made small: it
    loads as qwen3_5 with head dim 256 and a quarter rotary, and generates."""
    script = load_script("make_synthetic_qwen35")
    folder = script.main(["--out", str(tmp_path), "--layers", "4", "--hidden", "256", "--intermediate", "512",
                          "--vocab", "1000"])
    engine = Engine(folder, device="cpu", progress=False, max_num_seqs=2)
    c = engine.config
    assert (c.architecture, c.head_dim, c.gdn.layer_types.count("full_attention")) == ("qwen3_5", 256, 1)
    assert len(engine.generate([5, 6, 7], greedy(4))[0].outputs[0].token_ids) == 4
    with pytest.raises(SystemExit):
        script.main(["--out", str(tmp_path / "x"), "--layers", "6"])


@pytest.mark.parametrize("part, changes, match", [
    ("gdn", dict(linear_key_head_dim=12), r"linear_key_head_dim 12 has no CUDA kernel \(they take 4, 8, 16, 32, 64, 128, 256\)"),
    ("gdn", dict(linear_conv_kernel_dim=9), r"linear_conv_kernel_dim 9 has no CUDA kernel \(they take 1 to 8\)"),
    (None, dict(head_dim=24), r"head_dim 24 has no CUDA kernel \(they take 16, 32, 64, 128, 256\)"),
    ("moe", dict(num_experts=64, num_experts_per_tok=33), r"num_experts_per_tok 33 has no CUDA kernel \(they take 1 to 32\)"),
])
def test_sizes_without_cuda_kernels_refused(tmp_path, part, changes, match):
    """CudaOps.check_config (engine build, after the model): the fields the kernels cannot take."""
    import dataclasses

    from pocketcupy.backend.ops_cuda import CudaOps

    c = load_checkpoint(write_checkpoint(tmp_path, "q3n_moe")).config
    c = (dataclasses.replace(c, **changes) if part is None
         else dataclasses.replace(c, **{part: dataclasses.replace(getattr(c, part), **changes)}))
    with pytest.raises(ValueError, match=match + "; device='cpu' runs it"):
        object.__new__(CudaOps).check_config(c)
    NumpyOps().check_config(c)
