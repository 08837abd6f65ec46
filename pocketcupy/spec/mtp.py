"""Multi-token-prediction drafts (DeepSeek-V3's MTP layer, vLLM's "deepseek_mtp" method): the
target hands over the pre-norm hidden state of every token it computes; once the step's tokens are
known, the MTP layer runs at each position p it kept, on the token at p + 1 and the hidden state at
p, so its K/V follows the target's step by step, and the row at the last known position gives the
first draft. Each next draft feeds the previous one with the MTP layer's own output as the hidden
state (one layer reused for k drafts, as vLLM does).

Its K/V (one latent row a token) lives in pages of its own with the target's block tables, like a
draft model's. Positions the target takes from the prefix cache are not recomputed: their MTP rows
are those the request that computed them wrote, but for the hit's last block, which the scheduler
leaves to compute again (recompute_last_hit_block: its last row saw that request's next token). A
request that finished in a step still gets its MTP rows for it, in the blocks it held, so that its
cached blocks serve a later request whole (a block freed there and handed to another request's
drafts below is written by those after).

At tensor_parallel_size > 1 every rank holds its part of the MTP layer, split as the target's layers,
and runs its forwards in step with rank 0: rank 0 plans them (it alone knows the requests) and sends
the plan to every rank (MTPDrafter.run)."""
from __future__ import annotations

from dataclasses import dataclass

from ..runner import FlatBatchBuilder
from ..sched.output import ScheduledRequest, SchedulerOutput
from ..sched.request import Request


@dataclass
class MTPPlan:
    """One propose's MTP forwards, which every rank of a tensor-parallel group runs alike (rank 0
    sends it as a step message): the first forward's items, each item's rows (start, count) of the
    target's hidden states taken since the last plan, and of each request that drafts its number of
    drafts and the blocks they go in."""
    items: list[ScheduledRequest]
    spans: list[tuple[int, int]]
    drafts: dict[str, tuple[int, list[int]]]


class MTPDrafter:
    """The MTP layer's forwards over K/V pages of its own, on every rank (each its part of the layer:
    its query heads and experts' columns; the latent rows whole, as the target's). A draft is the
    argmax of the full-vocabulary logits, which the all-gather gives every rank alike, so every rank
    chains the same drafts with no message; how many forwards run depends on the plan alone."""

    def __init__(self, model, ops, num_blocks: int, block_size: int, kv_cache_dtype: str):
        """model: a DeepseekMTP; num_blocks: the target's pool (its pages have one more block, the
        runner's scratch block, so that a slot means the same in both)."""
        self.model, self.ops = model, ops
        self.kv_cache = ops.empty_kv_cache(num_blocks + 1, block_size, model.layout.num_kv_heads,
                                           model.config.head_dim, kv_cache_dtype, values=False)
        self.build_batch = FlatBatchBuilder(block_size)
        self._hidden: list = []   # the target's pre-norm hidden states of each step since the last plan

    def take(self, hidden) -> None:
        self._hidden.append(hidden)

    def run(self, plan: MTPPlan) -> dict[str, list[int]]:
        """The plan's forwards: the draft tokens of each request of plan.drafts."""
        hidden, self._hidden = self._hidden, []
        if not plan.items:
            return {}
        flat = hidden[0] if len(hidden) == 1 else self.ops.xp.concatenate(hidden)
        items, rows = plan.items, [flat[start:start + n] for start, n in plan.spans]
        drafts: dict[str, list[int]] = {}
        while items:
            y, last = self._run(items, rows)
            sampled = [(item, j) for item, j in zip(items, last) if item.sample]
            if not sampled:
                break
            at = self.ops.asarray([j for _, j in sampled])
            toks = self.ops.argmax_rows(self.model.compute_logits(y[at])).tolist()
            items, rows = [], []
            for (item, j), tok in zip(sampled, toks):
                d = drafts.setdefault(item.request_id, [])
                d.append(tok)
                k, block_ids = plan.drafts[item.request_id]
                if len(d) < k:   # the draft at the next position, with this one's output
                    pos = item.start_position + len(item.token_ids)
                    items.append(ScheduledRequest(item.request_id, [tok], pos, block_ids, sample=True,
                                                  prompt_logits=False))
                    rows.append(y[j:j + 1])
        return drafts

    def _run(self, items: list[ScheduledRequest], rows: list) -> tuple[object, list[int]]:
        """One MTP forward over items (rows: each one's hidden states): its output y and the row of
        each item's last token."""
        ops = self.ops
        ids, pos, meta = self.build_batch(SchedulerOutput(items))
        hidden = rows[0] if len(rows) == 1 else ops.xp.concatenate(rows)
        y = self.model.forward(ops.asarray(ids), hidden, ops.asarray(pos), ops.upload_meta(meta), self.kv_cache)
        return y, (meta.query_start[1:] - 1).tolist()


