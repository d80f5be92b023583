"""Speculative sampling preserves the target's distribution (chi-square goodness of fit).

Every check uses a fixed seed, so the suite is deterministic; the negative controls show the
same check rejects a wrong sampler, so passing means something.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from conftest import Clock, MarkovTarget, TableDrafter, tiny_model
from scipy.stats import chisquare

from draftsmith import CostAwarePolicy, FixedPolicy, SpeculativeDecoder
from draftsmith.core.sampling import SamplingParams, probabilities, sample
from draftsmith.decoding import verify_sampling
from draftsmith.decoding.profile import CostCurve
from draftsmith.heads import Draft, DraftModelDrafter, TreeShape, build_head

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
            draft = Draft(tokens=torch.tensor([sample(q, gen)]), probs=q[None])
        else:
            draft = Draft(tokens=torch.tensor([one_hot_token]))
        path, next_token = verify_sampling(target_probs, draft, gen)
        if not path and resample_from_p:  # a classic bug: ignore the residual
            next_token = sample(p, gen)
        counts[int(draft.tokens[0]) if path else next_token] += 1
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


def _sample_sequences(decoder, n: int, **sampling) -> tuple[Counter, int, int]:
    """How often each 3-token continuation of [0] came out over seeds 0..n-1 (temperature 1
    unless `sampling` says otherwise), and the tokens drafted and accepted in all."""
    sampling = {"temperature": 1.0, **sampling}
    counts, drafted, accepted = Counter(), 0, 0
    for seed in range(n):
        result = decoder.generate([0], max_new_tokens=3, seed=seed, **sampling)
        counts[tuple(result.tokens)] += 1
        drafted += result.stats.drafted
        accepted += result.stats.accepted
    return counts, drafted, accepted


SEQ_PARAMS = {
    "t1": SamplingParams(temperature=1.0),
    "t0.7_topk3": SamplingParams(temperature=0.7, top_k=3),
    "topp0.8": SamplingParams(temperature=1.0, top_p=0.8),
}


@pytest.mark.parametrize(
    ("name", "drafter_kind"),
    [
        ("t1", "table"),
        ("t0.7_topk3", "table"),
        ("topp0.8", "table"),
        ("t1", "draft-model"),
        ("t1", "int4-draft-model"),
    ],
)
def test_three_token_sequences_follow_the_target(name, drafter_kind):
    params = SEQ_PARAMS[name]
    vocab, n = 4, 3000
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(1)) * 1.5
    target = MarkovTarget(table)
    if drafter_kind == "table":
        drafter = TableDrafter(torch.randn(3, vocab, generator=torch.Generator().manual_seed(2)))
    elif drafter_kind == "draft-model":
        drafter = DraftModelDrafter(tiny_model("llama", seed=4, vocab_size=vocab))
    else:  # q is what the 4-bit layers computed, which the rejection rule must be given
        draft_model = tiny_model("llama", seed=4, vocab_size=vocab).bfloat16()
        drafter = DraftModelDrafter(draft_model, int4=True)
    decoder = SpeculativeDecoder(target, drafter, policy=FixedPolicy(max_draft_tokens=3))
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


def _model_sequence_distribution(model, params: SamplingParams, first: int, length: int):
    """Exact probability of each continuation of `length` tokens under a (tiny) causal LM."""
    vocab = model.config.vocab_size
    probs = {}
    with torch.no_grad():
        for seq in itertools.product(range(vocab), repeat=length):
            logits = model(torch.tensor([[first, *seq[:-1]]])).logits[0].float()
            step = probabilities(logits, params)
            probs[seq] = float(torch.prod(step[torch.arange(length), torch.tensor(seq)]))
    return probs


@pytest.mark.parametrize(
    "tree", [None, TreeShape(top_k=2, depth=3, total_tokens=5)], ids=["chain", "tree"]
)
@pytest.mark.parametrize(
    ("kind", "args"),
    [("peagle", {}), ("dflash", {}), ("dflash", {"markov_rank": 4, "markov_head_type": "gated"})],
    ids=["peagle", "dflash", "dspark"],
)
def test_a_block_drafters_sequences_follow_the_target(kind, args, tree):
    """A block drafter (P-EAGLE, DFlash) drafts a block's tokens from distributions that
    ignore the tokens drafted before them, or, with DSpark's Markov head, depend on the one
    before each: verified by the rejection rule, the output still follows the target."""
    target = tiny_model("llama", seed=4, vocab_size=4)
    head = build_head(kind, target, {"num_steps": 3, **args})
    with torch.no_grad():  # a head whose drafts the target sometimes takes, sometimes not
        # the weight just before the LM head (DFlash shares the target's, left alone)
        (head.lm_head if kind == "peagle" else head.norm).weight.mul_(40.0)
        if args:  # a Markov bias as large as the logits: each row follows the token before
            head.markov_head.markov_w1.weight.normal_(
                0.0, 3.0, generator=torch.Generator().manual_seed(0)
            )
    policy = FixedPolicy(max_draft_tokens=3) if tree is None else FixedPolicy(tree=tree)
    decoder = SpeculativeDecoder(target, head.as_drafter(target), policy=policy)
    n = 1200
    counts, drafted, accepted = _sample_sequences(decoder, n)
    assert 0 < accepted < drafted
    exact = _model_sequence_distribution(target, SamplingParams(temperature=1.0), 0, 3)
    assert _sequence_fits(counts, exact, n)


# -- trees ---------------------------------------------------------------------------------------


def _without_replacement(q: torch.Tensor, count: int, gen, renormalise: bool = True):
    """Draw count distinct tokens from q one after another; each with the distribution it was
    drawn from (q without the earlier ones, renormalised). renormalise=False records plain q
    instead: the bug the negative control plants."""
    tokens, dists, left = [], [], q.clone()
    for _ in range(min(count, int((q > 0).sum()))):
        dist = left / left.sum()
        token = sample(dist, gen)
        tokens.append(token)
        dists.append(dist if renormalise else q)
        left[token] = 0
    return tokens, dists


class SampledTreeDrafter(TableDrafter):
    """Drafts a tree whose depth-d nodes each get branching[d] children drawn without
    replacement from the depth's processed logits."""

    def __init__(self, logits: torch.Tensor, branching: tuple[int, ...], renormalise=True) -> None:
        super().__init__(logits)
        self.branching = branching
        self.renormalise = renormalise

    def draft(self, request) -> Draft:
        tokens, parents, probs = [], [], []
        frontier = [-1]
        for depth, count in enumerate(self.branching[: request.shape.depth]):
            q = probabilities(self.logits[depth], request.sampling)
            grown = []
            for parent in frontier:
                drawn, dists = _without_replacement(q, count, request.generator, self.renormalise)
                for token, dist in zip(drawn, dists, strict=True):
                    grown.append(len(tokens))
                    tokens.append(token)
                    parents.append(parent)
                    probs.append(dist)
            frontier = grown
        return Draft(
            tokens=torch.tensor(tokens),
            probs=torch.stack(probs),
            logits=self.logits[[0] * len(tokens)],
            parents=torch.tensor(parents),
        )


