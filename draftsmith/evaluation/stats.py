"""The statistics of an interleaved side-by-side run: the order methods take on each repeat, and
bootstrap intervals on a speed ratio over prompts. `Benchmark` (and so ``draftsmith bench``) and
``benchmarks/policies/compare_policies.py`` share them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")

INTERVAL_LEVEL = 0.9
RESAMPLES = 2000


def rotated(methods: Sequence[T], repeat: int) -> list[T]:
    """The methods in the order repeat `repeat` runs them: shifted by one each repeat, so no
    method always runs first (on a warm cache) or right after another's allocations."""
    shift = repeat % len(methods)
    return [*methods[shift:], *methods[:shift]]


def speedup_interval(
    prompts: list[dict],
    name: str,
    baseline: str = "plain",
    level: float = INTERVAL_LEVEL,
    resamples: int = RESAMPLES,
) -> tuple[float, float]:
    """The `level` bootstrap interval of `name`'s speed over `baseline`'s (tokens over seconds,
    summed over prompts), resampling the prompts: how far another draw of prompts (and of the
    machine's noise on each) could move the ratio. Each prompt is a dict with per-method
    "tokens" and "seconds"; the draws are seeded, so a report regenerates alike."""
    tokens = np.array([[p["tokens"][name], p["tokens"][baseline]] for p in prompts], dtype=float)
    seconds = np.array([[p["seconds"][name], p["seconds"][baseline]] for p in prompts])
    draws = np.random.default_rng(0).integers(0, len(prompts), (resamples, len(prompts)))
    rates = tokens[draws].sum(1) / seconds[draws].sum(1)  # (resamples, 2)
    ratios = rates[:, 0] / rates[:, 1]
    tail = (1 - level) / 2
    return float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1 - tail))
