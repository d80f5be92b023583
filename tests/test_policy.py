"""Draft-length policy: stopping on the (calibrated) path confidence of the policy's acceptance model."""

from __future__ import annotations

import torch
from conftest import greedy_reference

from draftsmith.decoding import DraftLengthPolicy, SpeculativeDecoder
from draftsmith.decoding.profile import CostCurve
from draftsmith.heads import Draft, DraftModelDrafter, TreeShape


class ConstantCalibrator:
    """Claims every drafted token is accepted with probability `p`."""

    def __init__(self, p: float) -> None:
        self.p = p
        self.seen_positions: list[float] = []

    def predict_signals(self, signals):
        self.seen_positions.extend(signals["position"].tolist())
        return torch.full_like(signals["top1_prob"], self.p)


def _drafts(llama, p: float, threshold: float):
    drafter = DraftModelDrafter(llama)
    calibrator = ConstantCalibrator(p)
    policy = DraftLengthPolicy(
        max_draft_tokens=6, min_path_confidence=threshold, acceptance=calibrator
    )
    prompt = torch.tensor([2, 4, 6])
    result = SpeculativeDecoder(llama, drafter, policy=policy).generate(prompt, max_new_tokens=21)
    assert result.tokens == greedy_reference(llama, prompt, 21)
    return result.stats, calibrator


def test_calibrated_confidence_sets_the_draft_length(llama):
    # path after j tokens is 0.6**j: 0.6, 0.36, 0.216 -> the third token falls below 0.3.
    stats, calibrator = _drafts(llama, p=0.6, threshold=0.3)
    assert stats.drafted_by_position[2:3] and len(stats.drafted_by_position) == 3
    assert calibrator.seen_positions[:3] == [0.0, 1.0, 2.0]


def test_confident_drafter_drafts_to_the_maximum(llama):
    stats, _ = _drafts(llama, p=0.99, threshold=0.3)
    assert len(stats.drafted_by_position) == 6


def test_without_threshold_the_calibrator_is_not_consulted(llama):
    _, calibrator = _drafts(llama, p=0.1, threshold=0.0)
    assert calibrator.seen_positions == []


# -- trees ---------------------------------------------------------------------------------------


def _curve(verify_s: list[float]) -> CostCurve:
    return CostCurve(tokens=list(range(1, len(verify_s) + 1)), verify_s=verify_s, context=8)


def _valued_draft(values: list[float]) -> Draft:
    """A chain whose node values are given (non-increasing, as along any path)."""
    return Draft(tokens=torch.arange(len(values)), values=torch.tensor(values))


def test_a_flat_cost_keeps_every_valuable_node_and_a_steep_one_none():
    tree = TreeShape(top_k=4, depth=4, total_tokens=16)
    draft = _valued_draft([0.9, 0.8, 0.7, 0.6])
    flat = DraftLengthPolicy(tree=tree, cost=_curve([1.0] * 6))
    assert len(flat.trim(draft)) == 4
    assert flat.shape() == TreeShape(top_k=4, depth=4, total_tokens=16)  # budget 8, capped
    steep = DraftLengthPolicy(tree=tree, cost=_curve([1.0, 3.0, 5.0, 7.0, 9.0, 11.0]))
    assert len(steep.trim(draft)) == 0
    # The next round drafts a small tree: drafting costs no more than the verification it feeds.
    assert steep.shape() == TreeShape(top_k=2, depth=2, total_tokens=16)


def test_calibrated_acceptance_ranks_tree_nodes(llama):
    calibrator = ConstantCalibrator(0.5)
    policy = DraftLengthPolicy(tree=TreeShape(top_k=2, depth=2), acceptance=calibrator)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    accept = policy.acceptance_fn()(logits, torch.tensor([1]), torch.tensor([0.7]))
    probs = logits.softmax(-1)
    # The top-1 token gets the calibrated 0.5; the others in proportion to their draft probs.
    torch.testing.assert_close(accept, 0.5 * probs / probs.max())
    assert calibrator.seen_positions == [1.0]
    prompt = torch.tensor([2, 4, 6])
    decoder = SpeculativeDecoder(llama, DraftModelDrafter(llama), policy=policy)
    assert decoder.generate(prompt, max_new_tokens=12).tokens == greedy_reference(llama, prompt, 12)
