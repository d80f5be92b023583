"""draftsmith: train, calibrate and run speculative-decoding drafters on a frozen target.

The public API, at the top of the layers (see the README's layout table). Its names import on
first use, so `draftsmith --help` does not pay for torch.
"""

from importlib import import_module
from importlib.metadata import version
from typing import Any

__version__ = version("draftsmith")

_EXPORTS = {
    "SpeculativeDecoder": "draftsmith.decoding",
    "DraftPolicy": "draftsmith.decoding",
    "CostAwarePolicy": "draftsmith.decoding",
    "FixedPolicy": "draftsmith.decoding",
    "build_policy": "draftsmith.decoding",
    "build_drafter": "draftsmith.build",
    "policy_from_spec": "draftsmith.build",
    "speculative_generate": "draftsmith.build",
    "Benchmark": "draftsmith.evaluation.benchmark",
    "Drafter": "draftsmith.heads",
    "fetch_model": "draftsmith.zoo",
    "load_acceptance_model": "draftsmith.artifact",
    "load_drafter": "draftsmith.artifact",
    "load_model": "draftsmith.zoo",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'draftsmith' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
