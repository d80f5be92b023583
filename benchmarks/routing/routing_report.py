"""Which drafter served which workload: decode prompts with a `route:` drafter through the
benchmark (plain `generate`, then the router, back to back per prompt after a warm-up) and report
per workload the rounds and tokens each routed drafter served (and the rounds the draft policy
decoded plainly), tokens/s against plain, and identity with plain greedy output.

    python benchmarks/routing/routing_report.py --target smollm2-135m \
        --drafter route:artifact:runs/exp11/mix/drafter+ngram \
        --prompts benchmarks/prompts/routing.jsonl [--dtype float32] [--max-new-tokens 96] \
        [--json OUT.json]

The draft policy is bench's default (cost-aware, 8 draft tokens, the target's stored cost curve).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from draftsmith.build import AUTO_TREE, cost_curve
from draftsmith.build.drafters import build_drafter, route_parts
from draftsmith.decoding import SpeculativeDecoder, build_policy
from draftsmith.decoding.policies import DEFAULT_POLICY
from draftsmith.decoding.routing import PLAIN
from draftsmith.evaluation.benchmark import Benchmark
from draftsmith.evaluation.prompts import load_prompts
from draftsmith.zoo import load_model


class RecordingDecoder(SpeculativeDecoder):
    """Keeps the router's `Route` of every request it decodes, in order."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.routes = []

    def generate(self, *args, **kwargs):
        result = super().generate(*args, **kwargs)
        self.routes.append(self.drafter.last_route)
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True, help="route:SPEC+SPEC[+...]")
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--draft-tokens", type=int, default=8)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not args.drafter.startswith("route:"):
        parser.error(f"--drafter {args.drafter!r}: give a route, route:SPEC+SPEC[+...]")
    names = route_parts(args.drafter)

    prompts = load_prompts(args.prompts, args.limit)
    target, tokenizer = load_model(args.target, dtype=args.dtype)
    built = build_drafter(args.drafter, target, tokenizer, dtype=args.dtype)
    policy = build_policy(
        DEFAULT_POLICY,
        max_draft_tokens=args.draft_tokens,
        acceptance=built.acceptance,
        cost=cost_curve(target, args.target, max_tokens=AUTO_TREE.max_tokens + 1),
    )
    decoder = RecordingDecoder(target, built.drafter, tokenizer, policy=policy)
    bench = Benchmark(target, tokenizer, decoder, {}, max_new_tokens=args.max_new_tokens)
    report = bench.run(prompts)
    routes = decoder.routes[1:]  # the first is the warm-up's
    report["routes"] = [
        {"index": i, "workload": p["workload"], **route.to_dict()}
        for i, (p, route) in enumerate(zip(prompts, routes, strict=True))
    ]
    report["served"] = served_by_workload(report["routes"])
    report["config"] = {**vars(args), "json": str(args.json), "command": " ".join(sys.argv)}
    print(format_table(report, [*names, PLAIN]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")


def served_by_workload(routes: list[dict]) -> dict[str, dict[str, dict[str, int]]]:
    """workload (and "overall") -> drafter -> {rounds, tokens}, summed over the prompts."""
    totals = defaultdict(lambda: defaultdict(lambda: {"rounds": 0, "tokens": 0}))
    for route in routes:
        for workload in (route["workload"], "overall"):
            for name, served in route["served"].items():
                for key in ("rounds", "tokens"):
                    totals[workload][name][key] += served[key]
    return {w: dict(by_name) for w, by_name in totals.items()}


def format_table(report: dict, names: list[str]) -> str:
    """Per workload: speed against plain, identity, and each drafter's rounds (tokens)."""
    lines = [
        "| workload | prompts | tok/s vs plain | identical | "
        + " | ".join(f"{n}: rounds (tokens)" for n in names)
        + " |",
        "|" + "---|" * (4 + len(names)),
    ]
    groups = {**report["workloads"], "overall": report["overall"]}
    for workload, summary in groups.items():
        served = report["served"].get(workload, {})
        cells = [
            f"{served[n]['rounds']} ({served[n]['tokens']})" if n in served else "0" for n in names
        ]
        lines.append(
            f"| {workload} | {summary['n_prompts']} | {summary['speedup_vs_plain']:.2f}x | "
            f"{summary['identical_to_plain']} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
