"""Collecting (signals, outcome) rows from real decoding runs."""

from __future__ import annotations

import pytest
import torch
from conftest import perturbed_copy

from draftsmith.calibration.collect import collect_from_decoding
from draftsmith.decoding import DraftLengthPolicy, SpeculativeDecoder
from draftsmith.heads import DraftModelDrafter, NgramDrafter

PROMPTS = [[5, 6, 7], [40, 41], [100, 7, 3, 9]]


def test_identical_drafter_is_always_accepted(llama):
    decoder = SpeculativeDecoder(
        llama, DraftModelDrafter(llama), policy=DraftLengthPolicy(max_tokens=4)
    )
    rows = collect_from_decoding(decoder, PROMPTS, max_new_tokens=10)
    assert len(rows) > 0
    assert all(a == 1.0 for a in rows["accepted"])
    assert rows["accept_prob"] == pytest.approx([1.0] * len(rows), abs=1e-4)


def test_rows_stop_at_the_first_rejection(llama):
    decoder = SpeculativeDecoder(
        llama,
        DraftModelDrafter(perturbed_copy(llama, 0.05)),
        policy=DraftLengthPolicy(max_tokens=4),
    )

    rows = collect_from_decoding(decoder, PROMPTS, max_new_tokens=16, temperature=1.0)
    accepted = torch.tensor(rows["accepted"])
    assert 0 < accepted.sum() < len(rows)
    assert all(0.0 <= p <= 1.0 for p in rows["accept_prob"])
    # Within each draft, a rejection can only be the last recorded position: after a 0 the next
    # row starts a new draft at position 0.
    positions = rows["position"]
    for i in range(len(rows) - 1):
        if accepted[i] == 0:
            assert positions[i + 1] == 0


def test_drafter_without_confidence_is_a_clear_error(llama):
    decoder = SpeculativeDecoder(llama, NgramDrafter())
    with pytest.raises(ValueError, match="no drafted token was recorded"):
        collect_from_decoding(decoder, PROMPTS, max_new_tokens=8)
