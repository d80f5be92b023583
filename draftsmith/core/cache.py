"""KV cache rollback and compaction, shared by the decoder and the drafters that keep a cache of
their own."""

from __future__ import annotations

import inspect

import torch
from transformers import Cache
from transformers.cache_utils import DynamicLayer


def crop_cache(cache: Cache, length: int) -> None:
    """Drop every cached position at or after `length`, in place."""
    current = cache.get_seq_length()
    if length > current:
        raise ValueError(f"cannot crop a cache of {current} positions to {length}")
    if length < current:
        # transformers 5 counts a negative argument as the number of positions to drop.
        cache.crop(length - current)


def cache_argument(model: torch.nn.Module) -> str:
    """The name under which model.forward takes its KV cache: transformers 5 renamed
    `past_key_values` to `cache` (the old name warns until it is removed)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def keep_cache_rows(cache: Cache, first: int, rows: torch.Tensor) -> None:
    """Keep the cached positions before `first`, then the positions `rows` (ascending, each >=
    first), in that order, and drop every other one, in place: after a draft tree's verification
    the cache keeps the accepted path's keys and values, gathered rather than recomputed."""
    rows = rows.long().cpu()
    if torch.equal(rows, torch.arange(first, first + rows.numel())):
        crop_cache(cache, first + rows.numel())  # a prefix (a chain's accepted part) needs no copy
        return
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or layer.keys is None:
            continue
        if type(layer) is not DynamicLayer:
            raise ValueError(
                f"cannot gather rows of a {type(layer).__name__}: draft trees need a model whose "
                "layers all use full attention with a dynamic cache (decode with a chain instead)"
            )
        index = rows.to(layer.keys.device)
        layer.keys = torch.cat([layer.keys[..., :first, :], layer.keys[..., index, :]], dim=-2)
        layer.values = torch.cat([layer.values[..., :first, :], layer.values[..., index, :]], -2)
