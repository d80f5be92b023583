"""Speculative decoding against plain decoding in lockstep: one process, one thread, the two
interleaved round by round, so a slow spell of a shared machine falls on both alike.

On a host whose speed drifts by 20-40% over seconds, timing whole generations one after the
other (`compare_policies.py`) leaves a ratio a few percent wide even with repeats. Here, after
every speculative round, plain decoding is advanced until it has as many tokens as speculation
has committed; each side's seconds are its own (plain's steps are taken out of speculation's
wall time, and a round's own timings, which a policy learns from, never hold them).

Plain decoding is the target's forward over its newest token on its own cache, then the argmax
or a sample (`draftsmith.core.sampling`), on the linear layers the decoder runs
(`draftsmith.core.small_rows`): the loop Hugging Face's `generate` runs, without its per-step
bookkeeping, so a ratio here is at most the one against `generate`. Every method sees the same
prompts; at temperature > 0 each side samples its own tokens, and speeds are tokens over
seconds.

    python benchmarks/policies/lockstep.py --target NAME --drafter SPEC --prompts FILE.jsonl \
        [--dtype float32] [--max-new-tokens 128] [--temperature 1] [--seed 0] \
        --policy cost-aware --policy fixed:max_draft_tokens=0 [--json OUT.json]

--policy as in compare_policies.py. Prints a table per workload: each policy's speed over plain
with a 90% bootstrap interval over the prompts, its mean accepted length and draft size, and
(greedy) the prompts decoded identically and those whose divergence is rounding, judged by
`draftsmith.evaluation.divergence` with this plain loop replayed among the shapes.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from draftsmith.build.drafters import build_drafter
from draftsmith.core import small_rows
from draftsmith.core.cache import cache_argument
from draftsmith.core.sampling import SamplingParams, probabilities, sample
from draftsmith.decoding import SpeculativeDecoder, build_policy
from draftsmith.decoding.decoder import eos_token_ids
from draftsmith.evaluation.divergence import DivergedBatch, DivergenceJudge, format_divergence
from draftsmith.evaluation.prompts import load_prompts
from draftsmith.zoo import load_model


def _compare_policies():
    """compare_policies.py's policy parsing and bootstrap interval (a sibling script)."""
    path = Path(__file__).resolve().parent / "compare_policies.py"
    spec = importlib.util.spec_from_file_location("compare_policies", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class PlainSteps:
    """Plain decoding of one prompt, a token per `step`, timed."""

    def __init__(self, model, ids: torch.Tensor, sampling: SamplingParams, seed: int) -> None:
        self.model, self.sampling = model, sampling
        self.generator = torch.Generator().manual_seed(seed)
        self.cache = DynamicCache()
        self._cache_argument = cache_argument(model)
        self.tokens: list[int] = []
        self.ended = False
        self._eos = eos_token_ids(model)
        started = time.perf_counter()
        self.next_logits = self._forward(ids[None])  # the prefill
        """The next token's logits (V,) float32, from the last forward."""
        self.seconds = time.perf_counter() - started

    def step(self) -> None:
        if self.ended:
            return
        started = time.perf_counter()
        logits = self.next_logits
        if self.sampling.greedy:
            token = int(logits.argmax())
        else:
            token = sample(probabilities(logits, self.sampling), self.generator)
        self.tokens.append(token)
        self.ended = token in self._eos
        if not self.ended:
            self.next_logits = self._forward(torch.tensor([[token]]))
        self.seconds += time.perf_counter() - started

    @torch.inference_mode()
    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (1, n) after the cached positions -> the next token's logits (V,) float32."""
        with small_rows.small_rows(self.model, ids.numel()):
            out = self.model(
                input_ids=ids,
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_argument: self.cache},
            )
        return out.logits[0, -1].float()


def _replay_plain(target, batch: DivergedBatch, position: int) -> torch.Tensor:
    """The plain loop's own next-token logits (1, V) at `position` (greedy): its run again,
    stopped there (the judge's `PlainReplay`)."""
    plain = PlainSteps(target, batch.prompts[batch.row], SamplingParams(), seed=0)
    for _ in range(position):
        plain.step()
    return plain.next_logits[None]


def lockstep(decoder, target, ids, max_new: int, sampling: SamplingParams, seed: int) -> dict:
    """One prompt decoded by `decoder` and plainly, interleaved after every round."""
    plain = PlainSteps(target, ids, sampling, seed)
    policy = decoder.policy
    observe_round = policy.observe_round
    committed = 0

    def observe_then_catch_up(outcomes) -> None:
        nonlocal committed
        observe_round(outcomes)
        committed += outcomes[0].committed
        while len(plain.tokens) < min(committed, max_new) and not plain.ended:
            plain.step()

    policy.observe_round = observe_then_catch_up
    try:
        started, before = time.perf_counter(), plain.seconds
        out = decoder.generate(
            ids,
            max_new_tokens=max_new,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=seed,
        )
        spec_s = time.perf_counter() - started - (plain.seconds - before)
    finally:
        del policy.observe_round  # the class's method again
    while len(plain.tokens) < max_new and not plain.ended:
        plain.step()
    return {"tokens": out.tokens, "seconds": spec_s, "stats": out.stats, "plain": plain}


