"""Side-by-side benchmark: plain `generate`, Hugging Face assisted generation and draftsmith.

Every prompt runs all three methods back to back on the same loaded models (interleaved, after a
warm-up), so machine noise hits them alike; results are reported as ratios. With a batch size
above 1, prompts run in batches of that many: plain `generate` on the left-padded batch and
`SpeculativeDecoder.generate_batch`, each batch's time split evenly among its prompts; Hugging
Face assisted generation decodes one sequence only, so it is not run (the report says so). A drafter without a
Hugging Face counterpart (empty `hf_assist`, e.g. a trained head) skips assisted generation and
reports its figures as null ("-" in the table). A greedy divergence from plain `generate` is
re-scored with a float32 copy of the target and called rounding only where the two tokens are a
near-tie within the run's own measured error there (`judge_divergence`), the error measured over
the forward shapes the two decoders compute that position in (`RESCORE_BLOCKS`, the prompt's row
of its batch, and plain `generate` itself replayed to that position).
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from draftsmith.core.cache import cache_argument, crop_cache
from draftsmith.core.small_rows import small_rows
from draftsmith.decoding.decoder import (
    GenerationResult,
    GenerationStats,
    SpeculativeDecoder,
    check_context,
    eos_token_ids,
)

logger = logging.getLogger(__name__)

RESCORE_BLOCKS = (1, 2, 4, 8, 16, 32, 65)
"""Block sizes a diverging position is re-run in. Plain `generate` computes a position in a
one-row step, draftsmith in a verification block of up to 65 rows (a tree's most), and a bf16
kernel rounds differently for each block size: the run's error there is the largest over them.
A prompt decoded in a batch is re-run in blocks of these sizes as its row of that batch too."""

FLOAT32_ULPS = 8
"""The float32 reference resolves two logits no finer than this many float32 ulps. In a float32
run the reference is the run itself (its measured error is zero), so only a gap this small counts
as rounding there: kept tight, so that a fault is not excused; a float32 rounding divergence past
it reads as unexplained, the safe side."""

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
        return {
            "n_prompts": len(self.results),
            "plain_tok_s": plain,
            "hf_tok_s": hf,
            "draftsmith_tok_s": ours,
            "speedup_vs_plain": ours / plain,
            "speedup_vs_hf": None if hf is None else ours / hf,
            "hf_speedup_vs_plain": None if hf is None else hf / plain,
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
    ) -> None:
        if (top_k is not None or top_p is not None) and temperature == 0.0:
            raise ValueError("top_k and top_p shape sampling: give a temperature > 0 with them")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.target = target
        self.tokenizer = tokenizer
        self.decoder = decoder
        self.hf_assist = hf_assist
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p
        self.seed = seed
        self.dtype = next(target.parameters()).dtype
        self._float32: PreTrainedModel | None = None
        self._eos = eos_token_ids(target)

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
            "overall": summary,
            "workloads": {name: g.summary(self.greedy) for name, g in groups.items()},
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
        """Every method on one batch of prompts (token ids (T_b,) each), back to back."""
        torch.manual_seed(self.seed)
        plain = self._plain(batch, self.max_new_tokens)
        hf: list[PromptRun | None] = [None] * len(batch)
        if self.hf_assist and len(batch) == 1:
            torch.manual_seed(self.seed)
            hf = [self._assisted(batch[0], self.max_new_tokens)]
        started = time.perf_counter()
        outs = self._ours(batch, self.max_new_tokens)
        wall_s = (time.perf_counter() - started) / len(batch)
        results = []
        for row, (index, workload, plain_run, hf_run, out) in enumerate(
            zip(indices, workloads, plain, hf, outs, strict=True)
        ):
            ours = PromptRun(out.tokens, wall_s)
            result = PromptResult(index, workload, plain_run, hf_run, ours, out.stats, out.lossy)
            # A lossy verifier's departures are its own doing, measured by the exact-match rate.
            if self.greedy and ours.tokens != plain_run.tokens and not out.lossy:
                result.divergence = self._divergence(index, _Batch(batch, plain, row), ours)
            results.append(result)
        return results

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

    def _plain_logits(self, batch: _Batch, position: int) -> torch.Tensor:
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

    @torch.inference_mode()
    def _divergence(self, index: int, batch: _Batch, ours: PromptRun) -> dict:
        """Re-score the first diverging position in float32 and judge it with `judge_divergence`.

        Both runs saw the same prefix there (the prompt and the tokens they share), so one
        cache-free forward over it in the run's dtype and one in float32 give the run's logits and
        the reference's at that position. Outside float32 the run's logits come from several
        shapes: blocks over a cache (`_next_logits_by_shape`), the prompt's row of its batch
        (`_next_logits_in_batch`, a batch of several), and plain `generate`'s own computation,
        replayed (its cache built step by step, which no re-run of the prefix reproduces).
        """
        ids, plain = batch.prompts[batch.row], batch.plain[batch.row]
        position = next(
            (i for i, (a, b) in enumerate(zip(plain.tokens, ours.tokens, strict=False)) if a != b),
            min(len(plain.tokens), len(ours.tokens)),
        )
        found = {"prompt": index, "position": position}
        if position == min(len(plain.tokens), len(ours.tokens)):
            # One output stops where the other goes on: no pair of tokens for rounding to explain.
            return {**found, "plain_token": None, "draftsmith_token": None, "explained": False}
        device = self.target.device
        prefix = torch.cat([ids, torch.tensor(plain.tokens[:position])]).to(device)
        after = torch.tensor(plain.tokens[position:], dtype=torch.long, device=device)
        if self.dtype == torch.float32:
            run_logits = self._next_logits(self.target, prefix)[None]
            reference = run_logits[0]
        else:
            shapes = [self._next_logits_by_shape(self.target, prefix, after)]
            if len(batch.prompts) > 1:
                prefixes = batch.prefixes(position, self._pad_id())
                shapes.append(self._next_logits_in_batch(self.target, prefixes, batch.row))
            shapes.append(self._plain_logits(batch, position))
            run_logits = torch.cat(shapes)
            reference = self._next_logits(self._float32_target(), prefix)
        return {
            **found,
            "plain_token": plain.tokens[position],
            "draftsmith_token": ours.tokens[position],
            "run_dtype": str(self.dtype).removeprefix("torch."),
            **judge_divergence(
                run_logits, reference, plain.tokens[position], ours.tokens[position]
            ),
        }

    def _float32_target(self) -> PreTrainedModel:
        """A float32 copy of the target, made once, at the first divergence that needs it."""
        if self._float32 is None:
            logger.info("re-scoring a divergence in float32: copying the %s target", self.dtype)
            self._float32 = copy.deepcopy(self.target).float()
        return self._float32

    @staticmethod
    def _next_logits(model: PreTrainedModel, prefix: torch.Tensor) -> torch.Tensor:
        """The next-token logits (V,) after prefix (T,), from one cache-free forward."""
        return model(input_ids=prefix[None], use_cache=False).logits[0, -1]

    @classmethod
    def _next_logits_by_shape(
        cls, model: PreTrainedModel, prefix: torch.Tensor, after: torch.Tensor
    ) -> torch.Tensor:
        """The next-token logits after prefix (T,) as differently shaped forwards compute them
        (S, V): cache-free, then for each of `RESCORE_BLOCKS` (m rows) the prefix's last token
        as the first row of a block continued by `after` (plain's next tokens), and as the last
        row of a block of prefix's last m tokens, each over a cache of the rest: one prefill,
        cropped to each block's start (the shrinking caches come last)."""
        rows = [cls._next_logits(model, prefix)]
        if prefix.numel() < 2:
            return torch.stack(rows)
        argument = cache_argument(model)
        cache = model(input_ids=prefix[None, :-1], use_cache=True).past_key_values

        def block_logits(block: torch.Tensor) -> torch.Tensor:
            """The logits (m, V) of block (m,) after the cache, which then drops it again."""
            cached = cache.get_seq_length()
            logits = model(input_ids=block[None], use_cache=True, **{argument: cache}).logits[0]
            crop_cache(cache, cached)
            return logits

        for m in RESCORE_BLOCKS:
            if m - 1 <= after.numel():
                rows.append(block_logits(torch.cat([prefix[-1:], after[: m - 1]]))[0])
        for m in RESCORE_BLOCKS:
            if 1 < m < prefix.numel():
                crop_cache(cache, prefix.numel() - m)
                rows.append(block_logits(prefix[-m:])[-1])
        return torch.stack(rows)

    @staticmethod
    def _next_logits_in_batch(
        model: PreTrainedModel, prefixes: list[torch.Tensor], row: int
    ) -> torch.Tensor:
        """Row `row`'s next-token logits (S, V) when prefixes (one (T_b,) per batch row) run
        together, left-padded as plain batched `generate` pads them: for each of
        `RESCORE_BLOCKS` (m) shorter than every prefix, the rows' last m tokens as one block over
        a cache of the rest (m = 1 is plain's own step; wider blocks stand for a batched
        verification's). One prefill, cropped to each block's start."""
        ids, mask = left_padded(prefixes)
        width = ids.shape[1]
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        ids, mask, positions = (x.to(model.device) for x in (ids, mask, positions))
        blocks = [m for m in RESCORE_BLOCKS if m < min(p.numel() for p in prefixes)]
        cache = model(
            input_ids=ids[:, :-1],
            attention_mask=mask[:, :-1],
            position_ids=positions[:, :-1],
            use_cache=True,
        ).past_key_values
        argument = cache_argument(model)
        rows = []
        for m in blocks:
            crop_cache(cache, width - m)
            logits = model(
                input_ids=ids[:, -m:],
                attention_mask=mask,
                position_ids=positions[:, -m:],
                use_cache=True,
                **{argument: cache},
            ).logits
            rows.append(logits[row, -1])
        return torch.stack(rows)

    def _pad_id(self) -> int:
        """Any id: the attention mask hides padding."""
        return self._hf_kwargs()["pad_token_id"] or 0


def left_padded(rows: list[torch.Tensor], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """rows (T_b,) as one batch (B, max T_b) padded on the left with `pad`, and its attention
    mask (B, max T_b), as batched `generate` takes them."""
    width = max(row.numel() for row in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, width - row.numel() :] = row
        mask[b, width - row.numel() :] = 1
    return ids, mask


@dataclass
class _Batch:
    """The batch a diverging prompt was decoded in (perhaps of one): every row's prompt (T_b,)
    and plain output."""

    prompts: list[torch.Tensor]
    plain: list[PromptRun]
    row: int
    """The diverging prompt's row."""

    def prefixes(self, position: int, pad: int) -> list[torch.Tensor]:
        """Each row's prompt and its first `position` plain tokens, as plain batched `generate`
        held them when it computed that position (a row that had finished, padding after)."""
        return [
            torch.cat([ids, torch.tensor((run.tokens + [pad] * position)[:position])])
            for ids, run in zip(self.prompts, self.plain, strict=True)
        ]


def judge_divergence(
    run_logits: torch.Tensor, reference: torch.Tensor, plain_token: int, our_token: int
) -> dict:
    """Whether the run's precision explains picking our_token where plain `generate` picked
    plain_token.

    run_logits (S, V) are the target's next-token logits at the diverging position in the run's
    dtype, as S differently shaped forwards compute it (`Benchmark._next_logits_by_shape`; the
    first a cache-free one), or (V,) from one; reference (V,) the same from float32. The
    divergence is rounding when the two tokens are a near-tie the run cannot resolve: their float32
    gap is within the run's error on them there (the largest over the shapes of |run - float32|
    summed over the pair: the forwards that diverged round like some of these, though not
    identically) plus FLOAT32_ULPS of the reference's own rounding. Gaps are plain's token minus
    ours; run_gap is the first shape's, run_gaps every shape's.
    """
    pair = torch.tensor([plain_token, our_token], device=run_logits.device)
    # float64 holds every bfloat16 and float32 value and their differences exactly.
    run, ref = (
        run_logits.reshape(-1, run_logits.shape[-1])[:, pair].double(),
        reference[pair].double(),
    )
    run_error = float((run - ref).abs().sum(dim=-1).max())
    top = reference[pair].abs().max()
    ulp = float(torch.nextafter(top, torch.full_like(top, torch.inf)) - top)
    tolerance = run_error + FLOAT32_ULPS * ulp
    float32_gap = float(ref[0] - ref[1])
    run_gaps = (run[:, 0] - run[:, 1]).tolist()
    return {
        "run_gap": run_gaps[0],
        "run_gaps": run_gaps,
        "float32_gap": float32_gap,
        "run_error": run_error,
        "tolerance": tolerance,
        "explained": abs(float32_gap) <= tolerance,
    }


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


def format_divergence(d: dict) -> str:
    """One line on one divergence of the report."""
    kind = "rounding" if d["explained"] else "UNEXPLAINED"
    head = f"divergence ({kind}): prompt {d['prompt']} position {d['position']}"
    if d["plain_token"] is None:
        return f"{head}, one output stops where the other goes on"
    dtype = d["run_dtype"]
    return (
        f"{head}, plain token {d['plain_token']} vs draftsmith {d['draftsmith_token']}: "
        f"float32 gap {d['float32_gap']:.4f} (tolerance {d['tolerance']:.4f}: {dtype} error "
        f"{d['run_error']:.4f} + {FLOAT32_ULPS} float32 ulps), {dtype} gap {d['run_gap']:.4f}"
        f" ({min(d['run_gaps']):.4f} to {max(d['run_gaps']):.4f} over {len(d['run_gaps'])} forward"
        " shapes)"
    )
