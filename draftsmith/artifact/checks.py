"""Checks of a head's tensors before they are loaded."""

from __future__ import annotations

from pathlib import Path

import torch


def check_tensors(
    expected: dict[str, torch.Tensor],
    found: dict[str, torch.Tensor],
    where: Path,
    fix: str = "export the drafter again",
) -> None:
    """The tensors `found` in the weights file `where` are exactly the `expected` ones (names and
    shapes) and finite; a ValueError names each one that is not, and `fix`."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"{where} does not match the head its config describes: missing "
            f"tensors {missing}, unexpected tensors {unexpected} (was it written by another "
            f"head kind or version? {fix})"
        )
    misshapen = [
        f"{name} {tuple(found[name].shape)} (expected {tuple(t.shape)})"
        for name, t in expected.items()
        if found[name].shape != t.shape
    ]
    if misshapen:
        raise ValueError(f"{where} has tensors of the wrong shape: {misshapen}")
    broken = [
        name
        for name, t in found.items()
        if t.is_floating_point() and not bool(torch.isfinite(t).all())
    ]
    if broken:
        raise ValueError(
            f"{where} holds NaN or infinite values in {broken}: the training "
            "diverged; retrain (lower the learning rate) or use an earlier checkpoint"
        )
