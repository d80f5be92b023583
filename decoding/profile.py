"""The target's verification cost on this device, so a decoder can size its drafts for speed.

One target forward of n new tokens after a cached context costs far less than n forwards of one
token, until the device runs out of parallel work. `profile_target` measures that curve for
n = 1..N and `profile_drafter` the drafter's cost per forward; the cost-aware policy sizes each
round's draft under them.
"""

from __future__ import annotations

import bisect
import itertools
import json
import platform
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from time import perf_counter

import torch
from transformers import PreTrainedModel

from draftsmith.core.cache import crop_cache
from draftsmith.core.home import default_home
from draftsmith.core.parallel import shards_agree
from draftsmith.core.sampling import SamplingParams
from draftsmith.core.small_rows import small_rows
from draftsmith.core.target import Target
from draftsmith.heads.base import Drafter

RERUN = "rerun `draftsmith profile --target NAME` to measure it again"


@dataclass
class CostCurve:
    """Seconds of one target forward of n new tokens per row after a cached context, for
    measured n, over `rows` rows at once."""

    tokens: list[int]
    """Verified-block sizes measured, increasing (e.g. 1, 2, 3, 4, 6, 8, 12, ..., 64)."""
    verify_s: list[float]
    """Seconds of one target forward of tokens[i] new tokens in each row, one per size."""
    context: int
    """Positions already in the target's KV cache when it was timed."""
    rows: int = 1
    """Rows in each timed forward: a batch of rows x tokens[i] new tokens (1: one sequence)."""
    draft_step_s: float | None = None
    """Seconds of one drafter forward, when a drafter was profiled (`profile_drafter`): per
    more drafted token where `draft_block` is 1, per round where it is a block."""
    draft_block: int = 1
    """Tokens that forward drafts (`Drafter.block_size`): 1 for a drafter stepping token by
    token; a block drafter's block, drafted in one forward whatever the draft's length."""
    drafter: str = ""
    """The profiled drafter's spec; empty when none was."""
    target: str = ""
    """The target's zoo name, folder or hub id; empty for a hand-made curve (as below)."""
    dtype: str = ""
    """The target's precision when timed (float32, bfloat16, ...)."""
    device: str = ""
    """The device it ran on (cpu, cuda:0, ...)."""
    device_name: str = ""
    """The device's model (`device_name`)."""
    torch_threads: int = 0
    """torch's intra-op threads when timed (a CPU run's cost depends on them)."""
    draftsmith_version: str = ""
    """The draftsmith that measured it."""
    date: str = ""
    """When it was measured, ISO 8601 in UTC."""

    def __post_init__(self) -> None:
        if not self.tokens or len(self.tokens) != len(self.verify_s):
            raise ValueError(
                f"a cost curve needs one time per size, got {len(self.tokens)} sizes and "
                f"{len(self.verify_s)} times"
            )
        if any(not isinstance(n, int) or n < 1 for n in self.tokens) or any(
            b <= a for a, b in itertools.pairwise(self.tokens)
        ):
            raise ValueError(f"sizes must be increasing positive integers, got {self.tokens}")
        if any(not isinstance(s, (int, float)) or not s > 0 for s in self.verify_s):
            raise ValueError(f"times must be positive seconds, got {self.verify_s}")
        if not isinstance(self.rows, int) or self.rows < 1:
            raise ValueError(f"rows must be a positive integer, got {self.rows}")

    def verify_cost(self, n: float) -> float:
        """Seconds to verify a block of n tokens in each of `rows` rows: linear between measured
        sizes, the smallest size's time below it, and the last segment's slope (never falling)
        beyond the largest."""
        sizes, times = self.tokens, self.verify_s
        if n <= sizes[0] or len(sizes) == 1:
            return times[0]
        # The segment sizes[i] < n <= sizes[i + 1], or the last one beyond the largest size.
        i = min(bisect.bisect_left(sizes, n), len(sizes) - 1) - 1
        slope = (times[i + 1] - times[i]) / (sizes[i + 1] - sizes[i])
        if n > sizes[-1]:
            return times[-1] + max(slope, 0.0) * (n - sizes[-1])
        return times[i] + slope * (n - sizes[i])

    def batch_cost(self, rows: int, n: int) -> float:
        """Seconds to verify n tokens in each of `rows` rows in one forward: measured where rows
        is the curve's own; elsewhere read at the same total tokens (rows * n), the work of the
        linear layers, which set the cost on a compute-bound device and cost about one weight
        read per forward on a memory-bound one."""
        return self.verify_cost(rows * n / self.rows)

    def relative(self, n: int) -> float:
        """verify_cost(n) in units of one token's verification."""
        return self.verify_cost(n) / self.verify_cost(1)

    def save(self, path: str | Path) -> None:
        """Write as JSON, to a temporary name first so a crash leaves no half-written curve."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(asdict(self), indent=2) + "\n")
        partial.replace(path)

    @classmethod
    def load(cls, path: str | Path) -> CostCurve:
        """Read a curve `save` wrote; a missing or corrupt file is an error naming the fix."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no cost curve at {path}: {RERUN}")
        try:
            return cls(**json.loads(path.read_text()))
        except (ValueError, TypeError) as err:  # bad JSON, missing or unknown keys, bad values
            raise ValueError(f"{path} is not a valid cost curve ({err}): {RERUN}") from err

    @staticmethod
    def default_path(
        target_name: str,
        dtype: str | torch.dtype,
        device: str = "cpu",
        placement: str = "",
        rows: int = 1,
    ) -> Path:
        """Where `draftsmith profile` keeps the curve of `target_name` at `dtype` on devices of
        `device`'s kind, spread as `placement` says (`draftsmith.core.parallel.placement`; ""
        on one device), timed over `rows` rows: ``$DRAFTSMITH_HOME/profiles/`` (default
        ``~/.cache/draftsmith``)."""
        dtype = str(dtype).removeprefix("torch.")
        kind = torch.device(device).type + (f"--{placement}" if placement else "")
        batch = f"--rows{rows}" if rows > 1 else ""
        name = f"{_safe_name(target_name)}--{dtype}--{kind}{batch}.json"
        return default_home() / "profiles" / name


