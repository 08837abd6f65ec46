"""Draft-model drafts: a smaller model with the same vocabulary proposes each request's next k
tokens greedily. Its K/V lives in a cache of its own with the target's block tables (a draft token
at position p goes to the slot the target uses for p), so the scheduler's blocks serve both models;
the proposer reserves the slots of its drafts before writing them."""
from __future__ import annotations

import weakref

from ..sched.output import ScheduledRequest, SchedulerOutput
from ..sched.request import Request


class DraftModelProposer:
    resolves_every_step = False   # (catches up on every token not seen yet when it is called)

    def __init__(self, runner, argmax_rows, num_speculative_tokens: int, max_len: int, reserve_slots,
                 max_tokens_per_forward: int):
        """runner: the draft model's ModelRunner (its own KV pages, as many blocks as the target's);
        argmax_rows(logits) -> host ids; max_len: positions the draft model takes; reserve_slots(req, n)
        -> bool: room in the request's blocks for n tokens past its computed ones."""
        self.runner, self.argmax_rows, self.k, self.max_len = runner, argmax_rows, num_speculative_tokens, max_len
        self.reserve_slots, self.max_tokens_per_forward = reserve_slots, max_tokens_per_forward
        # (preemptions, tokens) of each request: the tokens whose K/V the draft model holds, since its
        # last preemption (its blocks may come back from the prefix cache filled by a request the draft
        # model never saw); the target's computed length bounds it, the K/V past it being rejected drafts'
        self._computed: weakref.WeakKeyDictionary[Request, tuple[int, int]] = weakref.WeakKeyDictionary()

    def _start(self, r: Request) -> int:
        preemptions, n = self._computed.get(r, (r.num_preemptions, 0))
        return min(n, r.num_computed_tokens) if preemptions == r.num_preemptions else 0

    def propose(self, reqs: list[Request], ks: list[int]) -> None:
        """Sets draft_token_ids of each request, at most its k of ks (all at the decode point: every
        token but the last computed). The first forward catches the draft model up on the tokens it has not seen (a
        request left short of the forward's token budget drafts at a later step), each next one
        feeds the previous draft token."""
        items, room, budget = [], {}, self.max_tokens_per_forward
        for r, k in zip(reqs, ks):
            k = min(self.k, k, r.max_tokens - r.num_output_tokens - 1, self.max_len - r.num_tokens + 1)
            start = self._start(r)
            if k <= 0 or budget <= 0 or not self.reserve_slots(r, k):
                continue
            n = min(r.num_tokens - start, budget)
            budget -= n
            items.append(ScheduledRequest(r.request_id, r.token_slice(start, start + n), start, r.block_ids,
                                          sample=start + n == r.num_tokens, prompt_logits=False))
            self._computed[r] = (r.num_preemptions, start + n)
            room[r.request_id] = (r, k)
        drafts: dict[str, list[int]] = {}
        while items:
            out = self.runner.execute(SchedulerOutput(items))
            if not out.sample_ids:   # every request still catching up (no logits then): none drafts
                break
            for rid, tok in zip(out.sample_ids, self.argmax_rows(out.logits).tolist()):
                drafts.setdefault(rid, []).append(tok)
            items = []
            for rid, d in drafts.items():
                r, k = room[rid]
                if len(d) < k:   # feed the last draft token
                    pos = r.num_tokens + len(d) - 1
                    items.append(ScheduledRequest(rid, [d[-1]], pos, r.block_ids, sample=True, prompt_logits=False))
                    self._computed[r] = (r.num_preemptions, pos + 1)
        for rid, d in drafts.items():
            room[rid][0].draft_token_ids = d
