"""How many tokens a request drafts at its next step, from what its drafts earned so far and what
they cost (as vLLM's and SGLang's adaptive speculation do): drafts that keep failing cost a forward
over rows that give nothing, so a request whose drafts fail stops drafting instead of slowing down.

A request's acceptance at depth i is the chance that its i-th draft token is kept once those before
it were: a moving average over its verifications that tried that depth (a verification that kept j
of k drafts tried depths 1..j + 1, or all k). Kept drafts come in runs (a copied span is kept whole,
its first token is the gamble), so the depths are estimated apart, and a depth not tried yet keeps
the prior. k drafts then yield 1 + a1 + a1 a2 + ... + a1 ... ak tokens for a step that costs 1 + c(k)
plain steps (c(k): what the rows and the proposal of k drafts add, measured: StepCost); the request
drafts the k <= max_drafts that yields the most tokens per cost, or none where no k beats a plain
step. In a batch of n requests c(k) is relative to a token's share of the step, so drafts pay less
as the batch grows (in a compute-bound step, nothing).

The moving averages are slow (a verification weighs 0.1): a copied span's drafts fail now and then
between runs kept whole (SmolLM2 adding a docstring to a function kept 55% of 4 drafts a step, 1.2
times as fast as plain decoding on a CPU where a verification costs 2.6 steps), and a faster average
stopped such a request at its first misses in a row and cost it most of the gain.

A request that does not draft probes with as many drafts as would pay were they all kept (a probe
kept whole is what a copied span looks like): after probe_min steps, twice as many after each probe
that failed, up to probe_max; a probe that is kept is followed by another at once, so text that
starts repeating gets its drafts back at once (no probes where even drafts all kept would not pay:
a draft model as costly as the target).

Under async scheduling a request whose proposer found no drafts (n-gram drafts of text that does not
repeat) rests 1, 2, 4, then at most rest_max steps before it is proposed for again (found(): back to
no rest at the first drafts found): a step after which some request would draft must be resolved at
once, so asking at every step would keep every step synchronous for proposals that find nothing.

Only the number of drafts changes: what a request draws is what it draws without them."""
from __future__ import annotations

import weakref
from dataclasses import dataclass

from ..sched.request import Request
from .step_cost import StepCost


@dataclass
class _Drafting:
    acceptance: list[float]   # at each depth
    interval: int             # steps without drafts before the next probe
    idle: int = 0             # steps without drafts since the last verification
    probing: bool = False
    unmatched: int = 0        # proposals in a row that found no drafts
    rest: int = 0             # steps left before the proposer is asked again (after such proposals)


class AdaptiveDrafting:
    def __init__(self, max_drafts: int, cost: StepCost | None = None, decay: float = 0.1, prior: float = 0.8,
                 probe_min: int = 4, probe_max: int = 64, min_cost: float = 0.01, adaptive: bool = True,
                 rest_max: int = 8):
        """decay: a verification's weight in the moving averages; prior: the acceptance a request
        starts with at each depth; min_cost: the least cost of a draft token (drafts that keep
        nothing never pay); adaptive False: every request drafts max_drafts at every step; rest_max:
        the longest rest after proposals that found no drafts (found())."""
        self.max_drafts, self.cost, self.adaptive = max_drafts, cost or StepCost(), adaptive
        self.decay, self.prior, self.min_cost = decay, prior, min_cost
        self.probe_min, self.probe_max, self.rest_max = probe_min, probe_max, rest_max
        self._state: weakref.WeakKeyDictionary[Request, _Drafting] = weakref.WeakKeyDictionary()

    def _get(self, req: Request) -> _Drafting:
        st = self._state.get(req)
        if st is None:
            st = self._state[req] = _Drafting([self.prior] * self.max_drafts, self.probe_min)
        return st

    def best_drafts(self, acceptance: list[float], batch: int = 1) -> int:
        """The number of drafts that yields the most tokens per cost at these acceptances (one a
        depth), in a decode step of batch requests (0: none beats a plain step)."""
        best, best_gain, tokens, p = 0, 1.0, 1.0, 1.0
        for k, a in enumerate(acceptance[:self.max_drafts], 1):
            p *= a
            tokens += p
            gain = tokens / (1 + max(self.cost.extra(k, batch), self.min_cost * k))
            if gain > best_gain:
                best, best_gain = k, gain
        return best

    def num_drafts(self, req: Request, batch: int = 1) -> int:
        """How many tokens req drafts at this step (0: none), one of batch requests that could; called
        once a step it could draft at."""
        if not self.adaptive:
            return self.max_drafts
        if not self.cost.timed_plain():   # a decode step without drafts first, to weigh drafts against
            return 0
        st = self._get(req)
        if st.rest:
            st.rest -= 1
            return 0
        k = self.best_drafts(st.acceptance, batch)
        if k:
            return k
        probe = self.best_drafts([1.0] * self.max_drafts, batch)
        if not probe:   # drafts can never pay: no probe either
            return 0
        st.idle += 1
        st.probing = st.idle > st.interval
        return probe if st.probing else 0

    def found(self, req: Request, any_drafts: bool) -> None:
        """The proposer, asked for req's drafts under async scheduling, found some or none (then req
        rests before it is asked again, twice as long after each such proposal, up to rest_max)."""
        st = self._get(req)
        st.unmatched = 0 if any_drafts else st.unmatched + 1
        st.rest = min(1 << (st.unmatched - 1), self.rest_max) if st.unmatched else 0

    def record(self, req: Request, num_draft: int, num_kept: int) -> None:
        """A verification of num_draft drafts of req kept num_kept of them."""
        st = self._get(req)
        for depth in range(min(num_kept + 1, num_draft)):
            st.acceptance[depth] += self.decay * ((depth < num_kept) - st.acceptance[depth])
        if not st.probing:
            st.interval, st.idle = self.probe_min, 0
        elif num_kept:   # another probe at the next step (unless drafting pays again already)
            st.idle = st.interval
        else:
            st.interval, st.idle = min(2 * st.interval, self.probe_max), 0
        st.probing = False
