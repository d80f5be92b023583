"""`route:SPEC+SPEC` drafter specs: bad ones fail before any model loads, good ones build a
`RoutingDrafter` that `draftsmith bench` decodes with."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import tiny_model
from head_helpers import build_head, fit

from draftsmith.artifact import save_artifact
from draftsmith.build.drafters import build_drafter, drafter_kind, route_parts
from draftsmith.calibration.calibrators import build_calibrator
from draftsmith.commands.cli import main
from draftsmith.decoding.routing import RoutingDrafter
from draftsmith.heads import NgramDrafter


@pytest.fixture(scope="module")
def saved(tmp_path_factory, byte_tokenizer):
    """A saved tiny target and two artifacts (briefly trained) for it, one calibrated."""
    root = tmp_path_factory.mktemp("route")
    target = tiny_model("llama", seed=0)
    target.save_pretrained(root / "target")
    byte_tokenizer.save_pretrained(root / "target")
    for name in ("eagle3", "medusa"):
        head = fit(build_head(name, target), target, steps=5)
        save_artifact(head, target, root / name, training={"steps": 0}, target_name_or_path="t")
    calibrator = build_calibrator("platt").fit(
        np.array([0.2, 0.9, 0.4, 0.8]), np.array([0, 1, 0, 1])
    )
    calibrator.save(root / "eagle3")
    return root, target, byte_tokenizer


@pytest.mark.parametrize(
    "spec, complaint",
    [
        ("route:", "routes between nothing"),
        ("route", "routes between nothing"),
        ("route:ngram+", "has an empty part around a '+'"),
        ("route:ngram+route:ngram:4", "holds a route in a route"),
        ("route:ngram+ngram", "names ['ngram'] twice"),
        ("route:ngram+magic", "unknown drafter spec 'magic'"),
    ],
)
def test_a_bad_route_fails_before_any_model_loads(spec, complaint, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "x"}\n')
    with pytest.raises(SystemExit):
        main(["bench", "--target", "unused", "--drafter", spec, "--prompts", str(prompts)])
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith("draftsmith bench: error: ") and complaint in line


def test_a_route_checks_each_artifact_before_any_model_loads(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "x"}\n')
    spec = f"route:ngram+artifact:{tmp_path / 'none'}"
    with pytest.raises(SystemExit):
        main(["bench", "--target", "unused", "--drafter", spec, "--prompts", str(prompts)])
    assert str(tmp_path / "none") in capsys.readouterr().err


def test_a_route_builds_a_router_named_by_its_specs(saved):
    root, target, tokenizer = saved
    eagle3, medusa = f"artifact:{root / 'eagle3'}", f"artifact:{root / 'medusa'}"
    built = build_drafter(f"route:{eagle3}+ngram:4", target, tokenizer)
    assert isinstance(built.drafter, RoutingDrafter)
    assert (
        list(built.drafter.drafters)
        == [eagle3, "ngram:4"]
        == route_parts(f"route:{eagle3}+ngram:4")
    )
    assert built.drafter.drafters["ngram:4"].max_ngram == 4
    assert isinstance(built.drafter.drafters["ngram:4"], NgramDrafter)
    assert built.acceptance is not None and built.acceptance.kind == "platt"  # eagle3's
    assert built.hf_assist == {}
    uncalibrated = build_drafter(f"route:{medusa}+ngram", target, tokenizer)
    assert uncalibrated.acceptance is None


def test_bench_decodes_with_a_route(saved, tmp_path):
    root, _, _ = saved
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "abcabcabcabc"}\n{"prompt": "hello", "workload": "chat"}\n')
    out = tmp_path / "r.json"
    spec = f"route:artifact:{root / 'eagle3'}+artifact:{root / 'medusa'}+ngram"
    argv = ["bench", "--target", str(root / "target"), "--drafter", spec, "--prompts", str(prompts)]
    main([*argv, "--max-new-tokens", "12", "--dtype", "float32", "--policy", "fixed"])
    main(
        [
            *argv,
            "--max-new-tokens",
            "12",
            "--dtype",
            "float32",
            "--policy",
            "fixed",
            "--json",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    assert report["overall"]["identical_to_plain"] is True
    assert report["overall"]["hf_tok_s"] is None


def test_reports_name_what_a_spec_drafts_with(saved):
    """bench's report records the drafter's kind: an artifact's head, a route's parts."""
    root = saved[0]
    assert drafter_kind(f"artifact:{root / 'medusa'}") == "medusa"
    assert drafter_kind("ngram:4") == "ngram"
    assert drafter_kind(f"route:artifact:{root / 'eagle3'}+ngram") == "eagle3+ngram"
