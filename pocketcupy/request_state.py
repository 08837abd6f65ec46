"""Engine-side state of a request: its n sampled sequences with their sampling rows,
detokenizers, stop matchers and the outputs built so far (the scheduler sees only Request)."""
from __future__ import annotations

from dataclasses import dataclass, field

from .outputs import CompletionOutput
from .sampler import SamplingRow
from .sampling import SamplingParams
from .sched.request import Request
from .stop import StopStringMatcher


@dataclass
class SequenceState:
    """Engine-side state of one sampled sequence (a request has n of them)."""
    group: "RequestGroup"
    index: int
    req: Request
    row: SamplingRow
    detok: object
    stop: StopStringMatcher | None
    output: CompletionOutput
    prompt_chunks: list = field(default_factory=list)
    matcher: object | None = None  # structured.SequenceMatcher when the output is constrained
    thinking: object | None = None  # thinking_budget.ThinkingBudget of params.thinking_token_budget

    @property
    def thinking_open(self) -> bool:
        """A thinking budget still reads the output (to count or to force the end marker)."""
        return self.thinking is not None and not self.thinking.done


@dataclass
class RequestGroup:
    request_id: str
    prompt: str | None
    prompt_ids: list[int]
    params: SamplingParams
    seqs: list[SequenceState] = field(default_factory=list)
    prompt_logprobs: list | None = None
    allowed_mask: object = None  # bool [vocab] of params.allowed_token_ids, shared by the sequences' rows
    bad_words: tuple = ()  # bad_words.bad_words_token_ids of params.bad_words
    mailbox: object = None  # Engine._add_request's: gets the request's outputs
    error: Exception | None = None  # what failed the request (finish_reason "error")
    pooler: object = None  # pooling.Pooler of a pooling request (Engine.embed): its prompt's hidden states
    embedding: list | None = None  # the pooler's result once the prompt is computed

    @property
    def finished(self) -> bool:
        return all(s.output.finished() for s in self.seqs)
