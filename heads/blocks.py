"""Building pieces the learned heads share: the target's frozen modules, a decoder block of the
target's own architecture, attention masks and the row alignment of training inputs.

Blocks are built from the target's config through transformers' public classes, never from a
copy of its modeling code (DESIGN principle 1).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModel, PretrainedConfig, PreTrainedModel

from draftsmith.core import int4_rows
from draftsmith.core.attention import GROUPED_SDPA
from draftsmith.core.cache import cache_argument
from draftsmith.core.tree import additive_mask


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run a head's initialisation from its own seed, leaving the global RNG untouched: the same
    (target config, hyper-parameters) always give the same fresh weights."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@torch.no_grad()
def standardize_input_channels(linear: nn.Linear, inputs: torch.Tensor) -> None:
    """Divide `linear`'s weights on each input channel by that channel's RMS over a sample of
    its inputs (..., F): an initialisation for standardised inputs. Targets carry a few massive
    activations, orders of magnitude above the other channels; from the default initialisation
    they dominate the fused target feature, which then barely varies from token to token."""
    rms = inputs.float().flatten(0, -2).pow(2).mean(0).sqrt().clamp_min(1e-6)
    linear.weight.div_(rms.to(linear.weight))


def text_config(config: PretrainedConfig) -> PretrainedConfig:
    """The language-model part of a (possibly multimodal) config."""
    return config.get_text_config()


def rms_norm(config: PretrainedConfig, width: int | None = None) -> nn.RMSNorm:
    """An RMSNorm with the target's epsilon, over `width` (default: the hidden size)."""
    eps = getattr(config, "rms_norm_eps", None) or 1e-6
    return nn.RMSNorm(width or config.hidden_size, eps=eps)


