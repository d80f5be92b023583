"""Draft policies (and shapes) for one drafter, side by side in one run: every prompt is decoded
by plain `generate` (on draftsmith's linear layers, `draftsmith.core.small_rows`) and then by each
policy, back to back on the same loaded models, so machine noise hits them alike; speed is
reported as ratios to plain and to the first policy.

    python benchmarks/policies/compare_policies.py --target NAME --drafter SPEC --prompts FILE.jsonl \
        [--dtype float32] [--max-new-tokens 128] [--temperature 1 --top-p 0.9] \
        --policy fixed:max_draft_tokens=4 --policy cost-aware \
        --policy cost-aware:tree=auto --policy fixed:tree=8,6,48 --policy cost-aware:raw=1 \
        [--repeats 3] [--json OUT.json]

A policy is NAME[:KEY=VALUE:...] (`draftsmith.build.split_policy_spec`) with the policy's
options (`draftsmith.decoding.POLICIES`), tree=chain|auto|TOP_K,DEPTH,TOTAL[,EXPAND] (cost-aware's default: a sibling chain; tree=chain
or siblings=0, a bare one), raw=1 to rank drafts by raw confidence instead of the artifact's
calibration, online=shared to recalibrate online with one correction for every drafted token
(as `OnlineAcceptance` did before it corrected a round's first token apart from the later
ones), context=0 to recalibrate online without correcting tokens that repeat the context apart
(as before `context_match`; a calibration fitted on it still reads it), small_rows=0 to run the linear layers as stock torch does (not on prepacked weights,
`draftsmith.core.small_rows`; not with cost-aware, which plans on this draftsmith's curve), and artifact=DIR to draft with that artifact and its calibration instead of --drafter's
(the same drafter calibrated another way, or with a learned acceptance head), int4=0|1 to
draft on a draft model's or an EAGLE head's own weights or on 4-bit copies of them
(`draftsmith.core.int4_rows`). cost-aware gets the target's stored cost curve. With --repeats N
every prompt is decoded N times by every method, the methods' order rotating each time, and each
method's fastest run counts (other work on a shared machine only ever adds time). A greedy output that
differs from plain's is judged by `draftsmith.evaluation.divergence` (its first diverging position
re-scored in float32 against the run's error there, plain replayed among the shapes): "identical"
counts the prompts decoded token for token, "rounding" those whose divergence the run's
precision explains, and every divergence goes into the JSON. Each ratio to
plain comes with a 90% bootstrap interval over the workload's prompts
(`draftsmith.evaluation.stats.speedup_interval`, as `draftsmith bench` computes it): how far
another draw of prompts (and of the machine's noise on each) could move it. Prints a table per workload and,
with --json, writes every figure with the command line.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections import defaultdict
from dataclasses import replace

import torch

from draftsmith.build import AUTO_TREE, cost_curve, parse_options, split_policy_spec, tree_options
from draftsmith.build.drafters import build_drafter
from draftsmith.core import small_rows
from draftsmith.decoding import SpeculativeDecoder, build_policy
from draftsmith.decoding.online import OnlineAcceptance
from draftsmith.decoding.policies import DEFAULT_POLICY
from draftsmith.evaluation.divergence import DivergedBatch, DivergenceJudge, format_divergence
from draftsmith.evaluation.prompts import load_prompts
from draftsmith.evaluation.stats import rotated, speedup_interval
from draftsmith.heads import DraftModelDrafter
from draftsmith.heads.eagle import FeatureDrafter
from draftsmith.zoo import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_arguments(parser)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json")
    args = parser.parse_args()

    prompts = load_prompts(args.prompts, args.limit)
    target, tokenizer = load_model(args.target, dtype=args.dtype)
    built = build_drafter(args.drafter, target, tokenizer, dtype=args.dtype)
    decoders = {}
    weight_first = {}  # per policy: linear layers weight-first over a few rows (the default)
    for spec in args.policy:
        name, options = _parse_policy(spec, target, args.target)
        own = built
        if "artifact" in options:
            artifact = options.pop("artifact")
            own = build_drafter(f"artifact:{artifact}", target, tokenizer, dtype=args.dtype)
        if "int4" in options:
            int4 = bool(options.pop("int4"))
            if isinstance(own.drafter, DraftModelDrafter):
                own = replace(own, drafter=DraftModelDrafter(own.drafter.model, int4=int4))
            elif isinstance(own.drafter, FeatureDrafter):
                drafter = FeatureDrafter(own.drafter.head, own.drafter.vocab_size, int4=int4)
                own = replace(own, drafter=drafter)
            else:
                parser.error(f"--policy {spec}: int4= needs a draft model or an EAGLE head")
        acceptance = None if options.pop("raw", 0) else own.acceptance
        if options.pop("online", "split") == "shared":
            acceptance = OnlineAcceptance(acceptance, split_on=())
        elif not options.pop("context", 1):
            acceptance = OnlineAcceptance(acceptance, split_on=("position",))
        weight_first[spec] = bool(options.pop("small_rows", 1))
        if name == "cost-aware" and not weight_first[spec]:
            parser.error(f"--policy {spec}: small_rows=0 with cost-aware plans on the wrong curve")
        policy = build_policy(name, acceptance=acceptance, **options)
        decoders[spec] = SpeculativeDecoder(target, own.drafter, tokenizer, policy=policy)
    sampling = {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed}
    encoded = [tokenizer(p["prompt"], return_tensors="pt").input_ids[0] for p in prompts]
    for name, decoder in decoders.items():  # warm-up
        small_rows.ENABLED = weight_first[name]
        decoder.generate(encoded[0], max_new_tokens=8, **sampling)

    # totals[workload][method]: every workload, and "overall".
    totals = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    per_prompt = []  # seconds of each method on each prompt, to tell one slow prompt from many
    methods = ["plain", *decoders]
    judge = None
    if args.temperature == 0:
        replay = functools.partial(_replay_plain, target, tokenizer, args)
        judge = DivergenceJudge(target, replay, tokenizer.eos_token_id or 0)
    divergences = defaultdict(list)  # per policy
    for index, (record, ids) in enumerate(zip(prompts, encoded, strict=True)):
        groups = [totals[record["workload"]], totals["overall"]]
        seconds, outputs = {}, {}
        for repeat in range(args.repeats):
            for name in rotated(methods, repeat):
                torch.manual_seed(args.seed)
                started = time.perf_counter()
                outputs[name] = _decode(
                    name, decoders, weight_first, target, tokenizer, ids, args, sampling
                )
                wall = time.perf_counter() - started
                seconds[name] = min(wall, seconds.get(name, wall))
        plain = outputs["plain"]
        for group in groups:
            group["plain"]["wall_s"] += seconds["plain"]
            group["plain"]["tokens"] += len(plain)
        for name in decoders:
            out = outputs[name]
            for group in groups:
                row = group[name]
                row["wall_s"] += seconds[name]
                row["tokens"] += len(out.tokens)
                row["forwards"] += out.stats.target_forwards
                row["drafted"] += out.stats.drafted
                row["prompts"] += 1
                row["identical"] += out.tokens == plain
            if judge is not None and out.tokens != plain:
                divergence = judge(index, DivergedBatch([ids], [plain], 0), out.tokens)
                divergences[name].append(divergence)
                for group in groups:
                    group[name]["rounding"] += divergence["explained"]
        per_prompt.append(
            {
                "workload": record["workload"],
                "tokens": {
                    name: len(out if name == "plain" else out.tokens)
                    for name, out in outputs.items()
                },
                "seconds": seconds,
            }
        )

    report = {
        "command": " ".join(["python", *sys.argv]),
        "repeats": args.repeats,
        "greedy": args.temperature == 0,
        "torch_threads": torch.get_num_threads(),
        "workloads": {
            name: _summary(group, list(decoders), _prompts_of(per_prompt, name))
            for name, group in totals.items()
        },
        "prompts": per_prompt,
        "divergences": divergences,
    }
    for workload, summary in report["workloads"].items():
        print(f"\n{workload} (plain {summary['plain_tok_s']:.2f} tok/s)")
        print(
            f"{'policy':<34} {'tok/s':>7} {'vs plain':>8} {'90% interval':>12} {'vs first':>8} "
            f"{'tau':>5} {'tau/first':>9} {'nodes':>6} {'identical':>9} {'rounding':>8}"
        )
        for name, f in summary["policies"].items():
            low, high = f["speedup_vs_plain_interval"]
            print(
                f"{name:<34} {f['tok_s']:>7.2f} {f['speedup_vs_plain']:>7.2f}x "
                f"{f'[{low:.2f}, {high:.2f}]':>12} "
                f"{f['speedup_vs_first']:>7.2f}x {f['mean_accepted_length']:>5.2f} "
                f"{f['tau_vs_first']:>8.2f}x {f['mean_draft_size']:>6.1f} "
                f"{f['identical_prompts']:>5}/{f['prompts']} {f['rounding_prompts']:>8}"
            )
    for name, found in divergences.items():
        for divergence in found:
            print(f"{name}: {format_divergence(divergence)}")
    if args.json:
        with open(args.json, "w") as out:
            out.write(json.dumps(report, indent=2) + "\n")


def _decode(name, decoders, weight_first, target, tokenizer, ids, args, sampling):
    """One prompt decoded by `name`: plain `generate` on draftsmith's linear layers (its new
    token ids) or a policy's decoder with `sampling` (its result)."""
    if name != "plain":
        small_rows.ENABLED = weight_first[name]
        return decoders[name].generate(ids, max_new_tokens=args.max_new_tokens, **sampling)
    out = _generate_plain(target, tokenizer, ids, args, args.max_new_tokens)
    return out[0, ids.numel() :].tolist()


