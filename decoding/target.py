"""The target's side of the loop: one KV cache, extended by verification and cropped on rejection."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from draftsmith.cache import cache_argument, crop_cache


class TargetRunner:
    """Runs the frozen target over new tokens, keeping its cache across rounds."""

    def __init__(self, model: PreTrainedModel, feature_layers: tuple[int, ...] = ()) -> None:
        self.model = model
        self.feature_layers = feature_layers
        self.cache = DynamicCache()
        self._cache_argument = cache_argument(model)

    @property
    def length(self) -> int:
        """Positions held in the cache."""
        return self.cache.get_seq_length()

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run tokens (n,) after the cached positions.

        Returns logits (n, V) float32 and, if the drafter reads target features, features (n, F):
        the requested hidden-state layers concatenated.
        """
        out = self.model(
            input_ids=tokens[None].to(self.model.device),
            use_cache=True,
            **{self._cache_argument: self.cache},
            output_hidden_states=bool(self.feature_layers),
        )
        features = None
        if self.feature_layers:
            features = torch.cat([out.hidden_states[i][0] for i in self.feature_layers], -1)
        return out.logits[0].float(), features

    def rollback(self, length: int) -> None:
        """Keep only the first `length` cached positions."""
        crop_cache(self.cache, length)
