"""Datasets and vertical splits. A party loads only its own columns; the server only labels."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

__all__ = ["DATASETS", "default_data_dir", "column_ranges", "party_block", "labels", "load_all"]

DATASETS = ("breast_cancer", "a9a")
#: the paper's a9a split: party 1 = features 1-66, party 2 = 67-123
A9A_PAPER_SPLIT = [(0, 66), (66, 123)]


def default_data_dir(name: str) -> Path:
    """``../shared/data/<name>`` beside the repository (or the current directory)."""
    here = Path(__file__).resolve().parents[2] / "shared" / "data" / name
    return here if here.exists() else Path.cwd().parent / "shared" / "data" / name


def _check_name(name):
    if name not in DATASETS:
        raise ValueError(f"dataset={name!r} is not bundled; choose one of {DATASETS}")


def column_ranges(name: str, n_features: int, num_parties: int):
    """Contiguous column blocks: the paper split for a9a with 2 parties, else even splits."""
    if num_parties < 1 or num_parties > n_features:
        raise ValueError(f"num-parties={num_parties} must be between 1 and the {n_features} features")
    if name == "a9a" and num_parties == 2:
        return list(A9A_PAPER_SPLIT)
    edges = np.linspace(0, n_features, num_parties + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


@lru_cache(maxsize=4)
def load_all(name: str, data_dir: str | None = None):
    """(X_train, y_train, X_test, y_test); labels in {-1, +1}."""
    _check_name(name)
    if name == "breast_cancer":
        from sklearn.datasets import load_breast_cancer
        from sklearn.model_selection import train_test_split
        from sklearn.preprocessing import StandardScaler

        X, y = load_breast_cancer(return_X_y=True)
        y = np.where(y == 1, 1.0, -1.0)
        X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
        scaler = StandardScaler().fit(X_tr)
        return scaler.transform(X_tr), y_tr, scaler.transform(X_te), y_te
    from sklearn.datasets import load_svmlight_file

    d = Path(data_dir) if data_dir else default_data_dir("a9a")
    paths = [d / "a9a", d / "a9a.t"]
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(
                f"a9a data file not found: {p}. Set the node-config / run-config key "
                "data-dir to the folder holding a9a and a9a.t")
    X, y = load_svmlight_file(str(paths[0]), n_features=123)
    Xt, yt = load_svmlight_file(str(paths[1]), n_features=123)
    return X.tocsc(), y, Xt.tocsc(), yt


@lru_cache(maxsize=8)
def party_block(name, party: int, num_parties: int, data_dir=None):
    """(D_train, D_test) of one party: only its columns. Cached: a simulation actor serves many
    messages from one process and re-slicing was ~25 % of a party's handler time
    (docs/benchmarks.md). The blocks are shared; callers must not modify them in place."""
    X, _, Xt, _ = load_all(name, None if data_dir in (None, "") else str(data_dir))
    ranges = column_ranges(name, X.shape[1], num_parties)
    if not 0 <= party < num_parties:
        raise ValueError(f"partition-id={party} is outside 0..{num_parties - 1}")
    a, b = ranges[party]
    blk = lambda M: M[:, a:b].tocsr() if hasattr(M, "tocsr") else np.ascontiguousarray(M[:, a:b])  # noqa: E731
    return blk(X), blk(Xt)


def labels(name, data_dir=None):
    """(y_train, y_test): what the label owner (the central node) loads."""
    _, y, _, yt = load_all(name, None if data_dir in (None, "") else str(data_dir))
    return y, yt
