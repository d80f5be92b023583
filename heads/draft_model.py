"""A small causal LM with the target's vocabulary, drafting autoregressively from its own KV cache."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from draftsmith.core.cache import cache_argument
from draftsmith.core.tree import additive_mask
from draftsmith.heads.base import Draft, Drafter, DraftRequest, register_drafter
from draftsmith.heads.state import DraftBuilder, OwnCache
from draftsmith.heads.tree import DynamicTree, TreeRows


@register_drafter("draft-model")
class DraftModelDrafter(Drafter):
    """Drafts with any causal LM that shares the target's vocabulary: a chain, or an EAGLE-2
    dynamic tree whose nodes of one depth run in one forward with a tree attention mask.

    The draft model's cache is kept across rounds; after a round it keeps the rows of the tokens
    the target accepted (a tree's accepted path gathered) and drops the rest, so the accepted
    prefix is never recomputed.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model.eval()
        self.vocab_size = model.config.get_text_config().vocab_size
        self._cache_argument = cache_argument(model)
        self._committed: list[int] = []
        self._own = OwnCache()
        self._tree_rows: TreeRows | None = None  # the last round's tree, until it is committed

    def start(self, prompt_ids: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        self._committed = prompt_ids.tolist()
        self._own.reset()
        self._tree_rows = None

    def fork(self) -> DraftModelDrafter:
        return DraftModelDrafter(self.model)

    @torch.inference_mode()
    def draft(self, request: DraftRequest) -> Draft:
        # Rows of an uncommitted earlier draft go; the newest token is rerun for its logits.
        self._own.keep(min(self._own.agreeing(self._committed), len(self._committed) - 1))
        logits = self._forward(self._committed[len(self._own) :])[-1]
        if not request.shape.is_chain:
            tree = DynamicTree(request.shape, request.acceptance)
            self._tree_rows = TreeRows(tree, len(self._own))
            return tree.grow(logits, self._expand)
        builder = DraftBuilder(request)
        while True:
            token = builder.add(logits)
            if builder.done:
                return builder.draft()
            logits = self._forward([token])[-1]

    def _forward(
        self,
        new_tokens: list[int],
        positions: torch.Tensor | None = None,
        visible: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run the draft model over new_tokens, extending its cache; returns their logits (n, V).
        Tree rows come with their positions (n,) and visibility (n, cached + n)."""
        device = self.model.device
        tree = {}
        if visible is not None:
            tree = {
                "attention_mask": additive_mask(visible, self.model.dtype).to(device),
                "position_ids": positions[None].to(device),
            }
        out = self.model(
            input_ids=torch.tensor([new_tokens], dtype=torch.long, device=device),
            use_cache=True,
            **{self._cache_argument: self._own.kv},
            **tree,
        )
        self._own.extend(new_tokens)
        return out.logits[0].float()

    def _expand(self, nodes: list[int]) -> torch.Tensor:
        positions, visible = self._tree_rows.add(nodes)
        return self._forward([self._tree_rows.tree.tokens[n] for n in nodes], positions, visible)

    def commit(self, tokens: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        if self._tree_rows is not None:
            # Gather the accepted path's rows after the committed ones, drop the other branches.
            rows = self._tree_rows.kept(tokens.tolist())
            self._own.gather(self._tree_rows.committed, rows)
            self._tree_rows = None
        self._committed.extend(tokens.tolist())
        # Keep the cached positions that agree with the committed sequence, drop the rest.
        self._own.keep(self._own.agreeing(self._committed))
