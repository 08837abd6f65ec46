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
drafts below is written by those after)."""
from __future__ import annotations

from ..runner import FlatBatchBuilder
from ..sched.output import ScheduledRequest, SchedulerOutput
from ..sched.request import Request


class MTPProposer:
    def __init__(self, model, ops, num_blocks: int, block_size: int, kv_cache_dtype: str,
                 num_speculative_tokens: int, reserve_slots):
        """model: a DeepseekMTP; num_blocks: the target's pool (its pages have one more block, the
        runner's scratch block, so that a slot means the same in both); reserve_slots(req, n) ->
        bool: room in the request's blocks for n tokens past its computed ones."""
        c = model.config
        self.model, self.ops, self.k = model, ops, num_speculative_tokens
        self.reserve_slots = reserve_slots
        self.kv_cache = ops.empty_kv_cache(num_blocks + 1, block_size, model.layout.num_kv_heads, c.head_dim,
                                           kv_cache_dtype, values=False)
        self.build_batch = FlatBatchBuilder(block_size)
        # the last step's requests: (request, its scheduled item, the hidden states of the item's rows)
        self._steps: list[tuple[Request, ScheduledRequest, object]] = []

    def take_hidden(self, out: SchedulerOutput, hidden, reqs: list[Request]) -> None:
        """The target's step just run: its pre-norm hidden states [out.num_tokens, hidden], flat batch
        order, and the request of each scheduled item (read at the next propose, once the step's
        tokens are known)."""
        row = 0
        for r, item in zip(reqs, out.scheduled):
            n = len(item.token_ids)
            self._steps.append((r, item, hidden[row:row + n]))
            row += n

    def propose(self, reqs: list[Request], ks: list[int]) -> None:
        """Catches the MTP layer up on every position the last step computed and kept, and sets
        draft_token_ids of each request of reqs (all at the decode point), at most its k of ks."""
        ready = {r.request_id: k for r, k in zip(reqs, ks)}
        items, rows, room = [], [], {}
        for r, item, hidden in self._steps:
            # the positions whose next token is known (a rejected draft's is not); a request that
            # finished this step too, into the blocks it held, which may serve a prefix-cache hit
            start = item.start_position
            n = min(len(hidden), r.num_tokens - 1 - start)
            if n <= 0:
                continue
            k = 0
            if r.request_id in ready and start + n == r.num_tokens - 1:
                k = min(self.k, ready[r.request_id], r.max_tokens - r.num_output_tokens - 1)
                k = k if k > 0 and self.reserve_slots(r, k) else 0
            # at position p: the token at p + 1, the hidden state at p
            items.append(ScheduledRequest(r.request_id, r.token_slice(start + 1, start + n + 1), start,
                                          item.block_ids, sample=k > 0, prompt_logits=False))
            rows.append(hidden[:n])
            if k:
                room[r.request_id] = (r, k)
        self._steps = []
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
                r, k = room[item.request_id]
                if len(d) < k:   # the draft at the next position, with this one's output
                    pos = item.start_position + len(item.token_ids)
                    items.append(ScheduledRequest(item.request_id, [tok], pos, r.block_ids, sample=True,
                                                  prompt_logits=False))
                    rows.append(y[j:j + 1])
        for rid, d in drafts.items():
            room[rid][0].draft_token_ids = d

    def _run(self, items: list[ScheduledRequest], rows: list) -> tuple[object, list[int]]:
        """One MTP forward over items (rows: each one's hidden states): its output y and the row of
        each item's last token."""
        ops = self.ops
        ids, pos, meta = self.build_batch(SchedulerOutput(items))
        hidden = rows[0] if len(rows) == 1 else ops.xp.concatenate(rows)
        y = self.model.forward(ops.asarray(ids), hidden, ops.asarray(pos), ops.upload_meta(meta), self.kv_cache)
        return y, (meta.query_start[1:] - 1).tolist()
