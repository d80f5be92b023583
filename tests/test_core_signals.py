"""Confidence signals (`draftsmith.core.signals`), the numbers every calibrator reads, against
hand computations and invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from draftsmith.core.signals import (
    FIRST_PARENT,
    SIGNAL_NAMES,
    confidence_signals,
    distribution,
    signal_matrix,
    token_signals,
)


def test_signals_match_hand_computation():
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.05, 0.9, 0.05]])
    signals = confidence_signals(probs.log())
    assert tuple(signals) == SIGNAL_NAMES
    entropy = -(probs * probs.log()).sum(-1)
    torch.testing.assert_close(signals["top1_prob"], torch.tensor([0.5, 0.9]))
    torch.testing.assert_close(signals["margin"], torch.tensor([0.2, 0.85]))
    torch.testing.assert_close(signals["entropy"], entropy)
    torch.testing.assert_close(signals["position"], torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(signals["path_prob"], torch.tensor([0.5, 0.45]))
    torch.testing.assert_close(signals["composite"], torch.tensor([0.5, 0.9]) * (-entropy).exp())
    assert all(s.shape == (2,) and s.dtype == torch.float32 for s in signals.values())


@settings(max_examples=40, deadline=None, database=None)
@given(
    k=st.integers(1, 6),
    vocab=st.integers(1, 40),
    scale=st.floats(0.01, 30),
    seed=st.integers(0, 2**16),
)
def test_signal_invariants(k, vocab, scale, seed):
    logits = torch.randn(k, vocab, generator=torch.Generator().manual_seed(seed)) * scale
    s = confidence_signals(logits)
    assert ((s["top1_prob"] >= 1 / vocab - 1e-6) & (s["top1_prob"] <= 1)).all()
    assert ((s["margin"] >= 0) & (s["margin"] <= s["top1_prob"])).all()
    assert ((s["entropy"] >= -1e-6) & (s["entropy"] <= math.log(vocab) + 1e-5)).all()
    assert (s["path_prob"][1:] <= s["path_prob"][:-1]).all()
    assert ((s["composite"] > 0) & (s["composite"] <= s["top1_prob"] + 1e-7)).all()


def test_signals_temperature_and_masked_tokens():
    logits = torch.randn(4, 7)
    hot = confidence_signals(logits, temperature=2.0)
    for name, value in confidence_signals(logits / 2.0).items():
        torch.testing.assert_close(hot[name], value)
    # A masked (-inf) token contributes nothing: same signals as without it.
    masked = torch.cat([logits, torch.full((4, 1), float("-inf"))], dim=1)
    for name, value in confidence_signals(masked).items():
        torch.testing.assert_close(value, confidence_signals(logits)[name])


def test_signals_single_token_vocab_and_empty_draft():
    one = confidence_signals(torch.zeros(3, 1))
    torch.testing.assert_close(one["margin"], torch.ones(3))
    torch.testing.assert_close(one["entropy"], torch.zeros(3))
    empty = confidence_signals(torch.zeros(0, 5))
    assert all(v.shape == (0,) for v in empty.values())


@pytest.mark.parametrize(
    "bad",
    [
        torch.tensor([[0.0, float("nan")]]),
        torch.tensor([[0.0, float("inf")]]),
        torch.tensor([[0.0, 1.0], [float("-inf"), float("-inf")]]),
        torch.zeros(5),
        torch.zeros(2, 3, dtype=torch.long),
    ],
)
def test_signals_reject_bad_logits(bad):
    with pytest.raises(ValueError, match="logits"):
        confidence_signals(bad)


def test_signals_reject_bad_temperature():
    with pytest.raises(ValueError, match="temperature"):
        confidence_signals(torch.zeros(2, 3), temperature=0.0)


def test_signal_matrix_orders_columns_and_checks_names():
    signals = confidence_signals(torch.randn(3, 5))
    x = signal_matrix(signals, ["entropy", "top1_prob"])
    assert x.shape == (3, 2) and x.dtype == np.float64
    np.testing.assert_allclose(x[:, 1], signals["top1_prob"].numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="unknown signals"):
        signal_matrix(signals, ["logit"])
    with pytest.raises(ValueError, match="missing"):
        signal_matrix({"top1_prob": signals["top1_prob"]}, ["entropy"])


def test_token_signals_are_confidence_signals_of_one_token():
    """The scalar form (a draft tree's per-node work) gives the tensor form's numbers."""
    logits = torch.randn(4, 9, generator=torch.Generator().manual_seed(3)) * 2
    chain = confidence_signals(logits)
    _, top, entropy = distribution(logits)
    parent = FIRST_PARENT
    for i, (row, h) in enumerate(zip(top.values.tolist(), entropy.tolist(), strict=True)):
        token = token_signals(row, h, *parent)
        assert list(token) == list(SIGNAL_NAMES)
        for name, value in token.items():
            assert value == pytest.approx(float(chain[name][i]), rel=1e-6), name
        parent = (token["position"], token["path_prob"])


def test_tree_and_step_forms_agree_with_chains():
    """A tree's rows follow their parents (position = depth - 1, path_prob along the path); a
    chain given a step at a time is the chain given at once."""
    logits = torch.randn(5, 7, generator=torch.Generator().manual_seed(4))
    tree = confidence_signals(logits, parents=[-1, 0, 0, 1, -1])
    torch.testing.assert_close(tree["position"], torch.tensor([0.0, 1.0, 1.0, 2.0, 0.0]))
    top1 = tree["top1_prob"]
    path = torch.stack([top1[0], top1[0] * top1[1], top1[0] * top1[2], top1[0] * top1[1] * top1[3]])
    torch.testing.assert_close(tree["path_prob"][:4], path)
    assert tree["path_prob"][4] == top1[4]
    chain = confidence_signals(logits)
    steps = confidence_signals(list(logits))
    for name in SIGNAL_NAMES:
        torch.testing.assert_close(steps[name], chain[name], rtol=0, atol=0)
        if name not in ("position", "path_prob"):
            torch.testing.assert_close(tree[name], chain[name], rtol=0, atol=0)
    with pytest.raises(ValueError, match="parents"):
        confidence_signals(logits, parents=[-1, 0])
