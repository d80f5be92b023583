"""Confidence signals and calibrators on synthetic data whose true acceptance law is known."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression

from draftsmith.calibration import (
    SIGNAL_NAMES,
    Calibrator,
    HistogramBinning,
    IsotonicCalibrator,
    PlattScaling,
    TemperatureScaling,
    build_calibrator,
    confidence_signals,
    ece,
    signal_matrix,
)

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


# -- signals ---------------------------------------------------------------------------------------


def test_signals_match_hand_computation():
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.05, 0.9, 0.05]])
    signals = confidence_signals(probs.log())
    assert tuple(signals) == SIGNAL_NAMES
    entropy = -(probs * probs.log()).sum(-1)
    torch.testing.assert_close(signals["top1_prob"], torch.tensor([0.5, 0.9]))
    torch.testing.assert_close(signals["margin"], torch.tensor([0.2, 0.85]))
    torch.testing.assert_close(signals["entropy"], entropy)
    torch.testing.assert_close(signals["position"], torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(signals["path_prob"], torch.tensor([0.5, 0.45]))
    torch.testing.assert_close(signals["composite"], torch.tensor([0.5, 0.9]) * (-entropy).exp())
    assert all(s.shape == (2,) and s.dtype == torch.float32 for s in signals.values())


@settings(max_examples=40, deadline=None, database=None)
@given(
    k=st.integers(1, 6),
    vocab=st.integers(1, 40),
    scale=st.floats(0.01, 30),
    seed=st.integers(0, 2**16),
)
def test_signal_invariants(k, vocab, scale, seed):
    logits = torch.randn(k, vocab, generator=torch.Generator().manual_seed(seed)) * scale
    s = confidence_signals(logits)
    assert ((s["top1_prob"] >= 1 / vocab - 1e-6) & (s["top1_prob"] <= 1)).all()
    assert ((s["margin"] >= 0) & (s["margin"] <= s["top1_prob"])).all()
    assert ((s["entropy"] >= -1e-6) & (s["entropy"] <= math.log(vocab) + 1e-5)).all()
    assert (s["path_prob"][1:] <= s["path_prob"][:-1]).all()
    assert ((s["composite"] > 0) & (s["composite"] <= s["top1_prob"] + 1e-7)).all()


def test_signals_temperature_and_masked_tokens():
    logits = torch.randn(4, 7)
    hot = confidence_signals(logits, temperature=2.0)
    for name, value in confidence_signals(logits / 2.0).items():
        torch.testing.assert_close(hot[name], value)
    # A masked (-inf) token contributes nothing: same signals as without it.
    masked = torch.cat([logits, torch.full((4, 1), float("-inf"))], dim=1)
    for name, value in confidence_signals(masked).items():
        torch.testing.assert_close(value, confidence_signals(logits)[name])


def test_signals_single_token_vocab_and_empty_draft():
    one = confidence_signals(torch.zeros(3, 1))
    torch.testing.assert_close(one["margin"], torch.ones(3))
    torch.testing.assert_close(one["entropy"], torch.zeros(3))
    empty = confidence_signals(torch.zeros(0, 5))
    assert all(v.shape == (0,) for v in empty.values())


@pytest.mark.parametrize(
    "bad",
    [
        torch.tensor([[0.0, float("nan")]]),
        torch.tensor([[0.0, float("inf")]]),
        torch.tensor([[0.0, 1.0], [float("-inf"), float("-inf")]]),
        torch.zeros(5),
        torch.zeros(2, 3, dtype=torch.long),
    ],
)
def test_signals_reject_bad_logits(bad):
    with pytest.raises(ValueError, match="logits"):
        confidence_signals(bad)


def test_signals_reject_bad_temperature():
    with pytest.raises(ValueError, match="temperature"):
        confidence_signals(torch.zeros(2, 3), temperature=0.0)


def test_signal_matrix_orders_columns_and_checks_names():
    signals = confidence_signals(torch.randn(3, 5))
    x = signal_matrix(signals, ["entropy", "top1_prob"])
    assert x.shape == (3, 2) and x.dtype == np.float64
    np.testing.assert_allclose(x[:, 1], signals["top1_prob"].numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="unknown signals"):
        signal_matrix(signals, ["logit"])
    with pytest.raises(ValueError, match="missing"):
        signal_matrix({"top1_prob": signals["top1_prob"]}, ["entropy"])


# -- temperature -----------------------------------------------------------------------------------


@pytest.fixture
def one_thread():
    """Run torch single-threaded: these tensors are too small to gain from intra-op threads,
    and on a busy machine every threaded op waits for a free core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_temperature_recovers_known_temperature_from_logits():
    # Tokens are drawn from softmax(z) and accepted when an independent label from softmax(z)
    # agrees, so P(accept) = softmax(z)[token]; the drafter reports 3z, so T = 3 undoes it.
    torch.manual_seed(0)
    z = torch.randn(4000, 12) * 1.5
    probs = z.softmax(-1)
    tokens = torch.multinomial(probs, 1).squeeze(1)
    labels = torch.multinomial(probs, 1).squeeze(1)
    hard = (labels == tokens).double().numpy()
    # Tolerance ~4 standard deviations of the estimate at this N (measured over seeds).
    assert TemperatureScaling().fit_logits(3 * z, tokens, hard).temperature == pytest.approx(
        3.0, rel=0.1
    )
    # Soft outcomes (the acceptance probability itself) pin T much more tightly.
    soft = probs.gather(1, tokens[:, None]).squeeze(1)
    fitted = TemperatureScaling().fit_logits(3 * z, tokens, soft)
    assert fitted.temperature == pytest.approx(3.0, rel=1e-3)
    torch.testing.assert_close(fitted.predict_logits(3 * z, tokens), soft, atol=1e-4, rtol=0)
    # Sampling temperature 1.5 is applied before T: the fitted T halves to undo the rest.
    assert TemperatureScaling().fit_logits(
        3 * z, tokens, soft, temperature=1.5
    ).temperature == pytest.approx(2.0, rel=1e-3)


