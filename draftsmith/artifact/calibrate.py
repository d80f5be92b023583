"""Calibrate an artifact's drafter on held-out data, or evaluate its existing calibration.

`draftsmith.calibration` collects, fits and scores with a loaded head; this module is the part
that needs the artifact itself (its layer sits above calibration): refusing an artifact
calibration cannot write into, loading its head and learned acceptance head, and reading the
calibration.json an evaluation scores. `prepare_calibration` checks everything on disk (the
artifact, its calibration, the data) before any model loads, so bad input fails in seconds;
`ArtifactCalibration.run` then takes the loaded target. `calibrate_artifact` and
`evaluate_artifact` do both in one call.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from draftsmith.artifact.acceptance import ACCEPTANCE_ENTRY
from draftsmith.artifact.engines import foreign_layout
from draftsmith.artifact.load import (
    load_acceptance_head,
    load_acceptance_model,
    load_head,
    read_artifact_config,
    trains_own_acceptance,
)
from draftsmith.calibration.calibrators import Calibrator, calibrator_class
from draftsmith.calibration.collect import collect_heldout
from draftsmith.calibration.evaluate import evaluation_report
from draftsmith.calibration.heldout import CollectChoice, HeldOutData, load_heldout
from draftsmith.calibration.io import CALIBRATION_FILE, read_calibration
from draftsmith.calibration.pipeline import CalibrateConfig, calibrate_records
from draftsmith.core.signals import ACCEPTANCE_HEAD_SIGNAL


@dataclass(frozen=True)
class ArtifactCalibration:
    """A calibration (or evaluation) of one artifact on held-out data, checked against
    everything on disk (`prepare_calibration`); `run` collects with the loaded target."""

    artifact: Path
    data: HeldOutData
    config: CalibrateConfig
    """The fit's or the evaluation's settings, its `collect` the one the data takes."""
    evaluate_only: bool = False
    """Refit nothing: score the raw top-1 probability and `calibrator` per workload."""
    calibrator: Calibrator | None = None
    """evaluate_only: the artifact's calibrator (None: it has none, raw only)."""
    draft_tokens: int = 4
    """decode: most tokens drafted per round."""

    def run(self, target: PreTrainedModel, tokenizer, *, target_name: str | None = None) -> dict:
        """Collect the drafted-token records of the artifact's head on `target`, then fit and
        write calibration.json and the report into the artifact (returns the calibration.json
        payload with the calibrator's own keys, `calibrate_records`), or, evaluate_only, score
        the records and write nothing (returns `evaluation_report` with the artifact, target,
        data and collection named). target_name: the target as the caller named it, recorded
        in the result (default: its name_or_path)."""
        head = load_head(self.artifact, target)
        acceptance = load_acceptance_head(self.artifact, head.state_size)
        if acceptance is None:  # the head's own (DSpark's confidence head), or none
            acceptance = head.own_acceptance()
        if acceptance is not None:
            acceptance = acceptance.to(target.device)
        records = collect_heldout(
            self.data,
            head,
            target,
            tokenizer,
            self.config,
            acceptance=acceptance,
            draft_tokens=self.draft_tokens,
            # Fitting cross-fits over documents; evaluating one needs no other.
            min_documents=1 if self.evaluate_only else 2,
        )
        named = {
            "artifact": str(self.artifact),
            "target": target.name_or_path if target_name is None else target_name,
            "data": self.data.name,
        }
        if self.evaluate_only:
            return {
                **named,
                "collect": self.data.collect,
                **evaluation_report(
                    records,
                    self.calibrator,
                    temperature=self.config.temperature,
                    n_bins=self.config.n_bins,
                ),
            }
        metadata = {key: named[key] for key in ("target", "data", "artifact")}
        return calibrate_records(records, self.artifact, self.config, metadata)


