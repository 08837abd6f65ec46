"""Speculative decoding with a draft model on the CPU: SmolLM2 drafting for itself (nearly every
draft kept) and a random-weight model with SmolLM2's vocabulary (nearly none kept) both leave every
request with exactly the tokens it gets without drafts, alone, batched with preemption, over a
shared prefix and over two tensor-parallel ranks (drafting at every step); the draft's K/V shares
the target's blocks and is counted in their size; adaptive drafting stops drafts that cannot pay."""
import pytest

from pocketcupy import Engine, EngineArgs, SamplingParams
from pocketcupy.spec.adaptive import AdaptiveDrafting

from .conftest import FIXTURES
from .test_spec_decode import CHATS, CODE, assert_same
from .test_synthetic_model import _script

LEN = 1024   # two models' K/V in the CPU's default 512 MiB pool


def engine(path, **kw):
    return Engine(path, device="cpu", progress=False, max_model_len=LEN, **kw)


def drafting(path, draft, **kw):
    """(Drafting at every step: on the CPU a draft model as large as the target never pays, and the
    adaptive policy would stop drafting; here the drafts' verification is what is tested.)"""
    return engine(path, speculative_method="draft_model", speculative_model=draft, speculative_adaptive=False, **kw)


@pytest.fixture(scope="module")
def random_draft(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("draft"))
    _script().main(["--out", out, "--vocab", "49152", "--hidden", "64", "--layers", "2", "--heads", "2",
                    "--kv-heads", "1", "--intermediate", "128", "--formats", "q8_0", "--threads", "1"])
    return f"{out}/model-Q8_0.gguf"


@pytest.fixture(scope="module")
def plain(smollm2_gguf):
    return engine(smollm2_gguf)


@pytest.fixture(scope="module")
def self_draft(smollm2_gguf):
    return drafting(smollm2_gguf, smollm2_gguf)


def kept(e) -> tuple[int, int]:
    s = e.stats()
    return s["spec_num_accepted_tokens"], s["spec_num_draft_tokens"]


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=32, logprobs=1, min_tokens=16),
    SamplingParams(temperature=0.9, seed=4, repetition_penalty=1.2, max_tokens=40),
], ids=["greedy", "seeded"])
def test_self_draft_keeps_nearly_every_draft(plain, self_draft, params):
    k0, d0 = kept(self_draft)
    assert_same(self_draft.chat(CHATS, params), plain.chat(CHATS, params))
    k1, d1 = kept(self_draft)
    assert d1 - d0 > 20
    # greedy drafts of the same model: only float noise can reject one, and the EOS the draft model
    # proposes where the second chat's reply ends (13 tokens), before min_tokens lets it end
    if params.temperature == 0:
        assert k1 - k0 >= 0.9 * (d1 - d0)


def test_random_draft_rejected_yet_same_tokens(smollm2_gguf, random_draft, plain):
    e = drafting(smollm2_gguf, random_draft, num_speculative_tokens=3)
    p = SamplingParams(temperature=0, max_tokens=32, logprobs=2)
    assert_same(e.chat(CHATS, p), plain.chat(CHATS, p))
    s = e.stats()
    assert s["spec_num_draft_tokens"] >= 12 and s["spec_num_accepted_tokens"] < s["spec_num_draft_tokens"] / 2


def test_adaptive_drafting_stops_a_draft_model_that_cannot_pay(self_draft, plain):
    """SmolLM2 drafting for itself on the CPU: a draft token costs a whole step, so once a proposal
    was timed no draft can pay, and at most the first proposal's come (DraftBackoff verified 4 drafts
    after each pause: 16 draft tokens in 16 tokens), the tokens unchanged. (The module's engine with a
    new adaptive policy for the test: the costs its batches measured would weigh drafts differently.)"""
    p = SamplingParams(temperature=1.0, seed=2, max_tokens=8, ignore_eos=True)
    _, d0 = kept(self_draft)
    fixed, self_draft.drafting = self_draft.drafting, AdaptiveDrafting(self_draft.drafting.max_drafts)
    try:
        assert_same(self_draft.chat(CHATS[1:], p), plain.chat(CHATS[1:], p))
    finally:
        self_draft.drafting = fixed
    _, d1 = kept(self_draft)
    assert 0 < d1 - d0 <= 4


