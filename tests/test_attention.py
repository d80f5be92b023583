"""Grouped SDPA: transformers' attention without copying grouped key/value heads under a mask."""

from __future__ import annotations

import pytest
import torch
import transformers.integrations.sdpa_attention as sdpa_module
from conftest import tiny_model

from draftsmith.core.attention import GROUPED_SDPA, use_grouped_sdpa
from draftsmith.core.cache import cache_argument, returned_cache
from draftsmith.core.ragged import RaggedTarget
from draftsmith.core.tree import chain_parents

PARENTS = torch.tensor([-1, 0, 0, 1, 2, 2])
TOKENS = torch.tensor([17, 3, 99, 250, 42, 7])
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]


def _tree_logits(model) -> list[torch.Tensor]:
    """Each row's logits of a draft tree verified after a prompt, two rows of unequal length
    (the shorter left-padded under its mask)."""
    target = RaggedTarget(model, batch=len(PROMPTS))
    target.extend([torch.tensor(p) for p in PROMPTS], [chain_parents(len(p)) for p in PROMPTS])
    target.keep([range(len(p)) for p in PROMPTS])
    logits, _ = target.extend([TOKENS, TOKENS[:4]], [PARENTS, PARENTS[:4]])
    return logits


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_grouped_attention_equals_sdpa_on_a_batch_of_trees(arch):
    model = tiny_model(arch, seed=4, attn_implementation="sdpa")
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    expected = _tree_logits(model)
    use_grouped_sdpa(model)
    assert model.config._attn_implementation == GROUPED_SDPA
    for got, want in zip(_tree_logits(model), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_grouped_attention_reads_keys_and_values_where_they_lie(monkeypatch):
    copies = []
    repeat_kv = sdpa_module.repeat_kv
    monkeypatch.setattr(sdpa_module, "repeat_kv", lambda x, n: copies.append(n) or repeat_kv(x, n))
    model = tiny_model("llama", seed=4, attn_implementation="sdpa")
    _tree_logits(model)
    assert copies, "transformers' sdpa no longer copies grouped heads: this module can go"
    copies.clear()
    use_grouped_sdpa(model)
    _tree_logits(model)
    assert copies == []


def test_only_sdpa_is_replaced():
    model = tiny_model("llama", seed=4, attn_implementation="eager")
    use_grouped_sdpa(model)
    assert model.config._attn_implementation == "eager"


def _decode_logits(model, steps: int = 4) -> torch.Tensor:
    """Logits (steps, V) of one-token forwards after a prompt, each feeding its argmax back."""
    out = model(torch.tensor([PROMPTS[0]]), use_cache=True)
    cache, logits = returned_cache(out), []
    for _ in range(steps):
        out = model(out.logits[:, -1:].argmax(-1), use_cache=True, **{cache_argument(model): cache})
        logits.append(out.logits[0, -1])
    return torch.stack(logits)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_one_token_steps_stack_grouped_heads_as_rows(arch, monkeypatch):
    """Decoding one token at a time (plain steps, draft models' and heads' chains) attends with
    the grouped heads stacked as rows too, not through transformers' `enable_gqa` path (on the
    CPU several times slower), and gives sdpa's logits."""
    model = tiny_model(arch, seed=4, attn_implementation="sdpa")
    expected = _decode_logits(model)
    use_grouped_sdpa(model)
    calls = []
    stock = sdpa_module.sdpa_attention_forward
    monkeypatch.setattr(
        "draftsmith.core.attention.sdpa_attention_forward",
        lambda module, query, *args, **kwargs: (
            calls.append(query.shape[2]) or stock(module, query, *args, **kwargs)
        ),
    )
    got = _decode_logits(model)
    assert 1 not in calls, "a one-token step went through transformers' sdpa"
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
