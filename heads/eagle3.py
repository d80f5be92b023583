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
from draftsmith.heads.vocab import DraftVocabulary


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low, middle and high layers (2, N // 2, N - 3) in `hidden_states` indexing,
    clamped to 0 .. N for shallow targets."""
    return tuple(min(max(i, 0), num_layers) for i in (2, num_layers // 2, num_layers - 3))


@register_drafter("eagle3")
class Eagle3Head(DraftVocabulary, FeatureRecurrentHead):
    """EAGLE-3 head with its own final norm and LM head, over the full target vocabulary
    (`draft_vocab_size` None) or a reduced one (`DraftVocabulary`)."""

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
        self.init_draft_vocab(vocab, draft_vocab_size)
        self.target_feature_layers = tuple(i % (layers + 1) for i in feature_layers)
        self.num_steps, self.seed, self.hidden_size = num_steps, seed, hidden
        with seeded(seed):
            self.fc = nn.Linear(len(self.target_feature_layers) * hidden, hidden, bias=False)
            self.hidden_norm, self.embed_norm = rms_norm(config), rms_norm(config)
            self.proj = nn.Linear(2 * hidden, hidden, bias=False)
            self.block = DecoderBlock(config)
            self.norm = rms_norm(config)
            self.lm_head = nn.Linear(hidden, draft_vocab_size or vocab, bias=False)
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

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(features.to(self.fc.weight))

    def combine(self, hidden: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([self.hidden_norm(hidden), self.embed_norm(embeds)], dim=-1))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))
