"""The side-by-side benchmark harness on tiny models (speed itself is never asserted)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import perturbed_copy

from draftsmith.commands.bench import bundled_prompts
from draftsmith.decoding import DraftLengthPolicy, SpeculativeDecoder
from draftsmith.decoding.benchmark import Benchmark, format_table, load_prompts, rounding_tolerance
from draftsmith.heads import DraftModelDrafter, NgramDrafter

PROMPTS = [
    {"prompt": "def add(a, b):\n    return", "workload": "code"},
    {"prompt": "Once upon a time", "workload": "prose"},
    {"prompt": "for i in range(10):", "workload": "code"},
]


@pytest.mark.parametrize("kind", ["draft-model", "ngram"])
def test_report_has_every_key_and_greedy_identity(llama, byte_tokenizer, kind):
    if kind == "draft-model":
        draft = perturbed_copy(llama, scale=0.05)
        drafter, assist = DraftModelDrafter(draft), {"assistant_model": draft}
    else:
        drafter, assist = NgramDrafter(), {"prompt_lookup_num_tokens": 4}
    decoder = SpeculativeDecoder(
        llama, drafter, byte_tokenizer, policy=DraftLengthPolicy(max_draft_tokens=4)
    )
    report = Benchmark(llama, byte_tokenizer, decoder, assist, max_new_tokens=10).run(PROMPTS)
    assert set(report["workloads"]) == {"code", "prose"}
    assert report["workloads"]["code"]["n_prompts"] == 2
    overall = report["overall"]
    for key in (
        "plain_tok_s",
        "hf_tok_s",
        "draftsmith_tok_s",
        "speedup_vs_plain",
        "speedup_vs_hf",
        "mean_accepted_length",
        "acceptance_by_position",
        "identical_to_plain",
        "divergences",
        "unexplained_divergences",
        "n_prompts",
    ):
        assert key in overall
    assert overall["identical_to_plain"] is True
    assert overall["hf_identical_to_plain"] is True
    assert overall["divergences"] == []
    assert overall["mean_accepted_length"] >= 1.0
    assert all(0.0 <= a <= 1.0 for a in overall["acceptance_by_position"])
    json.dumps(report)  # the report is plain JSON
    table = format_table(report)
    assert "overall" in table and "prose" in table


def test_sampling_report_leaves_identity_undefined(llama, byte_tokenizer):
    decoder = SpeculativeDecoder(llama, NgramDrafter(), byte_tokenizer)
    bench = Benchmark(
        llama,
        byte_tokenizer,
        decoder,
        {"prompt_lookup_num_tokens": 4},
        max_new_tokens=6,
        temperature=0.8,
    )
    report = bench.run(PROMPTS[:1])
    assert report["overall"]["identical_to_plain"] is None


def test_rounding_tolerance_scales_with_dtype_and_magnitude():
    # bf16 has 8 significant bits: one ulp at 20.0 (in [16, 32)) is 16 * 2**-7 = 0.125.
    assert rounding_tolerance(20.0, torch.bfloat16) == pytest.approx(8 * 0.125)
    assert rounding_tolerance(-20.0, torch.bfloat16) == pytest.approx(8 * 0.125)
    assert rounding_tolerance(20.0, torch.float32) == pytest.approx(8 * 16 * 2**-23)
    assert rounding_tolerance(1.5, torch.bfloat16) < rounding_tolerance(20.0, torch.bfloat16)


def test_bundled_prompts_cover_code_chat_and_prose():
    records = load_prompts(bundled_prompts())
    assert {r["workload"] for r in records} >= {"code", "chat", "prose"}


def test_prompt_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_prompts(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="holds no prompts"):
        load_prompts(empty)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt field"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: each line needs"):
        load_prompts(bad)
