"""P-EAGLE (parallel EAGLE): EAGLE-3's layout drafting a whole block of K tokens in one forward.

The head is EAGLE-3's (`eagle3.py`: fc over the fused low/mid/high target features, one widened
decoder layer, its norm and LM head over an optional reduced vocabulary) plus two learned
stand-ins for what drafting does not know yet: `mask_hidden` (F,), in place of the target
features of the positions ahead, and `mask_embedding` (H,), in place of their tokens. After the
newest committed token n the block holds its row (n's token, the target feature of n - 1),
which predicts token n + 1, and K - 1 mask rows at positions n + 1 .. n + K - 1: mask row d
predicts token n + 1 + d, attending to every committed row and to the mask rows before it. So
one forward gives all K draft distributions, none of which depends on a drafted token.

Training scores every block depth at every position from one forward (`block_training_mask`):
row t of depth d stands for the block started after token t, so depth d at t predicts token
t + 1 + d, the `DraftHead` alignment convention of step d. speculators trains the same rows
(`models/peagle`), subsampling the deeper depths (COD sampling, each depth keeping a geometric
fraction of the one before) to save memory; in expectation that weights depth d by the kept
fraction, which the objective's `step_decay` gives when every row is kept, as here.

Layout and names follow speculators' `peagle` (vLLM loads it): `mask_hidden` is theirs; the
mask token is a row (`mask_token_id`) of their embedding table, which draftsmith shares with the
target, so the export writes `mask_embedding` into that row (`draftsmith.artifact.engines`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from draftsmith.core.target import TargetBatch
from draftsmith.heads.base import register_drafter
from draftsmith.heads.block_drafter import BlockDrafter
from draftsmith.heads.blocks import lag, seeded, text_config
from draftsmith.heads.eagle import unrolled_mask
from draftsmith.heads.eagle3 import Eagle3Config, Eagle3Head


@dataclass(kw_only=True)
class PEagleConfig(Eagle3Config):
    """P-EAGLE head hyper-parameters: EAGLE-3's, with K the block drafted in one forward."""

    num_steps: int = 4
    """K: tokens a block drafts in one forward (the newest token's row and K - 1 mask rows),
    every one of them trained in parallel."""
    mask_token_id: int | None = None
    """The token id whose embedding row an export writes the mask embedding into (speculators
    and vLLM look the mask token up in their embedding table): best an id that never occurs in
    text, such as an unused padding slot of the vocabulary; None: the target's last id."""


def block_training_mask(rows: int, depths: int) -> torch.Tensor:
    """(K T, K T) bool attention mask of a training block forward over T rows and K depths.

    Keys and queries are laid out depth by depth, T rows each. Row t of depth 0 sees depth 0's
    rows up to t (the committed context); row t of depth d > 0, the d-th mask row of the block
    started after token t, sees those too and its own row t of depths 1 .. d, never another
    block's rows.
    """
    width = depths * rows
    return torch.cat(
        [
            nn.functional.pad(unrolled_mask(rows, d), (0, width - (d + 1) * rows))
            for d in range(depths)
        ]
    )


@register_drafter("peagle")
class PEagleHead(Eagle3Head):
    """EAGLE-3's head plus the learned mask feature and mask token embedding; drafts a block
    of `num_steps` tokens in one forward (`BlockDrafter`)."""

    config_class = PEagleConfig

    def __init__(self, target_config: PretrainedConfig, config: PEagleConfig) -> None:
        super().__init__(target_config, config)
        text = text_config(target_config)
        if config.mask_token_id is not None and not 0 <= config.mask_token_id < text.vocab_size:
            raise ValueError(
                f"mask_token_id must be a token id of the target (0 .. {text.vocab_size - 1}), "
                f"got {config.mask_token_id}"
            )
        self.vocab_size = text.vocab_size
        width = len(self.target_feature_layers) * self.hidden_size
        std = getattr(text, "initializer_range", 0.02)
        with seeded(config.seed + 1):  # eagle3's modules keep the draws of config.seed
            self.mask_hidden = nn.Parameter(torch.randn(width))
            self.mask_embedding = nn.Parameter(torch.randn(self.hidden_size) * std)

    @property
    def mask_token_id(self) -> int:
        """The id an export writes the mask embedding at (`PEagleConfig.mask_token_id`)."""
        if self.config.mask_token_id is not None:
            return self.config.mask_token_id
        return self.vocab_size - 1

    @torch.no_grad()
    def fit_to_sample(self, sample: TargetBatch) -> None:
        """EAGLE-3's fc initialisation, and `mask_hidden` set to the sample's mean feature
        (B, T, F) -> (F,): the unknown feature starts as an average one, on the scale fc
        was fitted to."""
        super().fit_to_sample(sample)
        features = sample.features.float().flatten(0, -2)
        self.mask_hidden.copy_(features.mean(0).to(self.mask_hidden))

    def masked_rows(self, batch: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`rows` mask rows for each of `batch` sequences: their fused features and token
        embeddings, each (batch, rows, H)."""
        hidden = self.fuse(self.mask_hidden)
        embeds = self.mask_embedding.to(hidden.dtype)
        shape = (batch, rows, self.hidden_size)
        return hidden.expand(shape), embeds.expand(shape)

    def predict_features(self, batch: TargetBatch) -> list[torch.Tensor]:
        """Every depth of the block started after each position, in one forward: K predicted
        features (B, T, H), depth d at row t predicting token t + 1 + d."""
        if batch.features is None:
            raise ValueError(f"{self.kind} reads target features: batch.features is None")
        input_ids = batch.input_ids
        size, rows = input_ids.shape
        masked_hidden, masked_embeds = self.masked_rows(size, (self.num_steps - 1) * rows)
        hidden = torch.cat([self.fuse(lag(batch.features)), masked_hidden], dim=1)
        embeds = self.parts().embeddings(input_ids, self.dtype)
        embeds = torch.cat([embeds, masked_embeds.to(embeds.dtype)], dim=1)
        positions = torch.arange(rows, device=input_ids.device)
        positions = torch.cat([positions + d for d in range(self.num_steps)])
        mask = block_training_mask(rows, self.num_steps)
        out = self.run_layer(hidden, embeds, positions, mask)
        return list(out.split(rows, dim=1))

    def as_drafter(self, target: PreTrainedModel) -> BlockDrafter:
        self.bind_target(target)
        return BlockDrafter(self, text_config(target.config).vocab_size)
