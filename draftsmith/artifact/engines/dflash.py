"""DFlash heads in speculators' `dflash` format (what vLLM serves as DFlash), and those with
DSpark's Markov or confidence head in its `dspark` format (the `dflash` config plus
`markov_rank`, `markov_head_type`, `enable_confidence_head`, `confidence_head_with_markov`;
the tensors `markov_head.*` and `confidence_head.*` keep their names).

The head's own tensors keep their names (`fc`, `hidden_norm`, `layers.{i}.*`, `norm`); the
config holds the block (`block_size`: the anchor and the K mask rows), the mask token, the
feature layers in vLLM's numbering and a Llama `transformer_layer_config` of `num_layers`
layers. speculators' DFlash shares the target's embeddings and LM head, frozen, and saves no
copy of them except the LM head's draft-vocabulary rows with a reduced vocabulary; so does the
export, and the import refuses an LM head or embedding table that is not the target's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from draftsmith.artifact.engines.conventions import (
    check_layer_config,
    d2t_offsets,
    default_engine_feature_layers,
    engine_layer_ids,
    feature_layers_from_engine,
    llama_layer_config,
    same_tensors,
    t2d_mask,
    write_checkpoint,
)
from draftsmith.artifact.engines.eagle3 import (
    SPECULATORS_VERSION,
    check_speculators_type,
    draftsmith_head,
    proposal_config,
)
from draftsmith.heads.dflash import DFlashLayer
from draftsmith.heads.dspark import MARKOV_HEAD_TYPES
from draftsmith.heads.trainable import DraftHead


def write_speculators_dflash(
    head: DraftHead, target: PreTrainedModel, out: Path, *, verifier: str, draft_tokens: int
) -> None:
    """Write a DFlash head in speculators' dflash format into out; draft_tokens (what vLLM
    drafts a round) at most the head's K, `num_steps`."""
    if draft_tokens > head.num_steps:
        raise ValueError(
            f"the head drafts blocks of {head.num_steps} tokens (num_steps): export it with "
            f"--draft-tokens {head.num_steps} or fewer, not {draft_tokens}"
        )
    layer = llama_layer_config(target.config)
    _check_layers(head, layer)
    text = target.config.get_text_config()
    layer.num_hidden_layers = len(head.layers)
    vocab = text.vocab_size
    ids = engine_layer_ids(list(head.target_feature_layers), text.num_hidden_layers, "vllm")
    algorithm = "dspark" if is_dspark(head) else "dflash"
    config = {
        "architectures": ["DSparkSpeculator" if algorithm == "dspark" else "DFlashDraftModel"],
        "speculators_model_type": algorithm,
        "speculators_version": SPECULATORS_VERSION,
        "draft_vocab_size": head.draft_vocab_size or vocab,
        "block_size": head.num_steps + 1,
        "target_hidden_size": text.hidden_size,
        "aux_hidden_state_layer_ids": ids,
        "mask_token_id": head.mask_token_id,
        "sliding_window_non_causal": False,
        "sample_from_anchor": False,
        "transformer_layer_config": layer.to_diff_dict(),
        "speculators_config": proposal_config(algorithm, draft_tokens, verifier, target),
    }
    if algorithm == "dspark":
        config.update(
            markov_rank=head.config.markov_rank,
            markov_head_type=head.config.markov_head_type,
            enable_confidence_head=head.confidence_head is not None,
            confidence_head_with_markov=head.confidence_reads_markov,
        )
    tensors = {n: t for n, t in head.state_dict().items() if n not in ("d2t", "t2d")}
    if head.draft_vocab_size is not None:  # the LM head's draft rows (frozen, as the target's)
        rows = target.get_output_embeddings().weight[head.d2t.to(target.device)]
        tensors["lm_head.weight"] = rows
        tensors["d2t"], tensors["t2d"] = d2t_offsets(head.d2t), t2d_mask(head.d2t, vocab)
    write_checkpoint(out, config, tensors)


