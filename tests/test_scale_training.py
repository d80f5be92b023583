"""Training at scale on two CPU processes (gloo): the FSDP accelerate config trains, checkpoints
(full state dicts in safetensors), exports, and resumes at another number of processes or in a
replicated run; the feature cache is written once across the ranks and read whole by each; the
DeepSpeed config is at least well-formed.

Each launch is a real `accelerate launch` of scripts/train.py on a tiny random Llama saved to
disk (an EAGLE-3 head, two steps): slow-ish (20-40 s each on a loaded 2-core machine).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from accelerate.commands.config.config_args import ClusterConfig
from accelerate.utils import DistributedType
from conftest import tiny_model
from safetensors.torch import load_file
from test_trainer import byte_tokenizer, corpus, free_port, metrics, recipe  # noqa: F401

from draftsmith.train.config import TrainConfig, load_train_config
from draftsmith.train.distributed import check_deepspeed
from draftsmith.train.features import FeatureCache, write_feature_cache
from draftsmith.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
FSDP = REPO / "recipes/accelerate/fsdp.yaml"
HEAD = {"head": "eagle3", "head_args": {"num_steps": 2, "draft_vocab_size": 64}}


def launch(config: Path, processes: int, recipe_path: Path, *overrides: str) -> str:
    """Run scripts/train.py under `accelerate launch`; its stdout (the test fails on an error)."""
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(config), "--num_processes", str(processes),
        "--main_process_port", str(free_port()),
        str(REPO / "scripts/train.py"), str(recipe_path), "batch_size=2", *overrides,
    ]  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def setup(tmp_path_factory, corpus):  # noqa: F811
    """A tiny target saved to disk and a recipe training an EAGLE-3 head on it from a feature
    cache, two steps, a checkpoint at the end."""
    root = tmp_path_factory.mktemp("scale")
    tokenizer = byte_tokenizer()
    target = tiny_model("llama", seed=0, vocab_size=len(tokenizer), max_position_embeddings=512)
    target.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    raw = recipe(corpus, root / "unused", **HEAD)
    raw.update(
        target=str(root / "target"),
        target_dtype="float32",
        max_steps=2,
        warmup_steps=1,
        checkpoint_every=2,
        feature_cache=str(root / "features"),
        feature_cache_dtype="float32",
    )
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return root, path


@pytest.fixture(scope="module")
def two(setup) -> tuple[Path, str]:
    """The FSDP config on two processes, from scratch: its output folder and stdout."""
    root, path = setup
    out = root / "two"
    return out, launch(FSDP, 2, path, f"output_dir={out}")


@pytest.fixture(scope="module")
def one(setup, two) -> tuple[Path, str]:
    """`two`'s run resumed by one process for one more step."""
    root, path = setup
    out = root / "one"
    shutil.copytree(two[0], out)
    return out, launch(
        FSDP, 1, path, f"output_dir={out}", "resume=true", "max_steps=3", "checkpoint_every=1"
    )


def artifact_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "drafter" / "model.safetensors"))


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert all(torch.equal(a[name], b[name]) for name in a), "the weights differ"


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_fsdp_trains_checkpoints_and_exports_on_two_processes(setup, two):
    root, _ = setup
    out, stdout = two
    assert "2 process(es) (FSDP)" in stdout  # not silently DDP, as Accelerate alone does on CPU
    step = out / "checkpoints/step_2"
    # safetensors and JSON only (no pickled .distcp / .metadata); the RNGs one file pair per rank
    assert files(step) == [
        "model.safetensors", "optimizer.json", "optimizer.safetensors", "rng_0.json",
        "rng_0.safetensors", "rng_1.json", "rng_1.safetensors", "scheduler.json",
        "trainer_state.json",
    ]  # fmt: skip
    # the gathered weights are whole, as the export's
    assert_same_weights(
        artifact_weights(out),
        {k.removeprefix("head."): v for k, v in load_file(step / "model.safetensors").items()},
    )
    assert json.loads((step / "trainer_state.json").read_text())["num_processes"] == 2
    losses = [r["loss"] for r in metrics(out, "train")]
    assert len(losses) == 2 and all(map(torch.isfinite, torch.tensor(losses)))
    written = json.loads((out / "drafter/config.json").read_text())
    assert written["training"]["num_processes"] == 2 and written["training"]["steps"] == 2
    # the gathered export is the whole head, not one rank's shard
    assert all(t.numel() > 0 for t in artifact_weights(out).values())
    # the cache was written once between the ranks (rows summed over ranks == rows cached)
    (cached,) = metrics(out, "cache")
    assert cached["rows"] == len(FeatureCache(root / "features")) == 48


def test_a_two_process_checkpoint_resumes_at_one_process(setup, two, one):
    out, stdout = one
    assert "written by 2 process(es), resumed by 1" in stdout
    assert "resuming from" in stdout and "(step 2)" in stdout
    assert "1 process(es) (FSDP)" in stdout
    assert [r["step"] for r in metrics(out, "train")] == [1, 2, 3]
    assert [f for f in files(out / "checkpoints/step_3") if f.startswith("rng_")] == [
        "rng_0.json",
        "rng_0.safetensors",
    ]
    assert json.loads((out / "drafter/config.json").read_text())["training"]["steps"] == 3
    # The step after the load started from the two-process weights: its loss is that of the
    # two-process export on the same rows, recomputed here in one plain process.
    root, path = setup
    config = load_train_config(
        path, [f"output_dir={root / 'check'}", f"init_from={two[0] / 'drafter'}", "batch_size=2"]
    )
    trainer = Trainer(config)
    trainer.module.train()
    batch = trainer.train_source.batch(trainer.sampler.indices(2), "cpu")
    with torch.no_grad():
        expected = float(trainer.module(batch).loss)
    assert metrics(out, "train")[-1]["loss"] == pytest.approx(expected, rel=1e-5)


