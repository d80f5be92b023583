"""transformers' `generate` driving a draftsmith drafter (`custom_generate=speculative_generate`)
against plain greedy `generate`, on the bundled prompts, interleaved after a warm-up:

    python benchmarks/hf_generate/speed.py --target smollm2-135m \
        --drafter artifact:runs/quickstart/drafter --max-new-tokens 128 --json OUT.json

Prints the overall speedup (total tokens over total seconds of each method), and whether every
output is identical to plain greedy `generate`, as `draftsmith bench` reports for its own loop.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from draftsmith import speculative_generate
from draftsmith.decoding.profile import device_name
from draftsmith.evaluation.prompts import bundled_prompts, load_prompts
from draftsmith.zoo import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    model, tokenizer = load_model(args.target, dtype=args.dtype)
    prompts = [record["prompt"] for record in load_prompts(bundled_prompts())]

    def plain(ids):
        return model.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False)

    def speculative(ids):
        return model.generate(
            ids,
            max_new_tokens=args.max_new_tokens,
            do_sample=False,
            custom_generate=speculative_generate,
            drafter=args.drafter,
        )

    methods = {"plain": plain, "speculative_generate": speculative}
    warm = tokenizer(prompts[0], return_tensors="pt").input_ids
    for run in methods.values():
        run(warm)
    seconds = dict.fromkeys(methods, 0.0)
    tokens = dict.fromkeys(methods, 0)
    identical = 0
    for i, prompt in enumerate(prompts):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        order = list(methods) if i % 2 == 0 else list(reversed(methods))  # alternate who goes first
        outputs = {}
        for name in order:
            start = time.perf_counter()
            with torch.no_grad():
                outputs[name] = methods[name](ids)
            seconds[name] += time.perf_counter() - start
            tokens[name] += outputs[name].shape[1] - ids.shape[1]
        identical += torch.equal(outputs["plain"], outputs["speculative_generate"])
    rates = {name: tokens[name] / seconds[name] for name in methods}
    report = {
        "target": args.target,
        "drafter": args.drafter,
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "tokens_per_s": rates,
        "speedup_vs_plain": rates["speculative_generate"] / rates["plain"],
        "identical_to_plain": f"{identical}/{len(prompts)}",
        "hardware": device_name(torch.device("cpu")),
        "dtype": str(model.dtype).removeprefix("torch."),
        "date": time.strftime("%Y-%m-%d"),
    }
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
