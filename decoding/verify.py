"""Verification of a draft against the target's distributions.

Greedy: accept while the draft token is the target's argmax, then emit the target's argmax.
Sampling: the rejection rule of Leviathan et al. (2023) / Chen et al. (2023): accept draft token x
with probability min(1, p(x) / q(x)); on rejection draw from norm(max(0, p - q)); if every draft
token is accepted draw a bonus token from the target's next distribution. The emitted tokens are
then distributed exactly as the target's own samples.
"""

from __future__ import annotations

import torch

from draftsmith.core.sampling import sample


def verify_greedy(target_logits: torch.Tensor, draft_tokens: torch.Tensor) -> tuple[int, int]:
    """target_logits (k+1, V), draft_tokens (k,) -> (number accepted, the target's next token)."""
    target_tokens = target_logits.argmax(-1)
    k = draft_tokens.numel()
    mismatch = (target_tokens[:k] != draft_tokens).nonzero()
    n_accepted = int(mismatch[0]) if mismatch.numel() else k
    return n_accepted, int(target_tokens[n_accepted])


def verify_sampling(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Speculative sampling.

    target_probs (k+1, V) processed target distributions p; draft_tokens (k,); draft_probs (k, V)
    the distributions q the tokens were drawn from, or None for a deterministic draft (one-hot q).
    Returns (number accepted, the next token drawn from the target side).
    """
    k = draft_tokens.numel()
    # One uniform per draft token, drawn up front so the random stream does not depend on outcomes.
    uniforms = torch.rand(k, generator=generator)
    for i in range(k):
        token = int(draft_tokens[i])
        p = target_probs[i]
        q = _draft_distribution(draft_probs, i, token, p.shape[-1])
        q_token = float(q[token])
        if q_token > 0 and float(uniforms[i]) < min(1.0, float(p[token]) / q_token):
            continue
        residual = (p - q).clamp_min(0)
        total = float(residual.sum())
        # p == q leaves no residual mass; then rejection has probability 0 and this is unreachable
        # in exact arithmetic, so fall back to p.
        return i, sample(residual / total if total > 0 else p, generator)
    return k, sample(target_probs[k], generator)


def _draft_distribution(
    draft_probs: torch.Tensor | None, index: int, token: int, vocab_size: int
) -> torch.Tensor:
    if draft_probs is not None:
        return draft_probs[index]
    one_hot = torch.zeros(vocab_size)
    one_hot[token] = 1.0
    return one_hot
