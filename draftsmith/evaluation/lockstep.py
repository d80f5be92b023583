"""Speculative decoding timed against plain decoding in lockstep, for ``draftsmith bench
--lockstep``: one request decoded both ways in one thread, interleaved round by round, so a slow
spell of a shared machine falls on both alike.

On a host whose speed drifts by tens of percent over seconds, whole generations timed one after
the other leave a ratio a few percent wide even with repeats. Here, after every speculative round,
plain decoding is advanced until it has as many tokens as speculation has committed; each side's
seconds are its own (plain's steps are taken out of speculation's wall time, and run after the
round's own timings, which a policy learns from, were taken).

Plain decoding is the target's forward over its newest token on its own cache, then the argmax
or a sample (`draftsmith.core.sampling`), on the linear layers the decoder runs
(`draftsmith.core.small_rows`): the loop Hugging Face's `generate` runs, without its per-step
bookkeeping, so a ratio here is at most the one against `generate`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from draftsmith.core.cache import cache_argument
from draftsmith.core.sampling import SamplingParams, probabilities, sample
from draftsmith.core.small_rows import small_rows
from draftsmith.decoding.decoder import GenerationResult, SpeculativeDecoder, eos_token_ids
from draftsmith.evaluation.divergence import DivergedBatch


class PlainSteps:
    """Plain decoding of one prompt ids (T,), a token per `step`, each step timed on `clock`
    (the prefill counts too)."""

    def __init__(
        self,
        model: PreTrainedModel,
        ids: torch.Tensor,
        sampling: SamplingParams,
        seed: int,
        clock: Callable[[], float],
    ) -> None:
        self.model, self.sampling, self.clock = model, sampling, clock
        self.generator = torch.Generator().manual_seed(seed)
        self.cache = DynamicCache()
        self._cache_argument = cache_argument(model)
        self._eos = eos_token_ids(model)
        self.tokens: list[int] = []
        self.ended = False
        started = clock()
        self.next_logits = self._forward(ids[None].to(model.device))
        """The next token's logits (V,) float32, from the last forward."""
        self.seconds = clock() - started

    def step(self) -> None:
        """One more token, unless an EOS token ended the output."""
        if self.ended:
            return
        started = self.clock()
        if self.sampling.greedy:
            token = int(self.next_logits.argmax())
        else:
            token = sample(probabilities(self.next_logits, self.sampling), self.generator)
        self.tokens.append(token)
        self.ended = token in self._eos
        if not self.ended:
            self.next_logits = self._forward(torch.tensor([[token]], device=self.model.device))
        self.seconds += self.clock() - started

    def run_to(self, count: int) -> None:
        """Step until the output holds `count` tokens or has ended."""
        while len(self.tokens) < count and not self.ended:
            self.step()

    @torch.inference_mode()
    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (1, n) after the cached positions -> the next token's logits (V,) float32."""
        with small_rows(self.model, ids.numel()):
            out = self.model(
                input_ids=ids,
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_argument: self.cache},
            )
        return out.logits[0, -1].float().cpu()


@dataclass
class LockstepRun:
    """One request decoded speculatively and plainly in lockstep."""

    result: GenerationResult
    seconds: float
    """Speculation's own seconds (plain's steps taken out)."""
    plain: PlainSteps


def run_lockstep(
    decoder: SpeculativeDecoder,
    ids: torch.Tensor,
    max_new_tokens: int,
    sampling: SamplingParams,
    seed: int,
    clock: Callable[[], float],
) -> LockstepRun:
    """Prompt ids (T,) decoded by `decoder` and by plain steps of its target, plain caught up
    to speculation's committed tokens after every round (once the policy has observed it)."""
    plain = PlainSteps(decoder.target, ids, sampling, seed, clock)
    policy = decoder.policy
    observe_round = policy.observe_round
    committed = 0

    def observe_then_catch_up(outcomes) -> None:
        nonlocal committed
        observe_round(outcomes)
        committed += outcomes[0].committed
        plain.run_to(min(committed, max_new_tokens))

    policy.observe_round = observe_then_catch_up
    try:
        started, before = clock(), plain.seconds
        result = decoder.generate(
            ids,
            max_new_tokens=max_new_tokens,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            seed=seed,
        )
        seconds = clock() - started - (plain.seconds - before)
    finally:
        del policy.observe_round  # the class's method again
    plain.run_to(max_new_tokens)
    return LockstepRun(result, seconds, plain)


def replay_plain_steps(
    target: PreTrainedModel, batch: DivergedBatch, position: int
) -> torch.Tensor:
    """The plain loop's own next-token logits (1, V) at `position` of a greedy run: its run
    again, stopped there (the divergence judge's `PlainReplay` under lockstep)."""
    plain = PlainSteps(target, batch.prompts[batch.row], SamplingParams(), 0, lambda: 0.0)
    plain.run_to(position)
    return plain.next_logits[None]
