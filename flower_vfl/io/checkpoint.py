"""Durable checkpoints of the label owner's state (no Flower imports).

One file, ``checkpoint.npz`` in the state folder, holds every array and a JSON header. It is
written the way SQLite teaches: write a temporary file in the same folder, flush, ``fsync``,
rename over the old one, ``fsync`` the folder. A crash leaves either the previous checkpoint or
the new one, never a mix. Floats are stored as float64 arrays and as ``repr``-exact JSON, so a
resumed run continues with bitwise the same iterates.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

__all__ = ["CHECKPOINT", "save_checkpoint", "load_checkpoint"]

CHECKPOINT = "checkpoint.npz"
FORMAT = 1


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:            # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(folder, arrays: dict, header: dict) -> Path:
    """Atomically replace ``folder/checkpoint.npz`` with ``arrays`` (name -> ndarray) and the
    JSON-able ``header``. Returns the path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CHECKPOINT
    tmp = folder / f".{CHECKPOINT}.{os.getpid()}.tmp"
    payload = {f"a/{k}": np.asarray(v) for k, v in arrays.items()}
    payload["header"] = np.array(json.dumps(dict(header, format=FORMAT)))
    with open(tmp, "wb") as fh:
        np.savez(fh, **payload)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(folder)
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
