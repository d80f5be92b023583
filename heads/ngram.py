"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of the suffix."""

from __future__ import annotations

import torch

from draftsmith.heads.base import Draft, Drafter, DraftRequest, register_drafter


@register_drafter("ngram")
class NgramDrafter(Drafter):
    """Training-free drafter that copies from the prompt and the output so far.

    It matches the longest suffix of the committed sequence (up to `max_ngram` tokens, at least
    `min_ngram`) that occurred earlier and proposes what came after its most recent occurrence
    (a chain), or after each of its `top_k` most recent occurrences (a tree's branches; a chain
    for a tree expanding one node a depth: it has no distribution to rank runners-up by).
    Its proposals are deterministic, so the verifier treats q as one-hot.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._committed: list[int] = []

    def start(self, prompt_ids: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        self._committed = prompt_ids.tolist()

    def fork(self) -> NgramDrafter:
        return NgramDrafter(self.max_ngram, self.min_ngram)

    def draft(self, request: DraftRequest) -> Draft:
        seq = self._committed
        branches = request.shape.top_k if request.shape.width > 1 else 1
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            suffix = seq[-n:]
            # The top_k most recent earlier occurrences whose continuation is not the suffix itself.
            follows = []
            for start in range(len(seq) - n - 1, -1, -1):
                if seq[start : start + n] == suffix:
                    follows.append(seq[start + n : start + n + request.shape.depth])
                    if len(follows) == branches:
                        break
            if follows:
                return _trie(follows, request.shape.max_tokens)
        return Draft.empty()

    def commit(self, tokens: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        self._committed.extend(tokens.tolist())


def _trie(continuations: list[list[int]], max_tokens: int) -> Draft:
    """The continuations as branches of one tree (shared prefixes merged), the first (most recent)
    first, of at most max_tokens nodes."""
    tokens: list[int] = []
    parents: list[int] = []
    child: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    for continuation in continuations:
        node = -1
        for token in continuation:
            if (node, token) not in child:
                if len(tokens) == max_tokens:
                    break
                child[node, token] = len(tokens)
                tokens.append(token)
                parents.append(node)
            node = child[node, token]
    return Draft(
        tokens=torch.tensor(tokens, dtype=torch.long),
        parents=torch.tensor(parents, dtype=torch.long),
    )