def test_temperature_on_a_signal_recovers_known_temperature():
    conf, outcomes = overconfident(20000, seed=1, temperature=2.0)
    fitted = TemperatureScaling().fit(conf, outcomes)
    assert fitted.temperature == pytest.approx(2.0, rel=0.06)
    assert fitted.input == "signal"


def test_temperature_logits_mode_predicts_only_from_logits():
    z = torch.randn(50, 6)
    tokens = z.argmax(-1)
    fitted = TemperatureScaling().fit_logits(z, tokens, np.r_[np.ones(25), np.zeros(25)])
    with pytest.raises(ValueError, match="predict_logits"):
        fitted.predict(np.full(3, 0.5))
    # predict_draft defaults to the argmax tokens.
    torch.testing.assert_close(
        fitted.predict_draft(z[:4]), fitted.predict_logits(z[:4], tokens[:4])
    )


def test_temperature_needs_a_probability_signal():
    with pytest.raises(ValueError, match="probability signal"):
        TemperatureScaling(signals=["entropy"])


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


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_round_trip_gives_identical_predictions(kind, tmp_path):
    conf, outcomes = overconfident(2000, seed=7)
    signals = ["top1_prob", "entropy"] if kind in ("platt", "auto") else ["top1_prob"]
    calibrator = build_calibrator(kind, signals=signals)
    calibrator.fit({"top1_prob": conf, "entropy": -np.log(conf)}, outcomes)
    path = calibrator.save(tmp_path, {"metrics": {"before": {"ece": 0.1, "auroc": float("nan")}}})
    assert path == tmp_path / "calibration.json"
    assert [p.name for p in tmp_path.iterdir()] == ["calibration.json"]
    payload = json.loads(path.read_text())  # plain JSON: NaN was written as null
    assert payload["format_version"] == 1 and payload["metrics"]["before"]["auroc"] is None
    loaded = Calibrator.load(path)
    # auto saves the kind it chose, over that kind's signals.
    chosen = calibrator.selected if kind == "auto" else calibrator
    assert loaded.kind == chosen.kind and loaded.signals == chosen.signals
    probe_conf = np.r_[conf, 1e-9, 0.5, 1.0]
    probe = {"top1_prob": probe_conf, "entropy": -np.log(probe_conf)}
    np.testing.assert_array_equal(loaded.predict(probe), calibrator.predict(probe))
    assert loaded.to_dict() == {k: v for k, v in calibrator.to_dict().items() if k != "selection"}


def test_temperature_logits_mode_round_trips(tmp_path):
    z = torch.randn(200, 9)
    tokens = z.argmax(-1)
    fitted = TemperatureScaling().fit_logits(z, tokens, (torch.rand(200) < 0.5).double())
    loaded = Calibrator.load(fitted.save(tmp_path / "c.json"))
    torch.testing.assert_close(loaded.predict_draft(z, tokens), fitted.predict_draft(z, tokens))


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


def test_predict_signals_and_predict_draft_agree_with_predict():
    conf, outcomes = overconfident(1000, seed=10)
    platt = PlattScaling(signals=["top1_prob", "position"]).fit(
        np.stack([conf, np.arange(1000) % 5], axis=1), outcomes
    )
    logits = torch.randn(5, 30)
    signals = confidence_signals(logits)
    from_signals = platt.predict_signals(signals)
    assert from_signals.shape == (5,) and from_signals.dtype == torch.float32
    expected = platt.predict(signal_matrix(signals, platt.signals))
    np.testing.assert_allclose(from_signals.numpy(), expected, rtol=1e-6)
    torch.testing.assert_close(platt.predict_draft(logits), from_signals)
    assert platt.predict_draft(torch.zeros(0, 30)).shape == (0,)


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
    with pytest.raises(ValueError, match="logits"):
        TemperatureScaling().fit_logits(
            torch.tensor([[0.0, math.nan]]), torch.tensor([0]), np.ones(1)
        )


def test_load_rejects_bad_files(tmp_path):
    conf, outcomes = overconfident(200, seed=11)
    path = PlattScaling().fit(conf, outcomes).save(tmp_path / "calibration.json")
    payload = json.loads(path.read_text())
    path.write_text(json.dumps({**payload, "format_version": 99}))
    with pytest.raises(ValueError, match="format_version 99"):
        Calibrator.load(path)
    path.write_text(json.dumps({**payload, "params": {"coef": [1.0, 2.0], "intercept": 0, "C": 1}}))
    with pytest.raises(ValueError, match="2 coefs"):
        Calibrator.load(path)
    path.write_text(json.dumps({**payload, "kind": "auto"}))
    with pytest.raises(ValueError, match="chosen kind"):
        Calibrator.load(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        Calibrator.load(path)
