"""The committed sequence's n-grams (`ContextIndex`) and the `context_match` signal drafts carry."""

from __future__ import annotations

import pytest
import torch
from conftest import greedy_reference, perturbed_copy, tiny_model

from draftsmith import FixedPolicy, SpeculativeDecoder
from draftsmith.calibration import PlattScaling
from draftsmith.core.context import CONTEXT_SIGNAL, ContextIndex
from draftsmith.core.sampling import SamplingParams
from draftsmith.decoding import ThresholdPolicy
from draftsmith.heads import Draft, DraftModelDrafter, TreeShape
from draftsmith.heads.base import DraftRequest, raw_acceptance
from draftsmith.heads.tree import DynamicTree


def _grams(sequence: list[int], n: int) -> set[tuple[int, ...]]:
    return {tuple(sequence[i : i + n + 1]) for i in range(len(sequence) - n)}


def _brute_match(sequence: list[int], before: list[int], token: int, n: int = 3) -> bool:
    return len(before) >= n and (*before[-n:], token) in _grams(sequence, n)


def _expected_match(committed: list[int], draft: Draft, node: int) -> bool:
    """Whether the top-1 token of node's distribution continues an n-gram of committed, after
    committed and the node's ancestors."""
    before, ancestor = [], int(draft.parents[node])
    while ancestor >= 0:
        before.insert(0, int(draft.tokens[ancestor]))
        ancestor = int(draft.parents[ancestor])
    return _brute_match(committed, committed + before, int(draft.logits[node].argmax()))


def test_a_context_index_knows_which_tokens_continue_an_earlier_ngram():
    index = ContextIndex([1, 2, 3, 4, 9, 1, 2], n=2)
    assert index.tail() == [1, 2]
    assert index.matches([1, 2], 3)  # "1 2 3" occurred
    assert not index.matches([1, 2], 9)
    assert index.matches([7, 7, 4, 9], 1)  # only the last n tokens before count
    assert not index.matches([2], 3)  # fewer than n tokens before
    index.extend([9])  # "1 2 9" is committed now
    assert index.matches([1, 2], 9) and index.tail() == [2, 9]


def test_a_context_index_grown_token_by_token_equals_one_built_at_once():
    sequence = torch.randint(0, 5, (200,), generator=torch.Generator().manual_seed(0)).tolist()
    grown = ContextIndex(sequence[:7])
    for start in range(7, 200, 13):
        grown.extend(sequence[start : start + 13])
    whole = ContextIndex(sequence)
    assert grown.tail() == whole.tail() == sequence[-3:]
    for before in (sequence[i : i + 3] for i in range(0, 190, 7)):
        for token in range(5):
            expected = _brute_match(sequence, before, token)
            assert grown.matches(before, token) == whole.matches(before, token) == expected


def test_a_context_index_needs_at_least_one_token_before():
    with pytest.raises(ValueError, match="n >= 1"):
        ContextIndex(n=0)


@pytest.mark.parametrize(
    "shape", [TreeShape(top_k=3, depth=4, total_tokens=9), TreeShape(top_k=3, depth=4, expand=1)]
)
@pytest.mark.parametrize("support", [None, torch.tensor([7, 2, 11, 5, 13, 0])])
def test_each_tree_node_says_whether_its_top1_token_continues_the_context(shape, support):
    """A node's `context_match`: its parent distribution's top-1 token after the three tokens
    before it (committed, then the node's drafted ancestors) occurred in the committed sequence."""
    columns = support if support is not None else torch.arange(6)
    generator = torch.Generator().manual_seed(3)
    # A short alphabet, so that about one 4-gram in five occurred before.
    committed = columns[torch.randint(0, len(columns), (300,), generator=generator)].tolist()
    seen = set()
    for seed in range(6):
        rows = torch.Generator().manual_seed(seed)

        def expand(nodes, rows=rows):
            return torch.randn(len(nodes), len(columns), generator=rows) * 2

        tree = DynamicTree(
            shape, raw_acceptance, support=support, vocab_size=16, context=ContextIndex(committed)
        )
        draft = tree.grow(expand([-1])[0], expand)
        for kept in (draft, draft.pruned(5)):
            for node in range(len(kept)):
                expected = _expected_match(committed, kept, node)
                assert kept.signals[CONTEXT_SIGNAL][node] == float(expected)
                seen.add(expected)
    assert seen == {True, False}


