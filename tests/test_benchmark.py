"""The side-by-side benchmark harness on tiny models (speed itself is never asserted)."""

from __future__ import annotations

import copy
import json
import logging
from types import SimpleNamespace

import pytest
import torch
from conftest import perturbed_copy, tiny_model

from draftsmith.core import attention as attention_module
from draftsmith.core.attention import use_grouped_sdpa
from draftsmith.core.small_rows import small_rows
from draftsmith.decoding import FixedPolicy, SpeculativeDecoder
from draftsmith.decoding.results import GenerationResult, GenerationStats
from draftsmith.evaluation.benchmark import Benchmark
from draftsmith.evaluation.divergence import (
    FLOAT32_ULPS,
    RESCORE_BLOCKS,
    format_divergence,
    judge_divergence,
    next_logits_by_shape,
    next_logits_in_batch,
)
from draftsmith.evaluation.prompts import bundled_prompts, load_prompts
from draftsmith.evaluation.report import format_table
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
        llama, drafter, byte_tokenizer, policy=FixedPolicy(max_draft_tokens=4)
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


def test_near_tie_within_the_measured_error_is_rounding():
    # float32 says token 1 by 0.02; the run's logits are off by 0.03125 and 0.02 there, enough to
    # flip the pair: plain took token 0 and ours token 1, a tie the run cannot resolve.
    reference = torch.tensor([5.0, 5.02, 1.0, 0.0])
    run = torch.tensor([5.03125, 5.0, 1.0, 0.0], dtype=torch.bfloat16)
    judged = judge_divergence(run, reference, plain_token=0, our_token=1)
    errors = (run.double() - reference.double()).abs()
    assert judged["float32_gap"] == pytest.approx(-0.02, abs=1e-6)
    assert judged["run_gap"] == pytest.approx(0.03125)
    assert judged["run_error"] == pytest.approx(2 * errors.max().item())
    assert judged["tolerance"] >= judged["run_error"]
    assert judged["explained"] is True


def test_the_run_error_is_the_largest_over_its_forward_shapes():
    # float32 puts token 0 0.05 ahead. The cache-free forward is off by 0.019 on the pair, too
    # little to flip it; a block forward is off by 0.05 on token 1 and picks it, as a verification
    # block may: the divergence is rounding by that shape's error, not by the cache-free one's.
    reference = torch.tensor([5.0, 4.95, 1.0])
    cache_free = torch.tensor([5.0, 4.98, 1.0], dtype=torch.bfloat16)
    block = torch.tensor([4.96875, 5.0, 1.0], dtype=torch.bfloat16)
    alone = judge_divergence(cache_free, reference, plain_token=0, our_token=1)
    assert alone["explained"] is False
    judged = judge_divergence(torch.stack([cache_free, block]), reference, 0, 1)
    assert judged["run_gap"] == alone["run_gap"]
    assert judged["run_gaps"][1] == pytest.approx(-0.03125)
    assert judged["run_error"] == pytest.approx(2 * 0.05, abs=1e-6)  # its token 1's, twice
    assert judged["explained"] is True


def test_clear_gap_is_not_rounding_however_close_the_run_gap():
    # The run puts tokens 0 and 1 0.0625 apart and errs by 0.1875 at most on any one token, so by
    # 0.375 on a pair; float32 puts them 0.5 apart, past that: the float32 gap decides, not the
    # run's.
    reference = torch.tensor([5.0, 4.5, 4.96875, 0.0])
    run = torch.tensor([5.0, 4.9375, 5.0, 0.0], dtype=torch.bfloat16)
    judged = judge_divergence(run, reference, plain_token=0, our_token=1)
    assert judged["run_gap"] == pytest.approx(0.0625)
    assert judged["run_error"] == pytest.approx(2 * 0.4375)
    assert judged["float32_gap"] == pytest.approx(0.5)
    reference[1] = 4.0  # token 1 off by 0.9375 in the run: float32 gap 1.0 against 0.9375 * 2
    judged = judge_divergence(run, reference, plain_token=0, our_token=1)
    assert judged["float32_gap"] == pytest.approx(1.0)
    assert judged["explained"] is True
    # Tokens 0 and 2, tied in the run, lie 0.03125 apart in float32: within the run's error there.
    judged = judge_divergence(run, reference, plain_token=0, our_token=2)
    assert judged["run_gap"] == 0.0
    assert judged["float32_gap"] == pytest.approx(0.03125)
    assert judged["explained"] is True


