"""scripts/compare_policies.py's interval on a speed ratio: it must hold the ratio the summed
prompts give, and widen when the prompts disagree."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compare_policies.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("compare_policies", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _prompts(policy_seconds: list[float]) -> list[dict]:
    return [
        {"tokens": {"plain": 100, "p": 100}, "seconds": {"plain": 10.0, "p": s}}
        for s in policy_seconds
    ]


def test_the_interval_holds_the_ratio_and_widens_with_disagreeing_prompts(script):
    agreeing = script.speedup_interval(_prompts([8.0] * 8), "p")
    assert agreeing == pytest.approx((1.25, 1.25))
    low, high = script.speedup_interval(_prompts([6.0, 14.0] * 4), "p")
    assert low < 1.0 < high  # summed: 80 s each, a ratio of 1.0
    narrow = script.speedup_interval(_prompts([9.0, 11.0] * 4), "p")
    assert low < narrow[0] < 1.0 < narrow[1] < high


def test_the_interval_weighs_prompts_by_their_tokens(script):
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

    short, long = (script.speedup_interval(with_slow_prompt(n), "p") for n in (10, 100))
    assert long[0] < short[0] < 1.0
    assert long[1] <= short[1] == pytest.approx(1.0)
