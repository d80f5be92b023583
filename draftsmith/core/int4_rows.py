"""A drafter's linear layers over a few rows on 4-bit weights, on the CPU.

On the CPU a draft model's step is bound by reading its weights: a 0.5B draft model in bf16
reads about a gigabyte a token, a third of what the 1.5B target reads to verify a whole draft.
A drafter's weights only decide what is proposed, never what is accepted (the target verifies
every token), so they may be coarser than the target's without changing a single output token:
reading them as 4-bit integers (groups of `GROUP_SIZE` along the input, each with its own bf16
scale and offset, rounded to nearest) makes each one-row step read a quarter of the bytes, and
costs the drafter some agreement with the target.

`quantize` packs the 4-bit copies once (kept beside the bf16 weights, which the layers still
compute many rows with: a prompt's reading); within an `int4_rows` block the layers that have a
copy compute up to `MAX_ROWS` rows on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from weakref import WeakKeyDictionary

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.core.small_rows import of_weight

GROUP_SIZE = 32
"""Input columns sharing one scale and offset: the sub-block of the GGUF Q4_K format our zoo's
models come in, so their 4-bit tensors are represented almost as they were."""

MAX_ROWS = 8
"""Most rows computed on the 4-bit weight; above, unpacking it costs more than reading the bf16
weight."""

_QUANTIZED: WeakKeyDictionary[nn.Module, tuple] = WeakKeyDictionary()
"""Each quantized layer's packed 4-bit weight and (groups, out_features, 2) scales and offsets,
with the weight and the version of it they were packed from (`of_weight`)."""

_LAYERS: WeakKeyDictionary[nn.Module, list[nn.Linear]] = WeakKeyDictionary()
"""Each quantized model's quantized layers: walking its modules every round costs more than a
step can spare."""

_INSIDE: WeakKeyDictionary[nn.Module, list[tuple[nn.Module, type]]] = WeakKeyDictionary()
"""The models within a block now, with the classes their swapped layers had before it."""


def available(model: nn.Module) -> bool:
    """Whether `quantize` applies to model: bf16 weights on the CPU, and torch's kernel for them."""
    weight = next(model.parameters(), None)
    return (
        weight is not None
        and weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")
    )


def quantize(model: nn.Module) -> None:
    """Pack a 4-bit copy of every `nn.Linear` of model in the kernel's shapes (input width a
    multiple of `GROUP_SIZE`, output width of 16; the tied LM head too: the embedding's lookups
    keep the bf16 table). A ValueError where `available` says no."""
    if not available(model):
        raise ValueError(
            "4-bit drafting needs a bf16 model on the CPU and torch's int4 CPU kernel "
            "(_weight_int4pack_mm_for_cpu); load the drafter with dtype bfloat16, or draft on "
            "its own weights (int4=False)"
        )
    layers = [
        layer
        for layer in model.modules()
        if type(layer) is nn.Linear
        and layer.in_features % GROUP_SIZE == 0
        and layer.out_features % 16 == 0
    ]
    for layer in layers:
        packed(layer)
    _LAYERS[model] = layers


def is_quantized(model: nn.Module) -> bool:
    return model in _LAYERS


def prepare(model: nn.Module, int4: bool | None) -> bool:
    """Whether a drafter runs model on 4-bit copies, quantizing it once if so: int4 None (a
    drafter's default) does where `available` says it can."""
    int4 = available(model) if int4 is None else int4
    if int4 and not is_quantized(model):
        quantize(model)
    return int4


def packed(layer: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """layer's 4-bit weight and scales (`pack`), packed again when the weight has changed (a
    drafter made from a head that trains on)."""
    return of_weight(_QUANTIZED, layer, pack)


def pack(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight (out, in) as torch's packed 4-bit layout and its scales and offsets
    (in / GROUP_SIZE, out, 2), rounded to nearest within each group's min-max range."""
    out_features, in_features = weight.shape
    groups = weight.float().reshape(out_features, in_features // GROUP_SIZE, GROUP_SIZE)
    low = groups.amin(-1)
    scale = ((groups.amax(-1) - low) / 15).clamp(min=torch.finfo(torch.bfloat16).tiny)
    levels = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
        levels.reshape(out_features, in_features).to(torch.int32), 1
    )
    # The kernel reads a level q as (q - 8) * scale + offset.
    offset = low + 8 * scale
    scales = torch.stack([scale.t(), offset.t()], dim=-1).to(torch.bfloat16).contiguous()
    return packed, scales


def dequantize(layer: nn.Linear) -> torch.Tensor:
    """The weight layer's 4-bit copy stands for (out, in), float32: for tests and measurements."""
    eye = torch.eye(layer.in_features, dtype=torch.bfloat16)
    weight, scales = packed(layer)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, weight, GROUP_SIZE, scales).float().t()


class Int4RowsLinear(nn.Linear):
    """`nn.Linear` computing 1..MAX_ROWS rows without autograd on its 4-bit copy; anything else
    runs on the bf16 weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if not 1 <= rows <= MAX_ROWS or torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)
        weight, scales = packed(self)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.reshape(rows, self.in_features).contiguous(), weight, GROUP_SIZE, scales
        )
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


@contextmanager
def int4_rows(model: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Within the block, model's quantized layers are `Int4RowsLinear` (the same parameters),
    and what they were again after it, even on an error; nested blocks leave the layers to the
    outermost. Nothing for a model `quantize` has not seen, or with enabled false (a drafter
    that drafts on the weights of a model another one quantized)."""
    if not enabled or model in _INSIDE:
        yield
        return
    swapped = [(m, type(m)) for m in _LAYERS.get(model, ())]
    for module, _ in swapped:
        object.__setattr__(module, "__class__", Int4RowsLinear)
    _INSIDE[model] = swapped
    try:
        yield
    finally:
        del _INSIDE[model]
        for module, cls in swapped:
            object.__setattr__(module, "__class__", cls)