def test_the_run_error_reads_the_likely_tokens_not_the_pair_alone():
    # Every shape rounds the pair alike (0.05 off at most, float32 gap 0.2), but another likely
    # token is 0.25 off in one of them: a third shape (a draft's masked block) can be as far off
    # on either token of the pair, so a 0.2 gap is within its reach.
    reference = torch.tensor([34.7259, 34.5228, 34.0, 1.0])
    shapes = torch.tensor(
        [[34.75, 34.5, 34.0, 1.0], [34.75, 34.5, 33.75, 1.0]], dtype=torch.bfloat16
    )
    judged = judge_divergence(shapes, reference, plain_token=0, our_token=1)
    pair_error = float((shapes[:, :2].double() - reference[:2].double()).abs().sum(-1).max())
    assert pair_error < judged["float32_gap"] == pytest.approx(0.2031, abs=1e-4)
    assert judged["run_error"] == pytest.approx(0.5)
    assert judged["explained"] is True
    shapes[1, 2] = 34.0  # no token off by more than the pair's: 0.2 is past the run's reach
    assert judge_divergence(shapes, reference, plain_token=0, our_token=1)["explained"] is False


def test_float32_runs_excuse_only_a_few_ulps():
    top = torch.tensor(5.0)
    near = top
    for _ in range(FLOAT32_ULPS):
        near = torch.nextafter(near, torch.tensor(0.0))
    logits = torch.stack([top, near, torch.tensor(1.0)])
    judged = judge_divergence(logits, logits, plain_token=0, our_token=1)
    assert judged["run_error"] == 0.0
    assert judged["explained"] is True
    logits[1] = torch.nextafter(near, torch.tensor(0.0))
    assert judge_divergence(logits, logits, plain_token=0, our_token=1)["explained"] is False


class SwapDecoder:
    """Stands in for the speculative decoder: replays given outputs, one per prompt."""

    def __init__(self, outputs: dict[tuple[int, ...], list[int]]) -> None:
        self.outputs = outputs

    def generate(self, ids, max_new_tokens, **_) -> GenerationResult:
        tokens = self.outputs[tuple(ids.tolist())][:max_new_tokens]
        return GenerationResult(tokens=tokens, text=None, stats=GenerationStats())

    def generate_batch(self, prompts, max_new_tokens, **_) -> list[GenerationResult]:
        return [self.generate(ids, max_new_tokens) for ids in prompts]


def greedy(model, ids: torch.Tensor, max_new_tokens: int) -> list[int]:
    out = model.generate(
        ids[None],
        attention_mask=torch.ones_like(ids[None]),
        do_sample=False,
        max_new_tokens=max_new_tokens,
    )
    return out[0, ids.numel() :].tolist()


