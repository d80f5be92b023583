"""`fixed`: the same draft every round."""

from __future__ import annotations

from dataclasses import dataclass

from draftsmith.decoding.policies.base import DraftPolicy


@dataclass(kw_only=True)
class FixedPolicy(DraftPolicy):
    """Draft `tree`, or a chain of `max_draft_tokens`, every round, whatever the confidence."""

    name = "fixed"
