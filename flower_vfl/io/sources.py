"""Read a party's own file (CSV, Parquet, LIBSVM/svmlight) with an ID column.

Configured by the node-config keys below (a SuperNode's ``--node-config``), so an institution
points its node at an export without writing code:

=================  ==========================================================================
``data-path``      the training file (``.csv``, ``.parquet``/``.pq``, ``.svm``/``.libsvm``/
                   ``.txt`` or no extension = LIBSVM)
``test-path``      held-out rows scored in the evaluation rounds during training
``score-path``     new rows to score in a ``mode=predict`` run (default: ``test-path``)
``format``         ``auto`` (from the extension), ``csv``, ``parquet`` or ``libsvm``
``id-column``      the column holding the sample ID (default ``id``)
``id-path``        LIBSVM only: a sidecar file with one ID per line (default ``<file>.ids``)
``columns``        comma-separated column names to use (default: every column but the ID and
                   the label); LIBSVM columns are named ``f1 .. fd`` (1-based)
``label-column``   the label owner's label column (a party whose file holds the run's label
                   column without being the label owner is refused)
``categorical``    comma-separated columns to one-hot encode (categories from training rows)
``preprocess``     ``none``, ``standardize`` or ``maxabs`` (fitted on the party's training rows)
``n-features``     LIBSVM only: the number of columns (default: the largest index in the file)
``sparse``         keep a CSR matrix (default: LIBSVM sparse, CSV/Parquet dense)
=================  ==========================================================================

Every error names the file, the key and the fix (:class:`DataError`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from flower_vfl.errors import UserError

__all__ = ["DataError", "SourceConfig", "PartyTable", "source_from_config", "read_party", "align_rows",
           "FORMATS", "SPLITS"]

FORMATS = ("csv", "parquet", "libsvm")
#: split -> the node-config key naming its file
SPLITS = {"train": "data-path", "test": "test-path", "score": "score-path"}
_EXT = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".svm": "libsvm", ".libsvm": "libsvm",
        ".svmlight": "libsvm", ".txt": "libsvm", ".t": "libsvm", "": "libsvm"}


class DataError(UserError, ValueError):
    """Bad party data: the message names the file, the config key and the fix."""


def _split(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value if str(v).strip()]
    return [v.strip() for v in str(value).replace(";", ",").split(",") if v.strip()]


def _truthy(value) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class SourceConfig:
    """Where and how one party reads its rows (see the module docstring for the keys)."""

    path: str
    format: str = "auto"
    id_column: str = "id"
    id_path: str = ""
    columns: tuple = ()
    label_column: str = ""
    categorical: tuple = ()
    preprocess: str = "none"
    n_features: int = 0
    sparse: str = "auto"
    #: the run's label column: refused in a party's file unless this node is the label owner
    forbidden_label: str = ""
    #: the label owner's labels file: read the IDs and labels only
    labels_only: bool = False
    #: scoring rows: the label column may be absent (it is never a feature)
    label_optional: bool = False

    def resolved_format(self) -> str:
        if self.format != "auto":
            if self.format not in FORMATS:
                raise DataError(f"format={self.format!r} for {self.path} is not supported; set the "
                                f"node-config key format to one of {('auto',) + FORMATS}")
            return self.format
        suffix = Path(self.path).suffix.lower()
        if suffix not in _EXT:
            raise DataError(f"cannot tell the format of {self.path} from its extension {suffix!r}; set the "
                            f"node-config key format to one of {FORMATS}")
        return _EXT[suffix]


def source_from_config(cfg: dict, split: str = "train", forbidden_label: str = "") -> SourceConfig:
    """A :class:`SourceConfig` from node-config keys; ``split`` is 'train', 'test' or 'score'."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}; choose one of {tuple(SPLITS)}")
    key = SPLITS[split]
    if split == "score" and not cfg.get(key):
        key = "test-path"     # a party's held-out file doubles as its scoring file
    path = str(cfg.get(key, "") or "")
    if not path:
        raise DataError(f"the node-config key {key} is empty; set it to the party's "
                        f"{'training' if split == 'train' else 'scoring'} file (CSV, Parquet or LIBSVM)")
    preprocess = str(cfg.get("preprocess", "none") or "none")
    if preprocess not in ("none", "standardize", "maxabs"):
        raise DataError(f"preprocess={preprocess!r} (node config of {path}) is not supported; use none, "
                        "standardize or maxabs")
    sparse = str(cfg.get("sparse", "auto")).lower()
    return SourceConfig(path=path, format=str(cfg.get("format", "auto") or "auto"),
                        id_column=str(cfg.get("id-column", "id") or "id"),
                        id_path=str(cfg.get("id-path", "") or ""),
                        columns=tuple(_split(cfg.get("columns"))),
                        label_column=str(cfg.get("label-column", "") or ""),
                        categorical=tuple(_split(cfg.get("categorical"))), preprocess=preprocess,
                        n_features=int(cfg.get("n-features", 0) or 0),
                        sparse="auto" if sparse == "auto" else str(_truthy(sparse)).lower(),
                        forbidden_label=str(forbidden_label or ""))


