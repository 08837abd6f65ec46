"""What a request's draft tokens add to a decode step, relative to what a token of the step costs,
measured as the engine runs. Decode steps without drafts and verification steps are fitted apart,
each as a + b * rows (rows: every token of the forward, drafts included) by exponentially weighted
least squares: a verification is not a decode step with more rows (on the CPU its first draft row
costs about a whole step, the next ones far less), and on a GPU rows are nearly free. The proposer's
seconds per draft token count too (a draft model's forwards)."""
from __future__ import annotations

SPIKE = 10.0   # a step this many times off what the fit expects is not a step's cost (a compile, a capture)


class _Fit:
    """seconds = a + b * rows over moving averages of the steps seen (b: the last fitted, or the
    given slope while the rows seen barely differ)."""

    def __init__(self, decay: float, min_variance: float):
        self.decay, self.min_variance = decay, min_variance
        self.means = None   # of rows, seconds, rows^2, rows * seconds
        self.slope = None

    def add(self, rows: int, seconds: float) -> None:
        if self.means is not None:   # against both a flat and a proportional cost of the rows (GPU, CPU)
            mx, my = self.means[:2]
            flat, linear = my, my * rows / mx
            if seconds > SPIKE * max(flat, linear):
                return   # a kernel compile, a graph capture, a pause: not what such a step costs
            if seconds * SPIKE < min(flat, linear):
                self.means = self.slope = None   # the averages began on such a spike: start again
        x = (rows, seconds, rows * rows, rows * seconds)
        self.means = x if self.means is None else tuple(m + self.decay * (v - m) for m, v in zip(self.means, x))
        mx, my, mxx, mxy = self.means
        var = mxx - mx * mx
        if var >= self.min_variance:
            b = (mxy - mx * my) / var
            if b >= 0 and my - b * mx > 0:
                self.slope = b

    def seconds(self, rows: float, slope: float) -> float:
        """The fitted seconds of a step of rows rows (slope where none was fitted yet)."""
        mx, my = self.means[0], self.means[1]
        b = slope if self.slope is None else self.slope
        return max(my + b * (rows - mx), 0.0)


class StepCost:
    def __init__(self, decay: float = 0.05, prior_row_cost: float = 0.25, min_variance: float = 0.25):
        """decay: each step's weight in the moving averages; prior_row_cost: a row's cost relative to
        a one-row step until steps were seen (min_variance: the spread of rows that fits a slope)."""
        self.prior_row_cost = prior_row_cost
        self._plain, self._verify = _Fit(decay, min_variance), _Fit(decay, min_variance)
        self._draft = _Fit(decay, min_variance)   # proposal seconds over draft tokens

    def step(self, rows: int, num_draft: int, seconds: float) -> None:
        """A decode step (each request's one token and its drafts) of rows rows, num_draft of them
        drafts, took seconds."""
        (self._verify if num_draft else self._plain).add(rows, seconds)

    def proposed(self, num_tokens: int, seconds: float) -> None:
        """The proposer drafted num_tokens tokens in seconds."""
        if num_tokens:
            self._draft.add(num_tokens, seconds)

    def timed_plain(self) -> bool:
        """Whether a decode step without drafts was timed."""
        return self._plain.means is not None

    def extra(self, k: int, batch: int = 1) -> float:
        """What k drafts of one request add to a decode step of batch requests (rows and proposal),
        over what a token of that step costs; from the prior until steps of both kinds were seen."""
        if self._plain.means is None:
            return self.prior_row_cost * k
        mx, my = self._plain.means[:2]
        prior_slope = self.prior_row_cost * my / (1 + self.prior_row_cost * (mx - 1))
        plain, one_row = self._plain.seconds(batch, prior_slope), self._plain.seconds(1, prior_slope)
        if plain <= 0:
            return self.prior_row_cost * k
        if self._verify.means is None:
            rows = self.prior_row_cost * k * one_row
        else:
            # no slope fitted yet (drafts all of one length): a row costs at most what the mean draft row
            # of those steps did (on a GPU next to nothing), nor more than the prior's
            vx, vy = self._verify.means[:2]
            slope = min(max(vy - one_row, 0.0) / max(vx - 1, 1.0), self.prior_row_cost * one_row)
            rows = self._verify.seconds(batch + k, slope) - plain
        draft = 0.0
        if self._draft.means is not None:
            draft = self._draft.means[1] / self._draft.means[0] * k
        return max(rows + draft, 0.0) / (plain / batch)
