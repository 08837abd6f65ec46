"""Speculative decoding with DeepSeek-V3's multi-token-prediction layer (speculative_method "mtp")
on the tiny random checkpoints of tests/deepseek_checkpoints.py: the MTP layer's draft logits
against a plain NumPy computation from the checkpoint's tensors (itself checked against
transformers' logits), every request's tokens equal to plain decoding's (greedy, seeded sampling,
batched with preemption and prefix caching), nearly every draft kept where the MTP layer guesses the
model's greedy tokens (bigram_tensors), at 2 tensor-parallel ranks, its K/V in the block size, the
refused cases, and on CUDA."""
import numpy as np
import pytest

from pocketcupy import Engine, EngineArgs, SamplingParams
from pocketcupy.loader import load_checkpoint
from pocketcupy.loader.safetensors_loader import config_from_hf
from pocketcupy.models.rope import attention_factor, inv_freq, yarn_mscale
from pocketcupy.quant.dequant import bf16_to_f32

from .deepseek_checkpoints import REFERENCE, VARIANTS, bigram_tensors, config, tensors, write_checkpoint
from .seeded_checkpoints import (BATCH, GREEDY_PROMPT, MAX_TOKENS, PROMPTS, TOKENIZER, batch_alone, batch_tiny,
                                 greedy, variant_fixture)
from .test_spec_decode import assert_same

MTP = dict(speculative_method="mtp", num_speculative_tokens=3)


def engine(folder, **kw):
    return Engine(folder, device="cpu", progress=False, **kw)


variant = variant_fixture(VARIANTS, write_checkpoint)     # (name, folder) of each variant


@pytest.fixture(scope="module", params=list(VARIANTS))
def bigram(request, tmp_path_factory):
    """(name, folder) of a checkpoint whose MTP layer drafts the model's greedy tokens."""
    name = request.param
    return name, write_checkpoint(tmp_path_factory.mktemp(name + "_bigram"), name, bigram_tensors(name))


