"""The one training loop of every drafter head kind, on Accelerate: setup, fit, evaluation, export.

    from draftsmith.train.config import load_train_config
    from draftsmith.train.trainer import train
    result = train(load_train_config("recipes/smollm2-135m/eagle3.yaml", ["max_steps=50"]))

Kinds differ only in what their `forward_train` reads and in the objective settings; the loop
is the same: the frozen target gives a `TargetBatch` (online or from a feature cache, see
`draftsmith.train.features`), `HeadObjective` scores the head's K step logits, and AdamW steps
under transformers' linear warm-up + cosine schedule with gradient accumulation, clipping and
optional autocast. The data order is `EpochSampler`'s; with ``resume`` the newest checkpoint
(`draftsmith.train.checkpoint`) is loaded and the run continues exactly as if it had never
stopped.

Outputs in `output_dir`: ``checkpoints/step_N`` (every `checkpoint_every` steps),
``metrics.jsonl`` and ``wandb/`` (`draftsmith.train.tracking`), ``train_config.yaml``, and the
artifact in ``drafter/``. Evaluation reports per-step teacher-forced top-1 agreement,
conditional acceptance and the simulated mean accepted length tau_sim (see
`draftsmith.train.objectives`).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import DistributedType, set_seed
from tqdm.auto import tqdm
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    get_cosine_schedule_with_warmup,
)

from draftsmith.core.config import config_to_dict, save_config
from draftsmith.core.models import resolve_dtype
from draftsmith.data.documents import build_dataset
from draftsmith.heads import build_head, fit_draft_vocab  # registers every kind
from draftsmith.train.acceptance import build_acceptance_head
from draftsmith.train.artifacts import load_trained, write_artifact
from draftsmith.train.checkpoint import (
    TrainerState,
    check_checkpointable,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from draftsmith.train.config import TrainConfig
from draftsmith.train.distributed import build_accelerator, check_deepspeed
from draftsmith.train.features import (
    CachedFeatures,
    FeatureCache,
    FeatureSource,
    OnlineFeatures,
    packed_rows,
    write_feature_cache,
)
from draftsmith.train.head_objective import HeadObjective
from draftsmith.train.metrics import Totals
from draftsmith.train.sampler import EpochSampler
from draftsmith.train.tracking import RunLog, log_with
from draftsmith.zoo import load_model

__all__ = ["TrainResult", "Trainer", "train"]

ARTIFACT_DIR = "drafter"


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


FIT_SAMPLE_ROWS = 8
"""Training rows a head fits its data-dependent values on (`DraftHead.fit_to_sample`)."""


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
        self.accelerator = acc = build_accelerator(
            _mixed_precision(config.mixed_precision), log_with(config)
        )
        check_deepspeed(acc, config.grad_accum, config.clip_grad_norm)
        if config.checkpoint_every:
            check_checkpointable(acc)  # before training, not at the first checkpoint
        set_seed(config.seed)
        self.output_dir = Path(config.output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.state = TrainerState()
        self.run_log = RunLog(acc, config)
        self.tokens_per_step = (
            config.batch_size * config.grad_accum * config.data.seq_len * acc.num_processes
        )
        self.cache_written: dict[str, float] | None = None
        """What this run added to the feature cache (rows, seconds, tokens_per_s); logged by fit."""

        if target is None or tokenizer is None:
            # On the accelerator's device, so that target_dtype auto is that device's precision.
            target, tokenizer = load_model(
                config.target, dtype=config.target_dtype, device=str(acc.device)
            )
        self.target = target.eval().requires_grad_(False).to(acc.device)
        train_rows = packed_rows(build_dataset(config.data, tokenizer))
        head = build_head(config.head, self.target, config.head_args).to(acc.device)
        head.check_tokenizer(tokenizer)
        if config.init_from is not None:
            load_trained(head, config.init_from, self.target)
        else:
            fit_draft_vocab(head, *train_rows, self.target.config.get_text_config().vocab_size)
        layers = tuple(head.target_feature_layers)

        self.train_source = self._train_source(*train_rows, layers)
        # Heads reading no target features fit nothing to them; trained ones are fitted already.
        if layers and config.init_from is None:
            # The same leading rows on every process, so each fits the same values.
            sample = torch.arange(min(FIT_SAMPLE_ROWS, len(self.train_source)))
            head.fit_to_sample(self.train_source.batch(sample, acc.device))
        if not config.train_drafter:  # else as built: a LoRA draft's base stays frozen
            head.requires_grad_(False)
        acceptance = None
        if config.acceptance_head is not None:
            acceptance = build_acceptance_head(head, config.acceptance_head).to(acc.device)
        eval_rows = packed_rows(build_dataset(self.config.held_out_data(), tokenizer))
        self.eval_source = OnlineFeatures(self.target, layers, *eval_rows)
        self.sampler = EpochSampler(
            len(self.train_source),
            config.batch_size,
            config.seed,
            acc.process_index,
            acc.num_processes,
        )

        objective = HeadObjective(head, config.objective, acceptance, config.train_drafter)
        # Together: FSDP2 shards the module, then points the optimizer at the sharded parameters.
        self.module, self.optimizer = acc.prepare(objective, self._optimizer(objective))
        # Not prepared: a prepared scheduler steps once per process per optimizer step.
        self.scheduler = get_cosine_schedule_with_warmup(
            self.optimizer, config.warmup_steps, config.max_steps
        )

    # ---------------------------------------------------------------------------------------
    # setup
    # ---------------------------------------------------------------------------------------

    def _train_source(
        self, input_ids: torch.Tensor, loss_mask: torch.Tensor, layers: tuple[int, ...]
    ) -> FeatureSource:
        """The training rows' features: online, or read from the feature cache after writing
        what it lacks."""
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

    def _optimizer(self, module: torch.nn.Module) -> torch.optim.Optimizer:
        """AdamW over `module`'s trainable parameters; weight decay on matrices only (never on
        biases and norms)."""
        decay, no_decay = [], []
        for param in module.parameters():
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
        """Train to `max_steps` (from the newest checkpoint when resuming), evaluate, export.
        Ends Accelerate's process group: the run's last collective call."""
        resumed_step = self._resume()
        config, acc, state = self.config, self.accelerator, self.state
        self.run_log.start(resumed_step)
        if acc.is_main_process:
            save_config(config, self.output_dir / "train_config.yaml")
            print(
                f"training {config.head} on {config.target}: {len(self.train_source):,} rows x "
                f"{config.data.seq_len} tokens, {acc.num_processes} process(es) "
                f"({acc.distributed_type.value}) on {acc.device}, steps {state.step} -> "
                f"{config.max_steps}; outputs in {self.output_dir}"
            )
        if self.cache_written is not None:
            self.run_log.log(state.step, "cache", self.cache_written)
        progress = tqdm(
            total=config.max_steps,
            initial=state.step,
            desc=f"training {config.head}",
            unit="step",
            disable=not acc.is_main_process,
        )
        window = Totals()
        while state.step < config.max_steps:
            started = time.perf_counter()
            grad_norm = self._train_step(window)
            state.train_seconds += time.perf_counter() - started
            state.train_tokens += self.tokens_per_step
            state.step += 1
            progress.update(1)
            done = state.step == config.max_steps
            if state.step % config.log_every == 0 or done:
                reduced = window.reduce(acc)
                window = Totals()
                record = {"loss": reduced["loss"], "top1": reduced["top1"]}
                if "acceptance_head" in reduced:
                    record["acceptance_bce"] = reduced["acceptance_head"]["bce"]
                if grad_norm is not None:
                    record["grad_norm"] = grad_norm
                # the lr of the next step, as the scheduler has already stepped
                record.update(lr=self.scheduler.get_last_lr()[0], tokens_per_s=state.tokens_per_s)
                progress.set_postfix(loss=f"{record['loss']:.3f}")
                self.run_log.log(state.step, "train", record)
            # the final evaluation follows the loop
            if config.eval_every and state.step % config.eval_every == 0 and not done:
                self.run_log.log(state.step, "eval", self.evaluate())
            if config.checkpoint_every and state.step % config.checkpoint_every == 0:
                save_checkpoint(acc, self.output_dir, state, **self._checkpointed())
        progress.close()
        metrics = self.evaluate()
        self.run_log.log(state.step, "eval", metrics)
        artifact = self._export(metrics)
        self._release_wrapper()
        self.run_log.finish()
        return TrainResult(artifact, state.step, metrics, state.tokens_per_s)

    def _release_wrapper(self) -> None:
        """Keep the bare module and free the DDP wrapper while the process group still exists:
        its reducer holds the group, and freed after `end_training` it joined the gloo threads
        of a destroyed group (a rank hung there in teardown under load)."""
        if isinstance(self.module, torch.nn.parallel.DistributedDataParallel):
            self.module = self.accelerator.unwrap_model(self.module)
            self.accelerator.free_memory()

    def _resume(self) -> int | None:
        """Load the newest checkpoint when `config.resume`: its step, or None (a fresh start)."""
        checkpoint = latest_checkpoint(self.output_dir) if self.config.resume else None
        if checkpoint is None:
            return None
        self.state = load_checkpoint(self.accelerator, checkpoint, **self._checkpointed())
        self.accelerator.print(f"resuming from {checkpoint} (step {self.state.step})")
        return self.state.step

    def _checkpointed(self) -> dict[str, Any]:
        """What a checkpoint holds besides the trainer state and the RNGs (the data order is a
        function of the step)."""
        return {"model": self.module, "optimizer": self.optimizer, "scheduler": self.scheduler}

    def _train_step(self, window: Totals) -> float | None:
        """One optimizer step over grad_accum micro-batches, their outputs added to `window`.
        Returns the gradient norm before clipping (None without clipping)."""
        config, acc = self.config, self.accelerator
        self.module.train()
        for micro in range(config.grad_accum):
            indices = self.sampler.indices(self.state.step * config.grad_accum + micro)
            batch = self.train_source.batch(indices, acc.device)
            last = micro == config.grad_accum - 1
            # DDP all-reduces the gradients once, on the last micro-batch
            with contextlib.nullcontext() if last else acc.no_sync(self.module):
                out = self.module(batch)
                acc.backward(out.loss / config.grad_accum)
            window.add(out)
        grad_norm = self._clip_gradients()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def _clip_gradients(self) -> float | None:
        """Clip to `clip_grad_norm`; returns the norm before clipping (the drafter's; the
        acceptance head's when only it trains), None without clipping. The acceptance head is
        clipped on its own, so it never changes the drafter's steps."""
        config, acc = self.config, self.accelerator
        if config.clip_grad_norm is None or acc.distributed_type == DistributedType.DEEPSPEED:
            return None  # DeepSpeed's engine clips inside its step, by its config
        objective = acc.unwrap_model(self.module)
        if objective.acceptance is None:
            return float(acc.clip_grad_norm_(self.module.parameters(), config.clip_grad_norm))
        norm = acc.clip_grad_norm_(objective.acceptance.parameters(), config.clip_grad_norm)
        if config.train_drafter:
            norm = acc.clip_grad_norm_(objective.head.parameters(), config.clip_grad_norm)
        return float(norm)

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """Held-out loss, per-step top-1 agreement, conditional acceptance and tau_sim(k) over
        the eval rows (each process takes every num_processes-th; see `Totals.reduce`)."""
        acc = self.accelerator
        self.module.eval()
        rows = len(self.eval_source) // acc.num_processes * acc.num_processes
        if rows == 0:
            raise ValueError(
                f"the held-out data has fewer rows than processes ({acc.num_processes})"
            )
        totals = Totals()
        mine = torch.arange(acc.process_index, rows, acc.num_processes)
        for chunk in mine.split(self.config.batch_size):
            totals.add(self.module(self.eval_source.batch(chunk, acc.device)))
        return totals.reduce(acc)

    def _export(self, metrics: dict[str, Any]) -> Path:
        """Write the artifact (`write_artifact`) with what this run trained and measured."""
        training = {
            "recipe": config_to_dict(self.config),
            "steps": self.state.step,
            "metrics": metrics,
            "throughput_tokens_per_s": round(self.state.tokens_per_s, 1),
            "num_processes": self.accelerator.num_processes,
        }
        out = self.output_dir / ARTIFACT_DIR
        return write_artifact(
            self.accelerator, self.module, self.config, self.target, training, out
        )


def _mixed_precision(setting: str) -> str:
    """auto: bf16 where dtype auto is bfloat16 (a CUDA device that has it, a CPU with bf16 matrix
    units: `resolve_dtype`), else full precision."""
    if setting != "auto":
        return setting
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return "bf16" if resolve_dtype("auto", device) == torch.bfloat16 else "no"
