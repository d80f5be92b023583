"""EAGLE-3 heads in the engines' layouts: speculators (what vLLM serves), SGLang and the EAGLE
repository (SGLang reads the repository's layout plus an `eagle_config`).

draftsmith's EAGLE-3 head already has the published layout, so a conversion renames the layer
prefix (`midlayer.` here, in SGLang and in the EAGLE repository; `layers.0.` in speculators) and
translates the draft vocabulary and feature-layer numbering (`conventions`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from draftsmith.artifact.engines.conventions import (
    check_draft_vocab,
    check_layer_config,
    d2t_from_offsets,
    d2t_offsets,
    default_engine_feature_layers,
    engine_layer_ids,
    feature_layers_from_engine,
    llama_layer_config,
    same_tensors,
    t2d_mask,
    write_checkpoint,
)
from draftsmith.heads.eagle3 import Eagle3DecoderLayer
from draftsmith.heads.trainable import DraftHead
from draftsmith.heads.vocab import target_to_draft

SPECULATORS_VERSION = "0.9.0"
"""The speculators release whose format the export writes (and the parity tests load)."""

SGLANG_REQUIRED = (
    "fc.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    *(
        f"midlayer.{name}.weight"
        for name in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
            "input_layernorm",
            "hidden_norm",
            "post_attention_layernorm",
        )
    ),
)
"""What SGLang's LlamaForCausalLMEagle3 loads: it skips unknown names without a word, so a
missing one would leave a layer at random initialisation."""


def write_speculators(
    head: DraftHead, target: PreTrainedModel, out: Path, *, verifier: str, draft_tokens: int
) -> None:
    """Write head in speculators' EAGLE-3 format (config.json + model.safetensors) into out."""
    write_checkpoint(out, *speculators_checkpoint(head, target, verifier, draft_tokens))


