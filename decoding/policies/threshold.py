"""`threshold`: stop a chain once the draft's calibrated path confidence falls below a bound."""

from __future__ import annotations

from dataclasses import dataclass

from draftsmith.decoding.policies.base import DraftPolicy
from draftsmith.heads.base import StopFn


@dataclass(kw_only=True)
class ThresholdPolicy(DraftPolicy):
    """Draft up to `max_draft_tokens` and stop once the draft loses confidence.

    After each drafted token the policy estimates how likely the target is to accept it (the
    calibrated acceptance, else the raw top-1 probability) and multiplies along the draft. The
    draft stops once that path probability, the chance that every token so far is accepted,
    falls below `min_path_confidence`: a further token would most likely be wasted draft work.
    Trees ignore it (their size is set by their shape).
    """

    name = "threshold"
    min_path_confidence: float = 0.4
    """Stop drafting once the draft's cumulative acceptance probability falls below this."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.min_path_confidence <= 1.0:
            raise ValueError(
                f"min_path_confidence must be in [0, 1], got {self.min_path_confidence}"
            )

    def stop_fn(self) -> StopFn | None:
        if self.min_path_confidence <= 0.0:
            return None
        path = 1.0

        def below_bound(position: int, signals: dict[str, float], acceptance: float) -> bool:
            nonlocal path
            path *= acceptance
            return path < self.min_path_confidence

        return self.token_stop_fn(below_bound)
