"""`adaedl`: stop when an entropy-based lower bound on acceptance falls below an adaptive
threshold (AdaEDL, Agrawal et al. 2024, arXiv 2410.18351)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from transformers import PreTrainedModel

from draftsmith.decoding.policies.base import UNSIZED, DraftPolicy, RequestSize, RoundOutcome
from draftsmith.heads.base import StopFn


@dataclass(kw_only=True)
class AdaEDLPolicy(DraftPolicy):
    """AdaEDL's stop rule, which needs no calibration: the draft's entropy H (nats) of the token
    just drafted bounds its acceptance from below,

        P(accept) >= 1 - sqrt(gamma * H),

    and drafting stops once that bound falls below lambda. lambda adapts to the realised
    acceptance rate r of the recent rounds (an exponential moving average, weight `ema`):
    lambda <- lambda + step * (target_acceptance - r), clipped to [0, 1]: when tokens are
    rejected more than the target rate, drafting stops sooner. The update of lambda is ours
    (the paper adapts it from the acceptance rate; the constants here are not the paper's).
    """

    name = "adaedl"
    gamma: float = 0.5
    """Scale of the entropy bound."""
    initial_threshold: float = 0.3
    """lambda before any round was seen."""
    target_acceptance: float = 0.6
    """The acceptance rate lambda steers towards."""
    step: float = 0.1
    """How far one round moves lambda."""
    ema: float = 0.9
    """Weight of the past in the acceptance rate's moving average."""
    threshold: float = field(init=False)
    _rate: float = field(init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("gamma", "step"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("initial_threshold", "target_acceptance", "ema"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        self.start()

    def start(self, target: PreTrainedModel | None = None, size: RequestSize = UNSIZED) -> None:
        self.threshold = self.initial_threshold
        self._rate = self.target_acceptance

    def stop_fn(self) -> StopFn | None:
        def bound_below_threshold(position: int, signals: dict[str, float], _: float) -> bool:
            bound = 1.0 - math.sqrt(self.gamma * max(signals["entropy"], 0.0))
            return bound < self.threshold

        return self.token_stop_fn(bound_below_threshold)

    def observe(self, outcome: RoundOutcome) -> None:
        super().observe(outcome)
        drafted = len(outcome.draft)
        if drafted == 0:
            return
        rate = len(outcome.accepted_path) / drafted
        self._rate = self.ema * self._rate + (1 - self.ema) * rate
        moved = self.threshold + self.step * (self.target_acceptance - self._rate)
        self.threshold = min(max(moved, 0.0), 1.0)