def prepare_calibration(
    artifact: str | Path,
    data: str,
    config: CalibrateConfig | None = None,
    *,
    collect: CollectChoice = "auto",
    evaluate_only: bool = False,
    draft_tokens: int = 4,
) -> ArtifactCalibration:
    """Check the artifact, its calibration (evaluate_only) and the data (`load_heldout`: read,
    and the collection chosen) before any model loads.

    Raises a ValueError naming the fix for an unknown method, a head in an engine's layout (not
    a draftsmith artifact to write into), `acceptance_head` among the signals of an artifact
    without a learned acceptance head, and (evaluate_only) a calibration.json that cannot be
    read; warns when evaluate_only finds no calibration.json or one fitted at another
    temperature.
    """
    artifact = Path(artifact)
    config = config or CalibrateConfig()
    calibrator_class(config.method)  # an unknown method fails before anything is read
    check_calibration_target(artifact, config.signals)
    calibrator = existing_calibrator(artifact, config.temperature) if evaluate_only else None
    heldout = load_heldout(data, collect, seq_len=config.seq_len)
    return ArtifactCalibration(
        artifact=artifact,
        data=heldout,
        config=replace(config, collect=heldout.collect),
        evaluate_only=evaluate_only,
        calibrator=calibrator,
        draft_tokens=draft_tokens,
    )


def calibrate_artifact(
    artifact: str | Path,
    target: PreTrainedModel,
    tokenizer,
    data: str,
    config: CalibrateConfig | None = None,
    *,
    evaluate_only: bool = False,
    collect: CollectChoice = "auto",
    draft_tokens: int = 4,
    target_name: str | None = None,
) -> dict:
    """Calibrate the artifact's confidence on held-out `data` (`prepare_calibration`, then
    `ArtifactCalibration.run`): writes calibration.json and calibration/ (report, plots,
    records) into the artifact and returns the calibration.json payload; evaluate_only, see
    `evaluate_artifact`."""
    prepared = prepare_calibration(
        artifact,
        data,
        config,
        collect=collect,
        evaluate_only=evaluate_only,
        draft_tokens=draft_tokens,
    )
    return prepared.run(target, tokenizer, target_name=target_name)


def evaluate_artifact(
    artifact: str | Path, target: PreTrainedModel, tokenizer, data: str, **options: Any
) -> dict:
    """Score the artifact's raw and calibrated confidence on held-out `data`, per workload
    and overall, refitting nothing and writing nothing; returns the report. options:
    `calibrate_artifact`'s config, collect, draft_tokens and target_name."""
    return calibrate_artifact(artifact, target, tokenizer, data, evaluate_only=True, **options)


def check_calibration_target(artifact: Path, signals: tuple[str, ...]) -> None:
    """Fail on an artifact calibration cannot write into or whose head lacks a signal asked
    for."""
    layout = foreign_layout(artifact)
    if layout is not None:
        raise ValueError(
            f"{artifact} holds a head in the {layout} layout; calibration writes into a "
            f"draftsmith artifact: import it first (draftsmith import {artifact} "
            "--target NAME --out ARTIFACT), then calibrate ARTIFACT"
        )
    config = read_artifact_config(artifact)
    learned = ACCEPTANCE_ENTRY in config or trains_own_acceptance(config)
    if ACCEPTANCE_HEAD_SIGNAL in signals and not learned:
        raise ValueError(
            f"--signals names {ACCEPTANCE_HEAD_SIGNAL}, but {artifact} has no learned "
            "acceptance head: train one into it (recipes/smollm2-135m/acceptance-head.yaml) "
            "or calibrate other signals"
        )


def existing_calibrator(artifact: Path, temperature: float) -> Calibrator | None:
    """The artifact's calibrator to evaluate at `temperature`; None (with a warning) when it
    has none."""
    path = artifact / CALIBRATION_FILE
    try:
        calibrator = load_acceptance_model(artifact)
    except ValueError as error:
        raise ValueError(
            f"--evaluate-only: {path} cannot be read ({error}); refit it (draftsmith "
            f"calibrate {artifact} --target ... --data ..., without --evaluate-only) "
            "or delete it to evaluate the raw confidence alone"
        ) from error
    if calibrator is None:
        warnings.warn(
            f"{artifact} has no {CALIBRATION_FILE}: evaluating the raw top-1 "
            "probability only (draftsmith calibrate without --evaluate-only fits one)",
            stacklevel=3,
        )
        return None
    fitted_at = read_calibration(path).get("temperature", 0.0)
    if fitted_at != temperature:
        warnings.warn(
            f"{path} was fitted at --temperature {fitted_at}, evaluated here at "
            f"{temperature}: pass --temperature {fitted_at} to evaluate it as fitted",
            stacklevel=3,
        )
    return calibrator
