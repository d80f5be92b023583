"""EAGLE (EAGLE-1/2): one decoder layer that drafts autoregressively in the target's feature space.

Row t of the head reads the target feature of position t - 1 and the embedding of the token at t
and predicts the feature of position t, whose logits (through the target's LM head) predict the
token at t + 1. Drafting feeds each predicted feature back in with the token it predicted. The
same machinery (`FeatureRecurrentHead`, `FeatureDrafter`) runs EAGLE-3 (`eagle3.py`).
"""

from __future__ import annotations

import contextlib
from abc import abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, PretrainedConfig, PreTrainedModel

from draftsmith.core import int4_rows
from draftsmith.core.small_rows import prepack, small_rows
from draftsmith.core.target import TargetBatch
from draftsmith.heads.base import Draft, Drafter, DraftRequest, StatesHook, register_drafter
from draftsmith.heads.blocks import (
    DecoderBlock,
    SharesTargetParts,
    TargetParts,
    causal_mask,
    int4_target_lm_head,
    lag,
    lead,
    seeded,
    text_config,
)
from draftsmith.heads.state import DraftBuilder, LaggedFeatures, OwnCache, to_target_vocab
from draftsmith.heads.trainable import DraftHead, StepsConfig
from draftsmith.heads.tree import DynamicTree, TreeRows


def unrolled_mask(rows: int, step: int) -> torch.Tensor:
    """(T, (step + 1) T) bool attention mask of unrolled training step `step` over T rows.

    Keys are laid out step by step, T rows each. Row t of step j stands for drafting j tokens
    after position t: it sees step 0's rows up to t (the committed context) and its own row t of
    every step 1 .. j (the draft so far), never another row's draft.
    """
    eye = torch.eye(rows, dtype=torch.bool)
    return torch.cat([causal_mask(rows), *[eye] * step], dim=1)


