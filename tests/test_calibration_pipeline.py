"""Calibration end to end on a tiny target: records from real decoding -> `calibrate_records`
-> calibration.json, report, plots and the records."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import perturbed_copy
from datasets import Dataset

from draftsmith.calibration import Calibrator
from draftsmith.calibration.collect import collect_from_decoding
from draftsmith.calibration.pipeline import (
    CalibrateConfig,
    calibrate_records,
    prompt_windows,
    source_folds,
)
from draftsmith.decoding import FixedPolicy, SpeculativeDecoder
from draftsmith.heads import DraftModelDrafter

PROMPTS = [[i, i + 1, i + 2] for i in range(3, 60, 4)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_calibration_json_and_report_are_written(llama, tmp_path, temperature):
    decoder = SpeculativeDecoder(
        llama,
        DraftModelDrafter(perturbed_copy(llama, 0.05)),
        policy=FixedPolicy(max_draft_tokens=4),
    )
    config = CalibrateConfig(method="platt", temperature=temperature)
    # Greedy calibration records signals at temperature 1; sampling at the decoding temperature.
    records = collect_from_decoding(
        decoder,
        PROMPTS,
        max_new_tokens=12,
        temperature=temperature or 1.0,
        decode_temperature=temperature,
    )
    payload = calibrate_records(records, tmp_path, config, metadata={"target": "tiny"})
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
    assert saved["n_fit"] == saved["n_eval"] == len(records)
    n_sources = len(set(records["source"]))
    assert saved["evaluation"] == f"5-fold cross-fitted over {n_sources} sources"
    assert payload["method"] == "platt" and payload["signals"] == list(config.signals)
    loaded = Calibrator.load(tmp_path)
    assert loaded.kind == "platt" and loaded.signals == config.signals
    report = (tmp_path / "calibration" / "report.md").read_text()
    assert "target" in report and "reliability" in report
    for png in (tmp_path / "calibration").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(list((tmp_path / "calibration").glob("*.png"))) == 3
    written = Dataset.from_parquet(str(tmp_path / "calibration" / "records.parquet"))
    assert len(written) == saved["n_eval"]
    assert set(written.column_names) == {*records.column_names, "calibrated"}
    assert written["accepted"] == records["accepted"]


def test_prompt_windows_cut_texts_and_name_their_text(byte_tokenizer):
    texts = ["a" * 50, "b" * 10, "c" * 20]
    windows = prompt_windows(texts, byte_tokenizer, 16, stride=20, max_prompts=9)
    assert [index for index, _ in windows] == [0, 0, 2]  # "b" * 10 is too short to cut
    assert [len(ids) for _, ids in windows] == [16, 16, 16]
    assert byte_tokenizer.decode(windows[2][1]) == "c" * 16
    assert len(prompt_windows(texts, byte_tokenizer, 16, stride=20, max_prompts=2)) == 2
    with pytest.raises(ValueError, match="no held-out document has 64 tokens"):
        prompt_windows(["short"], byte_tokenizer, 64, stride=64, max_prompts=4)


def test_source_folds_keep_sources_whole_and_cover_every_row():
    sources = np.repeat(np.arange(7), [3, 1, 4, 2, 5, 1, 2])
    folds = source_folds(sources, folds=3, seed=1)
    assert len(folds) == 3
    assert sorted(np.concatenate(folds).tolist()) == list(range(len(sources)))
    owners = [set(sources[fold].tolist()) for fold in folds]
    assert all(a.isdisjoint(b) for i, a in enumerate(owners) for b in owners[i + 1 :])
    assert len(source_folds(sources, folds=20)) == 7  # at most one fold per source
    with pytest.raises(ValueError, match="at least 2 documents or prompts"):
        source_folds(np.zeros(5, dtype=int), folds=5)
