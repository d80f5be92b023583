"""MTP (DeepSeek-V3 multi-token prediction): K chained modules, each one decoder layer deep.

Module k combines RMSNorm(h) of the previous module's output (module 0: the target's last hidden
state) with RMSNorm(embedding of the next token) as Linear(2H -> H), runs one decoder layer of the
target's architecture and predicts a further token through the target's final norm and LM head.
Embeddings, final norm and LM head are the target's, frozen.

Rows follow the lag of target features: row t of module 0 reads the target feature of position
t - 1 and the token at t, so module k at row t reads the token at t + k and predicts the token at
t + 1 + k, the alignment convention of `DraftHead` (DeepSeek's module k + 1 at position t - 1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from draftsmith.core import int4_rows
from draftsmith.core.sampling import SamplingParams
from draftsmith.core.small_rows import prepack, small_rows
from draftsmith.core.target import TargetBatch
from draftsmith.heads.base import Draft, Drafter, DraftRequest, register_drafter
from draftsmith.heads.blocks import (
    DecoderBlock,
    SharesTargetParts,
    TargetParts,
    causal_mask,
    int4_target_lm_head,
    lag,
    lead,
    rms_norm,
    seeded,
    text_config,
)
from draftsmith.heads.state import DraftBuilder, LaggedFeatures, OwnCache, to_target_vocab
from draftsmith.heads.trainable import DraftHead, StepsConfig
from draftsmith.heads.tree import combine_depths
from draftsmith.heads.vocab import DraftVocabConfig, DraftVocabulary


class MTPModule(nn.Module):
    """One prediction depth: [RMSNorm(h) ; RMSNorm(embedding)] -> Linear(2H -> H) -> block."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.hidden_norm, self.embed_norm = rms_norm(config), rms_norm(config)
        self.proj = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.block = DecoderBlock(config)

    def forward(
        self,
        hidden: torch.Tensor,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache=None,
    ) -> torch.Tensor:
        """hidden, embeds (B, T, H) at positions (T,) -> this depth's hidden states (B, T, H)."""
        x = self.proj(torch.cat([self.hidden_norm(hidden), self.embed_norm(embeds)], dim=-1))
        return self.block(x, positions, mask, cache)


@dataclass(kw_only=True)
class MTPConfig(DraftVocabConfig, StepsConfig):
    """MTP head hyper-parameters."""

    num_steps: int = 2
    """K chained MTP modules, module k predicting the token k + 1 ahead (a draft holds up to
    K tokens)."""


@register_drafter("mtp")
class MTPHead(DraftVocabulary, SharesTargetParts, DraftHead):
    """K chained MTP modules sharing the target's embeddings, final norm and LM head (its rows
    of the draft vocabulary when `draft_vocab_size` is set: see `DraftVocabulary`)."""

    config_class = MTPConfig
    drafts_on_target_lm_head = True

    def __init__(self, target_config: PretrainedConfig, config: MTPConfig) -> None:
        super().__init__()
        text = text_config(target_config)
        self.init_draft_vocab(text.vocab_size, config.draft_vocab_size)
        self.config, self.num_steps = config, config.num_steps
        self.hidden_size = text.hidden_size
        self.target_feature_layers = (text.num_hidden_layers,)
        with seeded(config.seed):
            self.depths = nn.ModuleList(MTPModule(text) for _ in range(self.num_steps))
        self._target: TargetParts | None = None

    def run_depth(
        self,
        k: int,
        hidden: torch.Tensor,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache=None,
    ) -> torch.Tensor:
        """Module k over rows at positions (T,): hidden (B, T, H) from the depth before and the
        tokens (B, T) it pairs them with -> (B, T, H)."""
        module = self.depths[k]
        weight = module.proj.weight
        embeds = self.parts().embeddings(input_ids, weight.dtype)
        return module(hidden.to(weight), embeds, positions, mask, cache)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, T, H) -> (B, T, V_d) through the target's final norm and LM head."""
        return self.parts().logits(hidden, final_norm=True, vocab=self.draft_to_target())

    def forward_train(self, batch: TargetBatch) -> list[torch.Tensor]:
        if batch.features is None:
            raise ValueError("MTP reads the target's last hidden state: batch.features is None")
        rows = batch.input_ids.shape[1]
        positions = torch.arange(rows, device=batch.input_ids.device)
        mask = causal_mask(rows)
        hidden, step_logits = lag(batch.features), []
        for k in range(self.num_steps):
            hidden = self.run_depth(k, hidden, lead(batch.input_ids, k), positions, mask)
            step_logits.append(self.logits(hidden))
        return step_logits

    def as_drafter(self, target: PreTrainedModel) -> MTPDrafter:
        self.bind_target(target)
        return MTPDrafter(self, text_config(target.config).vocab_size)


