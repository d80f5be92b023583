"""The one training loop: learning, exact resume, two CPU processes, every real head kind.

A tiny random Llama target (vocab 257) with a byte-level tokenizer trains on a few stdlib
modules written to a local jsonl; a stand-in linear head keeps the loop tests independent of
the real kinds, which get their own few-step test.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from accelerate import Accelerator
from conftest import tiny_model
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch import nn
from transformers import PreTrainedTokenizerFast

from draftsmith.core.target import TargetBatch
from draftsmith.heads import DraftHead, build_head, drafter_class, fit_draft_vocab, register_drafter
from draftsmith.heads.blocks import seeded
from draftsmith.heads.eagle3 import Eagle3Head
from draftsmith.heads.trainable import StepsConfig
from draftsmith.train.checkpoint import (
    TrainerState,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from draftsmith.train.config import load_train_config as load_config
from draftsmith.train.sampler import EpochSampler
from draftsmith.train.trainer import FIT_SAMPLE_ROWS, Trainer, train

REPO = Path(__file__).resolve().parents[1]
MODULES = ["json/decoder.py", "json/encoder.py", "textwrap.py", "colorsys.py", "shlex.py",
           "fnmatch.py", "bisect.py", "heapq.py", "glob.py", "keyword.py", "string.py",
           "getopt.py", "calendar.py", "cmd.py", "difflib.py", "ftplib.py"]  # fmt: skip


@dataclass(kw_only=True)
class LinearConfig(StepsConfig):
    num_steps: int = 2
    dropout: float = 0.0


@register_drafter("test-linear")
class LinearHead(DraftHead):
    """Stand-in head: step k is a linear map of the target's last hidden state (with dropout, so
    an exact resume must restore the RNG too)."""

    config_class = LinearConfig

    def __init__(self, target_config, config: LinearConfig):
        super().__init__()
        self.config, self.num_steps = config, config.num_steps
        self.target_feature_layers = (target_config.num_hidden_layers,)
        self.drop = nn.Dropout(config.dropout)
        hidden, vocab = target_config.hidden_size, target_config.vocab_size
        with seeded(config.seed):
            self.steps = nn.ModuleList(nn.Linear(hidden, vocab) for _ in range(config.num_steps))

    def bind_target(self, target) -> None:
        pass

    def forward_train(self, batch: TargetBatch) -> list[torch.Tensor]:
        return [step(self.drop(batch.features)) for step in self.steps]

    def as_drafter(self, target):
        raise NotImplementedError


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE without merges: 256 byte tokens + <|endoftext|> (id 256)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=257,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(["x"], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def target(tokenizer):
    return tiny_model("llama", seed=0, vocab_size=len(tokenizer), max_position_embeddings=512)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Real code: a few stdlib modules, one jsonl record each."""
    path = tmp_path_factory.mktemp("corpus") / "code.jsonl"
    root = Path(sysconfig.get_paths()["stdlib"])
    with path.open("w") as out:
        for name in MODULES:
            out.write(json.dumps({"id": name, "text": (root / name).read_text()}) + "\n")
    return path


