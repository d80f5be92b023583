"""What a benchmark run reports: each prompt's runs and figures (`PromptResult`), a group's
totals with their intervals (`Aggregate`), one method's per workload and overall
(`method_summaries`), and the printed table (`format_table`: one row per workload, or per
workload and policy where several policies ran side by side)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from draftsmith.decoding.results import GenerationStats
from draftsmith.evaluation.stats import speedup_interval


@dataclass
class PromptRun:
    """One method's output for one prompt."""

    tokens: list[int]
    wall_s: float


@dataclass
class PromptResult:
    index: int
    workload: str
    plain: PromptRun
    hf: PromptRun | None
    """None when the drafter has no Hugging Face counterpart."""
    draftsmith: PromptRun
    stats: GenerationStats
    lossy: bool = False
    """A lossy verifier made draftsmith's output."""
    divergence: dict | None = None

    def timings(self) -> dict:
        """{"tokens": {method: n}, "seconds": {method: s}} of the methods that ran."""
        runs = {"plain": self.plain, "hf": self.hf, "draftsmith": self.draftsmith}
        runs = {name: run for name, run in runs.items() if run is not None}
        return {
            "tokens": {name: len(run.tokens) for name, run in runs.items()},
            "seconds": {name: run.wall_s for name, run in runs.items()},
        }

    def record(self) -> dict:
        """The prompt's own figures, for the report's per-prompt list."""
        forwards = max(self.stats.target_forwards, 1)
        return {
            "index": self.index,
            "workload": self.workload,
            **self.timings(),
            "mean_accepted_length": self.stats.new_tokens / forwards,
            "identical_to_plain": self.draftsmith.tokens == self.plain.tokens,
        }


@dataclass
class Aggregate:
    """Totals for a group of prompts, turned into the report's keys by `summary`."""

    results: list[PromptResult] = field(default_factory=list)

    def summary(self, greedy: bool) -> dict:
        def tok_s(method: str) -> float | None:
            runs = [getattr(r, method) for r in self.results]
            if any(run is None for run in runs):
                return None
            return sum(len(run.tokens) for run in runs) / sum(run.wall_s for run in runs)

        drafted, accepted = _position_counts([r.stats for r in self.results])
        forwards = sum(r.stats.target_forwards for r in self.results)
        new_tokens = sum(r.stats.new_tokens for r in self.results)
        divergences = [r.divergence for r in self.results if r.divergence is not None]
        lossy = any(r.lossy for r in self.results)
        plain, hf, ours = tok_s("plain"), tok_s("hf"), tok_s("draftsmith")
        timings = [r.timings() for r in self.results]
        return {
            "n_prompts": len(self.results),
            "plain_tok_s": plain,
            "hf_tok_s": hf,
            "draftsmith_tok_s": ours,
            "speedup_vs_plain": ours / plain,
            "speedup_vs_hf": None if hf is None else ours / hf,
            "hf_speedup_vs_plain": None if hf is None else hf / plain,
            "speedup_vs_plain_interval": speedup_interval(timings, "draftsmith"),
            "speedup_vs_hf_interval": (
                None if hf is None else speedup_interval(timings, "draftsmith", "hf")
            ),
            "hf_speedup_vs_plain_interval": None if hf is None else speedup_interval(timings, "hf"),
            "mean_accepted_length": new_tokens / max(forwards, 1),
            "mean_draft_size": sum(r.stats.drafted for r in self.results) / max(forwards, 1),
            "acceptance_by_position": [a / d for a, d in zip(accepted, drafted, strict=True)],
            "lossy": lossy,
            "identical_to_plain": (not divergences) if greedy and not lossy else None,
            "exact_match_rate": (
                sum(r.draftsmith.tokens == r.plain.tokens for r in self.results) / len(self.results)
                if greedy
                else None
            ),
            "hf_identical_to_plain": (
                all(r.hf.tokens == r.plain.tokens for r in self.results)
                if greedy and hf is not None
                else None
            ),
            "divergences": divergences,
            "unexplained_divergences": [d for d in divergences if not d["explained"]],
        }


def method_summaries(results: list[PromptResult], greedy: bool) -> dict:
    """{"overall": summary, "workloads": {workload: summary}} of one method's results, each
    summary `Aggregate.summary`'s."""
    groups: dict[str, Aggregate] = defaultdict(Aggregate)
    for result in results:
        groups[result.workload].results.append(result)
    return {
        "overall": Aggregate(list(results)).summary(greedy),
        "workloads": {name: group.summary(greedy) for name, group in groups.items()},
    }


