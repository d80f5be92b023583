"""After a rejection the caches hold exactly what a fresh prefill of the kept tokens would."""

from __future__ import annotations

import torch
from conftest import perturbed_copy

from draftsmith import FixedPolicy, SpeculativeDecoder
from draftsmith.core.cache import cache_argument, returned_cache
from draftsmith.core.ragged import RaggedTarget
from draftsmith.core.target import Target
from draftsmith.core.tree import chain_parents
from draftsmith.heads import DraftModelDrafter


def _assert_cache_equals_prefill(model, cache, tokens: list[int]) -> None:
    fresh = Target(model)
    fresh.extend(torch.tensor(tokens))
    assert cache.get_seq_length() == len(tokens)
    for layer, fresh_layer in zip(cache.layers, fresh.cache.layers, strict=True):
        torch.testing.assert_close(layer.keys, fresh_layer.keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(layer.values, fresh_layer.values, atol=1e-5, rtol=1e-4)


def test_target_rollback_equals_fresh_prefill(llama):
    runner = RaggedTarget(llama)
    runner.extend([torch.tensor([4, 8, 15, 16])], [chain_parents(4)])
    runner.keep([range(4)])
    # One verification round of 5 positions, of which two are accepted.
    runner.extend([torch.tensor([23, 42, 99, 7, 1])], [chain_parents(5)])
    runner.keep([range(2)])
    _assert_cache_equals_prefill(llama, runner.target.cache, [4, 8, 15, 16, 23, 42])
    # The rolled-back cache goes on to give the same logits as a fresh run.
    logits = runner.extend([torch.tensor([3])], [chain_parents(1)])[0][0]
    fresh = Target(llama)
    expected, _ = fresh.extend(torch.tensor([4, 8, 15, 16, 23, 42, 3]))
    torch.testing.assert_close(logits[-1], expected[-1], atol=1e-5, rtol=1e-4)


def test_draft_model_cache_matches_committed_tokens_after_decoding(llama):
    draft = perturbed_copy(llama, scale=0.05)
    drafter = DraftModelDrafter(draft)
    prompt = [9, 10, 11]
    decoder = SpeculativeDecoder(llama, drafter, policy=FixedPolicy(max_draft_tokens=4))
    result = decoder.generate(prompt, max_new_tokens=25)
    assert 0 < result.stats.accepted < result.stats.drafted  # rejections happened
    committed = prompt + result.tokens
    assert drafter._committed == committed
    # Whatever the drafter kept cached is a prefix of the committed sequence, and equals a fresh
    # prefill of that prefix.
    kept = drafter._own.tokens
    assert kept == committed[: len(kept)]
    _assert_cache_equals_prefill(draft, drafter._own.kv, kept)


def test_the_cache_a_forward_returns_continues_it(llama):
    ids = torch.tensor([[4, 8, 15, 16, 23]])
    cache = returned_cache(llama(input_ids=ids[:, :-1], use_cache=True))
    assert cache.get_seq_length() == 4
    argument = cache_argument(llama)
    step = llama(input_ids=ids[:, -1:], use_cache=True, **{argument: cache}).logits[0, -1]
    torch.testing.assert_close(step, llama(input_ids=ids).logits[0, -1], atol=1e-5, rtol=1e-4)
