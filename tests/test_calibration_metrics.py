"""Calibration metrics against hand-computed examples."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import roc_auc_score

from draftsmith.calibration import (
    auroc,
    bin_stats,
    bootstrap_ci,
    brier_score,
    calibration_metrics,
    ece,
    ece_debiased,
    mce,
    nll,
)

CONF = np.array([0.1, 0.2, 0.7, 0.8, 0.9])
OUTCOMES = np.array([0.0, 1.0, 1.0, 0.0, 1.0])


def test_ece_and_mce_equal_width_by_hand():
    # Two bins [0, 0.5) and [0.5, 1]:
    #   {0.1, 0.2}:      mean conf 0.15, acceptance 1/2, gap 0.35
    #   {0.7, 0.8, 0.9}: mean conf 0.80, acceptance 2/3, gap 0.1333...
    # ECE = 2/5 * 0.35 + 3/5 * 0.1333 = 0.14 + 0.08 = 0.22; MCE = 0.35.
    assert ece(CONF, OUTCOMES, n_bins=2) == pytest.approx(0.22)
    assert mce(CONF, OUTCOMES, n_bins=2) == pytest.approx(0.35)
    # One bin: |mean conf 0.54 - acceptance 0.6| = 0.06.
    assert ece(CONF, OUTCOMES, n_bins=1) == pytest.approx(0.06)


def test_ece_equal_mass_by_hand():
    # Five tokens in two equal-mass bins of 3 and 2, in confidence order:
    #   {0.1, 0.2, 0.7}: mean conf 1/3, acceptance 2/3, gap 1/3
    #   {0.8, 0.9}:      mean conf 0.85, acceptance 1/2, gap 0.35
    # ECE = 3/5 * 1/3 + 2/5 * 0.35 = 0.2 + 0.14 = 0.34; MCE = 0.35.
    assert ece(CONF, OUTCOMES, n_bins=2, binning="equal_mass") == pytest.approx(0.34)
    assert mce(CONF, OUTCOMES, n_bins=2, binning="equal_mass") == pytest.approx(0.35)


def test_bin_edges_and_empty_bins():
    stats = bin_stats(np.array([0.0, 0.5, 1.0]), np.array([0.0, 1.0, 1.0]), n_bins=4)
    # [0, .25) gets 0.0, [.5, .75) gets 0.5 (left-closed), the last bin is closed at 1.
    np.testing.assert_array_equal(stats.count, [1, 0, 1, 1])
    assert math.isnan(stats.mean_conf[1]) and math.isnan(stats.mean_outcome[1])
    np.testing.assert_allclose(stats.lower, [0, 0.25, 0.5, 0.75])
    # Fewer tokens than equal-mass bins: the extra bins are empty and ignored.
    assert ece(np.array([0.2, 0.6]), np.array([0.0, 1.0]), 15, "equal_mass") == pytest.approx(0.3)
    mass = bin_stats(CONF, OUTCOMES, n_bins=2, binning="equal_mass")
    np.testing.assert_allclose(mass.lower, [0.1, 0.8])
    np.testing.assert_allclose(mass.upper, [0.7, 0.9])


def test_soft_outcomes_enter_as_their_mean():
    # One bin, conf 0.5 everywhere, soft outcomes averaging 0.5: perfectly calibrated.
    assert ece(np.full(4, 0.5), np.array([0.2, 0.8, 0.4, 0.6])) == 0.0
    assert ece(np.full(2, 0.9), np.array([0.5, 0.7])) == pytest.approx(0.3)


@settings(max_examples=60, deadline=None, database=None)
@given(
    pairs=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=60),
    n_bins=st.integers(1, 20),
)
def test_metric_bounds(pairs, n_bins):
    conf, outcomes = (np.array(column) for column in zip(*pairs, strict=True))
    for binning in ("equal_width", "equal_mass"):
        error = ece(conf, outcomes, n_bins, binning)
        assert 0 <= error <= mce(conf, outcomes, n_bins, binning) + 1e-12 <= 1 + 1e-12
    # With one bin ECE is the gap between mean confidence and acceptance rate.
    assert ece(conf, outcomes, 1) == pytest.approx(abs(conf.mean() - outcomes.mean()))
    assert 0 <= brier_score(conf, outcomes) <= 1
    assert 0 <= ece_debiased(conf, outcomes, n_bins) <= 1


def test_debiased_ece_by_hand():
    # One equal-mass bin: conf 0.2, outcomes [1, 1, 1, 0] with mean 0.75.
    # Plug-in squared gap (0.75 - 0.2)^2 = 0.3025. Sample variance of the outcomes
    # (3 * 0.25^2 + 0.75^2) / 3 = 0.25, so the mean's variance is 0.25 / 4 = 0.0625
    # (Kumar's y(1-y)/(n-1) = 0.1875 / 3). sqrt(0.3025 - 0.0625) = sqrt(0.24).
    conf, outcomes = np.full(4, 0.2), np.array([1.0, 1.0, 1.0, 0.0])
    assert ece_debiased(conf, outcomes, n_bins=1) == pytest.approx(math.sqrt(0.24))
    # Calibrated on average: the bias correction exceeds the gap and the estimate clips at 0,
    # where plug-in ECE would report noise as miscalibration.
    # Here: gap 0.75 - 0.6 = 0.15, squared 0.0225 < 0.0625.
    conf, outcomes = np.full(4, 0.6), np.array([1.0, 0.0, 1.0, 1.0])
    assert ece(conf, outcomes) == pytest.approx(0.15)
    assert ece_debiased(conf, outcomes, n_bins=1) == 0.0


def test_brier_and_nll_by_hand():
    conf, outcomes = np.array([0.8, 0.3]), np.array([1.0, 0.0])
    assert brier_score(conf, outcomes) == pytest.approx((0.2**2 + 0.3**2) / 2)  # 0.065
    assert nll(conf, outcomes) == pytest.approx(-(math.log(0.8) + math.log(0.7)) / 2)
    # Soft outcome 0.25 at conf 0.5: Brier 0.0625, NLL log 2 whatever the target.
    assert brier_score(np.array([0.5]), np.array([0.25])) == pytest.approx(0.0625)
    assert nll(np.array([0.5]), np.array([0.25])) == pytest.approx(math.log(2))
    # Clipped: a certain miss costs -log(1e-7) nats, not infinity.
    assert nll(np.array([0.0]), np.array([1.0])) == pytest.approx(-math.log(1e-7))


def test_auroc_perfect_inverted_random_and_one_class():
    outcomes = np.r_[np.zeros(50), np.ones(50)]
    ranks = np.linspace(0, 1, 100)
    assert auroc(ranks, outcomes) == 1.0
    assert auroc(1 - ranks, outcomes) == 0.0
    rng = np.random.default_rng(0)
    random_outcomes = (rng.uniform(size=20000) < 0.4).astype(np.float64)
    assert auroc(rng.uniform(size=20000), random_outcomes) == pytest.approx(0.5, abs=0.015)
    assert math.isnan(auroc(ranks, np.ones(100)))


def test_auroc_soft_outcomes_by_hand_and_hard_equivalence():
    # Token A (conf 0.9) counts 0.75 positive / 0.25 negative, token B (conf 0.1) 0.25 / 0.75.
    # P(positive scores above negative), ties half: A+ vs B- 0.75*0.75 wins, A+ vs A- and
    # B+ vs B- tie (0.1875 each, half credit), B+ vs A- loses: 0.5625 + 0.1875 = 0.75.
    assert auroc(np.array([0.9, 0.1]), np.array([0.75, 0.25])) == pytest.approx(0.75)
    rng = np.random.default_rng(1)
    conf = rng.uniform(size=300)
    hard = (rng.uniform(size=300) < conf).astype(np.float64)
    assert auroc(conf, hard) == pytest.approx(roc_auc_score(hard, conf))


def test_bootstrap_ci_contains_estimate_and_is_reproducible():
    rng = np.random.default_rng(2)
    conf = rng.uniform(size=2000)
    outcomes = (rng.uniform(size=2000) < conf**2).astype(np.float64)
    for metric in (brier_score, nll, ece, auroc):
        interval = bootstrap_ci(metric, conf, outcomes, n=200, seed=3)
        assert interval.low < interval.estimate < interval.high, metric.__name__
        assert interval.estimate == metric(conf, outcomes)
    again = bootstrap_ci(brier_score, conf, outcomes, n=200, seed=3)
    assert again == bootstrap_ci(brier_score, conf, outcomes, n=200, seed=3)
    # Ten times the data, roughly a third of the width.
    big = np.tile(conf, 10), np.tile(outcomes, 10)
    wide = again.high - again.low
    narrow = bootstrap_ci(brier_score, *big, n=200, seed=3)
    assert narrow.high - narrow.low < 0.5 * wide


def test_cluster_bootstrap_is_wider_when_groups_share_their_outcome():
    """Forty groups whose tokens all share one outcome hold forty observations, not 2,000: the
    group bootstrap sees that, the token bootstrap does not."""
    rng = np.random.default_rng(4)
    groups = np.repeat(np.arange(40), 50)
    outcomes = np.repeat((rng.uniform(size=40) < 0.5).astype(np.float64), 50)
    conf = np.full(groups.size, 0.3)
    tokens = bootstrap_ci(brier_score, conf, outcomes, n=200, seed=1)
    clustered = bootstrap_ci(brier_score, conf, outcomes, n=200, seed=1, groups=groups)
    assert clustered.estimate == tokens.estimate
    assert clustered.high - clustered.low > 3 * (tokens.high - tokens.low)
    with pytest.raises(ValueError, match="groups must be"):
        bootstrap_ci(brier_score, conf, outcomes, groups=groups[:-1])


def test_bootstrap_ci_drops_nan_replicates():
    # One accepted token in 20: many resamples miss it and have no AUROC.
    conf = np.linspace(0, 1, 20)
    outcomes = np.r_[np.zeros(19), 1.0]
    interval = bootstrap_ci(auroc, conf, outcomes, n=100, seed=0)
    assert interval.estimate == 1.0 and 0.0 <= interval.low <= interval.high <= 1.0


def test_calibration_metrics_keys_and_values():
    metrics = calibration_metrics(CONF, OUTCOMES, n_bins=2)
    required = {"ece", "ece_equal_mass", "mce", "brier", "nll", "auroc"}
    assert required <= set(metrics)
    assert set(metrics) - required == {"ece_debiased", "n", "mean_confidence", "acceptance_rate"}
    assert metrics["ece"] == pytest.approx(0.22)
    assert metrics["ece_equal_mass"] == pytest.approx(0.34)
    assert metrics["mce"] == pytest.approx(0.35)
    assert metrics["n"] == 5 and metrics["acceptance_rate"] == pytest.approx(0.6)
    assert metrics["auroc"] == pytest.approx(roc_auc_score(OUTCOMES, CONF))
    assert math.isnan(calibration_metrics(CONF, np.ones(5))["auroc"])


@pytest.mark.parametrize(
    ("conf", "outcomes", "message"),
    [
        (np.zeros(0), np.zeros(0), "N=0"),
        (np.zeros(3), np.zeros(2), "both be \\(N,\\)"),
        (np.array([0.5, np.nan]), np.zeros(2), "conf has 1 NaN/inf"),
        (np.array([0.5, 1.5]), np.zeros(2), "conf must lie in \\[0, 1\\]"),
        (np.array([0.5, 0.5]), np.array([0.0, -1.0]), "outcomes must lie in \\[0, 1\\]"),
    ],
)
def test_bad_input_is_a_clear_error(conf, outcomes, message):
    with pytest.raises(ValueError, match=message):
        calibration_metrics(conf, outcomes)


def test_bad_binning_is_a_clear_error():
    with pytest.raises(ValueError, match="equal_width"):
        ece(CONF, OUTCOMES, binning="quantile")
    with pytest.raises(ValueError, match="n_bins"):
        ece(CONF, OUTCOMES, n_bins=0)
