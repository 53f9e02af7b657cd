"""ADMM sharing with Gaussian-perturbed releases at fixed noise levels (the paper's Fig. 3).

The paper's Fig. 3 sweeps raw noise levels sigma, not privacy budgets, so this loop takes
sigma directly; the privacy-budgeted protocol is :class:`flower_vfl.VerticalADMM` with
``privacy=[...]`` (docs/privacy.md). Every round, every party m makes its x-update
(eq. 6, :class:`flower_vfl.core.party.PartyUpdate`) and releases a perturbed
s~_m through the project's mechanism (:class:`flower_vfl.privacy.mechanism.GaussianOutputMechanism`):

- ``form='paper'``: eq. (16), s~_m = D_m (x_m + xi), xi ~ N(0, sigma^2 (D_m^T D_m)^-1)
  (not (eps, delta)-DP by itself: see the mechanism's docstring);
- ``form='output'``: s~_m = D_m x_m + e, e ~ N(0, sigma^2 I_N).

The central node's z- and y-updates (eq. 7-8) use the sum of the s~_m
(:class:`flower_vfl.core.central.CentralUpdate`); the next x-update sees them too
(Alg. 1 l. 3-4). Test metrics use the parties' exact x_m (the model they hold). No
epsilon is reported here: no accountant covers these raw levels (the "paper" form is not DP).
With sigma = 0 the loop is :class:`~flower_vfl.VerticalADMM` with ``acceleration='none'``.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from flower_vfl.core.central import CentralUpdate
from flower_vfl.core.schedule import default_rho
from flower_vfl.core.losses import get_loss
from flower_vfl.core.party import PartyUpdate
from flower_vfl.core.penalties import get_penalty
from flower_vfl.privacy.mechanism import GaussianOutputMechanism

__all__ = ["noisy_admm", "FactoredMechanism"]


class FactoredMechanism(GaussianOutputMechanism):
    """The project's mechanism with the Cholesky factor of D^T D computed once per block
    (the base class refactors it at every release: 2000 x 2000 per party per round on the
    wide data). Same formula, same random stream."""

    def parameter_noise(self, round, kind, D, n_cols=None):
        key = (id(D), D.shape)
        if getattr(self, "_factor_key", None) != key:
            gram = np.asarray(D.T @ D, dtype=float)
            d = gram.shape[0]
            ridge = self.jitter * max(np.trace(gram) / max(d, 1), np.finfo(float).tiny)
            self._factor, self._factor_key = np.linalg.cholesky(gram + ridge * np.eye(d)), key
        shape = (self._factor.shape[0],) if n_cols is None else (self._factor.shape[0], n_cols)
        g = self.rng(round, kind).standard_normal(shape)
        return self.sigma * scipy.linalg.solve_triangular(self._factor, g, trans="T", lower=True)


def noisy_admm(X_blocks, y, X_test_blocks, y_test, lam, sigma, form="output", rounds=20, rho="auto",
               seed=0, progress=None):
    """Run ``rounds`` rounds of ADMM sharing (theta = 1/M, intercept at the label owner) with
    every party's release perturbed at level ``sigma`` (0: exact releases).

    Returns a list of dicts per round: round, objective (exact x), train_loss, test_loss,
    test_accuracy, primal_residual.
    """
    if not (np.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be a finite number >= 0; got sigma={sigma!r}")
    if form not in ("output", "paper"):
        raise ValueError(f"form={form!r}; choose 'output' or 'paper'")
    loss = get_loss("logistic")
    t, tt = loss.encode_labels(np.asarray(y)), loss.encode_labels(np.asarray(y_test))
    M, n = len(X_blocks), t.shape[0]
    pen = get_penalty("l2")
    parties = [PartyUpdate(D, pen, lam) for D in X_blocks]
    dense = [D.toarray() if sp.issparse(D) else np.asarray(D) for D in X_blocks] if form == "paper" else None
    mechs = [FactoredMechanism(sigma, m, seed=seed, form=form) if sigma > 0 else None for m in range(M)]
    central = CentralUpdate(loss, t, default_rho(loss, n) if rho == "auto" else float(rho), theta=1.0 / M)
    rows = []
    for k in range(1, rounds + 1):
        s_sum = 0.0
        for m, p in enumerate(parties):
            s = p.step(central.q, central.y, central.rho, central.alpha, central.theta)
            if mechs[m] is not None:
                s = mechs[m].release(s, round=k, kind="train",
                                     **({"D": dense[m], "x": p.x} if form == "paper" else {}))
            p.commit(s)
            s_sum = s_sum + s
        r, _ = central.step(s_sum)
        f = sum(D @ p.x for D, p in zip(X_blocks, parties)) + central.b
        ft = sum(D @ p.x for D, p in zip(X_test_blocks, parties)) + central.b
        train_loss = loss.mean(f, t)
        rows.append({"round": k, "objective": train_loss + sum(lam * p.penalty_value() for p in parties),
                     "train_loss": train_loss, "test_loss": loss.mean(ft, tt),
                     "test_accuracy": float(np.mean(loss.predict(ft) == tt)), "primal_residual": r})
        if progress is not None:
            progress(k, rows[-1])
    return rows
