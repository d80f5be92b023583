"""Linear layers over a few rows on the CPU, computed by oneDNN on a prepacked weight.

Decoding runs 1 to 64 new positions through every linear layer. In float32 on the CPU,
`F.linear(x, W)` asks MKL's sgemm for x @ W^T, which for a few rows of x costs about one more
pass over the weight than the work needs (by all appearances a packing copy of it): a forward
over two tokens costs far more than one over a single token, though both read each weight once.
oneDNN's inner product on a weight reordered once into its blocked layout is faster at one row
and grows more slowly with the rows.

The packed weight is a second copy of each swapped layer's weight, made by `prepack` (decoders
and drafters call it at load) or on first use, and kept while the layer lives (repacked when the
weight changes); DRAFTSMITH_SMALL_ROWS=0 turns the whole mechanism off.

bfloat16 layers are packed for oneDNN too where it has bf16 kernels (AVX-512 BF16, AMX): there
F.linear in bf16 gives the same bits, more slowly. On CPUs without them `--dtype auto` runs
float32, so bf16 layers there stay torch's own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import TypeVar
from weakref import WeakKeyDictionary, WeakSet, ref

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

MAX_ROWS = 64
"""Most rows computed on the packed weight; above, F.linear (a prefill or a training batch) is
as fast."""

ENABLED = (
    os.environ.get("DRAFTSMITH_SMALL_ROWS", "1") != "0"
    and torch.backends.mkl.is_available()
    and torch.backends.mkldnn.is_available()
)
"""On x86 builds of torch (MKL and oneDNN), the measured case; DRAFTSMITH_SMALL_ROWS=0 turns it
off."""

_PACKED: WeakKeyDictionary[nn.Module, tuple[ref, int, torch.Tensor]] = WeakKeyDictionary()
"""Each swapped layer's packed weight, with the weight tensor and the version of it that it was
packed from (a new Parameter or an in-place update, e.g. an optimiser step, repacks)."""

Derived = TypeVar("Derived")


def of_weight(
    store: WeakKeyDictionary, layer: nn.Linear, make: Callable[[torch.Tensor], Derived]
) -> Derived:
    """What make gives of layer's weight, kept in store per layer and made again when the weight
    changes (a new Parameter, or an in-place update such as an optimiser step)."""
    weight = layer.weight
    cached = store.get(layer)
    if cached is None or cached[0]() is not weight or cached[1] != weight._version:
        cached = (ref(weight), weight._version, make(weight.detach()))
        store[layer] = cached
    return cached[2]


def packed_weight(layer: nn.Linear) -> torch.Tensor:
    """layer's weight in oneDNN's blocked layout, packed once per change of the weight."""
    return of_weight(_PACKED, layer, torch.ops.mkldnn._reorder_linear_weight)


class SmallRowsLinear(nn.Linear):
    """`nn.Linear` computing 1..MAX_ROWS rows without autograd on the packed weight; anything
    else (more rows, or a forward that records gradients) runs F.linear."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if not 1 <= rows <= MAX_ROWS or torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(
            x.contiguous(), packed_weight(self), self.bias, "none", [], ""
        )


def _small_rows_class(weight: torch.Tensor) -> type[nn.Linear] | None:
    """The class a layer with this weight computes few rows with, or None to leave it: plain
    float32 CPU weights and bf16 ones where oneDNN has bf16 kernels, both packed for oneDNN (a
    sharded weight computes its own way; accelerators do not go through these)."""
    if weight.device.type != "cpu" or isinstance(weight, DTensor):
        return None
    if weight.dtype == torch.float32:
        return SmallRowsLinear
    if weight.dtype == torch.bfloat16 and _onednn_bf16():
        return SmallRowsLinear
    return None


@cache
def _onednn_bf16() -> bool:
    """oneDNN has bf16 kernels on this CPU (AVX-512 BF16 or AMX): a bf16 weight packed for them
    computes few rows faster than F.linear does, to the same bits."""
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


_LINEARS: WeakKeyDictionary[nn.Module, list[nn.Module]] = WeakKeyDictionary()
"""Each model's `nn.Linear` layers, found once: walking the modules every forward costs more
than a one-token forward can spare."""

_INSIDE: WeakSet[nn.Module] = WeakSet()
"""The models within a block now: a nested block (a decoder's forward inside its generation's
block) returns at once rather than classifying every layer again."""


@contextmanager
def small_rows(model: nn.Module, rows: int | None = None) -> Iterator[None]:
    """Within the block, model's float32 CPU `nn.Linear` layers, and its bf16 ones where oneDNN
    has bf16 kernels, are `SmallRowsLinear` (the same parameters), and plain `nn.Linear` again
    after it, even on an error. rows: the positions (batch x tokens) of the one forward the
    block runs, to skip the swap where it would change nothing (past MAX_ROWS F.linear runs as
    fast as a packed weight); None for a block of many forwards (Hugging Face's `generate`), each
    dispatched by its own rows. Nested blocks leave the layers to the outermost; with `ENABLED`
    false the block changes nothing."""
    if not ENABLED or rows == 0 or (rows is not None and rows > MAX_ROWS) or model in _INSIDE:
        yield
        return
    swapped = [(m, cls) for m, cls in _linears(model) if type(m) is nn.Linear]
    # object.__setattr__: nn.Module's own __setattr__ costs microseconds per layer.
    for module, cls in swapped:
        object.__setattr__(module, "__class__", cls)
    _INSIDE.add(model)
    try:
        yield
    finally:
        _INSIDE.discard(model)
        for module, _ in swapped:
            object.__setattr__(module, "__class__", nn.Linear)


def prepack(model: nn.Module) -> None:
    """Pack the weights `small_rows` would swap in model now (and build the bf16 kernel where it
    swaps bf16 layers): its first forward on them would otherwise pay for the packing (seconds
    for a billion weights) and a decoder would time it as verification. Nothing with `ENABLED`
    false."""
    if ENABLED:
        for layer, cls in _linears(model):
            if cls is SmallRowsLinear:
                packed_weight(layer)


def _linears(model: nn.Module) -> list[tuple[nn.Module, type[nn.Linear]]]:
    """model's `nn.Linear` layers (found once) that compute few rows another way, each with the
    class that does (`_small_rows_class`)."""
    if model not in _LINEARS:
        _LINEARS[model] = [m for m in model.modules() if type(m) is nn.Linear]
    found = ((m, _small_rows_class(m._parameters["weight"])) for m in _LINEARS[model])
    return [(m, cls) for m, cls in found if cls is not None]