# --- a plain NumPy DeepSeek-V3 and its MTP layer, from the checkpoint's tensors -----------------
class Reference:
    """transformers' DeepseekV3 written out over whole sequences (no cache), float32."""

    def __init__(self, name: str, tensor_map=None):
        self.cfg = config(name)
        self.w = {k: (bf16_to_f32(a) if dtype == "BF16" else a).astype(np.float32)
                  for k, (dtype, a) in (tensor_map or tensors(name)).items()}
        self.mc = config_from_hf(self.cfg)   # rotary frequencies and yarn factors (pocketcupy.models.rope)

    def rms(self, x, key):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.cfg["rms_norm_eps"]) * self.w[key]

    def lin(self, x, key):
        y = x @ self.w[key + ".weight"].T
        return y + self.w[key + ".bias"] if key + ".bias" in self.w else y

    def rope(self, x, pos):
        """x [T, heads, r]: transformers' rotate-half, after de-interleaving where rope_interleave."""
        if self.cfg["rope_interleave"]:
            x = np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)
        f = pos[:, None] * inv_freq(self.mc)[None]
        cos = np.cos(np.concatenate([f, f], -1))[:, None] * attention_factor(self.mc.rope_scaling)
        sin = np.sin(np.concatenate([f, f], -1))[:, None] * attention_factor(self.mc.rope_scaling)
        half = x.shape[-1] // 2
        return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin

    def attention(self, p, x, pos):
        c, T = self.cfg, len(x)
        nope, r, vd, heads = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["num_attention_heads"]
        a = p + "self_attn."
        if c["q_lora_rank"] is None:
            q = self.lin(x, a + "q_proj")
        else:
            q = self.lin(self.rms(self.lin(x, a + "q_a_proj"), a + "q_a_layernorm.weight"), a + "q_b_proj")
        q = q.reshape(T, heads, nope + r)
        kv = self.lin(x, a + "kv_a_proj_with_mqa")
        kvb = self.lin(self.rms(kv[:, :c["kv_lora_rank"]], a + "kv_a_layernorm.weight"), a + "kv_b_proj")
        kvb = kvb.reshape(T, heads, nope + vd)
        k_pe = np.broadcast_to(self.rope(kv[:, None, c["kv_lora_rank"]:], pos), (T, heads, r))
        qq = np.concatenate([q[..., :nope], self.rope(q[..., nope:], pos)], -1)
        kk = np.concatenate([kvb[..., :nope], k_pe], -1)
        s = self.mc.rope_scaling
        mscale = yarn_mscale(s.factor, s.mscale_all_dim) if s.kind == "yarn" and s.mscale_all_dim else 1.0
        scores = np.einsum("thd,shd->hts", qq, kk) * mscale ** 2 / np.sqrt(nope + r)
        scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out = np.einsum("hts,shd->thd", probs, kvb[..., nope:]).reshape(T, heads * vd)
        return self.lin(out, a + "o_proj")

    def mlp(self, p, x):
        g, u = self.lin(x, p + ".gate_proj"), self.lin(x, p + ".up_proj")
        return self.lin(g / (1 + np.exp(-g)) * u, p + ".down_proj")

    def moe(self, p, x):
        c = self.cfg
        scores = 1 / (1 + np.exp(-(x @ self.w[p + "mlp.gate.weight"].T)))
        choice = scores + self.w[p + "mlp.gate.e_score_correction_bias"]
        groups = choice.reshape(len(x), c["n_group"], -1)
        group_scores = np.sort(groups, -1)[..., -2:].sum(-1)
        best = np.argsort(-group_scores, -1, kind="stable")[:, :c["topk_group"]]
        keep = np.zeros_like(group_scores, bool)
        np.put_along_axis(keep, best, True, -1)
        choice = np.where(np.repeat(keep, groups.shape[-1], -1), choice, 0.0)
        top = np.argsort(-choice, -1, kind="stable")[:, :c["num_experts_per_tok"]]
        wts = np.take_along_axis(scores, top, -1)
        if c["norm_topk_prob"]:
            wts = wts / (wts.sum(-1, keepdims=True) + 1e-20)
        wts = wts * c["routed_scaling_factor"]
        out = self.mlp(p + "mlp.shared_experts", x)
        for t in range(len(x)):
            for e, wt in zip(top[t], wts[t]):
                out[t] += wt * self.mlp(f"{p}mlp.experts.{e}", x[t:t + 1])[0]
        return out

    def layer(self, i, x, pos):
        p = f"model.layers.{i}."
        x = x + self.attention(p, self.rms(x, p + "input_layernorm.weight"), pos)
        h = self.rms(x, p + "post_attention_layernorm.weight")
        return x + (self.mlp(p + "mlp", h) if i < self.cfg["first_k_dense_replace"] else self.moe(p, h))

    def hidden(self, ids):
        """The last layer's output before the final norm, at every position."""
        x, pos = self.w["model.embed_tokens.weight"][ids], np.arange(len(ids))
        for i in range(self.cfg["num_hidden_layers"]):
            x = self.layer(i, x, pos)
        return x

    def logits(self, ids):
        head = self.w["model.embed_tokens.weight" if self.cfg["tie_word_embeddings"] else "lm_head.weight"]
        return self.rms(self.hidden(ids), "model.norm.weight") @ head.T

    def mtp_logits(self, next_ids, hidden):
        """The MTP layer over a whole sequence: next_ids[p], the token after position p, and
        hidden[p] -> its logits at every position (vLLM's deepseek_mtp: [enorm(embedding);
        hnorm(hidden)], the embedding zeroed at position 0)."""
        i = self.cfg["num_hidden_layers"]
        p = f"model.layers.{i}."
        emb = self.w["model.embed_tokens.weight"][next_ids]
        emb[0] = 0
        x = self.lin(np.concatenate([self.rms(emb, p + "enorm.weight"), self.rms(hidden, p + "hnorm.weight")], -1),
                     p + "eh_proj")
        y = self.layer(i, x, np.arange(len(x)))
        return self.rms(y, p + "shared_head.norm.weight") @ self.w[p + "shared_head.head.weight"].T


