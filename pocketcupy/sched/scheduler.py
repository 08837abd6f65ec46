"""The step scheduler: decides which requests compute how many tokens each step.

One rule covers prompts, chunked prefill, prefix-cache hits, decode and recompute after
preemption: each step a request closes (part of) the gap between `num_computed_tokens` and
`num_tokens`.

A step: (1) running requests, in order, each get min(gap, budget left) tokens; when the pool
runs out, the running request with the largest key is preempted (freed, recomputed later)
until the blocks fit. (2) Unless (1) preempted something, waiting requests are admitted in key
order (head-of-line: the first one that does not fit stops admission), each first taking what
the prefix cache holds of it. Under the priority policy a waiting request that does not fit
may also preempt running requests with a strictly larger key.

Keys: FCFS (arrival_time, arrival_seq); priority (priority, arrival_time, arrival_seq).

Blocks become prefix-cache entries when the tokens that fill them are scheduled, not when they
are computed: a request admitted later in the same step may read blocks that an earlier one
fills in that step (the runner writes every new token's K/V before any sequence attends).
Running requests' blocks are entered at the end of `schedule`, once no more of them can be
preempted in this step, so no hash ever names a block whose contents will not be computed.
"""
from __future__ import annotations

import bisect
import itertools
import time

from .kv_cache_manager import KVCacheManager
from .output import ScheduledRequest, SchedulerOutput
from .request import Request, RequestStatus

POLICIES = ("fcfs", "priority")


class RequestQueue:
    """Waiting requests sorted by the policy's key (stable for equal keys)."""

    def __init__(self, key):
        self._key = key
        self._items: list[tuple[tuple, Request]] = []

    def add(self, req: Request) -> None:
        k = self._key(req)
        i = bisect.bisect_right([x[0] for x in self._items], k)
        self._items.insert(i, (k, req))

    def peek(self) -> Request:
        return self._items[0][1]

    def pop(self) -> Request:
        return self._items.pop(0)[1]

    def remove(self, req: Request) -> bool:
        for i, (_, r) in enumerate(self._items):
            if r is req:
                del self._items[i]
                return True
        return False

    def __contains__(self, req: Request) -> bool:
        return any(r is req for _, r in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self):
        return iter([r for _, r in self._items])


