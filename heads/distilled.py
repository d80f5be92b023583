"""A draft model trained for the target: a small causal LM with the target's vocabulary.

It starts either as a pretrained sibling sharing the tokenizer (`init="sibling"`) or as a copy of
the target's architecture with a subset of its layers, initialised from the target's weights
(`init="from_target"`), optionally trained through LoRA adapters only (peft). It reads no target
features; at inference it is an ordinary `DraftModelDrafter` (adapters merged).

A LoRA draft's artifact keeps either only its adapters (`lora_export="adapter"`: the base is
rebuilt on load, from the target's layers or from the sibling `model`, whose fingerprint must be
the one the adapters were trained on) or the merged weights (`"merged"`: a full model, no base).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from draftsmith.core.fingerprint import model_fingerprint
from draftsmith.core.models import check_same_vocabulary
from draftsmith.core.target import TargetBatch
from draftsmith.heads.base import register_drafter
from draftsmith.heads.blocks import seeded, text_config
from draftsmith.heads.draft_model import DraftModelDrafter
from draftsmith.heads.trainable import DraftHead, HeadConfig
from draftsmith.zoo import load_model

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
    lora_target_modules: list[str] | None = None
    """Linear modules that get adapters, by name or dotted suffix (q_proj, mlp.down_proj, ...);
    None: every linear layer but the LM head."""
    lora_export: Literal["adapter", "merged"] = "adapter"
    """How the artifact keeps a LoRA draft: adapter (only the adapters; the base is rebuilt from
    the target's layers or reloaded from `model`, checked by its fingerprint) or merged (the
    adapters merged into the weights: a full model that needs no base)."""
    base_fingerprint: str | None = None
    """The sibling base model's fingerprint, filled in when it is loaded: adapters saved without
    their base load only onto a base with this fingerprint."""
    draft_config: dict[str, Any] | None = None
    """The draft model's full transformers config: rebuilds the architecture without fetching
    `model` (how an artifact reloads, unless it keeps only adapters). from_target weights are
    still copied when the head is bound; a sibling's are left fresh for the saved ones to
    replace."""

    def __post_init__(self) -> None:
        layers = self.layers
        if layers is not None and (not layers or layers[0] < 0 or sorted(set(layers)) != layers):
            raise ValueError(f"layers must be distinct ascending layer indices, got {layers}")
        if self.init == "sibling" and self.model is None and self.draft_config is None:
            raise ValueError('init="sibling" needs model=NAME_OR_PATH of a pretrained draft model')
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank must not be negative, got {self.lora_rank}")
        if self.lora_target_modules is not None and not (
            self.lora_rank and self.lora_target_modules
        ):
            raise ValueError(
                "lora_target_modules lists the modules LoRA adapts: give lora_rank > 0 and at "
                f"least one module name, got {self.lora_target_modules} at rank {self.lora_rank}"
            )

    @property
    def adapter_only(self) -> bool:
        """The artifact keeps only the LoRA adapters; the base comes back from elsewhere."""
        return bool(self.lora_rank) and self.lora_export == "adapter"


@register_drafter("distilled")
class DistilledHead(DraftHead):
    """A causal LM drafting on its own (no target features); `forward_train` returns its
    next-token logits, the one step of the alignment convention."""

    config_class = DistilledConfig
    num_steps = 1
    target_feature_layers = ()

    def __init__(
        self,
        target_config: PretrainedConfig,
        config: DistilledConfig,
        *,
        draft: PreTrainedModel | None = None,
    ) -> None:
        """draft: an already built draft model (config.draft_config's), wrapped as it is."""
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
        self._draft_tokenizer: PreTrainedTokenizerBase | None = None
        base_fingerprint = None
        # A given draft has its weights; a from_target one copies them at the first bind_target.
        self._copy_target = config.init == "from_target" and draft is None
        with seeded(config.seed):
            if draft is None:
                draft, self._draft_tokenizer, base_fingerprint = _build_draft(
                    target_config, config, layers
                )
            _check_vocabulary(draft, target, config)
            if config.lora_rank:
                alpha = config.lora_alpha or 2 * config.lora_rank
                draft = _with_lora(draft, config.lora_rank, alpha, config.lora_target_modules)
        self.model = draft
        self._target_config = target_config
        # Resolved: the layers kept and the architecture built, so an artifact rebuilds it alone.
        built = draft.get_base_model() if config.lora_rank else draft
        self.config = replace(
            config,
            layers=layers,
            draft_config=built.config.to_dict(),
            base_fingerprint=base_fingerprint or config.base_fingerprint,
        )

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
        """Drafts with the causal LM; a LoRA draft with a merged copy (no adapter cost per
        step), leaving the head's adapters in place."""
        self.bind_target(target)
        return DraftModelDrafter(_merged(self.model) if self.config.lora_rank else self.model)

    def check_tokenizer(self, tokenizer: PreTrainedTokenizerBase) -> None:
        """A sibling's tokenizer must map every token to the target's id."""
        if self._draft_tokenizer is None:
            return
        try:
            check_same_vocabulary(tokenizer, self._draft_tokenizer, self.config.model)
        except ValueError as error:
            raise ValueError(
                f"{error}. Give head_args.model a draft model of the target's family (one "
                "tokenizer), or init: from_target"
            ) from None

    def is_rebuilt(self, name: str) -> bool:
        return self.config.adapter_only and "lora_" not in name

    def for_artifact(self) -> DistilledHead:
        """With lora_export merged: a head without adapters holding the merged weights."""
        config = self.config
        if not config.lora_rank or config.adapter_only:
            return self
        merged = _merged(self.model)
        plain = replace(
            config,
            lora_rank=0,
            lora_alpha=None,
            lora_target_modules=None,
            base_fingerprint=None,
            draft_config=merged.config.to_dict(),
        )
        return DistilledHead(self._target_config, plain, draft=merged)


def _build_draft(
    target_config: PretrainedConfig, config: DistilledConfig, layers: list[int] | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None, str | None]:
    """The draft causal LM (float32), with the sibling's tokenizer and fingerprint when the
    sibling is loaded: its weights are needed (a fresh start, or adapters saved without it)."""
    if config.init == "sibling" and (config.draft_config is None or config.adapter_only):
        draft, tokenizer = load_model(config.model)
        draft = draft.float()
        return draft, tokenizer, _check_base(draft, config)
    if config.draft_config is not None:
        draft_config = AutoConfig.for_model(**config.draft_config)
    else:
        draft_config = layer_subset_config(target_config, layers)
    return AutoModelForCausalLM.from_config(draft_config), None, None


def _check_base(draft: PreTrainedModel, config: DistilledConfig) -> str:
    """The sibling's fingerprint, which must be the recorded one when only adapters are loaded
    onto it."""
    found = model_fingerprint(draft)
    expected = config.base_fingerprint
    if config.adapter_only and expected is not None and found != expected:
        raise ValueError(
            f"the LoRA adapters were trained on a base draft model with fingerprint "
            f"{expected[:12]}, but {config.model!r} now loads as another model (fingerprint "
            f"{found[:12]}): put that base back at {config.model!r} (head.model in the "
            "artifact's config.json), or retrain with lora_export: merged, which needs no base"
        )
    return found


def _check_vocabulary(
    draft: PreTrainedModel, target: PretrainedConfig, config: DistilledConfig
) -> None:
    vocab = text_config(draft.config).vocab_size
    if vocab != target.vocab_size:
        raise ValueError(
            f"the draft model {config.model or draft.config.model_type!r} has a vocabulary of "
            f"{vocab} tokens but the target's has {target.vocab_size}: a distilled draft model "
            "must share the target's vocabulary. Give head_args.model a draft model of the "
            "target's family (one tokenizer), or init: from_target"
        )


def _with_lora(
    model: PreTrainedModel, rank: int, alpha: float, modules: list[str] | None
) -> nn.Module:
    """model with LoRA adapters on `modules` (None: every linear layer but the LM head); only
    they train."""
    from peft import LoraConfig, get_peft_model

    if modules is not None:
        _check_lora_modules(model, modules)
    config = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=modules or "all-linear"
    )
    return get_peft_model(model, config)


def _check_lora_modules(model: PreTrainedModel, modules: list[str]) -> None:
    """Each name must end the dotted name of a linear layer of the model (as peft matches)."""
    linear = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    unknown = [
        wanted
        for wanted in modules
        if not any(name == wanted or name.endswith(f".{wanted}") for name in linear)
    ]
    if unknown:
        known = sorted({name.rsplit(".", 1)[-1] for name in linear})
        raise ValueError(
            f"lora_target_modules {unknown} name no linear layer of the draft model "
            f"({type(model).__name__}); its linear layers are {', '.join(known)}: give some of "
            "those, or leave lora_target_modules unset for all of them but the LM head"
        )


def _merged(model: nn.Module) -> PreTrainedModel:
    """A copy of a peft model with its adapters merged into the base weights."""
    return copy.deepcopy(model).merge_and_unload()