def test_reference_matches_transformers(variant):
    """The plain NumPy model above gives transformers' logits (so its hidden states are the model's)."""
    name, _ = variant
    ref = np.load(REFERENCE)
    model = Reference(name)
    for k, ids in enumerate(PROMPTS[:2]):
        want = ref[f"{name}__logits{k}"]
        assert np.abs(model.logits(ids) - want).max() <= 1e-4 * np.abs(want).max()


@pytest.mark.parametrize("chunks", [{}, dict(max_num_batched_tokens=3, block_size=4)], ids=["one_prefill", "chunked"])
def test_draft_logits_match_the_formula(variant, chunks):
    """The proposer's logits for a prompt's first two drafts (k = 2: the MTP layer over the prompt,
    then its one-token step on the first draft, with its own output as the hidden state) against
    the reference MTP layer over the same positions; chunked: the prompt prefilled 3 tokens a step,
    the MTP layer following each chunk over the K/V of the earlier ones."""
    name, folder = variant
    e = engine(folder, speculative_method="mtp", num_speculative_tokens=2, speculative_adaptive=False, **chunks)
    got = []
    compute = e.proposer.drafter.model.compute_logits
    e.proposer.drafter.model.compute_logits = lambda y: got.append(np.array(compute(y))) or got[-1]
    first = e.generate(GREEDY_PROMPT, greedy(8))[0].outputs[0].token_ids[0]
    ref = Reference(name)
    ids = GREEDY_PROMPT + [first]
    h = ref.hidden(GREEDY_PROMPT)                       # the target's, positions 0..L-1
    want0 = ref.mtp_logits(ids[1:], h)[-1]             # at L - 1: the token at L, h at L - 1
    assert got[0].shape == (1, 320)
    np.testing.assert_allclose(got[0][0], want0, atol=2e-4 * np.abs(want0).max())
    draft = int(got[0][0].argmax())
    # the second: at L, the first draft and the MTP layer's own pre-norm output at L - 1; the
    # reference's layer 3 over L + 1 rows (causal: the first L unchanged), its last row
    p = f"model.layers.{ref.cfg['num_hidden_layers']}."
    emb = ref.w["model.embed_tokens.weight"][ids[1:] + [draft]]
    emb[0] = 0
    x = ref.lin(np.concatenate([ref.rms(emb[:-1], p + "enorm.weight"), ref.rms(h, p + "hnorm.weight")], -1),
                p + "eh_proj")
    y = ref.layer(ref.cfg["num_hidden_layers"], x, np.arange(len(x)))
    x1 = ref.lin(np.concatenate([ref.rms(emb[-1:], p + "enorm.weight"), ref.rms(y[-1:], p + "hnorm.weight")], -1),
                 p + "eh_proj")
    y1 = ref.layer(ref.cfg["num_hidden_layers"], np.concatenate([x, x1]), np.arange(len(x) + 1))[-1]
    want1 = ref.rms(y1, p + "shared_head.norm.weight") @ ref.w[p + "shared_head.head.weight"].T
    np.testing.assert_allclose(got[1][0], want1, atol=2e-4 * np.abs(want1).max())


