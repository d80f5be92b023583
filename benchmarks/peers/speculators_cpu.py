"""Run vLLM speculators' own EAGLE-3 trainer on a CPU, in speculators' environment.

    $SPECULATORS_PYTHON benchmarks/peers/speculators_cpu.py --rows ROWS.safetensors \
        --stats STATS.json -- SPECULATORS_TRAIN_FLAGS...

Called by `speculators_eagle3.py`, which writes ROWS (the packed rows draftsmith's recipe trains
on) and one hidden-state file per row under `<data-path>/hidden_states/` in the layout the
trainer's offline path reads (`hs_<i>.safetensors`: token_ids (T,), hidden_states (T, 4, H):
the three feature layers, then the last layer before the final norm). This script adds the
arrow dataset the trainer indexes (input_ids, loss_mask, seq_len per row), then runs
`speculators.train.cli.main` with the flags after `--`.

speculators 0.9 assumes an accelerator in three places; only those are patched, never the
algorithm: the device the trainer moves the model and batches to (its local rank, an int, i.e.
cuda:0) becomes "cpu"; its autocast device type (which falls back to "cuda") becomes "cpu";
`torch.accelerator.synchronize` (its step timer) does nothing without an accelerator. Its fused
losses need Triton, so the caller passes `--loss-implementation eager` (the same loss, unfused).
The training loop is timed around each epoch, and the tokens it trains on are counted from the
batches' document ids, for `--stats`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from datasets import Dataset
from safetensors.torch import load_file


def write_dataset(rows: Path, data_path: Path) -> int:
    """The arrow dataset speculators' `ArrowDataset` reads, one sample per packed row."""
    tensors = load_file(str(rows))
    input_ids, loss_mask = tensors["input_ids"].long(), tensors["loss_mask"].long()
    dataset = Dataset.from_dict(
        {
            "input_ids": input_ids.tolist(),
            "loss_mask": loss_mask.tolist(),
            "seq_len": [input_ids.shape[1]] * input_ids.shape[0],
        }
    ).with_format("torch")
    dataset.save_to_disk(str(data_path))
    return input_ids.shape[0]


def patch_for_cpu(stats: dict) -> None:
    """Point speculators' trainer at the CPU and count what it trains on (see the docstring)."""
    from speculators.train import trainer as trainer_module

    if not torch.accelerator.is_available():
        torch.accelerator.synchronize = lambda *args, **kwargs: None
    trainer_module.get_local_rank = lambda: "cpu"
    original_init = trainer_module.Trainer.__init__
    original_epoch = trainer_module.Trainer.train_epoch

    def init(self, model, *args, **kwargs):
        original_init(self, model, *args, **kwargs)
        self.device_type = "cpu"
        forward = self.model.forward

        def counted(*f_args, **f_kwargs):
            if self.model.training:
                stats["tokens"] += int((f_kwargs["document_ids"] != -1).sum())
                stats["steps"] += 1
            return forward(*f_args, **f_kwargs)

        self.model.forward = counted

    def train_epoch(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return original_epoch(self, *args, **kwargs)
        finally:
            stats["train_seconds"] += time.perf_counter() - start

    trainer_module.Trainer.__init__ = init
    trainer_module.Trainer.train_epoch = train_epoch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=Path, required=True)
    parser.add_argument("--stats", type=Path, required=True)
    parser.add_argument("train_flags", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    flags = args.train_flags[1:] if args.train_flags[:1] == ["--"] else args.train_flags
    data_path = Path(flags[flags.index("--data-path") + 1])
    rows = write_dataset(args.rows, data_path)

    stats = {"rows": rows, "tokens": 0, "steps": 0, "train_seconds": 0.0}
    patch_for_cpu(stats)
    from speculators.train.cli import main as train
    from speculators.train.config import TrainConfig

    torch.set_num_threads(max(1, torch.get_num_threads()))
    train(TrainConfig.resolve(flags))
    stats["tokens_per_s"] = round(stats["tokens"] / max(stats["train_seconds"], 1e-9), 1)
    args.stats.write_text(json.dumps(stats, indent=2) + "\n")
    print(json.dumps(stats), file=sys.stderr)


if __name__ == "__main__":
    main()
