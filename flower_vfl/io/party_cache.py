"""A party's on-disk cache of its own parsed column blocks (no Flower imports, no math).

On real SuperNodes (flwr 1.41) every message runs in a fresh ``flwr-clientapp`` process, so
without this each message parsed the bundled data again: for a9a, reading both LIBSVM files and
slicing out the party's columns took 3-9 s of every round on a 2-core machine
(docs/benchmarks.md, "Latency of a round on real SuperNodes"); loading the cached block takes
milliseconds.

What is kept: the party's own ``(D_train, D_test)`` exactly as :func:`flower_vfl.io.data.party_block`
returns them (same class, dtypes and index arrays, so the privacy ledger's data fingerprint is
unchanged), in ``<state-dir>/block-cache/`` on the party's own disk beside its ledger: the same
trust domain as the data file it came from. Nothing else: no iterate, no noise, no model.

The file name is a SHA-256 over the dataset name, the party and the number of parties, the
content of the source files (a changed data file is a new key), and the source of the loader
modules (a changed parser is a new key). A file that fails its own checksum is ignored and
rewritten. ``FLOWER_VFL_BLOCK_CACHE=0`` turns the cache off.

A party's own files (docs/own-data.md) are cached the same way, aligned and preprocessed
(:func:`cached_own_block`, called by ``clients/psi_party.own_blocks``): the key
(:func:`own_block_key`) is what the party's node config declares (file, format, ID column,
columns, categorical, preprocessing), the SHA-256 of its files' content (not their size or time
stamps: a file rewritten in place is read again), the row order the party agreed to at the PSI
step (its row indices and digest) and the loader's code. Parsing a9a's 32,561 rows from CSV and
scaling them cost 0.4-2.4 s of every own-data message on real SuperNodes; hashing the file and
loading the block costs ~0.1 s.

The folder is bounded: it keeps the :data:`MAX_FILES` most recently used blocks and deletes the
rest; an own-data source keeps one file (a new order or new content replaces it). The run config (the server's) names the dataset and ``num-parties``, so without a bound a
curious or malicious server could make the party write one block per value it sends (a9a:
``num-parties`` 1..123 would be ~5x the data on the party's disk).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

__all__ = ["cache_enabled", "block_cache_dir", "source_fingerprint", "cached_party_block", "own_block_key", "files_of",
           "cached_own_block"]

#: bump when the file layout below changes
FORMAT = 1
#: blocks kept in the cache folder (least recently used deleted first)
MAX_FILES = 4
#: the loader modules (beside this file) whose code is part of every key
_LOADER_SOURCES = ("data.py", "__init__.py", "sources.py", "preprocess.py", "bundled.py")
_HERE = Path(__file__).resolve().parent


def cache_enabled() -> bool:
    """False when ``FLOWER_VFL_BLOCK_CACHE`` is ``0``/``false``/``no``/``off``."""
    return os.environ.get("FLOWER_VFL_BLOCK_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def block_cache_dir(state_dir=None) -> Path:
    """``<state-dir>/block-cache`` (the party's own state folder, as for its ledger)."""
    if not state_dir:
        from flower_vfl.privacy.store import default_state_dir
        state_dir = default_state_dir()
    return Path(state_dir) / "block-cache"


def _sha_file(h, path: Path) -> None:
    h.update(f"{path.name}|{path.stat().st_size}|".encode())
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)


def _source_files(name: str, data_dir) -> list[Path] | None:
    """The files a bundled dataset is parsed from (:func:`flower_vfl.io.data.source_files`); None
    when one is missing or the name is not a bundled dataset (no caching: the fresh load then
    raises its own error or writes the file first)."""
    from flower_vfl.io.data import source_files
    try:
        files = source_files(name, data_dir)
    except ValueError:
        return None
    return files if all(f.is_file() for f in files) else None


def source_fingerprint(name: str, party: int, num_parties: int, data_dir=None) -> str | None:
    """The cache key: SHA-256 of the request, the source files' content and the loader's code
    (and, for breast_cancer, the scikit-learn version that splits it). None: not cacheable."""
    files = _source_files(name, data_dir)
    if files is None:
        return None
    h = hashlib.sha256(f"flower-vfl block cache v{FORMAT}|{name}|{int(party)}|{int(num_parties)}|".encode())
    for f in files:
        _sha_file(h, f)
    for rel in _LOADER_SOURCES:
        p = _HERE / rel
        if p.is_file():
            _sha_file(h, p)
    if name == "breast_cancer":        # train_test_split(random_state=0) is sklearn's
        from importlib.metadata import version
        h.update(f"|sklearn {version('scikit-learn')}|numpy {np.__version__}".encode())
    return h.hexdigest()


