"""The cost-aware policy's fallback on synthetic rounds: how much of a drafter's speed it keeps.

Each round drafts a 4-token chain at the Qwen pair's float32 CPU costs (0.12 s a draft step, the
verification curve measured here, 0.37 s a plain step); each token is accepted with probability
p until the first rejection; a probe's first round also pays 1 s of the drafter catching up; a
request is 128 rounds. Prints tokens/s relative to plain decoding for a fixed 4-token chain and
for the policy, over 3 seeds of 3,000 rounds:

    python benchmarks/policies/simulate_fallback.py [--policy-source FILE.py ...] [--patience 8]

--policy-source runs another version of `decoding/policies/cost_aware.py` beside this one (for
example `git show REV:decoding/policies/cost_aware.py > old.py`), each with its defaults.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
from functools import partial

import torch

from draftsmith.decoding.policies.base import RoundOutcome
from draftsmith.decoding.policies.cost_aware import CostAwarePolicy
from draftsmith.decoding.profile import CostCurve
from draftsmith.heads import Draft

PLAIN_S, STEP_S, CATCH_UP_S, DRAFTED = 0.37, 0.12, 1.0, 4
CURVE = CostCurve(
    tokens=[1, 2, 3, 4, 5, 6, 8],
    verify_s=[0.37, 0.37, 0.425, 0.46, 0.65, 0.67, 0.85],
    context=256,
)


def speed_vs_plain(make_policy, p_accept: float, seeds: int = 3, rounds: int = 3000) -> float:
    ratios = []
    for seed in range(seeds):
        rng = random.Random(seed)
        policy = make_policy()
        tokens = seconds = 0.0
        for i in range(rounds):
            if i % 128 == 0:
                policy.start()
            if policy.shape().max_tokens == 0:
                policy.observe(RoundOutcome(Draft.empty(), [], 0.0, PLAIN_S))
                tokens, seconds = tokens + 1, seconds + PLAIN_S
                continue
            draft = policy.trim(Draft(tokens=torch.arange(DRAFTED)))
            accepted = 0
            while accepted < DRAFTED and rng.random() < p_accept:
                accepted += 1
            draft_s = DRAFTED * STEP_S + (0.0 if policy._drafted_before else CATCH_UP_S)
            round_s = draft_s + CURVE.verify_cost(DRAFTED + 1)
            policy.observe(RoundOutcome(draft, list(range(accepted)), draft_s, round_s))
            tokens, seconds = tokens + accepted + 1, seconds + round_s
        ratios.append(tokens / seconds * PLAIN_S)
    return sum(ratios) / len(ratios)


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.CostAwarePolicy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policy-source", action="append", default=[])
    parser.add_argument("--patience", type=float, help="this version's patience (its default)")
    args = parser.parse_args()
    options = {} if args.patience is None else {"patience": args.patience}
    classes = {path: _load(path, f"policy_{i}") for i, path in enumerate(args.policy_source)}
    policies = {path: partial(cls, cost=CURVE, recalibrate=False) for path, cls in classes.items()}
    policies["this version"] = partial(CostAwarePolicy, cost=CURVE, recalibrate=False, **options)
    print(f"{'p accept':>8} {'fixed 4':>8} " + " ".join(f"{name:>16}" for name in policies))
    for p_accept in (0.3, 0.6, 0.75, 0.8, 0.85, 0.9):
        expected = sum(p_accept**k for k in range(DRAFTED + 1))
        fixed = expected / (DRAFTED * STEP_S + CURVE.verify_cost(DRAFTED + 1)) * PLAIN_S
        row = [f"{speed_vs_plain(make, p_accept):>15.2f}x" for make in policies.values()]
        print(f"{p_accept:>8} {fixed:>7.2f}x " + " ".join(row))


if __name__ == "__main__":
    main()
