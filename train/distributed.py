"""The trainer's `Accelerator`, with the accelerate config's strategy honoured on the CPU too.

Accelerate joins processes that `accelerate launch` started on a machine without an accelerator
into one MULTI_CPU (gloo) group (with `cpu=True`), but only ever runs plain data parallel
there: under `cpu=True` its state never sets FSDP or DeepSpeed, so an FSDP config on the CPU
silently trains with DDP. PyTorch's FSDP2 (`fully_shard`) runs over gloo on the CPU, so a MULTI_CPU group
launched with an FSDP config is switched to FSDP here: the CPU tests then run the same sharding,
gathered checkpoints and export as the GPUs. DeepSpeed is not switched (see the README):
under it the engine accumulates and clips, so `check_deepspeed` holds its config to the recipe.
"""

from __future__ import annotations

import os

import torch
from accelerate import Accelerator, PartialState
from accelerate.tracking import GeneralTracker
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

__all__ = ["build_accelerator", "check_deepspeed"]


def build_accelerator(
    mixed_precision: str, log_with: list[str | GeneralTracker] | None
) -> Accelerator:
    """An Accelerator for this machine: `cpu=True` where there is no accelerator (only then do
    the launched processes form a gloo group), FSDP when the launch config asks for it."""
    cpu = not torch.accelerator.is_available()
    wants_fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    plugin = FullyShardedDataParallelPlugin() if cpu and wants_fsdp else None
    accelerator = Accelerator(
        mixed_precision=mixed_precision, cpu=cpu, log_with=log_with, fsdp_plugin=plugin
    )
    if plugin is not None and accelerator.distributed_type == DistributedType.MULTI_CPU:
        if plugin.fsdp_version != 2:
            raise ValueError(
                "FSDP on the CPU needs fsdp_version: 2 in the accelerate config (FSDP1 is "
                "CUDA-only)"
            )
        if accelerator.mixed_precision != "no":
            plugin.set_mixed_precision(accelerator.mixed_precision)
        accelerator.state.fsdp_plugin = plugin
        accelerator.state.distributed_type = DistributedType.FSDP
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    return accelerator


def check_deepspeed(
    accelerator: Accelerator, grad_accum: int, clip_grad_norm: float | None
) -> None:
    """Under DeepSpeed the engine steps after its own count of micro-batches and clips by its
    own setting; refuse a launch config whose values differ from the recipe's.

    Raises:
        ValueError: naming the accelerate config keys to set.
    """
    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        return
    ds = accelerator.state.deepspeed_plugin.deepspeed_config
    found = (ds.get("gradient_accumulation_steps"), ds.get("gradient_clipping"))
    wanted = (grad_accum, clip_grad_norm or 0.0)
    if found != wanted:
        raise ValueError(
            f"the DeepSpeed config has gradient_accumulation_steps {found[0]} and "
            f"gradient_clipping {found[1]}, the recipe grad_accum {grad_accum} and "
            f"clip_grad_norm {clip_grad_norm}: set deepspeed_config: gradient_accumulation_steps: "
            f"{wanted[0]} and gradient_clipping: {wanted[1]} in the accelerate config"
        )
