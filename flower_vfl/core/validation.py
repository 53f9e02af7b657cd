"""Input checks shared by the in-process engine and the Flower apps (errors name the fix)."""

from __future__ import annotations

import numbers

import numpy as np
import scipy.sparse as sp

__all__ = ["check_block", "check_blocks", "check_params"]


def check_block(D, name="block"):
    """Return D as a float ndarray or CSR matrix; reject empty, non-2-D and non-finite blocks."""
    if sp.issparse(D):
        D = sp.csr_matrix(D, dtype=float)
        data = D.data
    else:
        D = np.asarray(D, dtype=float)
        if D.ndim == 1:
            raise ValueError(f"{name} must be 2-D (N x d_m); got a 1-D array. Use x.reshape(-1, 1) "
                             "for a single feature.")
        if D.ndim != 2:
            raise ValueError(f"{name} must be 2-D (N x d_m); got shape {D.shape}")
        data = D
    if D.shape[0] == 0 or D.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {D.shape}); every party needs at least one row "
                         "and one column")
    if not np.all(np.isfinite(data)):
        bad = int(np.size(data) - np.count_nonzero(np.isfinite(data)))
        raise ValueError(f"{name} contains {bad} NaN or inf value(s); impute or drop them first")
    return D


def check_blocks(X_blocks, n_rows=None):
    if isinstance(X_blocks, np.ndarray) or sp.issparse(X_blocks):
        raise TypeError("X_blocks must be a list of per-party arrays (one N x d_m block per party), "
                        "not a single matrix; split the columns, e.g. [X[:, :66], X[:, 66:]]")
    blocks = [check_block(D, f"X_blocks[{m}]") for m, D in enumerate(X_blocks)]
    if not blocks:
        raise ValueError("X_blocks is empty; pass at least one party block")
    rows = [D.shape[0] for D in blocks]
    if len(set(rows)) != 1:
        raise ValueError(f"all blocks must have the same rows (aligned samples); got row counts "
                         f"{rows}. Align the parties on a common sample ID first")
    if n_rows is not None and rows[0] != n_rows:
        raise ValueError(f"blocks have {rows[0]} rows but y has {n_rows}; they must be aligned")
    return blocks


def check_params(lam, rho, alpha, theta, max_rounds, tol):
    if not isinstance(lam, numbers.Real) or not np.isfinite(lam) or lam < 0:
        raise ValueError(f"lam must be a finite number >= 0; got lam={lam!r}")
    if rho is not None and rho != "auto":
        if not isinstance(rho, numbers.Real) or not np.isfinite(rho) or rho <= 0:
            raise ValueError(f"rho must be > 0 (or 'auto' for the default); got rho={rho!r}")
    if not isinstance(alpha, numbers.Real) or not 0 < alpha < 2:
        raise ValueError(f"alpha (over-relaxation) must be in (0, 2); got alpha={alpha!r}")
    if not isinstance(theta, numbers.Real) or not 0 < theta <= 1:
        raise ValueError(f"theta must be in (0, 1]; got theta={theta!r}")
    if not isinstance(max_rounds, numbers.Integral) or max_rounds < 1:
        raise ValueError(f"max_rounds must be an integer >= 1; got max_rounds={max_rounds!r}")
    if not isinstance(tol, numbers.Real) or tol < 0:
        raise ValueError(f"tol must be >= 0; got tol={tol!r}")
