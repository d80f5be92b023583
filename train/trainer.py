"""The one training loop of every drafter head kind, on Accelerate.

    from draftsmith.train.config import load_train_config
    from draftsmith.train.trainer import train
    result = train(load_train_config("recipes/smollm2-135m/eagle3.yaml", ["max_steps=50"]))

Kinds differ only in what their `forward_train` reads and in the objective settings; the loop
is the same: the frozen target gives a `TargetBatch` (online or from a feature cache), the head
returns K step logits, `draft_objective` scores them, AdamW steps under a warm-up + cosine
schedule with gradient accumulation, clipping and optional autocast.

**Data order** is a pure function of (seed, micro-batch number): epoch e visits the rows in
``randperm(seed + e)``, process r taking the r-th slice of each global batch. Resuming needs no
sampler state, only the step.

**Checkpoints** (every `checkpoint_every` steps) are `accelerator.save_state` folders (model in
safetensors; optimizer, scheduler and RNG states as accelerate writes them) at
``output_dir/checkpoints/step_N``, written under ``step_N.tmp`` and renamed when complete, with a
``trainer_state.json``. With ``resume`` the newest one is loaded and the run continues exactly
as if it had never stopped.

**Outputs** in `output_dir`: ``metrics.jsonl`` (one JSON record per log or evaluation),
``train_config.yaml``, ``wandb/`` (offline unless configured), and the artifact in ``drafter/``.
Evaluation reports per-step teacher-forced top-1 agreement, conditional acceptance and the
simulated mean accepted length tau_sim (see `draftsmith.train.objectives`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from datasets import Dataset
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from draftsmith.core.config import config_to_dict, save_config
from draftsmith.core.target import TargetBatch
from draftsmith.data.documents import DataConfig, build_dataset
from draftsmith.heads import DraftHead, build_head, fit_draft_vocab  # registers every built-in kind
from draftsmith.train.config import TrainConfig
from draftsmith.train.features import (
    CachedFeatures,
    FeatureCache,
    FeatureSource,
    OnlineFeatures,
    write_feature_cache,
)
from draftsmith.train.objectives import (
    Agreement,
    ObjectiveConfig,
    ObjectiveOutput,
    draft_objective,
)

__all__ = [
    "EpochSampler",
    "HeadObjective",
    "TrainResult",
    "Trainer",
    "build_head",
    "fit_draft_vocab",
    "latest_checkpoint",
    "lr_factor",
    "train",
]

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
TRAINER_STATE = "trainer_state.json"
METRICS_FILE = "metrics.jsonl"
ARTIFACT_DIR = "drafter"
_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class TrainResult:
    artifact: Path
    """The exported drafter (`output_dir/drafter`)."""
    steps: int
    """Optimizer steps the run reached."""
    metrics: dict[str, Any]
    """Final held-out evaluation (see `Trainer.evaluate`)."""
    tokens_per_s: float
    """Training throughput over all processes (target + head, evaluation excluded)."""


def train(
    config: TrainConfig,
    *,
    target: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> TrainResult:
    """Run `config` to the end (resuming if a checkpoint exists) and write the artifact."""
    return Trainer(config, target=target, tokenizer=tokenizer).fit()


class HeadObjective(nn.Module):
    """A head and its objective as one module: what Accelerate wraps (DDP/FSDP, autocast).

    Going through `forward` (not `head.forward_train` directly) is what lets DDP synchronise
    gradients and autocast cover the step.
    """

    def __init__(self, head: DraftHead, objective: ObjectiveConfig) -> None:
        super().__init__()
        self.head = head
        self.objective = objective

    def forward(self, batch: TargetBatch) -> ObjectiveOutput:
        step_logits = self.head.forward_train(batch)
        out = draft_objective(
            step_logits,
            batch.target_logits,
            batch.loss_mask,
            self.objective,
            self.head.draft_to_target(),
            self.head.first_drafted_step,
        )
        auxiliary = self.head.auxiliary_loss()  # a kind's own extra term (EAGLE's regression)
        if auxiliary is not None:
            out.loss = out.loss + auxiliary
        return out


class EpochSampler:
    """Row indices of every micro-batch, a pure function of (seed, micro-batch number).

    Epoch e visits the rows in ``randperm(num_rows, seed + e)``; a global batch is
    ``batch_size * world_size`` consecutive rows of it, process `rank` taking its slice. Rows
    left over at an epoch's end are skipped (each epoch a different few).
    """

    def __init__(self, num_rows: int, batch_size: int, seed: int, rank: int, world_size: int):
        self.global_batch = batch_size * world_size
        self.per_epoch = num_rows // self.global_batch
        if self.per_epoch == 0:
            raise ValueError(
                f"{num_rows} training rows are fewer than one global batch of {self.global_batch} "
                f"(batch_size {batch_size} x {world_size} processes): add data (data.max_tokens) "
                f"or lower batch_size"
            )
        self.num_rows, self.batch_size, self.seed, self.rank = num_rows, batch_size, seed, rank
        self._epoch, self._order = -1, torch.empty(0, dtype=torch.long)

    def indices(self, micro_step: int) -> torch.Tensor:
        """(batch_size,) row indices of micro-batch `micro_step` (0-based, over the whole run)."""
        epoch, position = divmod(micro_step, self.per_epoch)
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            self._epoch, self._order = epoch, torch.randperm(self.num_rows, generator=generator)
        start = position * self.global_batch + self.rank * self.batch_size
        return self._order[start : start + self.batch_size]


def lr_factor(step: int, warmup_steps: int, max_steps: int) -> float:
    """Multiplier of the peak lr at `step`: linear warm-up from 1/(warmup+1), then cosine to 0."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete ``checkpoints/step_N`` folder of a run, or None."""
    folder = Path(output_dir) / CHECKPOINTS
    found = [
        (int(match.group(1)), path)
        for path in (folder.iterdir() if folder.is_dir() else [])
        if (match := _STEP_DIR.match(path.name)) and (path / TRAINER_STATE).is_file()
    ]
    return max(found)[1] if found else None


