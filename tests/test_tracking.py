"""Experiment tracking that is read back: a short training with wandb offline writes a run whose
history holds the trainer's metrics (loss, top-1 agreement by draft step, held-out tau_sim(k)),
the same series, at the same steps, as metrics.jsonl; with ``tensorboard: true`` its event
files hold them too (read with TensorBoard's own `EventAccumulator`).

The installed wandb (0.31, whose Go core writes the run) has no Python reader of a run's
``run-*.wandb`` log, so `wandb_records` reads it here: the LevelDB log framing wandb writes (a
7-byte ``:W&B`` header, 32 KiB blocks of checksummed chunks) around wandb's own protobuf
`Record`s.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest
import test_trainer
from test_trainer import _quiet_single_thread, config_of, recipe  # noqa: F401 (autouse fixture)

from draftsmith.core.config import ConfigError
from draftsmith.train import tracking
from draftsmith.train.plots import training_series
from draftsmith.train.tracking import log_with
from draftsmith.train.trainer import train

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4

# test_trainer's tiny Llama target, byte tokenizer and stdlib-code corpus (pytest fixtures)
corpus, target, tokenizer = test_trainer.corpus, test_trainer.target, test_trainer.tokenizer


def wandb_records(path: Path) -> list:
    """The protobuf records of a wandb transaction log, checksums checked."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0), f"{path}: not a wandb log"
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a chunk header is padding
            pos += BLOCK - pos % BLOCK
            continue
        checksum, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        chunk = data[pos + 7 : pos + 7 + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == checksum, f"{path}:{pos}"
        pos += 7 + length
        pending += chunk
        if kind in (FULL, LAST):
            record = Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_history(records: list) -> dict[str, tuple[list[int], list[float]]]:
    """Logged key -> (steps, values) of the run's history rows."""
    history: dict[str, tuple[list[int], list[float]]] = {}
    for record in records:
        if record.WhichOneof("record_type") != "history":
            continue
        row = {
            item.key or "/".join(item.nested_key): json.loads(item.value_json)
            for item in record.history.item
        }
        step = row.pop("_step")
        for key, value in row.items():
            if not key.startswith("_"):
                steps, values = history.setdefault(key, ([], []))
                steps.append(step)
                values.append(value)
    return history


def wandb_config(records: list) -> dict:
    """The run's config as logged (each key's value_json decoded)."""
    config = {}
    for record in records:
        if record.WhichOneof("record_type") == "config":
            for item in record.config.update:
                config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return config


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """wandb offline and silent, every folder it writes in tmp_path, no login possible."""
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        folder = tmp_path / name.lower()
        folder.mkdir()
        monkeypatch.setenv(name, str(folder))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens there


def test_an_offline_wandb_run_holds_the_trainers_metrics(
    tmp_path,
    corpus,
    target,
    tokenizer,
    offline_wandb,
):
    run = tmp_path / "run"
    raw = recipe(corpus, run, max_steps=6, warmup_steps=0, eval_every=3)
    train(config_of(raw, tmp_path), target=target, tokenizer=tokenizer)

    logs = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 1, list(run.rglob("*"))
    records = wandb_records(logs[0])
    history = wandb_history(records)
    # every series of the training curve, at the same steps with the same values
    curve = training_series(run / "metrics.jsonl")
    assert {"train/loss", "train/top1_2", "eval/loss", "eval/top1_2", "eval/tau_sim_2"} <= set(
        curve
    )
    for key, (steps, values) in curve.items():
        assert history[key][0] == steps, key
        assert history[key][1] == pytest.approx(values), key
    assert history["eval/tau_sim_2"][0] == [3, 6]
    assert len(history["train/lr"][0]) == 6
    config = wandb_config(records)
    assert config["max_steps"] == 6
    assert config["head"] == "test-linear"


def test_tensorboard_events_hold_the_trainers_metrics(tmp_path, corpus, target, tokenizer):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    raw = recipe(corpus, run, max_steps=6, warmup_steps=0, eval_every=3, tensorboard=True)
    train(config_of(raw, tmp_path), target=target, tokenizer=tokenizer)

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    curve = training_series(run / "metrics.jsonl")
    assert {"train/top1_2", "eval/tau_sim_2"} <= set(curve)
    assert set(curve) <= set(events.Tags()["scalars"])
    for key, (steps, values) in curve.items():
        scalars = events.Scalars(key)
        assert [s.step for s in scalars] == steps, key
        assert [s.value for s in scalars] == pytest.approx(values, rel=1e-6), key  # float32


def test_tensorboard_without_its_package_fails_before_any_model_loads(
    tmp_path, corpus, monkeypatch
):
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name: None)
    config = config_of(recipe(corpus, tmp_path / "run", tensorboard=True), tmp_path)
    with pytest.raises(ConfigError, match="pip install tensorboard"):
        log_with(config)
