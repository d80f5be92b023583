"""The tree parts of the cost-aware policy's plan: whether a tree grows another depth, which
nodes of a sampled tree the target verifies, and how wide the next round's tree grows. See
docs/cost-aware-policy.md."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from draftsmith.heads.base import Draft, TreeNodes, TreeShape

Rate = Callable[[list[float], int], float]
"""rate(values, depth): the best committed tokens per second of a tree holding nodes of
`values` (most valuable first) after drafting `depth` depths."""

Pays = Callable[[float, float, int, int], bool]
"""pays(value, accepted, kept, steps): whether verifying one more node of `value` raises the
round's committed tokens per second over the `kept` nodes before it, expected to give
`accepted` tokens, the drafting of `steps` steps spent."""


def a_deeper_tree_pays(
    nodes: TreeNodes, depth: int, shape: TreeShape, narrowed: TreeShape, rate: Rate
) -> bool:
    """Whether growing the tree beyond `depth` depths is expected to beat the best rate of the
    nodes it holds, each further depth expanding the most valuable nodes of the one before (the
    `narrowed` shape's width) with children in the proportions the newest depth's parents gave
    theirs; the proposed tree keeps at most `shape`'s most valuable nodes."""
    top_k, width = narrowed.top_k, narrowed.width
    values = nodes.values
    newest = [i for i, d in enumerate(nodes.depths) if d == depth]
    children: dict[int, list[float]] = {}
    for i in newest:
        parent = nodes.parents[i]
        parent_value = 1.0 if parent < 0 else values[parent]
        children.setdefault(parent, []).append(values[i] / max(parent_value, 1e-12))
    ratios = [sorted(r, reverse=True) for r in children.values()]
    # The child of each rank a parent is expected to get (missing children give nothing).
    by_rank = [sum(r[j] for r in ratios if j < len(r)) / len(ratios) for j in range(top_k)]
    frontier = sorted((values[i] for i in newest), reverse=True)[:width]
    grown = sorted(values, reverse=True)
    now = rate(grown[: shape.max_tokens], depth)
    for deeper in range(depth + 1, shape.depth + 1):
        frontier = sorted((f * r for f in frontier for r in by_rank), reverse=True)
        grown = sorted(grown + frontier, reverse=True)[: shape.max_tokens]
        frontier = frontier[:width]
        if rate(grown, deeper) > now:
            return True
    return False


def sampled_nodes(draft: Draft, pays: Pays, at_least: int) -> list[int]:
    """The nodes of a sampled tree to verify, ascending (where none pays, the first `at_least`
    judged), judged depth by depth, each depth's most valuable first (ties: the earlier node, so
    a node's elder siblings go first), each kept where its verification `pays` on the nodes
    kept before it; one that does not cuts its younger siblings (the verifier tries siblings in
    the order drawn) and every node under it.

    As for a chain, whether a node is verified depends on the values of the nodes judged before
    it and its own, a property of its parent's distribution and its rank, never on its token or
    on anything drafted after it: sampling stays exact."""
    parents, depths = draft.parents.tolist(), draft.depths.tolist()
    values = draft.values.tolist()
    order = sorted(range(len(draft)), key=lambda n: (depths[n], -values[n], n))
    kept: set[int] = set()
    closed: set[int] = set()  # parents whose younger children are cut
    accepted = 0.0
    for node in order:
        parent = parents[node]
        if parent in closed or (parent >= 0 and parent not in kept):
            continue
        if not pays(values[node], accepted, len(kept), depths[node]):
            closed.add(parent)
            continue
        kept.add(node)
        accepted += values[node]
    return sorted(kept) if kept or not order else order[:at_least]


def next_budget(kept: Sequence[Draft], max_top_k: int) -> tuple[int, int]:
    """The next round's (children a node, nodes expanded a depth): twice the most that one
    node, and one depth, of this round's kept trees have (the root: one expanded node), at most
    `max_top_k`. Apart, since the nodes worth expanding and the children worth keeping differ: a
    tree whose kept depths hold three children of one node is grown next with six children a
    node but two nodes expanded a depth, not six."""
    children, expanded = 1, 1
    for draft in kept:
        parents, depths = draft.parents.tolist(), draft.depths.tolist()
        counts = Counter(parents)
        children = max([children, *counts.values()])
        expanded = max([expanded, *Counter(depths[p] for p in counts if p >= 0).values()])
    top_k = min(2 * children, max_top_k)
    return top_k, min(2 * expanded, top_k)
