"""Batched speculative decoding: every row equals that prompt decoded alone, whatever each row
accepts per round, for chains and trees; per-row sampling follows the target; bad batches fail
clearly."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from conftest import (
    MarkovTarget,
    OracleDrafter,
    TableDrafter,
    greedy_reference,
    perturbed_copy,
    tiny_model,
)
from head_helpers import build_head
from test_sampling_distribution import _sequence_distribution, _sequence_fits

from draftsmith import FixedPolicy, SpeculativeDecoder
from draftsmith.core import small_rows
from draftsmith.core.attention import GROUPED_SDPA
from draftsmith.core.ragged import RaggedTarget
from draftsmith.core.sampling import SamplingParams
from draftsmith.decoding import RoutingDrafter, ThresholdPolicy
from draftsmith.heads import Draft, Drafter, DraftModelDrafter, NgramDrafter, TreeShape
from draftsmith.heads.base import RowDrafters
from draftsmith.heads.draft_model import BatchedDraftModel

# Different lengths, so rows are padded and their caches ragged from the first round.
PROMPTS = [[5, 17, 42], [9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [100, 101]]
# No online recalibration: the policy is the batch's, so what it learns from one row would shape
# another row's tree, and the rows' drafts would differ from their drafts alone (not their tokens).
CHAIN = FixedPolicy(max_draft_tokens=4, recalibrate=False)
TREE = FixedPolicy(tree=TreeShape(top_k=3, depth=3, total_tokens=8), recalibrate=False)
SIBLINGS = FixedPolicy(tree=TreeShape(top_k=3, depth=4, expand=1), recalibrate=False)
"""Chains with two siblings a token: drafted together where the kind steps its rows' chains in
one forward."""


def _drafter(kind: str, target) -> Drafter:
    if kind == "perturbed":  # accepts some
        return DraftModelDrafter(perturbed_copy(target, scale=0.05))
    if kind == "perturbed-together":  # its rows' chains drafted in one forward per step
        return DraftModelDrafter(perturbed_copy(target, scale=0.05), batch_drafting=True)
    if kind == "unrelated":  # accepts almost nothing
        return DraftModelDrafter(tiny_model(target.config.model_type, seed=99))
    if kind == "ngram":
        return NgramDrafter(max_ngram=3)
    return build_head(kind, target).as_drafter(target)  # untrained: a head's own state


@pytest.mark.parametrize("policy", [CHAIN, TREE, SIBLINGS], ids=["chain", "tree", "siblings"])
@pytest.mark.parametrize(
    "kind",
    [
        "perturbed",
        "perturbed-together",
        "unrelated",
        "ngram",
        "eagle",
        "eagle3",
        "peagle",
        "dflash",
        "mtp",
    ],
)
def test_each_row_equals_its_prompt_decoded_alone(llama, kind, policy):
    decoder = SpeculativeDecoder(llama, _drafter(kind, llama), policy=policy)
    batch = decoder.generate_batch(PROMPTS, max_new_tokens=12)
    for prompt, result in zip(PROMPTS, batch, strict=True):
        alone = decoder.generate(prompt, max_new_tokens=12)
        assert result.tokens == alone.tokens == greedy_reference(llama, torch.tensor(prompt), 12)
        assert result.stats.target_forwards == alone.stats.target_forwards
        assert result.stats.accepted == alone.stats.accepted


@pytest.mark.parametrize("implementation", ["eager", "sdpa", GROUPED_SDPA])
def test_qwen2_rows_of_a_tree_batch(implementation):
    qwen2 = tiny_model("qwen2", seed=3, attn_implementation=implementation)
    decoder = SpeculativeDecoder(qwen2, _drafter("perturbed", qwen2), policy=TREE)
    batch = decoder.generate_batch(PROMPTS, max_new_tokens=12)
    assert [r.tokens for r in batch] == [
        greedy_reference(qwen2, torch.tensor(p), 12) for p in PROMPTS
    ]
    accepted = [r.stats.accepted for r in batch]
    assert sum(accepted) > 0 and len(set(accepted)) > 1  # rows really accepted differently


class RowOracle(OracleDrafter):
    """`OracleDrafter` that looks up, per prompt, the target's continuation and how many tokens
    of each draft to get right: rows of one batch accept all, none or some. Counts its drafts."""

    def __init__(self, plans: dict[tuple[int, ...], tuple[list[int], int]], vocab_size: int):
        super().__init__([], vocab_size, correct=0)
        self.plans = plans
        self.drafts = 0

    def fork(self) -> RowOracle:
        return RowOracle(self.plans, self.vocab_size)

    def start(self, prompt_ids, target_features=None) -> None:
        super().start(prompt_ids)
        self.reference, self.correct = self.plans[tuple(prompt_ids.tolist())]

    def draft(self, request) -> Draft:
        self.drafts += 1
        return super().draft(request)


def test_stub_rows_accept_all_none_and_some_in_one_batch(llama):
    k, new = 4, 20
    correct = [k, 0, 2, 1]  # accept-all, reject-all, partial, partial
    references = [greedy_reference(llama, torch.tensor(p), new) for p in PROMPTS]
    plans = {tuple(p): (r, c) for p, r, c in zip(PROMPTS, references, correct, strict=True)}
    decoder = SpeculativeDecoder(
        llama, RowOracle(plans, 256), policy=FixedPolicy(max_draft_tokens=k)
    )
    batch = decoder.generate_batch(PROMPTS, max_new_tokens=new)
    for result, reference, c in zip(batch, references, correct, strict=True):
        assert result.tokens == reference
        # Every round but a budget-capped last one emits c + 1 tokens.
        assert result.stats.target_forwards == -(-new // (c + 1))
        assert result.stats.acceptance_by_position[:c] == [1.0] * c
        assert result.stats.acceptance_by_position[c : c + 1] in ([], [0.0])


def test_a_finished_row_stops_drafting(llama):
    target = tiny_model("llama", seed=5)
    free_runs = [greedy_reference(target, torch.tensor(p), 16) for p in PROMPTS]
    eos = free_runs[2][3]  # row 2 emits it early; the others may too, or later
    target.generation_config.eos_token_id = eos
    expected = [greedy_reference(target, torch.tensor(p), 16) for p in PROMPTS]
    assert len(expected[2]) == 4 and max(len(e) for e in expected) > 8
    plans = {tuple(p): (e, 1) for p, e in zip(PROMPTS, expected, strict=True)}
    decoder = SpeculativeDecoder(
        target, RowOracle(plans, 256), policy=FixedPolicy(max_draft_tokens=3)
    )
    batch = decoder.generate_batch(PROMPTS, max_new_tokens=16)
    assert [r.tokens for r in batch] == expected
    drafters = decoder._row_drafters(len(PROMPTS)).drafters
    for result, drafter in zip(batch, drafters, strict=True):
        assert drafter.drafts == result.stats.target_forwards  # no draft after the row ended
    assert drafters[2].drafts < max(d.drafts for d in drafters)


@pytest.mark.parametrize("kind", ["perturbed", "perturbed-together"])
def test_rows_stopped_early_by_the_policy_stay_identical(llama, kind):
    policy = ThresholdPolicy(max_draft_tokens=6, min_path_confidence=0.5)
    decoder = SpeculativeDecoder(llama, _drafter(kind, llama), policy=policy)
    batch = decoder.generate_batch(PROMPTS, max_new_tokens=16)
    assert [r.tokens for r in batch] == [
        greedy_reference(llama, torch.tensor(p), 16) for p in PROMPTS
    ]
    assert sum(r.stats.drafted for r in batch) < 6 * sum(r.stats.target_forwards for r in batch)


def test_ragged_cache_after_holes_and_compaction_equals_fresh_rows(llama):
    target = RaggedTarget(llama, batch=2)
    rows = [[5, 6, 7, 8], [9, 10]]
    target.extend([torch.tensor(r) for r in rows], [torch.arange(len(r)) - 1 for r in rows])
    target.keep([range(4), range(2)])
    # A tree per row; row 0 keeps the path 17 -> 99, row 1 only its root: holes in row 1.
    parents = torch.tensor([-1, 0, 0, 1])
    target.extend([torch.tensor([17, 3, 99, 4]), torch.tensor([21, 22, 23, 24])], [parents] * 2)
    target.keep([[0, 2], [0]])
    assert target.lengths == [6, 3] and target.valid.sum(1).tolist() == [6, 3]
    target._compact()
    assert target.valid.shape[1] == 6
    logits, _ = target.extend([torch.tensor([11]), torch.tensor([12])], [torch.tensor([-1])] * 2)
    for row, tail, got in zip(rows, ([17, 99, 11], [21, 12]), logits, strict=True):
        expected = llama(input_ids=torch.tensor([row + tail])).logits[0, -1]
        torch.testing.assert_close(got[-1], expected, rtol=1e-4, atol=1e-4)


def test_a_truncated_row_continues_as_a_fresh_prefill_and_last_logits_are_the_last(llama):
    target = RaggedTarget(llama, batch=2)
    rows = [[5, 6, 7, 8, 9], [10, 11]]
    target.extend([torch.tensor(r) for r in rows], [torch.arange(len(r)) - 1 for r in rows])
    target.keep([range(5), range(2)])
    target.truncate(0, 2)  # row 0 drafted 7, 8, 9 and had them rejected
    assert target.lengths == [2, 2]
    blocks = [torch.tensor([30, 31]), torch.tensor([32])]
    last, _ = target.extend(blocks, [torch.arange(b.numel()) - 1 for b in blocks], logits="last")
    for prefix, block, got in zip([[5, 6], [10, 11]], blocks, last, strict=True):
        expected = llama(input_ids=torch.tensor([prefix + block.tolist()])).logits[0, -1:]
        assert got.shape == expected.shape
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    # An empty block runs padding only, and gives no logits.
    target.keep([range(2), range(1)])
    last, _ = target.extend(
        [torch.tensor([40]), torch.empty(0, dtype=torch.long)],
        [torch.tensor([-1]), torch.empty(0, dtype=torch.long)],
        logits="last",
    )
    assert last[0].shape == (1, llama.config.vocab_size) and last[1].shape[0] == 0


class _ForwardCounter:
    def __init__(self, model):
        self.calls = 0
        model.register_forward_hook(lambda *_: setattr(self, "calls", self.calls + 1))


@pytest.mark.parametrize("policy", [CHAIN, SIBLINGS], ids=["chain", "siblings"])
def test_a_draft_model_drafts_every_rows_chain_in_one_forward_per_step(llama, policy):
    draft = perturbed_copy(llama, scale=0.05)
    counter = _ForwardCounter(draft)
    decoder = SpeculativeDecoder(
        llama, DraftModelDrafter(draft, batch_drafting=True), policy=policy
    )
    batch = decoder.generate_batch(PROMPTS, max_new_tokens=12)
    batched = counter.calls
    counter.calls = 0
    alone = [decoder.generate(p, max_new_tokens=12) for p in PROMPTS]
    assert [r.tokens for r in batch] == [r.tokens for r in alone]
    assert [r.stats.accepted for r in batch] == [r.stats.accepted for r in alone]
    assert all(r.stats.drafted > 0 for r in batch)
    # A round drafts 4 depths in at most 4 forwards for all rows; alone, every row pays them.
    assert batched <= 4 * max(r.stats.target_forwards for r in batch) < counter.calls


def test_draft_trees_a_lone_prompt_and_a_cpu_with_stock_kernels_draft_row_by_row(
    llama, monkeypatch
):
    draft = perturbed_copy(llama, scale=0.05)
    trees = SpeculativeDecoder(llama, DraftModelDrafter(draft, batch_drafting=True), policy=TREE)
    assert type(trees._row_drafters(2)) is RowDrafters
    chains = SpeculativeDecoder(llama, DraftModelDrafter(draft, batch_drafting=True), policy=CHAIN)
    assert isinstance(chains._row_drafters(2), BatchedDraftModel)
    siblings = DraftModelDrafter(draft, batch_drafting=True)
    assert isinstance(
        SpeculativeDecoder(llama, siblings, policy=SIBLINGS)._row_drafters(2), BatchedDraftModel
    )
    assert type(chains._row_drafters(1)) is RowDrafters
    on_cpu = SpeculativeDecoder(llama, DraftModelDrafter(draft), policy=CHAIN)
    monkeypatch.setattr(small_rows, "ENABLED", True)  # packed weights keep a few rows cheap
    assert isinstance(on_cpu._row_drafters(2), BatchedDraftModel)
    monkeypatch.setattr(small_rows, "ENABLED", False)
    assert type(on_cpu._row_drafters(2)) is RowDrafters


def test_every_rows_drafter_hands_its_states_to_a_hook_set_after_forking(llama):
    drafter = _drafter("eagle3", llama)
    decoder = SpeculativeDecoder(llama, drafter, policy=CHAIN)
    decoder.generate_batch(PROMPTS, max_new_tokens=4)  # the forks exist from here on
    seen = []
    drafter.expose_states(lambda logits, states: seen.append(logits.shape[0]))
    batch = decoder.generate_batch(PROMPTS, max_new_tokens=8)
    # One row of draft logits per drafted token (a chain drafts one token per step).
    assert sum(seen) == sum(r.stats.drafted for r in batch)
    assert sum(seen) > batch[0].stats.drafted


# -- sampling --------------------------------------------------------------------------------------


class ForkableTable(TableDrafter):
    """TableDrafter (stateless, so each row's fork is itself)."""

    def fork(self) -> ForkableTable:
        return self


def test_each_row_samples_the_targets_distribution():
    """A Markov target's rows follow their own last prompt token. Three prompts, each five times
    in a batch of fifteen (every row with its own seed), 300 batches: 1,500 samples per prompt."""
    params = SamplingParams(temperature=1.0)
    vocab, calls, copies = 4, 300, 5
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(1)) * 1.5
    drafter = ForkableTable(torch.randn(2, vocab, generator=torch.Generator().manual_seed(2)))
    decoder = SpeculativeDecoder(
        MarkovTarget(table), drafter, policy=FixedPolicy(max_draft_tokens=2)
    )
    prompts = [[0], [3, 1], [2, 0, 2]]
    counts = [Counter() for _ in prompts]
    drafted = accepted = 0
    for call in range(calls):
        batch = decoder.generate_batch(
            prompts * copies, max_new_tokens=2, temperature=1.0, seed=len(prompts) * copies * call
        )
        for row, result in enumerate(batch):
            counts[row % len(prompts)][tuple(result.tokens)] += 1
            drafted += result.stats.drafted
            accepted += result.stats.accepted
    assert 0 < accepted < drafted  # both branches of the rejection rule ran
    n = calls * copies
    exact = [_sequence_distribution(table, params, p[-1], 2) for p in prompts]
    for row in range(len(prompts)):
        assert _sequence_fits(counts[row], exact[row], n)
    # Negative control: the same check tells the rows apart, so a row mix-up would fail it.
    assert not _sequence_fits(counts[0], exact[1], n)
    assert not _sequence_fits(counts[1], exact[2], n)


