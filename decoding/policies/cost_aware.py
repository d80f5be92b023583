"""`cost-aware` (the default): draft what maximises expected committed tokens per second, and
nothing when speculation is slower than plain decoding."""

from __future__ import annotations

import itertools
import logging
import math
import operator
import statistics
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from time import perf_counter

from transformers import PreTrainedModel

from draftsmith.decoding.policies.base import UNSIZED, DraftPolicy, RequestSize, RoundOutcome
from draftsmith.decoding.policies.lockstep import LockstepPlan
from draftsmith.decoding.profile import CostCurve, profile_target
from draftsmith.heads.base import Draft, RoundStopFn, StopFn, TreeNodes, TreeShape, TreeStopFn

logger = logging.getLogger(__name__)

PLAIN = TreeShape.chain(0)

STEPS_TIMED = 9
"""Drafter steps whose median is a step's cost until rounds of several lengths fit it: a first
step's setting up of kernels does not stop the drafting that would time it again."""

TRUSTED_WIDER = 3
"""Rounds verifying more than one token timed before their own median sets the curve's scale
(until then every round's does): one alone may be slow for a reason that does not recur, such as
a first call's setting up of kernels for its shape."""


GAIN_ROUNDS = 32
"""Judged rounds whose expected gain over plain decoding sets what speculation is worth a token
when a request begins."""


@dataclass
class _RecentMedian:
    """Median of the last `size` values; None before the first. One slow round (a busy machine's
    hiccup, the first forward packing the weights) does not move it, so a cost it would overstate
    cannot stop the drafting that measures that cost again."""

    size: int
    value: float | None = field(default=None, init=False)
    """Set on each `add`: the planning reads it many times a drafted token."""
    _values: deque[float] = field(default_factory=deque, init=False)

    def add(self, x: float) -> None:
        self._values.append(x)
        if len(self._values) > self.size:
            self._values.popleft()
        self.value = statistics.median(self._values)


@dataclass
class _DraftCost:
    """Seconds of drafting n steps (a chain's tokens, a tree's depths), fixed + per_step * n,
    fitted by least squares on moving averages of the rounds' (n, seconds): a round's fixed part
    (catching up on the tokens just committed) is not charged to each step. Until a round is
    fitted, and where every round drafted (nearly) one length so there is no slope to fit,
    per_step is the measured time between consecutive steps (`add_step`), so the very first
    round, whose drafting also holds the drafter's reading of the prompt, already stops drafting
    where more steps cost more than they are expected to give."""

    weight: float
    _moments: list[float] = field(default_factory=lambda: [0.0] * 5)  # n, s, n*n, n*s, count
    _step: _RecentMedian = field(init=False)

    def __post_init__(self) -> None:
        self._step = _RecentMedian(STEPS_TIMED)

    def add(self, n: int, seconds: float) -> None:
        keep = 1 - self.weight
        for i, x in enumerate((n, seconds, n * n, n * seconds, 1.0)):
            self._moments[i] = keep * self._moments[i] + self.weight * x

    def add_step(self, seconds: float) -> None:
        """One drafter step's seconds: from one drafted token of a chain (or depth of a tree) to
        the next."""
        self._step.add(seconds)

    @property
    def per_step(self) -> float:
        n, s, nn, ns, count = self._moments
        if count == 0 or n == 0:
            return self._step.value or 0.0
        n, s, nn, ns = n / count, s / count, nn / count, ns / count
        spread = nn - n * n
        if spread < 0.25:  # drafts of (nearly) one length: no slope to fit
            return s / n if self._step.value is None else min(self._step.value, s / n)
        return max((ns - n * s) / spread, 0.0)

    @property
    def fixed(self) -> float:
        n, s, _, _, count = self._moments
        return 0.0 if count == 0 else max((s - self.per_step * n) / count, 0.0)


