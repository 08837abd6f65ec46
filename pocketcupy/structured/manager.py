"""The engine's structured-output side: compiled grammars (cached by grammar text), one matcher per
sampled sequence, and the batched mask fill that runs on the CPU while the device runs a forward.

Matchers deep-copied from one compiled grammar share its lexer caches behind a lock, so llguidance's
parallel fill does not scale over them (measured: 2 threads slower than 1). Each grammar therefore
has up to `threads` independently compiled roots; sequences take them in turn, and a fill passes the
rows grouped by root, so each worker thread mostly works on matchers of one root."""
from __future__ import annotations

import itertools
import os
import time
from collections import OrderedDict

import llguidance

from .ll_tokenizer import build_ll_tokenizer
from .masks import allow_only, fill_bitmasks
from .matcher import SequenceMatcher
from .params import StructuredOutputsParams
from .stats import StructuredStats

CACHE_SIZE = 256  # compiled grammars kept (least recently used dropped)


def default_threads() -> int:
    """llguidance's own default: 80% of the CPUs (this process may use), at most 32."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(32, int(0.8 * cpus)))


class StructuredOutputManager:
    def __init__(self, tokenizer, logits_width: int):
        self.tokenizer, self.logits_width = tokenizer, int(logits_width)
        self.stats = StructuredStats()
        self._ll_tokenizer = None
        self._executor = None
        self.threads = default_threads()
        self._compiled: OrderedDict[str, list[llguidance.LLMatcher]] = OrderedDict()  # grammar -> roots
        self._turn = itertools.count()

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        if self._ll_tokenizer is None:  # built on the first constrained request
            self._ll_tokenizer = build_ll_tokenizer(self.tokenizer)
            self._executor = llguidance.LLExecutor(self.threads)
        return self._ll_tokenizer

    def _compiled_matcher(self, params: StructuredOutputsParams, root: int = 0) -> llguidance.LLMatcher:
        """A matcher at the start of the grammar: root number `root` (< threads) of its compilations,
        each compiled once; the first compilation raises ValueError if the grammar is bad."""
        roots = self._compiled.get(params.ll_grammar)
        if roots is None:
            roots = self._compiled[params.ll_grammar] = [self._compile(params)]
            if len(self._compiled) > CACHE_SIZE:
                self._compiled.popitem(last=False)
        self._compiled.move_to_end(params.ll_grammar)
        while len(roots) <= root:
            roots.append(self._compile(params))
        return roots[root]

    def _compile(self, params: StructuredOutputsParams) -> llguidance.LLMatcher:
        m = llguidance.LLMatcher(self.ll_tokenizer, params.ll_grammar, log_level=0)
        if m.is_error():
            raise ValueError(f"structured_outputs.{params.kind}: {m.get_error()}")
        if not any(m.compute_bitmask()) or m.is_error():  # e.g. the schema {"$ref": "#"}: no first token
            why = m.get_error().split("\n", 1)[0] if m.is_error() else ""
            if why and why != "NoExtensionBias":  # a limit hit, not an empty language: '(.{1,100}){100}'
                raise ValueError(f"structured_outputs.{params.kind}: the constraint is too complex for the "
                                 f"structured-output engine ({why[:200]})")
            raise ValueError(f"structured_outputs.{params.kind}: the constraint cannot be satisfied (no output "
                             "matches it)")
        return m

    def prepare(self, params: StructuredOutputsParams) -> None:
        """Compile (or find) the request's grammar; raises ValueError naming what is wrong. Not counted
        in stats.num_requests: the engine may still refuse the request, and counts it once admitted."""
        self._compiled_matcher(params)

    def new_matcher(self, params: StructuredOutputsParams) -> SequenceMatcher:
        root = next(self._turn) % self.threads
        return SequenceMatcher(self._compiled_matcher(params, root).deep_copy(), root, params.start_after or (),
                               params.repeat)

    def fill_masks(self, seqs) -> None:
        """Sets `row.packed_mask` of every sequence that has a matcher (objects with .matcher, .row), unless
        the matcher still waits for its trigger (the row stays unmasked then).
        A matcher that cannot go on (an error, or no token allowed) is failed and its row allows only
        end-of-sequence: the engine aborts the sequence at its next token."""
        for s in seqs:
            if s.matcher is not None and s.matcher.waiting:   # (free again after a structure: no old mask)
                s.row.packed_mask = None
        cons = sorted((s for s in seqs if s.matcher is not None and not s.matcher.waiting),
                      key=lambda s: s.matcher.root)
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
