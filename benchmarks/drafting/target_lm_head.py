"""What a round's drafting costs for the head kinds whose logits come from the target's LM head
(Medusa, MTP, EAGLE-1), on SmolLM2-135M in bf16 over the full vocabulary, on its own bf16 weights
(int4=False) and on the 4-bit copy drafters take by default, side by side in one run: a 4x4
sibling chain (the default policy's shape) and a chain of 4, each the median of 50 drafts on
packed layers as the decoder runs them. The heads are untrained (perturbed from their
initialisation), which changes what is drafted, not what it costs.

    python benchmarks/drafting/target_lm_head.py
"""

from __future__ import annotations

import statistics
import time

import torch

from draftsmith.core.sampling import SamplingParams
from draftsmith.core.small_rows import prepack, small_rows
from draftsmith.heads.base import DraftRequest, TreeShape
from draftsmith.heads.eagle import FeatureDrafter
from draftsmith.heads.medusa import MedusaDrafter
from draftsmith.heads.mtp import MTPDrafter
from draftsmith.heads.trainable import build_head
from draftsmith.zoo import load_model

DRAFTERS = {"medusa": MedusaDrafter, "mtp": MTPDrafter, "eagle": FeatureDrafter}
SHAPES = (TreeShape(top_k=4, depth=4, total_tokens=16, expand=1), TreeShape.chain(4))


def main() -> None:
    target, _ = load_model("smollm2-135m", dtype="bfloat16")
    prepack(target)
    vocab, hidden = target.config.vocab_size, target.config.hidden_size
    prompt = torch.arange(20)
    for kind, drafter_class in DRAFTERS.items():
        head = build_head(kind, target, {"num_steps": 5}).to(torch.bfloat16)
        with torch.no_grad():
            for parameter in head.parameters():
                parameter.add_(0.02 * torch.randn_like(parameter))
        for int4 in (False, None):
            drafter = drafter_class(head, vocab, int4=int4)
            drafter.start(prompt, torch.randn(prompt.numel() - 1, hidden, dtype=torch.bfloat16))
            for shape in SHAPES:
                request = DraftRequest(shape, SamplingParams())
                with torch.inference_mode(), small_rows(target):
                    for _ in range(10):
                        drafter.draft(request)
                    times = []
                    for _ in range(50):
                        started = time.perf_counter()
                        drafter.draft(request)
                        times.append(time.perf_counter() - started)
                weights = "bf16" if int4 is False else "4-bit LM head"
                label = "siblings 4x4" if shape.expand == 1 else "chain of 4"
                print(
                    f"{kind:7s} {label:13s} {weights:14s} {1e3 * statistics.median(times):6.2f} ms"
                )


if __name__ == "__main__":
    main()