TREE_SHAPES = {"fan-3": (3,), "2x2": (2, 2), "3-1-2": (3, 1, 2)}


def _first_token_counts_tree(p, q, siblings, renormalise=True, seed=0):
    """Emit the first token of a round N times; the root has `siblings` children drawn from q
    without replacement (or one-hot children: the top `siblings` of q, when renormalise is None)."""
    gen = torch.Generator().manual_seed(seed)
    counts = Counter()
    target_probs = p.expand(siblings + 1, -1)
    for _ in range(N):
        if renormalise is None:
            draft = Draft(tokens=q.topk(siblings).indices, parents=torch.full((siblings,), -1))
        else:
            tokens, dists = _without_replacement(q, siblings, gen, renormalise)
            draft = Draft(
                tokens=torch.tensor(tokens),
                probs=torch.stack(dists),
                parents=torch.full((len(tokens),), -1),
            )
        path, next_token = verify_sampling(target_probs, draft, gen)
        counts[int(draft.tokens[path[0]]) if path else next_token] += 1
    return counts


@pytest.mark.parametrize(
    ("case", "siblings"),
    [("overconfident_q", 2), ("q_zero_where_p_positive", 3), ("disjoint_supports", 3)],
)
def test_sibling_candidates_preserve_next_token_distribution(case, siblings):
    p, q = CASES[case]
    assert _fits(_first_token_counts_tree(p, q, siblings), p, N)
    assert _fits(_first_token_counts_tree(p, q, siblings, renormalise=None), p, N)


