"""Centralized and local-only L2 logistic regression with scikit-learn at the project's lam.

The project's objective (docs/math.md §1) is

    (1/N) sum_i log(1 + exp(-y_i f_i)) + lam/2 ||w||^2,     f = X w + b (b unpenalized),

scikit-learn's ``LogisticRegression(penalty='l2', C=C)`` minimizes

    C sum_i log(1 + exp(-y_i f_i)) + 1/2 ||w||^2

(the intercept is not penalized by the lbfgs solver). Dividing the latter by C N gives the
former with lam = 1 / (C N), hence C = 1 / (lam N) (:func:`lam_to_C`).
"""

from __future__ import annotations

import numbers

import numpy as np
import scipy.sparse as sp
from scipy.special import log_expit
from sklearn.linear_model import LogisticRegression

__all__ = ["lam_to_C", "C_to_lam", "logreg_objective", "centralized_logreg", "local_only_logreg",
           "stack_blocks"]


def lam_to_C(lam, n_samples):
    """scikit-learn's C for the project's lam: C = 1 / (lam N)."""
    if isinstance(lam, bool) or not isinstance(lam, numbers.Real) or not (np.isfinite(lam) and lam > 0):
        raise ValueError(f"lam must be a finite number > 0 (sklearn's C = 1/(lam N) is infinite at "
                         f"lam = 0; use penalty=None for that); got lam={lam!r}")
    if isinstance(n_samples, bool) or not isinstance(n_samples, numbers.Integral) or n_samples < 1:
        raise ValueError(f"n_samples must be an integer >= 1; got n_samples={n_samples!r}")
    return 1.0 / (float(lam) * int(n_samples))


def C_to_lam(C, n_samples):
    """The inverse of :func:`lam_to_C`: lam = 1 / (C N)."""
    if isinstance(C, bool) or not isinstance(C, numbers.Real) or not (np.isfinite(C) and C > 0):
        raise ValueError(f"C must be a finite number > 0; got C={C!r}")
    return lam_to_C(C, n_samples)      # 1/(C N): the same map, (lam, C) swapped


def logreg_objective(X, y, w, b, lam):
    """(1/N) sum log(1 + exp(-y f)) + lam/2 ||w||^2 for labels y in {-1, +1}."""
    f = X @ np.asarray(w, dtype=float) + b
    return float(np.mean(-log_expit(np.asarray(y) * f)) + 0.5 * lam * float(np.dot(w, w)))


def _fit(X, y, lam, tol, max_iter):
    y = np.asarray(y)
    labels = np.unique(y)
    if not np.array_equal(labels, [-1.0, 1.0]):
        raise ValueError(f"y must hold the two labels -1 and +1; got labels {labels[:5].tolist()}")
    model = LogisticRegression(C=lam_to_C(lam, y.shape[0]), tol=tol, max_iter=max_iter)
    return model.fit(X, y)


def centralized_logreg(X_blocks, y, lam, tol=1e-10, max_iter=10000):
    """sklearn LogisticRegression on all parties' columns (what no party could do alone).

    Returns the fitted estimator; its ``decision_function`` takes the concatenated blocks
    (use :func:`stack_blocks`)."""
    return _fit(stack_blocks(X_blocks), y, lam, tol, max_iter)


def local_only_logreg(X_block, y, lam, tol=1e-10, max_iter=10000):
    """sklearn LogisticRegression on one party's own columns (party 1 alone in Fig. 3)."""
    return _fit(X_block, y, lam, tol, max_iter)


def stack_blocks(X_blocks):
    """Columns of all blocks side by side (sparse if any block is)."""
    if any(sp.issparse(B) for B in X_blocks):
        return sp.hstack([sp.csr_matrix(B) for B in X_blocks]).tocsr()
    return np.hstack([np.asarray(B, dtype=float) for B in X_blocks])
