"""`draftsmith calibrate` / `scripts/calibrate.py`: calibrate an artifact's confidence."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsmith.calibration.pipeline import CalibrateConfig, prompts_from_texts


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", type=Path, help="drafter artifact directory")
    parser.add_argument("--target", required=True, help="zoo name, local folder or hub id")
    parser.add_argument(
        "--data",
        required=True,
        help="held-out data: a jsonl with 'text' or 'prompt' fields, or a source spec "
        "(stdlib, chitchat: their held-out split is used)",
    )
    parser.add_argument(
        "--method",
        default="auto",
        choices=["auto", "temperature", "platt", "isotonic", "histogram"],
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0: calibrate for greedy verification; T > 0: for sampling at temperature T",
    )
    parser.add_argument("--dtype", default="auto", choices=["float32", "bfloat16", "auto"])
    parser.add_argument("--draft-tokens", type=int, default=4, help="draft length while collecting")
    defaults = CalibrateConfig()
    parser.add_argument("--prompt-tokens", type=int, default=defaults.prompt_tokens)
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    parser.add_argument("--max-prompts", type=int, default=defaults.max_prompts)
    parser.add_argument("--seed", type=int, default=defaults.seed)


def run_calibrate(args: argparse.Namespace) -> dict:
    from draftsmith.artifact import load_drafter
    from draftsmith.calibration.pipeline import calibrate_decoder
    from draftsmith.calibration.report import format_table
    from draftsmith.decoding import DraftLengthPolicy, SpeculativeDecoder
    from draftsmith.models import load_model

    target, tokenizer = load_model(args.target, dtype=args.dtype)
    drafter = load_drafter(args.artifact, target)
    config = CalibrateConfig(
        method=args.method,
        temperature=args.temperature,
        prompt_tokens=args.prompt_tokens,
        max_new_tokens=args.max_new_tokens,
        max_prompts=args.max_prompts,
        seed=args.seed,
    )
    prompts = _held_out_prompts(args.data, tokenizer, config)
    decoder = SpeculativeDecoder(
        target, drafter, tokenizer, policy=DraftLengthPolicy(max_tokens=args.draft_tokens)
    )
    metadata = {"target": args.target, "data": str(args.data), "artifact": str(args.artifact)}
    payload = calibrate_decoder(decoder, prompts, args.artifact, config, metadata)
    print(f"calibrator: {payload['method']} on {', '.join(payload['signals'])}")
    print(
        f"outcome: {payload['outcome']}; fit on {payload['n_fit']}, evaluated on "
        f"{payload['n_eval']} drafted tokens"
    )
    print(format_table(payload["metrics"]["before"], payload["metrics"]["after"]))
    print(f"wrote {args.artifact / 'calibration.json'} and {args.artifact / 'calibration'}/")
    return payload


def _held_out_prompts(data: str, tokenizer, config: CalibrateConfig) -> list:
    """Prompts from a jsonl file (`prompt` fields used as they are, `text` fields cut into
    windows) or from the held-out split of a data source."""
    path = Path(data)
    if path.suffix == ".jsonl":
        if not path.is_file():
            raise FileNotFoundError(f"calibration data {path} does not exist")
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        prompts = [r["prompt"] for r in records if r.get("prompt")]
        texts = [r["text"] for r in records if r.get("text")]
        if not prompts and not texts:
            raise ValueError(f"{path} holds no record with a 'text' or 'prompt' field")
    else:
        from draftsmith.train.data import DataConfig, load_documents

        documents = load_documents(DataConfig(source=data, split="heldout"))
        prompts, texts = [], [t for t in documents["text"] if t]
    stride = config.prompt_tokens + config.max_new_tokens
    if texts and len(prompts) < config.max_prompts:
        prompts += prompts_from_texts(
            texts, tokenizer, config.prompt_tokens, stride, config.max_prompts - len(prompts)
        )
    return prompts[: config.max_prompts]
