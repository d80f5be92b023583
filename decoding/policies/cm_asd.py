"""`cm-asd`: confidence-modulated draft length from the draft's entropy and margin (Waghela, Sen
and Dasgupta 2025, "Confidence-Modulated Speculative Decoding", arXiv 2508.15371)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from draftsmith.decoding.policies.base import DraftPolicy
from draftsmith.heads.base import StopFn


@dataclass(kw_only=True)
class ConfidenceModulatedPolicy(DraftPolicy):
    """CM-ASD's drafting rule as implemented here. For the token just drafted, with draft
    distribution q over a vocabulary of V tokens, entropy H(q) and margin m = q_(1) - q_(2):

        c = alpha * (1 - H(q) / log V) + (1 - alpha) * m           (confidence in [0, 1])
        k = k_min + round((k_max - k_min) * c)                     (the length it allows)

    and drafting stops after position i (0-based) once i + 1 >= k: a confident draft is allowed
    long, an uncertain one short. k_max is `max_draft_tokens`. The paper modulates the draft
    length with normalised entropy and margin in this way; the combination and constants here
    are ours, from its description (its exact formula was not at hand).
    """

    name = "cm-asd"
    alpha: float = 0.5
    """Weight of the normalised entropy against the margin."""
    min_draft_tokens: int = 1
    """k_min: the shortest draft."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        if not 1 <= self.min_draft_tokens <= max(self.max_draft_tokens, 1):
            raise ValueError(
                f"min_draft_tokens must be in [1, max_draft_tokens], got {self.min_draft_tokens}"
            )

    def stop_fn(self) -> StopFn | None:
        def confidence_allows_no_more(position: int, signals: dict[str, float], _: float) -> bool:
            vocab = signals["vocab_size"]
            spread = signals["entropy"] / math.log(vocab) if vocab > 1 else 0.0
            confidence = self.alpha * (1.0 - spread) + (1 - self.alpha) * signals["margin"]
            span = self.max_draft_tokens - self.min_draft_tokens
            allowed = self.min_draft_tokens + round(span * min(max(confidence, 0.0), 1.0))
            return position + 1 >= allowed

        return self.token_stop_fn(confidence_allows_no_more)
