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

from dataclasses import dataclass, replace

import torch
from torch import nn
from transformers import PretrainedConfig

from draftsmith.heads.base import register_drafter
from draftsmith.heads.blocks import DecoderBlock, rms_norm, seeded, text_config
from draftsmith.heads.eagle import FeatureRecurrentHead
from draftsmith.heads.trainable import StepsConfig
from draftsmith.heads.vocab import DraftVocabConfig, DraftVocabulary


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low, middle and high layers (2, N // 2, N - 3) in `hidden_states` indexing,
    clamped to 0 .. N for shallow targets."""
    return tuple(min(max(i, 0), num_layers) for i in (2, num_layers // 2, num_layers - 3))


@dataclass(kw_only=True)
class Eagle3Config(DraftVocabConfig, StepsConfig):
    """EAGLE-3 head hyper-parameters."""

    num_steps: int = 4
    """Training-time test depth: draft steps unrolled on the head's own outputs."""
    feature_layers: list[int] | None = None
    """Indices into the target's hidden_states (0 = embeddings) whose features are fused;
    None: EAGLE-3's low, middle and high layers (2, N // 2, N - 3)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.feature_layers is not None and not self.feature_layers:
            raise ValueError("feature_layers must name at least one layer (or be null)")


@register_drafter("eagle3")
class Eagle3Head(DraftVocabulary, FeatureRecurrentHead):
    """EAGLE-3 head with its own final norm and LM head, over the full target vocabulary
    (`draft_vocab_size` None) or a reduced one (`DraftVocabulary`)."""

    config_class = Eagle3Config

    def __init__(self, target_config: PretrainedConfig, config: Eagle3Config) -> None:
        super().__init__()
        text = text_config(target_config)
        layers = text.num_hidden_layers
        feature_layers = config.feature_layers or default_feature_layers(layers)
        if any(not -layers - 1 <= i <= layers for i in feature_layers):
            raise ValueError(
                f"feature_layers must index the target's hidden_states (0 .. {layers}), "
                f"got {list(feature_layers)}"
            )
        vocab, hidden = text.vocab_size, text.hidden_size
        self.init_draft_vocab(vocab, config.draft_vocab_size)
        self.target_feature_layers = tuple(i % (layers + 1) for i in feature_layers)
        # The layers as read, so the saved config does not depend on this version's defaults.
        self.config = replace(config, feature_layers=list(self.target_feature_layers))
        self.num_steps, self.hidden_size = config.num_steps, hidden
        with seeded(config.seed):
            self.fc = nn.Linear(len(self.target_feature_layers) * hidden, hidden, bias=False)
            self.hidden_norm, self.embed_norm = rms_norm(text), rms_norm(text)
            self.proj = nn.Linear(2 * hidden, hidden, bias=False)
            self.block = DecoderBlock(text)
            self.norm = rms_norm(text)
            self.lm_head = nn.Linear(hidden, config.draft_vocab_size or vocab, bias=False)
        self._target = None

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(features.to(self.fc.weight))

    def combine(self, hidden: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([self.hidden_norm(hidden), self.embed_norm(embeds)], dim=-1))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))
