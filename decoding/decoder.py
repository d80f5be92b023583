"""The speculative decoding loop: draft, verify with one target forward, commit, roll back."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from draftsmith.core.sampling import SamplingParams
from draftsmith.core.target import Target
from draftsmith.decoding.policies import CostAwarePolicy, DraftPolicy, RoundOutcome
from draftsmith.decoding.verify import LosslessVerifier, Verifier
from draftsmith.heads.base import Draft, Drafter


@dataclass
class GenerationStats:
    target_forwards: int = 0
    """Target forward passes after the prompt prefill (one per round)."""
    drafted: int = 0
    """Draft tokens proposed (tree nodes)."""
    accepted: int = 0
    """Draft tokens the target accepted."""
    new_tokens: int = 0
    mean_accepted_length: float = 0.0
    """Tokens produced per target forward pass (tau); 1.0 is plain decoding."""
    acceptance_by_position: list[float] = field(default_factory=list)
    """Fraction of drafts reaching depth i + 1 whose accepted path reached it too."""
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    tokens_per_s: float = 0.0

    def record_round(self, draft: Draft, n_accepted: int) -> None:
        self.target_forwards += 1
        self.drafted += len(draft)
        self.accepted += n_accepted
        depth = int(draft.depths.max()) if len(draft) else 0
        grow = depth - len(self.drafted_by_position)
        if grow > 0:
            self.drafted_by_position.extend([0] * grow)
            self.accepted_by_position.extend([0] * grow)
        for i in range(depth):
            self.drafted_by_position[i] += 1
            self.accepted_by_position[i] += i < n_accepted

    def finish(self, new_tokens: int, wall_s: float) -> None:
        self.new_tokens = new_tokens
        self.wall_s = wall_s
        self.tokens_per_s = new_tokens / wall_s if wall_s > 0 else 0.0
        self.mean_accepted_length = new_tokens / max(self.target_forwards, 1)
        self.acceptance_by_position = [
            a / d for a, d in zip(self.accepted_by_position, self.drafted_by_position, strict=True)
        ]

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RoundRecord:
    """What one draft-and-verify round saw, for observers (calibration data collection)."""

    draft: Draft
    target_logits: torch.Tensor
    """(k+1, V) float32 target logits: row 0 after the newest committed token, row 1 + i after
    draft node i."""
    accepted_path: list[int]
    """The draft nodes the target accepted, root first."""
    sampling: SamplingParams

    @property
    def n_accepted(self) -> int:
        return len(self.accepted_path)


RoundHook = Callable[[RoundRecord], None]


@dataclass
class GenerationResult:
    tokens: list[int]
    """The generated token ids (prompt excluded)."""
    text: str | None
    """The decoded generated text, when the decoder has a tokenizer."""
    stats: GenerationStats
    lossy: bool = False
    """True when a lossy verifier produced it: the tokens may differ from the target's own."""


