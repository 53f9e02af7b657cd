"""Write a dataset as party files with IDs (the bundled demos, tests and benchmarks).

Only writers: which datasets are bundled and how they are read is :mod:`flower_vfl.io.data`
(which uses :func:`write_table` for its cached breast_cancer CSV, and whose
:func:`~flower_vfl.io.data.write_bundled` writes a bundled dataset with :func:`write_party_files`).

The label owner's file holds the ID, the label and its own columns; each other party's file
holds the ID and its columns. Rows can be shuffled per file, a fraction dropped at one party
and extra rows (IDs nobody else has) added at another: what real exports look like.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

__all__ = ["write_party_files", "write_table"]

_SUFFIX = {"csv": ".csv", "parquet": ".parquet", "libsvm": ".svm"}


def write_table(path, ids, X, columns, fmt: str, y=None, id_column="id", label_column="label"):
    """One file: CSV / Parquet via pyarrow (ID, [label], columns), LIBSVM via scikit-learn
    (with the IDs in the sidecar ``<path>.ids``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "libsvm":
        from sklearn.datasets import dump_svmlight_file
        dump_svmlight_file(sp.csr_matrix(X), np.zeros(X.shape[0]) if y is None else np.asarray(y, float),
                           str(path), zero_based=False)
        Path(str(path) + ".ids").write_text("\n".join(str(i) for i in ids) + "\n", encoding="utf-8")
        return path
    import pyarrow as pa
    Xd = X.toarray() if sp.issparse(X) else np.asarray(X)
    cols = {id_column: pa.array([str(i) for i in ids])}
    if y is not None:
        cols[label_column] = pa.array(np.asarray(y))
    for j, c in enumerate(columns):
        cols[c] = pa.array(Xd[:, j])
    table = pa.table(cols)
    if fmt == "csv":
        from pyarrow import csv
        csv.write_csv(table, str(path))
    elif fmt == "parquet":
        import pyarrow.parquet as pq
        pq.write_table(table, str(path))
    else:
        raise ValueError(f"fmt={fmt!r}; choose csv, parquet or libsvm")
    return path


def write_party_files(X, y, ids, ranges, out_dir, fmt="csv", seed=0, missing=None, extra=None,
                      prefix="train", extra_ids_start=10_000_000):
    """Write the label owner's file (party 0: labels + columns ``ranges[0]``) and one file per
    other party; returns the list of paths (index = party).

    ``missing`` = {party: fraction of rows dropped}; ``extra`` = {party: number of extra rows
    with fresh IDs}. Each file's rows are shuffled with its own seed. Column names are
    ``f1 .. fd`` (global, 1-based), so a LIBSVM file's local columns are its own 1..d_m.
    """
    X = X.tocsr() if sp.issparse(X) else np.asarray(X)
    ids = np.asarray([str(i) for i in ids])
    rng = np.random.default_rng(seed)
    paths = []
    for m, (a, b) in enumerate(ranges):
        rows = np.arange(X.shape[0])
        if missing and m in missing:
            rows = np.sort(rng.choice(rows, int(round((1 - missing[m]) * rows.size)), replace=False))
        blk, pid = X[rows][:, a:b], ids[rows]
        lab = None if m else np.asarray(y)[rows]
        if extra and m in extra:
            k = int(extra[m])
            fake = rng.standard_normal((k, b - a)).round(3) if not sp.issparse(X) else \
                sp.random(k, b - a, density=0.1, random_state=seed + m, format="csr")
            blk = sp.vstack([blk, fake], format="csr") if sp.issparse(blk) else np.vstack([blk, fake])
            pid = np.concatenate([pid, [str(extra_ids_start + i) for i in range(k)]])
            if lab is not None:
                lab = np.concatenate([lab, rng.choice(np.unique(y), k)])
        perm = rng.permutation(blk.shape[0])
        cols = [f"f{j + 1}" for j in range(a, b)]
        path = Path(out_dir) / f"{prefix}-party{m}{_SUFFIX[fmt]}"
        write_table(path, pid[perm], blk[perm], cols, fmt, y=None if lab is None else lab[perm])
        paths.append(path)
    return paths
