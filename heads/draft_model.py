"""A small causal LM with the target's vocabulary, drafting autoregressively from its own KV cache."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from draftsmith.core import int4_rows
from draftsmith.core import small_rows as kernels
from draftsmith.core.cache import cache_argument
from draftsmith.core.ragged import RaggedTarget
from draftsmith.core.small_rows import prepack, small_rows
from draftsmith.core.target import TREE_ATTENTION
from draftsmith.core.tree import additive_mask, chain_parents
from draftsmith.heads.base import (
    Draft,
    Drafter,
    DraftRequest,
    RoundStopFn,
    RowDrafters,
    register_drafter,
)
from draftsmith.heads.state import DraftBuilder, OwnCache, agreeing
from draftsmith.heads.tree import DynamicTree, SiblingChain, TreeRows


@register_drafter("draft-model")
class DraftModelDrafter(Drafter):
    """Drafts with any causal LM that shares the target's vocabulary: a chain, or an EAGLE-2
    dynamic tree whose nodes of one depth run in one forward with a tree attention mask.

    The draft model's cache is kept across rounds; after a round it keeps the rows of the tokens
    the target accepted (a tree's accepted path gathered) and drops the rest, so the accepted
    prefix is never recomputed.

    In a batch its rows draft their chains together (`BatchedDraftModel`) where `batch_drafting`
    says so; None (the default) does on an accelerator, and on a CPU where the linear layers run
    on packed weights (`draftsmith.core.small_rows`), which keep several rows near one row's
    price; with stock kernels a one-row forward takes a matrix-vector path that several rows'
    forward loses, so rows draft alone, each in its own forwards.

    With `int4` the draft model steps on 4-bit copies of its linear layers
    (`draftsmith.core.int4_rows`): a quarter of the bytes a step reads, some agreement with the
    target lost, no output token changed (the target verifies every one). None (the default)
    does for a bf16 model on the CPU, where a step's cost is reading the weights.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        batch_drafting: bool | None = None,
        int4: bool | None = None,
    ) -> None:
        self.model = model.eval()
        prepack(self.model)  # not in the first round, which a policy times
        self.int4 = int4_rows.prepare(model, int4)
        self.batch_drafting = batch_drafting
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
        return DraftModelDrafter(self.model, self.batch_drafting, self.int4)

    def chain_batch(self, rows: int) -> RowDrafters | None:
        together = self.batch_drafting
        if together is None:
            together = self.model.device.type != "cpu" or kernels.ENABLED
        # The rows' caches differ in length, which needs a custom attention mask.
        if not together or self.model.config._attn_implementation not in TREE_ATTENTION:
            return None
        return BatchedDraftModel(self.model, rows, self.int4)

    @torch.inference_mode()
    def draft(self, request: DraftRequest) -> Draft:
        # Rows of an uncommitted earlier draft go; the newest token is rerun for its logits.
        self._own.keep(min(self._own.agreeing(self._committed), len(self._committed) - 1))
        # One block for the round's forwards, not one per step (a 0.5B model has 169 layers).
        with small_rows(self.model), int4_rows.int4_rows(self.model, self.int4):
            logits = self._forward(self._committed[len(self._own) :], last_only=True)[-1]
            if not request.shape.is_chain:
                tree = DynamicTree.for_request(request)
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
        last_only: bool = False,
    ) -> torch.Tensor:
        """Run the draft model over new_tokens, extending its cache; returns their logits (n, V),
        or the last token's alone (1, V) with last_only (a prompt's reading then skips the LM
        head over every other token, a large share of it for a vocabulary of 150k). Tree rows
        come with their positions (n,) and visibility (n, cached + n)."""
        device = self.model.device
        tree = {}
        if visible is not None:
            tree = {
                "attention_mask": additive_mask(visible, self.model.dtype).to(device),
                "position_ids": positions[None].to(device),
            }
        with small_rows(self.model, len(new_tokens)):
            out = self.model(
                input_ids=torch.tensor([new_tokens], dtype=torch.long, device=device),
                use_cache=True,
                **{self._cache_argument: self._own.kv},
                **tree,
                **({"logits_to_keep": 1} if last_only else {}),
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


class BatchedDraftModel(RowDrafters):
    """The draft model drafting every row's chain of a batch in one forward per step (or its
    tree that expands one node a depth, `SiblingChain`: the same forwards).

    The rows share one ragged cache (`RaggedTarget` over the draft model), where each row keeps,
    as `DraftModelDrafter` does alone, the positions that agree with its committed tokens: each
    round a row runs what it has not cached (at least its newest token, rerun for its logits),
    then one token per step while its chain goes on.
    """

    lockstep = True

    def __init__(self, model: PreTrainedModel, rows: int, int4: bool = False) -> None:
        self.cache = RaggedTarget(model, (), rows)
        self.int4 = int4
        self.order = list(range(rows))
        """The batch row of each row of the cache (finished rows leave it)."""
        self.committed: list[list[int]] = [[] for _ in range(rows)]
        self.cached: list[list[int]] = [[] for _ in range(rows)]
        """Per batch row, the token each of its cached positions was computed from."""

    def start(
        self, row: int, prompt_ids: torch.Tensor, target_features: torch.Tensor | None = None
    ) -> None:
        self.committed[row] = prompt_ids.tolist()

    @torch.inference_mode()
    def propose(
        self,
        rows: Sequence[int],
        requests: Sequence[DraftRequest],
        round_stop: RoundStopFn | None = None,
    ) -> list[Draft]:
        if list(rows) != self.order:
            raise ValueError(f"drafting rows {list(rows)}, but the batch holds {self.order}")
        builders = [_grower(q) if q.shape.max_tokens else None for q in requests]
        blocks = []
        for row, builder in zip(rows, builders, strict=True):
            if builder is None:
                blocks.append([])
                continue
            committed = self.committed[row]
            kept = min(agreeing(self.cached[row], committed), len(committed) - 1)
            self._truncate(row, kept)
            blocks.append(committed[kept:])
        steps = 0
        # One block for the round's steps, as alone.
        with small_rows(self.cache.model), int4_rows.int4_rows(self.cache.model, self.int4):
            while any(blocks):
                logits = self._run(blocks)
                steps += 1
                blocks = []
                for builder, row_logits in zip(builders, logits, strict=True):
                    token = None if row_logits is None else builder.add(row_logits)
                    blocks.append([] if token is None or builder.done else [token])
                if round_stop is not None and round_stop(steps):
                    break
        return [Draft.empty() if b is None else b.draft() for b in builders]

    def _run(self, blocks: list[list[int]]) -> list[torch.Tensor | None]:
        """Run each row's block after its cached positions in one forward, keeping them all;
        the logits (V,) after each non-empty block, None for an empty one."""
        logits, _ = self.cache.extend(
            [torch.tensor(b, dtype=torch.long) for b in blocks],
            [chain_parents(len(b)) for b in blocks],
            logits="last",
        )
        self.cache.keep([range(len(b)) for b in blocks])
        for row, block in zip(self.order, blocks, strict=True):
            self.cached[row].extend(block)
        return [
            row_logits[0] if len(b) else None for row_logits, b in zip(logits, blocks, strict=True)
        ]

    def commit(
        self, row: int, tokens: torch.Tensor, target_features: torch.Tensor | None = None
    ) -> None:
        self.committed[row].extend(tokens.tolist())
        self._truncate(row, agreeing(self.cached[row], self.committed[row]))

    def select(self, rows: Sequence[int]) -> None:
        self.cache.select([self.order.index(row) for row in rows])
        self.order = list(rows)

    def _truncate(self, row: int, length: int) -> None:
        self.cache.truncate(self.order.index(row), length)
        del self.cached[row][length:]


def _grower(request: DraftRequest) -> DraftBuilder | SiblingChain:
    """What drafts a row's request a step at a time: a chain, or a tree expanding one node a
    depth (its siblings leaves, its one expanded node the chain's next token)."""
    return DraftBuilder(request) if request.shape.is_chain else SiblingChain(request)
