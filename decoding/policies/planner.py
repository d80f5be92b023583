"""The cost-aware policy's round planner: how far each row drafts (chains, trees, and rows
drafting in lockstep) and which of its drafted nodes the target verifies, so that the round
commits the most tokens per second at the costs the cost model gives. See
docs/cost-aware-policy.md."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from draftsmith.decoding.policies.base import StopRule
from draftsmith.decoding.policies.cost_model import CostModel
from draftsmith.decoding.policies.lockstep import LockstepPlan
from draftsmith.decoding.policies.tree_plan import (
    Pays,
    a_deeper_tree_pays,
    next_budget,
    sampled_nodes,
)
from draftsmith.heads.base import Draft, RoundStopFn, TreeNodes, TreeShape, TreeStopFn

PLAIN = TreeShape.chain(0)


@dataclass
class RoundPlanner:
    """Plans one round at a time: `open` it, hand out its stop rules (one per row, in row
    order), then `trim` each row's draft (or `trim_round` every row's at once) in that order.

    A round's value with n nodes verified is its expected committed tokens (1 plus the n
    nodes' path probabilities of acceptance) over its seconds (drafting plus the verification
    of n + 1 tokens a row). Drafting goes on while some deeper draft is expected to beat the
    best value of what is drafted; greedy drafts are then cut to the nodes of best value, and
    sampled drafts node by node before the first that does not pay on what precedes it."""

    costs: CostModel
    largest: TreeShape
    """The largest draft a row proposes in one round."""
    max_draft_tokens: int
    """Most tokens a chain drafts."""
    refresh_rounds: int
    """Most rounds without one that verifies more than one token (`_measuring`)."""
    clock: Callable[[], float]
    """Seconds, read between a row's drafter steps to time them."""
    rows: int = field(default=1, init=False)
    """Rows decoding together this round."""
    drafted: int = field(default=0, init=False)
    """Nodes drafted this round over all rows, before the trim."""
    drafted_steps: int = field(default=0, init=False)
    """Drafter steps this round over all rows: a chain's tokens, a tree's depths."""
    lockstep_steps: int = field(default=0, init=False)
    """Steps this lockstep round drafted."""
    plan: LockstepPlan | None = field(default=None, init=False)
    """This round's plan for every row together, where the rows draft in lockstep."""
    expected: list[float | None] = field(default_factory=list, init=False)
    """Per row of this round, in row order, the tokens its trimmed draft is expected to commit
    (None where the draft was not planned)."""
    budget: tuple[int, int] | None = field(default=None, init=False)
    """The next round's (children a node, nodes expanded a depth), from what the last kept
    (`next_budget`); None: the largest shape's."""
    _round_acceptance: list[list[float]] = field(default_factory=list, init=False)
    """Per row of this round, in row order, the acceptance of each token its chain drafted."""
    _round_depths: list[list[int]] = field(default_factory=list, init=False)
    """Per row of this round, in row order, a one-element list: the depths its tree grew."""

    def open(self, rows: int, lockstep: bool) -> None:
        """A round of `rows` rows begins (`lockstep`: they draft in the same drafter forwards)."""
        self.rows, self.drafted, self.drafted_steps = rows, 0, 0
        self._round_acceptance, self._round_depths, self.expected = [], [], []
        self.lockstep_steps = 0
        self.plan = None
        if lockstep:
            self.plan = LockstepPlan(
                self.largest.depth, self.costs.lockstep.seconds, self.round_verify_s
            )

    def shape(self) -> TreeShape:
        """The round's draft shape where speculation may run: nothing where even a chain the
        target accepts whole could not pay (unless a wider round is due to be timed), else the
        largest, a tree's width following what the last rounds kept."""
        shape = self.largest
        if not self._a_chain_can_pay() and self.costs.since_wider < self.refresh_rounds:
            return PLAIN
        if shape.is_chain or self.budget is None:
            return shape
        # The depth is the stop rule's to choose; the width follows what the last rounds kept.
        return shape.narrowed(*self.budget)

    def _a_chain_can_pay(self) -> bool:
        """Whether a chain the target accepts whole would beat a plain step at today's costs
        (with a curve: without one nothing is known against drafting). A tree can do no better:
        n depths commit at most n + 1 tokens, for n steps and at least n + 1 verified."""
        if self.costs.curve is None:
            return True
        return any(
            (1 + n) / (self.drafting_s(n) + self.row_verify_s(n + 1)) > self.plain_rate()
            for n in range(1, self.largest.depth + 1)
        )

    # -- stop rules --------------------------------------------------------------------------

    def chain_rule(self) -> StopRule | None:
        """A row's rule ending its chain this round (one per row, asked for in row order)."""
        if self.costs.curve is None or not self.largest.is_chain:
            return None
        accepted: list[float] = []
        self._round_acceptance.append(accepted)
        if self.plan is not None:
            plan, row = self.plan, self.plan.add_row()

            def record(position: int, _: dict[str, float], acceptance: float) -> bool:
                accepted.append(acceptance)
                plan.record_chain(row, acceptance)
                return False  # the round's stop rule stops every row together

            return record
        drafting = self.costs.drafting
        fixed_s = drafting.fixed / self.rows
        path, expected, timed = 1.0, 1.0, drafting.step_timer(self.clock)

        def no_longer_draft_pays(position: int, _: dict[str, float], acceptance: float) -> bool:
            nonlocal path, expected
            timed()
            step_s = drafting.per_step
            accepted.append(acceptance)
            path *= acceptance
            expected += path
            n = position + 1
            now = expected / (fixed_s + n * step_s + self.row_verify_s(n + 1))
            longer_path, longer_expected = path, expected
            for m in range(n + 1, self.max_draft_tokens + 1):
                longer_path *= acceptance
                longer_expected += longer_path
                cost = fixed_s + m * step_s + self.row_verify_s(m + 1)
                if longer_expected / cost > now:
                    return False
            return True

        return no_longer_draft_pays

    def tree_stop_fn(self) -> TreeStopFn | None:
        """A row's rule ending its tree's growth this round (one per row, in row order)."""
        if self.costs.curve is None or self.largest.is_chain:
            return None
        grown = [1]
        self._round_depths.append(grown)
        if self.plan is not None:
            plan, row = self.plan, self.plan.add_row()

            def record(depth: int, nodes: TreeNodes) -> bool:
                grown[0] = depth
                plan.record_tree(row, depth, nodes)
                return False  # the round's stop rule stops every row together

            return record
        drafting = self.costs.drafting
        fixed_s, timed = drafting.fixed / self.rows, drafting.step_timer(self.clock)

        def no_deeper_tree_pays(depth: int, nodes: TreeNodes) -> bool:
            timed()
            grown[0] = depth
            shape, step_s = self.largest, drafting.per_step
            narrowed = shape if self.budget is None else shape.narrowed(*self.budget)
            if a_deeper_tree_pays(nodes, depth, shape, narrowed, self._rate(fixed_s, step_s)):
                grown[0] = depth + 1
                return False
            return True

        return no_deeper_tree_pays

    def _rate(self, fixed_s: float, step_s: float) -> Callable[[list[float], int], float]:
        """The best committed tokens per second of a tree holding `values` (most valuable
        first) after `depth` steps of `step_s` past `fixed_s`."""
        return lambda values, depth: best(values, fixed_s + depth * step_s, self.row_verify_s)[1]

    def round_stop_fn(self) -> RoundStopFn | None:
        """The rule ending a lockstep round's drafting for every row together (`LockstepPlan`),
        where the rows draft in lockstep."""
        if self.costs.curve is None or self.plan is None:
            return None
        plan, timed = self.plan, self.costs.lockstep.step_timer(self.clock)

        def no_deeper_round_pays(steps: int) -> bool:
            timed()
            self.lockstep_steps = steps
            return not plan.deeper_pays(steps)

        return no_deeper_round_pays

    # -- cuts --------------------------------------------------------------------------------

    def trim_round(self, drafts: Sequence[Draft]) -> list[Draft] | None:
        """Greedy drafts of a lockstep round each cut to the k most valuable nodes, k the
        round's best (`LockstepPlan.best`); None where each row's draft is trimmed alone."""
        chain = self.largest.is_chain
        if (
            self.plan is None
            or self.costs.curve is None
            or any(d.probs is not None or (not chain and d.values is None) for d in drafts)
        ):
            return None
        values = []
        for draft in drafts:  # rows' records are in the order of the drafts
            self.drafted += len(draft)
            if chain:
                accepted = self._round_acceptance.pop(0)[: len(draft)]
                values.append(list(itertools.accumulate(accepted, operator.mul)))
            else:
                self._round_depths.pop(0)
                values.append(draft.values.sort(descending=True).values.tolist())
        size = self._measuring(self.plan.best(values, self.lockstep_steps)[0])
        kept = []
        for draft, row_values in zip(drafts, values, strict=True):
            k = min(size, len(draft))
            self.expected.append(1.0 + sum(row_values[:k]))
            kept.append(draft.subtree(range(k)) if chain else draft.pruned(k))
        if not chain:
            self.budget = next_budget(kept, self.largest.top_k)
        return kept

    def trim(self, draft: Draft) -> Draft:
        """A row's draft as the target verifies it (rows in the order of their stop rules)."""
        self.drafted += len(draft)
        chain = self.largest.is_chain
        if chain:
            steps = len(draft)
        elif self._round_depths:  # rows are trimmed in the order their stop rules were made
            steps = self._round_depths.pop(0)[0] if len(draft) else 0
        else:
            steps = int(draft.depths.max()) if len(draft) else 0
        self.drafted_steps += steps
        if self.costs.curve is None or len(draft) == 0:
            self.expected.append(1.0 if len(draft) == 0 else None)
            return draft
        if not chain:
            return self._trim_tree(draft, steps)
        # Rows are trimmed in the order their stop rules were made.
        accepted = self._round_acceptance.pop(0) if self._round_acceptance else []
        if len(accepted) != len(draft):  # a drafter that ignored the stop rule
            self.expected.append(None)
            return draft
        paths = list(itertools.accumulate(accepted, operator.mul))
        if draft.probs is not None:
            size = while_each_pays(paths, range(1, len(paths) + 1), self._verifying_pays)
        else:
            size = best(paths, self.drafting_s(len(paths)), self.row_verify_s)[0]
        return draft.subtree(range(self._kept(size, paths)))

    def _trim_tree(self, draft: Draft, depths: int) -> Draft:
        if draft.values is None:
            self.expected.append(None)
            return draft
        if draft.probs is not None:
            kept = draft.subtree(sampled_nodes(draft, self._verifying_pays, self._measuring(0)))
            self.expected.append(1.0 + float(kept.values.sum()))
        else:
            # A node's value is its path's probability of acceptance, so the n most valuable
            # nodes (parents are worth at least their children) are expected to give their sum.
            values = draft.values.sort(descending=True).values.tolist()
            size = self._kept(best(values, self.drafting_s(depths), self.row_verify_s)[0], values)
            kept = draft.pruned(size)
        self.budget = next_budget([kept], self.largest.top_k)
        return kept

    def _kept(self, size: int, values: list[float]) -> int:
        """How many of a draft's nodes, in the order of their `values` (path probabilities), the
        target verifies: `size`, unless a node is kept for `_measuring`; the tokens they are
        expected to commit are noted for the verdict on speculation."""
        size = self._measuring(size)
        self.expected.append(1.0 + sum(values[:size]))
        return size

    def _measuring(self, size: int) -> int:
        """size, or one node where a draft cut to nothing would leave the cost of verifying more
        than one token unmeasured for `refresh_rounds` rounds (a scale it overstates would
        otherwise cut every draft and never be timed again). Which node is kept does not depend
        on its token, so sampling stays exact."""
        return max(size, 1) if self.costs.since_wider >= self.refresh_rounds else size

    # -- a round's value ---------------------------------------------------------------------

    def drafting_s(self, steps: int) -> float:
        """A row's expected seconds of drafting `steps` steps this round (in lockstep, its share
        of every row drafting them; else its share of the fixed part, the per-step part being
        fitted on every row's steps already)."""
        if self.plan is not None:
            return self.costs.lockstep.seconds(steps) / self.rows
        return self.costs.drafting.fixed / self.rows + steps * self.costs.drafting.per_step

    def _verifying_pays(self, value: float, accepted: float, kept: int, steps: int) -> bool:
        """Whether verifying one more node of `value` raises this round's committed tokens per
        second over the `kept` nodes verified so far, expected to give `accepted` tokens, the
        drafting of `steps` steps spent."""
        spent_s = self.drafting_s(steps)
        without = (1.0 + accepted) / (spent_s + self.row_verify_s(kept + 1))
        return (1.0 + accepted + value) / (spent_s + self.row_verify_s(kept + 2)) > without

    def round_verify_s(self, n: int) -> float:
        """Seconds of this round's target forward verifying n tokens in each row."""
        return self.costs.round_verify_s(n, self.rows)

    def row_verify_s(self, n: int) -> float:
        """A row's share of a round in which every row verifies n tokens."""
        return self.round_verify_s(n) / self.rows

    def plain_rate(self) -> float:
        """A row's tokens per second of plain decoding: one over its share of the batch's scaled
        one-token cost."""
        return 1.0 / self.row_verify_s(1)


