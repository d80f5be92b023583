"""Calibrators: map a draft's confidence signals to the probability that its token is accepted.

Every kind implements `Calibrator`: fit on held-out features (N, S) (columns = `signals`, see
`signal_matrix`) and outcomes (N,) in [0, 1], predict (N,) probabilities, and serialise to plain
JSON (`calibration.json`; never pickle). Outcomes may be soft, e.g. the sampling acceptance
probability min(1, p/q); every kind fits fractional targets. Kinds register by name
(`@register_calibrator("platt")`) and are built with `build_calibrator`.

scikit-learn is imported inside the fitting code only, so loading a calibrator for decoding costs
numpy alone.
"""

from __future__ import annotations

import json
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from draftsmith.calibration.metrics import EPS, nll
from draftsmith.core.signals import (
    PROBABILITY_SIGNALS,
    SIGNAL_NAMES,
    check_logits,
    confidence_signals,
    signal_matrix,
)

CALIBRATION_FILE = "calibration.json"
FORMAT_VERSION = 1
TEMPERATURE_RANGE = (1e-2, 1e2)
"""Fitted temperatures are clipped to this range: data that carries no signal would otherwise
send T to infinity."""

Features = np.ndarray | torch.Tensor | Mapping[str, np.ndarray | torch.Tensor]
"""A feature matrix (N, S) with columns in `Calibrator.signals` order, (N,) for one signal, or
signals (N,) by name (`confidence_signals` output, concatenated over drafts)."""

_REGISTRY: dict[str, type[Calibrator]] = {}


def register_calibrator(kind: str) -> Callable[[type[Calibrator]], type[Calibrator]]:
    """Class decorator: make a calibrator kind buildable and loadable by name."""

    def register(cls: type[Calibrator]) -> type[Calibrator]:
        if kind in _REGISTRY:
            raise ValueError(f"calibrator kind {kind!r} is already registered by {_REGISTRY[kind]}")
        _REGISTRY[kind] = cls
        cls.kind = kind
        return cls

    return register


def calibrator_class(kind: str) -> type[Calibrator]:
    if kind not in _REGISTRY:
        raise ValueError(f"unknown calibrator kind {kind!r}; known kinds: {sorted(_REGISTRY)}")
    return _REGISTRY[kind]


def build_calibrator(
    method: str, signals: Sequence[str] = ("top1_prob",), **kwargs: Any
) -> Calibrator:
    """Build an unfitted calibrator of kind `method` over the named signals.

    kwargs are the kind's hyper-parameters (`C` for platt, `n_bins` and `prior_weight` for
    histogram, `folds`, `candidates` and `seed` for auto).
    """
    return calibrator_class(method)(signals=signals, **kwargs)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    # tanh form: no overflow warning for large |z|.
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, EPS, 1 - EPS)
    return np.log(p) - np.log1p(-p)


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


def _json_safe(value: Any) -> Any:
    """Plain JSON: numpy scalars and arrays to Python, NaN and inf to None."""
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (np.integer, np.bool_)):
        return value.item()
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value


def _float_array(params: Mapping[str, Any], key: str, kind: str) -> np.ndarray:
    values = np.asarray(params[key], dtype=np.float64)
    if values.ndim != 1 or not np.isfinite(values).all():
        raise ValueError(f"{kind} calibrator: params[{key!r}] must be a list of finite numbers")
    return values


_CALIBRATOR_KEYS = {"kind", "signals", "params", "selection"}
"""The keys of calibration.json that describe the calibrator itself (the rest is metadata)."""


