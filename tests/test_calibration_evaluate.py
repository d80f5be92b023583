"""Evaluating a fitted calibration per workload, and reading calibration jsonl files."""

from __future__ import annotations

import json

import numpy as np
import pytest
from datasets import Dataset

from draftsmith.calibration import build_calibrator, calibration_metrics
from draftsmith.calibration.evaluate import evaluate_calibration, metrics_by_workload
from draftsmith.calibration.heldout import read_heldout_jsonl
from draftsmith.calibration.pipeline import CalibrateConfig, calibrate_records
from draftsmith.calibration.report import format_workload_table


def synthetic_records(n: int = 600, seed: int = 0) -> Dataset:
    """Drafted-token records of two workloads: 'code' accepts more often than its top-1
    probability says, 'chat' less, so one calibrator cannot suit both."""
    rng = np.random.default_rng(seed)
    top1 = rng.uniform(0.05, 0.95, n)
    workload = np.where(np.arange(n) % 3 == 0, "chat", "code")
    p_accept = np.where(workload == "code", np.sqrt(top1), top1**2)
    accepted = (rng.uniform(size=n) < p_accept).astype(float)
    return Dataset.from_dict(
        {
            "top1_prob": top1,
            "margin": top1 * rng.uniform(0.2, 1.0, n),
            "entropy": -np.log(top1),
            "position": rng.integers(0, 4, n),
            "accepted": accepted,
            "accept_prob": p_accept,
            "source": np.arange(n) // 20,
            "workload": workload,
        }
    )


def test_evaluation_per_workload_equals_the_metrics_of_each_subset():
    records = synthetic_records()
    calibrator = build_calibrator("platt", signals=("top1_prob", "margin"))
    calibrator.fit({s: np.asarray(records[s]) for s in calibrator.signals}, records["accepted"])
    result = evaluate_calibration(records, calibrator, outcome="accepted", n_bins=15)

    assert list(result["workloads"]) == ["chat", "code"]  # order of first appearance
    top1, y = np.asarray(records["top1_prob"]), np.asarray(records["accepted"])
    predicted = calibrator.predict({s: np.asarray(records[s]) for s in calibrator.signals})
    workload = np.asarray(records["workload"])
    for name, sides in result["workloads"].items():
        rows = workload == name
        assert sides["raw"] == calibration_metrics(top1[rows], y[rows], 15)
        assert sides["calibrated"] == calibration_metrics(predicted[rows], y[rows], 15)
    assert result["overall"]["calibrated"] == calibration_metrics(predicted, y, 15)
    # The workloads differ as built: code is under-confident raw, chat over-confident.
    code, chat = result["workloads"]["code"]["raw"], result["workloads"]["chat"]["raw"]
    assert code["acceptance_rate"] > code["mean_confidence"]
    assert chat["acceptance_rate"] < chat["mean_confidence"]


def test_evaluation_without_a_calibrator_or_workloads_scores_raw_under_default():
    records = synthetic_records().remove_columns("workload")
    result = evaluate_calibration(records, None, outcome="accept_prob", n_bins=10)
    assert list(result["workloads"]) == ["default"]
    assert set(result["overall"]) == {"raw"}
    expected = calibration_metrics(records["top1_prob"], records["accept_prob"], 10)
    assert result["workloads"]["default"]["raw"] == result["overall"]["raw"] == expected


def test_workload_table_has_a_line_per_workload_and_side():
    sides = metrics_by_workload(
        {"raw": np.array([0.2, 0.9, 0.6, 0.4]), "calibrated": np.array([0.3, 0.7, 0.5, 0.5])},
        np.array([0.0, 1.0, 1.0, 0.0]),
        np.array(["code", "code", "chat", "chat"], dtype=object),
        n_bins=2,
    )
    lines = format_workload_table(list(sides.items())).splitlines()
    assert lines[0].split("|")[1:3] == [" workload ", " confidence "]
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["code"] * 2 + ["chat"] * 2
    assert "0.5000" in lines[2]  # code, raw: accepted rate 1/2


def test_calibrate_records_breaks_the_metrics_down_by_workload(tmp_path):
    records = synthetic_records()
    config = CalibrateConfig(method="platt", signals=("top1_prob",))
    payload = calibrate_records(records, tmp_path, config)
    written = Dataset.from_parquet(str(tmp_path / "calibration" / "records.parquet"))
    out_of_fold, y = np.asarray(written["calibrated"]), np.asarray(written["accepted"])
    for name in ("code", "chat"):
        rows = np.asarray(written["workload"]) == name
        after = payload["metrics_by_workload"][name]["after"]
        assert after == calibration_metrics(out_of_fold[rows], y[rows], config.n_bins)
    saved = json.loads((tmp_path / "calibration.json").read_text())
    assert set(saved["metrics_by_workload"]) == {"code", "chat"}


def write_lines(path, lines: list) -> str:
    path.write_text(
        "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    )
    return str(path)


def test_prompt_only_records_keep_their_workloads(tmp_path):
    data = write_lines(
        tmp_path / "traffic.jsonl",
        [{"prompt": "def f():", "workload": "code"}, "", {"prompt": "Hello"}],
    )
    heldout = read_heldout_jsonl(data)
    assert not heldout.has_text and heldout.texts == []
    assert heldout.prompts == [("def f():", "code"), ("Hello", "default")]
    assert heldout.workloads == ["code", "default"]


def test_records_with_text_are_not_prompt_only(tmp_path):
    data = write_lines(
        tmp_path / "mixed.jsonl",
        [{"prompt": "a", "completion": "b"}, {"text": "some text", "workload": "docs"}],
    )
    heldout = read_heldout_jsonl(data)
    assert heldout.has_text
    assert heldout.prompts == [("a", "default")] and heldout.texts == [("some text", "docs")]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "holds no records: write one JSON object per line"),
        (["", "  "], "holds no records"),
        ([{"prompt": "ok"}, {"workload": "code"}], r":2: the record has no 'prompt'"),
        ([{"prompt": ""}], r":1: 'prompt' must be a non-empty string"),
        ([{"prompt": "ok", "workload": 3}], r":1: 'workload' must be a non-empty string"),
        (['["a list"]'], r":1: a record is a JSON object"),
        (["{not json"], r":1: not a JSON record"),
    ],
)
def test_bad_calibration_jsonl_names_the_line_and_the_fix(tmp_path, lines, message):
    with pytest.raises(ValueError, match=message):
        read_heldout_jsonl(write_lines(tmp_path / "bad.jsonl", lines))


def test_missing_calibration_jsonl(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_heldout_jsonl(tmp_path / "absent.jsonl")
