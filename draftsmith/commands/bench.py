"""``draftsmith bench``: plain `generate`, Hugging Face assisted generation and draftsmith (one
draft policy or several), side by side on the same loaded models."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

from draftsmith.build.flags import SAMPLING_RANGES, Range, at_least, between
from draftsmith.build.placement import TargetPlacement
from draftsmith.build.policies import AUTO_TREE, policy_from_spec, split_policy_spec
from draftsmith.core.models import Dtype
from draftsmith.decoding.policies import DEFAULT_POLICY, POLICIES
from draftsmith.evaluation.prompts import bundled_prompts


@dataclass(kw_only=True)
class BenchCommand(TargetPlacement):
    """Benchmark a drafter against plain and Hugging Face assisted generation: every prompt runs
    all three back to back after a warm-up; speed is reported as ratios, with the mean accepted
    length and every divergence from the target's plain greedy output. Several --policy compare
    draft policies in the same run, each a method of its own."""

    FLAG_RANGES: ClassVar[dict[str, Range]] = {
        **SAMPLING_RANGES,
        "limit": at_least(1),
        "draft_tokens": at_least(1),
        "verify_threshold": between(0, 1),
        "min_path_confidence": between(0, 1),
        "batch_size": at_least(1),
        "repeats": at_least(1),
    }

    target: str
    """Zoo name, local folder or hub id of the target model."""
    drafter: str
    """The drafter: draft-model:NAME_OR_PATH, ngram[:MAX_N], artifact:PATH, or route:SPEC+SPEC
    (a router picking one of several per request, e.g. route:artifact:PATH+ngram)."""
    prompts: Path = field(default_factory=bundled_prompts)
    """jsonl of {"prompt": str, "workload": str (optional)} records."""
    suite: str | None = None
    """Run a benchmark suite instead of --prompts: standard (72 prompts of six workloads: chat,
    code, summarisation, translation, math, qa; draftsmith.evaluation.suite) or a suite jsonl.
    The report adds the hardware, versions, commit, date and command."""
    repeats: int | None = None
    """Runs of every method on every prompt, in rotating order; the fastest counts (default 1;
    with --suite, 3)."""
    max_new_tokens: int | None = None
    """Tokens generated after each prompt (default 128; with --suite, the suite's 48)."""
    temperature: float = 0.0
    """Sampling temperature; 0 is greedy."""
    top_p: float | None = None
    """Sample from the smallest set of tokens holding this probability (with --temperature)."""
    top_k: int | None = None
    """Sample from the k most likely tokens (with --temperature)."""
    limit: int | None = None
    """Use the first N prompts; None: all."""
    dtype: Dtype = "auto"
    """Precision of the target and draft model (auto:
    bfloat16 on a GPU and on a CPU with bf16 matrix units, AMX or AVX512-BF16; float32
    elsewhere)."""
    policy: str | list[str] = DEFAULT_POLICY
    """How much to draft each round: cost-aware (maximise expected tokens per second under the
    target's measured verification cost, `draftsmith profile`, run here on first use, and fall
    back to plain decoding while speculation is slower), fixed, threshold (stop once the path's
    acceptance falls below --min-path-confidence), cm-asd, specdec++ or adaedl; a spec
    NAME[:KEY=VALUE:...] gives the policy's options and tree=. Several (e.g. --policy cost-aware
    fixed:max_draft_tokens=4 threshold) decode side by side in one run, each a method of its own
    in the rotation and a row of its own per workload in the table and under "policies" in the
    JSON."""
    policy_option: list[str] = field(default_factory=list)
    """KEY=VALUE options of the policy (its fields, e.g. rejection_threshold=0.6 for specdec++);
    with several --policy, give each its options in its spec instead."""
    lockstep: bool = False
    """Time each policy against plain decoding interleaved round by round within each request
    (the target's one-token loop advanced after every speculative round to the tokens
    speculation committed, each side timed apart), the policies rotating: a shared machine's
    slow spells fall on both alike. Hugging Face assisted generation is not run; batch size 1."""
    draft_tokens: int = 8
    """Most tokens drafted per round."""
    verify: str = "lossless"
    """lossless (the default: the target's own output), or a LOSSY mode that accepts more draft
    tokens than the target would emit: typical (Medusa-2's typical acceptance) or modulated
    (acceptance relaxed by the drafter's confidence). Lossy results say `lossy: true`."""
    verify_threshold: float | None = None
    """A lossy mode's knob (typical: epsilon in (0, 1]; modulated: strength in [0, 1))."""
    min_path_confidence: float | None = None
    """threshold: stop a draft once its cumulative acceptance probability (calibrated when the
    artifact has a calibration, else the raw top-1 probabilities) falls below this (default
    0.4). Setting it picks the threshold policy."""
    tree: str | None = None
    """The draft each round: chain (up to --draft-tokens tokens), TOP_K,DEPTH,TOTAL[,EXPAND] (an
    EAGLE-2 dynamic tree: each depth expands the TOP_K most valuable nodes, or EXPAND of them,
    TOP_K children each, TOTAL nodes kept; EXPAND 1 is a chain whose tokens come with TOP_K - 1
    siblings; the cost-aware policy cuts it to the size of best expected speed), or auto (the
    cost-aware policy on the tree AUTO_TREE). Default: the policy's own (cost-aware: a chain of
    up to --draft-tokens tokens with 3 siblings each; the others: a chain)."""
    plot: Path | None = None
    """Also decode the prompts at a range of tree sizes and plot accepted length and tokens/s
    against tree size to this PNG, marking where auto's budget lands."""
    seed: int = 0
    """Seeds sampling (each prompt and method starts from it; in a batch, row b from seed + b)."""
    batch_size: int = 1
    """Prompts decoded together: plain `generate` on the left-padded batch against speculative
    decoding of the batch (each row accepting its own tokens per round; the draft policy is the
    batch's). Hugging Face assisted generation runs at batch size 1 only, so above 1 it is not
    run and the report says so."""
    json: Path | None = None
    """Write the report here as JSON."""

    def __post_init__(self) -> None:
        # Bad flags fail before any model loads.
        super().__post_init__()
        if self.tensor_parallel and self.drafter.startswith("route:"):
            raise ValueError(
                "a route picks its drafter by the speed each process measures, so under "
                "--tensor-parallel the processes would draft differently: give one drafter"
            )
        if self.batch_size > 1 and self.plot:
            raise ValueError(
                "--plot sweeps tree sizes at batch size 1: drop --plot or --batch-size"
            )
        if self.batch_size > 1 and self.lockstep:
            raise ValueError(
                "--lockstep interleaves one request's rounds with plain decoding: drop "
                "--lockstep or --batch-size"
            )
        self.policy = check_policies(self.policies, self.min_path_confidence, self.tree)
        several = len(self.policies) > 1
        if several and self.policy_option:
            raise ValueError(
                "--policy-option sets one policy's options: with several --policy, give each "
                "its options in its spec, e.g. fixed:max_draft_tokens=4"
            )
        if several and self.plot:
            raise ValueError("--plot sweeps one policy's tree sizes: give one --policy")
        if self.suite:
            from draftsmith.evaluation.suite import suite_path

            suite_path(self.suite)  # an unknown suite fails before any model loads
        self.build_policies()  # checks the policies' options
        from draftsmith.decoding.lossy import build_verifier

        build_verifier(self.verify, self.verify_threshold)

    def run(self) -> dict:
        import torch

        from draftsmith.build.drafters import build_drafter, check_spec, drafter_kind
        from draftsmith.core.parallel import is_main_process, placement
        from draftsmith.decoding import SpeculativeDecoder
        from draftsmith.decoding.lossy import build_verifier
        from draftsmith.evaluation.benchmark import Benchmark
        from draftsmith.evaluation.prompts import load_prompts
        from draftsmith.evaluation.suite import (
            SUITE_MAX_NEW_TOKENS,
            SUITE_REPEATS,
            bench_prompts,
            load_suite,
            run_suite,
        )

        records = load_suite(self.suite)[: self.limit] if self.suite else None
        prompts = None if records else load_prompts(self.prompts, self.limit)
        by_suite = SUITE_MAX_NEW_TOKENS if self.suite else 128
        max_new_tokens = self.max_new_tokens or by_suite
        repeats = self.repeats or (SUITE_REPEATS if self.suite else 1)
        check_spec(self.drafter)  # a bad drafter fails before the target loads
        target, tokenizer = self.load_target(self.target, self.dtype)
        if records:
            prompts = bench_prompts(records, tokenizer)
        built = build_drafter(self.drafter, target, tokenizer, dtype=self.dtype)
        policies = self.build_policies(target, built.acceptance)
        verifier = build_verifier(self.verify, self.verify_threshold)
        decoders = {
            spec: SpeculativeDecoder(
                target, built.drafter, tokenizer, policy=policy, verifier=verifier
            )
            for spec, policy in policies.items()
        }
        bench = Benchmark(
            target,
            tokenizer,
            decoders if len(decoders) > 1 else next(iter(decoders.values())),
            built.hf_assist,
            max_new_tokens=max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            seed=self.seed,
            batch_size=self.batch_size,
            repeats=repeats,
            lockstep=self.lockstep,
        )
        command = " ".join(["draftsmith", *sys.argv[1:]])
        report = run_suite(bench, records, command) if records else bench.run(prompts)
        report["config"] = {
            **{k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()},
            "drafter_kind": drafter_kind(self.drafter),
            "placement": placement(target) or "one device",
            "torch_threads": torch.get_num_threads(),
            "max_new_tokens": max_new_tokens,
            "repeats": repeats,
            "command": command,
        }
        if self.plot:
            from draftsmith.evaluation.sweep import tree_size_sweep

            tree = bench.decoder.policy.tree or AUTO_TREE
            report["tree_sweep"] = tree_size_sweep(bench, prompts, tree)
        if is_main_process():  # under tensor parallel every process decoded alike: one reports
            self.write_report(report)
        return report

    def write_report(self, report: dict) -> None:
        """Print the report's table and divergences; write its plot and JSON where asked."""
        from draftsmith.evaluation.divergence import format_divergence
        from draftsmith.evaluation.report import format_table

        print(format_table(report))
        if "lockstep" in report:
            print(f"lockstep: {report['lockstep']}")
        if "hf_assisted" in report:
            print(f"Hugging Face assisted generation: {report['hf_assisted']}")
        for name, figures in report.get("policies", {"": report}).items():
            for d in figures["overall"]["divergences"]:
                print(f"{name}: {format_divergence(d)}" if name else format_divergence(d))
        if self.plot:
            from draftsmith.evaluation.sweep import plot_tree_sweep

            plot_tree_sweep(report["tree_sweep"], report["overall"], self.plot)
            print(f"wrote {self.plot}")
        if self.json:
            self.json.parent.mkdir(parents=True, exist_ok=True)
            self.json.write_text(json.dumps(report, indent=2) + "\n")
            print(f"wrote {self.json}")

    @property
    def policies(self) -> list[str]:
        """The --policy specs, one or several."""
        return [self.policy] if isinstance(self.policy, str) else list(self.policy)

    def build_policies(self, target=None, acceptance=None) -> dict:
        """Each --policy spec's policy with its options (and, for one policy, --policy-option),
        the drafter's acceptance model and, for cost-aware, the target's stored cost curve
        (without a target: none yet), by spec."""
        built = {}
        for spec in self.policies:
            name, tree, pairs = split_policy_spec(spec)
            fields = {}
            if name == "threshold" and self.min_path_confidence is not None:
                fields["min_path_confidence"] = self.min_path_confidence
            built[spec] = policy_from_spec(
                name,
                options=[*pairs, *self.policy_option],
                tree=tree or self.tree,
                draft_tokens=self.draft_tokens,
                acceptance=acceptance,
                target=target,
                target_name=self.target,
                rows=self.batch_size,
                **fields,
            )
        return built


def check_policies(
    specs: list[str], min_path_confidence: float | None, tree: str | None
) -> str | list[str]:
    """The --policy value once the specs are checked (a bad name or a repeated spec is an error
    naming the fix): --min-path-confidence makes the default policy alone threshold."""
    if len(set(specs)) < len(specs):
        twice = next(spec for spec in specs if specs.count(spec) > 1)
        raise ValueError(f"--policy {twice} is given twice: give each policy once")
    if min_path_confidence is not None:
        if len(specs) > 1:
            raise ValueError(
                "--min-path-confidence sets the one threshold policy: with several --policy, "
                "give threshold:min_path_confidence=X"
            )
        if specs[0] == DEFAULT_POLICY:
            specs = ["threshold"]
        elif split_policy_spec(specs[0])[0] != "threshold":
            raise ValueError(
                f"--min-path-confidence sets the threshold policy; drop it or --policy {specs[0]}"
            )
    for spec in specs:
        name, own_tree, _ = split_policy_spec(spec)
        if name not in POLICIES:
            raise ValueError(f"unknown --policy {name!r}: choose one of {sorted(POLICIES)}")
        if own_tree == "auto" and name != DEFAULT_POLICY:
            raise ValueError(
                f"tree auto is the {DEFAULT_POLICY} policy's: drop tree=auto from --policy {spec}"
            )
        if tree == "auto" and not own_tree and name != DEFAULT_POLICY:
            fix = "drop --policy" if len(specs) == 1 else "give tree=auto in its spec instead"
            raise ValueError(f"--tree auto is the {DEFAULT_POLICY} policy's; {fix}")
    return specs[0] if len(specs) == 1 else specs