@pytest.mark.parametrize("policy", [CHAIN, SIBLINGS], ids=["chain", "siblings"])
@pytest.mark.parametrize("kind", ["perturbed", "perturbed-together"])
def test_a_sampled_row_equals_its_prompt_sampled_alone_with_its_seed(llama, kind, policy):
    """Row b draws from its own generator seeded seed + b, as `generate` does alone."""
    decoder = SpeculativeDecoder(llama, _drafter(kind, llama), policy=policy)
    sampling = {"temperature": 0.8, "top_k": 20}
    batch = decoder.generate_batch(PROMPTS, max_new_tokens=12, seed=7, **sampling)
    for row, (prompt, result) in enumerate(zip(PROMPTS, batch, strict=True)):
        alone = decoder.generate(prompt, max_new_tokens=12, seed=7 + row, **sampling)
        assert result.tokens == alone.tokens
    assert len({tuple(r.tokens) for r in batch}) > 1


# -- bad input -------------------------------------------------------------------------------------


def test_a_prompt_too_long_for_the_context_is_named_by_its_index(llama):
    decoder = SpeculativeDecoder(llama, NgramDrafter(), policy=CHAIN)
    with pytest.raises(ValueError, match=r"prompt 2 has 250 tokens .* context of 256 positions"):
        decoder.generate_batch([[1, 2], [3], [7] * 250], max_new_tokens=8)


def test_a_drafter_kind_without_batches_is_named(llama):
    router = RoutingDrafter({"ngram": NgramDrafter(), "draft": _drafter("perturbed", llama)})
    decoder = SpeculativeDecoder(llama, router, policy=CHAIN)
    with pytest.raises(ValueError, match="RoutingDrafter cannot decode a batch.*batch size 1"):
        decoder.generate_batch(PROMPTS[:2], max_new_tokens=4)
    assert decoder.generate_batch(PROMPTS[:1], max_new_tokens=4)[0].tokens == greedy_reference(
        llama, torch.tensor(PROMPTS[0]), 4
    )


def test_an_attention_that_ignores_masks_is_refused_for_a_padded_batch():
    model = tiny_model("llama", seed=0)
    model.config._attn_implementation = "flash_attention_2"
    decoder = SpeculativeDecoder(model, NgramDrafter(), policy=CHAIN)
    with pytest.raises(ValueError, match="does not apply a draft tree's or a padded batch's"):
        decoder.generate_batch(PROMPTS[:2], max_new_tokens=4)