@dataclass
class PartyTable:
    """A party's rows as read from its file, before alignment and preprocessing."""

    path: str
    ids: np.ndarray                     # (n,) str
    X: object                           # (n, d) float ndarray or CSR
    columns: list                       # d names
    y: np.ndarray | None = None         # label owner only
    categorical: dict = field(default_factory=dict)   # name -> (n,) str values (not yet encoded)

    @property
    def n_rows(self) -> int:
        return int(self.ids.shape[0])


# --------------------------------------------------------------------------- readers
def _read_arrow(src: SourceConfig, fmt: str):
    import pyarrow as pa
    if fmt == "csv":
        from pyarrow import csv
        opts = csv.ConvertOptions(column_types={src.id_column: pa.string()},
                                  strings_can_be_null=True)
        try:
            return csv.read_csv(src.path, convert_options=opts)
        except pa.ArrowInvalid as exc:
            raise DataError(f"{src.path} is not a readable CSV file ({exc}); export it with a header row "
                            "and one row per sample") from None
    import pyarrow.parquet as pq
    try:
        return pq.read_table(src.path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"{src.path} is not a readable Parquet file ({exc})") from None


def _ids_from(values, src: SourceConfig, where: str) -> np.ndarray:
    ids = np.array(["" if v is None else str(v).strip() for v in values], dtype=object)
    empty = int(np.sum(ids == ""))
    if empty:
        raise DataError(f"{where}: {empty} row(s) have no ID in column {src.id_column!r}; every row needs "
                        "an ID (drop those rows or fill the IDs)")
    uniq, counts = np.unique(ids.astype(str), return_counts=True)
    dup = counts > 1
    if np.any(dup):
        ex = ", ".join(repr(str(u)) for u in uniq[dup][:3])
        raise DataError(f"{where}: {int(np.sum(counts[dup] - 1))} duplicated ID(s) in column "
                        f"{src.id_column!r} ({int(np.sum(dup))} distinct, e.g. {ex}); each sample must "
                        "appear once: deduplicate the export")
    return ids.astype(str)


def _numeric_column(col, name, src: SourceConfig) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc
    where = f"{src.path}, column {name!r}"
    if pa.types.is_boolean(col.type):
        col = pc.cast(col, pa.int8())
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        vals = col.to_pylist()
        bad = next(((i, v) for i, v in enumerate(vals) if v is not None and not _is_number(v)), None)
        if bad is not None:
            raise DataError(f"{where}: row {bad[0] + 1} holds the non-numeric value {bad[1]!r}; fix the value, "
                            "drop the column from the node-config key columns, or list it in categorical")
        col = pa.array([None if v is None else float(v) for v in vals], type=pa.float64())
    x = np.asarray(col.to_numpy(zero_copy_only=False), dtype=float)
    nan = int(np.sum(~np.isfinite(x)))
    if nan:
        raise DataError(f"{where}: {nan} missing/NaN/inf value(s); impute or drop them in the export "
                        "(the party's rows must be complete)")
    return x


def _is_number(v) -> bool:
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


def _read_table(src: SourceConfig, fmt: str) -> PartyTable:
    table = _read_arrow(src, fmt)
    names = list(table.column_names)
    if src.id_column not in names:
        raise DataError(f"{src.path} has no ID column {src.id_column!r} (columns: {names[:8]}"
                        f"{'...' if len(names) > 8 else ''}); set the node-config key id-column to the "
                        "column holding the sample IDs")
    if src.forbidden_label and src.forbidden_label in names and not src.label_column:
        raise DataError(f"{src.path} holds the label column {src.forbidden_label!r} but this node is not the "
                        "label owner; drop that column from the party's export (only the label owner "
                        "holds labels), or set label-column in this node's config if it is the label owner")
    ids = _ids_from(table.column(src.id_column).to_pylist(), src, src.path)
    y = None
    if src.label_column and src.label_column in names or (src.label_column and not src.label_optional):
        if src.label_column not in names:
            raise DataError(f"{src.path} has no label column {src.label_column!r} (columns: {names[:8]}); set "
                            "label-column to the column holding the labels")
        y = np.asarray(table.column(src.label_column).to_pylist(), dtype=object)
        if any(v is None for v in y):
            raise DataError(f"{src.path}: {sum(v is None for v in y)} row(s) have no label in column "
                            f"{src.label_column!r}; drop them or fill the labels")
        y = _labels_array(y)
    skip = {src.id_column, src.label_column}
    wanted = [] if src.labels_only else (list(src.columns) or [c for c in names if c not in skip])
    missing = [c for c in wanted + ([] if src.labels_only else list(src.categorical)) if c not in names]
    if missing:
        raise DataError(f"{src.path} has no column(s) {missing}; fix the node-config key columns/categorical "
                        f"(available: {names[:12]}{'...' if len(names) > 12 else ''})")
    cat = {c: np.array(["" if v is None else str(v) for v in table.column(c).to_pylist()])
           for c in src.categorical if not src.labels_only}
    numeric = [c for c in wanted if c not in cat]
    X = np.column_stack([_numeric_column(table.column(c), c, src) for c in numeric]) if numeric \
        else np.zeros((len(ids), 0))
    if src.sparse == "true":
        X = sp.csr_matrix(X)
    return PartyTable(src.path, ids, X, numeric, y, cat)


