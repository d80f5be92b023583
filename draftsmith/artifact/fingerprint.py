"""The target fingerprint: a head is never silently loaded onto another model."""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedModel

from draftsmith.core.fingerprint import model_fingerprint as target_fingerprint

__all__ = ["target_fingerprint", "target_record"]


def target_record(target: PreTrainedModel, name_or_path: str) -> dict[str, Any]:
    config = target.config.get_text_config()
    architectures = getattr(target.config, "architectures", None) or [type(target).__name__]
    return {
        "name_or_path": name_or_path,
        "architecture": architectures[0],
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "fingerprint": target_fingerprint(target),
    }
