"""Medusa: K independent residual heads on the target's last hidden state, one per future token.

Head k applied to the hidden state of position t predicts the token at t + 1 + k through the
target's own LM head, so head 0 predicts what the target itself predicts there. At draft time the
newest committed token (position n) has no target feature yet, so heads 1 .. K-1 read the feature
of position n - 1 and propose the tokens at n + 1 .. n + K - 1; head 0 would re-predict token n,
which the target already gave.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from draftsmith.core import int4_rows
from draftsmith.core.target import TargetBatch
from draftsmith.heads.base import Draft, Drafter, DraftRequest, register_drafter
from draftsmith.heads.blocks import (
    SharesTargetParts,
    TargetParts,
    int4_target_lm_head,
    seeded,
    text_config,
)
from draftsmith.heads.state import DraftBuilder, LaggedFeatures, to_target_vocab
from draftsmith.heads.trainable import DraftHead, StepsConfig
from draftsmith.heads.tree import combine_depths
from draftsmith.heads.vocab import DraftVocabConfig, DraftVocabulary


class ResBlock(nn.Module):
    """x + SiLU(Linear(x)), starting as the identity (zero weight), as in Medusa."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., H) -> (..., H)."""
        return x + nn.functional.silu(self.linear(x))


@dataclass(kw_only=True)
class MedusaConfig(DraftVocabConfig, StepsConfig):
    """Medusa head hyper-parameters."""

    num_steps: int = 5
    """K residual heads, head k predicting the token k + 1 ahead; head 0 re-predicts the
    target's own token, so a draft holds up to K - 1 tokens."""

    def __post_init__(self) -> None:
        if self.num_steps < 2:
            raise ValueError(
                f"num_steps must be at least 2 (head 0 only repeats the target's token), "
                f"got {self.num_steps}"
            )


@register_drafter("medusa")
class MedusaHead(DraftVocabulary, SharesTargetParts, DraftHead):
    """K residual heads sharing the target's LM head (its rows of the draft vocabulary when
    `draft_vocab_size` is set: see `DraftVocabulary`).

    The target's `hidden_states[N]` is already the output of its final norm (transformers ties
    the last hidden state to it), so the shared final norm is part of the feature and each head's
    output goes straight to the shared LM head: an untrained head predicts the target's own next
    token.
    """

    config_class = MedusaConfig
    drafts_on_target_lm_head = True
    first_drafted_step = 1  # head 0 re-predicts the target's own next token

    def __init__(self, target_config: PretrainedConfig, config: MedusaConfig) -> None:
        super().__init__()
        text = text_config(target_config)
        self.init_draft_vocab(text.vocab_size, config.draft_vocab_size)
        self.config, self.num_steps = config, config.num_steps
        self.target_feature_layers = (text.num_hidden_layers,)
        with seeded(config.seed):
            self.heads = nn.ModuleList(ResBlock(text.hidden_size) for _ in range(self.num_steps))
        self._target: TargetParts | None = None

    def head_logits(self, features: torch.Tensor, k: int) -> torch.Tensor:
        """features (B, T, H) -> head k's logits (B, T, V_d) of the token at t + 1 + k."""
        return self.heads_logits(features, range(k, k + 1))[..., 0, :]

    def heads_logits(self, features: torch.Tensor, heads: range) -> torch.Tensor:
        """features (B, T, H) -> the logits (B, T, len(heads), V_d) of heads `heads`, their
        outputs through the shared LM head in one call: drafting reads its weight once for every
        head, not once a head."""
        weight = self.heads[0].linear.weight
        hidden = torch.stack([self.heads[k](features.to(weight)) for k in heads], dim=-2)
        return self.parts().logits(hidden, vocab=self.draft_to_target())

    def forward_train(self, batch: TargetBatch) -> list[torch.Tensor]:
        if batch.features is None:
            raise ValueError("Medusa reads the target's last hidden state: batch.features is None")
        return [self.head_logits(batch.features, k) for k in range(self.num_steps)]

    def as_drafter(self, target: PreTrainedModel) -> MedusaDrafter:
        self.bind_target(target)
        return MedusaDrafter(self, text_config(target.config).vocab_size)


class MedusaDrafter(Drafter):
    """Proposes up to K - 1 tokens deep per round from the feature before the newest token: a
    chain of each head's choice, or a tree of each head's top-k. Its only state is that feature,
    so a rejection needs no rollback."""

    def __init__(self, head: MedusaHead, vocab_size: int, int4: bool | None = None) -> None:
        self.head = head.eval()
        self._lm_head = int4_target_lm_head(head, int4)
        self.int4 = self._lm_head is not None
        """Whether it drafts on a 4-bit copy of the target's LM head (`int4_target_lm_head`)."""
        self.vocab_size = vocab_size
        self.target_feature_layers = head.target_feature_layers
        self._d2t = head.draft_to_target()
        self._features = LaggedFeatures(head.heads[0].linear.in_features)

    def start(self, prompt_ids: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        self._features.start(target_features, prompt_ids.numel())
        self._features.release(len(self._features) - 1)  # only the newest row is ever read

    def fork(self) -> MedusaDrafter:
        return MedusaDrafter(self.head, self.vocab_size, self.int4)

    @torch.inference_mode()
    def draft(self, request: DraftRequest) -> Draft:
        newest = len(self._features) - 1
        depth = min(request.shape.depth, self.head.num_steps - 1)
        # No feature to read yet (a one-token prompt), or a plain step.
        if newest == 0 or depth == 0:
            return Draft.empty()
        feature = self._features.rows(newest, newest + 1)[None]  # (1, 1, H): position n - 1
        # Row k - 1: head k's guess at the token k ahead of the newest one. All heads at once:
        # K rows through the LM head cost little more than one.
        with int4_rows.int4_rows(self._lm_head, self.int4):
            logits = self.head.heads_logits(feature, range(1, depth + 1))[0, -1].float()
        depth_logits = list(to_target_vocab(logits, self._d2t, self.vocab_size))
        if not request.shape.is_chain:
            return combine_depths(request, depth_logits)
        builder = DraftBuilder(request, depth)
        for step_logits in depth_logits:
            builder.add(step_logits)
            if builder.done:
                break
        return builder.draft()

    def commit(self, tokens: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        self._features.append(target_features, tokens.numel())
        self._features.release(len(self._features) - 1)
