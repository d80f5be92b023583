"""The learned acceptance head's objective: binary cross-entropy of its P(accept) against
teacher-forced acceptance (`draftsmith.heads.acceptance.chain_outcomes`), on the drafter's
detached hidden states and the draft's confidence signals, so the drafter trains as it would
without it."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from draftsmith.core.config import ConfigError
from draftsmith.core.target import TargetBatch
from draftsmith.heads import DraftHead
from draftsmith.heads.acceptance import (
    AcceptanceHead,
    AcceptanceHeadConfig,
    chain_outcomes,
    chain_signals,
)

__all__ = ["ACCEPTANCE_SUMS", "acceptance_objective", "build_acceptance_head"]

ACCEPTANCE_SUMS = ("bce", "steps", "accepted", "predicted", "correct")
"""What `acceptance_objective` sums over the counted draft steps: the binary cross-entropy, the
steps, the accepted ones, the predicted P(accept), the predictions right at 0.5."""


def build_acceptance_head(head: DraftHead, config: AcceptanceHeadConfig) -> AcceptanceHead:
    """A fresh acceptance head reading `head`'s hidden states (float32 master weights)."""
    if head.state_size is None:
        raise ConfigError(
            f"acceptance_head: {head.kind} heads expose no hidden states behind their logits, "
            "which the acceptance head reads: use an eagle, eagle3, peagle or dflash head, or drop "
            "acceptance_head"
        )
    return AcceptanceHead(head.state_size, config).float()


def acceptance_objective(
    acceptance: AcceptanceHead,
    step_logits: Sequence[torch.Tensor],
    states: Sequence[torch.Tensor],
    batch: TargetBatch,
    draft_to_target: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean binary cross-entropy over the counted draft steps, with gradients into the
    acceptance head only, and its detached sums (len(ACCEPTANCE_SUMS),) for the metrics.

    step_logits, states: the head's K steps (B, T, V_d) and (B, T, H) (`forward_states`; step k
    at t drafts token t + 1 + k); draft_to_target (V_d,) or None.
    """
    with torch.no_grad():
        signals = chain_signals(step_logits)
        drafted = torch.stack([logits.argmax(-1) for logits in step_logits], dim=-1)
        if draft_to_target is not None:
            drafted = draft_to_target.to(drafted.device)[drafted]
        accepted, counted = chain_outcomes(
            drafted,
            batch.input_ids,
            batch.target_logits.argmax(-1),
            batch.loss_mask.to(drafted.device),
        )
    logits = acceptance(torch.stack(states, dim=2).detach(), signals)  # (B, T, K)
    labels = accepted.float()
    losses = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    losses = losses.where(counted, 0.0)
    steps = counted.sum()
    with torch.no_grad():
        predicted = torch.sigmoid(logits).where(counted, 0.0)
        correct = ((predicted > 0.5) == accepted) & counted
        sums = torch.stack(
            [losses.sum(), steps, labels.where(counted, 0.0).sum(), predicted.sum(), correct.sum()]
        ).float()
    return losses.sum() / steps.clamp_min(1), sums
