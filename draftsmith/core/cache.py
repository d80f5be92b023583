"""KV cache rollback shared by the decoder and the drafters that keep a cache of their own."""

from __future__ import annotations

import inspect

import torch
from transformers import Cache


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
