"""DFlash: a block-diffusion-style drafter that drafts K tokens in one forward, conditioned on
the target's features through its attention's keys and values.

After the newest committed token n (the anchor) a block of K + 1 rows runs at positions
n .. n + K: the anchor's token embedding, then K copies of the mask token's embedding (a row
`mask_token_id` of the target's frozen embedding table). Rows attend to every row of their own
block, in both directions, and to a context of keys and values projected from the target's
features of positions 0 .. n - 1: `fc` fuses the features of `feature_layers` (F -> H) and
`hidden_norm` normalises them; every layer projects that one context with its own k/v
projections (the context is not updated by the layers). Block row s > 0 predicts token n + s
through the final `norm` and the target's frozen LM head (its draft-vocabulary rows), so one
forward gives all K draft distributions and none depends on a drafted token. The context only
ever holds committed positions, so drafting never rolls anything back.

A layer is the target architecture's decoder layer (its q/k/v/o projections, MLP and norms,
from transformers' classes) plus per-head RMS norms of queries and keys (`q_norm`, `k_norm`), as
speculators' DFlash layer (Qwen3's) has; a Qwen3 target's own are kept.

Training makes every position t an anchor in one forward: block row s of anchor t reads the
context of positions before t and predicts token t + s, so depth d = s - 1 at t predicts token
t + 1 + d (the `DraftHead` alignment convention). speculators trains a random subset of anchors
(`max_anchors`) and weighs depth d by exp(-d / gamma) (`dflash_decay_gamma`, 4 by default): the
objective's `step_decay` exp(-1 / gamma) gives the same weights, up to their normalisation.

DSpark's options (`markov_rank`, `confidence_head`; `heads/dspark.py`) add a logit bias from
each row's previous token (the anchor for depth 0, the drafted token before it after that;
teacher-forced in training) and a head predicting each row's acceptance rate, trained through
`auxiliary_loss`.

Layout and names follow speculators' `dflash` (vLLM loads it): `fc`, `hidden_norm`,
`layers.{i}.self_attn.{q,k,v,o}_proj / q_norm / k_norm`, `layers.{i}.mlp.*`, the layer norms
and `norm`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from draftsmith.core.target import TargetBatch
from draftsmith.heads.base import register_drafter
from draftsmith.heads.blocks import (
    SharesTargetParts,
    build_decoder_layer,
    rms_norm,
    seeded,
    standardize_input_channels,
    text_config,
)
from draftsmith.heads.dflash_drafter import DFlashDrafter
from draftsmith.heads.dspark import (
    CONFIDENCE_TARGETS,
    MARKOV_HEAD_TYPES,
    BlockConfidence,
    ConfidenceHead,
    MarkovHead,
    confidence_loss,
    confidence_targets,
)
from draftsmith.heads.eagle3 import resolve_feature_layers
from draftsmith.heads.trainable import DraftHead, StepsConfig
from draftsmith.heads.vocab import DraftVocabConfig, DraftVocabulary

Context = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer, the context's keys and values, each (B, KV heads, C, head_dim)."""


