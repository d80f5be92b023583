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


def returned_cache(output) -> Cache:
    """The KV cache a forward returned (`use_cache=True`): transformers 5 renamed the output's
    `past_key_values` to `cache` too (the old name warns until it is removed)."""
    cache = getattr(output, "cache", None)
    return output.past_key_values if cache is None else cache


def keep_cache_rows(cache: Cache, first: int, rows: torch.Tensor) -> None:
    """Keep the cached positions before `first`, then the positions `rows` (ascending, each >=
    first), in that order, and drop every other one, in place: after a draft tree's verification
    the cache keeps the accepted path's keys and values, gathered rather than recomputed."""
    rows = rows.long().cpu()
    if torch.equal(rows, torch.arange(first, first + rows.numel())):
        crop_cache(cache, first + rows.numel())  # a prefix (a chain's accepted part) needs no copy
        return
    gather_cache_positions(cache, first, rows[None])


@torch.inference_mode()  # writes in place a cache made under inference mode, from anywhere
def gather_cache_positions(cache: Cache, first: int, index: torch.Tensor) -> None:
    """Keep the cached positions before `first`, then for each batch row b the positions
    index[b] (index (B, n) or (1, n) for every row, each >= first), and drop every other one, in
    place: each row of a batch keeps its own accepted path, padded to the longest."""
    kept = first + index.shape[-1]
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or layer.keys is None:
            continue
        if type(layer) is not DynamicLayer:
            raise ValueError(
                f"cannot gather rows of a {type(layer).__name__}: draft trees and batches need a "
                "model whose layers all use full attention with a dynamic cache (decode a chain "
                "at batch size 1 instead)"
            )
        batch, heads, _, width = layer.keys.shape
        gather = index.to(layer.keys.device)[:, None, :, None].expand(batch, heads, -1, width)
        # The kept rows are written over the block from `first` on: concatenating them to the
        # cached prefix would copy the whole cache each round, a cost that grows with the context.
        for name in ("keys", "values"):
            cached = getattr(layer, name)
            cached[..., first:kept, :] = cached.gather(2, gather)
            setattr(layer, name, cached[..., :kept, :])
