"""Lossy verifiers: typical acceptance (Medusa-2) and confidence-modulated acceptance, on
hand-built target distributions, chains and trees, and inside the decoder."""

from __future__ import annotations

import pytest
import torch
from conftest import greedy_reference, perturbed_copy

from draftsmith.core.sampling import SamplingParams, probabilities
from draftsmith.decoding import SpeculativeDecoder
from draftsmith.decoding.lossy import (
    VERIFIERS,
    ModulatedVerifier,
    TypicalVerifier,
    build_verifier,
    drafter_confidence,
)
from draftsmith.decoding.verify import LosslessVerifier, verify_greedy, verify_sampling
from draftsmith.heads import DraftModelDrafter
from draftsmith.heads.base import Draft

GREEDY = SamplingParams()
V = 6


def rows(*dists: list[float]) -> torch.Tensor:
    """Target logits (n, V) whose softmax is each given distribution (padded with tiny mass)."""
    probs = torch.full((len(dists), V), 1e-6)
    for i, dist in enumerate(dists):
        probs[i, : len(dist)] = torch.tensor(dist)
    return (probs / probs.sum(-1, keepdim=True)).log()


def draft(tokens: list[int], parents: list[int] | None = None, logits=None) -> Draft:
    return Draft(
        tokens=torch.tensor(tokens),
        parents=None if parents is None else torch.tensor(parents),
        logits=logits,
    )


PEAKED = [0.9, 0.06, 0.04]  # exp(-H) = 0.72: the runner-up is far below it
SPREAD = [0.3, 0.25, 0.2, 0.15, 0.1]  # H = 1.54 nats: several tokens are plausible