@dataclass(kw_only=True)
class DFlashConfig(DraftVocabConfig, StepsConfig):
    """DFlash head hyper-parameters."""

    num_steps: int = 7
    """K: tokens one forward drafts (the K mask rows after the anchor); speculators' block_size
    is K + 1, its anchor row included."""
    num_layers: int = 1
    """Decoder layers of the head."""
    feature_layers: list[int] | None = None
    """Indices into the target's hidden_states (0 = embeddings) whose features are fused into
    the context; None: EAGLE-3's low, middle and high layers (2, N // 2, N - 3)."""
    mask_token_id: int | None = None
    """The token whose (frozen) target embedding fills the mask rows: best an id that never
    occurs in text, such as an unused padding slot; None: the target's last id."""
    standardize_fc_init: bool = True
    """Initialise `fc` for standardised inputs, as EAGLE-3's option of that name: its weights on
    each feature channel divided by that channel's RMS over a sample of training rows. Without
    it a target's massive activations dominate the fused context, whose keys and values then
    barely differ from position to position. Only the initial weights change."""
    markov_rank: int = 0
    """DSpark's Markov head (`heads/dspark.py`): the rank of the logit bias each block row takes
    from the token before it, so a row knows what the row before it drafted; 0: none (DFlash)."""
    markov_head_type: str = "vanilla"
    """vanilla (the previous token alone) or gated (scaled by a gate from the row's state)."""
    confidence_head: bool = False
    """DSpark's confidence head: each row's acceptance rate predicted from its state, trained
    beside the drafter with binary cross-entropy against `confidence_target`."""
    confidence_target: str = "overlap"
    """What the confidence head learns: overlap, sum_v min(p_v, q_v), the rate sampling accepts
    the row's token (speculators' DSpark); greedy, whether the row's top token is the target's,
    the rate greedy decoding accepts it."""
    confidence_head_with_markov: bool = True
    """With a Markov head, the confidence head also reads the previous token's rank-r row."""
    confidence_loss_weight: float = 1.0
    """The confidence head's loss weight against the drafter's objective."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be at least 1, got {self.num_layers}")
        if self.markov_rank < 0:
            raise ValueError(
                f"markov_rank must be >= 0 (0: no Markov head), got {self.markov_rank}"
            )
        if self.markov_head_type not in MARKOV_HEAD_TYPES:
            raise ValueError(
                f"markov_head_type must be one of {', '.join(MARKOV_HEAD_TYPES)}, got "
                f"{self.markov_head_type!r}"
            )
        if self.confidence_target not in CONFIDENCE_TARGETS:
            raise ValueError(
                f"confidence_target must be one of {', '.join(CONFIDENCE_TARGETS)}, got "
                f"{self.confidence_target!r}"
            )
        if not self.confidence_loss_weight >= 0:
            raise ValueError(
                f"confidence_loss_weight must be >= 0, got {self.confidence_loss_weight}"
            )
        if self.feature_layers is not None and not self.feature_layers:
            raise ValueError("feature_layers must name at least one layer (or be null)")


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (..., d) by cos, sin (broadcastable to x): the half-split rotation
    transformers' Llama and Qwen layers apply."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class DFlashLayer(nn.Module):
    """One DFlash decoder layer: pre-norm attention of block rows over the context's keys and
    values and their own block's, then the MLP."""

    def __init__(self, text: PretrainedConfig) -> None:
        super().__init__()
        layer, _ = build_decoder_layer(text)
        self.heads = text.num_attention_heads
        self.kv_heads = getattr(text, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(text, "head_dim", None) or text.hidden_size // self.heads
        attention = layer.self_attn
        for name in ("q_norm", "k_norm"):
            if not isinstance(getattr(attention, name, None), nn.Module):
                setattr(attention, name, rms_norm(text, self.head_dim))
        self.self_attn = attention
        self.mlp = layer.mlp
        self.input_layernorm = layer.input_layernorm
        self.post_attention_layernorm = layer.post_attention_layernorm

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        """(..., heads * head_dim) -> (..., heads, head_dim)."""
        return x.unflatten(-1, (heads, self.head_dim))

    def context(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The context rows hidden (B, C, H) at rotary cos, sin (B, C, d) -> their keys and
        values, each (B, KV heads, C, head_dim)."""
        attention = self.self_attn
        keys = attention.k_norm(self._split(attention.k_proj(hidden), self.kv_heads))
        keys = rotate(keys, cos[:, :, None], sin[:, :, None])
        values = self._split(attention.v_proj(hidden), self.kv_heads)
        return keys.transpose(1, 2), values.transpose(1, 2)

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        context: tuple[torch.Tensor, torch.Tensor],
        visible: torch.Tensor,
    ) -> torch.Tensor:
        """Block rows hidden (B, S, A, H) (S rows in each of A blocks) at rotary cos, sin
        (B, S, A, d) -> (B, S, A, H). Each row attends to every row of its own block and to
        the context keys and values (B, KV heads, C, head_dim) its block sees: visible (A, C)
        bool. The context scores are (B, heads, S, A, C), never one (S A) x (C + S A) grid."""
        attention = self.self_attn
        normed = self.input_layernorm(hidden)
        groups = self.heads // self.kv_heads
        q = attention.q_norm(self._split(attention.q_proj(normed), self.heads))
        k = attention.k_norm(self._split(attention.k_proj(normed), self.kv_heads))
        v = self._split(attention.v_proj(normed), self.kv_heads)
        cos, sin = cos[..., None, :], sin[..., None, :]
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        # (B, S, A, heads, d) -> (B, heads, S, A, d)
        q, k, v = (t.permute(0, 3, 1, 2, 4) for t in (q, k, v))
        k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
        context_k, context_v = (t.repeat_interleave(groups, dim=1) for t in context)
        scale = self.head_dim**-0.5
        to_context = torch.einsum("bhsad,bhcd->bhsac", q, context_k) * scale
        to_context = to_context.masked_fill(~visible.to(q.device), float("-inf"))
        in_block = torch.einsum("bhsad,bhrad->bhsar", q, k) * scale
        scores = torch.cat([to_context, in_block], dim=-1)
        probs = scores.softmax(-1, dtype=torch.float32).to(q.dtype)
        width = context_k.shape[2]
        out = torch.einsum("bhsac,bhcd->bhsad", probs[..., :width], context_v)
        out = out + torch.einsum("bhsar,bhrad->bhsad", probs[..., width:], v)
        hidden = hidden + attention.o_proj(out.permute(0, 2, 3, 1, 4).flatten(-2))
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


@register_drafter("dflash")
class DFlashHead(DraftVocabulary, SharesTargetParts, DraftHead):
    """DFlash head: `fc` and `hidden_norm` over the fused target features, `num_layers`
    `DFlashLayer`s, a final `norm`; the target's embeddings and LM head (its draft-vocabulary
    rows with `draft_vocab_size`) are shared and frozen, as speculators' are."""

    config_class = DFlashConfig

    def __init__(self, target_config: PretrainedConfig, config: DFlashConfig) -> None:
        super().__init__()
        text = text_config(target_config)
        vocab, hidden = text.vocab_size, text.hidden_size
        if config.mask_token_id is not None and not 0 <= config.mask_token_id < vocab:
            raise ValueError(
                f"mask_token_id must be a token id of the target (0 .. {vocab - 1}), "
                f"got {config.mask_token_id}"
            )
        self.init_draft_vocab(vocab, config.draft_vocab_size)
        self.target_feature_layers = resolve_feature_layers(text, config.feature_layers)
        self.config = replace(config, feature_layers=list(self.target_feature_layers))
        self.num_steps, self.hidden_size, self.vocab_size = config.num_steps, hidden, vocab
        with seeded(config.seed):
            self.fc = nn.Linear(len(self.target_feature_layers) * hidden, hidden, bias=False)
            self.hidden_norm = rms_norm(text)
            self.layers = nn.ModuleList(DFlashLayer(text) for _ in range(config.num_layers))
            self.norm = rms_norm(text)
            _, self.rotary = build_decoder_layer(text)
            rank = config.markov_rank
            self.markov_head = (
                MarkovHead(
                    vocab, config.draft_vocab_size or vocab, rank, hidden, config.markov_head_type
                )
                if rank
                else None
            )
            self.confidence_reads_markov = bool(rank) and config.confidence_head_with_markov
            self.confidence_head = (
                ConfidenceHead(hidden + (rank if self.confidence_reads_markov else 0))
                if config.confidence_head
                else None
            )
        self._target = None
        self._auxiliary: torch.Tensor | None = None

    @property
    def mask_token_id(self) -> int:
        """The id whose target embedding fills the mask rows (`DFlashConfig.mask_token_id`)."""
        if self.config.mask_token_id is not None:
            return self.config.mask_token_id
        return self.vocab_size - 1

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (...) -> cos, sin (1, ..., d) in the head's dtype."""
        flat = positions.reshape(1, -1).to(self.fc.weight.device)
        cos, sin = self.rotary(self.fc.weight, flat)
        shape = (1, *positions.shape, cos.shape[-1])
        return cos.to(self.dtype).reshape(shape), sin.to(self.dtype).reshape(shape)

    def fit_to_sample(self, sample: TargetBatch) -> None:
        """`standardize_fc_init` on the sample's features (B, T, F)."""
        if self.config.standardize_fc_init:
            standardize_input_channels(self.fc, sample.features)

    def context(self, features: torch.Tensor, positions: torch.Tensor) -> Context:
        """Target features (B, C, F) of positions (C,) -> every layer's context keys and
        values."""
        hidden = self.hidden_norm(self.fc(features.to(self.fc.weight)))
        cos, sin = self._rotary(positions)
        return [layer.context(hidden, cos, sin) for layer in self.layers]

    def run_block(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        context: Context,
        visible: torch.Tensor,
    ) -> torch.Tensor:
        """Blocks of input_ids (B, S, A) (S rows in each of A blocks) at positions (S, A),
        attending to `context` where visible (A, C) -> the last layer's output (B, S, A, H)."""
        hidden = self.parts().embeddings(input_ids, self.dtype)
        cos, sin = self._rotary(positions)
        for layer, layer_context in zip(self.layers, context, strict=True):
            hidden = layer(hidden, cos, sin, layer_context, visible)
        return hidden

    def block_ids(self, anchors: torch.Tensor, masked: int) -> torch.Tensor:
        """anchors (B, A) -> block input ids (B, 1 + masked, A): each anchor, then mask ids."""
        mask = anchors.new_full((anchors.shape[0], masked, anchors.shape[1]), self.mask_token_id)
        return torch.cat([anchors[:, None], mask], dim=1)

    def logits(self, hidden: torch.Tensor, previous: torch.Tensor | None = None) -> torch.Tensor:
        """Block outputs (..., H) -> logits (..., V_d) through `norm` and the target's LM head
        (its draft-vocabulary rows), plus, with a Markov head, the bias of each row's previous
        token, previous (...) target ids."""
        normed = self.norm(hidden)
        logits = self.parts().logits(normed, vocab=self.draft_to_target())
        if self.markov_head is None:
            return logits
        if previous is None:
            raise ValueError("a Markov head's logits need each row's previous token")
        bias = self.markov_head(self.markov_head.embed(previous), normed)
        return logits + bias.to(logits.dtype)

    def states(self, hidden: torch.Tensor, previous: torch.Tensor | None) -> torch.Tensor:
        """What a learned acceptance head reads of block outputs (..., H) whose previous tokens
        are previous (...; read only with the Markov rows): the outputs themselves, or, with a
        confidence head, its features (..., `state_size`): the normalised outputs, then the
        previous tokens' Markov rows."""
        if self.confidence_head is None:
            return hidden
        features = [self.norm(hidden)]
        if self.confidence_reads_markov:
            if previous is None:
                raise ValueError("a confidence head reading Markov rows needs the previous tokens")
            features.append(self.markov_head.embed(previous).to(features[0].dtype))
        return torch.cat(features, dim=-1)

    def own_acceptance(self) -> BlockConfidence | None:
        """The confidence head, reading the states the head exposes."""
        return None if self.confidence_head is None else BlockConfidence(self.confidence_head)

    def forward_train(self, batch: TargetBatch) -> list[torch.Tensor]:
        """Every position t an anchor: K logits (B, T, V_d), depth d at t predicting token
        t + 1 + d from the features of positions before t."""
        return self.forward_states(batch)[0]

    @property
    def state_size(self) -> int:
        if self.confidence_head is None:
            return self.hidden_size
        return self.confidence_head.proj.in_features

    def forward_states(self, batch: TargetBatch) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """`forward_train`'s K logits and the `states` (B, T, state_size) of the block outputs
        they are computed from (what the drafter hands a learned acceptance head), depth by
        depth."""
        if batch.features is None:
            raise ValueError(f"{self.kind} reads target features: batch.features is None")
        input_ids = batch.input_ids
        rows = input_ids.shape[1]
        positions = torch.arange(rows, device=input_ids.device)
        context = self.context(batch.features, positions)
        block = positions + torch.arange(self.num_steps + 1, device=positions.device)[:, None]
        before = torch.ones(rows, rows, dtype=torch.bool).tril(-1)  # anchor t sees p < t
        hidden = self.run_block(self.block_ids(input_ids, self.num_steps), block, context, before)
        outputs = list(hidden[:, 1:].unbind(1))
        # depth d at row t follows token t + d (the anchor itself at depth 0); rows past the end
        # predict nothing the objective counts
        previous = [F.pad(input_ids[:, d:], (0, d)) for d in range(self.num_steps)]
        logits = [self.logits(h, p) for h, p in zip(outputs, previous, strict=True)]
        states = [self.states(h, p) for h, p in zip(outputs, previous, strict=True)]
        self._auxiliary = None  # the confidence head learns where the target's logits are given
        if self.confidence_head is not None and batch.target_logits is not None:
            rates = confidence_targets(
                logits, batch.target_logits, self.draft_to_target(), self.config.confidence_target
            )
            loss = confidence_loss(self.confidence_head, states, rates, batch.loss_mask)
            self._auxiliary = self.config.confidence_loss_weight * loss
        return logits, states

    def auxiliary_loss(self) -> torch.Tensor | None:
        """The confidence head's loss of the latest `forward_train`, when there is one."""
        return self._auxiliary

    def as_drafter(self, target: PreTrainedModel) -> DFlashDrafter:
        self.bind_target(target)
        return DFlashDrafter(self, text_config(target.config).vocab_size)
