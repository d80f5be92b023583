"""The results page, ``benchmarks/RESULTS.md``, generated from the standard suite's JSON reports.

    python -m draftsmith.evaluation.results benchmarks/results            # rewrites the page
    python -m draftsmith.evaluation.results benchmarks/results --check    # exit 1 if it differs

Every ``*.json`` in the folder written by ``draftsmith bench --suite ... --json`` (a report with an
``environment``) becomes rows: a headline table (the newest run of each target, drafter and
hardware class with the suite's default flags, `DEFAULT_FLAGS`), one table per hardware class
(every run), and one per-workload table per run. Every speedup carries its 90% bootstrap interval
over prompts, every row its date, draftsmith version and the command that reproduces it. The
page is never edited by hand (it says so at its top); a test regenerates it and compares.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from draftsmith.decoding.policies import DEFAULT_POLICY
from draftsmith.evaluation.report import ratio
from draftsmith.evaluation.suite import SUITE_MAX_NEW_TOKENS, SUITE_REPEATS

GENERATOR = "python -m draftsmith.evaluation.results"
DEFAULT_FLAGS = {
    "temperature": 0.0,
    "top_p": None,
    "top_k": None,
    "policy": DEFAULT_POLICY,
    "policy_option": [],
    "tree": None,
    "draft_tokens": 8,
    "min_path_confidence": None,
    "verify": "lossless",
    "batch_size": 1,
    "limit": None,
    "max_new_tokens": SUITE_MAX_NEW_TOKENS,
    "repeats": SUITE_REPEATS,
    "lockstep": False,
}
"""The flags a headline row must have run with (missing keys are not checked); the dtype is
free, as auto picks the hardware's fast precision."""


def load_reports(folder: Path) -> list[tuple[str, dict]]:
    """(file name, report) of every suite report in the folder, by date then name."""
    reports = []
    for path in sorted(folder.glob("*.json")):
        report = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(report, dict) and "environment" in report and "policies" in report:
            raise ValueError(
                f"{path} compares several policies; a row of the results page is one "
                "drafter's run: move it out of the folder, or rerun with one --policy"
            )
        if isinstance(report, dict) and "environment" in report and "overall" in report:
            reports.append((path.name, report))
    return sorted(reports, key=lambda item: (item[1]["environment"]["date"], item[0]))


def is_default(report: dict) -> bool:
    config = report.get("config", {})
    return all(config.get(key, value) == value for key, value in DEFAULT_FLAGS.items())


def identity(summary: dict) -> str:
    """Prompts decoded token for token like plain greedy, and the divergences' verdict."""
    if summary.get("lossy"):
        return f"lossy ({summary['exact_match_rate']:.0%} exact)"
    if summary.get("identical_to_plain") is None:
        return "- (sampling)"
    divergences = len(summary["divergences"])
    identical = summary["n_prompts"] - divergences
    text = f"{identical}/{summary['n_prompts']}"
    unexplained = len(summary["unexplained_divergences"])
    if divergences:
        text += f" ({divergences - unexplained} rounding, {unexplained} unexplained)"
    return text


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)]


def _drafter_cell(config: dict) -> str:
    """The drafter's spec, and its kind where the spec does not say it (an artifact's head)."""
    spec, kind = config.get("drafter", "?"), config.get("drafter_kind")
    return f"`{spec}`" if not kind or spec.startswith(kind) else f"`{spec}` ({kind})"


def _overall_cells(name: str, report: dict) -> list[str]:
    env, config, s = report["environment"], report.get("config", {}), report["overall"]
    return [
        config.get("target", "?"),
        _drafter_cell(config),
        ratio(s["speedup_vs_plain"], s.get("speedup_vs_plain_interval")),
        ratio(s["speedup_vs_hf"], s.get("speedup_vs_hf_interval")),
        ratio(s["hf_speedup_vs_plain"], s.get("hf_speedup_vs_plain_interval")),
        f"{s['mean_accepted_length']:.2f}",
        identity(s),
        f"{s['plain_tok_s']:.1f}",
        env["dtype"],
        env["date"],
        _version(env),
        f"[json](results/{name})",
        f"`{env['command']}`",
    ]


OVERALL_HEADER = [
    "target", "drafter", "vs plain [90%]", "vs HF assisted [90%]", "HF assisted vs plain [90%]",
    "tau", "identical to plain", "plain tok/s", "dtype", "date", "version", "report", "command",
]  # fmt: skip


