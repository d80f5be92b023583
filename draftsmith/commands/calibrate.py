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
        help="held-out data: a jsonl file (taken whole) with 'text', 'prompt' + 'completion' "
        "(e.g. `draftsmith regenerate` output) or, for --collect decode, 'prompt' fields; or a "
        "source name (stdlib, chitchat: its held-out split)",
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
    defaults = CalibrateConfig()
    parser.add_argument(
        "--collect",
        default=defaults.collect,
        choices=["teacher-forced", "decode"],
        help="teacher-forced: score the head's draft chains over held-out rows in one pass; "
        "decode: record real decoding runs",
    )
    parser.add_argument(
        "--seq-len", type=int, default=defaults.seq_len, help="teacher-forced: longest document"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=defaults.max_tokens, help="teacher-forced"
    )
    parser.add_argument("--draft-tokens", type=int, default=4, help="decode: draft length")
    parser.add_argument("--prompt-tokens", type=int, default=defaults.prompt_tokens, help="decode")
    parser.add_argument(
        "--max-new-tokens", type=int, default=defaults.max_new_tokens, help="decode"
    )
    parser.add_argument("--max-prompts", type=int, default=defaults.max_prompts, help="decode")
    parser.add_argument("--seed", type=int, default=defaults.seed)


def run_calibrate(args: argparse.Namespace) -> dict:
    from draftsmith.artifact import load_head
    from draftsmith.calibration.pipeline import calibrate_records
    from draftsmith.calibration.report import format_table
    from draftsmith.core.models import load_model

    target, tokenizer = load_model(args.target, dtype=args.dtype)
    head = load_head(args.artifact, target)
    config = CalibrateConfig(
        method=args.method,
        temperature=args.temperature,
        collect=args.collect,
        seq_len=args.seq_len,
        max_tokens=args.max_tokens,
        prompt_tokens=args.prompt_tokens,
        max_new_tokens=args.max_new_tokens,
        max_prompts=args.max_prompts,
        seed=args.seed,
    )
    records = _collect(args, head, target, tokenizer, config)
    metadata = {"target": args.target, "data": str(args.data), "artifact": str(args.artifact)}
    payload = calibrate_records(records, args.artifact, config, metadata)
    print(f"calibrator: {payload['method']} on {', '.join(payload['signals'])}")
    print(
        f"outcome: {payload['outcome']} ({config.collect}) over {payload['n_eval']} drafted "
        f"tokens; after: {payload['evaluation']}"
    )
    print(format_table(payload["metrics"]["before"], payload["metrics"]["after"]))
    ci = payload["ece_equal_mass_ci95"]
    print(
        "ece_equal_mass 95% interval (bootstrap over documents / prompts): before "
        f"[{ci['before'][0]:.4f}, {ci['before'][1]:.4f}], after "
        f"[{ci['after'][0]:.4f}, {ci['after'][1]:.4f}]"
    )
    print(f"wrote {args.artifact / 'calibration.json'} and {args.artifact / 'calibration'}/")
    return payload


def _collect(args: argparse.Namespace, head, target, tokenizer, config: CalibrateConfig):
    """The drafted-token records of `config.collect` over the held-out `args.data`."""
    from draftsmith.calibration.collect import collect_from_decoding, collect_teacher_forced
    from draftsmith.decoding import DraftLengthPolicy, SpeculativeDecoder

    sampling = config.temperature > 0
    temperature = config.temperature if sampling else 1.0
    if config.collect == "teacher-forced":
        documents = _held_out_documents(args.data, tokenizer, config)
        return collect_teacher_forced(head, target, documents, temperature=temperature)
    decoder = SpeculativeDecoder(
        target,
        head.as_drafter(target),
        tokenizer,
        policy=DraftLengthPolicy(max_draft_tokens=args.draft_tokens),
    )
    return collect_from_decoding(
        decoder,
        _held_out_prompts(args.data, tokenizer, config),
        max_new_tokens=config.max_new_tokens,
        temperature=temperature,
        decode_temperature=config.temperature,
        seed=config.seed,
    )


def _held_out_documents(data: str, tokenizer, config: CalibrateConfig) -> list:
    """(input_ids, loss_mask) of each held-out document, cut to seq_len tokens, up to
    max_tokens in all: a jsonl file whole, or the held-out split of a data source."""
    import torch

    from draftsmith.data.documents import DataConfig, encode_documents, load_documents

    # A file is held-out data as a whole: heldout_fraction 0 puts all of it in one split (a
    # missing path is `load_documents`' clear error).
    whole = Path(data).exists()
    split = {"split": "train", "heldout_fraction": 0.0} if whole else {"split": "heldout"}
    data_config = DataConfig(source=data, seq_len=config.seq_len, **split)
    documents, total = [], 0
    for ids, mask in encode_documents(
        load_documents(data_config), tokenizer, data_config.assistant_only_loss
    ):
        ids, mask = ids[: config.seq_len], mask[: config.seq_len]
        if any(mask[1:]):  # something to draft after the first token
            documents.append((torch.tensor(ids), torch.tensor(mask, dtype=torch.int8)))
            total += len(ids)
        if total >= config.max_tokens:
            break
    if len(documents) < 2:
        raise ValueError(
            f"calibration data {data} gives {len(documents)} document(s) with tokens to draft; "
            f"calibration fits on some documents and evaluates on others: give at least 2"
        )
    return documents


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
        from draftsmith.data.documents import DataConfig, load_documents

        documents = load_documents(DataConfig(source=data, split="heldout"))
        prompts, texts = [], [t for t in documents["text"] if t]
    stride = config.prompt_tokens + config.max_new_tokens
    if texts and len(prompts) < config.max_prompts:
        prompts += prompts_from_texts(
            texts, tokenizer, config.prompt_tokens, stride, config.max_prompts - len(prompts)
        )
    return prompts[: config.max_prompts]