class SpeculativeDecoder:
    """Lossless speculative decoding of a target model with any `Drafter`.

    Each round the drafter proposes a draft tree (a chain is one), the target verifies it in one
    forward with a tree attention mask, and both caches keep the accepted path's rows. Batch size
    1. Greedy output equals the target's greedy output token for token; sampled output
    follows the target's distribution (same temperature / top-k / top-p processing on both sides).
    """

    def __init__(
        self,
        target: PreTrainedModel,
        drafter: Drafter,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        policy: DraftPolicy | None = None,
        verifier: Verifier | None = None,
    ) -> None:
        self.target = target.eval()
        self.drafter = drafter
        self.tokenizer = tokenizer
        self.policy = policy or CostAwarePolicy()
        self.verifier = verifier or LosslessVerifier()
        config = target.config.get_text_config()
        self.vocab_size: int = config.vocab_size
        self.max_positions: int | None = getattr(config, "max_position_embeddings", None)
        if drafter.vocab_size is not None and drafter.vocab_size != self.vocab_size:
            raise ValueError(
                f"the drafter's vocabulary has {drafter.vocab_size} tokens but the target's has "
                f"{self.vocab_size}: a drafter must share the target's tokenizer and vocabulary "
                "(use a draft model from the same family, or train a head on this target)"
            )
        self.eos_token_ids = _eos_token_ids(target)

    @torch.inference_mode()
    def generate(
        self,
        prompt_or_ids: str | Sequence[int] | torch.Tensor,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop_strings: Sequence[str] | None = None,
        on_round: RoundHook | None = None,
    ) -> GenerationResult:
        """Generate up to max_new_tokens after the prompt (a string needs a tokenizer).

        on_round, if given, is called after every verification with a `RoundRecord`.
        """
        sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
        prompt = self._prompt_ids(prompt_or_ids, max_new_tokens)
        if stop_strings and self.tokenizer is None:
            raise ValueError("stop_strings need a tokenizer: pass tokenizer= to SpeculativeDecoder")
        generator = None
        if seed is not None:
            generator = torch.Generator().manual_seed(seed)
        stats = GenerationStats()
        started = time.perf_counter()

        target = Target(self.target, self.drafter.target_feature_layers)
        features = target.extend(prompt[:-1])[1] if prompt.numel() > 1 else None
        self.drafter.start(prompt, features)
        self.policy.start(self.target)
        last_token = int(prompt[-1])
        generated: list[int] = []
        while len(generated) < max_new_tokens:
            round_started = time.perf_counter()
            # A round emits at most draft depth + 1 tokens: draft no deeper than the budget left.
            shape = self.policy.shape().capped(max_new_tokens - len(generated) - 1)
            draft = self.drafter.propose(
                shape, sampling, generator, self.policy.stop_fn(), self.policy.acceptance_fn()
            )
            draft = self.policy.trim(draft)
            draft_s = time.perf_counter() - round_started
            committed = target.length
            # Row 0 is the newest committed token, the tree's root; node i is row 1 + i.
            block = torch.cat([torch.tensor([last_token]), draft.tokens])
            logits, features = target.extend_tree(
                block, torch.cat([torch.tensor([-1]), draft.parents + 1])
            )
            path, next_token = self.verifier(logits, draft, sampling, generator)
            stats.record_round(draft, len(path))
            if on_round is not None:
                on_round(RoundRecord(draft, logits, path, sampling))
            # Keep the root's row and the accepted path's: every committed token but the newest.
            rows = torch.tensor([0, *(1 + i for i in path)])
            target.keep(committed, committed + rows)
            new_tokens = [*draft.tokens[path].tolist(), next_token]
            self.drafter.commit(
                torch.tensor(new_tokens), None if features is None else features[rows]
            )
            generated.extend(new_tokens)
            last_token = next_token
            round_s = time.perf_counter() - round_started
            self.policy.observe(RoundOutcome(draft, path, draft_s, round_s))
            end = self._end_of_generation(generated, len(generated) - len(new_tokens), stop_strings)
            if end is not None:
                del generated[end:]
                break
        del generated[max_new_tokens:]
        stats.finish(len(generated), time.perf_counter() - started)
        text = self.tokenizer.decode(generated) if self.tokenizer is not None else None
        return GenerationResult(tokens=generated, text=text, stats=stats, lossy=self.verifier.lossy)

    def _prompt_ids(
        self, prompt_or_ids: str | Sequence[int] | torch.Tensor, max_new: int
    ) -> torch.Tensor:
        if isinstance(prompt_or_ids, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer: pass tokenizer= or token ids")
            ids = self.tokenizer(prompt_or_ids, return_tensors="pt").input_ids[0]
        else:
            ids = torch.as_tensor(prompt_or_ids, dtype=torch.long).reshape(-1)
        if ids.numel() == 0:
            raise ValueError("the prompt is empty: give at least one token (e.g. the BOS token)")
        if max_new < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new}")
        if int(ids.max()) >= self.vocab_size or int(ids.min()) < 0:
            raise ValueError(f"prompt token ids must lie in [0, {self.vocab_size}) for this target")
        if self.max_positions is not None and ids.numel() + max_new > self.max_positions:
            raise ValueError(
                f"the prompt has {ids.numel()} tokens and max_new_tokens is {max_new}, together "
                f"more than the target's context of {self.max_positions} positions: shorten the "
                "prompt or lower max_new_tokens"
            )
        return ids

    def _end_of_generation(
        self, generated: list[int], first_new: int, stop_strings: Sequence[str] | None
    ) -> int | None:
        """Length to cut generated to if an EOS token or stop string appeared among the new
        tokens (generated[first_new:]), else None."""
        for i in range(first_new, len(generated)):
            if generated[i] in self.eos_token_ids:
                return i + 1
            if stop_strings and _ends_in_stop_string(
                self.tokenizer, generated[: i + 1], stop_strings
            ):
                return i + 1
        return None


def _ends_in_stop_string(
    tokenizer: PreTrainedTokenizerBase, tokens: list[int], stop_strings: Sequence[str]
) -> bool:
    """True when the text of tokens contains a stop string that the last token completed."""
    text = tokenizer.decode(tokens)
    previous = tokenizer.decode(tokens[:-1])
    return any(s in text and s not in previous for s in stop_strings)


def _eos_token_ids(model: PreTrainedModel) -> set[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        return set()
    return {eos} if isinstance(eos, int) else set(eos)