class Calibrator(ABC):
    """Maps confidence features (N, S), one column per name in `signals`, to P(accepted) (N,)."""

    kind: ClassVar[str]
    max_signals: ClassVar[int | None] = 1
    """How many signals the kind can use (None: any number)."""

    def __init__(self, signals: Sequence[str] = ("top1_prob",)) -> None:
        signals = (signals,) if isinstance(signals, str) else tuple(signals)
        if not signals or len(set(signals)) != len(signals):
            raise ValueError(f"signals must be distinct and non-empty, got {list(signals)}")
        unknown = [s for s in signals if s not in SIGNAL_NAMES]
        if unknown:
            raise ValueError(f"unknown signals {unknown}; known signals: {list(SIGNAL_NAMES)}")
        if self.max_signals is not None and len(signals) > self.max_signals:
            raise ValueError(
                f"{self.kind} calibrates {self.max_signals} signal(s), got {list(signals)}; "
                "use 'platt' to combine several signals"
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
        """Calibrated acceptance probabilities (k,) float32 from `confidence_signals` output."""
        probs = self.predict(signals)
        first = signals[self.signals[0]]
        device = first.device if isinstance(first, torch.Tensor) else None
        return torch.as_tensor(probs, dtype=torch.float32, device=device)

    def predict_draft(
        self,
        logits: torch.Tensor,
        tokens: torch.Tensor | None = None,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """Calibrated acceptance probabilities (k,) straight from draft logits (k, V).

        tokens (k,) are the drafted ids; kinds that read signals ignore them.
        """
        return self.predict_signals(confidence_signals(logits, temperature))

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON description: {"kind", "signals", "params"}."""
        self._require_fitted()
        return {"kind": self.kind, "signals": list(self.signals), "params": self._params()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Calibrator:
        """Rebuild a fitted calibrator of the kind named in data (from `to_dict`)."""
        missing = {"kind", "signals", "params"} - set(data)
        unknown = set(data) - _CALIBRATOR_KEYS
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
        path = Path(path)
        if path.is_dir():
            path = path / CALIBRATION_FILE
        payload = {**(metadata or {}), "format_version": FORMAT_VERSION, **self.to_dict()}
        text = json.dumps(_json_safe(payload), indent=2, allow_nan=False)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text + "\n")
        os.replace(tmp, path)  # a crash mid-write leaves the previous file intact
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> Calibrator:
        """Read calibration.json (path: the file, or the directory holding it)."""
        path = Path(path)
        if path.is_dir():
            path = path / CALIBRATION_FILE
        try:
            payload = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from error
        version = payload.pop("format_version", None) if isinstance(payload, dict) else None
        if version != FORMAT_VERSION:
            raise ValueError(
                f"{path} has calibration format_version {version!r}; this draftsmith reads "
                f"{FORMAT_VERSION}. Re-run calibration with this version."
            )
        return cls.from_dict({k: v for k, v in payload.items() if k in _CALIBRATOR_KEYS})

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


def _fit_temperature(loss_of: Callable[[torch.Tensor], torch.Tensor]) -> float:
    """Minimise loss_of(T) over T > 0 with L-BFGS on log T, starting from T = 1."""
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [log_t], lr=1.0, max_iter=100, tolerance_grad=1e-10, line_search_fn="strong_wolfe"
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = loss_of(log_t.exp())
        loss.backward()
        return loss

    optimizer.step(closure)
    return float(np.clip(math.exp(log_t.item()), *TEMPERATURE_RANGE))


def _soft_bce(log_p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy from log p (N,), p clipped to [EPS, 1 - EPS]."""
    log_p = log_p.clamp(math.log(EPS), math.log1p(-EPS))
    return -(y * log_p + (1 - y) * torch.log(-torch.expm1(log_p))).mean()


@register_calibrator("temperature")
class TemperatureScaling(Calibrator):
    """One temperature T, fitted by NLL with L-BFGS.

    On a probability signal p (`fit`): calibrated = sigmoid(logit(p) / T), p clipped to
    [EPS, 1 - EPS]. On the full draft distribution (`fit_logits`): calibrated =
    softmax(logits / temperature / T)[token]. T > 1 means the drafter was overconfident.
    """

    def __init__(self, signals: Sequence[str] = ("top1_prob",)) -> None:
        super().__init__(signals)
        if self.signals[0] not in PROBABILITY_SIGNALS:
            raise ValueError(
                f"temperature scaling needs a probability signal, one of "
                f"{sorted(PROBABILITY_SIGNALS)}; got {self.signals[0]!r}"
            )
        self.temperature = 1.0
        self.input = "signal"
        """"signal" after `fit`, "logits" after `fit_logits`."""

    def _fit(self, x: np.ndarray, y: np.ndarray) -> None:
        if x.min() < 0 or x.max() > 1:
            raise ValueError(f"signal {self.signals[0]!r} must lie in [0, 1] for temperature")
        z = torch.from_numpy(_logit(x[:, 0]))
        target = torch.from_numpy(y)
        self.temperature = _fit_temperature(
            lambda t: torch.nn.functional.binary_cross_entropy_with_logits(z / t, target)
        )
        self.input = "signal"

    def _predict(self, x: np.ndarray) -> np.ndarray:
        if self.input != "signal":
            raise ValueError(
                "this temperature calibrator was fitted on full draft logits; call "
                "predict_logits(logits, tokens) or predict_draft(logits, tokens)"
            )
        return _sigmoid(_logit(x[:, 0]) / self.temperature)

    def fit_logits(
        self,
        logits: torch.Tensor,
        draft_tokens: torch.Tensor,
        outcomes: np.ndarray | torch.Tensor,
        temperature: float = 1.0,
    ) -> TemperatureScaling:
        """Fit T on draft logits (N, V), drafted ids (N,) and outcomes (N,) in [0, 1].

        temperature is the sampling temperature the drafts were made at (1.0 for greedy); the
        same value must be passed to `predict_logits`. Holds an (N, V) float32 copy in memory.
        """
        log_conf = self._log_confidence(logits, draft_tokens, temperature)
        target = torch.from_numpy(_check_outcomes(outcomes, logits.shape[0])).float()
        self.temperature = _fit_temperature(lambda t: _soft_bce(log_conf(t), target))
        self.input = "logits"
        self.fitted = True
        return self

    def predict_logits(
        self, logits: torch.Tensor, draft_tokens: torch.Tensor, temperature: float = 1.0
    ) -> torch.Tensor:
        """softmax(logits / temperature / T)[draft_tokens]: (N,) float32 for logits (N, V)."""
        self._require_fitted()
        if self.input != "logits":
            raise ValueError(
                f"this temperature calibrator was fitted on the {self.signals[0]!r} signal; call "
                "predict(features) or predict_signals(signals)"
            )
        with torch.no_grad():
            return self._log_confidence(logits, draft_tokens, temperature)(self.temperature).exp()

    def predict_draft(
        self,
        logits: torch.Tensor,
        tokens: torch.Tensor | None = None,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """As `Calibrator.predict_draft`; after `fit_logits`, tokens default to the argmax."""
        if self.input != "logits":
            return super().predict_draft(logits, tokens, temperature)
        if tokens is None:
            check_logits(logits)
            tokens = logits.argmax(-1)
        return self.predict_logits(logits, tokens, temperature)

    @staticmethod
    def _log_confidence(
        logits: torch.Tensor, tokens: torch.Tensor, temperature: float
    ) -> Callable[[float | torch.Tensor], torch.Tensor]:
        """Validate inputs and return T -> log softmax(logits / temperature / T)[tokens] (N,)."""
        check_logits(logits)
        n, vocab = logits.shape
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
        if tokens.shape != (n,) or tokens.is_floating_point():
            raise ValueError(f"draft_tokens must be integer (N,)=({n},), got {tuple(tokens.shape)}")
        if n and (tokens.min() < 0 or tokens.max() >= vocab):
            raise ValueError(f"draft_tokens must lie in [0, {vocab}), the logits' vocabulary")
        scaled = logits.float() / temperature
        chosen = scaled.gather(1, tokens.long()[:, None]).squeeze(1)
        if not torch.isfinite(chosen).all():
            raise ValueError("some drafted tokens have logit -inf: the tokens do not match logits")
        return lambda t: chosen / t - torch.logsumexp(scaled / t, dim=-1)

    def _params(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "input": self.input}

    def _load(self, params: Mapping[str, Any]) -> None:
        temperature = float(params["temperature"])
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature calibrator: temperature must be > 0, got {temperature}")
        if params["input"] not in ("signal", "logits"):
            raise ValueError(
                f"temperature calibrator: input must be signal or logits, got {params}"
            )
        self.temperature, self.input = temperature, params["input"]


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
        return _sigmoid(x @ self.coef + self.intercept)

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


DEFAULT_CANDIDATES: tuple[str, ...] = ("temperature", "platt", "histogram", "isotonic")


@register_calibrator("auto")
class AutoCalibrator(Calibrator):
    """Pick the candidate kind with the lowest K-fold cross-validated NLL, refit it on all data.

    Single-signal kinds use the first signal, platt uses all of them; temperature is skipped
    when the first signal is not a probability. Folds are stratified on outcome >= 0.5 when each
    side has at least K tokens, plain shuffled K-fold otherwise; K = 5 by default. Ties go to
    the earlier candidate, so list simpler kinds first.

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
        unknown = [c for c in candidates if c not in _REGISTRY or c == "auto"]
        if unknown or not candidates:
            raise ValueError(f"bad candidates {unknown or '[]'}; choose from {DEFAULT_CANDIDATES}")
        self.folds, self.candidates, self.seed = folds, tuple(candidates), seed
        self.selected: Calibrator | None = None
        self.cv_nll: dict[str, float] = {}

    def _candidate_signals(self, kind: str) -> tuple[str, ...] | None:
        if kind == "temperature" and self.signals[0] not in PROBABILITY_SIGNALS:
            return None
        return self.signals if calibrator_class(kind).max_signals is None else self.signals[:1]

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
        columns = [self.signals.index(s) for s in self._candidate_signals(best)]
        self.selected = build_calibrator(best, self._candidate_signals(best))
        self.selected.fit(x[:, columns], y)

    def _predict(self, x: np.ndarray) -> np.ndarray:
        columns = [self.signals.index(s) for s in self.selected.signals]
        return self.selected.predict(x[:, columns])

    def to_dict(self) -> dict[str, Any]:
        self._require_fitted()
        selection = {"method": "auto", "folds": self.folds, "seed": self.seed}
        return {**self.selected.to_dict(), "selection": {**selection, "cv_nll": self.cv_nll}}

    def _params(self) -> dict[str, Any]:
        raise NotImplementedError("AutoCalibrator.to_dict stores the selected calibrator")

    def _load(self, params: Mapping[str, Any]) -> None:
        raise ValueError(
            "'auto' is resolved when fitted: calibration.json stores the chosen kind instead"
        )
