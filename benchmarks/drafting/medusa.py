"""What a Medusa drafter's round costs on SmolLM2-135M in bf16: five heads (four drafting) over
the full vocabulary through the target's LM head, on packed layers as the decoder runs them; a
4x4 sibling chain (the default policy's shape) and a chain of 4, each the median of 50 drafts.
The heads are untrained (one perturbed), which changes what is drafted, not what it costs.

    python benchmarks/drafting/medusa.py
"""

from __future__ import annotations

import statistics
import time

import torch

from draftsmith.core.models import load_model
from draftsmith.core.sampling import SamplingParams
from draftsmith.core.small_rows import prepack, small_rows
from draftsmith.heads.base import DraftRequest, TreeShape
from draftsmith.heads.trainable import build_head


def main() -> None:
    target, _ = load_model("smollm2-135m", dtype="bfloat16")
    prepack(target)
    head = build_head("medusa", target, {"num_steps": 5}).to(torch.bfloat16)
    torch.nn.init.normal_(head.heads[1].linear.weight, std=0.02)
    drafter = head.as_drafter(target)
    hidden = target.config.hidden_size
    drafter.start(torch.arange(20), torch.randn(19, hidden, dtype=torch.bfloat16))
    for shape in (TreeShape(top_k=4, depth=4, total_tokens=16, expand=1), TreeShape.chain(4)):
        request = DraftRequest(shape, SamplingParams())
        with torch.inference_mode(), small_rows(target):
            for _ in range(10):
                drafter.draft(request)
            times = []
            for _ in range(50):
                started = time.perf_counter()
                draft = drafter.draft(request)
                times.append(time.perf_counter() - started)
        print(f"{shape}: {1e3 * statistics.median(times):.2f} ms a draft, {len(draft)} nodes")


if __name__ == "__main__":
    main()
