"""Audit of eq. (20): does any neighbouring dataset move f_p'(z) further (in L1) than the
sensitivity the noise was calibrated to?

Eq. (11b) defines the sensitivity over datasets "differing in a single entry" (11c);
eq. (20) evaluates it as max over the agent's *own* samples of ||x_i (h_i - y_i)^T||_1 / I.
Three neighbour families are audited here at a given z:

- ``remove``: drop one own sample (I kept fixed, as in eq. 2c). The change is exactly that
  sample's term, so eq. (20) is attained and never exceeded.
- ``random``: replace one own sample by a sample drawn from ``pool`` (other data).
- ``label_flip``: replace sample i by (x_i, y') with the label y' that maximizes the change;
  the change is 2 ||x_i||_1 / I (h_i cancels), which exceeds eq. (20) whenever
  h_{i, y_i} > 0 for the maximizing sample, i.e. always for a softmax model.

The data-independent 'replace' bound 4 * max||x||_1 / I (admm.laplace_scale) covers all three.
"""

from __future__ import annotations

import numpy as np

from flower_vfl.horizontal.model import one_hot, softmax

__all__ = ["audit_sensitivity"]


def audit_sensitivity(z, X, y, I: int, K: int, pool_X=None, pool_y=None, n_random: int = 200,
                      rng: np.random.Generator | None = None) -> dict:
    """Largest L1 change of f_p'(z) (the data term; the regularizer does not depend on data)
    per neighbour family, next to eq. (20)'s value. Uses each neighbour's full gradient
    difference computed directly (not the closed forms above), so it checks them too."""
    X, y = np.asarray(X, float), np.asarray(y)
    g_full = X.T @ (softmax(X @ z) - one_hot(y, K)) / I
    l1 = np.abs(X).sum(1) * np.abs(softmax(X @ z) - one_hot(y, K)).sum(1) / I
    eq20 = float(l1.max())
    out = {"eq20": eq20}
    # remove each sample (recompute the full gradient without it)
    worst = 0.0
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        g = X[keep].T @ (softmax(X[keep] @ z) - one_hot(y[keep], K)) / I
        worst = max(worst, float(np.abs(g - g_full).sum()))
    out["remove"] = worst
    # label flip of every sample to every other label
    worst = 0.0
    for i in range(len(y)):
        for k in range(K):
            if k == y[i]:
                continue
            y2 = y.copy()
            y2[i] = k
            g = X.T @ (softmax(X @ z) - one_hot(y2, K)) / I
            worst = max(worst, float(np.abs(g - g_full).sum()))
    out["label_flip"] = worst
    if pool_X is not None:
        rng = rng or np.random.default_rng(0)
        worst = 0.0
        for _ in range(int(n_random)):
            i, j = rng.integers(len(y)), rng.integers(len(pool_y))
            X2, y2 = X.copy(), y.copy()
            X2[i], y2[i] = pool_X[j], pool_y[j]
            g = X2.T @ (softmax(X2 @ z) - one_hot(y2, K)) / I
            worst = max(worst, float(np.abs(g - g_full).sum()))
        out["random"] = worst
    return out
