"""Medusa heads in vLLM's Medusa format and the Medusa repository's layout.

draftsmith's Medusa is K residual blocks (x + SiLU(Wx + b)) on the target's last hidden state
(after its final norm), each read through the target's own LM head; block k predicts the token
k + 1 ahead, so block 0 re-predicts the target's token and is never drafted from. Both foreign
layouts read the same hidden state and number their heads from the token two ahead: their head
i is draftsmith's block i + 1.

- vLLM (`model_type: medusa`): `blocks.{i}.layers.0.{weight,bias}` (with `medusa_fc_bias`),
  `lm_heads.{i}.weight` (vLLM has no shared LM head: the target's rows are written per head) and
  `token_map` (the target ids of a truncated vocabulary).
- The Medusa repository: `{i}.0.linear.{weight,bias}` and, in Medusa-1, a trained LM head per head
  `{i}.1.weight`; Medusa-2 heads use the target's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from draftsmith.artifact.engines.conventions import check_draft_vocab, write_checkpoint
from draftsmith.heads.trainable import DraftHead
from draftsmith.heads.vocab import target_to_draft


def write_vllm_medusa(head: DraftHead, target: PreTrainedModel, out: Path) -> None:
    """Write head in vLLM's Medusa format (config.json + model.safetensors) into out (vLLM's
    --speculative-config, not the config, chooses how many tokens to draft)."""
    if head.kind != "medusa":
        raise ValueError(f"vLLM's Medusa format holds Medusa heads, not {head.kind} heads")
    text = target.config.get_text_config()
    d2t = head.draft_to_target()
    lm_head = target.get_output_embeddings()
    if lm_head.bias is not None:
        raise ValueError("vLLM's Medusa LM heads have no bias; this target's LM head has one")
    rows = lm_head.weight if d2t is None else lm_head.weight[d2t.to(lm_head.weight.device)]
    tensors: dict[str, torch.Tensor] = {}
    for i, block in enumerate(head.heads[1:]):
        tensors[f"blocks.{i}.layers.0.weight"] = block.linear.weight
        tensors[f"blocks.{i}.layers.0.bias"] = block.linear.bias
        tensors[f"lm_heads.{i}.weight"] = rows.to(block.linear.weight.dtype).clone()
    if d2t is not None:
        tensors["token_map"] = d2t.long()
    config = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": text.hidden_size,
        "vocab_size": text.vocab_size,
        "truncated_vocab_size": text.vocab_size if d2t is None else int(d2t.numel()),
        "num_heads": head.num_steps - 1,
        "num_hidden_layers": 1,
        "medusa_fc_bias": True,
    }
    write_checkpoint(out, config, tensors)


def read_vllm_medusa(
    config: dict[str, Any], tensors: dict[str, torch.Tensor], target: PreTrainedModel, where: Path
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """vLLM's Medusa checkpoint as draftsmith's (head config, state dict)."""
    heads = int(config.get("num_heads") or config.get("medusa_num_heads") or 0)
    if config.get("num_hidden_layers", 1) != 1:
        raise ValueError(
            f"{where}: {config['num_hidden_layers']} residual layers per head; draftsmith's "
            "Medusa has one"
        )
    blocks = [
        (tensors.get(f"blocks.{i}.layers.0.weight"), tensors.get(f"blocks.{i}.layers.0.bias"))
        for i in range(heads)
    ]
    lm_heads = [tensors.get(f"lm_heads.{i}.weight") for i in range(heads)]
    token_map = tensors.get("token_map")
    return _draftsmith_medusa(blocks, lm_heads, token_map, target, where)


def read_medusa_repo(
    config: dict[str, Any], tensors: dict[str, torch.Tensor], target: PreTrainedModel, where: Path
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A Medusa-repository checkpoint (medusa_lm_head.safetensors) as draftsmith's (head config,
    state dict)."""
    heads = int(config.get("medusa_num_heads") or 0)
    if config.get("medusa_num_layers", 1) != 1:
        raise ValueError(
            f"{where}: medusa_num_layers {config['medusa_num_layers']}; draftsmith's Medusa has "
            "one residual block per head"
        )
    tensors = {name.removeprefix("medusa_head."): t for name, t in tensors.items()}
    blocks = [
        (tensors.get(f"{i}.0.linear.weight"), tensors.get(f"{i}.0.linear.bias"))
        for i in range(heads)
    ]
    lm_heads = [tensors.get(f"{i}.1.weight") for i in range(heads)]
    return _draftsmith_medusa(blocks, lm_heads, None, target, where)


def _draftsmith_medusa(
    blocks: list[tuple[torch.Tensor | None, torch.Tensor | None]],
    lm_heads: list[torch.Tensor | None],
    token_map: torch.Tensor | None,
    target: PreTrainedModel,
    where: Path,
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Foreign heads 0 .. K-2 as draftsmith blocks 1 .. K-1, block 0 the identity (zero weight
    and bias: it re-predicts the target's own token, as it is meant to). Per-head LM heads must
    be the target's rows: draftsmith's Medusa reads the target's LM head."""
    if not blocks:
        raise ValueError(
            f"{where}: the config names no Medusa heads (num_heads / medusa_num_heads)"
        )
    missing = [i for i, (w, b) in enumerate(blocks) if w is None or b is None]
    if missing:
        raise ValueError(
            f"{where}: heads {missing} lack their residual block weight or bias (a bias-free "
            "block, vLLM without medusa_fc_bias, is not the Medusa block draftsmith trains)"
        )
    vocab = target.config.get_text_config().vocab_size
    rows = target.get_output_embeddings().weight.detach().float().cpu()
    if token_map is not None:
        check_draft_vocab(token_map, None, vocab, f"{where} (token_map)")
        rows = rows[token_map.long()]
    for i, lm_head in enumerate(lm_heads):
        if lm_head is not None and (
            lm_head.shape != rows.shape or not torch.allclose(lm_head.float(), rows, atol=1e-2)
        ):
            raise ValueError(
                f"{where}: head {i} has its own trained LM head (Medusa-1); draftsmith's Medusa "
                "reads the target's LM head (Medusa-2), so it cannot hold this head"
            )
    weight, bias = blocks[0]
    tensors = {"heads.0.linear.weight": torch.zeros_like(weight)}
    tensors["heads.0.linear.bias"] = torch.zeros_like(bias)
    for i, (weight, bias) in enumerate(blocks, start=1):
        tensors[f"heads.{i}.linear.weight"], tensors[f"heads.{i}.linear.bias"] = weight, bias
    head_config: dict[str, Any] = {"num_steps": len(blocks) + 1}
    if token_map is not None and token_map.numel() != vocab:
        d2t = token_map.long()
        tensors["d2t"], tensors["t2d"] = d2t, target_to_draft(d2t, vocab)
        head_config["draft_vocab_size"] = int(d2t.numel())
    return head_config, tensors
