"""`cost-aware` (the default): draft what maximises expected committed tokens per second, and
nothing when speculation is slower than plain decoding."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from transformers import PreTrainedModel

from draftsmith.decoding.policies.base import UNSIZED, DraftPolicy, RequestSize, RoundOutcome
from draftsmith.decoding.policies.cost_model import CostModel
from draftsmith.decoding.policies.fallback import Fallback
from draftsmith.decoding.policies.planner import PLAIN, RoundPlanner
from draftsmith.decoding.profile import CostCurve, measure_cost_curve
from draftsmith.heads.base import Draft, RoundStopFn, StopFn, TreeShape, TreeStopFn

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class CostAwarePolicy(DraftPolicy):
    """Maximise expected committed tokens per second from calibrated acceptance and measured cost.

    Each round drafts (a chain, a tree, or every row of a batch in lockstep) while a longer
    draft is expected to raise the round's committed tokens per second, then cuts the draft to
    what pays (`RoundPlanner`), at the costs the rounds' timings fit (`CostModel`: the target's
    profiled verification curve scaled to now, the drafter's steps, its reading of a prompt).
    When speculation has lost against plain decoding the policy decodes plainly for a stretch,
    then probes again (`Fallback`). docs/cost-aware-policy.md explains the rules and why.
    """

    name = "cost-aware"
    siblings: int = 3
    """Runners-up drafted with each token of a chain, as leaves the drafter never runs (a tree
    expanding one node a depth, `TreeShape.expand`): more candidates for a chain's drafting,
    cut like a tree's nodes to those that pay. 0: a bare chain. Unused where `tree` is set."""
    cost: CostCurve | None = None
    """The target's verification cost (`draftsmith profile`); None: measured at first use."""
    patience: float = 8.0
    """Plain decoding steps' worth of seconds that speculation may lose, net, before the policy
    falls back to plain decoding."""
    expected_patience: float = 2.0
    """The same for what speculation is expected to lose, net, by the plans of its rounds (their
    drafting spent, their verification, and the tokens their kept drafts are expected to
    commit): an expectation varies far less from round to round than what a round commits, so
    the verdict on it can come sooner."""
    first_backoff: int = 4
    """Plain rounds after speculation first loses."""
    max_backoff: int = 64
    """Longest plain stretch the doubling reaches (a probe that lost more buys a longer one)."""
    probe_budget: float = 0.02
    """Most share of plain decoding's time that losing probes may cost."""
    smoothing: float = 0.3
    """Weight of the newest round in the moving averages of the drafting cost."""
    timed_rounds: int = 9
    """Rounds whose median sets the curve's scale (and the one-token factor's)."""
    refresh_rounds: int = 64
    """Most rounds between two that verify one token (the next is a plain step when none did),
    and between two that verify more (the next keeps a drafted token when none did), so both
    costs stay measured."""
    clock: Callable[[], float] = field(
        default=time.perf_counter, repr=False, compare=False, metadata={"option": False}
    )
    """Seconds, read to time the drafter's steps and the policy's own learning (a fake one makes
    the policy's decisions deterministic in tests); not a `build_policy` option."""
    _costs: CostModel = field(init=False, repr=False)
    _planner: RoundPlanner = field(init=False, repr=False)
    _fallback: Fallback = field(init=False, repr=False)
    _drafted_before: bool = field(default=False, init=False, repr=False)
    """The previous round of this request drafted: the drafter had caught up, so this round's
    drafting time measures drafting alone (not the prompt or a plain stretch)."""
    _prompt_tokens: int = field(default=0, init=False, repr=False)
    """Tokens of this request's prompts (0: not said)."""
    _first_round: bool = field(default=True, init=False, repr=False)
    """No round of this request has been observed yet."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.first_backoff < 1 or self.max_backoff < self.first_backoff:
            raise ValueError(
                "need 1 <= first_backoff <= max_backoff, got "
                f"{self.first_backoff}, {self.max_backoff}"
            )
        if self.patience < 0 or self.expected_patience < 0:
            raise ValueError(
                "patience and expected_patience must be >= 0, got "
                f"{self.patience}, {self.expected_patience}"
            )
        if not 0.0 < self.smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {self.smoothing}")
        if not 0.0 < self.probe_budget <= 1.0:
            raise ValueError(f"probe_budget must be in (0, 1], got {self.probe_budget}")
        if self.siblings < 0:
            raise ValueError(f"siblings must be >= 0, got {self.siblings}")
        if self.timed_rounds < 1:
            raise ValueError(f"timed_rounds must be >= 1, got {self.timed_rounds}")
        if self.refresh_rounds < 1:
            raise ValueError(f"refresh_rounds must be >= 1, got {self.refresh_rounds}")
        # Machine costs, and whether and how long speculation has been losing, carry over
        # between requests.
        self._costs = CostModel(self.cost, self.smoothing, self.timed_rounds)
        self._planner = RoundPlanner(
            self._costs, self.largest, self.max_draft_tokens, self.refresh_rounds, self.clock
        )
        self._fallback = Fallback(
            self.patience,
            self.expected_patience,
            self.first_backoff,
            self.max_backoff,
            self.probe_budget,
            self.timed_rounds,
        )
        self.start()

    def start(self, target: PreTrainedModel | None = None, size: RequestSize = UNSIZED) -> None:
        """Open a request; decode it plainly where the drafter's reading of its prompts would
        cost more than speculation is expected to gain over its tokens (`Fallback.reading_pays`)."""
        if self.cost is None and target is not None:
            logger.info("measuring the target's verification cost (once; uncached)")
            self.cost = measure_cost_curve(target, self.largest.max_tokens + 1)
            self._costs.use_curve(self.cost)
        rows = len(size.prompt_lengths) or 1
        fallback = self._fallback
        if fallback.speculating and not fallback.reading_pays(
            size.prompt_tokens, rows * size.max_new_tokens, self._costs.reading.value
        ):
            self._fall_back(
                at_least=size.max_new_tokens,
                why="reading the prompt would cost more than speculation is expected to gain",
            )
            fallback.forget_gains()  # the verdict is spent: the request after the stretch probes
        fallback.restart()
        self._planner.budget = None
        self._drafted_before = False
        self._prompt_tokens, self._first_round = size.prompt_tokens, True

    # -- planning (`RoundPlanner`) -----------------------------------------------------------

    @property
    def largest(self) -> TreeShape:
        """`tree`, or a chain of max_draft_tokens with `siblings` runners-up a token."""
        if self.tree is not None or self.siblings == 0:
            return super().largest
        width = 1 + self.siblings
        depth = self.max_draft_tokens
        return TreeShape(top_k=width, depth=depth, total_tokens=width * depth, expand=1)

    def shape(self, rows: int = 1, lockstep: bool = False) -> TreeShape:
        self._planner.open(rows, lockstep)
        if not self._fallback.speculating or self._costs.one_token_unmeasured(self.refresh_rounds):
            return PLAIN
        return self._planner.shape()

    def stop_fn(self) -> StopFn | None:
        """A row's stop rule for this round (one per row, asked for in row order)."""
        rule = self._planner.chain_rule()
        return None if rule is None else self.token_stop_fn(rule)

    def tree_stop_fn(self) -> TreeStopFn | None:
        """A row's rule ending its tree's growth this round (one per row, in row order)."""
        return self._planner.tree_stop_fn()

    def round_stop_fn(self) -> RoundStopFn | None:
        """The rule ending a lockstep round's drafting for every row together."""
        return self._planner.round_stop_fn()

    def trim_round(self, drafts: Sequence[Draft]) -> list[Draft]:
        """Greedy drafts of a lockstep round each keep the k most valuable nodes, k the round's
        best (`LockstepPlan.best`); otherwise each row's draft is trimmed alone (sampled ones
        node by node, which keeps them exact)."""
        kept = self._planner.trim_round(drafts)
        return [self.trim(draft) for draft in drafts] if kept is None else kept

    def trim(self, draft: Draft) -> Draft:
        return self._planner.trim(draft)

    # -- learning ----------------------------------------------------------------------------

    def observe(self, outcome: RoundOutcome) -> None:
        self.observe_round([outcome])

    def observe_round(self, outcomes: Sequence[RoundOutcome]) -> None:
        started = self.clock()
        for outcome in outcomes:
            super().observe(outcome)
        # Learning from a drafted round (the online recalibration reads every judged node's
        # signals) is a cost of speculation too, outside the round the decoder timed.
        learning_s = self.clock() - started
        planner, costs = self._planner, self._costs
        rows = planner.rows = len(outcomes)
        planned, planner.expected = planner.expected, []
        # One forward verified every row's block, padded to the widest.
        width = max(len(outcome.draft) for outcome in outcomes) + 1
        draft_s, round_s = outcomes[0].draft_s, outcomes[0].round_s
        costs.time_verification(max(round_s - draft_s, 1e-9), rows, width)
        first_of_request, self._first_round = self._first_round, False
        if self._fallback.plain_round():
            self._drafted_before = False
            return
        lockstep = planner.plan is not None
        steps = planner.lockstep_steps if lockstep else planner.drafted_steps
        catching_up = planner.drafted > 0 and not self._drafted_before
        if planner.drafted and not catching_up:
            costs.draft_cost(lockstep).add(steps, draft_s)
        self._drafted_before = planner.drafted > 0
        # Plain decoding gives every row a token per one-token forward of the batch.
        plain_round_s = self.round_verify_s(1, rows)
        committed = sum(outcome.committed for outcome in outcomes)
        spent_s = draft_s + learning_s + self.round_verify_s(width, rows)
        lost_s = spent_s - committed / rows * plain_round_s
        self._fallback.spec_lost_s += lost_s
        if catching_up:
            # The drafter read the prompt or a plain stretch first: a cost paid once per request
            # or probe (counted in what the probe lost), not evidence of how speculation goes.
            if first_of_request and self._prompt_tokens:
                costs.time_reading(draft_s, steps, lockstep, self._prompt_tokens)
            return
        # A row whose draft was not planned (its drafter ignored the stop rule) counts as what
        # it committed.
        expected = sum(
            outcome.committed if e is None else e
            for outcome, e in itertools.zip_longest(outcomes, planned[: len(outcomes)])
        )
        expected_lost_s = spent_s - expected / rows * plain_round_s
        if self._fallback.judge(lost_s, expected_lost_s, expected, plain_round_s):
            self._fall_back()

    def _fall_back(
        self, at_least: int = 0, why: str = "speculation slower than plain decoding"
    ) -> None:
        """Speculation is slower than plain decoding: decode plainly for a while (at least
        `at_least` rounds), then probe afresh; logged at INFO with `why`."""
        lost_s = self._fallback.spec_lost_s
        plain = self._fallback.fall_back(self.round_verify_s(1), at_least)
        logger.info("%s (the probe lost %.2f s net): %d plain rounds", why, lost_s, plain)

    # -- costs (`CostModel`) -----------------------------------------------------------------

    def round_verify_s(self, n: int, rows: int | None = None) -> float:
        """Seconds of one target forward verifying n tokens in each of `rows` rows (default this
        round's), at the costs timed now."""
        return self._costs.round_verify_s(n, self._planner.rows if rows is None else rows)

    def row_verify_s(self, n: int) -> float:
        """A row's share of a round in which every row verifies n tokens."""
        return self._planner.row_verify_s(n)

    def plain_rate(self) -> float:
        """A row's tokens per second of plain decoding: one over its share of the batch's scaled
        one-token cost."""
        return self._planner.plain_rate()

    @property
    def speculating(self) -> bool:
        """False while the policy decodes plainly after speculation lost."""
        return self._fallback.speculating
