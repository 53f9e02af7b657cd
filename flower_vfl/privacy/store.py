"""The party's durable memory: its privacy ledger and every answer it gave, on its own disk.

A party's budget belongs to its data, not to a run: a new run, a restarted SuperNode or a
second server must see only what is left. So the ledger lives here, in one SQLite file
(WAL mode, ``synchronous=FULL``) in the party's ``state-dir``, keyed by

- ``fingerprint``: a SHA-256 of the party's training block (what the budget protects), and
- ``unit``: the privacy unit / neighbouring relation the releases were calibrated for.

Every release is one row: the run, the round, the kind (``train`` or ``eval``), the hash of
the inputs it answered, the noise multiplier it was charged at, and the released payload.
The row is committed (durable) *before* the release leaves the party, in the same
transaction that re-checks the budget against every row of every run — so two processes
cannot both spend the last of a budget, and a crash between charge and send loses budget,
never privacy: on restart the re-sent request finds the stored answer and gets it back,
with no second noise draw.

No Flower imports: the Flower client (``flower_vfl.clients.vertical_party``), the
horizontal agents and the ``flower-vfl ledger`` command all use this class.

API
---
``PartyStore(path)`` opens (creates) the file. ``store.entries(fp, unit)`` lists every
charged release (all runs); ``store.answer(fp, unit, run, round, kind)`` returns the stored
:class:`Answer` or None; ``store.last_round(fp, unit, run, kind)``;
``store.commit_release(fp, unit, run, round, kind, inputs_hash, z, payload, check)``
inserts one release atomically after ``check(z_list)`` (raise to refuse) passed on the
ledger as it is inside the transaction; ``store.put_state`` / ``get_state`` keep a small
per-run blob (the party's iterate) so a restarted node resumes.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Answer", "PartyStore", "data_fingerprint", "default_state_dir", "pack_arrays", "unpack_arrays"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS releases (
    fingerprint TEXT NOT NULL, unit TEXT NOT NULL, run TEXT NOT NULL,
    round INTEGER NOT NULL, kind TEXT NOT NULL, inputs_hash TEXT NOT NULL,
    noise_multiplier REAL NOT NULL, sigma REAL NOT NULL, sensitivity REAL NOT NULL,
    payload BLOB NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (fingerprint, unit, run, round, kind));
CREATE TABLE IF NOT EXISTS state (
    fingerprint TEXT NOT NULL, unit TEXT NOT NULL, run TEXT NOT NULL,
    payload BLOB NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (fingerprint, unit, run));
CREATE TABLE IF NOT EXISTS budgets (
    fingerprint TEXT NOT NULL, unit TEXT NOT NULL, info TEXT NOT NULL,
    PRIMARY KEY (fingerprint, unit));
"""

#: test hook: called right after a release is durable and before it is returned (the
#: crash test sets it to kill the process there); None in production
_after_commit_hook = None


def default_state_dir() -> Path:
    """``$FLOWER_VFL_STATE_DIR`` or ``~/.flower-vfl/party-state`` (the party's own disk)."""
    env = os.environ.get("FLOWER_VFL_STATE_DIR")
    return Path(env) if env else Path.home() / ".flower-vfl" / "party-state"


def data_fingerprint(D) -> str:
    """SHA-256 of a block's type, shape and content: what a party's budget is keyed by."""
    h = hashlib.sha256(f"{type(D).__name__}|{tuple(D.shape)}|".encode())
    if hasattr(D, 'tocsr'):
        D = D.tocsr()
        parts = (D.indptr, D.indices, D.data)
    else:
        parts = (np.asarray(D),)
    for a in parts:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def pack_arrays(arrays: dict) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    return buf.getvalue()


