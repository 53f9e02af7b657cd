"""The loss base class and the scalar Newton shared by the losses (paper eq. 7).

:class:`Loss` is what every loss implements; :func:`newton_1d` solves the separable z-update
of a smooth nonconvex scalar loss. They sit below :mod:`flower_vfl.core.losses` (the convex and
sigmoid losses, :func:`~flower_vfl.core.losses.get_loss`) and
:mod:`flower_vfl.core.label_noise` (the label-noise-corrected logistic), so the registry can
name both without an import circle; ``losses`` re-exports them. No Flower imports here.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Loss"]


class Loss:
    """Base class. ``t`` are the encoded labels, ``z`` the predictions (N,) or (N, K)."""

    name = "base"
    #: upper bound on |l''| (per sample, before the 1/N); None for non-smooth losses
    curvature = None
    #: number of output columns (1 → vectors of shape (N,))
    n_outputs = 1
    convex = True
    # What callers ask of a loss (the estimator, the CLI's checks, the ClientApp), instead of its name:
    #: its labels: 'binary' (two classes, encoded -1 / +1, ``classes_[1]`` the positive one),
    #: 'classes' (K >= 2 classes, one output column each), 'real' (regression), 'soft' (a
    #: probability per row)
    label_kind = "binary"
    #: K classes, one output column each (labels encoded on the training classes)
    multiclass = False
    #: it has class probabilities (overrides :meth:`predict_proba`)
    has_proba = False
    #: label DP (randomized response, then the forward-corrected loss: privacy/label_dp.py) covers it
    supports_label_dp = False
    #: a private party's one noisy score vector per round covers it (one output column)
    supports_private_parties = True

    def __init_subclass__(cls, **kwargs):
        """A subclass that overrides :meth:`predict_proba` without saying ``has_proba`` has it."""
        super().__init_subclass__(**kwargs)
        if "predict_proba" in cls.__dict__ and "has_proba" not in cls.__dict__:
            cls.has_proba = True

    def encode_labels(self, y) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def value(self, z, t) -> np.ndarray:  # per-sample loss values
        raise NotImplementedError

    def grad(self, z, t) -> np.ndarray:  # per-sample derivative dl/dz
        raise NotImplementedError

    def mean(self, z, t) -> float:
        return float(np.mean(self.value(z, t)) if np.ndim(z) == 1
                     else np.mean(np.sum(self.value(z, t), axis=-1)))

    def z_update(self, a, y, t, rho, n, z0=None) -> np.ndarray:
        """Solve eq. (7) entry-wise: argmin (1/n) l(z) - y z + rho/2 (z - a)^2."""
        raise NotImplementedError

    def hess(self, z, t):
        """Per-sample l''(z) (smooth scalar losses)."""
        raise NotImplementedError

    def dz_da(self, z, t, rho, n):
        """Derivative of the z-update's solution with respect to a, at the solution z."""
        return rho / (self.hess(z, t) / n + rho)

    # helpers for predict / predict_proba
    def predict(self, f):
        return f

    def predict_proba(self, f):
        raise AttributeError(f"loss={self.name!r} has no probabilistic output")


def check_binary(y, name):
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"y must be 1-D for loss={name!r}; got shape {y.shape}")
    vals = np.unique(y)
    if not (set(vals.tolist()) <= {-1, 1} or set(vals.tolist()) <= {0, 1}):
        raise ValueError(
            f"loss={name!r} needs binary labels in {{-1, +1}} or {{0, 1}}; got values "
            f"{vals[:10].tolist()}{'...' if vals.size > 10 else ''}. "
            "Use loss='multinomial' for more than two classes or loss='squared' for regression."
        )
    if vals.size < 2:
        raise ValueError(f"loss={name!r} needs both classes in y; got only {vals.tolist()}")
    return np.where(y > 0, 1.0, -1.0)


def newton_1d(a, c, rho, n, grad, hess, z0, max_iter=100, tol=1e-13):
    """Safeguarded Newton (rtsafe) for phi(z) = (1/n) l(z) - c z + rho/2 (z - a)^2.

    phi' is increasing (rho > curvature/n), so keep a bracket [lo, hi] around its root
    and bisect whenever a Newton step would land on or outside the bracket or fails to
    halve the previous step (which stops the 2-cycles Newton has on sigmoid-shaped phi').
    An entry whose Newton step is already below the tolerance (or whose phi' is at round-off
    level) is converged: it takes that step and is never bisected, so round-off noise near the
    root cannot send it back to bisecting its (possibly still wide) bracket.
    """
    # |l'| <= 1 for our classification losses: the root is within (|c| + 1/n)/rho of a
    width = (np.abs(c) + 1.0 / n) / rho
    lo, hi = a - width - 1.0, a + width + 1.0
    z = np.clip(z0, lo, hi)
    prev_step = hi - lo
    eps = np.finfo(float).eps
    for _ in range(max_iter):
        gl = grad(z) / n
        g = gl - c + rho * (z - a)
        lo = np.where(g < 0, z, lo)
        hi = np.where(g > 0, z, hi)
        step = g / (hess(z) / n + rho)
        z_new = z - step
        # converged: the step is below tol, or phi' is within a few ulps of its terms
        done = (np.abs(step) <= tol * (1.0 + np.abs(z))) | (
            np.abs(g) <= 8.0 * eps * (np.abs(gl) + np.abs(c) + rho * (np.abs(z) + np.abs(a))))
        bisect = (z_new <= lo) | (z_new >= hi) | (np.abs(step) > 0.5 * np.abs(prev_step))
        bisect &= ~done
        z_new = np.where(bisect, 0.5 * (lo + hi), z_new)
        prev_step = np.where(bisect, 0.5 * (hi - lo), step)
        if done.all():
            return z_new
        z = z_new
    return z
