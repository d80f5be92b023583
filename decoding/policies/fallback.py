"""When the cost-aware policy stops speculating, and when it probes again: the running verdict
on speculation against plain decoding, the plain stretches it buys, and the gate that decodes a
request plainly where the drafter's reading of its prompt would not pay. See
docs/cost-aware-policy.md."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

GAIN_ROUNDS = 32
"""Judged rounds whose expected gain over plain decoding sets what speculation is worth a token
when a request begins."""


@dataclass
class Fallback:
    """The verdict on speculation, kept in seconds against plain decoding.

    Each judged round adds what it lost (its seconds less plain decoding's for the tokens it
    committed) to a sum that restarts at zero whenever speculation is ahead, and the same for
    what its plan expected it to commit; once either passes its patience (in plain steps'
    worth) speculation falls back. A plain stretch follows, its length doubling with each probe
    that loses (up to `max_backoff`) and at least long enough that what the probe lost is
    `probe_budget` of it."""

    patience: float
    """Plain decoding steps' worth of seconds that speculation may lose, net, before falling
    back."""
    expected_patience: float
    """The same for what speculation is expected to lose, net, by the plans of its rounds."""
    first_backoff: int
    """Plain rounds after speculation first loses."""
    max_backoff: int
    """Longest plain stretch the doubling reaches (a probe that lost more buys a longer one)."""
    probe_budget: float
    """Most share of plain decoding's time that losing probes may cost."""
    measured_rounds: int
    """Judged rounds needed before their expected gain can decode a request plainly."""
    plain_left: int = field(default=0, init=False)
    """Rounds of the plain stretch still to decode (0: speculating)."""
    spec_lost_s: float = field(default=0.0, init=False)
    """Net seconds the speculative rounds of this probe (or request) lost against plain
    decoding, the drafter's catching up included."""
    _backoff: int = field(default=0, init=False)
    _deficit_s: float = field(default=0.0, init=False)
    """Seconds speculation has lost against plain decoding since it last drew level (the
    drafter's catching up left out)."""
    _expected_deficit_s: float = field(default=0.0, init=False)
    """Seconds speculation is expected to have lost since it last drew level by those plans."""
    _gains: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=GAIN_ROUNDS), init=False
    )
    """Per judged round of the last `GAIN_ROUNDS`: seconds its plan expected to gain over plain
    decoding, and the tokens it expected to commit."""

    def __post_init__(self) -> None:
        self._backoff = self.first_backoff

    @property
    def speculating(self) -> bool:
        return self.plain_left == 0

    def plain_round(self) -> bool:
        """Whether the round just observed was one of the plain stretch (then counted off)."""
        if self.plain_left > 0:
            self.plain_left -= 1
            return True
        return False

    def judge(
        self, lost_s: float, expected_lost_s: float, expected: float, plain_round_s: float
    ) -> bool:
        """Weigh a judged round that lost `lost_s` against plain decoding (`plain_round_s` a
        round) and whose plan expected to lose `expected_lost_s` for `expected` tokens: whether
        speculation has now lost more than its patience and must fall back."""
        self._gains.append((-expected_lost_s, expected))
        self._deficit_s = max(self._deficit_s + lost_s, 0.0)
        self._expected_deficit_s = max(self._expected_deficit_s + expected_lost_s, 0.0)
        return not (
            self._deficit_s <= self.patience * plain_round_s
            and self._expected_deficit_s <= self.expected_patience * plain_round_s
        )

    def fall_back(self, plain_round_s: float, at_least: int = 0) -> int:
        """Start a plain stretch (at least `at_least` rounds) and restart the verdict: the
        stretch's length, paid for by what the probe lost (`spec_lost_s`, read before)."""
        if self.spec_lost_s <= 0:  # it paid until now: the workload changed, not the drafter
            self._backoff = self.first_backoff
        paid_for = math.ceil(self.spec_lost_s / (self.probe_budget * plain_round_s))
        self.plain_left = max(self._backoff, paid_for, at_least)
        self._backoff = min(2 * self._backoff, self.max_backoff)
        self.restart()
        return self.plain_left

    def restart(self) -> None:
        """Forget how speculation went: a new request, or a new probe."""
        self._deficit_s = 0.0
        self._expected_deficit_s = 0.0
        self.spec_lost_s = 0.0

    def forget_gains(self) -> None:
        """The gains' verdict on a request is spent: the request after its plain stretch
        probes."""
        self._gains.clear()

    def reading_pays(self, prompt_tokens: int, new_tokens: int, reading_s: float | None) -> bool:
        """Whether speculation is expected to gain, over `new_tokens` (every row's), more than the
        drafter's reading of `prompt_tokens` at `reading_s` a token costs, at the gain the last
        judged rounds' plans expected a token. Without both measured (`measured_rounds` judged
        rounds at least), or without the request's size, it is taken to pay."""
        measured = len(self._gains) >= self.measured_rounds and reading_s is not None
        if not (measured and prompt_tokens and new_tokens):
            return True
        gain_s = sum(g for g, _ in self._gains) / max(sum(n for _, n in self._gains), 1e-9)
        return gain_s * new_tokens > reading_s * prompt_tokens