class MTPProposer:
    # its propose catches the MTP layer up on each step's positions, the last one with the step's own
    # token: so the engine resolves every step at once (a step left in flight would have to be caught
    # up on later, beside the next one's rows of the same request, into blocks freed meanwhile)
    resolves_every_step = True

    def __init__(self, drafter: MTPDrafter, num_speculative_tokens: int, reserve_slots, run=None):
        """reserve_slots(req, n) -> bool: room in the request's blocks for n tokens past its computed
        ones; run(plan) -> drafts: drafter.run, on every rank at tensor_parallel_size > 1."""
        self.drafter, self.k, self.reserve_slots = drafter, num_speculative_tokens, reserve_slots
        self.run = run or drafter.run
        # the steps since the last propose: (request, its scheduled item, the item's first row in their
        # hidden states, which the drafter holds)
        self._steps: list[tuple[Request, ScheduledRequest, int]] = []
        self._rows = 0

    def take_hidden(self, out: SchedulerOutput, hidden, reqs: list[Request]) -> None:
        """The target's step just run: its pre-norm hidden states [out.num_tokens, hidden], flat batch
        order, and the request of each scheduled item (read at the next propose, once the step's
        tokens are known)."""
        self.drafter.take(hidden)
        for r, item in zip(reqs, out.scheduled):
            self._steps.append((r, item, self._rows))
            self._rows += len(item.token_ids)

    def propose(self, reqs: list[Request], ks: list[int]) -> None:
        """Catches the MTP layer up on every position the last step computed and kept, and sets
        draft_token_ids of each request of reqs (all at the decode point), at most its k of ks."""
        if not self._steps:
            return
        ready = {r.request_id: k for r, k in zip(reqs, ks)}
        items, spans, room = [], [], {}
        for r, item, row in self._steps:
            # the positions whose next token is known (a rejected draft's is not); a request that
            # finished this step too, into the blocks it held, which may serve a prefix-cache hit
            start = item.start_position
            n = min(len(item.token_ids), r.num_tokens - 1 - start)
            if n <= 0:
                continue
            k = 0
            if r.request_id in ready and start + n == r.num_tokens - 1:
                k = min(self.k, ready[r.request_id], r.max_tokens - r.num_output_tokens - 1)
                k = k if k > 0 and self.reserve_slots(r, k) else 0
            # at position p: the token at p + 1, the hidden state at p
            items.append(ScheduledRequest(r.request_id, r.token_slice(start + 1, start + n + 1), start,
                                          item.block_ids, sample=k > 0, prompt_logits=False))
            spans.append((row, n))
            if k:
                room[r.request_id] = (r, k)
        self._steps, self._rows = [], 0
        drafts = self.run(MTPPlan(items, spans, {rid: (k, r.block_ids) for rid, (r, k) in room.items()}))
        for rid, d in drafts.items():
            room[rid][0].draft_token_ids = d
