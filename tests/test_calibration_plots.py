"""Before/after figures and the Markdown report."""

from __future__ import annotations

import math

import matplotlib.image
import numpy as np
import pytest

from draftsmith.calibration import (
    PLOT_FILES,
    build_calibrator,
    calibration_metrics,
    format_table,
    plot_acceptance_by_position,
    write_plots,
    write_report,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def held_out() -> dict[str, np.ndarray]:
    """An overconfident drafter: raw confidence, calibrated confidence, outcomes, positions."""
    rng = np.random.default_rng(0)
    position = np.tile(np.arange(5), 200).astype(np.float64)
    p = rng.uniform(0.05, 0.95, position.size) * 0.9**position
    conf = 1 / (1 + np.exp(-2 * np.log(p / (1 - p))))
    outcomes = (rng.uniform(size=p.size) < p).astype(np.float64)
    calibrated = build_calibrator("isotonic").fit(conf, outcomes).predict(conf)
    return {"before": conf, "after": calibrated, "outcomes": outcomes, "position": position}


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 5000
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300
    assert image[..., :3].std() > 0.05  # something was drawn, not a blank canvas


def test_write_plots_writes_valid_pngs(held_out, tmp_path):
    paths = write_plots(
        tmp_path / "plots",
        held_out["before"],
        held_out["after"],
        held_out["outcomes"],
        held_out["position"],
    )
    assert set(paths) == set(PLOT_FILES)
    for name, path in paths.items():
        assert path == tmp_path / "plots" / PLOT_FILES[name]
        assert_png(path)
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(PLOT_FILES.values())


def test_write_plots_without_positions_skips_that_figure(held_out, tmp_path):
    paths = write_plots(tmp_path, held_out["before"], held_out["after"], held_out["outcomes"])
    assert set(paths) == {"reliability", "confidence_histogram"}
    assert not (tmp_path / PLOT_FILES["acceptance_by_position"]).exists()


def test_plots_reject_bad_input(held_out, tmp_path):
    with pytest.raises(ValueError, match="position"):
        plot_acceptance_by_position(
            held_out["position"] - 0.5,
            held_out["outcomes"],
            held_out["before"],
            held_out["after"],
            tmp_path / "p.png",
        )
    with pytest.raises(ValueError, match="both be \\(N,\\)"):
        write_plots(tmp_path, held_out["before"][:10], held_out["after"], held_out["outcomes"])
    assert not list(tmp_path.iterdir())


def test_format_table_by_hand():
    before = {"ece": 0.1, "auroc": 0.8, "n": 100, "custom": 2.0}
    after = {"ece": 0.05, "auroc": math.nan, "n": 100}
    lines = format_table(before, after).splitlines()
    assert lines[0].split("|")[1:-1] == [" metric ", " before ", "  after ", "  change "]
    assert set(lines[1]) <= {"|", "-", ":"}
    cells = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines[2:]
    }
    assert list(cells) == ["ece", "auroc", "n", "custom"]  # known metrics first, then the rest
    assert cells["ece"] == ["0.1000", "0.0500", "-0.0500"]
    assert cells["auroc"] == ["0.8000", "n/a", ""]
    assert cells["n"] == ["100", "100", ""]
    assert cells["custom"] == ["2.0000", "n/a", ""]
    assert len({len(line) for line in lines}) == 1  # padded into aligned columns


def test_write_report_links_figures_and_tables_metrics(held_out, tmp_path):
    plots = write_plots(
        tmp_path / "figures",
        held_out["before"],
        held_out["after"],
        held_out["outcomes"],
        held_out["position"],
    )
    before = calibration_metrics(held_out["before"], held_out["outcomes"])
    after = calibration_metrics(held_out["after"], held_out["outcomes"])
    metadata = {"drafter": "eagle3", "calibrator": "isotonic", "tokens": 1000}
    markdown = write_report(tmp_path, before, after, plots, metadata)
    assert (tmp_path / "report.md").read_text() == markdown
    assert markdown.startswith("# Calibration report\n")
    assert "- **drafter**: eagle3" in markdown and "- **tokens**: 1000" in markdown
    assert format_table(before, after) in markdown
    for name in PLOT_FILES:
        assert f"](figures/{PLOT_FILES[name]})" in markdown  # relative to the report
    assert markdown.index("Reliability diagram") < markdown.index("Confidence histogram")
    assert before["ece"] > 2 * after["ece"]  # the fixture's calibration did something
