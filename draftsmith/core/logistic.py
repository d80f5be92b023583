"""The logistic math offline and online calibration share.

`logit` and `sigmoid` (clipped, overflow-free; as Python floats for per-round arithmetic and as
numpy arrays for fitted calibrators), and `LogisticPosterior`: a Bayesian fit of

    P(y = 1 | z) = sigmoid(a + b z),   prior (a, b) ~ N(prior_mean, I / prior_strength),

to a stream of outcomes y in [0, 1] (fractional ones allowed), by Newton's method, with old
observations fading. The offline calibrators (`draftsmith.calibration`) transform through the
first two; the online recalibration (`draftsmith.decoding.online`) keeps one posterior per group
of drafted tokens. Here in core because decoding, which recalibrates online, sits below
calibration, which fits offline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def logit(p: float, eps: float) -> float:
    """log(p / (1 - p)) of p clipped to [eps, 1 - eps] (finite for p = 0 or 1)."""
    p = min(max(p, eps), 1.0 - eps)
    return math.log(p) - math.log1p(-p)


def sigmoid(x: float) -> float:
    """1 / (1 + exp(-x)), in the tanh form that cannot overflow."""
    return 0.5 * (1.0 + math.tanh(0.5 * x))


def logit_array(p: np.ndarray, eps: float) -> np.ndarray:
    """`logit` of every entry of p."""
    p = np.clip(p, eps, 1 - eps)
    return np.log(p) - np.log1p(-p)


def sigmoid_array(z: np.ndarray) -> np.ndarray:
    """`sigmoid` of every entry of z."""
    return 0.5 * (1.0 + np.tanh(0.5 * z))


Sym2 = tuple[float, float, float]
"""A symmetric 2 x 2 matrix [[aa, ab], [ab, bb]] as (aa, ab, bb)."""

NEWTON_TOLERANCE = 1e-6
MAX_NEWTON_STEPS = 20
"""An update runs Newton steps until (a, b) moves less than the tolerance: two or three in a
stream, where each update adds little to what is known; more after a surprise under a weak
prior, where the first step overshoots."""


class LogisticPosterior:
    """A Gaussian posterior N(mean, precision^-1) over (a, b) of sigmoid(a + b z), updated from
    a stream: a recursive Laplace approximation of a penalised log-likelihood in which every
    observation, and the prior, fades by `forgetting` per later observation:

        -log post(t) = 0.5 w(t) |(a, b) - prior_mean|^2 + sum_i forgetting^(t - t_i) logloss_i,
        w(t) = floor + forgetting^t (prior_strength - floor),

    where `floor` (at most prior_strength) is a weak pull to the prior mean that never fades, so
    a long run of uninformative observations (all near p = 0 or 1, or all alike) cannot leave
    (a, b) undetermined. Each `update` of m observations blends the previous Gaussian with that
    floor at weights forgetting^m and 1 - forgetting^m (exact for the objective above, given the
    previous Gaussian), minimises their log-loss plus that Gaussian by Newton's method and takes
    the Hessian at the mode as the new precision. So memory is about 1 / (1 - forgetting)
    observations and an update costs O(m) arithmetic on Python floats: for a few observations
    and two parameters, the per-call overheads of torch or numpy would cost more than that.

    A precision of prior_strength on each of a and b is worth about 4 * prior_strength
    observations near p = 0.5 (each adds p (1 - p) <= 1/4 to the information on a).
    """

    def __init__(
        self,
        prior_strength: float,
        prior_mean: tuple[float, float] = (0.0, 1.0),
        floor: float = 1.0,
    ) -> None:
        if not (math.isfinite(prior_strength) and prior_strength > 0):
            raise ValueError(f"prior_strength must be a finite number > 0, got {prior_strength}")
        self.prior_strength = prior_strength
        self.prior_mean = prior_mean
        self.floor = min(floor, prior_strength)
        self.mean: tuple[float, float] = prior_mean
        """The posterior mode (a, b)."""
        self.precision: Sym2 = (prior_strength, 0.0, prior_strength)
        """The posterior precision of (a, b) as (aa, ab, bb)."""
        self.n_observed = 0

    def update(self, z: Sequence[float], y: Sequence[float], forgetting: float) -> None:
        """Take in outcomes y in [0, 1] of observations at z (see the class docstring)."""
        keep = forgetting ** len(y)
        prior = (self.floor, 0.0, self.floor)
        precision = _add(_scale(self.precision, keep), _scale(prior, 1 - keep))
        moment = [
            keep * m + (1 - keep) * p
            for m, p in zip(
                _times(self.precision, self.mean), _times(prior, self.prior_mean), strict=True
            )
        ]
        self.mean, self.precision = newton(z, y, _solve(precision, moment), precision)
        self.n_observed += len(y)


def newton(
    z: Sequence[float], y: Sequence[float], centre: Sequence[float], precision: Sym2
) -> tuple[tuple[float, float], Sym2]:
    """Minimise 0.5 (w - centre)' precision (w - centre) + sum_i logloss(y_i, sigmoid(a + b z_i))
    over w = (a, b); returns the mode and the Hessian there (the posterior precision)."""
    w = tuple(centre)
    for _ in range(MAX_NEWTON_STEPS):
        (ga, gb), hessian = _loss_terms(z, y, w)
        pull = _times(precision, (w[0] - centre[0], w[1] - centre[1]))
        step = _solve(_add(precision, hessian), (pull[0] + ga, pull[1] + gb))
        w = (w[0] - step[0], w[1] - step[1])
        if abs(step[0]) + abs(step[1]) < NEWTON_TOLERANCE:
            break
    return w, _add(precision, _loss_terms(z, y, w)[1])


def _loss_terms(
    z: Sequence[float], y: Sequence[float], w: Sequence[float]
) -> tuple[tuple[float, float], Sym2]:
    """Gradient (a, b) and Hessian of sum_i logloss(y_i, sigmoid(a + b z_i)) at w = (a, b)."""
    ga = gb = haa = hab = hbb = 0.0
    for zi, yi in zip(z, y, strict=True):
        p = sigmoid(w[0] + w[1] * zi)
        v = p * (1.0 - p)
        ga += p - yi
        gb += (p - yi) * zi
        haa += v
        hab += v * zi
        hbb += v * zi * zi
    return (ga, gb), (haa, hab, hbb)


def _scale(m: Sym2, c: float) -> Sym2:
    return (m[0] * c, m[1] * c, m[2] * c)


def _add(m: Sym2, n: Sym2) -> Sym2:
    return (m[0] + n[0], m[1] + n[1], m[2] + n[2])


def _times(m: Sym2, v: Sequence[float]) -> tuple[float, float]:
    return (m[0] * v[0] + m[1] * v[1], m[1] * v[0] + m[2] * v[1])


def _solve(m: Sym2, v: Sequence[float]) -> tuple[float, float]:
    det = m[0] * m[2] - m[1] * m[1]
    return ((m[2] * v[0] - m[1] * v[1]) / det, (m[0] * v[1] - m[1] * v[0]) / det)
