"""The calibrator kinds fitted directly: temperature, platt, isotonic and histogram.

scikit-learn and scipy are imported inside the fitting code only, so loading a calibrator for
decoding does not pay for them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from draftsmith.calibration.calibrators import Calibrator, register_calibrator
from draftsmith.calibration.metrics import EPS
from draftsmith.core.logistic import logit_array, sigmoid_array

TEMPERATURE_RANGE = (1e-2, 1e2)
"""Fitted temperatures are clipped to this range: data that carries no signal would otherwise
send T to infinity."""


def _float_array(params: Mapping[str, Any], key: str, kind: str) -> np.ndarray:
    values = np.asarray(params[key], dtype=np.float64)
    if values.ndim != 1 or not np.isfinite(values).all():
        raise ValueError(f"{kind} calibrator: params[{key!r}] must be a list of finite numbers")
    return values


@register_calibrator("temperature")
class TemperatureScaling(Calibrator):
    """One temperature T on a probability signal p: calibrated = sigmoid(logit(p) / T), p clipped
    to [EPS, 1 - EPS], T fitted by NLL with L-BFGS on log T from T = 1. T > 1 means the drafter
    was overconfident."""

    probability_input = True

    def __init__(self, signals: Sequence[str] = ("top1_prob",)) -> None:
        super().__init__(signals)
        self.temperature = 1.0

    def _fit(self, x: np.ndarray, y: np.ndarray) -> None:
        if x.min() < 0 or x.max() > 1:
            raise ValueError(f"signal {self.signals[0]!r} must lie in [0, 1] for temperature")
        z = torch.from_numpy(logit_array(x[:, 0], EPS))
        target = torch.from_numpy(y)
        log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
        optimizer = torch.optim.LBFGS(
            [log_t], lr=1.0, max_iter=100, tolerance_grad=1e-10, line_search_fn="strong_wolfe"
        )

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(z / log_t.exp(), target)
            loss.backward()
            return loss

        optimizer.step(closure)
        self.temperature = float(np.clip(math.exp(log_t.item()), *TEMPERATURE_RANGE))

    def _predict(self, x: np.ndarray) -> np.ndarray:
        return sigmoid_array(logit_array(x[:, 0], EPS) / self.temperature)

    def _params(self) -> dict[str, Any]:
        return {"temperature": self.temperature}

    def _load(self, params: Mapping[str, Any]) -> None:
        # Files written before draft-logit fitting was removed carry "input": "signal".
        if params.get("input", "signal") != "signal":
            raise ValueError(
                f"temperature calibrator fitted on {params['input']!r}: only signal-fitted "
                "temperature scaling is read now; re-run `draftsmith calibrate` on the artifact"
            )
        temperature = float(params["temperature"])
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature calibrator: temperature must be > 0, got {temperature}")
        self.temperature = temperature


@register_calibrator("platt")
class PlattScaling(Calibrator):
    """Logistic regression on one or several signals: sigmoid(features @ coef + intercept).

    Fitted with scikit-learn (lbfgs, L2 strength 1/C, intercept unpenalised). Soft outcomes use
    the duplication trick: every token appears as a positive with weight y and a negative with
    weight 1 - y, which is exactly the cross-entropy with fractional targets.
    """

    max_signals = None

    def __init__(self, signals: Sequence[str] = ("top1_prob",), C: float = 1.0) -> None:
        super().__init__(signals)
        if not C > 0:
            raise ValueError(f"C must be > 0, got {C}")
        self.C = float(C)
        self.coef = np.zeros(len(self.signals))
        self.intercept = 0.0

    def _fit(self, x: np.ndarray, y: np.ndarray) -> None:
        from sklearn.linear_model import LogisticRegression

        n = y.shape[0]
        model = LogisticRegression(C=self.C, max_iter=1000)
        model.fit(
            np.concatenate([x, x]),
            np.concatenate([np.ones(n), np.zeros(n)]),
            sample_weight=np.concatenate([y, 1 - y]),
        )
        self.coef = model.coef_[0].astype(np.float64)
        self.intercept = float(model.intercept_[0])

    def _predict(self, x: np.ndarray) -> np.ndarray:
        return sigmoid_array(x @ self.coef + self.intercept)

    def predict_signals(self, signals: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """`Calibrator.predict_signals` in a few torch ops on the signals' device: a draft policy
        asks once a drafted depth, and inside a decoding round the checked numpy path (kept for
        any other input, and for the errors that name what is wrong with it) costs about twice
        as much a call."""
        columns = [signals.get(name) for name in self.signals]
        tensors = all(isinstance(c, torch.Tensor) and c.ndim == 1 for c in columns)
        if not tensors or len({c.shape[0] for c in columns}) != 1:
            return super().predict_signals(signals)  # its errors name what is wrong
        self._require_fitted()
        x = torch.stack(columns, dim=-1).double()
        if not bool(torch.isfinite(x).all()):
            return super().predict_signals(signals)  # names the signal with NaN/inf values
        coef = torch.from_numpy(self.coef).to(x.device)
        return torch.sigmoid(x @ coef + self.intercept).float()

    def _params(self) -> dict[str, Any]:
        return {"coef": self.coef.tolist(), "intercept": self.intercept, "C": self.C}

    def _load(self, params: Mapping[str, Any]) -> None:
        coef = _float_array(params, "coef", self.kind)
        if coef.shape != (len(self.signals),):
            raise ValueError(f"platt calibrator: {len(coef)} coefs for signals {self.signals}")
        self.coef, self.intercept, self.C = coef, float(params["intercept"]), float(params["C"])


@register_calibrator("isotonic")
class IsotonicCalibrator(Calibrator):
    """Isotonic regression on one signal (scikit-learn), monotone in the direction of the
    Spearman correlation of signal and outcome (decreasing for entropy, say).

    Predictions interpolate linearly between the fitted thresholds and are clipped to the end
    values outside them (out_of_bounds='clip'); only the threshold arrays are stored.
    """

    def __init__(self, signals: Sequence[str] = ("top1_prob",)) -> None:
        super().__init__(signals)
        self.x_thresholds = np.zeros(0)
        self.y_thresholds = np.zeros(0)
        self.increasing = True

    def _fit(self, x: np.ndarray, y: np.ndarray) -> None:
        from scipy.stats import spearmanr
        from sklearn.isotonic import IsotonicRegression

        # Not sklearn's increasing="auto": same rule, without its warning on weak correlations.
        self.increasing = not spearmanr(x[:, 0], y).statistic < 0
        model = IsotonicRegression(
            y_min=0.0, y_max=1.0, increasing=self.increasing, out_of_bounds="clip"
        ).fit(x[:, 0], y)
        self.x_thresholds = model.X_thresholds_.astype(np.float64)
        self.y_thresholds = model.y_thresholds_.astype(np.float64)

    def _predict(self, x: np.ndarray) -> np.ndarray:
        return np.interp(x[:, 0], self.x_thresholds, self.y_thresholds)

    def _params(self) -> dict[str, Any]:
        return {
            "x": self.x_thresholds.tolist(),
            "y": self.y_thresholds.tolist(),
            "increasing": self.increasing,
        }

    def _load(self, params: Mapping[str, Any]) -> None:
        xs, ys = _float_array(params, "x", self.kind), _float_array(params, "y", self.kind)
        if xs.size == 0 or xs.shape != ys.shape or (np.diff(xs) < 0).any():
            raise ValueError("isotonic calibrator: x and y must be equal-length, x sorted")
        self.x_thresholds, self.y_thresholds = xs, ys
        self.increasing = bool(params["increasing"])


@register_calibrator("histogram")
class HistogramBinning(Calibrator):
    """Histogram binning on one signal: equal-mass bins, each predicting its mean outcome.

    A bin's value is shrunk towards the overall acceptance rate r as
    (sum of outcomes + prior_weight * r) / (count + prior_weight), so an empty bin (only the
    highest can be, when ties put its lower edge at the maximum) predicts r. Ties also merge
    quantile edges, leaving fewer than n_bins bins.
    """

    def __init__(
        self, signals: Sequence[str] = ("top1_prob",), n_bins: int = 15, prior_weight: float = 1.0
    ) -> None:
        super().__init__(signals)
        if n_bins < 1 or prior_weight < 0:
            raise ValueError(f"need n_bins >= 1, prior_weight >= 0; got {n_bins}, {prior_weight}")
        self.n_bins, self.prior_weight = int(n_bins), float(prior_weight)
        self.edges = np.zeros(0)
        """Inner bin edges (B - 1,); a value equal to an edge falls in the lower bin."""
        self.values = np.full(1, 0.5)
        """(B,) the prediction of each bin."""

    def _fit(self, x: np.ndarray, y: np.ndarray) -> None:
        quantiles = np.linspace(0, 1, self.n_bins + 1)[1:-1]
        # Edges are observed values, so every bin but the highest holds its upper edge.
        self.edges = np.unique(np.quantile(x[:, 0], quantiles, method="inverted_cdf"))
        index = np.searchsorted(self.edges, x[:, 0], side="left")
        size = self.edges.size + 1
        count = np.bincount(index, minlength=size)
        total = np.bincount(index, y, minlength=size)
        rate = y.mean()
        with np.errstate(invalid="ignore"):
            values = (total + self.prior_weight * rate) / (count + self.prior_weight)
        self.values = np.where(count + self.prior_weight > 0, values, rate)

    def _predict(self, x: np.ndarray) -> np.ndarray:
        return self.values[np.searchsorted(self.edges, x[:, 0], side="left")]

    def _params(self) -> dict[str, Any]:
        return {
            "edges": self.edges.tolist(),
            "values": self.values.tolist(),
            "n_bins": self.n_bins,
            "prior_weight": self.prior_weight,
        }

    def _load(self, params: Mapping[str, Any]) -> None:
        edges = _float_array(params, "edges", self.kind)
        values = _float_array(params, "values", self.kind)
        if values.size != edges.size + 1 or (np.diff(edges) <= 0).any():
            raise ValueError("histogram calibrator: need sorted edges (B-1,) and values (B,)")
        self.edges, self.values = edges, values
        self.n_bins, self.prior_weight = int(params["n_bins"]), float(params["prior_weight"])
