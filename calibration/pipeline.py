"""Calibrate a drafter's confidence on held-out data and write the result into its artifact.

records of drafted tokens (`draftsmith.calibration.collect`: teacher-forced over held-out rows,
or from decoding held-out prompts) -> split by source (row or prompt) into fit / eval halves ->
fit the calibrator on one half -> metrics, plots and report, raw vs calibrated, on the other
half -> calibration.json + calibration/report.md.
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
from draftsmith.calibration.collect import collect_from_decoding
from draftsmith.calibration.metrics import calibration_metrics
from draftsmith.decoding import SpeculativeDecoder

logger = logging.getLogger(__name__)

REPORT_DIR = "calibration"


Collection = Literal["teacher-forced", "decode"]


@dataclass(kw_only=True)
class CalibrateConfig:
    method: str = "auto"
    """auto, temperature, platt, isotonic or histogram."""
    temperature: float = 0.0
    """0 calibrates for greedy verification (outcome: draft token == target argmax); T > 0 for
    sampling at temperature T (outcome: the acceptance probability min(1, p/q))."""
    signals: tuple[str, ...] = ("top1_prob", "margin", "entropy", "position")
    """Signals the calibrator may use (single-signal methods use the first)."""
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
    fit_fraction: float = 0.5
    """Share of prompts whose tokens fit the calibrator; the rest only evaluate it."""
    n_bins: int = 15
    seed: int = 0


def prompts_from_texts(
    texts: Sequence[str], tokenizer, prompt_tokens: int, stride: int, max_prompts: int
) -> list[list[int]]:
    """Cut held-out documents into prompts of prompt_tokens tokens, one every `stride` tokens."""
    prompts: list[list[int]] = []
    for text in texts:
        ids = tokenizer(text).input_ids
        for start in range(0, max(len(ids) - prompt_tokens, 0) + 1, stride):
            window = ids[start : start + prompt_tokens]
            if len(window) == prompt_tokens:
                prompts.append(window)
            if len(prompts) == max_prompts:
                return prompts
    if not prompts:
        raise ValueError(
            f"no held-out document has {prompt_tokens} tokens: give longer texts or lower "
            "--prompt-tokens"
        )
    return prompts


def calibrate_decoder(
    decoder: SpeculativeDecoder,
    prompts: Sequence[str | list[int]],
    artifact_dir: str | Path,
    config: CalibrateConfig,
    metadata: dict | None = None,
) -> dict:
    """Decode `prompts` recording every informative drafted token, then `calibrate_records`."""
    sampling = config.temperature > 0
    records = collect_from_decoding(
        decoder,
        prompts,
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature if sampling else 1.0,
        decode_temperature=config.temperature,
        seed=config.seed,
    )
    return calibrate_records(records, artifact_dir, config, metadata)


def calibrate_records(
    records: Dataset,
    artifact_dir: str | Path,
    config: CalibrateConfig,
    metadata: dict | None = None,
) -> dict:
    """Fit on some sources' records, evaluate on the others', and write calibration.json + the
    report into artifact_dir. Returns the calibration.json payload."""
    outcome = "accept_prob" if config.temperature > 0 else "accepted"
    fit, held_out = split_by_source(records, config.fit_fraction)
    # Single-signal methods (temperature, isotonic, histogram) take the first signal.
    names = config.signals[: calibrator_class(config.method).max_signals]
    signals = {name: np.asarray(fit[name]) for name in names}
    calibrator = build_calibrator(config.method, signals=names).fit(
        signals, np.asarray(fit[outcome])
    )
    y = np.asarray(held_out[outcome])
    raw = np.asarray(held_out["top1_prob"])  # the drafter's own, uncalibrated confidence
    calibrated = calibrator.predict({name: np.asarray(held_out[name]) for name in names})
    before = calibration_metrics(raw, y, n_bins=config.n_bins)
    after = calibration_metrics(calibrated, y, n_bins=config.n_bins)

    artifact_dir = Path(artifact_dir)
    payload = {
        "method": calibrator.to_dict()["kind"],  # auto reports the kind it chose
        "requested_method": config.method,
        "outcome": outcome,
        "temperature": config.temperature,
        "n_fit": len(fit),
        "n_eval": len(held_out),
        "metrics": {"before": before, "after": after},
        "config": asdict(config),
        **(metadata or {}),
    }
    path = calibrator.save(artifact_dir, payload)
    summary = {k: payload[k] for k in ("method", "outcome", "temperature", "n_fit", "n_eval")}
    _write_report(
        artifact_dir / REPORT_DIR,
        raw,
        calibrated,
        np.asarray(held_out["position"]),
        y,
        (before, after),
        {**summary, **(metadata or {})},
    )
    logger.info("wrote %s and %s", path, artifact_dir / REPORT_DIR)
    return {**payload, **calibrator.to_dict()}


def split_by_source(records: Dataset, fit_fraction: float) -> tuple[Dataset, Dataset]:
    """Split rows by the prompt they came from (never within one prompt's tokens)."""
    sources = sorted(set(records["source"]))
    if len(sources) < 2:
        raise ValueError("calibration needs drafted tokens from at least 2 prompts: give more data")
    rng = np.random.default_rng(0)
    order = rng.permutation(sources)
    n_fit = min(max(1, round(len(sources) * fit_fraction)), len(sources) - 1)
    fit_sources = set(order[:n_fit].tolist())
    is_fit = [s in fit_sources for s in records["source"]]
    fit = records.select([i for i, f in enumerate(is_fit) if f])
    held_out = records.select([i for i, f in enumerate(is_fit) if not f])
    return fit, held_out


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
