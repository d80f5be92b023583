"""The training curve: training draws it beside metrics.jsonl after each evaluation, the series
it draws are those of metrics.jsonl, and `draftsmith plot-training` draws it for a run on disk.

Uses test_trainer's tiny Llama target, byte tokenizer, stdlib-code corpus and stand-in head.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import test_trainer
from test_trainer import _quiet_single_thread, config_of, recipe  # noqa: F401 (autouse fixture)

from draftsmith.train import tracking
from draftsmith.train.plots import PLOT_FILE, plot_training_curve, training_series
from draftsmith.train.trainer import train

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# test_trainer's tiny Llama target, byte tokenizer and stdlib-code corpus (pytest fixtures)
corpus, target, tokenizer = test_trainer.corpus, test_trainer.target, test_trainer.tokenizer


def records(run: Path, split: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


def expected_series(run: Path) -> dict[str, tuple[list[int], list[float]]]:
    """What the figure must draw, read from metrics.jsonl here without the library's help."""
    expected = {}
    for split, names in (("train", ("loss", "top1")), ("eval", ("loss", "top1", "tau_sim"))):
        rows = records(run, split)
        steps = [r["step"] for r in rows]
        for name in names:
            if name == "loss":
                expected[f"{split}/loss"] = (steps, [r["loss"] for r in rows])
                continue
            for k in range(len(rows[0][name])):
                expected[f"{split}/{name}_{k + 1}"] = (steps, [r[name][k] for r in rows])
    return expected


def is_png(path: Path) -> bool:
    return path.stat().st_size > len(PNG_MAGIC) and path.read_bytes()[:8] == PNG_MAGIC


def test_training_draws_its_curve_after_each_evaluation_from_its_metrics(
    tmp_path,
    corpus,
    target,
    tokenizer,
    monkeypatch,
):
    drawn = []

    def counted(metrics_jsonl, out_png=None):
        drawn.append(len(records(Path(metrics_jsonl).parent, "eval")))
        return plot_training_curve(metrics_jsonl, out_png)

    monkeypatch.setattr(tracking, "plot_training_curve", counted)
    run = tmp_path / "run"
    raw = recipe(corpus, run, max_steps=6, warmup_steps=0, eval_every=3)
    train(config_of(raw, tmp_path), target=target, tokenizer=tokenizer)

    assert drawn == [1, 2]  # after the evaluation at step 3, then after the final one at 6
    assert is_png(run / PLOT_FILE)
    assert not list(run.glob("*.tmp"))
    series = training_series(run / "metrics.jsonl")
    expected = expected_series(run)
    assert set(series) == set(expected)
    assert {key for key in series if key.startswith("eval/tau_sim_")} == {
        "eval/tau_sim_1",
        "eval/tau_sim_2",
    }
    for key, (steps, values) in expected.items():
        assert series[key][0] == steps, key
        assert series[key][1] == pytest.approx(values), key
    assert series["train/loss"][0] == [1, 2, 3, 4, 5, 6]
    assert series["eval/tau_sim_2"][0] == [3, 6]


def test_a_step_with_nothing_counted_is_left_out_and_other_records_are_not_drawn(tmp_path):
    lines = [
        {"step": 0, "split": "cache", "rows": 10, "seconds": 1.0, "tokens_per_s": 640.0},
        {"step": 1, "split": "train", "loss": 3.0, "top1": [0.2, None], "lr": 1e-3},
        {"step": 2, "split": "train", "loss": 2.5, "top1": [0.3, 0.1], "lr": 1e-3},
        {"step": 2, "split": "eval", "loss": 2.6, "top1": [0.25, 0.05], "tau_sim": [1.2, 1.3]},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert training_series(path) == {
        "train/loss": ([1, 2], [3.0, 2.5]),
        "train/top1_1": ([1, 2], [0.2, 0.3]),
        "train/top1_2": ([2], [0.1]),
        "eval/loss": ([2], [2.6]),
        "eval/top1_1": ([2], [0.25]),
        "eval/top1_2": ([2], [0.05]),
        "eval/tau_sim_1": ([2], [1.2]),
        "eval/tau_sim_2": ([2], [1.3]),
    }
    assert is_png(plot_training_curve(path, tmp_path / "curve.png"))


def test_plot_training_draws_a_run_on_disk_and_names_a_folder_without_metrics(tmp_path, capsys):
    from draftsmith.commands.cli import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "split": "train", "loss": 3.0, "top1": [0.2]}) + "\n"
    )
    main(["plot-training", str(run)])
    assert is_png(run / PLOT_FILE)
    assert f"training curve written to {run / PLOT_FILE}" in capsys.readouterr().out
    main(["plot-training", str(run), "--out", str(tmp_path / "elsewhere.png")])
    assert is_png(tmp_path / "elsewhere.png")

    with pytest.raises(SystemExit) as exit:
        main(["plot-training", str(tmp_path / "empty")])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "draftsmith plot-training: error: no metrics file at" in err
    assert "output_dir" in err
    (run / "metrics.jsonl").write_text("not json\n")
    with pytest.raises(SystemExit):
        main(["plot-training", str(run)])
    assert "metrics.jsonl:1 is not a metrics record" in capsys.readouterr().err
