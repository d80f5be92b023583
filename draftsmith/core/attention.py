"""SDPA attention that keeps grouped key/value heads grouped, as rows of one head.

transformers' `sdpa` attention gives a model with grouped-query attention (fewer key/value heads
than query heads: SmolLM2-135M 9 / 3, Qwen2.5-Coder 12 / 2 and 14 / 2) its key/value heads
unrepeated only for one query token or no mask. Every verification of a draft passes a mask (its
tree, its row's padding) with more than one token, and there `sdpa` copies each layer's cached
keys and values once per query head sharing them (`repeat_kv`): the whole context, every layer,
every round. For one token it passes `enable_gqa`, which on the CPU runs several times slower
than the same attention with the heads stacked as rows.

`grouped_sdpa_attention` stacks the queries of the heads that share a key/value head into one
head's rows instead, and repeats the mask (shared by all heads) to match, so the keys and values
are read where they lie: under a mask, and for one token (plain decoding steps, a draft model's
or a head's chain). Each query row computes the same attention as before; only the rows'
blocking in the kernel changes (bitwise equal at a few rows, within bf16 rounding of it past the
kernel's block of rows). Everything else (several tokens attending causally without a mask: a
prefill) goes to transformers' own `sdpa` function.

`load_pretrained` gives the models it loads with `sdpa` this implementation (`GROUPED_SDPA`); it
runs
everything a model with `sdpa` runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GROUPED_SDPA = "draftsmith_grouped_sdpa"
"""The attention implementation's registered name (masks are built as for `sdpa`)."""


def grouped_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query (B, H, n, d), key and value
    (B, H_kv, S, d), attention_mask (B, 1, n, S) or None; returns (B, n, H, d)."""
    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, n, dim = query.shape
    # Without a mask, n > 1 tokens attend causally (transformers' is_causal), which rows stacked
    # from several heads cannot say; one token attends to every cached key.
    unmasked_one = attention_mask is None and n == 1
    shared_mask = attention_mask is not None and attention_mask.shape[1] == 1
    if groups == 1 or not (unmasked_one or shared_mask) or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    # Query head h uses key/value head h // groups (`repeat_kv`'s order), so the heads of one
    # group, each n rows, become one head of groups * n rows, row i * n + t its head i's token t.
    grouped = query.reshape(batch, heads // groups, groups * n, dim)
    output = F.scaled_dot_product_attention(
        grouped,
        key,
        value,
        attn_mask=None if attention_mask is None else attention_mask.repeat(1, 1, groups, 1),
        dropout_p=dropout,
        scale=scaling,
    )
    return output.reshape(batch, heads, n, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention)
AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)


def use_grouped_sdpa(model: PreTrainedModel) -> None:
    """Run model's attention through `grouped_sdpa_attention` where it runs transformers'
    `sdpa` (any other implementation is left as chosen)."""
    if model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(GROUPED_SDPA)
