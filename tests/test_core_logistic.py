"""The logistic math both calibrations share (`draftsmith.core.logistic`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from draftsmith.core.logistic import (
    LogisticPosterior,
    logit,
    logit_array,
    sigmoid,
    sigmoid_array,
)


def test_scalar_and_array_forms_agree_and_clip():
    p = np.array([0.0, 1e-9, 0.2, 0.5, 0.9, 1.0])
    z = logit_array(p, 1e-4)
    assert np.isfinite(z).all() and z[0] == z[1] == pytest.approx(math.log(1e-4 / (1 - 1e-4)))
    assert z.tolist() == pytest.approx([logit(float(v), 1e-4) for v in p], rel=1e-12)
    x = np.array([-800.0, -3.0, 0.0, 2.5, 800.0])
    assert sigmoid_array(x).tolist() == pytest.approx([sigmoid(float(v)) for v in x], rel=1e-12)
    assert sigmoid(-800.0) == 0.0 and sigmoid(800.0) == 1.0  # no overflow
    assert sigmoid(logit(0.3, 1e-7)) == pytest.approx(0.3, rel=1e-12)


def test_posterior_starts_at_the_prior_and_finds_the_fit_of_a_long_stream():
    posterior = LogisticPosterior(prior_strength=1e-3)
    assert posterior.mean == (0.0, 1.0) and posterior.n_observed == 0
    rng = np.random.default_rng(0)
    z = rng.normal(0, 2, 4000)
    y = (rng.random(4000) < 1 / (1 + np.exp(-(0.5 + 2.0 * z)))).astype(float)
    posterior.update(z.tolist(), y.tolist(), forgetting=1.0)
    a, b = posterior.mean
    assert a == pytest.approx(0.5, abs=0.15) and b == pytest.approx(2.0, abs=0.2)
    assert posterior.n_observed == 4000
    # The precision is the Hessian at the mode: large after 4000 observations.
    assert posterior.precision[0] > 100 and posterior.precision[2] > 100


def test_posterior_rejects_a_bad_prior():
    with pytest.raises(ValueError, match="prior_strength"):
        LogisticPosterior(prior_strength=0.0)
