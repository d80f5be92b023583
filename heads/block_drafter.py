"""Drafting a block of tokens in one head forward: the `Drafter` of parallel heads (P-EAGLE;
DFlash's `dflash_drafter.py` replaces the block forward alone).

A round runs one forward of the head over the committed rows not yet in its cache (on their
real target features) followed by mask rows for the positions ahead, and reads the whole
block's draft distributions off it: the newest committed row's prediction, then one per mask
row. None of them depends on a drafted token, so the drafted tokens are chosen from them
(argmax, or sampled from each processed q, which keeps rejection sampling exact) as a chain, or
as a tree whose every node of depth d takes its children from the block's distribution d. A
head whose rows also read the token before them (DSpark's Markov bias) still runs one forward;
its rows' logits are then read one depth at a time, after the token before is chosen.
Mask rows are dropped from the cache after the round: the cache only ever holds committed rows.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from draftsmith.heads.base import Draft, DraftRequest
from draftsmith.heads.blocks import causal_mask
from draftsmith.heads.eagle import FeatureDrafter
from draftsmith.heads.state import DraftBuilder
from draftsmith.heads.tree import DynamicTree


def block_mask(committed: int, cached: int, masked: int) -> torch.Tensor:
    """(committed + masked, cached + committed + masked) bool attention mask of a drafting
    forward: `committed` new rows of committed tokens after `cached` cached rows, causal, then
    `masked` mask rows that see every committed row and the mask rows up to themselves."""
    known = cached + committed
    ahead = torch.zeros(committed, masked, dtype=torch.bool)
    seen = torch.ones(masked, known, dtype=torch.bool)
    return torch.cat(
        [
            torch.cat([causal_mask(committed, cached), ahead], dim=1),
            torch.cat([seen, causal_mask(masked)], dim=1),
        ]
    )


class BlockDrafter(FeatureDrafter):
    """Drafts with a block head, one head forward a round: a `FeatureRecurrentHead` drafting
    `num_steps` tokens a block, whose `masked_rows(batch, rows)` gives the mask rows' fused
    features and token embeddings (P-EAGLE's). The cache, lagged features, commits and forks
    are `FeatureDrafter`'s."""

    @property
    def block_size(self) -> int:
        """The head's block: one forward drafts up to `num_steps` tokens."""
        return self.head.num_steps

    conditions_on_previous = False
    """Whether a row's logits depend on the token drafted before it (`_row_logits`): then the
    block's rows are read one depth at a time, each after the token before it is chosen."""

    @torch.inference_mode()
    def draft(self, request: DraftRequest) -> Draft:
        size = min(request.shape.depth, self.head.num_steps)
        with self.packed_weights():
            hidden = self._block(size)  # (1, size, H)
        if self.conditions_on_previous:
            return self._draft_sequentially(request, hidden)
        if request.shape.is_chain:
            builder = DraftBuilder(request, max_draft_tokens=size, support=self._d2t)
            for logits in self._target_logits(hidden):
                builder.add(logits)
                if builder.done:
                    break
            return builder.draft()
        shape = replace(request.shape, depth=size)
        tree = DynamicTree.for_request(request, shape, self._d2t, self.vocab_size)
        by_depth = self._draft_logits(hidden)  # (size, V_d): row d for the nodes of depth d + 1
        return tree.grow(by_depth[0], lambda nodes: by_depth[[tree.depths[n] for n in nodes]])

    def _draft_sequentially(self, request: DraftRequest, hidden: torch.Tensor) -> Draft:
        """`draft` from the block's outputs hidden (1, size, H) when each row's logits follow
        the token before it: the chain's rows one at a time; a tree node of depth d takes its
        children from row d after its own token."""
        anchor = self._committed[-1]
        size = hidden.shape[1]
        if request.shape.is_chain:
            builder = DraftBuilder(request, max_draft_tokens=size, support=self._d2t)
            previous = anchor
            for depth in range(size):
                logits = self._row_logits(hidden[:, [depth]], [previous], on_target_vocab=True)
                previous = builder.add(logits[0])
                if builder.done:
                    break
            return builder.draft()
        shape = replace(request.shape, depth=size)
        tree = DynamicTree.for_request(request, shape, self._d2t, self.vocab_size)

        def expand(nodes: list[int]) -> torch.Tensor:
            rows = hidden[:, [tree.depths[n] for n in nodes]]
            return self._row_logits(rows, [tree.tokens[n] for n in nodes])

        return tree.grow(self._row_logits(hidden[:, :1], [anchor])[0], expand)

    def _row_logits(
        self, hidden: torch.Tensor, previous: list[int], on_target_vocab: bool = False
    ) -> torch.Tensor:
        """Block rows hidden (1, k, H) whose previous tokens are `previous` -> their logits,
        as `_draft_logits` gives them; for heads that `conditions_on_previous`."""
        raise NotImplementedError(f"{type(self).__name__} does not condition on previous tokens")

    def _block(self, size: int) -> torch.Tensor:
        """One head forward over the committed rows not yet cached and `size - 1` mask rows
        (none: no forward where every committed row is cached); returns the predicted features
        (1, size, H) of the newest committed row and of the mask rows, in block order: a
        sibling block drafter overrides this alone."""
        masked = size - 1
        start, stop = len(self._own), len(self._committed)
        if start == stop and masked == 0:
            return self._newest
        ids = self._ids(self._committed[start:stop])
        fused = self.head.fuse(self._features.rows(start, stop))[None]
        embeds = self.head.parts().embeddings(ids, self.head.dtype)
        masked_hidden, masked_embeds = self.head.masked_rows(1, masked)
        out = self.head.run_layer(
            torch.cat([fused, masked_hidden], dim=1),
            torch.cat([embeds, masked_embeds.to(embeds.dtype)], dim=1),
            torch.arange(start, stop + masked),
            block_mask(stop - start, start, masked),
            self._own.kv,
        )
        self._own.extend([*self._committed[start:stop], *[-1] * masked])  # -1: a mask row
        self._own.keep(stop)
        self._features.release(stop)
        if stop > start:
            self._newest = out[:, stop - start - 1 : stop - start]
        return torch.cat([self._newest, out[:, stop - start :]], dim=1)
