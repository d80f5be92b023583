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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from draftsmith.core.config import ConfigError, config_from_dict
from draftsmith.core.target import TargetBatch
from draftsmith.heads.base import Drafter, drafter_class
from draftsmith.heads.vocab import build_draft_vocab


@dataclass(kw_only=True)
class HeadConfig:
    """Hyper-parameters of a trainable head: with the target's config they fix the fresh head,
    its initial weights included."""

    seed: int = 0
    """Seeds the head's initialisation (the same config always gives the same fresh weights)."""


@dataclass(kw_only=True)
class StepsConfig(HeadConfig):
    """A head trained to predict several tokens ahead of each position."""

    num_steps: int = 1
    """K: future tokens the head predicts per position (its training steps)."""

    def __post_init__(self) -> None:
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be at least 1, got {self.num_steps}")


class DraftHead(nn.Module, ABC):
    """A trainable drafter built from the target's config; exported as a draftsmith artifact.

    A kind declares its typed hyper-parameters as `config_class` and is built as
    `cls(target_config, config)` (see `build_head`). The initialisation is a function of the two
    alone (kinds seed it), so `load_drafter` can tell weights that were never trained.
    """

    kind: str
    """Registered drafter kind (also the `drafter` field of the artifact's config.json)."""
    config_class: ClassVar[type[HeadConfig]]
    """The kind's typed config: recipes' `head_args` and the artifact's `head` are read into it."""
    config: HeadConfig
    """The config this head was built with, defaults that depend on the target filled in, so
    `cls(target_config, head.config)` builds the same fresh head."""
    target_feature_layers: tuple[int, ...] = ()
    """Indices into the target's `hidden_states` output (0 = embeddings, N = last layer)."""
    num_steps: int = 1
    """K: how many future tokens `forward_train` predicts per position."""
    first_drafted_step: int = 0
    """The step of `forward_train` that makes the drafter's first token: a draft after position
    n reads row n - s and steps s .. K-1 (s = this). 0 for heads whose row t reads the feature
    of t - 1; Medusa's row t reads the feature of t itself, so its step 0 re-predicts the token
    the target's verification already gives, and drafting starts at step 1."""

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

    @property
    def state_size(self) -> int | None:
        """Width H of the hidden states behind each step's logits (`forward_states`), which a
        learned acceptance head reads; None: the kind exposes none."""
        return None

    def forward_states(self, batch: TargetBatch) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """`forward_train`'s K step logits and the K hidden states (B, T, H) they are computed
        from; a ValueError for kinds that expose none (`state_size` None)."""
        raise ValueError(
            f"{self.kind} heads expose no hidden states behind their logits, which a learned "
            "acceptance head reads: train one on an eagle, eagle3, peagle or dflash head"
        )

    def own_acceptance(self) -> nn.Module | None:
        """A learned acceptance head trained as part of the head (DSpark's confidence head), in
        `AcceptanceHead`'s protocol, reading the states `forward_states` returns and the drafter
        exposes; None: the kind has none."""
        return None

    def fit_to_sample(self, sample: TargetBatch) -> None:
        """Set what a kind fits to data once, before training (EAGLE-3's fc initialisation),
        from a sample of the training rows with their target features (heads that read target
        features only). Default: nothing."""

    def auxiliary_loss(self) -> torch.Tensor | None:
        """A kind's own extra loss term from the latest `forward_train` (already weighted, e.g.
        EAGLE's feature regression), for the trainer to add to the objective; None: no term."""
        return None

    def draft_to_target(self) -> torch.Tensor | None:
        """(V_draft,) int64 map from draft-vocabulary ids to target ids, or None when the head
        predicts over the full target vocabulary."""
        return None

    def check_tokenizer(self, tokenizer: PreTrainedTokenizerBase) -> None:
        """Raise a ValueError naming the fix when the head does not draft in the ids of
        `tokenizer` (the target's). Default: nothing to check (a head built from the target's
        config predicts over its vocabulary)."""

    def is_rebuilt(self, name: str) -> bool:
        """Whether state-dict entry `name` comes back when the head is built and bound (from
        the target, or from a base model the config names and fingerprints), so the artifact
        leaves it out. Default: no entry does."""
        return False

    def for_artifact(self) -> DraftHead:
        """The head as its artifact keeps it (a LoRA draft model may merge its adapters);
        default: the head itself."""
        return self


def head_class(kind: str) -> type[DraftHead]:
    """The trainable head registered as `kind` (ValueError: unknown, or nothing to train)."""
    cls = drafter_class(kind)
    if not issubclass(cls, DraftHead):
        raise ValueError(f"drafter kind {kind!r} has nothing to train (it is not a DraftHead)")
    return cls


def head_config(
    kind: str, args: Mapping[str, Any] | HeadConfig, where: str = "head_args"
) -> HeadConfig:
    """`args` as the typed config of head `kind`. A mapping is checked against the config's
    fields: an unknown key or a bad value is a `ConfigError` naming it (`where` prefixes the
    key, e.g. head_args.num_steps) and listing the valid keys."""
    cls = head_class(kind).config_class
    if isinstance(args, Mapping):
        return config_from_dict(cls, args, where)
    if not isinstance(args, cls):
        raise ConfigError(
            f"{where} of a {kind} head must be a {cls.__name__} or a mapping of its keys, "
            f"got a {type(args).__name__}"
        )
    return args


def build_head(
    kind: str, target: PreTrainedModel, head_args: Mapping[str, Any] | HeadConfig
) -> DraftHead:
    """A freshly initialised head of `kind` sized for `target`, bound to its shared modules,
    in float32 (the master weights; `mixed_precision` autocasts the compute), whatever the
    precision of the target's config it was built from. head_args: the kind's typed config or
    a mapping of its keys."""
    head = head_class(kind)(target.config, head_config(kind, head_args))
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
