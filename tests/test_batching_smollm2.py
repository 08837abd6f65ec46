"""Continuous batching end to end on the CPU with the real SmolLM2-135M-Instruct: preemption,
priorities, prefix caching and n > 1 sharing all give the tokens a request gets alone."""
import pytest

from pocketcupy import Engine, SamplingParams

PROMPTS = [  # mixed lengths
    "The history of Rome",
    "Photosynthesis is the process by which green plants and some other organisms use sunlight to",
    "A haiku about snow:",
    "Dear diary,",
    "The three laws of motion formulated by Isaac Newton describe",
    "Water boils at",
    "In computer science, a linked list is a linear collection of data elements whose order is",
    "My favourite food is",
]
MAX_TOKENS = [5, 3, 6, 4, 2, 5, 3, 4]
LONG_PREFIX = ("You are a helpful assistant. Answer briefly and precisely. The following is a short text "
               "about the solar system. The Sun is the star at the centre of the solar system. Eight "
               "planets orbit it: Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus and Neptune. ")


def greedy(n):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(smollm2_gguf):
    """One request at a time, no prefix cache: the tokens each request gives alone."""
    return Engine(smollm2_gguf, device="cpu", progress=False, num_kv_blocks=64, enable_prefix_caching=False)


@pytest.fixture(scope="module")
def alone(reference):
    return [reference.generate(p, greedy(m))[0].outputs[0].token_ids for p, m in zip(PROMPTS, MAX_TOKENS)]


@pytest.fixture(scope="module")
def prio(smollm2_gguf):
    return Engine(smollm2_gguf, device="cpu", progress=False, num_kv_blocks=64, block_size=8,
                  scheduling_policy="priority")


def run(engine, requests):
    """Adds (request_id, prompt, params, priority) tuples; steps to the end. Returns the final
    outputs and the request ids in the order they finished."""
    for rid, prompt, params, priority in requests:
        engine.add_request(rid, prompt, params, priority=priority)
    final, order = {}, []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
                order.append(out.request_id)
    return final, order


def test_eight_concurrent_with_preemption_match_alone(smollm2_gguf, alone):
    # 11 usable blocks of 4 tokens: any one request fits, all eight at once do not
    tiny = Engine(smollm2_gguf, device="cpu", progress=False, num_kv_blocks=12, block_size=4,
                  max_num_batched_tokens=48)
    final, _ = run(tiny, [(f"r{i}", p, greedy(m), 0) for i, (p, m) in enumerate(zip(PROMPTS, MAX_TOKENS))])
    assert [final[f"r{i}"].outputs[0].token_ids for i in range(len(PROMPTS))] == alone
    st = tiny.stats()
    assert st["num_preemptions"] > 0
    assert st["kv_blocks_used"] == 0 and st["kv_blocks_total"] == 11
    assert st["num_running"] == 0 and st["num_waiting"] == 0


def test_priority_policy_serves_lower_values_first(prio, alone):
    sch = prio.scheduler
    saved, sch.max_num_seqs = sch.max_num_seqs, 2   # two requests at a time
    try:
        before = prio.stats()["num_preemptions"]
        for rid, i in (("low-a", 0), ("low-b", 3)):
            prio.add_request(rid, PROMPTS[i], greedy(MAX_TOKENS[i]), priority=5)
        prio.step()
        assert [r.request_id for r in sch.running] == ["low-a", "low-b"]
        prio.add_request("urgent", PROMPTS[2], greedy(MAX_TOKENS[2]), priority=-1)
        prio.add_request("mid", PROMPTS[5], greedy(MAX_TOKENS[5]), priority=1)
        assert [r.request_id for r in sch.waiting] == ["urgent", "mid"]
        prio.step()   # urgent takes the place of the newest low-priority request
        assert [r.request_id for r in sch.running] == ["low-a", "urgent"]
        prio.step()   # and mid the place of the other one
        assert [r.request_id for r in sch.running] == ["urgent", "mid"]
        assert [r.request_id for r in sch.waiting] == ["low-a", "low-b"]
        final, order = run(prio, [])
    finally:
        sch.max_num_seqs = saved
    assert prio.stats()["num_preemptions"] == before + 2
    assert set(order[:2]) == {"urgent", "mid"}
    assert final["urgent"].outputs[0].token_ids == alone[2]
    assert final["mid"].outputs[0].token_ids == alone[5]
    assert final["low-b"].outputs[0].token_ids == alone[3]
    assert final["low-a"].outputs[0].token_ids == alone[0]


