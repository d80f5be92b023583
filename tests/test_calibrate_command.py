"""`draftsmith calibrate` end to end: a saved tiny target, an artifact, held-out jsonl."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_model
from datasets import Dataset
from head_helpers import build_head, fit

from draftsmith.artifact import (
    calibrate_artifact,
    evaluate_artifact,
    prepare_calibration,
    save_artifact,
)
from draftsmith.calibration import CalibrateConfig, Calibrator, calibration_metrics
from draftsmith.calibration.io import write_json
from draftsmith.commands.cli import main
from draftsmith.zoo import load_model

DECODE_FLAGS = ["--dtype", "float32", "--max-prompts", "12", "--max-new-tokens", "12"]


@pytest.fixture(scope="module")
def saved_target_and_artifact(tmp_path_factory, byte_tokenizer):
    """A saved tiny target (with its tokenizer) and a medusa artifact trained 5 steps on it."""
    root = tmp_path_factory.mktemp("calibrate")
    target = tiny_model("llama", seed=0)
    target_dir = root / "target"
    target.save_pretrained(target_dir)
    tokenizer = copy.deepcopy(byte_tokenizer)
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(0)  # rows of text end documents with it
    tokenizer.save_pretrained(target_dir)
    artifact = root / "drafter"
    head = fit(build_head("medusa", target), target, steps=5)
    save_artifact(head, target, artifact, training={"steps": 5}, target_name_or_path="tiny")
    return target_dir, artifact


@pytest.fixture
def target_dir(saved_target_and_artifact):
    return saved_target_and_artifact[0]


@pytest.fixture
def artifact(saved_target_and_artifact, tmp_path):
    """A fresh copy of the uncalibrated artifact for each test."""
    return shutil.copytree(saved_target_and_artifact[1], tmp_path / "drafter")


def write_jsonl(path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.fixture
def traffic(tmp_path) -> str:
    """Prompt-only records of two workloads, as a user's own traffic."""
    code = [{"prompt": f"def f{i}(x):\n    return x * {i}", "workload": "code"} for i in range(6)]
    chat = [{"prompt": f"A: how are you {i}?\nB:", "workload": "chat"} for i in range(6)]
    return write_jsonl(tmp_path / "traffic.jsonl", code + chat)


def files_of(folder) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("collect", ["teacher-forced", "decode"])
def test_calibrate_writes_into_the_artifact(tmp_path, target_dir, artifact, capsys, collect):
    data = tmp_path / "heldout.jsonl"
    texts = [f"def f{i}(x):\n    return x * {i} + {i * i}\n" * 3 for i in range(12)]
    write_jsonl(data, [{"text": t} for t in texts])

    main(
        ["calibrate", str(artifact), "--target", str(target_dir), "--data", str(data)]
        + ["--method", "histogram", *DECODE_FLAGS, "--prompt-tokens", "16"]
        + ["--collect", collect, "--seq-len", "64"]
    )
    saved = json.loads((artifact / "calibration.json").read_text())
    assert saved["method"] == "histogram" and saved["n_eval"] > 0
    assert saved["config"]["collect"] == collect
    assert (artifact / "calibration" / "report.md").is_file()
    printed = capsys.readouterr().out
    assert "ece_equal_mass" in printed and "calibration.json" in printed and collect in printed


def calibrate(artifact: Path, target: str, data: str, *flags: str) -> None:
    """``draftsmith calibrate`` through the command line, its errors raised (--debug)."""
    main(["calibrate", str(artifact), "--target", target, "--data", data, *flags, "--debug"])


def test_text_records_are_collected_teacher_forced_by_default(target_dir, artifact, tmp_path):
    texts = [f"def g{i}(y):\n    return y - {i}\n" * 3 for i in range(6)]
    data = write_jsonl(tmp_path / "texts.jsonl", [{"text": t} for t in texts])
    out = tmp_path / "result.json"
    calibrate(
        artifact, str(target_dir), data, "--dtype", "float32", "--seq-len", "64", "--json", str(out)
    )
    assert json.loads(out.read_text())["config"]["collect"] == "teacher-forced"


def test_prompt_only_records_calibrate_from_decoding(target_dir, artifact, traffic, capsys):
    main(
        ["calibrate", str(artifact), "--target", str(target_dir), "--data", traffic]
        + ["--method", "histogram", *DECODE_FLAGS]
    )
    printed = capsys.readouterr().out
    assert "prompt-only records: collecting from decoding" in printed
    saved = json.loads((artifact / "calibration.json").read_text())
    assert saved["config"]["collect"] == "decode" and saved["n_eval"] > 0
    assert list(saved["metrics_by_workload"]) == ["code", "chat"]
    records = Dataset.from_parquet(str(artifact / "calibration" / "records.parquet"))
    # Prompts 0-5 are code and 6-11 chat: each record keeps its prompt's workload.
    expected = ["code" if source < 6 else "chat" for source in records["source"]]
    assert records["workload"] == expected
    assert "per workload" in printed and "| chat " in printed


