"""The one training objective of every head kind, and the agreement metrics that evaluate it.

A head's `forward_train` returns K step logits; step k at position t predicts token t + 1 + k and
is scored against the target's logits at position t + k (the alignment convention of
`draftsmith.heads.trainable`). Per step, a divergence between the target's distribution p and
the draft's q is averaged over the positions that count, and the steps are combined with decay
weights ``step_decay ** k`` (normalised to sum to 1, so the loss scale does not grow with K), or
per position by D-PACE (`dpace_weights`):

    forward_kl   KL(p || q)             soft labels (EAGLE-3; the default)
    reverse_kl   KL(q || p)             mode seeking
    tv           1/2 sum |p - q|        total variation: 1 - TV is the acceptance rate of q
    jsd          beta KL(p || m) + (1 - beta) KL(q || m),  m = beta p + (1 - beta) q (DistillSpec)
    ce_argmax    -log q(argmax p)       hard labels (Medusa-classic)

A head with a reduced draft vocabulary (`draft_to_target()` maps its V_d ids to target ids)
is scored against the target's logits gathered onto those ids and renormalised there; under
``ce_argmax`` a position whose target argmax lies outside the draft vocabulary has no label and
is skipped.

Agreement (the evaluation metric): at a counted position, step k agrees when the draft's argmax
(mapped to a target id) equals the target's argmax over the full vocabulary. `Agreement` also
counts agreement *conditional on all earlier steps agreeing at the same position* (what a chain
draft started there needs), and replays greedy chain decoding over each row (`tau_sim`): a round
at position t accepts the a agreeing leading steps of t's chain and the target adds one token,
so the next round starts at t + a + 1. Rounds start where the decoder's would, not at every
position: averaging chains over every start over-weights easy stretches (a run the decoder
crosses in one round counts once per position in it). On the target's own greedy text (every
accepted draft is the data's next token) the replay is greedy decoding itself; on other text
every step sees the data's tokens, so it estimates the decoder's tau.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

__all__ = [
    "DIVERGENCES",
    "Agreement",
    "ObjectiveConfig",
    "ObjectiveOutput",
    "divergence",
    "dpace_weights",
    "draft_objective",
    "step_weights",
]

Divergence = Literal["forward_kl", "reverse_kl", "tv", "jsd", "ce_argmax"]
StepWeighting = Literal["decay", "dpace"]
DIVERGENCES: tuple[str, ...] = ("forward_kl", "reverse_kl", "tv", "jsd", "ce_argmax")


@dataclass(kw_only=True)
class ObjectiveConfig:
    """How a head's step logits are scored against the target."""

    divergence: Divergence = "forward_kl"
    """forward_kl (soft labels, EAGLE-3), reverse_kl, tv, jsd (DistillSpec) or ce_argmax (hard
    labels from the target's argmax, Medusa-classic)."""
    step_decay: float = 0.8
    """Step k's weight is step_decay ** k (normalised over the K steps)."""
    jsd_beta: float = 0.5
    """jsd only: the mixture weight beta of the target's distribution, in (0, 1)."""
    step_weighting: StepWeighting = "decay"
    """decay: step k weighs step_decay ** k; dpace: each step of the chain after each position
    weighs what it can still earn (`dpace_weights`, speculators' D-PACE for block drafters)."""
    dpace_alpha: float = 0.5
    """dpace only: the smoothing alpha of each step's confidence, in (0, 1]."""

    def __post_init__(self) -> None:
        if self.divergence not in DIVERGENCES:
            raise ValueError(
                f"objective.divergence must be one of {', '.join(DIVERGENCES)}; "
                f"got {self.divergence!r}"
            )
        if not self.step_decay > 0:
            raise ValueError(f"objective.step_decay must be positive, got {self.step_decay}")
        if not 0 < self.jsd_beta < 1:
            raise ValueError(f"objective.jsd_beta must be in (0, 1), got {self.jsd_beta}")
        if self.step_weighting not in ("decay", "dpace"):
            raise ValueError(
                f"objective.step_weighting must be decay or dpace, got {self.step_weighting!r}"
            )
        if not 0 < self.dpace_alpha <= 1:
            raise ValueError(f"objective.dpace_alpha must be in (0, 1], got {self.dpace_alpha}")