def main() -> None:
    helpers = _compare_policies()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    helpers.add_run_arguments(parser)
    parser.add_argument("--json")
    args = parser.parse_args()

    target, tokenizer = load_model(args.target, dtype=args.dtype)
    small_rows.prepack(target)
    built = build_drafter(args.drafter, target, tokenizer, dtype=args.dtype)
    prompts = load_prompts(args.prompts)[: args.limit]
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p)
    decoders = {}
    for spec in args.policy:
        name, options = helpers._parse_policy(spec, target, args.target)
        acceptance = None if options.pop("raw", 0) else built.acceptance
        policy = build_policy(name, acceptance=acceptance, **options)
        decoders[spec] = SpeculativeDecoder(target, built.drafter, tokenizer, policy=policy)
    encoded = [tokenizer(p["prompt"], return_tensors="pt").input_ids[0] for p in prompts]
    for decoder in decoders.values():  # warm-up
        lockstep(decoder, target, encoded[0], 8, sampling, args.seed)

    judge = None
    if sampling.greedy:
        replay = functools.partial(_replay_plain, target)
        judge = DivergenceJudge(target, replay, tokenizer.eos_token_id or 0)
    per_prompt, stats = [], {name: [] for name in decoders}
    for index, (record, ids) in enumerate(zip(prompts, encoded, strict=True)):
        for name, decoder in decoders.items():
            run = lockstep(decoder, target, ids, args.max_new_tokens, sampling, args.seed)
            plain = run["plain"]
            per_prompt.append(
                {
                    "workload": record["workload"],
                    "policy": name,
                    "tokens": {"plain": len(plain.tokens), name: len(run["tokens"])},
                    "seconds": {"plain": plain.seconds, name: run["seconds"]},
                    "identical": plain.tokens == run["tokens"],
                }
            )
            if judge is not None and plain.tokens != run["tokens"]:
                diverged = DivergedBatch([ids], [plain.tokens], 0)
                per_prompt[-1]["divergence"] = judge(index, diverged, run["tokens"])
                print(f"{name}: {format_divergence(per_prompt[-1]['divergence'])}")
            stats[name].append((record["workload"], run["stats"]))

    report = {"command": " ".join(["python", *sys.argv]), "workloads": {}, "prompts": []}
    workloads = ["overall", *dict.fromkeys(p["workload"] for p in prompts)]
    for workload in workloads:
        rows = {}
        for name in decoders:
            runs = [
                p
                for p in per_prompt
                if p["policy"] == name and workload in ("overall", p["workload"])
            ]
            tokens = {k: sum(p["tokens"][k] for p in runs) for k in ("plain", name)}
            seconds = {k: sum(p["seconds"][k] for p in runs) for k in ("plain", name)}
            forwards = sum(s.target_forwards for w, s in stats[name] if workload in ("overall", w))
            drafted = sum(s.drafted for w, s in stats[name] if workload in ("overall", w))
            rows[name] = {
                "plain_tok_s": tokens["plain"] / seconds["plain"],
                "tok_s": tokens[name] / seconds[name],
                "speedup_vs_plain": (tokens[name] / seconds[name])
                / (tokens["plain"] / seconds["plain"]),
                "speedup_vs_plain_interval": helpers.speedup_interval(runs, name),
                "mean_accepted_length": tokens[name] / forwards,
                "mean_draft_size": drafted / forwards,
                "prompts": len(runs),
                "identical_prompts": sum(p["identical"] for p in runs),
                "rounding_prompts": sum(p.get("divergence", {}).get("explained", 0) for p in runs),
            }
        report["workloads"][workload] = rows
        print(f"\n{workload}")
        print(
            f"{'policy':<34} {'tok/s':>7} {'plain':>7} {'vs plain':>8} {'90% interval':>12} "
            f"{'tau':>5} {'nodes':>6} {'identical':>9} {'rounding':>8}"
        )
        for name, f in rows.items():
            low, high = f["speedup_vs_plain_interval"]
            print(
                f"{name:<34} {f['tok_s']:>7.2f} {f['plain_tok_s']:>7.2f} "
                f"{f['speedup_vs_plain']:>7.2f}x {f'[{low:.2f}, {high:.2f}]':>12} "
                f"{f['mean_accepted_length']:>5.2f} {f['mean_draft_size']:>6.1f} "
                f"{f['identical_prompts']:>5}/{f['prompts']} {f['rounding_prompts']:>8}"
            )
    report["prompts"] = per_prompt
    if args.json:
        with open(args.json, "w") as out:
            out.write(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
