"""`HeadObjective`: a head and its objective as one module, the thing Accelerate wraps (DDP/FSDP, autocast)."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from draftsmith.core.target import TargetBatch
from draftsmith.heads import DraftHead
from draftsmith.heads.acceptance import AcceptanceHead
from draftsmith.train.acceptance import acceptance_objective
from draftsmith.train.objectives import ObjectiveConfig, ObjectiveOutput, draft_objective

__all__ = ["HeadObjective"]


class HeadObjective(nn.Module):
    """A head scored by `draft_objective`, and optionally a learned acceptance head trained
    beside it. Going through `forward` (not `head.forward_train` directly) is what lets DDP
    synchronise gradients and autocast cover the step."""

    def __init__(
        self,
        head: DraftHead,
        objective: ObjectiveConfig,
        acceptance: AcceptanceHead | None = None,
        train_head: bool = True,
    ) -> None:
        """train_head False: the loss is the acceptance head's alone (the drafter is frozen;
        its objective is still scored, for the metrics)."""
        super().__init__()
        self.head = head
        self.objective = objective
        self.acceptance = acceptance
        self.train_head = train_head

    def forward(self, batch: TargetBatch) -> ObjectiveOutput:
        """The objective of the head's K step logits against `batch.target_logits` (B, T, V),
        plus the kind's own auxiliary term (EAGLE's feature regression) when it has one, plus
        the acceptance head's binary cross-entropy when there is one."""
        if batch.features is not None:
            # float32, the head's master precision, whatever the target's (autocast, when on,
            # lowers them again where it pays)
            batch = replace(batch, features=batch.features.float())
        if self.acceptance is None:
            step_logits, states = self.head.forward_train(batch), None
        else:
            step_logits, states = self.head.forward_states(batch)
        d2t = self.head.draft_to_target()
        out = draft_objective(
            step_logits,
            batch.target_logits,
            batch.loss_mask,
            self.objective,
            d2t,
            self.head.first_drafted_step,
        )
        auxiliary = self.head.auxiliary_loss()
        if auxiliary is not None:
            out.loss = out.loss + auxiliary
        if states is not None:
            loss, out.acceptance = acceptance_objective(
                self.acceptance, step_logits, states, batch, d2t
            )
            out.loss = out.loss + loss if self.train_head else loss
        return out
