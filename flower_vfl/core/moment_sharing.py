"""The moment route's pool objective as vertical ADMM sharing (issue 21 item 3). No Flower imports.

The objective (docs/privacy_parties.md, "the moment route"; rows of unit norm),

    F(x, b) = (1/n) sum_{j in pool} [log(1 + e^{f_j}) - pi f_j] - sum_m x_m^T h_m + lam/2 sum_m |x_m|^2,
    f_j = sum_m P_mj x_m + b,      h_m = g~_m / (N kappa_m),

is ADMM sharing (Boyd et al. 2011, Sec. 7.3) with

- the central node's loss: logistic with the SOFT label pi on every pool row, mean over the n
  pool rows, the intercept b at the central node: :class:`~flower_vfl.core.central.CentralUpdate`
  with :class:`~flower_vfl.core.losses.SoftLabelLogisticLoss` (z-update eq. 7, y-update eq. 8);
- party m's regularizer lam/2 |x|^2 - h_m^T x. Its x-update on the target c the central node
  sends (completed square, rho_x = rho / theta):

      x = argmin lam/2 |x|^2 - h^T x + rho_x/2 |P x - c|^2   <=>   (lam I + rho_x P^T P) x = rho_x P^T c + h.

The central node forms c_m = s_m - theta q_m - y / rho_x (:func:`sharing_target`: the party's line
of :class:`~flower_vfl.core.party.PartyUpdate` with alpha = 1, moved to the side that knows q, y and
the last s_m; q_m is the central node's q, or party m's own residual from the Anderson accelerator,
:class:`~flower_vfl.core.accel.Anderson`: the rounds are deterministic once g~ is drawn), so the
party keeps no iterate between rounds: x_m is a function of (c_m, rho_x, g~_m, its pool block). The
party keeps g~_m and x_m; only its pool scores s_m = P_m x_m travel. With theta = 1/M it is a
genuine two-block ADMM and converges for any rho > 0 (F is convex). The pool columns are centred on
the party's side (:class:`MomentXUpdate`): without that, or without Anderson, a9a needs hundreds of
rounds (the one-hot groups' flat direction shared with the intercept, lam = 3e-4); with both, ~50.

:func:`pool_driver` builds a fit's central node and its :class:`~flower_vfl.core.rounds.RoundDriver`
(the one round loop, with its stopping rule 'change': the largest change of a party's pool scores
or of b); :class:`PoolExchange` is how its rounds reach the parties (the targets c_m from the last
releases; a subclass says how a party answers). :func:`moment_sharing_admm` runs them in process
(the reference the Flower route is tested against, and the place to choose rho), the label owner
(:class:`~flower_vfl.strategies.moment.MomentStrategy`) through Flower.
"""

from __future__ import annotations

import numpy as np

from flower_vfl.core.blas import one_blas_thread
from flower_vfl.core.central import CentralUpdate
from flower_vfl.core.losses import SoftLabelLogisticLoss
from flower_vfl.core.rounds import RoundDriver

__all__ = ["MomentXUpdate", "sharing_target", "moment_sharing_admm", "default_rho", "pool_driver", "PoolExchange"]


def default_rho(n_pool: int) -> float:
    """The rho the label owner uses unless told: 0.1 / n (the pool loss's curvature is at most
    1/(4n) per row). Measured (simulations/moment_flower.py, tests/test_moment_sharing.py): with
    Anderson acceleration and centred pool columns, a9a's 8,140-row pool reaches max |dx| ~1e-8 in
    40 rounds at rho = 1e-5; without Anderson or without centring hundreds of rounds are needed."""
    return 0.1 / int(n_pool)


class MomentXUpdate:
    """Party m's x-update of the pool objective: (lam I + rho P_c^T P_c) x = rho P_c^T c + h.

    The pool columns are centred, P_c = P - 1 mu^T (mu: the pool rows' column means, the party's
    own): the central node fits an unpenalized intercept, which absorbs sum_m mu_m^T x_m, so F's
    x-minimizer is unchanged and the flat direction a one-hot group shares with the intercept
    (a9a: hundreds of rounds) is gone; the central node's b is the intercept of centred scores
    (:meth:`scores` centres any rows it scores with the same mu).

    Parameters
    ----------
    P : (n, d) array or sparse matrix
        The party's pool block, rows already normalized.
    h : (d,) array
        g~ / (N kappa): the party's released moment, scaled.
    lam : float > 0
    """

    def __init__(self, P, h, lam):
        self.P = P
        n = P.shape[0]
        self.mu = np.asarray(P.T @ np.ones(n), dtype=float).ravel() / n
        self.h = np.asarray(h, dtype=float).ravel()
        self.lam = float(lam)
        if not (np.isfinite(self.lam) and self.lam > 0):
            raise ValueError(f"lam={lam!r} must be > 0")
        if self.h.shape != self.mu.shape:
            raise ValueError(f"h has shape {self.h.shape}; the pool block has {self.mu.size} columns")
        with one_blas_thread():
            G = P.T @ P
            G = np.asarray(G.toarray() if hasattr(G, "toarray") else G, dtype=float)
            G -= n * np.outer(self.mu, self.mu)          # P_c^T P_c, nothing dense of size n x d
            e, V = np.linalg.eigh(G)
        self._e, self._V = np.maximum(e, 0.0), V

    def solve(self, c, rho):
        """x for target ``c`` (one value per pool row) and penalty ``rho`` (> 0)."""
        c = np.asarray(c, dtype=float)
        with one_blas_thread():
            rhs = rho * (np.asarray(self.P.T @ c, dtype=float).ravel() - self.mu * c.sum()) + self.h
            V = self._V
            return V @ ((V.T @ rhs) / (rho * self._e + self.lam))

    def scores(self, x, rows=None):
        """The centred scores P_c x of the pool, or (rows - 1 mu^T) x of other ``rows`` (normalized
        by the caller): what the central node's intercept b is fitted to."""
        rows = self.P if rows is None else rows
        return np.asarray(rows @ x, dtype=float).ravel() - float(self.mu @ x)


