"""Where a run's records go: ``metrics.jsonl`` in the run folder, its training curve beside it
(``training_curve.png``, `draftsmith.train.plots`), and experiment trackers through Accelerate:
wandb (offline by default, under ``output_dir/wandb``) and, when asked, TensorBoard (under
``output_dir/tensorboard``)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.tracking import GeneralTracker, TensorBoardTracker
from tqdm.auto import tqdm

from draftsmith.core.config import ConfigError, config_to_dict
from draftsmith.train.config import TrainConfig
from draftsmith.train.metrics import flat_record
from draftsmith.train.plots import plot_training_curve

__all__ = ["METRICS_FILE", "TENSORBOARD_DIR", "RunLog", "log_with", "wandb_mode"]

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
"""The TensorBoard event files' folder in the run folder (`TrainConfig.tensorboard`)."""


def wandb_mode(config: TrainConfig) -> str:
    """The run's wandb mode: as configured, else $WANDB_MODE, else offline (logs under
    ``output_dir/wandb``, for ``wandb sync`` later)."""
    return config.wandb_mode or os.environ.get("WANDB_MODE", "offline")


def log_with(config: TrainConfig) -> list[str | GeneralTracker] | None:
    """The trackers to build the run's `Accelerator` with (its ``log_with``).

    Raises:
        ConfigError: ``tensorboard: true`` where no TensorBoard writer is installed (checked
            before any model loads).
    """
    trackers: list[str | GeneralTracker] = []
    if wandb_mode(config) != "disabled":
        trackers.append("wandb")
    if config.tensorboard:
        if not any(importlib.util.find_spec(name) for name in ("tensorboard", "tensorboardX")):
            raise ConfigError(
                "tensorboard: true needs the tensorboard package: pip install tensorboard "
                "(or set tensorboard=false)"
            )
        trackers.append(_TensorBoard(TENSORBOARD_DIR, config.output_dir))
    return trackers or None


class _TensorBoard(TensorBoardTracker):
    """Accelerate's TensorBoard tracker, given the run's config as flat hyper-parameters
    (``data.seq_len``): TensorBoard takes only numbers, booleans and strings, where the config
    nests dicts and holds lists and None."""

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        super().store_init_configuration(_flat_config(values))


def _flat_config(values: dict[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """A nested config as ``{"data.seq_len": 64, ...}``; lists and None as their text."""
    flat: dict[str, bool | int | float | str] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flat_config(value, f"{prefix}{key}."))
        else:
            plain = isinstance(value, (bool, int, float, str))
            flat[f"{prefix}{key}"] = value if plain else json.dumps(value)
    return flat


class RunLog:
    """The records of one run: one JSON line each in ``metrics.jsonl`` (``{"step", "split",
    ...}``), eval lines on the console, every record sent to the accelerator's trackers, and
    the training curve redrawn after each evaluation (the final one included), so a run's
    picture is never older than its last evaluation.

    Only the main process writes; every process calls `finish`.
    """

    def __init__(self, accelerator: Accelerator, config: TrainConfig) -> None:
        """accelerator: built with ``log_with=log_with(config)``."""
        self.accelerator = accelerator
        self.config = config
        self.output_dir = Path(config.output_dir)
        self.path = self.output_dir / METRICS_FILE

    def start(self, resumed_step: int | None) -> None:
        """Keep the records up to `resumed_step` (None: a fresh run keeps none) and start the
        trackers."""
        if not self.accelerator.is_main_process:
            return
        if resumed_step is None:
            self.path.unlink(missing_ok=True)
        else:
            _truncate(self.path, resumed_step)
        self.accelerator.init_trackers(
            self.config.wandb_project,
            config=config_to_dict(self.config),
            init_kwargs={
                "wandb": {
                    "mode": wandb_mode(self.config),
                    "dir": str(self.output_dir),
                    "name": self.output_dir.name,
                }
            },
        )

    def log(self, step: int, split: str, record: dict[str, Any]) -> None:
        """Append `record` of `split` (train, eval, cache) at optimizer step `step`."""
        if not self.accelerator.is_main_process:
            return
        record = {"step": step, "split": split, **record}
        with self.path.open("a") as out:
            out.write(json.dumps(record) + "\n")
        if split == "eval":
            tqdm.write(
                f"step {step}: held-out loss {record['loss']:.4f}, top-1 agreement by step "
                f"{record['top1']}, tau_sim {record['tau_sim']}"
            )
        self.accelerator.log(flat_record(split, record), step=step)
        if split == "eval":
            self._plot()

    def _plot(self) -> None:
        """Redraw the training curve. A figure that cannot be written is a warning, not the
        end of the run: the metrics it is drawn from are on disk, and the artifact is not yet."""
        try:
            plot_training_curve(self.path)
        except (OSError, ValueError) as error:
            tqdm.write(
                f"warning: the training curve was not drawn ({error}); draw it later with "
                f"draftsmith plot-training {self.output_dir}"
            )

    def finish(self) -> None:
        """Close the trackers. Accelerate's `end_training` also ends the process group, so this
        is the run's last collective call.

        wandb's ``run.finish()`` returns before its core process has written the run's log
        (``wandb/offline-run-*/run-*.wandb`` may still be its 7-byte header then, the records
        following a second or two later), so the main process then waits for wandb's teardown:
        when training returns, the offline run is complete on disk (for ``wandb sync``, or a
        reader). Teardown ends every wandb run of the process, and the trainer's is its last."""
        self.accelerator.end_training()
        if self.accelerator.is_main_process and wandb_mode(self.config) != "disabled":
            import wandb

            wandb.teardown()


def _truncate(path: Path, step: int) -> None:
    """Drop the records a resumed run writes again (those after its checkpoint's `step`); the
    kept ones are written under a temporary name, then renamed over the file."""
    if not path.is_file():
        return
    kept = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= step]
    tmp = path.with_name(f"{path.name}.tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept))
    tmp.replace(path)