@dataclass
class Agreement:
    """Top-1 agreement counts per step; sums over batches and processes (`__add__`, all-reduce
    the tensors) before reading rates."""

    agree: torch.Tensor
    """(K,) counted positions where step k's argmax equals the target's."""
    total: torch.Tensor
    """(K,) counted positions of step k."""
    chain_agree: torch.Tensor
    """(K,) positions where steps 0..k all agree."""
    chain_total: torch.Tensor
    """(K,) positions where steps 0..k-1 all agree and step k is counted."""
    walk_tokens: torch.Tensor
    """(K,) tokens a greedy decoder drafting k + 1 tokens a round produces over the rows."""
    walk_rounds: torch.Tensor
    """(K,) rounds it takes for them."""

    @classmethod
    def zeros(cls, num_steps: int, device: torch.device | str = "cpu") -> Agreement:
        return cls(*(torch.zeros(num_steps, dtype=torch.long, device=device) for _ in range(6)))

    def __add__(self, other: Agreement) -> Agreement:
        return Agreement(
            self.agree + other.agree,
            self.total + other.total,
            self.chain_agree + other.chain_agree,
            self.chain_total + other.chain_total,
            self.walk_tokens + other.walk_tokens,
            self.walk_rounds + other.walk_rounds,
        )

    def as_tensor(self) -> torch.Tensor:
        """(6, K) stacked counts, for one all-reduce."""
        return torch.stack(
            [
                self.agree,
                self.total,
                self.chain_agree,
                self.chain_total,
                self.walk_tokens,
                self.walk_rounds,
            ]
        )

    @classmethod
    def from_tensor(cls, counts: torch.Tensor) -> Agreement:
        return cls(*counts.unbind(0))

    def top1(self) -> list[float]:
        """Per-step top-1 agreement with the target (teacher-forced)."""
        return _rates(self.agree, self.total)

    def acceptance(self) -> list[float]:
        """Per-step conditional acceptance acc_k = P(step k agrees | steps < k agree)."""
        return _rates(self.chain_agree, self.chain_total)

    def tau_sim(self) -> list[float]:
        """Mean accepted length (tokens per target forward, the target's own token included) of
        greedy chain decoding with k = 1..K draft tokens a round, replayed over the rows; 1.0
        where nothing was counted."""
        return [
            t / r if r else 1.0
            for t, r in zip(self.walk_tokens.tolist(), self.walk_rounds.tolist(), strict=True)
        ]


@dataclass
class ObjectiveOutput:
    loss: torch.Tensor
    """() the decay-weighted mean of the per-step losses, or the D-PACE-weighted sum over the
    counted positions over their count (carries the gradient)."""
    step_losses: torch.Tensor
    """(K,) detached per-step losses."""
    agreement: Agreement
    acceptance: torch.Tensor | None = None
    """A learned acceptance head's detached sums (`draftsmith.train.acceptance.ACCEPTANCE_SUMS`),
    or None without one."""


def step_weights(num_steps: int, decay: float) -> torch.Tensor:
    """(K,) float32 weights decay ** k, normalised to sum to 1."""
    weights = decay ** torch.arange(num_steps, dtype=torch.float32)
    return weights / weights.sum()


def dpace_weights(losses: torch.Tensor, counted: torch.Tensor, alpha: float) -> torch.Tensor:
    """D-PACE weights (K, ...) of the K steps of the chain after each position, from their
    per-position losses and counted masks (K, ...): step k's confidence is c_k = exp(-loss_k),
    smoothed to s_k = (1 - alpha) c_k + alpha (1 where not counted), and step k weighs
    sum_{j >= k} s_0 ... s_j over the counted steps j: the expected length still to be gained
    from step k on, so steps a chain rarely reaches weigh little. Detached, as speculators'."""
    with torch.no_grad():
        smooth = torch.where(counted, (1 - alpha) * torch.exp(-losses.float()) + alpha, 1.0)
        prefix = torch.cumprod(smooth, dim=0) * counted
        return torch.flip(torch.cumsum(torch.flip(prefix, [0]), dim=0), [0]) * counted


