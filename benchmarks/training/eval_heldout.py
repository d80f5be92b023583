"""Held-out loss, top-1 agreement and tau_sim(k) of a drafter artifact on one data file, as the
trainer's evaluation computes them (teacher-forced at every position, counting the
completions / assistant turns, as a recipe's eval_data does), for comparing one head across
workloads:

    python benchmarks/training/eval_heldout.py ARTIFACT --target NAME --data FILE.jsonl \
        [--dtype float32] [--seq-len 512] [--max-tokens 32768] [--batch-size 4]

Prints one JSON record (the trainer's metrics plus the data file and row count).
"""

from __future__ import annotations

import argparse
import json

import torch
from accelerate import Accelerator

from draftsmith.artifact import load_head
from draftsmith.data.documents import DataConfig, build_dataset
from draftsmith.train.features import OnlineFeatures, packed_rows
from draftsmith.train.head_objective import HeadObjective
from draftsmith.train.metrics import Totals
from draftsmith.train.objectives import ObjectiveConfig
from draftsmith.zoo import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact")
    parser.add_argument("--target", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=32768)
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args()

    target, tokenizer = load_model(args.target, dtype=args.dtype)
    head = load_head(args.artifact, target).float()
    data = DataConfig(
        source=args.data,
        split="train",
        heldout_fraction=0.0,  # the file is held-out data as a whole
        seq_len=args.seq_len,
        max_tokens=args.max_tokens,
    )
    rows = OnlineFeatures(
        target, head.target_feature_layers, *packed_rows(build_dataset(data, tokenizer))
    )
    scored = HeadObjective(head, ObjectiveConfig()).eval()
    totals = Totals()
    with torch.no_grad():
        for chunk in torch.arange(len(rows)).split(args.batch_size):
            totals.add(scored(rows.batch(chunk, "cpu")))
    metrics = totals.reduce(Accelerator(cpu=True))
    print(json.dumps({"artifact": args.artifact, "data": args.data, "rows": len(rows), **metrics}))


if __name__ == "__main__":
    main()