# ------------------------------------------------------------------ file layout
def _pack(prefix: str, M, out: dict) -> None:
    if hasattr(M, "tocsr"):
        if M.format != "csr":
            raise TypeError(f"block of format {M.format!r}; only CSR blocks are cached")
        out[f"{prefix}.kind"] = np.array(type(M).__name__)
        out[f"{prefix}.shape"] = np.array(M.shape, dtype=np.int64)
        out[f"{prefix}.data"], out[f"{prefix}.indices"], out[f"{prefix}.indptr"] = M.data, M.indices, M.indptr
        out[f"{prefix}.sorted"] = np.array(bool(M.has_sorted_indices))
    else:
        out[f"{prefix}.kind"] = np.array("ndarray")
        out[f"{prefix}.data"] = np.asarray(M)


def _unpack(prefix: str, f):
    kind = str(f[f"{prefix}.kind"])
    if kind == "ndarray":
        return np.array(f[f"{prefix}.data"])
    import scipy.sparse as sp
    cls = {"csr_matrix": sp.csr_matrix, "csr_array": getattr(sp, "csr_array", sp.csr_matrix)}[kind]
    shape = tuple(int(s) for s in f[f"{prefix}.shape"])
    M = cls(shape, dtype=f[f"{prefix}.data"].dtype)
    # set the arrays as stored: the constructor may change the index dtype, and the ledger's
    # fingerprint covers dtypes
    M.data, M.indices, M.indptr = f[f"{prefix}.data"], f[f"{prefix}.indices"], f[f"{prefix}.indptr"]
    M.has_sorted_indices = bool(f[f"{prefix}.sorted"])
    return M