def test_prefix_hit_reads_the_rows_its_first_request_wrote(variant):
    """A request that shares a finished one's 24-token prefix takes its blocks from the prefix cache
    with the MTP rows the first wrote (in its one step, which ended it), but for the last block,
    computed again: its last row saw the first request's next token (17), not this one's (200).
    Its first draft's logits are those of the reference over its whole prompt."""
    name, folder = variant
    e = engine(folder, speculative_method="mtp", num_speculative_tokens=2, block_size=4, speculative_adaptive=False)
    e.generate(BATCH[1], greedy(1))      # PREFIX + [17, 5, 9]
    got = []
    compute = e.proposer.drafter.model.compute_logits
    e.proposer.drafter.model.compute_logits = lambda y: got.append(np.array(compute(y))) or got[-1]
    out = e.generate(BATCH[3], greedy(3))[0]    # PREFIX + [200, 3]
    assert out.num_cached_tokens == 20
    ref = Reference(name)
    want = ref.mtp_logits(BATCH[3][1:] + out.outputs[0].token_ids[:1], ref.hidden(BATCH[3]))[-1]
    np.testing.assert_allclose(got[0][0], want, atol=2e-4 * np.abs(want).max())


@pytest.mark.parametrize("params", [
    [greedy(m) for m in MAX_TOKENS],
    [SamplingParams(temperature=0.8, top_p=0.9, seed=7 + i, max_tokens=m, ignore_eos=True, logprobs=2)
     for i, m in enumerate(MAX_TOKENS)],
], ids=["greedy", "seeded"])
def test_same_tokens_as_plain_decoding(variant, params):
    _, folder = variant
    plain, mtp = engine(folder), engine(folder, **MTP)
    assert_same(mtp.generate(BATCH, params), plain.generate(BATCH, params))
    s = mtp.stats()
    assert s["spec_num_draft_tokens"] > 0 and 0 <= s["spec_num_accepted_tokens"] <= s["spec_num_draft_tokens"]


def test_batched_with_preemption_and_prefix_cache(variant):
    _, folder = variant
    tiny, got = batch_tiny(folder, **MTP)
    assert got == batch_alone(folder)
    s = tiny.stats()
    assert s["num_preemptions"] > 0 and s["prefix_cache_hits"] > 0 and s["kv_blocks_used"] == 0
    assert s["spec_num_draft_tokens"] > 0


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=1),
    SamplingParams(temperature=0.7, seed=3, max_tokens=24, ignore_eos=True, n=2),
], ids=["greedy", "seeded"])
def test_mtp_that_guesses_the_greedy_tokens(bigram, params):
    """bigram_tensors: the MTP layer's logits are the model's at the next position, so greedy drafts
    are kept (all but where float noise breaks a tie), which only holds if the MTP layer reads the
    token after each position and chains its drafts; batched and with a small pool too."""
    _, folder = bigram
    plain = engine(folder)
    prompts = [GREEDY_PROMPT, BATCH[1], BATCH[4]]
    want = plain.generate(prompts, params)
    for small_pool in (False, True):
        kw = dict(num_kv_blocks=16, block_size=4, max_num_batched_tokens=40) if small_pool else {}
        # every step drafts: adaptive drafting's choices follow the measured step times (it drafted too
        # few here once, on a CPU shared with another test run)
        e = engine(folder, **kw, **MTP, speculative_adaptive=False)
        assert_same(e.generate(prompts, params), want)
        s = e.stats()
        drafted, kept = s["spec_num_draft_tokens"], s["spec_num_accepted_tokens"]
        assert drafted >= 20 and kept <= drafted and (s["num_preemptions"] > 0) == small_pool
        if params.temperature == 0:
            assert kept >= 0.9 * drafted


def test_quantized_kv_cache(variant):
    """kv_cache_dtype quantizes the MTP layer's latent rows as the target's."""
    _, folder = variant
    e = engine(folder, kv_cache_dtype="int8", **MTP)
    out = e.generate(BATCH, [greedy(m) for m in MAX_TOKENS])
    assert [len(o.outputs[0].token_ids) for o in out] == MAX_TOKENS
    pages = e.proposer.drafter.kv_cache
    assert type(pages[0]) is type(e.runner.kv_caches[0][0]) and e.stats()["spec_num_draft_tokens"] > 0


