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
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from draftsmith.core.ragged import left_padded
from draftsmith.core.small_rows import small_rows
from draftsmith.decoding.decoder import (
    GenerationResult,
    SpeculativeDecoder,
    check_context,
    eos_token_ids,
)
from draftsmith.evaluation.divergence import DivergedBatch, DivergenceJudge
from draftsmith.evaluation.report import Aggregate, PromptResult, PromptRun
from draftsmith.evaluation.stats import rotated

logger = logging.getLogger(__name__)

WARMUP_TOKENS = 8
HF_ASSISTED_BATCH = (
    "not run: Hugging Face assisted generation supports batch size 1 only "
    "(its generate raises for a larger batch)"
)


class Benchmark:
    """Runs plain, assisted and speculative generation over prompts on one set of loaded models."""

    def __init__(
        self,
        target: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        decoder: SpeculativeDecoder,
        hf_assist: dict,
        *,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int = 0,
        batch_size: int = 1,
        repeats: int = 1,
    ) -> None:
        if (top_k is not None or top_p is not None) and temperature == 0.0:
            raise ValueError("top_k and top_p shape sampling: give a temperature > 0 with them")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        self.batch_size = batch_size
        self.repeats = repeats
        self.target = target
        self.tokenizer = tokenizer
        self.decoder = decoder
        self.hf_assist = hf_assist
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p
        self.seed = seed
        self._eos = eos_token_ids(target)
        self._judge = DivergenceJudge(target, self._plain_logits, self._pad_id())

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
        groups: dict[str, Aggregate] = defaultdict(Aggregate)
        overall = Aggregate()
        for batch in tqdm(batches, desc="bench" if size == 1 else f"bench (batches of {size})"):
            workloads = [prompts[i]["workload"] for i in batch]
            for result in self._run_batch(batch, workloads, [encoded[i] for i in batch]):
                overall.results.append(result)
                groups[result.workload].results.append(result)
        summary = overall.summary(self.greedy)
        report = {
            "lossy": summary["lossy"],
            "batch_size": size,
            "repeats": self.repeats,
            "overall": summary,
            "workloads": {name: g.summary(self.greedy) for name, g in groups.items()},
            "prompts": [r.record() for r in overall.results],
        }
        if self.hf_assist and size > 1:
            report["hf_assisted"] = HF_ASSISTED_BATCH
        return report

    def _warm_up(self, batch: list[torch.Tensor]) -> None:
        logger.info("warm-up: %d tokens with each method", WARMUP_TOKENS)
        self._plain(batch, WARMUP_TOKENS)
        if self.hf_assist and len(batch) == 1:
            self._assisted(batch[0], WARMUP_TOKENS)
        self._ours(batch, WARMUP_TOKENS)

    def _run_batch(
        self, indices: list[int], workloads: list[str], batch: list[torch.Tensor]
    ) -> list[PromptResult]:
        """Every method on one batch of prompts (token ids (T_b,) each), back to back, `repeats`
        times in rotating order; each method's fastest run is kept."""
        methods = ["plain", "hf", "draftsmith"]
        if not (self.hf_assist and len(batch) == 1):
            methods.remove("hf")
        kept: dict[str, tuple[float, list]] = {}
        for repeat in range(self.repeats):
            for method in rotated(methods, repeat):
                wall_s, runs = self._timed(method, batch)
                if method not in kept or wall_s < kept[method][0]:
                    kept[method] = (wall_s, runs)
        plain = kept["plain"][1]
        hf: list[PromptRun | None] = kept["hf"][1] if "hf" in kept else [None] * len(batch)
        wall_s, outs = kept["draftsmith"]
        wall_s /= len(batch)
        results = []
        for row, (index, workload, plain_run, hf_run, out) in enumerate(
            zip(indices, workloads, plain, hf, outs, strict=True)
        ):
            ours = PromptRun(out.tokens, wall_s)
            result = PromptResult(index, workload, plain_run, hf_run, ours, out.stats, out.lossy)
            # A lossy verifier's departures are its own doing, measured by the exact-match rate.
            if self.greedy and ours.tokens != plain_run.tokens and not out.lossy:
                diverged = DivergedBatch(batch, [run.tokens for run in plain], row)
                result.divergence = self._judge(index, diverged, ours.tokens)
            results.append(result)
        return results

    def _timed(self, method: str, batch: list[torch.Tensor]) -> tuple[float, list]:
        """One run of `method` on the batch, seeded alike: its wall time and its per-row runs
        (`PromptRun`s; `GenerationResult`s for draftsmith)."""
        torch.manual_seed(self.seed)
        started = time.perf_counter()
        if method == "plain":
            runs = self._plain(batch, self.max_new_tokens)
        elif method == "hf":
            runs = [self._assisted(batch[0], self.max_new_tokens)]
        else:
            runs = self._ours(batch, self.max_new_tokens)
        return time.perf_counter() - started, runs

    def _ours(self, batch: list[torch.Tensor], max_new: int) -> list[GenerationResult]:
        """draftsmith on the batch: `generate` for one prompt (which a subclass may observe),
        `generate_batch` for more (row b seeded seed + b)."""
        kwargs = {"max_new_tokens": max_new, "seed": self.seed, **self._sampling_kwargs()}
        if len(batch) == 1:
            return [self.decoder.generate(batch[0], **kwargs)]
        return self.decoder.generate_batch(batch, **kwargs)

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
        started = time.perf_counter()
        out = self._generate_plain(batch, max_new)
        wall_s = (time.perf_counter() - started) / len(batch)
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
        started = time.perf_counter()
        with self._our_kernels():
            out = self.target.generate(
                ids[None],
                attention_mask=torch.ones_like(ids[None]),
                max_new_tokens=max_new,
                **self.hf_assist,
                **self._hf_kwargs(),
            )
        return PromptRun(out[0, ids.numel() :].tolist(), time.perf_counter() - started)

    def _pad_id(self) -> int:
        """Any id: the attention mask hides padding."""
        return self._hf_kwargs()["pad_token_id"] or 0
