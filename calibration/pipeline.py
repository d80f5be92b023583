"""Calibrate a drafter's confidence on held-out data and write the result into its artifact.

records of drafted tokens (`draftsmith.calibration.collect`: teacher-forced over held-out
documents, or from decoding held-out prompts) -> K folds of sources (documents or prompts) ->
each fold scored by a calibrator fitted on the other folds (cross-fitting) -> metrics, plots and
report, raw vs calibrated, over every token, each scored out of sample -> the calibrator fitted
on all folds -> calibration.json + calibration/report.md (and the records, records.parquet).

Why cross-fitting rather than one fit / eval split: acceptance varies far more between documents
than within one, so two halves differ in base rate by chance, and a single split's ECE measures
that luck as much as the calibrator. Scoring every fold out of sample and pooling averages the
fold differences out, and no token is ever scored by a calibrator that saw its document.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from datasets import Dataset

from draftsmith.calibration.calibrators import build_calibrator, calibrator_class
from draftsmith.calibration.evaluate import metrics_by_workload, outcome_column, workloads_of
from draftsmith.calibration.metrics import bootstrap_ci, calibration_metrics, ece

logger = logging.getLogger(__name__)

REPORT_DIR = "calibration"
RECORDS_FILE = "records.parquet"


Collection = Literal["teacher-forced", "decode"]


@dataclass(kw_only=True)
class CalibrateConfig:
    method: str = "auto"
    """auto, temperature, platt, isotonic or histogram."""
    temperature: float = 0.0
    """0 calibrates for greedy verification (outcome: draft token == target argmax); T > 0 for
    sampling at temperature T (outcome: the acceptance probability min(1, p/q))."""
    signals: tuple[str, ...] = ("top1_prob", "margin", "entropy", "position", "context_match")
    """Signals the calibrator may use (single-signal methods use the first). `context_match`
    (the drafted token repeats an n-gram of the text before it) separates tokens accepted far
    more often than their confidence says from the rest (benchmarks/notes/calibration.md)."""
    collect: Collection = "teacher-forced"
    """teacher-forced: score draft chains at every position of held-out rows in one pass (exact
    for greedy decoding where the text is the target's own greedy output; see
    `draftsmith.calibration.collect`); decode: record real decoding runs of held-out prompts."""
    seq_len: int = 512
    """teacher-forced: longest held-out document scored (longer ones are cut)."""
    max_tokens: int = 262_144
    """teacher-forced: held-out tokens scored, in whole documents."""
    prompt_tokens: int = 64
    """decode: tokens of held-out text given as each prompt."""
    max_new_tokens: int = 64
    """decode: tokens decoded after each prompt."""
    max_prompts: int = 64
    """decode: prompts decoded."""
    folds: int = 5
    """Folds of sources for cross-fitting: each fold is scored by a calibrator fitted on the
    others (at most one fold per source)."""
    n_bins: int = 15
    """Bins of the reliability diagram and of ECE (equal-mass for the headline ECE)."""
    seed: int = 0
    """Seeds the document folds, the bootstrap and the sampled decoding."""


def prompt_windows(
    texts: Sequence[str], tokenizer, prompt_tokens: int, stride: int, max_prompts: int
) -> list[tuple[int, list[int]]]:
    """Cut held-out documents into prompts of prompt_tokens tokens, one every `stride` tokens:
    (index of the text cut, its prompt_tokens ids) pairs, so each prompt keeps its text's
    workload."""
    prompts: list[tuple[int, list[int]]] = []
    for index, text in enumerate(texts):
        ids = tokenizer(text).input_ids
        for start in range(0, max(len(ids) - prompt_tokens, 0) + 1, stride):
            window = ids[start : start + prompt_tokens]
            if len(window) == prompt_tokens:
                prompts.append((index, window))
            if len(prompts) == max_prompts:
                return prompts
    if not prompts:
        raise ValueError(
            f"no held-out document has {prompt_tokens} tokens: give longer texts or lower "
            "--prompt-tokens"
        )
    return prompts


def calibrate_records(
    records: Dataset,
    artifact_dir: str | Path,
    config: CalibrateConfig,
    metadata: dict | None = None,
) -> dict:
    """Cross-fit by source (see the module doc), fit the saved calibrator on every record, and
    write calibration.json + the report into artifact_dir. Records with a `workload` column
    also get the before / after metrics of each workload (`metrics_by_workload`). Returns the
    calibration.json payload."""
    outcome = outcome_column(config.temperature)
    # Single-signal methods (temperature, isotonic, histogram) take the first signal.
    names = config.signals[: calibrator_class(config.method).max_signals]
    signals = {name: np.asarray(records[name]) for name in names}
    y = np.asarray(records[outcome])
    raw = np.asarray(records["top1_prob"])  # the drafter's own, uncalibrated confidence
    sources = np.asarray(records["source"])
    calibrated = cross_fit(config.method, signals, y, sources, config.folds, config.seed)
    calibrator = build_calibrator(config.method, signals=names).fit(signals, y)
    before = calibration_metrics(raw, y, n_bins=config.n_bins)
    after = calibration_metrics(calibrated, y, n_bins=config.n_bins)
    n_sources = len(np.unique(sources))

    def equal_mass_ece(conf: np.ndarray, outcomes: np.ndarray) -> float:
        return ece(conf, outcomes, config.n_bins, "equal_mass")

    ci95 = {  # resampling whole documents / prompts: their tokens are correlated
        side: list(bootstrap_ci(equal_mass_ece, conf, y, n=200, groups=sources)[1:])
        for side, conf in (("before", raw), ("after", calibrated))
    }

    by_workload = {}
    if "workload" in records.column_names:  # the data named workloads: break the metrics down
        by_workload["metrics_by_workload"] = metrics_by_workload(
            {"before": raw, "after": calibrated}, y, workloads_of(records), config.n_bins
        )
    artifact_dir = Path(artifact_dir)
    payload = {
        "method": calibrator.to_dict()["kind"],  # auto reports the kind it chose
        "requested_method": config.method,
        "outcome": outcome,
        "temperature": config.temperature,
        "n_fit": len(y),
        "n_eval": len(y),
        "evaluation": f"{min(config.folds, n_sources)}-fold cross-fitted over {n_sources} sources",
        "metrics": {"before": before, "after": after},
        "ece_equal_mass_ci95": ci95,
        **by_workload,
        "config": asdict(config),
        **(metadata or {}),
    }
    path = calibrator.save(artifact_dir, payload)
    summary = {k: payload[k] for k in ("method", "outcome", "temperature", "n_fit", "evaluation")}
    _write_report(
        artifact_dir / REPORT_DIR,
        raw,
        calibrated,
        np.asarray(records["position"]),
        y,
        (before, after),
        {**summary, **(metadata or {})},
    )
    # The drafted-token records themselves (signals, outcomes, source, the out-of-fold
    # calibrated confidence), for analyses the report does not make.
    records.add_column("calibrated", calibrated).to_parquet(
        str(artifact_dir / REPORT_DIR / RECORDS_FILE)
    )
    logger.info("wrote %s and %s", path, artifact_dir / REPORT_DIR)
    return {**payload, **calibrator.to_dict()}


def cross_fit(
    method: str,
    signals: dict[str, np.ndarray],
    outcomes: np.ndarray,
    sources: np.ndarray,
    folds: int,
    seed: int = 0,
) -> np.ndarray:
    """Every record's P(accept) (N,) from a `method` calibrator over `signals` (each (N,))
    fitted on the other folds of sources (`source_folds`): each scored out of sample."""
    names = list(signals)
    predicted = np.empty_like(outcomes, dtype=np.float64)
    for scored in source_folds(sources, folds, seed):
        fitted = np.ones(len(outcomes), dtype=bool)
        fitted[scored] = False
        calibrator = build_calibrator(method, signals=names).fit(
            {name: values[fitted] for name, values in signals.items()}, outcomes[fitted]
        )
        predicted[scored] = calibrator.predict(
            {name: values[scored] for name, values in signals.items()}
        )
    return predicted


def source_folds(sources: np.ndarray, folds: int, seed: int = 0) -> list[np.ndarray]:
    """Row indices of each fold, folds made of whole sources (shuffled by `seed`, dealt round
    robin); min(folds, number of sources) folds.

    Raises a ValueError with fewer than 2 sources: nothing would be left to score out of sample.
    """
    unique = np.unique(sources)
    if len(unique) < 2:
        raise ValueError(
            "calibration needs drafted tokens from at least 2 documents or prompts (it scores "
            "each with a calibrator fitted on the others): give more data"
        )
    order = np.random.default_rng(seed).permutation(unique)
    fold_of = {source: i % min(folds, len(unique)) for i, source in enumerate(order.tolist())}
    assigned = np.array([fold_of[source] for source in sources.tolist()])
    return [np.flatnonzero(assigned == fold) for fold in range(min(folds, len(unique)))]


def _write_report(
    out_dir: Path,
    raw: np.ndarray,
    calibrated: np.ndarray,
    position: np.ndarray,
    y: np.ndarray,
    metrics: tuple[dict, dict],
    metadata: dict,
) -> None:
    """Reliability diagram, confidence histogram, acceptance by position, and report.md."""
    from draftsmith.calibration.plots import write_plots
    from draftsmith.calibration.report import write_report

    plots = write_plots(out_dir, raw, calibrated, y, position=position)
    write_report(out_dir, *metrics, plots, metadata=metadata)
