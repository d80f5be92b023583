"""P-EAGLE heads in speculators' `peagle` format (what vLLM serves as EAGLE-3 with parallel
drafting): the EAGLE-3 speculators layout (`eagle3.py`) plus `mask_hidden` (1, 1, F) and the
mask token's embedding as row `mask_token_id` of `embed_tokens.weight`.

draftsmith's head keeps that embedding apart (`mask_embedding`, H) and shares the target's
table for every other token, so the export writes the target's table with the mask row
replaced, and the import reads the mask row back and refuses a table whose other rows are not
the target's (a head trained with its own embeddings, which speculators' P-EAGLE allows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from draftsmith.artifact.engines.conventions import write_checkpoint
from draftsmith.artifact.engines.eagle3 import (
    check_speculators_type,
    read_speculators_layout,
    speculators_checkpoint,
)
from draftsmith.heads.trainable import DraftHead


def write_speculators_peagle(
    head: DraftHead, target: PreTrainedModel, out: Path, *, verifier: str, draft_tokens: int
) -> None:
    """Write a P-EAGLE head in speculators' peagle format into out; draft_tokens (the block
    vLLM drafts in one forward) at most the head's block, `num_steps`."""
    if draft_tokens > head.num_steps:
        raise ValueError(
            f"the head drafts blocks of {head.num_steps} tokens (num_steps): export it with "
            f"--draft-tokens {head.num_steps} or fewer, not {draft_tokens}"
        )
    config, tensors = speculators_checkpoint(head, target, verifier, draft_tokens, ("peagle",))
    mask_id = head.mask_token_id
    config.update(
        architectures=["PEagleDraftModel"],
        speculators_model_type="peagle",
        mask_token_id=mask_id,
    )
    config["speculators_config"]["algorithm"] = "peagle"
    embed = tensors["embed_tokens.weight"].detach().clone()
    embed[mask_id] = tensors.pop("mask_embedding").to(embed.dtype)
    tensors["embed_tokens.weight"] = embed
    tensors["mask_hidden"] = tensors["mask_hidden"].reshape(1, 1, -1)
    write_checkpoint(out, config, tensors)


def read_speculators_peagle(
    config: dict[str, Any], tensors: dict[str, torch.Tensor], target: PreTrainedModel, where: Path
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A speculators P-EAGLE checkpoint as draftsmith's (head config, state dict): its block
    (num_steps) is the speculative tokens its config proposes."""
    check_speculators_type(config, "peagle", where)
    tensors = dict(tensors)
    mask_hidden = tensors.pop("mask_hidden", None)
    if mask_hidden is None:
        raise ValueError(f"{where}: a P-EAGLE checkpoint without mask_hidden")
    mask_id = config.get("mask_token_id")
    embed = tensors.get("embed_tokens.weight")
    if mask_id is None or embed is None:
        raise ValueError(
            f"{where}: a P-EAGLE checkpoint needs mask_token_id in its config and "
            "embed_tokens.weight, which holds the mask token's embedding"
        )
    embed = embed.clone()
    mask_embedding = embed[mask_id].clone()
    # The other rows must be the target's (checked with the EAGLE-3 layout); so is this one.
    embed[mask_id] = target.get_input_embeddings().weight[mask_id].detach().to(embed)
    tensors["embed_tokens.weight"] = embed
    args, state = read_speculators_layout(config, tensors, target, where)
    state["mask_hidden"] = mask_hidden.reshape(-1)
    state["mask_embedding"] = mask_embedding
    methods = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
    args.update(mask_token_id=int(mask_id), num_steps=int(methods[0].get("speculative_tokens", 4)))
    return args, state
