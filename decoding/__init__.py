"""Speculative decoding at run time: the loop, verification, draft-length policies and routing
between drafters."""

from draftsmith.decoding.decoder import SpeculativeDecoder
from draftsmith.decoding.policies import (
    POLICIES,
    CostAwarePolicy,
    DraftPolicy,
    FixedPolicy,
    ThresholdPolicy,
    build_policy,
)
from draftsmith.decoding.results import GenerationResult, GenerationStats, RoundRecord
from draftsmith.decoding.routing import RoutingDrafter
from draftsmith.decoding.verify import LosslessVerifier, Verifier, verify_greedy, verify_sampling

__all__ = [
    "POLICIES",
    "CostAwarePolicy",
    "DraftPolicy",
    "FixedPolicy",
    "ThresholdPolicy",
    "build_policy",
    "GenerationResult",
    "GenerationStats",
    "LosslessVerifier",
    "RoundRecord",
    "RoutingDrafter",
    "SpeculativeDecoder",
    "Verifier",
    "verify_greedy",
    "verify_sampling",
]
