"""Plain batched `generate` against several draft policies at one batch size, on the Qwen pair in
bf16, the 8 bundled code prompts, 64 new tokens, greedy: each batch runs plain first and then each
policy (its own decoder and drafter), back to back; prints each method's seconds and its speed
over plain.

    python benchmarks/batch/batch_ab.py 4 fixed:max_draft_tokens=1 fixed:tree=4x1x4x1 cost-aware

A policy is NAME[:KEY=VALUE,...]; tree=TOP_KxDEPTHxTOTAL[xEXPAND]; cost-aware gets the target's
stored cost curve.
"""

from __future__ import annotations

import json
import sys
import time
from importlib.resources import files

from draftsmith.build import AUTO_TREE, cost_curve, parse_options, split_policy_spec, tree_options
from draftsmith.build.drafters import build_drafter
from draftsmith.decoding import SpeculativeDecoder, build_policy
from draftsmith.evaluation.benchmark import Benchmark
from draftsmith.zoo import load_model

TARGET, DRAFTER, NEW_TOKENS = "qwen2.5-coder-1.5b", "draft-model:qwen2.5-coder-0.5b", 64


def policy_of(spec: str, acceptance, curve):
    name, tree, pairs = split_policy_spec(spec)
    options = {**(tree_options(tree, name) if tree else {}), **parse_options(pairs)}
    if name == "cost-aware":
        options["cost"] = curve
    return build_policy(name, acceptance=acceptance, **options)


def main(batch_size: int, specs: list[str]) -> None:
    target, tokenizer = load_model(TARGET, dtype="bfloat16")
    built = build_drafter(DRAFTER, target, tokenizer, dtype="bfloat16")
    lines = (files("draftsmith.evaluation") / "bench_prompts.jsonl").read_text().splitlines()
    code = [r["prompt"] for r in map(json.loads, lines) if r["workload"] == "code"][:8]
    prompts = [tokenizer(p, return_tensors="pt").input_ids[0] for p in code]
    curve = cost_curve(target, TARGET, max_tokens=AUTO_TREE.max_tokens + 1)
    decoders = {
        spec: SpeculativeDecoder(
            target, built.drafter.fork(), tokenizer, policy=policy_of(spec, built.acceptance, curve)
        )
        for spec in specs
    }
    plain = Benchmark(target, tokenizer, next(iter(decoders.values())), {}, batch_size=batch_size)
    batches = [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]
    plain._plain(batches[0], 8)  # warm-up
    for decoder in decoders.values():
        decoder.generate_batch(batches[0], max_new_tokens=8)
    seconds = dict.fromkeys(["plain", *specs], 0.0)
    tau: dict[str, list[float]] = {spec: [] for spec in specs}
    for batch in batches:
        started = time.perf_counter()
        plain._plain(batch, NEW_TOKENS)
        seconds["plain"] += time.perf_counter() - started
        for spec, decoder in decoders.items():
            started = time.perf_counter()
            results = decoder.generate_batch(batch, max_new_tokens=NEW_TOKENS)
            seconds[spec] += time.perf_counter() - started
            tau[spec] += [r.stats.mean_accepted_length for r in results]
    for method, s in seconds.items():
        line = f"{method:40s} {s:7.2f} s  {seconds['plain'] / s:.3f}x plain"
        if method in tau:
            line += f"  tau {sum(tau[method]) / len(tau[method]):.2f}"
        print(line)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
