"""The one interface every drafter implements, and the registry of drafter kinds.

The decoder never branches on a drafter's kind: it asks for a draft, verifies it with the target
and tells the drafter which tokens were committed, so the drafter can roll back its own state.

Target features lag one token behind the committed sequence: the target's hidden states exist
for every position it has run, and it has run every committed token except the newest one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from draftsmith.core.sampling import SamplingParams

StopFn = Callable[[int, torch.Tensor], bool]
"""stop(position, draft_logits (V,)) -> True to end the draft after the token just proposed."""


@dataclass
class Draft:
    """Proposed continuation of the committed sequence."""

    tokens: torch.Tensor
    """(k,) int64 proposed token ids, k >= 0."""
    probs: torch.Tensor | None = None
    """(k, V) draft distribution q each token was drawn from, after the same sampling processing
    as the target's. None means the tokens were chosen deterministically (one-hot q)."""
    logits: torch.Tensor | None = None
    """(k, V) raw draft logits, the source of confidence signals. None for drafters without a
    distribution (n-gram)."""

    def __len__(self) -> int:
        return int(self.tokens.numel())

    @classmethod
    def empty(cls) -> Draft:
        return cls(tokens=torch.empty(0, dtype=torch.long))


class Drafter(ABC):
    """Proposes tokens for a target model to verify."""

    vocab_size: int | None = None
    """Size of the token space the drafter proposes from; None if it only copies token ids."""
    target_feature_layers: tuple[int, ...] = ()
    """Indices into the target's `hidden_states` output that this drafter reads (empty: none)."""

    @abstractmethod
    def start(self, prompt_ids: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        """Begin a new sequence.

        prompt_ids (T,); target_features (T-1, F) for all prompt tokens but the last, or None.
        """

    @abstractmethod
    def propose(
        self,
        max_draft_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
        stop: StopFn | None = None,
    ) -> Draft:
        """Propose up to max_draft_tokens tokens after the committed sequence.

        Under sampling the tokens must be drawn from the returned `probs` (or be deterministic with
        `probs=None`), or the verification would not preserve the target's distribution.
        """

    @abstractmethod
    def commit(self, tokens: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        """Append tokens (n,) the target accepted (the accepted draft prefix plus the target's own
        next token) to the committed sequence and drop any state built on rejected tokens.

        target_features (n, F): the target's features for the previous newest token and the
        accepted draft tokens (one row per target position that was kept), or None.
        """


_REGISTRY: dict[str, type] = {}
Registered = TypeVar("Registered", bound=type)


def register_drafter(kind: str) -> Callable[[Registered], Registered]:
    """Class decorator: make a drafter kind buildable by name. The class is a `Drafter`, or a
    trainable `DraftHead` whose `as_drafter` gives one (the kinds an artifact can hold)."""

    def register(cls: Registered) -> Registered:
        if kind in _REGISTRY:
            raise ValueError(f"drafter kind {kind!r} is already registered by {_REGISTRY[kind]}")
        _REGISTRY[kind] = cls
        cls.kind = kind
        return cls

    return register


def drafter_class(kind: str) -> type:
    if kind not in _REGISTRY:
        raise KeyError(f"unknown drafter kind {kind!r}; known kinds: {sorted(_REGISTRY)}")
    return _REGISTRY[kind]


def drafter_kinds() -> list[str]:
    """Every registered kind, sorted."""
    return sorted(_REGISTRY)