def sharing_target(s, q, y, rho, theta):
    """c_m = s_m - theta q - y / rho_x, rho_x = rho / theta: the party's completed-square target
    (:class:`~flower_vfl.core.party.PartyUpdate`, alpha = 1)."""
    return np.asarray(s, float) - theta * np.asarray(q, float) - np.asarray(y, float) * (theta / rho)


def pool_driver(n_pool: int, pi: float, rho: float, num_parties: int, max_rounds: int, tol: float,
                anderson: bool = True) -> RoundDriver:
    """The round driver of one fit on ``n_pool`` pool rows: the central node's soft-label loss
    (label ``pi`` on every row, the intercept), theta = 1/M, Anderson acceleration (``anderson``),
    and the stopping rule 'change' (max |s^{k+1} - s^k| over the parties' pool scores and
    |b^{k+1} - b^k| below ``tol`` after round 1; ``tol`` = 0 runs ``max_rounds``)."""
    M = int(num_parties)
    central = CentralUpdate(SoftLabelLogisticLoss(), np.full(int(n_pool), float(pi)), rho, theta=1.0 / M)
    driver = RoundDriver(central, M, max_rounds=max_rounds, tol=tol, stop="change")
    driver.plan([False] * M, [], acceleration="anderson" if anderson else "none", adapt_theta=False)
    return driver


class PoolExchange:
    """How a fit's rounds reach the parties (a :class:`~flower_vfl.core.rounds.RoundExchange`):
    round k sends party m its target c_m (:func:`sharing_target` from its last pool scores, the
    accelerator's q_m or the central node's q, and the dual) and reads back its pool scores s_m.
    A subclass gives :meth:`release`. After the run :attr:`targets` holds the last targets sent
    (a party's x is a function of it) and :attr:`rho_x` the parties' penalty rho / theta."""

    evaluates = False

    def __init__(self, central: CentralUpdate):
        self.central = central
        self.rho_x = central.rho / central.theta
        self.s: dict = {}
        self.targets: dict = {}

    def release(self, k: int, targets: dict) -> dict:
        """Party -> its pool scores for round ``k``'s targets (party -> c_m)."""
        raise NotImplementedError

    def train(self, k, parties, qs):
        c = self.central
        zero = np.zeros(c.n)
        self.targets = {m: sharing_target(self.s.get(m, zero), c.q if qs is None else qs[m], c.y, c.rho, c.theta)
                        for m in parties}
        self.s = dict(self.release(k, self.targets))
        return self.s, {}

    def evaluate(self, k, parties, final):
        return {}

    def finish(self, k):
        pass


class _InProcess(PoolExchange):
    """The parties' x-updates called in process (:class:`MomentXUpdate`); keeps their x."""

    def __init__(self, central, parties):
        super().__init__(central)
        self.parties = parties
        self.xs = [np.zeros(p.h.size) for p in parties]

    def release(self, k, targets):
        self.xs = [p.solve(targets[m], self.rho_x) for m, p in enumerate(self.parties)]
        return {m: p.scores(x) for m, (p, x) in enumerate(zip(self.parties, self.xs))}


def moment_sharing_admm(pool_blocks, h, pi, lam, rho=None, max_rounds=500, tol=1e-9, anderson=True):
    """Minimize F by ADMM sharing in process: the rounds of the Flower route, without Flower
    (:func:`pool_driver`, :class:`PoolExchange`).

    ``pool_blocks``: each party's pool block, rows normalized; ``h[m]`` = g~_m / (N kappa_m).
    Stops when max |s^{k+1} - s^k| (every party's pool scores) and |b^{k+1} - b^k| fall below
    ``tol``. Returns (xs, b, rounds), b the intercept of the uncentred rows (as
    :func:`~flower_vfl.estimator.moment_route.solve_moment_logistic`'s)."""
    n = pool_blocks[0].shape[0]
    rho = default_rho(n) if rho is None else float(rho)
    parties = [MomentXUpdate(P, hm, lam) for P, hm in zip(pool_blocks, h)]
    driver = pool_driver(n, pi, rho, len(parties), max_rounds, tol, anderson)
    pool = _InProcess(driver.central, parties)
    k = driver.run(pool)
    xs = pool.xs
    return xs, float(driver.central.b) - sum(float(p.mu @ x) for p, x in zip(parties, xs)), k
