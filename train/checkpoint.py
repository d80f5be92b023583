"""Resumable checkpoints of a run: ``checkpoints/step_N`` folders, written whole or not at all, found and loaded back."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from accelerate import Accelerator

__all__ = [
    "CHECKPOINTS",
    "TRAINER_STATE",
    "TrainerState",
    "latest_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
]

CHECKPOINTS = "checkpoints"
TRAINER_STATE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class TrainerState:
    """Where a run stands, beyond what Accelerate saves (model, optimizer, scheduler, RNGs)."""

    step: int = 0
    """Optimizer steps done."""
    train_seconds: float = 0.0
    """Seconds spent in training steps (evaluation and checkpoints excluded)."""
    train_tokens: int = 0
    """Training tokens those steps read, over all processes."""

    @property
    def tokens_per_s(self) -> float:
        """Training throughput over all processes."""
        return self.train_tokens / self.train_seconds if self.train_seconds else 0.0


def save_checkpoint(accelerator: Accelerator, output_dir: Path, state: TrainerState) -> Path:
    """Save `accelerator`'s state (model in safetensors) and `state` to
    ``output_dir/checkpoints/step_N``. Every process calls it. It is written as ``step_N.tmp``
    and renamed once complete, so a folder named ``step_N`` is always whole."""
    folder = output_dir / CHECKPOINTS
    final, tmp = folder / f"step_{state.step}", folder / f"step_{state.step}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a run that died while saving
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        record = {**asdict(state), "num_processes": accelerator.num_processes}
        (tmp / TRAINER_STATE).write_text(json.dumps(record, indent=2) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    accelerator.wait_for_everyone()
    return final


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete ``checkpoints/step_N`` folder of a run, or None."""
    folder = Path(output_dir) / CHECKPOINTS
    found = [
        (int(match.group(1)), path)
        for path in (folder.iterdir() if folder.is_dir() else [])
        if (match := _STEP_DIR.match(path.name)) and (path / TRAINER_STATE).is_file()
    ]
    return max(found)[1] if found else None


def load_checkpoint(accelerator: Accelerator, checkpoint: Path) -> TrainerState:
    """Restore `accelerator`'s state from `checkpoint` and return the run's state there.

    Raises:
        ValueError: the checkpoint was written by another number of processes (the data order
            and the RNG states are per process).
    """
    record = json.loads((checkpoint / TRAINER_STATE).read_text())
    written_by = record.pop("num_processes")
    if written_by != accelerator.num_processes:
        raise ValueError(
            f"checkpoint {checkpoint} was written by {written_by} processes; resume it with the "
            f"same number (now {accelerator.num_processes})"
        )
    accelerator.load_state(str(checkpoint))
    return TrainerState(**record)