class Scheduler:
    def __init__(self, num_blocks: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                 enable_prefix_caching: bool = True, policy: str = "fcfs", recompute_last_hit_block: bool = False):
        if policy not in POLICIES:
            raise ValueError(f"scheduling_policy: must be 'fcfs' or 'priority', got {policy!r}")
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy
        self.kv_cache_manager = KVCacheManager(num_blocks, block_size, enable_prefix_caching, recompute_last_hit_block)
        self.pool = self.kv_cache_manager.block_pool
        self.waiting = RequestQueue(self._key)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_ids: list[str] = []   # for the next SchedulerOutput
        self._arrivals = itertools.count()
        self.num_preemptions = 0
        self.num_computed_tokens_total = 0   # tokens the runner was asked to compute, all steps
        self.num_steps = 0
        self.num_drafts = 0                  # speculative decoding: verification steps of a request,
        self.num_draft_tokens = 0            # draft tokens computed in them,
        self.num_accepted_tokens = 0         # and those the sampler kept

    def _key(self, req: Request) -> tuple:
        if self.policy == "priority":
            return (req.priority, req.arrival_time, req.arrival_seq)
        return (req.arrival_time, req.arrival_seq)

    # --- queue management ----------------------------------------------------------------
    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def add(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"request_id: {req.request_id!r} is already in use")
        self._check_new(req)
        need = self._blocks_for(len(req.prompt_token_ids) + req.max_tokens - 1)   # the last token needs no K/V
        usable = self.pool.num_usable_blocks
        if need > usable:  # blame max_tokens when the prompt alone would fit
            field = "max_tokens" if self._blocks_for(len(req.prompt_token_ids)) <= usable else "prompt"
            raise ValueError(f"{field}: {len(req.prompt_token_ids)} prompt tokens plus max_tokens "
                             f"{req.max_tokens} need {need} KV blocks; the cache has {usable}")
        req.arrival_seq = next(self._arrivals)
        req.status = RequestStatus.WAITING
        self.requests[req.request_id] = req
        self.waiting.add(req)

    @staticmethod
    def _check_new(req: Request) -> None:
        """A request as add() takes it (fresh, or resumed with output tokens: those are recomputed).
        Admission counts num_computed_tokens as tokens already in blocks, so a stale value (a request
        added again after it ran) made it ask for too many blocks, which a tight pool never had (the
        request waited forever at the head of the queue), or too few (a negative value)."""
        if not req.prompt_token_ids:
            raise ValueError("prompt: must not be empty")
        if req.num_computed_tokens != 0:
            raise ValueError(f"num_computed_tokens: must be 0 for a request added (it holds no KV blocks yet; a "
                             f"resumed request's tokens are computed again), got {req.num_computed_tokens}")
        if req.max_tokens < 1 or req.num_output_tokens >= req.max_tokens:
            raise ValueError(f"max_tokens: {req.max_tokens} leaves no token to sample after the request's "
                             f"{req.num_output_tokens} output tokens")

    def finish(self, request_id: str, status: RequestStatus) -> Request | None:
        """Ends a request (finished or aborted) wherever it is and frees its blocks."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        self.kv_cache_manager.free(req)
        req.status = status
        self._finished_ids.append(request_id)
        return req

    def abort(self, request_id: str) -> Request | None:
        return self.finish(request_id, RequestStatus.FINISHED_ABORTED)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    # --- one step ------------------------------------------------------------------------
    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.running.remove(req)
        self.kv_cache_manager.free(req)
        req.num_computed_tokens = 0
        req.draft_token_ids = []
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.add(req)
        out.preempted_ids.append(req.request_id)

    def _unschedule(self, req: Request, out: SchedulerOutput) -> int:
        """Drops req's item from this step's output; returns the tokens it had."""
        for i, item in enumerate(out.scheduled):
            if item.request_id == req.request_id:
                del out.scheduled[i]
                return len(item.token_ids)
        return 0

    def _item(self, req: Request, start: int, n: int, drafts: list[int] = ()) -> ScheduledRequest:
        # block_ids is shared, not copied: KVCacheManager replaces a request's list, never edits it
        return ScheduledRequest(req.request_id, req.token_slice(start, start + n) + list(drafts), start,
                                req.block_ids, sample=start + n == req.num_tokens,
                                prompt_logits=req.want_prompt_logits, prompt_hidden=req.prompt_hidden,
                                num_draft=len(drafts))

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished_ids=self._finished_ids)
        self._finished_ids = []
        kv = self.kv_cache_manager
        budget = self.max_num_batched_tokens
        scheduled: dict[str, int] = {}   # running request id -> tokens this step

        # (1) running requests
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            gap = req.num_tokens - req.num_computed_tokens
            n = min(gap, budget)
            if n <= 0 or req.num_output_tokens >= req.max_tokens:   # the last token needs no K/V
                i += 1
                continue
            drafts, req.draft_token_ids = req.draft_token_ids, []
            drafts = drafts[:budget - n] if n == gap else []
            if drafts and kv.allocate_slots(req, n + len(drafts)) is None:
                drafts = []   # speculation never preempts
            while not drafts and kv.allocate_slots(req, n) is None:   # (drafts left: their slots are allocated)
                victim = max(self.running, key=self._key)
                if victim.request_id in scheduled:   # a newer request placed before it in `running`
                    budget += self._unschedule(victim, out)
                    del scheduled[victim.request_id]
                if self.running.index(victim) < i:
                    i -= 1
                self._preempt(victim, out)
                if victim is req:
                    break
            if req.status != RequestStatus.RUNNING:
                continue  # preempted itself; i already points at the next one
            out.scheduled.append(self._item(req, req.num_computed_tokens, n, drafts))
            n += len(drafts)
            scheduled[req.request_id] = n
            budget -= n
            i += 1

        # (2) waiting requests
        admitted_by_preemption = False
        while self.waiting and budget > 0 and not out.preempted_ids and not admitted_by_preemption:
            req = self.waiting.peek()
            hits, num_hit = kv.get_computed_blocks(req)
            n = min(req.num_tokens - num_hit, budget)
            while len(self.running) >= self.max_num_seqs or kv.allocate_slots(req, n, hits) is None:
                victim = self._admission_victim(req)
                if victim is None:
                    break
                if victim.request_id in scheduled:
                    budget += self._unschedule(victim, out)
                    del scheduled[victim.request_id]
                self._preempt(victim, out)
                admitted_by_preemption = True
            else:
                self.waiting.pop()
                req.status = RequestStatus.RUNNING
                req.num_computed_tokens = num_hit
                if req.num_cached_tokens < 0:
                    req.num_cached_tokens = num_hit
                    req.first_scheduled_time = time.monotonic()
                self.running.append(req)
                kv.cache_blocks(req, num_hit + n)
                kv.record_lookup(req, num_hit)
                out.scheduled.append(self._item(req, num_hit, n))
                budget -= n
                continue
            break

        # (3) running requests' newly filled blocks join the prefix cache (most steps fill none)
        for rid, n in scheduled.items():   # (only blocks full of known tokens, never of draft tokens)
            req = self.requests[rid]
            kv.cache_blocks(req, req.num_computed_tokens + n)
        # budget may have grown back when a scheduled victim was dropped; it never goes below 0
        assert out.num_tokens <= self.max_num_batched_tokens and len(self.running) <= self.max_num_seqs
        return out

    def _admission_victim(self, req: Request) -> Request | None:
        """Priority policy only: the running request with the largest key, if it is larger than req's."""
        if self.policy != "priority" or not self.running:
            return None
        victim = max(self.running, key=self._key)
        return victim if self._key(victim) > self._key(req) else None

    def on_step_done(self, out: SchedulerOutput) -> None:
        self.num_steps += 1
        for item in out.scheduled:
            req = self.requests.get(item.request_id)
            if req is None:
                continue
            req.num_computed_tokens += len(item.token_ids)
            self.num_computed_tokens_total += len(item.token_ids)
            if item.prompt_logits and req.num_computed_tokens >= len(req.prompt_token_ids):
                req.want_prompt_logits = False

    def append_token(self, request_id: str, token_id: int) -> None:
        self.requests[request_id].output_token_ids.append(token_id)

    def reserve_slots(self, req: Request, num_tokens: int) -> bool:
        """Room in a running request's blocks for num_tokens tokens past its computed ones, for a
        draft model's K/V written before the step that schedules them; False (nothing allocated)
        when the pool lacks the blocks."""
        return self.kv_cache_manager.allocate_slots(req, num_tokens) is not None

    def drafts_verified(self, request_id: str, num_draft: int, num_accepted: int) -> None:
        """After a step that computed num_draft draft tokens of the request: the K/V of the rejected
        ones (past the accepted) is dropped, i.e. overwritten by later steps. The request may have
        finished meanwhile (a stop among the accepted tokens)."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        req = self.requests.get(request_id)
        if req is not None:
            req.num_computed_tokens -= num_draft - num_accepted

    # --- stats ---------------------------------------------------------------------------
    @property
    def num_blocks_used(self) -> int:
        return self.kv_cache_manager.num_used_blocks

    @property
    def num_blocks_total(self) -> int:
        return self.pool.num_usable_blocks

    def get_stats(self) -> dict:
        kv = self.kv_cache_manager
        return {
            "num_running": len(self.running),
            "num_waiting": len(self.waiting),
            "kv_blocks_used": self.num_blocks_used,
            "kv_blocks_total": self.num_blocks_total,
            "num_preemptions": self.num_preemptions,
            "prefix_cache_queries": kv.prefix_cache_queries,                # tokens looked up
            "prefix_cache_hits": kv.prefix_cache_hits,                      # tokens found
            "prefix_cache_preempted_queries": kv.prefix_cache_preempted_queries,  # re-admissions (not in the two above)
            "prefix_cache_preempted_hits": kv.prefix_cache_preempted_hits,
            "num_computed_tokens_total": self.num_computed_tokens_total,    # tokens the model computed
            "spec_num_drafts": self.num_drafts,
            "spec_num_draft_tokens": self.num_draft_tokens,
            "spec_num_accepted_tokens": self.num_accepted_tokens,
        }
