"""Resumable checkpoints of a run: ``checkpoints/step_N`` folders, written whole or not at all, found and loaded back.

A checkpoint holds safetensors and JSON only, written and read here: never pickle, whose
loading can run code. Weights and optimizer state are full (unsharded) state dicts, so any
number of processes, FSDP-sharded or replicated, resumes any checkpoint. One folder::

    trainer_state.json      `TrainerState` and num_processes; written last (marks a whole folder)
    model.safetensors       the prepared module's full state dict ("head.*", "acceptance.*"),
                            each tensor shaped as its parameter or buffer; tied tensors are
                            written once, the other names in the metadata's "aliases" (JSON)
    optimizer.safetensors   the optimizer's tensors as "state.<parameter name>.<entry>": AdamW's
                            step (), exp_avg and exp_avg_sq (shaped as the parameter)
    optimizer.json          {"param_groups": [... "params": [parameter name, ...]],
                             "state": {parameter name: {entry: plain number}}}
    scheduler.json          the LR scheduler's state_dict()
    scaler.json             the GradScaler's state_dict() (fp16 mixed precision only)
    rng_<rank>.safetensors  per process: "torch" (the CPU generator's state, uint8 (S,)) and
                            "cuda.<i>" (CUDA device i's, when there are CUDA devices)
    rng_<rank>.json         per process: {"python": random.getstate(), "numpy": its global state}

The data order needs no state: `EpochSampler` is a function of (seed, micro-batch number).
"""

from __future__ import annotations

import json
import random
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.utils import DistributedType
from safetensors import safe_open
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.optim.lr_scheduler import LRScheduler

__all__ = [
    "CHECKPOINTS",
    "TRAINER_STATE",
    "TrainerState",
    "check_checkpointable",
    "latest_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
]

CHECKPOINTS = "checkpoints"
TRAINER_STATE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")
# Gathered whole onto the CPU, on the main process only (the others get empty dicts).
_GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)
# Every process reads the whole file; each keeps its own shard of it.
_SCATTER = StateDictOptions(full_state_dict=True)


@dataclass
class TrainerState:
    """Where a run stands, beyond the model, optimizer, schedule and RNGs."""

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


def check_checkpointable(accelerator: Accelerator) -> None:
    """Raises ValueError under DeepSpeed, whose engine keeps the ZeRO optimizer state
    partitioned in a form of its own (saved with pickle by its `save_checkpoint`)."""
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        raise ValueError(
            "checkpoints are not supported under DeepSpeed (its engine saves the optimizer "
            "state with pickle): set checkpoint_every=0, or train with the fsdp or "
            "multi-gpu-ddp accelerate config"
        )


def save_checkpoint(
    accelerator: Accelerator,
    output_dir: Path,
    state: TrainerState,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
) -> Path:
    """Save `model` (as prepared), `optimizer`, `scheduler`, the RNGs and `state` to
    ``output_dir/checkpoints/step_N``. Every process calls it (the state dicts are gathered).
    It is written as ``step_N.tmp`` and renamed once complete, so a folder named ``step_N`` is
    always whole.

    Raises:
        ValueError: under DeepSpeed, or a state that is not plain JSON where JSON is written.
    """
    check_checkpointable(accelerator)
    # On every process, before any collective call: an error here stops them all alike.
    schedule = _json(scheduler.state_dict(), "the LR scheduler's state_dict()")
    folder = output_dir / CHECKPOINTS
    final, tmp = folder / f"step_{state.step}", folder / f"step_{state.step}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a run that died while saving
        tmp.mkdir(parents=True)
    weights = get_model_state_dict(model, options=_GATHER)
    optim = get_optimizer_state_dict(model, _unwrapped(optimizer), options=_GATHER)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _write_tensors(tmp / "model.safetensors", weights)
        tensors, plain = _split_optimizer_state(optim)
        _write_tensors(tmp / "optimizer.safetensors", tensors)
        (tmp / "optimizer.json").write_text(_json(plain, "the optimizer's state_dict()"))
        (tmp / "scheduler.json").write_text(schedule)
        if accelerator.scaler is not None:
            scaler = _json(accelerator.scaler.state_dict(), "the GradScaler's state_dict()")
            (tmp / "scaler.json").write_text(scaler)
    rank = accelerator.process_index
    tensors, plain = _rng_state()
    _write_tensors(tmp / f"rng_{rank}.safetensors", tensors)
    (tmp / f"rng_{rank}.json").write_text(_json(plain, "the RNG states"))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        record = {**asdict(state), "num_processes": accelerator.num_processes}
        (tmp / TRAINER_STATE).write_text(_json(record, "the trainer state"))
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


