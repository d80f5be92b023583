"""The bootstrap interval on a speed ratio that `Benchmark` and benchmarks/policies/compare_policies.py share
(it must hold the ratio the summed prompts give, and widen when the prompts disagree), the
methods' rotating order, and the plain runs compare_policies.py and `draftsmith bench --lockstep`
replay for the divergence judge."""

import argparse
import functools
import importlib.util
from pathlib import Path

import pytest
import torch
from conftest import tiny_model

from draftsmith.core.sampling import SamplingParams
from draftsmith.evaluation.divergence import DivergedBatch, DivergenceJudge
from draftsmith.evaluation.lockstep import PlainSteps, replay_plain_steps
from draftsmith.evaluation.stats import rotated, speedup_interval

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "policies" / "compare_policies.py"


def _prompts(policy_seconds: list[float]) -> list[dict]:
    return [
        {"tokens": {"plain": 100, "p": 100}, "seconds": {"plain": 10.0, "p": s}}
        for s in policy_seconds
    ]


def test_every_method_leads_once_in_as_many_repeats():
    orders = [rotated(["plain", "hf", "ours"], repeat) for repeat in range(3)]
    assert [order[0] for order in orders] == ["plain", "hf", "ours"]
    assert all(sorted(order) == ["hf", "ours", "plain"] for order in orders)


def test_the_interval_holds_the_ratio_and_widens_with_disagreeing_prompts():
    agreeing = speedup_interval(_prompts([8.0] * 8), "p")
    assert agreeing == pytest.approx((1.25, 1.25))
    low, high = speedup_interval(_prompts([6.0, 14.0] * 4), "p")
    assert low < 1.0 < high  # summed: 80 s each, a ratio of 1.0
    narrow = speedup_interval(_prompts([9.0, 11.0] * 4), "p")
    assert low < narrow[0] < 1.0 < narrow[1] < high


def test_the_interval_weighs_prompts_by_their_tokens():
    """One prompt five times slower under the policy moves the summed ratio less when it is
    short."""

    def with_slow_prompt(tokens: int) -> list[dict]:
        prompts = _prompts([10.0] * 7)
        plain_s = tokens / 10
        prompts.append(
            {
                "tokens": {"plain": tokens, "p": tokens},
                "seconds": {"plain": plain_s, "p": 5 * plain_s},
            }
        )
        return prompts

    short, long = (speedup_interval(with_slow_prompt(n), "p") for n in (10, 100))
    assert long[0] < short[0] < 1.0
    assert long[1] <= short[1] == pytest.approx(1.0)


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPT.parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_replays_its_own_plain_run_for_the_divergence_judge(byte_tokenizer):
    """compare_policies judges a divergence on plain `generate`'s own logits at the position,
    lockstep on its bare loop's: each replay must return what its plain run computed there (in
    bfloat16 no re-run of the prefix in another shape need match it), and the judge uses it as
    its last shape."""
    target = tiny_model("llama", seed=0).to(torch.bfloat16)
    ids = byte_tokenizer("def add(a, b):", return_tensors="pt").input_ids[0]
    args = argparse.Namespace(temperature=0.0, top_p=None)
    compare = _load("compare_policies")
    out = compare._generate_plain(
        target, byte_tokenizer, ids, args, 6, output_logits=True, return_dict_in_generate=True
    )
    plain = out.sequences[0, ids.numel() :].tolist()
    batch = DivergedBatch([ids], [plain], 0)
    generated = compare._replay_plain(target, byte_tokenizer, args, batch, 4)
    torch.testing.assert_close(generated, out.logits[4], atol=0, rtol=0)

    steps = PlainSteps(target, ids, SamplingParams(), 0, clock=lambda: 0.0)
    steps.run_to(6)
    assert steps.tokens == plain
    replayed = replay_plain_steps(target, batch, 4)
    assert replayed.shape == (1, out.logits[4].shape[-1])
    assert int(replayed.argmax()) == plain[4]

    ours = plain[:4] + [int(replayed.argmin())]
    judged = DivergenceJudge(target, functools.partial(replay_plain_steps, target))(0, batch, ours)
    assert judged["position"] == 4 and judged["explained"] is False
    pair = [plain[4], ours[4]]
    assert judged["run_gaps"][-1] == pytest.approx(
        float(replayed[0, pair[0]] - replayed[0, pair[1]])
    )
