"""A small causal LM with the target's vocabulary, drafting autoregressively from its own KV cache."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from draftsmith.core.cache import cache_argument
from draftsmith.core.sampling import SamplingParams
from draftsmith.heads.base import Draft, Drafter, StopFn, register_drafter
from draftsmith.heads.state import DraftBuilder, OwnCache


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
        self._committed: list[int] = []
        self._own = OwnCache()

    def start(self, prompt_ids: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        self._committed = prompt_ids.tolist()
        self._own.reset()

    @torch.inference_mode()
    def propose(
        self,
        max_draft_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
        stop: StopFn | None = None,
    ) -> Draft:
        builder = DraftBuilder(max_draft_tokens, sampling, generator, stop)
        # Rows of an uncommitted earlier draft go; the newest token is rerun for its logits.
        self._own.keep(min(self._own.agreeing(self._committed), len(self._committed) - 1))
        pending = self._committed[len(self._own) :]
        while not builder.done:
            pending = [builder.add(self._forward(pending))]
        return builder.draft()

    def _forward(self, new_tokens: list[int]) -> torch.Tensor:
        """Run the draft model over new_tokens, extending its cache; returns the last logits (V,)."""
        input_ids = torch.tensor([new_tokens], dtype=torch.long, device=self.model.device)
        out = self.model(
            input_ids=input_ids, use_cache=True, **{self._cache_argument: self._own.kv}
        )
        self._own.extend(new_tokens)
        return out.logits[0, -1].float()

    def commit(self, tokens: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        self._committed.extend(tokens.tolist())
        # Keep the cached positions that agree with the committed sequence, drop the rest.
        self._own.keep(self._own.agreeing(self._committed))