@pytest.fixture(autouse=True)
def _quiet_single_thread(monkeypatch):
    """No wandb; one thread: tiny matmuls on two threads of a busy 2-core machine spend their
    time synchronising (17 ms instead of 0.08 ms a call)."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def recipe(corpus: Path, output_dir: Path, **overrides) -> dict:
    """A tiny recipe as a plain dict (what a YAML file would hold)."""
    raw = {
        "target": "unused-when-passed-in",
        "head": "test-linear",
        "data": {
            "source": str(corpus),
            "seq_len": 64,
            "max_tokens": 64 * 48,
            "heldout_fraction": 0.25,
        },
        "batch_size": 4,
        "lr": 1e-2,
        "warmup_steps": 2,
        "max_steps": 30,
        "eval_batches": 2,
        "log_every": 1,
        "output_dir": str(output_dir),
    }
    for key, value in overrides.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return raw


def config_path(raw: dict, tmp_path: Path) -> Path:
    path = tmp_path / f"recipe-{len(list(tmp_path.glob('recipe-*')))}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def config_of(raw: dict, tmp_path: Path, overrides=()):
    return load_config(config_path(raw, tmp_path), overrides)


def metrics(output_dir: Path, split: str) -> list[dict]:
    lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


def test_loss_decreases_and_the_artifact_is_written(tmp_path, corpus, target, tokenizer):
    out = tmp_path / "run"
    result = train(config_of(recipe(corpus, out), tmp_path), target=target, tokenizer=tokenizer)
    losses = [r["loss"] for r in metrics(out, "train")]
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5
    # each record holds the next step's lr: warm-up from 0 over 2 steps, then cosine to 0
    lrs = [r["lr"] for r in metrics(out, "train")]
    assert lrs[:2] == pytest.approx([0.5e-2, 1e-2])
    assert all(a > b for a, b in zip(lrs[1:], lrs[2:], strict=False))
    assert lrs[-1] == pytest.approx(0.0)
    final = metrics(out, "eval")[-1]
    assert final == {"step": 30, "split": "eval", **result.metrics}
    assert len(final["top1"]) == len(final["tau_sim"]) == 2
    assert 1.0 <= final["tau_sim"][0] <= final["tau_sim"][1] <= 3.0
    assert result.tokens_per_s > 0
    assert result.artifact == out / "drafter"
    written = json.loads((out / "drafter" / "config.json").read_text())
    assert written["drafter"] == "test-linear"
    assert written["training"]["steps"] == 30
    assert written["training"]["metrics"]["top1"] == final["top1"]
    assert written["training"]["throughput_tokens_per_s"] > 0
    assert (out / "train_config.yaml").is_file()


class Killed(Exception):
    pass


def test_resume_continues_exactly(tmp_path, corpus, target, tokenizer, monkeypatch):
    """8 steps straight == 6 steps, killed (checkpoint at 4), resumed to 8: same losses, same
    weights. Dropout and gradient accumulation make data order, RNG, optimizer and scheduler
    state all matter."""
    raw = recipe(
        corpus,
        tmp_path / "straight",
        max_steps=8,
        checkpoint_every=4,
        grad_accum=2,
        head_args={"dropout": 0.2},
        lr=1e-2,
    )
    straight = Trainer(config_of(raw, tmp_path), target=target, tokenizer=tokenizer)
    straight.fit()

    interrupted_dir = tmp_path / "interrupted"
    config = config_of({**raw, "output_dir": str(interrupted_dir)}, tmp_path)
    original = Trainer._train_step

    def dies_at_step_6(self, window):
        if self.state.step == 6:
            raise Killed
        return original(self, window)

    monkeypatch.setattr(Trainer, "_train_step", dies_at_step_6)
    with pytest.raises(Killed):
        Trainer(config, target=target, tokenizer=tokenizer).fit()
    assert latest_checkpoint(interrupted_dir).name == "step_4"
    assert [r["step"] for r in metrics(interrupted_dir, "train")] == [1, 2, 3, 4, 5, 6]
    monkeypatch.setattr(Trainer, "_train_step", original)

    resumed = Trainer(config, target=target, tokenizer=tokenizer)
    resumed.fit()
    assert resumed.state.step == 8
    first, second = metrics(tmp_path / "straight", "train"), metrics(interrupted_dir, "train")
    assert [r["step"] for r in second] == list(range(1, 9))  # replayed steps are not doubled
    assert [r["loss"] for r in first] == [r["loss"] for r in second]
    assert [r["lr"] for r in first] == [r["lr"] for r in second]
    weights = straight.module.state_dict(), resumed.module.state_dict()
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
    assert metrics(tmp_path / "straight", "eval") == metrics(interrupted_dir, "eval")


def test_checkpoints_are_complete_folders_of_safetensors_and_json(
    tmp_path, corpus, target, tokenizer
):
    out = tmp_path / "run"
    raw = recipe(corpus, out, max_steps=4, checkpoint_every=2)
    trainer = Trainer(config_of(raw, tmp_path), target=target, tokenizer=tokenizer)
    trainer.fit()
    folders = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert folders == ["step_2", "step_4"]  # no .tmp left behind
    step = out / "checkpoints" / "step_4"
    assert sorted(p.name for p in step.iterdir()) == [
        "model.safetensors",
        "optimizer.json",
        "optimizer.safetensors",
        "rng_0.json",
        "rng_0.safetensors",
        "scheduler.json",
        "trainer_state.json",
    ]  # nothing pickled
    assert json.loads((step / "trainer_state.json").read_text())["step"] == 4
    weights = load_file(step / "model.safetensors")
    assert all(torch.equal(t, weights[n]) for n, t in trainer.module.state_dict().items())
    optimizer = load_file(step / "optimizer.safetensors")
    assert set(optimizer) == {
        f"state.{name}.{entry}"
        for name, _ in trainer.module.named_parameters()
        for entry in ("step", "exp_avg", "exp_avg_sq")
    }
    assert float(optimizer["state.head.steps.0.weight.step"]) == 4
    groups = json.loads((step / "optimizer.json").read_text())["param_groups"]
    assert [g["weight_decay"] for g in groups] == [trainer.config.weight_decay, 0.0]
    assert json.loads((step / "scheduler.json").read_text())["last_epoch"] == 4


def test_a_checkpoint_of_the_old_pickled_format_is_refused_with_the_fix(
    tmp_path, corpus, target, tokenizer
):
    out = tmp_path / "run"
    old = out / "checkpoints" / "step_2"
    old.mkdir(parents=True)
    record = {"step": 2, "train_seconds": 1.0, "train_tokens": 512, "num_processes": 1}
    (old / "trainer_state.json").write_text(json.dumps(record))
    for name in ("model.safetensors", "optimizer.bin", "random_states_0.pkl"):
        (old / name).write_bytes(b"not loaded")
    trainer = Trainer(config_of(recipe(corpus, out), tmp_path), target=target, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="optimizer.bin, random_states_0.pkl: the old format") as e:
        trainer.fit()
    assert "Start a new output_dir" in str(e.value)
    assert trainer.state.step == 0


def test_a_checkpoint_writes_tied_weights_once_and_refuses_a_state_that_is_not_json(tmp_path):
    """Tied tensors (a draft model's embeddings and LM head) come back tied; a scheduler whose
    state_dict() holds a tensor is a clear error, not a pickle."""
    accelerator = Accelerator(cpu=True)
    model = nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 8, bias=False))
    model[1].weight = model[0].weight
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    model(torch.tensor([1, 2])).sum().backward()
    optimizer.step()
    parts = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
    folder = save_checkpoint(accelerator, tmp_path, TrainerState(step=1), **parts)
    assert set(load_file(folder / "model.safetensors")) == {"0.weight"}
    fresh = nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 8, bias=False))
    fresh[1].weight = fresh[0].weight
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    fresh_parts = {
        "model": fresh,
        "optimizer": fresh_optimizer,
        "scheduler": torch.optim.lr_scheduler.LambdaLR(fresh_optimizer, lambda step: 1.0),
    }
    assert load_checkpoint(accelerator, folder, **fresh_parts).step == 1
    assert torch.equal(fresh[1].weight, model[0].weight)
    assert fresh[1].weight is fresh[0].weight

    class TensorFactor:
        def __init__(self):
            self.factor = torch.tensor(1.0)

        def __call__(self, step):
            return float(self.factor)

    parts["scheduler"] = torch.optim.lr_scheduler.LambdaLR(optimizer, TensorFactor())
    with pytest.raises(ValueError, match="the LR scheduler's state_dict.. is not plain JSON"):
        save_checkpoint(accelerator, tmp_path, TrainerState(step=2), **parts)
    assert latest_checkpoint(tmp_path).name == "step_1"


def test_feature_cache_trains_like_online(tmp_path, corpus, target, tokenizer):
    """float32 cached features reproduce the online run's losses."""
    online = recipe(corpus, tmp_path / "online", max_steps=3)
    cached = recipe(
        corpus,
        tmp_path / "cached",
        max_steps=3,
        feature_cache=str(tmp_path / "features"),
        feature_cache_dtype="float32",
    )
    train(config_of(online, tmp_path), target=target, tokenizer=tokenizer)
    train(config_of(cached, tmp_path), target=target, tokenizer=tokenizer)
    assert (tmp_path / "features" / "meta.json").is_file()
    a, b = metrics(tmp_path / "online", "train"), metrics(tmp_path / "cached", "train")
    assert [r["loss"] for r in a] == pytest.approx([r["loss"] for r in b], rel=1e-4)
    (written,) = metrics(tmp_path / "cached", "cache")
    assert written["rows"] == json.loads((tmp_path / "features/meta.json").read_text())["rows"]
    assert written["tokens_per_s"] > 0
    train(config_of(cached, tmp_path), target=target, tokenizer=tokenizer)  # cache reused
    assert metrics(tmp_path / "cached", "cache") == []  # nothing written this time


def test_sampler_is_a_function_of_seed_and_step():
    sampler = EpochSampler(num_rows=10, batch_size=2, seed=3, rank=0, world_size=2)
    other_rank = EpochSampler(num_rows=10, batch_size=2, seed=3, rank=1, world_size=2)
    assert sampler.per_epoch == 2  # 10 rows // (2 x 2): two rows skipped each epoch
    epoch0 = torch.cat([s.indices(i) for i in range(2) for s in (sampler, other_rank)])
    assert len(set(epoch0.tolist())) == 8  # ranks never share a row within an epoch
    fresh = EpochSampler(num_rows=10, batch_size=2, seed=3, rank=0, world_size=2)
    assert torch.equal(fresh.indices(3), sampler.indices(3))  # no hidden state
    assert not torch.equal(sampler.indices(0), sampler.indices(2))  # epochs reshuffle
    with pytest.raises(ValueError, match="fewer than one global batch"):
        EpochSampler(num_rows=3, batch_size=2, seed=0, rank=0, world_size=2)


def test_reduced_vocabulary_heads_draft_the_most_frequent_training_targets(target):
    head = build_head("eagle3", target, {"draft_vocab_size": 4, "num_steps": 1})
    input_ids = torch.tensor([[9, 9, 9, 5, 5, 7, 7, 7, 7, 3, 3, 1, 1, 1, 1, 1]])
    loss_mask = torch.ones_like(input_ids)
    loss_mask[0, 11:] = 0  # the 1s are context only: never drafted targets
    fit_draft_vocab(head, input_ids, loss_mask, target.config.vocab_size)
    assert head.draft_to_target().tolist() == [3, 5, 7, 9]
    assert head.dtype == torch.float32  # master weights, whatever the target config's dtype


def test_evaluation_reads_eval_batches_of_rows_even_from_its_own_held_out_data(tmp_path, corpus):
    held_out = {"source": str(corpus), "split": "heldout", "seq_len": 64}
    config = config_of(recipe(corpus, tmp_path, eval_data=held_out), tmp_path)
    assert config.held_out_data().max_tokens == 2 * 4 * 64  # eval_batches * batch_size rows
    default = config_of(recipe(corpus, tmp_path), tmp_path).held_out_data()
    assert (default.split, default.max_tokens) == ("heldout", 2 * 4 * 64)
    capped = config_of(
        recipe(corpus, tmp_path, eval_data={**held_out, "max_tokens": 640}), tmp_path
    )
    assert capped.held_out_data().max_tokens == 640  # a cap of its own stands


def test_unknown_head_kind_is_a_clear_error(tmp_path, corpus, target, tokenizer):
    raw = recipe(corpus, tmp_path / "run", head="nope")
    with pytest.raises(ValueError, match="unknown drafter kind 'nope'"):
        Trainer(config_of(raw, tmp_path), target=target, tokenizer=tokenizer)


TRAINABLE = [
    kind
    for kind in ("medusa", "mtp", "eagle", "eagle3", "peagle", "dflash", "distilled")
    if issubclass(drafter_class(kind), DraftHead)
]
HEAD_ARGS = {
    "eagle3": {"draft_vocab_size": 64, "num_steps": 2},
    "peagle": {"draft_vocab_size": 64, "num_steps": 3},
    "dflash": {"draft_vocab_size": 64, "num_steps": 3},
    "medusa": {"num_steps": 2},
    "distilled": {"layers": [0]},
}


@pytest.mark.parametrize("kind", TRAINABLE)
def test_every_real_head_kind_trains_and_exports(kind, tmp_path, corpus, target, tokenizer):
    from draftsmith.artifact import load_drafter

    out = tmp_path / kind
    raw = recipe(corpus, out, head=kind, head_args=HEAD_ARGS.get(kind, {}), max_steps=4, lr=1e-3)
    result = train(config_of(raw, tmp_path), target=target, tokenizer=tokenizer)
    losses = [r["loss"] for r in metrics(out, "train")]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert len(result.metrics["top1"]) >= 1
    drafter = load_drafter(result.artifact, target)
    assert drafter.vocab_size == target.config.vocab_size


@pytest.mark.parametrize(
    ("kind", "extra"),
    [("peagle", {}), ("dflash", {}), ("dflash", {"markov_rank": 8, "confidence_head": True})],
    ids=["peagle", "dflash", "dspark"],
)
def test_a_few_steps_of_a_block_head_lower_its_loss(
    kind, extra, tmp_path, corpus, target, tokenizer
):
    """The block objective trains (with DSpark's heads, their loss too): the loss over every
    depth falls, and every depth (the block's first prediction, then the mask rows after it)
    agrees with the target somewhere held out."""
    out = tmp_path / kind
    head_args = {"num_steps": 3, "draft_vocab_size": 64, **extra}
    raw = recipe(corpus, out, head=kind, head_args=head_args, max_steps=16, lr=3e-3)
    result = train(config_of(raw, tmp_path), target=target, tokenizer=tokenizer)
    losses = [r["loss"] for r in metrics(out, "train")]
    assert sum(losses[-3:]) < 0.85 * sum(losses[:3])
    assert len(result.metrics["top1"]) == 3 and min(result.metrics["top1"]) > 0


def test_the_head_is_fitted_to_the_leading_training_rows_once(
    tmp_path, corpus, target, tokenizer, monkeypatch
):
    samples = []
    monkeypatch.setattr(Eagle3Head, "fit_to_sample", lambda head, sample: samples.append(sample))
    raw = recipe(corpus, tmp_path / "run", head="eagle3", head_args={"num_steps": 1}, max_steps=3)
    trainer = Trainer(config_of(raw, tmp_path), target=target, tokenizer=tokenizer)
    (sample,) = samples
    rows = min(FIT_SAMPLE_ROWS, len(trainer.train_source))
    assert sample.features.shape[:2] == sample.input_ids.shape == (rows, raw["data"]["seq_len"])
    first = trainer.train_source.batch(torch.arange(rows), "cpu")
    assert torch.equal(sample.input_ids, first.input_ids)
    torch.testing.assert_close(sample.features, first.features)


# -- a learned acceptance head --------------------------------------------------------------------

ACCEPTANCE = {"head": "eagle3", "head_args": {"num_steps": 2, "draft_vocab_size": 64}}
DFLASH_ACCEPTANCE = {"head": "dflash", "head_args": {"num_steps": 2, "draft_vocab_size": 64}}


def drafter_tensors(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "drafter" / "model.safetensors"))


