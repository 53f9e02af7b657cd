"""Party-side preprocessing, fitted on the party's own (aligned) training rows and kept.

Scaling statistics are scikit-learn's (``StandardScaler``, ``MaxAbsScaler``, 1.9) computed here
with numpy in the same operations and order (:func:`standardize_stats`, :func:`maxabs_scale`;
tests/test_own_data_cache.py holds them equal to scikit-learn's): on real SuperNodes every message
is a fresh process, and importing scikit-learn cost 0.2-2 s of each own-data message. What is kept
is plain numbers (JSON), so a saved model carries them and scoring rows are transformed exactly as
training rows.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["Preprocessor", "standardize_stats", "maxabs_scale"]

_EPS = np.finfo(np.float64).eps


def _rows_needed(X) -> None:
    if X.shape[0] < 1:
        raise ValueError(f"cannot fit scaling statistics on 0 rows (shape {X.shape})")


def standardize_stats(X):
    """(mean, scale) of ``StandardScaler(with_mean=not sparse).fit(X)``: the column means (zeros
    for a sparse ``X``, which is scaled, not centred) and standard deviations, near-constant
    columns' scale 1. Dense: scikit-learn's corrected two-pass algorithm
    (``utils.extmath._incremental_mean_and_var`` on a first batch); sparse: its
    ``_csr_mean_variance_axis0`` (sums in storage order, as ``np.bincount`` adds them)."""
    _rows_needed(X)
    if sp.issparse(X):
        X = X.tocsr()
        n, d = X.shape
        data = np.asarray(X.data, dtype=np.float64)
        cols = np.asarray(X.indices, dtype=np.intp)
        nz = np.bincount(cols, minlength=d).astype(np.float64)           # stored entries per column
        mean = np.bincount(cols, weights=data, minlength=d) / float(n)
        diff = data - mean[cols]
        correction = np.bincount(cols, weights=diff, minlength=d)
        var = np.bincount(cols, weights=diff * diff, minlength=d)
        gap = float(n) - nz                                               # implicit zeros per column
        has_gap = gap != 0
        correction[has_gap] -= gap[has_gap] * mean[has_gap]
        correction = correction ** 2 / float(n)
        var[has_gap] += gap[has_gap] * mean[has_gap] ** 2
        var = (var - correction) / float(n)
        n_seen = float(n)
        out_mean = np.zeros(d)
    else:
        X = np.asarray(X, dtype=np.float64)
        n_seen = float(X.shape[0])
        total = np.sum(X, axis=0)
        mean = total / n_seen
        temp = X - mean
        correction = np.sum(temp, axis=0)
        temp **= 2
        var = (np.sum(temp, axis=0) - correction ** 2 / n_seen) / n_seen
        out_mean = mean
    constant = var <= n_seen * _EPS * var + (n_seen * mean * _EPS) ** 2
    scale = np.sqrt(var)
    scale[constant] = 1.0
    return out_mean, scale


def maxabs_scale(X):
    """``MaxAbsScaler().fit(X).scale_``: each column's largest absolute value (implicit zeros of a
    sparse ``X`` count), 1 where that is below 10 machine epsilons."""
    _rows_needed(X)
    if sp.issparse(X):
        X = X.tocsr()
        scale = np.zeros(X.shape[1])
        np.maximum.at(scale, np.asarray(X.indices, dtype=np.intp), np.abs(np.asarray(X.data, dtype=np.float64)))
    else:
        scale = np.max(np.abs(np.asarray(X, dtype=np.float64)), axis=0)
    scale[scale < 10 * _EPS] = 1.0
    return scale


class Preprocessor:
    """Scale numeric columns and one-hot encode categorical ones.

    Parameters
    ----------
    kind : {'none', 'standardize', 'maxabs'}, default='none'
        'standardize' centres and scales dense blocks (sparse blocks are only scaled, to keep
        them sparse); 'maxabs' divides by the largest absolute value.
    """

    def __init__(self, kind: str = "none"):
        if kind not in ("none", "standardize", "maxabs"):
            raise ValueError(f"preprocess={kind!r}; choose 'none', 'standardize' or 'maxabs'")
        self.kind = kind

    def fit(self, X, columns, categorical=None):
        """Learn scale statistics and categories from the training rows ``X`` (n x d)."""
        d = X.shape[1]
        self.mean_, self.scale_ = np.zeros(d), np.ones(d)
        if self.kind == "standardize" and d:
            self.mean_, self.scale_ = standardize_stats(X)
        elif self.kind == "maxabs" and d:
            self.scale_ = maxabs_scale(X)
        self.columns_ = list(columns)
        self.categories_ = {c: sorted(set(v.tolist())) for c, v in (categorical or {}).items()}
        return self

    @property
    def feature_names_(self) -> list:
        return self.columns_ + [f"{c}={v}" for c, cats in self.categories_.items() for v in cats]

    def transform(self, X, categorical=None):
        """Apply the kept statistics; unseen categories encode as all-zero columns."""
        if X.shape[1] != len(self.columns_):
            raise ValueError(f"the rows have {X.shape[1]} numeric columns but the preprocessing was fitted on "
                             f"{len(self.columns_)} ({self.columns_[:5]}...)")
        if sp.issparse(X):
            out = X.multiply(1.0 / self.scale_).tocsr() if self.kind != "none" else X.tocsr()
        else:
            out = (np.asarray(X, dtype=float) - self.mean_) / self.scale_
        if not self.categories_:
            return out
        categorical = categorical or {}
        blocks = []
        for c, cats in self.categories_.items():
            if c not in categorical:
                raise ValueError(f"categorical column {c!r} is missing from the rows to transform")
            pos = {v: j for j, v in enumerate(cats)}
            vals = categorical[c]
            rows = [i for i, v in enumerate(vals.tolist()) if v in pos]
            cols = [pos[vals[i]] for i in rows]
            blocks.append(sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(vals), len(cats))))
        if sp.issparse(out):
            return sp.hstack([out] + blocks, format="csr")
        return np.hstack([out] + [b.toarray() for b in blocks])

    def fit_transform(self, X, columns, categorical=None):
        return self.fit(X, columns, categorical).transform(X, categorical)

    # ------------------------------------------------------------- persistence
    def to_dict(self) -> dict:
        return {"kind": self.kind, "columns": self.columns_, "mean": self.mean_.tolist(),
                "scale": self.scale_.tolist(), "categories": self.categories_}

    @classmethod
    def from_dict(cls, d: dict) -> "Preprocessor":
        p = cls(d["kind"])
        p.columns_ = list(d["columns"])
        p.mean_, p.scale_ = np.asarray(d["mean"], dtype=float), np.asarray(d["scale"], dtype=float)
        p.categories_ = {k: list(v) for k, v in d["categories"].items()}
        return p
