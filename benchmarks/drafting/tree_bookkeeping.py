"""What growing a draft tree costs besides the drafter's forwards: `DynamicTree` over random
logits on an 8,192-token draft vocabulary (the 1,200-step head's) placed on SmolLM2's 49,152, a
4x6x12 tree and a 4x3 sibling chain, each the median of 300 grows after 30 warm-ups.

    python benchmarks/drafting/tree_bookkeeping.py [ARTIFACT_DIR]

With ARTIFACT_DIR the nodes are valued by its calibrated acceptance, recalibrated online as the
cost-aware policy does; without, by the raw draft probability.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from draftsmith.artifact import load_acceptance_model
from draftsmith.core.context import ContextIndex
from draftsmith.core.sampling import SamplingParams
from draftsmith.decoding import build_policy
from draftsmith.heads.base import DraftRequest, TreeShape, raw_acceptance
from draftsmith.heads.tree import DynamicTree, SiblingChain

TARGET_VOCAB, DRAFT_VOCAB = 49152, 8192


def main() -> None:
    acceptance = raw_acceptance
    if len(sys.argv) > 1:
        policy = build_policy("cost-aware", acceptance=load_acceptance_model(sys.argv[1]))
        acceptance = policy.acceptance_fn()
    generator = torch.Generator().manual_seed(0)
    support = torch.randperm(TARGET_VOCAB, generator=generator)[:DRAFT_VOCAB].sort().values
    logits = [torch.randn(4, DRAFT_VOCAB, generator=generator) * 4 for _ in range(8)]
    context = ContextIndex(torch.randint(0, TARGET_VOCAB, (400,), generator=generator).tolist())

    def request(shape: TreeShape) -> DraftRequest:
        return DraftRequest(shape, SamplingParams(), acceptance=acceptance, context=context)

    def tree() -> None:
        grown = DynamicTree.for_request(
            request(TreeShape(top_k=4, depth=6, total_tokens=12)), None, support, TARGET_VOCAB
        )
        grown.grow(logits[0][0], lambda nodes: logits[grown.depths[nodes[0]]][: len(nodes)])

    def sibling_chain() -> None:
        chain = SiblingChain(request(TreeShape(top_k=4, depth=3, total_tokens=12, expand=1)))
        step = 0
        while chain.add(logits[step][0]) is not None:
            step += 1
        chain.draft()

    for label, grow in (("tree 4x6x12", tree), ("sibling chain 4x3", sibling_chain)):
        for _ in range(30):
            grow()
        times = []
        for _ in range(300):
            started = time.perf_counter()
            grow()
            times.append(time.perf_counter() - started)
        print(f"{label}: {1e3 * statistics.median(times):.3f} ms")


if __name__ == "__main__":
    main()
