"""Before/after calibration figures, written as PNG.

Figures are built on matplotlib's Agg canvas directly instead of through pyplot, so plotting
never switches the global backend or keeps figures alive (safe in scripts, tests and threads).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from draftsmith.calibration.metrics import bin_stats, check_conf_outcomes, ece

PLOT_FILES = {
    "reliability": "reliability.png",
    "confidence_histogram": "confidence_histogram.png",
    "acceptance_by_position": "acceptance_by_position.png",
}
"""File names `write_plots` uses, by figure."""

_BEFORE, _AFTER, _OBSERVED = "tab:orange", "tab:blue", "black"


def _figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Figure, path: str | os.PathLike) -> Path:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    figure.savefig(tmp, format="png", dpi=110)
    os.replace(tmp, path)  # never leave a half-written PNG under the final name
    return path


def _check_pair(
    conf_before: np.ndarray, conf_after: np.ndarray, outcomes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    conf_before, outcomes = check_conf_outcomes(conf_before, outcomes)
    conf_after, _ = check_conf_outcomes(conf_after, outcomes)
    return conf_before, conf_after, outcomes


def plot_reliability(
    conf_before: np.ndarray,
    conf_after: np.ndarray,
    outcomes: np.ndarray,
    path: str | os.PathLike,
    n_bins: int = 15,
) -> Path:
    """Reliability diagrams before (left) and after (right) calibration, equal-width bins.

    Top: acceptance rate per bin as bars, with each bin's mean confidence marked and the
    diagonal of perfect calibration. Bottom: drafted tokens per bin (log scale), so sparse bins
    are visible. conf_before, conf_after, outcomes (N,).
    """
    conf_before, conf_after, outcomes = _check_pair(conf_before, conf_after, outcomes)
    figure = _figure(10, 6)
    axes = figure.subplots(2, 2, sharex=True, height_ratios=[3, 1])
    for column, (label, conf, color) in enumerate(
        (("before", conf_before, _BEFORE), ("after", conf_after, _AFTER))
    ):
        stats = bin_stats(conf, outcomes, n_bins, "equal_width")
        centers = (stats.lower + stats.upper) / 2
        width = 1.0 / n_bins
        filled = stats.count > 0
        top, bottom = axes[0, column], axes[1, column]
        top.bar(
            centers[filled],
            stats.mean_outcome[filled],
            width=width * 0.9,
            color=color,
            alpha=0.6,
            label="acceptance rate",
        )
        top.plot(
            centers[filled],
            stats.mean_conf[filled],
            "_",
            color=_OBSERVED,
            markersize=12,
            label="mean confidence",
        )
        top.plot([0, 1], [0, 1], "--", color="grey", linewidth=1, label="perfect calibration")
        error = ece(conf, outcomes, n_bins)
        top.set(
            title=f"{label} calibration (ECE {error:.4f})",
            ylabel="acceptance rate",
            xlim=(0, 1),
            ylim=(0, 1),
        )
        top.legend(loc="upper left", fontsize="small")
        bottom.bar(centers, stats.count, width=width * 0.9, color=color)
        bottom.set(xlabel="confidence", ylabel="tokens", yscale="symlog")
    return _save(figure, path)


def plot_confidence_histogram(
    conf_before: np.ndarray,
    conf_after: np.ndarray,
    outcomes: np.ndarray,
    path: str | os.PathLike,
    n_bins: int = 20,
) -> Path:
    """Histograms of confidence before (left) and after (right), stacked into accepted mass
    (sum of outcomes) and rejected mass (sum of 1 - outcomes), with the mean confidence and the
    acceptance rate marked. conf_before, conf_after, outcomes (N,)."""
    conf_before, conf_after, outcomes = _check_pair(conf_before, conf_after, outcomes)
    figure = _figure(10, 3.5)
    axes = figure.subplots(1, 2, sharey=True)
    edges = np.linspace(0, 1, n_bins + 1)
    for ax, (label, conf) in zip(
        axes, (("before", conf_before), ("after", conf_after)), strict=True
    ):
        ax.hist(
            [conf, conf],
            bins=edges,
            weights=[outcomes, 1 - outcomes],
            stacked=True,
            color=["tab:green", "tab:red"],
            label=["accepted", "rejected"],
        )
        ax.axvline(conf.mean(), color=_OBSERVED, linestyle="-", label="mean confidence")
        ax.axvline(outcomes.mean(), color="grey", linestyle="--", label="acceptance rate")
        ax.set(title=f"confidence {label} calibration", xlabel="confidence", xlim=(0, 1))
        ax.legend(fontsize="small")
    axes[0].set_ylabel("drafted tokens")
    return _save(figure, path)


def plot_acceptance_by_position(
    position: np.ndarray,
    outcomes: np.ndarray,
    conf_before: np.ndarray,
    conf_after: np.ndarray,
    path: str | os.PathLike,
) -> Path:
    """Acceptance rate and mean confidence before and after calibration per draft position.

    Top: observed acceptance rate, mean confidence before and after, per 0-based position.
    Bottom: drafted tokens per position. position (N,) integer-valued, the rest (N,).
    """
    conf_before, conf_after, outcomes = _check_pair(conf_before, conf_after, outcomes)
    position = np.asarray(position, dtype=np.float64)
    if position.shape != outcomes.shape or (position < 0).any() or (position % 1).any():
        raise ValueError(f"position must be (N,)=({outcomes.size},) non-negative integers")
    index = position.astype(np.int64)
    count = np.bincount(index)
    present = np.flatnonzero(count)

    def per_position(values: np.ndarray) -> np.ndarray:
        return np.bincount(index, values, count.size)[present] / count[present]

    figure = _figure(7, 5)
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    top.plot(present, per_position(outcomes), "o-", color=_OBSERVED, label="acceptance rate")
    top.plot(present, per_position(conf_before), "s--", color=_BEFORE, label="confidence before")
    top.plot(present, per_position(conf_after), "^-", color=_AFTER, label="confidence after")
    top.set(title="acceptance by draft position", ylabel="rate", ylim=(0, 1.02))
    top.legend(fontsize="small")
    bottom.bar(present, count[present], color="grey")
    bottom.set(xlabel="draft position (0-based)", ylabel="tokens", xticks=present)
    return _save(figure, path)


def write_plots(
    out_dir: str | os.PathLike,
    conf_before: np.ndarray,
    conf_after: np.ndarray,
    outcomes: np.ndarray,
    position: np.ndarray | None = None,
    n_bins: int = 15,
) -> dict[str, Path]:
    """Write the standard figures (`PLOT_FILES`) into out_dir; returns their paths by name.

    The by-position figure is skipped when position is None.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "reliability": plot_reliability(
            conf_before, conf_after, outcomes, out_dir / PLOT_FILES["reliability"], n_bins
        ),
        "confidence_histogram": plot_confidence_histogram(
            conf_before, conf_after, outcomes, out_dir / PLOT_FILES["confidence_histogram"]
        ),
    }
    if position is not None:
        paths["acceptance_by_position"] = plot_acceptance_by_position(
            position,
            outcomes,
            conf_before,
            conf_after,
            out_dir / PLOT_FILES["acceptance_by_position"],
        )
    return paths
