"""Sampling parameters and the logit processing shared by target and drafter.

Speculative sampling is only lossless if the target distribution p and the draft distribution q
are processed identically (temperature, then top-k, then top-p, the order Hugging Face uses), so
both sides call `probabilities` from here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    temperature: float = 0.0
    """0 means greedy (argmax); otherwise logits are divided by it before softmax."""
    top_k: int | None = None
    """Keep only the k most likely tokens (ignored when greedy)."""
    top_p: float | None = None
    """Keep the smallest set of tokens whose probability reaches top_p (ignored when greedy)."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """logits (..., V) -> (...,) int64 the index of each row's largest logit, the first on ties as
    `torch.argmax` gives it. Through `max`: on the CPU argmax over a vocabulary's logits costs
    several times as much."""
    return logits.max(-1).indices


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits (..., V) into the sampling distribution (..., V), float32.

    Greedy parameters give the one-hot distribution of the argmax.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(greedy_tokens(logits), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k is not None and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p is not None and params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already reach top_p; the first always stays.
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from probs (V,)."""
    return int(torch.multinomial(probs, 1, generator=generator))
