"""Accepted length and speed against draft-tree size, for `draftsmith bench --plot`: where the
tree budget pays for its verification and where it stops paying."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from draftsmith.decoding.policies import FixedPolicy
from draftsmith.evaluation.benchmark import Benchmark
from draftsmith.heads.base import TreeShape

SWEEP_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)


def tree_size_sweep(bench: Benchmark, prompts: list[dict], shape: TreeShape) -> list[dict]:
    """Decode every prompt with trees of `shape` cut to each size in SWEEP_SIZES (up to the
    shape's most nodes), with the bench policy's acceptance model and no cost curve. Returns one record per size: size,
    mean_accepted_length, tokens_per_s (the decoder alone, after the bench's warm-up)."""
    decoder = bench.decoder
    policy = decoder.policy
    encoded = [bench.tokenizer(p["prompt"], return_tensors="pt").input_ids[0] for p in prompts]
    points = []
    try:
        for size in [s for s in SWEEP_SIZES if s <= shape.max_tokens]:
            tree = replace(shape, total_tokens=size)
            decoder.policy = FixedPolicy(tree=tree, acceptance=policy.acceptance)
            tokens = forwards = 0
            wall = 0.0
            for ids in encoded:
                started = time.perf_counter()
                out = decoder.generate(
                    ids,
                    max_new_tokens=bench.max_new_tokens,
                    seed=bench.seed,
                    temperature=bench.temperature,
                )
                wall += time.perf_counter() - started
                tokens += len(out.tokens)
                forwards += out.stats.target_forwards
            points.append(
                {
                    "size": size,
                    "mean_accepted_length": tokens / max(forwards, 1),
                    "tokens_per_s": tokens / wall,
                }
            )
    finally:
        decoder.policy = policy
    return points


def plot_tree_sweep(points: list[dict], overall: dict, path: str | Path) -> None:
    """Two panels against tree size: mean accepted length, and tokens/s with plain decoding's
    rate as a line; the bench's own run is marked at its mean draft size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [p["size"] for p in points]
    figure, (tau, speed) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    tau.plot(sizes, [p["mean_accepted_length"] for p in points], "o-", label="tree of this size")
    speed.plot(sizes, [p["tokens_per_s"] for p in points], "o-", label="tree of this size")
    speed.axhline(overall["plain_tok_s"], color="gray", linestyle="--", label="plain decoding")
    size = overall["mean_draft_size"]
    tau.plot([size], [overall["mean_accepted_length"]], "r*", markersize=12, label="this run")
    speed.plot([size], [overall["draftsmith_tok_s"]], "r*", markersize=12, label="this run")
    tau.set(xlabel="draft tree size (nodes)", ylabel="mean accepted length (tokens per round)")
    speed.set(xlabel="draft tree size (nodes)", ylabel="tokens / s")
    for axes in (tau, speed):
        axes.set_xscale("log", base=2)
        axes.grid(alpha=0.3)
        axes.legend()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
