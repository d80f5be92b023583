"""The `draftsmith` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from importlib import resources
from pathlib import Path

BUNDLED_PROMPTS = "bench_prompts.jsonl"


def bundled_prompts() -> Path:
    """The prompt set shipped with the package (code, chat and prose)."""
    return Path(str(resources.files("draftsmith.decoding") / BUNDLED_PROMPTS))


def _fetch_model(args: argparse.Namespace) -> None:
    from draftsmith.core.zoo import fetch_model

    print(fetch_model(args.name))


def _bench(args: argparse.Namespace) -> None:
    import torch

    from draftsmith.commands.drafter_spec import build_drafter
    from draftsmith.core.models import load_model
    from draftsmith.decoding import DraftLengthPolicy, SpeculativeDecoder
    from draftsmith.decoding.benchmark import Benchmark, format_table, load_prompts

    prompts = load_prompts(args.prompts, args.limit)
    target, tokenizer = load_model(args.target, dtype=args.dtype)
    built = build_drafter(args.drafter, target, tokenizer, dtype=args.dtype)
    policy = DraftLengthPolicy(
        max_draft_tokens=args.draft_tokens,
        min_path_confidence=args.min_path_confidence,
        acceptance=built.acceptance,
    )
    decoder = SpeculativeDecoder(target, built.drafter, tokenizer, policy=policy)
    bench = Benchmark(
        target,
        tokenizer,
        decoder,
        built.hf_assist,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
    )
    report = bench.run(prompts)
    report["config"] = {
        **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "func"},
        "torch_threads": torch.get_num_threads(),
        "command": " ".join(["draftsmith", *sys.argv[1:]]),
    }
    print(format_table(report))
    overall = report["overall"]
    for d in overall["divergences"]:
        kind = "rounding" if d["explained"] else "UNEXPLAINED"
        print(
            f"divergence ({kind}): prompt {d['prompt']} position {d['position']}, "
            f"top-1 minus top-2 logit {d['top1_minus_top2_logit']:.4f} "
            f"(tolerance {d['rounding_tolerance']:.4f})"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")


def _train(args: argparse.Namespace) -> None:
    from draftsmith.commands.train import main as train_main

    train_main(args.arguments, prog="draftsmith train")


def _prepare_data(args: argparse.Namespace) -> None:
    from draftsmith.commands.data import add_prepare_data_arguments, run_prepare_data

    parser = argparse.ArgumentParser(
        prog="draftsmith prepare-data",
        description="Tokenize and pack a data source into fixed-length training rows.",
    )
    add_prepare_data_arguments(parser)
    run_prepare_data(parser.parse_args(args.arguments))


def _regenerate(args: argparse.Namespace) -> None:
    from draftsmith.commands.data import add_regenerate_arguments, run_regenerate

    parser = argparse.ArgumentParser(
        prog="draftsmith regenerate",
        description="Training data in the target's own words: chat answers rewritten by the "
        "target, text and code continued by it (jsonl, resumable).",
    )
    add_regenerate_arguments(parser)
    run_regenerate(parser.parse_args(args.arguments))


def _calibrate(args: argparse.Namespace) -> None:
    from draftsmith.commands.calibrate import add_calibrate_arguments, run_calibrate

    parser = argparse.ArgumentParser(
        prog="draftsmith calibrate",
        description="Calibrate an artifact's confidence on held-out data.",
    )
    add_calibrate_arguments(parser)
    run_calibrate(parser.parse_args(args.arguments))


def _deferred(commands, name: str, summary: str):
    """A subcommand whose arguments its handler parses (so its imports stay lazy): every word,
    --help included, is passed on (no prefix character marks an option here)."""
    parser = commands.add_parser(name, help=summary, add_help=False, prefix_chars="\0")
    parser.add_argument("arguments", nargs=argparse.REMAINDER)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="draftsmith", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO level")
    commands = parser.add_subparsers(dest="command", required=True)

    fetch = commands.add_parser("fetch-model", help="fetch a zoo model and print its folder")
    fetch.add_argument("name", help="smollm2-135m, qwen2.5-coder-0.5b or qwen2.5-coder-1.5b")
    fetch.set_defaults(func=_fetch_model)

    bench = commands.add_parser(
        "bench", help="plain vs Hugging Face assisted vs draftsmith, side by side"
    )
    bench.add_argument("--target", required=True, help="zoo name, local folder or hub id")
    bench.add_argument(
        "--drafter", required=True, help="draft-model:NAME_OR_PATH, ngram[:MAX_N] or artifact:PATH"
    )
    bench.add_argument(
        "--prompts", type=Path, default=bundled_prompts(), help="jsonl of {prompt, workload}"
    )
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    bench.add_argument("--limit", type=int, default=None, help="use the first N prompts")
    bench.add_argument("--dtype", default="auto", choices=["float32", "bfloat16", "auto"])
    bench.add_argument("--draft-tokens", type=int, default=8, help="most draft tokens a round")
    bench.add_argument(
        "--min-path-confidence",
        type=float,
        default=0.0,
        help="stop a draft once its cumulative acceptance probability (calibrated when the "
        "artifact has a calibration, else the raw top-1 probabilities) falls below this",
    )
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--json", type=Path, default=None, help="write the report here")
    bench.set_defaults(func=_bench)

    train = _deferred(
        commands,
        "train",
        "train a drafter head in this process: RECIPE.yaml [key=value ...] (--help: all keys)",
    )
    train.set_defaults(func=_train)
    prepare = _deferred(
        commands, "prepare-data", "tokenize and pack a data source into training rows (--help)"
    )
    prepare.set_defaults(func=_prepare_data)
    regenerate = _deferred(
        commands,
        "regenerate",
        "data in the target's own words: --target NAME --source SRC --out FILE.jsonl (--help)",
    )
    regenerate.set_defaults(func=_regenerate)
    calibrate = _deferred(
        commands,
        "calibrate",
        "calibrate an artifact's confidence: ARTIFACT --target NAME --data FILE|SOURCE (--help)",
    )
    calibrate.set_defaults(func=_calibrate)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s: %(message)s",
    )
    args.func(args)


if __name__ == "__main__":
    main()
