"""The reasoning parsers (qwen3, deepseek_r1) without a model: whole texts, every split of a text into
two deltas (tags cut at every position) and one character at a time, and tool calls after the
reasoning."""
import pytest

from pocketcupy.server.reasoning import PARSERS, ReasoningParser, message_texts
from pocketcupy.server.tools import ToolParser

CASES = [
    # (parser, text, (reasoning_content, content))
    ("qwen3", "<think>step one</think>\n\nThe answer.", ("step one", "The answer.")),
    ("qwen3", "  \n<think>a</think>b", ("a", "b")),
    ("qwen3", "<think>no end in sight", ("no end in sight", None)),
    ("qwen3", "plain reply", (None, "plain reply")),
    ("qwen3", "plain <think>x</think> later", (None, "plain <think>x</think> later")),
    ("qwen3", "<thin", (None, "<thin")),
    ("qwen3", "  ", (None, "  ")),
    ("qwen3", "", (None, "")),
    ("qwen3", "<think>x</think>\n", ("x", None)),
    ("qwen3", "<think>a < b </thin </think> c </think>", ("a < b </thin ", " c </think>")),  # only newlines are dropped
    ("qwen3", "<think>x</think>\r\n\nrest", ("x", "rest")),
    ("deepseek_r1", "thinking</think>\nanswer", ("thinking", "answer")),
    ("deepseek_r1", "<think>thinking</think>answer", ("thinking", "answer")),
    ("deepseek_r1", "all reasoning, no end", ("all reasoning, no end", None)),
    ("deepseek_r1", "<thi", ("<thi", None)),
    ("deepseek_r1", "</think>only content", (None, "only content")),
    ("deepseek_r1", "", (None, "")),
]


def streamed(parser, pieces):
    events = []
    for p in pieces:
        events += parser.feed(p)
    events += parser.finish()
    assert all(e[1] for e in events), events  # no empty deltas
    joined = {k: "".join(e[1] for e in events if e[0] == k) for k in ("reasoning", "content")}
    return message_texts(joined["reasoning"], joined["content"])


@pytest.mark.parametrize("name,text,expected", CASES)
def test_whole_and_every_split(name, text, expected):
    assert streamed(ReasoningParser(name), [text]) == expected
    for k in range(len(text) + 1):
        assert streamed(ReasoningParser(name), [text[:k], text[k:]]) == expected, k
    assert streamed(ReasoningParser(name), list(text)) == expected


PROMPTED = [
    # (parser, the prompt's end, text, (reasoning_content, content))
    ("deepseek_r1", "<｜Assistant｜></think>", "The answer.", (None, "The answer.")),  # thinking off
    ("qwen3", "assistant\n<think>\n\n</think>\n\n", "The answer.", (None, "The answer.")),
    ("deepseek_r1", "<｜Assistant｜></think>", "<think>x</think>y", ("x", "y")),
    ("qwen3", "<|im_start|>assistant\n<think>\n", "step</think>\n\nThe answer.", ("step", "The answer.")),
    ("qwen3", "<|im_start|>assistant\n<think>\n", "cut by max_tokens", ("cut by max_tokens", None)),
    ("deepseek_r1", "<｜Assistant｜><think>\n", "<think>a</think>b", ("a", "b")),
    ("qwen3", "<think>x</think> earlier turn<|im_start|>assistant\n", "plain", (None, "plain")),
    ("deepseek_r1", "<think>x</think> earlier turn<｜Assistant｜>", "still</think>c", ("still", "c")),
]


@pytest.mark.parametrize("name,prompt,text,expected", PROMPTED)
def test_the_prompt_opened_or_closed_the_block(name, prompt, text, expected):
    """A prompt ending with <think> starts the output inside the reasoning, one ending with </think>
    (thinking switched off) outside it: deepseek_r1 took the whole answer for reasoning, and qwen3
    left a block the prompt opened, </think> and all, in the content."""
    for pieces in ([text], list(text)):
        assert streamed(ReasoningParser(name, prompt=prompt), pieces) == expected


def test_tags_never_leak_into_a_delta():
    text = "<think>abc</think>\ndef"
    for name in PARSERS:
        p = ReasoningParser(name)
        for ch in text:
            for kind, t in p.feed(ch):
                assert "<" not in t and ">" not in t, (name, kind, t)


def test_reasoning_is_sent_before_the_block_closes():
    p = ReasoningParser("qwen3")
    assert p.feed("<think>first ") == [("reasoning", "first ")]
    assert p.feed("second</th") == [("reasoning", "second")]  # '</th' held back
    assert p.feed("ink>\n") == []
    assert p.feed("done") == [("content", "done")]
    assert p.finish() == []


def test_tool_calls_come_from_the_content_only():
    text = '<think>I will call <tool_call>{"name": "get_time", "arguments": {}}</tool_call></think>\n' \
           '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    for step in (1, 3, len(text)):
        p = ReasoningParser("qwen3", ToolParser(["get_weather", "get_time"]))
        events = []
        for k in range(0, len(text), step):
            events += p.feed(text[k:k + step])
        events += p.finish()
        assert "".join(e[1] for e in events if e[0] == "reasoning") == \
            'I will call <tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
        assert [e for e in events if e[0] == "call"] == [("call", 0, "get_weather")]
        assert "".join(e[2] for e in events if e[0] == "args") == '{"city": "Oslo"}'
        assert not "".join(e[1] for e in events if e[0] == "content").strip()


def test_unknown_name():
    with pytest.raises(ValueError, match="qwen3"):
        ReasoningParser("granite")