def _digest(arrays: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(f"{k}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _read_arrays(path: Path):
    """The arrays of a cache file whose checksum holds, else None."""
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
        return None
    digest = str(arrays.pop("checksum", ""))
    if digest != _digest(arrays):
        return None                       # torn or tampered file: parse again
    return arrays


def _read(path: Path):
    arrays = _read_arrays(path)
    if arrays is None:
        return None
    return _unpack("train", arrays), (None if "test.kind" not in arrays else _unpack("test", arrays))


def _write(path: Path, D, D_test, extra=None) -> None:
    arrays: dict = {}
    _pack("train", D, arrays)
    if D_test is not None:
        _pack("test", D_test, arrays)
    for k, v in (extra or {}).items():
        arrays[f"extra.{k}"] = np.asarray(v)
    arrays["checksum"] = np.array(_digest(arrays))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".npz.tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)                  # atomic: a concurrent reader sees a whole file
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _touch(path: Path) -> None:
    try:
        os.utime(path)                         # "recently used" for _evict
    except OSError:
        pass


def _evict(folder: Path, keep: Path) -> None:
    """Delete all but the MAX_FILES most recently used blocks (never ``keep``)."""
    def mtime(f):
        try:
            return f.stat().st_mtime_ns
        except OSError:
            return 0
    files = sorted(folder.glob("*.npz"), key=mtime, reverse=True)
    kept = [keep] + [f for f in files if f != keep][: MAX_FILES - 1]
    for f in files:
        if f not in kept:
            f.unlink(missing_ok=True)


#: blocks already returned in this process (a simulation actor serves many messages), keyed by
#: the request and the source files' (size, mtime): no hashing or reading per message
_MEMO: dict = {}


def cached_party_block(name: str, party: int, num_parties: int, data_dir=None, state_dir=None):
    """:func:`flower_vfl.io.data.party_block`, through the party's block cache when it is enabled
    and the source files exist. Returns ``(D_train, D_test)``, bitwise those of a fresh parse
    (shared objects: callers must not modify them in place)."""
    from flower_vfl.io.data import party_block
    data_dir = None if data_dir in (None, "") else str(data_dir)
    files = _source_files(name, data_dir) if cache_enabled() else None
    if files is None:
        return party_block(name, party, num_parties, data_dir)
    stats = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    memo = (name, int(party), int(num_parties), data_dir, str(block_cache_dir(state_dir)), stats)
    if memo in _MEMO:
        return _MEMO[memo]
    key = source_fingerprint(name, party, num_parties, data_dir)
    stem = f"{name}-p{int(party)}of{int(num_parties)}-"
    folder = block_cache_dir(state_dir)
    path = folder / f"{stem}{key[:32]}.npz"
    got = _read(path) if path.is_file() else None
    if got is not None:
        _touch(path)
    else:
        got = party_block(name, party, num_parties, data_dir)
        try:
            _write(path, *got)
            for old in folder.glob(f"{stem}*.npz"):     # blocks of data that has changed since
                if old != path:
                    old.unlink(missing_ok=True)
            _evict(folder, keep=path)
        except (OSError, TypeError):
            pass                               # a read-only state dir only costs speed
    while len(_MEMO) >= 8:                     # bounded: the oldest request goes first
        _MEMO.pop(next(iter(_MEMO)))
    _MEMO[memo] = got
    return got


# ------------------------------------------------------------------ own data (clients/psi_party.py)
#: own-data blocks already returned in this process, by their key (bounded like _MEMO)
_OWN_MEMO: dict = {}


def files_of(src) -> list[Path]:
    """The files a party's own source is parsed from: the data file, and a LIBSVM file's ID sidecar."""
    files = [Path(src.path)]
    if src.resolved_format() == "libsvm":
        files.append(Path(src.id_path or src.path + ".ids"))
    return files


def own_block_key(sources, code_files=()) -> str | None:
    """The cache key of a party's aligned, preprocessed own-data block: SHA-256 over, per split,
    the source as its node config declares it (``SourceConfig``: path, format, ID column,
    columns, categorical, preprocessing ...), the *content* of its files (a file rewritten in
    place, whatever its size or time stamps, is a new key), the aligned row indices and the
    agreed order's digest the party stored at the PSI step; and over the loader's code
    (``code_files`` too) and the parsing library's version. ``sources``: ``[(split, SourceConfig,
    idx, order_digest)]``. None when a file is missing (no caching: the fresh read raises its
    DataError)."""
    from importlib.metadata import PackageNotFoundError, version
    h = hashlib.sha256(f"flower-vfl own block v{FORMAT}|numpy {np.__version__}|".encode())
    for split, src, idx, digest in sources:
        files = files_of(src)
        if not all(f.is_file() for f in files):
            return None
        lib = "scikit-learn" if src.resolved_format() == "libsvm" else "pyarrow"
        try:
            lib = f"{lib} {version(lib)}"
        except PackageNotFoundError:
            pass
        h.update(f"|{split}|{src!r}|{lib}|{digest}|".encode())
        for f in files:
            _sha_file(h, f)
        a = np.ascontiguousarray(np.asarray(idx, dtype=np.int64))
        h.update(f"|idx {a.shape}|".encode())
        h.update(a.tobytes())
    for p in [_HERE / rel for rel in _LOADER_SOURCES] + [Path(c) for c in code_files]:
        if p.is_file():
            _sha_file(h, p)
    return h.hexdigest()


def cached_own_block(key: str | None, source_path: str, id_column: str, build, state_dir=None):
    """``build()`` -> ``(D, D_test, extra)`` (``extra``: a dict of plain numpy arrays), through the
    party's block cache under ``key`` (:func:`own_block_key`; None or the cache turned off: built
    afresh). Returns the same triple, bitwise that of ``build()``.

    Bounded as the bundled blocks are: one file per declared source (``source_path`` and its ID
    column; a new key for it replaces the old file) and :data:`MAX_FILES` files in the folder.
    The agreed order is the central node's choice: a new order only replaces that source's file."""
    if key is None or not cache_enabled():
        return build()
    folder = block_cache_dir(state_dir)
    memo = (str(folder), key)
    if memo in _OWN_MEMO:
        return _OWN_MEMO[memo]
    stem = "own-" + hashlib.sha256(f"{source_path}|{id_column}".encode()).hexdigest()[:16] + "-"
    path = folder / f"{stem}{key[:32]}.npz"
    arrays = _read_arrays(path) if path.is_file() else None
    if arrays is not None:
        _touch(path)
        got = (_unpack("train", arrays), None if "test.kind" not in arrays else _unpack("test", arrays),
               {k[len("extra."):]: v for k, v in arrays.items() if k.startswith("extra.")})
    else:
        got = build()
        try:
            _write(path, *got)
            for old in folder.glob(f"{stem}*.npz"):     # this source's block for other data or order
                if old != path:
                    old.unlink(missing_ok=True)
            _evict(folder, keep=path)
        except (OSError, TypeError):
            pass                               # a read-only state dir only costs speed
    while len(_OWN_MEMO) >= 4:
        _OWN_MEMO.pop(next(iter(_OWN_MEMO)))
    _OWN_MEMO[memo] = got
    return got
