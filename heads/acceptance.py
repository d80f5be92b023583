"""A learned acceptance head (SpecDec++): P(the target accepts a drafted token) from the
drafter's hidden state behind that token and the token's confidence signals.

The one trainer fits it with binary cross-entropy on detached inputs, so the drafter's own
training is unchanged (`draftsmith.train.acceptance`). Its label is teacher-forced acceptance
(`chain_outcomes`): the draft's argmax equals the target's at that position, counted on the
draft chains greedy decoding makes (every earlier step of the chain accepted). At decoding time
`LearnedAcceptance` (`draftsmith.heads.learned_acceptance`) runs it as the policy's
acceptance model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from draftsmith.core.signals import SIGNAL_NAMES, confidence_signals
from draftsmith.heads.blocks import seeded


@dataclass(kw_only=True)
class AcceptanceHeadConfig:
    """A learned acceptance head's hyper-parameters."""

    width: int = 64
    """Hidden units of its MLP; 0: a logistic layer on the inputs."""
    seed: int = 0
    """Seeds its initialisation."""

    def __post_init__(self) -> None:
        if self.width < 0:
            raise ValueError(f"acceptance_head.width must be >= 0, got {self.width}")


PROBABILITY_INPUTS = ("top1_prob", "margin", "path_prob", "composite")
"""Signals the head also reads as logits: acceptance is close to linear in logit(top-1), far
from linear in top-1 itself (a logistic layer on the raw signals ranks drafts worse than top-1
does)."""


def signal_features(signals: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The head's view of the signals (each (...,)): (..., S + P), each signal as it is (O(1)
    numbers: probabilities, nats, a draft position), then the logits of PROBABILITY_INPUTS."""
    missing = [name for name in SIGNAL_NAMES if name not in signals]
    if missing:
        raise ValueError(f"the acceptance head reads signals {missing}, which are missing")
    raw = torch.stack([signals[name].float() for name in SIGNAL_NAMES], dim=-1)
    probs = torch.stack([signals[name].float() for name in PROBABILITY_INPUTS], dim=-1)
    return torch.cat([raw, torch.logit(probs, eps=1e-6)], dim=-1)


class AcceptanceHead(nn.Module):
    """logit P(accept) = linear(signal features) + MLP([rms-normalised state ; signal features]).

    The linear part is a logistic regression on the signals (Platt scaling's form); the MLP's
    output layer starts at zero, so a fresh head is that regression and the hidden state adds
    what it knows beyond the signals. The state is normalised without weights because drafter
    states carry a few massive channels (EAGLE-3's residual stream starts at the fused target
    features).
    """

    signals: tuple[str, ...] = SIGNAL_NAMES
    """The confidence signals it reads, in input order."""

    def __init__(self, state_size: int, config: AcceptanceHeadConfig) -> None:
        super().__init__()
        if state_size < 1:
            raise ValueError(f"an acceptance head needs a state size >= 1, got {state_size}")
        self.state_size, self.config = state_size, config
        features = len(SIGNAL_NAMES) + len(PROBABILITY_INPUTS)
        inputs = state_size + features
        with seeded(config.seed):
            self.linear = nn.Linear(features, 1)
            if config.width:
                layers = [nn.Linear(inputs, config.width), nn.SiLU(), nn.Linear(config.width, 1)]
            else:  # a logistic layer on every input
                layers = [nn.Linear(inputs, 1)]
            self.mlp = nn.Sequential(*layers)
        nn.init.zeros_(self.mlp[-1].weight)
        nn.init.zeros_(self.mlp[-1].bias)

    def forward(self, states: torch.Tensor, signals: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """states (..., H) and signals, each (...,) -> logits (...,) of acceptance."""
        if states.shape[-1] != self.state_size:
            raise ValueError(
                f"the acceptance head reads states of width {self.state_size}, got "
                f"{tuple(states.shape)}: was it trained for another drafter?"
            )
        weight = self.linear.weight
        states = states.to(weight.device).float()
        states = states * torch.rsqrt(states.pow(2).mean(-1, keepdim=True) + 1e-6)
        features = signal_features(signals).to(states.device)
        inputs = torch.cat([states, features], dim=-1).to(weight.dtype)
        logits = self.linear(features.to(weight.dtype)) + self.mlp(inputs)
        return logits.squeeze(-1).float()

    def predict(self, states: torch.Tensor, signals: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """P(accept) (...,) in (0, 1) float32, inputs as `forward`."""
        return torch.sigmoid(self.forward(states, signals))


def chain_labels(
    length: int, steps: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each draft chain step is scored: label (T, K) int64, the target position t + k whose
    logits score step k of the chain after t (clamped inside the row), and inside (T, K) bool,
    whether the drafted token t + 1 + k lies inside the row."""
    label = torch.arange(length, device=device)[:, None] + torch.arange(steps, device=device)
    return label.clamp(max=max(length - 2, 0)), label + 1 < length


def chain_outcomes(
    drafted: torch.Tensor,
    input_ids: torch.Tensor,
    target_top1: torch.Tensor,
    loss_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced outcomes of the draft chains after every position of a row.

    Args:
        drafted (..., T, K): the target ids the chain after position t drafts at steps k
            (step k drafts token t + 1 + k).
        input_ids, target_top1, loss_mask (..., T): the text, the target's argmax after each
            position, and `TargetBatch.loss_mask`.

    Returns:
        accepted (..., T, K) bool: step k's token is the target's argmax at t + k.
        counted (..., T, K) bool: a step greedy decoding drafts and scores. Its token lies
        inside the row, loss_mask[t + k] holds, and every earlier step drafted the target's
        argmax with the text continuing with it, so the step saw the context greedy decoding
        gives it.
    """
    label, inside = chain_labels(drafted.shape[-2], drafted.shape[-1], drafted.device)
    top1 = target_top1[..., label]
    accepted = drafted == top1
    on_greedy_path = accepted & (input_ids[..., label + 1] == top1)
    prefix_ok = torch.ones_like(accepted)
    prefix_ok[..., 1:] = on_greedy_path[..., :-1].cumprod(-1).bool()
    return accepted, prefix_ok & inside & loss_mask.bool()[..., label]


def chain_signals(step_logits: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Confidence signals of the chains after every position: step_logits, K tensors (..., V),
    step k's drafts -> each signal (..., K), `confidence_signals` of each chain (position k,
    path_prob the product over steps 0 .. k), detached, one step's softmax at a time."""
    return confidence_signals([step.detach() for step in step_logits])
