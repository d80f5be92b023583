"""A small causal LM with the target's vocabulary, drafting autoregressively from its own KV cache."""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache, PreTrainedModel

from draftsmith.cache import cache_argument, crop_cache
from draftsmith.heads.base import Draft, Drafter, StopFn, register_drafter
from draftsmith.sampling import SamplingParams, probabilities, sample


@register_drafter("draft-model")
class DraftModelDrafter(Drafter):
    """Drafts with any causal LM that shares the target's vocabulary.

    The draft model's cache is kept across rounds; after a rejection only the positions built on
    rejected tokens are dropped, so the accepted prefix is never recomputed.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model.eval()
        self.vocab_size = model.config.get_text_config().vocab_size
        self._cache_argument = cache_argument(model)
        # Only the last position's logits are needed; skipping the LM head elsewhere matters when
        # a round feeds several tokens and the vocabulary is large.
        self._last_logits_only = (
            {"logits_to_keep": 1}
            if "logits_to_keep" in inspect.signature(model.forward).parameters
            else {}
        )
        self._committed: list[int] = []
        self._cached: list[int] = []  # tokens whose keys/values are in the cache, in order
        self._cache = DynamicCache()

    def start(self, prompt_ids: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        self._committed = prompt_ids.tolist()
        self._cached = []
        self._cache = DynamicCache()

    @torch.inference_mode()
    def propose(
        self,
        max_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
        stop: StopFn | None = None,
    ) -> Draft:
        if max_tokens <= 0:
            return Draft.empty()
        pending = self._committed[len(self._cached) :]
        tokens, all_logits = [], []
        for position in range(max_tokens):
            logits = self._forward(pending)
            probs = probabilities(logits, sampling)
            token = int(logits.argmax()) if sampling.greedy else sample(probs, generator)
            tokens.append(token)
            all_logits.append(logits)
            if stop is not None and stop(position, logits):
                break
            pending = [token]
        logits = torch.stack(all_logits)
        return Draft(
            tokens=torch.tensor(tokens, dtype=torch.long),
            probs=None if sampling.greedy else probabilities(logits, sampling),
            logits=logits,
        )

    def _forward(self, new_tokens: list[int]) -> torch.Tensor:
        """Run the draft model over new_tokens, extending its cache; returns the last logits (V,)."""
        input_ids = torch.tensor([new_tokens], dtype=torch.long, device=self.model.device)
        out = self.model(input_ids=input_ids, use_cache=True, **{self._cache_argument: self._cache})
        self._cached.extend(new_tokens)
        return out.logits[0, -1].float()

    def commit(self, tokens: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        self._committed.extend(tokens.tolist())
        # Keep the cached positions that agree with the committed sequence, drop the rest.
        keep = 0
        for cached, committed in zip(self._cached, self._committed, strict=False):
            if cached != committed:
                break
            keep += 1
        if keep < len(self._cached):
            crop_cache(self._cache, keep)
            del self._cached[keep:]
