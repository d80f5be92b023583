"""``draftsmith profile``: the target's verification cost for 1..N tokens on this device, saved
for the decoder to size its draft trees by."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from draftsmith.build.flags import Range, at_least
from draftsmith.build.placement import TargetPlacement
from draftsmith.core.models import Dtype

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from draftsmith.decoding.profile import CostCurve
    from draftsmith.heads import Drafter


@dataclass(kw_only=True)
class ProfileCommand(TargetPlacement):
    """Measure how long one target forward of n new tokens takes after a cached context, for n
    from 1 to --max-tokens, and save the curve as JSON: the decoder reads it to choose the draft
    size that gives the most accepted tokens per second on this device. Given a drafter, its cost
    per draft step (a block drafter's: per round, one forward) is measured too."""

    FLAG_RANGES: ClassVar[dict[str, Range]] = {
        "max_tokens": at_least(1),
        "context": at_least(1),
        "repeats": at_least(1),
        "rows": at_least(1),
    }

    target: str
    """Zoo name, local folder or hub id of the target model."""
    drafter: str | None = None
    """The drafter whose cost per draft step (a block drafter: per round) to measure too: draft-model:NAME_OR_PATH,
    ngram[:MAX_N] or artifact:PATH; None: the target only."""
    dtype: Dtype = "auto"
    """Precision of the target and draft model (auto:
    bfloat16 on a GPU and on a CPU with bf16 matrix units, AMX or AVX512-BF16; float32
    elsewhere)."""
    max_tokens: int = 64
    """Largest verified block timed, in tokens."""
    context: int = 256
    """Positions in the target's KV cache before each timed block."""
    repeats: int = 5
    """Timed runs per block size (the fastest is kept), after one warm-up."""
    rows: int = 1
    """Rows verified together in each timed forward: the batch size the curve is for
    (`draftsmith bench --batch-size N` reads the curve of N rows where there is one)."""
    out: Path | None = None
    """Where to write the curve; None: $DRAFTSMITH_HOME/profiles/ (default ~/.cache/draftsmith),
    named after the target, its dtype, the device kind and the rows, where the decoder looks."""

    def run(self) -> CostCurve:
        import torch

        from draftsmith.build.drafters import build_drafter, check_spec
        from draftsmith.core.parallel import is_main_process, placement
        from draftsmith.decoding.profile import CostCurve, profile_target

        if self.drafter:
            check_spec(self.drafter)  # a bad drafter fails before the target loads
        model, tokenizer = self.load_target(self.target, self.dtype)
        spread = placement(model)
        report = is_main_process()  # under tensor parallel every process times, one reports
        if report:
            where = f"{model.device}, {spread}" if spread else model.device
            print(f"timing {self.target} on {where} ({model.dtype}) ...")
        curve = profile_target(
            model,
            max_tokens=self.max_tokens,
            context=self.context,
            repeats=self.repeats,
            rows=self.rows,
            name=self.target,
        )
        if self.drafter:
            drafter = build_drafter(self.drafter, model, tokenizer, dtype=self.dtype).drafter
            curve.draft_step_s = _draft_step(model, drafter, self.context, self.repeats)
            curve.drafter = self.drafter
            curve.draft_block = drafter.block_size
        if report:
            out = self.out or CostCurve.default_path(
                self.target, curve.dtype, curve.device, spread, rows=self.rows
            )
            curve.save(out)
            print(format_curve(curve))
            print(f"wrote {out} (torch threads: {torch.get_num_threads()})")
        return curve


def _draft_step(model: PreTrainedModel, drafter: Drafter, context: int, repeats: int) -> float:
    """The drafter's seconds per forward (`profile_drafter`) after a random prompt of `context`
    tokens, with the target's features of that prompt as the decoder would give them."""
    import torch

    from draftsmith.core.target import Target
    from draftsmith.decoding.profile import profile_drafter

    vocab = model.config.get_text_config().vocab_size
    prompt = torch.randint(vocab, (context,), generator=torch.Generator().manual_seed(1))
    prompt = prompt.to(model.device)
    with torch.inference_mode():
        target = Target(model, drafter.target_feature_layers)
        features = target.extend(prompt[:-1])[1] if context > 1 else None
        return profile_drafter(drafter, prompt, features, repeats)


def format_curve(curve: CostCurve) -> str:
    """The curve as a table: tokens (per row), milliseconds, and cost relative to one token."""
    lines = [] if curve.rows == 1 else [f"{curve.rows} rows, each verifying:"]
    lines.append(f"{'tokens':>6}  {'ms':>9}  {'x 1 token':>9}")
    for n, seconds in zip(curve.tokens, curve.verify_s, strict=True):
        lines.append(f"{n:>6}  {seconds * 1e3:>9.3f}  {curve.relative(n):>9.2f}")
    if curve.draft_step_s is not None:
        ms = f"{curve.draft_step_s * 1e3:.3f} ms"
        if curve.draft_block > 1:
            lines.append(f"draft round: {ms}, one forward of up to {curve.draft_block} tokens")
        else:
            lines.append(f"draft step: {ms} a token")
        lines[-1] += f" ({curve.drafter})"
    return "\n".join(lines)
