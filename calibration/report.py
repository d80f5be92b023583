"""The calibration report: before/after metrics and the figures, as one Markdown file."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPORT_FILE = "report.md"

METRIC_HELP: dict[str, str] = {
    "ece": "expected calibration error, equal-width bins (lower is better)",
    "ece_equal_mass": "expected calibration error, equal-mass bins (lower is better)",
    "ece_debiased": "debiased L2 calibration error, Kumar et al. 2019 (lower is better)",
    "mce": "largest per-bin calibration gap, equal-width bins (lower is better)",
    "brier": "mean squared error of confidence vs outcome (lower is better)",
    "nll": "binary cross-entropy in nats (lower is better)",
    "auroc": "how well confidence ranks accepted above rejected tokens (higher is better)",
    "mean_confidence": "mean predicted acceptance probability",
    "acceptance_rate": "observed acceptance rate (the same before and after)",
    "n": "drafted tokens evaluated",
}
"""Metric keys in table order, with the one-line meaning the report prints under the table."""

FIGURE_TITLES = {
    "reliability": "Reliability diagram",
    "confidence_histogram": "Confidence histogram",
    "acceptance_by_position": "Acceptance by draft position",
}


def _format(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return str(value) if isinstance(value, int) else f"{value:.4f}"


def _change(before: Any, after: Any) -> str:
    numbers = all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        for v in (before, after)
    )
    if not numbers or isinstance(before, int) and isinstance(after, int):
        return ""
    return f"{after - before:+.4f}"


def format_table(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """Markdown table, padded to read well in a terminal too: metric | before | after | change.

    Known metrics come first in `METRIC_HELP` order, then any others sorted; a metric missing
    on one side shows n/a. Change is after minus before.
    """
    keys = [k for k in METRIC_HELP if k in before or k in after]
    keys += sorted((set(before) | set(after)) - set(keys))
    rows = [("metric", "before", "after", "change")]
    rows += [
        (k, _format(before.get(k)), _format(after.get(k)), _change(before.get(k), after.get(k)))
        for k in keys
    ]
    return _markdown_table(rows, label_columns=1)


WORKLOAD_METRICS = ("n", "acceptance_rate", "mean_confidence", "ece_equal_mass", "brier", "auroc")
"""The columns of `format_workload_table`: tokens, accepted rate, mean predicted acceptance,
equal-mass ECE, Brier, AUROC."""


def format_workload_table(rows: Sequence[tuple[str, Mapping[str, Mapping[str, Any]]]]) -> str:
    """Markdown table, padded for a terminal: one line per (workload, confidence side).

    rows: (workload, {side (e.g. raw, calibrated): `calibration_metrics` dict}) in print order;
    columns `WORKLOAD_METRICS`.
    """
    table = [("workload", "confidence", *WORKLOAD_METRICS)]
    for workload, sides in rows:
        for side, metrics in sides.items():
            table.append((workload, side, *(_format(metrics.get(k)) for k in WORKLOAD_METRICS)))
    return _markdown_table(table, label_columns=2)


def _markdown_table(rows: Sequence[tuple[str, ...]], label_columns: int) -> str:
    """rows[0] is the header; the first `label_columns` columns align left, the rest right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def line(cells: tuple[str, ...]) -> str:
        padded = [
            c.ljust(w) if i < label_columns else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = "|".join(
        "-" * (w + 2) if i < label_columns else "-" * (w + 1) + ":" for i, w in enumerate(widths)
    )
    return "\n".join([line(rows[0]), f"|{rule}|", *map(line, rows[1:])])


def write_report(
    path: str | os.PathLike,
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    plots: Mapping[str, str | os.PathLike],
    metadata: Mapping[str, Any] | None = None,
    title: str = "Calibration report",
) -> str:
    """Write report.md (path: the file, or a directory to put it in) and return its Markdown.

    before/after: `calibration_metrics` dicts of the raw and the calibrated confidence on the
    same held-out tokens. plots: figure name -> PNG path (e.g. from `write_plots`), linked
    relative to the report. metadata: what was calibrated, e.g. drafter, target, calibrator
    kind, signals, data; listed as given.
    """
    path = Path(path)
    if path.is_dir():
        path = path / REPORT_FILE
    lines = [f"# {title}", ""]
    if metadata:
        lines += [f"- **{key}**: {_format(value)}" for key, value in metadata.items()] + [""]
    lines += ["## Held-out metrics", "", format_table(before, after), ""]
    lines += [f"- `{k}`: {text}" for k, text in METRIC_HELP.items() if k in before or k in after]
    for name, plot in plots.items():
        link = Path(os.path.relpath(Path(plot).resolve(), path.parent.resolve())).as_posix()
        heading = FIGURE_TITLES.get(name, name.replace("_", " ").capitalize())
        lines += ["", f"## {heading}", "", f"![{heading}]({link})"]
    markdown = "\n".join(lines) + "\n"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(markdown)
    os.replace(tmp, path)
    return markdown
