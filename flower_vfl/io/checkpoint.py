"""Durable checkpoints of the label owner's state (no Flower imports).

One file, ``checkpoint.npz`` in the state folder, holds every array and a JSON header. It is
written the way SQLite teaches: write a temporary file in the same folder, flush, ``fsync``,
rename over the old one, ``fsync`` the folder. A crash leaves either the previous checkpoint or
the new one, never a mix. Floats are stored as float64 arrays and as ``repr``-exact JSON, so a
resumed run continues with bitwise the same iterates.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import numpy as np

from flower_vfl.errors import UserError

__all__ = ["CHECKPOINT", "DiskError", "atomic_write", "disk_writes", "fsync_dir", "save_checkpoint", "load_checkpoint",
           "writable_folder"]

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


def load_checkpoint(folder) -> tuple[dict, dict]:
    """``(arrays, header)`` of ``folder/checkpoint.npz``; a clear error when there is none."""
    path = Path(folder) / CHECKPOINT
    if not path.is_file():
        raise FileNotFoundError(f"resume={str(folder)!r}: no {CHECKPOINT} there; give the state folder of the "
                                "run to continue (its state-dir, by default <out-dir>/state)")
    with np.load(path, allow_pickle=False) as data:
        header = json.loads(str(data["header"]))
        arrays = {k[2:]: data[k] for k in data.files if k.startswith("a/")}
    if header.get("format") != FORMAT:
        raise ValueError(f"{path}: checkpoint format {header.get('format')!r}, this version reads {FORMAT}")
    return arrays, header