def test_mtp_kv_counted_in_the_block_size(variant):
    _, folder = variant
    mem = 1 << 20
    alone, mtp = engine(folder, kv_cache_memory=mem), engine(folder, kv_cache_memory=mem, **MTP)
    latent = 16 * 48 * 4    # a block of 16 tokens' latent rows (32 + 16), float32, K pages only
    assert alone._kv_block_bytes() == 3 * latent and mtp._kv_block_bytes() == 4 * latent
    assert mtp.scheduler.num_blocks_total == mem // (4 * latent) - 1
    pages = mtp.proposer.drafter.kv_cache
    assert pages[0].shape == mtp.runner.kv_caches[0][0].shape and pages[1] is None


def test_loaded_only_when_asked(tmp_path):
    folder = write_checkpoint(tmp_path, "ds_lora_yarn")
    assert not any(k.startswith(("blk.3.", "mtp.")) for k in load_checkpoint(folder).tensors)
    names = set(load_checkpoint(folder, mtp=True).tensors)
    assert {"mtp.0.eh_proj.weight", "mtp.0.enorm.weight", "mtp.0.shared_head_head.weight",
            "mtp.0.attn_kv_b.weight", "mtp.0.ffn_gate_exps.7.weight"} <= names
    assert not any(k.startswith("blk.3.") or "embed_tokens" in k for k in names)


def test_vllm_names(variant):
    _, folder = variant
    for args in (dict(speculative_method="deepseek_mtp"),
                 dict(speculative_config={"method": "deepseek_mtp", "num_speculative_tokens": 2}),
                 dict(speculative_config='{"method": "mtp", "num_speculative_tokens": 2}')):
        assert EngineArgs(**args).speculative_method == "mtp"
    e = engine(folder, speculative_config={"method": "deepseek_mtp", "num_speculative_tokens": 2})
    assert e.args.num_speculative_tokens == 2 and type(e.proposer).__name__ == "MTPProposer"


def test_refused_without_mtp_layers(tmp_path):
    with pytest.raises(ValueError, match="speculative_method: 'mtp' needs a model with multi-token-prediction "
                                         "layers .*architecture 'llama' has none"):
        engine(TOKENIZER, **MTP)
    no_mtp = {k: v for k, v in tensors("ds_plain").items() if not k.startswith("model.layers.3.")}
    folder = write_checkpoint(tmp_path / "none", "ds_plain", no_mtp, {"num_nextn_predict_layers": 0})
    with pytest.raises(ValueError, match="speculative_method: 'mtp' needs the checkpoint's multi-token-prediction "
                                         "layers, but its config.json has num_nextn_predict_layers 0"):
        engine(folder, **MTP)
    engine(folder)   # fine without MTP
    missing = write_checkpoint(tmp_path / "missing", "ds_plain", no_mtp)   # declared, not stored
    with pytest.raises(ValueError, match="speculative_method: 'mtp': weight 'mtp.0.enorm.weight' is missing"):
        engine(missing, **MTP)


def test_at_two_ranks_the_drafts_of_one_rank(bigram):
    """At tensor_parallel_size=2 every rank runs its part of the MTP layer (heads, experts' columns,
    vocab-parallel embedding and head) in step with rank 0: the greedy tokens of plain one-rank
    decoding, and the drafts and kept drafts of one-rank MTP, alone and for a batch (every step
    drafts: speculative_adaptive off)."""
    _, folder = bigram
    p = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    batch = [GREEDY_PROMPT, BATCH[1], BATCH[4]]
    plain = engine(folder)
    want = [[o.outputs[0].token_ids for o in plain.generate(prompts, p)] for prompts in ([GREEDY_PROMPT], batch)]
    counters = ("spec_num_drafts", "spec_num_draft_tokens", "spec_num_accepted_tokens")
    runs = []
    for tp in (1, 2):
        e = engine(folder, tensor_parallel_size=tp, speculative_adaptive=False, **MTP)
        try:
            for prompts, tokens in zip(([GREEDY_PROMPT], batch), want):
                assert [o.outputs[0].token_ids for o in e.generate(prompts, p)] == tokens
                runs.append({k: e.stats()[k] for k in counters})
        finally:
            e.close()
    assert runs[2:] == runs[:2]
    drafted, kept = runs[1]["spec_num_draft_tokens"], runs[1]["spec_num_accepted_tokens"]
    assert drafted >= 30 and kept >= 0.9 * drafted


