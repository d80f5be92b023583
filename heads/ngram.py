"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of the suffix."""

from __future__ import annotations

import torch

from draftsmith.core.sampling import SamplingParams
from draftsmith.heads.base import Draft, Drafter, StopFn, register_drafter


@register_drafter("ngram")
class NgramDrafter(Drafter):
    """Training-free drafter that copies from the prompt and the output so far.

    It matches the longest suffix of the committed sequence (up to `max_ngram` tokens, at least
    `min_ngram`) that occurred earlier and proposes what came after its most recent occurrence.
    Its proposals are deterministic, so the verifier treats q as one-hot.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._committed: list[int] = []

    def start(self, prompt_ids: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        self._committed = prompt_ids.tolist()

    def propose(
        self,
        max_draft_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
        stop: StopFn | None = None,
    ) -> Draft:
        seq = self._committed
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            suffix = seq[-n:]
            # Most recent earlier occurrence whose continuation is not the suffix itself.
            for start in range(len(seq) - n - 1, -1, -1):
                if seq[start : start + n] == suffix:
                    follow = seq[start + n : start + n + max_draft_tokens]
                    return Draft(tokens=torch.tensor(follow, dtype=torch.long))
        return Draft.empty()

    def commit(self, tokens: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        self._committed.extend(tokens.tolist())
