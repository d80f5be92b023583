"""One plan for a batch whose rows draft in lockstep (one drafter forward per step for every
row): the round lasts as long as its longest row drafts and its verification is as wide as its
widest row's block, so the rows' drafts are sized together, not each as if alone."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from draftsmith.heads.base import TreeNodes


@dataclass
class _RowGrowth:
    """What one row has drafted so far this round, and how its next depth is expected to grow."""

    values: list[float] = field(default_factory=list)
    """Per node drafted, its path's probability of acceptance."""
    depth: int = 0
    """Steps drafted (a chain's tokens, a tree's depths)."""
    frontier: float = 0.0
    """Value of the node the next step expands (a chain's newest token)."""
    ratios: list[float] = field(default_factory=list)
    """The children the newest step gave its parent, each's value over the parent's, most
    valuable first: what each further step is taken to give the node it expands."""

    def projected(self, steps: int) -> list[float]:
        """The values of the nodes `steps` further steps are expected to add."""
        added, frontier = [], self.frontier
        for _ in range(steps):
            added.extend(frontier * r for r in self.ratios)
            frontier *= self.ratios[0] if self.ratios else 0.0
        return added


@dataclass
class LockstepPlan:
    """A batch's round planned as one: drafting n steps costs `drafting_s(n)` for every row
    together, verifying k nodes in every row costs `verify_s(k + 1)` (the batch's one forward,
    padded to its widest row), and each row verifies its k most valuable nodes, so the round is
    expected to commit

        rate(n, k) = sum over rows of (1 + its k best values) / (drafting_s(n) + verify_s(k + 1))

    tokens per second. Drafting goes on while some deeper round is expected to beat the best
    rate of what is drafted (each row's next steps growing as its newest did), and the round
    keeps the k of best rate. A row's values are its nodes' path probabilities of acceptance."""

    max_depth: int
    drafting_s: Callable[[int], float]
    verify_s: Callable[[int], float]
    rows: list[_RowGrowth] = field(default_factory=list)

    def add_row(self) -> _RowGrowth:
        """A row's record, which its stop rule fills in (rows in batch order)."""
        row = _RowGrowth()
        self.rows.append(row)
        return row

    def record_chain(self, row: _RowGrowth, acceptance: float) -> None:
        """Row's chain drafted another token, accepted with probability `acceptance` if the
        tokens before it are."""
        row.frontier = (row.frontier if row.values else 1.0) * acceptance
        row.values.append(row.frontier)
        row.depth += 1
        row.ratios = [acceptance]

    def record_tree(self, row: _RowGrowth, depth: int, nodes: TreeNodes) -> None:
        """Row's tree (expanding its most valuable node a depth) grew its depth `depth`."""
        newest = [i for i, d in enumerate(nodes.depths) if d == depth]
        parent = nodes.parents[newest[0]]
        parent_value = 1.0 if parent < 0 else nodes.values[parent]
        values = sorted((nodes.values[i] for i in newest), reverse=True)
        row.values, row.depth, row.frontier = list(nodes.values), depth, values[0]
        row.ratios = [v / max(parent_value, 1e-12) for v in values]

    def best(self, values: Sequence[Sequence[float]], steps: int) -> tuple[int, float]:
        """The k (nodes a row) of best rate with `values` drafted in `steps` steps, and that
        rate; each row's values most valuable first."""
        spent_s = self.drafting_s(steps)
        widest = max((len(v) for v in values), default=0)
        best, best_rate = 0, len(values) / (spent_s + self.verify_s(1))
        expected = float(len(values))
        for k in range(1, widest + 1):
            expected += sum(v[k - 1] for v in values if len(v) >= k)
            rate = expected / (spent_s + self.verify_s(k + 1))
            if rate > best_rate:
                best, best_rate = k, rate
        return best, best_rate

    def deeper_pays(self, steps: int) -> bool:
        """Whether drafting beyond `steps` steps is expected to beat the best round drafted so
        far; a row that stopped before `steps` (its draft full) grows no further."""
        now = [sorted(row.values, reverse=True) for row in self.rows]
        best_now = self.best(now, steps)[1]
        for deeper in range(steps + 1, self.max_depth + 1):
            grown = [
                sorted(row.values + row.projected(deeper - steps), reverse=True)
                if row.depth == steps
                else values
                for row, values in zip(self.rows, now, strict=True)
            ]
            if self.best(grown, deeper)[1] > best_now:
                return True
        return False
