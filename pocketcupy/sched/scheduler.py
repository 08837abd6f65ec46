"""The step scheduler: decides which requests compute how many tokens each step.

One rule covers prompts, chunked prefill, decode and recompute after preemption: each step a
request closes (part of) the gap between `num_computed_tokens` and `num_tokens`.
"""
from __future__ import annotations

from collections import deque

from .block_pool import BlockPool
from .output import ScheduledRequest, SchedulerOutput
from .request import Request, RequestStatus


class Scheduler:
    def __init__(self, num_blocks: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int):
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.pool = BlockPool(num_blocks)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0

    # --- queue management ----------------------------------------------------------------
    def add(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"request_id: {req.request_id!r} is already in use")
        need = self._blocks_for(len(req.prompt_token_ids) + req.max_tokens)
        if need > self.pool.num_blocks:
            raise ValueError(f"prompt: {len(req.prompt_token_ids)} prompt tokens plus max_tokens "
                             f"{req.max_tokens} need {need} KV blocks; the cache has {self.pool.num_blocks}")
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def finish(self, request_id: str, status: RequestStatus) -> Request | None:
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.pool.free(req.block_ids)
        req.block_ids = []
        req.status = status
        return req

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    # --- one step ------------------------------------------------------------------------
    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _grow(self, req: Request, num_tokens: int) -> bool:
        extra = self._blocks_for(num_tokens) - len(req.block_ids)
        if extra <= 0:
            return True
        got = self.pool.allocate(extra)
        if got is None:
            return False
        req.block_ids.extend(got)
        return True

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.running.remove(req)
        self.pool.free(req.block_ids)
        req.block_ids = []
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        out.preempted_ids.append(req.request_id)

    def _schedule_one(self, req: Request, budget: int) -> ScheduledRequest | None:
        n = min(req.num_tokens - req.num_computed_tokens, budget)
        if n <= 0 or not self._grow(req, req.num_computed_tokens + n):
            return None
        start = req.num_computed_tokens
        done = start + n == req.num_tokens
        return ScheduledRequest(req.request_id, req.token_slice(start, start + n), start, list(req.block_ids),
                                sample=done, prompt_logits=req.want_prompt_logits)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        scheduled_ids = set()
        for req in list(self.running):
            if budget <= 0:
                break
            if req not in self.running:
                continue  # preempted below while making room
            item = self._schedule_one(req, budget)
            while item is None and req.num_tokens > req.num_computed_tokens:
                victim = self.running[-1]  # the newest running request gives up its blocks
                self._preempt(victim, out)
                if victim is req:
                    break
                item = self._schedule_one(req, budget)
            if item is not None:
                out.scheduled.append(item)
                scheduled_ids.add(req.request_id)
                budget -= len(item.token_ids)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            item = self._schedule_one(req, budget)
            if item is None:
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append(item)
            budget -= len(item.token_ids)
        return out

    def on_step_done(self, out: SchedulerOutput) -> None:
        for item in out.scheduled:
            req = self.requests.get(item.request_id)
            if req is not None:
                req.num_computed_tokens += len(item.token_ids)
                if item.prompt_logits and req.num_computed_tokens >= len(req.prompt_token_ids):
                    req.want_prompt_logits = False

    def append_token(self, request_id: str, token_id: int) -> None:
        self.requests[request_id].output_token_ids.append(token_id)

    @property
    def num_blocks_used(self) -> int:
        return self.pool.num_blocks - self.pool.num_free
