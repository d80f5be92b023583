"""Plain `generate` on stock and packed kernels and the decoder (one drafter, one policy) on
0.3.1's weight-first and 0.3.2's packed kernels, alternated per prompt in one run; every output
must equal the first method's. Ratios are to plain `generate` on stock torch (a user's baseline).

    python benchmarks/kernels/decode_kernels.py TARGET DRAFTER PROMPTS.jsonl POLICY OUT.json
"""

import json
import sys
import time

import torch
from weight_first import use_kernel

from draftsmith import SpeculativeDecoder
from draftsmith.build.drafters import build_drafter
from draftsmith.core.small_rows import small_rows
from draftsmith.decoding import build_policy
from draftsmith.evaluation.prompts import load_prompts
from draftsmith.zoo import load_model

METHODS = [("plain", "stock"), ("plain", "packed"), ("ours", "weight-first"), ("ours", "packed")]

target_name, drafter_spec, prompt_file, policy_spec, out = sys.argv[1:6]
target, tokenizer = load_model(target_name, dtype="float32")
built = build_drafter(drafter_spec, target, tokenizer, dtype="float32")
name, _, options = policy_spec.partition(":")
options = {k: int(v) for k, v in (kv.split("=") for kv in options.split(",") if kv)}
policy = build_policy(name, acceptance=built.acceptance, **options)
decoder = SpeculativeDecoder(target, built.drafter, tokenizer, policy=policy)


def decode(method: str, ids: torch.Tensor, max_new: int) -> list[int]:
    if method == "ours":
        return decoder.generate(ids, max_new_tokens=max_new).tokens
    with torch.inference_mode(), small_rows(target):
        out = target.generate(
            ids[None],
            attention_mask=torch.ones_like(ids[None]),
            do_sample=False,
            max_new_tokens=max_new,
            pad_token_id=tokenizer.eos_token_id,
        )
    return out[0, ids.numel() :].tolist()


encoded = [
    tokenizer(p["prompt"], return_tensors="pt").input_ids[0] for p in load_prompts(prompt_file)
]
for method, kernel in METHODS:  # warm-up
    use_kernel(kernel)
    decode(method, encoded[0], 8)
totals = {f"{m}/{k}": [0.0, 0] for m, k in METHODS}
for ids in encoded:
    first = None
    for method, kernel in METHODS:
        use_kernel(kernel)
        started = time.perf_counter()
        tokens = decode(method, ids, 128)
        totals[f"{method}/{kernel}"][0] += time.perf_counter() - started
        totals[f"{method}/{kernel}"][1] += len(tokens)
        first = first or tokens
        assert tokens == first, f"{method} on {kernel} decoded other tokens"
base = totals["plain/stock"][1] / totals["plain/stock"][0]
report = {"command": " ".join(["python", *sys.argv])}
for key, (seconds, n) in totals.items():
    report[key] = {"tok_s": n / seconds, "vs_plain_stock": n / seconds / base}
    print(f"{key:20s} {n / seconds:7.2f} tok/s  {n / seconds / base:.3f}x plain on stock")
with open(out, "w") as file:
    json.dump(report, file, indent=2)