class MTPDrafter(Drafter):
    """Drafts one token per module (a chain), or each module's top-k along the top-1 path (a
    tree), each module keeping its own KV cache across rounds.

    Module k's row q reads the token at q + k, so its newest rows are built on draft tokens of
    the same round. After a round a module keeps the rows whose tokens were committed and whose
    input rows in module k - 1 were kept; the rest are rebuilt next round.
    """

    def __init__(self, head: MTPHead, vocab_size: int, int4: bool | None = None) -> None:
        self.head = head.eval()
        prepack(self.head)  # not in the first round, which a policy times
        self._lm_head = int4_target_lm_head(head, int4)
        self.int4 = self._lm_head is not None
        """Whether it drafts on a 4-bit copy of the target's LM head (`int4_target_lm_head`)."""
        self.vocab_size = vocab_size
        self.target_feature_layers = head.target_feature_layers
        self._d2t = head.draft_to_target()
        self._committed: list[int] = []
        self._depths = [OwnCache() for _ in range(head.num_steps)]
        self._features = LaggedFeatures(head.hidden_size)

    def start(self, prompt_ids: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        self._committed = prompt_ids.tolist()
        for own in self._depths:
            own.reset()
        self._features.start(target_features, prompt_ids.numel())

    def fork(self) -> MTPDrafter:
        return MTPDrafter(self.head, self.vocab_size, self.int4)

    @torch.inference_mode()
    def draft(self, request: DraftRequest) -> Draft:
        depth = min(request.shape.depth, self.head.num_steps)
        if request.shape.is_chain:
            return self._chain(DraftBuilder(request, depth))
        # A tree: each module's top-k, from the modules run along the top-1 path.
        greedy = DraftBuilder(replace(request, sampling=SamplingParams(), stop=None), depth)
        self._chain(greedy)
        return combine_depths(request, list(greedy.draft().logits))

    def _chain(self, builder: DraftBuilder) -> Draft:
        """One token per module, each module reading the tokens drafted before it."""
        self._drop_uncommitted()  # rows built on an earlier, uncommitted draft
        sequence = list(self._committed)  # grows by each drafted token
        newest = len(self._committed) - 1
        with int4_rows.int4_rows(self._lm_head, self.int4):
            for k, own in enumerate(self._depths):
                if builder.done:
                    break
                self._extend(k, sequence, newest)
                newest_out = own.outputs[newest : newest + 1][None]  # (1, 1, H)
                logits = self.head.logits(newest_out)[0, -1].float()
                sequence.append(builder.add(to_target_vocab(logits, self._d2t, self.vocab_size)))
        self._features.release(len(self._depths[0]))
        return builder.draft()

    def _extend(self, k: int, sequence: list[int], newest: int) -> None:
        """Run module k over its rows not yet cached, up to the newest committed token's row;
        sequence holds the committed tokens and the k tokens drafted so far this round."""
        own = self._depths[k]
        start = len(own)
        if start > newest:
            return
        if k == 0:
            hidden = self._features.rows(start, newest + 1)
        else:
            hidden = self._depths[k - 1].outputs[start : newest + 1]
        tokens = sequence[start + k : newest + 1 + k]
        with small_rows(self.head, len(tokens)):
            out = self.head.run_depth(
                k,
                hidden[None],
                torch.tensor([tokens]),
                torch.arange(start, newest + 1),
                causal_mask(newest + 1 - start, start),
                own.kv,
            )
        own.extend(tokens, out[0])

    def commit(self, tokens: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        self._committed.extend(tokens.tolist())
        self._features.append(target_features, tokens.numel())
        self._drop_uncommitted()

    def _drop_uncommitted(self) -> None:
        """Keep, per module, the rows whose tokens are all committed: module k's row q reads
        token q + k and module k - 1's row q, so it keeps no more rows than module k - 1."""
        kept = len(self._committed)
        for k, own in enumerate(self._depths):
            kept = min(own.agreeing(self._committed, offset=k), kept)
            own.keep(kept)
