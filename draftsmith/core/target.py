"""The frozen target model: the one place its forward runs, for decoding, training and calibration.

- Incremental (decoding): `Target.extend(tokens)` runs new tokens after the cached positions
  and returns their logits and features; `Target.extend_rows` runs a batch of rows the same way,
  and `Target.extend_tree` one sequence's draft tree under its tree attention mask.
  `draftsmith.core.ragged.RaggedTarget` builds on it: a batch's draft trees, each row's own
  cached length, and keeping only the accepted positions.
- Batched (training, the feature cache, teacher-forced calibration): `Target.batch(input_ids,
  loss_mask)` runs whole rows once and returns a `TargetBatch` with the loss-mask shift applied.

Features are the hidden states of `feature_layers` (indices into transformers' `hidden_states`
output: 0 = embeddings, N = last layer), concatenated along the last dim. The model's code is
never copied: everything goes through its normal forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from draftsmith.core.attention import GROUPED_SDPA
from draftsmith.core.cache import cache_argument
from draftsmith.core.small_rows import small_rows
from draftsmith.core.tree import additive_mask, ancestor_mask, tree_depths

TREE_ATTENTION = ("eager", "sdpa", GROUPED_SDPA)
"""Attention implementations that apply a custom 4D mask as given (tested); others, e.g. flash
attention, ignore it or build their own, and would verify a tree against the wrong context."""


@dataclass
class TargetBatch:
    """What the frozen target provides for one training batch."""

    input_ids: torch.Tensor
    """(B, T) int64 token ids."""
    loss_mask: torch.Tensor
    """(B, T) bool: positions whose next-token prediction is trained on (see `next_token_mask`)."""
    features: torch.Tensor | None
    """(B, T, F) the target hidden states the head reads (its `target_feature_layers`,
    concatenated along the last dim), or None for heads that read none (draft models)."""
    target_logits: torch.Tensor
    """(B, T, V) the target's next-token logits at every position."""


def next_token_mask(loss_mask: torch.Tensor) -> torch.Tensor:
    """Data mask -> `TargetBatch.loss_mask`.

    loss_mask (B, T): 1 where the token at t is a training target (the data pipeline's
    convention). Returns (B, T) bool: True where the prediction made *at* t (of token t + 1)
    is trained on; the last position predicts past the row and is False.
    """
    shifted = torch.zeros_like(loss_mask, dtype=torch.bool)
    shifted[:, :-1] = loss_mask[:, 1:].bool()
    return shifted


class Target:
    """A frozen causal LM and the hidden-state layers its drafter reads."""

    def __init__(self, model: PreTrainedModel, feature_layers: tuple[int, ...] = ()) -> None:
        self.model = model
        self.feature_layers = tuple(feature_layers)
        self.cache = DynamicCache()
        self._cache_argument = cache_argument(model)

    def _features(self, hidden_states: tuple[torch.Tensor, ...] | None) -> torch.Tensor | None:
        if not self.feature_layers:
            return None
        return torch.cat([hidden_states[i] for i in self.feature_layers], dim=-1)

    # -- batched ----------------------------------------------------------------------------------

    @torch.no_grad()
    def forward(
        self, input_ids: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor, tuple[torch.Tensor, ...]]:
        """One cache-free forward over whole rows input_ids (B, T).

        Returns features (B, T, len(layers) * H) (None without layers), logits (B, T, V), and all
        hidden states (N + 1 tensors (B, T, H); empty without layers).
        """
        out = self.model(
            input_ids=input_ids, output_hidden_states=bool(self.feature_layers), use_cache=False
        )
        hidden = tuple(out.hidden_states) if self.feature_layers else ()
        return self._features(hidden), out.logits, hidden

    @torch.no_grad()
    def batch(self, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> TargetBatch:
        """The `TargetBatch` of rows input_ids (B, T) with data mask loss_mask (B, T) (the data
        pipeline's convention, see `next_token_mask`): one frozen forward of the target."""
        features, logits, _ = self.forward(input_ids)
        return TargetBatch(
            input_ids=input_ids,
            loss_mask=next_token_mask(loss_mask).to(input_ids.device),
            features=features,
            target_logits=logits,
        )

    # -- incremental ------------------------------------------------------------------------------

    @property
    def length(self) -> int:
        """Positions held in the cache."""
        return self.cache.get_seq_length()

    def extend(
        self,
        tokens: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run tokens (n,) after the cached positions, adding them to the cache.

        attention_mask and position_ids pass through to the model's forward unchanged (a draft
        tree's 4D mask and depths); the default is causal attention at the next positions.
        Returns logits (n, V) float32 and, when feature layers are set, features (n, F).
        """
        logits, features = self.extend_rows(tokens[None], attention_mask, position_ids)
        return logits[0], None if features is None else features[0]

    def extend_tree(
        self, tokens: torch.Tensor, parents: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run a draft tree tokens (m,) with parents (m,) (as `draftsmith.core.tree`: -1 continues
        the cache) after every cached position, under its 4D attention mask and explicit positions
        (the cached length plus each row's depth), as a draft's verification passes them. A chain
        (`chain_parents`) runs so too, attending causally through the mask: attention then takes
        the masked kernel path, which may round unlike the model's own causal masking. Returns
        `extend`'s logits (m, V) and features (m, F) or None."""
        check_custom_masks(self.model, "a draft tree's")
        cached, m = self.length, parents.numel()
        visible = torch.ones(m, cached + m, dtype=torch.bool)
        visible[:, cached:] = ancestor_mask(parents)
        device = self.model.device
        return self.extend(
            tokens,
            attention_mask=additive_mask(visible, self.model.dtype).to(device),
            position_ids=(cached + tree_depths(parents))[None].to(device),
        )

    def extend_rows(
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        logits_to_keep: int | torch.Tensor = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`extend` for a batch: tokens (B, n) after the cached positions of B rows. Returns logits
        (B, n, V) float32 (of the last logits_to_keep positions only, when it is a nonzero int,
        or of the positions it lists (k,), when a tensor: a prompt's prefill needs none, and the
        LM head over every prompt token is a large share of its cost) and features (B, n, F) or
        None."""
        everything = isinstance(logits_to_keep, int) and logits_to_keep == 0
        if isinstance(logits_to_keep, torch.Tensor):
            logits_to_keep = logits_to_keep.to(self.model.device)
        with small_rows(self.model, tokens.numel()):
            out = self.model(
                input_ids=tokens.to(self.model.device),
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                **{self._cache_argument: self.cache},
                output_hidden_states=bool(self.feature_layers),
                **({} if everything else {"logits_to_keep": logits_to_keep}),
            )
        return out.logits.float(), self._features(out.hidden_states)


def check_custom_masks(model: PreTrainedModel, what: str) -> None:
    """Raise a ValueError naming the fix unless model's attention applies a custom 4D mask as
    given (`TREE_ATTENTION`); what names the mask's use, e.g. "a draft tree's"."""
    implementation = model.config._attn_implementation
    if implementation not in TREE_ATTENTION:
        raise ValueError(
            f"the target runs {implementation!r} attention, which does not apply {what} "
            f"attention mask: load it with attn_implementation in {TREE_ATTENTION}, or decode "
            "with a chain at batch size 1"
        )
