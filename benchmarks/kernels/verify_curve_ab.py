"""The target's verification cost with stock linear layers and draftsmith's (oneDNN on prepacked
weights, `draftsmith.core.small_rows`), alternated in one run: per size the fastest of all rounds.

    python benchmarks/kernels/verify_curve_ab.py TARGET DTYPE ROUNDS MAX_TOKENS OUT.json
"""

import json
import sys
from collections.abc import Callable

import torch

from draftsmith.core import small_rows
from draftsmith.decoding.profile import profile_target
from draftsmith.zoo import load_model


def use_kernel(name: str) -> None:
    """stock: `small_rows` off; packed: as it is."""
    small_rows.ENABLED = name == "packed"


def compare_kernels(
    kernels: tuple[str, ...], use: Callable[[str], None] = use_kernel, argv: list[str] = sys.argv
) -> None:
    """The curves of `kernels` (each switched on by `use`), printed against the first kernel's
    one-token cost and written with the command line to argv's OUT.json."""
    name, dtype, rounds, max_tokens, out = argv[1:6]
    target, _ = load_model(name, dtype=dtype)
    best: dict[str, list[float]] = {}
    for _ in range(int(rounds)):
        for kernel in kernels:
            use(kernel)
            curve = profile_target(target, max_tokens=int(max_tokens), context=256, repeats=2)
            old = best.get(kernel, curve.verify_s)
            best[kernel] = [min(a, b) for a, b in zip(old, curve.verify_s, strict=True)]
    unit = best[kernels[0]][0]
    print(f"{'tokens':13s}", " ".join(f"{n:7d}" for n in curve.tokens))
    for kernel, times in best.items():
        print(f"{kernel:13s}", " ".join(f"{t * 1e3:7.1f}" for t in times))
        print(f"{'  x ' + kernels[0] + ' 1':13s}", " ".join(f"{t / unit:7.2f}" for t in times))
    report = {"command": " ".join(["python", *argv]), "tokens": curve.tokens, **best}
    report["torch_threads"] = torch.get_num_threads()
    with open(out, "w") as file:
        file.write(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    compare_kernels(("stock", "packed"))
