"""Confidence signals of a drafted token: the one place each is defined.

A token's signals come from its draft distribution (one log-softmax and one top-2, no extra
forward pass, so the decoder can afford them on every draft) and from the token it follows in the
draft (its position and path probability); the calibrators are fitted on exactly these numbers.
Each signal's formula is written once below (`margin`, `composite`, `position`, `path_prob`,
`distribution` for the entropy) and serves two forms: `confidence_signals`, tensors for whole
drafts (chains, batches of chains, trees), and `token_signals`, Python floats for one token (a
draft tree's hot path, where one tensor op per signal costs more than the arithmetic).
`context_match` is `ContextIndex.matches` (`draftsmith.core.context`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

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


Number = TypeVar("Number", float, torch.Tensor)
"""A Python float (one token) or a tensor (many): each signal's formula serves both."""

FIRST_PARENT = (-1.0, 1.0)
"""(position, path_prob) of what a draft's first token follows: the newest committed token."""


def margin(top1: Number, top2: Number) -> Number:
    """Top-1 minus top-2 probability of the draft distribution (top2 0 for a one-token one)."""
    return top1 - top2


def composite(top1: Number, entropy: Number) -> Number:
    """top1_prob * exp(-entropy). exp(-entropy) is one over the distribution's perplexity (its
    effective number of candidates), so the composite discounts the top-1 probability by how
    spread the rest of the distribution is; it lies in (0, 1] and is 1 only for a one-hot draft."""
    if isinstance(entropy, torch.Tensor):
        return top1 * torch.exp(-entropy)
    return top1 * math.exp(-entropy)


def position(parent_position: Number) -> Number:
    """0-based position in the draft: one past the token it follows (`FIRST_PARENT`: -1)."""
    return parent_position + 1


def path_prob(top1: Number, parent_path: Number) -> Number:
    """The product of top1_prob over the token and its ancestors in the draft (`FIRST_PARENT`:
    1): the draft's own estimate that the whole prefix up to here survives when every token is
    its argmax. Down a chain this is the cumulative product of top1_prob."""
    return parent_path * top1


def distribution(
    logits: torch.Tensor, top_k: int = 2, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.return_types.topk, torch.Tensor]:
    """The draft distribution of logits (..., V) at temperature: probs (..., V) =
    softmax(logits / T) in float32, its min(top_k, V) largest probabilities with their indices
    (descending), and its entropy (...,) in nats. No checks (`check_logits`): a tree calls it
    once a drafted depth."""
    scaled = logits.float() if temperature == 1.0 else logits.float() / temperature
    # One log-softmax serves both: cheaper than a softmax and entr (a log per entry).
    log_probs = scaled.log_softmax(-1)
    probs = log_probs.exp()
    # p log p in log_probs' memory where no gradient needs it (a teacher-forced pass holds
    # (T, K, V) of these). A masked (-inf) token gives 0 * -inf = NaN, which nansum counts as
    # the 0 it is.
    plogp = probs * log_probs if log_probs.requires_grad else log_probs.mul_(probs)
    entropy = -plogp.nansum(-1)
    return probs, probs.topk(min(top_k, probs.shape[-1]), dim=-1), entropy


def token_signals(
    top: Sequence[float],
    entropy: float,
    parent_position: float = FIRST_PARENT[0],
    parent_path: float = FIRST_PARENT[1],
) -> dict[str, float]:
    """`confidence_signals` of one drafted token as Python floats, keyed by `SIGNAL_NAMES`: from
    its draft distribution's largest probabilities top (descending, from `distribution`) and
    entropy, and the position and path_prob of the token it follows (`FIRST_PARENT` for the
    first). For a draft tree's per-node work, where these few numbers cost less as floats."""
    top1 = top[0]
    return {
        "top1_prob": top1,
        "margin": margin(top1, top[1] if len(top) > 1 else 0.0),
        "entropy": entropy,
        "position": position(parent_position),
        "path_prob": path_prob(top1, parent_path),
        "composite": composite(top1, entropy),
    }


def confidence_signals(
    logits: torch.Tensor | Sequence[torch.Tensor],
    temperature: float = 1.0,
    parents: Sequence[int] | None = None,
) -> dict[str, torch.Tensor]:
    """Per drafted token confidence signals from the draft logits.

    Args:
        logits (k, V): raw draft logits, one row per drafted position, in draft order; or
            (N, k, V): N drafts of k tokens each (a teacher-forced pass scores many at once); or
            k tensors (..., V), step j's logits of many chains, each signal (..., k): one step's
            softmax at a time, for little memory.
        temperature: the sampling temperature the draft is made at; 1.0 for greedy decoding.
        parents (k,): with logits (k, V), the rows are a draft tree's nodes and parents[i] the
            row of node i's parent (-1: none), every parent before its children; None: a chain.

    Returns:
        A dict keyed by `SIGNAL_NAMES`, each (k,) (or (N, k), (..., k)) float32 on the logits'
        device:

        - `top1_prob`: largest probability of the draft distribution softmax(logits / T).
        - `margin`, `entropy`, `position`, `path_prob`, `composite`: see the functions of those
          names (`distribution` for the entropy, in nats).
    """
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    if not isinstance(logits, torch.Tensor):  # chains a step at a time
        for step in logits:
            check_logits(step.reshape(-1, step.shape[-1]), "step logits")
        steps = [_distribution_signals(step, temperature) for step in logits]
        signals = {name: torch.stack([s[name] for s in steps], dim=-1) for name in steps[0]}
        return _along_chains(signals)
    check_logits(logits.flatten(0, 1) if logits.ndim == 3 else logits)
    signals = _distribution_signals(logits, temperature)
    if parents is None:
        return _along_chains(signals)
    if logits.ndim != 2 or len(parents) != logits.shape[0]:
        raise ValueError(f"parents ({len(parents)}) must name one row of logits (k, V) each")
    top1 = signals["top1_prob"].tolist()
    positions: list[float] = []
    paths: list[float] = []
    # Parents come before their children, so one pass in row order multiplies whole paths.
    for i, parent in enumerate(parents):
        before = FIRST_PARENT if parent < 0 else (positions[parent], paths[parent])
        positions.append(position(before[0]))
        paths.append(path_prob(top1[i], before[1]))
    device = signals["top1_prob"].device
    signals["position"] = torch.tensor(positions, device=device)
    signals["path_prob"] = torch.tensor(paths, device=device)
    return {name: signals[name] for name in SIGNAL_NAMES}


def _distribution_signals(logits: torch.Tensor, temperature: float) -> dict[str, torch.Tensor]:
    """The signals of each row's own distribution, logits (..., V) -> each (...,)."""
    _, top, entropy = distribution(logits, 2, temperature)
    top1 = top.values[..., 0]
    top2 = top.values[..., 1] if top.values.shape[-1] > 1 else torch.zeros_like(top1)
    return {
        "top1_prob": top1,
        "margin": margin(top1, top2),
        "entropy": entropy,
        "composite": composite(top1, entropy),
    }


def _along_chains(signals: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Add `position` and `path_prob` along the last axis of signals (..., k), each a chain whose
    token j follows token j - 1 (`position` and `path_prob` vectorised: arange and cumprod)."""
    top1 = signals["top1_prob"]
    steps = torch.arange(top1.shape[-1], dtype=torch.float32, device=top1.device)
    signals["position"] = steps.expand_as(top1)
    signals["path_prob"] = torch.cumprod(top1, dim=-1)
    return {name: signals[name] for name in SIGNAL_NAMES}


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
