"""A party's arrays too large for ``context.state``, kept in its own state folder instead.

On a real SuperNode ``context.state`` travels whole to and from every message's ClientApp, and
Flower pushes it back in the ClientApp's exit handler, which Flower force-ends 5 s after it
began: a state of tens of MB can miss that push, and the next message then starts from an
empty state (docs/benchmarks.md, "10M rows × 4 parties on loopback"). So an array above the
caller's limit is written here, in ``<state-dir>/party-arrays/``, and ``context.state`` keeps
only the SHA-256 of the file's bytes; the file's name ends with that digest, so a file is
checked against its own name on every read (:func:`read_arrays`), and a file that is missing or
does not match is simply "not kept" (the caller decides what that means: recompute a cache,
refuse a round).

Writes are atomic and durable (:func:`flower_vfl.io.checkpoint.atomic_write`: a temporary file
in the same folder, fsync, ``os.replace``; then fsync of the folder).

The folder is bounded: per run (``run-<id>/``) a name keeps its file and the one before it
(:func:`put_arrays` with ``keep``), and only the :data:`KEEP_RUNS` most recently written run
folders are kept (:func:`evict_runs`); caches shared across runs (the x-update's factorization,
keyed by a hash of the party's block and solver parameters) keep the :data:`KEEP_SHARED` most
recently used files. The run id and the parties' names are the only things of the run in a
path; nothing is read from a path the central node names. No Flower imports, no math.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from flower_vfl.io.checkpoint import atomic_write, fsync_dir
from flower_vfl.privacy.store import StateDirRequired, default_state_dir, disk_errors, pack_arrays, unpack_arrays

__all__ = ["KEEP_RUNS", "KEEP_SHARED", "arrays_folder", "evict_runs", "evict_shared", "find_arrays", "put_arrays",
           "read_arrays", "run_folder"]

#: run folders kept (the most recently written); older runs' files are deleted
KEEP_RUNS = 4
#: files kept in the shared (cross-run) cache folder, least recently used deleted first
KEEP_SHARED = 4
_SUFFIX = ".npz"


def arrays_folder(state_dir, what: str) -> Path:
    """``<state-dir>/party-arrays`` (``state_dir`` None: :func:`default_state_dir`). On a deployed
    SuperNode without node config ``state-dir`` this raises :class:`StateDirRequired`, saying
    that ``what`` is too large for context.state: never kept there, silently lost at the push."""
    if not state_dir:
        try:
            state_dir = default_state_dir()
        except StateDirRequired as exc:
            raise StateDirRequired(f"{what} is too large to travel in context.state (Flower may drop the whole "
                                   f"state at the end of the message) and is kept in the party's own state "
                                   f"folder instead; {exc}") from None
    return Path(state_dir).expanduser() / "party-arrays"


def run_folder(folder: Path, run) -> Path:
    """The folder of run ``run`` (Flower's integer run id)."""
    return folder / f"run-{int(run)}"


def _path(folder: Path, stem: str, sha: str) -> Path:
    return folder / f"{stem}-{sha}{_SUFFIX}"


def put_arrays(folder: Path, stem: str, arrays: dict, keep: str | None = None) -> str:
    """Write ``arrays`` to ``folder/<stem>-<sha256>.npz`` (atomic, synced) and return the digest.
    Other files of ``stem`` are deleted, except the one of digest ``keep`` (the state the node
    holds now, should this message's state not reach it)."""
    data = pack_arrays(arrays)
    sha = hashlib.sha256(data).hexdigest()
    path = _path(folder, stem, sha)
    with disk_errors(folder, "write the party's state array to"):
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda fh: fh.write(data))   # (always written: a file of that name may be altered)
        fsync_dir(folder)
    for old in folder.glob(f"{stem}-*{_SUFFIX}"):
        if old.name not in (path.name, _path(folder, stem, keep or "-").name) and _digest_of(old, stem):
            old.unlink(missing_ok=True)
    return sha


def _digest_of(path: Path, stem: str) -> str | None:
    """The digest part of ``path``'s name when it is a file of ``stem`` (64 hex digits), else None."""
    name = path.name
    if not (name.startswith(stem + "-") and name.endswith(_SUFFIX)):
        return None
    sha = name[len(stem) + 1:-len(_SUFFIX)]
    return sha if len(sha) == 64 and all(c in "0123456789abcdef" for c in sha) else None


def read_arrays(folder: Path, stem: str, sha: str) -> dict | None:
    """The arrays of ``folder/<stem>-<sha>.npz`` when its bytes have that SHA-256; None when the
    file is missing, unreadable or does not match (never an exception: the caller's fallback)."""
    path = _path(folder, stem, str(sha))
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if hashlib.sha256(data).hexdigest() != sha:
        return None
    try:
        out = unpack_arrays(data)
    except Exception:       # a file of the right digest that numpy cannot read: not ours
        return None
    try:
        os.utime(path)      # recently used (the shared cache's eviction order)
    except OSError:
        pass
    return out


def find_arrays(folder: Path, stem: str) -> tuple[str, dict] | None:
    """Any file of ``stem`` in ``folder`` whose bytes match the digest in its name (the newest
    first): ``(sha, arrays)``, or None. For caches shared across runs, where no context.state
    names the digest yet."""
    try:
        files = sorted(folder.glob(f"{stem}-*{_SUFFIX}"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    except OSError:
        return None
    for path in files:
        sha = _digest_of(path, stem)
        got = read_arrays(folder, stem, sha) if sha else None
        if got is not None:
            return sha, got
    return None


def _mtime(p: Path) -> int:
    try:
        return p.stat().st_mtime_ns
    except OSError:
        return 0


def evict_runs(folder: Path, current: Path, keep: int = KEEP_RUNS) -> None:
    """Delete the run folders of ``folder`` beyond the ``keep`` most recently written (never
    ``current``): a run whose files are gone refuses what needs them, it never guesses."""
    runs = sorted((p for p in folder.glob("run-*") if p.is_dir() and p != current), key=_mtime, reverse=True)
    for old in runs[max(0, keep - 1):]:
        shutil.rmtree(old, ignore_errors=True)


def evict_shared(folder: Path, keep: int = KEEP_SHARED) -> None:
    """Keep the ``keep`` most recently used files of the shared cache ``folder``."""
    files = sorted(folder.glob(f"*{_SUFFIX}"), key=_mtime, reverse=True)
    for old in files[keep:]:
        old.unlink(missing_ok=True)
