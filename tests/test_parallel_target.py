"""A target over several devices decodes the same tokens as on one: tensor parallel on two CPU
processes (torchrun, gloo; transformers' tp_plan="auto"), and a device map (one device here, so
the map's building, checking and the per-round moves run, not a real split). Bad input: more
processes than the heads split into, a map that leaves layers on no device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_model
from parallel_cases import decode_cases
from test_trainer import byte_tokenizer, free_port

from draftsmith.core.models import load_model
from draftsmith.core.parallel import check_tensor_parallel, split_device_map

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """The tiny Llama (4 query, 2 key/value heads) on disk, as a user's target would be."""
    folder = tmp_path_factory.mktemp("target")
    tiny_model("llama", seed=0).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)  # load_model loads one; decoding uses ids
    return folder


@pytest.fixture(scope="module")
def reference(saved) -> dict:
    target, _ = load_model(str(saved), dtype="float32")
    return decode_cases(target)


def test_tensor_parallel_on_two_processes_decodes_the_single_device_tokens(
    saved, reference, tmp_path
):
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_port", str(free_port()),
        str(HERE / "tp_decode_worker.py"), str(saved), str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=os.environ)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert result.pop("world_size") == 2
        assert result.pop("sharded") == "DTensor"  # the layers really are split
        assert result == reference
    # multi-token acceptance happened, so the sharded cache was cut back to accepted paths
    assert reference["draft-model/chain"]["accepted"] > 5
    assert reference["draft-model/tree"]["accepted"] > 5


def test_a_device_map_split_decodes_the_single_device_tokens(saved, reference):
    config = tiny_model("llama").config
    device_map = split_device_map(config, ["cpu", "cpu"])
    assert device_map["model.layers.0"] == device_map["model.embed_tokens"] == "cpu"
    assert set(device_map) >= {"model.layers.1", "model.norm", "lm_head"}
    target, _ = load_model(str(saved), dtype="float32", device_map=device_map)
    assert decode_cases(target) == reference


def test_split_device_map_runs_layers_contiguously_over_the_devices():
    config = tiny_model("llama", num_hidden_layers=5).config
    device_map = split_device_map(config, [0, 1])
    layers = [device_map[f"model.layers.{i}"] for i in range(5)]
    assert layers == ["cuda:0"] * 3 + ["cuda:1"] * 2
    assert device_map["model.embed_tokens"] == "cuda:0" and device_map["lm_head"] == "cuda:1"


def test_a_device_map_leaving_layers_on_no_device_is_refused_before_loading(saved):
    device_map = split_device_map(tiny_model("llama").config, ["cpu"])
    del device_map["model.layers.1"], device_map["lm_head"]
    with pytest.raises(ValueError, match=r"leaves lm_head, model\.layers\.1 on no device"):
        load_model(str(saved), device_map=device_map)
    with pytest.raises(ValueError, match=r"names model\.layers\.7, which LlamaForCausalLM"):
        load_model(str(saved), device_map={"": "cpu", "model.layers.7": "cpu"})


def test_more_processes_than_the_heads_split_into_is_a_clear_error(saved, monkeypatch):
    config = tiny_model("llama").config  # 4 query heads, 2 key/value heads
    check_tensor_parallel(config, 2)
    with pytest.raises(ValueError, match=r"2 key/value heads.*process count in \[1, 2\]"):
        check_tensor_parallel(config, 4)
    monkeypatch.setenv("WORLD_SIZE", "3")  # as torchrun --nproc_per_node 3 would
    with pytest.raises(ValueError, match="do not split evenly into 3"):
        load_model(str(saved), tensor_parallel=True)
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(ValueError, match="started by torchrun"):
        load_model(str(saved), tensor_parallel=True)
