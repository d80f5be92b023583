"""A run's training curve as a PNG: loss, top-1 agreement by draft step and tau_sim(k), per
optimizer step, read from its ``metrics.jsonl``.

    from draftsmith.train.plots import plot_training_curve
    plot_training_curve("runs/quickstart/metrics.jsonl")  # -> runs/quickstart/training_curve.png

The trainer redraws it after each evaluation; ``draftsmith plot-training RUN_DIR`` draws it for
a run already on disk. The figure is built on matplotlib's Agg canvas directly (not pyplot), so
drawing never switches the global backend or keeps figures alive.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from draftsmith.train.metrics import flat_record

__all__ = ["PLOT_FILE", "PLOTTED", "Series", "plot_training_curve", "training_series"]

PLOT_FILE = "training_curve.png"
"""The PNG's name in the run folder, beside ``metrics.jsonl``."""

PLOTTED = ("loss", "top1", "tau_sim")
"""The record keys the figure draws, from the train and eval records."""

Series = dict[str, tuple[list[int], list[float]]]
"""Tracker key (``train/loss``, ``eval/top1_2``, ...) -> (steps, values)."""


def training_series(metrics_jsonl: str | os.PathLike) -> Series:
    """The series the figure draws, keyed as the trackers key them (`flat_record`:
    ``train/loss``, ``train/top1_1`` .. ``train/top1_K``, ``eval/loss``, ``eval/top1_k``,
    ``eval/tau_sim_k``), each (steps, values) in file order; a step where a value is None
    (nothing was counted there) is left out of its series.

    Raises:
        ValueError: the file is missing, or holds no train or eval record.
    """
    path = Path(metrics_jsonl)
    if not path.is_file():
        raise ValueError(
            f"no metrics file at {path}: give the folder a training run wrote (its recipe's "
            "output_dir), which holds metrics.jsonl"
        )
    series: Series = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            step, split = record["step"], record["split"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ValueError(
                f"{path}:{number} is not a metrics record ({{step, split, ...}}): is it a "
                "metrics.jsonl a training run wrote?"
            ) from None
        if split not in ("train", "eval"):
            continue
        kept = {key: record[key] for key in PLOTTED if key in record}
        for key, value in flat_record(split, kept).items():
            steps, values = series.setdefault(key, ([], []))
            steps.append(step)
            values.append(value)
    if not series:
        raise ValueError(f"{path} holds no train or eval record to plot")
    return series


def plot_training_curve(
    metrics_jsonl: str | os.PathLike, out_png: str | os.PathLike | None = None
) -> Path:
    """Draw the run's loss (train and held-out), top-1 agreement by draft step (train lines,
    held-out markers) and held-out tau_sim(k) against the optimizer step, one panel each, to
    `out_png` (None: ``training_curve.png`` beside the metrics file). The PNG is written under
    a temporary name, then renamed, so a reader never sees half of one. Returns its path."""
    series = training_series(metrics_jsonl)
    out = Path(out_png) if out_png is not None else Path(metrics_jsonl).with_name(PLOT_FILE)
    figure = Figure(figsize=(7.5, 9), layout="constrained")
    FigureCanvasAgg(figure)
    loss_ax, top1_ax, tau_ax = figure.subplots(3, 1, sharex=True)
    _draw(loss_ax, series, "loss", "loss")
    loss_ax.set_title(f"training curve: {out.parent.name or out.name}")
    _draw(top1_ax, series, "top1", "top-1 agreement")
    _draw(tau_ax, series, "tau_sim", "tau_sim(k)")
    tau_ax.set_xlabel("optimizer step")
    tmp = out.with_name(f"{out.name}.tmp")
    figure.savefig(tmp, format="png", dpi=100)
    os.replace(tmp, out)
    return out


def _draw(ax, series: Series, name: str, label: str) -> None:
    """One panel: every series of record key `name`, train as lines, eval as lines with
    markers, one colour per draft step."""
    for split in ("train", "eval"):
        for key, (steps, values) in series.items():
            prefix = f"{split}/{name}"
            if key != prefix and not key.startswith(f"{prefix}_"):
                continue
            draft_step = key.removeprefix(prefix).lstrip("_")
            colour = f"C{int(draft_step) - 1}" if draft_step else "C0"
            text = ("train" if split == "train" else "held-out") + (
                f" k={draft_step}" if draft_step else ""
            )
            if split == "train":
                ax.plot(steps, values, color=colour, linewidth=1, alpha=0.7, label=text)
            else:
                ax.plot(steps, values, color=colour, marker="o", linestyle="--", label=text)
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    if ax.has_data():
        ax.legend(fontsize="small", ncol=2)
    else:
        ax.text(0.5, 0.5, "not logged yet", ha="center", va="center", transform=ax.transAxes)
