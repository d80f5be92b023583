"""One target forward verifying n draft tokens under a chain mask after `context` cached tokens:
transformers' `sdpa` attention against draftsmith's grouped SDPA, alternating, fastest of
`repeats` each; writes one JSON.

    python benchmarks/kernels/grouped_attention_ab.py smollm2-135m --context 300 \
        --tokens 1,2,5,12,24 --json benchmarks/kernels/smollm2-135m_bf16_grouped_attention_s48.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import DynamicCache

from draftsmith.core.attention import GROUPED_SDPA
from draftsmith.core.cache import crop_cache
from draftsmith.core.small_rows import small_rows
from draftsmith.core.tree import additive_mask
from draftsmith.heads.blocks import causal_mask
from draftsmith.zoo import load_model


def verify_seconds(model, cache: DynamicCache, context: int, n: int) -> float:
    """Seconds of one forward of n chained tokens after the cache's context positions (the
    cache is cropped back after it)."""
    mask = additive_mask(causal_mask(n, context), model.dtype)
    started = time.perf_counter()
    model(
        input_ids=torch.randint(1000, (1, n)),
        attention_mask=mask,
        position_ids=torch.arange(context, context + n)[None],
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=n,
    )
    seconds = time.perf_counter() - started
    crop_cache(cache, context)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--tokens", default="1,2,5,12,24")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    model, _ = load_model(args.target, dtype=args.dtype)
    cache = DynamicCache()
    implementations = ("sdpa", GROUPED_SDPA)
    rows = []
    with torch.inference_mode(), small_rows(model):
        model(input_ids=torch.randint(1000, (1, args.context)), past_key_values=cache)
        for n in (int(t) for t in args.tokens.split(",")):
            best = dict.fromkeys(implementations, float("inf"))
            for _ in range(args.repeats):
                for implementation in implementations:
                    model.set_attn_implementation(implementation)
                    best[implementation] = min(
                        best[implementation], verify_seconds(model, cache, args.context, n)
                    )
            rows.append({"tokens": n, **best})
            ratio = best[GROUPED_SDPA] / best["sdpa"]
            print(
                f"{n:3d} tokens: sdpa {best['sdpa'] * 1e3:7.1f} ms, grouped "
                f"{best[GROUPED_SDPA] * 1e3:7.1f} ms, {ratio:.3f}x",
                flush=True,
            )
    with open(args.json, "w") as f:
        json.dump(
            {
                "command": vars(args),
                "torch_threads": torch.get_num_threads(),
                "seconds": rows,
                "heads": model.config.num_attention_heads,
                "key_value_heads": model.config.num_key_value_heads,
            },
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
