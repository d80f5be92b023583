"""Seconds of one draft-model step (one new token per row) at batch 1 and batch 4 on this machine:
one row alone on its own cache, four rows dense (no mask), and four rows through the ragged cache
batched drafting uses (`RaggedTarget` with a mask), plus the bare matrix products behind them.

    python benchmarks/batch/draft_step_cost.py [--model qwen2.5-coder-0.5b]
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import DynamicCache

from draftsmith.core.cache import cache_argument
from draftsmith.core.ragged import RaggedTarget
from draftsmith.core.tree import chain_parents
from draftsmith.zoo import load_model

STEPS = 6


def _timed(step) -> list[float]:
    times = []
    for _ in range(STEPS):
        started = time.perf_counter()
        step()
        times.append(round(time.perf_counter() - started, 3))
    return times


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    args = parser.parse_args()
    model, _ = load_model(args.model, dtype="float32")
    model.eval()
    torch.manual_seed(0)
    prompts = [torch.randint(0, 1000, (n,)) for n in (180, 220, 250, 200)]

    ragged = RaggedTarget(model, (), len(prompts))
    ragged.extend(prompts, [chain_parents(p.numel()) for p in prompts], logits="last")
    ragged.keep([range(p.numel()) for p in prompts])

    def ragged_step() -> None:
        ragged.extend([torch.tensor([5])] * 4, [torch.tensor([-1])] * 4, logits="last")
        ragged.keep([range(1)] * 4)

    name = cache_argument(model)  # transformers' keyword for the KV cache
    alone, dense = DynamicCache(), DynamicCache()
    model(input_ids=prompts[0][None], use_cache=True, **{name: alone})
    model(input_ids=torch.randint(0, 1000, (4, 200)), use_cache=True, **{name: dense})
    one_row = torch.tensor([[5]])
    four_rows = torch.full((4, 1), 5)
    print("one row alone  ", _timed(lambda: model(input_ids=one_row, **{name: alone})))
    print("4 rows, dense  ", _timed(lambda: model(input_ids=four_rows, **{name: dense})))
    print("4 rows, ragged ", _timed(ragged_step))

    hidden = model.config.hidden_size
    weight = torch.randn(model.config.intermediate_size, hidden)
    for rows in (1, 2, 4, 8, 16):
        x = torch.randn(rows, hidden)
        x @ weight.T
        started = time.perf_counter()
        for _ in range(50):
            x @ weight.T
        ms = (time.perf_counter() - started) / 50 * 1e3
        print(f"({rows}, {hidden}) @ ({hidden}, {weight.shape[0]}): {ms:.2f} ms")


if __name__ == "__main__":
    main()
