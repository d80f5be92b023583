"""Collect the block drafters' Done-when figures into one JSON, from reports already written.

Each head is given as KIND=SUITE_REPORT:TRAIN_DIR: a `draftsmith bench --suite standard --json`
report of the head (its code workload is held-out code: the suite shares no 8-gram with any
recipe's data) and the training run's output directory (its `train_config.yaml` gives the
training budget, its `metrics.jsonl` the held-out tau_sim of the last evaluation).

    python benchmarks/parallel/summarise.py --out benchmarks/parallel/smollm2-135m.json \\
        eagle3=benchmarks/results/smollm2-135m_eagle3-quickstart_cpu-avx2_2026-12-07.json:runs/quickstart \\
        peagle=benchmarks/results/smollm2-135m_peagle_cpu-avx2_2026-12-07.json:runs/smollm2-135m-peagle

Per head: ``code_speedup_vs_plain`` (and its 90% interval), ``suite_speedup_vs_plain`` (the same
overall), ``tau`` (mean tokens a target forward yields on the suite), ``acceptance_by_position``,
``heldout_tau_sim`` (teacher-forced, at the head's trained depth), ``train_tokens`` (steps x rows
a step x sequence length) and the run's processes; ``ratio_to_eagle3`` of both speedups when an
eagle3 entry is given.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml


def _last_eval(metrics: Path) -> dict:
    evals = [
        row
        for row in map(json.loads, metrics.read_text().splitlines())
        if row.get("split") == "eval"
    ]
    if not evals:
        raise SystemExit(f"{metrics} holds no evaluation row")
    return evals[-1]


def head_figures(report_path: Path, run_dir: Path, processes: int) -> dict:
    """The Done-when figures of one head from its suite report and its training run."""
    report = json.loads(report_path.read_text())
    config = yaml.safe_load((run_dir / "train_config.yaml").read_text())
    code, overall = report["workloads"]["code"], report["overall"]
    rows_per_step = config["batch_size"] * config.get("grad_accum", 1) * processes
    evaluation = _last_eval(run_dir / "metrics.jsonl")
    return {
        "code_speedup_vs_plain": code["speedup_vs_plain"],
        "code_speedup_vs_plain_interval": code["speedup_vs_plain_interval"],
        "suite_speedup_vs_plain": overall["speedup_vs_plain"],
        "suite_speedup_vs_plain_interval": overall["speedup_vs_plain_interval"],
        "tau": overall["mean_accepted_length"],
        "code_tau": code["mean_accepted_length"],
        "acceptance_by_position": overall["acceptance_by_position"],
        "identical_to_plain": overall["identical_to_plain"],
        "heldout_tau_sim": evaluation["tau_sim"][-1],
        "heldout_positions": evaluation["positions"],
        "train_tokens": config["max_steps"] * rows_per_step * config["data"]["seq_len"],
        "train_steps": config["max_steps"],
        "train_processes": processes,
        "suite_report": str(report_path),
        "environment": report["environment"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("heads", nargs="+", help="KIND=SUITE_REPORT:TRAIN_DIR")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--processes", type=int, default=2, help="training processes (the cpu-2proc config: 2)"
    )
    args = parser.parse_args()
    figures = {}
    for spec in args.heads:
        kind, _, paths = spec.partition("=")
        report, _, run_dir = paths.partition(":")
        if not (kind and report and run_dir):
            raise SystemExit(f"bad head {spec!r}: give KIND=SUITE_REPORT:TRAIN_DIR")
        figures[kind] = head_figures(Path(report), Path(run_dir), args.processes)
    if "eagle3" in figures:
        base = figures["eagle3"]
        for kind, entry in figures.items():
            if kind != "eagle3":
                entry["ratio_to_eagle3"] = {
                    key: entry[key] / base[key]
                    for key in ("code_speedup_vs_plain", "suite_speedup_vs_plain")
                }
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {args.out}")
    for kind, entry in figures.items():
        print(
            f"{kind}: code {entry['code_speedup_vs_plain']:.3f}x, suite "
            f"{entry['suite_speedup_vs_plain']:.3f}x, tau {entry['tau']:.3f}, "
            f"held-out tau_sim {entry['heldout_tau_sim']:.3f}"
        )


if __name__ == "__main__":
    main()
