"""EAGLE-3 in the published layout: fused low/mid/high target features, one widened decoder
layer, training-time test, optional reduced vocabulary.

The layout is the one the EAGLE repository, SpecForge, speculators, vLLM and SGLang share, so
weights map one to one onto theirs (`draftsmith.artifact.engines`). Per row t: `fc` (3H -> H, no
bias) fuses the target's features of position t - 1 from three layers; the decoder layer's
q/k/v projections read 2H, the concatenation of `input_layernorm(embedding of token t)` and
`hidden_norm(fused)`, while its residual stream starts at the un-normalised fused feature
(`hidden_norm(fused)` with `norm_before_residual`, vLLM's variant); then
the standard `post_attention_layernorm` and MLP. Logits are `lm_head(norm(h))` over the draft
vocabulary, and the next draft step is fed the un-normalised `h`. Training unrolls `num_steps`
steps on the head's own outputs (the training-time test, see `FeatureRecurrentHead`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn
from transformers import PretrainedConfig

from draftsmith.core.cache import cache_argument
from draftsmith.core.target import TargetBatch
from draftsmith.heads.base import register_drafter
from draftsmith.heads.blocks import (
    build_decoder_layer,
    layer_inputs,
    rms_norm,
    seeded,
    standardize_input_channels,
    text_config,
)
from draftsmith.heads.eagle import FeatureRecurrentHead
from draftsmith.heads.trainable import StepsConfig
from draftsmith.heads.vocab import DraftVocabConfig, DraftVocabulary


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low, middle and high layers (2, N // 2, N - 3) in `hidden_states` indexing,
    clamped to 0 .. N for shallow targets."""
    return tuple(min(max(i, 0), num_layers) for i in (2, num_layers // 2, num_layers - 3))


def resolve_feature_layers(text: PretrainedConfig, feature_layers: list[int] | None) -> tuple:
    """`feature_layers` (None: `default_feature_layers`) as indices 0 .. N into the target's
    hidden_states, negative ones counted from the end; a ValueError outside them."""
    layers = text.num_hidden_layers
    feature_layers = feature_layers or default_feature_layers(layers)
    if any(not -layers - 1 <= i <= layers for i in feature_layers):
        raise ValueError(
            f"feature_layers must index the target's hidden_states (0 .. {layers}), "
            f"got {list(feature_layers)}"
        )
    return tuple(i % (layers + 1) for i in feature_layers)


@dataclass(kw_only=True)
class Eagle3Config(DraftVocabConfig, StepsConfig):
    """EAGLE-3 head hyper-parameters."""

    num_steps: int = 4
    """Training-time test depth: draft steps unrolled on the head's own outputs."""
    feature_layers: list[int] | None = None
    """Indices into the target's hidden_states (0 = embeddings) whose features are fused;
    None: EAGLE-3's low, middle and high layers (2, N // 2, N - 3)."""
    norm_before_fc: bool = False
    """RMS-normalise the concatenated features before `fc` (weight `input_norm`): the variant
    speculators, SGLang and recent vLLM load as `norm_before_fc`."""
    norm_before_residual: bool = False
    """Start the layer's residual stream at `hidden_norm(hidden)` instead of the raw hidden: the
    variant speculators and vLLM load as `norm_before_residual` (SGLang does not compute it)."""
    standardize_fc_init: bool = True
    """Initialise `fc` for standardised inputs: its weights on each feature channel are divided
    by that channel's RMS over a sample of training rows, before training. Targets carry a few
    massive activations, orders of magnitude above the other channels; from the default
    initialisation they dominate the fused feature, which starts the layer's residual stream,
    and the head learns more slowly. Only the initial weights change: the layout is the
    published one."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.feature_layers is not None and not self.feature_layers:
            raise ValueError("feature_layers must name at least one layer (or be null)")


class Eagle3DecoderLayer(nn.Module):
    """The EAGLE-3 decoder layer, made of a transformers decoder layer of the target's
    architecture whose q/k/v projections are widened to read 2H (`widen_attention_inputs`), plus
    `hidden_norm`. Parameter names are the reference ones (`self_attn.*`, `mlp.*`,
    `input_layernorm`, `hidden_norm`, `post_attention_layernorm`)."""

    def __init__(self, target_config: PretrainedConfig, norm_before_residual: bool = False) -> None:
        super().__init__()
        text = text_config(target_config)
        self.norm_before_residual = norm_before_residual
        layer, self.rotary = build_decoder_layer(text)
        parts = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")
        if any(not hasattr(layer, name) for name in parts):
            raise ValueError(
                f"{type(layer).__name__} is not a pre-norm decoder layer with {list(parts)}: "
                "the EAGLE-3 layout needs one (Llama, Qwen2, Mistral, ...)"
            )
        self.self_attn = widen_attention_inputs(layer.self_attn, 2 * text.hidden_size)
        self.mlp = layer.mlp
        self.input_layernorm = layer.input_layernorm
        self.hidden_norm = rms_norm(text)
        self.post_attention_layernorm = layer.post_attention_layernorm
        self._cache_argument = cache_argument(layer)

    def forward(
        self,
        hidden: torch.Tensor,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache=None,
    ) -> torch.Tensor:
        """hidden (B, T, H) (fused features or the previous step's output) and token embeddings
        (B, T, H) at positions (T,) -> (B, T, H); mask and cache as `blocks.layer_inputs`."""
        inputs = layer_inputs(hidden, positions, mask, self.rotary, self._cache_argument, cache)
        normed = self.hidden_norm(hidden)
        both = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        attended, _ = self.self_attn(both, **inputs)
        hidden = (normed if self.norm_before_residual else hidden) + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


def widen_attention_inputs(attention: nn.Module, width: int) -> nn.Module:
    """Replace attention's q/k/v projections by fresh ones reading `width` features, in place;
    returns attention. They keep their output size and, as in the published layout, have no bias
    (so a Qwen2 target's layer maps onto the engines' Llama layer too)."""
    for name in ("q_proj", "k_proj", "v_proj"):
        old = getattr(attention, name, None)
        if not isinstance(old, nn.Linear):
            raise ValueError(
                f"{type(attention).__name__} has no linear {name}: the EAGLE-3 layout widens "
                "separate q/k/v projections"
            )
        new = nn.Linear(width, old.out_features, bias=False)
        setattr(attention, name, new.to(old.weight.dtype))
    return attention


@register_drafter("eagle3")
class Eagle3Head(DraftVocabulary, FeatureRecurrentHead):
    """EAGLE-3 head with its own final norm and LM head, over the full target vocabulary
    (`draft_vocab_size` None) or a reduced one (`DraftVocabulary`)."""

    config_class = Eagle3Config

    def __init__(self, target_config: PretrainedConfig, config: Eagle3Config) -> None:
        super().__init__()
        text = text_config(target_config)
        vocab, hidden = text.vocab_size, text.hidden_size
        self.init_draft_vocab(vocab, config.draft_vocab_size)
        self.target_feature_layers = resolve_feature_layers(text, config.feature_layers)
        # The layers as read, so the saved config does not depend on this version's defaults.
        self.config = replace(config, feature_layers=list(self.target_feature_layers))
        self.num_steps, self.hidden_size = config.num_steps, hidden
        with seeded(config.seed):
            width = len(self.target_feature_layers) * hidden
            self.input_norm = rms_norm(text, width) if config.norm_before_fc else None
            self.fc = nn.Linear(width, hidden, bias=False)
            self.midlayer = Eagle3DecoderLayer(text, config.norm_before_residual)
            self.norm = rms_norm(text)
            self.lm_head = nn.Linear(hidden, config.draft_vocab_size or vocab, bias=False)
        self._target = None

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(self._fc_inputs(features))

    def _fc_inputs(self, features: torch.Tensor) -> torch.Tensor:
        features = features.to(self.fc.weight)
        return features if self.input_norm is None else self.input_norm(features)

    @torch.no_grad()
    def fit_to_sample(self, sample: TargetBatch) -> None:
        """`standardize_fc_init`: scale fc's initial weights to the RMS of each channel fc reads
        in the sample's features (B, T, F)."""
        if self.config.standardize_fc_init:
            standardize_input_channels(self.fc, self._fc_inputs(sample.features))

    def run_layer(self, hidden, embeds, positions, mask, cache=None) -> torch.Tensor:
        return self.midlayer(hidden, embeds, positions, mask, cache)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))
