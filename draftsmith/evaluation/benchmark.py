"""Side-by-side benchmark: plain `generate`, Hugging Face assisted generation and draftsmith.

Every prompt runs all three methods back to back on the same loaded models (interleaved, after a
warm-up), so machine noise hits them alike; results are reported as ratios. With repeats above 1,
every prompt runs every method that many times, the methods' order rotating each time
(`stats.rotated`), and each method's fastest run counts (other work on a shared machine only ever
adds time); each ratio comes with a 90% bootstrap interval over the prompts
(`stats.speedup_interval`). With a batch size
above 1, prompts run in batches of that many: plain `generate` on the left-padded batch and
`SpeculativeDecoder.generate_batch`, each batch's time split evenly among its prompts; Hugging
Face assisted generation decodes one sequence only, so it is not run (the report says so). A drafter without a
Hugging Face counterpart (empty `hf_assist`, e.g. a trained head) skips assisted generation and
reports its figures as null ("-" in the table). A greedy divergence from plain `generate` is
judged rounding or a fault by `draftsmith.evaluation.divergence` (a float32 re-score against the
run's error over the forward shapes that position is computed in, plain `generate` itself
replayed among them).

Several draft policies run side by side when `decoder` is a dict of named decoders (``draftsmith
bench --policy A B ...``): each is a method of its own in the same rotation, and the report holds
each one's figures under ``policies`` (`report.method_summaries`), the per-prompt list one
record per prompt and policy. With ``lockstep``, each policy is timed against plain decoding
interleaved round by round within each request (`draftsmith.evaluation.lockstep`), the policies
rotating; Hugging Face assisted generation, which cannot be interleaved, is not run.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from draftsmith.core.ragged import left_padded
from draftsmith.core.sampling import SamplingParams
from draftsmith.core.small_rows import small_rows
from draftsmith.decoding.decoder import (
    GenerationResult,
    SpeculativeDecoder,
    check_context,
    eos_token_ids,
)
from draftsmith.evaluation.divergence import DivergedBatch, DivergenceJudge
from draftsmith.evaluation.lockstep import replay_plain_steps, run_lockstep
from draftsmith.evaluation.report import PromptResult, PromptRun, method_summaries
from draftsmith.evaluation.stats import rotated

logger = logging.getLogger(__name__)

WARMUP_TOKENS = 8
HF_ASSISTED_BATCH = (
    "not run: Hugging Face assisted generation supports batch size 1 only "
    "(its generate raises for a larger batch)"
)
HF_ASSISTED_LOCKSTEP = (
    "not run: under lockstep each policy is timed against plain decoding interleaved round by "
    "round, which Hugging Face assisted generation cannot be"
)
LOCKSTEP = (
    "plain is the target's one-token loop interleaved round by round with each policy's "
    "decoding of the same request, each side timed apart: each policy's speedup is over its own "
    "plain run"
)


class Benchmark:
    """Runs plain, assisted and speculative generation over prompts on one set of loaded models."""

    def __init__(
        self,
        target: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        decoder: SpeculativeDecoder | dict[str, SpeculativeDecoder],
        hf_assist: dict,
        *,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int = 0,
        batch_size: int = 1,
        repeats: int = 1,
        lockstep: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """decoder: draftsmith's decoder, reported as ``draftsmith``, or named decoders (one per
        draft policy) reported side by side under their names; lockstep: time each against
        plain decoding interleaved round by round (batch size 1); clock: seconds, read to time
        every run."""
        if (top_k is not None or top_p is not None) and temperature == 0.0:
            raise ValueError("top_k and top_p shape sampling: give a temperature > 0 with them")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        if lockstep and batch_size > 1:
            raise ValueError(
                "lockstep interleaves one request's rounds with plain decoding: batch size 1 only"
            )
        self.side_by_side = isinstance(decoder, dict)
        self.decoders = dict(decoder) if self.side_by_side else {"draftsmith": decoder}
        if not self.decoders:
            raise ValueError("no decoder to benchmark: give at least one")
        if {"plain", "hf"} & set(self.decoders):
            raise ValueError("plain and hf name the baselines: name the decoders otherwise")
        self.decoder = next(iter(self.decoders.values()))
        self.batch_size = batch_size
        self.repeats = repeats
        self.lockstep = lockstep
        self.clock = clock
        self.target = target
        self.tokenizer = tokenizer
        self.hf_assist = hf_assist
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p
        self.seed = seed
        self._eos = eos_token_ids(target)
        replay = functools.partial(replay_plain_steps, target) if lockstep else self._plain_logits
        self._judge = DivergenceJudge(target, replay, self._pad_id())

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def run(self, prompts: list[dict]) -> dict:
        encoded = [self.tokenizer(p["prompt"], return_tensors="pt").input_ids[0] for p in prompts]
        positions = getattr(self.target.config.get_text_config(), "max_position_embeddings", None)
        for index, ids in enumerate(encoded):  # before any method runs, whatever its batch
            fix = "shorten the prompt, drop it from the prompt file, or lower --max-new-tokens"
            check_context(positions, ids.numel(), self.max_new_tokens, f"prompt {index}", fix)
        size = self.batch_size
        batches = [
            list(range(i, min(i + size, len(prompts)))) for i in range(0, len(prompts), size)
        ]
        self._warm_up([encoded[i] for i in batches[0]])
        results: list[tuple[str, PromptResult]] = []
        for batch in tqdm(batches, desc="bench" if size == 1 else f"bench (batches of {size})"):
            workloads = [prompts[i]["workload"] for i in batch]
            results += self._run_batch(batch, workloads, [encoded[i] for i in batch])
        by_method = {
            name: method_summaries([r for n, r in results if n == name], self.greedy)
            for name in self.decoders
        }
        report: dict = {
            "lossy": any(s["overall"]["lossy"] for s in by_method.values()),
            "batch_size": size,
            "repeats": self.repeats,
        }
        if self.side_by_side:
            report["policies"] = by_method
            report["prompts"] = [{**r.record(), "policy": name} for name, r in results]
        else:
            report.update(by_method["draftsmith"])
            report["prompts"] = [r.record() for _, r in results]
        if self.lockstep:
            report["lockstep"] = LOCKSTEP
        if self.hf_assist and (size > 1 or self.lockstep):
            report["hf_assisted"] = HF_ASSISTED_LOCKSTEP if self.lockstep else HF_ASSISTED_BATCH
        return report

    def methods(self, rows: int) -> list[str]:
        """The methods a batch of `rows` prompts runs, in its first repeat's order: plain,
        assisted (one prompt, with a Hugging Face counterpart) and each decoder; under lockstep
        the decoders alone, each with plain decoding inside its run."""
        if self.lockstep:
            return list(self.decoders)
        hf = ["hf"] if self.hf_assist and rows == 1 else []
        return ["plain", *hf, *self.decoders]

    def _warm_up(self, batch: list[torch.Tensor]) -> None:
        logger.info("warm-up: %d tokens with each method", WARMUP_TOKENS)
        for method in self.methods(len(batch)):
            if self.lockstep:
                self._lockstep(method, batch, WARMUP_TOKENS)
            else:
                self._run(method, batch, WARMUP_TOKENS)

    def _run_batch(
        self, indices: list[int], workloads: list[str], batch: list[torch.Tensor]
    ) -> list[tuple[str, PromptResult]]:
        """Every method on one batch of prompts (token ids (T_b,) each), back to back, `repeats`
        times in rotating order; each method's fastest run is kept (under lockstep, each
        decoder's and its plain run's apart). Returns (decoder name, result) per prompt and
        decoder, prompt by prompt."""
        kept: dict[str | tuple[str, str], tuple[float, list]] = {}

        def keep(key: str | tuple[str, str], wall_s: float, runs: list) -> None:
            if key not in kept or wall_s < kept[key][0]:
                kept[key] = (wall_s, runs)

        for repeat in range(self.repeats):
            for method in rotated(self.methods(len(batch)), repeat):
                if self.lockstep:
                    ours, plain = self._lockstep(method, batch, self.max_new_tokens)
                    keep(method, *ours)
                    keep(("plain", method), *plain)
                else:
                    keep(method, *self._timed(method, batch))
        hf: list[PromptRun | None] = kept["hf"][1] if "hf" in kept else [None] * len(batch)
        results = []
        for row, (index, workload) in enumerate(zip(indices, workloads, strict=True)):
            for name in self.decoders:
                plain = kept[("plain", name) if self.lockstep else "plain"][1]
                wall_s, outs = kept[name]
                out = outs[row]
                ours = PromptRun(out.tokens, wall_s / len(batch))
                result = PromptResult(
                    index, workload, plain[row], hf[row], ours, out.stats, out.lossy
                )
                # A lossy verifier's departures are its own doing, measured by the exact-match
                # rate.
                if self.greedy and ours.tokens != plain[row].tokens and not out.lossy:
                    diverged = DivergedBatch(batch, [run.tokens for run in plain], row)
                    result.divergence = self._judge(index, diverged, ours.tokens)
                results.append((name, result))
        return results

    def _timed(self, method: str, batch: list[torch.Tensor]) -> tuple[float, list]:
        """One run of `method` on the batch, seeded alike: its wall time and its per-row runs
        (`PromptRun`s; `GenerationResult`s for a decoder)."""
        torch.manual_seed(self.seed)
        started = self.clock()
        runs = self._run(method, batch, self.max_new_tokens)
        return self.clock() - started, runs

    def _run(self, method: str, batch: list[torch.Tensor], max_new: int) -> list:
        if method == "plain":
            return self._plain(batch, max_new)
        if method == "hf":
            return [self._assisted(batch[0], max_new)]
        return self._ours(self.decoders[method], batch, max_new)

    def _lockstep(
        self, name: str, batch: list[torch.Tensor], max_new: int
    ) -> tuple[tuple[float, list[GenerationResult]], tuple[float, list[PromptRun]]]:
        """Decoder `name` and plain decoding on the batch's one prompt in lockstep, seeded
        alike: (its seconds, [its result]) and (plain's seconds, [plain's run])."""
        torch.manual_seed(self.seed)
        sampling = SamplingParams(**self._sampling_kwargs())
        run = run_lockstep(self.decoders[name], batch[0], max_new, sampling, self.seed, self.clock)
        plain = PromptRun(run.plain.tokens, run.plain.seconds)
        return (run.seconds, [run.result]), (plain.wall_s, [plain])

    def _ours(
        self, decoder: SpeculativeDecoder, batch: list[torch.Tensor], max_new: int
    ) -> list[GenerationResult]:
        """A decoder on the batch: `generate` for one prompt (which a subclass may observe),
        `generate_batch` for more (row b seeded seed + b)."""
        kwargs = {"max_new_tokens": max_new, "seed": self.seed, **self._sampling_kwargs()}
        if len(batch) == 1:
            return [decoder.generate(batch[0], **kwargs)]
        return decoder.generate_batch(batch, **kwargs)

    def _sampling_kwargs(self) -> dict:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}

    def _hf_kwargs(self) -> dict:
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = self.tokenizer.eos_token_id
        kwargs = {"pad_token_id": pad}
        if self.greedy:
            return {**kwargs, "do_sample": False}
        return {
            **kwargs,
            "do_sample": True,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
        }

    @torch.inference_mode()
    def _plain(self, batch: list[torch.Tensor], max_new: int) -> list[PromptRun]:
        """Plain `generate` of the target on the batch, left-padded; each row cut after its first
        EOS token (where a batch pads the rows that finished), the time split evenly."""
        started = self.clock()
        out = self._generate_plain(batch, max_new)
        wall_s = (self.clock() - started) / len(batch)
        width = max(ids.numel() for ids in batch)
        return [PromptRun(self._until_eos(row[width:].tolist()), wall_s) for row in out]

    def _plain_logits(self, batch: DivergedBatch, position: int) -> torch.Tensor:
        """Plain `generate`'s own next-token logits (1, V) for the batch's diverging row at
        `position`: `_plain`'s call again, stopped after that step."""
        out = self._generate_plain(
            batch.prompts, position + 1, output_logits=True, return_dict_in_generate=True
        )
        return out.logits[position][batch.row][None]

    def _generate_plain(self, batch: list[torch.Tensor], max_new: int, **options):
        """`generate` on the batch, left-padded, on draftsmith's kernels."""
        input_ids, attention_mask = left_padded(batch, self._pad_id())
        with self._our_kernels():
            return self.target.generate(
                input_ids.to(self.target.device),
                attention_mask=attention_mask.to(self.target.device),
                max_new_tokens=max_new,
                **self._hf_kwargs(),
                **options,
            )

    @contextmanager
    def _our_kernels(self) -> Iterator[None]:
        """Hugging Face's methods run on the linear layers draftsmith's decoder runs
        (`small_rows`), so the ratios measure speculation, not kernels."""
        with ExitStack() as stack:
            for model in (self.target, self.hf_assist.get("assistant_model")):
                if model is not None:
                    stack.enter_context(small_rows(model))
            yield

    def _until_eos(self, tokens: list[int]) -> list[int]:
        end = next((i + 1 for i, t in enumerate(tokens) if t in self._eos), len(tokens))
        return tokens[:end]

    @torch.inference_mode()
    def _assisted(self, ids: torch.Tensor, max_new: int) -> PromptRun:
        """Hugging Face's own speculative decoding with the drafter's counterpart."""
        started = self.clock()
        with self._our_kernels():
            out = self.target.generate(
                ids[None],
                attention_mask=torch.ones_like(ids[None]),
                max_new_tokens=max_new,
                **self.hf_assist,
                **self._hf_kwargs(),
            )
        return PromptRun(out[0, ids.numel() :].tolist(), self.clock() - started)

    def _pad_id(self) -> int:
        """Any id: the attention mask hides padding."""
        return self._hf_kwargs()["pad_token_id"] or 0
