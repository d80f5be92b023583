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

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from draftsmith.core.target import TargetBatch
from draftsmith.heads.base import register_drafter
from draftsmith.heads.blocks import seeded, text_config
from draftsmith.heads.draft_model import DraftModelDrafter
from draftsmith.heads.trainable import DraftHead

INITS = ("from_target", "sibling")
_LAYER = re.compile(r"\blayers\.(\d+)\.")


def layer_subset_config(target_config: PretrainedConfig, layers: Sequence[int]) -> PretrainedConfig:
    """The target's text config cut down to the given layers (indices into the target's)."""
    config = copy.deepcopy(text_config(target_config))
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [config.layer_types[i] for i in layers]
    config.num_hidden_layers = len(layers)
    return config


@register_drafter("distilled")
class DistilledHead(DraftHead):
    """A causal LM drafting on its own (no target features); `forward_train` returns its
    next-token logits, the one step of the alignment convention."""

    num_steps = 1
    target_feature_layers = ()

    def __init__(self, model: PreTrainedModel, hyper: dict, *, copy_target: bool) -> None:
        super().__init__()
        self.model = model
        self._hyper = hyper
        self._copy_target = copy_target  # initialise from the target at the first bind_target

    @classmethod
    def from_target_config(
        cls,
        target_config: PretrainedConfig,
        *,
        init: str = "from_target",
        model: str | None = None,
        layers: Sequence[int] | None = None,
        lora_rank: int = 0,
        lora_alpha: float | None = None,
        draft_config: dict | None = None,
        seed: int = 0,
    ) -> DistilledHead:
        """init: "from_target" (the target's `layers`, default every other one, copied from the
        target when the head is bound) or "sibling" (the pretrained causal LM `model`, a zoo
        name, folder or hub id, sharing the target's vocabulary). lora_rank > 0 trains LoRA
        adapters of that rank (alpha default 2 * rank) instead of the weights. draft_config: the
        draft model's full config, which rebuilds the architecture without fetching `model` (how
        an artifact is reloaded): "from_target" weights are still copied at bind_target, a
        sibling's are left freshly initialised for the saved ones to replace."""
        target = text_config(target_config)
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        if layers is None:
            layers = list(range(0, target.num_hidden_layers, 2))
        layers = [int(i) for i in layers]
        if init == "from_target" and (
            not layers
            or sorted(set(layers)) != layers
            or not 0 <= layers[-1] < target.num_hidden_layers
        ):
            raise ValueError(
                f"layers must be distinct ascending indices of the target's "
                f"{target.num_hidden_layers} layers, got {layers}"
            )
        if init == "sibling" and model is None and draft_config is None:
            raise ValueError('init="sibling" needs model=NAME_OR_PATH of a pretrained draft model')
        if lora_rank < 0:
            raise ValueError(f"lora_rank must be >= 0, got {lora_rank}")
        hyper = {
            "init": init,
            "model": model,
            "layers": layers if init == "from_target" else None,
            "lora_rank": lora_rank,
            "lora_alpha": lora_alpha,
            "seed": seed,
        }
        with seeded(seed):
            if draft_config is not None:
                config = AutoConfig.for_model(**draft_config)
                draft = AutoModelForCausalLM.from_config(config)
            elif init == "sibling":
                from draftsmith.core.models import load_model

                draft = load_model(model)[0].float()
            else:
                draft = AutoModelForCausalLM.from_config(layer_subset_config(target_config, layers))
            _check_vocabulary(draft, target)
            if lora_rank:
                draft = _with_lora(draft, lora_rank, lora_alpha or 2 * lora_rank)
        return cls(draft, hyper, copy_target=init == "from_target")

    def causal_lm(self) -> PreTrainedModel:
        """The draft causal LM itself (LoRA adapters, if any, live inside its layers)."""
        return self.model.get_base_model() if self._hyper["lora_rank"] else self.model

    def hyper_parameters(self) -> dict:
        return {**self._hyper, "draft_config": self.causal_lm().config.to_dict()}

    def bind_target(self, target: PreTrainedModel) -> None:
        if self._copy_target:
            self._copy_layers_from(target)
            self._copy_target = False

    def _copy_layers_from(self, target: PreTrainedModel) -> None:
        """Load the target's weights for the kept layers (and embeddings, norm, LM head)."""
        source = target.state_dict()
        layers = self._hyper["layers"]
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
