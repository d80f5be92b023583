"""Speculative sampling preserves the target's distribution (chi-square goodness of fit).

Every check uses a fixed seed, so the suite is deterministic; the negative controls show the
same check rejects a wrong sampler, so passing means something.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from conftest import MarkovTarget, TableDrafter, tiny_model
from scipy.stats import chisquare

from draftsmith import DraftLengthPolicy, SpeculativeDecoder
from draftsmith.core.sampling import SamplingParams, probabilities, sample
from draftsmith.decoding import verify_sampling
from draftsmith.heads import DraftModelDrafter

V = 6
N = 12_000
ALPHA = 1e-3


def _fits(counts: Counter, expected_probs: torch.Tensor, n: int) -> bool:
    """Chi-square goodness of fit over the cells with positive expected probability; any sample
    in a zero-probability cell fails outright."""
    support = expected_probs > 0
    if any(not support[c] for c in counts):
        return False
    observed = torch.tensor([counts.get(i, 0) for i in range(len(expected_probs))], dtype=float)
    expected = expected_probs.double() * n
    keep = support.nonzero()[:, 0]
    return chisquare(observed[keep], expected[keep] / expected[keep].sum() * n).pvalue > ALPHA


def _first_token_counts(p, q, one_hot_token=None, resample_from_p=False, seed=0):
    """Emit the first token of one verification round N times; the draft is drawn from q."""
    gen = torch.Generator().manual_seed(seed)
    counts = Counter()
    target_probs = torch.stack([p, p])
    for _ in range(N):
        if one_hot_token is None:
            draft = torch.tensor([sample(q, gen)])
            draft_probs = q[None]
        else:
            draft, draft_probs = torch.tensor([one_hot_token]), None
        n_accepted, next_token = verify_sampling(target_probs, draft, draft_probs, gen)
        if n_accepted == 0 and resample_from_p:  # a classic bug: ignore the residual
            next_token = sample(p, gen)
        counts[int(draft[0]) if n_accepted else next_token] += 1
    return counts


def _dist(*values):
    t = torch.tensor(values, dtype=torch.float32)
    return t / t.sum()


P = _dist(0.3, 0.25, 0.2, 0.15, 0.07, 0.03)
CASES = {
    "p_equals_q": (P, P),
    "disjoint_supports": (_dist(0.5, 0.3, 0.2, 0, 0, 0), _dist(0, 0, 0, 0.2, 0.5, 0.3)),
    "q_zero_where_p_positive": (P, _dist(0.6, 0, 0.4, 0, 0, 0)),
    "overconfident_q": (P, _dist(0.05, 0.05, 0.8, 0.05, 0.03, 0.02)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_verification_preserves_next_token_distribution(case):
    p, q = CASES[case]
    assert _fits(_first_token_counts(p, q), p, N)


@pytest.mark.parametrize("token", [0, 4])
def test_one_hot_draft_preserves_distribution(token):
    assert _fits(_first_token_counts(P, None, one_hot_token=token), P, N)


def test_top_k_top_p_processed_distribution_is_preserved():
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0])
    params = SamplingParams(temperature=0.8, top_k=4, top_p=0.9)
    p = probabilities(logits, params)
    q = probabilities(logits.flip(0), params)
    assert (p == 0).sum() >= 2  # top-k / top-p really cut the tail
    assert _fits(_first_token_counts(p, q), p, N)


@pytest.mark.parametrize("case", ["overconfident_q", "q_zero_where_p_positive"])
def test_negative_control_wrong_residual_is_detected(case):
    p, q = CASES[case]
    assert not _fits(_first_token_counts(p, q, resample_from_p=True), p, N)


def _sequence_distribution(table: torch.Tensor, params: SamplingParams, first: int, length: int):
    """Exact probability of each continuation of `length` tokens under a Markov target."""
    step = probabilities(table, params)  # (V, V): row = previous token
    vocab = table.shape[0]
    probs = {}
    for seq in itertools.product(range(vocab), repeat=length):
        prob, prev = 1.0, first
        for t in seq:
            prob *= float(step[prev, t])
            prev = t
        probs[seq] = prob
    return probs


def _sequence_fits(counts: Counter, exact: dict, n: int) -> bool:
    if any(exact[s] == 0 for s in counts):
        return False
    cells = [s for s, p in exact.items() if p > 0]
    observed = torch.tensor([counts.get(s, 0) for s in cells], dtype=float)
    expected = torch.tensor([exact[s] for s in cells], dtype=float)
    return chisquare(observed, expected / expected.sum() * n).pvalue > ALPHA


SEQ_PARAMS = {
    "t1": SamplingParams(temperature=1.0),
    "t0.7_topk3": SamplingParams(temperature=0.7, top_k=3),
    "topp0.8": SamplingParams(temperature=1.0, top_p=0.8),
}


@pytest.mark.parametrize(
    ("name", "drafter_kind"),
    [("t1", "table"), ("t0.7_topk3", "table"), ("topp0.8", "table"), ("t1", "draft-model")],
)
def test_three_token_sequences_follow_the_target(name, drafter_kind):
    params = SEQ_PARAMS[name]
    vocab, n = 4, 3000
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(1)) * 1.5
    target = MarkovTarget(table)
    if drafter_kind == "table":
        drafter = TableDrafter(torch.randn(3, vocab, generator=torch.Generator().manual_seed(2)))
    else:
        drafter = DraftModelDrafter(tiny_model("llama", seed=4, vocab_size=vocab))
    decoder = SpeculativeDecoder(target, drafter, policy=DraftLengthPolicy(max_draft_tokens=3))
    counts = Counter()
    drafted = accepted = 0
    for seed in range(n):
        result = decoder.generate(
            [0],
            max_new_tokens=3,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            seed=seed,
        )
        counts[tuple(result.tokens)] += 1
        drafted += result.stats.drafted
        accepted += result.stats.accepted
    assert 0 < accepted < drafted  # both branches of the rejection rule were exercised
    assert _sequence_fits(counts, _sequence_distribution(table, params, 0, 3), n)
