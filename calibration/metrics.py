"""How far a confidence can be trusted as the probability that a drafted token is accepted.

Every function takes conf (N,) in [0, 1] and outcomes (N,) in [0, 1]. Outcomes may be soft: under
sampling the natural target is the acceptance probability min(1, p/q) rather than the coin flip,
and every metric here is defined for fractional outcomes (lower variance, same expectation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

EPS = 1e-7
"""Probabilities are clipped to [EPS, 1 - EPS] in the NLL, so one confident miss costs at most
-log(EPS) ~= 16.1 nats instead of infinity."""

Binning = Literal["equal_width", "equal_mass"]


def check_conf_outcomes(conf: np.ndarray, outcomes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Validate conf (N,) and outcomes (N,) and return them as float64 arrays."""
    conf = np.asarray(conf, dtype=np.float64)
    outcomes = np.asarray(outcomes, dtype=np.float64)
    if conf.ndim != 1 or outcomes.shape != conf.shape:
        raise ValueError(
            f"conf and outcomes must both be (N,), got {conf.shape} and {outcomes.shape}"
        )
    if conf.size == 0:
        raise ValueError("no drafted tokens to evaluate (N=0); collect held-out drafts first")
    for name, values in (("conf", conf), ("outcomes", outcomes)):
        if not np.isfinite(values).all():
            raise ValueError(f"{name} has {int((~np.isfinite(values)).sum())} NaN/inf values")
        if values.min() < 0 or values.max() > 1:
            raise ValueError(
                f"{name} must lie in [0, 1], got range [{values.min():.4g}, {values.max():.4g}]"
            )
    return conf, outcomes


@dataclass(frozen=True)
class BinStats:
    """Per-bin summary of a reliability diagram; empty bins have count 0 and NaN means."""

    lower: np.ndarray
    """(B,) lower bin edge: i / B for equal-width bins, the smallest confidence for equal-mass."""
    upper: np.ndarray
    """(B,) upper bin edge: (i + 1) / B, or the largest confidence in an equal-mass bin."""
    count: np.ndarray
    """(B,) number of drafted tokens in the bin."""
    mean_conf: np.ndarray
    """(B,) mean confidence in the bin."""
    mean_outcome: np.ndarray
    """(B,) mean outcome (acceptance rate) in the bin."""
    var_outcome: np.ndarray
    """(B,) sample variance (ddof=1) of the outcomes in the bin; NaN with fewer than two."""

    @property
    def gap(self) -> np.ndarray:
        """(B,) |mean outcome - mean confidence| per bin."""
        return np.abs(self.mean_outcome - self.mean_conf)


