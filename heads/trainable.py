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
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from draftsmith.core.target import TargetBatch
from draftsmith.heads.base import Drafter, drafter_class
from draftsmith.heads.vocab import build_draft_vocab


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


def build_head(kind: str, target: PreTrainedModel, head_args: dict[str, Any]) -> DraftHead:
    """A freshly initialised head of `kind` sized for `target`, bound to its shared modules,
    in float32 (the master weights; `mixed_precision` autocasts the compute), whatever the
    precision of the target's config it was built from."""
    try:
        cls = drafter_class(kind)
    except KeyError as error:
        raise ValueError(str(error.args[0])) from None
    if not issubclass(cls, DraftHead):
        raise ValueError(f"drafter kind {kind!r} has nothing to train (it is not a DraftHead)")
    try:
        head = cls.from_target_config(target.config, **head_args)
    except TypeError as error:
        raise ValueError(f"head_args {head_args} do not fit head kind {kind!r}: {error}") from error
    head.bind_target(target)
    return head.float()


def fit_draft_vocab(
    head: DraftHead, input_ids: torch.Tensor, loss_mask: torch.Tensor, vocab_size: int
) -> None:
    """Give a head with a reduced vocabulary the tokens most frequent among the training
    targets (input_ids, loss_mask (N, T)); heads over the full vocabulary are left alone."""
    d2t = head.draft_to_target()
    if d2t is None:
        return
    if not hasattr(head, "set_draft_vocab"):
        raise TypeError(f"{type(head).__name__} has a reduced vocabulary but no set_draft_vocab")
    counts = torch.bincount(input_ids[loss_mask.bool()].long(), minlength=vocab_size)
    head.set_draft_vocab(*build_draft_vocab(counts, d2t.numel()))
