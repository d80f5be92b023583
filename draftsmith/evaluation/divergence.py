"""Judging a greedy divergence from plain `generate`: a near-tie the run's precision cannot
resolve (rounding), or a fault.

The first diverging position is re-scored with a float32 copy of the target and called rounding
only where the two tokens are a near-tie within the run's own measured error there
(`judge_divergence`), the error measured over the forward shapes the two decoders compute that
position in: blocks over a cache (`RESCORE_BLOCKS`), with the model's causal masking and under an
explicit mask as a draft's verification runs them, the prompt's row of its left-padded batch,
and plain `generate` itself replayed to that position (a `PlainReplay` of the caller's own plain
run). Every forward runs through `draftsmith.core.target.Target`, as the decoder's do (blocks
over a cache on its CPU linear kernels, `small_rows`). The benchmark and the side-by-side scripts
share this judge.
"""

from __future__ import annotations

import copy
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from draftsmith.core.cache import crop_cache
from draftsmith.core.ragged import left_padded
from draftsmith.core.target import TREE_ATTENTION, Target
from draftsmith.core.tree import chain_parents

logger = logging.getLogger(__name__)

RESCORE_BLOCKS = (1, 2, 4, 8, 16, 32, 65)
"""Block sizes a diverging position is re-run in. Plain `generate` computes a position in a
one-row step, draftsmith in a verification block of up to 65 rows (a tree's most), and a bf16
kernel rounds differently for each block size: the run's error there is the largest over them.
A prompt decoded in a batch is re-run in blocks of these sizes as its row of that batch too."""

ERROR_TOKENS = 16
"""The reference's most likely tokens whose errors in the run, besides the diverging pair's,
measure the run's error at a position."""

FLOAT32_ULPS = 8
"""The float32 reference resolves two logits no finer than this many float32 ulps. In a float32
run the reference is the run itself (its measured error is zero), so only a gap this small counts
as rounding there: kept tight, so that a fault is not excused; a float32 rounding divergence past
it reads as unexplained, the safe side."""


@dataclass
class DivergedBatch:
    """The batch a diverging prompt was decoded in (perhaps of one): every row's prompt (T_b,)
    and plain output."""

    prompts: list[torch.Tensor]
    plain: list[list[int]]
    """Each row's plain `generate` tokens (cut after its first EOS)."""
    row: int
    """The diverging prompt's row."""

    def prefixes(self, position: int, pad: int) -> list[torch.Tensor]:
        """Each row's prompt and its first `position` plain tokens, as plain batched `generate`
        held them when it computed that position (a row that had finished, padding after)."""
        return [
            torch.cat([ids, torch.tensor((tokens + [pad] * position)[:position], dtype=torch.long)])
            for ids, tokens in zip(self.prompts, self.plain, strict=True)
        ]


PlainReplay = Callable[[DivergedBatch, int], torch.Tensor]
"""Plain `generate`'s own next-token logits (1, V) for the batch's diverging row at a position:
the caller's plain run again (same batch, padding and kernels), stopped after that step."""


class DivergenceJudge:
    """Re-scores the first diverging position of a greedy run against plain `generate`'s.

    target: the model both runs decoded with (its dtype is the run's); replay_plain: the caller's
    plain run replayed to a position (None: that shape is left out); pad: the padding id plain
    batched `generate` used (any id: its attention mask hides padding). A float32 copy of a
    lower-precision target is made once, at the first divergence that needs it.
    """

    def __init__(
        self, target: PreTrainedModel, replay_plain: PlainReplay | None = None, pad: int = 0
    ) -> None:
        self.target = target
        self.replay_plain = replay_plain
        self.pad = pad
        self.dtype = next(target.parameters()).dtype
        self._float32: PreTrainedModel | None = None

    @torch.inference_mode()
    def __call__(self, index: int, batch: DivergedBatch, ours: list[int]) -> dict:
        """The divergence of our tokens from the batch's row `batch.row` (prompt `index`): its
        position, both tokens, and `judge_divergence`'s verdict.

        Both runs saw the same prefix there (the prompt and the tokens they share), so one
        cache-free forward over it in the run's dtype and one in float32 give the run's logits and
        the reference's at that position. Outside float32 the run's logits come from several
        shapes: blocks over a cache (`next_logits_by_shape`), the prompt's row of its batch
        (`next_logits_in_batch`, a batch of several), and plain `generate`'s own computation,
        replayed (its cache built step by step, which no re-run of the prefix reproduces).
        """
        ids, plain = batch.prompts[batch.row], batch.plain[batch.row]
        position = next(
            (i for i, (a, b) in enumerate(zip(plain, ours, strict=False)) if a != b),
            min(len(plain), len(ours)),
        )
        found = {"prompt": index, "position": position}
        if position == min(len(plain), len(ours)):
            # One output stops where the other goes on: no pair of tokens for rounding to explain.
            return {**found, "plain_token": None, "draftsmith_token": None, "explained": False}
        device = self.target.device
        prefix = torch.cat([ids, torch.tensor(plain[:position], dtype=torch.long)]).to(device)
        after = torch.tensor(plain[position:], dtype=torch.long, device=device)
        if self.dtype == torch.float32:
            run_logits = next_logits(self.target, prefix)[None]
            reference = run_logits[0]
        else:
            shapes = [next_logits_by_shape(self.target, prefix, after)]
            if len(batch.prompts) > 1:
                prefixes = batch.prefixes(position, self.pad)
                shapes.append(next_logits_in_batch(self.target, prefixes, batch.row))
            if self.replay_plain is not None:
                shapes.append(self.replay_plain(batch, position).to(device))
            run_logits = torch.cat(shapes)
            reference = next_logits(self._float32_target(), prefix)
        return {
            **found,
            "plain_token": plain[position],
            "draftsmith_token": ours[position],
            "run_dtype": str(self.dtype).removeprefix("torch."),
            **judge_divergence(run_logits, reference, plain[position], ours[position]),
        }

    def _float32_target(self) -> PreTrainedModel:
        if self._float32 is None:
            logger.info("re-scoring a divergence in float32: copying the %s target", self.dtype)
            self._float32 = copy.deepcopy(self.target).float()
        return self._float32


