"""`HeadObjective`: a head and its objective as one module, the thing Accelerate wraps (DDP/FSDP, autocast)."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from draftsmith.core.target import TargetBatch
from draftsmith.heads import DraftHead
from draftsmith.train.objectives import ObjectiveConfig, ObjectiveOutput, draft_objective

__all__ = ["HeadObjective"]


class HeadObjective(nn.Module):
    """A head scored by `draft_objective`. Going through `forward` (not `head.forward_train`
    directly) is what lets DDP synchronise gradients and autocast cover the step."""

    def __init__(self, head: DraftHead, objective: ObjectiveConfig) -> None:
        super().__init__()
        self.head = head
        self.objective = objective

    def forward(self, batch: TargetBatch) -> ObjectiveOutput:
        """The objective of the head's K step logits against `batch.target_logits` (B, T, V),
        plus the kind's own auxiliary term (EAGLE's feature regression) when it has one."""
        if batch.features is not None:
            # float32, the head's master precision, whatever the target's (autocast, when on,
            # lowers them again where it pays)
            batch = replace(batch, features=batch.features.float())
        step_logits = self.head.forward_train(batch)
        out = draft_objective(
            step_logits,
            batch.target_logits,
            batch.loss_mask,
            self.objective,
            self.head.draft_to_target(),
            self.head.first_drafted_step,
        )
        auxiliary = self.head.auxiliary_loss()
        if auxiliary is not None:
            out.loss = out.loss + auxiliary
        return out
