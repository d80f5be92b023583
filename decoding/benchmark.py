"""Side-by-side benchmark: plain `generate`, Hugging Face assisted generation and draftsmith.

Every prompt runs all three methods back to back on the same loaded models (interleaved, after a
warm-up), so machine noise hits them alike; results are reported as ratios. A drafter without a
Hugging Face counterpart (empty `hf_assist`, e.g. a trained head) skips assisted generation and
reports its figures as null ("-" in the table).
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from draftsmith.decoding.decoder import GenerationStats, SpeculativeDecoder

logger = logging.getLogger(__name__)

ROUNDING_ULPS = 8
"""A divergence is explained by rounding when the target's top-1/top-2 logit gap there is within
this many units in the last place of the top-1 logit, in the run's dtype: a k-token verification
forward and k one-token forwards round differently, by a few ulps after a few dozen layers."""

WARMUP_TOKENS = 8


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
    divergence: dict | None = None


@dataclass
class Aggregate:
    """Totals for a group of prompts, turned into the report's keys by `summary`."""

    results: list[PromptResult] = field(default_factory=list)

    def summary(self, greedy: bool, dtype: torch.dtype) -> dict:
        def tok_s(method: str) -> float | None:
            runs = [getattr(r, method) for r in self.results]
            if any(run is None for run in runs):
                return None
            return sum(len(run.tokens) for run in runs) / sum(run.wall_s for run in runs)

        drafted, accepted = _position_counts([r.stats for r in self.results])
        forwards = sum(r.stats.target_forwards for r in self.results)
        new_tokens = sum(r.stats.new_tokens for r in self.results)
        divergences = [r.divergence for r in self.results if r.divergence is not None]
        plain, hf, ours = tok_s("plain"), tok_s("hf"), tok_s("draftsmith")
        return {
            "n_prompts": len(self.results),
            "plain_tok_s": plain,
            "hf_tok_s": hf,
            "draftsmith_tok_s": ours,
            "speedup_vs_plain": ours / plain,
            "speedup_vs_hf": None if hf is None else ours / hf,
            "hf_speedup_vs_plain": None if hf is None else hf / plain,
            "mean_accepted_length": new_tokens / max(forwards, 1),
            "acceptance_by_position": [a / d for a, d in zip(accepted, drafted, strict=True)],
            "identical_to_plain": (not divergences) if greedy else None,
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
        seed: int = 0,
    ) -> None:
        self.target = target
        self.tokenizer = tokenizer
        self.decoder = decoder
        self.hf_assist = hf_assist
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.seed = seed
        self.dtype = next(target.parameters()).dtype

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def run(self, prompts: list[dict]) -> dict:
        encoded = [self.tokenizer(p["prompt"], return_tensors="pt").input_ids[0] for p in prompts]
        self._warm_up(encoded[0])
        groups: dict[str, Aggregate] = defaultdict(Aggregate)
        overall = Aggregate()
        for index, record in enumerate(tqdm(prompts, desc="bench")):
            result = self._run_prompt(index, record["workload"], encoded[index])
            overall.results.append(result)
            groups[record["workload"]].results.append(result)
        return {
            "overall": overall.summary(self.greedy, self.dtype),
            "workloads": {name: g.summary(self.greedy, self.dtype) for name, g in groups.items()},
        }

    def _warm_up(self, ids: torch.Tensor) -> None:
        logger.info("warm-up: %d tokens with each method", WARMUP_TOKENS)
        self._plain(ids, WARMUP_TOKENS)
        if self.hf_assist:
            self._assisted(ids, WARMUP_TOKENS)
        self.decoder.generate(ids, max_new_tokens=WARMUP_TOKENS, **self._sampling_kwargs())

    def _run_prompt(self, index: int, workload: str, ids: torch.Tensor) -> PromptResult:
        torch.manual_seed(self.seed)
        plain, gaps = self._plain(ids, self.max_new_tokens, with_gaps=self.greedy)
        hf = None
        if self.hf_assist:
            torch.manual_seed(self.seed)
            hf = self._assisted(ids, self.max_new_tokens)
        started = time.perf_counter()
        out = self.decoder.generate(
            ids, max_new_tokens=self.max_new_tokens, seed=self.seed, **self._sampling_kwargs()
        )
        ours = PromptRun(out.tokens, time.perf_counter() - started)
        result = PromptResult(index, workload, plain, hf, ours, out.stats)
        if self.greedy and ours.tokens != plain.tokens:
            result.divergence = self._divergence(index, plain, ours, gaps)
        return result

    def _sampling_kwargs(self) -> dict:
        return {"temperature": self.temperature}

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
            "top_k": None,
            "top_p": None,
        }

    @torch.inference_mode()
    def _plain(
        self, ids: torch.Tensor, max_new: int, with_gaps: bool = False
    ) -> tuple[PromptRun, list[float] | None]:
        started = time.perf_counter()
        out = self.target.generate(
            ids[None],
            attention_mask=torch.ones_like(ids[None]),
            max_new_tokens=max_new,
            output_logits=with_gaps,
            return_dict_in_generate=True,
            **self._hf_kwargs(),
        )
        run = PromptRun(out.sequences[0, ids.numel() :].tolist(), time.perf_counter() - started)
        gaps = None
        if with_gaps:
            logits = torch.stack(out.logits)[:, 0].float()  # (new, V)
            top2 = logits.topk(2, dim=-1).values
            gaps = [(float(a), float(a - b)) for a, b in top2.tolist()]
        return run, gaps

    @torch.inference_mode()
    def _assisted(self, ids: torch.Tensor, max_new: int) -> PromptRun:
        """Hugging Face's own speculative decoding with the drafter's counterpart."""
        started = time.perf_counter()
        out = self.target.generate(
            ids[None],
            attention_mask=torch.ones_like(ids[None]),
            max_new_tokens=max_new,
            **self.hf_assist,
            **self._hf_kwargs(),
        )
        return PromptRun(out[0, ids.numel() :].tolist(), time.perf_counter() - started)

    def _divergence(
        self, index: int, plain: PromptRun, ours: PromptRun, gaps: list[tuple[float, float]]
    ) -> dict:
        position = next(
            (i for i, (a, b) in enumerate(zip(plain.tokens, ours.tokens, strict=False)) if a != b),
            min(len(plain.tokens), len(ours.tokens)),
        )
        top1, gap = gaps[min(position, len(gaps) - 1)]
        tolerance = rounding_tolerance(top1, self.dtype)
        return {
            "prompt": index,
            "position": position,
            "top1_minus_top2_logit": gap,
            "rounding_tolerance": tolerance,
            "explained": gap <= tolerance,
        }


def rounding_tolerance(logit: float, dtype: torch.dtype) -> float:
    """ROUNDING_ULPS units in the last place of `logit` in `dtype`."""
    info = torch.finfo(dtype)
    magnitude = max(abs(logit), info.tiny)
    ulp = 2.0 ** torch.floor(torch.log2(torch.tensor(magnitude))).item() * info.eps
    return ROUNDING_ULPS * ulp


def format_table(report: dict) -> str:
    """A readable table of the report, one row per workload and one overall."""
    header = (
        f"{'workload':<10} {'n':>3} {'plain tok/s':>11} {'HF tok/s':>9} {'ours tok/s':>10} "
        f"{'vs plain':>8} {'vs HF':>6} {'HF/plain':>8} {'tau':>5} {'identical':>9}"
    )
    rows = [header, "-" * len(header)]
    named = [*report["workloads"].items(), ("overall", report["overall"])]
    for name, s in named:
        identical = s["identical_to_plain"]
        if identical is False and not s["unexplained_divergences"]:
            identical = "rounding"
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
