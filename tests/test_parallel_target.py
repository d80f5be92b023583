"""A target over several devices decodes the same tokens as on one: tensor parallel on two CPU
processes (torchrun, gloo; transformers' tp_plan="auto"), and a device map (one device here, so
the map's building, checking and the per-round moves run, not a real split); so does
`draftsmith bench` given --tensor-parallel or --device-map. Bad input: more processes than the
heads split into, a map that leaves layers on no device, placement flags that cannot work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import perturbed_copy, tiny_model
from parallel_cases import decode_cases
from test_cli import bench, fails, prompts
from test_trainer import byte_tokenizer, free_port

from draftsmith.commands.cli import main
from draftsmith.core.parallel import (
    check_tensor_parallel,
    placement,
    split_device_map,
)
from draftsmith.decoding.profile import CostCurve
from draftsmith.zoo import load_model

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
        assert result.pop("agreed") == [1.0, 1.0]  # each offered its rank: the largest wins
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


# -- the command line -----------------------------------------------------------------------------

BENCH_PROMPTS = (
    '{"prompt": "def f(x): return x + 1\\ndef g(x): return", "workload": "code"}',
    '{"prompt": "hello hello hello", "workload": "chat"}',
)


@pytest.fixture(scope="module")
def bench_argv(saved, tmp_path_factory) -> list[str]:
    """`draftsmith bench` of the saved target with a draft model that agrees in part (so Hugging
    Face assisted generation runs too) and a fixed draft length, so that every figure but the
    speeds follows from the tokens alone."""
    folder = tmp_path_factory.mktemp("bench")
    perturbed_copy(tiny_model("llama", seed=0), scale=0.1).save_pretrained(folder / "draft")
    byte_tokenizer().save_pretrained(folder / "draft")
    argv = bench(saved, f"draft-model:{folder / 'draft'}", prompts(folder, *BENCH_PROMPTS))
    return [*argv, "--policy", "fixed", "--max-new-tokens", "12", "--dtype", "float32"]


@pytest.fixture(scope="module")
def one_device_report(bench_argv, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("report") / "report.json"
    main([*bench_argv, "--json", str(out)])
    return json.loads(out.read_text())


def decoding(report: dict) -> dict:
    """The figures of a bench report that the decoded tokens decide (not the clock)."""
    keys = ("n_prompts", "mean_accepted_length", "mean_draft_size", "acceptance_by_position")
    keys += ("identical_to_plain", "hf_identical_to_plain")
    groups = {**report["workloads"], "overall": report["overall"]}
    return {name: {key: figures[key] for key in keys} for name, figures in groups.items()}


def test_bench_with_tensor_parallel_on_two_processes_decodes_alike_and_reports_once(
    bench_argv, one_device_report, tmp_path
):
    out = tmp_path / "report.json"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_port", str(free_port()), "-m", "draftsmith.commands.cli",
        *bench_argv, "--tensor-parallel", "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=os.environ)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("ours tok/s") == done.stdout.count(f"wrote {out}") == 1
    report = json.loads(out.read_text())
    assert report["config"]["tensor_parallel"] is True and report["config"]["placement"] == "tp2"
    assert decoding(report) == decoding(one_device_report)
    assert report["overall"]["hf_tok_s"] is not None  # assisted generation runs sharded too
    assert 1.0 < report["overall"]["mean_accepted_length"] < 5.0  # some drafts cut short


@pytest.mark.parametrize("form", ["devices", "json", "auto"])
def test_bench_with_a_device_map_decodes_the_one_device_figures(
    form, saved, bench_argv, one_device_report, tmp_path
):
    device_map = {"devices": "cpu,cpu", "json": str(tmp_path / "map.json"), "auto": "auto"}[form]
    split = split_device_map(tiny_model("llama").config, ["cpu", "cpu"])
    (tmp_path / "map.json").write_text(json.dumps(split))
    out = tmp_path / "report.json"
    main([*bench_argv, "--device-map", device_map, "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["config"]["device_map"] == device_map
    assert report["config"]["tensor_parallel"] is False
    assert decoding(report) == decoding(one_device_report)


def test_profile_with_a_device_map_writes_the_curve(saved, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path))
    argv = ["--target", str(saved), "--device-map", "cpu,cpu", "--max-tokens", "2"]
    main(["profile", *argv, "--context", "8", "--repeats", "1", "--dtype", "float32"])
    # cpu,cpu is one device: the curve is the one-device curve, where the decoder looks
    assert CostCurve.load(CostCurve.default_path(str(saved), "float32", "cpu")).tokens == [1, 2]


def test_a_curve_measured_over_several_devices_is_kept_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path))
    split = SimpleNamespace(hf_device_map={"model.layers.0": 0, "lm_head": 1})
    assert placement(split) == "2-devices"
    assert placement(tiny_model("llama")) == ""
    path = CostCurve.default_path("t", "float32", "cuda:0", placement(split))
    assert path.name == "t--float32--cuda--2-devices.json"


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--device-map", "nonsense"], "--device-map 'nonsense': 'nonsense' is not a device; "
         "give auto, a comma-separated device list (e.g. cuda:0,cuda:1) or a JSON file"),
        (["--device-map", "cpu,cuda:99"], "names cuda:99, but this machine has"),
        (["--device-map", "missing.json"], "--device-map missing.json: no such file; give auto"),
        (["--device-map", "cpu", "--tensor-parallel"],
         "--device-map and --tensor-parallel are two ways to spread the target: give one"),
    ],
)  # fmt: skip
def test_bad_placement_flags_fail_before_any_model_loads(flags, complaint, tmp_path, capsys):
    file = prompts(tmp_path, '{"prompt": "x"}')
    assert complaint in fails(capsys, [*bench("unused", "ngram", file), *flags])
    assert complaint in fails(capsys, ["profile", "--target", "unused", *flags])


def test_placement_flags_that_need_the_target_fail_before_its_weights_load(
    saved, tmp_path, capsys, monkeypatch
):
    file = prompts(tmp_path, '{"prompt": "x"}')
    argv = [*bench(saved, "ngram", file), "--tensor-parallel"]
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert "started by torchrun" in fails(capsys, argv)
    route = [*bench("unused", "route:ngram+ngram:2", file), "--tensor-parallel"]
    assert "under --tensor-parallel the processes would draft differently" in fails(capsys, route)
    (tmp_path / "map.json").write_text('{"": "cpu", "model.layers.7": "cpu"}')
    argv = [*bench(saved, "ngram", file), "--device-map", str(tmp_path / "map.json")]
    assert "names model.layers.7, which LlamaForCausalLM does not have" in fails(capsys, argv)
