"""A request as the scheduler sees it: token ids and progress, no arrays, no sampling state.

Life cycle: WAITING -> RUNNING -> FINISHED_* ; a RUNNING request may be PREEMPTED (its blocks
are freed and it goes back to the waiting queue to be recomputed) and any request may be
aborted (FINISHED_ABORTED) at any time, or fail (FINISHED_ERROR).
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field


# An output token not yet known on the host: with async scheduling the engine appends it when it
# launches the step that samples it, and writes the real id in once that step's result arrives.
# The runner takes such a token from the device (the previous step's sampled ids).
PENDING_TOKEN = -1


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"     # an error of the request's own (vLLM's), or of its step's forward

    @property
    def finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
                        RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR)


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int                      # output tokens allowed (already capped by the context)
    priority: int = 0                    # lower value is served first (priority policy)
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0         # tokens whose K/V are in the request's blocks
    # the block table, kept by KVCacheManager, which replaces the list and never edits it in place
    # (ScheduledRequest shares it)
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of the full blocks so far
    want_prompt_logits: bool = False     # cleared once the prompt's logits were produced
    prompt_hidden: bool = False          # with want_prompt_logits: the prompt rows' final hidden states
                                         # instead of their logits (a pooling request: embeddings)
    num_preemptions: int = 0
    num_cached_tokens: int = -1          # prompt tokens served by the prefix cache at first scheduling
    first_scheduled_time: float | None = None   # time.monotonic() when first scheduled
    arrival_seq: int = -1                # set by the scheduler: breaks arrival_time ties
    # speculative decoding: proposed tokens to follow the known ones, scheduled (and cleared) at the next
    # step, whose sampler keeps those it would have drawn itself
    draft_token_ids: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def token_slice(self, start: int, stop: int) -> list[int]:
        n = len(self.prompt_token_ids)
        if stop <= n:
            return self.prompt_token_ids[start:stop]
        if start >= n:
            return self.output_token_ids[start - n:stop - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[:stop - n]
