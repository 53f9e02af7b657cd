"""Party-side preprocessing, fitted on the party's own (aligned) training rows and kept.

Scaling statistics come from scikit-learn's scalers; what is kept is plain numbers (JSON),
so a saved model carries them and scoring rows are transformed exactly as training rows.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["Preprocessor"]


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
        from sklearn.preprocessing import MaxAbsScaler, StandardScaler
        d = X.shape[1]
        self.mean_, self.scale_ = np.zeros(d), np.ones(d)
        if self.kind == "standardize" and d:
            sc = StandardScaler(with_mean=not sp.issparse(X)).fit(X)
            self.mean_ = np.zeros(d) if sc.mean_ is None or sp.issparse(X) else sc.mean_.copy()
            self.scale_ = sc.scale_.copy()
        elif self.kind == "maxabs" and d:
            self.scale_ = MaxAbsScaler().fit(X).scale_.copy()
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
