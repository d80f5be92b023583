"""Resumable checkpoints of a run: ``checkpoints/step_N`` folders, written whole or not at all, found and loaded back."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from accelerate import Accelerator
from accelerate.utils import DistributedType

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

    Any number of processes resumes any checkpoint of its strategy: replicated weights are one
    file, FSDP's sharded ones are resharded on load. Only an equal number continues exactly; at
    another the global batch, the data order and the per-process RNG streams differ from the
    run that wrote it (the model, optimizer, schedule and step carry over), which is said.

    Raises:
        ValueError: the checkpoint's weights are sharded (FSDP) and this run's are not, or the
            other way round.
    """
    record = json.loads((checkpoint / TRAINER_STATE).read_text())
    written_by = record.pop("num_processes")
    sharded, wanted = _is_sharded(checkpoint), accelerator.distributed_type == DistributedType.FSDP
    if sharded != wanted:
        kind = {True: "FSDP-sharded", False: "replicated (DDP / one process)"}
        raise ValueError(
            f"checkpoint {checkpoint} holds {kind[sharded]} weights but this run is "
            f"{kind[wanted]}: resume it with the accelerate config that wrote it (any number of "
            "processes), or start a new output_dir"
        )
    if written_by != accelerator.num_processes:
        accelerator.print(
            f"checkpoint {checkpoint} was written by {written_by} process(es), resumed by "
            f"{accelerator.num_processes}: weights, optimizer, schedule and step carry over, but "
            "the global batch, data order and RNG streams change, so this is not the run that "
            "the same number of processes would have continued"
        )
    accelerator.load_state(str(checkpoint))
    return TrainerState(**record)


def _is_sharded(checkpoint: Path) -> bool:
    """True for a checkpoint of FSDP-sharded weights (Accelerate's ``pytorch_model_fsdp_*``)."""
    return any(checkpoint.glob("pytorch_model_fsdp_*"))