@dataclass(kw_only=True)
class CostAwarePolicy(DraftPolicy):
    """Maximise expected committed tokens per second from calibrated acceptance and measured cost.

    Planning a round (a chain): after drafting token n with acceptance a_n (calibrated when the
    artifact is, else raw top-1) the path probability is P_n = a_1 ... a_n, and

        value(n) = (1 + P_1 + ... + P_n) / (draft_fixed_s + n * draft_step_s + verify_cost(n + 1))

    is the round's expected committed tokens per second (verify_cost from `cost`, the target's
    measured curve, scaled to the rounds timed now; the drafting cost fitted on the rounds so
    far, and before any, the drafter's steps as the stop rule times them). Drafting goes on
    while some longer draft, each further token accepted with probability a_n, is expected to
    beat value(n); the draft is then cut to the prefix of best value, drafting cost spent
    (possibly to nothing: the round is a plain step). A sampled draft is cut node by node
    instead, before the first node that does not pay on what precedes it (`_while_each_pays`),
    which keeps rejection sampling exact. Nothing is drafted while even a
    chain the target would accept whole could not beat a plain step.

    A tree (`tree` set, or the default's chain with `siblings`) is planned the same way, a depth
    (one drafter step over the nodes it expands) for a chain's token: its value with n nodes
    verified is that of its n most valuable nodes (the sum of their path probabilities is the
    expected accepted length), and it grows another depth while some deeper tree is expected to
    beat the best it holds, each further depth taken to give the nodes it expands children as
    the newest depth gave its parents theirs (the chain's rule when top_k is 1). It is then cut
    to its nodes of best value, its drafting spent, and the next round's tree gives a node up to
    twice as many children, and expands up to twice as many nodes a depth, as the kept one did.

    A batch (rows decoding together, each verifying its own draft in the round's one target
    forward, `CostCurve.batch_cost`) whose rows draft in lockstep (one drafter forward a step
    for every row) is planned as one round (`LockstepPlan`): its drafting lasts as long as its
    longest row's and its verification is padded to its widest row, so every row drafts until
    no deeper round pays and greedy rows keep one common number of nodes. Rows that draft one
    after another are planned per row, as if every row drafted what this one does: a row's
    share of the round is the batch forward's cost over the rows plus its own drafting. Either
    way a plain step gives each row one token for the batch's one-token forward, so a device
    whose batched forward costs about what a one-row forward does keeps drafting at batch B, and
    one whose cost grows with the tokens verified drafts less as B grows.

    The one-token cost is measured apart: a round that verifies one token (a plain step, or a
    draft cut to nothing) costs the decoder what its plain decoding would, which need not be what
    the curve, scaled on the rounds that verified more, says (the curve's one- and two-token
    forwards may differ by more or less than it was timed at, and a speculative round does more
    besides its forward). So once `TRUSTED_WIDER` rounds that verified two tokens or more are
    timed, the curve's scale is fitted on those alone (before, on every round), and a one-token
    round sets the one-token cost's own factor over that scale, each the median of the last
    `timed_rounds`. When no round of the last `refresh_rounds` verified one token, the next is a
    plain step to measure it (at most one round in `refresh_rounds` without speculation's gain,
    nothing against plain decoding's speed); when none verified more, the next drafts and keeps
    at least one token to measure that, whether or not drafting is expected to pay.

    Falling back: each speculative round's seconds (its drafting, the scaled curve's cost of the
    tokens it verified, and the policy's learning from it) are set against what plain decoding would
    have taken for the tokens it committed (one scaled one-token cost each), and the policy falls
    back once speculation has lost, net, more than `patience` plain steps' worth since it last drew
    level (a cumulative sum that restarts at zero whenever speculation is ahead: one round's
    committed tokens vary widely, so a few rounds that lose are no verdict, and the seconds any
    drafter can lose before the verdict are bounded). The round in which the drafter first reads the
    prompt or a plain stretch is left out of that sum (its reading is a once-per-probe cost, which
    for a draft model is a prefill of its own) but not out of what the probe lost. Every round,
    plain or not, times its verification and so sets the curve's scale. Judging rounds on the scaled
    curve rather than on their own wall time keeps a busy machine's noise out of the comparison,
    noise that would otherwise let a drafter whose tokens are all cut go on drafting. The same sum
    is kept on what each round's plan expected it to commit (its trimmed draft's path probabilities,
    plus one) for what it spent, and the policy falls back too once that one passes
    `expected_patience` plain steps: a draft cut to nothing is a certain loss of its drafting, and a
    kept one an expected loss or gain, where what a round commits varies by whole tokens, so the
    expectation gives its verdict after far fewer rounds; what the rounds committed still judges a
    calibration that promises too much. Once speculation is slower, the policy decodes plainly for
    `first_backoff` rounds, then probes afresh; each probe that loses doubles the plain stretch (up
    to `max_backoff`), and a fallback after speculation paid overall starts the doubling again. A
    plain stretch runs on into the next request: a probe there would first have the drafter read the
    whole prompt, a cost plain decoding never pays.

    A request is decoded plainly from its start where the drafter's reading of its prompts (a
    prefill of its own for a draft model, timed per token on requests' first drafted rounds)
    would cost more than speculation is expected to gain over its new tokens, at the gain a
    token the plans of the last `GAIN_ROUNDS` judged rounds expected: a short request, or a
    workload where speculation barely pays, does not earn back that reading. The verdict is
    then spent, so the request after the plain stretch probes again.

    What a probe costs bounds how often it runs: the seconds its rounds lost against plain
    decoding of the tokens they committed (the drafter's catching up on the prompt and the plain
    stretch included: for a draft model that is a prefill of its own) buy a plain stretch at
    least long enough that they are `probe_budget` of its time. A drafter that is slow to catch
    up is probed rarely, so over a long run losing probes cost about that share of plain
    decoding's time at most (the first probe, before any stretch, is paid in full).
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
    _draft_cost: _DraftCost = field(init=False, repr=False)
    _lockstep_cost: _DraftCost = field(init=False, repr=False)
    """Seconds of a lockstep round's drafting by its steps (one forward for every row a step)."""
    _plan: LockstepPlan | None = field(default=None, init=False, repr=False)
    """This round's plan for every row together, where the rows draft in lockstep."""
    _lockstep_steps: int = field(default=0, init=False, repr=False)
    """Steps this lockstep round drafted."""
    _scale: _RecentMedian = field(init=False, repr=False)
    """Seconds of verification now per second of the profiled curve, on the rounds that verified
    two tokens or more."""
    _any_scale: _RecentMedian = field(init=False, repr=False)
    """The same on every round: the scale until `TRUSTED_WIDER` wider rounds are timed."""
    _wider_timed: int = field(default=0, init=False, repr=False)
    """Rounds timed that verified more than one token."""
    _one_token: _RecentMedian = field(init=False, repr=False)
    """A one-token round's seconds of verification per second of the scaled curve's."""
    _since_one_token: int = field(default=0, init=False, repr=False)
    """Rounds since the last that verified one token."""
    _since_wider: int = field(default=0, init=False, repr=False)
    """Rounds since the last that verified more than one token."""
    _budget: tuple[int, int] | None = field(default=None, init=False, repr=False)
    """The next round's (children a node, nodes expanded a depth), from what the last kept
    (`_next_budget`); None: the largest shape's."""
    _round_acceptance: list[list[float]] = field(default_factory=list, init=False, repr=False)
    """Per row of this round, in row order, the acceptance of each token its chain drafted."""
    _round_depths: list[list[int]] = field(default_factory=list, init=False, repr=False)
    """Per row of this round, in row order, a one-element list: the depths its tree grew."""
    _rows: int = field(default=1, init=False, repr=False)
    """Rows decoding together this round."""
    _drafted: int = field(default=0, init=False, repr=False)
    """Nodes drafted this round over all rows, before the trim."""
    _drafted_steps: int = field(default=0, init=False, repr=False)
    """Drafter steps this round over all rows: a chain's tokens, a tree's depths."""
    _drafted_before: bool = field(default=False, init=False, repr=False)
    """The previous round of this request drafted: the drafter had caught up, so this round's
    drafting time measures drafting alone (not the prompt or a plain stretch)."""
    _deficit_s: float = field(default=0.0, init=False, repr=False)
    """Seconds speculation has lost against plain decoding since it last drew level (the
    drafter's catching up left out)."""
    _expected_deficit_s: float = field(default=0.0, init=False, repr=False)
    """Seconds speculation is expected to have lost since it last drew level by those plans."""
    _expected: list[float | None] = field(default_factory=list, init=False, repr=False)
    """Per row of this round, in row order, the tokens its trimmed draft is expected to commit
    (None where the draft was not planned)."""
    _gains: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=GAIN_ROUNDS), init=False, repr=False
    )
    """Per judged round of the last `GAIN_ROUNDS`: seconds its plan expected to gain over plain
    decoding, and the tokens it expected to commit."""
    _reading: _RecentMedian = field(init=False, repr=False)
    """Seconds the drafter takes to read a prompt token, from requests' first drafted rounds."""
    _prompt_tokens: int = field(default=0, init=False, repr=False)
    """Tokens of this request's prompts (0: not said)."""
    _first_round: bool = field(default=True, init=False, repr=False)
    """No round of this request has been observed yet."""
    _spec_lost_s: float = field(default=0.0, init=False, repr=False)
    """Net seconds the speculative rounds of this probe (or request) lost against plain
    decoding, the drafter's catching up included."""
    _plain_left: int = field(default=0, init=False, repr=False)
    _backoff: int = field(default=0, init=False, repr=False)
    _verify_s: dict[tuple[int, int], float] = field(default_factory=dict, init=False, repr=False)
    """`round_verify_s` by (rows, n) until the next round is timed: a tree's planning asks for
    it thousands of times a round."""

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
        self._draft_cost = _DraftCost(self.smoothing)
        self._lockstep_cost = _DraftCost(self.smoothing)
        self._scale = _RecentMedian(self.timed_rounds)
        self._any_scale = _RecentMedian(self.timed_rounds)
        self._one_token = _RecentMedian(self.timed_rounds)
        self._reading = _RecentMedian(self.timed_rounds)
        self._backoff = self.first_backoff
        self.start()

    def start(self, target: PreTrainedModel | None = None, size: RequestSize = UNSIZED) -> None:
        """Open a request; decode it plainly where the drafter's reading of its prompts would
        cost more than speculation is expected to gain over its tokens (`_reading_pays`)."""
        if self.cost is None and target is not None:
            self.cost = _measure_cost(target, self.largest.max_tokens + 1)
            self._verify_s.clear()
        rows = len(size.prompt_lengths) or 1
        if self.speculating and not self._reading_pays(
            size.prompt_tokens, rows * size.max_new_tokens
        ):
            self._fall_back(
                at_least=size.max_new_tokens,
                why="reading the prompt would cost more than speculation is expected to gain",
            )
            self._gains.clear()  # the verdict is spent: the request after the stretch probes
        self._reset_speculation()
        self._budget = None
        self._drafted_before = False
        self._prompt_tokens, self._first_round = size.prompt_tokens, True

    def _reading_pays(self, prompt_tokens: int, new_tokens: int) -> bool:
        """Whether speculation is expected to gain, over `new_tokens` (every row's), more than the
        drafter's reading of `prompt_tokens` costs: each at what the last rounds measured (the
        gain their plans expected a token, the reading's seconds a token). Without both
        measured (`timed_rounds` judged rounds at least), or without the request's size, it is
        taken to pay."""
        measured = len(self._gains) >= self.timed_rounds and self._reading.value is not None
        if not (measured and prompt_tokens and new_tokens):
            return True
        gain_s = sum(g for g, _ in self._gains) / max(sum(n for _, n in self._gains), 1e-9)
        return gain_s * new_tokens > self._reading.value * prompt_tokens

    def _reset_speculation(self) -> None:
        self._deficit_s = 0.0
        self._expected_deficit_s = 0.0
        self._spec_lost_s = 0.0

    # -- planning ----------------------------------------------------------------------------

    @property
    def largest(self) -> TreeShape:
        """`tree`, or a chain of max_draft_tokens with `siblings` runners-up a token."""
        if self.tree is not None or self.siblings == 0:
            return super().largest
        width = 1 + self.siblings
        depth = self.max_draft_tokens
        return TreeShape(top_k=width, depth=depth, total_tokens=width * depth, expand=1)

    def shape(self, rows: int = 1, lockstep: bool = False) -> TreeShape:
        self._rows, self._drafted, self._drafted_steps = rows, 0, 0
        self._round_acceptance, self._round_depths, self._expected = [], [], []
        self._lockstep_steps = 0
        self._plan = None
        if lockstep:
            self._plan = LockstepPlan(
                self.largest.depth, self._lockstep_drafting_s, self.round_verify_s
            )
        if self._plain_left > 0 or self._one_token_unmeasured():
            return PLAIN
        shape = self.largest
        if not self._a_chain_can_pay() and self._since_wider < self.refresh_rounds:
            return PLAIN
        if shape.is_chain or self._budget is None:
            return shape
        # The depth is the stop rule's to choose; the width follows what the last rounds kept.
        return shape.narrowed(*self._budget)

    def _one_token_unmeasured(self) -> bool:
        """Whether this round must be a plain step to measure the one-token cost: speculative
        rounds have set the curve's scale, and none of the last `refresh_rounds` rounds (or none
        at all) verified one token."""
        return (
            self.cost is not None
            and self._wider_timed >= TRUSTED_WIDER
            and (self._one_token.value is None or self._since_one_token >= self.refresh_rounds)
        )

    def _a_chain_can_pay(self) -> bool:
        """Whether a chain the target accepts whole would beat a plain step at today's costs
        (with a curve: without one nothing is known against drafting). A tree can do no better:
        n depths commit at most n + 1 tokens, for n steps and at least n + 1 verified."""
        if self.cost is None:
            return True
        return any(
            (1 + n) / (self._drafting_s(n) + self.row_verify_s(n + 1)) > self.plain_rate()
            for n in range(1, self.largest.depth + 1)
        )

    def stop_fn(self) -> StopFn | None:
        """A row's stop rule for this round (one per row, asked for in row order)."""
        if self.cost is None or not self.largest.is_chain:
            return None
        accepted: list[float] = []
        self._round_acceptance.append(accepted)
        if self._plan is not None:
            plan, row = self._plan, self._plan.add_row()

            def record(position: int, _: dict[str, float], acceptance: float) -> bool:
                accepted.append(acceptance)
                plan.record_chain(row, acceptance)
                return False  # the round's stop rule stops every row together

            return self.token_stop_fn(record)
        fixed_s = self._row_draft_fixed_s()
        path, expected, last_token_at = 1.0, 1.0, None

        def no_longer_draft_pays(position: int, _: dict[str, float], acceptance: float) -> bool:
            nonlocal path, expected, last_token_at
            now_at = perf_counter()
            if last_token_at is not None:
                self._draft_cost.add_step(now_at - last_token_at)
            last_token_at = now_at
            step_s = self._draft_cost.per_step
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

        return self.token_stop_fn(no_longer_draft_pays)

    def tree_stop_fn(self) -> TreeStopFn | None:
        """A row's rule ending its tree's growth this round (one per row, in row order)."""
        if self.cost is None or self.largest.is_chain:
            return None
        grown = [1]
        self._round_depths.append(grown)
        if self._plan is not None:
            plan, row = self._plan, self._plan.add_row()

            def record(depth: int, nodes: TreeNodes) -> bool:
                grown[0] = depth
                plan.record_tree(row, depth, nodes)
                return False  # the round's stop rule stops every row together

            return record
        fixed_s = self._row_draft_fixed_s()
        last_depth_at = None

        def no_deeper_tree_pays(depth: int, nodes: TreeNodes) -> bool:
            nonlocal last_depth_at
            now_at = perf_counter()
            if last_depth_at is not None:
                self._draft_cost.add_step(now_at - last_depth_at)
            last_depth_at = now_at
            grown[0] = depth
            if self._a_deeper_tree_pays(nodes, depth, fixed_s):
                grown[0] = depth + 1
                return False
            return True

        return no_deeper_tree_pays

    def round_stop_fn(self) -> RoundStopFn | None:
        """The rule ending a lockstep round's drafting for every row together (`LockstepPlan`),
        where the rows draft in lockstep."""
        if self.cost is None or self._plan is None:
            return None
        plan, last_step_at = self._plan, None

        def no_deeper_round_pays(steps: int) -> bool:
            nonlocal last_step_at
            now_at = perf_counter()
            if last_step_at is not None:
                self._lockstep_cost.add_step(now_at - last_step_at)
            last_step_at = now_at
            self._lockstep_steps = steps
            return not plan.deeper_pays(steps)

        return no_deeper_round_pays

    def _a_deeper_tree_pays(self, nodes: TreeNodes, depth: int, fixed_s: float) -> bool:
        """Whether growing the tree beyond `depth` depths is expected to beat the best value of
        the nodes it holds, each further depth expanding the most valuable nodes of the one before
        (the shape's width) with children in the proportions the newest depth's parents gave
        theirs."""
        shape, step_s = self.largest, self._draft_cost.per_step
        narrowed = shape if self._budget is None else shape.narrowed(*self._budget)
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
        # The proposed tree keeps at most the shape's most valuable nodes.
        _, now = self._best(grown[: shape.max_tokens], fixed_s + depth * step_s)
        for deeper in range(depth + 1, shape.depth + 1):
            frontier = sorted((f * r for f in frontier for r in by_rank), reverse=True)
            grown = sorted(grown + frontier, reverse=True)[: shape.max_tokens]
            frontier = frontier[:width]
            if self._best(grown, fixed_s + deeper * step_s)[1] > now:
                return True
        return False

    def trim_round(self, drafts: Sequence[Draft]) -> list[Draft]:
        """Greedy drafts of a lockstep round each keep the k most valuable nodes, k the round's
        best (`LockstepPlan.best`); otherwise each row's draft is trimmed alone (sampled ones
        node by node, which keeps them exact)."""
        chain = self.largest.is_chain
        if (
            self._plan is None
            or self.cost is None
            or any(d.probs is not None or (not chain and d.values is None) for d in drafts)
        ):
            return [self.trim(draft) for draft in drafts]
        values = []
        for draft in drafts:  # rows' records are in the order of the drafts
            self._drafted += len(draft)
            if chain:
                accepted = self._round_acceptance.pop(0)[: len(draft)]
                values.append(list(itertools.accumulate(accepted, operator.mul)))
            else:
                self._round_depths.pop(0)
                values.append(draft.values.sort(descending=True).values.tolist())
        size = self._measuring(self._plan.best(values, self._lockstep_steps)[0])
        kept = []
        for draft, row_values in zip(drafts, values, strict=True):
            k = min(size, len(draft))
            self._expected.append(1.0 + sum(row_values[:k]))
            kept.append(draft.subtree(range(k)) if chain else draft.pruned(k))
        if not chain:
            self._budget = self._next_budget(kept)
        return kept

    def trim(self, draft: Draft) -> Draft:
        self._drafted += len(draft)
        chain = self.largest.is_chain
        if chain:
            steps = len(draft)
        elif self._round_depths:  # rows are trimmed in the order their stop rules were made
            steps = self._round_depths.pop(0)[0] if len(draft) else 0
        else:
            steps = int(draft.depths.max()) if len(draft) else 0
        self._drafted_steps += steps
        if self.cost is None or len(draft) == 0:
            self._expected.append(1.0 if len(draft) == 0 else None)
            return draft
        if not chain:
            return self._trim_tree(draft, steps)
        # Rows are trimmed in the order their stop rules were made.
        accepted = self._round_acceptance.pop(0) if self._round_acceptance else []
        if len(accepted) != len(draft):  # a drafter that ignored the stop rule
            self._expected.append(None)
            return draft
        paths = list(itertools.accumulate(accepted, operator.mul))
        if draft.probs is not None:
            size = self._while_each_pays(paths, range(1, len(paths) + 1))
        else:
            size = self._best(paths, self._drafting_s(len(paths)))[0]
        return draft.subtree(range(self._kept(size, paths)))

    def _kept(self, size: int, values: list[float]) -> int:
        """How many of a draft's nodes, in the order of their `values` (path probabilities), the
        target verifies: `size`, unless a node is kept for `_measuring`; the tokens they are
        expected to commit are noted for the verdict on speculation."""
        size = self._measuring(size)
        self._expected.append(1.0 + sum(values[:size]))
        return size

    def _measuring(self, size: int) -> int:
        """size, or one node where a draft cut to nothing would leave the cost of verifying more
        than one token unmeasured for `refresh_rounds` rounds (a scale it overstates would
        otherwise cut every draft and never be timed again). Which node is kept does not depend
        on its token, so sampling stays exact."""
        return max(size, 1) if self._since_wider >= self.refresh_rounds else size

    def _trim_tree(self, draft: Draft, depths: int) -> Draft:
        if draft.values is None:
            self._expected.append(None)
            return draft
        if draft.probs is not None:
            kept = draft.subtree(self._sampled_nodes_that_pay(draft))
            self._expected.append(1.0 + float(kept.values.sum()))
        else:
            # A node's value is its path's probability of acceptance, so the n most valuable
            # nodes (parents are worth at least their children) are expected to give their sum.
            values = draft.values.sort(descending=True).values.tolist()
            size = self._kept(self._best(values, self._drafting_s(depths))[0], values)
            kept = draft.pruned(size)
        self._budget = self._next_budget([kept])
        return kept

    def _next_budget(self, kept: Sequence[Draft]) -> tuple[int, int]:
        """The next round's (children a node, nodes expanded a depth): twice the most that one
        node, and one depth, of this round's kept trees have (the root: one expanded node).
        Apart, since the nodes worth expanding and the children worth keeping differ: a tree
        whose kept depths hold three children of one node is grown next with six children a
        node but two nodes expanded a depth, not six."""
        children, expanded = 1, 1
        for draft in kept:
            parents, depths = draft.parents.tolist(), draft.depths.tolist()
            counts = Counter(parents)
            children = max([children, *counts.values()])
            expanded = max([expanded, *Counter(depths[p] for p in counts if p >= 0).values()])
        top_k = min(2 * children, self.largest.top_k)
        return top_k, min(2 * expanded, top_k)

    def _sampled_nodes_that_pay(self, draft: Draft) -> list[int]:
        """The nodes of a sampled tree to verify, ascending (at least the first judged where
        `_measuring` asks for one), judged depth by depth, each depth's most valuable first
        (ties: the earlier node, so a node's elder siblings go first), each kept where its
        verification raises this round's committed tokens per second on the nodes kept before
        it, its drafting spent; one that does not cuts its younger siblings (the verifier tries
        siblings in the order drawn) and every node under it.

        As `_while_each_pays` for a chain, whether a node is verified depends on the values of
        the nodes judged before it and its own, a property of its parent's distribution and its
        rank, never on its token or on anything drafted after it: sampling stays exact."""
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
            if not self._verifying_pays(values[node], accepted, len(kept), depths[node]):
                closed.add(parent)
                continue
            kept.add(node)
            accepted += values[node]
        return sorted(kept) if kept or not order else order[: self._measuring(0)]

    def _drafting_s(self, steps: int) -> float:
        """A row's expected seconds of drafting `steps` steps this round (in lockstep, its share
        of every row drafting them)."""
        if self._plan is not None:
            return self._lockstep_drafting_s(steps) / self._rows
        return self._row_draft_fixed_s() + steps * self._draft_cost.per_step

    def _lockstep_drafting_s(self, steps: int) -> float:
        """Expected seconds of a lockstep round drafting `steps` steps for every row."""
        return self._lockstep_cost.fixed + steps * self._lockstep_cost.per_step

    def _while_each_pays(self, values: list[float], steps: Sequence[int]) -> int:
        """How many of a sampled draft's nodes to verify, in the order given (each after its
        parent): the nodes before the first whose verification would lower this round's
        committed tokens per second, the drafting of its `steps` spent.

        Sampling stays exact only if whether a node is verified does not depend on its own token
        or on anything drafted after it (the tokens a node's children are drawn from depend on
        it); a node's value depends on neither, and this cut judges each node on the values of
        the nodes before it and its own. The best size over the whole draft, as greedy drafts
        are cut, would keep a token for what its continuation promises."""
        accepted = 0.0
        for n, (value, step) in enumerate(zip(values, steps, strict=True)):
            if not self._verifying_pays(value, accepted, n, step):
                return n
            accepted += value
        return len(values)

    def _verifying_pays(self, value: float, accepted: float, kept: int, steps: int) -> bool:
        """Whether verifying one more node of `value` raises this round's committed tokens per
        second over the `kept` nodes verified so far, expected to give `accepted` tokens, the
        drafting of `steps` steps spent."""
        spent_s = self._drafting_s(steps)
        without = (1.0 + accepted) / (spent_s + self.row_verify_s(kept + 1))
        return (1.0 + accepted + value) / (spent_s + self.row_verify_s(kept + 2)) > without

    def _best(self, values: list[float], spent_s: float) -> tuple[int, float]:
        """The number n of draft nodes to verify that maximises this round's committed tokens
        per second, and that rate, `spent_s` of drafting spent; values are the nodes' path
        probabilities, most valuable first (the n first are expected to give their sum)."""
        best, best_value, accepted = 0, 1.0 / (spent_s + self.row_verify_s(1)), 0.0
        for n, value in enumerate(values, start=1):
            accepted += value
            rate = (1.0 + accepted) / (spent_s + self.row_verify_s(n + 1))
            if rate > best_value:
                best, best_value = n, rate
        return best, best_value

    def _row_draft_fixed_s(self) -> float:
        """A row's share of a round's fixed drafting cost (the drafting cost is fitted on the
        round's nodes over all rows, so its per-token part is already a row's)."""
        return self._draft_cost.fixed / self._rows

    # -- learning ----------------------------------------------------------------------------

    def observe(self, outcome: RoundOutcome) -> None:
        self.observe_round([outcome])

    def observe_round(self, outcomes: Sequence[RoundOutcome]) -> None:
        started = perf_counter()
        for outcome in outcomes:
            super().observe(outcome)
        # Learning from a drafted round (the online recalibration reads every judged node's
        # signals) is a cost of speculation too, outside the round the decoder timed.
        learning_s = perf_counter() - started
        rows = self._rows = len(outcomes)
        planned, self._expected = self._expected, []
        # One forward verified every row's block, padded to the widest.
        width = max(len(outcome.draft) for outcome in outcomes) + 1
        draft_s, round_s = outcomes[0].draft_s, outcomes[0].round_s
        self._time_verification(max(round_s - draft_s, 1e-9), width)
        first_of_request, self._first_round = self._first_round, False
        if self._plain_left > 0:
            self._plain_left -= 1
            self._drafted_before = False
            return
        catching_up = self._drafted > 0 and not self._drafted_before
        if self._drafted and not catching_up:
            if self._plan is not None:
                self._lockstep_cost.add(self._lockstep_steps, draft_s)
            else:
                self._draft_cost.add(self._drafted_steps, draft_s)
        self._drafted_before = self._drafted > 0
        # Plain decoding gives every row a token per one-token forward of the batch.
        plain_round_s = self.round_verify_s(1, rows)
        committed = sum(outcome.committed for outcome in outcomes)
        spent_s = draft_s + learning_s + self.round_verify_s(width, rows)
        lost_s = spent_s - committed / rows * plain_round_s
        self._spec_lost_s += lost_s
        if catching_up:
            # The drafter read the prompt or a plain stretch first: a cost paid once per request
            # or probe (counted in what the probe lost), not evidence of how speculation goes.
            if first_of_request and self._prompt_tokens:
                drafting_s = (
                    self._lockstep_drafting_s(self._lockstep_steps)
                    if self._plan is not None
                    else self._draft_cost.fixed + self._drafted_steps * self._draft_cost.per_step
                )
                self._reading.add(max(draft_s - drafting_s, 0.0) / self._prompt_tokens)
            return
        # A row whose draft was not planned (its drafter ignored the stop rule) counts as what
        # it committed.
        expected = sum(
            outcome.committed if e is None else e
            for outcome, e in itertools.zip_longest(outcomes, planned[: len(outcomes)])
        )
        expected_lost_s = spent_s - expected / rows * plain_round_s
        self._gains.append((-expected_lost_s, expected))
        self._deficit_s = max(self._deficit_s + lost_s, 0.0)
        self._expected_deficit_s = max(self._expected_deficit_s + expected_lost_s, 0.0)
        if (
            self._deficit_s <= self.patience * plain_round_s
            and self._expected_deficit_s <= self.expected_patience * plain_round_s
        ):
            return
        self._fall_back()

    def _fall_back(
        self, at_least: int = 0, why: str = "speculation slower than plain decoding"
    ) -> None:
        """Speculation is slower than plain decoding: decode plainly for a while (at least
        `at_least` rounds), then probe afresh; logged at INFO with `why`."""
        if self._spec_lost_s <= 0:  # it paid until now: the workload changed, not the drafter
            self._backoff = self.first_backoff
        plain_round_s = self.round_verify_s(1)
        paid_for = math.ceil(self._spec_lost_s / (self.probe_budget * plain_round_s))
        self._plain_left = max(self._backoff, paid_for, at_least)
        logger.info(
            "%s (the probe lost %.2f s net): %d plain rounds",
            why,
            self._spec_lost_s,
            self._plain_left,
        )
        self._backoff = min(2 * self._backoff, self.max_backoff)
        self._reset_speculation()

    def _time_verification(self, seconds: float, width: int) -> None:
        """Learn from a round whose verification (all but its drafting) took `seconds` for
        `width` tokens a row: the curve's scale from two tokens or more, the one-token factor
        over it from one (every round's scale too, the scale until `TRUSTED_WIDER` wider
        rounds are timed)."""
        self._since_one_token += 1
        self._since_wider += 1
        self._verify_s.clear()
        scale = seconds / self._curve(self._rows, width)
        self._any_scale.add(scale)
        if width == 1:
            self._since_one_token = 0
            if self._wider_timed >= TRUSTED_WIDER:
                self._one_token.add(scale / self._scale.value)
            return
        self._since_wider = 0
        self._scale.add(scale)
        self._wider_timed += 1

    def round_verify_s(self, n: int, rows: int | None = None) -> float:
        """Seconds of one target forward verifying n tokens in each of `rows` rows (default this
        round's): the profiled curve's shape, scaled to the rounds timed now (the machine may be
        busier, or run other threads, than when it was profiled), and one token's by its own
        measured factor."""
        key = (self._rows if rows is None else rows, n)
        if key not in self._verify_s:
            if self._wider_timed >= TRUSTED_WIDER:
                scale = self._scale.value
                if n == 1 and self._one_token.value is not None:
                    scale *= self._one_token.value
            else:
                scale = 1.0 if self._any_scale.value is None else self._any_scale.value
            self._verify_s[key] = self._curve(*key) * scale
        return self._verify_s[key]

    def row_verify_s(self, n: int) -> float:
        """A row's share of a round in which every row verifies n tokens."""
        return self.round_verify_s(n) / self._rows

    def _curve(self, rows: int, n: int) -> float:
        """The profiled cost of verifying n tokens in each of `rows` rows; one unit each without
        a curve."""
        return 1.0 if self.cost is None else self.cost.batch_cost(rows, n)

    def plain_rate(self) -> float:
        """A row's tokens per second of plain decoding: one over its share of the batch's scaled
        one-token cost."""
        return 1.0 / self.row_verify_s(1)

    @property
    def speculating(self) -> bool:
        """False while the policy decodes plainly after speculation lost."""
        return self._plain_left == 0


def _measure_cost(target: PreTrainedModel, max_tokens: int) -> CostCurve:
    positions = getattr(target.config.get_text_config(), "max_position_embeddings", None) or 4096
    context = max(min(256, positions - max_tokens), 1)
    logger.info("measuring the target's verification cost for 1..%d tokens (once)", max_tokens)
    return profile_target(target, max_tokens=max_tokens, context=context, repeats=3)