def unpack_arrays(blob: bytes) -> dict:
    with np.load(io.BytesIO(blob), allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


@dataclass(frozen=True)
class Answer:
    """One charged release as stored."""

    run: str
    round: int
    kind: str
    inputs_hash: str
    noise_multiplier: float
    sigma: float
    sensitivity: float
    payload: dict
    created: float


class PartyStore:
    """A party's ledger and answers in ``<state_dir>/party.sqlite`` (or a given file).

    Parameters
    ----------
    path : str or Path
        A directory (the file ``party.sqlite`` is created in it), a ``.sqlite`` file, or
        ``":memory:"`` (the in-process engine: nothing outlives the process).
    """

    def __init__(self, path):
        if str(path) == ":memory:":                    # the in-process engine: one user, one process
            self.path = ":memory:"
            self._db = sqlite3.connect(":memory:", isolation_level=None)
            self._db.executescript(_SCHEMA)
            return
        path = Path(path).expanduser()
        if path.suffix != ".sqlite":
            path = path / "party.sqlite"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OSError(f"cannot create the party's state-dir {path.parent}: {exc}; set the node-config "
                          "key state-dir to a writable folder on this party's disk") from exc
        self.path = path
        self._db = sqlite3.connect(str(path), timeout=30.0, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")     # a commit is on disk before we go on
        self._db.executescript(_SCHEMA)

    def close(self):
        self._db.close()

    # ------------------------------------------------------------------ queries
    def entries(self, fingerprint: str, unit: str) -> list[Answer]:
        """Every charged release on this data, all runs, oldest first (payloads not loaded)."""
        rows = self._db.execute(
            "SELECT run, round, kind, inputs_hash, noise_multiplier, sigma, sensitivity, created "
            "FROM releases WHERE fingerprint=? AND unit=? ORDER BY created, rowid", (fingerprint, unit))
        return [Answer(r[0], r[1], r[2], r[3], r[4], r[5], r[6], {}, r[7]) for r in rows]

    def datasets(self) -> list[tuple[str, str, int]]:
        """(fingerprint, unit, number of releases) of every dataset this store has seen."""
        return list(self._db.execute(
            "SELECT fingerprint, unit, COUNT(*) FROM releases GROUP BY fingerprint, unit"))

    def answer(self, fingerprint, unit, run, round, kind) -> Answer | None:
        row = self._db.execute(
            "SELECT run, round, kind, inputs_hash, noise_multiplier, sigma, sensitivity, payload, created "
            "FROM releases WHERE fingerprint=? AND unit=? AND run=? AND round=? AND kind=?",
            (fingerprint, unit, str(run), int(round), kind)).fetchone()
        if row is None:
            return None
        return Answer(row[0], row[1], row[2], row[3], row[4], row[5], row[6], unpack_arrays(row[7]), row[8])

    def last_answer(self, fingerprint, unit, run, kind) -> Answer | None:
        row = self._db.execute(
            "SELECT round FROM releases WHERE fingerprint=? AND unit=? AND run=? AND kind=? "
            "ORDER BY round DESC LIMIT 1", (fingerprint, unit, str(run), kind)).fetchone()
        return None if row is None else self.answer(fingerprint, unit, run, row[0], kind)

    def last_round(self, fingerprint, unit, run, kind) -> int | None:
        row = self._db.execute(
            "SELECT MAX(round) FROM releases WHERE fingerprint=? AND unit=? AND run=? AND kind=?",
            (fingerprint, unit, str(run), kind)).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    # ------------------------------------------------------------------ updates
    def commit_release(self, fingerprint, unit, run, round, kind, inputs_hash, *, noise_multiplier,
                       sigma, sensitivity, payload: dict, check=None, state: dict | None = None):
        """Charge and store one release in one durable transaction.

        ``check(multipliers)`` receives the noise multipliers of every release already on
        this data (all runs, read inside the write lock) and raises to refuse; nothing is
        written then. ``state`` (optional arrays) is stored as the run's party state in the
        same transaction. Returns the stored :class:`Answer`.
        """
        db = self._db
        db.execute("BEGIN IMMEDIATE")                  # the write lock: check-and-charge is atomic
        try:
            prev = db.execute("SELECT inputs_hash FROM releases WHERE fingerprint=? AND unit=? AND run=? "
                              "AND round=? AND kind=?", (fingerprint, unit, str(run), int(round), kind)).fetchone()
            if prev is not None:
                raise RuntimeError(f"round {round} ({kind}) of run {run} was already released")
            if check is not None:
                zs = [r[0] for r in db.execute(
                    "SELECT noise_multiplier FROM releases WHERE fingerprint=? AND unit=? ORDER BY created, rowid",
                    (fingerprint, unit))]
                check(zs)
            now = time.time()
            db.execute("INSERT INTO releases VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                       (fingerprint, unit, str(run), int(round), kind, inputs_hash, float(noise_multiplier),
                        float(sigma), float(sensitivity), pack_arrays(payload), now))
            if state is not None:
                db.execute("INSERT OR REPLACE INTO state VALUES (?,?,?,?,?)",
                           (fingerprint, unit, str(run), pack_arrays(state), now))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        if _after_commit_hook is not None:
            _after_commit_hook()
        return Answer(str(run), int(round), kind, inputs_hash, float(noise_multiplier), float(sigma),
                      float(sensitivity), payload, now)

    def put_state(self, fingerprint, unit, run, arrays: dict):
        self._db.execute("INSERT OR REPLACE INTO state VALUES (?,?,?,?,?)",
                         (fingerprint, unit, str(run), pack_arrays(arrays), time.time()))

    def get_state(self, fingerprint, unit, run) -> dict | None:
        row = self._db.execute("SELECT payload FROM state WHERE fingerprint=? AND unit=? AND run=?",
                               (fingerprint, unit, str(run))).fetchone()
        return None if row is None else unpack_arrays(row[0])

    def note_budget(self, fingerprint, unit, info: dict):
        """Remember the budget last configured for this data (shown by ``flower-vfl ledger``)."""
        self._db.execute("INSERT OR REPLACE INTO budgets VALUES (?,?,?)",
                         (fingerprint, unit, json.dumps(info, sort_keys=True)))

    def budget_info(self, fingerprint, unit) -> dict | None:
        row = self._db.execute("SELECT info FROM budgets WHERE fingerprint=? AND unit=?",
                               (fingerprint, unit)).fetchone()
        return None if row is None else json.loads(row[0])
