"""Draft policies: each policy's stop rule and sizing, the cost-aware fall-back to plain decoding,
and greedy identity whatever a policy decides."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import Clock, greedy_reference, tiny_model

from draftsmith.core.signals import confidence_signals
from draftsmith.decoding import (
    POLICIES,
    CostAwarePolicy,
    SpeculativeDecoder,
    ThresholdPolicy,
    build_policy,
)
from draftsmith.decoding.policies import (
    UNSIZED,
    AdaEDLPolicy,
    ConfidenceModulatedPolicy,
    RequestSize,
    RoundOutcome,
    SpecDecPlusPlusPolicy,
    cost_model,
)
from draftsmith.decoding.profile import CostCurve
from draftsmith.heads import Draft, DraftModelDrafter, TreeShape, build_head
from draftsmith.heads.base import raw_acceptance
from draftsmith.heads.tree import DynamicTree


class ConstantCalibrator:
    """Claims every drafted token is accepted with probability `p`."""

    def __init__(self, p: float) -> None:
        self.p = p
        self.seen_positions: list[float] = []

    def predict_signals(self, signals):
        self.seen_positions.extend(signals["position"].tolist())
        return torch.full_like(signals["top1_prob"], self.p)


def _curve(verify_s: list[float]) -> CostCurve:
    return CostCurve(tokens=list(range(1, len(verify_s) + 1)), verify_s=verify_s, context=8)


def _decode(llama, policy, max_new: int = 21, drafter=None):
    """Greedy decoding checked against the target's own; a round takes the decoder 0.01 s a
    clock reading, so what a cost-aware policy on its own clock decides is the same every run."""
    prompt = torch.tensor([2, 4, 6])
    drafter = drafter or DraftModelDrafter(llama)
    decoder = SpeculativeDecoder(llama, drafter, policy=policy, clock=Clock(0.01))
    result = decoder.generate(prompt, max_new)
    assert result.tokens == greedy_reference(llama, prompt, max_new)
    return result.stats


def _stop_length(policy, logits: torch.Tensor, limit: int = 8) -> int:
    """Tokens a chain drafts under policy's stop rule when every draft distribution is logits."""
    stop = policy.stop_fn()
    for position in range(limit):
        if stop is not None and stop(position, logits, False):
            return position + 1
    return limit


# -- threshold -----------------------------------------------------------------------------------


def test_calibrated_confidence_sets_the_draft_length(llama):
    # path after j tokens is 0.6**j: 0.6, 0.36, 0.216 -> the third token falls below 0.3.
    calibrator = ConstantCalibrator(0.6)
    policy = ThresholdPolicy(
        max_draft_tokens=6, min_path_confidence=0.3, acceptance=calibrator, recalibrate=False
    )
    stats = _decode(llama, policy)
    assert len(stats.drafted_by_position) == 3
    assert calibrator.seen_positions[:3] == [0.0, 1.0, 2.0]


def test_confident_drafter_drafts_to_the_maximum(llama):
    policy = ThresholdPolicy(
        max_draft_tokens=6, acceptance=ConstantCalibrator(0.99), recalibrate=False
    )
    assert len(_decode(llama, policy).drafted_by_position) == 6


def test_without_threshold_the_calibrator_is_not_consulted(llama):
    calibrator = ConstantCalibrator(0.1)
    _decode(
        llama,
        ThresholdPolicy(
            max_draft_tokens=6, min_path_confidence=0.0, acceptance=calibrator, recalibrate=False
        ),
    )
    assert calibrator.seen_positions == []


# -- specdec++, adaedl, cm-asd -------------------------------------------------------------------


def test_specdec_stops_once_a_rejection_is_more_likely_than_the_threshold():
    # survival 0.8 ** n: 0.8, 0.64, 0.512, 0.41 -> P(some rejected) passes 0.5 at the 4th token.
    policy = SpecDecPlusPlusPolicy(
        rejection_threshold=0.5, acceptance=ConstantCalibrator(0.8), recalibrate=False
    )
    assert _stop_length(policy, torch.zeros(1, 5)) == 4
    loose = SpecDecPlusPlusPolicy(
        rejection_threshold=0.9, acceptance=ConstantCalibrator(0.8), recalibrate=False
    )
    assert _stop_length(loose, torch.zeros(1, 5)) == 11 - 3  # 0.8**11 < 0.1: capped at 8


def test_adaedl_stops_on_uncertain_drafts_and_tightens_when_drafts_are_rejected():
    confident, uncertain = torch.tensor([[20.0, 0.0, 0.0, 0.0]]), torch.zeros(1, 4)
    policy = AdaEDLPolicy()
    assert _stop_length(policy, confident) == 8
    assert _stop_length(policy, uncertain) == 1  # 1 - sqrt(0.5 * log 4) < 0.3
    before = policy.threshold
    rejected = RoundOutcome(Draft(tokens=torch.arange(4)), [], draft_s=0.0, round_s=1.0)
    for _ in range(5):
        policy.observe(rejected)
    assert policy.threshold > before
    policy.start()
    assert policy.threshold == before


def test_cm_asd_drafts_long_when_confident_and_short_when_not():
    policy = ConfidenceModulatedPolicy(max_draft_tokens=8, min_draft_tokens=2)
    assert _stop_length(policy, torch.tensor([[30.0, 0.0, 0.0, 0.0]])) == 8
    assert _stop_length(policy, torch.zeros(1, 4)) == 2
    # Half confident (margin ~0.5, entropy ~half the maximum): about half way.
    middle = _stop_length(policy, torch.tensor([[1.6, 0.0, 0.0, 0.0]]))
    assert 2 < middle < 8


# -- cost-aware ----------------------------------------------------------------------------------


def test_cost_aware_drafts_long_when_verification_is_flat_and_acceptance_high(llama):
    policy = CostAwarePolicy(
        clock=Clock(0.001),  # a drafter step: a tenth of a verification (`_decode`)
        siblings=0,
        max_draft_tokens=6,
        cost=_curve([1.0] * 8),
        acceptance=ConstantCalibrator(0.9),
        recalibrate=False,
    )
    assert len(_decode(llama, policy).drafted_by_position) == 6


