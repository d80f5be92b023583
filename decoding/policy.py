"""Draft-length policies: how large a draft (chain or tree) to propose each round."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from draftsmith.core.signals import AcceptanceModel, confidence_signals
from draftsmith.decoding.profile import CostCurve, best_budget
from draftsmith.heads.base import AcceptanceFn, Draft, StopFn, TreeShape


@dataclass(kw_only=True)
class DraftLengthPolicy:
    """Draft up to `max_draft_tokens` per round and stop early once the draft loses confidence.

    After each drafted token the policy estimates how likely the target is to accept it (with
    `acceptance`, an artifact's fitted calibrator, when given; else the raw top-1 probability)
    and multiplies along the draft. The draft stops once that path probability, the chance that
    every token so far is accepted, falls below `min_path_confidence`: a further token would most
    likely be wasted draft work.
    """

    max_draft_tokens: int = 8
    """Most tokens drafted per round (the target verifies max_draft_tokens + 1 positions)."""
    min_path_confidence: float = 0.0
    """Stop drafting once the draft's cumulative acceptance probability falls below this
    (0: never stop early)."""
    acceptance: AcceptanceModel | None = None
    """Calibrated P(accept) of a drafted token from its confidence signals; None: raw top-1."""
    tree: TreeShape | None = None
    """Draft a tree of this shape (its nodes ranked by `acceptance_fn`); None: a chain of
    `max_draft_tokens`."""
    cost: CostCurve | None = None
    """The target's measured verification cost (`draftsmith profile`). When given, `tree` is the
    largest tree drafted, and each round's tree is cut to the number n of its most valuable
    nodes that maximises expected accepted tokens per second (`best_budget`); the next round
    grows a tree of up to 2n nodes' worth (at least one), so drafting costs no more than the
    verification it feeds."""
    _budget: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_draft_tokens < 0:
            raise ValueError(f"max_draft_tokens must be >= 0, got {self.max_draft_tokens}")
        if not 0.0 <= self.min_path_confidence <= 1.0:
            raise ValueError(
                f"min_path_confidence must be in [0, 1], got {self.min_path_confidence}"
            )

    def shape(self) -> TreeShape:
        """The draft shape of one round."""
        shape = self.tree or TreeShape.chain(self.max_draft_tokens)
        if self.cost is None or self._budget is None:
            return shape
        top_k, depth = min(shape.top_k, self._budget), min(shape.depth, self._budget)
        return TreeShape(top_k=top_k, depth=depth, total_tokens=shape.total_tokens)

    def trim(self, draft: Draft) -> Draft:
        """draft cut to the size the cost curve favours (unchanged without a curve, or for a
        draft without node values); sets the next round's budget."""
        if self.cost is None or draft.values is None or len(draft) == 0:
            return draft
        expected = draft.values.sort(descending=True).values.cumsum(0).tolist()
        size = best_budget(self.cost, expected)
        largest = (self.tree or TreeShape.chain(self.max_draft_tokens)).max_tokens
        self._budget = min(2 * max(size, 1), largest)
        return draft.pruned(size)

    def acceptance_fn(self) -> AcceptanceFn | None:
        """How a drafter ranks tree nodes: None (the raw draft probabilities) without a calibrated
        acceptance model. With one, a node's calibrated acceptance is that of its distribution's
        top-1 token, shared among the candidate tokens in proportion to their draft
        probabilities (so the top-1 token gets it exactly)."""
        if self.acceptance is None:
            return None

        def calibrated(logits: torch.Tensor, depth: torch.Tensor, path_prob: torch.Tensor):
            signals = confidence_signals(logits)
            signals["position"] = depth.float()
            signals["path_prob"] = path_prob.float()
            top1 = self.acceptance.predict_signals(signals).float()
            probs = logits.float().softmax(-1)
            return probs * (top1 / signals["top1_prob"].clamp_min(1e-12))[:, None]

        return calibrated

    def acceptance_prob(self, signals: dict[str, torch.Tensor]) -> torch.Tensor:
        """P(the target accepts each drafted token) (k,) from `confidence_signals` output."""
        if self.acceptance is None:
            return signals["top1_prob"]
        return self.acceptance.predict_signals(signals)

    def stop_fn(self) -> StopFn | None:
        """A fresh stop callback for one round, or None when drafting never stops early."""
        if self.min_path_confidence <= 0.0:
            return None
        path = raw_path = 1.0

        def stop(position: int, logits: torch.Tensor) -> bool:
            nonlocal path, raw_path
            # The signals of this one token, placed at its position in the draft.
            signals = confidence_signals(logits[None])
            raw_path *= float(signals["top1_prob"][0])
            signals["position"] = torch.tensor([float(position)])
            signals["path_prob"] = torch.tensor([raw_path])
            path *= float(self.acceptance_prob(signals)[0])
            return path < self.min_path_confidence

        return stop
