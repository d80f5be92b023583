"""What the oneDNN-packed linear layers (`draftsmith.core.small_rows`) give on the default path of
a CPU without bf16 matrix units (`--dtype auto` -> float32): plain greedy `generate` and draftsmith
(n-gram drafter, fixed chain of 4: a policy that reads no clock) on the bundled prompts, each
prompt decoded with the packed layers on and off back to back, the order alternating, the
fastest of `--repeats` runs counting.

    python benchmarks/kernels/small_rows_default_ab.py --limit 8 --new-tokens 64 --repeats 3 \
        --json benchmarks/kernels/<name>.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from draftsmith import __version__
from draftsmith.build import build_drafter
from draftsmith.core import small_rows
from draftsmith.decoding import SpeculativeDecoder, build_policy
from draftsmith.decoding.profile import device_name
from draftsmith.evaluation.prompts import bundled_prompts, load_prompts
from draftsmith.zoo import load_model


def timed(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    target, tokenizer = load_model(args.target)  # dtype auto
    built = build_drafter("ngram", target, tokenizer)
    decoder = SpeculativeDecoder(
        target, built.drafter, tokenizer, policy=build_policy("fixed", max_draft_tokens=4)
    )
    prompts = [
        tokenizer(r["prompt"], return_tensors="pt").input_ids
        for r in load_prompts(bundled_prompts(), args.limit)
    ]
    n = args.new_tokens

    def plain(ids):
        def run():
            with small_rows.small_rows(target):  # as the benchmark's plain baseline runs
                target.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=n,
                    min_new_tokens=n,
                    do_sample=False,
                )

        return run

    def ours(ids):
        return lambda: decoder.generate(ids[0], max_new_tokens=n)

    methods = {"plain": plain, "draftsmith": ours}
    best = {(m, on): [float("inf")] * len(prompts) for m in methods for on in (True, False)}
    for make in methods.values():  # warm-up, both ways
        for on in (True, False):
            small_rows.ENABLED = on
            make(prompts[0])()
    for repeat in range(args.repeats):
        for i, ids in enumerate(prompts):
            for m, make in methods.items():
                for on in (True, False) if (repeat + i) % 2 == 0 else (False, True):
                    small_rows.ENABLED = on
                    best[m, on][i] = min(best[m, on][i], timed(make(ids)))
    small_rows.ENABLED = True
    report = {
        "what": "packed linear layers on (small_rows) against stock torch, float32 default path",
        "target": args.target,
        "dtype": str(target.dtype),
        "device": device_name(target.device),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "draftsmith": __version__,
        "torch_threads": torch.get_num_threads(),
        "prompts": len(prompts),
        "new_tokens": n,
        "repeats": args.repeats,
        "speedup_of_packed": {m: sum(best[m, False]) / sum(best[m, True]) for m in methods},
        "seconds": {f"{m}_{'packed' if on else 'stock'}": sum(v) for (m, on), v in best.items()},
    }
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
