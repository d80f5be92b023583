"""How well confidence predicts acceptance on new data, per workload, without refitting.

A calibration fitted on one kind of text can fail on another (a user's own traffic): this scores
the raw top-1 probability and an already fitted calibrator on freshly collected records
(`draftsmith.calibration.collect`), for each workload the records carry and over all of them.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from datasets import Dataset

from draftsmith.calibration.calibrators import Calibrator
from draftsmith.calibration.metrics import calibration_metrics

DEFAULT_WORKLOAD = "default"
"""The workload of records whose data named none."""


def outcome_column(temperature: float) -> str:
    """The outcome a calibration at `temperature` predicts: 0 (greedy verification) `accepted`,
    T > 0 (sampling) `accept_prob`."""
    return "accept_prob" if temperature > 0 else "accepted"


def evaluation_report(
    records: Dataset, calibrator: Calibrator | None, *, temperature: float, n_bins: int = 15
) -> dict:
    """`evaluate_calibration` of the outcome a calibration at `temperature` predicts, with what
    it scored: {"outcome", "temperature", "n_bins", "calibrator" (its `to_dict`, or None: raw
    only), "workloads", "overall"}."""
    outcome = outcome_column(temperature)
    return {
        "outcome": outcome,
        "temperature": temperature,
        "n_bins": n_bins,
        "calibrator": None if calibrator is None else calibrator.to_dict(),
        **evaluate_calibration(records, calibrator, outcome=outcome, n_bins=n_bins),
    }


def evaluate_calibration(
    records: Dataset, calibrator: Calibrator | None, *, outcome: str, n_bins: int = 15
) -> dict:
    """Metrics of the raw top-1 probability and, when given, of `calibrator`'s prediction.

    records: the collected drafted tokens (signal columns, `outcome`, optionally `workload`).
    Returns {"workloads": {name: {"raw": metrics, "calibrated": metrics}}, "overall": {...}},
    each metrics a `calibration_metrics` dict; workloads in order of first appearance.
    """
    confidences = {"raw": np.asarray(records["top1_prob"], dtype=np.float64)}
    if calibrator is not None:
        signals = {name: np.asarray(records[name]) for name in calibrator.signals}
        confidences["calibrated"] = calibrator.predict(signals)
    outcomes = np.asarray(records[outcome], dtype=np.float64)
    return {
        "workloads": metrics_by_workload(confidences, outcomes, workloads_of(records), n_bins),
        "overall": {
            side: calibration_metrics(conf, outcomes, n_bins) for side, conf in confidences.items()
        },
    }


def metrics_by_workload(
    confidences: Mapping[str, np.ndarray],
    outcomes: np.ndarray,
    workloads: np.ndarray,
    n_bins: int = 15,
) -> dict[str, dict[str, dict]]:
    """{workload: {side: `calibration_metrics`}} for confidences (N,) by side name (e.g. raw,
    calibrated), outcomes (N,) and workloads (N,) names; workloads in order of first appearance.
    """
    names = list(dict.fromkeys(workloads.tolist()))
    return {
        name: {
            side: calibration_metrics(conf[workloads == name], outcomes[workloads == name], n_bins)
            for side, conf in confidences.items()
        }
        for name in names
    }


def workloads_of(records: Dataset) -> np.ndarray:
    """(N,) workload names of the records (`DEFAULT_WORKLOAD` without a workload column)."""
    if "workload" in records.column_names:
        return np.asarray(records["workload"], dtype=object)
    return np.full(len(records), DEFAULT_WORKLOAD, dtype=object)
