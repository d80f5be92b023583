"""Plain `generate`, Hugging Face assisted generation with the draft model's bf16 weights and with
draftsmith's 4-bit copies of them, and draftsmith's default, greedy, per prompt in one process
(the methods' order rotating per prompt): how much of draftsmith's lead over assisted generation
is the 4-bit draft, which assisted generation could be given too.

    python benchmarks/int4/hf_assisted_int4.py --target qwen2.5-coder-1.5b \
        --draft qwen2.5-coder-0.5b [--limit 8] [--max-new-tokens 64] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import ExitStack

import torch

from draftsmith.build import AUTO_TREE, cost_curve
from draftsmith.build.drafters import build_drafter
from draftsmith.core import int4_rows
from draftsmith.core.small_rows import small_rows
from draftsmith.decoding import SpeculativeDecoder, build_policy
from draftsmith.evaluation.prompts import load_prompts
from draftsmith.zoo import load_model

METHODS = ("plain", "hf_bf16", "hf_int4", "draftsmith")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--prompts", default="draftsmith/evaluation/bench_prompts.jsonl")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--json")
    args = parser.parse_args()
    target, tokenizer = load_model(args.target, dtype="bfloat16")
    built = build_drafter(f"draft-model:{args.draft}", target, tokenizer, dtype="bfloat16")
    draft = built.hf_assist["assistant_model"]
    if not built.drafter.int4:
        parser.error("this torch or machine drafts on bf16 weights: nothing to compare")
    policy = build_policy(
        "cost-aware", cost=cost_curve(target, args.target, max_tokens=AUTO_TREE.max_tokens + 1)
    )
    decoder = SpeculativeDecoder(target, built.drafter, tokenizer, policy=policy)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    @torch.inference_mode()
    def generate(ids: torch.Tensor, assistant, int4: bool) -> list[int]:
        with ExitStack() as blocks:
            blocks.enter_context(small_rows(target))
            options = {}
            if assistant is not None:
                blocks.enter_context(small_rows(assistant))
                blocks.enter_context(int4_rows.int4_rows(assistant, int4))
                options["assistant_model"] = assistant
            out = target.generate(
                ids[None],
                attention_mask=torch.ones_like(ids[None]),
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
                **options,
            )
        return out[0, ids.numel() :].tolist()

    run = {
        "plain": lambda ids: generate(ids, None, False),
        "hf_bf16": lambda ids: generate(ids, draft, False),
        "hf_int4": lambda ids: generate(ids, draft, True),
        "draftsmith": lambda ids: decoder.generate(ids, max_new_tokens=args.max_new_tokens).tokens,
    }
    prompts = load_prompts(args.prompts, args.limit)
    encoded = [tokenizer(p["prompt"], return_tensors="pt").input_ids[0] for p in prompts]
    for method in METHODS:  # warm-up
        run[method](encoded[0][:32])
    seconds = dict.fromkeys(METHODS, 0.0)
    tokens = dict.fromkeys(METHODS, 0)
    per_prompt = []
    for index, ids in enumerate(encoded):
        shift = index % len(METHODS)
        row = {}
        for method in METHODS[shift:] + METHODS[:shift]:
            started = time.perf_counter()
            out = run[method](ids)
            row[method] = {"s": time.perf_counter() - started, "tokens": len(out)}
            seconds[method] += row[method]["s"]
            tokens[method] += len(out)
        per_prompt.append(row)
        print(index, {m: round(r["tokens"] / r["s"], 2) for m, r in row.items()}, flush=True)
    tok_s = {m: tokens[m] / seconds[m] for m in METHODS}
    ratios = {
        "draftsmith_vs_hf_bf16": tok_s["draftsmith"] / tok_s["hf_bf16"],
        "draftsmith_vs_hf_int4": tok_s["draftsmith"] / tok_s["hf_int4"],
        "hf_int4_vs_hf_bf16": tok_s["hf_int4"] / tok_s["hf_bf16"],
    }
    print({m: round(v, 2) for m, v in tok_s.items()}, {k: round(v, 2) for k, v in ratios.items()})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "tok_s": tok_s, **ratios, "per_prompt": per_prompt}, f)


if __name__ == "__main__":
    main()
