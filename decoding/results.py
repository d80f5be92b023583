"""What decoding gives back: each request's tokens and statistics, and each round's record for
observers (calibration collection)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from draftsmith.core.sampling import SamplingParams
from draftsmith.heads.base import Draft


@dataclass
class GenerationStats:
    target_forwards: int = 0
    """Target forward passes after the prompt prefill (one per round)."""
    drafted: int = 0
    """Draft tokens proposed (tree nodes)."""
    accepted: int = 0
    """Draft tokens the target accepted."""
    new_tokens: int = 0
    mean_accepted_length: float = 0.0
    """Tokens produced per target forward pass (tau); 1.0 is plain decoding."""
    acceptance_by_position: list[float] = field(default_factory=list)
    """Fraction of drafts reaching depth i + 1 whose accepted path reached it too."""
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    tokens_per_s: float = 0.0

    def record_round(self, draft: Draft, n_accepted: int) -> None:
        self.target_forwards += 1
        self.drafted += len(draft)
        self.accepted += n_accepted
        depth = int(draft.depths.max()) if len(draft) else 0
        grow = depth - len(self.drafted_by_position)
        if grow > 0:
            self.drafted_by_position.extend([0] * grow)
            self.accepted_by_position.extend([0] * grow)
        for i in range(depth):
            self.drafted_by_position[i] += 1
            self.accepted_by_position[i] += i < n_accepted

    def finish(self, new_tokens: int, wall_s: float) -> None:
        self.new_tokens = new_tokens
        self.wall_s = wall_s
        self.tokens_per_s = new_tokens / wall_s if wall_s > 0 else 0.0
        self.mean_accepted_length = new_tokens / max(self.target_forwards, 1)
        self.acceptance_by_position = [
            a / d for a, d in zip(self.accepted_by_position, self.drafted_by_position, strict=True)
        ]

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RoundRecord:
    """What one draft-and-verify round saw, for observers (calibration data collection)."""

    draft: Draft
    target_logits: torch.Tensor
    """(k+1, V) float32 target logits: row 0 after the newest committed token, row 1 + i after
    draft node i."""
    accepted_path: list[int]
    """The draft nodes the target accepted, root first."""
    sampling: SamplingParams
    row: int = 0
    """The prompt's index in its batch."""

    @property
    def n_accepted(self) -> int:
        return len(self.accepted_path)


RoundHook = Callable[[RoundRecord], None]

CommitHook = Callable[[int, list[int]], None]
"""on_commit(row, tokens): the tokens row `row` (its prompt's index in the batch) committed in a
round, final (after any cut), in order; every output token is handed over once."""


@dataclass
class GenerationResult:
    tokens: list[int]
    """The generated token ids (prompt excluded)."""
    text: str | None
    """The decoded generated text, when the decoder has a tokenizer."""
    stats: GenerationStats
    lossy: bool = False
    """True when a lossy verifier produced it: the tokens may differ from the target's own."""
