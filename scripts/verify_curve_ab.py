"""The target's verification cost with stock linear layers and draftsmith's (oneDNN on prepacked
weights, `draftsmith.core.small_rows`), alternated in one run: per size the fastest of all rounds.

    python scripts/verify_curve_ab.py TARGET DTYPE ROUNDS MAX_TOKENS OUT.json
"""

import json
import sys

import torch

from draftsmith.core import small_rows
from draftsmith.core.models import load_model
from draftsmith.decoding.profile import profile_target


def main() -> None:
    name, dtype, rounds, max_tokens, out = sys.argv[1:6]
    target, _ = load_model(name, dtype=dtype)
    best: dict[str, list[float]] = {}
    for _ in range(int(rounds)):
        for kernel in ("stock", "packed"):
            small_rows.ENABLED = kernel == "packed"
            curve = profile_target(target, max_tokens=int(max_tokens), context=256, repeats=2)
            old = best.get(kernel, curve.verify_s)
            best[kernel] = [min(a, b) for a, b in zip(old, curve.verify_s, strict=True)]
    print(f"{'tokens':13s}", " ".join(f"{n:7d}" for n in curve.tokens))
    for kernel, times in best.items():
        print(f"{kernel:13s}", " ".join(f"{t * 1e3:7.1f}" for t in times))
        print(f"{'  x 1 token':13s}", " ".join(f"{t / times[0]:7.2f}" for t in times))
    ratio = [a / b for a, b in zip(best["packed"], best["stock"], strict=True)]
    print(f"{'packed/stock':13s}", " ".join(f"{r:7.2f}" for r in ratio))
    report = {"command": " ".join(["python", *sys.argv]), "tokens": curve.tokens, **best}
    report["torch_threads"] = torch.get_num_threads()
    with open(out, "w") as file:
        file.write(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