def render_page(folder: Path, source: str = "benchmarks/results") -> str:
    """The results page for the reports in `folder` (named `source` on the page)."""
    reports = load_reports(folder)
    lines = [
        f"<!-- Generated by `{GENERATOR} {source}` from the JSON reports in {source}/. "
        f"Do not edit by hand: rerun that command. -->",
        "",
        "# draftsmith results",
        "",
        "Each row is one run of the standard suite (`draftsmith bench --suite standard`: 72 "
        "prompts, 12 each of chat, code, summarisation, translation, math and question "
        "answering over a passage, none of them from text the recipes train or calibrate on; "
        "`draftsmith/evaluation/suite.py`). Every prompt is decoded by plain `generate`, Hugging "
        "Face assisted generation (where the drafter has a counterpart) and draftsmith, "
        "interleaved, after a warm-up, several times with the order rotating; the fastest run "
        "of each counts. A speedup is draftsmith's tokens per second over the other method's, "
        "with its 90% bootstrap interval over prompts in brackets; tau is the mean number of "
        "tokens each target forward yields; *identical* counts the prompts whose greedy output "
        "equals plain `generate`'s (a divergence is *rounding* when the run's precision "
        "explains it). `-`: the method did not run.",
        "",
        "## Headline: default flags",
        "",
    ]
    newest: dict[tuple, tuple[str, dict]] = {}
    for name, report in reports:
        if is_default(report):
            config = report.get("config", {})
            key = (config.get("target"), config.get("drafter"), _hardware(report))
            newest[key] = (name, report)
    if newest:
        rows = [
            [_hardware(report), *_overall_cells(name, report)]
            for name, report in sorted(newest.values(), key=lambda item: _sort_key(item[1]))
        ]
        lines += _table(["hardware class", *OVERALL_HEADER], rows)
    else:
        lines.append("No run with default flags yet.")
    for hardware in sorted({_hardware(report) for _, report in reports}):
        runs = [(n, r) for n, r in reports if _hardware(r) == hardware]
        devices = sorted({r["environment"]["hardware"] for _, r in runs})
        lines += ["", f"## {hardware}", "", f"Hardware: {'; '.join(devices)}.", ""]
        lines += _table(OVERALL_HEADER, [_overall_cells(n, r) for n, r in runs])
    if reports:
        lines += ["", "## Per workload", ""]
    for name, report in reports:
        config = report.get("config", {})
        lines += [
            f"### {config.get('target', '?')}, {_drafter_cell(config)}, "
            f"{_hardware(report)}, {report['environment']['date']} ([json](results/{name}))",
            "",
        ]
        rows = [
            [
                workload,
                str(s["n_prompts"]),
                ratio(s["speedup_vs_plain"], s.get("speedup_vs_plain_interval")),
                ratio(s["speedup_vs_hf"], s.get("speedup_vs_hf_interval")),
                f"{s['mean_accepted_length']:.2f}",
                " ".join(f"{a:.2f}" for a in s["acceptance_by_position"]) or "-",
                identity(s),
            ]
            for workload, s in [*report["workloads"].items(), ("overall", report["overall"])]
        ]
        header = [
            "workload", "prompts", "vs plain [90%]", "vs HF assisted [90%]", "tau",
            "acceptance by draft position", "identical to plain",
        ]  # fmt: skip
        lines += [*_table(header, rows), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _version(env: dict) -> str:
    """draftsmith's version, and the commit it ran from (``+`` when the checkout had changes)."""
    commit = env.get("commit")
    if not commit:
        return env["draftsmith"]
    return f"{env['draftsmith']} ({commit[:7]}{'+' if env.get('dirty') else ''})"


def _hardware(report: dict) -> str:
    return report["environment"]["hardware_class"]


def _sort_key(report: dict) -> tuple:
    config = report.get("config", {})
    return (_hardware(report), str(config.get("target")), str(config.get("drafter")))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path, help="folder of suite reports (*.json)")
    parser.add_argument("--out", type=Path, help="the page (default: RESULTS.md beside the folder)")
    parser.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        parser.error(f"{args.folder} is not a folder of suite reports")
    out = args.out or args.folder.parent / "RESULTS.md"
    page = render_page(args.folder, args.folder.as_posix().rstrip("/"))
    if args.check:
        same = out.is_file() and out.read_text(encoding="utf-8") == page
        print(f"{out} is {'up to date' if same else 'OUT OF DATE: rerun without --check'}")
        sys.exit(0 if same else 1)
    partial = out.with_suffix(".partial")
    partial.write_text(page, encoding="utf-8")
    partial.replace(out)
    print(f"wrote {out} from {len(load_reports(args.folder))} reports")


if __name__ == "__main__":
    main()
