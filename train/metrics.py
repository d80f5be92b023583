"""A run's metrics: objective outputs summed over batches, then reduced over processes into one record."""

from __future__ import annotations

import math
from typing import Any

import torch
from accelerate import Accelerator

from draftsmith.train.acceptance import ACCEPTANCE_SUMS
from draftsmith.train.objectives import Agreement, ObjectiveOutput

__all__ = ["Totals", "flat_record"]


class Totals:
    """Sums of the objective outputs of some batches on this process (a log window, or an
    evaluation); `reduce` turns them into one record over every process."""

    def __init__(self) -> None:
        self.batches = 0
        self._losses: torch.Tensor | None = None  # (1 + K,) the loss, then the K step losses
        self._agreement: Agreement | None = None
        self._acceptance: torch.Tensor | None = None  # (len(ACCEPTANCE_SUMS),)

    def add(self, out: ObjectiveOutput) -> None:
        losses = torch.cat([out.loss.detach().float()[None], out.step_losses.float()])
        self._losses = losses if self._losses is None else self._losses + losses
        agreement = out.agreement
        self._agreement = agreement if self._agreement is None else self._agreement + agreement
        if out.acceptance is not None:
            sums = out.acceptance.detach().float()
            self._acceptance = sums if self._acceptance is None else self._acceptance + sums
        self.batches += 1

    def reduce(self, accelerator: Accelerator) -> dict[str, Any]:
        """{loss, step_loss (K,), top1 (K,), acceptance (K,), tau_sim (K,), positions}: losses
        averaged over batches and processes, agreement counted over all of them; with a
        learned acceptance head also acceptance_head {bce, accuracy, accepted_rate,
        mean_predicted, steps} over the draft steps it was scored on.
        Every process calls it, each having added the same number of batches (an all-reduce)."""
        if self._losses is None or self._agreement is None:
            raise ValueError("no batches to reduce")
        device = accelerator.device
        losses = accelerator.reduce(self._losses.to(device), reduction="mean") / self.batches
        counts = accelerator.reduce(self._agreement.as_tensor().to(device), reduction="sum")
        agreement = Agreement.from_tensor(counts.cpu())
        record = {
            "loss": float(losses[0]),
            "step_loss": [round(float(x), 5) for x in losses[1:]],
            "top1": _rounded(agreement.top1()),
            "acceptance": _rounded(agreement.acceptance()),
            "tau_sim": _rounded(agreement.tau_sim()),
            "positions": int(agreement.total[0]),
        }
        if self._acceptance is not None:
            sums = accelerator.reduce(self._acceptance.to(device), reduction="sum").cpu().tolist()
            record["acceptance_head"] = _acceptance_record(
                dict(zip(ACCEPTANCE_SUMS, sums, strict=True))
            )
        return record


def flat_record(split: str, record: dict[str, Any]) -> dict[str, float]:
    """A record as the trackers and the training curve key it, ``split/key``: a list becomes one
    series per draft step (``split/key_k``, k from 1), its None entries left out; step and
    split are not values."""
    flat = {}
    for key, value in record.items():
        if key in ("step", "split"):
            continue
        if isinstance(value, list):
            flat.update({f"{split}/{key}_{k + 1}": v for k, v in enumerate(value) if v is not None})
        else:
            flat[f"{split}/{key}"] = value
    return flat


def _acceptance_record(sums: dict[str, float]) -> dict[str, Any]:
    """Rates of the acceptance head from its summed `ACCEPTANCE_SUMS`."""
    steps = sums["steps"]
    names = {"bce": "bce", "accuracy": "correct", "accepted_rate": "accepted"}
    names["mean_predicted"] = "predicted"
    rates = _rounded([sums[key] / steps if steps else math.nan for key in names.values()])
    return {**dict(zip(names, rates, strict=True)), "steps": int(steps)}


def _rounded(values: list[float]) -> list[float | None]:
    """Rates for a JSON record: 5 decimals, None where nothing was counted (NaN)."""
    return [None if math.isnan(v) else round(v, 5) for v in values]
