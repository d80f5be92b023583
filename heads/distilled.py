"""A draft model trained for the target: a small causal LM with the target's vocabulary.

It starts either as a pretrained sibling sharing the tokenizer (`init="sibling"`) or as a copy of
the target's architecture with a subset of its layers, initialised from the target's weights
(`init="from_target"`), optionally trained through LoRA adapters only. It reads no target
features; at inference it is an ordinary `DraftModelDrafter`.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from draftsmith.core.target import TargetBatch
from draftsmith.heads.base import register_drafter
from draftsmith.heads.blocks import seeded, text_config
from draftsmith.heads.draft_model import DraftModelDrafter
from draftsmith.heads.trainable import DraftHead, HeadConfig

_LAYER = re.compile(r"\blayers\.(\d+)\.")


def layer_subset_config(target_config: PretrainedConfig, layers: Sequence[int]) -> PretrainedConfig:
    """The target's text config cut down to the given layers (indices into the target's)."""
    config = copy.deepcopy(text_config(target_config))
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [config.layer_types[i] for i in layers]
    config.num_hidden_layers = len(layers)
    return config


@dataclass(kw_only=True)
class DistilledConfig(HeadConfig):
    """Distilled draft model hyper-parameters."""

    init: Literal["from_target", "sibling"] = "from_target"
    """from_target: a copy of the target's `layers`, weights copied when the head is bound;
    sibling: the pretrained causal LM `model`, sharing the target's vocabulary."""
    model: str | None = None
    """The sibling draft model (init=sibling): zoo name, folder or hub id."""
    layers: list[int] | None = None
    """The target's layers the draft model keeps (init=from_target), distinct and ascending;
    None: every other one."""
    lora_rank: int = 0
    """Train LoRA adapters of this rank instead of the weights; 0: train the weights."""
    lora_alpha: float | None = None
    """LoRA scaling alpha; None: 2 * lora_rank."""
    draft_config: dict[str, Any] | None = None
    """The draft model's full transformers config: rebuilds the architecture without fetching
    `model` (how an artifact reloads). from_target weights are still copied when the head is
    bound; a sibling's are left fresh for the saved ones to replace."""

    def __post_init__(self) -> None:
        layers = self.layers
        if layers is not None and (not layers or layers[0] < 0 or sorted(set(layers)) != layers):
            raise ValueError(f"layers must be distinct ascending layer indices, got {layers}")
        if self.init == "sibling" and self.model is None and self.draft_config is None:
            raise ValueError('init="sibling" needs model=NAME_OR_PATH of a pretrained draft model')
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank must not be negative, got {self.lora_rank}")


@register_drafter("distilled")
class DistilledHead(DraftHead):
    """A causal LM drafting on its own (no target features); `forward_train` returns its
    next-token logits, the one step of the alignment convention."""

    config_class = DistilledConfig
    num_steps = 1
    target_feature_layers = ()

    def __init__(self, target_config: PretrainedConfig, config: DistilledConfig) -> None:
        super().__init__()
        target = text_config(target_config)
        layers = None
        if config.init == "from_target":
            layers = config.layers or list(range(0, target.num_hidden_layers, 2))
            if layers[-1] >= target.num_hidden_layers:
                raise ValueError(
                    f"layers must index the target's {target.num_hidden_layers} layers, "
                    f"got {layers}"
                )
        with seeded(config.seed):
            if config.draft_config is not None:
                draft = AutoModelForCausalLM.from_config(
                    AutoConfig.for_model(**config.draft_config)
                )
            elif config.init == "sibling":
                from draftsmith.core.models import load_model

                draft = load_model(config.model)[0].float()
            else:
                draft = AutoModelForCausalLM.from_config(layer_subset_config(target_config, layers))
            _check_vocabulary(draft, target)
            if config.lora_rank:
                alpha = config.lora_alpha or 2 * config.lora_rank
                draft = _with_lora(draft, config.lora_rank, alpha)
        self.model = draft
        # Resolved: the layers kept and the architecture built, so an artifact rebuilds it alone.
        built = draft.get_base_model() if config.lora_rank else draft
        self.config = replace(config, layers=layers, draft_config=built.config.to_dict())
        self._copy_target = config.init == "from_target"  # copied at the first bind_target

    def causal_lm(self) -> PreTrainedModel:
        """The draft causal LM itself (LoRA adapters, if any, live inside its layers)."""
        return self.model.get_base_model() if self.config.lora_rank else self.model

    def bind_target(self, target: PreTrainedModel) -> None:
        if self._copy_target:
            self._copy_layers_from(target)
            self._copy_target = False

    def _copy_layers_from(self, target: PreTrainedModel) -> None:
        """Load the target's weights for the kept layers (and embeddings, norm, LM head)."""
        source = target.state_dict()
        layers = self.config.layers
        mapped = {}
        for name in self.causal_lm().state_dict():
            if "lora_" in name:
                continue
            target_name = _LAYER.sub(
                lambda m: f"layers.{layers[int(m.group(1))]}.", name.replace(".base_layer", "")
            )
            if target_name not in source:
                raise ValueError(f"cannot initialise {name!r}: the target has no {target_name!r}")
            mapped[name] = source[target_name]
        missing, _ = self.causal_lm().load_state_dict(mapped, strict=False)
        left = [name for name in missing if "lora_" not in name]
        if left:
            raise ValueError(f"the target provides no weights for {left}")

    def forward_train(self, batch: TargetBatch) -> list[torch.Tensor]:
        return [self.model(input_ids=batch.input_ids).logits]

    def as_drafter(self, target: PreTrainedModel) -> DraftModelDrafter:
        self.bind_target(target)
        return DraftModelDrafter(self.causal_lm())


def _check_vocabulary(draft: PreTrainedModel, target: PretrainedConfig) -> None:
    vocab = text_config(draft.config).vocab_size
    if vocab != target.vocab_size:
        raise ValueError(
            f"the draft model's vocabulary has {vocab} tokens but the target's has "
            f"{target.vocab_size}: a distilled draft model must share the target's vocabulary"
        )


def _with_lora(model: PreTrainedModel, rank: int, alpha: float) -> nn.Module:
    """model with LoRA adapters on every linear layer but the LM head; only they train."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules="all-linear")
    return get_peft_model(model, config)