def test_evaluate_only_reports_per_workload_and_leaves_the_artifact_alone(
    target_dir, artifact, traffic, tmp_path, capsys
):
    flags = ["--target", str(target_dir), "--data", traffic, *DECODE_FLAGS]
    main(["calibrate", str(artifact), "--method", "platt", *flags])
    before = files_of(artifact)
    out = tmp_path / "reports" / "evaluation.json"
    capsys.readouterr()

    main(["calibrate", str(artifact), *flags, "--evaluate-only", "--json", str(out)])
    assert files_of(artifact) == before  # byte for byte, nothing added
    printed = capsys.readouterr().out
    assert "nothing refitted" in printed and "| overall " in printed
    report = json.loads(out.read_text())
    assert list(report["workloads"]) == ["code", "chat"]
    assert report["calibrator"]["kind"] == "platt" and report["collect"] == "decode"

    # Greedy decoding of the same prompts gives the records calibration wrote: score them directly.
    records = Dataset.from_parquet(str(artifact / "calibration" / "records.parquet"))
    calibrator = Calibrator.load(artifact)
    predicted = calibrator.predict({s: np.asarray(records[s]) for s in calibrator.signals})
    top1, y = np.asarray(records["top1_prob"]), np.asarray(records["accepted"])
    workload = np.asarray(records["workload"])
    assert report["overall"]["raw"]["n"] == len(records)
    for name in ("code", "chat"):
        rows = workload == name
        for side, conf in (("raw", top1), ("calibrated", predicted)):
            direct = calibration_metrics(conf[rows], y[rows], 15)
            assert _nan_as_none(direct) == pytest.approx(report["workloads"][name][side])


def _nan_as_none(metrics: dict) -> dict:
    """As the JSON report writes them."""
    return {k: None if isinstance(v, float) and np.isnan(v) else v for k, v in metrics.items()}


def test_evaluate_only_without_calibration_scores_raw_with_a_warning(
    target_dir, artifact, traffic, tmp_path
):
    before = files_of(artifact)
    out = tmp_path / "report.json"
    flags = ["--evaluate-only", "--dtype", "float32", "--max-new-tokens", "8", "--json", str(out)]
    with pytest.warns(UserWarning, match="no calibration.json: evaluating the raw top-1"):
        calibrate(artifact, str(target_dir), traffic, *flags)
    report = json.loads(out.read_text())
    assert report["calibrator"] is None
    assert all(set(sides) == {"raw"} for sides in report["workloads"].values())
    assert files_of(artifact) == before


def test_evaluate_only_on_a_corrupt_calibration_names_the_fix(artifact, traffic):
    (artifact / "calibration.json").write_text('{"kind": "platt", ')
    with pytest.raises(ValueError, match="cannot be read .* refit it .* or delete it"):
        calibrate(artifact, "never-loaded", traffic, "--evaluate-only")


@pytest.mark.parametrize(
    ("records", "flags", "message"),
    [
        ([], [], "holds no records: write one JSON object per line"),
        ([{"prompt": "x"}, {"workload": "code"}], [], r"jsonl:2: the record has no 'prompt'"),
        ([{"prompt": "x"}], ["--collect", "teacher-forced"], "drop --collect teacher-forced"),
    ],
)
def test_bad_prompt_data_fails_before_the_target_loads(artifact, tmp_path, records, flags, message):
    data = write_jsonl(tmp_path / "prompts.jsonl", records)
    with pytest.raises(ValueError, match=message):
        calibrate(artifact, "never-loaded", data, *flags)


def test_json_inside_the_artifact_is_refused(artifact, traffic):
    with pytest.raises(ValueError, match="lies inside the artifact"):
        calibrate(
            artifact,
            "never-loaded",
            traffic,
            "--evaluate-only",
            "--json",
            str(artifact / "calibration.json"),
        )


def test_the_library_calibrates_and_evaluates_as_the_command_does(
    target_dir, artifact, traffic, tmp_path
):
    """calibrate_artifact / evaluate_artifact, called without the CLI on a loaded target,
    write and return what `draftsmith calibrate` (with and without --evaluate-only) does."""
    flags = ["--target", str(target_dir), "--data", traffic, *DECODE_FLAGS, "--method", "platt"]
    by_command = tmp_path / "by_command"
    shutil.copytree(artifact, by_command)
    command_json = tmp_path / "command.json"
    main(["calibrate", str(by_command), *flags, "--json", str(command_json)])
    main(["calibrate", str(by_command), *flags, "--evaluate-only", "--json", str(command_json)])
    evaluated_by_command = json.loads(command_json.read_text())

    target, tokenizer = load_model(str(target_dir), dtype="float32")
    config = CalibrateConfig(method="platt", max_prompts=12, max_new_tokens=12)
    result = calibrate_artifact(
        artifact, target, tokenizer, traffic, config, target_name=str(target_dir)
    )
    saved = json.loads((artifact / "calibration.json").read_text())
    # The command's payload names its own artifact directory; everything else is the same.
    expected = json.loads((by_command / "calibration.json").read_text())
    assert expected.pop("artifact") == str(by_command) and saved.pop("artifact") == str(artifact)
    assert saved == expected and saved["config"]["collect"] == "decode"
    assert result["kind"] == "platt" and result["n_eval"] == saved["n_eval"]
    assert (artifact / "calibration" / "records.parquet").is_file()

    before = files_of(artifact)
    report = evaluate_artifact(
        artifact, target, tokenizer, traffic, config=config, target_name=str(target_dir)
    )
    assert files_of(artifact) == before
    assert report["collect"] == "decode" and report["calibrator"]["kind"] == "platt"
    # As the command's --json writes it (NaN as null).
    report = json.loads(write_json(tmp_path / "library.json", report).read_text())
    assert report.pop("artifact") == str(artifact)
    assert evaluated_by_command.pop("artifact") == str(by_command)
    assert report == evaluated_by_command


def test_the_library_refuses_prompt_only_data_for_teacher_forced(artifact, traffic):
    with pytest.raises(ValueError, match="drop --collect teacher-forced"):
        prepare_calibration(artifact, traffic, collect="teacher-forced")
