"""A model's fingerprint: a hash that tells one checkpoint from another, across precisions."""

from __future__ import annotations

import hashlib
import json

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


def model_fingerprint(model: PreTrainedModel) -> str:
    """sha256 identifying a causal LM: its key config fields and samples of two weight matrices.

    The samples are the first rows of the input embedding and of the last weight matrix of the
    decoder stack (the last layer's), reduced to their signs: a sign survives casting between
    float32, bfloat16 and float16, so a head trained on a float32 target loads onto the same
    target in bfloat16, while another checkpoint (other seed, a fine-tune) differs in thousands of
    signs. Cheap: a few rows, no pass over the weights.
    """
    config = model.config.get_text_config()
    fields = {key: getattr(config, key, None) for key in FINGERPRINT_CONFIG_KEYS}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode())
    for weight in _fingerprint_weights(model):
        rows = weight.detach()[:FINGERPRINT_ROWS].float().cpu()
        digest.update(str(tuple(weight.shape)).encode())
        digest.update(torch.sign(rows).to(torch.int8).numpy().tobytes())
    return digest.hexdigest()


def _fingerprint_weights(model: PreTrainedModel) -> list[torch.Tensor]:
    embed = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    skip = {id(embed), id(getattr(output, "weight", None))}
    matrices = [p for p in model.parameters() if p.ndim == 2 and id(p) not in skip]
    return [embed, *matrices[-1:]]
