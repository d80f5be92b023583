"""Speculative decoding: the loop, verification, draft-length policies and the benchmark."""

from draftsmith.decoding.decoder import (
    GenerationResult,
    GenerationStats,
    RoundRecord,
    SpeculativeDecoder,
)
from draftsmith.decoding.policy import DraftLengthPolicy
from draftsmith.decoding.verify import LosslessVerifier, Verifier, verify_greedy, verify_sampling

__all__ = [
    "DraftLengthPolicy",
    "GenerationResult",
    "GenerationStats",
    "LosslessVerifier",
    "RoundRecord",
    "SpeculativeDecoder",
    "Verifier",
    "verify_greedy",
    "verify_sampling",
]
