"""Training throughput of every head kind, with the target online and from a feature cache.

    python benchmarks/training/train_throughput.py --json benchmarks/smollm2-135m_train_throughput.json

Each recipe of `recipes/<target>/` trains `--steps` optimizer steps under `accelerate launch`
(two processes by default), first with the frozen target in the loop, then from a feature cache
of the same rows. Kinds reading the same layers share one cache, written by the first cached
run; its write rate is reported once (the cache's shards are 64 rows, so a cache of fewer rows
is written by one process). Tokens/s exclude start-up, evaluation and cache writing
(the trainer's own count). Run it on a quiet machine: the runs take turns, and any other job
changes the ratios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("eagle3", "eagle", "mtp", "medusa", "draft-model")


def run(recipe: Path, output_dir: Path, overrides: list[str], launch_config: str) -> list[dict]:
    """Train `recipe` with `overrides`; its metrics.jsonl records."""
    command = [
        *("accelerate", "launch", "--config_file", launch_config),
        str(ROOT / "scripts" / "train.py"),
        str(recipe),
        f"output_dir={output_dir}",
        "resume=false",
        "wandb_mode=disabled",
        *overrides,
    ]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=ROOT)
    lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def measure(kind: str, args: argparse.Namespace) -> dict:
    recipe = ROOT / "recipes" / args.target / f"{kind}.yaml"
    processes = yaml.safe_load((ROOT / args.config).read_text()).get("num_processes", 1)
    rows = args.batch_size * processes * args.steps  # one pass: no row is read twice
    overrides = [
        f"max_steps={args.steps}",
        f"batch_size={args.batch_size}",
        "grad_accum=1",
        "warmup_steps=1",
        "eval_every=0",
        "checkpoint_every=0",
        f"log_every={args.steps}",
        f"data.max_tokens={rows * args.seq_len}",
        f"data.seq_len={args.seq_len}",
        # the final evaluation is not timed; keep it short
        "eval_batches=1" if kind == "draft-model" else f"eval_data.max_tokens={2 * args.seq_len}",
    ]
    result = {"kind": kind, "recipe": str(recipe.relative_to(ROOT))}
    for mode in ("online", "cached"):
        extra = []
        if mode == "cached":
            layers = "eagle3" if kind == "eagle3" else "last"
            extra = [f"feature_cache={args.work_dir / f'cache-{layers}'}"]
        records = run(recipe, args.work_dir / f"{kind}-{mode}", overrides + extra, args.config)
        (train,) = [r for r in records if r["split"] == "train"]
        result[f"{mode}_tokens_per_s"] = round(train["tokens_per_s"], 1)
        for cache in (r for r in records if r["split"] == "cache"):
            result["cache_write_tokens_per_s"] = round(cache["tokens_per_s"], 1)
    result["cached_vs_online"] = round(
        result["cached_tokens_per_s"] / result["online_tokens_per_s"], 2
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", default="smollm2-135m", help="recipes/<target>/ to read")
    parser.add_argument(
        "--kinds", nargs="+", choices=KINDS, help="default: every kind with a recipe there"
    )
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per run")
    parser.add_argument("--batch-size", type=int, default=2, help="rows per process and step")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument(
        "--config", default="recipes/accelerate/cpu-2proc.yaml", help="accelerate config"
    )
    parser.add_argument("--work-dir", type=Path, default=Path("runs/train-throughput"))
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()

    recipes = ROOT / "recipes" / args.target
    kinds = args.kinds or [kind for kind in KINDS if (recipes / f"{kind}.yaml").is_file()]
    results = [measure(kind, args) for kind in kinds]
    print("| kind | online tok/s | cached tok/s | cached / online | cache write tok/s |")
    print("|---|---|---|---|---|")
    for r in results:
        write = r.get("cache_write_tokens_per_s", "(shared)")
        print(
            f"| {r['kind']} | {r['online_tokens_per_s']} | {r['cached_tokens_per_s']} | "
            f"{r['cached_vs_online']}x | {write} |"
        )
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k not in ("json", "work_dir")}
        args.json.write_text(
            json.dumps({"settings": settings, "command": sys.argv, "results": results}, indent=2)
            + "\n"
        )


if __name__ == "__main__":
    main()
