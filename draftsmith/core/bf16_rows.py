"""bfloat16 linear layers on x86 CPUs without bf16 matrix units.

There (AVX2 CPUs: AMD EPYC up to Zen 3, Intel before Cooper Lake) neither MKL nor oneDNN
computes bf16 matrices: torch's fallback reads the whole weight once per row of x, so a forward
over k tokens costs about k one-token forwards, while one token in bf16 costs half what it
does in float32 (a decoding step reads half the bytes). Speculation in bf16 then cannot pay, and in float32 it races a plain baseline twice
as slow as the machine's best. Our kernel (`csrc/bf16_rows.cpp`) reads each weight row once,
widens it to float32 in registers and multiplies it with every row of x, accumulating in
float32 as torch does: a few rows cost little more than one. Past `MAX_ROWS` (a prefill),
`linear_many` widens the weight to float32 a block at a time for MKL's GEMM, at float32's speed
where torch's fallback costs several times that.

The kernel is compiled on first use (tens of seconds, with the C++ compiler torch extensions use),
into `~/.cache/draftsmith/extensions`; where that fails, or the CPU lacks AVX2 and FMA, or it has
bf16 units (oneDNN's kernels then serve bf16 well), `available()` is false and layers stay
torch's own.
"""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "bf16_rows.cpp"


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def needed() -> bool:
    """The CPU runs AVX2 and FMA but oneDNN has no bf16 kernels for it (no AVX-512 BW/VL/DQ,
    AVX-NE-CONVERT or AMX): the case the kernel is for."""
    flags = _cpu_flags()
    return {"avx2", "fma"} <= flags and not torch.ops.mkldnn._is_mkldnn_bf16_supported()


@cache
def _kernel():
    from torch.utils.cpp_extension import load  # noqa: PLC0415 (torch's build tools: only here)

    build = Path.home() / ".cache" / "draftsmith" / "extensions" / f"torch-{torch.__version__}"
    build.mkdir(parents=True, exist_ok=True)
    logger.info("building the bf16 small-rows kernel into %s (once per machine)", build)
    return load(
        name="draftsmith_bf16_rows",
        sources=[str(SOURCE)],
        # -fopenmp: at::parallel_for splits the rows over torch's threads only when OpenMP is on.
        extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        build_directory=str(build),
        verbose=False,
    )


@cache
def available() -> bool:
    """The kernel is needed here and built (a failed build warns once and leaves torch's
    kernels in place)."""
    if not needed():
        return False
    try:
        _kernel()
    except Exception as err:  # noqa: BLE001 (any build failure: fall back, never fail decoding)
        logger.warning(
            "bf16 linear layers keep torch's kernels (a forward over k tokens costs about k "
            "one-token forwards on this CPU): building draftsmith's kernel failed (%s)",
            str(err).splitlines()[0] if str(err) else type(err).__name__,
        )
        return False
    return True


MAX_ROWS = 96
"""Most rows `linear` takes: its cost grows with the rows, and from about here float32 GEMMs
on widened blocks of the weight (`linear_many`) cost as little."""

WIDEN_BLOCK = 512
"""Weight rows `linear_many` widens to float32 at a time: a block (3 MiB at 1,536 inputs) stays
in cache for its GEMM, where widening the whole weight first writes and rereads a float32 copy
twice its size."""


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear for bf16 x (..., in), weight (out, in) and bias (out,) through the kernel ->
    (..., out) bf16: float32 products and sums, rounded to bf16 once at the end (as torch
    rounds its own)."""
    return _kernel().linear_rows(x, weight, bias)


def linear_many(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear for bf16 x (..., in) over many rows (a prefill) -> (..., out) bf16: float32
    GEMMs on `WIDEN_BLOCK` weight rows widened at a time, rounded to bf16 once, as `linear`
    rounds. Where oneDNN has no bf16 kernels this runs at float32's speed; torch's fallback
    costs about five times that."""
    rows = x.reshape(-1, x.shape[-1]).float()
    out = torch.empty(rows.shape[0], weight.shape[0], dtype=torch.bfloat16, device=x.device)
    for start in range(0, weight.shape[0], WIDEN_BLOCK):
        block = slice(start, start + WIDEN_BLOCK)
        block_bias = None if bias is None else bias[block].float()
        out[:, block] = F.linear(rows, weight[block].float(), block_bias)
    return out.reshape(*x.shape[:-1], weight.shape[0])
