"""A draft model's forward over 1..N new tokens after a cached prompt, on its bf16 weights and on
their 4-bit copies (`draftsmith.core.int4_rows`), alternating; and how often the two agree on the
next token, teacher-forced over a standard-library module.

    python benchmarks/int4/draft_step.py qwen2.5-coder-0.5b [--rows 1,2,4,8,12] [--json OUT]
"""

from __future__ import annotations

import argparse
import inspect
import json
import time
from json import decoder as json_decoder

import torch
from transformers import DynamicCache

from draftsmith.core import int4_rows
from draftsmith.core.cache import cache_argument
from draftsmith.core.small_rows import prepack, small_rows
from draftsmith.zoo import load_model

CONTEXT = 300
REPEATS = 12


@torch.inference_mode()
def step_ms(model, ids: torch.Tensor, rows: int, int4: bool) -> float:
    """Median ms of a forward over `rows` tokens after CONTEXT cached ones."""
    cache = DynamicCache()
    times = []
    with small_rows(model):
        model(ids[:, :CONTEXT], **{cache_argument(model): cache}, logits_to_keep=1)
        for _ in range(REPEATS):
            with int4_rows.int4_rows(model, int4):
                started = time.perf_counter()
                model(ids[:, CONTEXT : CONTEXT + rows], **{cache_argument(model): cache})
                times.append(time.perf_counter() - started)
            cache.crop(-rows)
    return sorted(times)[REPEATS // 2] * 1e3


@torch.inference_mode()
def next_tokens(model, ids: torch.Tensor, int4: bool, block: int = 8) -> torch.Tensor:
    """The model's argmax after each token from position 100 on, `block` tokens a forward."""
    cache, out = DynamicCache(), []
    with small_rows(model):
        model(ids[:, :100], **{cache_argument(model): cache})
        for start in range(100, ids.shape[1], block):
            with int4_rows.int4_rows(model, int4):
                chunk = ids[:, start : start + block]
                out.append(model(chunk, **{cache_argument(model): cache}).logits[0])
    return torch.cat(out).argmax(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--rows", default="1,2,4,8,12")
    parser.add_argument("--json")
    args = parser.parse_args()
    model, tokenizer = load_model(args.model, dtype="bfloat16")
    prepack(model)
    started = time.perf_counter()
    int4_rows.quantize(model)
    quantize_s = time.perf_counter() - started
    text = inspect.getsource(json_decoder)
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :700]
    report = {"model": args.model, "quantize_s": quantize_s, "rows": {}}
    for rows in map(int, args.rows.split(",")):
        runs = {"bf16": [], "int4": []}
        for _ in range(2):  # alternating, so a slow spell falls on both
            for name in runs:
                runs[name].append(step_ms(model, ids, rows, name == "int4"))
        report["rows"][rows] = {name: min(times) for name, times in runs.items()}
        print(rows, {name: round(ms, 1) for name, ms in report["rows"][rows].items()}, flush=True)
    bf16, int4 = next_tokens(model, ids, False), next_tokens(model, ids, True)
    text_next = ids[0, 101:]
    n = min(len(bf16), len(text_next))
    report["agreement_int4_bf16"] = (bf16 == int4).float().mean().item()
    report["next_token_accuracy"] = {
        "bf16": (bf16[:n] == text_next[:n]).float().mean().item(),
        "int4": (int4[:n] == text_next[:n]).float().mean().item(),
    }
    print({k: v for k, v in report.items() if k != "rows"})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
