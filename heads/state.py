"""Per-sequence drafter state kept across decoding rounds: an own KV cache that rolls back to what
the target accepted, the lagged target features, and the assembly of one round's draft."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from draftsmith.core.cache import crop_cache, keep_cache_rows
from draftsmith.core.context import CONTEXT_SIGNAL
from draftsmith.core.sampling import greedy_tokens, probabilities, sample
from draftsmith.core.signals import confidence_signals
from draftsmith.heads.base import Draft, DraftRequest, on_support


class OwnCache:
    """A drafter's own KV cache and, per cached row, the token id it was computed from.

    Rows are kept across rounds; after a rejection only the rows built on rejected tokens are
    dropped (`keep`), so the accepted prefix is never recomputed. Rows may also carry an output
    tensor (a module's hidden state that a later module reads).
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.kv = DynamicCache()
        self.tokens: list[int] = []
        self.outputs: torch.Tensor | None = None
        """(rows, H) per-row outputs, when `extend` was given them."""

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int], outputs: torch.Tensor | None = None) -> None:
        """Record the rows just appended to `kv`: their tokens and optionally outputs (n, H)."""
        self.tokens.extend(tokens)
        if outputs is not None:
            self.outputs = outputs if self.outputs is None else torch.cat([self.outputs, outputs])

    def agreeing(self, sequence: Sequence[int], offset: int = 0) -> int:
        """How many leading rows were computed from sequence[offset + row]."""
        return agreeing(self.tokens, sequence[offset:])

    def gather(self, first: int, rows: Sequence[int]) -> None:
        """Keep the rows before `first` and then `rows` (ascending, >= first), in that order: a
        tree's accepted path, gathered rather than recomputed."""
        keep_cache_rows(self.kv, first, torch.tensor(rows, dtype=torch.long))
        kept = [*range(first), *rows]
        self.tokens = [self.tokens[i] for i in kept]
        if self.outputs is not None:
            self.outputs = self.outputs[torch.tensor(kept, dtype=torch.long)]

    def keep(self, rows: int) -> None:
        """Drop every row at or after `rows`."""
        if rows < len(self.tokens):
            crop_cache(self.kv, rows)
            del self.tokens[rows:]
            if self.outputs is not None:
                self.outputs = self.outputs[:rows]


def agreeing(cached: Sequence[int], sequence: Sequence[int]) -> int:
    """How many leading cached positions were computed from the tokens of `sequence`."""
    count = 0
    for cached_token, token in zip(cached, sequence, strict=False):
        if cached_token != token:
            break
        count += 1
    return count


class LaggedFeatures:
    """The target features of the committed tokens, addressed by the row that reads them.

    Target features lag one token: the newest committed token has none yet. Row q (the row of
    committed token q) reads the feature of position q - 1, and row 0 reads zeros (nothing
    precedes the first token), exactly as the heads see them in training (`lag`). So there is
    one row per committed token.
    """

    def __init__(self, width: int) -> None:
        self.width = width
        self._buffer = torch.zeros(0, width)
        self._start = self._end = 0  # the buffer's slots of the rows held
        self._first = 0  # the row held at self._buffer[self._start]

    def start(self, features: torch.Tensor | None, num_tokens: int) -> None:
        """features (num_tokens - 1, F) of the prompt's tokens but the last, or None."""
        rows = torch.zeros(1, self.width)
        if features is not None:
            rows = torch.cat([rows.to(features), features])
        if rows.shape[0] != num_tokens:
            raise ValueError(
                f"expected target features for the {num_tokens - 1} prompt tokens before the "
                f"last, got {rows.shape[0] - 1}"
            )
        self._buffer, self._start, self._end, self._first = rows, 0, rows.shape[0], 0

    def append(self, features: torch.Tensor | None, num_tokens: int) -> None:
        """features (num_tokens, F): one per target position kept in the round."""
        if features is None or features.shape[0] != num_tokens:
            got = None if features is None else tuple(features.shape)
            raise ValueError(
                f"this drafter reads target features: commit needs ({num_tokens}, {self.width}) "
                f"features for {num_tokens} tokens, got {got}"
            )
        buffer = self._buffer
        if (
            self._end + num_tokens > buffer.shape[0]
            or buffer.dtype != features.dtype
            or buffer.device != features.device
        ):
            # Grown by doubling, so a round costs its own rows, not a copy of every row held
            # (rows pile up while a policy decodes plainly and nothing reads them).
            held = buffer[self._start : self._end]
            size = max(2 * held.shape[0], held.shape[0] + num_tokens, 64)
            self._buffer = features.new_empty(size, self.width)
            self._buffer[: held.shape[0]] = held
            self._start, self._end = 0, held.shape[0]
        self._buffer[self._end : self._end + num_tokens] = features
        self._end += num_tokens

    def __len__(self) -> int:
        """Rows known: the number of committed tokens."""
        return self._first + self._end - self._start

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """(stop - start, F) the features read by rows start .. stop - 1."""
        if start < self._first or stop > len(self):
            raise IndexError(f"rows {start}..{stop} are outside {self._first}..{len(self)}")
        offset = self._start - self._first
        return self._buffer[offset + start : offset + stop]

    def release(self, before: int) -> None:
        """Forget the rows before `before`: they will not be read again."""
        drop = min(max(before - self._first, 0), self._end - self._start)
        self._start, self._first = self._start + drop, self._first + drop


