"""A training run's artifacts: the trained head written as a draftsmith artifact, and a trained
artifact read back to start from (`init_from`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from transformers import PreTrainedModel

from draftsmith.artifact import load_head, save_artifact
from draftsmith.core.config import ConfigError, config_to_dict
from draftsmith.heads import DraftHead, build_head
from draftsmith.train.acceptance import build_acceptance_head
from draftsmith.train.config import TrainConfig


def write_artifact(
    acc: Accelerator,
    module: torch.nn.Module,
    config: TrainConfig,
    target: PreTrainedModel,
    training: dict[str, Any],
    out: Path,
) -> Path:
    """Write the trained head (and its acceptance head) to `out` from the main process. The
    weights go through a full state dict (gathered when FSDP shards them) loaded into a fresh
    head, so every strategy exports the same way; `training` goes into its config."""
    weights = acc.get_state_dict(module)  # every process takes part in the gather
    if acc.is_main_process:
        head = build_head(config.head, target, config.head_args).to(acc.device)
        head.load_state_dict(_submodule(weights, "head"))
        acceptance = None
        if config.acceptance_head is not None:
            acceptance = build_acceptance_head(head, config.acceptance_head)
            acceptance.load_state_dict(_submodule(weights, "acceptance"))
        out = save_artifact(
            head,
            target,
            out,
            training=training,
            target_name_or_path=config.target,
            acceptance=acceptance,
        )
        print(f"drafter written to {out}")
    acc.wait_for_everyone()
    return out


def load_trained(head: DraftHead, path: str, target: PreTrainedModel) -> None:
    """Replace the fresh head's weights by those of the trained artifact at `path`, whose head
    config must be the recipe's."""
    trained = load_head(path, target, dtype=torch.float32)
    if trained.config != head.config:
        raise ConfigError(
            f"init_from {path} holds a {trained.kind} head with config "
            f"{config_to_dict(trained.config)}, but the recipe's head_args give "
            f"{config_to_dict(head.config)}: make head_args match the artifact's"
        )
    head.load_state_dict(trained.state_dict())


def _submodule(weights: dict[str, torch.Tensor], name: str) -> dict[str, torch.Tensor]:
    """The entries of a `HeadObjective` state dict under its submodule `name`, unprefixed."""
    prefix = f"{name}."
    return {k.removeprefix(prefix): v for k, v in weights.items() if k.startswith(prefix)}
