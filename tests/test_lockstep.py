"""A batch whose rows draft in lockstep is planned as one round (`LockstepPlan`): every row drafts
until no deeper round pays, and greedy rows keep one common number of nodes; output stays the
target's, greedy and sampled."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from conftest import Clock, MarkovTarget, greedy_reference, perturbed_copy
from test_sampling_distribution import _sequence_distribution, _sequence_fits

from draftsmith import SpeculativeDecoder
from draftsmith.core.sampling import SamplingParams
from draftsmith.decoding import CostAwarePolicy
from draftsmith.decoding.policies.lockstep import LockstepPlan
from draftsmith.decoding.profile import CostCurve
from draftsmith.heads import Draft, Drafter, DraftModelDrafter, TreeShape
from draftsmith.heads.base import DraftRequest, RowDrafters
from draftsmith.heads.draft_model import BatchedDraftModel
from draftsmith.heads.state import DraftBuilder
from draftsmith.heads.tree import SiblingChain


def _plan(drafting_s=lambda n: 0.0, verify_s=lambda n: 1.0 + 0.5 * (n - 1), depth=4):
    return LockstepPlan(depth, drafting_s, verify_s)


def test_the_best_width_is_the_one_of_best_rate_over_every_row():
    plan = _plan()
    rng = random.Random(0)
    for _ in range(50):
        values = [
            sorted((rng.random() for _ in range(rng.randint(0, 5))), reverse=True) for _ in range(3)
        ]
        k, rate = plan.best(values, steps=2)

        rates = [
            (3 + sum(sum(v[:j]) for v in values)) / plan.verify_s(j + 1)
            for j in range(max(len(v) for v in values) + 1)
        ]
        assert rate == pytest.approx(max(rates))
        assert rates[k] == pytest.approx(rate)


def test_drafting_goes_on_while_a_deeper_round_is_expected_to_pay():
    # Verifying more costs little, drafting a step costs a tenth of a verification.
    cheap = _plan(drafting_s=lambda n: 0.1 * n, verify_s=lambda n: 1.0 + 0.01 * n)
    sure, unsure = cheap.add_row(), cheap.add_row()
    cheap.record_chain(sure, 0.95)
    cheap.record_chain(unsure, 0.05)
    assert cheap.deeper_pays(1)  # the sure row's next tokens pay for both rows' step
    # The same rows when a step costs as much as a verification: not worth another step.
    dear = _plan(drafting_s=lambda n: 1.0 * n, verify_s=lambda n: 1.0 + 0.01 * n)
    for acceptance in (0.95, 0.05):
        dear.record_chain(dear.add_row(), acceptance)
    assert not dear.deeper_pays(1)


def test_a_row_whose_draft_ended_grows_no_further():
    plan = _plan(drafting_s=lambda n: 0.1 * n, verify_s=lambda n: 1.0 + 0.01 * n)
    done, going = plan.add_row(), plan.add_row()
    plan.record_chain(done, 0.95)  # its draft was full after one token
    plan.record_chain(going, 0.01)
    plan.record_chain(going, 0.01)
    assert done.projected(1) and not plan.deeper_pays(2)
    assert done.values == [0.95] and going.values == [0.01, 0.01 * 0.01]


def test_a_sibling_chain_grows_as_its_newest_depth_did():
    plan = _plan()
    row = plan.add_row()
    # The root's children 0.6 / 0.3, then node 0's children 0.5 / 0.1 (paths 0.3 / 0.06).
    nodes = SimpleNamespace(values=[0.6, 0.3], parents=[-1, -1], depths=[1, 1])
    plan.record_tree(row, 1, nodes)
    assert row.ratios == [0.6, 0.3] and row.frontier == 0.6
    nodes = SimpleNamespace(
        values=[0.6, 0.3, 0.3, 0.06], parents=[-1, -1, 0, 0], depths=[1, 1, 2, 2]
    )
    plan.record_tree(row, 2, nodes)
    assert row.depth == 2 and row.frontier == 0.3
    assert row.ratios == pytest.approx([0.5, 0.1])
    assert row.projected(2) == pytest.approx([0.15, 0.03, 0.075, 0.015])


def test_a_round_stop_ends_every_rows_lockstep_drafting(llama):
    draft = BatchedDraftModel(perturbed_copy(llama, scale=0.05), rows=3)
    for row, prompt in enumerate([[5, 17, 42], [9], [1, 2, 3, 4]]):
        draft.start(row, torch.tensor(prompt))
    shapes = [TreeShape.chain(5), TreeShape(top_k=3, depth=5, expand=1)]
    for shape in shapes:
        requests = [DraftRequest(shape, SamplingParams()) for _ in range(3)]
        seen: list[int] = []

        def after_two(steps: int, seen: list[int] = seen) -> bool:
            seen.append(steps)
            return steps == 2

        drafts = draft.propose([0, 1, 2], requests, after_two)
        assert seen == [1, 2]
        assert [int(d.depths.max()) for d in drafts] == [2, 2, 2]
        full = draft.propose([0, 1, 2], requests)
        assert [int(d.depths.max()) for d in full] == [5, 5, 5]


def _curve(verify_s: list[float]) -> CostCurve:
    return CostCurve(tokens=list(range(1, len(verify_s) + 1)), verify_s=verify_s, context=8)


def _takes(clock: Clock, seconds: float):
    """A forward pre-hook that moves `clock` on by `seconds`: what the module's forward costs
    on the clock the decoder and its policy read."""

    def advance(*_) -> None:
        clock.now += seconds

    return advance


class _RecordingWidths(CostAwarePolicy):
    """Cost-aware, noting each round's draft sizes before and after its trim."""

    def __post_init__(self) -> None:
        self.widths: list[tuple[list[int], list[int]]] = []
        super().__post_init__()

    def trim_round(self, drafts):
        kept = super().trim_round(drafts)
        self.widths.append(([len(d) for d in drafts], [len(d) for d in kept]))
        return kept


