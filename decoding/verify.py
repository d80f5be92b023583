"""Verification of a draft tree against the target's distributions, one target forward per round.

Rows of the target's output: row 0 is the prediction after the newest committed token (the
tree's root), row 1 + i the prediction after draft node i.

Greedy: the longest root path whose every token is the target's argmax after its parent, then the
target's argmax after the path. Siblings carry distinct tokens, so at most one child matches.

Sampling: the rejection rule of Leviathan et al. (2023) / Chen et al. (2023), applied at each node
to its children in draft order (multi-candidate, as SpecInfer): child x, drawn from q, is accepted
with probability min(1, p(x) / q(x)); on rejection the target side becomes the residual
norm(max(0, p - q)) and the next child is tried against it. A child that was drawn after its
elder siblings without replacement carries that q (without them, renormalised) as its
`Draft.probs` row; a deterministic child is one-hot. When no child is accepted the next token is
drawn from what is left of p; after an accepted leaf, from the target's next distribution. The
emitted tokens are then distributed exactly as the target's own samples. A chain is the tree with
one child per node, where this is the classic rule.
"""

from __future__ import annotations

from typing import Protocol

import torch

from draftsmith.core.sampling import SamplingParams, greedy_tokens, probabilities, sample
from draftsmith.heads.base import Draft


class Verifier(Protocol):
    """Decides which draft nodes the target accepts, and the token it adds after them."""

    lossy: bool
    """True when the output may differ from the target's own (greedy tokens or sampled
    distribution): such a verifier is opt-in and its results say so."""

    def __call__(
        self,
        target_logits: torch.Tensor,
        draft: Draft,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> tuple[list[int], int]:
        """target_logits (k+1, V) float32 -> (the accepted path's nodes, the next token)."""
        ...


class LosslessVerifier:
    """The default: `verify_greedy` at temperature 0, else `verify_sampling` on the processed
    target distributions. The output is the target's own."""

    lossy = False

    def __call__(
        self,
        target_logits: torch.Tensor,
        draft: Draft,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> tuple[list[int], int]:
        if sampling.greedy:
            return verify_greedy(target_logits, draft)
        return verify_sampling(probabilities(target_logits, sampling), draft, generator)


def verify_greedy(target_logits: torch.Tensor, draft: Draft) -> tuple[list[int], int]:
    """target_logits (k+1, V) -> (the accepted path's nodes, the target's next token)."""
    target_tokens = greedy_tokens(target_logits).tolist()
    tokens, parents = draft.tokens.tolist(), draft.parents.tolist()
    path, node = [], -1
    # Nodes come in topological order: a matching child of the path's end extends the path.
    for i, (token, parent) in enumerate(zip(tokens, parents, strict=True)):
        if parent == node and token == target_tokens[node + 1]:
            path.append(i)
            node = i
    return path, target_tokens[node + 1]


def verify_sampling(
    target_probs: torch.Tensor,
    draft: Draft,
    generator: torch.Generator | None,
    slack: torch.Tensor | None = None,
) -> tuple[list[int], int]:
    """target_probs (k+1, V) processed target distributions p -> (the accepted path's nodes, the
    next token drawn from the target side).

    slack (k,) in (0, 1] per node, None for all ones: child x is accepted with probability
    min(1, p(x) / (slack * q(x))). Below 1 it is a lossy relaxation (`lossy.ModulatedVerifier`).
    """
    # One uniform per node, drawn up front so the random stream does not depend on outcomes.
    uniforms = torch.rand(len(draft), generator=generator).tolist()
    path, node = [], -1
    while True:
        p = target_probs[node + 1]
        for child in draft.children(node):
            token = int(draft.tokens[child])
            q = _draft_distribution(draft, child, p.shape[-1])
            q_token = float(q[token])
            if slack is not None:
                q_token *= float(slack[child])
            if q_token > 0 and uniforms[child] < min(1.0, float(p[token]) / q_token):
                path.append(child)
                node = child
                break
            residual = (p - q).clamp_min(0)
            total = float(residual.sum())
            # p == q leaves no residual, but then rejection has probability 0: unreachable in
            # exact arithmetic, so keep p.
            p = residual / total if total > 0 else p
        else:
            return path, sample(p, generator)


def _draft_distribution(draft: Draft, node: int, vocab_size: int) -> torch.Tensor:
    if draft.probs is not None:
        return draft.probs[node]
    one_hot = torch.zeros(vocab_size)
    one_hot[int(draft.tokens[node])] = 1.0
    return one_hot
