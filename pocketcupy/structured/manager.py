"""The engine's structured-output side: compiled grammars (cached by grammar text), one matcher per
sampled sequence, and the batched mask fill that runs on the CPU while the device runs a forward."""
from __future__ import annotations

import time
from collections import OrderedDict

import llguidance

from .ll_tokenizer import build_ll_tokenizer
from .masks import allow_only, fill_bitmasks
from .matcher import SequenceMatcher
from .params import StructuredOutputsParams
from .stats import StructuredStats

CACHE_SIZE = 256  # compiled grammars kept (least recently used dropped)


class StructuredOutputManager:
    def __init__(self, tokenizer, logits_width: int):
        self.tokenizer, self.logits_width = tokenizer, int(logits_width)
        self.stats = StructuredStats()
        self._ll_tokenizer = None
        self._executor = None
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        if self._ll_tokenizer is None:  # built on the first constrained request
            self._ll_tokenizer = build_ll_tokenizer(self.tokenizer)
            self._executor = llguidance.LLExecutor()
        return self._ll_tokenizer

    def _compiled_matcher(self, params: StructuredOutputsParams) -> llguidance.LLMatcher:
        """A matcher at the start of the grammar, compiled once per distinct grammar."""
        m = self._compiled.get(params.ll_grammar)
        if m is not None:
            self._compiled.move_to_end(params.ll_grammar)
            return m
        m = llguidance.LLMatcher(self.ll_tokenizer, params.ll_grammar, log_level=0)
        if m.is_error():
            raise ValueError(f"structured_outputs.{params.kind}: {m.get_error()}")
        self._compiled[params.ll_grammar] = m
        if len(self._compiled) > CACHE_SIZE:
            self._compiled.popitem(last=False)
        return m

    def add_request(self, params: StructuredOutputsParams) -> None:
        """Compile (or find) the request's grammar; raises ValueError naming what is wrong."""
        self._compiled_matcher(params)
        self.stats.num_requests += 1

    def new_matcher(self, params: StructuredOutputsParams) -> SequenceMatcher:
        return SequenceMatcher(self._compiled_matcher(params).deep_copy())

    def fill_masks(self, seqs) -> None:
        """Sets `row.packed_mask` of every sequence that has a matcher (objects with .matcher, .row).
        A matcher that cannot go on (an error, or no token allowed) is failed and its row allows only
        end-of-sequence: the engine aborts the sequence at its next token."""
        cons = [s for s in seqs if s.matcher is not None]
        if not cons:  # (a matcher exists only once ll_tokenizer, and with it the executor, was built)
            return
        t0 = time.perf_counter()
        masks = fill_bitmasks(self._executor, [s.matcher for s in cons], self._ll_tokenizer.vocab_size,
                              self.logits_width)
        for s, words in zip(cons, masks):
            if s.matcher.ll.is_error() or not words.any():
                s.matcher.fail("no token is allowed here (the constraint cannot be satisfied)")
                allow_only(words, min(self._ll_tokenizer.eos_tokens))
            s.row.packed_mask = words
        self.stats.record_masks(time.perf_counter() - t0, len(cons))
