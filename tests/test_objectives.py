"""The one objective: divergences, alignment, masking, reduced vocabularies, agreement, tau_sim."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import greedy_reference
from head_helpers import build_head, fit, target_batch

from draftsmith.decoding import FixedPolicy, SpeculativeDecoder
from draftsmith.train.objectives import (
    DIVERGENCES,
    Agreement,
    ObjectiveConfig,
    divergence,
    dpace_weights,
    draft_objective,
    step_weights,
)


def logits_of(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs).log()


@pytest.mark.parametrize("kind", DIVERGENCES)
def test_identical_distributions_diverge_by_zero_except_cross_entropy(kind):
    logits = torch.randn(3, 5, 11)
    value = divergence(kind, logits, logits.clone())
    if kind == "ce_argmax":  # -log q(argmax p) is the entropy-like floor, not 0
        expected = -torch.log_softmax(logits, -1).max(-1).values
        torch.testing.assert_close(value, expected)
    else:
        torch.testing.assert_close(value, torch.zeros(3, 5), atol=1e-6, rtol=0)


def test_hand_computed_two_token_cases():
    p, q = [0.75, 0.25], [0.5, 0.5]
    target, draft = logits_of(p), logits_of(q)
    forward = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    reverse = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)
    m = [0.625, 0.375]
    jsd = 0.5 * sum(a * math.log(a / b) for a, b in zip(p, m, strict=True)) + 0.5 * sum(
        a * math.log(a / b) for a, b in zip(q, m, strict=True)
    )
    expected = {
        "forward_kl": forward,
        "reverse_kl": reverse,
        "tv": 0.25,
        "jsd": jsd,
        "ce_argmax": -math.log(0.5),
    }
    for kind, value in expected.items():
        assert float(divergence(kind, draft, target)) == pytest.approx(value, rel=1e-5), kind


def test_jsd_beta_weights_the_mixture():
    p, q = torch.tensor([0.9, 0.1]), torch.tensor([0.2, 0.8])
    beta = 0.3
    m = beta * p + (1 - beta) * q
    expected = beta * (p * (p / m).log()).sum() + (1 - beta) * (q * (q / m).log()).sum()
    value = divergence("jsd", q.log(), p.log(), jsd_beta=beta)
    assert float(value) == pytest.approx(float(expected), rel=1e-5)


def test_zero_probability_tokens_give_finite_values_and_gradients():
    target = torch.tensor([0.0, -float("inf"), 1.0])  # a target that rules a token out
    draft = torch.zeros(3, requires_grad=True)
    value = divergence("forward_kl", draft, target)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(draft.grad).all()


def test_step_weights_decay_and_sum_to_one():
    weights = step_weights(3, 0.8)
    torch.testing.assert_close(weights, torch.tensor([1, 0.8, 0.64]) / 2.44)


def test_alignment_step_k_at_t_is_scored_against_target_at_t_plus_k():
    """Each step's draft equals the target's logits shifted by k: every loss is 0, agreement 1."""
    batch, length, vocab = 2, 7, 13
    target = torch.randn(batch, length, vocab) * 3
    steps = []
    for k in range(3):
        shifted = torch.randn(batch, length, vocab)  # garbage where t + k leaves the row
        shifted[:, : length - k] = target[:, k:]
        steps.append(shifted)
    mask = torch.ones(batch, length, dtype=torch.bool)
    out = draft_objective(steps, target, mask, ObjectiveConfig())
    torch.testing.assert_close(out.step_losses, torch.zeros(3), atol=1e-5, rtol=0)
    assert out.agreement.top1() == [1.0, 1.0, 1.0]
    # step k counts positions t with t + 1 + k < T
    assert out.agreement.total.tolist() == [batch * (length - 1 - k) for k in range(3)]


def test_loss_mask_removes_positions_from_loss_and_agreement():
    target = torch.randn(1, 6, 9)
    draft = torch.randn(1, 6, 9)
    mask = torch.tensor([[1, 0, 1, 0, 0, 0]], dtype=torch.bool)
    out = draft_objective([draft, draft], target, mask, ObjectiveConfig(step_decay=1.0))
    per_position = divergence("forward_kl", draft, target)
    # step 0: positions 0 and 2; step 1: draft at t scored against target t + 1 with mask[t + 1]
    assert float(out.step_losses[0]) == pytest.approx(float(per_position[0, [0, 2]].mean()), 1e-5)
    step1 = divergence("forward_kl", draft[0, [0, 1]], target[0, [1, 2]])
    assert float(out.step_losses[1]) == pytest.approx(float(step1[1]), rel=1e-5)
    assert out.agreement.total.tolist() == [2, 1]
    assert float(out.loss) == pytest.approx(float(out.step_losses.mean()), rel=1e-5)


def test_fully_masked_batch_has_zero_loss_and_no_nan():
    target, draft = torch.randn(1, 4, 5), torch.randn(1, 4, 5, requires_grad=True)
    out = draft_objective([draft], target, torch.zeros(1, 4), ObjectiveConfig())
    out.loss.backward()
    assert out.loss.item() == 0.0 and torch.isfinite(draft.grad).all()
    assert math.isnan(out.agreement.top1()[0])  # nothing was counted
    assert out.agreement.tau_sim() == [1.0]


def test_reduced_vocabulary_gathers_and_renormalises_the_target():
    vocab, draft_to_target = 10, torch.tensor([7, 2, 4])
    target = torch.randn(1, 3, vocab)
    draft = torch.randn(1, 3, 3, requires_grad=True)
    mask = torch.ones(1, 3, dtype=torch.bool)
    out = draft_objective([draft], target, mask, ObjectiveConfig(), draft_to_target)
    p = torch.softmax(target[0, :2][:, draft_to_target], -1)  # renormalised on the draft ids
    q = torch.softmax(draft[0, :2].detach(), -1)
    expected = (p * (p / q).log()).sum(-1).mean()
    assert out.loss.detach().item() == pytest.approx(float(expected), rel=1e-5)
    out.loss.backward()
    assert draft.grad.abs().sum() > 0


def test_reduced_vocabulary_agreement_and_hard_labels_use_target_ids():
    draft_to_target = torch.tensor([5, 1])
    target = torch.full((1, 4, 8), -5.0)
    target[0, 0, 1] = target[0, 1, 3] = target[0, 2, 5] = 5.0  # argmax 1, 3 (not drafted), 5
    draft = torch.zeros(1, 4, 2)
    draft[0, 0, 1] = draft[0, 1, 0] = draft[0, 2, 0] = 5.0  # proposes ids 1, 5, 5
    mask = torch.ones(1, 4, dtype=torch.bool)
    soft = draft_objective([draft], target, mask, ObjectiveConfig(), draft_to_target)
    assert soft.agreement.agree.tolist() == [2] and soft.agreement.total.tolist() == [3]
    hard = draft_objective(
        [draft], target, mask, ObjectiveConfig(divergence="ce_argmax"), draft_to_target
    )
    assert hard.agreement.total.tolist() == [2]  # the undraftable label at t = 1 is skipped
    expected = -torch.log_softmax(draft[0, [0, 2]], -1)[[0, 1], [1, 0]].mean()
    assert float(hard.loss) == pytest.approx(float(expected), rel=1e-5)


def test_decay_weights_combine_the_steps():
    target = torch.randn(1, 8, 6)
    steps = [torch.randn(1, 8, 6) for _ in range(3)]
    out = draft_objective(steps, target, torch.ones(1, 8), ObjectiveConfig(step_decay=0.5))
    expected = (out.step_losses * torch.tensor([1, 0.5, 0.25])).sum() / 1.75
    assert float(out.loss) == pytest.approx(float(expected), rel=1e-5)


def test_dpace_weighs_each_step_by_what_the_chain_can_still_earn():
    """Losses ln 2, ln 4, 0 give confidences 1/2, 1/4, 1, smoothed with alpha 1/2 to 3/4, 5/8,
    1: prefix products 3/4, 15/32, 15/32, and step k weighs their sum from k on; a step not
    counted adds nothing and weighs nothing."""
    losses = torch.tensor([math.log(2), math.log(4), 0.0])[:, None]  # (K, positions)
    every = torch.ones(3, 1, dtype=torch.bool)
    weights = dpace_weights(losses, every, alpha=0.5)[:, 0]
    torch.testing.assert_close(weights, torch.tensor([27 / 16, 15 / 16, 15 / 32]))
    weights = dpace_weights(losses, torch.tensor([[True], [True], [False]]), alpha=0.5)[:, 0]
    torch.testing.assert_close(weights, torch.tensor([39 / 32, 15 / 32, 0.0]))


def test_dpace_weights_the_counted_positions_and_trains_every_step():
    target = torch.randn(1, 8, 6)
    steps = [torch.randn(1, 8, 6, requires_grad=True) for _ in range(3)]
    mask = torch.tensor([[1, 1, 0, 1, 1, 1, 1, 1]])
    config = ObjectiveConfig(step_weighting="dpace", dpace_alpha=0.3)
    out = draft_objective(steps, target, mask, config)
    per_position = torch.zeros(3, 1, 8)
    counted = torch.zeros(3, 1, 8, dtype=torch.bool)
    with torch.no_grad():
        for k, logits in enumerate(steps):
            n = 7 - k
            per_position[k, :, :n] = divergence("forward_kl", logits[:, :n], target[:, k : k + n])
            counted[k, :, :n] = mask[:, k : k + n].bool()
    per_position = per_position.where(counted, 0.0)
    weights = dpace_weights(per_position, counted, 0.3)
    expected = (weights * per_position).sum() / counted.sum()
    loss = out.loss.item()
    assert loss == pytest.approx(float(expected), rel=1e-5)
    assert loss != pytest.approx(
        draft_objective(steps, target, mask, ObjectiveConfig()).loss.item()
    )
    out.loss.backward()
    assert all(logits.grad.abs().sum() > 0 for logits in steps)


def test_chain_acceptance_counts_and_tau_sim():
    """Step 0 agrees at t = 0, 1, 3 (of 0..3); step 1 at t = 0, 2 (of 0..2)."""
    length, vocab = 5, 3
    target = torch.zeros(1, length, vocab)
    target[..., 0] = 1.0  # the target's argmax is always 0
    steps = [torch.zeros(1, length, vocab) for _ in range(2)]
    for k, agreeing in enumerate([{0, 1, 3}, {0, 2}]):
        for t in range(length):
            steps[k][0, t, 0 if t in agreeing else 1] = 1.0
    out = draft_objective(steps, target, torch.ones(1, length), ObjectiveConfig())
    counts = out.agreement
    assert counts.total.tolist() == [4, 3] and counts.agree.tolist() == [3, 2]
    # step 1 given step 0 agreed: t = 0 (agrees) and t = 1 (does not)
    assert counts.chain_total.tolist() == [4, 2] and counts.chain_agree.tolist() == [3, 1]
    assert counts.acceptance() == [0.75, 0.5]
    # replayed rounds, 1 draft token: t=0 accepts 1 (2 tokens), t=2 none (1), t=3 predicts the
    # last token, so it drafts nothing (1); 2 draft tokens: t=0 accepts both (3), then t=3 (1).
    # Not the per-position average 1 + 0.75 + 0.75 * 0.5, which also counts the easy start t=1
    # the decoder jumps over.
    assert counts.walk_rounds.tolist() == [3, 2]
    assert counts.tau_sim() == pytest.approx([4 / 3, 4 / 2])

    # Medusa-style heads draft from step 1: the chain starts there, every step is still trained
    later = draft_objective(steps, target, torch.ones(1, length), ObjectiveConfig(), None, 1)
    assert later.agreement.total.tolist() == [3] and later.agreement.agree.tolist() == [2]
    assert later.agreement.tau_sim() == pytest.approx([3 / 2])  # rounds at t = 0 and 2
    assert later.step_losses.shape == (2,)


def test_tau_sim_restarts_at_each_packed_text_and_stops_at_its_end():
    """Two texts packed in one row (rows 0-3 and 6-8 counted): each is decoded on its own, and a
    round never drafts past its text's last token, however well the chain agrees."""
    length, vocab = 10, 3
    target = torch.zeros(1, length, vocab)
    target[..., 0] = 1.0
    step = torch.zeros(1, length, vocab)
    step[..., 0] = 1.0  # one draft step that always agrees
    mask = torch.tensor([[1, 1, 1, 1, 0, 0, 1, 1, 1, 0]])
    counts = draft_objective([step], target, mask, ObjectiveConfig()).agreement
    # text 1: rounds at 0 (2 tokens) and 2 (2 tokens, the second is the text's last, 4);
    # text 2: rounds at 6 (2 tokens) and 8 (its last row: 1 token)
    assert counts.walk_rounds.tolist() == [4] and counts.walk_tokens.tolist() == [7]


