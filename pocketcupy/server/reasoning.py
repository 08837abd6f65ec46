"""Reasoning out of generated text, incrementally (vLLM's reasoning parsers, `--reasoning-parser`).

  qwen3        <think>reasoning</think>content: the block is reasoning only when the output opens
               with <think> (after optional whitespace); otherwise everything is content.
  deepseek_r1  the prompt already opened the block: the output starts inside the reasoning (a leading
               <think> is dropped if the model writes one anyway) and everything up to </think> is
               reasoning; without </think> the whole output is reasoning.

The prompt decides first where it already did: a prompt that ends with <think> (Qwen3-Thinking's and
DeepSeek-R1-0528's templates open the block) starts the output inside the reasoning, one that ends with
</think> (thinking switched off: Qwen3's enable_thinking false, DeepSeek-V3.1's default) outside it, so
deepseek_r1 does not take the whole answer for reasoning, and qwen3 splits a block it did not open.

A structured-output constraint starts after the reasoning when the reply starts inside it
(after_reasoning): the reasoning is free, the content has the structure.

Newlines right after </think> are dropped, as vLLM does. A block the output never closes (cut by
max_tokens) stays reasoning, so a stream and the whole text agree. Tags split across deltas never
leak: a possible tag prefix is held back until the next delta decides it.

A parser turns text deltas into events ("reasoning", text) and ("content", text); the content goes
through `then` (a tools.py parser) when one is given, and its events come out instead.
"""
from __future__ import annotations

from dataclasses import replace

from ..thinking_budget import CLOSE, OPEN, starts_inside
from .tools import cut_at_tag

PARSERS = ("qwen3", "deepseek_r1")


def after_reasoning(params, tokenizer, name: str | None, prompt: str):
    """SamplingParams whose structured-output constraint starts after the reasoning, as vLLM's does
    under a reasoning parser: when the reply starts inside the reasoning, the constraint applies from
    the token after the end marker's (the reasoning itself is free); otherwise from the first token. A
    constraint with its own trigger (strict tool calls') keeps it."""
    so = params.structured_outputs
    if so is None or so.start_after or name is None or not starts_inside(name, prompt):
        return params
    end = tokenizer.encode(CLOSE, add_special_tokens=False)
    return replace(params, structured_outputs=replace(so, start_after=end))


class ReasoningParser:
    def __init__(self, name: str, then=None, prompt: str = ""):
        if name not in PARSERS:
            raise ValueError(f"unknown reasoning parser {name!r}; one of {', '.join(PARSERS)}")
        self.inside_by_default = starts_inside(name, prompt)
        self.then = then
        self.buf = ""
        self.mode = "start"    # start | reasoning | after (dropping newlines) | content

    @property
    def done(self) -> bool:
        """The content's parser wants no more (a call made under parallel_tool_calls false)."""
        return bool(getattr(self.then, "done", False))

    def _reasoning(self, text: str, events: list) -> None:
        if text:
            events.append(("reasoning", text))

    def _content(self, text: str, events: list) -> None:
        if self.then is not None:
            events += self.then.feed(text)
        elif text:
            events.append(("content", text))

    def feed(self, delta: str) -> list:
        events: list = []
        self.buf += delta
        if self.mode == "start":
            s = self.buf.lstrip()
            if OPEN.startswith(s):
                return events  # whitespace, or might still become <think>
            if s.startswith(OPEN):
                self.buf, self.mode = s[len(OPEN):], "reasoning"
            else:
                self.mode = "reasoning" if self.inside_by_default else "content"
        if self.mode == "reasoning":
            before, self.buf, found = cut_at_tag(self.buf, CLOSE)
            self._reasoning(before, events)
            if not found:
                return events
            self.mode = "after"
        if self.mode == "after":
            self.buf = self.buf.lstrip("\r\n")
            if not self.buf:
                return events
            self.mode = "content"
        buf, self.buf = self.buf, ""
        self._content(buf, events)
        return events

    def finish(self) -> list:
        events: list = []
        buf, self.buf = self.buf, ""
        if self.mode == "reasoning" or (self.mode == "start" and self.inside_by_default):
            self._reasoning(buf, events)
        elif self.mode != "after":
            self._content(buf, events)
        if self.then is not None:
            events += self.then.finish()
        return events


def message_texts(reasoning: str, content: str) -> tuple[str | None, str | None]:
    """A choice's (reasoning_content, content) out of the joined texts."""
    if not reasoning:
        return None, content
    return reasoning, content or None
