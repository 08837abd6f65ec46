"""Speculative decoding keeps an error of one request's own to that request: a verification step
whose sampling raises because of one row (its allowed-token mask emptied) samples the rows apart,
that request fails with finish_reason "error", the others keep the tokens they draw alone; a
sequence whose sibling failed draws nothing more."""
import numpy as np
import pytest

from pocketcupy import Engine, SamplingParams

PROMPTS = {"greedy": "The capital of France is", "seeded": "My favourite animal is"}


class Oracle:
    """Drafts the next 3 tokens each request draws alone (none for the others): every step verifies."""

    def __init__(self, expected: dict):
        self.expected = expected

    def propose(self, reqs, ks):
        for r in reqs:
            out = self.expected.get(tuple(r.prompt_token_ids), [])
            n = r.num_output_tokens
            r.draft_token_ids = list(out[n:n + min(3, r.max_tokens - n - 1)])


@pytest.fixture(scope="module")
def engines(smollm2_gguf):
    plain = Engine(smollm2_gguf, device="cpu", progress=False, max_model_len=256)
    spec = Engine(smollm2_gguf, device="cpu", progress=False, max_model_len=256, speculative_method="ngram")
    return plain, spec


@pytest.mark.parametrize("sampled", [False, True], ids=["all-greedy", "seeded"])
def test_one_failing_row_in_a_verification_leaves_the_others(engines, sampled):
    plain, spec = engines
    params = {"greedy": SamplingParams(temperature=0, max_tokens=8),
              "seeded": SamplingParams(temperature=0.8, seed=7, max_tokens=8) if sampled else None,
              "bad": SamplingParams(temperature=0.8 if sampled else 0, max_tokens=50, ignore_eos=True)}
    alone = {rid: plain.generate(PROMPTS[rid], p)[0] for rid, p in params.items() if rid in PROMPTS and p}
    spec.proposer = Oracle({tuple(o.prompt_token_ids): o.outputs[0].token_ids for o in alone.values()})
    for rid, p in params.items():
        if p is not None:
            spec.add_request(rid, PROMPTS.get(rid, "Write a long story about a dragon."), p)
    spec.step()
    with spec._lock:
        spec._seqs["bad"].row.allowed_mask = np.zeros(spec.config.vocab_size, bool)
    before, finals = spec.stats()["spec_num_accepted_tokens"], {}
    while spec.has_unfinished_requests():
        finals.update((o.request_id, o) for o in spec.step() if o.finished)
    assert finals["bad"].outputs[0].finish_reason == "error"
    for rid, want in alone.items():
        assert finals[rid].outputs[0].token_ids == want.outputs[0].token_ids
    assert spec.stats()["spec_num_accepted_tokens"] > before and spec.scheduler.num_blocks_used == 0


def test_a_sibling_failing_in_a_verification_leaves_the_others(engines):
    """n = 2: the first sequence's own error (its detokenizer) fails the request, whose second
    sequence then draws no token in that verification (it used to, into a request the scheduler
    had dropped: a KeyError that ended every request)."""
    plain, spec = engines
    greedy = SamplingParams(temperature=0, max_tokens=8)
    alone = plain.generate(PROMPTS["greedy"], greedy)[0]
    spec.proposer = Oracle({tuple(alone.prompt_token_ids): alone.outputs[0].token_ids})
    spec.add_request("greedy", PROMPTS["greedy"], greedy)
    spec.add_request("pair", PROMPTS["seeded"], SamplingParams(n=2, temperature=0.8, seed=3, max_tokens=30))
    spec.step()
    with spec._lock:
        def push(token_id):
            raise RuntimeError(f"detokenizer failed at token {token_id}")
        spec._seqs["pair#0"].detok.push = push
    finals = {}
    while spec.has_unfinished_requests():
        finals.update((o.request_id, o) for o in spec.step() if o.finished)
    assert [o.finish_reason for o in finals["pair"].outputs] == ["error", "error"]
    assert finals["greedy"].outputs[0].token_ids == alone.outputs[0].token_ids
    assert spec.scheduler.num_blocks_used == 0
