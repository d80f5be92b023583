"""The calibrator interface and its registry of kinds.

A calibrator maps a draft's confidence signals to the probability that its token is accepted:
fit on held-out features (N, S) (columns = `signals`, see `signal_matrix`) and outcomes (N,) in
[0, 1], predict (N,) probabilities, and describe itself as plain JSON (`to_dict`; saved as
calibration.json by `draftsmith.calibration.io`, never pickle). Outcomes may be soft, e.g. the
sampling acceptance probability min(1, p/q); every kind fits fractional targets. Kinds register
by name (`@register_calibrator("platt")`) and are built with `build_calibrator`.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from draftsmith.calibration.io import read_calibration, write_calibration
from draftsmith.core.registry import Registry
from draftsmith.core.signals import KNOWN_SIGNALS, PROBABILITY_SIGNALS, signal_matrix

Features = np.ndarray | torch.Tensor | Mapping[str, np.ndarray | torch.Tensor]
"""A feature matrix (N, S) with columns in `Calibrator.signals` order, (N,) for one signal, or
signals (N,) by name (`confidence_signals` output, concatenated over drafts)."""

DESCRIPTION_KEYS = ("kind", "signals", "params", "selection")
"""The keys of `Calibrator.to_dict` (selection only from auto); calibration.json adds metadata."""

CALIBRATORS: Registry[type[Calibrator]] = Registry("calibrator kind")
"""Every calibrator kind by name (calibration.json names the kind it holds)."""


def register_calibrator(kind: str) -> Callable[[type[Calibrator]], type[Calibrator]]:
    """Class decorator: make a calibrator kind buildable and loadable by name."""
    return CALIBRATORS.register(kind)


def calibrator_class(kind: str) -> type[Calibrator]:
    """The class registered as `kind`; an `UnknownNameError` listing the kinds otherwise."""
    return CALIBRATORS[kind]


def build_calibrator(
    method: str, signals: Sequence[str] = ("top1_prob",), **kwargs: Any
) -> Calibrator:
    """Build an unfitted calibrator of kind `method` over the named signals.

    kwargs are the kind's hyper-parameters (`C` for platt, `n_bins` and `prior_weight` for
    histogram, `folds`, `candidates` and `seed` for auto).
    """
    return calibrator_class(method)(signals=signals, **kwargs)


class Calibrator(ABC):
    """Maps confidence features (N, S), one column per name in `signals`, to P(accepted) (N,)."""

    kind: ClassVar[str]
    max_signals: ClassVar[int | None] = 1
    """How many signals the kind can use (None: any number)."""
    probability_input: ClassVar[bool] = False
    """Whether the kind reads its signal as a probability (one of `PROBABILITY_SIGNALS`)."""

    def __init__(self, signals: Sequence[str] = ("top1_prob",)) -> None:
        signals = (signals,) if isinstance(signals, str) else tuple(signals)
        if not signals or len(set(signals)) != len(signals):
            raise ValueError(f"signals must be distinct and non-empty, got {list(signals)}")
        unknown = [s for s in signals if s not in KNOWN_SIGNALS]
        if unknown:
            raise ValueError(f"unknown signals {unknown}; known signals: {list(KNOWN_SIGNALS)}")
        if self.max_signals is not None and len(signals) > self.max_signals:
            raise ValueError(
                f"{self.kind} calibrates {self.max_signals} signal(s), got {list(signals)}; "
                "use 'platt' to combine several signals"
            )
        if self.probability_input and signals[0] not in PROBABILITY_SIGNALS:
            raise ValueError(
                f"{self.kind} needs a probability signal, one of "
                f"{sorted(PROBABILITY_SIGNALS)}; got {signals[0]!r}"
            )
        self.signals: tuple[str, ...] = signals
        self.fitted = False

    # -- the interface ---------------------------------------------------------------------------

    def fit(self, features: Features, outcomes: np.ndarray | torch.Tensor) -> Calibrator:
        """Fit on features (N, S) (or (N,) for one signal, or a dict of signals (N,) by name)
        and outcomes (N,) in [0, 1]."""
        x = self._features(features)
        y = _check_outcomes(outcomes, x.shape[0])
        self._fit(x, y)
        self.fitted = True
        return self

    def predict(self, features: Features) -> np.ndarray:
        """Calibrated acceptance probabilities (N,) for features as in `fit`."""
        self._require_fitted()
        return np.clip(self._predict(self._features(features)), 0.0, 1.0)

    def predict_signals(self, signals: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Calibrated acceptance probabilities (k,) float32 from `confidence_signals` output,
        on the signals' device (the draft policy's `AcceptanceModel`)."""
        probs = self.predict(signals)
        first = signals[self.signals[0]]
        device = first.device if isinstance(first, torch.Tensor) else None
        return torch.as_tensor(probs, dtype=torch.float32, device=device)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON description: {"kind", "signals", "params"}."""
        self._require_fitted()
        return {"kind": self.kind, "signals": list(self.signals), "params": self._params()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Calibrator:
        """Rebuild a fitted calibrator of the kind named in data (from `to_dict`)."""
        missing = {"kind", "signals", "params"} - set(data)
        unknown = set(data) - set(DESCRIPTION_KEYS)
        if missing or unknown:
            raise ValueError(
                f"a calibrator dict needs keys kind, signals, params (and optionally selection); "
                f"missing {sorted(missing)}, unknown {sorted(unknown)}"
            )
        kind_cls = calibrator_class(data["kind"])
        if not issubclass(kind_cls, cls):
            raise ValueError(f"{data['kind']!r} is not a {cls.__name__}")
        calibrator = kind_cls(signals=data["signals"])
        try:
            calibrator._load(data["params"])
        except (KeyError, TypeError) as error:
            raise ValueError(f"bad params for calibrator {data['kind']!r}: {error!r}") from error
        calibrator.fitted = True
        return calibrator

    def save(self, path: str | os.PathLike, metadata: Mapping[str, Any] | None = None) -> Path:
        """Write calibration.json (path: the file, or a directory to put it in) atomically.

        metadata, e.g. {"method": ..., "n_fit": ..., "metrics": {"before": ..., "after": ...}},
        is stored alongside for the model card (ignored by `load`); NaN becomes null.
        """
        return write_calibration(path, self.to_dict(), metadata)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Calibrator:
        """Read calibration.json (path: the file, or the directory holding it)."""
        payload = read_calibration(path)
        return cls.from_dict({k: v for k, v in payload.items() if k in DESCRIPTION_KEYS})

    # -- what each kind implements ---------------------------------------------------------------

    @abstractmethod
    def _fit(self, x: np.ndarray, y: np.ndarray) -> None:
        """x (N, S) finite, y (N,) in [0, 1] with both classes present."""

    @abstractmethod
    def _predict(self, x: np.ndarray) -> np.ndarray:
        """x (N, S) -> (N,)."""

    @abstractmethod
    def _params(self) -> dict[str, Any]:
        """Fitted parameters and hyper-parameters as plain JSON."""

    @abstractmethod
    def _load(self, params: Mapping[str, Any]) -> None:
        """Inverse of `_params`."""

    # -- helpers ---------------------------------------------------------------------------------

    def _require_fitted(self) -> None:
        if not self.fitted:
            raise RuntimeError(f"the {self.kind} calibrator is not fitted; call fit() or load()")

    def _features(self, features: Features) -> np.ndarray:
        if isinstance(features, Mapping):
            features = signal_matrix(features, self.signals)
        elif isinstance(features, torch.Tensor):
            features = features.detach().cpu().double().numpy()
        x = np.asarray(features, dtype=np.float64)
        if x.ndim == 1 and len(self.signals) == 1:
            x = x[:, None]
        if x.ndim != 2 or x.shape[1] != len(self.signals):
            raise ValueError(
                f"expected features (N, {len(self.signals)}) with columns {list(self.signals)}, "
                f"got shape {x.shape}"
            )
        for column, name in enumerate(self.signals):
            bad = int((~np.isfinite(x[:, column])).sum())
            if bad:
                raise ValueError(f"signal {name!r} has {bad} NaN/inf values of {x.shape[0]}")
        return x


def _check_outcomes(outcomes: np.ndarray | torch.Tensor, n: int) -> np.ndarray:
    """Validate outcomes (n,) in [0, 1] with both accepted and rejected mass present."""
    if isinstance(outcomes, torch.Tensor):
        outcomes = outcomes.detach().cpu().double().numpy()
    y = np.asarray(outcomes, dtype=np.float64)
    if y.shape != (n,):
        raise ValueError(f"outcomes must be (N,) with N={n} to match the features, got {y.shape}")
    if n == 0:
        raise ValueError("no drafted tokens to calibrate on (N=0); collect held-out drafts first")
    if not np.isfinite(y).all() or y.min() < 0 or y.max() > 1:
        raise ValueError("outcomes must be finite and in [0, 1] (1 = accepted, or min(1, p/q))")
    if (y == 1).all():
        raise ValueError(
            f"all {n} drafted tokens were accepted (every outcome is 1), so there is nothing to "
            "calibrate against; calibrate on harder or more held-out data (longer drafts, "
            "sampling instead of greedy)"
        )
    if (y == 0).all():
        raise ValueError(
            f"none of the {n} drafted tokens was accepted (every outcome is 0); check that the "
            "drafter matches the target, or calibrate on more held-out data"
        )
    return y