def next_logits(model, ids: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.cat([ids, torch.tensor(tokens, dtype=torch.long)])[None]).logits[0, -1]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_divergences_are_judged_by_a_float32_rescore(byte_tokenizer, caplog, dtype):
    target = tiny_model("llama", seed=0).to(dtype)
    new = 8
    ids = [byte_tokenizer(p["prompt"], return_tensors="pt").input_ids[0] for p in PROMPTS[:2]]
    # A near-tie: token b's output row copies token a's with one weight scaled by 1 + 2**-7 (about
    # a bfloat16 ulp), so a and b differ by a hair: less than bfloat16 resolves, far more than
    # float32 does.
    before = greedy(target, ids[0], new)
    a = before[2]
    b = next(t for t in range(a + 1, 256) if t not in before)
    with torch.no_grad():
        row = target.lm_head.weight[a].clone()
        row[0] *= 1 + 2**-7
        target.lm_head.weight[b] = row
    plain = [greedy(target, i, new) for i in ids]
    near = next(i for i, t in enumerate(plain[0]) if t in (a, b))
    tie_ours = plain[0][:near] + [a + b - plain[0][near]]
    # A clear loser: ours takes the token the target ranks last.
    clear = 3
    loser = int(next_logits(target, ids[1], plain[1][:clear]).argmin())
    clear_ours = plain[1][:clear] + [loser]
    decoder = SwapDecoder(
        {tuple(i.tolist()): o for i, o in zip(ids, [tie_ours, clear_ours], strict=True)}
    )

    bench = Benchmark(target, byte_tokenizer, decoder, {}, max_new_tokens=new)
    with caplog.at_level(logging.INFO, logger="draftsmith.evaluation.divergence"):
        report = bench.run(PROMPTS[:2])

    overall = report["overall"]
    tie, lost = overall["divergences"]
    reference = copy.deepcopy(target).float()
    for d, prompt, ours in ((tie, 0, tie_ours), (lost, 1, clear_ours)):
        position = len(ours) - 1
        assert (d["prompt"], d["position"]) == (prompt, position)
        assert (d["plain_token"], d["draftsmith_token"]) == (plain[prompt][position], ours[-1])
        pair = [d["plain_token"], d["draftsmith_token"]]
        run = next_logits(target, ids[prompt], ours[:-1])[pair].double()
        ref = next_logits(reference, ids[prompt], ours[:-1])[pair].double()
        assert d["run_gap"] == pytest.approx(float(run[0] - run[1]), abs=1e-6)
        assert d["float32_gap"] == pytest.approx(float(ref[0] - ref[1]), abs=1e-6)
        # The run's error is the largest over its forward shapes, the cache-free one among them.
        cache_free_error = float((run - ref).abs().sum())
        assert d["run_error"] >= cache_free_error - 1e-6
        assert d["run_gaps"][0] == d["run_gap"]
        # bfloat16 re-runs the position in block forwards too; float32 needs no rounding bound.
        assert (len(d["run_gaps"]) > 1) is (dtype == torch.bfloat16)
    assert tie["float32_gap"] != 0.0
    rounds_away = dtype == torch.bfloat16
    assert tie["explained"] is rounds_away
    assert lost["explained"] is False
    assert overall["unexplained_divergences"] == ([lost] if rounds_away else [tie, lost])
    assert overall["identical_to_plain"] is False
    assert format_divergence(tie).startswith(
        "divergence (rounding)" if rounds_away else "divergence (UNEXPLAINED)"
    )
    assert str(loser) in format_divergence(lost)
    # A float32 copy only where the run's dtype is not float32, made once for both divergences,
    # and the target itself left in its dtype.
    copies = [r for r in caplog.records if "re-scoring a divergence in float32" in r.message]
    assert len(copies) == (1 if rounds_away else 0)
    assert next(target.parameters()).dtype == dtype
    json.dumps(report)


def test_a_batch_row_is_rescored_where_it_sat_in_its_left_padded_batch(byte_tokenizer):
    target = tiny_model("llama", seed=0)
    prefixes = [byte_tokenizer(p["prompt"], return_tensors="pt").input_ids[0] for p in PROMPTS]
    assert len({p.numel() for p in prefixes}) == len(prefixes)  # padded differently
    with torch.no_grad():
        for row, prefix in enumerate(prefixes):
            in_batch = next_logits_in_batch(target, prefixes, row)
            alone = target(prefix[None]).logits[0, -1]
            # One shape per block narrower than the shortest prompt, each the row's own logits:
            # padding hidden, positions counted from the row's first token.
            assert in_batch.shape[0] > 2
            torch.testing.assert_close(in_batch, alone.expand_as(in_batch), atol=1e-4, rtol=0)


