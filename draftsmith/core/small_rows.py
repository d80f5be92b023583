"""Linear layers over a few rows on the CPU, computed with the weight as the streamed operand.

A verification forward runs 2 to 64 new tokens through every linear layer. In float32 on the CPU
`F.linear(x, W)` asks MKL's sgemm for x @ W^T, which for a few rows of x costs about one more
pass over the weight than the work needs (by all appearances a packing copy of the second
operand): a forward over two tokens costs 1.6-2x one over a single token (a gemv), though both
read each weight once. Asked for (W @ x^T)^T instead, sgemm streams the weight: 2 to 6 tokens cost
about what one does. Measured in `benchmarks/README.md`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from weakref import WeakKeyDictionary

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

MAX_ROWS = 64
"""Most rows computed weight-first; above, F.linear (a prefill or a training batch) is as fast."""

ENABLED = os.environ.get("DRAFTSMITH_SMALL_ROWS", "1") != "0" and torch.backends.mkl.is_available()
"""Where torch's BLAS is MKL, the measured one; DRAFTSMITH_SMALL_ROWS=0 turns it off."""


class SmallRowsLinear(nn.Linear):
    """`nn.Linear` computing 2..MAX_ROWS rows as (W @ x^T)^T; other row counts run F.linear."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if not 2 <= rows <= MAX_ROWS:
            return F.linear(x, self.weight, self.bias)
        out = torch.mm(self.weight, x.reshape(rows, self.in_features).t()).t().contiguous()
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def _weight_first_pays(weight: torch.Tensor) -> bool:
    """Plain float32 CPU weights: the measured case (a sharded weight computes its own way;
    bf16 and accelerators do not go through sgemm)."""
    return (
        weight.dtype == torch.float32
        and weight.device.type == "cpu"
        and not isinstance(weight, DTensor)
    )


_LINEARS: WeakKeyDictionary[nn.Module, list[nn.Module]] = WeakKeyDictionary()
"""Each model's `nn.Linear` layers, found once: walking the modules every forward costs more
than a one-token forward can spare."""


@contextmanager
def small_rows(model: nn.Module, rows: int) -> Iterator[None]:
    """Within the block, a forward of model over `rows` positions in all (batch x tokens): when
    they are 2..MAX_ROWS (and `ENABLED`), model's float32 CPU `nn.Linear` layers compute weight-first
    (`SmallRowsLinear`, the same parameters), and are plain `nn.Linear` again after it, even on
    an error; other row counts change nothing. Nested blocks leave the layers to the outermost."""
    if not (ENABLED and 2 <= rows <= MAX_ROWS):
        yield
        return
    if model not in _LINEARS:
        _LINEARS[model] = [m for m in model.modules() if type(m) is nn.Linear]
    swapped = [
        m
        for m in _LINEARS[model]
        if type(m) is nn.Linear and _weight_first_pays(m._parameters["weight"])
    ]
    # object.__setattr__: nn.Module's own __setattr__ costs microseconds per layer.
    for module in swapped:
        object.__setattr__(module, "__class__", SmallRowsLinear)
    try:
        yield
    finally:
        for module in swapped:
            object.__setattr__(module, "__class__", nn.Linear)