@dataclass
class TargetParts:
    """The target's frozen modules a head shares. Held outside the head's module tree, so they
    are neither trained with the head's parameters nor saved in its artifact."""

    embed: nn.Module
    """Token ids (B, T) -> embeddings (B, T, H)."""
    lm_head: nn.Module
    """Hidden (B, T, H) -> logits (B, T, V)."""
    norm: nn.Module | None
    """The final norm before the LM head, where the architecture exposes one."""
    _rows: tuple | None = field(default=None, repr=False)
    """(key, (weight, bias)) of the last draft vocabulary's LM head rows."""

    @classmethod
    def of(cls, target: PreTrainedModel) -> TargetParts:
        embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
        if embed is None or lm_head is None:
            raise ValueError(
                f"{type(target).__name__} exposes no input or output embeddings: heads need a "
                "causal LM with get_input_embeddings() and get_output_embeddings()"
            )
        base = getattr(target, getattr(target, "base_model_prefix", "model"), None)
        parts = cls(embed=embed, lm_head=lm_head, norm=getattr(base, "norm", None))
        for module in (parts.embed, parts.lm_head, parts.norm):
            if module is not None:
                module.requires_grad_(False)  # the target is frozen
        return parts

    def embeddings(self, input_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """input_ids (B, T) -> the target's token embeddings (B, T, H) in the head's dtype."""
        weight = self.embed.weight
        return self.embed(input_ids.to(weight.device)).to(dtype)

    def logits(
        self,
        hidden: torch.Tensor,
        *,
        final_norm: bool = False,
        vocab: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """hidden (B, T, H) -> logits (B, T, V) through the target's LM head, after its final
        norm when final_norm (for hidden states that have not been through it). vocab (V_d,):
        only those rows of the LM head, giving (B, T, V_d) (a reduced draft vocabulary)."""
        hidden = hidden.to(self.lm_head.weight.dtype)
        if final_norm:
            if self.norm is None:
                raise ValueError(
                    "the target exposes no final norm (base model attribute `norm`); this head "
                    "applies it before the shared LM head"
                )
            hidden = self.norm(hidden)
        if vocab is None:
            return self.lm_head(hidden)
        return F.linear(hidden, *self._lm_head_rows(vocab))

    def _lm_head_rows(self, vocab: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The LM head's weight (V_d, H) and bias rows of vocab (V_d,), kept while vocab and the
        head are unchanged: gathering them costs as much as the full LM head, once per draft
        token otherwise."""
        weight, bias = self.lm_head.weight, self.lm_head.bias
        # Rows gathered under inference_mode cannot enter autograd: a switch back to training
        # gathers them again.
        inference = torch.is_inference_mode_enabled()
        key = (vocab.data_ptr(), vocab._version, weight.data_ptr(), weight._version, inference)
        if self._rows is None or self._rows[0] != key:
            index = vocab.to(weight.device)
            rows = (
                weight.index_select(0, index),
                None if bias is None else bias.index_select(0, index),
            )
            self._rows = (key, rows)
        return self._rows[1]


class SharesTargetParts:
    """Mixin for heads that borrow the target's embeddings, final norm and LM head."""

    _target: TargetParts | None = None
    drafts_on_target_lm_head: bool = False
    """Whether this kind's logits come from the target's LM head (it has none of its own)."""

    def bind_target(self, target: PreTrainedModel) -> None:
        self._target = TargetParts.of(target)

    def parts(self) -> TargetParts:
        if self._target is None:
            raise RuntimeError(
                f"{type(self).__name__}.bind_target(target) first: the head shares the target's "
                "embeddings and LM head"
            )
        return self._target


def int4_target_lm_head(head: SharesTargetParts, int4: bool | None) -> nn.Module | None:
    """The target's LM head, with a 4-bit copy packed for drafting (`draftsmith.core.int4_rows`),
    where `head` drafts through the whole of it every step (`drafts_on_target_lm_head`, over the
    full vocabulary: a reduced one reads its rows gathered) and int4 allows it (None or True:
    where `int4_rows.available`; False: never); else None. One-row steps read a quarter of its
    bytes, and on the CPU the LM head is the largest weight a step reads (SmolLM2's: 57 MB in
    bf16); the target verifies on its own weights."""
    if not head.drafts_on_target_lm_head or head.draft_to_target() is not None or int4 is False:
        return None
    lm_head = head.parts().lm_head
    return lm_head if int4_rows.prepare(lm_head, None) else None


def block_config(target_config: PretrainedConfig) -> PretrainedConfig:
    """A copy of the target's text config describing one full-attention decoder layer.

    The vocabulary shrinks to one token: the base model built from it carries an embedding
    table that the head discards, and the attention runs on SDPA, which takes explicit masks
    (`grouped_sdpa_attention`: grouped key/value heads are not copied under a tree's mask).
    """
    config = copy.deepcopy(text_config(target_config))
    config.num_hidden_layers = 1
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = ["full_attention"]
    config.vocab_size = 1
    config.pad_token_id = None
    config._attn_implementation = GROUPED_SDPA
    return config


def build_decoder_layer(target_config: PretrainedConfig) -> tuple[nn.Module, nn.Module]:
    """A fresh decoder layer of the target's architecture and that architecture's rotary
    embedding, both from transformers' own classes: a one-layer base model is built from a copy
    of the target config and only its layer and rotary module are kept."""
    base = AutoModel.from_config(block_config(target_config))
    layers, rotary = getattr(base, "layers", None), getattr(base, "rotary_emb", None)
    if layers is None or rotary is None:
        raise ValueError(
            f"{type(base).__name__} has no `layers` / `rotary_emb`: draftsmith builds head "
            "blocks for rotary decoder-only architectures (Llama, Qwen2, Mistral, ...)"
        )
    return layers[0], rotary


ROTARY_BUFFERS = ("inv_freq", "original_inv_freq")
"""A rotary embedding's frequency buffers: transformers, the target in any precision, training
and the serving engines keep them in float32; rounded to bf16 they move every angle (far more
at long range), and the head's drafts drift from what an engine computes."""


def to_target_precision(module: nn.Module, device: torch.device | str, dtype: torch.dtype) -> None:
    """Move `module` to `device` and cast its floating parameters and buffers to `dtype`, keeping
    every rotary embedding's frequency buffers (`ROTARY_BUFFERS`) in float32."""
    kept = {
        name: buffer
        for name, buffer in module.named_buffers()
        if name.rpartition(".")[2] in ROTARY_BUFFERS
    }
    module.to(device=device, dtype=dtype)
    for name, buffer in kept.items():
        owner, _, leaf = name.rpartition(".")
        module.get_submodule(owner)._buffers[leaf] = buffer.to(device=device, dtype=torch.float32)


def layer_inputs(
    hidden: torch.Tensor,
    positions: torch.Tensor,
    mask: torch.Tensor | None,
    rotary: nn.Module,
    cache_argument: str,
    cache=None,
) -> dict:
    """The keyword arguments of a transformers decoder layer (or its attention) for rows hidden
    (B, T, H) at positions (T,).

    mask (T, S) bool, True where a row may attend to a key (S = cached + T keys); None lets
    every row attend to every key (one new row after a cache). cache: a DynamicCache that gains
    the T new keys/values, or None.
    """
    position_ids = positions.to(hidden.device)[None].expand(hidden.shape[0], -1)
    additive = None if mask is None else additive_mask(mask.to(hidden.device), hidden.dtype)
    return {
        "attention_mask": additive,
        "position_ids": position_ids,
        "use_cache": cache is not None,
        cache_argument: cache,
        "position_embeddings": rotary(hidden, position_ids),
    }


class DecoderBlock(nn.Module):
    """One decoder layer of the target's architecture with that architecture's rotary embedding
    (`build_decoder_layer`). The layer has its own weights (it is not one of the target's
    layers) and keeps its keys/values in the cache it is given.
    """

    def __init__(self, target_config: PretrainedConfig) -> None:
        super().__init__()
        self.layer, self.rotary = build_decoder_layer(target_config)
        self._cache_argument = cache_argument(self.layer)

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache=None,
    ) -> torch.Tensor:
        """hidden (B, T, H) at positions (T,) -> (B, T, H); mask and cache as `layer_inputs`."""
        inputs = layer_inputs(hidden, positions, mask, self.rotary, self._cache_argument, cache)
        return self.layer(hidden, **inputs)


def causal_mask(rows: int, cached: int = 0) -> torch.Tensor:
    """(rows, cached + rows) bool: new row i sees the cached keys and new keys up to itself."""
    keys = torch.arange(cached + rows)
    return keys[None, :] <= (cached + torch.arange(rows))[:, None]


def lag(features: torch.Tensor) -> torch.Tensor:
    """features (B, T, F) -> (B, T, F) where row t holds the feature of position t - 1 (zeros in
    row 0): the target's feature lags the token it is paired with, at inference as in training."""
    return F.pad(features, (0, 0, 1, 0))[:, :-1]


def lead(input_ids: torch.Tensor, steps: int) -> torch.Tensor:
    """input_ids (B, T) -> (B, T) where row t holds the token at t + steps. Rows past the end hold
    token 0; their predictions fall outside the sequence and are never scored."""
    if steps == 0:
        return input_ids
    return F.pad(input_ids[:, steps:], (0, steps), value=0)
