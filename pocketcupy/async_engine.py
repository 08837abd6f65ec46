"""An asyncio front of the Engine (vLLM's AsyncLLM): coroutines submit requests and iterate their
outputs while the engine's background step loop (EngineLoop) batches every request in flight.

The engine's lock is held for a whole step, so a call that takes it (submitting, aborting) runs in a
worker thread: the event loop never waits out a step (a long prefill chunk on the CPU takes seconds).
"""
from __future__ import annotations

import asyncio
import itertools
import threading
from typing import AsyncIterator

from .api_names import vllm_named
from .engine_loop import EngineLoop
from .outputs import EmbeddingRequestOutput, RequestOutput, ScoringRequestOutput
from .pooling import PoolingParams
from .sampling import SamplingParams
from .scoring import classifier_params, classifier_results, cosine_results


class _EventLoopQueue:
    """What EngineLoop.submit puts a request's outputs into (queue.Queue's put), called on the step
    loop's thread: each item is handed to an asyncio.Queue on the event loop of the coroutine that
    submitted. Once that event loop is closed (closed without finalizing the request's generator), the
    items are dropped and the request is aborted: a caller gone away must neither fail the step loop,
    which serves everyone else, nor leave its request running."""

    def __init__(self):
        self._event_loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.stream = None   # the request's RequestStream, once submitted

    def put(self, item) -> None:
        try:
            self._event_loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:   # the event loop is closed
            if self.stream is not None:   # (not from inside the step that is delivering this item)
                threading.Thread(target=self.stream.abort, daemon=True).start()
                self.stream = None


def _in_background(fn, *args) -> None:
    """Runs fn(*args) in the event loop's worker threads without waiting for it (the loop may be
    shutting down, and so refuse new work: then here, at once)."""
    try:
        asyncio.get_running_loop().run_in_executor(None, fn, *args)
    except RuntimeError:
        fn(*args)