class Trainer:
    """One run: builds everything from the config, then `fit()` trains, evaluates and exports."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        target: PreTrainedModel | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> None:
        """target, tokenizer: an already loaded target (else loaded from `config.target`)."""
        self.config = config
        # cpu=True where there is no accelerator: only then does Accelerate join the processes
        # `accelerate launch` started into one MULTI_CPU (gloo) group rather than leave each alone.
        self.accelerator = Accelerator(
            mixed_precision=_mixed_precision(config.mixed_precision),
            cpu=not torch.accelerator.is_available(),
        )
        acc = self.accelerator
        set_seed(config.seed)
        self.output_dir = Path(config.output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.step = 0
        self.train_seconds = 0.0
        self.train_tokens = 0
        self._wandb = None
        self.cache_written: dict[str, float] | None = None
        """What this run added to the feature cache (rows, seconds, tokens/s); logged by fit."""

        if target is None or tokenizer is None:
            from draftsmith.core.models import load_model

            target, tokenizer = load_model(config.target, dtype=config.target_dtype)
        self.target = target.eval().requires_grad_(False).to(acc.device)
        train_rows = self._rows(build_dataset(config.data, tokenizer))
        head = build_head(config.head, self.target, config.head_args).to(acc.device)
        fit_draft_vocab(head, *train_rows, self.target.config.get_text_config().vocab_size)
        layers = tuple(head.target_feature_layers)

        self.train_source = self._train_source(*train_rows, layers)
        eval_rows = self._rows(build_dataset(self._eval_data(), tokenizer))
        self.eval_source = OnlineFeatures(self.target, layers, *eval_rows)
        self.sampler = EpochSampler(
            len(self.train_source),
            config.batch_size,
            config.seed,
            acc.process_index,
            acc.num_processes,
        )

        self.module = acc.prepare(HeadObjective(head, config.objective))
        self.optimizer = acc.prepare(self._optimizer())
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: lr_factor(step, config.warmup_steps, config.max_steps)
        )
        # Not prepared: a prepared scheduler steps once per process per optimizer step.
        acc.register_for_checkpointing(self.scheduler)

    # ---------------------------------------------------------------------------------------
    # setup
    # ---------------------------------------------------------------------------------------

    @staticmethod
    def _rows(dataset: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids, loss_mask (N, T) of packed rows."""
        table = dataset.with_format("numpy")
        return (
            torch.from_numpy(np.asarray(table["input_ids"], dtype=np.int32)),
            torch.from_numpy(np.asarray(table["loss_mask"], dtype=np.int8)),
        )

    def _train_source(
        self, input_ids: torch.Tensor, loss_mask: torch.Tensor, layers: tuple[int, ...]
    ) -> FeatureSource:
        if self.config.feature_cache is None:
            return OnlineFeatures(self.target, layers, input_ids, loss_mask)
        acc = self.accelerator
        started = time.perf_counter()
        written = write_feature_cache(
            self.target,
            input_ids,
            loss_mask,
            layers,
            self.config.feature_cache,
            target_name=self.config.target,
            dtype=self.config.feature_cache_dtype,
            batch_size=self.config.batch_size,
            rank=acc.process_index,
            world_size=acc.num_processes,
        )
        acc.wait_for_everyone()
        rows = int(acc.reduce(torch.tensor(written), reduction="sum"))
        if rows:
            seconds = time.perf_counter() - started
            tokens = rows * input_ids.shape[1]
            self.cache_written = {
                "rows": rows,
                "seconds": seconds,
                "tokens_per_s": tokens / seconds,
            }
            acc.print(
                f"feature cache: wrote {rows:,} rows in {seconds:.0f} s, {tokens / seconds:,.0f} tokens/s"
            )
        return CachedFeatures(self.target, layers, FeatureCache(self.config.feature_cache))

    def _eval_data(self) -> DataConfig:
        config = self.config
        if config.eval_data is not None:
            return config.eval_data
        rows = config.eval_batches * config.batch_size
        return replace(config.data, split="heldout", max_tokens=rows * config.data.seq_len)

    def _optimizer(self) -> torch.optim.Optimizer:
        decay, no_decay = [], []
        for param in self.module.parameters():
            if param.requires_grad:
                (decay if param.ndim >= 2 else no_decay).append(param)
        if not decay and not no_decay:
            raise ValueError(f"head {self.config.head!r} has no trainable parameters")
        groups = [
            {"params": decay, "weight_decay": self.config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(
            [g for g in groups if g["params"]], lr=self.config.lr, betas=self.config.adam_betas
        )

    # ---------------------------------------------------------------------------------------
    # the loop
    # ---------------------------------------------------------------------------------------

    def fit(self) -> TrainResult:
        config, acc = self.config, self.accelerator
        self._resume()
        if acc.is_main_process:
            save_config(config, self.output_dir / "train_config.yaml")
            self._start_wandb()
            if self.cache_written is not None:
                self._log("cache", self.cache_written)
            print(
                f"training {config.head} on {config.target}: {len(self.train_source):,} rows x "
                f"{config.data.seq_len} tokens, {acc.num_processes} process(es) on "
                f"{acc.device}, steps {self.step} -> {config.max_steps}; outputs in "
                f"{self.output_dir}"
            )
        progress = tqdm(
            total=config.max_steps,
            initial=self.step,
            desc=f"training {config.head}",
            unit="step",
            disable=not acc.is_main_process,
        )
        window = _Window()
        while self.step < config.max_steps:
            started = time.perf_counter()
            outputs, grad_norm = self._train_step()
            self.train_seconds += time.perf_counter() - started
            self.train_tokens += self._tokens_per_step()
            window.add(outputs, grad_norm)
            self.step += 1
            progress.update(1)
            done = self.step == config.max_steps
            if self.step % config.log_every == 0 or done:
                record = window.flush(acc)
                record.update(lr=self.scheduler.get_last_lr()[0], tokens_per_s=self.tokens_per_s)
                progress.set_postfix(loss=f"{record['loss']:.3f}")
                self._log("train", record)
            # the final evaluation follows the loop
            if config.eval_every and self.step % config.eval_every == 0 and not done:
                self._log("eval", self.evaluate())
            if config.checkpoint_every and self.step % config.checkpoint_every == 0:
                self.save_checkpoint()
        progress.close()
        metrics = self.evaluate()
        self._log("eval", metrics)
        artifact = self._export(metrics)
        if self._wandb is not None:
            self._wandb.finish()
        acc.wait_for_everyone()
        return TrainResult(artifact, self.step, metrics, self.tokens_per_s)

    def _train_step(self) -> tuple[list[ObjectiveOutput], float | None]:
        """One optimizer step over grad_accum micro-batches: their detached outputs and the
        gradient norm before clipping (None without clipping)."""
        config, acc = self.config, self.accelerator
        self.module.train()
        outputs = []
        for micro in range(config.grad_accum):
            indices = self.sampler.indices(self.step * config.grad_accum + micro)
            batch = _float_features(self.train_source.batch(indices, acc.device))
            last = micro == config.grad_accum - 1
            with contextlib.nullcontext() if last else acc.no_sync(self.module):
                out = self.module(batch)
                acc.backward(out.loss / config.grad_accum)
            outputs.append(_detached(out))
        grad_norm = None
        if config.clip_grad_norm is not None:
            grad_norm = float(acc.clip_grad_norm_(self.module.parameters(), config.clip_grad_norm))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return outputs, grad_norm

    def _tokens_per_step(self) -> int:
        config = self.config
        return (
            config.batch_size
            * config.grad_accum
            * config.data.seq_len
            * self.accelerator.num_processes
        )

    @property
    def tokens_per_s(self) -> float:
        """Training tokens per second over all processes (evaluation and checkpoints excluded)."""
        return self.train_tokens / self.train_seconds if self.train_seconds else 0.0

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """Held-out loss, per-step top-1 agreement, conditional acceptance and tau_sim(k)."""
        acc, config = self.accelerator, self.config
        self.module.eval()
        rows = len(self.eval_source) // acc.num_processes * acc.num_processes
        if rows == 0:
            raise ValueError(
                f"the held-out data has fewer rows than processes ({acc.num_processes})"
            )
        mine = torch.arange(acc.process_index, rows, acc.num_processes)
        agreement, loss_sum, step_loss_sum, batches = None, 0.0, 0.0, 0
        for chunk in mine.split(config.batch_size):
            out = self.module(_float_features(self.eval_source.batch(chunk, acc.device)))
            agreement = out.agreement if agreement is None else agreement + out.agreement
            loss_sum += out.loss.float()
            step_loss_sum += out.step_losses.float()
            batches += 1
        counts = acc.reduce(agreement.as_tensor(), reduction="sum")
        losses = acc.reduce(torch.cat([loss_sum[None], step_loss_sum]), reduction="mean") / batches
        agreement = Agreement.from_tensor(counts.cpu())
        return {
            "loss": float(losses[0]),
            "step_loss": [round(float(x), 5) for x in losses[1:]],
            "top1": _rounded(agreement.top1()),
            "acceptance": _rounded(agreement.acceptance()),
            "tau_sim": _rounded(agreement.tau_sim()),
            "positions": int(agreement.total[0]),
        }

    # ---------------------------------------------------------------------------------------
    # checkpoints, logs, export
    # ---------------------------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        """Save a resumable checkpoint of the current step (temporary name, then rename)."""
        acc = self.accelerator
        folder = self.output_dir / CHECKPOINTS
        final = folder / f"step_{self.step}"
        tmp = folder / f"step_{self.step}.tmp"
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        acc.wait_for_everyone()
        acc.save_state(str(tmp), safe_serialization=True)
        acc.wait_for_everyone()
        if acc.is_main_process:
            state = {
                "step": self.step,
                "train_seconds": self.train_seconds,
                "train_tokens": self.train_tokens,
                "num_processes": acc.num_processes,
            }
            (tmp / TRAINER_STATE).write_text(json.dumps(state, indent=2) + "\n")
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        acc.wait_for_everyone()
        return final

    def _resume(self) -> None:
        checkpoint = latest_checkpoint(self.output_dir) if self.config.resume else None
        if checkpoint is None:
            if self.accelerator.is_main_process:
                (self.output_dir / METRICS_FILE).unlink(missing_ok=True)
            return
        state = json.loads((checkpoint / TRAINER_STATE).read_text())
        if state["num_processes"] != self.accelerator.num_processes:
            raise ValueError(
                f"checkpoint {checkpoint} was written by {state['num_processes']} processes; "
                f"resume it with the same number (now {self.accelerator.num_processes})"
            )
        self.accelerator.load_state(str(checkpoint))
        self.step = state["step"]
        self.train_seconds = state["train_seconds"]
        self.train_tokens = state["train_tokens"]
        if self.accelerator.is_main_process:
            print(f"resuming from {checkpoint} (step {self.step})")
            _truncate_metrics(self.output_dir / METRICS_FILE, self.step)

    def _log(self, split: str, record: dict[str, Any]) -> None:
        if not self.accelerator.is_main_process:
            return
        record = {"step": self.step, "split": split, **record}
        with (self.output_dir / METRICS_FILE).open("a") as out:
            out.write(json.dumps(record) + "\n")
        if split == "eval":
            tqdm.write(
                f"step {self.step}: held-out loss {record['loss']:.4f}, top-1 agreement by step "
                f"{record['top1']}, tau_sim {record['tau_sim']}"
            )
        if self._wandb is not None:
            self._wandb.log(_flatten(split, record), step=self.step)

    def _start_wandb(self) -> None:
        mode = self.config.wandb_mode or os.environ.get("WANDB_MODE", "offline")
        if mode == "disabled":
            return
        import wandb

        self._wandb = wandb.init(
            project=self.config.wandb_project,
            mode=mode,
            dir=str(self.output_dir),
            name=self.output_dir.name,
            config=config_to_dict(self.config),
        )

    def _export(self, metrics: dict[str, Any]) -> Path:
        """Write the artifact from the main process. The weights go through a full state dict
        (gathered when FSDP shards them) loaded into a fresh head, so every strategy exports
        the same way."""
        from draftsmith.artifact import save_artifact

        acc = self.accelerator
        out = self.output_dir / ARTIFACT_DIR
        state = acc.get_state_dict(self.module)  # every process takes part in the gather
        if acc.is_main_process:
            head = build_head(self.config.head, self.target, self.config.head_args).to(acc.device)
            head.load_state_dict({k.removeprefix("head."): v for k, v in state.items()})
            training = {
                "recipe": config_to_dict(self.config),
                "steps": self.step,
                "metrics": metrics,
                "throughput_tokens_per_s": round(self.tokens_per_s, 1),
                "num_processes": acc.num_processes,
            }
            out = save_artifact(
                head, self.target, out, training=training, target_name_or_path=self.config.target
            )
            print(f"drafter written to {out}")
        acc.wait_for_everyone()
        return out


class _Window:
    """Training outputs since the last log line, reduced over processes when flushed."""

    def __init__(self) -> None:
        self.outputs: list[ObjectiveOutput] = []
        self.grad_norm: float | None = None

    def add(self, outputs: list[ObjectiveOutput], grad_norm: float | None) -> None:
        self.outputs += outputs
        self.grad_norm = grad_norm

    def flush(self, acc: Accelerator) -> dict[str, Any]:
        losses = torch.stack([o.loss for o in self.outputs]).float().mean()
        agreement = self.outputs[0].agreement
        for o in self.outputs[1:]:
            agreement = agreement + o.agreement
        loss = float(acc.reduce(losses.to(acc.device), reduction="mean"))
        counts = acc.reduce(agreement.as_tensor().to(acc.device), reduction="sum").cpu()
        self.outputs = []
        record: dict[str, Any] = {
            "loss": loss,
            "top1": _rounded(Agreement.from_tensor(counts).top1()),
        }
        if self.grad_norm is not None:
            record["grad_norm"] = self.grad_norm
        return record


def _float_features(batch: TargetBatch) -> TargetBatch:
    """Features in float32, the head's master precision (autocast, when on, lowers them)."""
    if batch.features is not None:
        batch.features = batch.features.float()
    return batch


def _detached(out: ObjectiveOutput) -> ObjectiveOutput:
    return ObjectiveOutput(out.loss.detach(), out.step_losses, out.agreement)


def _mixed_precision(setting: str) -> str:
    """auto: bf16 on a CUDA device that has it; else full precision (CPU autocast is opt-in:
    it is only faster on CPUs with bf16 matrix units)."""
    if setting != "auto":
        return setting
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


def _rounded(values: list[float]) -> list[float | None]:
    return [None if math.isnan(v) else round(v, 5) for v in values]


def _flatten(split: str, record: dict[str, Any]) -> dict[str, float]:
    """wandb keys: lists become one series per draft step (1-based)."""
    flat = {}
    for key, value in record.items():
        if key in ("step", "split"):
            continue
        if isinstance(value, list):
            flat.update({f"{split}/{key}_{k + 1}": v for k, v in enumerate(value) if v is not None})
        else:
            flat[f"{split}/{key}"] = value
    return flat


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop the records a resumed run will write again (those after its checkpoint's step)."""
    if not path.is_file():
        return
    kept = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= step]
    tmp = path.with_name(f"{path.name}.tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept))
    tmp.replace(path)
