"""Token trees in one forward pass: the attention mask and positions of a block of rows that form
a tree after the cached positions (a draft tree under verification, or its expansion by a drafter).

A block is given by its parents: `parents[i]` is the block row that row i continues (always an
earlier row), or -1 for a row that directly continues the cached sequence. Row i sees every
cached position, its ancestors in the block and itself; it sits at the position after its parent.
"""

from __future__ import annotations

import torch


def chain_parents(length: int) -> torch.Tensor:
    """(length,) the parents of a chain: every row continues the one before."""
    return torch.arange(length) - 1


def check_parents(parents: torch.Tensor) -> None:
    """Raise a ValueError unless parents (m,) is int64 and every parent is -1 or an earlier row."""
    if parents.ndim != 1 or parents.dtype != torch.long:
        raise ValueError(f"parents must be a 1-D int64 tensor, got {parents.dtype} {parents.shape}")
    rows = torch.arange(parents.numel())
    if bool(((parents < -1) | (parents >= rows)).any()):
        raise ValueError(f"each parent must be -1 or an earlier row, got {parents.tolist()}")


def is_chain(parents: torch.Tensor) -> bool:
    return torch.equal(parents.cpu(), chain_parents(parents.numel()))


def tree_depths(parents: torch.Tensor) -> torch.Tensor:
    """(m,) int64 depth of each row: 0 for rows that continue the cache, parent's depth + 1 else."""
    depth = [0] * parents.numel()
    for i, parent in enumerate(parents.tolist()):
        depth[i] = 0 if parent < 0 else depth[parent] + 1
    return torch.tensor(depth, dtype=torch.long)


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """(m, m) bool: True where row i may attend to row j (j is i or one of i's ancestors)."""
    mask = torch.eye(parents.numel(), dtype=torch.bool)
    for i, parent in enumerate(parents.tolist()):
        if parent >= 0:
            mask[i] |= mask[parent]
    return mask


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """visible (m, S) or (B, m, S) bool -> (1, 1, m, S) or (B, 1, m, S) additive attention mask
    on visible's device: 0 where a row may attend, the dtype's minimum elsewhere (eager attention
    adds it to the scores; SDPA takes it as is)."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    mask = mask.masked_fill(~visible, torch.finfo(dtype).min)
    return mask[None, None] if visible.ndim == 2 else mask[:, None]