def divergence(
    kind: Divergence,
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor,
    *,
    jsd_beta: float = 0.5,
) -> torch.Tensor:
    """Per-position divergence of the draft from the target.

    draft_logits, target_logits (..., V) over the same vocabulary; returns (...,) float32.
    ce_argmax takes its label from the target's argmax over these logits.
    """
    log_q = F.log_softmax(draft_logits.float(), dim=-1)
    log_p = F.log_softmax(target_logits.float(), dim=-1)
    return _divergence(kind, log_q, log_p, jsd_beta)


def _divergence(
    kind: Divergence, log_q: torch.Tensor, log_p: torch.Tensor, jsd_beta: float
) -> torch.Tensor:
    """`divergence` from log-probabilities log_q (draft), log_p (target) (..., V)."""
    if kind == "forward_kl":
        return _kl(log_p, log_q)
    if kind == "reverse_kl":
        return _kl(log_q, log_p)
    if kind == "tv":
        return 0.5 * (log_p.exp() - log_q.exp()).abs().sum(-1)
    if kind == "jsd":
        log_m = torch.logaddexp(log_p + math.log(jsd_beta), log_q + math.log1p(-jsd_beta))
        return jsd_beta * _kl(log_p, log_m) + (1 - jsd_beta) * _kl(log_q, log_m)
    if kind == "ce_argmax":
        return -log_q.gather(-1, log_p.argmax(-1, keepdim=True)).squeeze(-1)
    raise ValueError(f"unknown divergence {kind!r}; choose one of {', '.join(DIVERGENCES)}")


def draft_objective(
    step_logits: Sequence[torch.Tensor],
    target_logits: torch.Tensor,
    loss_mask: torch.Tensor,
    config: ObjectiveConfig,
    draft_to_target: torch.Tensor | None = None,
    first_drafted_step: int = 0,
) -> ObjectiveOutput:
    """Score K step logits against the target (see the module doc for the alignment).

    step_logits: K tensors (B, T, V_d); target_logits (B, T, V); loss_mask (B, T), nonzero where
    the next-token prediction at t is trained on (`TargetBatch.loss_mask`); draft_to_target
    (V_d,) int64 or None when V_d == V. Step k at position t counts iff t + 1 + k < T and
    loss_mask[t + k] (and, under ce_argmax with a reduced vocabulary, the label is drafted).
    Every step is trained; the agreement counts the drafted steps `first_drafted_step` .. K-1
    (`DraftHead.first_drafted_step`), so its draft positions are the decoder's.
    """
    num_steps = len(step_logits)
    if num_steps == 0:
        raise ValueError("forward_train returned no step logits")
    batch, length, vocab = target_logits.shape
    device = target_logits.device
    target_top1 = target_logits.argmax(-1)  # (B, T) over the full vocabulary
    target_in_draft = target_logits
    label_drafted = torch.ones_like(target_top1, dtype=torch.bool)
    if draft_to_target is not None:
        draft_to_target = draft_to_target.to(device)
        target_in_draft = target_logits.index_select(-1, draft_to_target)
        drafted = torch.zeros(vocab, dtype=torch.bool, device=device)
        drafted[draft_to_target] = True
        label_drafted = drafted[target_top1]
    target_log_p = F.log_softmax(target_in_draft.float(), dim=-1)  # once for all K steps
    mask = loss_mask.to(device=device, dtype=torch.bool)
    if config.divergence == "ce_argmax":
        mask = mask & label_drafted

    losses = []
    agree = torch.zeros(num_steps, batch, length, dtype=torch.bool, device=device)
    counted = torch.zeros_like(agree)
    for k, logits in enumerate(step_logits):
        n = length - 1 - k  # positions t whose label t + 1 + k lies inside the sequence
        if n <= 0:  # zeros that keep every step in the graph
            losses.append(logits.new_zeros(batch, length, dtype=torch.float32) + logits.sum() * 0)
            continue
        step_mask = mask[:, k : k + n]
        per_position = _divergence(
            config.divergence,
            F.log_softmax(logits[:, :n].float(), dim=-1),
            target_log_p[:, k : k + n],
            config.jsd_beta,
        )
        losses.append(F.pad(per_position.where(step_mask, 0.0), (0, length - n)))
        with torch.no_grad():
            top1 = logits[:, :n].argmax(-1)
            if draft_to_target is not None:
                top1 = draft_to_target[top1]
            agree[k, :, :n] = top1 == target_top1[:, k : k + n]
            counted[k, :, :n] = step_mask
    per_position = torch.stack(losses)  # (K, B, T)
    step_losses = per_position.sum((1, 2)) / counted.sum((1, 2)).clamp_min(1)
    if config.step_weighting == "dpace":
        weights = dpace_weights(per_position, counted, config.dpace_alpha)
        loss = (weights * per_position).sum() / counted.sum().clamp_min(1)
    else:
        loss = (step_weights(num_steps, config.step_decay).to(device) * step_losses).sum()
    return ObjectiveOutput(
        loss=loss,
        step_losses=step_losses.detach(),
        agreement=_count(agree[first_drafted_step:], counted[first_drafted_step:]),
    )


