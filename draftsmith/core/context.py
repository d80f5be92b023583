"""What the committed sequence says of a drafted token: whether it repeats an earlier n-gram.

Code, structured text and small models' greedy output repeat themselves, and the target accepts
a drafted token that continues an n-gram of the prompt or the output far more often than its
draft confidence says. `ContextIndex` keeps the committed
sequence's (n + 1)-grams so that a draft can ask this of every token at O(1) a token.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

CONTEXT_SIGNAL = "context_match"
"""Per drafted node: 1.0 when its parent distribution's top-1 token, after the n tokens before it
(committed ones, then the node's drafted ancestors), continues them as somewhere earlier in the
committed sequence; else 0.0. A signal calibrators fit on (`draftsmith calibrate` by default),
and one the online recalibration (`OnlineAcceptance`) corrects apart."""


class ContextIndex:
    """The (n + 1)-grams of a growing committed token sequence (prompt, then output)."""

    def __init__(self, tokens: Iterable[int] = (), n: int = 3) -> None:
        if n < 1:
            raise ValueError(f"a context index needs n >= 1 tokens before the matched one, got {n}")
        self.n = n
        self._grams: set[tuple[int, ...]] = set()
        self._tail: list[int] = []
        """The newest n committed tokens."""
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Commit tokens after the sequence so far."""
        for token in tokens:
            token = int(token)
            if len(self._tail) == self.n:
                self._grams.add((*self._tail, token))
                del self._tail[0]
            self._tail.append(token)

    def tail(self) -> list[int]:
        """The newest n committed tokens (fewer at the start), oldest first."""
        return list(self._tail)

    def matches(self, before: Sequence[int], token: int) -> bool:
        """Whether the n tokens ending `before` followed by token occurred in the sequence."""
        if len(before) < self.n:
            return False
        return (*before[len(before) - self.n :], token) in self._grams
