"""The flags that spread a command's target over several devices: ``--device-map`` and
``--tensor-parallel`` (see `draftsmith.core.parallel`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from draftsmith.core.parallel import DeviceMap

DEVICE_MAP_FORMS = (
    "give auto, a comma-separated device list (e.g. cuda:0,cuda:1) or a JSON file of module "
    'name -> device (e.g. {"model.layers.0": "cuda:0", ...})'
)


@dataclass(kw_only=True)
class TargetPlacement:
    """A command's target on one device, split over several by layers, or sharded over
    processes."""

    device_map: str | None = None
    """Split the target's layers over devices: auto (transformers' placement), a comma-separated
    device list (cuda:0,cuda:1: contiguous runs of layers, the embeddings on the first device and
    the LM head on the last), or a JSON file of module name -> device. The drafter stays on the
    first device."""
    tensor_parallel: bool = False
    """Shard every layer of the target over the processes torchrun started (torchrun
    --nproc_per_node N -m draftsmith.commands.cli COMMAND ...): each runs the same decoding and
    the first alone prints and writes."""

    def __post_init__(self) -> None:
        if self.device_map is not None and self.tensor_parallel:
            raise ValueError(
                "--device-map and --tensor-parallel are two ways to spread the target: give one"
            )
        if self.device_map is not None:
            parse_device_map(self.device_map)  # bad values fail before any model loads

    def load_target(self, name: str, dtype: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        """The target `name` and its tokenizer, placed as the flags say."""
        from draftsmith.zoo import load_model

        if self.tensor_parallel:
            return load_model(name, dtype=dtype, tensor_parallel=True)
        if self.device_map is None:
            return load_model(name, dtype=dtype)
        device_map = parse_device_map(self.device_map)
        if isinstance(device_map, list):
            device_map = layer_split(name, device_map)
        return load_model(name, dtype=dtype, device_map=device_map)


def parse_device_map(value: str) -> DeviceMap | list[str] | str:
    """--device-map's value: "auto", a list of devices, or the map a JSON file holds; a
    ValueError naming the accepted forms otherwise."""
    if value == "auto":
        return value
    if value.endswith(".json") or Path(value).is_file():
        return _read_device_map(Path(value))
    return [_device(part, value) for part in value.split(",")]


def layer_split(name: str, devices: list[str]) -> dict[str, str]:
    """Target `name`'s layers in contiguous runs over `devices` (its config read, not its
    weights)."""
    from transformers import AutoConfig

    from draftsmith.core.parallel import split_device_map
    from draftsmith.zoo import resolve_model

    return split_device_map(AutoConfig.from_pretrained(resolve_model(name)), devices)


def _read_device_map(path: Path) -> dict[str, str]:
    if not path.is_file():
        raise FileNotFoundError(f"--device-map {path}: no such file; {DEVICE_MAP_FORMS}")
    try:
        device_map = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"--device-map {path} is not JSON ({error}); {DEVICE_MAP_FORMS}") from None
    if not isinstance(device_map, dict) or not device_map:
        raise ValueError(
            f"--device-map {path} holds no module name -> device object; {DEVICE_MAP_FORMS}"
        )
    return {module: _device(str(device), str(path)) for module, device in device_map.items()}


def _device(text: str, value: str) -> str:
    """One device of a --device-map as torch names it (an index alone: that CUDA device)."""
    import torch

    try:
        device = torch.device("cuda", int(text)) if text.isdigit() else torch.device(text)
    except RuntimeError:
        raise ValueError(
            f"--device-map {value!r}: {text!r} is not a device; {DEVICE_MAP_FORMS}"
        ) from None
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(
            f"--device-map {value!r} names {device}, but this machine has "
            f"{torch.cuda.device_count()} CUDA devices: name devices it has"
        )
    return str(device)
