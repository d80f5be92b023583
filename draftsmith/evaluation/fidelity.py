"""Fidelity of lossy verification: how far its output strays from lossless output on the same
prompts (and from references where the prompts have them), and the speed it buys.

Metrics, each over a list of prompts decoded by both modes:

- exact match: the fraction of prompts whose token sequence equals the lossless one;
- BLEU and chrF: corpus scores from sacrebleu (0-100), lossless output as the reference;
- ROUGE-L: mean F1 from rouge-score (0-100), on lowercased whitespace tokens so that text in any
  script counts (its default tokenizer keeps only ASCII letters and digits);
- speed: tokens per second over all prompts, and its ratio to lossless decoding.

sacrebleu and rouge-score come with the `fidelity` extra (`pip install draftsmith[fidelity]`);
they are imported inside the functions, so decoding never pays for them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Decoded:
    """One prompt's output from one mode."""

    tokens: list[int]
    text: str
    wall_s: float


def exact_match_rate(outputs: Sequence[Decoded], baseline: Sequence[Decoded]) -> float:
    """The fraction of prompts whose tokens equal the baseline's, in [0, 1]."""
    _check_pairs(outputs, baseline)
    return sum(o.tokens == b.tokens for o, b in zip(outputs, baseline, strict=True)) / len(outputs)


def tokens_per_s(outputs: Sequence[Decoded]) -> float:
    """All tokens over all wall time."""
    return sum(len(o.tokens) for o in outputs) / max(sum(o.wall_s for o in outputs), 1e-9)


def text_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Corpus BLEU and chrF, and mean ROUGE-L F1, of hypotheses against references (one each),
    all on a 0-100 scale."""
    import sacrebleu
    from rouge_score.rouge_scorer import RougeScorer

    _check_pairs(hypotheses, references)
    scorer = RougeScorer(["rougeL"], tokenizer=_WhitespaceTokenizer())
    rouge = [
        scorer.score(r, h)["rougeL"].fmeasure for h, r in zip(hypotheses, references, strict=True)
    ]
    return {
        "bleu": sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score,
        "chrf": sacrebleu.corpus_chrf(list(hypotheses), [list(references)]).score,
        "rouge_l": 100.0 * sum(rouge) / len(rouge),
    }


def fidelity(
    outputs: Sequence[Decoded],
    lossless: Sequence[Decoded],
    references: Sequence[str | None] | None = None,
    answer: Callable[[str], str] | None = None,
) -> dict[str, float]:
    """One mode's figures on a list of prompts: tok_s, speed_vs_lossless, exact_match, bleu, chrf,
    rouge_l (against the lossless output), and, where references are given (None for a prompt
    without one), ref_bleu, ref_chrf, ref_rouge_l and ref_prompts over the prompts that have one.
    answer picks the part of an output that is scored against its reference (for example the
    first line of a one-line answer); None scores the whole text."""
    row = {
        "tok_s": tokens_per_s(outputs),
        "speed_vs_lossless": tokens_per_s(outputs) / max(tokens_per_s(lossless), 1e-9),
        "exact_match": exact_match_rate(outputs, lossless),
        **text_scores([o.text for o in outputs], [b.text for b in lossless]),
    }
    if references is not None:
        _check_pairs(outputs, references)
        answer = answer or (lambda text: text)
        pairs = [
            (answer(o.text), r) for o, r in zip(outputs, references, strict=True) if r is not None
        ]
        if pairs:
            scores = text_scores([h for h, _ in pairs], [r for _, r in pairs])
            row.update({f"ref_{name}": value for name, value in scores.items()})
            row["ref_prompts"] = len(pairs)
    return row


COLUMNS = (
    ("workload", "workload", "{}"),
    ("mode", "mode", "{}"),
    ("threshold", "threshold", "{}"),
    ("tok/s", "tok_s", "{:.2f}"),
    ("speed vs lossless", "speed_vs_lossless", "{:.2f}x"),
    ("exact match", "exact_match", "{:.2f}"),
    ("BLEU", "bleu", "{:.1f}"),
    ("chrF", "chrf", "{:.1f}"),
    ("ROUGE-L", "rouge_l", "{:.1f}"),
    ("chrF vs ref", "ref_chrf", "{:.1f}"),
    ("BLEU vs ref", "ref_bleu", "{:.1f}"),
)
"""The table's columns: header, row key, format. BLEU / chrF / ROUGE-L are against lossless
output; "vs ref" against the prompts' references (blank without them)."""


def format_table(rows: Sequence[dict]) -> str:
    """A markdown table of fidelity rows (each `fidelity` plus workload, mode, threshold)."""
    lines = [
        "| " + " | ".join(header for header, _, _ in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for row in rows:
        cells = ["" if row.get(key) is None else fmt.format(row[key]) for _, key, fmt in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_tradeoff(rows: Sequence[dict], path: str | Path) -> None:
    """Speed against fidelity: one panel per workload, speed vs lossless (y) against chrF vs
    lossless output (x), one line per lossy mode through its thresholds (labelled), lossless at
    (100, 1)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    workloads = list(dict.fromkeys(row["workload"] for row in rows))
    figure = Figure(figsize=(5 * len(workloads), 4), layout="constrained")
    FigureCanvasAgg(figure)
    for axes, workload in zip(
        figure.subplots(1, len(workloads), squeeze=False)[0], workloads, strict=True
    ):
        here = [row for row in rows if row["workload"] == workload]
        for mode in dict.fromkeys(row["mode"] for row in here if row["mode"] != "lossless"):
            points = sorted((r for r in here if r["mode"] == mode), key=lambda r: r["threshold"])
            xs = [p["chrf"] for p in points]
            ys = [p["speed_vs_lossless"] for p in points]
            axes.plot(xs, ys, "o-", label=mode)
            for point, x, y in zip(points, xs, ys, strict=True):
                axes.annotate(
                    f"{point['threshold']:g}",
                    (x, y),
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize=8,
                )
        axes.plot([100.0], [1.0], "k*", markersize=12, label="lossless")
        axes.axhline(1.0, color="gray", linestyle="--", linewidth=0.8)
        axes.set(
            title=workload,
            xlabel="chrF against lossless output (100 = identical)",
            ylabel="speed vs lossless (tokens/s ratio)",
        )
        axes.grid(alpha=0.3)
        axes.legend()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)


class _WhitespaceTokenizer:
    """rouge-score's tokenizer interface: lowercased whitespace tokens, any script."""

    def tokenize(self, text: str) -> list[str]:
        return text.lower().split()


def _check_pairs(outputs: Sequence, baseline: Sequence) -> None:
    if len(outputs) != len(baseline) or not outputs:
        raise ValueError(
            f"fidelity needs the same non-empty list of prompts on both sides, got "
            f"{len(outputs)} and {len(baseline)}"
        )