@pytest.mark.parametrize("drafter", [ACCEPTANCE, DFLASH_ACCEPTANCE], ids=["eagle3", "dflash"])
def test_an_acceptance_head_trains_beside_the_drafter_without_changing_it(
    drafter, tmp_path, corpus, target, tokenizer
):
    runs = {}
    for name, extra in (("plain", {}), ("with", {"acceptance_head": {"width": 16}})):
        raw = recipe(corpus, tmp_path / name, **drafter, **extra, max_steps=6, lr=1e-3)
        runs[name] = train(config_of(raw, tmp_path), target=target, tokenizer=tokenizer)
    plain, joint = drafter_tensors(tmp_path / "plain"), drafter_tensors(tmp_path / "with")
    assert plain.keys() == joint.keys()
    assert all(torch.equal(plain[name], joint[name]) for name in plain)
    assert "acceptance_head" not in runs["plain"].metrics
    scored = runs["with"].metrics["acceptance_head"]
    assert scored["steps"] > 0 and 0 < scored["mean_predicted"] < 1
    assert all("acceptance_bce" in r for r in metrics(tmp_path / "with", "train"))
    assert (tmp_path / "with/drafter/acceptance_head.safetensors").is_file()


def test_a_trained_drafter_gets_an_acceptance_head_in_a_short_pass(
    tmp_path, corpus, target, tokenizer
):
    from draftsmith.artifact import load_acceptance_head

    first = recipe(corpus, tmp_path / "drafter", **ACCEPTANCE, max_steps=6, lr=1e-3)
    trained = train(config_of(first, tmp_path), target=target, tokenizer=tokenizer).artifact
    raw = recipe(
        corpus,
        tmp_path / "acceptance",
        **ACCEPTANCE,
        init_from=str(trained),
        train_drafter=False,
        acceptance_head={"width": 16},
        max_steps=30,
        lr=1e-2,
    )
    result = train(config_of(raw, tmp_path), target=target, tokenizer=tokenizer)
    records = metrics(tmp_path / "acceptance", "train")
    losses = [r["loss"] for r in records]  # the acceptance head's alone: the drafter is frozen
    assert losses == pytest.approx([r["acceptance_bce"] for r in records], abs=1e-5)
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    before, after = drafter_tensors(tmp_path / "drafter"), drafter_tensors(tmp_path / "acceptance")
    assert all(torch.equal(before[name], after[name]) for name in before)
    head = load_acceptance_head(result.artifact, target.config.hidden_size)
    assert head is not None and head.config.width == 16


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"train_drafter": False}, "give acceptance_head"),
        ({"train_drafter": False, "acceptance_head": {}}, "and init_from"),
        ({"acceptance_head": {"width": -1}}, "width must be >= 0"),
        ({"init_from": "/nonexistent/artifact"}, "init_from: no drafter artifact"),
    ],
)
def test_acceptance_recipe_errors_are_clear(tmp_path, corpus, extra, message):
    with pytest.raises(ValueError, match=message):
        config_of(recipe(corpus, tmp_path / "run", **ACCEPTANCE, **extra), tmp_path)


