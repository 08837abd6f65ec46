"""Speculative decoding in the engine: each step's drafts proposed, and a step with drafts verified
one depth at a time (a part of Engine)."""
from __future__ import annotations

import time

import numpy as np

from .request_state import SequenceState
from .sched.request import RequestStatus


class EngineSpec:
    def _verify_and_roll_back(self, sched_out, logits, seqs: list[SequenceState], touched: dict) -> None:
        """_verify, then a hybrid model's recurrent states rolled back to the tokens each request kept
        (ModelRunner.roll_back; K/V pages need nothing: a rejected draft's slots are written again)."""
        self._rejected = {}
        self._verify(sched_out, logits, seqs, touched)
        if self.runner.states is not None:
            self.runner.roll_back(sched_out, self._rejected)

    def _verify(self, sched_out, logits, seqs: list[SequenceState], touched: dict) -> None:
        """Samples a step with draft tokens (logits: 1 + num_draft rows a sequence) one depth at a
        time: a sequence samples its next row only while each token drawn equals its draft token,
        with penalties, masks and its generator advanced by the tokens kept, so it draws exactly the
        tokens it would draw without drafts (a draft chosen without sampling makes the acceptance
        test of speculative sampling this comparison). When every sequence is greedy with nothing
        that reads its output so far, every row is sampled in one launch instead. A launch that raises
        (a row at fault) is sampled again row by row: the sequences whose row raises fail alone."""
        items = {item.request_id: item for item in sched_out.scheduled if item.sample}
        drafts, offsets, row = [], [], 0   # each sequence's draft tokens and first logits row
        for s in seqs:
            item = items[s.req.request_id]
            drafts.append(item.token_ids[len(item.token_ids) - item.num_draft:])
            offsets.append(row)
            row += 1 + item.num_draft
        result = None
        if all(_greedy_alone(s) for s in seqs):
            try:
                result = self.sampler.launch(logits, [s.row for s, d in zip(seqs, drafts)
                                                      for _ in range(1 + len(d))]).result()
            except Exception:   # a row at fault: verified depth by depth below, its rows sampled apart
                pass
        if result is not None:
            toks = result.token_ids.tolist()
            for i, s in enumerate(seqs):
                if s.output.finished():   # (failed in this step)
                    continue
                for depth in range(1 + len(drafts[i])):
                    j = offsets[i] + depth
                    if not self._keep(s, drafts[i], depth, toks[j], result.logprobs[j], touched):
                        break
            return
        alive, depth = [i for i, s in enumerate(seqs) if not s.output.finished()], 0
        while alive:
            if depth:
                self._constrain_rows([seqs[i] for i in alive], touched)   # after the tokens kept so far
                alive = [i for i in alive if not seqs[i].output.finished()]
                if not alive:
                    break
            live = [seqs[i] for i in alive]
            rows = self.ops.asarray(np.asarray([offsets[i] + depth for i in alive], np.int64))
            try:
                result = self.sampler.launch(logits[rows], [s.row for s in live]).result()
            except Exception:   # each row sampled alone: the sequences whose row raises fail
                result = self._sample_apart(logits[rows], live, touched).result()
            alive = [i for i, s, tok, lp in zip(alive, live, result.token_ids.tolist(), result.logprobs)
                     if not s.output.finished() and self._keep(s, drafts[i], depth, tok, lp, touched)]
            depth += 1

    def _keep(self, s: SequenceState, draft: list[int], depth: int, tok: int, logprobs, touched: dict) -> bool:
        """tok, drawn at this depth of a verification, into the sequence; True while it equals its
        draft token and the sequence goes on (then its next row is sampled)."""
        self.scheduler.append_token(s.req.request_id, tok)
        self._append(s, tok, logprobs)
        touched[id(s.group)] = s.group
        kept = depth < len(draft) and tok == draft[depth]
        if kept and not s.output.finished():
            return True
        if draft:
            self.scheduler.drafts_verified(s.req.request_id, len(draft), depth + kept)
            self.drafting.record(s.req, len(draft), depth + kept)
            if depth + kept < len(draft):
                self._rejected[s.req.request_id] = 1 + depth + kept   # the step's tokens that stand
        return False

    def _time_step(self, sched_out, seconds: float) -> None:
        """A step's seconds, for the cost of drafts (decode and verification steps only: a prompt
        chunk's tokens cost more than a decode row's)."""
        items = sched_out.scheduled
        if items and all(len(item.token_ids) == 1 + item.num_draft for item in items):
            self.drafting.cost.step(sum(len(item.token_ids) for item in items),
                                    sum(item.num_draft for item in items), seconds)

    def _plan_drafts(self, touched: dict, cur) -> list | None:
        """For a step that async scheduling would leave in flight (cur): each sequence that may draft
        at the next step and its number of drafts, decided before the step's tokens are known (the
        step stays in flight where none drafts). None where the step must be resolved at once: a
        proposer that reads every step's tokens (MTP), or a request still holding drafts of an earlier
        step (a verification never runs while a step is in flight)."""
        if self.proposer.resolves_every_step or any(r.draft_token_ids for r in self.scheduler.running):
            return None
        return self._drafts_wanted({**touched, **{id(s.group): s.group for s in cur.seqs}}.values())

    def _drafts_wanted(self, groups) -> list:
        """(sequence, number of drafts) of each sequence of groups at the decode point (which got its
        token, known or pending, this step), as many as its acceptance makes worth verifying
        (spec/adaptive.py: called once a step)."""
        decoding = [s for g in groups for s in g.seqs if _decoding(s)]
        return [(s, self.drafting.num_drafts(s.req, len(decoding))) for s in decoding]

    def _propose(self, groups, plan: list | None = None) -> None:
        """Draft tokens for the next step of each sequence that just got its token, as many as plan
        says (_drafts_wanted's, made now where None); a structured output's are cut where its grammar
        would refuse them."""
        plan = self._drafts_wanted(groups) if plan is None else plan
        ready = [(s, k) for s, k in plan if k and _decoding(s)]   # (a planned one may have finished since)
        t0 = time.perf_counter()
        self.proposer.propose([s.req for s, _ in ready], [k for _, k in ready])
        self.drafting.cost.proposed(sum(len(s.req.draft_token_ids) for s, _ in ready), time.perf_counter() - t0)
        for s, _ in ready:
            if self._async:   # (where a proposal that finds nothing costs a step's overlap)
                self.drafting.found(s.req, bool(s.req.draft_token_ids))
            if s.matcher is not None and s.req.draft_token_ids:
                s.req.draft_token_ids = s.req.draft_token_ids[:s.matcher.valid_prefix(s.req.draft_token_ids)]


def _decoding(s: SequenceState) -> bool:
    """Whether the sequence runs at the decode point with tokens still to come (its last token,
    known or pending, not computed yet)."""
    r = s.req
    return r.status == RequestStatus.RUNNING and r.num_computed_tokens == r.num_tokens - 1 \
        and r.num_output_tokens < r.max_tokens


def _greedy_alone(s: SequenceState) -> bool:
    """Whether the sequence's next tokens are each its logits row's argmax, whatever tokens come
    before (no penalties, structured output, bad words, min_tokens still to reach or a thinking budget
    still open, whose forced tokens depend on the tokens before)."""
    p = s.group.params
    return (p.greedy and not p.has_penalties and s.matcher is None and not s.group.bad_words and not s.thinking_open
            and s.req.num_output_tokens >= p.min_tokens)
