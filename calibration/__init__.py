"""Confidence calibration: how far a drafter's confidence can be trusted as the probability that
the target accepts its drafted token.

signals (from draft logits) -> calibrators (fitted on held-out outcomes, saved as
calibration.json) -> metrics, plots and report (before/after).

Plotting and the report are imported on first use, so the decoder loading a calibrator does not
pay for matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

from draftsmith.calibration.calibrators import (
    CALIBRATION_FILE,
    AutoCalibrator,
    Calibrator,
    HistogramBinning,
    IsotonicCalibrator,
    PlattScaling,
    TemperatureScaling,
    build_calibrator,
    calibrator_class,
    register_calibrator,
)
from draftsmith.calibration.metrics import (
    BinStats,
    Interval,
    auroc,
    bin_stats,
    bootstrap_ci,
    brier_score,
    calibration_metrics,
    ece,
    ece_debiased,
    mce,
    nll,
)
from draftsmith.core.signals import (
    PROBABILITY_SIGNALS,
    SIGNAL_NAMES,
    check_logits,
    confidence_signals,
    signal_matrix,
)

_LAZY = {
    "PLOT_FILES": "plots",
    "plot_reliability": "plots",
    "plot_confidence_histogram": "plots",
    "plot_acceptance_by_position": "plots",
    "write_plots": "plots",
    "REPORT_FILE": "report",
    "format_table": "report",
    "write_report": "report",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CALIBRATION_FILE",
    "PROBABILITY_SIGNALS",
    "SIGNAL_NAMES",
    "AutoCalibrator",
    "BinStats",
    "Calibrator",
    "HistogramBinning",
    "Interval",
    "IsotonicCalibrator",
    "PlattScaling",
    "TemperatureScaling",
    "auroc",
    "bin_stats",
    "bootstrap_ci",
    "brier_score",
    "build_calibrator",
    "calibration_metrics",
    "calibrator_class",
    "check_logits",
    "confidence_signals",
    "ece",
    "ece_debiased",
    "mce",
    "nll",
    "register_calibrator",
    "signal_matrix",
    *_LAZY,
]
