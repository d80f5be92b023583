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

import json
import logging
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from draftsmith.core.ragged import left_padded
from draftsmith.core.small_rows import small_rows
from draftsmith.decoding.decoder import (
    GenerationResult,
    GenerationStats,
    SpeculativeDecoder,
    check_context,
    eos_token_ids,
)
from draftsmith.evaluation.divergence import DivergedBatch, DivergenceJudge
from draftsmith.evaluation.stats import rotated, speedup_interval

logger = logging.getLogger(__name__)

WARMUP_TOKENS = 8
HF_ASSISTED_BATCH = (
    "not run: Hugging Face assisted generation supports batch size 1 only "
    "(its generate raises for a larger batch)"
)


@dataclass
class PromptRun:
    """One method's output for one prompt."""

    tokens: list[int]
    wall_s: float


@dataclass
class PromptResult:
    index: int
    workload: str
    plain: PromptRun
    hf: PromptRun | None
    """None when the drafter has no Hugging Face counterpart."""
    draftsmith: PromptRun
    stats: GenerationStats
    lossy: bool = False
    """A lossy verifier made draftsmith's output."""
    divergence: dict | None = None

    def timings(self) -> dict:
        """{"tokens": {method: n}, "seconds": {method: s}} of the methods that ran."""
        runs = {"plain": self.plain, "hf": self.hf, "draftsmith": self.draftsmith}
        runs = {name: run for name, run in runs.items() if run is not None}
        return {
            "tokens": {name: len(run.tokens) for name, run in runs.items()},
            "seconds": {name: run.wall_s for name, run in runs.items()},
        }

    def record(self) -> dict:
        """The prompt's own figures, for the report's per-prompt list."""
        forwards = max(self.stats.target_forwards, 1)
        return {
            "index": self.index,
            "workload": self.workload,
            **self.timings(),
            "mean_accepted_length": self.stats.new_tokens / forwards,
            "identical_to_plain": self.draftsmith.tokens == self.plain.tokens,
        }


@dataclass
class Aggregate:
    """Totals for a group of prompts, turned into the report's keys by `summary`."""

    results: list[PromptResult] = field(default_factory=list)

    def summary(self, greedy: bool) -> dict:
        def tok_s(method: str) -> float | None:
            runs = [getattr(r, method) for r in self.results]
            if any(run is None for run in runs):
                return None
            return sum(len(run.tokens) for run in runs) / sum(run.wall_s for run in runs)

        drafted, accepted = _position_counts([r.stats for r in self.results])
        forwards = sum(r.stats.target_forwards for r in self.results)
        new_tokens = sum(r.stats.new_tokens for r in self.results)
        divergences = [r.divergence for r in self.results if r.divergence is not None]
        lossy = any(r.lossy for r in self.results)
        plain, hf, ours = tok_s("plain"), tok_s("hf"), tok_s("draftsmith")
        timings = [r.timings() for r in self.results]
        return {
            "n_prompts": len(self.results),
            "plain_tok_s": plain,
            "hf_tok_s": hf,
            "draftsmith_tok_s": ours,
            "speedup_vs_plain": ours / plain,
            "speedup_vs_hf": None if hf is None else ours / hf,
            "hf_speedup_vs_plain": None if hf is None else hf / plain,
            "speedup_vs_plain_interval": speedup_interval(timings, "draftsmith"),
            "speedup_vs_hf_interval": (
                None if hf is None else speedup_interval(timings, "draftsmith", "hf")
            ),
            "hf_speedup_vs_plain_interval": None if hf is None else speedup_interval(timings, "hf"),
            "mean_accepted_length": new_tokens / max(forwards, 1),
            "mean_draft_size": sum(r.stats.drafted for r in self.results) / max(forwards, 1),
            "acceptance_by_position": [a / d for a, d in zip(accepted, drafted, strict=True)],
            "lossy": lossy,
            "identical_to_plain": (not divergences) if greedy and not lossy else None,
            "exact_match_rate": (
                sum(r.draftsmith.tokens == r.plain.tokens for r in self.results) / len(self.results)
                if greedy
                else None
            ),
            "hf_identical_to_plain": (
                all(r.hf.tokens == r.plain.tokens for r in self.results)
                if greedy and hf is not None
                else None
            ),
            "divergences": divergences,
            "unexplained_divergences": [d for d in divergences if not d["explained"]],
        }


def _position_counts(stats: list[GenerationStats]) -> tuple[list[int], list[int]]:
    width = max((len(s.drafted_by_position) for s in stats), default=0)
    drafted, accepted = [0] * width, [0] * width
    for s in stats:
        for i, (d, a) in enumerate(zip(s.drafted_by_position, s.accepted_by_position, strict=True)):
            drafted[i] += d
            accepted[i] += a
    return drafted, accepted


BUNDLED_PROMPTS = "bench_prompts.jsonl"


def bundled_prompts() -> Path:
    """The prompt set shipped with the package (code, chat and prose)."""
    return Path(str(resources.files("draftsmith.evaluation") / BUNDLED_PROMPTS))


def load_prompts(path: str | Path, limit: int | None = None) -> list[dict]:
    """Read a jsonl of {"prompt": str, "workload": str (optional)} records."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"prompt file {path} does not exist: give a jsonl with 'prompt' fields"
        )
    records = []
    for line_no, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{line_no}: not a JSON record ({error})") from None
        prompt = record.get("prompt") if isinstance(record, dict) else None
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(f"{path}:{line_no}: each line needs a non-empty string 'prompt'")
        records.append({"prompt": prompt, "workload": record.get("workload", "default")})
    if not records:
        raise ValueError(f"prompt file {path} holds no prompts")
    return records[:limit] if limit else records


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


def format_table(report: dict) -> str:
    """A readable table of the report, one row per workload and one overall."""
    header = (
        f"{'workload':<10} {'n':>3} {'plain tok/s':>11} {'HF tok/s':>9} {'ours tok/s':>10} "
        f"{'vs plain':>8} {'vs HF':>6} {'HF/plain':>8} {'tau':>5} {'identical':>9}"
    )
    rows = [header, "-" * len(header)]
    if report.get("lossy"):
        rows.insert(0, "LOSSY verification: outputs may differ from the target's own")
    named = [*report["workloads"].items(), ("overall", report["overall"])]
    for name, s in named:
        identical = s["identical_to_plain"]
        if identical is False and not s["unexplained_divergences"]:
            identical = "rounding"
        if s["lossy"]:
            match = s["exact_match_rate"]
            identical = "lossy" if match is None else f"lossy {match:.0%}"
        rows.append(
            f"{name:<10} {s['n_prompts']:>3} {s['plain_tok_s']:>11.2f} "
            f"{_number(s['hf_tok_s'], 9, '.2f')} "
            f"{s['draftsmith_tok_s']:>10.2f} {s['speedup_vs_plain']:>7.2f}x "
            f"{_number(s['speedup_vs_hf'], 6, '.2f', 'x')} "
            f"{_number(s['hf_speedup_vs_plain'], 8, '.2f', 'x')} "
            f"{s['mean_accepted_length']:>5.2f} {str(identical):>9}"
        )
    return "\n".join(rows)


def _number(value: float | None, width: int, spec: str, unit: str = "") -> str:
    """value formatted right-aligned in width characters, or "-" when there is none."""
    text = "-" if value is None else f"{value:{spec}}{unit}"
    return f"{text:>{width}}"