def _labels_array(y):
    try:
        f = np.asarray([float(v) for v in y])
        return f.astype(np.int64) if np.all(f == np.round(f)) and np.all(np.abs(f) < 2**53) else f
    except (TypeError, ValueError):
        return np.asarray([str(v) for v in y])


def _read_libsvm(src: SourceConfig) -> PartyTable:
    from sklearn.datasets import load_svmlight_file
    if src.categorical:
        raise DataError(f"categorical={list(src.categorical)} for the LIBSVM file {src.path}: LIBSVM columns are "
                        "numeric; one-hot them in the export or use CSV/Parquet")
    try:
        X, y = load_svmlight_file(src.path, n_features=src.n_features or None, dtype=np.float64)
    except ValueError as exc:
        raise DataError(f"{src.path} is not a valid LIBSVM/svmlight file ({exc}); set n-features if "
                        "the party's last columns are all zero") from None
    id_path = src.id_path or src.path + ".ids"
    if not Path(id_path).is_file():
        raise DataError(f"the sidecar ID file {id_path} of {src.path} does not exist; write one ID per line "
                        "(in row order) there or set the node-config key id-path")
    with open(id_path, encoding="utf-8") as fh:
        raw = fh.read().splitlines()
    if raw and raw[0].strip() == src.id_column:      # an optional header line
        raw = raw[1:]
    if len(raw) != X.shape[0]:
        raise DataError(f"{id_path} holds {len(raw)} IDs but {src.path} has {X.shape[0]} rows; write one ID "
                        "per row, in the same order")
    ids = _ids_from(raw, src, id_path)
    X = X.tocsr()
    if X.data.size and not np.all(np.isfinite(X.data)):
        raise DataError(f"{src.path}: {int(np.sum(~np.isfinite(X.data)))} NaN/inf value(s); fix the export")
    names = [f"f{j + 1}" for j in range(X.shape[1])]
    if src.columns:
        missing = [c for c in src.columns if c not in names]
        if missing:
            raise DataError(f"{src.path} has no column(s) {missing} (LIBSVM columns are f1..f{X.shape[1]}); "
                            "fix the node-config key columns or set n-features")
        idx = [names.index(c) for c in src.columns]
        X, names = X[:, idx].tocsr(), list(src.columns)
    if src.sparse == "false":
        X = X.toarray()
    return PartyTable(src.path, ids, X, names, _labels_array(y) if src.label_column else None)


def read_party(src: SourceConfig) -> PartyTable:
    """Read one party's file (see the module docstring); raises :class:`DataError`."""
    if not Path(src.path).is_file():
        raise DataError(f"the data file {src.path} does not exist; fix the node-config key data-path "
                        "(or score-path) to point at the party's export")
    fmt = src.resolved_format()
    return _read_libsvm(src) if fmt == "libsvm" else _read_table(src, fmt)


def align_rows(table_ids: np.ndarray, order_ids, where: str = "") -> np.ndarray:
    """Row indices of ``table_ids`` that list ``order_ids`` in order (the agreed intersection).

    Raises :class:`DataError` when the party does not hold some ID of the order (a corrupted or
    stale alignment). The refusal goes back to the requester, so it says that some are missing,
    never how many: a count would tell a requester that names guessed IDs more than the one bit
    its PSI log counts (:mod:`flower_vfl.io.psi_log`)."""
    pos = {v: i for i, v in enumerate(np.asarray(table_ids).tolist())}
    order = list(order_ids)
    idx = np.fromiter((pos.get(v, -1) for v in order), dtype=np.int64, count=len(order))
    if np.any(idx < 0):
        raise DataError(f"{where or 'party'}: some ID(s) of the agreed order are not in this party's file "
                        "(the alignment is stale: run the PSI step again)")
    return idx
