"""What a round costs the cost-aware policy, learned from the rounds' timings: the target's
verification (its profiled curve, scaled to the rounds timed now, one token's cost apart), the
drafter's steps (per row, and for rows drafting in lockstep), and the drafter's reading of a
prompt. See docs/cost-aware-policy.md."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from draftsmith.decoding.profile import CostCurve

STEPS_TIMED = 9
"""Drafter steps whose median is a step's cost until rounds of several lengths fit it: a first
step's setting up of kernels does not stop the drafting that would time it again."""

TRUSTED_WIDER = 3
"""Rounds verifying more than one token timed before their own median sets the curve's scale
(until then every round's does): one alone may be slow for a reason that does not recur, such as
a first call's setting up of kernels for its shape."""


@dataclass
class RecentMedian:
    """Median of the last `size` values; None before the first. One slow round (a busy machine's
    hiccup, the first forward packing the weights) does not move it, so a cost it would overstate
    cannot stop the drafting that measures that cost again."""

    size: int
    value: float | None = field(default=None, init=False)
    """Set on each `add`: the planning reads it many times a drafted token."""
    _values: deque[float] = field(default_factory=deque, init=False)

    def add(self, x: float) -> None:
        self._values.append(x)
        if len(self._values) > self.size:
            self._values.popleft()
        self.value = statistics.median(self._values)


@dataclass
class DraftCost:
    """Seconds of drafting n steps (a chain's tokens, a tree's depths), fixed + per_step * n,
    fitted by least squares on moving averages of the rounds' (n, seconds): a round's fixed part
    (catching up on the tokens just committed) is not charged to each step. Until a round is
    fitted, and where every round drafted (nearly) one length so there is no slope to fit,
    per_step is the measured time between consecutive steps (`add_step`), so the very first
    round, whose drafting also holds the drafter's reading of the prompt, already stops drafting
    where more steps cost more than they are expected to give."""

    weight: float
    _moments: list[float] = field(default_factory=lambda: [0.0] * 5)  # n, s, n*n, n*s, count
    _step: RecentMedian = field(init=False)

    def __post_init__(self) -> None:
        self._step = RecentMedian(STEPS_TIMED)

    def add(self, n: int, seconds: float) -> None:
        keep = 1 - self.weight
        for i, x in enumerate((n, seconds, n * n, n * seconds, 1.0)):
            self._moments[i] = keep * self._moments[i] + self.weight * x

    def add_step(self, seconds: float) -> None:
        """One drafter step's seconds: from one drafted token of a chain (or depth of a tree) to
        the next."""
        self._step.add(seconds)

    def step_timer(self, clock: Callable[[], float]) -> Callable[[], None]:
        """A callback made for a round's drafting, called at each drafter step: from its second
        call on, the seconds on `clock` since the call before are a step's (`add_step`)."""
        last_at: float | None = None

        def step() -> None:
            nonlocal last_at
            now_at = clock()
            if last_at is not None:
                self.add_step(now_at - last_at)
            last_at = now_at

        return step

    @property
    def per_step(self) -> float:
        n, s, nn, ns, count = self._moments
        if count == 0 or n == 0:
            return self._step.value or 0.0
        n, s, nn, ns = n / count, s / count, nn / count, ns / count
        spread = nn - n * n
        if spread < 0.25:  # drafts of (nearly) one length: no slope to fit
            return s / n if self._step.value is None else min(self._step.value, s / n)
        return max((ns - n * s) / spread, 0.0)

    @property
    def fixed(self) -> float:
        n, s, _, _, count = self._moments
        return 0.0 if count == 0 else max((s - self.per_step * n) / count, 0.0)

    def seconds(self, steps: int) -> float:
        """Expected seconds of drafting `steps` steps."""
        return self.fixed + steps * self.per_step