class FeatureRecurrentHead(SharesTargetParts, DraftHead):
    """A head that runs one decoder block autoregressively on (feature, token) pairs.

    Row t reads `fuse`d target features of position t - 1 and the token at t, and outputs the
    predicted feature of position t (logits: the token at t + 1). Training unrolls `num_steps`
    steps: step j > 0 reads the head's own step j - 1 output at the same row in place of the
    target feature, and the token at t + j, attending as drafting would (`unrolled_mask`). So step
    j at row t predicts the token at t + 1 + j, the alignment convention of `DraftHead`.

    Kinds implement `fuse`, `run_layer` and `logits`; they own `_target`.
    """

    hidden_size: int
    _target: TargetParts | None

    @abstractmethod
    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Target features (..., F) -> (..., H), the stand-in for the head's own output."""

    @abstractmethod
    def run_layer(
        self,
        hidden: torch.Tensor,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        cache=None,
    ) -> torch.Tensor:
        """hidden (B, T, H) and token embeddings (B, T, H) at positions (T,) -> predicted
        features (B, T, H); mask and cache as `blocks.layer_inputs`."""

    @abstractmethod
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Predicted features (B, T, H) -> logits (B, T, V_d) of the next token."""

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def step(
        self,
        hidden: torch.Tensor,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        cache=None,
    ) -> torch.Tensor:
        """One block pass: hidden (B, T, H) (fused target features or the head's own outputs)
        with input_ids (B, T) at positions (T,) -> predicted features (B, T, H)."""
        embeds = self.parts().embeddings(input_ids, self.dtype)
        return self.run_layer(hidden, embeds, positions, mask, cache)

    def unroll(self, features: torch.Tensor, input_ids: torch.Tensor) -> list[torch.Tensor]:
        """features (B, T, F), input_ids (B, T) -> num_steps predicted features, each (B, T, H)."""
        rows = input_ids.shape[1]
        positions = torch.arange(rows, device=input_ids.device)
        hidden = self.fuse(lag(features))
        cache = DynamicCache()  # step j attends to the keys of steps 0 .. j
        outputs = []
        for j in range(self.num_steps):
            mask = unrolled_mask(rows, j)
            hidden = self.step(hidden, lead(input_ids, j), positions + j, mask, cache)
            outputs.append(hidden)
        return outputs

    def predict_features(self, batch: TargetBatch) -> list[torch.Tensor]:
        """The num_steps unrolled predictions (B, T, H) for a training batch."""
        if batch.features is None:
            raise ValueError(f"{self.kind} reads target features: batch.features is None")
        return self.unroll(batch.features, batch.input_ids)

    def forward_train(self, batch: TargetBatch) -> list[torch.Tensor]:
        return self.forward_states(batch)[0]

    @property
    def state_size(self) -> int:
        return self.hidden_size

    def forward_states(self, batch: TargetBatch) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        predicted = self.predict_features(batch)
        return [self.logits(h) for h in predicted], predicted

    def as_drafter(self, target: PreTrainedModel) -> FeatureDrafter:
        self.bind_target(target)
        return FeatureDrafter(self, text_config(target.config).vocab_size)


@dataclass(kw_only=True)
class EagleConfig(StepsConfig):
    """EAGLE-1 head hyper-parameters."""

    num_steps: int = 1
    """Unrolled draft steps trained per position (EAGLE-1 trained 1; more also train the head
    on its own predicted features)."""
    feature_loss_weight: float = 1.0
    """Weight of EAGLE's feature regression (smooth L1) next to the objective; 0: none."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.feature_loss_weight < 0:
            raise ValueError(
                f"feature_loss_weight must not be negative, got {self.feature_loss_weight}"
            )


@register_drafter("eagle")
class EagleHead(FeatureRecurrentHead):
    """EAGLE-1: fc([feature ; embedding]) (2H -> H) -> one decoder layer -> predicted feature,
    whose logits come from the target's LM head.

    The feature is the target's `hidden_states[N]`, which transformers ties to the output of the
    final norm, so the shared final norm is part of the feature and predicted features go
    straight to the LM head. `feature_loss_weight` adds EAGLE's feature regression (smooth L1
    between predicted and target features) as `auxiliary_loss`.
    """

    config_class = EagleConfig
    drafts_on_target_lm_head = True

    def __init__(self, target_config: PretrainedConfig, config: EagleConfig) -> None:
        super().__init__()
        text = text_config(target_config)
        self.config, self.num_steps = config, config.num_steps
        self.hidden_size = text.hidden_size
        self.target_feature_layers = (text.num_hidden_layers,)
        with seeded(config.seed):
            self.fc = nn.Linear(2 * text.hidden_size, text.hidden_size)
            self.block = DecoderBlock(text)
        self._target = None
        self._auxiliary: torch.Tensor | None = None

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        return features.to(self.fc.weight)

    def run_layer(self, hidden, embeds, positions, mask, cache=None) -> torch.Tensor:
        return self.block(self.fc(torch.cat([hidden, embeds], dim=-1)), positions, mask, cache)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.parts().logits(hidden)

    def predict_features(self, batch: TargetBatch) -> list[torch.Tensor]:
        predicted = super().predict_features(batch)
        weight = self.config.feature_loss_weight
        self._auxiliary = self._feature_loss(predicted, batch) if weight else None
        return predicted

    def _feature_loss(self, predicted: list[torch.Tensor], batch: TargetBatch) -> torch.Tensor:
        """Smooth L1 between step j's prediction at row t and the target feature of t + j, over
        the rows whose step-j label is trained on (loss_mask[t + j]), averaged over steps."""
        rows = batch.input_ids.shape[1]
        target = batch.features.to(self.dtype)
        losses = []
        for j, hidden in enumerate(predicted[: rows - 1]):
            mask = batch.loss_mask[:, j:].to(device=hidden.device, dtype=torch.bool)
            error = F.smooth_l1_loss(hidden[:, : rows - j], target[:, j:], reduction="none")
            losses.append(error.mean(-1).where(mask, 0.0).sum() / mask.sum().clamp_min(1))
        return self.config.feature_loss_weight * torch.stack(losses).mean()

    def auxiliary_loss(self) -> torch.Tensor | None:
        return self._auxiliary


class FeatureDrafter(Drafter):
    """Drafts with a `FeatureRecurrentHead`, keeping the block's own KV cache across rounds.

    Each round first runs the rows of the tokens committed since the last round on their real
    target features (the feature before the newest token is the latest there is), then drafts
    autoregressively on predicted features: a chain, or an EAGLE-2 dynamic tree whose nodes of
    one depth run in one step with a tree attention mask. Rows built on predicted features are dropped at the
    end of the round, since the accepted ones are rebuilt from real features next round; so the
    cache only ever holds committed rows and the accepted prefix is never recomputed.
    """

    def __init__(
        self, head: FeatureRecurrentHead, vocab_size: int, int4: bool | None = None
    ) -> None:
        self.head = head.eval()
        prepack(self.head)  # not in the first round, which a policy times
        self.int4 = int4_rows.prepare(self.head, int4)
        self._lm_head = int4_target_lm_head(self.head, int4)
        self._int4_asked = int4  # a fork decides as this drafter did, for both
        self.vocab_size = vocab_size
        self.target_feature_layers = head.target_feature_layers
        self.state_size = head.hidden_size
        self._d2t = head.draft_to_target()
        self._committed: list[int] = []
        self._own = OwnCache()
        self._features = LaggedFeatures(len(head.target_feature_layers) * head.hidden_size)
        self._newest: torch.Tensor | None = None  # (1, 1, H) predicted feature of the newest row
        self._states_hook: StatesHook | None = None
        self._forks: list[FeatureDrafter] = []  # told of a later hook too

    def start(self, prompt_ids: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        self._committed = prompt_ids.tolist()
        self._own.reset()
        self._features.start(target_features, prompt_ids.numel())
        self._newest = None

    def fork(self) -> FeatureDrafter:
        fork = type(self)(self.head, self.vocab_size, self._int4_asked)
        fork.expose_states(self._states_hook)
        self._forks.append(fork)
        return fork

    @contextlib.contextmanager
    def packed_weights(self) -> Iterator[None]:
        """Within the block every head forward of a round, one-row chain steps included, runs
        on packed weights (small-row and 4-bit where prepared)."""
        with (
            small_rows(self.head),
            int4_rows.int4_rows(self.head, self.int4),
            int4_rows.int4_rows(self._lm_head, self._lm_head is not None),
        ):
            yield

    @torch.inference_mode()
    def draft(self, request: DraftRequest) -> Draft:
        with self.packed_weights():
            hidden = self._catch_up()
            committed_rows = len(self._own)
            if request.shape.is_chain:
                draft = self._chain(hidden, DraftBuilder(request, support=self._d2t))
            else:
                tree = DynamicTree.for_request(request, None, self._d2t, self.vocab_size)
                draft = self._tree(hidden, tree)
        # Rows built on predicted features go: accepted ones are rebuilt on real features.
        self._own.keep(committed_rows)
        return draft

    def _chain(self, hidden: torch.Tensor, builder: DraftBuilder) -> Draft:
        while True:
            token = builder.add(self._target_logits(hidden)[0])
            if builder.done:
                return builder.draft()
            position = torch.tensor([len(self._own)])
            hidden = self.head.step(hidden, self._ids([token]), position, None, self._own.kv)
            self._own.extend([token])

    def _tree(self, hidden: torch.Tensor, tree: DynamicTree) -> Draft:
        rows = TreeRows(tree, len(self._own))
        predicted = {-1: hidden[0, -1]}  # node -> the feature its row predicts (H,)

        def expand(nodes: list[int]) -> torch.Tensor:
            positions, visible = rows.add(nodes)
            tokens = [tree.tokens[n] for n in nodes]
            inputs = torch.stack([predicted[tree.parents[n]] for n in nodes])[None]
            out = self.head.step(inputs, self._ids(tokens), positions, visible, self._own.kv)
            logits = self._draft_logits(out)
            self._own.extend(tokens)
            predicted.update({n: out[0, i] for i, n in enumerate(nodes)})
            return logits

        return tree.grow(self._draft_logits(hidden)[0], expand)

    def _catch_up(self) -> torch.Tensor:
        """Run the committed rows not yet cached on their real features; returns the predicted
        feature of the newest row (1, 1, H)."""
        start, stop = len(self._own), len(self._committed)
        if start < stop:
            mask = causal_mask(stop - start, start)
            ids = self._ids(self._committed[start:stop])
            fused = self.head.fuse(self._features.rows(start, stop))[None]
            out = self.head.step(fused, ids, torch.arange(start, stop), mask, self._own.kv)
            self._own.extend(self._committed[start:stop])
            self._features.release(stop)
            self._newest = out[:, -1:]
        return self._newest

    def _ids(self, tokens: list[int]) -> torch.Tensor:
        return torch.tensor([tokens], dtype=torch.long)

    def _target_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Predicted features (1, k, H) -> logits (k, V) over the target vocabulary."""
        return self._draft_logits(hidden, on_target_vocab=True)

    def _draft_logits(self, hidden: torch.Tensor, on_target_vocab: bool = False) -> torch.Tensor:
        """Predicted features (1, k, H) -> logits (k, V_d) over the head's draft vocabulary (the
        target's without a reduced one; a tree ranks its nodes on these columns alone), or (k, V)
        on the target's with on_target_vocab. A states hook sees them on the target's."""
        return self._emit(self.head.logits(hidden)[0].float(), hidden, on_target_vocab)

    def _emit(
        self, logits: torch.Tensor, states: torch.Tensor, on_target_vocab: bool
    ) -> torch.Tensor:
        """`_draft_logits` of draft-vocabulary logits (k, V_d) already computed, behind which
        are states (1, k, state_size), what a states hook sees."""
        if not on_target_vocab and self._states_hook is None:
            return logits
        full = to_target_vocab(logits, self._d2t, self.vocab_size)
        if self._states_hook is not None:
            self._states_hook(full, states[0])
        return full if on_target_vocab else logits

    def acceptance_head(self) -> nn.Module | None:
        """A learned acceptance head trained as part of the head (`DraftHead.own_acceptance`,
        DSpark's confidence head), reading the states `expose_states` hands out; or None."""
        return self.head.own_acceptance()

    def expose_states(self, hook: StatesHook | None) -> None:
        self._states_hook = hook
        for fork in self._forks:
            fork.expose_states(hook)

    def commit(self, tokens: torch.Tensor, target_features: torch.Tensor | None = None) -> None:
        # The cache holds committed rows only (see draft): nothing to roll back.
        self._committed.extend(tokens.tolist())
        self._features.append(target_features, tokens.numel())
