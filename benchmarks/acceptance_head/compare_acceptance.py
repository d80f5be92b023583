"""Compare acceptance models on held-out drafted-token records: the raw top-1 probability, Platt
scaling on the confidence signals, and the learned acceptance head raw and Platt-scaled, each
fitted one is cross-fitted by source as `draftsmith calibrate` does. Reports AUROC, equal-mass
ECE (with 95% intervals from a bootstrap over documents), Brier and NLL, overall and per
workload:

    python benchmarks/acceptance_head/compare_acceptance.py --records code=ART_A/calibration/records.parquet \
        --records chat=ART_B/calibration/records.parquet [--folds 5] [--json OUT]

Records come from `draftsmith calibrate` (greedy, teacher-forced by default) on an artifact with a
learned acceptance head, so they carry the `acceptance_head` signal; the outcome is `accepted`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from datasets import Dataset

from draftsmith.calibration import auroc, bootstrap_ci, calibration_metrics, ece
from draftsmith.calibration.evaluate import metrics_by_workload
from draftsmith.calibration.io import write_json
from draftsmith.calibration.pipeline import CalibrateConfig, cross_fit

SIGNALS = CalibrateConfig().signals
"""The signals `draftsmith calibrate` fits by default."""
CANDIDATES = {
    "raw top1_prob": (None, ("top1_prob",)),
    "platt(signals)": ("platt", SIGNALS),
    "head": (None, ("acceptance_head",)),
    "platt(head)": ("platt", ("acceptance_head",)),
    "platt(head + signals)": ("platt", ("acceptance_head", *SIGNALS)),
}
"""name -> (calibrator kind, or None for the signal as it is; the signals it reads)."""


def read_records(specs: list[str]) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Columns of every WORKLOAD=PATH records file, pooled; each file's sources offset so they
    stay distinct. Returns (columns, sources (N,), workloads (N,))."""
    names = ("accepted", *{s for _, signals in CANDIDATES.values() for s in signals})
    columns: dict[str, list] = {name: [] for name in names}
    sources, workloads, offset = [], [], 0
    for spec in specs:
        workload, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"--records takes WORKLOAD=PATH, got {spec!r}")
        records = Dataset.from_parquet(str(Path(path)))
        missing = [name for name in names if name not in records.column_names]
        if missing:
            raise SystemExit(
                f"{path} lacks {missing}: calibrate an artifact with a learned acceptance head"
            )
        for name in names:
            columns[name].append(np.asarray(records[name], dtype=np.float64))
        source = np.asarray(records["source"]) + offset
        offset = int(source.max()) + 1
        sources.append(source)
        workloads.append(np.full(len(records), workload, dtype=object))
    pooled = {name: np.concatenate(parts) for name, parts in columns.items()}
    return pooled, np.concatenate(sources), np.concatenate(workloads)


def compare(
    columns: dict[str, np.ndarray], sources: np.ndarray, workloads: np.ndarray, args
) -> dict:
    """Each candidate's held-out predictions and metrics."""
    y = columns["accepted"]
    predicted = {}
    for name, (kind, signals) in CANDIDATES.items():
        if kind is None:
            predicted[name] = columns[signals[0]]
        else:
            inputs = {s: columns[s] for s in signals}
            predicted[name] = cross_fit(kind, inputs, y, sources, args.folds, args.seed)

    def equal_mass_ece(conf: np.ndarray, outcomes: np.ndarray) -> float:
        return ece(conf, outcomes, args.n_bins, "equal_mass")

    overall = {}
    for name, conf in predicted.items():
        metrics = calibration_metrics(conf, y, args.n_bins)
        for metric, fn in (("ece_equal_mass", equal_mass_ece), ("auroc", auroc)):
            interval = bootstrap_ci(fn, conf, y, n=args.bootstrap, groups=sources)
            metrics[f"{metric}_ci95"] = [interval.low, interval.high]
        overall[name] = metrics
    return {
        "candidates": {
            name: {"method": k, "signals": list(s)} for name, (k, s) in CANDIDATES.items()
        },
        "evaluation": f"{args.folds}-fold cross-fitted over {len(np.unique(sources))} sources",
        "overall": overall,
        "workloads": metrics_by_workload(predicted, y, workloads, args.n_bins),
    }


def table(result: dict) -> str:
    """Markdown: AUROC and equal-mass ECE per candidate, overall and per workload."""
    workloads = list(result["workloads"])
    header = ["acceptance model", "AUROC", "ECE (equal-mass)", "Brier"]
    header += [f"{w} AUROC / ECE" for w in workloads]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, m in result["overall"].items():
        low, high = m["ece_equal_mass_ci95"]
        cells = [name, f"{m['auroc']:.3f}", f"{m['ece_equal_mass']:.3f} [{low:.3f}, {high:.3f}]"]
        cells.append(f"{m['brier']:.4f}")
        for w in workloads:
            wm = result["workloads"][w][name]
            cells.append(f"{wm['auroc']:.3f} / {wm['ece_equal_mass']:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", action="append", required=True, metavar="WORKLOAD=PATH")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--n-bins", type=int, default=15)
    parser.add_argument("--bootstrap", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    columns, sources, workloads = read_records(args.records)
    result = {"records": args.records, **compare(columns, sources, workloads, args)}
    print(f"{len(sources)} drafted tokens, {result['evaluation']}")
    print(table(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        print(f"wrote {write_json(args.json, result)}")


if __name__ == "__main__":
    main()
