"""`specdec++`: stop once the draft probably holds a rejected token (SpecDec++, Huang et al.
2024, arXiv 2405.19715)."""

from __future__ import annotations

from dataclasses import dataclass

from draftsmith.decoding.policies.base import DraftPolicy
from draftsmith.heads.base import StopFn


@dataclass(kw_only=True)
class SpecDecPlusPlusPolicy(DraftPolicy):
    """SpecDec++'s stopping rule: after drafting token i with acceptance probabilities a_1..a_i
    (calibrated when the artifact is, else raw top-1), stop when

        P(some drafted token is rejected) = 1 - prod_{j <= i} a_j  >  rejection_threshold.

    SpecDec++ trains an acceptance head for a_j; here a_j is whatever acceptance model the
    policy holds (the artifact's calibrator). Trees ignore it.
    """

    name = "specdec++"
    rejection_threshold: float = 0.7
    """Stop once the probability that the draft holds a rejected token exceeds this."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.rejection_threshold < 1.0:
            raise ValueError(
                f"rejection_threshold must be in (0, 1), got {self.rejection_threshold}"
            )

    def stop_fn(self) -> StopFn | None:
        survive = 1.0

        def probably_rejected(position: int, signals: dict[str, float], acceptance: float) -> bool:
            nonlocal survive
            survive *= acceptance
            return 1.0 - survive > self.rejection_threshold

        return self.token_stop_fn(probably_rejected)