def speculators_checkpoint(
    head: DraftHead,
    target: PreTrainedModel,
    verifier: str,
    draft_tokens: int,
    kinds: tuple[str, ...] = ("eagle3",),
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config, tensors) of head, a kind of `kinds` with EAGLE-3's layout, in speculators'
    EAGLE-3 format: what a kind built on that layout (P-EAGLE) adds its own fields to."""
    text, layers = exportable(head, target, kinds)
    ids = engine_layer_ids(list(head.target_feature_layers), layers, "vllm")
    vocab = text.vocab_size
    config = {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "draft_vocab_size": head.draft_vocab_size or vocab,
        "target_hidden_size": text.hidden_size,
        # Always written: vLLM assumes true when it is absent.
        "norm_before_residual": head.midlayer.norm_before_residual,
        "norm_before_fc": head.input_norm is not None,
        "fc_norm": False,
        "norm_output": False,
        "embed_requires_grad": False,
        "tie_word_embeddings": False,
        # vLLM/speculators numbering: id k is the input of target layer k (hidden_states[k]).
        "eagle_aux_hidden_state_layer_ids": ids,
        "transformer_layer_config": llama_layer_config(target.config).to_diff_dict(),
        "speculators_config": proposal_config("eagle3", draft_tokens, verifier, target),
    }
    tensors = _renamed(head, "layers.0.")
    tensors["embed_tokens.weight"] = target.get_input_embeddings().weight
    if head.draft_vocab_size is not None:  # speculators has no maps for a full vocabulary
        tensors["d2t"], tensors["t2d"] = d2t_offsets(head.d2t), t2d_mask(head.d2t, vocab)
    return config, tensors


def proposal_config(
    algorithm: str, draft_tokens: int, verifier: str, target: PreTrainedModel
) -> dict[str, Any]:
    """speculators' `speculators_config`: the algorithm, greedy proposals of `draft_tokens`
    tokens, and the verifier vLLM serves the head with."""
    return {
        "algorithm": algorithm,
        "default_proposal_method": "greedy",
        "proposal_methods": [
            {
                "proposal_type": "greedy",
                "speculative_tokens": draft_tokens,
                "verifier_accept_k": 1,
                "accept_tolerance": 0.0,
            }
        ],
        "verifier": {"name_or_path": verifier, "architectures": _architectures(target)},
    }


def write_sglang(head: DraftHead, target: PreTrainedModel, out: Path) -> None:
    """Write head in SGLang's LlamaForCausalLMEagle3 format into out (SGLang's launch flags,
    not the config, choose how many tokens to draft)."""
    text, layers = exportable(head, target)
    if head.midlayer.norm_before_residual:
        raise ValueError(
            "the head was trained with norm_before_residual (its residual starts at the "
            "normalised hidden state), which SGLang's EAGLE-3 layer does not compute: export it "
            "with --format speculators (vLLM serves it) or train with "
            "head_args.norm_before_residual=false"
        )
    if head.input_norm is not None:
        raise ValueError(
            "the head was trained with norm_before_fc (a norm on the fused features), whose "
            "weight (input_norm.weight) SGLang's EAGLE-3 loader skips: export it with --format "
            "speculators (vLLM serves it) or train with head_args.norm_before_fc=false"
        )
    ids = engine_layer_ids(list(head.target_feature_layers), layers, "sglang")
    vocab = text.vocab_size
    d2t = head.d2t if head.draft_vocab_size is not None else torch.arange(vocab)
    config = {
        # Every field spelled out: SGLang's defaults are not necessarily transformers'.
        **llama_layer_config(target.config).to_dict(),
        "architectures": ["LlamaForCausalLMEagle3"],
        # Both spellings of the weights' precision and of the rotary base: transformers 5 and 4.
        "dtype": str(head.fc.weight.dtype).removeprefix("torch."),
        "torch_dtype": str(head.fc.weight.dtype).removeprefix("torch."),
        "rope_theta": (getattr(text, "rope_parameters", None) or {}).get("rope_theta"),
        # Always set: SGLang takes a missing draft_vocab_size to mean "use the target's LM head".
        "draft_vocab_size": int(d2t.numel()),
        "target_hidden_size": text.hidden_size,
        "norm_before_fc": head.input_norm is not None,
        "eagle_config": {
            # SGLang numbering: id k is the OUTPUT of target layer k (hidden_states[k + 1]).
            "eagle_aux_hidden_state_layer_ids": ids,
            "use_aux_hidden_state": True,
            "norm_before_fc": head.input_norm is not None,
        },
    }
    tensors = _renamed(head, "midlayer.")
    tensors["d2t"], tensors["t2d"] = d2t_offsets(d2t), t2d_mask(d2t, vocab)
    missing = sorted(set(SGLANG_REQUIRED) - set(tensors))
    if missing:
        raise ValueError(f"the SGLang export lacks tensors its loader needs: {missing}")
    write_checkpoint(out, config, tensors)


def exportable(head: DraftHead, target: PreTrainedModel, kinds: tuple[str, ...] = ("eagle3",)):
    """(target text config, its layer count), after checking the engines can hold the head: a
    kind of `kinds`, a three-layer fc and a layer with exactly the parameters of the engines'
    Llama layer."""
    if head.kind not in kinds:
        held = " or ".join({"eagle3": "EAGLE-3", "peagle": "P-EAGLE"}.get(k, k) for k in kinds)
        raise ValueError(f"this format holds {held} heads, not {head.kind} heads")
    text = target.config.get_text_config()
    if len(head.target_feature_layers) != 3:
        raise ValueError(
            f"the engines' EAGLE-3 fuses exactly 3 target layers; this head reads "
            f"{len(head.target_feature_layers)} ({list(head.target_feature_layers)})"
        )
    with torch.device("meta"):  # shapes only
        engine = Eagle3DecoderLayer(llama_layer_config(target.config)).state_dict()
    ours = head.midlayer.state_dict()
    if not same_tensors(ours, engine):
        raise ValueError(
            f"the head's layer (built from {type(target).__name__}) is not the engines' Llama "
            f"EAGLE-3 layer: its tensors are {sorted(ours)}, theirs {sorted(engine)}"
        )
    return text, text.num_hidden_layers


def _architectures(target: PreTrainedModel) -> list[str]:
    return list(getattr(target.config, "architectures", None) or [type(target).__name__])


def _renamed(head: DraftHead, layer_prefix: str) -> dict[str, torch.Tensor]:
    """The head's weights (no vocabulary maps) with its `midlayer.` renamed to layer_prefix."""
    tensors = {}
    for name, tensor in head.state_dict().items():
        if name in ("d2t", "t2d"):
            continue
        if name.startswith("midlayer."):
            name = layer_prefix + name.removeprefix("midlayer.")
        tensors[name] = tensor
    return tensors


# -- reading ------------------------------------------------------------------------------------