def test_agreement_from_hand_counts():
    counts = Agreement(
        agree=torch.tensor([8, 5]),
        total=torch.tensor([10, 10]),
        chain_agree=torch.tensor([8, 4]),
        chain_total=torch.tensor([10, 8]),
        walk_tokens=torch.tensor([18, 20]),
        walk_rounds=torch.tensor([10, 9]),
    )
    assert counts.top1() == [0.8, 0.5]
    assert counts.acceptance() == [0.8, 0.5]
    assert counts.tau_sim() == pytest.approx([1.8, 20 / 9])
    doubled = counts + counts
    assert doubled.acceptance() == [0.8, 0.5]
    torch.testing.assert_close(Agreement.from_tensor(doubled.as_tensor()).total, counts.total * 2)


def test_bad_objective_settings_are_clear_errors():
    with pytest.raises(ValueError, match="divergence must be one of"):
        ObjectiveConfig(divergence="kl")
    with pytest.raises(ValueError, match="jsd_beta"):
        ObjectiveConfig(jsd_beta=1.0)
    with pytest.raises(ValueError, match="step_weighting must be decay or dpace"):
        ObjectiveConfig(step_weighting="fixed")
    with pytest.raises(ValueError, match="dpace_alpha"):
        ObjectiveConfig(dpace_alpha=0.0)


