"""Greedy speculative decoding reproduces the target's greedy tokens exactly."""

from __future__ import annotations

import pytest
import torch
from conftest import MarkovTarget, OracleDrafter, greedy_reference, perturbed_copy, tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftsmith import FixedPolicy, SpeculativeDecoder
from draftsmith.decoding import ThresholdPolicy
from draftsmith.heads import DraftModelDrafter, NgramDrafter

prompts = st.lists(st.integers(1, 255), min_size=1, max_size=12)


def _drafter(kind: str, target):
    if kind == "same-model":  # accepts everything
        return DraftModelDrafter(target)
    if kind == "perturbed":  # accepts some
        return DraftModelDrafter(perturbed_copy(target, scale=0.05))
    if kind == "unrelated":  # accepts almost nothing
        return DraftModelDrafter(tiny_model(target.config.model_type, seed=99))
    return NgramDrafter(max_ngram=3)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("kind", ["same-model", "perturbed", "unrelated", "ngram"])
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(prompt=prompts, draft_len=st.integers(0, 7), max_new=st.integers(1, 24))
def test_greedy_identity(arch, kind, llama, qwen2, prompt, draft_len, max_new):
    target = {"llama": llama, "qwen2": qwen2}[arch]
    prompt = torch.tensor(prompt)
    decoder = SpeculativeDecoder(
        target, _drafter(kind, target), policy=FixedPolicy(max_draft_tokens=draft_len)
    )
    result = decoder.generate(prompt, max_new_tokens=max_new)
    assert result.tokens == greedy_reference(target, prompt, max_new)
    stats = result.stats
    assert stats.new_tokens == len(result.tokens) == max_new
    assert stats.target_forwards * (draft_len + 1) >= max_new
    assert stats.accepted <= stats.drafted


def test_same_model_drafter_accepts_everything(llama):
    prompt = torch.tensor([5, 17, 42])
    result = SpeculativeDecoder(
        llama, DraftModelDrafter(llama), policy=FixedPolicy(max_draft_tokens=4)
    ).generate(prompt, max_new_tokens=20)
    assert result.stats.accepted == result.stats.drafted
    assert result.stats.target_forwards == 4  # 5 + 5 + 5 + 5 tokens
    assert result.stats.mean_accepted_length == 5.0


@pytest.mark.parametrize("correct", [0, 1, 2, 3, 4])
def test_oracle_stub_accepts_first_j(llama, correct):
    """accept-all (j = k), reject-all (j = 0) and accept-first-j drafts."""
    k, max_new = 4, 30
    prompt = torch.tensor([3, 9, 27])
    reference = greedy_reference(llama, prompt, max_new)
    drafter = OracleDrafter(reference, vocab_size=256, correct=correct)
    decoder = SpeculativeDecoder(llama, drafter, policy=FixedPolicy(max_draft_tokens=k))
    result = decoder.generate(prompt, max_new_tokens=max_new)
    assert result.tokens == reference
    by_position = result.stats.acceptance_by_position
    assert by_position[:correct] == [1.0] * correct
    assert all(rate == 0.0 for rate in by_position[correct : correct + 1])
    # Every full round emits correct + 1 tokens.
    assert result.stats.mean_accepted_length == pytest.approx(
        max_new / result.stats.target_forwards
    )
    assert result.stats.target_forwards == -(-max_new // (correct + 1))


@pytest.mark.parametrize("kind", ["same-model", "perturbed", "ngram"])
def test_eos_inside_a_draft_stops_where_generate_stops(kind):
    target = tiny_model("llama", seed=5)
    prompt = torch.tensor([7, 8, 9])
    free_run = greedy_reference(target, prompt, 24)
    eos = free_run[6]  # a token the target emits mid-way, so drafts run over it
    target.generation_config.eos_token_id = eos
    expected = greedy_reference(target, prompt, 24)
    assert expected[-1] == eos and len(expected) < 24
    decoder = SpeculativeDecoder(
        target, _drafter(kind, target), policy=FixedPolicy(max_draft_tokens=5)
    )
    assert decoder.generate(prompt, max_new_tokens=24).tokens == expected


def test_confidence_stop_keeps_identity(llama):
    prompt = torch.tensor([1, 2, 3, 4])
    draft = perturbed_copy(llama, scale=0.05)
    policy = ThresholdPolicy(max_draft_tokens=8, min_path_confidence=0.5)
    result = SpeculativeDecoder(llama, DraftModelDrafter(draft), policy=policy).generate(
        prompt, max_new_tokens=30
    )
    assert result.tokens == greedy_reference(llama, prompt, 30)
    # The stop rule must have shortened some drafts below the maximum.
    assert result.stats.drafted < 8 * result.stats.target_forwards


def test_drafters_used_above_accept_partially(llama):
    """Guards the identity tests above: they must exercise partial acceptance, not only
    accept-all or reject-all."""
    policy = FixedPolicy(max_draft_tokens=4)
    prompt = torch.tensor([5, 6, 7])
    perturbed = SpeculativeDecoder(llama, _drafter("perturbed", llama), policy=policy)
    stats = perturbed.generate(prompt, max_new_tokens=40).stats
    assert 0 < stats.accepted < stats.drafted

    # Prompt lookup pays off when the target repeats itself: a bigram target's greedy path cycles.
    table = torch.randn(16, 16, generator=torch.Generator().manual_seed(0))
    markov = MarkovTarget(table)
    expected, token = [], 3
    for _ in range(30):
        token = int(table[token].argmax())
        expected.append(token)
    ngram = SpeculativeDecoder(markov, NgramDrafter(), policy=policy)
    result = ngram.generate(torch.tensor([3]), max_new_tokens=30)
    assert result.tokens == expected
    assert result.stats.accepted > 0


def test_a_draft_models_chain_reads_the_prompt_without_its_lm_head_on_every_token(llama):
    """A chain needs the logits of the newest token only: the LM head (a large share of a small
    model's prefill over a big vocabulary) runs on one position per catch-up, and the output is
    still the target's."""
    draft = perturbed_copy(llama, scale=0.05)
    positions = []
    draft.lm_head.register_forward_hook(lambda _, args, __: positions.append(args[0].shape[1]))
    prompt = torch.arange(3, 15)
    result = SpeculativeDecoder(
        llama, DraftModelDrafter(draft), policy=FixedPolicy(max_draft_tokens=3)
    ).generate(prompt, max_new_tokens=10)
    assert result.tokens == greedy_reference(llama, prompt, 10)
    assert positions and set(positions) == {1}
