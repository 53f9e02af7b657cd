"""The party's durable memory: every release it made and every answer it gave, on its own disk.

A party's budget belongs to the people in its data, not to a run or to a view of them. So
every release is one row of one SQLite file (WAL mode, ``synchronous=FULL``) in the party's
``state-dir``, under the *source key* of the data it was computed from: what the party's own
node config declares as its data (:mod:`flower_vfl.clients.source`), never a hash of the
block the server shaped (row order, subset, column split, ``num-parties`` and preprocessing
all leave the key unchanged).

Each row records the run, the round, the kind (``train`` or ``eval``), the privacy unit it
was calibrated for, the mechanism (``gaussian`` or ``laplace``), the hash of the inputs it
answered, the noise multiplier it was charged at and the released payload. The row is
committed (durable) *before* the release leaves the party, in the same transaction that
re-checks the budget against every row on the source (:meth:`PartyStore.commit_release`,
used through :class:`flower_vfl.privacy.ledger.Ledger`): two processes cannot both spend
the last of a budget, and a crash between charge and send loses budget, never privacy (the
re-sent request finds the stored answer; no second draw).

No Flower imports.
"""

from __future__ import annotations

import io
import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Answer", "PartyStore", "StoreError", "default_state_dir", "pack_arrays", "unpack_arrays"]

#: bumped when the tables change; a file of another version is refused, never silently reused
SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS releases (
    source TEXT NOT NULL, run TEXT NOT NULL, round INTEGER NOT NULL, kind TEXT NOT NULL,
    unit TEXT NOT NULL, mechanism TEXT NOT NULL, inputs_hash TEXT NOT NULL,
    noise_multiplier REAL NOT NULL, sigma REAL NOT NULL, sensitivity REAL NOT NULL,
    payload BLOB NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (source, run, round, kind));
CREATE TABLE IF NOT EXISTS state (
    source TEXT NOT NULL, run TEXT NOT NULL, payload BLOB NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (source, run));
CREATE TABLE IF NOT EXISTS sources (
    source TEXT PRIMARY KEY, info TEXT NOT NULL);
"""

#: test hook: called right after a release is durable and before it is returned (the
#: crash test sets it to kill the process there); None in production
_after_commit_hook = None


class StoreError(RuntimeError):
    """The party's store cannot be used as it is (another schema version)."""


def default_state_dir() -> Path:
    """``$FLOWER_VFL_STATE_DIR`` or ``~/.flower-vfl/party-state`` (the party's own disk)."""
    env = os.environ.get("FLOWER_VFL_STATE_DIR")
    return Path(env) if env else Path.home() / ".flower-vfl" / "party-state"


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
    unit: str
    mechanism: str
    inputs_hash: str
    noise_multiplier: float
    sigma: float
    sensitivity: float
    payload: dict
    created: float


_COLS = "run, round, kind, unit, mechanism, inputs_hash, noise_multiplier, sigma, sensitivity"


