"""The adaptive drafting policy's decisions (spec/adaptive.py), without a model: how many drafts an
acceptance is worth at a given cost, a request whose drafts keep failing stopping and probing ever
more rarely (with every draft: a probe kept brings the request back at once), one whose drafts copy
text with a few misses drafting throughout, and the cost of a row fitted from step times."""
import itertools

import pytest

from pocketcupy.sched.request import Request
from pocketcupy.spec.adaptive import AdaptiveDrafting
from pocketcupy.spec.step_cost import StepCost


def policy(row_cost: float, max_drafts: int = 4) -> AdaptiveDrafting:
    """Drafts costing row_cost a row (the prior's, after one decode step timed)."""
    cost = StepCost(prior_row_cost=row_cost)
    cost.step(1, 0, 0.010)
    return AdaptiveDrafting(max_drafts, cost)


@pytest.mark.parametrize("acceptance, row_cost, want", [
    ([0.0] * 4, 0.01, 0),               # nothing kept: even nearly free rows do not pay
    ([0.3] * 4, 0.45, 0),               # 1.3 tokens for 1.45 steps
    ([0.6] * 4, 0.45, 1),               # a CPU: rows cost half a step
    ([0.6, 0.9, 0.9, 0.9], 0.45, 2),    # drafts kept in runs: the later ones are safer bets
    ([0.3, 0.9, 0.9, 0.9], 0.45, 0),
    ([0.6] * 4, 0.02, 4),               # a GPU: rows nearly free
    ([1.0] * 4, 0.45, 4),
])
def test_drafts_worth_their_cost(acceptance, row_cost, want):
    assert policy(row_cost).best_drafts(acceptance) == want


def test_drafts_pay_less_in_a_larger_batch():
    p = AdaptiveDrafting(4, StepCost())
    for n in range(1, 9):          # 10 ms a step and 1 ms a row, drafts or not
        p.cost.step(n, 0, 0.010 + 0.001 * n)
        p.cost.step(n + 2, 2, 0.012 + 0.001 * n)
    assert p.cost.extra(2, 1) == pytest.approx(2 / 11) and p.cost.extra(2, 10) == pytest.approx(2 / 2)
    assert [p.best_drafts([0.7] * 4, n) for n in (1, 10, 40)] == [4, 1, 0]


def steps(p: AdaptiveDrafting, req: Request, n: int, kept) -> list[int]:
    """The drafts of each of n steps, each verification keeping kept(k) of its k drafts."""
    out = []
    for _ in range(n):
        k = p.num_drafts(req)
        if k:
            p.record(req, k, kept(k))
        out.append(k)
    return out


def test_failing_drafts_stop_and_probe_ever_more_rarely():
    p, r = policy(0.45), Request("a", [1], 400)
    got = steps(p, r, 300, lambda k: 0)
    drafted = [i for i, k in enumerate(got) if k]
    assert [got[i] for i in drafted] == [2, 2, 2, 1, 1, 1] + [4] * (len(drafted) - 6)   # the prior's, then probes
    assert [b - a for a, b in zip(drafted[5:], drafted[6:])] == [5, 9, 17, 33, 65, 65, 65]
    # DraftBackoff (at most 16 steps paused) verified 4 drafts every 17 steps: 72 drafts here
    assert sum(got) == 37


def test_proposals_that_find_nothing_rest_ever_longer():
    """Under async scheduling, each proposal that found no drafts: 1, 2, 4, then 8 steps without asking
    (the request's drafts, when asked, unchanged); the first drafts found end the rests."""
    p, r = policy(0.02), Request("a", [1], 400)
    asked = []
    for step in range(40):
        k = p.num_drafts(r)
        if k:
            asked.append(step)
            p.found(r, step >= 30)
    assert asked == [0, 2, 5, 10, 19, 28, 37, 38, 39]   # found from step 30 on: asked at 37, then every step


def test_probes_kept_bring_the_drafts_back():
    p, r = policy(0.45), Request("a", [1], 400)
    steps(p, r, 40, lambda k: 0)
    assert p.num_drafts(r) == 0
    got = steps(p, r, 40, lambda k: k)              # the text starts repeating: every draft kept
    first = next(i for i, k in enumerate(got) if k)
    assert first <= 32 and got[first:first + 3] == [4, 4, 4] and all(got[first:]) and got[-1] >= 3
    p, r = policy(0.45), Request("b", [1], 400)
    assert steps(p, r, 8, lambda k: k) == [2] * 6 + [3] * 2   # a new request: from the prior up