def test_negative_control_siblings_verified_against_the_wrong_q_is_detected():
    p, q = CASES["overconfident_q"]
    assert not _fits(_first_token_counts_tree(p, q, 3, renormalise=False), p, N)


@pytest.mark.parametrize(
    ("shape", "name"), [("fan-3", "t1"), ("2x2", "t0.7_topk3"), ("3-1-2", "t1")]
)
def test_three_token_sequences_follow_the_target_with_trees(shape, name):
    params = SEQ_PARAMS[name]
    vocab, n = 4, 3000
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(1)) * 1.5
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(2))
    drafter = SampledTreeDrafter(logits, TREE_SHAPES[shape])
    tree = TreeShape(top_k=2, depth=3)  # any tree shape: this drafter grows its own
    decoder = SpeculativeDecoder(MarkovTarget(table), drafter, policy=FixedPolicy(tree=tree))
    counts = Counter()
    for seed in range(n):
        result = decoder.generate(
            [0], max_new_tokens=3, temperature=params.temperature, top_k=params.top_k, seed=seed
        )
        counts[tuple(result.tokens)] += 1
    assert _sequence_fits(counts, _sequence_distribution(table, params, 0, 3), n)


@pytest.mark.parametrize(
    "tree",
    [TreeShape(top_k=2, depth=3, total_tokens=5), TreeShape(top_k=3, depth=3, expand=1)],
    ids=["eagle2", "siblings"],
)
def test_draft_model_trees_sample_the_target_distribution(tree):
    params = SEQ_PARAMS["t1"]
    vocab, n = 4, 3000
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(1)) * 1.5
    drafter = DraftModelDrafter(tiny_model("llama", seed=4, vocab_size=vocab))
    policy = FixedPolicy(tree=tree)
    decoder = SpeculativeDecoder(MarkovTarget(table), drafter, policy=policy)
    n = 2000
    counts, _, _ = _sample_sequences(decoder, n)
    assert _sequence_fits(counts, _sequence_distribution(table, params, 0, 3), n)


@pytest.mark.parametrize(
    "tree",
    [None, TreeShape(top_k=3, depth=3, total_tokens=6), TreeShape(top_k=3, depth=3, expand=1)],
    ids=["chain", "eagle2", "siblings"],
)
def test_cost_aware_cuts_keep_sampling_exact(tree):
    """The cost-aware policy cuts every draft on a verify curve with a step in it (up to 4
    tokens verify for one's cost, 5 for five times it; a drafter step costs a tenth of a plain
    step), so whether a token is verified depends on the acceptance of what was drafted before
    it, never after."""
    params = SEQ_PARAMS["t1"]
    vocab, n = 4, 2000
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(1)) * 1.5
    drafter = DraftModelDrafter(tiny_model("llama", seed=4, vocab_size=vocab))
    cost = CostCurve(tokens=[1, 2, 3, 4, 5], verify_s=[0.02, 0.02, 0.02, 0.02, 0.1], context=8)
    # The decoder's clock moves 0.01 s a reading, the policy's (a drafter step) 0.001 s.
    policy = CostAwarePolicy(
        tree=tree, siblings=0, cost=cost, patience=1e9, max_draft_tokens=4, clock=Clock(0.001)
    )
    decoder = SpeculativeDecoder(MarkovTarget(table), drafter, policy=policy, clock=Clock(0.01))
    counts, drafted, accepted = _sample_sequences(decoder, n)
    assert 0 < accepted < drafted
    assert _sequence_fits(counts, _sequence_distribution(table, params, 0, 3), n)
