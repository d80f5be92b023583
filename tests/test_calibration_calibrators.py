"""Calibrator kinds and auto selection on synthetic data whose true acceptance law is known."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression

from draftsmith.calibration import (
    HistogramBinning,
    IsotonicCalibrator,
    PlattScaling,
    TemperatureScaling,
    build_calibrator,
    ece,
)
from draftsmith.core.signals import confidence_signals, signal_matrix

KINDS = ("temperature", "platt", "isotonic", "histogram", "auto")


def overconfident(n: int, seed: int, temperature: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """conf (n,) = sigmoid(logit(p) * temperature) for true acceptance probabilities p, and
    outcomes (n,) ~ Bernoulli(p): exactly the law temperature scaling assumes, with T known."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.02, 0.98, n)
    conf = 1 / (1 + np.exp(-temperature * np.log(p / (1 - p))))
    return conf, (rng.uniform(size=n) < p).astype(np.float64)


def step_law(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Acceptance 0.9 for confidence in (0.3, 0.6), 0.15 elsewhere: not monotone."""
    rng = np.random.default_rng(seed)
    conf = rng.uniform(0, 1, n)
    p = np.where((conf > 0.3) & (conf < 0.6), 0.9, 0.15)
    return conf, (rng.uniform(size=n) < p).astype(np.float64)


# -- temperature -----------------------------------------------------------------------------------


def test_temperature_on_a_signal_recovers_known_temperature():
    conf, outcomes = overconfident(20000, seed=1, temperature=2.0)
    assert TemperatureScaling().fit(conf, outcomes).temperature == pytest.approx(2.0, rel=0.06)


def test_temperature_from_draft_logits_through_the_signals():
    """The decoder's path: draft logits -> `confidence_signals` -> fit / `predict_signals`.

    Two-token drafts with logits 3 * [z, 0] are accepted with probability sigmoid(|z|), the top-1
    probability of [z, 0], so T = 3 undoes the overconfidence exactly; soft outcomes (the
    acceptance probability itself) pin it tightly.
    """
    z = torch.randn(4000, generator=torch.Generator().manual_seed(0))
    logits = 3 * torch.stack([z, torch.zeros_like(z)], dim=1)
    accept_prob = torch.sigmoid(z.abs())
    signals = confidence_signals(logits)
    fitted = TemperatureScaling().fit(signals, accept_prob)
    assert fitted.temperature == pytest.approx(3.0, rel=1e-3)
    torch.testing.assert_close(fitted.predict_signals(signals), accept_prob, atol=1e-4, rtol=0)
    # Sampling temperature 1.5 is applied in the signals: the fitted T undoes only the rest.
    hot = confidence_signals(logits, temperature=1.5)
    assert TemperatureScaling().fit(hot, accept_prob).temperature == pytest.approx(2.0, rel=1e-3)


def test_temperature_needs_a_probability_signal():
    with pytest.raises(ValueError, match="probability signal"):
        TemperatureScaling(signals=["entropy"])
    with pytest.raises(ValueError, match="must lie in \\[0, 1\\] for temperature"):
        TemperatureScaling().fit(np.array([0.2, 1.5]), np.array([0.0, 1.0]))


# -- platt -----------------------------------------------------------------------------------------


def test_platt_matches_sklearn_logistic_regression():
    rng = np.random.default_rng(2)
    x = np.stack([rng.uniform(0, 1, 3000), rng.uniform(0, 6, 3000)], axis=1)
    p = 1 / (1 + np.exp(-(3 * x[:, 0] - 0.5 * x[:, 1] + 0.5)))
    y = (rng.uniform(size=3000) < p).astype(np.float64)
    ours = PlattScaling(signals=["top1_prob", "entropy"], C=0.5).fit(x, y)
    reference = LogisticRegression(C=0.5, max_iter=1000).fit(x, y)
    np.testing.assert_allclose(ours.coef, reference.coef_[0], atol=1e-3)
    assert ours.intercept == pytest.approx(reference.intercept_[0], abs=1e-3)
    np.testing.assert_allclose(ours.predict(x), reference.predict_proba(x)[:, 1], atol=1e-4)


def test_platt_soft_labels_minimise_the_soft_cross_entropy():
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, (2000, 1))
    y = np.clip(x[:, 0] ** 2 + rng.normal(0, 0.05, 2000), 0, 1)
    platt = PlattScaling(C=1.0).fit(x, y)
    # Stationarity of (sum(BCE(sigmoid(xw + b), y)) + w^2 / (2C)) / N in b and w.
    residual = platt.predict(x) - y
    assert abs(residual.mean()) < 1e-4
    assert abs((x[:, 0] @ residual + platt.coef[0] / platt.C) / len(y)) < 1e-4
    assert platt.coef[0] > 3  # a real fit, not the zero initialisation


# -- isotonic and histogram ------------------------------------------------------------------------


def test_isotonic_is_monotone_matches_sklearn_and_improves_heldout_ece():
    conf, outcomes = overconfident(8000, seed=4)
    iso = IsotonicCalibrator().fit(conf[:4000], outcomes[:4000])
    grid = np.linspace(-0.5, 1.5, 401)  # beyond the data on both sides: clipped
    assert (np.diff(iso.predict(grid)) >= 0).all()
    reference = IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1)
    reference.fit(conf[:4000], outcomes[:4000])
    np.testing.assert_allclose(iso.predict(grid), reference.predict(grid), atol=1e-12)
    before = ece(conf[4000:], outcomes[4000:])
    after = ece(iso.predict(conf[4000:]), outcomes[4000:])
    assert before > 0.05 and after < before / 2


def test_isotonic_follows_a_decreasing_signal():
    rng = np.random.default_rng(5)
    entropy = rng.uniform(0, 5, 3000)
    outcomes = (rng.uniform(size=3000) < np.exp(-entropy)).astype(np.float64)
    iso = IsotonicCalibrator(signals=["entropy"]).fit(entropy, outcomes)
    assert not iso.increasing
    prediction = iso.predict(np.linspace(0, 5, 50))
    assert (np.diff(prediction) <= 0).all() and prediction[0] > 0.7 > 0.1 > prediction[-1]


def test_histogram_binning_hand_example():
    x = np.array([0.1, 0.2, 0.3, 0.4])
    y = np.array([0.0, 0.0, 1.0, 1.0])
    # Two equal-mass bins split at the median 0.2: {0.1, 0.2} and {0.3, 0.4}.
    raw = HistogramBinning(n_bins=2, prior_weight=0).fit(x, y)
    np.testing.assert_allclose(raw.edges, [0.2])
    np.testing.assert_allclose(raw.predict(x), [0, 0, 1, 1])
    # Prior weight 1 towards the overall rate 0.5: (0 + 0.5) / 3 and (2 + 0.5) / 3.
    smoothed = HistogramBinning(n_bins=2, prior_weight=1).fit(x, y)
    np.testing.assert_allclose(smoothed.predict(np.array([0.0, 1.0])), [1 / 6, 5 / 6])


def test_histogram_ties_leave_no_nan_bins():
    x = np.r_[np.zeros(50), np.ones(50)]
    y = np.r_[np.zeros(40), np.ones(10), np.ones(45), np.zeros(5)]
    hist = HistogramBinning(n_bins=10, prior_weight=1.0).fit(x, y)
    # Nine quantile edges collapse to [0, 1]: bins (-inf, 0], (0, 1] and an empty (1, inf),
    # which predicts the overall rate 55 / 100; the others shrink towards it with weight 1.
    np.testing.assert_allclose(hist.edges, [0.0, 1.0])
    prediction = hist.predict(np.array([0.0, 0.5, 1.0, 2.0]))
    np.testing.assert_allclose(prediction, [10.55 / 51, 45.55 / 51, 45.55 / 51, 0.55])


# -- every kind ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_fit_on_one_split_improves_ece_on_another(kind):
    conf, outcomes = overconfident(6000, seed=6)
    calibrator = build_calibrator(kind).fit(conf[:3000], outcomes[:3000])
    before = ece(conf[3000:], outcomes[3000:])
    after = ece(calibrator.predict(conf[3000:]), outcomes[3000:])
    assert before > 0.05, "the synthetic drafter should start miscalibrated"
    assert after < 0.5 * before


def test_auto_picks_the_parametric_law_and_the_flexible_one_when_needed():
    auto = build_calibrator("auto").fit(*overconfident(4000, seed=8))
    assert auto.selected.kind == "temperature"
    assert set(auto.cv_nll) == {"temperature", "platt", "histogram", "isotonic"}
    assert auto.to_dict()["selection"]["folds"] == 5
    # A non-monotone law: only histogram binning can follow it.
    step = build_calibrator("auto").fit(*step_law(4000, seed=8))
    assert step.selected.kind == "histogram"
    assert step.cv_nll["histogram"] < min(step.cv_nll["platt"], step.cv_nll["isotonic"]) - 0.05


def test_auto_skips_temperature_for_a_non_probability_signal():
    rng = np.random.default_rng(9)
    entropy = rng.uniform(0, 5, 1000)
    outcomes = (rng.uniform(size=1000) < np.exp(-entropy)).astype(np.float64)
    auto = build_calibrator("auto", signals=["entropy"]).fit(entropy, outcomes)
    assert "temperature" not in auto.cv_nll and auto.selected.kind in auto.cv_nll


def test_predict_signals_agrees_with_predict():
    conf, outcomes = overconfident(1000, seed=10)
    platt = PlattScaling(signals=["top1_prob", "position"]).fit(
        np.stack([conf, np.arange(1000) % 5], axis=1), outcomes
    )
    signals = confidence_signals(torch.randn(5, 30))
    from_signals = platt.predict_signals(signals)
    assert from_signals.shape == (5,) and from_signals.dtype == torch.float32
    expected = platt.predict(signal_matrix(signals, platt.signals))
    np.testing.assert_allclose(from_signals.numpy(), expected, rtol=1e-6)
    assert platt.predict_signals(confidence_signals(torch.zeros(0, 30))).shape == (0,)
    bad = {**signals, "position": torch.tensor([0.0, 1.0, float("nan"), 3.0, 4.0])}
    with pytest.raises(ValueError, match="'position' has 1 NaN"):
        platt.predict_signals(bad)
    with pytest.raises(ValueError, match="different lengths"):
        platt.predict_signals({**signals, "position": torch.arange(3.0)})


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_single_class_and_empty_data_are_clear_errors(kind):
    conf = np.linspace(0.1, 0.9, 20)
    with pytest.raises(ValueError, match="all 20 drafted tokens were accepted.*harder or more"):
        build_calibrator(kind).fit(conf, np.ones(20))
    with pytest.raises(ValueError, match="none of the 20 drafted tokens was accepted"):
        build_calibrator(kind).fit(conf, np.zeros(20))
    with pytest.raises(ValueError, match="N=0"):
        build_calibrator(kind).fit(np.zeros(0), np.zeros(0))


def test_bad_features_outcomes_and_names_are_clear_errors():
    conf = np.linspace(0.1, 0.9, 20)
    outcomes = np.r_[np.zeros(10), np.ones(10)]
    with pytest.raises(ValueError, match="'top1_prob' has 1 NaN/inf"):
        PlattScaling().fit(np.r_[conf[:-1], np.nan], outcomes)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        PlattScaling().fit(conf, outcomes * 2)
    with pytest.raises(ValueError, match="expected features \\(N, 2\\)"):
        PlattScaling(signals=["top1_prob", "margin"]).fit(conf, outcomes)
    with pytest.raises(ValueError, match="use 'platt'"):
        IsotonicCalibrator(signals=["top1_prob", "margin"])
    with pytest.raises(ValueError, match="unknown calibrator kind 'beta'"):
        build_calibrator("beta")
    with pytest.raises(ValueError, match="unknown signals"):
        build_calibrator("platt", signals=["confidence"])
    with pytest.raises(RuntimeError, match="not fitted"):
        PlattScaling().predict(conf)
    with pytest.raises(ValueError, match="at least 10 drafted tokens"):
        build_calibrator("auto").fit(conf[:8], outcomes[6:14])
    with pytest.raises(ValueError, match="unknown calibrator kind 'beta'"):
        build_calibrator("auto", candidates=["platt", "beta"])
    with pytest.raises(ValueError, match="bad candidates"):
        build_calibrator("auto", candidates=["auto"])
