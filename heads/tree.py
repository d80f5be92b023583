"""EAGLE-2's dynamic draft tree, grown by any drafter that can run a batch of tree nodes at once.

The tree starts from the drafter's prediction after the newest committed token. Each following
depth expands the most valuable nodes of the depth before (`TreeShape.width`: top_k, or the
shape's `expand`), `top_k` children each, in one forward of the drafter, until the shape's depth
or until the request's `tree_stop` ends it; a node's value is the estimated probability that the
target accepts its whole path (the `AcceptanceFn` multiplied along it).

Greedy: children are the top-k tokens, and the proposed tree keeps the `total_tokens` most
valuable nodes. Sampling: a node's children are drawn from its processed draft distribution q
without replacement (the first from q, each next from q without the earlier ones, renormalised:
the `Draft.probs` that multi-candidate verification needs), so the first child is accepted as
often as a chain's token. Verification stays exact only if whether a node is drafted does not
depend on its own token or anything drafted after it, so under sampling a child's value is that
of its rank (the acceptance of the parent distribution's rank-r token, a property of the
distribution, not of the draw), and the `total_tokens` budget is spent as the tree grows, each
depth on its most valuable (parent, rank) places, never by pruning afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from draftsmith.core.context import CONTEXT_SIGNAL, ContextIndex
from draftsmith.core.sampling import SamplingParams, probabilities
from draftsmith.core.signals import FIRST_PARENT, SIGNAL_NAMES, distribution, token_signals
from draftsmith.heads.base import (
    AcceptanceFn,
    Draft,
    DraftRequest,
    TreeShape,
    TreeStopFn,
    most_valuable,
)
from draftsmith.heads.state import to_target_vocab

Expand = Callable[[list[int]], torch.Tensor]
"""expand(nodes) -> logits (len(nodes), V) of the drafter's prediction after each node (run on the
node's token with its ancestors as context); (len(nodes), V_s) over a tree's `support`."""

_NODE_SIGNALS = (*SIGNAL_NAMES, CONTEXT_SIGNAL)
"""The signals a tree keeps of each node (`Draft.signals`)."""


class DynamicTree:
    """The nodes drafted so far in one round, with their values; see the module docstring."""

    def __init__(
        self,
        shape: TreeShape,
        acceptance: AcceptanceFn,
        stop: TreeStopFn | None = None,
        sampling: SamplingParams | None = None,
        generator: torch.Generator | None = None,
        support: torch.Tensor | None = None,
        vocab_size: int | None = None,
        context: ContextIndex | None = None,
    ) -> None:
        if support is not None and vocab_size is None:
            raise ValueError("a tree over a reduced vocabulary needs the target's vocab_size")
        self.shape = shape
        self.acceptance = acceptance
        self.stop = stop
        self.sampling = None if sampling is None or sampling.greedy else sampling
        """None: greedy (top-k children); else the processing children are sampled under."""
        self.generator = generator
        self.support = support
        """(V_s,) the target ids a reduced draft vocabulary covers, or None (the whole
        vocabulary). With one, the tree grows from logits over these columns alone (the
        drafter's are -inf elsewhere) and places them on the target's vocab_size columns only
        where a `Draft` needs them."""
        self.vocab_size = vocab_size
        self.context = ContextIndex() if context is None else context
        """The committed sequence's n-grams, for each node's `context_match` (none known: no
        node repeats the context)."""
        self._context_tail = self.context.tail()
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.depths: list[int] = []
        """1-based depth per node."""
        self.values: list[float] = []
        self._raw_paths: list[float] = []  # product of the draft's top-1 probs along the path
        self._logits: list[torch.Tensor] = []  # (V_s,) per expanded distribution
        self._logits_row: list[int] = []  # per node, its parent's distribution in _logits
        self._signals: list[torch.Tensor] = []  # (len(_NODE_SIGNALS),) per expanded distribution
        self._top1: list[bool] = []  # per node, greedy: it is its parent's top-ranked child
        self._probs: list[torch.Tensor] = []  # under sampling, per node: q it was drawn from (V,)
        self._frontier: list[int] = []  # the newest depth's nodes

    @classmethod
    def for_request(
        cls,
        request: DraftRequest,
        shape: TreeShape | None = None,
        support: torch.Tensor | None = None,
        vocab_size: int | None = None,
    ) -> DynamicTree:
        """The tree a request asks for (of `shape` instead of the request's, when given), from a
        drafter whose logits cover the target ids `support` only (None: every one of the
        target's vocab_size)."""
        return cls(
            shape or request.shape,
            request.acceptance,
            request.tree_stop,
            request.sampling,
            request.generator,
            support,
            vocab_size,
            request.context,
        )

    def grow(self, root_logits: torch.Tensor, expand: Expand) -> Draft:
        """Grow the whole tree from the prediction after the newest committed token, root_logits
        (V,) (V_s over a `support`), calling expand once per further depth; returns the proposed
        `Draft`."""
        nodes = self.start(root_logits)
        while nodes:
            nodes = self.extend(nodes, expand(nodes))
        return self.draft()

    def start(self, root_logits: torch.Tensor) -> list[int]:
        """The first depth, from root_logits (V,) (V_s over a `support`); returns the nodes to
        expand next (empty: the tree is grown), for `extend` with their logits."""
        self._frontier = self._add_children([-1], root_logits[None])
        return self._to_expand(depth=1)

    def extend(self, nodes: list[int], logits: torch.Tensor) -> list[int]:
        """The next depth: children of nodes from their logits (len(nodes), V) (V_s over a
        `support`); returns the nodes to expand next (empty: the tree is grown)."""
        self._frontier = self._add_children(nodes, logits)
        return self._to_expand(depth=self.depths[self._frontier[0]] if self._frontier else 0)

    def _to_expand(self, depth: int) -> list[int]:
        """The most valuable nodes of the newest depth, `depth`, to give children, unless the
        tree is grown: the shape's depth reached, the budget spent, or the stop rule says so."""
        if not self._frontier or depth >= self.shape.depth:
            return []
        width = self.shape.width
        if self.sampling is not None:  # the budget is spent as the tree grows
            width = min(width, self.shape.max_tokens - len(self.tokens))
        if width <= 0 or (self.stop is not None and self.stop(depth, self)):
            return []
        return sorted(self._frontier, key=lambda n: -self.values[n])[:width]

    def _add_children(self, nodes: list[int], logits: torch.Tensor) -> list[int]:
        """Give each of nodes (-1: the root) its children from its logits (len(nodes), V_s): the
        top_k tokens (greedy) or draws without replacement (sampling); returns the new nodes."""
        logits = logits.float()
        # One softmax and one top-k give both the children and their confidence signals.
        width = min(self.shape.top_k, logits.shape[-1])
        _, top, entropy = distribution(logits, max(width, 2))
        indices = top.indices[:, :width]
        ids = (indices if self.support is None else self.support[indices]).tolist()
        # Past the (len(nodes), V) work a depth holds a few numbers a node: as Python floats
        # they cost less than one tensor op each.
        top_probs = top.values.tolist()
        table = [
            self._node_signals(node, row, h, row_ids[0])
            for node, row, h, row_ids in zip(nodes, top_probs, entropy.tolist(), ids, strict=True)
        ]
        signals = torch.tensor(table)  # (len(nodes), len(_NODE_SIGNALS)) float32
        raw_paths = signals[:, _NODE_SIGNALS.index("path_prob")].tolist()
        acceptance = self.acceptance(
            {name: signals[:, j] for j, name in enumerate(_NODE_SIGNALS)}
        ).tolist()
        values = []  # per node, per rank: its path's value
        for node, row, accepted in zip(nodes, top_probs, acceptance, strict=True):
            # The top-1 child is accepted with the node's acceptance; a runner-up keeps its
            # draft probability, which a calibration fitted on top-1 tokens says nothing of.
            parent_value = 1.0 if node < 0 else self.values[node]
            values.append([parent_value * share for share in [accepted, *row[1:width]]])
        if self.sampling is None:
            children = [
                [(t, v, None) for t, v in zip(tokens, row, strict=True) if v > 0.0]
                for tokens, row in zip(ids, values, strict=True)
            ]  # a value of 0: the drafter rules the token out (outside its vocabulary)
        else:
            children = self._sampled_children(self._on_target_vocab(logits), values)
        added = []
        for i, node in enumerate(nodes):
            self._logits.append(logits[i])
            self._signals.append(signals[i])
            depth = 1 if node < 0 else self.depths[node] + 1
            for rank, (token, value, drawn_from) in enumerate(children[i]):
                added.append(len(self.tokens))
                self.tokens.append(token)
                self.parents.append(node)
                self.depths.append(depth)
                self.values.append(value)
                self._raw_paths.append(raw_paths[i])
                self._logits_row.append(len(self._logits) - 1)
                self._top1.append(rank == 0 and values[i][0] > 0.0)
                if drawn_from is not None:
                    self._probs.append(drawn_from)
        return added

    def _node_signals(self, node: int, top: list[float], entropy: float, top1: int) -> list[float]:
        """The `_NODE_SIGNALS` of the distribution node (-1: the root) predicts, from its largest
        probabilities top (descending), its entropy and its top-1 token (a target id):
        `token_signals` after the node, and whether top1 repeats the context."""
        parent = FIRST_PARENT if node < 0 else (self.depths[node] - 1.0, self._raw_paths[node])
        signals = token_signals(top, entropy, *parent)
        signals[CONTEXT_SIGNAL] = float(self._context_match(node, top1))
        return [signals[name] for name in _NODE_SIGNALS]

    def _context_match(self, node: int, top1: int) -> bool:
        """Whether top1 (a target id), the top-1 token of node's distribution, continues the n
        tokens before it (committed ones, then the node's path) as somewhere earlier in the
        committed sequence."""
        path = []  # the node and its ancestors, newest first, as many as the match reads
        while node >= 0 and len(path) < self.context.n:
            path.append(self.tokens[node])
            node = self.parents[node]
        return self.context.matches(self._context_tail + path[::-1], top1)

    def _sampled_children(
        self, logits: torch.Tensor, values: list[list[float]]
    ) -> list[list[tuple[int, float, torch.Tensor]]]:
        """Per node, its children (token, value, q drawn from) under sampling: the budget left
        goes to the most valuable (node, rank) places, values (len(nodes), top_k) per rank, and
        each node draws as many tokens as it got places, without replacement."""
        q = probabilities(logits, self.sampling)
        drawable = (q > 0).sum(-1).tolist()
        places = [
            (value, i, rank)
            for i, row in enumerate(values)
            for rank, value in enumerate(row[: drawable[i]])
            if value > 0.0
        ]
        # Values fall with rank, so each node's places are its first ranks.
        places = sorted(places, key=lambda p: (-p[0], p[1], p[2]))
        room = self.shape.max_tokens - len(self.tokens)
        count = [0] * len(q)
        for _, i, _ in places[:room]:
            count[i] += 1
        children = []
        for i, row in enumerate(values):
            drawn = _without_replacement(q[i], count[i], self.generator)
            left, siblings = q[i].clone(), []
            for rank, token in enumerate(drawn):
                siblings.append((token, row[rank], left / left.sum()))
                left[token] = 0.0
            children.append(siblings)
        return children

    def draft(self) -> Draft:
        """The shape's total_tokens most valuable nodes drafted (each with its parent's logits);
        under sampling every node drafted (the budget was spent growing)."""
        kept = most_valuable(self.values, self.depths, self.shape.max_tokens)
        renumber = {node: i for i, node in enumerate(kept)}
        probs = torch.stack([self._probs[n] for n in kept]) if self._probs and kept else None
        logits = signals = top1 = None
        if kept:
            rows = [self._logits_row[n] for n in kept]
            logits = self._on_target_vocab(torch.stack([self._logits[r] for r in rows]))
            table = torch.stack([self._signals[r] for r in rows])
            signals = {name: table[:, j] for j, name in enumerate(_NODE_SIGNALS)}
            if self.sampling is None:
                top1 = torch.tensor([self._top1[n] for n in kept])
        return Draft(
            tokens=torch.tensor([self.tokens[n] for n in kept], dtype=torch.long),
            probs=probs,
            logits=logits,
            parents=torch.tensor(
                [renumber.get(self.parents[n], -1) for n in kept], dtype=torch.long
            ),
            values=torch.tensor([self.values[n] for n in kept]),
            support=self.support,
            signals=signals,
            top1=top1,
        )

    def _on_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (m, V_s) on the target's vocabulary (m, V), -inf outside the support."""
        return (
            logits
            if self.support is None
            else to_target_vocab(logits, self.support, self.vocab_size)
        )


def combine_depths(request: DraftRequest, depth_logits: list[torch.Tensor]) -> Draft:
    """A tree from one prediction per depth, depth_logits[d] (V,) for the tokens at depth d + 1,
    made without seeing the tokens before them (Medusa's heads; MTP's modules along the top-1
    path): every node of one depth gets that depth's top-k as children, and the tree keeps the
    most valuable combinations under the request's budget."""
    shape = replace(request.shape, depth=min(request.shape.depth, len(depth_logits)))
    tree = DynamicTree.for_request(request, shape)
    return tree.grow(
        depth_logits[0], lambda nodes: depth_logits[tree.depths[nodes[0]]].expand(len(nodes), -1)
    )


def _without_replacement(q: torch.Tensor, count: int, generator: torch.Generator | None):
    """count distinct token ids drawn from q (V,) one after another without replacement, in draw
    order (Gumbel top-k: the largest log q + Gumbel noise)."""
    if count == 0:
        return []
    uniform = torch.rand(q.shape, generator=generator).clamp_min(1e-20)
    keys = q.log() - (-uniform.log()).log()
    return keys.topk(count).indices.tolist()


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


class SiblingChain:
    """A tree that expands one node a depth (`TreeShape.expand` 1) grown a step at a time, as a
    chain is drafted (`DraftBuilder`'s `add` / `done` / `draft`): each step the drafter runs the
    one node to expand, whose siblings stay leaves, so a drafter that steps a batch's chains in
    lockstep grows these trees with the same forwards."""

    def __init__(self, request: DraftRequest) -> None:
        if request.shape.width != 1:
            raise ValueError(
                f"{request.shape} expands {request.shape.width} nodes a depth; a sibling chain "
                "expands one (expand=1)"
            )
        self.tree = DynamicTree.for_request(request)
        self._next: list[int] | None = None
        self.done = False

    def add(self, logits: torch.Tensor) -> int | None:
        """The children of the node expanded last (the root first) from logits (V,); returns the
        token of the node to expand next, None once the tree is grown."""
        if self._next is None:
            self._next = self.tree.start(logits)
        else:
            self._next = self.tree.extend(self._next, logits[None])
        self.done = not self._next
        return None if self.done else self.tree.tokens[self._next[0]]

    def draft(self) -> Draft:
        return self.tree.draft()
