"""draftsmith 0.3.1's linear kernel, kept here only to measure against: (W @ x^T)^T over 2 to 64
rows (MKL streaming the weight), `F.linear` otherwise; and a switch between the three kernels."""

import torch
import torch.nn.functional as F

from draftsmith.core import small_rows

_PACKED_FORWARD = small_rows.SmallRowsLinear.forward
KERNELS = ("stock", "weight-first", "packed")


def weight_first_forward(self, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // self.in_features
    if not 2 <= rows <= 64:
        return F.linear(x, self.weight, self.bias)
    out = torch.mm(self.weight, x.reshape(rows, self.in_features).t()).t().contiguous()
    if self.bias is not None:
        out = out + self.bias
    return out.reshape(*x.shape[:-1], self.out_features)


def use_kernel(name: str) -> None:
    """stock: `small_rows` off; weight-first: 0.3.1's; packed: 0.3.2's (`small_rows` as it is)."""
    small_rows.ENABLED = name != "stock"
    forward = weight_first_forward if name == "weight-first" else _PACKED_FORWARD
    small_rows.SmallRowsLinear.forward = forward