def next_logits(model: PreTrainedModel, prefix: torch.Tensor) -> torch.Tensor:
    """The next-token logits (V,) after prefix (T,), from one cache-free forward."""
    return Target(model).forward(prefix[None])[1][0, -1]


def next_logits_by_shape(
    model: PreTrainedModel, prefix: torch.Tensor, after: torch.Tensor
) -> torch.Tensor:
    """The next-token logits after prefix (T,) as differently shaped forwards compute them
    (S, V): cache-free, then for each of `RESCORE_BLOCKS` (m rows) the prefix's last token as the
    first row of a block continued by `after` (plain's next tokens), and as the last row of a
    block of prefix's last m tokens, each over a cache of the rest, with the model's own causal
    masking and, where it applies custom masks, under an explicit mask as a draft's verification
    passes one (`Target.extend_tree` on a chain: attention may then take another kernel path,
    `grouped_sdpa_attention` stacking the query heads that share a key/value head). One
    prefill, cropped to each block's start (the shrinking caches come last)."""
    rows = [next_logits(model, prefix)]
    if prefix.numel() < 2:
        return torch.stack(rows)
    target = Target(model)
    target.extend_rows(prefix[None, :-1], logits_to_keep=1)  # the cache is what it is for
    masks = (False, True) if model.config._attn_implementation in TREE_ATTENTION else (False,)

    def block_logits(block: torch.Tensor, masked: bool) -> torch.Tensor:
        """The logits (m, V) of block (m,) after the cache, which then drops it again; masked:
        as a draft tree, under an explicit mask and positions."""
        cached = target.length
        if masked:
            logits, _ = target.extend_tree(block, chain_parents(block.numel()))
        else:
            logits, _ = target.extend(block)
        crop_cache(target.cache, cached)
        return logits

    for m, masked in itertools.product(RESCORE_BLOCKS, masks):
        if m - 1 <= after.numel():
            rows.append(block_logits(torch.cat([prefix[-1:], after[: m - 1]]), masked)[0])
    for m in RESCORE_BLOCKS:
        if 1 < m < prefix.numel():
            crop_cache(target.cache, prefix.numel() - m)
            rows.extend(block_logits(prefix[-m:], masked)[-1] for masked in masks)
    return torch.stack(rows)


def next_logits_in_batch(
    model: PreTrainedModel, prefixes: list[torch.Tensor], row: int
) -> torch.Tensor:
    """Row `row`'s next-token logits (S, V) when prefixes (one (T_b,) per batch row) run
    together, left-padded as plain batched `generate` pads them: for each of `RESCORE_BLOCKS`
    (m) shorter than every prefix, the rows' last m tokens as one block over a cache of the rest
    (m = 1 is plain's own step; wider blocks stand for a batched verification's). One prefill,
    cropped to each block's start."""
    ids, mask = left_padded(prefixes)
    width = ids.shape[1]
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    ids, mask, positions = (x.to(model.device) for x in (ids, mask, positions))
    blocks = [m for m in RESCORE_BLOCKS if m < min(p.numel() for p in prefixes)]
    target = Target(model)
    target.extend_rows(ids[:, :-1], mask[:, :-1], positions[:, :-1], logits_to_keep=1)
    rows = []
    for m in blocks:
        crop_cache(target.cache, width - m)
        logits, _ = target.extend_rows(ids[:, -m:], mask, positions[:, -m:])
        rows.append(logits[row, -1])
    return torch.stack(rows)


def judge_divergence(
    run_logits: torch.Tensor, reference: torch.Tensor, plain_token: int, our_token: int
) -> dict:
    """Whether the run's precision explains picking our_token where plain `generate` picked
    plain_token.

    run_logits (S, V) are the target's next-token logits at the diverging position in the run's
    dtype, as S differently shaped forwards compute it (`next_logits_by_shape`; the first a
    cache-free one), or (V,) from one; reference (V,) the same from float32. The divergence is
    rounding when the two tokens are a near-tie the run cannot resolve: their float32 gap is
    within the run's error on them there plus FLOAT32_ULPS of the reference's own rounding. The
    run's error on a pair is twice its largest |run - float32| over the shapes and over the pair
    and the reference's `ERROR_TOKENS` most likely tokens: the forwards that diverged round like
    these, though not identically, and the pair's own errors are too few to say how far a third
    shape's can reach (every shape may round the pair alike, as a draft's masked block then
    does not). Gaps are plain's token minus ours; run_gap is the first shape's, run_gaps every
    shape's.
    """
    rows = run_logits.reshape(-1, run_logits.shape[-1])
    pair = torch.tensor([plain_token, our_token], device=run_logits.device)
    likely = reference.topk(min(ERROR_TOKENS, reference.numel())).indices
    tokens = torch.cat([pair, likely])
    # float64 holds every bfloat16 and float32 value and their differences exactly.
    errors = (rows[:, tokens].double() - reference[tokens].double()).abs()
    run, ref = rows[:, pair].double(), reference[pair].double()
    run_error = 2 * float(errors.max())
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


def format_divergence(d: dict) -> str:
    """One line on one divergence (`DivergenceJudge`'s dict)."""
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