def test_cost_aware_drafts_nothing_when_each_token_costs_a_full_forward(llama):
    # Verifying n tokens costs n forwards: no acceptance below 1 makes a draft pay.
    policy = CostAwarePolicy(
        clock=Clock(0.001),  # a drafter step: a tenth of a verification (`_decode`)
        siblings=0,
        max_draft_tokens=6,
        cost=_curve([float(n) for n in range(1, 9)]),
        acceptance=ConstantCalibrator(0.7),
        recalibrate=False,
    )
    stats = _decode(llama, policy)
    assert stats.drafted == 0 and stats.target_forwards == 21


def test_cost_aware_stops_where_the_curve_steps_up(llama):
    # Up to 4 tokens cost one forward, beyond that each costs a full forward.
    policy = CostAwarePolicy(
        clock=Clock(0.001),  # a drafter step: a tenth of a verification (`_decode`)
        siblings=0,
        max_draft_tokens=6,
        cost=_curve([1.0, 1.0, 1.0, 1.0, 2.0, 3.0, 4.0, 5.0]),
        acceptance=ConstantCalibrator(0.8),
        recalibrate=False,
    )
    assert len(_decode(llama, policy).drafted_by_position) == 3


@pytest.mark.parametrize(("step_s", "drafted"), [(0.0, 8), (0.5, 3)])
def test_the_first_round_stops_once_a_drafter_step_costs_more_than_it_adds(step_s, drafted):
    """No round has been timed yet, so the stop rule times the drafter's steps itself: at half a
    verification a step, with 0.9 acceptance, a 3-token chain is worth most (E / (0.5 n + 1))."""
    policy = CostAwarePolicy(
        clock=Clock(step_s),
        siblings=0,
        cost=_curve([1.0] * 10),
        acceptance=ConstantCalibrator(0.9),
        recalibrate=False,
    )
    assert _stop_length(policy, torch.zeros(1, 16)) == drafted


def test_each_rows_chain_is_cut_on_its_own_acceptance():
    """Two rows' chains at a batch: the confident one keeps a token, the unsure one none (both
    stop rules were made before either row drafted)."""
    cost = CostCurve(tokens=[1, 2, 4, 6, 8], verify_s=[1.0, 1.0, 1.2, 4.0, 6.0], context=8)
    # recalibrate=False: the raw top-1 probability.
    policy = CostAwarePolicy(clock=Clock(0.0), siblings=0, cost=cost, recalibrate=False)
    policy.shape(rows=2)
    confident, unsure = torch.full((1, 1000), -20.0), torch.zeros(1, 1000)
    confident[0, 0] = 0.0
    stops = [policy.stop_fn(), policy.stop_fn()]
    for stop, logits in zip(stops, [confident, unsure], strict=True):
        for position in range(3):
            stop(position, logits, False)
    kept = [len(policy.trim(Draft(tokens=torch.arange(3)))) for _ in range(2)]
    assert kept == [1, 0]


# Verifying one drafted token costs twice a plain step, two cost 2.1x: at acceptance 0.9 the pair
# pays (2.71 tokens for 2.1 steps), the first token alone does not (1.9 for 2).
_PAIR_PAYS = [1.0, 2.0, 2.1, 2.2]


@pytest.mark.parametrize(("sampled", "kept"), [(False, 2), (True, 0)])
def test_a_sampled_chain_is_not_kept_for_what_its_later_tokens_promise(sampled, kept):
    """A greedy chain keeps both tokens. A sampled one keeps neither: the second token's
    acceptance comes from the distribution drawn after the first token, so keeping the first for
    it would make the first token's fate depend on its own draw, and the output would no longer
    follow the target's distribution."""
    # recalibrate=False: the raw top-1 probability.
    policy = CostAwarePolicy(
        clock=Clock(0.0), siblings=0, cost=_curve(_PAIR_PAYS), recalibrate=False
    )
    policy.shape()
    stop = policy.stop_fn()
    q = torch.tensor([0.9, 0.1])
    for position in range(2):
        stop(position, q.log(), False)
    draft = Draft(
        tokens=torch.zeros(2, dtype=torch.long), probs=q.expand(2, -1) if sampled else None
    )
    assert len(policy.trim(draft)) == kept


@pytest.mark.parametrize(("sampled", "kept"), [(False, 2), (True, 0)])
def test_a_sampled_tree_is_cut_node_by_node_on_what_precedes_each(sampled, kept):
    """The tree form of the chain case above: a node of depth 2 cannot keep its parent."""
    policy = CostAwarePolicy(tree=TreeShape(top_k=2, depth=2), cost=_curve(_PAIR_PAYS))
    policy.shape()
    q = torch.tensor([0.9, 0.1])
    draft = Draft(
        tokens=torch.tensor([0, 0]),
        parents=torch.tensor([-1, 0]),
        values=torch.tensor([0.9, 0.81]),
        probs=q.expand(2, -1) if sampled else None,
    )
    assert len(policy.trim(draft)) == kept


def test_a_sampled_trees_cut_keeps_each_nodes_elder_siblings_and_parent():
    """Flat verification: nodes are kept depth by depth, each depth's most valuable first, up to
    the first that does not pay; every kept node's parent and elder siblings are kept."""
    policy = CostAwarePolicy(
        tree=TreeShape(top_k=2, depth=3), cost=_curve([1.0, 1.0, 1.0, 1.0, 9.0, 9.0, 9.0])
    )
    policy.shape()
    # depth 1: 0 (0.6), 1 (0.3); depth 2: 2 under 0 (0.5), 3 under 1 (0.2), 4 under 0 (0.1).
    draft = Draft(
        tokens=torch.tensor([0, 1, 0, 0, 1]),
        parents=torch.tensor([-1, -1, 0, 1, 0]),
        values=torch.tensor([0.6, 0.3, 0.5, 0.2, 0.1]),
        probs=torch.full((5, 2), 0.5),
    )
    kept = policy.trim(draft)
    # Three nodes verify at a plain step's cost; a fourth costs nine.
    assert kept.tokens.tolist() == [0, 1, 0] and kept.parents.tolist() == [-1, -1, 0]


