"""The target fingerprint: a head is never silently loaded onto another model."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch
from transformers import PreTrainedModel

FINGERPRINT_CONFIG_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "tie_word_embeddings",
)
FINGERPRINT_ROWS = 8
"""Rows of each sampled weight matrix that enter the fingerprint."""


def target_fingerprint(target: PreTrainedModel) -> str:
    """sha256 identifying a target: its key config fields and samples of two weight matrices.

    The samples are the first rows of the input embedding and of the last weight matrix of the
    decoder stack (the last layer's), reduced to their signs: a sign survives casting between
    float32, bfloat16 and float16, so a head trained on a float32 target loads onto the same
    target in bfloat16, while another checkpoint (other seed, a fine-tune) differs in thousands of
    signs. Cheap: a few rows, no pass over the weights.
    """
    config = target.config.get_text_config()
    fields = {key: getattr(config, key, None) for key in FINGERPRINT_CONFIG_KEYS}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode())
    for weight in _fingerprint_weights(target):
        rows = weight.detach()[:FINGERPRINT_ROWS].float().cpu()
        digest.update(str(tuple(weight.shape)).encode())
        digest.update(torch.sign(rows).to(torch.int8).numpy().tobytes())
    return digest.hexdigest()


def _fingerprint_weights(target: PreTrainedModel) -> list[torch.Tensor]:
    embed = target.get_input_embeddings().weight
    output = target.get_output_embeddings()
    skip = {id(embed), id(getattr(output, "weight", None))}
    matrices = [p for p in target.parameters() if p.ndim == 2 and id(p) not in skip]
    return [embed, *matrices[-1:]]


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