class PartyStore:
    """A party's releases and answers in ``<state_dir>/party.sqlite`` (or a given file).

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
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables and version != SCHEMA_VERSION:
            self._db.close()
            raise StoreError(f"the party store {path} was written by another flower-vfl version (schema "
                             f"{version}, this one reads {SCHEMA_VERSION}); its releases were keyed by a hash "
                             "of the aligned block, not by the declared data source, so they cannot be "
                             "carried over. Keep the file for your records, move it out of state-dir and "
                             "account for what it spent by hand")
        self._db.executescript(_SCHEMA)
        self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self):
        self._db.close()

    # ------------------------------------------------------------------ queries
    def entries(self, source: str) -> list[Answer]:
        """Every charged release on this source, all runs, oldest first (payloads not loaded)."""
        rows = self._db.execute(f"SELECT {_COLS}, created FROM releases WHERE source=? ORDER BY created, rowid",
                                (source,))
        return [Answer(*r[:9], {}, r[9]) for r in rows]

    def sources(self) -> list[tuple[str, int]]:
        """(source key, number of releases) of every source this store has charged or noted."""
        counts = dict(self._db.execute("SELECT source, COUNT(*) FROM releases GROUP BY source"))
        noted = [r[0] for r in self._db.execute("SELECT source FROM sources")]
        return [(s, int(counts.get(s, 0))) for s in sorted(set(counts) | set(noted))]

    def count(self) -> int:
        """Releases in the whole store (every source)."""
        return int(self._db.execute("SELECT COUNT(*) FROM releases").fetchone()[0])

    def answer(self, source, run, round, kind) -> Answer | None:
        row = self._db.execute(f"SELECT {_COLS}, payload, created FROM releases "
                               "WHERE source=? AND run=? AND round=? AND kind=?",
                               (source, str(run), int(round), kind)).fetchone()
        if row is None:
            return None
        return Answer(*row[:9], unpack_arrays(row[9]), row[10])

    def last_answer(self, source, run, kind) -> Answer | None:
        last = self.last_round(source, run, kind)
        return None if last is None else self.answer(source, run, last, kind)

    def last_round(self, source, run, kind) -> int | None:
        row = self._db.execute("SELECT MAX(round) FROM releases WHERE source=? AND run=? AND kind=?",
                               (source, str(run), kind)).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    # ------------------------------------------------------------------ updates
    def commit_release(self, source, run, round, kind, inputs_hash, *, unit, mechanism, noise_multiplier,
                       sigma, sensitivity, payload: dict, check=None, state: dict | None = None) -> Answer:
        """Charge and store one release in one durable transaction.

        ``check(entries)`` receives every release already charged on this source (all runs,
        read inside the write lock, payloads not loaded) and raises to refuse; nothing is
        written then. ``state`` (optional arrays) is stored as the run's party state in the
        same transaction. Returns the stored :class:`Answer`.
        """
        db = self._db
        db.execute("BEGIN IMMEDIATE")                  # the write lock: check-and-charge is atomic
        try:
            prev = db.execute("SELECT 1 FROM releases WHERE source=? AND run=? AND round=? AND kind=?",
                              (source, str(run), int(round), kind)).fetchone()
            if prev is not None:
                raise RuntimeError(f"round {round} ({kind}) of run {run} was already released")
            if check is not None:
                check(self.entries(source))
            now = time.time()
            db.execute("INSERT INTO releases VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                       (source, str(run), int(round), kind, str(unit), str(mechanism), inputs_hash,
                        float(noise_multiplier), float(sigma), float(sensitivity), pack_arrays(payload), now))
            if state is not None:
                db.execute("INSERT OR REPLACE INTO state VALUES (?,?,?,?)", (source, str(run), pack_arrays(state), now))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        if _after_commit_hook is not None:
            _after_commit_hook()
        return Answer(str(run), int(round), kind, str(unit), str(mechanism), inputs_hash, float(noise_multiplier),
                      float(sigma), float(sensitivity), payload, now)

    def put_state(self, source, run, arrays: dict):
        self._db.execute("INSERT OR REPLACE INTO state VALUES (?,?,?,?)",
                         (source, str(run), pack_arrays(arrays), time.time()))

    def get_state(self, source, run) -> dict | None:
        row = self._db.execute("SELECT payload FROM state WHERE source=? AND run=?", (source, str(run))).fetchone()
        return None if row is None else unpack_arrays(row[0])

    def note_source(self, source, info: dict):
        """Remember what the source is and the budget last configured for it (``flower-vfl ledger``)."""
        self._db.execute("INSERT OR REPLACE INTO sources VALUES (?,?)", (source, json.dumps(info, sort_keys=True)))

    def source_info(self, source) -> dict | None:
        row = self._db.execute("SELECT info FROM sources WHERE source=?", (source,)).fetchone()
        return None if row is None else json.loads(row[0])