class DraftBuilder:
    """One round's draft: chooses each token from its logits and assembles the `Draft`.

    Greedy takes the argmax; sampling draws from the processed q (`probabilities`, the same
    processing as the target's), which is what keeps rejection sampling exact. Whether each
    step's top-1 token repeats the request's context (`context_match`) goes to the stop rule
    and, with the confidence signals, into the draft's `signals`.
    """

    def __init__(
        self,
        request: DraftRequest,
        max_draft_tokens: int | None = None,
        support: torch.Tensor | None = None,
    ) -> None:
        """A chain for request of at most max_draft_tokens (default: the request's depth), from
        logits that are -inf outside the target ids `support` (None: nowhere; `Draft.support`)."""
        self.max_draft_tokens = (
            request.shape.depth if max_draft_tokens is None else max_draft_tokens
        )
        self.support = support
        self.sampling = request.sampling
        self.generator = request.generator
        self.stop = request.stop
        self.context = request.context
        self._context_tail = self.context.tail()
        self.tokens: list[int] = []
        self._logits: list[torch.Tensor] = []
        self._probs: list[torch.Tensor] = []
        self._context_match: list[float] = []
        self._stopped = False

    @property
    def done(self) -> bool:
        """True once the draft is full or the stop callback ended it."""
        return self._stopped or len(self.tokens) >= self.max_draft_tokens

    def add(self, logits: torch.Tensor) -> int:
        """Choose the next token from its raw logits (V,) over the target vocabulary."""
        logits = logits.float()
        top1 = int(greedy_tokens(logits))
        if self.sampling.greedy:
            token = top1
        else:
            probs = probabilities(logits, self.sampling)
            token = sample(probs, self.generator)
            self._probs.append(probs)
        before = self._context_tail + self.tokens
        self._context_match.append(float(self.context.matches(before, top1)))
        self.tokens.append(token)
        self._logits.append(logits)
        # The stop rule reads the support's columns: the same signals, for less work.
        if self.stop is not None and self.stop(
            len(self.tokens) - 1, on_support(logits, self.support), bool(self._context_match[-1])
        ):
            self._stopped = True
        return token

    def draft(self) -> Draft:
        if not self.tokens:
            return Draft.empty()
        logits = torch.stack(self._logits)
        signals = confidence_signals(on_support(logits, self.support))
        signals[CONTEXT_SIGNAL] = torch.tensor(self._context_match, device=logits.device)
        return Draft(
            tokens=torch.tensor(self.tokens, dtype=torch.long),
            probs=torch.stack(self._probs) if self._probs else None,
            logits=logits,
            support=self.support,
            signals=signals,
        )


def to_target_vocab(
    logits: torch.Tensor, d2t: torch.Tensor | None, vocab_size: int
) -> torch.Tensor:
    """Draft-vocabulary logits (..., V_d) on the target vocabulary (..., V): -inf outside the
    draft vocabulary, so q is zero there and rejection sampling stays exact. d2t (V_d,) maps
    draft ids to target ids; None means the logits already cover the target vocabulary."""
    if d2t is None:
        return logits
    full = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))
    return full.index_copy_(-1, d2t.to(logits.device), logits)