def test_init_from_must_hold_the_recipe_head(tmp_path, corpus, target, tokenizer):
    first = recipe(corpus, tmp_path / "drafter", **ACCEPTANCE, max_steps=2, warmup_steps=0)
    trained = str(train(config_of(first, tmp_path), target=target, tokenizer=tokenizer).artifact)
    with pytest.raises(ValueError, match="holds a eagle3 head, but the recipe trains head: mtp"):
        config_of(recipe(corpus, tmp_path / "run", head="mtp", init_from=trained), tmp_path)
    other_steps = {**ACCEPTANCE, "head_args": {"num_steps": 3, "draft_vocab_size": 64}}
    raw = recipe(corpus, tmp_path / "run", **other_steps, init_from=trained)
    with pytest.raises(ValueError, match="make head_args match the artifact's"):
        Trainer(config_of(raw, tmp_path), target=target, tokenizer=tokenizer)


def test_an_acceptance_head_needs_a_head_with_hidden_states(tmp_path, corpus, target, tokenizer):
    raw = recipe(corpus, tmp_path / "run", head="medusa", acceptance_head={})
    with pytest.raises(ValueError, match="medusa heads expose no hidden states"):
        Trainer(config_of(raw, tmp_path), target=target, tokenizer=tokenizer)


def test_cli_prepares_data_and_trains_in_process(tmp_path, corpus, target, tokenizer, capsys):
    from draftsmith.commands.cli import main

    folder = tmp_path / "target"
    target.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    main(["prepare-data", "--target", str(folder), "--source", str(corpus), "--seq-len", "64",
          "--max-tokens", "640", "--out", str(tmp_path / "rows")])  # fmt: skip
    assert "10 rows x 64" in capsys.readouterr().out
    raw = recipe(corpus, tmp_path / "run", target=str(folder), target_dtype="float32")
    main(["train", str(config_path(raw, tmp_path)), "max_steps=2", "warmup_steps=0"])
    assert json.loads((tmp_path / "run/drafter/config.json").read_text())["training"]["steps"] == 2
    with pytest.raises(SystemExit) as exit:
        main(["train", str(config_path(raw, tmp_path)), "max_step=2"])
    assert exit.value.code == 2
    assert "draftsmith train: error: unknown key 'max_step'" in capsys.readouterr().err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_cpu_processes_with_accelerate_launch(tmp_path, corpus, target, tokenizer):
    """`accelerate launch` with recipes/accelerate/cpu-2proc.yaml starts two gloo ranks that
    train one head on a target saved to disk, and the main one exports it."""
    folder = tmp_path / "target"
    target.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    raw = recipe(corpus, tmp_path / "run", head="medusa", head_args={"num_steps": 2})
    raw.update(target=str(folder), target_dtype="float32", max_steps=3, checkpoint_every=3)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO / "recipes/accelerate/cpu-2proc.yaml"),
        "--main_process_port", str(free_port()),
        str(REPO / "scripts/train.py"), str(path), "batch_size=2",
    ]  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 process(es)" in done.stdout
    written = json.loads((tmp_path / "run/drafter/config.json").read_text())
    assert written["training"]["num_processes"] == 2
    assert written["training"]["steps"] == 3
    state = tmp_path / "run/checkpoints/step_3"
    assert {p.name for p in state.glob("rng_*")} == {
        "rng_0.json",
        "rng_0.safetensors",
        "rng_1.json",
        "rng_1.safetensors",
    }
    assert all(p.suffix in (".json", ".safetensors") for p in state.iterdir())