def test_batched_with_preemption_and_shared_prefix(smollm2_gguf, plain):
    p = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prefix = "Here is a function.\n" + CODE
    prompts = [prefix + "Explain it.", prefix + "Rewrite it iteratively.", "one two three one two three",
               CODE, "The cat sat on the mat. The cat sat on the", prefix + "Name it differently."]
    alone = [plain.generate(x, p)[0].outputs[0].token_ids for x in prompts]
    tiny = drafting(smollm2_gguf, smollm2_gguf, num_kv_blocks=30, block_size=4, max_num_batched_tokens=96)
    outs = tiny.generate(prompts, p)
    assert [o.outputs[0].token_ids for o in outs] == alone
    s = tiny.stats()
    assert s["num_preemptions"] > 0 and s["prefix_cache_hits"] > 0 and s["kv_blocks_used"] == 0
    assert s["spec_num_accepted_tokens"] > 0


def test_prompt_longer_than_the_token_budget(smollm2_gguf, plain):
    """The draft model catches up on a prompt longer than max_num_batched_tokens over several steps
    (a forward in which no request reaches its last token samples nothing): no draft until then,
    the same tokens, and drafts kept once caught up."""
    p = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompt = "Copy this code exactly:\n" + CODE + CODE
    want = plain.generate(prompt, p)[0].outputs[0].token_ids
    e = drafting(smollm2_gguf, smollm2_gguf, max_num_batched_tokens=32)
    out = e.generate(prompt, p)[0]
    assert len(out.prompt_token_ids) > 2 * 32 and out.outputs[0].finish_reason == "length"
    assert out.outputs[0].token_ids == want and e.stats()["spec_num_accepted_tokens"] > 0


def test_draft_kv_counted_in_the_block_size(smollm2_gguf, random_draft):
    mem = 64 << 20
    alone = engine(smollm2_gguf, kv_cache_memory=mem)
    both = drafting(smollm2_gguf, random_draft, kv_cache_memory=mem)
    # SmolLM2: 30 layers x 3 KV heads x 64; the draft: 2 layers x 1 KV head x 32; K and V in float32
    block = 16 * 2 * 4
    assert alone._kv_block_bytes() == 30 * 3 * 64 * block and both._kv_block_bytes() == (30 * 3 * 64 + 2 * 32) * block
    assert both.scheduler.num_blocks_total == mem // both._kv_block_bytes() - 1


def test_tensor_parallel_draft_on_rank_zero(smollm2_gguf, random_draft, plain):
    p = SamplingParams(temperature=0, max_tokens=24, logprobs=1)
    e = drafting(smollm2_gguf, smollm2_gguf, tensor_parallel_size=2)
    try:
        assert_same(e.chat(CHATS, p), plain.chat(CHATS, p), logprob_tol=1e-3)
        assert e.stats()["spec_num_accepted_tokens"] > 10
    finally:
        e.close()


def test_bad_draft_settings(smollm2_gguf):
    with pytest.raises(ValueError, match="speculative_model: speculative_method 'draft_model' needs the draft"):
        EngineArgs(speculative_method="draft_model")
    with pytest.raises(ValueError, match="speculative_model: is read only with speculative_method 'draft_model'"):
        EngineArgs(speculative_model="x.gguf")
    with pytest.raises(ValueError, match="speculative_model: its vocabulary of .* tokens differs from the model's 49152"):
        drafting(smollm2_gguf, f"{FIXTURES}/tiny_llama")
    with pytest.raises(ValueError, match="^speculative_model: /nonexistent.gguf does not exist$"):  # was "model: "
        drafting(smollm2_gguf, "/nonexistent.gguf")


def test_async_scheduling_while_drafts_stop(smollm2_gguf, random_draft, plain):
    """async_scheduling "on" with a draft model whose drafts fail: once adaptive drafting stops them,
    steps stay in flight (none drafts at the next), and the tokens, greedy and seeded, are unchanged."""
    from .test_async_scheduling import COUNT, assert_switched, trace_steps

    e = engine(smollm2_gguf, speculative_method="draft_model", speculative_model=random_draft,
               num_speculative_tokens=3, async_scheduling="on")
    for params in (SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                   SamplingParams(temperature=0.8, seed=3, max_tokens=10, ignore_eos=True)):
        got, trace = trace_steps(e, [("count", COUNT, params)])
        assert_same(got, plain.generate(COUNT, params))
        assert_switched(trace)
    assert e.stats()["kv_blocks_used"] == 0