@pytest.mark.gpu
def test_cuda_mtp_keeps_the_greedy_drafts(bigram):
    """On CUDA (eager steps: the decode graphs return no pre-norm hidden states for the MTP layer):
    the tokens of plain CUDA decoding, and nearly every draft kept."""
    _, folder = bigram
    p = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = [GREEDY_PROMPT, BATCH[1], BATCH[4]]
    kw = dict(device="cuda", progress=False, kv_cache_memory=1 << 24)
    want = [o.outputs[0].token_ids for o in Engine(folder, **kw).generate(prompts, p)]
    # every step drafts: this checks the drafts, not the policy (adaptive drafting drafted 6 tokens here on
    # an H100, the tiny model's eager MTP forwards weighing about as much as its steps)
    e = Engine(folder, **kw, **MTP, speculative_adaptive=False)
    assert e.runner.graphs is None
    assert [o.outputs[0].token_ids for o in e.generate(prompts, p)] == want
    s = e.stats()
    assert s["spec_num_draft_tokens"] >= 20 and s["spec_num_accepted_tokens"] >= 0.8 * s["spec_num_draft_tokens"]


def test_metrics_count_mtp_drafts(bigram):
    """/metrics reads the drafts' counters from Engine.stats(): MTP drafts are counted as any."""
    from types import SimpleNamespace

    from pocketcupy.server.metrics import _EngineCollector

    _, folder = bigram
    e = engine(folder, **MTP)
    e.generate(GREEDY_PROMPT, greedy(12))
    s = e.stats()
    got = {m.name: m.samples[0].value for m in _EngineCollector(SimpleNamespace(engine=e, ready=True)).collect()
           if m.name.startswith("pocketcupy_spec_decode")}
    assert got == {"pocketcupy_spec_decode_num_drafts": s["spec_num_drafts"],
                   "pocketcupy_spec_decode_num_draft_tokens": s["spec_num_draft_tokens"],
                   "pocketcupy_spec_decode_num_accepted_tokens": s["spec_num_accepted_tokens"]}
    assert 0 < s["spec_num_accepted_tokens"] <= s["spec_num_draft_tokens"]


def test_without_its_own_head_the_models(tmp_path):
    """A checkpoint without shared_head.head: the MTP layer's logits come from the model's lm_head."""
    t = bigram_tensors("ds_lora_yarn")
    del t["model.layers.3.shared_head.head.weight"]
    e = engine(write_checkpoint(tmp_path, "ds_lora_yarn", t), **MTP, speculative_adaptive=False)
    assert e.mtp_model.head is e.model.lm_head
    e.generate(GREEDY_PROMPT, greedy(16))
    s = e.stats()
    assert s["spec_num_draft_tokens"] >= 9 and s["spec_num_accepted_tokens"] == s["spec_num_draft_tokens"]


def test_async_scheduling_resolves_every_mtp_step(variant):
    """async_scheduling "on" with MTP drafts: the MTP layer catches up on each step's tokens when it
    proposes, so every step is resolved at once (none left in flight), and the tokens are plain decoding's."""
    from .test_async_scheduling import trace_steps

    _, folder = variant
    params = [SamplingParams(temperature=0.8, seed=7 + i, max_tokens=m, ignore_eos=True) if i % 2 else greedy(m)
              for i, m in enumerate(MAX_TOKENS)]
    e = engine(folder, async_scheduling="on", **MTP)
    got, trace = trace_steps(e, [(f"r{i}", p, sp) for i, (p, sp) in enumerate(zip(BATCH, params))])
    assert_same(got, engine(folder).generate(BATCH, params))
    assert "D" in trace and "f" not in trace, trace