def _safe_name(name: str) -> str:
    """A hub id or a folder as one file name: `Qwen/Qwen2.5-0.5B` -> `Qwen_Qwen2.5-0.5B`."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "target"


def default_sizes(max_tokens: int) -> list[int]:
    """1, 2, 3, 4, then each power of two and the midpoint 1.5x above it (6, 8, 12, 16, 24, ...),
    up to and always including max_tokens: dense where the curve bends, sparse where it is
    straight."""
    sizes = {1, 2, 3, 4, max_tokens}
    power = 4
    while power <= max_tokens:
        sizes |= {power, power * 3 // 2}
        power *= 2
    return sorted(n for n in sizes if n <= max_tokens)


# -- measuring ------------------------------------------------------------------------------------


def _synchronize(device: torch.device) -> None:
    """Wait for queued kernels: an accelerator's forward returns before its work is done.
    torch.cuda, torch.mps, torch.xpu and torch.cpu (a no-op) each have synchronize()."""
    getattr(torch, device.type).synchronize()


def _seconds(run: Callable[[], object], device: torch.device) -> float:
    _synchronize(device)
    start = perf_counter()
    run()
    _synchronize(device)
    return perf_counter() - start


def _interleaved_minima(
    runs: list[Callable[[], object]], repeats: int, device: torch.device
) -> list[float]:
    """Fastest seconds of each of `runs`: one untimed warm-up round, then `repeats` rounds over
    all of them, so a drift of the clock speed spreads over every run instead of biasing the ones
    timed last. The minimum, not the median: other work on a shared machine only ever adds
    time."""
    for run in runs:
        run()
    rounds = [[_seconds(run, device) for run in runs] for _ in range(repeats)]
    return [min(column) for column in zip(*rounds, strict=True)]


def device_name(device: torch.device) -> str:
    """What the device is: an accelerator's model name, or the CPU's model with the matrix
    instructions its kernels can use (a curve timed on one CPU plans wrongly on another)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type != "cpu":
        return device.type
    units = [
        name
        for name, present in (
            (torch.backends.cpu.get_cpu_capability(), True),
            ("AVX512-BF16", torch.cpu._is_avx512_bf16_supported()),
            ("AMX", torch.cpu._is_amx_tile_supported()),
        )
        if present
    ]
    return f"cpu: {_cpu_model()} ({', '.join(units)})"


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    models = [line.partition(":")[2].strip() for line in text.splitlines() if "model name" in line]
    return models[0] if models else platform.processor() or "unknown"