def _count(agree: torch.Tensor, counted: torch.Tensor) -> Agreement:
    """agree, counted (K, B, T) bool -> per-step plain and chain (prefix-conditional) counts."""
    hit = agree & counted
    # prefix[k]: steps 0..k-1 all agree (and were counted) at that position
    prefix = torch.cat([torch.ones_like(hit[:1]), hit[:-1].cumprod(0).bool()])
    tokens, rounds = _walk(hit.long().cumprod(0).sum(0), counted[0], hit.shape[0])
    return Agreement(
        agree=hit.sum((1, 2)),
        total=counted.sum((1, 2)),
        chain_agree=(hit & prefix).sum((1, 2)),
        chain_total=(counted & prefix).sum((1, 2)),
        walk_tokens=tokens.to(hit.device),
        walk_rounds=rounds.to(hit.device),
    )


def _walk(
    runs: torch.Tensor, starts: torch.Tensor, num_steps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Replay greedy chain decoding over each row, for drafts of k = 1..num_steps tokens.

    runs (B, T) int: how many leading steps of the chain at t agree (0..num_steps); starts
    (B, T) bool: where a round may start (step 0 is counted). Each run of starts is one text the
    decoder continues to its end: like the decoder, a round drafts no further than the text's
    last token, so its target token lands inside. Returns tokens, rounds (K,) int64.
    """
    tokens, rounds = [0] * num_steps, [0] * num_steps
    for row_runs, row_starts in zip(runs.tolist(), starts.tolist(), strict=True):
        last = [0] * len(row_starts)  # the last start of the run of starts holding t
        for t in reversed(range(len(row_starts))):
            following = t + 1 < len(row_starts) and row_starts[t + 1]
            last[t] = last[t + 1] if following else t
        for k in range(1, num_steps + 1):
            t = 0
            while t < len(row_runs):
                if not row_starts[t]:
                    t += 1
                    continue
                accepted = min(row_runs[t], k, last[t] - t)
                tokens[k - 1] += accepted + 1
                rounds[k - 1] += 1
                t += accepted + 1
    return torch.tensor(tokens), torch.tensor(rounds)


def _kl(log_a: torch.Tensor, log_b: torch.Tensor) -> torch.Tensor:
    """KL(a || b) over the last dim from log-probabilities; 0 log 0 = 0."""
    a = log_a.exp()
    # where() inside the product keeps 0 * (-inf) from turning into a NaN value or gradient
    return (a * torch.where(a > 0, log_a - log_b, 0.0)).sum(-1)


def _rates(hits: torch.Tensor, totals: torch.Tensor) -> list[float]:
    return [h / t if t else math.nan for h, t in zip(hits.tolist(), totals.tolist(), strict=True)]
