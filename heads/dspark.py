"""DSpark's two additions to a DFlash head: a Markov logit bias and a confidence head.

A DFlash block predicts every row from the context and mask tokens alone, so no row knows which
token the row before it drafted. The Markov head adds a low-rank bias from that previous token
to each row's draft logits, ``B[prev] = W2 W1[prev]`` (W1: one rank-r row per target id, W2:
rank r -> draft vocabulary), optionally gated by the row's hidden state. Drafting then picks the
block's tokens one row at a time, but the rows' hidden states still come from one forward: the
bias is an embedding lookup and one small matrix product a row.

The confidence head is a linear read of each row's hidden state (and the previous token's W1
row) giving the logit of that row's acceptance rate, trained against the rate the target's
distribution gives the row's draft distribution, ``sum_v min(p_v, q_v)`` (one minus their total
variation: the chance rejection sampling accepts the drafted token), or against whether the
row's top token is the target's (what greedy decoding accepts).

Names and shapes follow speculators' `dspark` (`markov_head.markov_w1 / markov_w2 / gate_proj`,
`confidence_head.proj`), so an export is a renaming. Its recurrent variant (`rnn`) is not
computed here.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

MARKOV_HEAD_TYPES = ("vanilla", "gated")
"""vanilla: the bias depends on the previous token alone; gated: a sigmoid gate from the row's
hidden state and the previous token scales its rank-r embedding first."""
CONFIDENCE_TARGETS = ("overlap", "greedy")
"""What a confidence head learns of each row: the chance sampling accepts its token (overlap),
or whether greedy decoding does (greedy)."""


class MarkovHead(nn.Module):
    """Low-rank logit bias from the previous token of a block row."""

    def __init__(
        self, vocab_size: int, draft_vocab_size: int, rank: int, hidden_size: int, head_type: str
    ) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"markov_rank must be at least 1 for a Markov head, got {rank}")
        if head_type not in MARKOV_HEAD_TYPES:
            raise ValueError(
                f"markov_head_type must be one of {', '.join(MARKOV_HEAD_TYPES)}, got {head_type!r}"
            )
        self.head_type = head_type
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        nn.init.normal_(self.markov_w1.weight, std=0.01)  # starts as a near-zero bias
        self.markov_w2 = nn.Linear(rank, draft_vocab_size, bias=False)
        if head_type == "gated":
            self.gate_proj = nn.Linear(hidden_size + rank, rank)

    def embed(self, previous: torch.Tensor) -> torch.Tensor:
        """previous (...) target ids -> their W1 rows (..., r)."""
        return self.markov_w1(previous)

    def forward(self, embedded: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The bias (..., V_d) of rows whose previous tokens' W1 rows are embedded (..., r) and
        whose normalised hidden states are hidden (..., H)."""
        embedded = embedded.to(self.markov_w2.weight.dtype)
        if self.head_type == "gated":
            gate = self.gate_proj(torch.cat([hidden.to(embedded.dtype), embedded], dim=-1))
            embedded = torch.sigmoid(gate) * embedded
        return self.markov_w2(embedded)


class ConfidenceHead(nn.Module):
    """Logit of a block row's acceptance rate, linear in its features."""

    def __init__(self, input_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(input_size, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features (..., F) -> logits (...,)."""
        return self.proj(features.to(self.proj.weight.dtype)).squeeze(-1)


class BlockConfidence(nn.Module):
    """A confidence head as its drafter's own learned acceptance head (the protocol of
    `AcceptanceHead`: `predict(states, signals)`): the states its head exposes are the
    confidence head's features, and it reads no signal."""

    signals: tuple[str, ...] = ()

    def __init__(self, confidence: ConfidenceHead) -> None:
        super().__init__()
        self.confidence = confidence
        self.state_size = confidence.proj.in_features

    def forward(self, states: torch.Tensor, signals: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """states (..., F) -> logits (...,) of acceptance, float32."""
        if states.shape[-1] != self.state_size:
            raise ValueError(
                f"the confidence head reads states of width {self.state_size}, got "
                f"{tuple(states.shape)}: were they exposed by its own drafter?"
            )
        return self.confidence(states.to(self.confidence.proj.weight.device)).float()

    def predict(self, states: torch.Tensor, signals: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """P(accept) (...,) in (0, 1) float32, inputs as `forward`."""
        return torch.sigmoid(self.forward(states, signals))


def acceptance_rate(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """The chance rejection sampling accepts a token drawn from q = softmax(draft_logits) under
    p = softmax(target_logits), both (..., V) over the same ids: sum_v min(p_v, q_v), (...,)
    float32."""
    q = draft_logits.float().softmax(-1)
    p = target_logits.float().softmax(-1)
    return torch.minimum(p, q).sum(-1)


def confidence_targets(
    step_logits: list[torch.Tensor],
    target_logits: torch.Tensor,
    draft_to_target: torch.Tensor | None,
    kind: str,
) -> list[torch.Tensor]:
    """Depth d's acceptance rates (B, T - 1 - d) float32: step_logits[d] (B, T, V_d) at anchor t
    drafts token t + 1 + d, judged against target_logits (B, T, V) at t + d. overlap: the
    target's distribution renormalised over the draft vocabulary (as speculators' DSpark scores
    it: the draft's lies inside it); greedy: 1 where the draft's top token is the target's top
    token of the whole vocabulary (one outside the draft vocabulary is never accepted)."""
    length = target_logits.shape[1]
    d2t = None if draft_to_target is None else draft_to_target.to(target_logits.device)
    with torch.no_grad():  # once for every depth: the renormalised target, or its top tokens
        if kind == "overlap" and d2t is not None:
            target_logits = target_logits.index_select(-1, d2t)
        top = target_logits.argmax(-1) if kind == "greedy" else None
        rates = []
        for d, step in enumerate(step_logits):
            n = max(length - 1 - d, 0)
            if top is None:
                rates.append(acceptance_rate(step[:, :n], target_logits[:, d : d + n]))
                continue
            drafted = step[:, :n].argmax(-1)
            if d2t is not None:
                drafted = d2t[drafted]
            rates.append((drafted == top[:, d : d + n]).float())
    return rates


def confidence_loss(
    head: ConfidenceHead,
    states: list[torch.Tensor],
    rates: list[torch.Tensor],
    loss_mask: torch.Tensor,
) -> torch.Tensor:
    """The confidence head's mean binary cross-entropy over depths and counted positions: depth
    d's states (B, T, F) at anchors t < T - 1 - d against its rates (`confidence_targets`),
    where loss_mask (B, T) counts token t + d."""
    total, count = rates[0].new_zeros(()), 0
    for d, (state, rate) in enumerate(zip(states, rates, strict=True)):
        n = rate.shape[1]
        if n == 0:
            continue
        counted = loss_mask[:, d : d + n].to(torch.bool)
        predicted = head(state[:, :n]).float()
        loss = F.binary_cross_entropy_with_logits(predicted, rate, reduction="none")
        total = total + loss.where(counted, 0.0).sum()
        count += int(counted.sum())
    return total / max(count, 1)
