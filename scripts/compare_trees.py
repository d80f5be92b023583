"""Chain against draft trees for one drafter, side by side in one run: every prompt is decoded by
plain `generate` and then by each draft shape, back to back on the same loaded models, so machine
noise hits them alike; speed is reported as ratios to plain and to the chain.

    python scripts/compare_trees.py --target NAME --drafter SPEC --prompts FILE.jsonl \
        [--dtype float32] [--max-new-tokens 128] [--draft-tokens 4] \
        [--tree 8,6,48 --tree auto ...] [--json OUT.json]

Prints a table and, with --json, writes every figure with the command line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict

import torch

from draftsmith.commands.bench import AUTO_TREE, cost_curve, parse_tree
from draftsmith.commands.drafter_spec import build_drafter
from draftsmith.core.models import load_model
from draftsmith.decoding import DraftLengthPolicy, SpeculativeDecoder
from draftsmith.decoding.benchmark import load_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--draft-tokens", type=int, default=4, help="the chain's length")
    parser.add_argument("--tree", action="append", default=[], help="TOP_K,DEPTH,TOTAL or auto")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--json")
    args = parser.parse_args()

    prompts = load_prompts(args.prompts, args.limit)
    target, tokenizer = load_model(args.target, dtype=args.dtype)
    built = build_drafter(args.drafter, target, tokenizer, dtype=args.dtype)
    policies = {"chain": DraftLengthPolicy(max_draft_tokens=args.draft_tokens)}
    for spec in args.tree or ["auto"]:
        tree = parse_tree(spec)
        auto = tree == "auto"
        policies[spec] = DraftLengthPolicy(
            tree=AUTO_TREE if auto else tree,
            acceptance=built.acceptance,
            cost=cost_curve(target, args.target) if auto else None,
        )
    decoders = {
        name: SpeculativeDecoder(target, built.drafter, tokenizer, policy=policy)
        for name, policy in policies.items()
    }
    encoded = [tokenizer(p["prompt"], return_tensors="pt").input_ids[0] for p in prompts]
    for decoder in decoders.values():  # warm-up
        decoder.generate(encoded[0], max_new_tokens=8)

    # totals[workload][method]: every workload, and "overall".
    totals = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    for record, ids in zip(prompts, encoded, strict=True):
        groups = [totals[record["workload"]], totals["overall"]]
        started = time.perf_counter()
        with torch.inference_mode():
            plain = target.generate(
                ids[None],
                attention_mask=torch.ones_like(ids[None]),
                do_sample=False,
                max_new_tokens=args.max_new_tokens,
                pad_token_id=tokenizer.eos_token_id,
            )[0, ids.numel() :].tolist()
        for group in groups:
            group["plain"]["wall_s"] += time.perf_counter() - started
            group["plain"]["tokens"] += len(plain)
        for name, decoder in decoders.items():
            started = time.perf_counter()
            out = decoder.generate(ids, max_new_tokens=args.max_new_tokens)
            wall = time.perf_counter() - started
            for group in groups:
                row = group[name]
                row["wall_s"] += wall
                row["tokens"] += len(out.tokens)
                row["forwards"] += out.stats.target_forwards
                row["drafted"] += out.stats.drafted
                row["prompts"] += 1
                row["identical"] += out.tokens == plain

    report = {
        "command": " ".join(["python", *sys.argv]),
        "torch_threads": torch.get_num_threads(),
        "workloads": {name: _summary(group, list(decoders)) for name, group in totals.items()},
    }
    for workload, summary in report["workloads"].items():
        print(f"\n{workload} (plain {summary['plain_tok_s']:.2f} tok/s)")
        print(
            f"{'shape':<10} {'tok/s':>7} {'vs plain':>8} {'vs chain':>8} {'tau':>5} "
            f"{'tau/chain':>9} {'nodes':>6} {'identical':>9}"
        )
        for name, f in summary["shapes"].items():
            print(
                f"{name:<10} {f['tok_s']:>7.2f} {f['speedup_vs_plain']:>7.2f}x "
                f"{f['speedup_vs_chain']:>7.2f}x {f['mean_accepted_length']:>5.2f} "
                f"{f['tau_vs_chain']:>8.2f}x {f['mean_draft_size']:>6.1f} "
                f"{f['identical_prompts']:>5}/{f['prompts']}"
            )
    if args.json:
        with open(args.json, "w") as out:
            out.write(json.dumps(report, indent=2) + "\n")


def _summary(group: dict, shapes: list[str]) -> dict:
    """Per shape: tokens/s, ratios to plain and to the chain, mean accepted length, mean draft
    size, prompts identical to plain."""
    plain_rate = group["plain"]["tokens"] / group["plain"]["wall_s"]
    chain = group["chain"]
    chain_rate, chain_tau = chain["tokens"] / chain["wall_s"], chain["tokens"] / chain["forwards"]
    figures = {}
    for name in shapes:
        row = group[name]
        rate, tau = row["tokens"] / row["wall_s"], row["tokens"] / row["forwards"]
        figures[name] = {
            "tok_s": rate,
            "speedup_vs_plain": rate / plain_rate,
            "speedup_vs_chain": rate / chain_rate,
            "mean_accepted_length": tau,
            "tau_vs_chain": tau / chain_tau,
            "mean_draft_size": row["drafted"] / row["forwards"],
            "prompts": int(row["prompts"]),
            "identical_prompts": int(row["identical"]),
        }
    return {"plain_tok_s": plain_rate, "shapes": figures}


if __name__ == "__main__":
    main()
