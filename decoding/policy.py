"""Draft-length policies: how many tokens to draft each round."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsmith.heads.base import StopFn


@dataclass(kw_only=True)
class DraftLengthPolicy:
    """Draft up to `max_tokens` per round and stop early once the draft loses confidence.

    The draft stops after a token when the product of the draft's top-1 probabilities along the
    draft (the chance, by the drafter's own account, that every token so far is accepted) falls
    below `min_path_confidence`: a further token would most likely be wasted draft work.
    """

    max_tokens: int = 8
    """Most tokens drafted per round (the target verifies max_tokens + 1 positions)."""
    min_path_confidence: float = 0.0
    """Stop drafting once the draft's cumulative top-1 probability falls below this (0: never)."""

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {self.max_tokens}")
        if not 0.0 <= self.min_path_confidence <= 1.0:
            raise ValueError(
                f"min_path_confidence must be in [0, 1], got {self.min_path_confidence}"
            )

    def stop_fn(self) -> StopFn | None:
        """A fresh stop callback for one round, or None when drafting never stops early."""
        if self.min_path_confidence <= 0.0:
            return None
        path = 1.0

        def stop(position: int, logits: torch.Tensor) -> bool:
            nonlocal path
            path *= float(logits.float().softmax(-1).max())
            return path < self.min_path_confidence

        return stop