def bin_stats(
    conf: np.ndarray, outcomes: np.ndarray, n_bins: int = 15, binning: Binning = "equal_width"
) -> BinStats:
    """Bin drafted tokens by confidence.

    equal_width: bins [i/B, (i+1)/B), the last one closed at 1. equal_mass: tokens sorted by
    confidence (stable) and split into B runs whose sizes differ by at most one, so ties may
    straddle two bins; with N < B some bins are empty.
    """
    conf, outcomes = check_conf_outcomes(conf, outcomes)
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    if binning == "equal_width":
        index = np.minimum((conf * n_bins).astype(np.int64), n_bins - 1)
    elif binning == "equal_mass":
        order = np.argsort(conf, kind="stable")
        sizes = [len(run) for run in np.array_split(order, n_bins)]
        index = np.empty_like(order)
        index[order] = np.repeat(np.arange(n_bins), sizes)
    else:
        raise ValueError(f"binning must be 'equal_width' or 'equal_mass', got {binning!r}")

    count = np.bincount(index, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(index, conf, n_bins) / count
        mean_outcome = np.bincount(index, outcomes, n_bins) / count
        sq = np.bincount(index, outcomes**2, n_bins)
        var = (sq - count * mean_outcome**2) / (count - 1)
    var = np.where(count > 1, np.maximum(var, 0.0), np.nan)
    if binning == "equal_width":
        lower = np.arange(n_bins) / n_bins
        upper = np.arange(1, n_bins + 1) / n_bins
    else:
        lower = np.full(n_bins, np.inf)
        upper = np.full(n_bins, -np.inf)
        np.minimum.at(lower, index, conf)
        np.maximum.at(upper, index, conf)
        lower[count == 0] = upper[count == 0] = np.nan
    return BinStats(lower, upper, count, mean_conf, mean_outcome, var)


def ece(
    conf: np.ndarray, outcomes: np.ndarray, n_bins: int = 15, binning: Binning = "equal_width"
) -> float:
    """Expected calibration error: sum over bins of (n_b / N) * |mean outcome - mean conf|."""
    stats = bin_stats(conf, outcomes, n_bins, binning)
    filled = stats.count > 0
    return float(np.sum(stats.count[filled] * stats.gap[filled]) / stats.count.sum())


def mce(
    conf: np.ndarray, outcomes: np.ndarray, n_bins: int = 15, binning: Binning = "equal_width"
) -> float:
    """Maximum calibration error: the largest |mean outcome - mean conf| over non-empty bins."""
    stats = bin_stats(conf, outcomes, n_bins, binning)
    return float(np.max(stats.gap[stats.count > 0]))


def ece_debiased(conf: np.ndarray, outcomes: np.ndarray, n_bins: int = 15) -> float:
    """Debiased L2 calibration error of Kumar, Liang and Ma (2019), "Verified Uncertainty
    Calibration", over equal-mass bins.

    The plug-in squared gap (mean outcome - mean conf)^2 of a bin overestimates the true one by
    the variance of the bin's mean outcome; this subtracts its unbiased estimate s_b^2 / n_b
    (s_b^2 the sample variance, which for hard 0/1 outcomes is Kumar's y(1-y)/(n_b - 1)), skips
    bins with fewer than two tokens as they do, and returns sqrt(max(sum_b (n_b/N) * that, 0)).
    It is an RMS error, so it is not on the same scale as the L1 `ece`.
    """
    stats = bin_stats(conf, outcomes, n_bins, "equal_mass")
    usable = stats.count > 1
    per_bin = stats.gap[usable] ** 2 - stats.var_outcome[usable] / stats.count[usable]
    squared = np.sum(stats.count[usable] * per_bin) / stats.count.sum()
    return float(np.sqrt(max(squared, 0.0)))


def brier_score(conf: np.ndarray, outcomes: np.ndarray) -> float:
    """Mean squared error between confidence and outcome."""
    conf, outcomes = check_conf_outcomes(conf, outcomes)
    return float(np.mean((conf - outcomes) ** 2))


def nll(conf: np.ndarray, outcomes: np.ndarray) -> float:
    """Mean binary cross-entropy in nats, confidence clipped to [EPS, 1 - EPS]."""
    conf, outcomes = check_conf_outcomes(conf, outcomes)
    conf = np.clip(conf, EPS, 1 - EPS)
    return float(-np.mean(outcomes * np.log(conf) + (1 - outcomes) * np.log1p(-conf)))


def auroc(conf: np.ndarray, outcomes: np.ndarray) -> float:
    """Area under the ROC curve of confidence as a score for acceptance; NaN with one class.

    Soft outcomes use the duplication trick: each token counts as a positive with weight y and a
    negative with weight 1 - y, which equals the usual AUROC for hard 0/1 outcomes.
    """
    conf, outcomes = check_conf_outcomes(conf, outcomes)
    if outcomes.sum() == 0 or (1 - outcomes).sum() == 0:
        return float("nan")
    # Imported here so loading a calibrator for decoding does not pay for scikit-learn.
    from sklearn.metrics import roc_auc_score

    n = conf.size
    labels = np.concatenate([np.ones(n), np.zeros(n)])
    weights = np.concatenate([outcomes, 1 - outcomes])
    return float(roc_auc_score(labels, np.concatenate([conf, conf]), sample_weight=weights))


class Interval(NamedTuple):
    estimate: float
    """The metric on the full data."""
    low: float
    high: float


def bootstrap_ci(
    metric_fn: Callable[[np.ndarray, np.ndarray], float],
    conf: np.ndarray,
    outcomes: np.ndarray,
    n: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
    groups: np.ndarray | None = None,
) -> Interval:
    """Percentile bootstrap (1 - alpha) confidence interval of metric_fn(conf, outcomes).

    Resamples n times with replacement: drafted tokens, or with `groups` (N,) whole groups
    (documents or prompts: a cluster bootstrap, honest when tokens of one group are correlated,
    as drafts of one document are). Replicates where the metric is NaN (an AUROC resample with
    one class) are dropped.
    """
    conf, outcomes = check_conf_outcomes(conf, outcomes)
    if n < 1 or not 0 < alpha < 1:
        raise ValueError(f"need n >= 1 and 0 < alpha < 1, got n={n}, alpha={alpha}")
    rng = np.random.default_rng(seed)
    members = None
    if groups is not None:
        groups = np.asarray(groups)
        if groups.shape != conf.shape:
            raise ValueError(f"groups must be ({conf.size},), got {groups.shape}")
        order = np.argsort(groups, kind="stable")
        members = np.split(order, np.flatnonzero(np.diff(groups[order])) + 1)
    replicates = np.empty(n)
    for i in range(n):
        if members is None:
            index = rng.integers(0, conf.size, conf.size)
        else:
            picked = rng.integers(0, len(members), len(members))
            index = np.concatenate([members[j] for j in picked])
        replicates[i] = metric_fn(conf[index], outcomes[index])
    replicates = replicates[~np.isnan(replicates)]
    if replicates.size == 0:
        raise ValueError(f"{metric_fn.__name__} was NaN on every bootstrap resample")
    low, high = np.quantile(replicates, [alpha / 2, 1 - alpha / 2])
    return Interval(float(metric_fn(conf, outcomes)), float(low), float(high))


def calibration_metrics(
    conf: np.ndarray, outcomes: np.ndarray, n_bins: int = 15
) -> dict[str, float]:
    """All the metrics of one set of confidences, for the calibration report and calibration.json.

    Keys: ece (equal-width), ece_equal_mass, ece_debiased (L2, see `ece_debiased`), mce
    (equal-width), brier, nll, auroc (NaN with one class), n, mean_confidence, acceptance_rate.
    """
    conf, outcomes = check_conf_outcomes(conf, outcomes)
    return {
        "ece": ece(conf, outcomes, n_bins, "equal_width"),
        "ece_equal_mass": ece(conf, outcomes, n_bins, "equal_mass"),
        "ece_debiased": ece_debiased(conf, outcomes, n_bins),
        "mce": mce(conf, outcomes, n_bins, "equal_width"),
        "brier": brier_score(conf, outcomes),
        "nll": nll(conf, outcomes),
        "auroc": auroc(conf, outcomes),
        "n": int(conf.size),
        "mean_confidence": float(conf.mean()),
        "acceptance_rate": float(outcomes.mean()),
    }
