"""Fidelity of lossy verification against lossless, side by side in one run: every prompt is
decoded greedily by the lossless verifier and by each lossy mode at each threshold, back to back
on the same loaded models (so machine noise hits them alike), with the same fixed draft policy.

    python benchmarks/fidelity/fidelity_report.py --target NAME --drafter SPEC --out DIR \
        [--prompts FILE.jsonl ...] [--dtype float32] [--max-new-tokens 64] [--draft-tokens 4] \
        [--typical 1,0.3,0.09] [--modulated 0.5,0.8,0.95] [--limit N] [--threads 1]

Prompts: jsonl records {"prompt", "workload", "reference" (optional)}; by default the
translation and summarisation sets of benchmarks/prompts/fidelity (benchmarks/prompts/make_fidelity_prompts.py),
whose answers are one line, so references are scored against each output's first line.

Writes into DIR: fidelity.json (every figure per workload and overall, each prompt's outputs,
the command), fidelity.md (the table) and fidelity.png (speed against chrF, per workload).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from draftsmith.build.drafters import build_drafter
from draftsmith.decoding import SpeculativeDecoder, build_policy
from draftsmith.decoding.lossy import build_verifier
from draftsmith.evaluation.fidelity import Decoded, fidelity, format_table, plot_tradeoff
from draftsmith.zoo import load_model

PROMPTS = Path(__file__).resolve().parents[1] / "prompts" / "fidelity"
DEFAULT_PROMPTS = [PROMPTS / "translation.jsonl", PROMPTS / "summarisation.jsonl"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--out", required=True, help="folder for the JSON, table and plot")
    parser.add_argument("--prompts", nargs="+", default=[str(p) for p in DEFAULT_PROMPTS])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--draft-tokens", type=int, default=4, help="the fixed chain's length")
    parser.add_argument("--typical", type=thresholds, default=[1.0, 0.3, 0.09], help="epsilons")
    parser.add_argument("--modulated", type=thresholds, default=[0.5, 0.8, 0.95], help="strengths")
    parser.add_argument("--limit", type=int, help="prompts per file")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: no thrashing on a shared CPU)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    records = [r for path in args.prompts for r in read_prompts(path)[: args.limit]]
    modes = [
        ("lossless", None),
        *(("typical", t) for t in args.typical),
        *(("modulated", t) for t in args.modulated),
    ]
    verifiers = [build_verifier(name, threshold) for name, threshold in modes]  # bad input first
    target, tokenizer = load_model(args.target, dtype=args.dtype)
    drafter = build_drafter(args.drafter, target, tokenizer, dtype=args.dtype).drafter
    decoders = [
        SpeculativeDecoder(
            target,
            drafter,
            tokenizer,
            policy=build_policy("fixed", max_draft_tokens=args.draft_tokens),
            verifier=verifier,
        )
        for verifier in verifiers
    ]
    encoded = [tokenizer(r["prompt"], return_tensors="pt").input_ids[0] for r in records]
    for decoder in decoders:  # warm-up
        decoder.generate(encoded[0], max_new_tokens=8)

    # outputs[m][i]: mode m on prompt i; forwards alike, for the mean accepted length.
    outputs = [[] for _ in modes]
    forwards = [[] for _ in modes]
    for i, ids in enumerate(encoded, 1):
        for m, decoder in enumerate(decoders):
            started = time.perf_counter()
            out = decoder.generate(ids, max_new_tokens=args.max_new_tokens)
            outputs[m].append(Decoded(out.tokens, out.text, time.perf_counter() - started))
            forwards[m].append(out.stats.target_forwards)
        print(f"prompt {i}/{len(encoded)} decoded by {len(modes)} modes", file=sys.stderr)

    groups = {"overall": list(range(len(records)))}
    for i, record in enumerate(records):
        groups.setdefault(record["workload"], []).append(i)
    rows = []
    for workload, indices in groups.items():
        lossless = [outputs[0][i] for i in indices]
        references = [records[i].get("reference") for i in indices]
        for m, (name, threshold) in enumerate(modes):
            mine = [outputs[m][i] for i in indices]
            row = {"workload": workload, "mode": name, "threshold": threshold}
            row.update(fidelity(mine, lossless, references, answer=first_line))
            tokens = sum(len(o.tokens) for o in mine)
            row["mean_accepted_length"] = tokens / max(sum(forwards[m][i] for i in indices), 1)
            rows.append(row)

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {
        "command": " ".join(["python", *sys.argv]),
        "settings": {
            "target": args.target,
            "drafter": args.drafter,
            "dtype": args.dtype,
            "max_new_tokens": args.max_new_tokens,
            "draft_policy": f"fixed chain of {args.draft_tokens}",
            "decoding": "greedy",
            "torch_threads": torch.get_num_threads(),
            "machine": platform.processor() or platform.machine(),
        },
        "rows": rows,
        "prompts": [
            {
                "source": record.get("source"),
                "workload": record["workload"],
                "reference": record.get("reference"),
                "outputs": {
                    mode_label(name, threshold): outputs[m][i].text
                    for m, (name, threshold) in enumerate(modes)
                },
            }
            for i, record in enumerate(records)
        ],
    }
    (out_dir / "fidelity.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    table = format_table(rows)
    (out_dir / "fidelity.md").write_text(f"`{report['command']}`\n\n{table}")
    plot_tradeoff(rows, out_dir / "fidelity.png")
    print(table)


def thresholds(text: str) -> list[float]:
    return [float(t) for t in text.split(",") if t.strip()]


def read_prompts(path: str | Path) -> list[dict]:
    """jsonl records, each with a non-empty 'prompt' string."""
    records = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    for n, record in enumerate(records, 1):
        if not isinstance(record.get("prompt"), str) or not record["prompt"]:
            raise ValueError(f"{path}: record {n} needs a non-empty string 'prompt'")
        record.setdefault("workload", Path(path).stem)
    return records


def first_line(text: str) -> str:
    """The answer of a one-line task: the output's first non-empty line."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def mode_label(name: str, threshold: float | None) -> str:
    return name if threshold is None else f"{name}@{threshold:g}"


if __name__ == "__main__":
    main()
