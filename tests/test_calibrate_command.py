"""`draftsmith calibrate` end to end: a saved tiny target, an artifact, held-out jsonl."""

from __future__ import annotations

import copy
import json

import pytest
from conftest import tiny_model
from head_helpers import build_head, fit

from draftsmith.artifact import save_artifact
from draftsmith.commands.cli import main


@pytest.mark.parametrize("collect", ["teacher-forced", "decode"])
def test_calibrate_writes_into_the_artifact(tmp_path, byte_tokenizer, capsys, collect):
    target = tiny_model("llama", seed=0)
    target_dir = tmp_path / "target"
    target.save_pretrained(target_dir)
    tokenizer = copy.deepcopy(byte_tokenizer)
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(0)  # rows of text end documents with it
    tokenizer.save_pretrained(target_dir)
    artifact = tmp_path / "drafter"
    head = fit(build_head("medusa", target), target, steps=5)
    save_artifact(head, target, artifact, training={"steps": 5}, target_name_or_path="tiny")
    data = tmp_path / "heldout.jsonl"
    texts = [f"def f{i}(x):\n    return x * {i} + {i * i}\n" * 3 for i in range(12)]
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))

    main(
        ["calibrate", str(artifact), "--target", str(target_dir), "--data", str(data)]
        + ["--method", "histogram", "--dtype", "float32", "--max-prompts", "12"]
        + ["--prompt-tokens", "16", "--max-new-tokens", "12"]
        + ["--collect", collect, "--seq-len", "64"]
    )
    saved = json.loads((artifact / "calibration.json").read_text())
    assert saved["method"] == "histogram" and saved["n_eval"] > 0
    assert (artifact / "calibration" / "report.md").is_file()
    printed = capsys.readouterr().out
    assert "ece_equal_mass" in printed and "calibration.json" in printed and collect in printed