def test_probes_kept_by_chance_do_not_reset_the_pause():
    p, r = policy(0.45), Request("a", [1], 400)
    steps(p, r, 100, lambda k: 0)
    outcomes = itertools.cycle([1, 0, 0])
    got = steps(p, r, 400, lambda k: next(outcomes))   # a third of the probes kept
    drafted = [i for i, k in enumerate(got) if k]
    assert [b - a for a, b in zip(drafted, drafted[1:])] == [1, 65, 65, 1, 65, 65, 1, 65]   # a kept one: one more
    assert {got[i] for i in drafted} == {4}


def test_copying_with_a_few_misses_drafts_throughout():
    """n-gram drafts of SmolLM2 adding a docstring to a function (greedy), at this CPU's costs (a first
    draft row costs more than a step, each next one an eighth): the misses come between runs kept
    whole, and drafting every step ran 1.2 times as fast as plain decoding. (With a moving average of
    weight 0.2 and one-draft probes the request stopped after the third miss in four and came back
    slowly: 1.04 times.)"""
    cost = StepCost()
    for _ in range(10):
        cost.step(1, 0, 0.049)
        cost.step(2, 1, 0.107)
        cost.step(5, 4, 0.132)
    p, r = AdaptiveDrafting(4, cost), Request("a", [1], 400)
    kept = [4, 0, 4, 4, 4, 4, 0, 4, 4, 0, 4, 4, 0, 3, 0, 0, 1, 3, 0, 1, 0, 2, 4, 0, 4, 3]
    got = []
    for j in kept:
        got.append(p.num_drafts(r))
        p.record(r, got[-1], min(j, got[-1]))
    assert got == [4] * len(kept)


def test_costs_fitted_from_step_times():
    c = StepCost(decay=0.5)
    assert c.extra(2) == 0.5                 # the prior's 0.25 a row until steps were seen
    for _ in range(20):
        c.step(1, 0, 0.010)
        c.step(2, 1, 0.020)                  # a CPU: the first draft row costs a whole step,
        c.step(5, 4, 0.023)                  # each next one a tenth
    assert c.extra(1) == pytest.approx(1.0) and c.extra(4) == pytest.approx(1.3)
    p = AdaptiveDrafting(4, c)
    assert p.best_drafts([0.6, 0.9, 0.9, 0.9]) == 4 and p.best_drafts([0.3, 0.9, 0.9, 0.9]) == 0
    c.proposed(4, 0.010)                     # a draft model: 2.5 ms a draft token, a quarter of a step
    assert c.extra(4) == pytest.approx(2.3)


def test_rows_nearly_free_when_drafts_were_all_of_one_length():
    """A GPU whose verifications all had 4 rows, 9% dearer than a one-row step: a fifth row is
    extrapolated at the mean draft row's cost, not the prior's quarter of a step, so the fourth draft
    pays (with the prior's slope it looked dearer than it yields, and requests drafted 3)."""
    c = StepCost()
    for _ in range(10):
        c.step(1, 0, 0.010)
        c.step(4, 3, 0.0109)
    assert c.extra(4) == pytest.approx(0.12)
    assert AdaptiveDrafting(4, c).best_drafts([0.8] * 4) == 4


def test_spikes_are_not_step_costs():
    """A verification that compiled its kernels (seconds, not milliseconds) neither makes drafts look
    dear for the hundreds of steps a moving average takes to forget it, nor, when it came first, stays
    the baseline: the fit skips a step ten times off what it expects, and starts again from a step ten
    times below what it began with."""
    def gpu(first_verify: float | None) -> StepCost:
        c = StepCost()
        if first_verify is not None:
            c.step(4, 3, first_verify)
        for _ in range(10):
            c.step(1, 0, 0.010)
            c.step(4, 3, 0.0109)
        return c

    calm = gpu(None).extra(3)
    assert gpu(3.0).extra(3) == pytest.approx(calm)
    spiked = gpu(None)
    spiked.step(4, 3, 2.5)                  # a compile later on
    assert spiked.extra(3) == pytest.approx(calm)