def _round(committed: int, round_s: float, drafted: int = 4) -> RoundOutcome:
    draft = Draft(tokens=torch.arange(drafted))
    return RoundOutcome(draft, list(range(committed - 1)), draft_s=0.1, round_s=round_s)


def _plain_step_timed(policy: CostAwarePolicy, round_s: float = 1.0, rows: int = 1) -> None:
    """A plain round, as the policy asks for one to time the one-token cost."""
    assert policy.shape(rows=rows).max_tokens == 0
    policy.observe_round(_batch_round([1] * rows, [0] * rows, draft_s=0.0, round_s=round_s))


def test_cost_aware_falls_back_to_plain_decoding_and_probes_again(caplog):
    # A budget that any probe's loss fits: the doubling alone sets the plain stretches.
    policy = CostAwarePolicy(
        siblings=0, cost=_curve([1.0] * 10), patience=0.15, first_backoff=2, probe_budget=1.0
    )
    # 0.1 s of drafting, then a verification that costs what a plain step does: 0.1 s lost, and
    # the second such round has lost more than 0.15 of a plain step.
    losing = _round(committed=1, round_s=1.1)
    plain_step = RoundOutcome(Draft.empty(), [], draft_s=0.0, round_s=1.0)
    with caplog.at_level(logging.INFO, logger="draftsmith.decoding.policies.cost_aware"):
        for _ in range(2):
            assert policy.shape().max_tokens > 0
            policy.observe(losing)
    # Each fallback says what the probe lost and how long the plain stretch is.
    assert [r.getMessage() for r in caplog.records] == [
        "speculation slower than plain decoding (the probe lost 0.20 s net): 2 plain rounds"
    ]
    assert policy.shape().max_tokens == 0 and not policy.speculating
    policy.observe(plain_step)
    for _ in range(1):  # the rest of the plain stretch
        assert policy.shape().max_tokens == 0
        policy.observe(plain_step)
    assert policy.speculating  # the probe
    for _ in range(2):
        policy.observe(losing)
    for _ in range(4):  # the probe lost: twice as long a stretch
        assert policy.shape().max_tokens == 0
        policy.observe(plain_step)
    for _ in range(2):  # the probe wins: speculation resumes for good
        policy.observe(_round(committed=4, round_s=1.5))
    for _ in range(5):
        assert policy.shape().max_tokens > 0
        policy.observe(_round(committed=4, round_s=1.5))


def test_a_plain_stretch_runs_on_into_the_next_request():
    policy = CostAwarePolicy(
        siblings=0, cost=_curve([1.0] * 10), patience=0.05, first_backoff=3, probe_budget=1.0
    )
    policy.observe(_round(committed=1, round_s=1.5))  # lost: 3 plain rounds
    policy.observe(_round(committed=1, round_s=1.0, drafted=0))
    policy.start()  # a new request: the drafter would have to read its prompt to probe
    shapes = []
    for _ in range(3):
        shapes.append(policy.shape().max_tokens)
        policy.observe(_round(committed=1, round_s=1.0, drafted=0))
    assert shapes == [0, 0, 8]


def _drafted_round(policy: CostAwarePolicy, draft_s: float, accepted: int) -> None:
    """A round through the policy as the decoder runs it: 3 tokens drafted and kept, `accepted`
    of them accepted, on a flat curve of 1 s a forward."""
    policy.shape()
    draft = policy.trim(Draft(tokens=torch.arange(3)))
    outcome = RoundOutcome(draft, list(range(accepted)), draft_s=draft_s, round_s=draft_s + 1.0)
    policy.observe(outcome)


def test_a_probe_that_lost_much_buys_a_plain_stretch_its_loss_is_a_small_share_of():
    policy = CostAwarePolicy(
        clock=Clock(0.0),  # learning from a round takes no time here
        siblings=0,
        cost=_curve([1.0] * 10),
        patience=0.25,
        first_backoff=2,
        probe_budget=0.05,
    )
    # The probe's first round has the drafter catch up on the prompt (3 s of drafting), the
    # next three commit one token each for 0.1 s of drafting (the third takes the loss past a
    # quarter of a plain step): 3.3 s lost against 1 s plain steps.
    for draft_s in (3.0, 0.1, 0.1, 0.1):
        _drafted_round(policy, draft_s, accepted=0)
    stretch = 0
    while not policy.speculating:
        assert policy.shape().max_tokens == 0
        policy.observe(_round(committed=1, round_s=1.0, drafted=0))
        stretch += 1
    assert stretch == 66  # 3.3 s is 5% of 66 plain seconds; the doubling alone would give 2


def test_speculation_falls_back_once_it_has_lost_more_than_its_patience_since_it_was_ahead():
    """Rejected drafts lose their 0.125 s of drafting each against 1 s plain steps: eight of them
    lose exactly the one plain step of patience, a ninth falls back; a round that commits 4
    tokens for 1.3 s puts speculation ahead and the count starts again."""
    # Learning from a round takes no time here.
    policy = CostAwarePolicy(clock=Clock(0.0), siblings=0, cost=_curve([1.0] * 10), patience=1.0)
    _drafted_round(policy, draft_s=0.1, accepted=0)  # catching up on the prompt
    for _ in range(5):
        _drafted_round(policy, draft_s=0.125, accepted=0)
    _drafted_round(policy, draft_s=0.3, accepted=3)
    for _ in range(8):
        _drafted_round(policy, draft_s=0.125, accepted=0)
        assert policy.speculating
    _drafted_round(policy, draft_s=0.125, accepted=0)
    assert not policy.speculating


