"""EAGLE-3: fused low/mid/high target features, training-time test, optional reduced vocabulary.

Per row t: fc(3H -> H) fuses the target's features of position t - 1 from three layers; the
fused feature and the embedding of the token at t, each RMS-normed, are concatenated (2H) and
projected to H, run through one decoder layer of the target's architecture, then the head's own
final norm and own LM head over the draft vocabulary. Training unrolls `num_steps` steps on the
head's own outputs (the training-time test, see `FeatureRecurrentHead`).

Layer input: the paper's layer takes the 2H concatenation straight into its attention
projections, with the fused feature as the residual. Here a 2H -> H projection comes first, so the
layer is the target architecture's standard decoder layer (built through transformers, with its
own rotary embedding and attention code) rather than a modified copy; its residual stream starts
at the projected input.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from transformers import PretrainedConfig

from draftsmith.heads.base import register_drafter
from draftsmith.heads.blocks import DecoderBlock, rms_norm, seeded, text_config
from draftsmith.heads.eagle import FeatureRecurrentHead


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low, middle and high layers (2, N // 2, N - 3) in `hidden_states` indexing,
    clamped to 0 .. N for shallow targets."""
    return tuple(min(max(i, 0), num_layers) for i in (2, num_layers // 2, num_layers - 3))


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
    t2d = torch.full((vocab,), -1, dtype=torch.long)
    t2d[d2t] = torch.arange(size)
    return d2t, t2d


@register_drafter("eagle3")
class Eagle3Head(FeatureRecurrentHead):
    """EAGLE-3 head. `draft_vocab_size` None drafts over the full target vocabulary; otherwise
    `d2t` / `t2d` buffers (saved with the weights) map the draft vocabulary, set from training
    data with `set_draft_vocab(*build_draft_vocab(counts, size))`."""

    def __init__(
        self,
        target_config: PretrainedConfig,
        *,
        feature_layers: Sequence[int] | None = None,
        num_steps: int = 4,
        draft_vocab_size: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        config = text_config(target_config)
        layers = config.num_hidden_layers
        if feature_layers is None:
            feature_layers = default_feature_layers(layers)
        if not feature_layers or any(not -layers - 1 <= i <= layers for i in feature_layers):
            raise ValueError(
                f"feature_layers must index the target's hidden_states (0 .. {layers}), "
                f"got {list(feature_layers)}"
            )
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        vocab, hidden = config.vocab_size, config.hidden_size
        if draft_vocab_size is not None and not 1 <= draft_vocab_size <= vocab:
            raise ValueError(f"draft_vocab_size must be in 1 .. {vocab}, got {draft_vocab_size}")
        self.target_feature_layers = tuple(i % (layers + 1) for i in feature_layers)
        self.num_steps, self.seed, self.hidden_size = num_steps, seed, hidden
        self.draft_vocab_size, self.vocab_size = draft_vocab_size, vocab
        with seeded(seed):
            self.fc = nn.Linear(len(self.target_feature_layers) * hidden, hidden, bias=False)
            self.hidden_norm, self.embed_norm = rms_norm(config), rms_norm(config)
            self.proj = nn.Linear(2 * hidden, hidden, bias=False)
            self.block = DecoderBlock(config)
            self.norm = rms_norm(config)
            self.lm_head = nn.Linear(hidden, draft_vocab_size or vocab, bias=False)
        if draft_vocab_size is not None:
            # A placeholder until set_draft_vocab: the first draft_vocab_size target ids.
            self.register_buffer("d2t", torch.arange(draft_vocab_size))
            t2d = torch.full((vocab,), -1, dtype=torch.long)
            t2d[:draft_vocab_size] = torch.arange(draft_vocab_size)
            self.register_buffer("t2d", t2d)
        self._target = None

    @classmethod
    def from_target_config(cls, target_config: PretrainedConfig, **hyper) -> Eagle3Head:
        return cls(target_config, **hyper)

    def hyper_parameters(self) -> dict:
        return {
            "feature_layers": list(self.target_feature_layers),
            "num_steps": self.num_steps,
            "draft_vocab_size": self.draft_vocab_size,
            "seed": self.seed,
        }

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

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(features.to(self.fc.weight))

    def combine(self, hidden: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([self.hidden_norm(hidden), self.embed_norm(embeds)], dim=-1))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))
