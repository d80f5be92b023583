"""A target over several devices: tensor parallel (transformers' ``tp_plan="auto"`` under
``torchrun``) or a ``device_map`` split of its layers, checked before anything is loaded.

Tensor parallel: every process runs the same decoding loop; each holds a slice of every
attention and MLP layer, and the target's forward all-reduces inside (the logits come out
whole on every process). The drafter is replicated, so every process drafts the same tokens.
A device map places whole layers (embeddings on the first device, norm and LM head on the
last); activations hop device to device inside the forward, and Accelerate's dispatch hooks
(which transformers installs for a map over several devices) return the logits and hidden
states to the device the tokens came from: the first, where the drafter lives. So each round
moves the draft tokens in and the logits and features out once, in the target's forward.

    target, tokenizer = load_model(name, tensor_parallel=True)     # under torchrun
    target, tokenizer = load_model(name, device_map=split_device_map(config, [0, 1]))
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

import torch
from transformers import PretrainedConfig, PreTrainedModel

__all__ = [
    "DeviceMap",
    "check_device_map",
    "check_tensor_parallel",
    "is_main_process",
    "placement",
    "shards_agree",
    "split_device_map",
    "tensor_parallel_world_size",
]

DeviceMap = Mapping[str, str | int | torch.device]
"""Module name prefix -> device, as transformers' ``from_pretrained(device_map=...)`` takes it."""


def tensor_parallel_world_size() -> int:
    """The number of processes `torchrun` started (WORLD_SIZE).

    Raises:
        ValueError: not started by torchrun.
    """
    if "WORLD_SIZE" not in os.environ:
        raise ValueError(
            "tensor parallel needs one process per device, started by torchrun: "
            "torchrun --nproc_per_node N your_script.py ... (no WORLD_SIZE in the environment)"
        )
    return int(os.environ["WORLD_SIZE"])


def check_tensor_parallel(
    config: PretrainedConfig, world_size: int, name: str = "the target"
) -> None:
    """Raise unless `world_size` processes can each hold an equal share of every attention
    layer's query and key/value heads (transformers shards heads, never splits one).

    Raises:
        ValueError: naming the head counts and the process counts that work.
    """
    text = config.get_text_config()
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    if heads % world_size == 0 and kv_heads % world_size == 0:
        return
    shared = math.gcd(heads, kv_heads)
    works = [n for n in range(1, shared + 1) if shared % n == 0]
    raise ValueError(
        f"tensor parallel over {world_size} processes: {name} has {heads} query and {kv_heads} "
        f"key/value heads, which do not split evenly into {world_size}; run with a process "
        f"count in {works} (torchrun --nproc_per_node N), or split the layers over devices with "
        "a device map instead"
    )


def is_main_process() -> bool:
    """Whether this process is the one that reports: the only one, or rank 0 of torchrun's."""
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


def shards_agree(model: PreTrainedModel, values: Sequence[float]) -> list[float]:
    """`values` at their largest over the processes a tensor-parallel `model` is sharded over
    (as given for a model on one process). A process that sized its next draft by its own clock
    would verify another number of tokens than the others, and their collective forwards would
    no longer match."""
    if (getattr(model, "tp_size", None) or 1) == 1:
        return list(values)
    # On the model's device: NCCL reduces accelerator tensors only.
    agreed = torch.tensor(values, dtype=torch.float64, device=model.device)
    torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MAX)
    return agreed.tolist()


def placement(model: PreTrainedModel) -> str:
    """How `model` spreads over devices, for naming what is measured on it: "" on one device,
    "tp2" sharded over two processes, "2-devices" for a device map over two."""
    tp_size = getattr(model, "tp_size", None) or 1
    if tp_size > 1:
        return f"tp{tp_size}"
    devices = set(getattr(model, "hf_device_map", {"": None}).values())
    return f"{len(devices)}-devices" if len(devices) > 1 else ""


def split_device_map(config: PretrainedConfig, devices: Sequence[str | int]) -> dict[str, str]:
    """The target's decoder layers in contiguous, near-equal runs over `devices` (first device:
    embeddings and rotary tables; last: the final norm and the LM head). Names follow the
    ``model.layers.N`` layout of Llama-style causal LMs; check a map with `check_device_map`."""
    if not devices:
        raise ValueError("split_device_map needs at least one device")
    layers = config.get_text_config().num_hidden_layers
    names = [
        str(torch.device(d) if not isinstance(d, int) else torch.device("cuda", d)) for d in devices
    ]
    per = math.ceil(layers / len(names))
    device_map = {"model.embed_tokens": names[0], "model.rotary_emb": names[0]}
    device_map.update({f"model.layers.{i}": names[i // per] for i in range(layers)})
    device_map.update({"model.norm": names[-1], "lm_head": names[-1]})
    return device_map


def check_device_map(model: PreTrainedModel, device_map: DeviceMap) -> None:
    """Raise unless `device_map` gives every parameter and buffer of `model` (built on the meta
    device is enough) a device, and names only modules that exist.

    Raises:
        ValueError: naming the modules left on no device, or the unknown entries.
    """
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    modules = {n for n, _ in model.named_modules()}

    def placed(name: str) -> bool:
        return "" in device_map or any(
            name == prefix or name.startswith(prefix + ".") for prefix in device_map
        )

    missing = sorted({_owner(n) for n in names if not placed(n)})
    if missing:
        raise ValueError(
            f"the device map leaves {', '.join(missing)} on no device: give each a device "
            f"(e.g. {{'{missing[0]}': 'cuda:0'}}), or build one with split_device_map / "
            "device_map='auto'"
        )
    unknown = sorted(set(device_map) - modules - {""})
    if unknown:
        raise ValueError(
            f"the device map names {', '.join(unknown)}, which {type(model).__name__} does not "
            "have: use its module names (model.embed_tokens, model.layers.N, model.norm, lm_head)"
        )


def _owner(name: str) -> str:
    """The module a parameter belongs to, at the depth a device map names (model.layers.3)."""
    parts = name.split(".")
    depth = 3 if parts[:2] == ["model", "layers"] else len(parts) - 1
    return ".".join(parts[:depth])
