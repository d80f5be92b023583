"""Fidelity metrics of lossy output against lossless output, the table and the plot."""

from __future__ import annotations

import pytest

from draftsmith.evaluation.fidelity import (
    Decoded,
    exact_match_rate,
    fidelity,
    format_table,
    plot_tradeoff,
    text_scores,
)

LOSSLESS = [
    Decoded([1, 2, 3], "le chat est sur la table", 1.0),
    Decoded([4, 5], "the meeting ends at noon", 1.0),
]


def test_identical_output_scores_full_marks():
    row = fidelity(LOSSLESS, LOSSLESS)
    assert row["exact_match"] == 1.0 and row["speed_vs_lossless"] == pytest.approx(1.0)
    for name in ("bleu", "chrf", "rouge_l"):
        assert row[name] == pytest.approx(100.0)


def test_lossy_output_loses_fidelity_and_gains_speed():
    lossy = [
        Decoded([1, 2, 3], "le chat est sur la table", 0.5),
        Decoded([4, 6], "the meeting finishes at noon", 0.5),
    ]
    row = fidelity(lossy, LOSSLESS)
    assert row["exact_match"] == 0.5
    assert row["speed_vs_lossless"] == pytest.approx(2.0)
    assert row["tok_s"] == pytest.approx(5 / 1.0)
    assert 0 < row["chrf"] < 100 and 0 < row["bleu"] < 100
    # ROUGE-L on the second prompt: 4 of 5 tokens in common, F1 0.8; mean with 1.0.
    assert row["rouge_l"] == pytest.approx(90.0)


def test_references_score_only_the_prompts_that_have_one():
    row = fidelity(LOSSLESS, LOSSLESS, references=["le chat est sur la table", None])
    assert row["ref_prompts"] == 1 and row["ref_chrf"] == pytest.approx(100.0)
    assert "ref_bleu" not in fidelity(LOSSLESS, LOSSLESS, references=[None, None])
    rambling = [Decoded([1], "le chat est sur la table\nEnglish: and more", 1.0)]
    first_line = fidelity(
        rambling, rambling, ["le chat est sur la table"], lambda t: t.split("\n")[0]
    )
    assert first_line["ref_chrf"] == pytest.approx(100.0)
    assert fidelity(rambling, rambling, ["le chat est sur la table"])["ref_chrf"] < 100.0


def test_rouge_counts_words_in_any_script():
    # rouge-score's own tokenizer drops non-ASCII letters; ours keeps them.
    assert text_scores(["Größe äöü"], ["größe ÄÖÜ"])["rouge_l"] == pytest.approx(100.0)
    assert text_scores(["Größe"], ["Grüße"])["rouge_l"] == 0.0


def test_mismatched_lists_are_an_error():
    with pytest.raises(ValueError, match="same non-empty list"):
        exact_match_rate(LOSSLESS, LOSSLESS[:1])
    with pytest.raises(ValueError, match="same non-empty list"):
        text_scores([], [])


def rows() -> list[dict]:
    table = [
        {
            "workload": "translation",
            "mode": "lossless",
            "threshold": None,
            **fidelity(LOSSLESS, LOSSLESS),
        }
    ]
    for mode in ("typical", "modulated"):
        for threshold in (0.1, 0.5):
            lossy = [Decoded(d.tokens, d.text + " x" * int(10 * threshold), 0.8) for d in LOSSLESS]
            table.append(
                {
                    "workload": "translation",
                    "mode": mode,
                    "threshold": threshold,
                    **fidelity(lossy, LOSSLESS),
                }
            )
    return table


def test_table_has_a_row_per_mode_and_threshold():
    text = format_table(rows())
    lines = text.strip().splitlines()
    assert lines[0].startswith("| workload | mode | threshold | tok/s")
    assert len(lines) == 2 + 5
    assert "| translation | typical | 0.5 |" in text
    assert lines[2].count("|  |") >= 2  # lossless: no threshold, no references


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "curve" / "fidelity.png"
    plot_tradeoff(rows(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
