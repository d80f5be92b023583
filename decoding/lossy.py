"""Lossy verification, opt-in: rules that accept plausible draft tokens the target would not have
produced itself, so more of each draft survives, at the price of output that differs from the
target's own. Each verifier says `lossy = True` and every result it makes says so too; measure
what it costs with `draftsmith.evaluation.fidelity`.

Both rules accept the target's own top token wherever they look at a node, so they accept at
least what greedy verification accepts, and both work on chains and trees (rows of the target's
output as in `decoding.verify`: row 0 after the newest committed token, row 1 + i after node i).

`build_verifier(name, threshold)` makes one by name ("lossless", "typical", "modulated").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from draftsmith.core.sampling import SamplingParams, greedy_tokens, probabilities, sample
from draftsmith.core.signals import confidence_signals
from draftsmith.decoding.verify import LosslessVerifier, verify_sampling
from draftsmith.heads.base import Draft


@dataclass(frozen=True)
class TypicalVerifier:
    """Medusa-2's typical acceptance (Cai et al. 2024, arXiv 2401.10774, section 2.3.1; the
    `evaluate_posterior` of github.com/FasterDecoding/Medusa, medusa/model/utils.py).

    A draft token x after a prefix is accepted when

        p(x) > min(epsilon, delta * exp(-H(p)))

    with p the target's distribution after the prefix and H its entropy in nats (or when x is p's
    top token). The accepted path is the longest root path whose every node is accepted (a chain:
    the accepted prefix); among equally long paths, the first in draft order. The next token is
    the target's argmax after the path when greedy, else drawn from p there.

    p is the target's processed sampling distribution (temperature, top-k, top-p). Greedy
    decoding uses the softmax at temperature 1: Medusa's code falls back to exact argmax matching
    at temperature 0 (the criterion's limit as the temperature goes to 0), which would make this
    verifier lossless there; at temperature 1 it relaxes greedy decoding too.

    epsilon in (0, 1] is the knob: smaller accepts more. delta defaults to sqrt(epsilon), as
    Medusa-2 pairs them (epsilon 0.09, delta 0.3). Even the strictest setting (epsilon = delta =
    1: p(x) > exp(-H(p))) is not greedy: where two tokens share most of the mass (p = 0.45, 0.45,
    0.1: exp(-H) = 0.39) both pass.
    """

    epsilon: float = 0.09
    delta: float | None = None
    lossy: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not 0.0 < self.epsilon <= 1.0:
            raise ValueError(
                f"typical acceptance needs epsilon in (0, 1] (1 is the strictest), got "
                f"{self.epsilon}"
            )
        if self.delta is None:
            object.__setattr__(self, "delta", math.sqrt(self.epsilon))
        if not 0.0 < self.delta <= 1.0:
            raise ValueError(f"typical acceptance needs delta in (0, 1], got {self.delta}")

    def __call__(
        self,
        target_logits: torch.Tensor,
        draft: Draft,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> tuple[list[int], int]:
        """target_logits (k+1, V) float32 -> (the accepted path's nodes, the next token)."""
        probs = _criterion_probabilities(target_logits, sampling)
        entropy = torch.special.entr(probs).sum(-1)  # (k+1,)
        threshold = torch.minimum(
            torch.full_like(entropy, self.epsilon), self.delta * torch.exp(-entropy)
        )
        rows = draft.parents + 1  # (k,) the row each node's token is predicted in
        p_token = probs[rows, draft.tokens]
        path = _accepted(target_logits, draft, p_token > threshold[rows])
        row = path[-1] + 1 if path else 0
        if sampling.greedy:
            return path, int(greedy_tokens(target_logits[row]))
        return path, sample(probs[row], generator)


@dataclass(frozen=True)
class ModulatedVerifier:
    """Confidence-modulated acceptance, after the verification step of CM-ASD (Waghela, Sen and
    Dasgupta 2025, "Confidence-Modulated Speculative Decoding for Large Language Models", arXiv
    2508.15371).

    NOT VERIFIED AGAINST THE PAPER: its text could not be had here, only its abstract and
    summaries ("the verification process is modulated using the same confidence signals",
    entropy and margin of the drafter's distribution; acceptance "stricter in uncertain regions
    and relaxed where the model is confident"). The rule below is ours, built to that description.

    The drafter's confidence at node i, from its draft distribution q_i = softmax(draft logits):

        c_i = margin(q_i) * (1 - H(q_i) / log V)            in [0, 1]

    (top-1 minus top-2 probability, times one minus the normalised entropy: 1 only for a one-hot
    q, 0 for a tie). With strength lambda in [0, 1), the target's tolerance is s_i = 1 - lambda c_i:

    - greedy: x is accepted when p(x) >= s_i * max p, p the target's softmax at temperature 1 (the
      argmax always passes); the longest accepted root path wins (ties: draft order), then the
      target's argmax;
    - sampling: the rejection rule with q scaled by s_i, accept with probability
      min(1, p(x) / (s_i q(x))), residual and next token as in `verify_sampling`.

    lambda = 0 is the lossless rule in both settings (greedy up to exact ties of the target's
    top logits). Drafts without logits (n-gram) have c = 0 and are verified losslessly.
    """

    strength: float = 0.5
    lossy: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.strength < 1.0:
            raise ValueError(
                f"modulated acceptance needs strength in [0, 1) (0 is lossless), got "
                f"{self.strength}"
            )

    def __call__(
        self,
        target_logits: torch.Tensor,
        draft: Draft,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> tuple[list[int], int]:
        """target_logits (k+1, V) float32 -> (the accepted path's nodes, the next token)."""
        slack = 1.0 - self.strength * drafter_confidence(draft)  # (k,)
        if not sampling.greedy:
            return verify_sampling(
                probabilities(target_logits, sampling), draft, generator, slack=slack
            )
        log_probs = target_logits.float().log_softmax(-1)
        rows = draft.parents + 1
        # log p(x) - log max p >= log s: ratios in log space, so tiny probabilities still compare.
        gap = log_probs[rows, draft.tokens] - log_probs[rows].max(-1).values
        path = _accepted(target_logits, draft, gap >= torch.log(slack).to(gap.device))
        return path, int(greedy_tokens(target_logits[path[-1] + 1 if path else 0]))


def drafter_confidence(draft: Draft) -> torch.Tensor:
    """(k,) margin * (1 - normalised entropy) of each node's draft distribution (temperature 1);
    zeros for a draft without logits."""
    if draft.logits is None or len(draft) == 0:
        return torch.zeros(len(draft))
    signals = confidence_signals(draft.logits.float())
    normalised = signals["entropy"] / max(math.log(draft.logits.shape[-1]), 1e-9)
    return (signals["margin"] * (1.0 - normalised)).clamp(0.0, 1.0).cpu()


def _criterion_probabilities(target_logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """(k+1, V): the processed sampling distribution, or the softmax at temperature 1 when greedy
    (the greedy one-hot would leave nothing to relax)."""
    if sampling.greedy:
        return target_logits.float().softmax(-1)
    return probabilities(target_logits, sampling)


def _accepted(target_logits: torch.Tensor, draft: Draft, passes: torch.Tensor) -> list[int]:
    """The longest root path of nodes that pass or are the target's argmax after their parent."""
    argmax = greedy_tokens(target_logits).cpu()  # (k+1,)
    top = draft.tokens == argmax[draft.parents + 1]
    return longest_path(draft, (passes.cpu() | top).tolist())


def longest_path(draft: Draft, passes: list[bool]) -> list[int]:
    """The longest root path whose every node passes; among equally long ones, the first in
    draft order (the lexicographically smallest list of node indices). Empty when no child of the
    root passes."""
    parents = draft.parents.tolist()
    depth = [0] * len(parents)
    for i, parent in enumerate(parents):  # topological order: a parent's depth is known
        if passes[i] and (parent < 0 or depth[parent] > 0):
            depth[i] = 1 + (depth[parent] if parent >= 0 else 0)
    deepest = max(depth, default=0)
    if deepest == 0:
        return []
    return min(draft.path_to(i) for i, d in enumerate(depth) if d == deepest)


VERIFIERS: dict[str, type] = {
    "lossless": LosslessVerifier,
    "typical": TypicalVerifier,
    "modulated": ModulatedVerifier,
}
"""Every verification mode by name; only "lossless" keeps the target's output."""


def build_verifier(name: str, threshold: float | None = None):
    """The verifier called `name`; threshold sets a lossy mode's knob (typical: epsilon in
    (0, 1], delta = sqrt(epsilon); modulated: strength in [0, 1)), None for its default."""
    if name not in VERIFIERS:
        raise ValueError(f"unknown verification mode {name!r}; choose one of {sorted(VERIFIERS)}")
    if name == "lossless":
        if threshold is not None:
            raise ValueError(
                "lossless verification takes no threshold; pick a lossy mode "
                "('typical' or 'modulated') to relax acceptance"
            )
        return LosslessVerifier()
    if threshold is None:
        return VERIFIERS[name]()
    if name == "typical":
        return TypicalVerifier(epsilon=float(threshold))
    return ModulatedVerifier(strength=float(threshold))