def read_speculators(
    config: dict[str, Any], tensors: dict[str, torch.Tensor], target: PreTrainedModel, where: Path
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A speculators EAGLE-3 checkpoint as draftsmith's (head config, state dict)."""
    check_speculators_type(config, "eagle3", where)
    return read_speculators_layout(config, tensors, target, where)


def check_speculators_type(config: dict[str, Any], kind: str, where: Path) -> None:
    """A ValueError unless config's speculators_model_type is `kind`."""
    if config.get("speculators_model_type") != kind:
        raise ValueError(
            f"{where}: speculators_model_type {config.get('speculators_model_type')!r}; "
            f"this reader imports {kind} speculators"
        )


def read_speculators_layout(
    config: dict[str, Any], tensors: dict[str, torch.Tensor], target: PreTrainedModel, where: Path
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A checkpoint in speculators' EAGLE-3 layout (of whichever model type) as draftsmith's
    (head config, state dict): the tensors EAGLE-3 does not hold are left in the state dict."""
    for flag in ("fc_norm", "norm_output"):
        if config.get(flag):
            raise ValueError(
                f"{where}: {flag}: true is an EAGLE-3 variant draftsmith's layer does not compute"
            )
    layer = config.get("transformer_layer_config") or {}
    _check_one_layer(layer, tensors, where)
    check_layer_config(layer, target.config, where)
    layers = target.config.get_text_config().num_hidden_layers
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    feature_layers = (
        feature_layers_from_engine(ids, layers, "vllm")
        if ids
        else default_engine_feature_layers(layers)
    )
    renamed = {
        ("midlayer." + name.removeprefix("layers.0.") if name.startswith("layers.0.") else name): t
        for name, t in tensors.items()
    }
    variants = {
        "norm_before_fc": bool(config.get("norm_before_fc")),
        # vLLM reads an absent norm_before_residual as true, so the import does too.
        "norm_before_residual": bool(config.get("norm_before_residual", True)),
    }
    return draftsmith_head(config, renamed, feature_layers, variants, target, where)


def read_eagle(
    config: dict[str, Any], tensors: dict[str, torch.Tensor], target: PreTrainedModel, where: Path
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """An EAGLE-3 checkpoint in the EAGLE repository's or SGLang's layout (a flat Llama config
    with draft_vocab_size; `midlayer.*`; SGLang's optional eagle_config names the feature
    layers in its numbering) as draftsmith's (head config, state dict)."""
    _check_one_layer(config, tensors, where)
    check_layer_config(config, target.config, where)
    layers = target.config.get_text_config().num_hidden_layers
    eagle_config = config.get("eagle_config") or {}
    ids = eagle_config.get("eagle_aux_hidden_state_layer_ids")
    feature_layers = (
        feature_layers_from_engine(ids, layers, "sglang")
        if ids
        else default_engine_feature_layers(layers)
    )
    variants = {
        "norm_before_fc": bool(config.get("norm_before_fc") or eagle_config.get("norm_before_fc"))
    }
    for flag in ("fc_norm", "use_aux_norm", "norm_output"):
        if config.get(flag) or eagle_config.get(flag):
            raise ValueError(
                f"{where}: {flag}: true is an EAGLE-3 variant draftsmith's layer does not compute"
            )
    return draftsmith_head(config, tensors, feature_layers, variants, target, where)


def _check_one_layer(layer_config: dict, tensors: dict[str, torch.Tensor], where: Path) -> None:
    count = layer_config.get("num_hidden_layers", 1)
    extra = sorted({n.split(".")[1] for n in tensors if n.startswith("layers.")} - {"0"})
    if count != 1 or extra:
        raise ValueError(
            f"{where}: the head has {count} decoder layers (layers {extra or [0]}); draftsmith's "
            "EAGLE-3 has one"
        )


def draftsmith_head(
    config: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    feature_layers: list[int],
    variants: dict[str, bool],
    target: PreTrainedModel,
    where: Path,
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The head config (with the layout `variants` that are on) and state dict, the vocabulary
    maps translated and checked, and the engines' copy of the target's embeddings dropped
    (draftsmith shares the target's)."""
    text = target.config.get_text_config()
    vocab = text.vocab_size
    tensors = dict(tensors)
    embed = tensors.pop("embed_tokens.weight", None)
    if embed is not None:
        own = target.get_input_embeddings().weight.detach().float().cpu()
        if embed.shape != own.shape or not torch.allclose(embed.float(), own, atol=1e-2):
            raise ValueError(
                f"{where}: embed_tokens.weight {tuple(embed.shape)} is not the target's input "
                "embedding: the head was trained for another target, or with its own "
                "embeddings, which draftsmith's EAGLE-3 (sharing the target's) cannot hold"
            )
    lm_head = tensors.get("lm_head.weight")
    draft_size = config.get("draft_vocab_size") or (None if lm_head is None else lm_head.shape[0])
    offsets, mask = tensors.pop("d2t", None), tensors.pop("t2d", None)
    head_config: dict[str, Any] = {"feature_layers": feature_layers}
    head_config.update({name: True for name, on in variants.items() if on})
    if draft_size is not None and draft_size != vocab:
        if offsets is None:
            raise ValueError(
                f"{where}: the head drafts over {draft_size} of the target's {vocab} tokens but "
                "holds no d2t map saying which: add the d2t (and t2d) its training wrote"
            )
        d2t = d2t_from_offsets(offsets)
        check_draft_vocab(d2t, mask, vocab, str(where))
        tensors["d2t"], tensors["t2d"] = d2t, target_to_draft(d2t, vocab)
        head_config["draft_vocab_size"] = int(draft_size)
    elif offsets is not None and not torch.equal(d2t_from_offsets(offsets), torch.arange(vocab)):
        raise ValueError(f"{where}: a full-vocabulary head whose d2t is not the identity")
    return head_config, tensors