def test_a_one_process_checkpoint_resumes_at_two_and_loads_exactly(setup, one):
    """Resumed at its last step, a run only loads and exports: the two-process export of the
    one-process checkpoint is the one-process export, bit for bit."""
    root, path = setup
    out = root / "back-to-two"
    shutil.copytree(one[0], out)
    shutil.rmtree(out / "drafter")
    stdout = launch(
        FSDP, 2, path, f"output_dir={out}", "resume=true", "max_steps=3", "eval_batches=1"
    )
    assert "written by 1 process(es), resumed by 2" in stdout
    assert_same_weights(artifact_weights(one[0]), artifact_weights(out))


def test_an_fsdp_checkpoint_resumes_in_a_replicated_run(setup, two, one, capsys):
    """A plain one-process run resumed from the two-process FSDP checkpoint takes the step the
    one-process FSDP run took: the same loss (the weights loaded) and the same weights after it
    (the optimizer state loaded: a fresh AdamW's first step would differ)."""
    root, path = setup
    out = root / "to-replicated"
    shutil.copytree(two[0], out)
    shutil.rmtree(out / "drafter")
    overrides = [f"output_dir={out}", "resume=true", "max_steps=3", "batch_size=2"]  # as `one`
    trainer = Trainer(load_train_config(path, overrides))
    assert trainer.accelerator.distributed_type == DistributedType.NO
    trainer.fit()
    assert "written by 2 process(es), resumed by 1" in capsys.readouterr().out
    assert metrics(out, "train")[-1]["loss"] == pytest.approx(
        metrics(one[0], "train")[-1]["loss"], rel=1e-5
    )
    replicated, sharded = artifact_weights(out), artifact_weights(one[0])
    assert replicated.keys() == sharded.keys()
    for name in replicated:
        torch.testing.assert_close(replicated[name], sharded[name])


def test_the_feature_cache_is_written_once_across_ranks_and_read_whole(tmp_path):
    """Each rank writes its own shards (none twice); every rank reads all of them, equal to
    what one process writes."""
    target = tiny_model("llama", seed=0)
    ids = torch.randint(0, 256, (20, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids, dtype=torch.int8)
    kwargs = dict(target_name="tiny", dtype="float32", batch_size=4, rows_per_shard=4)
    layers = (1,)
    written = [
        write_feature_cache(
            target, ids, mask, layers, tmp_path / "two", rank=r, world_size=2, **kwargs
        )
        for r in (0, 1)
    ]
    assert written == [12, 8]  # shards 0, 2, 4 and 1, 3 of five
    assert [write_feature_cache(target, ids, mask, layers, tmp_path / "two", rank=r,
                                world_size=2, **kwargs) for r in (0, 1)] == [0, 0]  # fmt: skip
    write_feature_cache(target, ids, mask, layers, tmp_path / "one", **kwargs)
    shared, alone = FeatureCache(tmp_path / "two"), FeatureCache(tmp_path / "one")
    rows = torch.arange(20)
    a, b = shared.rows(rows), alone.rows(rows)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("path", sorted((REPO / "recipes/accelerate").glob("*.yaml")), ids=str)
def test_every_accelerate_config_loads(path):
    config = ClusterConfig.from_yaml_file(path)
    assert config.num_machines == 1 and config.num_processes >= 1
    assert config.mixed_precision == "no"  # the recipe's mixed_precision decides
    if config.distributed_type == DistributedType.FSDP:
        assert config.fsdp_config["fsdp_version"] == 2  # the version that also runs on the CPU


def test_the_deepspeed_config_matches_the_recipe_defaults_and_a_mismatch_is_refused():
    """DeepSpeed is not installed for the tests (see the README): the config is checked as
    Accelerate reads it, and against `check_deepspeed` with a stand-in accelerator."""
    config = ClusterConfig.from_yaml_file(REPO / "recipes/accelerate/deepspeed-zero2.yaml")
    assert config.distributed_type == DistributedType.DEEPSPEED
    ds = config.deepspeed_config
    assert ds["zero_stage"] in (1, 2, 3)
    assert ds["offload_optimizer_device"] == ds["offload_param_device"] == "none"
    assert "deepspeed_config_file" not in ds  # the trainer's AdamW and schedule, no DS optimizer
    state = SimpleNamespace(deepspeed_plugin=SimpleNamespace(deepspeed_config=ds))
    accelerator = SimpleNamespace(distributed_type=DistributedType.DEEPSPEED, state=state)
    defaults = TrainConfig.__dataclass_fields__
    check_deepspeed(accelerator, defaults["grad_accum"].default, defaults["clip_grad_norm"].default)
    with pytest.raises(ValueError, match="gradient_accumulation_steps: 4 and gradient_clipping"):
        check_deepspeed(accelerator, 4, 1.0)