@pytest.mark.parametrize(("learning_s", "rounds"), [(0.0, 8), (0.125, 4)])
def test_learning_from_a_drafted_round_is_a_cost_of_speculation(learning_s, rounds):
    """Rejected drafts lose their 0.125 s of drafting each against 1 s plain steps, plus the time
    the policy takes to learn from the round (the online recalibration), outside the round the
    decoder timed: with none, eight rounds lose the one plain step of patience and a ninth falls
    back; with 0.125 s a round, four do and a fifth falls back."""
    # observe_round reads the clock before and after.
    policy = CostAwarePolicy(
        clock=Clock(learning_s), siblings=0, cost=_curve([1.0] * 10), patience=1.0
    )
    _drafted_round(policy, draft_s=0.1, accepted=0)  # catching up on the prompt
    for _ in range(rounds):
        _drafted_round(policy, draft_s=0.125, accepted=0)
        assert policy.speculating
    _drafted_round(policy, draft_s=0.125, accepted=0)
    assert not policy.speculating


def _planned_round(policy: CostAwarePolicy, accepted: bool) -> None:
    """A round as the decoder runs it: one token drafted (at the acceptance of the policy's
    calibrator) in 0.3 s and kept, accepted or not, verified by a 1 s forward; a plain step
    first wherever the policy asks for one to time the one-token cost."""
    while policy.shape().max_tokens == 0:
        policy.observe(RoundOutcome(Draft.empty(), [], draft_s=0.0, round_s=1.0))
    policy.stop_fn()(0, torch.zeros(1, 16), False)
    draft = policy.trim(Draft(tokens=torch.zeros(1, dtype=torch.long)))
    assert len(draft) == 1  # at 0.2, 1.2 tokens for 1.3 s beat the 1 token its cut would give
    outcome = RoundOutcome(draft, [0] if accepted else [], draft_s=0.3, round_s=1.3)
    policy.observe(outcome)


@pytest.mark.parametrize(("expected_patience", "rounds"), [(2.0, 23), (1e9, 81)])
def test_speculation_falls_back_on_the_loss_its_plans_expect_before_the_rounds_show_it(
    expected_patience, rounds
):
    """Each round is expected to lose 0.1 s (1.2 tokens for 1.3 s against plain's 1 s a token)
    and does, on average, as one round in five commits two tokens. Two rounds are not judged:
    the first, and the first after the plain step that times the one-token cost (the drafter
    catches up in both). So the expectation passes the two plain steps of `expected_patience`
    in the 23rd round, while what the rounds committed, which each lucky round puts 0.7 s
    ahead, passes the eight of `patience` only in the 81st."""
    policy = CostAwarePolicy(
        clock=Clock(0.0),
        siblings=0,
        cost=_curve([1.0] * 10),
        acceptance=ConstantCalibrator(0.2),
        recalibrate=False,
        expected_patience=expected_patience,
    )
    for n in range(rounds):
        assert policy.speculating
        _planned_round(policy, accepted=n % 5 == 1)
    assert not policy.speculating


@pytest.mark.parametrize(
    ("prompts", "max_new_tokens", "speculates"),
    [((100,), 2, False), ((100,), 10, True), ((25, 25, 25, 25), 2, True)],
)
def test_a_request_is_decoded_plainly_where_reading_its_prompt_costs_more_than_speculation_gains(
    caplog, prompts, max_new_tokens, speculates
):
    """The drafter read the last request's 100-token prompt in 0.3 s; since then each round was
    expected to commit 1.5 tokens for 1.3 s (plain: 1 s a token), about 0.12 s gained a token
    (the plain step that timed the one-token cost gained nothing). A next request of 100 prompt
    tokens pays that reading over 10 new tokens, not over 2: that one is decoded plainly
    throughout. Four rows of 25 prompt tokens pay it over their 2 new tokens each (8 in all),
    whatever the rounds before had as rows."""
    policy = CostAwarePolicy(
        clock=Clock(0.0),
        siblings=0,
        cost=_curve([1.0] * 10),
        acceptance=ConstantCalibrator(0.5),
        recalibrate=False,
    )
    policy.start(size=RequestSize((100,), 64))
    for n in range(12):
        _planned_round(policy, accepted=n % 2 == 0)
    with caplog.at_level(logging.INFO, logger="draftsmith.decoding.policies.cost_aware"):
        policy.start(size=RequestSize(prompts, max_new_tokens))
    assert policy.speculating == speculates
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == (0 if speculates else 1)
    assert all(m.startswith("reading the prompt would cost more") for m in said)
    for _ in range(0 if speculates else max_new_tokens):
        assert policy.shape().max_tokens == 0
        policy.observe(RoundOutcome(Draft.empty(), [], draft_s=0.0, round_s=1.0))


def test_the_round_a_drafter_catches_up_in_is_not_judged_as_speculations_rate():
    """The first round has the drafter read the prompt (6 s): 4 tokens for 7 s, 3 s lost against
    plain's one a second, more than the 2 plain steps of patience. After it, 4 tokens commit
    per 1.3 s, and speculation goes on."""
    policy = CostAwarePolicy(siblings=0, cost=_curve([1.0] * 10), patience=2.0)
    _drafted_round(policy, draft_s=6.0, accepted=3)
    assert policy.speculating
    for _ in range(3):
        _drafted_round(policy, draft_s=0.3, accepted=3)
        assert policy.speculating


def test_cost_aware_judges_rounds_on_the_scaled_curve_not_their_wall_time():
    # Every drafted token is cut, so each round verifies one token after 0.1 s of drafting; on a
    # busy machine the rounds happen to take less wall time than the curve's plain step.
    policy = CostAwarePolicy(siblings=0, cost=_curve([1.0] * 10), patience=0.2, first_backoff=2)
    cut = RoundOutcome(Draft.empty(), [], draft_s=0.1, round_s=0.9)
    for _ in range(2):
        policy.observe(cut)
    # Their verification took 0.8 s: plain decoding (0.8 s a token) beats them (0.9 s).
    assert policy.plain_rate() == pytest.approx(1 / 0.8)
    assert not policy.speculating