def test_a_bfloat16_batch_divergence_is_judged_over_its_batched_shapes(byte_tokenizer):
    target = tiny_model("llama", seed=0).to(torch.bfloat16)
    ids = [byte_tokenizer(p["prompt"], return_tensors="pt").input_ids[0] for p in PROMPTS[:2]]
    plain = [greedy(target, i, 6) for i in ids]
    ours = plain[0][:3] + [int(next_logits(target, ids[0], plain[0][:3]).argmin())]
    decoder = SwapDecoder({tuple(ids[0].tolist()): ours, tuple(ids[1].tolist()): plain[1]})

    def shapes(batch_size: int) -> int:
        bench = Benchmark(
            target, byte_tokenizer, decoder, {}, max_new_tokens=6, batch_size=batch_size
        )
        (divergence,) = bench.run(PROMPTS[:2])["overall"]["divergences"]
        assert (divergence["prompt"], divergence["position"]) == (0, 3)
        return len(divergence["run_gaps"])

    alone = shapes(1)
    assert shapes(2) > alone


def test_a_bfloat16_divergence_is_judged_on_plain_generates_own_logits_too(byte_tokenizer):
    """The last shape is plain `generate` replayed to the diverging position (its cache built
    step by step, on the kernels it ran on): its own logits there, which no re-run of the prefix
    reproduces exactly."""
    target = tiny_model("llama", seed=0).to(torch.bfloat16)
    ids = byte_tokenizer(PROMPTS[0]["prompt"], return_tensors="pt").input_ids[0]
    plain = greedy(target, ids, 6)
    ours = plain[:3] + [int(next_logits(target, ids, plain[:3]).argmin())]
    bench = Benchmark(
        target, byte_tokenizer, SwapDecoder({tuple(ids.tolist()): ours}), {}, max_new_tokens=6
    )
    (divergence,) = bench.run(PROMPTS[:1])["overall"]["divergences"]
    with torch.no_grad(), small_rows(target):
        out = target.generate(
            ids[None],
            attention_mask=torch.ones_like(ids[None]),
            do_sample=False,
            max_new_tokens=4,
            output_logits=True,
            return_dict_in_generate=True,
        )
    own = out.logits[3][0]
    pair = [divergence["plain_token"], divergence["draftsmith_token"]]
    assert divergence["run_gaps"][-1] == pytest.approx(float(own[pair[0]] - own[pair[1]]))
    with torch.no_grad():
        prefix = torch.cat([ids, torch.tensor(plain[:3])])
        blocks = next_logits_by_shape(target, prefix, torch.tensor(plain[3:]))
    assert len(divergence["run_gaps"]) == len(blocks) + 1


