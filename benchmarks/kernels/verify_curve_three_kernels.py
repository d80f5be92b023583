"""The target's verification cost with three linear kernels (`weight_first.KERNELS`: stock torch,
draftsmith 0.3.1's weight-first product, 0.3.2's oneDNN on packed weights), alternated in one
run, per size the fastest of all rounds.

    python benchmarks/kernels/verify_curve_three_kernels.py TARGET DTYPE ROUNDS MAX_TOKENS OUT.json
"""

import json
import sys

import torch
from weight_first import KERNELS, use_kernel

from draftsmith.core.models import load_model
from draftsmith.decoding.profile import profile_target

name, dtype, rounds, max_tokens, out = sys.argv[1:6]
target, _ = load_model(name, dtype=dtype)
best = {}
for _ in range(int(rounds)):
    for kernel in KERNELS:
        use_kernel(kernel)
        curve = profile_target(target, max_tokens=int(max_tokens), context=256, repeats=2)
        old = best.get(kernel, curve.verify_s)
        best[kernel] = [min(a, b) for a, b in zip(old, curve.verify_s, strict=True)]
print(f"{'tokens':13s}", " ".join(f"{n:7d}" for n in curve.tokens))
for kernel, times in best.items():
    print(f"{kernel:13s}", " ".join(f"{t * 1e3:7.1f}" for t in times))
    print(f"{'  x stock 1':13s}", " ".join(f"{t / best['stock'][0]:7.2f}" for t in times))
report = {"command": " ".join(["python", *sys.argv]), "tokens": curve.tokens, **best}
report["torch_threads"] = torch.get_num_threads()
with open(out, "w") as file:
    json.dump(report, file, indent=2)