def test_the_one_token_cost_is_timed_apart_from_the_wider_rounds():
    """On a flat curve, rounds verifying 5 tokens take 1.5 s and one-token rounds 1.1 s: once
    three wider rounds set the scale, the policy asks for a plain step to time the one-token cost,
    and then prices one token at 1.1 s and more at 1.5 s, not both at the wider rounds' scale."""
    policy = CostAwarePolicy(siblings=0, cost=_curve([1.0] * 10))
    for _ in range(cost_model.TRUSTED_WIDER):
        assert policy.shape().max_tokens > 0
        policy.observe(_round(committed=2, round_s=1.6))
    _plain_step_timed(policy, round_s=1.1)
    assert policy.round_verify_s(1) == pytest.approx(1.1)
    assert policy.round_verify_s(2) == pytest.approx(1.5)
    assert policy.shape().max_tokens > 0


def test_one_slow_round_does_not_move_the_scale():
    policy = CostAwarePolicy(siblings=0, cost=_curve([1.0] * 10), timed_rounds=3)
    for round_s in (1.1, 1.1, 10.1):  # the last: a hiccup of a busy machine
        policy.observe(_round(committed=5, round_s=round_s))
    assert policy.round_verify_s(3) == pytest.approx(1.0)


def test_both_costs_are_timed_again_after_refresh_rounds():
    """Drafts that always pay leave the one-token cost untimed: after 4 rounds without a one-token
    round, the next is a plain step. Drafts that never pay (acceptance 0.01, a second token
    costing half a forward more) leave the wider cost untimed: the 5th round keeps a token."""
    policy = CostAwarePolicy(
        siblings=0,
        cost=_curve([1.0] + [1.5] * 9),
        refresh_rounds=4,
        acceptance=ConstantCalibrator(0.01),
        recalibrate=False,
    )
    wide = _round(committed=5, round_s=1.6)
    plain_step = RoundOutcome(Draft.empty(), [], draft_s=0.0, round_s=1.0)
    for _ in range(cost_model.TRUSTED_WIDER):
        policy.observe(wide)
    _plain_step_timed(policy)
    plain = []
    for _ in range(9):
        plain.append(policy.shape().max_tokens == 0)
        policy.observe(plain_step if plain[-1] else wide)
    assert plain == [False] * 4 + [True] + [False] * 4
    kept = []
    for _ in range(10):
        policy.shape()
        policy.stop_fn()(0, torch.zeros(16), False)
        draft = policy.trim(Draft(tokens=torch.arange(1)))
        kept.append(len(draft))
        policy.observe(RoundOutcome(draft, [], draft_s=0.1, round_s=1.1))
    assert kept == [0, 0, 0, 0, 1] * 2


def test_a_wider_round_is_timed_again_where_no_draft_is_expected_to_pay():
    """Each verified token costs a full forward, so no draft pays; still, after 4 rounds without
    a wider one, the policy drafts to time one (a scale that overstates that cost would
    otherwise never be measured again)."""
    policy = CostAwarePolicy(
        siblings=0, cost=_curve([float(n) for n in range(1, 11)]), refresh_rounds=4
    )
    drafts = []
    for _ in range(5):
        drafts.append(policy.shape().max_tokens > 0)
        policy.observe(RoundOutcome(Draft.empty(), [], draft_s=0.0, round_s=1.0))
    assert drafts == [False] * 4 + [True]


# -- cost-aware at a batch -------------------------------------------------------------------------

# Verification flat up to 4 tokens, then each token costs a quarter of a one-token forward.
_SATURATING = CostCurve(
    tokens=[1, 4, 8, 16, 32, 64], verify_s=[1.0, 1.0, 2.0, 4.0, 8.0, 16.0], context=8
)


@pytest.mark.parametrize(
    ("cost", "drafts_at"),
    [(_SATURATING, {1: True, 2: True, 8: False}), (_curve([1.0] * 64), {1: True, 8: True})],
)
def test_cost_aware_plans_a_batch_on_the_cost_of_the_batch_forward(cost, drafts_at):
    """At 8 rows a 4-token chain verifies 32 tokens in one forward, 8 times a plain step's 1 (for
    8 tokens): it cannot pay where cost grows with the tokens, and does where it stays flat."""
    policy = CostAwarePolicy(
        siblings=0,
        cost=cost,
        max_draft_tokens=3,
        acceptance=ConstantCalibrator(0.8),
        recalibrate=False,
    )
    assert {rows: policy.shape(rows=rows).max_tokens > 0 for rows in drafts_at} == drafts_at


def test_a_tree_is_cut_with_its_drafting_spent():
    """Verification is flat and a drafted node cost 0.1 s: once drafted, every node that may be
    accepted is worth verifying. (Charging each round the drafting of the largest tree, 48
    nodes, 4.8 s, cut every tree to nothing.)"""
    policy = CostAwarePolicy(
        tree=TreeShape(top_k=8, depth=6, total_tokens=48), cost=_curve([1.0] * 64)
    )
    for _ in range(2):  # the drafter catches up, then a round fits 0.1 s a node
        policy.shape()
        drafted = policy.trim(Draft(tokens=torch.arange(4)))
        policy.observe(RoundOutcome(drafted, [], draft_s=0.4, round_s=1.4))
    policy.shape()
    draft = Draft(tokens=torch.arange(4), values=torch.tensor([0.5, 0.3, 0.2, 0.1]))
    assert len(policy.trim(draft)) == 4


class _Nodes:
    """`TreeNodes` of a hand-made tree."""

    def __init__(self, values: list[float], parents: list[int]) -> None:
        self.values, self.parents = values, parents
        self.depths = []
        for parent in parents:
            self.depths.append(1 if parent < 0 else self.depths[parent] + 1)


def _fit_drafting(policy: CostAwarePolicy, step_s: float) -> None:
    """Rounds that drafted 1, 2 and 6 steps at step_s each, verified for 1 s and accepted whole
    (the first is the drafter's catching up, left out of the fit)."""
    for steps in (1, 2, 6):
        policy.shape()
        drafted = policy.trim(Draft(tokens=torch.arange(steps)))
        seconds = steps * step_s
        policy.observe(RoundOutcome(drafted, list(range(steps)), seconds, seconds + 1.0))
    _plain_step_timed(policy)


