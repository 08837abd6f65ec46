"""The only things that cross between the scheduler and the runner."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ScheduledRequest:
    request_id: str
    token_ids: list[int]       # the new tokens to compute this step
    start_position: int        # position of token_ids[0] (= num_computed_tokens before the step)
    block_ids: list[int]       # the request's whole block table (shared with the Request: read only)
    sample: bool               # True when this step reaches the end of the known tokens
    prompt_logits: bool        # True when the runner must return logits for every prompt row
    num_draft: int = 0         # trailing draft tokens in token_ids (sample is True then): the runner
                               # returns logits for the last num_draft + 1 rows
    prompt_hidden: bool = False  # with prompt_logits: the rows' final hidden states instead (pooling)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)   # requests finished or aborted since the last
                                                            # output: the runner frees what it kept for them

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.scheduled)
