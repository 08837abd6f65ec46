"""What the engine returns, with vLLM's names."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list | None = None           # one {token_id: Logprob} dict per generated token
    finish_reason: str | None = None       # "stop" | "length" | "abort" | "error" | None while running
    stop_reason: int | str | None = None   # the stop string or stop token id that ended it
    # what this step added (for streaming)
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None  # the sum of the tokens' logprobs (vLLM's: only with logprobs)

    def finished(self) -> bool:
        """A method, as vLLM's (RequestOutput.finished is an attribute, as there)."""
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    prompt_logprobs: list | None = None     # vLLM semantics: [None, {id: Logprob}, ...]
    finished: bool = False
    num_cached_tokens: int = 0
    time_in_queue: float | None = None      # seconds from arrival to first scheduling (None until then)
    embedding: list[float] | None = None    # a pooling request's (Engine.embed), once finished


@dataclass
class EmbeddingOutput:
    embedding: list[float]


@dataclass
class EmbeddingRequestOutput:
    """Engine.embed's result for one prompt (vLLM's names: outputs.embedding)."""
    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool = True


@dataclass
class ScoringOutput:
    score: float


@dataclass
class ScoringRequestOutput:
    """Engine.score's result for one pair (vLLM's names: outputs.score); prompt_token_ids are the first
    text's, then the second's."""
    request_id: str
    prompt_token_ids: list[int]
    outputs: ScoringOutput
    finished: bool = True
