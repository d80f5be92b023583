"""Where a batch's speculative rounds spend their time, beside plain batched `generate`.

Decodes the first `--limit` bundled prompts as one batch under a fixed chain length, times each
round's drafting and verification and every forward of the target and the draft model by its
widest block, counts each row's rounds (the batch runs until its slowest row is done), then
times plain batched `generate` (left-padded, on the same kernels) and its prefill alone:

    python benchmarks/batch/round_parts.py --draft-tokens 2 [--limit 4] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch

from draftsmith.build.drafters import build_drafter
from draftsmith.core.ragged import RaggedTarget, left_padded
from draftsmith.core.small_rows import small_rows
from draftsmith.decoding import SpeculativeDecoder, build_policy
from draftsmith.evaluation.prompts import bundled_prompts, load_prompts
from draftsmith.zoo import load_model

TIMES: dict[str, list[float]] = defaultdict(list)


def _timed(name: str, call):
    def timed(*args, **kwargs):
        started = time.perf_counter()
        out = call(*args, **kwargs)
        TIMES[name].append(time.perf_counter() - started)
        return out

    return timed


def _time_forwards(target) -> None:
    """Time every `RaggedTarget.extend`, named by model and widest block."""
    extend = RaggedTarget.extend

    def timed(self, tokens, parents, **kwargs):
        started = time.perf_counter()
        out = extend(self, tokens, parents, **kwargs)
        model = "target" if self.model is target else "draft"
        TIMES[f"{model} forward, {max(t.numel() for t in tokens)} wide"].append(
            time.perf_counter() - started
        )
        return out

    RaggedTarget.extend = timed


@torch.inference_mode()
def _plain(target, batch: list[torch.Tensor], max_new: int) -> tuple[float, float]:
    """Seconds of plain batched `generate` over the left-padded batch, and of its prefill."""
    ids, mask = left_padded(batch)
    with small_rows(target):
        target.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
        started = time.perf_counter()
        target(ids, attention_mask=mask)
        prefill_s = time.perf_counter() - started
        started = time.perf_counter()
        target.generate(
            ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False, pad_token_id=0
        )
    return time.perf_counter() - started, prefill_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--drafter", default="draft-model:qwen2.5-coder-0.5b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompts", default=None, help="jsonl (default: the bundled prompts)")
    parser.add_argument("--limit", type=int, default=4, help="prompts in the batch")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--draft-tokens", type=int, default=2)
    args = parser.parse_args()

    target, tokenizer = load_model(args.target, dtype=args.dtype)
    built = build_drafter(args.drafter, target, tokenizer, dtype=args.dtype)
    policy = build_policy("fixed", max_draft_tokens=args.draft_tokens)
    decoder = SpeculativeDecoder(target, built.drafter, tokenizer, policy=policy)
    prompts = load_prompts(args.prompts or bundled_prompts(), args.limit)
    batch = [tokenizer(p["prompt"], return_tensors="pt").input_ids[0] for p in prompts]

    decoder.generate_batch(batch, max_new_tokens=8)  # warm-up
    decoder._drafts = _timed("drafting, per round", decoder._drafts)
    decoder._verify = _timed("verification, per round", decoder._verify)
    _time_forwards(target)
    started = time.perf_counter()
    outs = decoder.generate_batch(batch, max_new_tokens=args.max_new_tokens)
    wall_s = time.perf_counter() - started
    tokens = sum(len(o.tokens) for o in outs)
    plain_s, prefill_s = _plain(target, batch, args.max_new_tokens)

    print(f"{len(batch)} rows, {args.draft_tokens} draft tokens, {args.max_new_tokens} new tokens")
    print(f"speculative: {wall_s:.2f} s, {tokens} tokens, {tokens / wall_s:.2f} tok/s")
    print(f"rounds per row: {[o.stats.target_forwards for o in outs]}")
    print(
        f"plain generate: {plain_s:.2f} s ({tokens / plain_s:.2f} tok/s for the same tokens), "
        f"prefill {prefill_s:.2f} s, a step {(plain_s - prefill_s) / args.max_new_tokens * 1e3:.1f} ms"
    )
    for name, values in sorted(TIMES.items()):
        print(
            f"  {name:<28} {len(values):4d} x median {statistics.median(values) * 1e3:7.1f} ms"
            f" = {sum(values):6.2f} s"
        )


if __name__ == "__main__":
    main()