def _check_profile_args(
    model: PreTrainedModel, sizes: list[int], context: int, repeats: int
) -> None:
    if not sizes or sizes[0] < 1 or context < 1 or repeats < 1:
        raise ValueError(
            f"profile needs sizes >= 1, context >= 1 and repeats >= 1, got sizes {sizes}, "
            f"context {context}, repeats {repeats}"
        )
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if limit is not None and context + sizes[-1] > limit:
        raise ValueError(
            f"context {context} + {sizes[-1]} tokens exceeds the target's "
            f"{limit} positions: lower --context or --max-tokens"
        )


@torch.inference_mode()
def measure_cost_curve(model: PreTrainedModel, max_tokens: int, *, name: str = "") -> CostCurve:
    """The target's verification cost for 1..`max_tokens` tokens with the one set of defaults
    every caller shares: a cache of 256 positions (fewer where the model's context would not
    hold them and the block) and `profile_target`'s repeats. Uncached: `draftsmith.build`
    keeps it on disk."""
    config = model.config.get_text_config()
    positions = getattr(config, "max_position_embeddings", None) or 4096
    context = max(min(256, positions - max_tokens), 1)
    return profile_target(model, max_tokens=max_tokens, context=context, name=name)


def profile_target(
    model: PreTrainedModel,
    *,
    max_tokens: int = 64,
    context: int = 256,
    repeats: int = 5,
    sizes: Sequence[int] | None = None,
    rows: int = 1,
    name: str = "",
) -> CostCurve:
    """Time one target forward of n new tokens in each of `rows` rows, after a KV cache of
    `context` positions per row, for each n in `sizes` (default `default_sizes(max_tokens)`),
    through `Target.extend_rows` as the decoder's verification runs it (logits cast to float32):
    the fastest of `repeats` runs, after a warm-up, and never less than a smaller block's (a
    larger block does at least its work). The tokens run causally, as a chain: a draft tree's
    mask changes what attends to what, not how much work the forward does. `name` is recorded
    as the curve's target."""
    if rows < 1:
        raise ValueError(f"profile needs rows >= 1, got {rows}")
    sizes = sorted(set(sizes)) if sizes is not None else default_sizes(max_tokens)
    _check_profile_args(model, sizes, context, repeats)
    device = model.device
    vocab = model.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(0)
    target = Target(model)
    prompt = torch.randint(vocab, (rows, context), generator=generator)
    target.extend_rows(prompt.to(device), logits_to_keep=1)  # the cache is what it is for

    def verify(block: torch.Tensor) -> Callable[[], None]:
        def run() -> None:
            target.extend_rows(block)
            crop_cache(target.cache, context)

        return run

    blocks = [torch.randint(vocab, (rows, n), generator=generator).to(device) for n in sizes]
    with small_rows(model):  # as the decoder runs it: one block for the whole generation
        times = _interleaved_minima([verify(block) for block in blocks], repeats, device)
    times = shards_agree(model, times)  # one curve on every process, to draft alike
    times = list(itertools.accumulate(times, max))
    return CostCurve(
        tokens=sizes,
        verify_s=times,
        context=context,
        rows=rows,
        target=name or model.name_or_path,
        dtype=str(model.dtype).removeprefix("torch."),
        device=str(device),
        device_name=device_name(device),
        torch_threads=torch.get_num_threads(),
        draftsmith_version=version("draftsmith"),
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def profile_drafter(
    drafter: Drafter,
    prompt_ids: torch.Tensor,
    target_features: torch.Tensor | None,
    repeats: int = 5,
) -> float:
    """Seconds of one drafter forward. A drafter stepping token by token
    (`Drafter.block_size` 1): proposing 8 tokens minus proposing 1, over 7 (a round's fixed
    costs, such as rerunning the newest token, cancel out), at least 0. A block drafter's cost
    does not grow per token: proposing its whole block, the round's one forward.

    prompt_ids (T,) on the drafter's device (the timing waits for that device's queued work);
    target_features (T-1, F) for all prompt tokens but the last, or None.
    """
    drafter.start(prompt_ids, target_features)
    sampling = SamplingParams()
    block = drafter.block_size
    # propose leaves the committed sequence alone: each call redrafts from the same point.
    if block > 1:
        run = [lambda: drafter.propose(block, sampling)]
        return _interleaved_minima(run, repeats, prompt_ids.device)[0]
    one, eight = _interleaved_minima(
        [lambda: drafter.propose(1, sampling), lambda: drafter.propose(8, sampling)],
        repeats,
        prompt_ids.device,
    )
    return max((eight - one) / 7, 0.0)
