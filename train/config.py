"""The typed config of a training run: a YAML recipe plus ``key=value`` overrides -> `TrainConfig`.

config = load_train_config("recipes/smollm2-135m/eagle3.yaml", ["max_steps=100"])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from draftsmith.artifact import read_artifact_config
from draftsmith.core.config import ConfigError, load_config
from draftsmith.core.models import Dtype
from draftsmith.data.documents import DataConfig
from draftsmith.heads import HeadConfig, head_config
from draftsmith.heads.acceptance import AcceptanceHeadConfig
from draftsmith.train.objectives import ObjectiveConfig

MixedPrecision = Literal["auto", "no", "bf16", "fp16"]


@dataclass(kw_only=True)
class TrainConfig:
    """One training run of one drafter head on one frozen target."""

    target: str
    """The frozen target: zoo name (smollm2-135m, ...), local folder or hub id."""
    target_dtype: Dtype = "auto"
    """Precision the target runs in (auto: the device's fast one: bfloat16 on a GPU and on a CPU
    with bf16 matrix units, float32 elsewhere)."""
    head: str
    """Head kind, as registered (eagle3, eagle, mtp, medusa, distilled, ...)."""
    head_args: dict[str, Any] | HeadConfig = field(default_factory=dict)
    """The head's hyper-parameters: keys of its kind's config (eagle3: Eagle3Config, medusa:
    MedusaConfig, ...), checked when the recipe is read and held as that typed config."""
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    """Divergence and per-step decay the head is trained with."""
    acceptance_head: AcceptanceHeadConfig | None = None
    """Also train a learned acceptance head (SpecDec++) on the head's detached hidden states
    and confidence signals, by binary cross-entropy against teacher-forced acceptance (the
    head's own training is unchanged); saved in the artifact. None: none."""
    init_from: str | None = None
    """A trained artifact of this head (kind and head_args as the recipe's) to start from: its
    weights replace the fresh head's. None: a fresh head."""
    train_drafter: bool = True
    """False: the head stays frozen (from init_from) and only the acceptance head trains."""
    data: DataConfig
    """Training rows (the `train` split); `data.seq_len` is the sequence length."""
    eval_data: DataConfig | None = None
    """Held-out rows (None: `data` with split heldout); without a max_tokens of their own, the
    first eval_batches * batch_size of them (`held_out_data`)."""
    batch_size: int = 8
    """Rows per micro-batch on each process."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (rows per step: batch_size * grad_accum * processes)."""
    lr: float = 1e-4
    """Peak learning rate of AdamW."""
    adam_betas: tuple[float, float] = (0.9, 0.95)
    """AdamW's (beta1, beta2)."""
    weight_decay: float = 0.0
    """AdamW weight decay of matrices (never of biases and norms)."""
    warmup_steps: int = 0
    """Linear warm-up steps, then a cosine decay to zero at max_steps."""
    max_steps: int
    """Optimizer steps of the whole run (resumed runs count from the checkpoint)."""
    clip_grad_norm: float | None = 1.0
    """Clip the gradient's global L2 norm to this; None: no clipping."""
    mixed_precision: MixedPrecision = "auto"
    """Autocast of the head: no, bf16, fp16, or auto (bf16 where target_dtype auto is bfloat16:
    a GPU that has it, a CPU with bf16 matrix units; else no)."""
    seed: int = 0
    """Seeds the data order and every RNG (a head seeds its own init: head_args.seed)."""
    checkpoint_every: int = 0
    """Save a resumable checkpoint every N steps to output_dir/checkpoints/step_N; 0: never."""
    resume: bool = True
    """Continue from the newest checkpoint under output_dir/checkpoints when there is one."""
    eval_every: int = 0
    """Evaluate on the held-out rows every N steps (and always at the end); 0: only at the end."""
    eval_batches: int = 8
    """Held-out micro-batches per evaluation (over all processes)."""
    log_every: int = 10
    """Log training metrics every N steps."""
    output_dir: str
    """Run folder: metrics.jsonl, checkpoints/, wandb/, and the artifact in drafter/."""
    feature_cache: str | None = None
    """Folder of cached target features (written on first use, resumable); None: run the
    target online in the training loop."""
    feature_cache_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    """Precision of the cached hidden states."""
    wandb_project: str = "draftsmith"
    """Weights & Biases project."""
    wandb_mode: Literal["online", "offline", "disabled"] | None = None
    """None: $WANDB_MODE if set, else offline (logs under output_dir/wandb, `wandb sync` later)."""
    tensorboard: bool = False
    """Also write TensorBoard event files to output_dir/tensorboard (needs the tensorboard
    package: pip install tensorboard)."""

    def __post_init__(self) -> None:
        try:
            self.head_args = head_config(self.head, self.head_args)
        except ConfigError:
            raise
        except ValueError as error:  # an unknown kind, or one with nothing to train
            raise ConfigError(f"head: {error}") from None
        for name in ("batch_size", "grad_accum", "max_steps", "eval_batches", "log_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "checkpoint_every", "eval_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.warmup_steps >= self.max_steps:
            raise ConfigError(
                f"warmup_steps ({self.warmup_steps}) must be below max_steps ({self.max_steps})"
            )
        if not self.train_drafter and (self.acceptance_head is None or self.init_from is None):
            raise ConfigError(
                "train_drafter: false trains only a learned acceptance head beside a trained "
                "drafter: give acceptance_head (e.g. acceptance_head.width=64) and init_from "
                "(the trained artifact)"
            )
        if self.init_from is not None:
            self._check_init_from()
        if self.data.split != "train":
            raise ConfigError(f"data.split must be train, got {self.data.split!r}")
        if self.eval_data is not None and self.eval_data.seq_len != self.data.seq_len:
            raise ConfigError(
                f"eval_data.seq_len ({self.eval_data.seq_len}) differs from data.seq_len "
                f"({self.data.seq_len})"
            )

    def held_out_data(self) -> DataConfig:
        """What an evaluation reads: eval_data, or `data` with split heldout, cut to
        eval_batches * batch_size rows unless it sets max_tokens itself (packing stops there, so
        a whole held-out corpus is never tokenised, let alone run through the target)."""
        held_out = self.eval_data or replace(self.data, split="heldout", max_tokens=None)
        if held_out.max_tokens is not None:
            return held_out
        rows = self.eval_batches * self.batch_size
        return replace(held_out, max_tokens=rows * held_out.seq_len)

    def _check_init_from(self) -> None:
        """init_from is an artifact of this recipe's head kind (checked before any model loads;
        its head config is compared with the recipe's once the head is built)."""
        try:
            kind = read_artifact_config(self.init_from)["drafter"]
        except (OSError, ValueError) as error:
            raise ConfigError(f"init_from: {error}") from None
        if kind != self.head:
            raise ConfigError(
                f"init_from {self.init_from} holds a {kind} head, but the recipe trains "
                f"head: {self.head}; give an artifact of the recipe's kind"
            )


def load_train_config(path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read a YAML recipe, apply ``key=value`` overrides, and build the typed config."""
    return load_config(TrainConfig, path, overrides)