@dataclass
class CostModel:
    """The seconds a round's parts take on this machine now.

    Verification: the profiled curve's shape (`curve`; one unit a forward without one), scaled
    to the rounds timed now. Once `TRUSTED_WIDER` rounds that verified two tokens or more are
    timed, the scale is the median of the last `timed_rounds` of those alone (before, of every
    round's), and a one-token round sets one token's own factor over that scale: a round that
    verifies one token costs what plain decoding would, which need not be what the curve, scaled
    on the wider rounds, says. Drafting: `drafting` for rows drafting one after another,
    `lockstep` for rows drafting together (one forward for every row a step). Reading: the
    drafter's seconds a prompt token, from requests' first drafted rounds."""

    curve: CostCurve | None
    """The target's profiled verification cost; None: every forward costs one unit."""
    smoothing: float
    """Weight of the newest round in the moving averages of the drafting cost."""
    timed_rounds: int
    """Rounds whose median sets the curve's scale (and the one-token factor's)."""
    drafting: DraftCost = field(init=False)
    """Seconds of a round's drafting by its steps over all rows, the rows drafting in turn."""
    lockstep: DraftCost = field(init=False)
    """Seconds of a lockstep round's drafting by its steps (one forward for every row a step)."""
    reading: RecentMedian = field(init=False)
    """Seconds the drafter takes to read a prompt token, from requests' first drafted rounds."""
    wider_timed: int = field(default=0, init=False)
    """Rounds timed that verified more than one token."""
    since_one_token: int = field(default=0, init=False)
    """Rounds since the last that verified one token."""
    since_wider: int = field(default=0, init=False)
    """Rounds since the last that verified more than one token."""
    _scale: RecentMedian = field(init=False)
    """Seconds of verification now per second of the profiled curve, on the rounds that verified
    two tokens or more."""
    _any_scale: RecentMedian = field(init=False)
    """The same on every round: the scale until `TRUSTED_WIDER` wider rounds are timed."""
    _one_token: RecentMedian = field(init=False)
    """A one-token round's seconds of verification per second of the scaled curve's."""
    _verify_s: dict[tuple[int, int], float] = field(default_factory=dict, init=False)
    """`round_verify_s` by (rows, n) until the next round is timed: a tree's planning asks for
    it thousands of times a round."""

    def __post_init__(self) -> None:
        self.drafting = DraftCost(self.smoothing)
        self.lockstep = DraftCost(self.smoothing)
        self._scale = RecentMedian(self.timed_rounds)
        self._any_scale = RecentMedian(self.timed_rounds)
        self._one_token = RecentMedian(self.timed_rounds)
        self.reading = RecentMedian(self.timed_rounds)

    def use_curve(self, curve: CostCurve) -> None:
        """Price verification on `curve` from now on (measured once the target is known)."""
        self.curve = curve
        self._verify_s.clear()

    def round_verify_s(self, n: int, rows: int) -> float:
        """Seconds of one target forward verifying n tokens in each of `rows` rows: the profiled
        curve's shape, scaled to the rounds timed now (the machine may be busier, or run other
        threads, than when it was profiled), and one token's by its own measured factor."""
        key = (rows, n)
        if key not in self._verify_s:
            if self.wider_timed >= TRUSTED_WIDER:
                scale = self._scale.value
                if n == 1 and self._one_token.value is not None:
                    scale *= self._one_token.value
            else:
                scale = 1.0 if self._any_scale.value is None else self._any_scale.value
            self._verify_s[key] = self._curve(*key) * scale
        return self._verify_s[key]

    def time_verification(self, seconds: float, rows: int, width: int) -> None:
        """Learn from a round whose verification (all but its drafting) took `seconds` for
        `width` tokens in each of `rows` rows: the curve's scale from two tokens or more, the
        one-token factor over it from one (every round's scale too, the scale until
        `TRUSTED_WIDER` wider rounds are timed)."""
        self.since_one_token += 1
        self.since_wider += 1
        self._verify_s.clear()
        scale = seconds / self._curve(rows, width)
        self._any_scale.add(scale)
        if width == 1:
            self.since_one_token = 0
            if self.wider_timed >= TRUSTED_WIDER:
                self._one_token.add(scale / self._scale.value)
            return
        self.since_wider = 0
        self._scale.add(scale)
        self.wider_timed += 1

    def one_token_unmeasured(self, refresh_rounds: int) -> bool:
        """Whether the next round must be a plain step to measure the one-token cost: rounds that
        verified more have set the curve's scale, and none of the last `refresh_rounds` rounds (or
        none at all) verified one token."""
        return (
            self.curve is not None
            and self.wider_timed >= TRUSTED_WIDER
            and (self._one_token.value is None or self.since_one_token >= refresh_rounds)
        )

    def draft_cost(self, lockstep: bool) -> DraftCost:
        """The drafting cost of rows drafting in lockstep, or one after another."""
        return self.lockstep if lockstep else self.drafting

    def time_reading(self, draft_s: float, steps: int, lockstep: bool, prompt_tokens: int) -> None:
        """Learn the drafter's seconds a prompt token from a request's first drafted round: its
        `draft_s` of drafting `steps` steps, less what drafting them alone is expected to take,
        went to reading the `prompt_tokens`."""
        drafting_s = self.draft_cost(lockstep).seconds(steps)
        self.reading.add(max(draft_s - drafting_s, 0.0) / prompt_tokens)

    def _curve(self, rows: int, n: int) -> float:
        """The profiled cost of verifying n tokens in each of `rows` rows; one unit each without
        a curve."""
        return 1.0 if self.curve is None else self.curve.batch_cost(rows, n)