@pytest.mark.parametrize(("step_s", "grows"), [(0.5, True), (2.0, False)])
def test_a_tree_grows_while_a_deeper_tree_is_expected_to_pay(step_s, grows):
    """Depth 1 holds 0.8 and 0.1 and verification is flat (1 s). Grown as that depth suggests,
    depth 2 would add 0.64, 0.08, 0.08, 0.01: 2.71 tokens for 2 steps against 1.9 for one.
    At 0.5 s a step that pays (2.71 / 2.0 > 1.9 / 1.5); at 2 s no depth does (1.9 / 3.0 beats
    2.71 / 5.0 and 3.29 / 7.0)."""
    policy = CostAwarePolicy(
        tree=TreeShape(top_k=2, depth=3, total_tokens=12), cost=_curve([1.0] * 13)
    )
    _fit_drafting(policy, step_s)
    policy.shape()
    stop = policy.tree_stop_fn()
    assert stop(1, _Nodes([0.8, 0.1], [-1, -1])) is not grows


@pytest.mark.parametrize(("expand", "grows"), [(None, True), (1, False)])
def test_a_deeper_tree_is_valued_on_the_nodes_it_would_expand(expand, grows):
    """As above at 0.68 s a step: expanding both depth-1 nodes adds 0.81 tokens for a step,
    which pays (2.71 / 2.36 > 1.9 / 1.68); expanding the best one alone (a sibling chain) adds
    0.72, which does not (2.62 / 2.36), nor does any deeper sibling chain."""
    shape = TreeShape(top_k=2, depth=3, total_tokens=12, expand=expand)
    policy = CostAwarePolicy(tree=shape, cost=_curve([1.0] * 13))
    _fit_drafting(policy, 0.68)
    policy.shape()
    stop = policy.tree_stop_fn()
    assert stop(1, _Nodes([0.8, 0.1], [-1, -1])) is not grows


def test_no_tree_is_drafted_where_even_a_chain_accepted_whole_cannot_pay():
    """A depth takes 5 s and a verification 1 s: no n depths committing n + 1 tokens beat a plain
    step, so the round drafts nothing rather than a root's children it would cut."""
    policy = CostAwarePolicy(
        tree=TreeShape(top_k=4, depth=4, total_tokens=16), cost=_curve([1.0] * 17), patience=1e9
    )
    _fit_drafting(policy, 0.5)
    assert policy.shape().max_tokens > 0
    _fit_drafting(policy, 5.0)
    assert policy.shape().max_tokens == 0


def test_a_tree_stops_where_its_newest_depth_gives_little():
    """Depth 2 gave its parents' children 1% of their value: a third depth is not worth a step
    however cheap verification is."""
    policy = CostAwarePolicy(
        tree=TreeShape(top_k=2, depth=6, total_tokens=64), cost=_curve([1.0] * 65)
    )
    _fit_drafting(policy, 0.05)
    policy.shape()
    stop = policy.tree_stop_fn()
    assert not stop(1, _Nodes([0.8, 0.1], [-1, -1]))
    deeper = _Nodes([0.8, 0.1, 0.008, 0.001, 0.001, 0.0001], [-1, -1, 0, 1, 0, 1])
    assert stop(2, deeper)


def test_a_trees_drafting_is_fitted_on_the_depths_it_grew():
    """Each depth takes 0.3 s (on a clock that moves 0.3 s between the stop rule's calls): the
    drafting cost is 0.3 s a step whatever the nodes (fitted on nodes it would be less)."""
    policy = CostAwarePolicy(
        clock=Clock(0.3),
        tree=TreeShape(top_k=3, depth=4, total_tokens=24),
        cost=_curve([1.0] * 25),
        patience=1e9,
    )
    probs = torch.tensor([0.6, 0.3, 0.1]).log()
    # The first round is the drafter's catching up, the second a plain step timing one token,
    # the third the drafter's catching up again.
    for _ in range(4):
        shape = policy.shape()
        if shape.max_tokens == 0:
            policy.observe(RoundOutcome(Draft.empty(), [], draft_s=0.0, round_s=1.0))
            continue
        expanded = []

        def expand(nodes, expanded=expanded):
            expanded.append(nodes)
            return probs.expand(len(nodes), -1)

        tree = DynamicTree(shape, raw_acceptance, policy.tree_stop_fn())
        draft = policy.trim(tree.grow(probs, expand))
        depths = 1 + len(expanded)
        assert len(tree.values) > depths
        seconds = 0.3 * depths
        policy.observe(RoundOutcome(draft, [], draft_s=seconds, round_s=seconds + 1.0))
    assert policy._costs.drafting.per_step == pytest.approx(0.3)


def test_cost_aware_cuts_each_rows_tree_to_its_share_of_the_batch_forward():
    draft = Draft(tokens=torch.arange(4), values=torch.tensor([0.9, 0.8, 0.7, 0.6]))
    policy = CostAwarePolicy(tree=TreeShape(top_k=4, depth=4, total_tokens=16), cost=_SATURATING)
    policy.shape(rows=1)
    assert len(policy.trim(draft)) == 3  # 4 tokens verify for one token's cost; a 5th costs more
    policy.shape(rows=8)
    assert len(policy.trim(draft)) == 0  # 8 rows of 2 tokens already cost 4 plain steps


def _batch_round(committed: list[int], drafted: list[int], draft_s: float, round_s: float):
    return [
        RoundOutcome(Draft(tokens=torch.arange(d)), list(range(c - 1)), draft_s, round_s)
        for c, d in zip(committed, drafted, strict=True)
    ]


