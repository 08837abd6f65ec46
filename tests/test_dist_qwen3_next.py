"""Qwen3-Next / Qwen3.5 at tensor_parallel_size 2 on the CPU: greedy tokens and logprobs equal one
rank's for the tiny safetensors checkpoints (in_proj_qkvz stored per key head; Qwen3.5's
projections apart), dense and MoE (each expert's and the shared expert's columns split), and GGUFs
(Qwen3.5's out_proj value heads tiled), each rank keeping the recurrent state of its own heads; a
batch with preemption and one with speculative decoding (the state rolled back on every rank) equal
each request alone; what cannot split is refused before any rank starts."""
import multiprocessing as mp

import pytest

from pocketcupy import Engine, SamplingParams

from .qwen3_next_checkpoints import tensors, write_checkpoint
from .qwen3_next_gguf import write_gguf
from .seeded_checkpoints import BATCH, GREEDY_PROMPT, PROMPTS, batch_alone, batch_tiny
from .test_dist_engine import max_logprob_gap
from .test_qwen3_next import OracleDrafts

PARAMS = SamplingParams(temperature=0, max_tokens=8, logprobs=3, prompt_logprobs=2, ignore_eos=True)


def dense_qwen3_next(folder) -> str:
    """q3n_dense_mlp with its one MoE layer (1) made dense: layer 2's MLP weights, every layer in
    mlp_only_layers (Qwen3-Next with in_proj_qkvz and in_proj_ba stored per key head)."""
    stored = tensors("q3n_dense_mlp")
    out = {k: v for k, v in stored.items() if not k.startswith("model.layers.1.mlp.")}
    out.update({k.replace(".layers.2.", ".layers.1."): v for k, v in stored.items() if ".layers.2.mlp." in k})
    return write_checkpoint(folder, "q3n_dense_mlp", out, {"mlp_only_layers": [0, 1, 2, 3]})


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    d = tmp_path_factory.mktemp("tp_q3n")
    return {"qwen3_next": dense_qwen3_next(d / "q3n"), "qwen3_5": write_checkpoint(d / "q35", "q35_dense"),
            "qwen35_gguf_f16": write_gguf(d / "q35.gguf", "q35_dense", "F16"),
            "qwen3_next_moe": write_checkpoint(d / "q3n_moe", "q3n_moe"),
            "qwen35_moe": write_checkpoint(d / "q35_moe", "q35_moe"),
            "qwen3_next_moe_gguf_f16": write_gguf(d / "q3n_moe.gguf", "q3n_moe", "F16")}


def engine(path, tp, **kw):
    return Engine(path, device="cpu", progress=False, tensor_parallel_size=tp, **kw)


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5", "qwen35_gguf_f16", "qwen3_next_moe", "qwen35_moe",
                                  "qwen3_next_moe_gguf_f16"])
def test_two_ranks_equal_one(checkpoints, name):
    """Three prompts batched (three state slots); rank 0's conv and recurrent states hold its half
    of the DeltaNet heads (1 key head, 2 value heads), its KV cache 1 of the 2 KV heads; in the MoE
    variants its 16 of each expert's 32 columns and 24 of the shared expert's 48, the router whole."""
    path, prompts = checkpoints[name], [GREEDY_PROMPT, PROMPTS[1], PROMPTS[2]]
    want = engine(path, 1).generate(prompts, PARAMS)
    eng = engine(path, 2, max_num_seqs=4)
    try:
        conv, state = eng.runner.states.layers[0]
        assert conv.shape == (4, 64, 3) and state.shape == (4, 2, 16, 16)
        assert eng.runner.kv_caches[0][0].shape[2] == 1
        if "moe" in name:
            moe = eng.runner.model.layers[0].mlp
            assert [w.shape for w in (moe.w_gate[7], moe.w_down[7], moe.shared.w_up, moe.shared.w_down)] == [
                (16, 64), (64, 16), (24, 64), (64, 24)]
            assert moe.router.shape == (8, 64) and moe.shared_gate.shape == (1, 64)
        got = eng.generate(prompts, PARAMS)
    finally:
        eng.close()
    for a, b in zip(want, got):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert max_logprob_gap(a, b) < 1e-4
    assert all(p.exitcode == 0 for p in eng.ranks.procs.values())


@pytest.mark.parametrize("spec", [{}, dict(speculative_method="ngram", num_speculative_tokens=3)],
                         ids=["plain", "speculative"])
def test_preempted_batch_equals_alone(checkpoints, spec):
    """BATCH in too few KV blocks (preemption, each preempted request's state recomputed from 0; the
    prefix cache asked for, and off for a recurrent state), and with drafts an oracle keeps whole or
    in part: every rank restores its heads' states and runs the kept tokens again."""
    path = checkpoints["qwen3_next"]
    alone = batch_alone(path)
    eng, got = batch_tiny(path, tensor_parallel_size=2, max_num_seqs=4, enable_prefix_caching=True,
                          prepare=OracleDrafts.install(alone) if spec else None, **spec)
    try:
        st = eng.stats()
    finally:
        eng.close()
    assert got == alone and len(got) == len(BATCH)
    assert st["num_preemptions"] > 0 and st["prefix_cache_hits"] == 0
    if spec:
        assert st["spec_num_drafts"] > 0 and st["spec_num_accepted_tokens"] < st["spec_num_draft_tokens"]


@pytest.mark.parametrize("make, tp, match", [
    # each expert's columns 0:16 and 16:32 on the two ranks: inside a Q8_0 block
    (lambda d: write_gguf(d / "moe.gguf", "q3n_moe", "Q8_0"), 2,
     r"tensor_parallel_size: blk\.0\.ffn_down_exps\.0\.weight \(Q8_0, 32-value blocks\) cannot be split at column 16"),
    (lambda d: write_checkpoint(d, "q35_dense"), 4,
     "tensor_parallel_size: 4 ranks cannot share the model's 2 linear-attention key heads"),
    # out_proj's columns in tiled head order: rank 1's value heads at columns 16:32 and 48:64, inside Q8_0 blocks
    (lambda d: write_gguf(d / "q8.gguf", "q35_dense", "Q8_0"), 2,
     r"tensor_parallel_size: blk\.0\.ssm_out\.weight \(Q8_0, 32-value blocks\) cannot be split at column 16"),
], ids=["q3n_moe_q8_0_gguf", "key_heads", "q35_q8_0_gguf"])
def test_refused_before_any_rank_starts(tmp_path, make, tp, match):
    path = make(tmp_path)
    before = set(mp.active_children())
    with pytest.raises(ValueError, match=match):
        engine(path, tp)
    assert set(mp.active_children()) == before