def test_tau_sim_replays_greedy_decoding_on_the_targets_own_text(llama):
    """On the target's greedy text, the replayed rounds are the decoder's rounds: as many target
    forwards for as many tokens."""
    torch.manual_seed(0)
    head = fit(build_head("eagle3-reduced", llama), llama, steps=30)
    prompt, new = [5, 6, 7], 40
    text = torch.tensor(prompt + greedy_reference(llama, torch.tensor(prompt), new))
    decoder = SpeculativeDecoder(
        llama, head.as_drafter(llama), policy=FixedPolicy(max_draft_tokens=head.num_steps)
    )
    stats = decoder.generate(prompt, max_new_tokens=new).stats

    batch = target_batch(llama, head, text[None])
    batch.loss_mask = torch.zeros_like(text[None], dtype=torch.bool)
    batch.loss_mask[0, len(prompt) - 1 :] = True  # the completion's next-token predictions
    with torch.no_grad():
        steps = head.forward_train(batch)
    out = draft_objective(
        steps, batch.target_logits, batch.loss_mask, ObjectiveConfig(), head.draft_to_target()
    )
    walk = out.agreement
    assert 0 < stats.accepted < stats.drafted  # some drafts accepted, some rejected
    assert int(walk.walk_rounds[-1]) == stats.target_forwards
    assert int(walk.walk_tokens[-1]) == stats.new_tokens
