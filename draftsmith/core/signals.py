"""Confidence signals of a draft, computed from its logits alone.

One softmax and one top-2 per draft and no extra forward pass, so the decoder can afford them on
every draft; the calibrators are fitted on exactly these numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import torch

from draftsmith.core.context import CONTEXT_SIGNAL

SIGNAL_NAMES: tuple[str, ...] = (
    "top1_prob",
    "margin",
    "entropy",
    "position",
    "path_prob",
    "composite",
)
"""Every signal `confidence_signals` returns, in a fixed order."""

ACCEPTANCE_HEAD_SIGNAL = "acceptance_head"
"""A drafter's learned acceptance head's P(accept) (`draftsmith.heads.acceptance`), which a
calibrator may read like any other signal."""

LEARNED_SIGNALS: tuple[str, ...] = (ACCEPTANCE_HEAD_SIGNAL,)
"""Signals of a learned head, not computed from the logits."""

KNOWN_SIGNALS: tuple[str, ...] = SIGNAL_NAMES + (CONTEXT_SIGNAL,) + LEARNED_SIGNALS
"""Every signal a calibrator may read."""

PROBABILITY_SIGNALS: frozenset[str] = frozenset(
    {"top1_prob", "margin", "path_prob", "composite", ACCEPTANCE_HEAD_SIGNAL}
)
"""The signals that lie in [0, 1], so they can be read as a confidence without a calibrator."""


class AcceptanceModel(Protocol):
    """P(the target accepts each drafted token) from its confidence signals: a fitted calibrator
    (`draftsmith.calibration.Calibrator`, an artifact's calibration.json) is one."""

    def predict_signals(self, signals: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """signals: `confidence_signals` output, each (k,). Returns (k,) probabilities."""
        ...


def check_logits(logits: torch.Tensor, name: str = "logits") -> None:
    """Raise a ValueError unless logits (N, V) is a float tensor every row of which has a softmax.

    -inf marks a masked token and is allowed; NaN, +inf and rows without a finite entry are not.
    """
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2 or not logits.is_floating_point():
        shape = tuple(logits.shape) if hasattr(logits, "shape") else type(logits).__name__
        raise ValueError(f"{name} must be a float tensor (N, V), got {shape}")
    if logits.shape[1] == 0:
        raise ValueError(f"{name} has an empty vocabulary dimension: shape {tuple(logits.shape)}")
    if logits.shape[0] == 0:
        return
    # A row's max is NaN if it holds a NaN (max propagates NaN), +inf if it holds +inf and -inf
    # if every entry is: one pass and one device sync on the happy path.
    if not bool(torch.isfinite(logits.amax(dim=-1)).all()):
        bad = torch.isnan(logits) | torch.isposinf(logits)
        dead = ~torch.isfinite(logits.amax(dim=-1))
        rows = torch.nonzero(bad.any(-1) | dead).flatten().tolist()
        raise ValueError(
            f"{name} has NaN, +inf or all -inf values in {len(rows)} of {logits.shape[0]} rows "
            f"(first: row {rows[0]}); check the drafter's forward pass (overflow in half "
            "precision, a fully masked vocabulary)"
        )


def confidence_signals(logits: torch.Tensor, temperature: float = 1.0) -> dict[str, torch.Tensor]:
    """Per drafted token confidence signals from the draft logits.

    Args:
        logits (k, V): raw draft logits, one row per drafted position, in draft order; or
            (N, k, V): N drafts of k tokens each (a teacher-forced pass scores many at once).
        temperature: the sampling temperature the draft is made at; 1.0 for greedy decoding.

    Returns:
        A dict keyed by `SIGNAL_NAMES`, each (k,) (or (N, k)) float32 on the logits' device:

        - `top1_prob`: largest probability of the draft distribution softmax(logits / T).
        - `margin`: top-1 minus top-2 probability (equals top1_prob when V == 1).
        - `entropy`: entropy of the draft distribution in nats.
        - `position`: 0-based position in the draft.
        - `path_prob`: cumulative product of top1_prob along the draft, the draft's own estimate
          that the whole prefix up to here survives when every token is its argmax.
        - `composite`: top1_prob * exp(-entropy). exp(-entropy) is one over the distribution's
          perplexity (its effective number of candidates), so the composite discounts the top-1
          probability by how spread the rest of the distribution is; it lies in (0, 1] and is 1
          only for a one-hot draft.
    """
    if isinstance(logits, torch.Tensor) and logits.ndim == 3:
        check_logits(logits.flatten(0, 1))
    else:
        check_logits(logits)
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    top = probs.topk(min(2, probs.shape[-1]), dim=-1).values
    top1 = top[..., 0]
    top2 = top[..., 1] if top.shape[-1] > 1 else torch.zeros_like(top1)
    # entr(0) = 0, so masked (-inf) tokens add nothing instead of 0 * log 0 = NaN.
    entropy = torch.special.entr(probs).sum(-1)
    position = torch.arange(probs.shape[-2], dtype=torch.float32, device=probs.device)
    return {
        "top1_prob": top1,
        "margin": top1 - top2,
        "entropy": entropy,
        "position": position.expand_as(top1),
        "path_prob": torch.cumprod(top1, dim=-1),
        "composite": top1 * torch.exp(-entropy),
    }


def signal_matrix(
    signals: Mapping[str, torch.Tensor | np.ndarray], names: Sequence[str]
) -> np.ndarray:
    """Stack the named signals, each (N,), into a float64 feature matrix (N, len(names))."""
    if not names:
        raise ValueError("name at least one signal to stack")
    unknown = [n for n in names if n not in KNOWN_SIGNALS]
    if unknown:
        raise ValueError(f"unknown signals {unknown}; known signals: {list(KNOWN_SIGNALS)}")
    missing = [n for n in names if n not in signals]
    if missing:
        hint = ""
        if any(n in LEARNED_SIGNALS for n in missing):
            hint = " (a learned head's output: load the acceptance model with its drafter)"
        elif CONTEXT_SIGNAL in missing:
            hint = (
                f" ({CONTEXT_SIGNAL} says whether a drafted token repeats the context: drafters "
                "and teacher-forced collection give it, `confidence_signals` alone does not)"
            )
        raise ValueError(f"signals {missing} are missing{hint}; got {sorted(signals)}")
    columns = []
    for name in names:
        value = signals[name]
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().double().numpy()
        column = np.asarray(value, dtype=np.float64)
        if column.ndim != 1:
            raise ValueError(f"signal {name!r} must be (N,), got shape {column.shape}")
        columns.append(column)
    lengths = {c.shape[0] for c in columns}
    if len(lengths) > 1:
        raise ValueError(f"signals {list(names)} have different lengths {sorted(lengths)}")
    return np.stack(columns, axis=1)
