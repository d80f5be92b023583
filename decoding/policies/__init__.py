"""Draft policies: how much to draft each round (possibly nothing), one small module each.

`build_policy(name, **options)` makes one by name: fixed, threshold, cost-aware (the default),
cm-asd, specdec++, adaedl.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from draftsmith.core.registry import Registry
from draftsmith.decoding.policies.adaedl import AdaEDLPolicy
from draftsmith.decoding.policies.base import (
    UNSIZED,
    DraftPolicy,
    RequestSize,
    RoundOutcome,
    StopRule,
)
from draftsmith.decoding.policies.cm_asd import ConfidenceModulatedPolicy
from draftsmith.decoding.policies.cost_aware import CostAwarePolicy
from draftsmith.decoding.policies.fixed import FixedPolicy
from draftsmith.decoding.policies.specdec import SpecDecPlusPlusPolicy
from draftsmith.decoding.policies.threshold import ThresholdPolicy

DEFAULT_POLICY = CostAwarePolicy.name

POLICIES: Registry[type[DraftPolicy]] = Registry("draft policy")
for _policy in (
    FixedPolicy,
    ThresholdPolicy,
    CostAwarePolicy,
    ConfidenceModulatedPolicy,
    SpecDecPlusPlusPolicy,
    AdaEDLPolicy,
):
    POLICIES.add(_policy.name, _policy)


def build_policy(name: str = DEFAULT_POLICY, **options: Any) -> DraftPolicy:
    """The policy called `name`, with the given options (its dataclass fields, less those marked
    `metadata={"option": False}` such as a clock); options it does not take are an error naming
    the ones it does."""
    cls = POLICIES[name]
    known = {f.name for f in dataclasses.fields(cls) if f.init and f.metadata.get("option", True)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(
            f"the {name} policy takes no option {unknown}; its options: {sorted(known)}"
        )
    return cls(**options)


__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "AdaEDLPolicy",
    "ConfidenceModulatedPolicy",
    "CostAwarePolicy",
    "DraftPolicy",
    "FixedPolicy",
    "RequestSize",
    "RoundOutcome",
    "SpecDecPlusPlusPolicy",
    "StopRule",
    "ThresholdPolicy",
    "UNSIZED",
    "build_policy",
]