def test_flags_and_registry():
    assert TypicalVerifier.lossy and ModulatedVerifier.lossy
    assert not LosslessVerifier.lossy
    assert set(VERIFIERS) == {"lossless", "typical", "modulated"}
    assert isinstance(build_verifier("lossless"), LosslessVerifier)
    assert build_verifier("typical", 0.25) == TypicalVerifier(epsilon=0.25, delta=0.5)
    assert build_verifier("modulated", 0.3) == ModulatedVerifier(strength=0.3)
    assert TypicalVerifier().delta == pytest.approx(0.3)  # Medusa-2: epsilon 0.09, sqrt of it


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: build_verifier("relaxed"), "unknown verification mode"),
        (lambda: build_verifier("lossless", 0.5), "takes no threshold"),
        (lambda: build_verifier("typical", 0.0), r"epsilon in \(0, 1\]"),
        (lambda: build_verifier("typical", 1.5), r"epsilon in \(0, 1\]"),
        (lambda: build_verifier("modulated", 1.0), r"strength in \[0, 1\)"),
        (lambda: build_verifier("modulated", -0.1), r"strength in \[0, 1\)"),
        (lambda: TypicalVerifier(epsilon=0.5, delta=2.0), r"delta in \(0, 1\]"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_typical_at_its_strictest_is_greedy_on_peaked_rows():
    logits = rows(PEAKED, [0.05, 0.85, 0.1], [0.1, 0.1, 0.8], PEAKED)
    strict = TypicalVerifier(epsilon=1.0)
    for tokens in ([0, 1, 2], [0, 2, 2], [1, 1, 2], [0, 1, 0]):
        chain = draft(tokens)
        assert strict(logits, chain, GREEDY, None) == verify_greedy(logits, chain)


def test_typical_at_its_strictest_still_accepts_a_near_tie():
    # The documented limit: 0.45 > exp(-H) = 0.39, so the runner-up passes too.
    logits = rows([0.45, 0.45, 0.1], PEAKED)
    assert verify_greedy(logits, draft([1])) == ([], 0)
    assert TypicalVerifier(epsilon=1.0)(logits, draft([1]), GREEDY, None) == ([0], 0)


def test_typical_accepts_plausible_and_rejects_implausible_tokens():
    typical = TypicalVerifier()
    # Spread target: 0.25 (not the argmax) beats min(0.09, 0.3 * exp(-1.54)) = 0.064.
    logits = rows(SPREAD, PEAKED)
    assert typical(logits, draft([1]), GREEDY, None) == ([0], 0)
    # Peaked target: 0.04 is below min(0.09, 0.3 * 0.72) = 0.09.
    logits = rows(PEAKED, PEAKED)
    assert typical(logits, draft([2]), GREEDY, None) == ([], 0)
    # A smaller epsilon accepts it.
    assert TypicalVerifier(epsilon=0.01)(logits, draft([2]), GREEDY, None) == ([0], 0)


def test_typical_chain_stops_at_the_first_rejection():
    logits = rows(SPREAD, PEAKED, SPREAD, SPREAD)
    # Node 0 plausible (0.2), node 1 implausible (0.04 under a peaked row), node 2 never reached.
    path, nxt = TypicalVerifier()(logits, draft([2, 2, 1]), GREEDY, None)
    assert (path, nxt) == ([0], 0)


def test_trees_take_the_longest_accepted_path_first_in_draft_order():
    # Both root children pass under SPREAD (tokens 4 and 1); node 0's child (token 3 after a
    # peaked row) fails, node 1's child (token 0, the argmax there) passes: the deeper path wins.
    tree = draft([4, 1, 0, 3], parents=[-1, -1, 1, 0])
    target = rows(SPREAD, PEAKED, PEAKED, PEAKED, PEAKED)
    assert TypicalVerifier()(target, tree, GREEDY, None) == ([1, 2], 0)
    # Two equally long passing paths: the first in draft order wins.
    tree = draft([1, 0, 0, 0], parents=[-1, -1, 0, 1])
    assert TypicalVerifier()(rows(SPREAD, *[PEAKED] * 4), tree, GREEDY, None) == ([0, 2], 0)


def test_typical_sampling_next_token_comes_from_the_processed_target():
    sampling = SamplingParams(temperature=1.0, top_k=1)  # one-hot: the draw is determined
    logits = rows(SPREAD, [0.1, 0.1, 0.1, 0.7])
    gen = torch.Generator().manual_seed(0)
    # top_k=1 leaves p one-hot, so only the argmax passes at the root.
    assert TypicalVerifier()(logits, draft([1]), sampling, gen) == ([], 0)
    assert TypicalVerifier()(logits, draft([0]), sampling, gen) == ([0], 3)


def confident_logits(n: int, token: int = 0) -> torch.Tensor:
    """Draft logits (n, V) of a drafter sure of `token` (confidence near 1)."""
    logits = torch.full((n, V), -20.0)
    logits[:, token] = 10.0
    return logits


def test_drafter_confidence_is_high_when_sure_and_zero_on_a_tie():
    sure = drafter_confidence(draft([0], logits=confident_logits(1)))
    tie = drafter_confidence(draft([0], logits=torch.zeros(1, V)))
    assert sure.item() > 0.99 and tie.item() == pytest.approx(0.0, abs=1e-6)
    assert drafter_confidence(draft([0])).tolist() == [0.0]  # no logits: no relaxation


def test_modulated_relaxes_only_for_a_confident_drafter():
    # Target: 0.5 for token 0, 0.4 for token 1 (ratio 0.8); drafter proposes token 1.
    target = rows([0.5, 0.4, 0.1], PEAKED)
    modulated = ModulatedVerifier(strength=0.5)  # tolerance 1 - 0.5 c >= 0.5 when sure
    assert modulated(target, draft([1], logits=confident_logits(1, 1)), GREEDY, None) == ([0], 0)
    assert modulated(target, draft([1], logits=torch.zeros(1, V)), GREEDY, None) == ([], 0)
    # Implausible (ratio 0.02) stays rejected even for a sure drafter.
    target = rows([0.5, 0.01, 0.49], PEAKED)
    assert modulated(target, draft([1], logits=confident_logits(1, 1)), GREEDY, None) == ([], 0)


def test_modulated_tree_path():
    # Root: token 0 is the argmax (node 0, a leaf); token 1 has ratio 0.8 (node 1), and node 1's
    # child node 3 carries the argmax after it, so relaxing node 1 gives a longer path.
    tree = draft([0, 1, 2, 0], parents=[-1, -1, 1, 1], logits=confident_logits(4, 0))
    target = rows([0.5, 0.4, 0.1], PEAKED, PEAKED, PEAKED, [0.1, 0.1, 0.8])
    assert verify_greedy(target, tree) == ([0], 0)
    assert ModulatedVerifier(strength=0.3)(target, tree, GREEDY, None) == ([1, 3], 2)
    assert ModulatedVerifier(strength=0.1)(target, tree, GREEDY, None) == ([0], 0)


def random_case(seed: int, tree: bool) -> tuple[torch.Tensor, Draft]:
    gen = torch.Generator().manual_seed(seed)
    parents = [-1, -1, 0, 1, 2, 2] if tree else [-1, 0, 1, 2, 3, 4]
    target = torch.randn(len(parents) + 1, V, generator=gen) * 3
    argmax = target.argmax(-1)
    # Half the nodes carry the target's argmax after their parent, so paths go somewhere.
    tokens = [
        int(argmax[p + 1]) if i % 2 == 0 else int(torch.randint(V, (1,), generator=gen))
        for i, p in enumerate(parents)
    ]
    if tree:  # siblings must differ
        tokens[1] = (tokens[0] + 1) % V
        tokens[5] = (tokens[4] + 1) % V
    logits = torch.randn(len(parents), V, generator=gen) * 3
    sampled = probabilities(logits, SamplingParams(temperature=1.0))
    return target, Draft(
        tokens=torch.tensor(tokens), parents=torch.tensor(parents), logits=logits, probs=sampled
    )


@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_modulated_at_strength_zero_is_lossless(seed, tree):
    target, case = random_case(seed, tree)
    zero = ModulatedVerifier(strength=0.0)
    assert zero(target, case, GREEDY, None) == verify_greedy(target, case)
    sampling = SamplingParams(temperature=1.0)
    ours = zero(target, case, sampling, torch.Generator().manual_seed(seed))
    lossless = verify_sampling(
        probabilities(target, sampling), case, torch.Generator().manual_seed(seed)
    )
    assert ours == lossless


def test_modulated_sampling_accepts_more_often():
    # p(x) = 0.2, q(x) = 0.8: lossless accepts with 0.25, tolerance 0.5 with 0.5.
    target = rows([0.7, 0.2, 0.1], PEAKED)
    q = torch.tensor([[0.1, 0.8, 0.1, 0.0, 0.0, 0.0]])
    chain = Draft(tokens=torch.tensor([1]), probs=q, logits=confident_logits(1, 1))
    sampling = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    verifier = ModulatedVerifier(strength=0.5)
    accepted = sum(bool(verifier(target, chain, sampling, gen)[0]) for _ in range(2000))
    assert abs(accepted / 2000 - 0.5) < 0.05


def test_decoder_reports_lossy(llama):
    drafter = DraftModelDrafter(perturbed_copy(llama, scale=0.05))
    prompt = torch.tensor([1, 2, 3, 4])
    plain = SpeculativeDecoder(llama, drafter).generate(prompt, max_new_tokens=12)
    assert not plain.lossy
    assert plain.tokens == greedy_reference(llama, prompt, 12)
    for name, threshold in [("typical", 0.09), ("modulated", 0.5)]:
        decoder = SpeculativeDecoder(llama, drafter, verifier=build_verifier(name, threshold))
        for temperature in (0.0, 1.0):
            out = decoder.generate(prompt, max_new_tokens=12, temperature=temperature, seed=0)
            assert out.lossy and len(out.tokens) == 12
    # Strength 0 keeps the target's greedy output.
    zero = SpeculativeDecoder(llama, drafter, verifier=ModulatedVerifier(strength=0.0))
    assert zero.generate(prompt, max_new_tokens=12).tokens == plain.tokens
