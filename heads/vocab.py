"""A reduced draft vocabulary: a head predicts only the most frequent target tokens.

Drafting and training cost of a head is often its output layer (49,152 tokens for SmolLM2, 151k
for Qwen): predicting over the few thousand tokens that make up nearly all of the training
targets cuts it several-fold. `d2t` / `t2d` map draft ids to target ids and back; the decoder
puts q = 0 on the tokens outside (`heads.state.to_target_vocab`), so verification stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def build_draft_vocab(token_counts: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `size` most frequent target tokens as the draft vocabulary.

    token_counts (V,): how often each target token occurs in the training data (ties go to the
    lower id). Returns d2t (size,) int64, the target id of each draft id (ascending), and t2d (V,)
    int64, the draft id of each target id or -1 outside the draft vocabulary.
    """
    counts = torch.as_tensor(token_counts).flatten()
    vocab = counts.numel()
    if not 1 <= size <= vocab:
        raise ValueError(f"draft vocabulary size must be in 1 .. {vocab}, got {size}")
    kept = torch.sort(counts.double(), descending=True, stable=True).indices[:size]
    d2t = kept.sort().values.long()
    return d2t, target_to_draft(d2t, vocab)


def target_to_draft(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """t2d (V,) int64 from d2t (V_d,): the draft id of each target id, -1 outside."""
    t2d = torch.full((vocab_size,), -1, dtype=torch.long)
    t2d[d2t.long()] = torch.arange(d2t.numel())
    return t2d


@dataclass(kw_only=True)
class DraftVocabConfig:
    """Config mixin of the heads that may draft over a reduced vocabulary."""

    draft_vocab_size: int | None = None
    """Draft over this many target tokens, the most frequent training targets; None: over the
    target's whole vocabulary."""


class DraftVocabulary:
    """Mixin for `DraftHead`s that may draft over a reduced vocabulary.

    With `draft_vocab_size` set, `d2t` / `t2d` buffers (saved with the weights) hold the map,
    installed from training data with `set_draft_vocab(*build_draft_vocab(counts, size))`.
    """

    draft_vocab_size: int | None = None
    d2t: torch.Tensor
    t2d: torch.Tensor

    def init_draft_vocab(self, vocab_size: int, draft_vocab_size: int | None) -> None:
        """Call from __init__: None drafts over all vocab_size target tokens."""
        if draft_vocab_size is not None and not 1 <= draft_vocab_size <= vocab_size:
            raise ValueError(
                f"draft_vocab_size must be in 1 .. {vocab_size}, got {draft_vocab_size}"
            )
        self.draft_vocab_size = draft_vocab_size
        if draft_vocab_size is None:
            return
        # A placeholder until set_draft_vocab: the first draft_vocab_size target ids.
        self.register_buffer("d2t", torch.arange(draft_vocab_size))
        self.register_buffer("t2d", target_to_draft(self.d2t, vocab_size))

    def set_draft_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        """Install a draft vocabulary from `build_draft_vocab`."""
        if self.draft_vocab_size is None:
            raise ValueError("this head drafts over the full vocabulary (draft_vocab_size=None)")
        d2t, t2d = torch.as_tensor(d2t).long(), torch.as_tensor(t2d).long()
        if d2t.shape != self.d2t.shape or t2d.shape != self.t2d.shape:
            raise ValueError(
                f"expected d2t {tuple(self.d2t.shape)} and t2d {tuple(self.t2d.shape)}, "
                f"got {tuple(d2t.shape)} and {tuple(t2d.shape)}"
            )
        if not torch.equal(t2d[d2t], torch.arange(d2t.numel())):
            raise ValueError("d2t and t2d are not inverse maps (build them with build_draft_vocab)")
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def draft_to_target(self) -> torch.Tensor | None:
        return None if self.draft_vocab_size is None else self.d2t
