"""``draftsmith train RECIPE.yaml [key=value ...]``: one training run from a YAML recipe."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from draftsmith.commands.flags import POSITIONAL
from draftsmith.core.config import config_help
from draftsmith.heads import DraftHead, drafter_class, drafter_kinds
from draftsmith.heads.trainable import head_class
from draftsmith.train.config import TrainConfig, load_train_config
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
