"""The draft-policy interface: what to draft each round, learned from each round's outcome."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from transformers import PreTrainedModel

from draftsmith.core.context import CONTEXT_SIGNAL
from draftsmith.core.signals import AcceptanceModel, confidence_signals, path_prob
from draftsmith.decoding.online import OnlineAcceptance, round_outcomes
from draftsmith.heads.base import (
    AcceptanceFn,
    Draft,
    RoundStopFn,
    StopFn,
    TreeShape,
    TreeStopFn,
)

StopRule = Callable[[int, dict[str, float], float], bool]
"""rule(position, signals, acceptance) -> True to end a chain after the token just drafted:
position is 0-based, signals that token's confidence signals as floats (`confidence_signals`
names; path_prob is the raw product of top-1 probabilities so far; plus `vocab_size`, the size of
the draft distribution's support: a reduced draft vocabulary's), acceptance its P(accept)."""


@dataclass(frozen=True)
class RequestSize:
    """How much a request asks of the decoder, as a policy weighs it when the request opens."""

    prompt_lengths: tuple[int, ...] = ()
    """Prompt tokens of each row (empty: not said)."""
    max_new_tokens: int = 0
    """Most tokens each row generates (0: not said)."""

    @property
    def prompt_tokens(self) -> int:
        return sum(self.prompt_lengths)


UNSIZED = RequestSize()


@dataclass
class RoundOutcome:
    """What one draft-and-verify round cost and gave, as a policy learns from it."""

    draft: Draft
    """The draft the target verified (after `DraftPolicy.trim`)."""
    accepted_path: list[int]
    """The draft nodes the target accepted, root first."""
    draft_s: float
    """Seconds spent drafting (0 for a plain step)."""
    round_s: float
    """Seconds of the whole round: drafting, the target forward, verification, both commits."""

    @property
    def committed(self) -> int:
        """Tokens the round committed: the accepted nodes plus the target's own next token."""
        return len(self.accepted_path) + 1


@dataclass(kw_only=True)
class DraftPolicy:
    """Chooses each round's draft and learns from its outcome.

    Each round the decoder asks for the draft `shape` (zero tokens: a plain decoding step), a
    `stop_fn` that may end a chain early, a `tree_stop_fn` that may end a tree's growth, an
    `acceptance_fn` that ranks tree nodes, then `trim`s
    the drafted tree before verification and reports the round to `observe_round` (every row's
    outcome at once when rows decode as a batch; the default `observe`s each). `start` opens a
    request. A subclass overrides what it decides; the base drafts `tree`, or a chain of
    `max_draft_tokens`, every round.
    """

    name: ClassVar[str]
    max_draft_tokens: int = 8
    """Most tokens drafted per round as a chain (the target verifies max_draft_tokens + 1)."""
    tree: TreeShape | None = None
    """Draft a tree of this shape instead of a chain (its nodes ranked by `acceptance_fn`)."""
    acceptance: AcceptanceModel | None = None
    """Calibrated P(accept) of a drafted token from its confidence signals (an artifact's fitted
    calibrator); None: the raw top-1 probability."""
    recalibrate: bool = True
    """Correct `acceptance` online from every verification (`OnlineAcceptance`, the offline fit
    as its prior), so the policy acts on the acceptance of the traffic it sees."""

    def __post_init__(self) -> None:
        if self.max_draft_tokens < 0:
            raise ValueError(f"max_draft_tokens must be >= 0, got {self.max_draft_tokens}")
        if self.recalibrate and not isinstance(self.acceptance, OnlineAcceptance):
            self.acceptance = OnlineAcceptance(self.acceptance)

    @property
    def largest(self) -> TreeShape:
        """The largest draft this policy proposes in one round."""
        return self.tree or TreeShape.chain(self.max_draft_tokens)

    def start(self, target: PreTrainedModel | None = None, size: RequestSize = UNSIZED) -> None:
        """A new request of `size` for `target` begins: a policy resets its per-request state
        here (and may measure what it needs of the target, once)."""

    def shape(self, rows: int = 1, lockstep: bool = False) -> TreeShape:
        """The draft shape of this round, which opens it, for `rows` rows decoding together (each
        drafts its own of this shape; `lockstep`: all in the same drafter forwards)."""
        return self.largest

    def stop_fn(self) -> StopFn | None:
        """A fresh stop callback for this round's chain, or None when drafting never stops early."""
        return None

    def tree_stop_fn(self) -> TreeStopFn | None:
        """A fresh callback that may end this round's tree before its full depth, or None when a
        tree always grows to its shape's depth."""
        return None

    def round_stop_fn(self) -> RoundStopFn | None:
        """A callback that may end a lockstep round's drafting for every row at once, or None."""
        return None

    def trim(self, draft: Draft) -> Draft:
        """The drafted tree as the target will verify it."""
        return draft

    def trim_round(self, drafts: Sequence[Draft]) -> list[Draft]:
        """Every row's drafted tree as the target will verify it, in row order: each `trim`med."""
        return [self.trim(draft) for draft in drafts]

    def observe(self, outcome: RoundOutcome) -> None:
        """Learn from a verified round: the online acceptance model sees what the target
        accepted (a subclass that learns more calls this too)."""
        draft = outcome.draft
        if (
            isinstance(self.acceptance, OnlineAcceptance)
            and len(draft)
            and draft.logits is not None
        ):
            self.acceptance.observe(*round_outcomes(draft, outcome.accepted_path))

    def observe_round(self, outcomes: Sequence[RoundOutcome]) -> None:
        """Learn from a verified round of one or more rows (one outcome each, in row order),
        verified together in one target forward: each is `observe`d, unless a policy that times
        rounds takes them together."""
        for outcome in outcomes:
            self.observe(outcome)

    def acceptance_prob(self, signals: dict[str, torch.Tensor]) -> torch.Tensor:
        """P(the target accepts each drafted token) (k,) from `confidence_signals` output."""
        if self.acceptance is None:
            return signals["top1_prob"]
        return self.acceptance.predict_signals(signals)

    def acceptance_fn(self) -> AcceptanceFn | None:
        """How a drafter ranks tree nodes: None (the raw draft probabilities) without a calibrated
        acceptance model; with one, its calibrated acceptance of each node's top-1 token."""
        if self.acceptance is None:
            return None
        return lambda signals: self.acceptance_prob(signals).float()

    def token_stop_fn(self, stop_after: StopRule) -> StopFn:
        """A chain stop callback from a rule over the signals of the token just drafted (with its
        position, the draft's raw path probability and its context match filled in) and its
        acceptance."""
        raw_path = 1.0

        def stop(position: int, logits: torch.Tensor, context_match: bool) -> bool:
            nonlocal raw_path
            signals = confidence_signals(logits[None])
            raw_path = path_prob(float(signals["top1_prob"][0]), raw_path)
            signals["position"] = torch.tensor([float(position)])
            signals["path_prob"] = torch.tensor([raw_path])
            signals[CONTEXT_SIGNAL] = torch.tensor([float(context_match)])
            token = {name: float(value[0]) for name, value in signals.items()}
            token["vocab_size"] = logits.shape[-1]
            return stop_after(position, token, float(self.acceptance_prob(signals)[0]))

        return stop
