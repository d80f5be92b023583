"""Draft-length policy: stopping on the (calibrated) path confidence of the policy's acceptance model."""

from __future__ import annotations

import torch
from conftest import greedy_reference

from draftsmith.decoding import DraftLengthPolicy, SpeculativeDecoder
from draftsmith.heads import DraftModelDrafter


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
