"""Datasets and vertical splits. A party loads only its own columns; the server only labels."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

__all__ = ["DATASETS", "default_data_dir", "column_ranges", "party_block", "labels", "load_all", "write_bundled"]

DATASETS = ("breast_cancer", "a9a")
#: the paper's a9a split: party 1 = features 1-66, party 2 = 67-123
A9A_PAPER_SPLIT = [(0, 66), (66, 123)]


def default_data_dir(name: str) -> Path:
    """``shared/data/<name>`` beside the repository (``<repo>/../shared``), else ``../shared/data/<name>``
    from the working folder (an installed package has no repository beside it)."""
    here = Path(__file__).resolve().parents[3] / "shared" / "data" / name
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
    return _load_uncached(name, data_dir)


def _load_uncached(name, data_dir=None):
    """:func:`load_all` without its cache."""
    _check_name(name)
    if name == "breast_cancer":
        from flower_vfl.io import Preprocessor
        t = _read_bundled("breast_cancer")              # a file with IDs, read like a party's export
        X, y = t.X, np.where(t.y == 1, 1.0, -1.0)
        tr, te = _bundled_split(y)
        X_tr, X_te, y_tr, y_te = X[tr], X[te], y[tr], y[te]
        scaler = Preprocessor("standardize").fit(X_tr, t.columns)   # fitted on the training rows
        return scaler.transform(X_tr), y_tr, scaler.transform(X_te), y_te

    paths = source_files("a9a", data_dir)
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(
                f"a9a data file not found: {p}. Set the node-config / run-config key "
                "data-dir to the folder holding a9a and a9a.t")
    tr, te = (_read_bundled("a9a", p) for p in paths)     # LIBSVM + sidecar IDs, as a party's export
    return tr.X.tocsc(), tr.y.astype(float), te.X.tocsc(), te.y.astype(float)


def _bundled_split(y):
    """breast_cancer's train / test rows: scikit-learn's stratified ``train_test_split`` (test 25 %,
    random_state 0), computed once and kept beside the bundled CSV (``breast_cancer.split.npz``,
    checked against the labels), so that the processes of a run (the ServerApp, one ClientApp per
    party) do not each import scikit-learn for it: ~0.7-1.3 s of a process's start-up (issue 24,
    item 5)."""
    path = bundled_cache_dir() / "breast_cancer.split.npz"
    if path.is_file():
        try:
            with np.load(path) as f:
                tr, te, ys = f["train"], f["test"], f["y"]
            if np.array_equal(ys, y) and tr.size + te.size == y.size:
                return tr, te
        except (OSError, KeyError, ValueError):
            pass                                        # unreadable or stale: computed again
    from sklearn.model_selection import train_test_split

    from flower_vfl.io.checkpoint import atomic_write
    tr, te = train_test_split(np.arange(y.size), test_size=0.25, random_state=0, stratify=y)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda fh: np.savez(fh, train=tr, test=te, y=y))   # concurrent readers: a whole file
    return tr, te


def source_files(name: str, data_dir=None) -> list[Path]:
    """The files a bundled dataset is parsed from (they may not exist: breast_cancer's CSV is
    written on first use; a9a's must be in ``data_dir``)."""
    _check_name(name)
    if name == "breast_cancer":
        return [bundled_cache_dir() / "breast_cancer.csv"]
    d = Path(data_dir) if data_dir else default_data_dir("a9a")
    return [d / "a9a", d / "a9a.t"]


def bundled_cache_dir() -> Path:
    """Where the bundled datasets' files with IDs are written (``$FLOWER_VFL_CACHE``)."""
    import os
    return Path(os.environ.get("FLOWER_VFL_CACHE", Path.home() / ".cache" / "flower-vfl" / "bundled"))


def _read_bundled(name, libsvm_path=None):
    """The bundled dataset through :func:`flower_vfl.io.read_party`: breast_cancer as a CSV with
    IDs 0..N-1 (written once by :func:`flower_vfl.io.bundled.write_table`), a9a's LIBSVM files
    with a sidecar of row-number IDs."""
    import os
    import tempfile

    from flower_vfl.io import read_party, source_from_config
    from flower_vfl.io.bundled import write_table
    cache = bundled_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    if name == "breast_cancer":
        path = source_files("breast_cancer")[0]
        if not path.is_file():
            from sklearn.datasets import load_breast_cancer
            d = load_breast_cancer()
            cols = [c.replace(" ", "_") for c in d.feature_names]
            fd, tmp = tempfile.mkstemp(suffix=".csv", dir=cache)
            os.close(fd)
            write_table(tmp, range(d.data.shape[0]), d.data, cols, "csv", y=d.target)
            os.replace(tmp, path)                   # atomic: concurrent readers see a whole file
        return read_party(source_from_config({"data-path": str(path), "label-column": "label"}))
    ids = cache / f"{Path(libsvm_path).name}.{os.stat(libsvm_path).st_size}.ids"
    if not ids.is_file():
        with open(libsvm_path, "rb") as fh:
            n = sum(1 for line in fh if line.strip())
        from flower_vfl.io.checkpoint import atomic_write
        text = ("\n".join(str(i) for i in range(n)) + "\n").encode()
        atomic_write(ids, lambda fh: fh.write(text))     # concurrent readers see a whole file
    return read_party(source_from_config({"data-path": str(libsvm_path), "format": "libsvm", "id-path": str(ids),
                                          "n-features": 123, "label-column": "label"}))


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
    """(y_train, y_test): what the label owner (the central node) loads. a9a's are parsed from its
    LIBSVM files once and kept in the bundled cache (:func:`_cached_labels`)."""
    data_dir = None if data_dir in (None, "") else str(data_dir)
    if name == "a9a":
        return _cached_labels(name, data_dir)
    _, y, _, yt = load_all(name, data_dir)
    return y, yt


def _cached_labels(name, data_dir):
    """a9a's (y_train, y_test) from ``<bundled cache>/<name>.labels.<key>.npz``, the key a hash of
    both files' resolved paths, sizes and modification times (a changed file is parsed again);
    written on the first parse, which is :func:`load_all`'s. The label owner needs only the labels:
    the parse (scikit-learn's LIBSVM reader, whose import is ~1.3-3 s of a ServerApp's start and
    pulls scipy.stats) and the whole X (~4 GB at 10M rows, kept by ``load_all``'s cache) are paid
    once per file, not by every run's ServerApp (issue 24, items 1, 4 and 5)."""
    import hashlib
    paths = source_files(name, data_dir)
    try:
        stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in paths]
    except OSError:
        stats = None                                   # missing: load_all names the file and the key
    path = None
    if stats is not None:
        key = hashlib.sha256(repr(stats).encode()).hexdigest()[:16]
        path = bundled_cache_dir() / f"{name}.labels.{key}.npz"
        if path.is_file():
            try:
                with np.load(path) as f:
                    return f["train"], f["test"]
            except (OSError, KeyError, ValueError):
                pass                                   # unreadable: parsed again, written again
    X, y, Xt, yt = _load_uncached(name, data_dir)
    del X, Xt
    if path is not None:
        from flower_vfl.io.checkpoint import atomic_write
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, lambda fh: np.savez(fh, train=y, test=yt))   # concurrent readers: a whole file
        except OSError:
            pass                                       # a read-only cache: parsed every run, as before
    return y, yt


def write_bundled(name: str, out_dir, num_parties: int = 2, fmt: str = "csv", data_dir=None):
    """The bundled dataset (``a9a`` or ``breast_cancer``) as party files with IDs ``0..N-1``
    (train) and ``t0..`` (test), split by :func:`column_ranges`."""
    from flower_vfl.io.bundled import write_party_files
    X, y, Xt, yt = load_all(name, data_dir)
    ranges = column_ranges(name, X.shape[1], num_parties)
    tr = write_party_files(X, y, range(X.shape[0]), ranges, out_dir, fmt, prefix="train")
    te = write_party_files(Xt, yt, [f"t{i}" for i in range(Xt.shape[0])], ranges, out_dir, fmt, seed=1,
                           prefix="test")
    return tr, te