def test_cost_aware_scales_its_curve_by_the_batch_forward_it_timed():
    policy = CostAwarePolicy(siblings=0, cost=_SATURATING)
    policy.shape(rows=4)
    # Blocks padded to the widest (3 drafted + the root): 16 tokens, 4.0 s on the curve.
    policy.observe_round(_batch_round([1, 2, 4, 1], [0, 2, 3, 1], draft_s=0.5, round_s=8.5))
    assert policy.round_verify_s(4) == pytest.approx(8.0)  # twice the curve
    assert policy.plain_rate() == pytest.approx(4 / 2.0)  # 4 rows a token per 2.0 s step


def test_a_losing_probe_at_a_batch_buys_plain_rounds_by_what_the_batch_lost():
    """Flat curve, 1 s a forward: a plain step gives each of 4 rows a token a second. Two rounds
    that each commit one token a row for 1.5 s (0.5 s of drafting) lose 0.5 s each: 1.0 s, 5%
    of 20 plain rounds. Judged row by row (four outcomes a round) they would lose 4 times that."""
    # Learning from a round takes no time here.
    policy = CostAwarePolicy(
        clock=Clock(0.0), siblings=0, cost=_curve([1.0] * 10), patience=0.75, probe_budget=0.05
    )
    for _ in range(2):
        assert policy.shape(rows=4).max_tokens > 0
        policy.observe_round(_batch_round([1] * 4, [4] * 4, draft_s=0.5, round_s=1.5))
    stretch = 0
    while not policy.speculating:
        assert policy.shape(rows=4).max_tokens == 0
        policy.observe_round(_batch_round([1] * 4, [0] * 4, draft_s=0.0, round_s=1.0))
        stretch += 1
    assert stretch == 20


class RecordingPolicy(CostAwarePolicy):
    """Cost-aware, recording each request's size, the rows each round opened with and the
    outcomes it observed."""

    def __post_init__(self) -> None:
        self.rounds: list[list[int | None]] = []
        self.requests: list[RequestSize] = []
        super().__post_init__()

    def start(self, target=None, size=UNSIZED) -> None:
        self.requests.append(size)
        super().start(target, size)

    def shape(self, rows: int = 1, lockstep: bool = False) -> TreeShape:
        self.rounds.append([rows, None])
        return super().shape(rows)

    def observe_round(self, outcomes) -> None:
        self.rounds[-1][1] = len(outcomes)
        super().observe_round(outcomes)


def test_the_decoder_reports_each_batch_round_to_the_policy_at_once(llama):
    policy = RecordingPolicy(max_draft_tokens=3, cost=_curve([1e-3] * 8))
    decoder = SpeculativeDecoder(llama, DraftModelDrafter(llama), policy=policy)
    prompts = [torch.tensor([2, 4, 6]), torch.tensor([7, 1]), torch.tensor([3, 3, 9, 5])]
    results = decoder.generate_batch(prompts, max_new_tokens=12)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.tokens == greedy_reference(llama, prompt, 12)
    assert policy.rounds[0] == [3, 3]
    assert all(rows == observed for rows, observed in policy.rounds)
    assert policy.requests[-1] == RequestSize((3, 2, 4), 12)


def test_cost_aware_falls_back_when_the_drafter_is_useless(llama):
    useless = DraftModelDrafter(tiny_model("llama", seed=99))
    policy = CostAwarePolicy(
        siblings=0, max_draft_tokens=4, cost=_curve([1e-3] * 6), clock=Clock(0.001)
    )
    stats = _decode(llama, policy, max_new=60, drafter=useless)
    # Rounds after the first fall-back mostly draft nothing.
    assert stats.drafted < 2 * stats.target_forwards


def test_cost_aware_measures_the_curve_when_given_none(llama):
    policy = CostAwarePolicy(siblings=0, max_draft_tokens=3)
    _decode(llama, policy, max_new=6)
    assert policy.cost is not None and policy.cost.tokens[-1] == 4


def test_the_cost_curve_cuts_trees_and_sizes_the_next_one():
    """The next round gives a node twice as many children as one kept node has, and expands
    twice as many nodes a depth as one kept depth has expanded (the root: one), each capped at
    the shape's; its depth is the stop rule's."""
    tree = TreeShape(top_k=4, depth=4, total_tokens=16)
    values = torch.tensor([0.9, 0.8, 0.7, 0.6])
    chain = Draft(tokens=torch.arange(4), values=values)
    flat = CostAwarePolicy(tree=tree, cost=_curve([1.0] * 6))
    assert len(flat.trim(chain)) == 4
    assert flat.shape() == TreeShape(top_k=2, depth=4, total_tokens=16)  # one child a node kept
    fan = Draft(tokens=torch.arange(4), parents=torch.full((4,), -1), values=values)
    assert len(flat.trim(fan)) == 4
    # Four children of the root: four a node, but two nodes expanded a depth.
    assert flat.shape() == TreeShape(top_k=4, depth=4, total_tokens=16, expand=2)
    bush = Draft(
        tokens=torch.arange(6),
        parents=torch.tensor([-1, -1, 0, 0, 1, 1]),
        values=torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5, 0.4]),
    )
    assert len(flat.trim(bush)) == 6
    assert flat.shape() == tree  # two nodes of depth 1 expanded: four a depth
    # Each further token costs 0.9 of a plain step: none of these nodes pays, though a chain
    # accepted whole would.
    steep = CostAwarePolicy(tree=tree, cost=_curve([1.0, 1.9, 2.8, 3.7, 4.6, 5.5]))
    assert len(steep.trim(fan)) == 0
    assert steep.shape() == TreeShape(top_k=2, depth=4, total_tokens=16)


def test_calibrated_acceptance_ranks_tree_nodes(llama):
    calibrator = ConstantCalibrator(0.5)
    policy = build_policy(
        "fixed", tree=TreeShape(top_k=2, depth=2), acceptance=calibrator, recalibrate=False
    )
    signals = confidence_signals(torch.tensor([[2.0, 1.0, 0.0, -1.0]]))
    signals["position"] = torch.tensor([1.0])
    torch.testing.assert_close(policy.acceptance_fn()(signals), torch.tensor([0.5]))
    assert calibrator.seen_positions == [1.0]
    _decode(llama, policy, max_new=12)


