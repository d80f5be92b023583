"""Several sequences of different lengths decoded together through one target cache.

Each round every row runs its own block (its newest committed token and its draft tree) after its
own cached positions and keeps its own accepted path, so rows grow by different amounts. The
cache stays one rectangular tensor per layer: a row that kept fewer positions than the longest
leaves unused slots, which the attention mask hides, and every token gets an explicit position
(its row's length plus its depth in the block). When every row is dense (no hidden slots, all of
one length, chain blocks of one width) no mask is passed and the model attends causally, exactly
as a single sequence decodes.

The model need not be the target: a draft model drafting every row of a batch in one forward per
step runs through one too, and `truncate` drops what its rows drafted beyond what was accepted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from transformers import PreTrainedModel

from draftsmith.core.cache import crop_cache, gather_cache_positions
from draftsmith.core.target import Target, check_custom_masks
from draftsmith.core.tree import additive_mask, ancestor_mask, is_chain, tree_depths


class RaggedTarget:
    """The frozen target decoding `batch` rows, each with its own cached length."""

    def __init__(
        self, model: PreTrainedModel, feature_layers: tuple[int, ...] = (), batch: int = 1
    ) -> None:
        self.target = Target(model, feature_layers)
        self.model = model
        self.lengths = [0] * batch
        """Committed positions cached per row."""
        self.valid = torch.zeros(batch, 0, dtype=torch.bool)
        """(B, S) True where cache slot s holds one of row b's positions."""
        self._block_start = 0  # cache slots before the last extended block

    def extend(
        self,
        tokens: Sequence[torch.Tensor],
        parents: Sequence[torch.Tensor],
        *,
        logits: Literal["all", "last", "none"] = "all",
    ) -> tuple[list[torch.Tensor] | None, list[torch.Tensor | None]]:
        """Run one block per row in one forward: tokens[b] (m_b,) with parents[b] (m_b,) as
        `draftsmith.core.tree` (-1: continues row b's cached positions). Blocks are padded to the
        widest (an empty block runs padding alone); a padded slot sees only itself. Returns per
        row logits float32 and features (m_b, F) or None. logits: "all" (m_b, V); "last" the
        block's last position's (min(m_b, 1), V), the LM head run on those positions only (a
        draft model catching up on a prompt needs no more); "none" None (a prefill)."""
        if logits not in ("all", "last", "none"):
            raise ValueError(f"logits must be 'all', 'last' or 'none', got {logits!r}")
        widths = [t.numel() for t in tokens]
        width = max(widths)
        ids = torch.zeros(len(tokens), width, dtype=torch.long)
        for b, row in enumerate(tokens):
            ids[b, : widths[b]] = row
        self._block_start = self.valid.shape[1]
        dense = (
            all(w == width for w in widths)
            and all(is_chain(p) for p in parents)
            and bool(self.valid.all())
            and len(set(self.lengths)) == 1
        )
        mask = positions = None
        if not dense:
            check_custom_masks(self.model, "a draft tree's or a padded batch's")
            mask, positions = self._attention(parents, width)
        rows = range(len(tokens))
        ends = sorted({w - 1 for w in widths if w}) if logits == "last" else []
        keep = torch.tensor(ends) if logits == "last" else (0 if logits == "all" else 1)
        out, features = self.target.extend_rows(ids, mask, positions, keep)
        row_features = [None if features is None else features[b, : widths[b]] for b in rows]
        if logits == "none":
            return None, row_features
        if logits == "last":  # out holds the positions `ends` only
            at = [ends.index(w - 1) if w else slice(0, 0) for w in widths]
            return [out[b, at[b]].reshape(-1, out.shape[-1]) for b in rows], row_features
        return [out[b, : widths[b]] for b in rows], row_features

    def _attention(
        self, parents: Sequence[torch.Tensor], width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """attention_mask (B, 1, width, S + width) and position_ids (B, width) of a padded block
        after the cache: row b's slot i sees row b's cached slots, its ancestors and itself."""
        batch, cached = self.valid.shape
        visible = torch.zeros(batch, width, cached + width, dtype=torch.bool)
        visible[:, :, :cached] = self.valid[:, None, :]
        visible[:, :, cached:] = torch.eye(width, dtype=torch.bool)  # padded slots: themselves
        positions = torch.tensor(self.lengths)[:, None].repeat(1, width)
        for b, row_parents in enumerate(parents):
            m = row_parents.numel()
            visible[b, :m, cached : cached + m] = ancestor_mask(row_parents)
            positions[b, :m] += tree_depths(row_parents)
        device = self.model.device
        return additive_mask(visible, self.model.dtype).to(device), positions.to(device)

    def keep(self, rows: Sequence[Sequence[int]]) -> None:
        """Keep, per row b, the slots rows[b] (ascending indices into its last extended block)
        after its cached positions: its accepted path, gathered rather than recomputed."""
        first, counts = self._block_start, [len(r) for r in rows]
        kept = max(counts)
        if all(list(r) == list(range(len(r))) for r in rows):
            crop_cache(self.target.cache, first + kept)  # prefixes (chains) need no copy
        else:
            self._gather(first, [[first + i for i in r] for r in rows])
        self._append_slots(counts, kept)
        if self.valid.shape[1] > 2 * max(self.lengths) + 64:
            self._compact()

    def truncate(self, row: int, length: int) -> None:
        """Forget row `row`'s cached positions from `length` on (what it drafted past the tokens
        accepted); their slots stay hidden until compaction frees them."""
        if length < self.lengths[row]:
            slots = self.valid[row].nonzero()[:, 0]
            self.valid[row, slots[length:]] = False
            self.lengths[row] = length

    def select(self, rows: Sequence[int]) -> None:
        """Keep only the batch rows `rows` (in that order): finished rows stop costing."""
        index = torch.tensor(list(rows), dtype=torch.long)
        self.target.cache.batch_select_indices(index.to(self.model.device))
        self.valid = self.valid[index]
        self.lengths = [self.lengths[r] for r in rows]

    def _gather(self, first: int, slots: list[list[int]]) -> None:
        """Keep the slots before `first`, then per row b the slots slots[b], padded to the longest
        with a repeat of one slot (hidden by `valid`)."""
        width = max(len(s) for s in slots)
        index = torch.full((len(slots), width), first, dtype=torch.long)
        for b, row in enumerate(slots):
            index[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        gather_cache_positions(self.target.cache, first, index)

    def _append_slots(self, counts: list[int], width: int) -> None:
        added = torch.arange(width)[None, :] < torch.tensor(counts)[:, None]
        self.valid = torch.cat([self.valid, added], dim=1)
        self.lengths = [length + n for length, n in zip(self.lengths, counts, strict=True)]

    def _compact(self) -> None:
        """Move every row's positions to the front of the cache, dropping the hidden slots: their
        share has grown past half the cache."""
        slots = [row.nonzero()[:, 0].tolist() for row in self.valid]
        counts = [len(s) for s in slots]
        self._gather(0, slots)
        self.valid = torch.zeros(len(slots), 0, dtype=torch.bool)
        self.lengths = [0] * len(slots)
        self._append_slots(counts, max(counts))


def left_padded(rows: list[torch.Tensor], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """rows (T_b,) as one batch (B, max T_b) padded on the left with `pad`, and its attention
    mask (B, max T_b), as batched `generate` takes them."""
    width = max(row.numel() for row in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, width - row.numel() :] = row
        mask[b, width - row.numel() :] = 1
    return ids, mask
