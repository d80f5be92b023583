"""draftsmith: train, calibrate and run speculative-decoding drafters on a frozen target."""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

# Lazy exports: the subpackages import from draftsmith's core modules, so importing them here
# eagerly would be circular (and would make `import draftsmith` pull in torch for the CLI help).
_EXPORTS = {
    "SpeculativeDecoder": "draftsmith.decoding",
    "DraftLengthPolicy": "draftsmith.decoding",
    "Drafter": "draftsmith.heads",
    "fetch_model": "draftsmith.zoo",
    "load_drafter": "draftsmith.artifact",
    "load_model": "draftsmith.models",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'draftsmith' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
