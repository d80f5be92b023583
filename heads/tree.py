"""EAGLE-2's dynamic draft tree, grown by any drafter that can run a batch of tree nodes at once.

The tree starts from the drafter's prediction after the newest committed token. Each following
depth expands the `top_k` most valuable nodes of the depth before, `top_k` children each, in one
forward of the drafter, until the shape's depth or until the request's `tree_stop` ends it; a
node's value is the estimated probability that the target accepts its
whole path (the `AcceptanceFn` multiplied along it). The proposed tree keeps the `total_tokens`
most valuable nodes. Children are the top-k tokens, chosen deterministically, so under sampling
each is verified as a one-hot draft, which keeps verification exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from draftsmith.heads.base import (
    AcceptanceFn,
    Draft,
    DraftRequest,
    TreeShape,
    TreeStopFn,
    most_valuable,
)

Expand = Callable[[list[int]], torch.Tensor]
"""expand(nodes) -> logits (len(nodes), V) of the drafter's prediction after each node (run on the
node's token with its ancestors as context)."""


class DynamicTree:
    """The nodes drafted so far in one round, with their values; see the module docstring."""

    def __init__(
        self, shape: TreeShape, acceptance: AcceptanceFn, stop: TreeStopFn | None = None
    ) -> None:
        self.shape = shape
        self.acceptance = acceptance
        self.stop = stop
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.depths: list[int] = []
        """1-based depth per node."""
        self.values: list[float] = []
        self._raw_paths: list[float] = []  # product of the draft's top-1 probs along the path
        self._logits: list[torch.Tensor] = []  # (V,) per expanded distribution
        self._logits_row: list[int] = []  # per node, its parent's distribution in _logits

    def grow(self, root_logits: torch.Tensor, expand: Expand) -> Draft:
        """Grow the whole tree from the prediction after the newest committed token, root_logits
        (V,), calling expand once per further depth; returns the proposed `Draft`."""
        frontier = self._add_children([-1], root_logits[None])
        for depth in range(1, self.shape.depth):
            if self.stop is not None and self.stop(depth, self):
                break
            ranked = sorted(frontier, key=lambda n: -self.values[n])[: self.shape.top_k]
            frontier = self._add_children(ranked, expand(ranked))
        return self.draft()

    def _add_children(self, nodes: list[int], logits: torch.Tensor) -> list[int]:
        """Give each of nodes (-1: the root) the top_k tokens of its logits (len(nodes), V) as
        children; returns the new nodes."""
        logits = logits.float()
        depth = torch.tensor([0 if n < 0 else self.depths[n] for n in nodes])
        raw_top1 = logits.softmax(-1).amax(-1)
        parent_raw = torch.tensor([1.0 if n < 0 else self._raw_paths[n] for n in nodes])
        raw_paths = parent_raw * raw_top1
        accept = self.acceptance(logits, depth, raw_paths)
        top = accept.topk(min(self.shape.top_k, accept.shape[-1]), dim=-1)
        added = []
        for i, node in enumerate(nodes):
            self._logits.append(logits[i])
            parent_value = 1.0 if node < 0 else self.values[node]
            for value, token in zip(top.values[i].tolist(), top.indices[i].tolist(), strict=True):
                if value <= 0.0:  # the drafter rules the token out (outside its vocabulary)
                    continue
                added.append(len(self.tokens))
                self.tokens.append(token)
                self.parents.append(node)
                self.depths.append(int(depth[i]) + 1)
                self.values.append(parent_value * value)
                self._raw_paths.append(float(raw_paths[i]))
                self._logits_row.append(len(self._logits) - 1)
        return added

    def draft(self) -> Draft:
        """The shape's total_tokens most valuable nodes drafted (each with its parent's logits)."""
        kept = most_valuable(self.values, self.depths, self.shape.max_tokens)
        renumber = {node: i for i, node in enumerate(kept)}
        return Draft(
            tokens=torch.tensor([self.tokens[n] for n in kept], dtype=torch.long),
            logits=torch.stack([self._logits[self._logits_row[n]] for n in kept]) if kept else None,
            parents=torch.tensor(
                [renumber.get(self.parents[n], -1) for n in kept], dtype=torch.long
            ),
            values=torch.tensor([self.values[n] for n in kept]),
        )


def combine_depths(request: DraftRequest, depth_logits: list[torch.Tensor]) -> Draft:
    """A tree from one prediction per depth, depth_logits[d] (V,) for the tokens at depth d + 1,
    made without seeing the tokens before them (Medusa's heads; MTP's modules along the top-1
    path): every node of one depth gets that depth's top-k as children, and the tree keeps the
    most valuable combinations under the request's budget."""
    shape = replace(request.shape, depth=min(request.shape.depth, len(depth_logits)))
    tree = DynamicTree(shape, request.acceptance, request.tree_stop)
    return tree.grow(
        depth_logits[0], lambda nodes: depth_logits[tree.depths[nodes[0]]].expand(len(nodes), -1)
    )


class TreeRows:
    """The rows a drafter adds to its own KV cache while it expands a tree, after the rows of the
    `committed` tokens (the newest committed token's row is the last of those)."""

    def __init__(self, tree: DynamicTree, committed: int) -> None:
        self.tree = tree
        self.committed = committed
        self.row: dict[int, int] = {}
        """Node -> its cache row, for every node expanded so far."""

    def add(self, nodes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Place rows for nodes (whose parents have rows) after the cached ones. Returns their
        positions (k,) and visibility (k, cached + k) bool: each sees the committed rows, its
        ancestors' rows and itself."""
        cached = self.committed + len(self.row)
        visible = torch.zeros(len(nodes), cached + len(nodes), dtype=torch.bool)
        visible[:, : self.committed] = True
        for i, node in enumerate(nodes):
            ancestor = self.tree.parents[node]
            while ancestor >= 0:
                visible[i, self.row[ancestor]] = True
                ancestor = self.tree.parents[ancestor]
            visible[i, cached + i] = True
        positions = torch.tensor([self.committed - 1 + self.tree.depths[n] for n in nodes])
        self.row.update({node: cached + i for i, node in enumerate(nodes)})
        return positions, visible

    def kept(self, committed_tokens: list[int]) -> list[int]:
        """The rows of the expanded nodes along the path the committed tokens (after the round's
        root) take through the tree: what the cache keeps after the round."""
        rows = []
        node = -1
        for token in committed_tokens:
            match = [
                n
                for n, (t, p) in enumerate(zip(self.tree.tokens, self.tree.parents, strict=True))
                if p == node and t == token
            ]
            if not match or match[0] not in self.row:
                break
            node = match[0]
            rows.append(self.row[node])
        return rows
