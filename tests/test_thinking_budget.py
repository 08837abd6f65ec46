"""thinking_token_budget (vLLM's) on the real SmolLM2: it does not think by itself, so the prompt opens the
<think> block (as Qwen3-Thinking's template does) or a grammar makes it write one; once the budget's tokens
are spent, the end marker's tokens are forced and the content follows."""
import pytest

from pocketcupy import SamplingParams
from pocketcupy.thinking_budget import CLOSE

Q = [{"role": "user", "content": "Why is the sky blue?"}]


@pytest.fixture(scope="module")
def opened(smollm2_engine):
    """A prompt that ends inside the reasoning block."""
    return smollm2_engine.render_chat(Q) + "<think>\n"


def end_ids(engine) -> list[int]:
    return engine.tokenizer.encode(CLOSE, add_special_tokens=False)


def assert_cut(engine, out, budget: int) -> None:
    """The output's first `budget` tokens are the reasoning, then the end marker, then content."""
    end = end_ids(engine)
    ids = out.token_ids
    assert ids[budget:budget + len(end)] == end and len(ids) > budget + len(end)
    assert CLOSE not in engine.tokenizer.decode(ids[:budget])
    thought, content = out.text.split(CLOSE, 1)
    assert thought == engine.tokenizer.decode(ids[:budget]) and content


@pytest.mark.parametrize("budget, n", [(0, 1), (5, 2)])
def test_reasoning_is_cut_at_the_budget(smollm2_engine, opened, budget, n):
    params = SamplingParams(max_tokens=budget + 5, temperature=0.8, seed=3, n=n, thinking_token_budget=budget)
    (out,) = smollm2_engine.generate(opened, params)
    for o in out.outputs:   # (each sequence its own budget)
        assert_cut(smollm2_engine, o, budget)


def test_without_a_budget_nothing_is_forced(smollm2_engine, opened):
    (out,) = smollm2_engine.generate(opened, SamplingParams(max_tokens=6, temperature=0))
    assert CLOSE not in out.outputs[0].text


def test_counting_starts_at_the_start_marker_in_the_output(smollm2_engine):
    """A reply that opens the block itself (here a grammar makes it: the forced tokens must be ones the
    grammar allows, and these are) is cut `budget` tokens after its <think>."""
    so = {"regex": "<think>[a-z ]{1,40}</think>[A-Za-z ]{1,20}"}
    start = smollm2_engine.tokenizer.encode("<think>", add_special_tokens=False)
    params = SamplingParams(max_tokens=16, temperature=0, thinking_token_budget=3, structured_outputs=so)
    o = smollm2_engine.generate(smollm2_engine.render_chat(Q), params)[0].outputs[0]
    assert o.token_ids[:len(start)] == start
    assert o.token_ids[len(start) + 3:len(start) + 3 + len(end_ids(smollm2_engine))] == end_ids(smollm2_engine)
    assert o.finish_reason == "stop" and o.text.split(CLOSE)[1]


def test_structured_output_starts_after_the_forced_end(smollm2_engine, opened):
    """A constraint that starts after the end marker (the server's after_reasoning) starts after the forced one."""
    so = {"regex": "[0-9]{3}", "start_after": end_ids(smollm2_engine)}
    params = SamplingParams(max_tokens=20, temperature=0, thinking_token_budget=4, structured_outputs=so)
    (out,) = smollm2_engine.generate(opened, params)
    o = out.outputs[0]
    assert o.token_ids[4:7] == end_ids(smollm2_engine) and o.finish_reason == "stop"
    assert o.text.split(CLOSE)[1].isdigit() and len(o.text.split(CLOSE)[1]) == 3


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_bad_budget_names_the_field(bad):
    with pytest.raises(ValueError, match="thinking_token_budget"):
        SamplingParams(thinking_token_budget=bad)
