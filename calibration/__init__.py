"""Calibration: collect drafted tokens' confidence and outcomes, fit calibrators, report.

held-out data (`heldout`: which collection it takes) -> collect (signals from
`draftsmith.core.signals`, outcomes; `collect_heldout` with a loaded head) -> calibrators (kinds,
auto selection) -> calibration.json (`io`) -> metrics, plots and report; `pipeline` runs them end
to end; `evaluate` scores an existing calibrator per workload. Calibrating an artifact by its
path (loading its head) is `draftsmith.artifact.calibrate_artifact`, a layer up. Collection, the
pipeline, plots and the report load on first use, so the decoder loading a calibrator pays for
neither datasets nor matplotlib.
"""

from __future__ import annotations

from draftsmith.calibration.calibrators import (
    Calibrator,
    build_calibrator,
    calibrator_class,
    register_calibrator,
)
from draftsmith.calibration.io import CALIBRATION_FILE

# Imported for their registration too: `Calibrator.load` finds every kind by name.
from draftsmith.calibration.kinds import (
    HistogramBinning,
    IsotonicCalibrator,
    PlattScaling,
    TemperatureScaling,
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
from draftsmith.calibration.selection import AutoCalibrator
from draftsmith.core.lazy import lazy_exports

_LAZY = {
    "collect_from_decoding": "collect",
    "collect_teacher_forced": "collect",
    "collect_heldout": "collect",
    "HeldOutData": "heldout",
    "load_heldout": "heldout",
    "read_heldout_jsonl": "heldout",
    "CalibrateConfig": "pipeline",
    "calibrate_records": "pipeline",
    "prompt_windows": "pipeline",
    "evaluate_calibration": "evaluate",
    "evaluation_report": "evaluate",
    "metrics_by_workload": "evaluate",
    "PLOT_FILES": "plots",
    "plot_reliability": "plots",
    "plot_confidence_histogram": "plots",
    "plot_acceptance_by_position": "plots",
    "write_plots": "plots",
    "REPORT_FILE": "report",
    "format_table": "report",
    "format_workload_table": "report",
    "write_report": "report",
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "CALIBRATION_FILE",
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
    "ece",
    "ece_debiased",
    "mce",
    "nll",
    "register_calibrator",
    *_LAZY,
]