def test_greedy_rows_drafted_in_lockstep_keep_one_width_and_the_targets_tokens(llama):
    prompts = [[5, 17, 42], [9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [100, 101]]
    references = [greedy_reference(llama, torch.tensor(p), 24) for p in prompts]
    # A target far slower than its drafter (as a real pair is), whose verification grows dear
    # with the tokens, so rounds draft and keep fewer nodes than they draft.
    curve = _curve([1e-3 * (1 + 0.3 * n) for n in range(10)])
    draft = perturbed_copy(llama, scale=0.05)  # before the hook, which a copy would keep
    clock = Clock(0.0)  # moved on only by the forwards
    draft.register_forward_pre_hook(_takes(clock, 0.0005))
    slow = llama.register_forward_pre_hook(_takes(clock, 0.004))
    try:
        for siblings in (0, 2):
            policy = _RecordingWidths(siblings=siblings, cost=curve, clock=clock)
            decoder = SpeculativeDecoder(
                llama, DraftModelDrafter(draft, True), policy=policy, clock=clock
            )
            assert isinstance(decoder._row_drafters(len(prompts)), BatchedDraftModel)
            batch = decoder.generate_batch(prompts, max_new_tokens=24)
            assert [result.tokens for result in batch] == references
            drafted = [(before, after) for before, after in policy.widths if any(before)]
            assert drafted
            for before, after in drafted:  # one k for every row: each keeps min(k, its draft)
                assert any(after == [min(k, b) for b in before] for k in range(max(before) + 1))
            assert any(after != before for before, after in drafted)
    finally:
        slow.remove()


class _LockstepTable(RowDrafters):
    """Rows drafting a hand-written table of per-position logits (k, V) in lockstep, as a draft
    model steps its rows' chains: a step for every row, until the round's stop rule ends them."""

    lockstep = True

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__([])
        self.logits = logits

    def start(self, row, prompt_ids, target_features=None) -> None:
        pass

    def commit(self, row, tokens, target_features=None) -> None:
        pass

    def propose(self, rows, requests, round_stop=None) -> list[Draft]:
        growers = [
            (DraftBuilder(q) if q.shape.is_chain else SiblingChain(q))
            if q.shape.max_tokens
            else None
            for q in requests
        ]
        going = [g for g in growers if g is not None]
        for step in itertools.count(1):
            going = [g for g in going if not g.done]
            if not going:
                break
            for grower in going:
                grower.add(self.logits[step - 1])
            if round_stop is not None and round_stop(step):
                break
        return [Draft.empty() if g is None else g.draft() for g in growers]


class _LockstepTableDrafter(Drafter):
    def __init__(self, logits: torch.Tensor) -> None:
        self.logits, self.vocab_size = logits, logits.shape[-1]

    def start(self, prompt_ids, target_features=None) -> None:
        pass

    def draft(self, request) -> Draft:
        raise AssertionError("a batch drafts in lockstep")

    def commit(self, tokens, target_features=None) -> None:
        pass

    def chain_batch(self, rows: int) -> RowDrafters:
        return _LockstepTable(self.logits)


def test_rows_drafted_in_lockstep_sample_the_targets_distribution():
    """Cost-aware sizing of lockstep rounds (the round's stop rule reads every row's values)
    keeps each row's output on the target's distribution: three prompts, each five times in a
    batch of fifteen, 300 batches, chains and sibling chains."""
    params = SamplingParams(temperature=1.0)
    vocab, calls, copies, length = 4, 300, 5, 3
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(1)) * 1.5
    drafter = _LockstepTableDrafter(
        torch.randn(4, vocab, generator=torch.Generator().manual_seed(2)) * 2
    )
    prompts = [[0], [3, 1], [2, 0, 2]]
    exact = [_sequence_distribution(table, params, p[-1], length) for p in prompts]
    for siblings in (0, 2):
        clock = Clock(0.0)  # moved on only by the target's forwards: drafting costs nothing
        policy = CostAwarePolicy(
            max_draft_tokens=3,
            siblings=siblings,
            cost=_curve([1.0, 1.3, 1.6, 1.9, 2.2] * 2),
            clock=clock,
        )
        target = MarkovTarget(table)
        # Verifying must cost more than drafting for the policy to draft at all.
        target.register_forward_pre_hook(_takes(clock, 0.003))
        decoder = SpeculativeDecoder(target, drafter, policy=policy, clock=clock)
        counts = [Counter() for _ in prompts]
        drafted, accepted = Counter(), 0
        for call in range(calls):
            batch = decoder.generate_batch(
                prompts * copies, length, temperature=1.0, seed=len(prompts) * copies * call
            )
            for row, result in enumerate(batch):
                counts[row % len(prompts)][tuple(result.tokens)] += 1
                drafted[result.stats.drafted] += 1
                accepted += result.stats.accepted
        assert 0 < accepted < sum(n * c for n, c in drafted.items())
        assert len(drafted) > 2  # rounds drafted several sizes
        n = calls * copies
        for row in range(len(prompts)):
            assert _sequence_fits(counts[row], exact[row], n)
        assert not _sequence_fits(counts[0], exact[1], n)  # negative control
