"""Penalties R_m and constraint sets X_m used by the party's x-update (paper eq. 6).

Every party solves, in completed-square form,

    x_m = argmin_{x in X_m}  lam * R(x) + (rho_x / 2) * || D_m x - v ||^2,

where ``v`` is the target assembled from what the central node sent (see
:mod:`flower_vfl.core.party`). The solvers (chosen by the block's shape) are in
:mod:`flower_vfl.core.xsolve`; this module holds R, its proximal map, and X_m.
No Flower imports here.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

__all__ = ["Penalty", "get_penalty", "penalty_class", "Ball", "Box", "PENALTIES"]


class Ball:
    """X_m = {x : ||x||_2 <= radius}."""

    def __init__(self, radius: float):
        if not radius > 0:
            raise ValueError(f"ball radius must be > 0; got {radius!r}")
        self.radius = float(radius)

    def project(self, x):
        nrm = np.linalg.norm(x)
        return x if nrm <= self.radius else x * (self.radius / nrm)

    def contains(self, x, tol=1e-9):
        return np.linalg.norm(x) <= self.radius * (1 + tol)


class Box:
    """X_m = {x : lower <= x <= upper} (entry-wise)."""

    def __init__(self, lower: float, upper: float):
        if not lower < upper:
            raise ValueError(f"box needs lower < upper; got lower={lower!r}, upper={upper!r}")
        self.lower, self.upper = float(lower), float(upper)

    def project(self, x):
        return np.clip(x, self.lower, self.upper)

    def contains(self, x, tol=1e-9):
        return bool(np.all(x >= self.lower - tol) and np.all(x <= self.upper + tol))


class Penalty:
    """R(x): value and proximal map prox_{t R}.

    What callers ask of a penalty, instead of its name: ``smooth_quadratic`` (the x-update is a
    linear system: the direct and eigen solvers of :mod:`flower_vfl.core.xsolve`),
    ``supports_private_parties`` (a private party's calibration covers it: its sensitivity
    bound needs the strong convexity of lam/2 |x|^2, :mod:`flower_vfl.privacy.party`) and
    ``anderson`` (Anderson acceleration applies to the rounds: a smooth x-update; on a9a with L1
    the accelerated rounds stalled, :func:`flower_vfl.core.accel.make_accelerator`)."""

    name = "base"
    smooth_quadratic = False
    supports_private_parties = False
    anderson = False

    def value(self, x) -> float:
        raise NotImplementedError

    def prox(self, u, t):
        raise NotImplementedError


class L2(Penalty):
    """R(x) = 1/2 ||x||^2."""

    name = "l2"
    smooth_quadratic = True
    supports_private_parties = True
    anderson = True

    def value(self, x):
        return 0.5 * float(np.sum(x * x))

    def prox(self, u, t):
        return u / (1.0 + t)


class L1(Penalty):
    """R(x) = ||x||_1."""

    name = "l1"

    def value(self, x):
        return float(np.sum(np.abs(x)))

    def prox(self, u, t):
        return np.sign(u) * np.maximum(np.abs(u) - t, 0.0)


class ElasticNet(Penalty):
    """R(x) = l1_ratio ||x||_1 + (1 - l1_ratio)/2 ||x||^2."""

    name = "elasticnet"

    def __init__(self, l1_ratio: float = 0.5):
        if not 0.0 <= l1_ratio <= 1.0:
            raise ValueError(f"l1_ratio must be in [0, 1]; got {l1_ratio!r}")
        self.l1_ratio = float(l1_ratio)

    def value(self, x):
        a = self.l1_ratio
        return a * float(np.sum(np.abs(x))) + (1 - a) * 0.5 * float(np.sum(x * x))

    def prox(self, u, t):
        a = self.l1_ratio
        return np.sign(u) * np.maximum(np.abs(u) - t * a, 0.0) / (1.0 + t * (1 - a))


class NoPenalty(Penalty):
    name = "none"

    def value(self, x):
        return 0.0

    def prox(self, u, t):
        return u


PENALTIES = {"l2": L2, "l1": L1, "elasticnet": ElasticNet, "none": NoPenalty}


def penalty_class(penalty) -> type[Penalty] | None:
    """The class of a penalty given by name (:data:`PENALTIES`) or as an object, to read what it
    supports (:class:`Penalty`); None for a name that is not registered."""
    if isinstance(penalty, Penalty):
        return type(penalty)
    name = getattr(penalty, "name", penalty)
    return PENALTIES.get(name) if isinstance(name, str) else None


def get_penalty(penalty, l1_ratio=0.5) -> Penalty:
    if isinstance(penalty, Penalty):
        return penalty
    if penalty not in PENALTIES:
        raise ValueError(f"penalty={penalty!r} is not supported; choose one of {sorted(PENALTIES)}")
    return ElasticNet(l1_ratio) if penalty == "elasticnet" else PENALTIES[penalty]()


def spectral_norm_sq(D) -> float:
    """||D||_2^2 (largest eigenvalue of D^T D), via a few Lanczos steps."""
    n, d = D.shape
    if min(n, d) <= 200 and not sp.issparse(D):
        return float(np.linalg.norm(D, 2) ** 2)
    op = spla.LinearOperator((d, d), matvec=lambda v: D.T @ (D @ v), dtype=float)
    return float(spla.eigsh(op, k=1, which="LA", tol=1e-6, return_eigenvectors=False)[0])
