"""Speculative decoding: the loop, verification, draft-length policies, routing between drafters
and the benchmark."""

from draftsmith.decoding.decoder import (
    GenerationResult,
    GenerationStats,
    RoundRecord,
    SpeculativeDecoder,
)
from draftsmith.decoding.policies import (
    POLICIES,
    CostAwarePolicy,
    DraftPolicy,
    FixedPolicy,
    ThresholdPolicy,
    build_policy,
)
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