class AsyncEngine:
    """`AsyncEngine(model, device, **engine_args)` builds an Engine (blocking: weights load; wrap it in
    `asyncio.to_thread` inside a running event loop) and starts its step loop; `from_engine` wraps
    one already built. A request's generator aborts it when the caller stops early (a break once the
    generator is closed, a cancelled task)."""

    def __init__(self, model: str | None = None, device: str = "auto", **engine_args):
        from .engine import Engine

        self._start(Engine(model, device, **engine_args))

    @classmethod
    def from_engine(cls, engine) -> "AsyncEngine":
        self = cls.__new__(cls)
        self._start(engine)
        return self

    @classmethod
    def from_args(cls, args) -> "AsyncEngine":
        from .engine import Engine

        return cls.from_engine(Engine.from_args(args))

    def _start(self, engine) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self._loop = EngineLoop(engine)
        self._ids = itertools.count()

    async def generate(self, prompt, params: SamplingParams | None = None, request_id: str | None = None,
                       priority: int = 0, prompt_token_ids: list[int] | None = None, *,
                       sampling_params=None) -> AsyncIterator[RequestOutput]:
        """One request (text or token ids, as Engine.add_request takes): its RequestOutput after each
        step that advanced it (text and tokens so far, and the step's deltas), the last one finished.
        A bad argument raises ValueError at the first iteration. sampling_params: params by vLLM's name
        (so for chat and stream; embed's and score's pooling_params)."""
        params = vllm_named(params, sampling_params, "params", "sampling_params")
        async for out in self._outputs(request_id, "agen", prompt, params, priority, prompt_token_ids):
            yield out

    async def chat(self, messages: list[dict], params: SamplingParams | None = None, tools=None,
                   add_generation_prompt: bool = True, chat_template_kwargs: dict | None = None,
                   continue_final_message: bool = False, request_id: str | None = None,
                   priority: int = 0, *, sampling_params=None,
                   chat_template: str | None = None) -> AsyncIterator[RequestOutput]:
        """One conversation through the chat template (Engine.chat's arguments), as generate()."""
        params = vllm_named(params, sampling_params, "params", "sampling_params")
        ids = self.engine.chat_prompt_ids(messages, tools, add_generation_prompt, chat_template_kwargs,
                                          continue_final_message, chat_template)
        async for out in self.generate(ids, params, request_id, priority):
            yield out

    async def stream(self, prompt_or_messages, params: SamplingParams | None = None, *,
                     sampling_params=None) -> AsyncIterator[str]:
        """The text deltas of one request (a prompt, or a conversation's messages; n must be 1)."""
        params = vllm_named(params, sampling_params, "params", "sampling_params")
        prompt, params = self.engine.stream_request(prompt_or_messages, params)
        async for out in self.generate(prompt, params):
            if out.outputs[0].delta_text:
                yield out.outputs[0].delta_text

    async def embed(self, prompt, pooling: PoolingParams | None = None, request_id: str | None = None,
                    priority: int = 0, *, pooling_params=None) -> EmbeddingRequestOutput:
        """One prompt's embedding (Engine.embed's pooling), computed among the other requests."""
        pooling = vllm_named(pooling, pooling_params, "pooling", "pooling_params")
        last = await self._last(self._outputs(request_id, "aembd", prompt, None, priority,
                                              pooling=self.engine.pooling_or_default(pooling)))
        return self.engine.embedding_output(last)

    async def score(self, text_1, text_2, pooling: PoolingParams | None = None, *,
                    pooling_params=None) -> list[ScoringRequestOutput]:
        """Engine.score's pairs (one text_1 against each text_2, or side by side), computed among the
        other requests: the cosine of their embeddings, or with score_tokens a reranker's P(yes)."""
        pooling = vllm_named(pooling, pooling_params, "pooling", "pooling_params")
        e = self.engine
        first, second, pairs = e.score_inputs(text_1, text_2)
        if e.score_token_ids is not None:
            prompts = [e.pair_ids(first[i], second[j]) for i, j in pairs]
            params = classifier_params(e.score_token_ids)
            outs = await asyncio.gather(*(self._last(self.generate(p, params)) for p in prompts))
            return classifier_results(prompts, outs, e.score_token_ids)
        vecs = await asyncio.gather(*(self.embed(t, pooling) for t in first + second))
        return cosine_results(vecs, len(first), pairs, (f"ascore-{next(self._ids)}" for _ in pairs))

    @staticmethod
    async def _last(agen):
        last = None
        async for last in agen:
            pass
        return last

    async def abort(self, request_id: str | list[str]) -> None:
        """Aborts requests by id (unknown ids are ignored); their generators end with finish_reason
        "abort"."""
        await asyncio.to_thread(self._loop.abort, request_id)

    async def get_tokenizer(self):
        """The model's Tokenizer (a coroutine, as vLLM's AsyncLLM.get_tokenizer)."""
        return self.tokenizer

    async def reset_prefix_cache(self) -> bool:
        """Engine.reset_prefix_cache (vLLM's AsyncLLM's), in a worker thread."""
        return await asyncio.to_thread(self.engine.reset_prefix_cache)

    async def stats(self) -> dict:
        return await asyncio.to_thread(self.engine.stats)

    async def shutdown(self, timeout: float | None = None) -> None:
        """Lets the requests in flight finish (up to timeout seconds), then stops the step loop."""
        await asyncio.to_thread(self._loop.shutdown, timeout)
        self.engine.close()

    async def __aenter__(self) -> "AsyncEngine":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()

    async def _outputs(self, request_id: str | None, id_prefix: str, prompt, params, priority: int,
                       prompt_token_ids=None, pooling: PoolingParams | None = None) -> AsyncIterator[RequestOutput]:
        box = _EventLoopQueue()
        submitting = asyncio.ensure_future(asyncio.to_thread(
            self._loop.submit, prompt, params, request_id, priority, prompt_token_ids, box, None, pooling, id_prefix))
        try:
            box.stream = stream = await asyncio.shield(submitting)
        except asyncio.CancelledError:   # the request may still be added: abort it once it is
            submitting.add_done_callback(
                lambda f: f.cancelled() or f.exception() is not None or _in_background(f.result().abort))
            raise
        try:
            while not stream.finished:
                _, item = await box.queue.get()
                yield stream.take(item)
        finally:
            if not stream.finished:   # the caller stopped early
                _in_background(stream.abort)
