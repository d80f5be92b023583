"""The speculative decoding loop: draft, verify with one target forward, commit, roll back."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from draftsmith.core.context import ContextIndex
from draftsmith.core.parallel import shards_agree
from draftsmith.core.ragged import RaggedTarget
from draftsmith.core.sampling import SamplingParams
from draftsmith.core.small_rows import prepack, small_rows
from draftsmith.core.tree import chain_parents
from draftsmith.decoding.policies import CostAwarePolicy, DraftPolicy, RequestSize, RoundOutcome
from draftsmith.decoding.results import (
    CommitHook,
    GenerationResult,
    GenerationStats,
    RoundHook,
    RoundRecord,
)
from draftsmith.decoding.verify import LosslessVerifier, Verifier
from draftsmith.heads.base import Draft, Drafter, DraftRequest, RowDrafters, raw_acceptance


class SpeculativeDecoder:
    """Lossless speculative decoding of a target model with any `Drafter`.

    Each round the drafter proposes a draft tree (a chain is one), the target verifies it in one
    forward with a tree attention mask, and both caches keep the accepted path's rows. A batch of
    prompts (`generate_batch`) runs every row's draft in that one forward, each row accepting its
    own number of tokens. Greedy output equals the target's greedy output token for token; sampled output
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
        clock: Callable[[], float] = time.perf_counter,
        eos_tokens: Iterable[int] | None = None,
    ) -> None:
        """clock: seconds, read to time each round for the policy and each output's stats (a
        fake one, given to the policy too, makes what the policy decides deterministic in
        tests); the default policy shares it. eos_tokens: the token ids that end a generation
        (None: those of the target's generation config)."""
        self.target = target.eval()
        self.drafter = drafter
        self.tokenizer = tokenizer
        self.clock = clock
        self.policy = policy or CostAwarePolicy(clock=clock)
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
        self.eos_token_ids = eos_token_ids(target) if eos_tokens is None else set(eos_tokens)
        self._forks: list[Drafter] = []
        prepack(target)  # not in the first round, which the policy times

    def generate(
        self,
        prompt_or_ids: str | Sequence[int] | torch.Tensor,
        max_new_tokens: int = 128,
        **options,
    ) -> GenerationResult:
        """Generate up to max_new_tokens after the prompt (a string needs a tokenizer):
        `generate_batch` of one prompt, with its options (temperature, top_k, top_p, seed,
        stop_strings, on_round, on_commit)."""
        return self.generate_batch([prompt_or_ids], max_new_tokens, **options)[0]

    @torch.inference_mode()
    def generate_batch(
        self,
        prompts: Sequence[str | Sequence[int] | torch.Tensor],
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop_strings: Sequence[str] | None = None,
        on_round: RoundHook | None = None,
        on_commit: CommitHook | None = None,
    ) -> list[GenerationResult]:
        """Generate up to max_new_tokens after each prompt, all rows verified in one target
        forward per round; one result per prompt, in order. A string prompt needs a tokenizer;
        on_round, if given, is called after every verification with a `RoundRecord`; on_commit,
        if given, with each row's index and the tokens it committed that round, once they are
        final (cut at an EOS token, a stop string or max_new_tokens): a stream of the output.

        Each row drafts with its own drafter (`Drafter.fork` of this decoder's, or one forward
        for every row's chain where the kind can: `Drafter.chain_batch`) and accepts its own
        number of tokens per round; a row that finished drops out of the batch. The policy is
        the batch's: one `shape` per round for every row (each row's chain may stop early by its
        own `stop_fn`), and the round's outcomes, one per row with the round's timings, go to
        `observe_round` together. Row b samples from its own generator seeded `seed + b`, so its
        output is the one `generate` gives that prompt alone with that seed (greedy: always).
        on_round sees every row's `RoundRecord` (with its row index).
        """
        if not prompts:
            raise ValueError("generate_batch needs at least one prompt")
        sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
        names = (
            ["the prompt"] if len(prompts) == 1 else [f"prompt {i}" for i in range(len(prompts))]
        )
        ids = [
            self._prompt_ids(p, max_new_tokens, name)
            for p, name in zip(prompts, names, strict=True)
        ]
        if stop_strings and self.tokenizer is None:
            raise ValueError("stop_strings need a tokenizer: pass tokenizer= to SpeculativeDecoder")
        rows = [
            _Row(i, _row_generator(seed, i), int(prompt[-1]), ContextIndex(prompt.tolist()))
            for i, prompt in enumerate(ids)
        ]
        # One block of draftsmith's linear layers for the whole generation: finding the layers
        # to swap again for every forward would cost each round time a plain step does not pay.
        with small_rows(self.target):
            self._rounds(rows, ids, max_new_tokens, sampling, stop_strings, on_round, on_commit)
        return [self._result(row) for row in rows]

    def _rounds(
        self,
        rows: list[_Row],
        ids: list[torch.Tensor],
        max_new_tokens: int,
        sampling: SamplingParams,
        stop_strings: Sequence[str] | None,
        on_round: RoundHook | None,
        on_commit: CommitHook | None,
    ) -> None:
        """Prefill the prompts ids, then draft and verify round after round until every row
        finished."""
        started = self.clock()
        drafters = self._row_drafters(len(rows))
        target = RaggedTarget(self.target, self.drafter.target_feature_layers, len(rows))
        _prefill(target, ids, drafters)
        self.policy.start(
            self.target, RequestSize(tuple(prompt.numel() for prompt in ids), max_new_tokens)
        )
        active = rows
        while active:
            round_started = self.clock()
            drafts = self._drafts(drafters, active, max_new_tokens, sampling)
            draft_s = self.clock() - round_started
            paths = self._verify(target, drafters, active, drafts, sampling, stop_strings, on_round)
            round_s = self.clock() - round_started
            draft_s, round_s = shards_agree(self.target, [draft_s, round_s])
            self.policy.observe_round(
                [
                    RoundOutcome(draft, path, draft_s, round_s)
                    for draft, path in zip(drafts, paths, strict=True)
                ]
            )
            still = [
                b
                for b, row in enumerate(active)
                if not row.finish(max_new_tokens, started, self.clock)
            ]
            if on_commit is not None:
                for row in active:
                    on_commit(row.index, row.generated[row.streamed :])
                    row.streamed = len(row.generated)
            if len(still) < len(active):
                active = [active[b] for b in still]
                if active:
                    target.select(still)  # a finished row costs no more drafts or verification
                    drafters.select([row.index for row in active])

    def _drafts(
        self, drafters: RowDrafters, active: list[_Row], max_new: int, sampling: SamplingParams
    ) -> list[Draft]:
        """Each active row's draft of the policy's shape this round, trimmed by the policy."""
        shape = self.policy.shape(rows=len(active), lockstep=drafters.lockstep)
        acceptance = self.policy.acceptance_fn() or raw_acceptance
        # A round emits at most draft depth + 1 tokens: draft no deeper than the budget left.
        # Each row gets its own stop rules: they follow that row's chain or tree.
        requests = [
            DraftRequest(
                shape.capped(max_new - len(row.generated) - 1),
                sampling,
                row.generator,
                self.policy.stop_fn(),
                acceptance,
                self.policy.tree_stop_fn(),
                row.context,
            )
            for row in active
        ]
        drafts = drafters.propose(
            [row.index for row in active], requests, self.policy.round_stop_fn()
        )
        return self.policy.trim_round(drafts)

    def _verify(
        self,
        target: RaggedTarget,
        drafters: RowDrafters,
        active: list[_Row],
        drafts: list[Draft],
        sampling: SamplingParams,
        stop_strings: Sequence[str] | None,
        on_round: RoundHook | None,
    ) -> list[list[int]]:
        """Verify every active row's draft in one target forward, commit what each accepted to
        the target's cache, its drafter and its output; returns each row's accepted path."""
        # Row 0 of a block is the newest committed token, the tree's root; node i is row 1 + i.
        roots = [torch.tensor([row.last_token]) for row in active]
        logits, features = target.extend(
            [torch.cat([root, d.tokens]) for root, d in zip(roots, drafts, strict=True)],
            [torch.cat([torch.tensor([-1]), d.parents + 1]) for d in drafts],
        )
        verified = [
            self.verifier(row_logits, draft, sampling, row.generator)
            for row, row_logits, draft in zip(active, logits, drafts, strict=True)
        ]
        # Keep the root's row and the accepted path's: every committed token but the newest.
        kept = [[0, *(1 + i for i in path)] for path, _ in verified]
        target.keep(kept)
        for row, draft, (path, next_token), row_logits, row_features, row_kept in zip(
            active, drafts, verified, logits, features, kept, strict=True
        ):
            row.stats.record_round(draft, len(path))
            if on_round is not None:
                on_round(RoundRecord(draft, row_logits, path, sampling, row.index))
            new_tokens = [*draft.tokens[path].tolist(), next_token]
            drafters.commit(
                row.index,
                torch.tensor(new_tokens),
                None if row_features is None else row_features[row_kept],
            )
            row.generated.extend(new_tokens)
            row.context.extend(new_tokens)
            row.last_token = next_token
            row.end = self._end_of_generation(
                row.generated, len(row.generated) - len(new_tokens), stop_strings
            )
        return [path for path, _ in verified]

    def _result(self, row: _Row) -> GenerationResult:
        text = self.tokenizer.decode(row.generated) if self.tokenizer is not None else None
        return GenerationResult(
            tokens=row.generated, text=text, stats=row.stats, lossy=self.verifier.lossy
        )

    def _row_drafters(self, count: int) -> RowDrafters:
        """The drafters of `count` rows: all drafting together where the drafter's kind can
        (`Drafter.chain_batch`: chains, and trees expanding one node a depth); else this
        decoder's drafter and count - 1 forks of it, made once and kept for later batches."""
        if count > 1 and self.policy.largest.width == 1:
            together = self.drafter.chain_batch(count)
            if together is not None:
                return together
        while len(self._forks) < count - 1:
            self._forks.append(self.drafter.fork())
        return RowDrafters([self.drafter, *self._forks[: count - 1]])

    def _prompt_ids(
        self, prompt_or_ids: str | Sequence[int] | torch.Tensor, max_new: int, name: str
    ) -> torch.Tensor:
        if isinstance(prompt_or_ids, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer: pass tokenizer= or token ids")
            ids = self.tokenizer(prompt_or_ids, return_tensors="pt").input_ids[0]
        else:
            ids = torch.as_tensor(prompt_or_ids, dtype=torch.long).reshape(-1)
        if ids.numel() == 0:
            raise ValueError(f"{name} is empty: give at least one token (e.g. the BOS token)")
        if max_new < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new}")
        if int(ids.max()) >= self.vocab_size or int(ids.min()) < 0:
            raise ValueError(
                f"{name}'s token ids must lie in [0, {self.vocab_size}) for this target"
            )
        apart = "" if name == "the prompt" else ", decode it apart from this batch,"
        fix = f"shorten {name}{apart} or lower max_new_tokens"
        check_context(self.max_positions, ids.numel(), max_new, name, fix)
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


