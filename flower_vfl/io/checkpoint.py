"""Durable checkpoints of the label owner's state (no Flower imports).

One file, ``checkpoint.npz`` in the state folder, holds every array and a JSON header. It is
written the way SQLite teaches: write a temporary file in the same folder, flush, ``fsync``,
rename over the old one, ``fsync`` the folder. A crash leaves either the previous checkpoint or
the new one, never a mix. Floats are stored as float64 arrays and as ``repr``-exact JSON, so a
resumed run continues with bitwise the same iterates. A file damaged after it was written
(truncated, a flipped byte, empty, a pickle, an array or a header field missing, a NaN) is
:class:`CheckpointDamaged` at :func:`load_checkpoint`, naming the file, what is wrong and the fix,
before any party is contacted; nothing in it is unpickled.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import numpy as np

from flower_vfl.errors import UserError

__all__ = ["CHECKPOINT", "CheckpointDamaged", "DiskError", "atomic_write", "disk_writes", "fsync_dir",
           "save_checkpoint", "load_checkpoint", "writable_folder"]

CHECKPOINT = "checkpoint.npz"
FORMAT = 1


class DiskError(UserError, OSError):
    """A folder of the label owner's run (run-config ``out-dir`` or ``state-dir``) cannot be
    written: read-only, full, or a file where a folder should be. Names the path, the key and the
    fix; what was written before stays whole (every file is replaced atomically)."""


def disk_fix(key: str) -> str:
    return (f"set the run-config key {key} to a writable folder with free space on the label owner's disk "
            "(not a file; it is created if missing), or free/remount this one")


@contextlib.contextmanager
def disk_writes(path, key: str, what: str):
    """Turn an OSError while writing ``path`` into a :class:`DiskError` naming ``path``, the
    run-config ``key`` that chose it and the fix (a :class:`DiskError` passes unchanged)."""
    try:
        yield
    except DiskError:
        raise
    except OSError as exc:
        raise DiskError(f"{key} {path}: cannot write the {what} ({exc.strerror or exc}); {disk_fix(key)}; "
                        f"the previous {what}, if any, is intact") from exc


def writable_folder(path, key: str) -> Path:
    """Make sure the folder ``path`` (chosen by the run-config ``key``) can take the run's files
    before any round: created if missing, a 64 KiB probe written, synced and removed. A plain file
    there or above it, a read-only folder or a full disk: a :class:`DiskError`."""
    path = Path(path).expanduser()
    for p in (path, *path.parents):          # the nearest existing entry must be a folder
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                where = "" if p == path else f" (its parent {p} is a file)"
                raise DiskError(f"{key} {path} is a file, not a folder{where}; {disk_fix(key)}")
            break
    probe = path / f".flower-vfl-write-probe-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as fh:
            fh.write(b"\0" * 65536)          # room for at least a small file
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise DiskError(f"{key} {path} cannot be written ({exc.strerror or exc}); {disk_fix(key)}") from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return path


def atomic_write(path: Path, write, durable: bool = True) -> None:
    """``write(fh)`` into a temporary file of its own next to ``path`` (unique per call, so
    concurrent writers of one path never share it), fsync (``durable``), rename over ``path``:
    a reader sees the old file or the new one, and a failure (a full disk) leaves the previous
    ``path`` whole and no temporary file. The one way this package replaces a file."""
    import tempfile
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (where the platform opens folders)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:            # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(folder, arrays: dict, header: dict, key: str = "state-dir") -> Path:
    """Atomically replace ``folder/checkpoint.npz`` with ``arrays`` (name -> ndarray) and the
    JSON-able ``header``. Returns the path. A disk error (read-only, full, a file where the folder
    should be) is a :class:`DiskError` naming the path and ``key``; the previous checkpoint stays."""
    folder = Path(folder)
    path = folder / CHECKPOINT
    payload = {f"a/{k}": np.asarray(v) for k, v in arrays.items()}
    payload["header"] = np.array(json.dumps(dict(header, format=FORMAT)))
    with disk_writes(path, key, "checkpoint"):
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda fh: np.savez(fh, **payload))
        fsync_dir(folder)
    return path


class CheckpointDamaged(UserError, ValueError):
    """``checkpoint.npz`` cannot be read back as the state it was written with (truncated, a
    flipped byte, empty, a pickle, an array or a header field missing, a non-finite value). Names
    the file, what is wrong and the fix; nothing in it is used (a pickle is never loaded)."""


#: what every checkpoint holds (:func:`flower_vfl.strategies.checkpointing.save`): the central
#: node's state and the header fields a resume reads
REQUIRED_ARRAYS = ("z", "y", "q", "b")
REQUIRED_HEADER = ("round", "phase", "j", "phase_stopped", "rho", "replay", "stale", "history", "privacy")


def damaged(folder, path, what: str) -> CheckpointDamaged:
    """The one message for a checkpoint that cannot be resumed: the file, what is wrong, the fix."""
    return CheckpointDamaged(
        f"resume={str(folder)!r}: {path} is damaged ({what}); it cannot continue the run. The checkpoint is "
        "replaced atomically after every round, so this is damage after it was written (a disk error, a copy "
        "cut short, an edit): put back a copy of the whole state folder if you kept one and resume from it, "
        "or start a new run without resume")


class CheckpointArrays(dict):
    """The checkpoint's arrays; asking for one it does not hold is :class:`CheckpointDamaged`
    (naming the file and the array), never a bare ``KeyError``."""

    def __init__(self, arrays, folder, path):
        super().__init__(arrays)
        self._where = (folder, path)

    def __missing__(self, key):
        raise damaged(*self._where, f"the array {key!r} the checkpoint's header needs is missing")


def _read(path) -> tuple[dict, object]:
    """Every array of ``path`` read in full (a zip member's CRC is checked at its end) and the
    raw header; a pickled object is refused by numpy (``allow_pickle=False``)."""
    with np.load(path, allow_pickle=False) as data:
        if not hasattr(data, "files"):           # a bare .npy, not the zip of a checkpoint
            raise ValueError("not a zip of named arrays (a single .npy array)")
        names = list(data.files)
        if "header" not in names:
            raise KeyError("header")
        arrays = {k[2:]: data[k] for k in names if k.startswith("a/")}
        return arrays, data["header"]


def load_checkpoint(folder) -> tuple[dict, dict]:
    """``(arrays, header)`` of ``folder/checkpoint.npz``; a clear error when there is none, and
    :class:`CheckpointDamaged` when it is not whole: unreadable, an array or a header field the
    resume needs missing, or a non-finite value in the state (a NaN z would otherwise surface
    rounds later as a party's bad reply)."""
    import zipfile
    import zlib
    path = Path(folder) / CHECKPOINT
    if not path.is_file():
        raise FileNotFoundError(f"resume={str(folder)!r}: no {CHECKPOINT} there; give the state folder of the "
                                "run to continue (its state-dir, by default <out-dir>/state)")
    size = path.stat().st_size
    if size == 0:
        raise damaged(folder, path, "the file is empty")
    try:
        arrays, raw = _read(path)
    except KeyError:
        raise damaged(folder, path, "it holds no header") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, OSError, UnicodeDecodeError) as exc:
        text = str(exc)
        if "pickle" in text or "Object arrays" in text:
            what = "it holds pickled data, which is never loaded"
        elif isinstance(exc, (EOFError, zipfile.BadZipFile)) or "CRC" in text or isinstance(exc, zlib.error):
            what = f"not a whole zip of arrays, {size} bytes: {text or type(exc).__name__}"
        else:
            what = f"unreadable: {text or type(exc).__name__}"
        raise damaged(folder, path, what) from None
    try:
        header = json.loads(str(raw))
    except ValueError as exc:
        raise damaged(folder, path, f"its header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise damaged(folder, path, "its header is not a JSON object")
    if header.get("format") != FORMAT:
        raise ValueError(f"{path}: checkpoint format {header.get('format')!r}, this version reads {FORMAT}")
    missing = [k for k in REQUIRED_HEADER if k not in header]
    if missing:
        raise damaged(folder, path, f"its header lacks {', '.join(missing)}")
    replay = header["replay"] if isinstance(header["replay"], dict) else {}
    needed = [*REQUIRED_ARRAYS, *(f"rq{m}" for m in replay),
              *(r.get("y") for r in replay.values() if isinstance(r, dict))]
    missing = [k for k in dict.fromkeys(needed) if k not in arrays]
    if missing:
        raise damaged(folder, path, f"the array{'s' if len(missing) > 1 else ''} "
                      f"{', '.join(map(repr, missing))} {'are' if len(missing) > 1 else 'is'} missing")
    for k, v in arrays.items():
        if v.dtype.kind not in "fiub":
            raise damaged(folder, path, f"the array {k!r} has dtype {v.dtype}, not numbers")
        # Anderson's history ('aa...') may keep unused buffer columns; every other array is state
        if v.dtype.kind == "f" and not k.startswith("aa") and not np.all(np.isfinite(v)):
            bad = int(v.size - np.isfinite(v).sum())
            raise damaged(folder, path, f"the array {k!r} holds {bad} NaN/inf value{'s' if bad > 1 else ''}")
    shape = arrays["z"].shape
    for k in ("y", "q", *(f"s{m}" for m in range(len(arrays)) if f"s{m}" in arrays)):
        if arrays[k].shape != shape:
            raise damaged(folder, path, f"the array {k!r} has shape {arrays[k].shape}, z has {shape}")
    return CheckpointArrays(arrays, folder, path), header
