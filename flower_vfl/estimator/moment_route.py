"""Joint logistic regression over private parties from one label moment each (issue 21 item 3).

The route, its derivation, the trust assumption and the numbers are in docs/privacy_parties.md.

1. The label owner sends every private party the target v = kappa (t - pi) (t in {0, 1} its
   training labels, pi their mean, kappa = c_v / max(pi, 1 - pi) so v fills the clip), as the
   stacked route does.
2. Each party makes one release (:class:`~flower_vfl.privacy.label_moments.MomentParty`):
   g~_m = D_m^T v + N(0, sigma^2 I), its whole privacy cost.
3. The model is the minimizer of the convex objective

       F(x, b) = (1/n) sum_{j in pool} [log(1 + e^{f_j}) - pi f_j]  -  sum_m x_m^T g~_m / (N kappa)
                 + lam/2 sum_m |x_m|^2,            f_j = sum_m D_mj x_m + b,

   over unlabelled pool rows (rows the parties score anyway). Its gradient is the logistic score
   equation with the training rows' label-free average (1/N) sum_i D_i (p(f_i) - pi) replaced by the
   pool's: with the noise-free moment and the training rows as the pool, F's minimizer is exactly
   L2 logistic regression on all features. Everything here is post-processing of the releases and
   of the pool; no training-row score is ever released.

In process the minimizer is computed by Newton's method on the pool (all blocks at once). Through
Flower (route='moment') the same point is reached by ADMM sharing on the pool rows
(flower_vfl.core.moment_sharing, flower_vfl.strategies.moment, flower_vfl.clients.party_moment):
the central node's loss is logistic with the soft label pi, each party's regularizer has its moment
as a linear term; tests/test_moment_flower.py checks the two agree on the same release.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit, logit

from flower_vfl.core.scoring import normalize_rows
from flower_vfl.core.validation import check_blocks
from flower_vfl.privacy.label_moments import MomentParty
from flower_vfl.estimator.stacked import binary_targets, seeded_config

__all__ = ["MomentMatchingLogistic", "solve_moment_logistic", "DEFAULT_LAM"]

#: the L2 coefficient; chosen per epsilon on the a9a TRAINING set by simulations/moment_route.py
#: (docs/privacy_parties.md); 3e-4 is its choice at epsilon = 1
DEFAULT_LAM = 3e-4


def _dense(b):
    b = normalize_rows(b)
    return np.asarray(b.toarray() if hasattr(b, "toarray") else b, dtype=float)


def solve_moment_logistic(pool_blocks, h, pi, lam, max_iter=100, tol=1e-10):
    """Minimize F (module docstring) by damped Newton; ``h[m]`` = g~_m / (N kappa). Returns (xs, b).

    ``pool_blocks`` are the pool rows' blocks (rows normalized here); ``pi`` in (0, 1), ``lam`` > 0.
    """
    if not 0 < pi < 1:
        raise ValueError(f"pi={pi!r}: both classes must occur in the training labels")
    if not (np.isfinite(lam) and lam > 0):
        raise ValueError(f"lam={lam!r} must be > 0 (the pool objective needs it to be bounded)")
    P = [_dense(b) for b in pool_blocks]
    n = P[0].shape[0]
    if n < 10 or any(p.shape[0] != n for p in P):
        raise ValueError(f"the pool blocks have shapes {[p.shape for p in P]}; give every party's block of the "
                         "same (at least 10) unlabelled rows")
    widths = [p.shape[1] for p in P]
    A = np.hstack(P + [np.ones((n, 1))])
    hv = np.r_[np.concatenate([np.asarray(x, float).ravel() for x in h]), 0.0]
    reg = np.r_[np.full(A.shape[1] - 1, float(lam)), 0.0]
    th = np.zeros(A.shape[1])
    th[-1] = logit(pi)

    def F(th):
        f = A @ th
        return float(np.mean(np.logaddexp(0.0, f) - pi * f) - hv @ th + 0.5 * reg @ (th * th))

    Fc = F(th)
    for _ in range(max_iter):
        p = expit(A @ th)
        grad = A.T @ (p - pi) / n - hv + reg * th
        H = (A * (p * (1 - p))[:, None]).T @ A / n + np.diag(reg)
        step = np.linalg.solve(H, grad)
        s = 1.0
        while True:
            Fn = F(th - s * step)
            if Fn <= Fc - 1e-4 * s * float(grad @ step) or s < 1e-10:
                break
            s *= 0.5
        th, Fc = th - s * step, Fn
        if np.max(np.abs(s * step)) < tol:
            break
    xs = np.split(th[:-1], np.cumsum(widths)[:-1])
    return xs, float(th[-1])


class MomentMatchingLogistic:
    """Binary L2 logistic model over vertically split private parties (the label owner has labels only).

    Parameters
    ----------
    privacy : list of PrivacyConfig
        One per party (every party is private); see :class:`~flower_vfl.privacy.label_moments.MomentParty`.
        ``c_v`` only scales the target: the noise relative to the moment does not depend on it.
    lam : float
        The L2 coefficient of the pool objective.
    random_state : int or None
        Seeds the parties' noise (in-process experiments only), party m: random_state * 1000 + m,
        unless its PrivacyConfig has a seed.

    Attributes (after fit / refit): ``coef_`` (list, one x_m per party), ``intercept_``, ``classes_``.
    """

    def __init__(self, privacy, lam=DEFAULT_LAM, random_state=None):
        self.privacy = privacy
        self.lam = lam
        self.random_state = random_state

    def fit(self, X_blocks, y, pool_blocks):
        """Each party's one release, then the fit on ``pool_blocks`` (unlabelled rows)."""
        blocks = check_blocks(X_blocks, n_rows=np.shape(y)[0])
        t = binary_targets(self, blocks, y)
        self._parties, self._kappa = [], []
        for m, (D, cfg) in enumerate(zip(blocks, self.privacy)):
            cfg = seeded_config(cfg, self.random_state, m)
            party = MomentParty(D, cfg, party_id=m)
            kappa = cfg.c_v / max(self.pi_, 1 - self.pi_)
            party.release(1, kappa * (t - self.pi_))
            self._parties.append(party)
            self._kappa.append(kappa)
        self.n_features_in_ = [p.d for p in self._parties]
        return self.refit(pool_blocks)

    def refit(self, pool_blocks, lam=None):
        """Fit (again) on another pool or L2 coefficient: post-processing of the releases, free."""
        blocks = check_blocks(pool_blocks)
        if [b.shape[1] for b in blocks] != self.n_features_in_:
            raise ValueError(f"pool blocks have widths {[b.shape[1] for b in blocks]}; the parties have "
                             f"widths {self.n_features_in_}")
        if lam is not None:
            self.lam = lam
        h = [p.g_released / (k * self.n_train_) for p, k in zip(self._parties, self._kappa)]
        self.coef_, self.intercept_ = solve_moment_logistic(blocks, h, self.pi_, float(self.lam))
        return self

    def decision_function(self, X_blocks):
        blocks = check_blocks(X_blocks)
        if [b.shape[1] for b in blocks] != self.n_features_in_:
            raise ValueError(f"blocks have widths {[b.shape[1] for b in blocks]}; the model was fitted on "
                             f"widths {self.n_features_in_}")
        return sum(np.asarray(normalize_rows(b) @ x).ravel() for b, x in zip(blocks, self.coef_)) + self.intercept_

    def predict(self, X_blocks):
        return np.where(self.decision_function(X_blocks) >= 0, self.classes_[1], self.classes_[0])

    def predict_proba(self, X_blocks):
        p = expit(self.decision_function(X_blocks))
        return np.column_stack([1 - p, p])

    def privacy_report(self):
        """Each party's own report, its ledger's totals included."""
        return [p.report() for p in getattr(self, "_parties", [])]