def test_shared_prefix_is_served_from_cache(prio, reference):
    first = LONG_PREFIX + "Which planet is the largest?"
    second = LONG_PREFIX + "Which planet is closest to the Sun?"
    p = greedy(3)
    ref_before = reference.stats()["num_computed_tokens_total"]
    want = reference.generate(second, p)[0].outputs[0].token_ids
    ref_cost = reference.stats()["num_computed_tokens_total"] - ref_before   # prompt + 2 decode tokens

    assert prio.scheduler.kv_cache_manager.reset_prefix_cache()
    a = prio.generate(first, p)[0]
    s0 = prio.stats()
    b = prio.generate(second, p)[0]
    s1 = prio.stats()
    n_prompt = len(b.prompt_token_ids)
    common = next(i for i, (x, y) in enumerate(zip(a.prompt_token_ids, b.prompt_token_ids)) if x != y)
    assert a.num_cached_tokens == 0
    assert b.outputs[0].token_ids == want
    assert b.num_cached_tokens == common // 8 * 8 >= 48
    cost = s1["num_computed_tokens_total"] - s0["num_computed_tokens_total"]
    assert cost == ref_cost - b.num_cached_tokens
    assert s1["prefix_cache_hits"] - s0["prefix_cache_hits"] == b.num_cached_tokens
    assert s1["prefix_cache_queries"] - s0["prefix_cache_queries"] == n_prompt


def test_n_samples_share_prompt_blocks(prio):
    prompt = LONG_PREFIX + "Name a planet:"
    n_prompt = len(prio.tokenizer.encode(prompt))

    def peak_blocks(params):
        prio.add_request(f"n{params.n}", prompt, params)
        peak = 0
        while prio.has_unfinished_requests():
            prio.step()
            peak = max(peak, prio.stats()["kv_blocks_used"])
        return peak

    prio.scheduler.kv_cache_manager.reset_prefix_cache()
    one = peak_blocks(SamplingParams(n=1, temperature=0.8, seed=3, max_tokens=2, ignore_eos=True))
    prio.scheduler.kv_cache_manager.reset_prefix_cache()
    four = peak_blocks(SamplingParams(n=4, temperature=0.8, seed=3, max_tokens=2, ignore_eos=True))
    assert one == -(-n_prompt // 8)         # the peak is after the prompt step (step 2 finishes)
    shared = (n_prompt - 1) // 8            # full prompt blocks the three later samples share
    assert four == 4 * one - 3 * shared < 2 * one


def test_time_in_queue(smollm2_gguf):
    """RequestOutput.time_in_queue: arrival to first scheduling (vLLM's RequestMetrics.time_in_queue);
    with one sequence at a time the second request waits out the first."""
    import time

    one = Engine(smollm2_gguf, device="cpu", progress=False, num_kv_blocks=32, max_num_seqs=1)
    one.add_request("a", "The capital of France is", greedy(8))
    one.add_request("b", "One, two, three,", greedy(2))
    added, a_done, final = time.monotonic(), None, {}
    while one.has_unfinished_requests():
        for out in one.step():
            if out.request_id == "b" and not out.finished:
                assert a_done is not None   # (b runs only once a is done)
            if out.finished:
                final[out.request_id] = out
                if out.request_id == "a":
                    a_done = time.monotonic()
    assert 0 <= final["a"].time_in_queue < final["b"].time_in_queue
    assert final["b"].time_in_queue >= a_done - added
