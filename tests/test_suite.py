"""The standard suite's runner on tiny models: repeats in rotating order with the fastest run
kept, intervals on every ratio, the environment a report names, prompt rendering, suite files and
``draftsmith bench --suite`` (speed itself is never asserted)."""

from __future__ import annotations

import json

import pytest
import torch

from draftsmith.commands.cli import main
from draftsmith.decoding import FixedPolicy, SpeculativeDecoder
from draftsmith.evaluation import suite as suite_module
from draftsmith.evaluation.benchmark import Benchmark
from draftsmith.evaluation.suite import (
    hardware_class,
    load_suite,
    render_prompt,
    run_suite,
    suite_path,
)
from draftsmith.heads import NgramDrafter

RECORDS = [
    {"id": "code-00", "workload": "code", "prompt": "def f(x):\n    return x", "source": "s",
     "licence": "l"},
    {"id": "chat-00", "workload": "chat", "prompt": [
        {"role": "user", "content": "hi hi"}, {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "hi again"}], "source": "s", "licence": "l"},
    {"id": "code-01", "workload": "code", "prompt": "for i in range(3):\n    for j in",
     "source": "s", "licence": "l"},
]  # fmt: skip


def _bench(llama, byte_tokenizer, repeats: int, cls=Benchmark) -> Benchmark:
    decoder = SpeculativeDecoder(
        llama, NgramDrafter(), byte_tokenizer, policy=FixedPolicy(max_draft_tokens=3)
    )
    assist = {"prompt_lookup_num_tokens": 3}
    return cls(llama, byte_tokenizer, decoder, assist, max_new_tokens=6, repeats=repeats)


def test_a_suite_run_reports_intervals_ids_and_its_environment(llama, byte_tokenizer):
    report = run_suite(_bench(llama, byte_tokenizer, repeats=2), RECORDS, command="draftsmith x")
    assert report["repeats"] == 2 and set(report["workloads"]) == {"code", "chat"}
    for summary in [report["overall"], *report["workloads"].values()]:
        for key in ("speedup_vs_plain", "speedup_vs_hf", "hf_speedup_vs_plain"):
            low, high = summary[f"{key}_interval"]
            assert low <= high
        assert summary["identical_to_plain"] is True
    assert [p["id"] for p in report["prompts"]] == ["code-00", "chat-00", "code-01"]
    assert set(report["prompts"][0]["seconds"]) == {"plain", "hf", "draftsmith"}
    env = report["environment"]
    assert env["dtype"] == "float32" and env["command"] == "draftsmith x"
    assert env["hardware"].startswith("cpu: ") and env["hardware_class"].startswith("cpu-")
    for key in ("torch", "transformers", "draftsmith", "date", "commit"):
        assert key in env


def test_repeats_rotate_the_methods_and_keep_each_ones_fastest_run(llama, byte_tokenizer):
    """Scripted wall times (no clock): draftsmith is fastest on its second run."""
    walls = {"plain": [3.0, 2.0, 4.0], "hf": [5.0, 5.0, 5.0], "draftsmith": [9.0, 1.0, 7.0]}
    order = []

    class Scripted(Benchmark):
        def _timed(self, method, batch):
            _, runs = super()._timed(method, batch)
            order.append(method)
            return walls[method][order.count(method) - 1], runs

    report = _bench(llama, byte_tokenizer, 3, Scripted).run([{"prompt": "abcabc", "workload": "w"}])
    assert order == ["plain", "hf", "draftsmith", "hf", "draftsmith", "plain"] + [
        "draftsmith", "plain", "hf"
    ]  # fmt: skip
    assert report["prompts"][0]["seconds"]["draftsmith"] == 1.0


def test_a_chat_record_goes_through_the_chat_template_or_a_transcript(byte_tokenizer):
    chat = RECORDS[1]
    assert (
        render_prompt(chat, byte_tokenizer)
        == "User: hi hi\nAssistant: hello\nUser: hi again\nAssistant:"
    )
    templated = byte_tokenizer.__class__(tokenizer_object=byte_tokenizer.backend_tokenizer)
    templated.chat_template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    assert render_prompt(chat, templated) == "<user>hi hi<assistant>hello<user>hi again<assistant>"
    assert render_prompt(RECORDS[0], templated) == RECORDS[0]["prompt"]


def test_suite_files_are_checked(tmp_path):
    with pytest.raises(ValueError, match="unknown suite 'nosuch'"):
        suite_path("nosuch")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "workload": "w", "prompt": ""}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: a suite record needs .*missing \['source'"):
        load_suite(str(bad))
    assert len(load_suite("standard")) >= 72


@pytest.mark.parametrize(
    ("amx", "bf16", "capability", "expected"),
    [(True, True, "AVX512", "cpu-amx"), (False, True, "AVX512", "cpu-avx512-bf16"),
     (False, False, "AVX2", "cpu-avx2")],
)  # fmt: skip
def test_the_hardware_class_names_the_cpus_fastest_matrix_units(
    monkeypatch, amx, bf16, capability, expected
):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    assert hardware_class(torch.device("cpu")) == expected


def test_bench_suite_runs_end_to_end(llama, byte_tokenizer, tmp_path, capsys, monkeypatch):
    target = tmp_path / "target"
    llama.save_pretrained(target)
    byte_tokenizer.save_pretrained(target)
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    out = tmp_path / "r.json"
    argv = ["bench", "--target", str(target), "--drafter", "ngram", "--suite", str(suite)]
    argv += ["--max-new-tokens", "4", "--policy", "fixed", "--json", str(out)]
    monkeypatch.setattr("sys.argv", ["draftsmith", *argv])  # the command the report names
    main(argv)
    report = json.loads(out.read_text())
    assert report["repeats"] == report["config"]["repeats"] == suite_module.SUITE_REPEATS
    assert report["overall"]["n_prompts"] == 3 and report["overall"]["hf_tok_s"] is not None
    assert "--suite" in report["environment"]["command"]
    with pytest.raises(SystemExit):
        main(["bench", "--target", "unused", "--drafter", "ngram", "--suite", "nosuch"])
    assert "unknown suite 'nosuch'" in capsys.readouterr().err
