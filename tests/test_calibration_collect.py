"""Collecting (signals, outcome) rows from real decoding runs and teacher-forced passes."""

from __future__ import annotations

import pytest
import torch
from conftest import greedy_reference, perturbed_copy, tiny_model
from head_helpers import build_head, fit

from draftsmith.calibration.collect import collect_from_decoding, collect_teacher_forced
from draftsmith.core.context import CONTEXT_SIGNAL
from draftsmith.decoding import FixedPolicy, SpeculativeDecoder
from draftsmith.heads import DraftModelDrafter, NgramDrafter

PROMPTS = [[5, 6, 7], [40, 41], [100, 7, 3, 9]]


def test_identical_drafter_is_always_accepted(llama):
    decoder = SpeculativeDecoder(
        llama, DraftModelDrafter(llama), policy=FixedPolicy(max_draft_tokens=4)
    )
    rows = collect_from_decoding(decoder, PROMPTS, max_new_tokens=10)
    assert len(rows) > 0
    assert all(a == 1.0 for a in rows["accepted"])
    assert rows["accept_prob"] == pytest.approx([1.0] * len(rows), abs=1e-4)


def test_rows_stop_at_the_first_rejection(llama):
    decoder = SpeculativeDecoder(
        llama,
        DraftModelDrafter(perturbed_copy(llama, 0.05)),
        policy=FixedPolicy(max_draft_tokens=4),
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


@pytest.mark.parametrize(
    "name, vocab_size",
    [
        ("eagle3-reduced", 256),
        ("peagle-reduced", 256),
        ("dflash-reduced", 256),
        ("medusa", 256),
        ("mtp-reduced", 256),
        ("eagle3", 6),
    ],
)
def test_teacher_forced_on_greedy_text_reproduces_the_decoding_records(llama, name, vocab_size):
    """On the target's own greedy text a teacher-forced pass sees every context decoding sees,
    so each record of a real decoding run is among its records (same draft position, same
    confidence, same outcome, same context match); it also scores chains starting at every other
    position. A target of 6 tokens repeats itself, so some drafted tokens repeat the context."""
    torch.manual_seed(0)
    target = llama if vocab_size == 256 else tiny_model(vocab_size=vocab_size)
    head = build_head(name, target)
    if target is llama:  # untrained, a 6-token head drafts well enough (and the training
        head = fit(head, target, steps=30)  # prompts lie outside its vocabulary)
    # No token 0 in a prompt: `greedy_reference` would mask it as padding.
    prompt, new = [1, 2, 3, 4, 5, 3, 1] if vocab_size < 8 else [5, 6, 7], 24
    text = prompt + greedy_reference(target, torch.tensor(prompt), new)
    decoder = SpeculativeDecoder(
        target, head.as_drafter(target), policy=FixedPolicy(max_draft_tokens=head.num_steps)
    )
    decoded = collect_from_decoding(decoder, [prompt], max_new_tokens=new)
    loss_mask = torch.tensor([0] * len(prompt) + [1] * new)
    forced = collect_teacher_forced(head, target, [(torch.tensor(text), loss_mask)])

    assert 0 < sum(decoded["accepted"]) < len(decoded)  # some accepted, some rejected
    assert len(forced) > len(decoded)
    if vocab_size < 8:
        assert 0 < sum(decoded[CONTEXT_SIGNAL]) < len(decoded)
    keys = ("position", "top1_prob", "entropy", "accepted", CONTEXT_SIGNAL)
    pool = [tuple(forced[k][i] for k in keys) for i in range(len(forced))]
    for i in range(len(decoded)):
        record = tuple(decoded[k][i] for k in keys)
        match = next(
            (
                other
                for other in pool
                if other[0] == record[0]
                and other[3] == record[3]
                and other[4] == record[4]
                and abs(other[1] - record[1]) < 1e-4
                and abs(other[2] - record[2]) < 1e-3
            ),
            None,
        )
        assert match is not None, f"decoding record {record} has no teacher-forced twin"
        pool.remove(match)


def test_teacher_forced_cuts_chains_where_the_text_leaves_the_greedy_path(llama):
    head = fit(build_head("eagle3", llama), llama, steps=10)
    ids = torch.randint(3, 200, (40,), generator=torch.Generator().manual_seed(1))
    documents = [(ids, torch.ones_like(ids)), (ids[:25], torch.ones_like(ids[:25]))]
    rows = collect_teacher_forced(head, llama, documents, temperature=0.7)
    positions = torch.tensor(rows["position"])
    # Random text almost never follows the target's argmax: chains stop at step 0 or 1.
    assert (positions == 0).sum() == (40 - 1) + (25 - 1)  # padding drafts nothing
    assert (positions > 0).sum() < (positions == 0).sum() // 4
    assert all(0.0 <= p <= 1.0 for p in rows["accept_prob"])
    assert set(rows["source"]) == {0, 1}
    # Right padding changes nothing for the longer document's records.
    alone = collect_teacher_forced(head, llama, documents[:1], temperature=0.7)
    first = [i for i, source in enumerate(rows["source"]) if source == 0]
    assert len(first) == len(alone)
    assert [rows["top1_prob"][i] for i in first] == pytest.approx(alone["top1_prob"], abs=1e-5)