@dataclass
class _Row:
    """One prompt's decoding state in a batch."""

    index: int
    generator: torch.Generator | None
    last_token: int
    context: ContextIndex
    """The prompt's and the output's n-grams, for the drafts' `context_match` signal."""
    generated: list[int] = field(default_factory=list)
    stats: GenerationStats = field(default_factory=GenerationStats)
    streamed: int = 0
    """Output tokens handed to the commit hook so far."""
    end: int | None = None
    """Where an EOS token or stop string cut the output, once one appeared."""

    def finish(self, max_new_tokens: int, started: float, clock: Callable[[], float]) -> bool:
        """True, with the output cut and the stats final (timed since `started` on `clock`),
        once the row is done."""
        if self.end is None and len(self.generated) < max_new_tokens:
            return False
        del self.generated[min(self.end or max_new_tokens, max_new_tokens) :]
        self.stats.finish(len(self.generated), clock() - started)
        return True


def _row_generator(seed: int | None, row: int) -> torch.Generator | None:
    return None if seed is None else torch.Generator().manual_seed(seed + row)


def _prefill(target: RaggedTarget, ids: list[torch.Tensor], drafters: RowDrafters) -> None:
    """Run every prompt but its last token through the target (the last opens the first round)
    and start each row's drafter on its prompt and those features."""
    features = [None] * len(ids)
    if max(p.numel() for p in ids) > 1:
        _, features = target.extend(
            [p[:-1] for p in ids], [chain_parents(p.numel() - 1) for p in ids], logits="none"
        )
        target.keep([range(p.numel() - 1) for p in ids])
    for row, (prompt, row_features) in enumerate(zip(ids, features, strict=True)):
        drafters.start(row, prompt, row_features if prompt.numel() > 1 else None)


def check_context(
    max_positions: int | None, length: int, max_new: int, name: str, fix: str
) -> None:
    """Raise a ValueError naming the prompt (name) and the fix unless its length tokens and
    max_new generated ones fit in the target's context of max_positions (None: no limit)."""
    if max_positions is not None and length + max_new > max_positions:
        raise ValueError(
            f"{name} has {length} tokens and max_new_tokens is {max_new}, together more than "
            f"the target's context of {max_positions} positions: {fix}"
        )


def _ends_in_stop_string(
    tokenizer: PreTrainedTokenizerBase, tokens: list[int], stop_strings: Sequence[str]
) -> bool:
    """True when the text of tokens contains a stop string that the last token completed."""
    text = tokenizer.decode(tokens)
    previous = tokenizer.decode(tokens[:-1])
    return any(s in text and s not in previous for s in stop_strings)


def eos_token_ids(model: PreTrainedModel) -> set[int]:
    """The token ids that end a generation in model's generation config."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        return set()
    return {eos} if isinstance(eos, int) else set(eos)