# -- every policy by name ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_keeps_greedy_output_identical(llama, name):
    options = {"cost": _curve([1.0, 1.2, 1.4, 1.6, 1.8])} if name == "cost-aware" else {}
    policy = build_policy(name, max_draft_tokens=4, **options)
    drafter = DraftModelDrafter(tiny_model("llama", seed=3))
    _decode(llama, policy, max_new=16, drafter=drafter)
    _decode(llama, policy, max_new=16, drafter=DraftModelDrafter(llama))


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("greedy-ish", {}, "unknown draft policy"),
        ("threshold", {"min_path_confidence": 1.5}, "min_path_confidence"),
        ("specdec++", {"rejection_threshold": 0.0}, "rejection_threshold"),
        ("adaedl", {"gamma": -1.0}, "gamma"),
        ("cm-asd", {"alpha": 2.0}, "alpha"),
        ("cost-aware", {"max_backoff": 1, "first_backoff": 4}, "first_backoff"),
        ("cost-aware", {"probe_budget": 0.0}, "probe_budget"),
        ("fixed", {"min_path_confidence": 0.4}, "takes no option"),
        ("cost-aware", {"clock": Clock(0.0)}, r"takes no option \['clock'\]"),
    ],
)
def test_bad_policy_options_are_clear_errors(name, options, message):
    with pytest.raises(ValueError, match=message):
        build_policy(name, **options)


@pytest.mark.parametrize(("drafter_seed", "direction"), [(None, 1), (99, -1)])
def test_the_policy_recalibrates_its_acceptance_from_the_verifications(
    llama, drafter_seed, direction
):
    # The offline model says 0.5 everywhere; a same-model drafter is always accepted, an
    # unrelated one almost never: the online model moves each way.
    draft_model = llama if drafter_seed is None else tiny_model("llama", seed=drafter_seed)
    policy = build_policy("fixed", max_draft_tokens=4, acceptance=ConstantCalibrator(0.5))
    _decode(llama, policy, max_new=80, drafter=DraftModelDrafter(draft_model))
    # A round's first token: the one every round drafts, so its correction sees every round.
    signals = {"top1_prob": torch.tensor([0.5]), "position": torch.tensor([0.0])}
    learned = float(policy.acceptance_prob(signals)[0])
    assert policy.acceptance.corrections[0].n_observed > 10
    assert (learned - 0.5) * direction > 0.1


def test_the_default_drafts_chains_with_three_siblings_a_token():
    policy = CostAwarePolicy(max_draft_tokens=6)
    assert policy.largest == TreeShape(top_k=4, depth=6, total_tokens=24, expand=1)
    assert CostAwarePolicy(siblings=0, max_draft_tokens=6).largest.is_chain
    assert CostAwarePolicy(tree=TreeShape(top_k=2, depth=3)).largest == TreeShape(2, 3)
    with pytest.raises(ValueError, match="siblings must be >= 0"):
        CostAwarePolicy(siblings=-1)


def test_a_sampled_sibling_that_does_not_pay_cuts_its_younger_siblings_not_the_chain():
    """Verification costs 0.1 a token more from the second on, drafting nothing: the chain's
    first token (0.9) pays, its sibling (0.05) does not (1.95 / 1.2 < 1.9 / 1.1), and the
    chain's second token (0.8) pays on what precedes it; the younger sibling goes with its
    elder, and the node under the cut sibling with it."""
    policy = CostAwarePolicy(cost=_curve([1.0, 1.1, 1.2, 1.3, 1.4, 1.5]), patience=1e9)
    _fit_drafting(policy, 0.0)
    policy.shape()
    draft = Draft(
        tokens=torch.tensor([5, 6, 7, 8, 9]),
        parents=torch.tensor([-1, -1, -1, 0, 1]),
        values=torch.tensor([0.9, 0.05, 0.04, 0.8, 0.04]),
        probs=torch.full((5, 16), 1 / 16),
    )
    kept = policy.trim(draft)
    assert kept.tokens.tolist() == [5, 8]
    assert kept.parents.tolist() == [-1, 0]


class ForwardClock:
    """Seconds that pass in forwards alone: `tick` s in each forward of a module it is hooked
    on (`on`), none between, so a round's timing counts its forwards."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def on(self, module: torch.nn.Module, tick: float = 1.0):
        def forward(*_):
            self.now += tick

        return module.register_forward_hook(forward)


@pytest.mark.parametrize(
    ("kind", "per_token_s", "four_tokens_s"),
    [("peagle", 0.0, 1.0), ("dflash", 0.0, 1.0), ("eagle3", 1.0, 4.0)],
)
def test_the_cost_model_prices_a_drafter_by_its_forwards(kind, per_token_s, four_tokens_s):
    """A block drafter's round is one head forward, however many tokens it drafts: on a clock
    that moves 1 s in each head (and target) forward, the cost-aware policy fits P-EAGLE's and
    DFlash's drafting at 1 s a round and nothing a token, EAGLE-3's (a forward a token: the
    catching up on the committed tokens drafts the first) at 1 s a token."""
    target = tiny_model("llama", seed=0)
    head = build_head(kind, target, {"num_steps": 4})
    clock = ForwardClock()
    clock.on(target)
    clock.on(head.layers[0] if kind == "dflash" else head.midlayer)  # one layer: one forward
    policy = CostAwarePolicy(
        clock=clock, max_draft_tokens=4, cost=_curve([1.0] * 6), patience=1e9, recalibrate=False
    )
    decoder = SpeculativeDecoder(target, head.as_drafter(target), policy=policy, clock=clock)
    prompt = torch.tensor([4, 8, 15, 16, 23])
    result = decoder.generate(prompt, 24)
    assert result.tokens == greedy_reference(target, prompt, 24)
    drafting = policy._costs.drafting
    assert drafting.per_step == pytest.approx(per_token_s, abs=0.05)
    assert drafting.seconds(4) == pytest.approx(four_tokens_s, abs=0.3)
