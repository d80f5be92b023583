"""Loading targets and draft models by zoo name, local folder or hub id, at a chosen precision."""

from __future__ import annotations

import logging
from typing import Literal

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from draftsmith.core.attention import use_grouped_sdpa
from draftsmith.core.hub import offline_unless_hub_reachable
from draftsmith.core.parallel import (
    DeviceMap,
    check_device_map,
    check_tensor_parallel,
    tensor_parallel_world_size,
)

logger = logging.getLogger(__name__)

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
"""Precision a model loads in (auto: the device's fast one, `resolve_dtype`)."""

DTYPES: dict[str, torch.dtype | str] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "auto": "auto",  # the device's fast precision: `resolve_dtype`
}


def bf16_matrix_units() -> list[str]:
    """The bf16 matrix units of this CPU that torch's kernels use (AMX, AVX512-BF16); empty
    where it has none."""
    units = (
        ("AMX", torch.cpu._is_amx_tile_supported()),
        ("AVX512-BF16", torch.cpu._is_avx512_bf16_supported()),
    )
    return [name for name, present in units if present]


def resolve_dtype(dtype: str, device: str | torch.device | None = None) -> torch.dtype:
    """The torch dtype of `dtype` (float32, bfloat16, float16, or auto) on `device` (default: the
    CPU). auto is the device's fast precision: bfloat16 on a GPU that has it and on a CPU with bf16
    matrix units (AMX or AVX512-BF16), float32 elsewhere (bf16 without those units is several
    times slower than float32 on a CPU); the choice and its reason are logged in one line."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    if dtype != "auto":
        return DTYPES[dtype]
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        fast = torch.cuda.is_bf16_supported()
        why = f"{torch.cuda.get_device_name(device)} {'has' if fast else 'lacks'} bf16"
    elif device.type == "cpu":
        units = bf16_matrix_units()
        fast = bool(units)
        why = (
            f"this CPU has bf16 matrix units: {', '.join(units)}"
            if fast
            else "this CPU has no bf16 matrix units: "
            f"{torch.backends.cpu.get_cpu_capability()}, no AMX or AVX512-BF16"
        )
    else:
        fast, why = False, f"no bf16 rule for {device.type} devices"
    chosen = torch.bfloat16 if fast else torch.float32
    logger.info("dtype auto: %s (%s)", str(chosen).removeprefix("torch."), why)
    return chosen


def load_device(
    device: str | None = None,
    device_map: DeviceMap | Literal["auto"] | None = None,
    tensor_parallel: bool = False,
) -> torch.device:
    """The kind of device a model loaded with these placement arguments computes on (its first,
    when spread): what `resolve_dtype` decides auto for."""
    if device is not None:
        return torch.device(device)
    if tensor_parallel or device_map == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device_map:
        first = str(next(iter(dict(device_map).values())))
        if first.isdigit():
            return torch.device("cuda", int(first))
        return torch.device(first if first.startswith(("cuda", "cpu")) else "cpu")
    return torch.device("cpu")


def load_pretrained(
    path: str,
    *,
    name: str | None = None,
    dtype: str = "auto",
    device: str | None = None,
    device_map: DeviceMap | Literal["auto"] | None = None,
    tensor_parallel: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, in eval mode (`draftsmith.zoo.load_model` also takes
    zoo names).

    path: a local folder holding a transformers checkpoint, or a hub id.
    name: what the user called the model, for messages (default: `path`).
    dtype: float32, bfloat16, float16, or auto (the fast precision of the device the model
        lands on, `resolve_dtype`).
    device_map: split the layers over devices (see `draftsmith.core.parallel`); checked
        before the weights load. "auto": transformers' own placement.
    tensor_parallel: shard every layer over the processes torchrun started (transformers'
        ``tp_plan="auto"``); checked against the model's head counts first.

    A model that loads with `sdpa` attention runs `grouped_sdpa_attention` instead (the same
    attention, without copying grouped key/value heads under a draft's mask).
    """
    if sum(x is not None and x is not False for x in (device, device_map, tensor_parallel)) > 1:
        raise ValueError("give one of device, device_map and tensor_parallel, not several")
    name_or_path = path if name is None else name
    torch_dtype = resolve_dtype(dtype, load_device(device, device_map, tensor_parallel))
    offline = offline_unless_hub_reachable(path)  # an unreachable hub: no minute of retries
    logger.info("loading %s from %s (%s)", name_or_path, path, torch_dtype)
    placement: dict = {}
    try:
        if device_map == "auto":
            placement = {"device_map": "auto"}
        elif device_map is not None:
            config = AutoConfig.from_pretrained(path)
            with torch.device("meta"):
                check_device_map(AutoModelForCausalLM.from_config(config), device_map)
            placement = {"device_map": dict(device_map)}
        if tensor_parallel:
            world_size = tensor_parallel_world_size()
            check_tensor_parallel(AutoConfig.from_pretrained(path), world_size, name_or_path)
            placement = {"tp_plan": "auto"}
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, **placement)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as err:
        why = (
            "no such local folder, the hub is offline or unreachable from here and its local "
            "cache does not hold it"
            if offline
            else " ".join(str(err).split())
        )
        raise FileNotFoundError(
            f"could not load model {name_or_path!r} from {path!r} ({why}): give a zoo name "
            "(smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b), a local folder holding a "
            "transformers checkpoint, or a hub id where a hub is reachable"
        ) from err
    if device is not None:
        model = model.to(device)
    use_grouped_sdpa(model)
    return model.eval(), tokenizer


def check_same_vocabulary(
    target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase, draft_name: str
) -> None:
    """Raise if the draft's tokenizer maps any token to another id than the target's."""
    if target.get_vocab() != draft.get_vocab():
        raise ValueError(
            f"the draft model {draft_name!r} uses another tokenizer than the target "
            f"({len(draft)} vs {len(target)} tokens, or the same size with other ids): "
            "a draft model must share the target's vocabulary"
        )