def load_checkpoint(
    accelerator: Accelerator,
    checkpoint: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
) -> TrainerState:
    """Restore `model`, `optimizer`, `scheduler` (and the RNGs) from `checkpoint` and return the
    run's state there. Every process calls it.

    Any number of processes resumes any checkpoint, sharded (FSDP) or replicated, as the files
    hold full state dicts. Only an equal number continues exactly; at another the global batch,
    the data order and the per-process RNG streams differ from the run that wrote it (the
    model, optimizer, schedule and step carry over, the RNGs are left as seeded), which is said.

    Raises:
        ValueError: the folder holds files other than safetensors and JSON (a checkpoint of
            the old, pickled format), or this run is under DeepSpeed.
    """
    check_checkpointable(accelerator)
    foreign = sorted(
        p.name for p in checkpoint.iterdir() if p.suffix not in (".json", ".safetensors")
    )
    if foreign:
        raise ValueError(
            f"checkpoint {checkpoint} holds {', '.join(foreign)}: the old format, whose "
            "optimizer, schedule and RNG states are pickled (loading a pickle can run code), "
            "so it is not loaded. Start a new output_dir, or delete "
            f"{checkpoint.parent} to re-train from the start"
        )
    record = json.loads((checkpoint / TRAINER_STATE).read_text())
    written_by = record.pop("num_processes")
    same_count = written_by == accelerator.num_processes
    if not same_count:
        accelerator.print(
            f"checkpoint {checkpoint} was written by {written_by} process(es), resumed by "
            f"{accelerator.num_processes}: weights, optimizer, schedule and step carry over, but "
            "the global batch, data order and RNG streams change, so this is not the run that "
            "the same number of processes would have continued"
        )
    set_model_state_dict(model, _read_tensors(checkpoint / "model.safetensors"), options=_SCATTER)
    optim = _join_optimizer_state(
        _read_tensors(checkpoint / "optimizer.safetensors"),
        json.loads((checkpoint / "optimizer.json").read_text()),
    )
    set_optimizer_state_dict(model, _unwrapped(optimizer), optim, options=_SCATTER)
    scheduler.load_state_dict(json.loads((checkpoint / "scheduler.json").read_text()))
    scaler = checkpoint / "scaler.json"
    if accelerator.scaler is not None and scaler.is_file():
        accelerator.scaler.load_state_dict(json.loads(scaler.read_text()))
    if same_count:
        rank = accelerator.process_index
        _set_rng_state(
            _read_tensors(checkpoint / f"rng_{rank}.safetensors"),
            json.loads((checkpoint / f"rng_{rank}.json").read_text()),
        )
    return TrainerState(**record)


def _unwrapped(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The torch optimizer inside Accelerate's wrapper: loading a state dict may take a step
    with zero gradients and lr 0 (to create the state), which must not go through the
    wrapper's gradient scaler."""
    return optimizer.optimizer if isinstance(optimizer, AcceleratedOptimizer) else optimizer


def _split_optimizer_state(optim: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A full optimizer state dict ({"state": {name: {entry: value}}, "param_groups": [...]})
    as its tensors ("state.<name>.<entry>") and the rest."""
    tensors, plain = {}, {name: {} for name in optim["state"]}
    for name, entries in optim["state"].items():
        for entry, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{name}.{entry}"] = value
            else:
                plain[name][entry] = value
    return tensors, {"param_groups": optim["param_groups"], "state": plain}


def _join_optimizer_state(
    tensors: dict[str, torch.Tensor], plain: dict[str, Any]
) -> dict[str, Any]:
    """The inverse of `_split_optimizer_state`. A parameter name holds dots, an entry never."""
    state = plain["state"]
    for key, tensor in tensors.items():
        name, entry = key.removeprefix("state.").rsplit(".", 1)
        state[name][entry] = tensor
    return {"state": state, "param_groups": plain["param_groups"]}


def _rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """This process's generator states: torch's as tensors, Python's and numpy's as JSON."""
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors |= {f"cuda.{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())}
    name, keys, position, has_gauss, gauss = np.random.get_state()
    numpy = [name, keys.tolist(), position, has_gauss, gauss]
    return tensors, {"python": random.getstate(), "numpy": numpy}


def _set_rng_state(tensors: dict[str, torch.Tensor], plain: dict[str, Any]) -> None:
    """Restore what `_rng_state` returned (JSON turned its tuples into lists)."""
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[f"cuda.{i}"] for i in range(sum(k.startswith("cuda.") for k in tensors))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    version, internal, gauss = plain["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, position, has_gauss, gauss = plain["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), position, has_gauss, gauss))


def _write_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Save `tensors` with safetensors, which refuses tensors sharing memory (tied weights):
    each is written once, under its first name, the others listed as "aliases"."""
    unique, aliases, first = {}, {}, {}
    for name, tensor in tensors.items():
        storage = tensor.untyped_storage().data_ptr()
        where = (storage, tensor.storage_offset(), tensor.shape, tensor.stride(), tensor.dtype)
        if where in first:
            aliases[name] = first[where]
        else:
            first[where] = name
            unique[name] = tensor.detach().cpu().contiguous()
    save_file(unique, str(path), metadata={"aliases": json.dumps(aliases)})


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """What `_write_tensors` saved, aliases included (on the CPU)."""
    with safe_open(str(path), framework="pt") as file:
        tensors = {name: file.get_tensor(name) for name in file.keys()}  # noqa: SIM118 (no __iter__)
        aliases = json.loads(file.metadata()["aliases"])
    return tensors | {name: tensors[original] for name, original in aliases.items()}


def _json(value: Any, what: str) -> str:
    """`value` as JSON text; `what` names it in the error."""
    try:
        return json.dumps(value, indent=2, allow_nan=False) + "\n"
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"{what} is not plain JSON ({error}), and a checkpoint holds no pickle: keep its "
            "values to numbers, strings, lists and dicts"
        ) from error
