"""Versioned model files that each owner keeps on its own disk (no Flower imports).

* a party's file: its block x_m (for a private party only the released x̃), its preprocessing,
  its column names and a fingerprint of the (aligned) training rows;
* the label owner's file: the intercept, the loss, the class encoding, the run's config and
  history.

Format: a NumPy ``.npz`` (``allow_pickle=False``) holding the arrays plus one JSON document
``meta`` with ``format`` = :data:`FORMAT` and ``version`` = :data:`VERSION`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from flower_vfl.errors import UserError
from flower_vfl.io.checkpoint import atomic_write

__all__ = ["FORMAT", "VERSION", "save_party_model", "save_owner_model", "load_model", "describe",
           "data_fingerprint", "ModelFileError"]

FORMAT = "flower-vfl-model"
VERSION = 1


class ModelFileError(UserError, ValueError):
    """A model file that is missing, of another format, or of an unsupported version."""


def data_fingerprint(D, ids=None) -> str:
    """SHA-256 over the IDs (in row order) and the block's values: names the training rows."""
    h = hashlib.sha256()
    if ids is not None:
        h.update(json.dumps([str(v) for v in ids]).encode())
    parts = (D.tocsr().indptr, D.tocsr().indices, D.tocsr().data) if sp.issparse(D) else (np.asarray(D, float),)
    for a in parts:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def write_model_file(path, arrays: dict, meta: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT, "version": VERSION, **meta}
    blob = np.frombuffer(json.dumps(meta, default=_jsonable).encode(), dtype=np.uint8)
    atomic_write(path, lambda fh: np.savez(fh, meta=blob, **{k: np.asarray(v) for k, v in arrays.items()}))
    return path


def _jsonable(o):
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, np.generic):
        return o.item()
    return str(o)


def save_party_model(path, party_id: int, x, columns, preprocessing: dict, fingerprint: str, n_rows: int,
                     private: bool = False, extra: dict | None = None, block: dict | None = None) -> Path:
    """Party m's block of the model (x_m, or x̃ for a private party). ``block``: a non-linear
    block model's kind and settings (``PartyBlock.to_meta()``, core/blocks.py: no rows), x then
    being its coefficients on the mapped columns or its network's parameters."""
    x = np.asarray(x, dtype=float)
    if block is None and x.shape[0] != len(columns):
        raise ValueError(f"x has {x.shape[0]} rows but {len(columns)} column names were given")
    meta = {"kind": "party", "party": int(party_id), "columns": list(columns), "preprocessing": preprocessing,
            "fingerprint": fingerprint, "n_rows": int(n_rows), "private": bool(private),
            "x_kind": "released x_tilde" if private else "x_m", **(extra or {})}
    if block is not None:
        meta["block"] = dict(block)
    return write_model_file(path, {"x": x}, meta)


def save_owner_model(path, intercept, loss: str, classes, config: dict, history: list,
                     extra: dict | None = None) -> Path:
    """The label owner's part: intercept, loss, class encoding, config, history."""
    meta = {"kind": "label-owner", "loss": str(loss),
            "classes": None if classes is None else np.asarray(classes).tolist(),
            "config": dict(config), "history": list(history), **(extra or {})}
    return write_model_file(path, {"intercept": np.asarray(intercept, dtype=float)}, meta)


def load_model(path) -> dict:
    """``{'meta': dict, <arrays>}``; raises :class:`ModelFileError` naming the path and the fix."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"model file {path} does not exist; train first (a run saves it under the "
                             "node-config key model-dir) or fix the path")
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {k: z[k] for k in z.files}
    except (ValueError, OSError) as exc:
        raise ModelFileError(f"{path} is not a flower-vfl model file ({exc})") from None
    if "meta" not in out:
        raise ModelFileError(f"{path} is not a flower-vfl model file (no meta record)")
    meta = json.loads(out.pop("meta").tobytes().decode())
    if meta.get("format") != FORMAT:
        raise ModelFileError(f"{path} has format {meta.get('format')!r}, not {FORMAT!r}")
    if int(meta.get("version", 0)) > VERSION:
        raise ModelFileError(f"{path} is version {meta['version']}; this flower-vfl reads up to {VERSION}: "
                             "upgrade flower-vfl")
    out["meta"] = meta
    return out


def describe(path) -> dict:
    """The metadata a user checks (``flower-vfl model show PATH``): no training rows inside."""
    m = load_model(path)
    meta = dict(m["meta"])
    if meta["kind"] == "party":
        x = m["x"]
        meta["x_shape"] = list(x.shape)
        meta["x_norm"] = float(np.linalg.norm(x))
        meta["n_columns"] = len(meta["columns"])
        meta["columns"] = meta["columns"][:10] + (["..."] if len(meta["columns"]) > 10 else [])
    else:
        meta["intercept"] = m["intercept"].tolist()
        meta["rounds"] = len(meta.pop("history"))
        if meta["kind"] == "estimator":
            meta["coef_norms"] = [float(np.linalg.norm(m[k])) for k in sorted(m) if k.startswith("coef_")]
    return meta