def _generate_plain(target, tokenizer, ids, args, max_new_tokens, **options):
    """Plain `generate` of ids (T,) on the decoders' linear layers."""
    small_rows.ENABLED = True
    with torch.inference_mode(), small_rows.small_rows(target):
        return target.generate(
            ids[None],
            attention_mask=torch.ones_like(ids[None]),
            do_sample=args.temperature > 0,
            temperature=args.temperature or None,
            top_p=args.top_p,
            top_k=None,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.eos_token_id,
            **options,
        )


def _replay_plain(target, tokenizer, args, batch: DivergedBatch, position: int) -> torch.Tensor:
    """Plain `generate`'s own next-token logits (1, V) at `position`: its run again, stopped
    after that step (the judge's `PlainReplay`)."""
    ids = batch.prompts[batch.row]
    out = _generate_plain(
        target, tokenizer, ids, args, position + 1, output_logits=True, return_dict_in_generate=True
    )
    return out.logits[position]


def _parse_policy(spec: str, target, target_name: str) -> tuple[str, dict]:
    """The policy name and options of NAME[:KEY=VALUE:...] (see the module docstring)."""
    name, tree, pairs = split_policy_spec(spec)
    options = {**(tree_options(tree, name) if tree else {}), **parse_options(pairs)}
    if name == DEFAULT_POLICY:
        options["cost"] = cost_curve(target, target_name, max_tokens=AUTO_TREE.max_tokens + 1)
    return name, options


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The target, drafter, prompts, decoding and --policy options of a side-by-side run."""
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", action="append", required=True, help="NAME[:KEY=VALUE:...]")
    parser.add_argument("--limit", type=int)


def _prompts_of(per_prompt: list[dict], workload: str) -> list[dict]:
    return [p for p in per_prompt if workload in ("overall", p["workload"])]


def _summary(group: dict, policies: list[str], prompts: list[dict]) -> dict:
    """Per policy: tokens/s, ratios to plain (with its `speedup_interval` over `prompts`) and to
    the first policy, mean accepted length, mean draft size, prompts identical to plain and
    prompts whose divergence from plain is rounding."""
    plain_rate = group["plain"]["tokens"] / group["plain"]["wall_s"]
    first = group[policies[0]]
    first_rate, first_tau = first["tokens"] / first["wall_s"], first["tokens"] / first["forwards"]
    figures = {}
    for name in policies:
        row = group[name]
        rate, tau = row["tokens"] / row["wall_s"], row["tokens"] / row["forwards"]
        figures[name] = {
            "tok_s": rate,
            "speedup_vs_plain": rate / plain_rate,
            "speedup_vs_plain_interval": speedup_interval(prompts, name),
            "speedup_vs_first": rate / first_rate,
            "mean_accepted_length": tau,
            "tau_vs_first": tau / first_tau,
            "mean_draft_size": row["drafted"] / row["forwards"],
            "prompts": int(row["prompts"]),
            "identical_prompts": int(row["identical"]),
            "rounding_prompts": int(row["rounding"]),
        }
    return {"plain_tok_s": plain_rate, "policies": figures}


if __name__ == "__main__":
    main()
