"""Model selection: "auto" picks a calibrator kind by cross-validated NLL."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from draftsmith.calibration.calibrators import (
    Calibrator,
    build_calibrator,
    calibrator_class,
    register_calibrator,
)
from draftsmith.calibration.metrics import nll
from draftsmith.core.signals import PROBABILITY_SIGNALS

DEFAULT_CANDIDATES: tuple[str, ...] = ("temperature", "platt", "histogram", "isotonic")
"""Simplest first: ties go to the earlier kind."""


@register_calibrator("auto")
class AutoCalibrator(Calibrator):
    """Pick the candidate kind with the lowest K-fold cross-validated NLL, refit it on all data.

    Single-signal kinds use the first signal, platt uses all of them; kinds that read a
    probability (temperature) are skipped when the first signal is not one. Folds are stratified
    on outcome >= 0.5 when each side has at least K tokens, plain shuffled K-fold otherwise;
    K = 5 by default. Ties go to the earlier candidate, so list simpler kinds first.

    Saving writes the chosen calibrator (its kind, not "auto") plus a "selection" record with
    every candidate's CV NLL; loading returns the chosen kind.
    """

    max_signals = None

    def __init__(
        self,
        signals: Sequence[str] = ("top1_prob",),
        folds: int = 5,
        candidates: Sequence[str] = DEFAULT_CANDIDATES,
        seed: int = 0,
    ) -> None:
        super().__init__(signals)
        if folds < 2:
            raise ValueError(f"folds must be >= 2, got {folds}")
        if not candidates or self.kind in candidates:
            raise ValueError(f"bad candidates {list(candidates)}; choose from {DEFAULT_CANDIDATES}")
        for kind in candidates:
            calibrator_class(kind)  # an unknown kind is an error naming the known ones
        self.folds, self.candidates, self.seed = folds, tuple(candidates), seed
        self.selected: Calibrator | None = None
        self.cv_nll: dict[str, float] = {}
        """Each tried candidate's mean out-of-fold NLL, by kind."""

    def _candidate_signals(self, kind: str) -> tuple[str, ...] | None:
        """The signals `kind` is fitted on, or None when it cannot read them."""
        cls = calibrator_class(kind)
        if cls.probability_input and self.signals[0] not in PROBABILITY_SIGNALS:
            return None
        return self.signals if cls.max_signals is None else self.signals[: cls.max_signals]

    def _fit(self, x: np.ndarray, y: np.ndarray) -> None:
        from sklearn.model_selection import KFold, StratifiedKFold

        n = y.shape[0]
        if n < 2 * self.folds:
            raise ValueError(
                f"auto needs at least {2 * self.folds} drafted tokens for {self.folds}-fold "
                f"cross-validation, got {n}; collect more held-out data or name a method"
            )
        strata = (y >= 0.5).astype(np.int64)
        if np.bincount(strata, minlength=2).min() >= self.folds:
            splitter = StratifiedKFold(self.folds, shuffle=True, random_state=self.seed)
            splits = list(splitter.split(x, strata))
        else:
            splits = list(KFold(self.folds, shuffle=True, random_state=self.seed).split(x))

        self.cv_nll = {}
        for kind in self.candidates:
            signals = self._candidate_signals(kind)
            if signals is None:
                continue
            columns = [self.signals.index(s) for s in signals]
            total = 0.0
            for train, val in splits:
                calibrator = build_calibrator(kind, signals).fit(x[train][:, columns], y[train])
                total += nll(calibrator.predict(x[val][:, columns]), y[val]) * val.size
            self.cv_nll[kind] = total / n
        best = min(self.cv_nll, key=self.cv_nll.__getitem__)
        signals = self._candidate_signals(best)
        columns = [self.signals.index(s) for s in signals]
        self.selected = build_calibrator(best, signals).fit(x[:, columns], y)

    def _predict(self, x: np.ndarray) -> np.ndarray:
        columns = [self.signals.index(s) for s in self.selected.signals]
        return self.selected.predict(x[:, columns])

    def to_dict(self) -> dict[str, Any]:
        self._require_fitted()
        selection = {"method": self.kind, "folds": self.folds, "seed": self.seed}
        return {**self.selected.to_dict(), "selection": {**selection, "cv_nll": self.cv_nll}}

    def _params(self) -> dict[str, Any]:
        raise NotImplementedError("AutoCalibrator.to_dict stores the selected calibrator")

    def _load(self, params: Mapping[str, Any]) -> None:
        raise ValueError(
            "'auto' is resolved when fitted: calibration.json stores the chosen kind instead"
        )