def while_each_pays(values: list[float], steps: Sequence[int], pays: Pays) -> int:
    """How many of a sampled draft's nodes to verify, in the order given (each after its
    parent): the nodes before the first whose verification would lower the round's committed
    tokens per second (`pays` says), the drafting of its `steps` spent.

    Sampling stays exact only if whether a node is verified does not depend on its own token
    or on anything drafted after it (the tokens a node's children are drawn from depend on
    it); a node's value depends on neither, and this cut judges each node on the values of
    the nodes before it and its own. The best size over the whole draft, as greedy drafts
    are cut, would keep a token for what its continuation promises."""
    accepted = 0.0
    for n, (value, step) in enumerate(zip(values, steps, strict=True)):
        if not pays(value, accepted, n, step):
            return n
        accepted += value
    return len(values)


def best(
    values: list[float], spent_s: float, row_verify_s: Callable[[int], float]
) -> tuple[int, float]:
    """The number n of draft nodes to verify that maximises a row's committed tokens per
    second, and that rate, `spent_s` of drafting spent and `row_verify_s(n + 1)` of
    verification; values are the nodes' path probabilities, most valuable first (the n first
    are expected to give their sum)."""
    size, best_rate, accepted = 0, 1.0 / (spent_s + row_verify_s(1)), 0.0
    for n, value in enumerate(values, start=1):
        accepted += value
        rate = (1.0 + accepted) / (spent_s + row_verify_s(n + 1))
        if rate > best_rate:
            size, best_rate = n, rate
    return size, best_rate