def test_the_judge_reruns_blocks_under_a_mask_through_the_grouped_attention(monkeypatch):
    """A draft's verification passes a mask, under which a grouped-query model attends through
    `grouped_sdpa_attention`'s stacked query heads (rounding unlike transformers' maskless
    blocks): the judge's shapes hold every block again under an explicit mask, computed so."""
    model = tiny_model("llama", seed=4, attn_implementation="sdpa")
    use_grouped_sdpa(model)
    stacked = []
    sdpa = attention_module.F.scaled_dot_product_attention
    monkeypatch.setattr(
        attention_module,
        "F",
        SimpleNamespace(
            scaled_dot_product_attention=lambda q, *a, **k: (
                stacked.append(q.shape[-2]) or sdpa(q, *a, **k)
            )
        ),
    )
    prefix, after = torch.arange(5, 45), torch.arange(50, 90)
    with torch.no_grad():
        rows = next_logits_by_shape(model, prefix, after)
    first = [m for m in RESCORE_BLOCKS if m - 1 <= after.numel()]
    last = [m for m in RESCORE_BLOCKS if 1 < m < prefix.numel()]
    assert rows.shape[0] == 1 + 2 * (len(first) + len(last))
    groups = model.config.num_attention_heads // model.config.num_key_value_heads
    assert set(stacked) == {groups * m for m in first + last}  # one-token blocks stack too
    # Each block with and without the mask: the same attention, rounded differently at most.
    torch.testing.assert_close(rows[2::2], rows[1::2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch_size", [1, 2])
def test_a_divergence_at_the_first_new_token_is_judged(byte_tokenizer, batch_size):
    """No plain token precedes it: the re-scored prefix is the prompt alone (an empty list of
    tokens must not turn the prompt's ids into floats)."""
    target = tiny_model("llama", seed=0).to(torch.bfloat16)
    ids = [byte_tokenizer(p["prompt"], return_tensors="pt").input_ids[0] for p in PROMPTS[:2]]
    plain = [greedy(target, i, 4) for i in ids]
    ours = [int(next_logits(target, ids[0], []).argmin()), *plain[0][1:]]
    decoder = SwapDecoder({tuple(ids[0].tolist()): ours, tuple(ids[1].tolist()): plain[1]})
    bench = Benchmark(target, byte_tokenizer, decoder, {}, max_new_tokens=4, batch_size=batch_size)
    (divergence,) = bench.run(PROMPTS[:2])["overall"]["divergences"]
    assert (divergence["prompt"], divergence["position"]) == (0, 0)
    assert divergence["draftsmith_token"] == ours[0] and not divergence["explained"]


def test_an_output_that_stops_early_is_unexplained(llama, byte_tokenizer):
    ids = byte_tokenizer(PROMPTS[0]["prompt"], return_tensors="pt").input_ids[0]
    short = greedy(llama, ids, 10)[:6]
    decoder = SwapDecoder({tuple(ids.tolist()): short})
    report = Benchmark(llama, byte_tokenizer, decoder, {}, max_new_tokens=10).run(PROMPTS[:1])
    (d,) = report["overall"]["unexplained_divergences"]
    assert (d["position"], d["plain_token"], d["explained"]) == (6, None, False)
    assert "stops" in format_divergence(d)


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


def test_a_lossy_verifier_is_labelled_and_scored_by_exact_match(llama, byte_tokenizer):
    from draftsmith.decoding.lossy import build_verifier

    # An unrelated draft model: loose typical acceptance takes tokens the target would not.
    decoder = SpeculativeDecoder(
        llama,
        DraftModelDrafter(tiny_model("llama", seed=99)),
        byte_tokenizer,
        policy=FixedPolicy(max_draft_tokens=4),
        verifier=build_verifier("typical", 1.0),
    )
    report = Benchmark(llama, byte_tokenizer, decoder, {}, max_new_tokens=12).run(PROMPTS)
    overall = report["overall"]
    assert report["lossy"] is True and overall["lossy"] is True
    assert overall["identical_to_plain"] is None and overall["divergences"] == []
    assert 0.0 <= overall["exact_match_rate"] < 1.0
    table = format_table(report)
    assert table.startswith("LOSSY") and "lossy" in table.splitlines()[-1]


def test_sampling_flags_need_a_temperature(llama, byte_tokenizer):
    decoder = SpeculativeDecoder(llama, NgramDrafter(), byte_tokenizer)
    with pytest.raises(ValueError, match="temperature"):
        Benchmark(llama, byte_tokenizer, decoder, {}, top_p=0.9)
    bench = Benchmark(
        llama, byte_tokenizer, decoder, {}, max_new_tokens=6, temperature=1.0, top_p=0.9
    )
    assert bench.run(PROMPTS[:1])["overall"]["identical_to_plain"] is None
