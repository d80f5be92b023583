"""Draft-length policies: how many tokens to draft each round."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsmith.core.signals import AcceptanceModel, confidence_signals
from draftsmith.heads.base import StopFn


@dataclass(kw_only=True)
class DraftLengthPolicy:
    """Draft up to `max_draft_tokens` per round and stop early once the draft loses confidence.

    After each drafted token the policy estimates how likely the target is to accept it (with
    `acceptance`, an artifact's fitted calibrator, when given; else the raw top-1 probability)
    and multiplies along the draft. The draft stops once that path probability, the chance that
    every token so far is accepted, falls below `min_path_confidence`: a further token would most
    likely be wasted draft work.
    """

    max_draft_tokens: int = 8
    """Most tokens drafted per round (the target verifies max_draft_tokens + 1 positions)."""
    min_path_confidence: float = 0.0
    """Stop drafting once the draft's cumulative acceptance probability falls below this
    (0: never stop early)."""
    acceptance: AcceptanceModel | None = None
    """Calibrated P(accept) of a drafted token from its confidence signals; None: raw top-1."""

    def __post_init__(self) -> None:
        if self.max_draft_tokens < 0:
            raise ValueError(f"max_draft_tokens must be >= 0, got {self.max_draft_tokens}")
        if not 0.0 <= self.min_path_confidence <= 1.0:
            raise ValueError(
                f"min_path_confidence must be in [0, 1], got {self.min_path_confidence}"
            )

    def acceptance_prob(self, signals: dict[str, torch.Tensor]) -> torch.Tensor:
        """P(the target accepts each drafted token) (k,) from `confidence_signals` output."""
        if self.acceptance is None:
            return signals["top1_prob"]
        return self.acceptance.predict_signals(signals)

    def stop_fn(self) -> StopFn | None:
        """A fresh stop callback for one round, or None when drafting never stops early."""
        if self.min_path_confidence <= 0.0:
            return None
        path = raw_path = 1.0

        def stop(position: int, logits: torch.Tensor) -> bool:
            nonlocal path, raw_path
            # The signals of this one token, placed at its position in the draft.
            signals = confidence_signals(logits[None])
            raw_path *= float(signals["top1_prob"][0])
            signals["position"] = torch.tensor([float(position)])
            signals["path_prob"] = torch.tensor([raw_path])
            path *= float(self.acceptance_prob(signals)[0])
            return path < self.min_path_confidence

        return stop
