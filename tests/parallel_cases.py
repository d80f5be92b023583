"""The decoding cases a target over several devices must reproduce token for token: an EAGLE-3
head (reads the target's features) and a draft model (accepts often), each with a chain and a
tree, greedy. Shared by the single-device reference, the device-map run and each
tensor-parallel rank (tests/tp_decode_worker.py), which must all build the same drafters."""

from __future__ import annotations

import torch
from conftest import perturbed_copy
from transformers import PreTrainedModel

from draftsmith import FixedPolicy, SpeculativeDecoder
from draftsmith.heads import DraftModelDrafter, TreeShape, build_head

PROMPTS = ([4, 8, 15, 16, 23], [9, 9, 7])
NEW_TOKENS = 12
POLICIES = {
    "chain": lambda: FixedPolicy(max_draft_tokens=4),
    "tree": lambda: FixedPolicy(tree=TreeShape(top_k=3, depth=3, total_tokens=8)),
}


def decode_cases(target: PreTrainedModel, reference: PreTrainedModel | None = None) -> dict:
    """{case: {"tokens": [...per prompt], "accepted": n}} for every drafter x policy.
    reference: an unsharded copy of the target to perturb into the draft model (default:
    the target itself); the drafters never hold sharded weights."""
    draft_model = perturbed_copy(reference or target, scale=0.1)
    drafters = {
        "eagle3": lambda: build_head("eagle3", target, {"num_steps": 2}).as_drafter(target),
        "draft-model": lambda: DraftModelDrafter(draft_model),
    }
    results = {}
    for drafter_name, drafter in drafters.items():
        for policy_name, policy in POLICIES.items():
            decoder = SpeculativeDecoder(target, drafter(), policy=policy())
            outputs = [
                decoder.generate(torch.tensor(p), max_new_tokens=NEW_TOKENS) for p in PROMPTS
            ]
            results[f"{drafter_name}/{policy_name}"] = {
                "tokens": [o.tokens for o in outputs],
                "accepted": sum(o.stats.accepted for o in outputs),
            }
    return results
