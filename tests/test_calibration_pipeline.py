"""calibrate_decoder end to end on a tiny target: calibration.json, report and plots."""

from __future__ import annotations

import json

import pytest
from conftest import perturbed_copy

from draftsmith.calibration import Calibrator
from draftsmith.calibration.pipeline import CalibrateConfig, calibrate_decoder, prompts_from_texts
from draftsmith.decoding import DraftLengthPolicy, SpeculativeDecoder
from draftsmith.heads import DraftModelDrafter

PROMPTS = [[i, i + 1, i + 2] for i in range(3, 60, 4)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_calibration_json_and_report_are_written(llama, tmp_path, temperature):
    decoder = SpeculativeDecoder(
        llama,
        DraftModelDrafter(perturbed_copy(llama, 0.05)),
        policy=DraftLengthPolicy(max_tokens=4),
    )
    config = CalibrateConfig(method="platt", temperature=temperature, max_new_tokens=12)
    payload = calibrate_decoder(decoder, PROMPTS, tmp_path, config, metadata={"target": "tiny"})
    saved = json.loads((tmp_path / "calibration.json").read_text())
    for key in ("method", "params", "signals", "n_fit", "n_eval"):
        assert key in saved
    for side in ("before", "after"):
        assert set(saved["metrics"][side]) >= {
            "ece",
            "ece_equal_mass",
            "mce",
            "brier",
            "nll",
            "auroc",
        }
    assert saved["outcome"] == ("accept_prob" if temperature else "accepted")
    assert saved["n_fit"] > 0 and saved["n_eval"] > 0
    assert payload["method"] == "platt"
    assert Calibrator.load(tmp_path).kind == "platt"
    report = (tmp_path / "calibration" / "report.md").read_text()
    assert "target" in report and "reliability" in report
    for png in (tmp_path / "calibration").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(list((tmp_path / "calibration").glob("*.png"))) == 3


def test_prompts_from_texts_cuts_windows(byte_tokenizer):
    prompts = prompts_from_texts(["a" * 50, "b" * 10], byte_tokenizer, 16, stride=20, max_prompts=9)
    assert [len(p) for p in prompts] == [16, 16]
    with pytest.raises(ValueError, match="no held-out document has 64 tokens"):
        prompts_from_texts(["short"], byte_tokenizer, 64, stride=64, max_prompts=4)
