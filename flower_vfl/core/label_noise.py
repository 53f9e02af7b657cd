"""Logistic loss corrected for randomized-response label noise (forward correction).

When the label owner trains on labels t~ flipped with a known probability p (randomized
response, :mod:`flower_vfl.privacy.label_dp`), the model f = sum_m D_m x_m + b should still
describe the clean labels: P(t = +1 | x) = sigmoid(f). The observed label then has

    P(t~ | x) = (1 - p) sigmoid(t~ f) + p sigmoid(-t~ f),

and the forward-corrected loss is its negative log-likelihood (Patrini et al. 2017, "Making
deep neural networks robust to label noise: a loss correction approach", eq. for the forward
correction; Natarajan et al. 2013 for the noise model). With v = t~ z and
kappa = log((1 - p) / p) (= epsilon for randomized response):

    l(z, t~) = log(1 + e^v) - log(p + (1 - p) e^v)          (stable via logaddexp)
    l'(z)    = t~ (sigmoid(v) - sigmoid(v + kappa))
    l''(z)   = sigmoid'(v) - sigmoid'(v + kappa),  sigmoid' = sigmoid (1 - sigmoid).

l is bounded (0 <= l <= -log p) and nonconvex for p > 0 (l'' < 0 for v < -kappa/2), with
|l'| <= 1 and |l''| <= c(p) <= 1/4, c(p) = max_v |l''(v)| computed below. It is handled exactly
as the nonconvex sigmoid loss (docs/math.md, Sections 4 and 9): default rho = 3 c/N (> 2L,
Assumption 1.2 of the paper), the intercept as its own block (``CentralUpdate._intercept_then_z``),
the z-update (eq. 7) by the bracketed vectorized Newton ``newton_1d``.
At p = 0 it is the logistic loss. No Flower imports here.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import expit

from flower_vfl.core.loss_base import Loss, check_binary, newton_1d

__all__ = ["ForwardCorrectedLogistic", "curvature_bound"]


def _dsig(v):
    s = expit(v)
    return s * (1.0 - s)


@lru_cache(maxsize=64)
def curvature_bound(flip_prob: float) -> float:
    """c(p) = max_v |sigmoid'(v) - sigmoid'(v + kappa)| (<= 1/4), kappa = log((1-p)/p).

    f(v) = sigmoid'(v) - sigmoid'(v + kappa) satisfies f(-kappa - v) = -f(v) (sigmoid' is
    even), so max |f| = max f, attained at v >= -kappa/2. A grid of step 1e-3 locates it and
    a bounded scalar search refines it; the returned bound carries a 1e-6 relative margin.
    """
    if flip_prob == 0.0:
        return 0.25
    kappa = math.log((1.0 - flip_prob) / flip_prob)
    v = np.arange(-kappa / 2.0, 40.0, 1e-3)
    f = _dsig(v) - _dsig(v + kappa)
    i = int(np.argmax(f))
    lo, hi = v[max(i - 1, 0)], v[min(i + 1, v.size - 1)]
    res = minimize_scalar(lambda u: -(_dsig(u) - _dsig(u + kappa)), bounds=(lo, hi),
                          method="bounded", options={"xatol": 1e-12})
    return float(min(0.25, max(f[i], -res.fun) * (1.0 + 1e-6)))


class ForwardCorrectedLogistic(Loss):
    """Forward-corrected logistic loss for labels flipped with probability ``flip_prob``.

    Parameters
    ----------
    flip_prob : float in [0, 0.5), default=0.0
        Probability p that a training label was flipped (randomized response at epsilon:
        p = 1/(1+e^epsilon)). 0 gives the logistic loss.
    """

    name = "logistic_rr"
    n_outputs = 1

    def __init__(self, flip_prob: float = 0.0):
        p = float(flip_prob)
        if not 0.0 <= p < 0.5:
            raise ValueError(f"flip_prob={flip_prob!r} must be in [0, 0.5): at 0.5 the flipped labels "
                             "carry no information (label_epsilon = 0)")
        self.flip_prob = p
        self.kappa = math.inf if p == 0.0 else math.log((1.0 - p) / p)
        self.curvature = curvature_bound(p)
        self.convex = p == 0.0

    def __repr__(self):
        return f"ForwardCorrectedLogistic(flip_prob={self.flip_prob!r})"

    def encode_labels(self, y):
        return check_binary(y, self.name)

    def value(self, z, t):
        v = np.multiply(t, z)
        if self.flip_prob == 0.0:
            return np.logaddexp(0.0, -v)
        return np.logaddexp(0.0, v) - np.logaddexp(math.log(self.flip_prob),
                                                   math.log1p(-self.flip_prob) + v)

    def mean(self, z, t):
        return float(np.mean(self.value(z, t)))

    def grad(self, z, t):
        v = np.multiply(t, z)
        return t * (expit(v) - expit(v + self.kappa))

    def hess(self, z, t):
        v = np.multiply(t, z)
        return _dsig(v) - _dsig(v + self.kappa) if self.flip_prob else _dsig(v)

    def z_update(self, a, y, t, rho, n, z0=None):
        """Eq. (7) entry-wise: argmin (1/n) l(z) - y z + rho/2 (z - a)^2 (strongly convex in z
        once rho > c(p)/n; bracketed Newton since |l'| <= 1)."""
        if not self.convex and rho <= self.curvature / n:
            raise ValueError(
                f"rho={rho:g} is too small for the label-noise-corrected loss: the z-update needs "
                f"rho > {self.curvature / n:.3g} (= c(p)/N with c(p)={self.curvature:.4g}) to be "
                "strongly convex; use rho='auto'")
        a = np.asarray(a, dtype=float)
        return newton_1d(a, y, rho, n, lambda z: self.grad(z, t), lambda z: self.hess(z, t),
                          a + y / rho if z0 is None else z0)

    def predict(self, f):
        return np.where(f >= 0, 1, -1)

    def predict_proba(self, f):
        """P(clean label = +1) = sigmoid(f): the correction models the clean labels."""
        p = expit(f)
        return np.column_stack([1 - p, p])
