"""Drafting with a DFlash head (`dflash.py`): one head forward a round, as `BlockDrafter`.

The head's cache is its context: per layer, the keys and values of the target features of
committed positions, which never change, so nothing is rolled back. A round first adds the
positions whose features arrived since the last one (the features lag the newest committed
token by one, so the context ends just before it), then runs the block: the newest token (the
anchor) and one mask row per token drafted. The block's rows are not kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from draftsmith.heads.block_drafter import BlockDrafter

if TYPE_CHECKING:  # dflash.py builds this drafter
    from draftsmith.heads.dflash import DFlashHead


class DFlashDrafter(BlockDrafter):
    """`BlockDrafter` of a `DFlashHead`: the chain, tree, forks and commits are its; the block
    forward is DFlash's."""

    def __init__(self, head: DFlashHead, vocab_size: int, int4: bool | None = None) -> None:
        super().__init__(head, vocab_size, int4)
        self.state_size = head.state_size
        # A Markov head's logits (and the confidence head's features beside it) follow the
        # previous token; without one the block's rows are read at once.
        self.conditions_on_previous = head.markov_head is not None

    def _draft_logits(self, hidden: torch.Tensor, on_target_vocab: bool = False) -> torch.Tensor:
        logits = self.head.logits(hidden)[0].float()
        return self._emit(logits, self._states(hidden, None), on_target_vocab)

    def _row_logits(
        self, hidden: torch.Tensor, previous: list[int], on_target_vocab: bool = False
    ) -> torch.Tensor:
        previous = torch.tensor([previous])
        logits = self.head.logits(hidden, previous)[0].float()
        return self._emit(logits, self._states(hidden, previous), on_target_vocab)

    def _states(self, hidden: torch.Tensor, previous: torch.Tensor | None) -> torch.Tensor:
        """What a states hook sees of rows hidden (1, k, H): computed only when one is set,
        never on the plain decode path."""
        return hidden if self._states_hook is None else self.head.states(hidden, previous)

    def start(self, prompt_ids: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        super().start(prompt_ids, target_features)
        self._context: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def _block(self, size: int) -> torch.Tensor:
        """The block after the newest committed token n, its context grown to positions
        0 .. n - 1 first; returns the outputs (1, size, H) of its `size` mask rows."""
        newest = len(self._committed) - 1
        cached = len(self._own)
        if self._context is None or newest > cached:
            # Feature row q is the feature of position q - 1 (`LaggedFeatures`).
            features = self._features.rows(cached + 1, newest + 1)[None]
            added = self.head.context(features, torch.arange(cached, newest))
            if self._context is not None:
                added = [
                    (torch.cat([k, new_k], dim=2), torch.cat([v, new_v], dim=2))
                    for (k, v), (new_k, new_v) in zip(self._context, added, strict=True)
                ]
            self._context = added
            self._own.extend(self._committed[cached:newest])
            self._features.release(newest + 1)
        anchor = torch.tensor([[self._committed[newest]]])
        positions = newest + torch.arange(size + 1)[:, None]
        visible = torch.ones(1, newest, dtype=torch.bool)
        hidden = self.head.run_block(
            self.head.block_ids(anchor, size), positions, self._context, visible
        )
        return hidden[:, 1:, 0]
