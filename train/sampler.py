"""The data order of a run: the rows of every micro-batch, a pure function of (seed, micro-batch number)."""

from __future__ import annotations

import torch

__all__ = ["EpochSampler"]


class EpochSampler:
    """Row indices of every micro-batch, a pure function of (seed, micro-batch number).

    Epoch e visits the rows in ``randperm(num_rows, seed + e)``; a global batch is
    ``batch_size * world_size`` consecutive rows of it, process `rank` taking its slice. Rows
    left over at an epoch's end are skipped (each epoch a different few). Resuming needs no
    sampler state, only the micro-batch number.
    """

    def __init__(
        self, num_rows: int, batch_size: int, seed: int, rank: int, world_size: int
    ) -> None:
        self.global_batch = batch_size * world_size
        self.per_epoch = num_rows // self.global_batch
        if self.per_epoch == 0:
            raise ValueError(
                f"{num_rows} training rows are fewer than one global batch of {self.global_batch} "
                f"(batch_size {batch_size} x {world_size} processes): add data (data.max_tokens) "
                f"or lower batch_size"
            )
        self.num_rows, self.batch_size, self.seed, self.rank = num_rows, batch_size, seed, rank
        # The current epoch's permutation, kept only to avoid redrawing it every micro-batch.
        self._epoch, self._order = -1, torch.empty(0, dtype=torch.long)

    def indices(self, micro_step: int) -> torch.Tensor:
        """(batch_size,) row indices of micro-batch `micro_step` (0-based, over the whole run)."""
        epoch, position = divmod(micro_step, self.per_epoch)
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            self._epoch, self._order = epoch, torch.randperm(self.num_rows, generator=generator)
        start = position * self.global_batch + self.rank * self.batch_size
        return self._order[start : start + self.batch_size]
