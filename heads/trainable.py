"""The training-side contract of every learned drafter head.

The trainer never branches on a head's kind: it runs the frozen target, hands each head the
target features it asked for, and scores the head's per-step logits against the target's own
distributions with one objective (`draftsmith.train.objectives`). Kinds differ in what their
`forward_train` does with those inputs.

Alignment convention (all kinds): `forward_train` returns K tensors of logits; step k (0-based)
at position t predicts the token at position t + 1 + k, so it is scored against the target's
logits at position t + k (which predict that same token). Positions whose label falls outside
the sequence are ignored by the objective.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from draftsmith.heads.base import Drafter


@dataclass
class TargetBatch:
    """What the frozen target provides for one training batch."""

    input_ids: torch.Tensor
    """(B, T) int64 token ids."""
    loss_mask: torch.Tensor
    """(B, T) bool/0-1: positions whose next-token prediction is trained on."""
    features: torch.Tensor | None
    """(B, T, F) the target hidden states the head reads (its `target_feature_layers`,
    concatenated along the last dim), or None for heads that read none (draft models)."""
    target_logits: torch.Tensor
    """(B, T, V) the target's next-token logits at every position."""


def next_token_mask(loss_mask: torch.Tensor) -> torch.Tensor:
    """Data mask -> `TargetBatch.loss_mask`.

    loss_mask (B, T): 1 where the token at t is a training target (the data pipeline's
    convention). Returns (B, T) bool: True where the prediction made *at* t (of token t + 1)
    is trained on; the last position predicts past the row and is False.
    """
    shifted = torch.zeros_like(loss_mask, dtype=torch.bool)
    shifted[:, :-1] = loss_mask[:, 1:].bool()
    return shifted


@torch.no_grad()
def target_forward(
    target: PreTrainedModel, input_ids: torch.Tensor, layers: tuple[int, ...]
) -> tuple[torch.Tensor | None, torch.Tensor, tuple[torch.Tensor, ...]]:
    """One frozen forward of the target.

    input_ids (B, T). Returns features (B, T, len(layers) * H) (None without layers), logits
    (B, T, V), and all hidden states (N + 1 tensors (B, T, H); empty without layers).
    """
    out = target(input_ids=input_ids, output_hidden_states=bool(layers), use_cache=False)
    hidden = tuple(out.hidden_states) if layers else ()
    features = torch.cat([hidden[i] for i in layers], dim=-1) if layers else None
    return features, out.logits, hidden


@torch.no_grad()
def target_batch(
    target: PreTrainedModel,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    layers: tuple[int, ...],
) -> TargetBatch:
    """The `TargetBatch` of rows input_ids (B, T) with data mask loss_mask (B, T) (the data
    pipeline's convention, see `next_token_mask`): one frozen forward of the target."""
    features, logits, _ = target_forward(target, input_ids, layers)
    return TargetBatch(
        input_ids=input_ids,
        loss_mask=next_token_mask(loss_mask).to(input_ids.device),
        features=features,
        target_logits=logits,
    )


class DraftHead(nn.Module, ABC):
    """A trainable drafter built from the target's config; exported as a draftsmith artifact."""

    kind: str
    """Registered drafter kind (also the `drafter` field of the artifact's config.json)."""
    target_feature_layers: tuple[int, ...] = ()
    """Indices into the target's `hidden_states` output (0 = embeddings, N = last layer)."""
    num_steps: int = 1
    """K: how many future tokens `forward_train` predicts per position."""
    first_drafted_step: int = 0
    """The step of `forward_train` that makes the drafter's first token: a draft after position
    n reads row n - s and steps s .. K-1 (s = this). 0 for heads whose row t reads the feature
    of t - 1; Medusa's row t reads the feature of t itself, so its step 0 re-predicts the token
    the target's verification already gives, and drafting starts at step 1."""

    @classmethod
    @abstractmethod
    def from_target_config(cls, target_config: PretrainedConfig, **hyper) -> DraftHead:
        """Build a freshly initialised head sized for the target.

        The initialisation is a function of (target config, hyper) alone (kinds seed it, with a
        `seed` hyper-parameter), so `load_drafter` can tell weights that were never trained."""

    @abstractmethod
    def hyper_parameters(self) -> dict:
        """JSON-serialisable keyword arguments that rebuild this head via from_target_config."""

    @abstractmethod
    def bind_target(self, target: PreTrainedModel) -> None:
        """Attach the target's frozen modules the head shares (embeddings, LM head). They are not
        part of the head's own parameters and are never saved in its artifact.

        A fresh head may also initialise its own weights from the target's here (a distilled
        draft model copies target layers), so load saved weights after binding, never before."""

    @abstractmethod
    def forward_train(self, batch: TargetBatch) -> list[torch.Tensor]:
        """K logits tensors, each (B, T, V) (V may be the reduced draft vocabulary; see
        `draft_to_target`), step k at position t predicting token t + 1 + k."""

    @abstractmethod
    def as_drafter(self, target: PreTrainedModel) -> Drafter:
        """The inference-side `Drafter` running this head next to `target`."""

    def auxiliary_loss(self) -> torch.Tensor | None:
        """A kind's own extra loss term from the latest `forward_train` (already weighted, e.g.
        EAGLE's feature regression), for the trainer to add to the objective; None: no term."""
        return None

    def draft_to_target(self) -> torch.Tensor | None:
        """(V_draft,) int64 map from draft-vocabulary ids to target ids, or None when the head
        predicts over the full target vocabulary."""
        return None