@pytest.mark.parametrize(
    "policy",
    [
        FixedPolicy(tree=TreeShape(top_k=3, depth=4, total_tokens=10, expand=1)),
        FixedPolicy(max_draft_tokens=4),
    ],
    ids=["tree", "chain"],
)
def test_the_decoder_drafts_with_the_context_it_committed(policy):
    """Every round's draft, tree or chain, carries `context_match` against the prompt and the
    output so far, and the output stays the target's."""
    target = tiny_model(vocab_size=6)  # a small vocabulary, so that the output repeats itself
    prompt = [1, 2, 3, 4, 5, 0, 1]
    committed = list(prompt)
    checked = []

    def on_round(record):
        draft = record.draft
        for node in range(len(draft)):
            expected = _expected_match(committed, draft, node)
            checked.append((draft.signals[CONTEXT_SIGNAL][node] == float(expected), expected))
        path = record.accepted_path
        row = 1 + path[-1] if path else 0
        committed.extend([*draft.tokens[path].tolist(), int(record.target_logits[row].argmax())])

    drafter = DraftModelDrafter(perturbed_copy(target, scale=0.3))
    result = SpeculativeDecoder(target, drafter, policy=policy).generate(
        torch.tensor(prompt), max_new_tokens=32, on_round=on_round
    )
    assert checked and all(right for right, _ in checked)
    assert {expected for _, expected in checked} == {True, False}
    assert committed[len(prompt) :][:32] == result.tokens


def test_a_chain_stop_rule_reads_the_context_match_its_draft_keeps():
    """A chain's stop rule is told whether the token just drafted repeats the context, the same
    `context_match` the finished draft keeps."""
    target = tiny_model(vocab_size=6)
    prompt = [1, 2, 3, 4, 5, 0, 1, 0, 0, 0, 4, 5, 0, 4, 5, 3, 3, 4, 5, 4, 5, 0]
    drafter = DraftModelDrafter(target)
    drafter.start(torch.tensor(prompt))
    told = []

    def stop(position, logits, context_match):
        told.append(context_match)
        return False

    request = DraftRequest(
        TreeShape.chain(8), SamplingParams(), stop=stop, context=ContextIndex(prompt)
    )
    draft = drafter.propose_request(request)
    expected = [_expected_match(prompt, draft, node) for node in range(len(draft))]
    assert told == expected == [bool(v) for v in draft.signals[CONTEXT_SIGNAL]]
    assert set(told) == {True, False}


class _Spy:
    """An acceptance model that records the signals it is asked about."""

    def __init__(self, model) -> None:
        self.model, self.asked = model, []

    def predict_signals(self, signals):
        self.asked.append({name: value.clone() for name, value in signals.items()})
        return self.model.predict_signals(signals)


@pytest.mark.parametrize(
    "policy",
    [
        lambda spy: ThresholdPolicy(acceptance=spy, max_draft_tokens=6, min_path_confidence=0.3),
        lambda spy: FixedPolicy(acceptance=spy, tree=TreeShape(top_k=2, depth=4, expand=1)),
    ],
    ids=["chain stop rule", "tree ranking"],
)
def test_a_calibration_fitted_on_context_match_reads_it_while_decoding(policy):
    """A calibrator fitted on `context_match` (repeats accepted more often) is asked about
    every drafted token with it, by a chain's stop rule and by a tree's ranking alike, and
    decoding stays the target's greedy decoding."""
    rng = torch.Generator().manual_seed(0)
    top1, match = torch.rand(400, generator=rng), (torch.rand(400, generator=rng) < 0.3).float()
    accepted = (torch.rand(400, generator=rng) < torch.where(match > 0, 0.95, top1)).float()
    fitted = PlattScaling(signals=("top1_prob", CONTEXT_SIGNAL)).fit(
        {"top1_prob": top1, CONTEXT_SIGNAL: match}, accepted
    )
    spy = _Spy(fitted)
    target = tiny_model(vocab_size=6)
    prompt = torch.tensor([1, 2, 3, 4, 5, 3, 1])
    decoder = SpeculativeDecoder(
        target, DraftModelDrafter(perturbed_copy(target, 0.3)), policy=policy(spy)
    )
    result = decoder.generate(prompt, max_new_tokens=40)
    assert result.tokens == greedy_reference(target, prompt, 40)
    asked = torch.cat([signals[CONTEXT_SIGNAL] for signals in spy.asked])
    assert set(asked.tolist()) == {0.0, 1.0}
