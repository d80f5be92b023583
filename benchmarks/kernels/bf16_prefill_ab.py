"""A bf16 prefill of random tokens on torch's kernels and under `small_rows` (past
`bf16_rows.MAX_ROWS`: float32 GEMMs on widened weight blocks), alternated; the fastest of
ROUNDS each, and the largest difference of the last position's logits.

    python benchmarks/kernels/bf16_prefill_ab.py TARGET TOKENS ROUNDS OUT.json
"""

import json
import sys
import time

import torch

from draftsmith.core import bf16_rows
from draftsmith.zoo import load_model
from draftsmith.core.small_rows import small_rows

target_name, tokens, rounds, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
target, _ = load_model(target_name, dtype="bfloat16")
assert bf16_rows.available(), "this CPU does not need the bf16 kernel: nothing to compare"
ids = torch.randint(
    100, target.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0)
)
seconds: dict[str, list[float]] = {"torch": [], "small_rows": []}
logits: dict[str, torch.Tensor] = {}
with torch.inference_mode():
    for _ in range(rounds):
        for method in seconds:
            started = time.perf_counter()
            if method == "torch":
                logits[method] = target(ids, logits_to_keep=1).logits[0, -1].float()
            else:
                with small_rows(target, ids.numel()):
                    logits[method] = target(ids, logits_to_keep=1).logits[0, -1].float()
            seconds[method].append(time.perf_counter() - started)
report = {
    "target": target_name,
    "tokens": tokens,
    "fastest_s": {m: min(s) for m, s in seconds.items()},
    "ratio": min(seconds["small_rows"]) / min(seconds["torch"]),
    "max_logit_difference": (logits["torch"] - logits["small_rows"]).abs().max().item(),
    "same_argmax": bool(logits["torch"].argmax() == logits["small_rows"].argmax()),
}
print(json.dumps(report, indent=2))
with open(out, "w") as f:
    json.dump(report, f, indent=2)