def _position_counts(stats: list[GenerationStats]) -> tuple[list[int], list[int]]:
    width = max((len(s.drafted_by_position) for s in stats), default=0)
    drafted, accepted = [0] * width, [0] * width
    for s in stats:
        for i, (d, a) in enumerate(zip(s.drafted_by_position, s.accepted_by_position, strict=True)):
            drafted[i] += d
            accepted[i] += a
    return drafted, accepted


def format_table(report: dict) -> str:
    """A readable table of the report, one row per workload and one overall (per workload and
    policy, with the speedups' 90% intervals, where several policies ran side by side)."""
    if "policies" in report:
        return _policies_table(report)
    header = (
        f"{'workload':<10} {'n':>3} {'plain tok/s':>11} {'HF tok/s':>9} {'ours tok/s':>10} "
        f"{'vs plain':>8} {'vs HF':>6} {'HF/plain':>8} {'tau':>5} {'identical':>9}"
    )
    rows = [header, "-" * len(header)]
    if report.get("lossy"):
        rows.insert(0, LOSSY)
    named = [*report["workloads"].items(), ("overall", report["overall"])]
    for name, s in named:
        rows.append(
            f"{name:<10} {s['n_prompts']:>3} {s['plain_tok_s']:>11.2f} "
            f"{_number(s['hf_tok_s'], 9, '.2f')} "
            f"{s['draftsmith_tok_s']:>10.2f} {s['speedup_vs_plain']:>7.2f}x "
            f"{_number(s['speedup_vs_hf'], 6, '.2f', 'x')} "
            f"{_number(s['hf_speedup_vs_plain'], 8, '.2f', 'x')} "
            f"{s['mean_accepted_length']:>5.2f} {_identity(s):>9}"
        )
    return "\n".join(rows)


LOSSY = "LOSSY verification: outputs may differ from the target's own"


def _policies_table(report: dict) -> str:
    """Rows per workload and policy (``ours tok/s`` is the policy's)."""
    policies = report["policies"]
    width = max(len("policy"), *(len(name) for name in policies))
    header = (
        f"{'workload':<10} {'policy':<{width}} {'n':>3} {'plain tok/s':>11} {'HF tok/s':>9} "
        f"{'ours tok/s':>10} {'vs plain [90%]':>20} {'vs HF [90%]':>20} {'tau':>5} "
        f"{'identical':>9}"
    )
    rows = [header, "-" * len(header)]
    if report.get("lossy"):
        rows.insert(0, LOSSY)
    first = next(iter(policies.values()))
    for workload in [*first["workloads"], "overall"]:
        for name, figures in policies.items():
            s = figures["overall"] if workload == "overall" else figures["workloads"][workload]
            rows.append(
                f"{workload:<10} {name:<{width}} {s['n_prompts']:>3} {s['plain_tok_s']:>11.2f} "
                f"{_number(s['hf_tok_s'], 9, '.2f')} {s['draftsmith_tok_s']:>10.2f} "
                f"{ratio(s['speedup_vs_plain'], s['speedup_vs_plain_interval']):>20} "
                f"{ratio(s['speedup_vs_hf'], s['speedup_vs_hf_interval']):>20} "
                f"{s['mean_accepted_length']:>5.2f} {_identity(s):>9}"
            )
    return "\n".join(rows)


def _identity(s: dict) -> str:
    """The table's identity cell: True / False, rounding (every divergence explained), None
    (sampling) or the lossy exact-match rate."""
    if s["lossy"]:
        match = s["exact_match_rate"]
        return "lossy" if match is None else f"lossy {match:.0%}"
    identical = s["identical_to_plain"]
    if identical is False and not s["unexplained_divergences"]:
        return "rounding"
    return str(identical)


def ratio(value: float | None, interval: list[float] | tuple[float, float] | None) -> str:
    """``1.23x [1.10, 1.37]``, or ``-`` when the method did not run."""
    if value is None:
        return "-"
    if not interval:
        return f"{value:.2f}x"
    return f"{value:.2f}x [{interval[0]:.2f}, {interval[1]:.2f}]"


def _number(value: float | None, width: int, spec: str, unit: str = "") -> str:
    """value formatted right-aligned in width characters, or "-" when there is none."""
    text = "-" if value is None else f"{value:{spec}}{unit}"
    return f"{text:>{width}}"