def is_dspark(head: DraftHead) -> bool:
    """Whether a DFlash head carries DSpark's Markov or confidence head."""
    return head.markov_head is not None or head.confidence_head is not None


def _check_layers(head: DraftHead, layer_config) -> None:
    """Each of the head's layers must have exactly the tensors of speculators' DFlash layer
    built from the target's Llama layer config (no q/k/v biases, say)."""
    with torch.device("meta"):  # shapes only
        theirs = DFlashLayer(layer_config).state_dict()
    ours = head.layers[0].state_dict()
    if not same_tensors(ours, theirs):
        raise ValueError(
            f"the head's layers are not speculators' DFlash layer for this target: their "
            f"tensors are {sorted(ours)}, speculators' {sorted(theirs)}"
        )


def read_speculators_dflash(
    config: dict[str, Any], tensors: dict[str, torch.Tensor], target: PreTrainedModel, where: Path
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A speculators DFlash or DSpark checkpoint as draftsmith's (head config, state dict)."""
    dspark = config.get("speculators_model_type") == "dspark"
    check_speculators_type(config, "dspark" if dspark else "dflash", where)
    if config.get("sample_from_anchor"):
        raise ValueError(
            f"{where}: sample_from_anchor: true (the anchor row drafts too, DSpark's default) is "
            "a variant draftsmith's DFlash does not compute"
        )
    layer = config.get("transformer_layer_config") or {}
    if "sliding_attention" in (layer.get("layer_types") or []) or layer.get("attention_bias"):
        raise ValueError(
            f"{where}: sliding-window layers or attention biases are DFlash variants "
            "draftsmith's layer does not compute"
        )
    check_layer_config(layer, target.config, where)
    text = target.config.get_text_config()
    ids = config.get("aux_hidden_state_layer_ids")
    layers = text.num_hidden_layers
    feature_layers = (
        feature_layers_from_engine(ids, layers, "vllm")
        if ids
        else default_engine_feature_layers(layers)
    )
    if config.get("mask_token_id") is None or config.get("block_size") is None:
        raise ValueError(f"{where}: a DFlash checkpoint needs mask_token_id and block_size")
    args, state = draftsmith_head(config, tensors, feature_layers, {}, target, where)
    lm_head = state.pop("lm_head.weight", None)
    if lm_head is not None:
        rows = target.get_output_embeddings().weight.detach().float().cpu()
        if "d2t" in state:
            rows = rows[state["d2t"]]
        if lm_head.shape != rows.shape or not torch.allclose(lm_head.float(), rows, atol=1e-2):
            raise ValueError(
                f"{where}: lm_head.weight {tuple(lm_head.shape)} is not the target's LM head "
                "(its draft-vocabulary rows): draftsmith's DFlash shares the target's, frozen"
            )
    args.update(
        num_steps=int(config["block_size"]) - 1,
        num_layers=int(layer.get("num_hidden_layers", 1)),
        mask_token_id=int(config["mask_token_id"]),
    )
    if dspark:
        args.update(_dspark_args(config, where))
    return args, state


def _dspark_args(config: dict[str, Any], where: Path) -> dict[str, Any]:
    """The DFlash config fields of a DSpark checkpoint's Markov and confidence heads (its
    defaults where a field is absent, as speculators reads them)."""
    head_type = config.get("markov_head_type", "vanilla")
    if head_type not in MARKOV_HEAD_TYPES:
        raise ValueError(
            f"{where}: markov_head_type {head_type!r} is a DSpark variant draftsmith does not "
            f"compute (it computes {', '.join(MARKOV_HEAD_TYPES)})"
        )
    return {
        "markov_rank": int(config.get("markov_rank", 256)),
        "markov_head_type": head_type,
        "confidence_head": bool(config.get("enable_confidence_head", True)),
        "confidence_head_with_markov": bool(config.get("confidence_head_with_markov", True)),
    }
