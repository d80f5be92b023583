"""calibration.json: round trips, files written by earlier versions, and bad files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from draftsmith.calibration import CALIBRATION_FILE, Calibrator, build_calibrator

KINDS = ("temperature", "platt", "isotonic", "histogram", "auto")
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def held_out() -> tuple[np.ndarray, np.ndarray]:
    """conf (N,) and outcomes (N,) ~ Bernoulli(conf^2): an overconfident drafter."""
    rng = np.random.default_rng(7)
    conf = rng.uniform(0.01, 0.99, 2000)
    return conf, (rng.uniform(size=conf.size) < conf**2).astype(np.float64)


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_round_trip_gives_identical_predictions(kind, held_out, tmp_path):
    conf, outcomes = held_out
    signals = ["top1_prob", "entropy"] if kind in ("platt", "auto") else ["top1_prob"]
    calibrator = build_calibrator(kind, signals=signals)
    calibrator.fit({"top1_prob": conf, "entropy": -np.log(conf)}, outcomes)
    path = calibrator.save(tmp_path, {"metrics": {"before": {"ece": 0.1, "auroc": float("nan")}}})
    assert path == tmp_path / CALIBRATION_FILE
    assert [p.name for p in tmp_path.iterdir()] == [CALIBRATION_FILE]  # no temporary left
    payload = json.loads(path.read_text())  # plain JSON: NaN was written as null
    assert payload["format_version"] == 1 and payload["metrics"]["before"]["auroc"] is None
    loaded = Calibrator.load(tmp_path)
    # auto saves the kind it chose, over that kind's signals, and its selection record.
    chosen = calibrator.selected if kind == "auto" else calibrator
    assert loaded.kind == chosen.kind and loaded.signals == chosen.signals
    assert ("selection" in payload) == (kind == "auto")
    probe_conf = np.r_[conf, 1e-9, 0.5, 1.0]
    probe = {"top1_prob": probe_conf, "entropy": -np.log(probe_conf)}
    np.testing.assert_array_equal(loaded.predict(probe), calibrator.predict(probe))
    assert loaded.to_dict() == {k: v for k, v in calibrator.to_dict().items() if k != "selection"}


@pytest.mark.parametrize(
    "path", sorted(BENCHMARKS.glob("*_calibration_*.json")), ids=lambda path: path.stem
)
def test_calibration_files_of_earlier_runs_still_load(path):
    payload = json.loads(path.read_text())
    loaded = Calibrator.load(path)
    assert loaded.to_dict() == {k: payload[k] for k in ("kind", "signals", "params")}
    grid = np.linspace(0, 1, 101)
    prediction = loaded.predict({name: grid for name in loaded.signals})
    assert prediction.shape == (101,) and ((prediction >= 0) & (prediction <= 1)).all()


def test_temperature_files_from_before_logit_fitting_was_removed(tmp_path):
    """They carry params["input"]: "signal" loads as before, "logits" is a clear error."""
    old = {"format_version": 1, "kind": "temperature", "signals": ["top1_prob"]}
    path = tmp_path / CALIBRATION_FILE
    path.write_text(json.dumps({**old, "params": {"temperature": 2.0, "input": "signal"}}))
    conf = np.array([0.1, 0.5, 0.9])
    expected = 1 / (1 + np.exp(-np.log(conf / (1 - conf)) / 2.0))
    np.testing.assert_allclose(Calibrator.load(path).predict(conf), expected, rtol=1e-12)
    path.write_text(json.dumps({**old, "params": {"temperature": 2.0, "input": "logits"}}))
    with pytest.raises(ValueError, match="'logits'.*re-run `draftsmith calibrate`"):
        Calibrator.load(path)


def test_load_rejects_bad_files(held_out, tmp_path):
    path = build_calibrator("platt").fit(*held_out).save(tmp_path / CALIBRATION_FILE)
    payload = json.loads(path.read_text())
    path.write_text(json.dumps({**payload, "format_version": 99}))
    with pytest.raises(ValueError, match="format_version 99"):
        Calibrator.load(path)
    path.write_text(json.dumps({**payload, "params": {"coef": [1.0, 2.0], "intercept": 0, "C": 1}}))
    with pytest.raises(ValueError, match="2 coefs"):
        Calibrator.load(path)
    path.write_text(json.dumps({**payload, "kind": "auto"}))
    with pytest.raises(ValueError, match="chosen kind"):
        Calibrator.load(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        Calibrator.load(path)
