"""Online recalibration of the acceptance model from the decoder's own verifications.

A calibrator fitted offline (held-out stdlib code, teacher-forced) drifts when the traffic
changes (benchmarks/notes/calibration.md). Every verification labels the drafted
tokens it looked at for free, so `OnlineAcceptance` keeps correcting the offline model from that
stream:

    round = decoder round (a draft and its verification)
    signals, accepted = round_outcomes(round.draft, round.accepted_path)
    probs = online.predict_signals(signals)     # before this round's outcomes are known
    online.observe(signals, accepted)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from draftsmith.core.context import CONTEXT_SIGNAL
from draftsmith.core.logistic import LogisticPosterior, logit
from draftsmith.core.signals import AcceptanceModel, confidence_signals
from draftsmith.heads.base import Draft, on_support

CORRECTION_GROUPS = ("first", "later", "first, context match", "later, context match")
"""The groups of tokens `OnlineAcceptance` corrects apart, in the order of its `corrections`."""

SPLIT_SIGNALS = ("position", CONTEXT_SIGNAL)
"""The signals whose values split `CORRECTION_GROUPS` (a later token: position >= 1; a
repeat: context_match 1)."""

_CLIP = 1e-4
"""Offline probabilities are clipped to [_CLIP, 1 - _CLIP] before the logit (|z| <= 9.2), so a
calibrator that says 0 or 1 can still be corrected."""


def draft_signals(draft: Draft, nodes: Sequence[int] | None = None) -> dict[str, torch.Tensor]:
    """Confidence signals (each (k,)) of every node of a draft tree, or of `nodes` (ascending,
    each one's parent among them; for a chain, a prefix): `confidence_signals` of their logits
    (k, V) along the tree's paths (for a chain, exactly `confidence_signals(draft.logits)`). A
    draft that kept the signals its drafter computed (`Draft.signals`) gives those."""
    if draft.signals is not None:
        if nodes is None:
            return dict(draft.signals)
        index = torch.as_tensor(list(nodes), dtype=torch.long)
        return {name: value[index] for name, value in draft.signals.items()}
    if draft.logits is None:
        raise ValueError(
            "this draft has no logits (an n-gram drafter's), so it has no confidence signals "
            "to calibrate; use a drafter with a draft distribution"
        )
    if nodes is None:
        index, logits = torch.arange(len(draft)), draft.logits
    else:
        index = torch.as_tensor(list(nodes), dtype=torch.long)
        logits = draft.logits[index.to(draft.logits.device)]
    if draft.is_chain:
        return confidence_signals(on_support(logits, draft.support))
    row = {node: i for i, node in enumerate(index.tolist())}
    parents = [row[p] if p >= 0 else -1 for p in draft.parents[index].tolist()]
    return confidence_signals(on_support(logits, draft.support), parents=parents)


def round_outcomes(
    draft: Draft, accepted_path: Sequence[int]
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The nodes whose fate a verified round revealed, with their signals and labels.

    A node is observed when the target judged it: its parent is the root or on the accepted path.
    Of those, what counts is what the policy asks the acceptance model of the token it drafts:
    - chosen deterministically (`Draft.probs` None): nodes whose token is the argmax of their own
      draft distribution (`Draft.top1`, where the drafter kept it), P(the target accepts the
      top-1 token);
    - sampled: each judged node's first child in draft order, P(the token drawn from q is
      accepted). A later sibling is only tried after its elder ones were rejected, against
      what they left of p; the argmax filter would keep the sampled tokens that happened to be
      the top-1, which are accepted more often than a sample (an acceptance the policy then
      overrates at temperature > 0).

    Returns:
        signals: `draft_signals` restricted to the m observed nodes, each (m,), in node order.
        accepted (m,) float32: 1 for observed nodes on the accepted path, 0 otherwise.
    """
    on_path = torch.zeros(len(draft), dtype=torch.bool)
    on_path[list(accepted_path)] = True
    parents = draft.parents.cpu()
    judged = (parents < 0) | on_path[parents.clamp_min(0)]
    nodes = torch.nonzero(judged).flatten()
    if draft.probs is None and draft.top1 is not None:
        counted = nodes[draft.top1[nodes]].tolist()
    elif draft.probs is None:
        logits = draft.logits[nodes.to(draft.logits.device)].cpu()
        own = logits.gather(1, draft.tokens.cpu()[nodes, None]).squeeze(1)
        counted = nodes[own >= logits.max(dim=-1).values].tolist()
    else:
        first = torch.zeros(len(draft), dtype=torch.bool)
        first[_first_children(parents.tolist())] = True
        counted = torch.nonzero(judged & first).flatten().tolist()
    # A counted node's ancestors are the accepted path: the signals of those and the counted
    # nodes alone (not of every sibling judged, nor of a wide tree's every node) give the counted
    # ones' path probabilities.
    read = sorted(set(counted) | set(accepted_path))
    signals = draft_signals(draft, read)
    row_of = {node: row for row, node in enumerate(read)}
    rows = torch.tensor([row_of[node] for node in counted], dtype=torch.long)
    observed = {name: value[rows.to(value.device)] for name, value in signals.items()}
    return observed, on_path[counted].float()


def _first_children(parents: list[int]) -> list[int]:
    """Each parent's first child in node order."""
    first: dict[int, int] = {}
    for node, parent in enumerate(parents):
        first.setdefault(parent, node)
    return list(first.values())


class OnlineAcceptance:
    """An `AcceptanceModel` that recalibrates an offline one from the verification stream.

    Model: with z = logit(p_offline) (p_offline from the wrapped calibrator, or the raw
    `top1_prob` without one),

        P(accept) = sigmoid(a_g + b_g * z),   prior (a_g, b_g) ~ N((0, 1), I / prior_strength),

    with one correction g per group of tokens: the first token a round drafts (`position` 0) or
    the tokens after it (`position` >= 1, judged only when every token before it was accepted),
    each with or without a `context_match` (the token continues an n-gram of the committed
    sequence; `draftsmith.core.context`). At equal confidence the groups are accepted at
    different rates, so one correction shared by them is off for each: first tokens overrated
    and later ones underrated on the quickstart head's decoding, and tokens that repeat the
    context accepted far more often than the rest at the same draft confidence
    (benchmarks/notes/calibration.md), which lets a plan draft deep where the text repeats itself and
    stop early where it does not. The first token's acceptance is what decides whether drafting
    pays at all. Before any observation each predicts exactly the offline model, and a workload
    where the offline fit is too confident moves a below 0 (a shift) or b below 1 (a
    flattening).

    Posterior, per correction: `draftsmith.core.logistic.LogisticPosterior` of (a, b) on the
    observations z = logit(p_offline), y = accepted, with the prior fading by `forgetting` per
    later observation to a weak floor that never does. So memory is about 1 / (1 - forgetting)
    observations, a stream that changes workload is followed once that many of the new one have
    been seen, and a round costs O(m) arithmetic on floats. A precision of `prior_strength` on
    each of a and b is worth about 4 * prior_strength observations near p = 0.5: the first
    rounds of a stream barely move the offline model, a few hundred observations replace it.
    Defaults and why: see `__init__`.
    """

    def __init__(
        self,
        offline: AcceptanceModel | None = None,
        *,
        prior_strength: float = 10.0,
        forgetting: float = 0.99,
        split_on: tuple[str, ...] = SPLIT_SIGNALS,
    ) -> None:
        """Defaults chosen by replaying the tuning streams of benchmarks/notes/calibration.md
        (`benchmarks/calibration/stream_calibration.py`) over prior_strength and forgetting:
        prior_strength 10 (the prior worth ~40 observations) is as good as the best there and
        the most cautious of the near-best, so a few misses at a confident prediction do not
        swing it; forgetting 0.99 (a memory of ~100 observations) follows a new workload within
        a few prompts, where longer memories were worse. They were chosen for one correction of
        every token; each group keeps them.

        split_on: the `SPLIT_SIGNALS` that split the groups; tokens that differ only in the
        others are corrected together (the baselines of `benchmarks/policies/compare_policies.py`)."""
        unknown = set(split_on) - set(SPLIT_SIGNALS)
        if unknown:
            raise ValueError(f"split_on names {sorted(unknown)}; choose from {SPLIT_SIGNALS}")
        if not 0.0 < forgetting <= 1.0:
            raise ValueError(f"forgetting must be in (0, 1] (1: never forget), got {forgetting}")
        self.offline = offline
        self.prior_strength = prior_strength
        self.forgetting = forgetting
        self.split_on = tuple(split_on)
        self.reset()

    def reset(self) -> None:
        """Forget every observation: back to the prior (the offline model)."""
        self.corrections = tuple(LogisticPosterior(self.prior_strength) for _ in CORRECTION_GROUPS)
        """One correction per `CORRECTION_GROUPS` entry (a token's group: `_groups`)."""

    @property
    def n_observed(self) -> int:
        return sum(c.n_observed for c in self.corrections)

    def offline_probs(self, signals: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The offline model's P(accept) (k,) of each token (raw top1_prob without one)."""
        if self.offline is None:
            return signals["top1_prob"]
        return torch.as_tensor(self.offline.predict_signals(signals))

    def predict_signals(self, signals: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """P(the target accepts each token) (k,) float32 from its confidence signals (each (k,)),
        on the signals' device."""
        z = torch.logit(self.offline_probs(signals).float(), eps=_CLIP)
        a, b = torch.tensor([c.mean for c in self.corrections], device=z.device).unbind(-1)
        group = _groups(signals, z.shape, self.split_on).to(z.device)
        return torch.sigmoid(a[group] + b[group] * z).to(signals["top1_prob"].device)

    def observe(self, signals: Mapping[str, torch.Tensor], accepted: torch.Tensor) -> None:
        """Update from m verified tokens: their signals (each (m,)) and outcomes accepted (m,)
        in [0, 1] (1 = accepted; fractional outcomes, e.g. min(1, p/q), are allowed)."""
        y = [float(v) for v in torch.as_tensor(accepted).reshape(-1).tolist()]
        if not y:
            return
        if not all(0.0 <= v <= 1.0 for v in y):
            raise ValueError(f"accepted must lie in [0, 1], got {y}")
        # Plain floats, not tensors: for a few observations and two parameters, the per-call
        # overheads of torch or numpy would cost more than the arithmetic.
        z = [logit(p, _CLIP) for p in self.offline_probs(signals).reshape(-1).tolist()]
        if len(z) != len(y):
            raise ValueError(f"{len(z)} tokens' signals but {len(y)} outcomes")
        groups = _groups(signals, (len(z),), self.split_on).tolist()
        for group, correction in enumerate(self.corrections):
            mine = [i for i, g in enumerate(groups) if g == group]
            if mine:
                correction.update([z[i] for i in mine], [y[i] for i in mine], self.forgetting)


def _groups(
    signals: Mapping[str, torch.Tensor], shape: tuple[int, ...], split_on: tuple[str, ...]
) -> torch.Tensor:
    """(k,) int64: each token's correction, 1 if it comes after a round's first, plus 2 if it
    continues an n-gram of the context (each only when split on, and the signals carry it)."""
    group = torch.zeros(shape, dtype=torch.long)
    for weight, name in enumerate(SPLIT_SIGNALS):
        value = signals.get(name)
        if name in split_on and value is not None:
            group += 2**weight * (value.reshape(shape).cpu() > 0)
    return group
