"""``draftsmith prepare-data`` and ``draftsmith regenerate``: training data from a source."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from draftsmith.core.config import field_docs
from draftsmith.data.documents import SPLITS, DataConfig, prepare_data
from draftsmith.data.regenerate import (
    RegenerateConfig,
    completed_ids,
    continue_texts,
    regenerate,
)


def add_prepare_data_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``draftsmith prepare-data``; each `DataConfig` field's docstring is its help."""
    docs = field_docs(DataConfig)
    defaults = {f.name: f.default for f in fields(DataConfig) if f.name != "source"}
    parser.add_argument(
        "--target",
        required=True,
        help="zoo name, local folder or hub id of "
        "the target model, whose tokenizer and chat template render the data",
    )
    parser.add_argument("--source", required=True, help=docs["source"])
    parser.add_argument("--out", required=True, type=Path, help="output folder (Arrow)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument("--split", choices=SPLITS, help=docs["split"])
    parser.add_argument("--seq-len", type=int, help=docs["seq_len"])
    parser.add_argument("--max-tokens", type=int, help=docs["max_tokens"])
    parser.add_argument("--max-documents", type=int, help=docs["max_documents"])
    parser.add_argument("--heldout-fraction", type=float, help=docs["heldout_fraction"])
    parser.add_argument("--seed", type=int, help=docs["seed"])
    parser.add_argument(
        "--assistant-only-loss",
        action=argparse.BooleanOptionalAction,
        help=docs["assistant_only_loss"],
    )
    parser.add_argument(
        "--include-tests", action=argparse.BooleanOptionalAction, help=docs["include_tests"]
    )
    parser.add_argument(
        "--text-sample-by", choices=("document", "paragraph", "line"), help=docs["text_sample_by"]
    )
    parser.add_argument("--hub-config", help=docs["hub_config"])
    parser.add_argument("--hub-split", help=docs["hub_split"])
    parser.set_defaults(**defaults)


def run_prepare_data(args: argparse.Namespace) -> Path:
    """Run ``draftsmith prepare-data`` with the parsed `args`; returns the output folder."""
    from transformers import AutoTokenizer

    from draftsmith.core.zoo import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.target))
    config = DataConfig(**{f.name: getattr(args, f.name) for f in fields(DataConfig)})
    return prepare_data(config, tokenizer, args.out, overwrite=args.overwrite)


def add_regenerate_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``draftsmith regenerate``."""
    defaults = RegenerateConfig()
    parser.add_argument("--target", required=True, help="zoo name, local folder or hub id")
    parser.add_argument(
        "--source", required=True, help="stdlib, chitchat, a local file or folder, or a hub name"
    )
    parser.add_argument("--out", required=True, type=Path, help="jsonl to write (resumes)")
    parser.add_argument("--split", default="train", choices=("train", "heldout"))
    parser.add_argument(
        "--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16")
    )
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    parser.add_argument(
        "--prompt-tokens", type=int, default=defaults.prompt_tokens, help="text sources"
    )
    parser.add_argument(
        "--prompts-per-document",
        type=int,
        default=defaults.prompts_per_document,
        help="text sources",
    )
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument(
        "--max-records",
        type=int,
        default=None,
        help="the first N records in all (a rerun only finishes them)",
    )
    parser.add_argument("--sample", action="store_true", help="sample instead of greedy")
    parser.add_argument("--temperature", type=float, default=defaults.temperature)
    parser.add_argument("--top-p", type=float, default=defaults.top_p)
    parser.add_argument("--seed", type=int, default=defaults.seed)


def run_regenerate(args: argparse.Namespace) -> int:
    """Run ``draftsmith regenerate``: chat sources get their answers rewritten, text sources are
    continued (`continue_texts`). Returns the number of records written."""
    from draftsmith.core.models import load_model
    from draftsmith.data.documents import DataConfig, load_documents

    config = RegenerateConfig(
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        do_sample=args.sample,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        max_records=args.max_records,
        prompt_tokens=args.prompt_tokens,
        prompts_per_document=args.prompts_per_document,
    )
    documents = load_documents(DataConfig(source=args.source, split=args.split, seed=args.seed))
    model, tokenizer = load_model(args.target, dtype=args.dtype)
    chat = [d for d in documents if d["messages"]]
    text = [d for d in documents if not d["messages"]]
    written = 0
    if chat:
        written += regenerate(chat, model, tokenizer, args.out, config)
    if text:
        written += continue_texts(text, model, tokenizer, args.out, config)
    print(f"{args.out}: {written:,} new records ({len(completed_ids(args.out)):,} in all)")
    return written
