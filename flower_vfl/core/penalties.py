"""Penalties R_m and constraint sets X_m, and the party's x-update (paper eq. 6).

Every party solves, in completed-square form,

    x_m = argmin_{x in X_m}  lam * R(x) + (rho_x / 2) * || D_m x - v ||^2,

where ``v`` is the target assembled from what the central node sent (see
:mod:`flower_vfl.core.party`).  L2 without constraints is a linear system whose
factorization is computed once per (D_m, rho_x) and reused; everything else is a
warm-started FISTA with the exact proximal map of lam*R + indicator(X_m).
No Flower imports here.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
import scipy.sparse.linalg as spla

__all__ = ["Penalty", "get_penalty", "XSolver", "Ball", "Box", "PENALTIES"]


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
    """R(x): value and proximal map prox_{t R}."""

    name = "base"
    smooth_quadratic = False

    def value(self, x) -> float:
        raise NotImplementedError

    def prox(self, u, t):
        raise NotImplementedError


class L2(Penalty):
    """R(x) = 1/2 ||x||^2."""

    name = "l2"
    smooth_quadratic = True

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


def get_penalty(penalty, l1_ratio=0.5) -> Penalty:
    if isinstance(penalty, Penalty):
        return penalty
    if penalty not in PENALTIES:
        raise ValueError(f"penalty={penalty!r} is not supported; choose one of {sorted(PENALTIES)}")
    return ElasticNet(l1_ratio) if penalty == "elasticnet" else PENALTIES[penalty]()


def _spectral_norm_sq(D) -> float:
    """||D||_2^2 (largest eigenvalue of D^T D), via a few Lanczos steps."""
    n, d = D.shape
    if min(n, d) <= 200 and not sp.issparse(D):
        return float(np.linalg.norm(D, 2) ** 2)
    op = spla.LinearOperator((d, d), matvec=lambda v: D.T @ (D @ v), dtype=float)
    return float(spla.eigsh(op, k=1, which="LA", tol=1e-6, return_eigenvectors=False)[0])


class XSolver:
    """Solves eq. (6) for one party: argmin_{x in X} lam R(x) + rho/2 ||D x - v||^2.

    ``v`` may be (N,) or (N, K) (multinomial). The L2 system
    (lam I + rho D^T D) x = rho D^T v is factorized once per rho and reused; when
    d_m > N the N x N dual form (lam I + rho D D^T) w = rho v, x = D^T w is used.
    Other penalties / constraint sets use FISTA warm-started from the last x.
    """

    def __init__(self, D, penalty: Penalty, lam: float, constraint=None,
                 inner_tol: float = 1e-12, inner_max_iter: int = 5000):
        self.D = D
        self.sparse = sp.issparse(D)
        self.penalty = penalty
        self.lam = float(lam)
        self.constraint = constraint
        self.inner_tol = inner_tol
        self.inner_max_iter = inner_max_iter
        self._rho = None
        self._fac = None
        self._L = None
        self.inner_iters_ = 0

    @property
    def direct(self) -> bool:
        return self.penalty.smooth_quadratic and self.constraint is None

    @property
    def ball_l2(self) -> bool:
        """L2 penalty on a ball: solved exactly by an eigendecomposition + secular equation."""
        return (self.penalty.smooth_quadratic and isinstance(self.constraint, Ball)
                and self.D.shape[1] <= 4000)

    def _factorize(self, rho):
        D = self.D
        n, d = D.shape
        self._rho = rho
        if self.ball_l2:
            G = D.T @ D
            G = G.toarray() if sp.issparse(G) else np.asarray(G)
            self._eig = np.linalg.eigh(rho * G)
            return
        if not self.direct:
            self._L = rho * _spectral_norm_sq(D)
            return
        dual = d > n
        if self.sparse:
            A = (rho * (D @ D.T) if dual else rho * (D.T @ D)).tocsc()
            A = A + self.lam * sp.identity(A.shape[0], format="csc")
            if self.lam == 0:
                raise ValueError("penalty='l2' with lam=0 needs a positive lam for the direct solver")
            self._fac = ("splu", spla.splu(A), dual)
        else:
            A = rho * (D @ D.T if dual else D.T @ D)
            A[np.diag_indices_from(A)] += self.lam
            try:
                self._fac = ("chol", sla.cho_factor(A, lower=False, check_finite=False), dual)
            except np.linalg.LinAlgError:
                raise ValueError(
                    "the x-update system lam*I + rho*D^T D is singular: use lam > 0 or a block "
                    "with full column rank") from None

    def solve(self, v, rho, x0=None):
        if self._rho != rho:
            self._factorize(rho)
        if self.ball_l2:
            return self._solve_ball(v, rho)
        if self.direct:
            kind, fac, dual = self._fac
            if dual:
                w = fac.solve(rho * v) if kind == "splu" else sla.cho_solve(fac, rho * v, check_finite=False)
                return self.D.T @ w
            rhs = rho * (self.D.T @ v)
            return fac.solve(rhs) if kind == "splu" else sla.cho_solve(fac, rhs, check_finite=False)
        return self._fista(v, rho, x0)

    def _solve_ball(self, v, rho):
        """argmin lam/2||x||^2 + rho/2||Dx - v||^2 s.t. ||x|| <= r: x(mu) = (rho G + (lam+mu) I)^-1 rho D^T v,
        with mu >= 0 the root of ||x(mu)|| = r when the unconstrained solution is outside."""
        e, V = self._eig
        c = V.T @ (rho * (self.D.T @ v))
        r = self.constraint.radius

        def norm_at(mu):
            return np.linalg.norm(c / (e + self.lam + mu)[:, None] if c.ndim == 2 else c / (e + self.lam + mu))

        mu = 0.0
        if norm_at(0.0) > r or self.lam + e.min() <= 0:
            lo, hi = 0.0, max(1.0, np.linalg.norm(c) / r)
            while norm_at(hi) > r:
                hi *= 2.0
            for _ in range(200):   # bisection on a monotone scalar function: exact to round-off
                mu = 0.5 * (lo + hi)
                if norm_at(mu) > r:
                    lo = mu
                else:
                    hi = mu
                if hi - lo <= 1e-15 * hi:
                    break
            mu = hi
        scale = (e + self.lam + mu)
        return V @ (c / (scale[:, None] if c.ndim == 2 else scale))

    def _prox(self, u, t):
        x = self.penalty.prox(u, t * self.lam)
        if self.constraint is not None:
            # prox of (lam R + indicator) = project(prox_R) holds for our R (separable or
            # radial) with boxes and origin-centred balls
            x = self.constraint.project(x)
        return x

    def _fista(self, v, rho, x0):
        D = self.D
        d = D.shape[1]
        shape = (d,) if v.ndim == 1 else (d, v.shape[1])
        x = np.zeros(shape) if x0 is None else np.array(x0, dtype=float)
        if self.constraint is not None:
            x = self.constraint.project(x)
        step = 1.0 / self._L
        w, theta = x.copy(), 1.0
        scale = max(1.0, float(np.linalg.norm(rho * (D.T @ v))))
        for k in range(self.inner_max_iter):
            g = rho * (D.T @ (D @ w - v))
            x_new = self._prox(w - step * g, step)
            diff = x_new - w
            # gradient-mapping norm ||(w - x_new)/step|| measures optimality
            if np.linalg.norm(diff) / step <= self.inner_tol * scale:
                x = x_new
                break
            theta_new = 0.5 * (1 + np.sqrt(1 + 4 * theta * theta))
            # restart on non-monotone steps (O'Donoghue & Candes) keeps FISTA fast
            if np.sum((x_new - x) * diff) < 0:
                theta_new, w_next = 1.0, x_new
            else:
                w_next = x_new + ((theta - 1) / theta_new) * (x_new - x)
            x, w, theta = x_new, w_next, theta_new
        self.inner_iters_ += k + 1
        return x
