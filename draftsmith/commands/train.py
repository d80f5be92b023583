"""``draftsmith train RECIPE.yaml [key=value ...]``: one training run from a YAML recipe;
``draftsmith plot-training RUN_DIR``: its training curve as a PNG."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from draftsmith.build.flags import POSITIONAL
from draftsmith.core.config import config_help
from draftsmith.heads import DraftHead, drafter_class, drafter_kinds
from draftsmith.heads.trainable import head_class
from draftsmith.train.config import TrainConfig, load_train_config
from draftsmith.train.plots import plot_training_curve
from draftsmith.train.tracking import METRICS_FILE
from draftsmith.train.trainer import TrainResult, train


@dataclass(kw_only=True)
class TrainCommand:
    """Train a drafter head on a frozen target from a YAML recipe. Overrides use the recipe's
    keys, dotted for nested ones (data.seq_len=256), values parsed as YAML (feature_cache=null).
    The recipe is checked whole before any model loads."""

    EPILOG: ClassVar[str] = "\n\n".join(
        ["config keys:\n" + config_help(TrainConfig)]
        + [
            f"head_args of head: {kind}\n" + config_help(head_class(kind).config_class, "head_args")
            for kind in drafter_kinds()
            if issubclass(drafter_class(kind), DraftHead)
        ]
    )

    recipe: Path = field(metadata=POSITIONAL)
    """YAML recipe, e.g. recipes/smollm2-135m/eagle3.yaml."""
    overrides: list[str] = field(
        default_factory=list, metadata={**POSITIONAL, "metavar": "key=value"}
    )
    """Recipe overrides."""

    def run(self) -> TrainResult:
        config = load_train_config(self.recipe, self.overrides)
        check_output_dir(Path(config.output_dir))
        result = train(config)
        print(
            f"done: {result.steps} steps, {result.tokens_per_s:,.0f} tokens/s, held-out top-1 "
            f"{result.metrics['top1']}, tau_sim {result.metrics['tau_sim']}; drafter in "
            f"{result.artifact}"
        )
        return result


def check_output_dir(output_dir: Path) -> None:
    """Fail before any model loads when the run folder cannot be a folder."""
    for path in (output_dir, *output_dir.parents):
        if path.exists():
            if not path.is_dir():
                inside = "" if path == output_dir else f" cannot be made: {path}"
                raise NotADirectoryError(
                    f"output_dir {output_dir}{inside} is a file, not a folder: give the run "
                    "another output_dir (output_dir=runs/NAME) or move the file away"
                )
            return


@dataclass(kw_only=True)
class PlotTrainingCommand:
    """Draw a training run's curve from its metrics.jsonl to a PNG: loss, top-1 agreement by
    draft step and held-out tau_sim(k) per optimizer step. Training draws the same picture
    after each evaluation; this draws it again for a run on disk (one still running, one from
    an older release)."""

    run_dir: Path = field(metadata=POSITIONAL)
    """The run folder (a recipe's output_dir), holding metrics.jsonl."""
    out: Path | None = None
    """PNG to write (default: RUN_DIR/training_curve.png)."""

    def run(self) -> Path:
        path = plot_training_curve(self.run_dir / METRICS_FILE, self.out)
        print(f"training curve written to {path}")
        return path
