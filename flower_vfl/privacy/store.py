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

A ledger that silently starts from zero would hand the budget back, so every committed
release is also one line of a journal beside the SQLite file (``party.journal``, appended
and synced after the commit, before the release leaves). A state folder whose journal names
releases that the ledger does not hold (the SQLite file deleted, or its WAL lost) is refused
when the store opens (:class:`LedgerMissing`) until the party's operator accepts the loss
(``flower-vfl ledger --state-dir D --accept-reset``, :func:`accept_reset`). This guards the
party's own disk against accidents, not against the server (which never touches it):
docs/privacy.md, "Trust model".

No Flower imports.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import secrets
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flower_vfl.errors import UserError

__all__ = ["Answer", "CountJournal", "Plan", "StateDirRequired", "deployed_supernode", "open_journaled", "LedgerMissing", "PartyStore", "StoreDiskError", "StoreError", "accept_reset",
           "default_state_dir", "disk_errors", "journal_check", "pack_arrays", "party_store", "unpack_arrays"]

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
CREATE TABLE IF NOT EXISTS secagg_sums (
    party TEXT NOT NULL, run TEXT NOT NULL, slot TEXT NOT NULL, names TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (party, run, slot));
CREATE TABLE IF NOT EXISTS secagg_answers (
    party TEXT NOT NULL, run TEXT NOT NULL, kind TEXT NOT NULL, key TEXT NOT NULL, digest BLOB NOT NULL,
    masked BLOB NOT NULL, round INTEGER NOT NULL, plain BLOB NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (party, run, kind));
CREATE TABLE IF NOT EXISTS plans (
    source TEXT NOT NULL, plan TEXT NOT NULL, ticket TEXT NOT NULL, mechanism TEXT NOT NULL,
    noise_multiplier REAL NOT NULL, train INTEGER NOT NULL, eval INTEGER NOT NULL, status TEXT NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL, PRIMARY KEY (source, plan));
CREATE TABLE IF NOT EXISTS plan_runs (
    source TEXT NOT NULL, run TEXT NOT NULL, plan TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (source, run));
CREATE TABLE IF NOT EXISTS secagg_rosters (
    party TEXT PRIMARY KEY, names TEXT NOT NULL, created REAL NOT NULL);
"""
#: (the plan and secagg tables came after schema 2 without changing it: an older file gets them when it
#: opens, and an older version of this code ignores them)

#: runs whose last masked answers a party keeps (the most recently answered); the sums record of
#: every run is kept (a few bytes per round)
SECAGG_KEEP_RUNS = 4

#: test hook: called right after a release is durable and before it is returned (the
#: crash test sets it to kill the process there); None in production
_after_commit_hook = None


class StoreError(UserError, RuntimeError):
    """The party's store cannot be used as it is (another schema version)."""


class LedgerMissing(StoreError):
    """The journal names releases the ledger no longer holds (its file deleted or its WAL lost)."""


class StoreDiskError(StoreError):
    """The party's state folder cannot be written (read-only, full, or a file where a folder
    should be): named with its path; nothing already committed is lost."""


@contextlib.contextmanager
def disk_errors(path, what: str, key: str = "state-dir"):
    """Turn an OS or SQLite error on ``path`` into a :class:`StoreDiskError` naming the path, the
    node-config ``key`` that chose it and the fix. SQLite rolls back a failed transaction and the
    journal is appended only after a commit, so what was committed before stays valid."""
    try:
        yield
    except (OSError, sqlite3.OperationalError) as exc:
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            raise                                   # another process holds the lock: not a disk error
        reason = getattr(exc, "strerror", None) or str(exc)
        raise StoreDiskError(
            f"cannot {what} {path}: {reason}. Set the node-config key {key} to a writable folder with free "
            "space on this party's disk (not a file), or free/remount this one; nothing already written there "
            "is lost (every committed release stays in the ledger and its journal)") from exc


#: the journal's first line: which file it vouches for
_JOURNAL_HEAD = {"flower-vfl-journal": 1}


def _journal_path(path: Path) -> Path:
    return path.with_name(path.stem + ".journal")


def _journal_line(source, run, round, kind) -> str:
    src = hashlib.sha256(str(source).encode()).hexdigest()[:16]
    return json.dumps([src, str(run), int(round), str(kind)], separators=(",", ":"))


def _append(journal: Path, lines):
    """Append ``lines`` to the journal and sync it (created with its head line if absent)."""
    new = not journal.exists()
    with open(journal, "a", encoding="utf-8") as fh:
        if new:
            fh.write(json.dumps(_JOURNAL_HEAD) + "\n")
        for line in lines:
            fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _journaled(journal: Path) -> set:
    with open(journal, encoding="utf-8") as fh:
        return {line.strip() for line in fh if line.startswith("[")}     # the head line is an object


def _ledger_lines(db) -> set:
    return {_journal_line(*r) for r in db.execute("SELECT source, run, round, kind FROM releases")}


def _reset_hint(state_dir) -> str:
    return (f"If the loss is known and accepted (the spent budget is then forgotten), run "
            f"`flower-vfl ledger --state-dir {state_dir} --accept-reset`; otherwise restore the file from a "
            "backup first")


def journal_check(path) -> dict:
    """Compare the ledger at ``path`` (a state-dir or ``.sqlite`` file) with its journal, read-only:
    ``{"journaled", "in_ledger", "missing", "ledger_file", "journal"}``."""
    path = Path(path).expanduser()
    path = path if path.suffix == ".sqlite" else path / "party.sqlite"
    journal = _journal_path(path)
    journaled = _journaled(journal) if journal.is_file() else set()
    held = set()
    if path.is_file():
        db = sqlite3.connect(str(path), timeout=30.0)      # reads only
        try:
            held = _ledger_lines(db)
        except sqlite3.DatabaseError:
            held = set()
        finally:
            db.close()
    return {"journaled": len(journaled), "in_ledger": len(held), "missing": len(journaled - held),
            "ledger_file": str(path), "ledger_exists": path.is_file(), "journal": str(journal),
            "journal_exists": journal.is_file()}


def accept_reset(path) -> dict:
    """The operator accepts that the ledger at ``path`` lost releases: the old journal is kept as
    ``party.journal.reset-<time>`` and a new one is written from what the ledger holds now.
    Returns :func:`journal_check`'s figures from before the reset and the archived journal's path."""
    before = journal_check(path)
    journal = Path(before["journal"])
    archived = None
    if journal.is_file():
        archived = journal.with_name(f"{journal.name}.reset-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        journal.rename(archived)
    if before["journal_exists"] or before["ledger_exists"] or not count_journals(journal.parent):
        store = PartyStore(before["ledger_file"], check=False)
        try:
            _append(journal, sorted(_ledger_lines(store._db)))
        finally:
            store.close()
    others = _reset_count_journals(journal.parent)      # label-store.journal, psi-log.journal
    return {**before, "archived_journal": None if archived is None else str(archived), "archived_others": others}


def count_journals(folder: Path) -> list:
    return [p for p in folder.glob("*.journal") if p.name != "party.journal"] if folder.is_dir() else []


class CountJournal:
    """The loud check for the party's other SQLite files (``label-store.sqlite``, ``psi-log.sqlite``):
    beside ``db_path``, ``<stem>.journal`` records how many rows ``table`` held after each commit
    (appended and synced). Those rows only grow, so a file that holds fewer than its journal last
    recorded (deleted, or replaced by an older copy) would silently start over: refused
    (:class:`LedgerMissing`) until the operator runs ``flower-vfl ledger --state-dir D --accept-reset``.

    Parameters
    ----------
    db_path : Path
        The SQLite file.
    table : str
        The table whose rows are counted.
    what : str
        What the file holds, in words (for the refusal).
    """

    def __init__(self, db_path, table: str, what: str):
        self.db_path, self.table, self.what = Path(db_path), str(table), what
        self.path = _journal_path(self.db_path)

    def last(self) -> int:
        """The largest count the journal recorded (0: no journal)."""
        if not self.path.is_file():
            return 0
        with open(self.path, encoding="utf-8") as fh:
            return max([0] + [int(json.loads(line)[0]) for line in fh if line.startswith("[")])

    def check_missing(self):
        """Before the file is opened (opening would create it empty)."""
        n = self.last()
        if n and not self.db_path.is_file():
            raise LedgerMissing(f"the {self.what} {self.db_path} is missing, but its journal {self.path} records "
                                f"{n} row(s) there: this state folder was in use, and starting empty would forget "
                                f"them. Refused. {_reset_hint(self.db_path.parent)}")

    def check(self, db):
        """After opening: refuse a file that holds fewer rows than the journal recorded."""
        n, held = self.last(), self.count(db)
        if held < n:
            raise LedgerMissing(f"the {self.what} {self.db_path} holds {held} row(s) but its journal {self.path} "
                                f"recorded {n}; the file was replaced or its write-ahead log lost, and going on "
                                f"would forget what is gone. Refused. {_reset_hint(self.db_path.parent)}")

    def count(self, db) -> int:
        return int(db.execute(f"SELECT count(*) FROM {self.table}").fetchone()[0])

    def note(self, db):
        """After a commit: append the table's row count (synced)."""
        with disk_errors(self.path, f"write the journal of the {self.what}"):
            new = not self.path.is_file()
            with open(self.path, "a", encoding="utf-8") as fh:
                if new:
                    fh.write(json.dumps({"flower-vfl-count-journal": 1, "table": self.table}) + "\n")
                fh.write(json.dumps([self.count(db)]) + "\n")
                fh.flush()
                os.fsync(fh.fileno())


def _while_locked(call, timeout: float):
    """``call()``, tried again for up to ``timeout`` seconds while SQLite says the file is locked.
    Switching a new file to WAL takes an exclusive lock that SQLite refuses at once (no busy
    wait) while another process opens the same new file (parties that share a state folder in
    simulation do), and a reader meets the same refusal then."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _wal(db, timeout: float):
    """Put ``db`` in WAL mode (:func:`_while_locked`)."""
    _while_locked(lambda: db.execute("PRAGMA journal_mode=WAL"), timeout)


def open_journaled(path: Path, journal: "CountJournal", schema: str, what: str, check: bool = True):
    """Open (create) the SQLite file ``path`` (WAL, ``synchronous=FULL``) with ``schema``, and with
    ``check`` refuse it when ``journal`` says rows are gone (:class:`LedgerMissing`); a file
    without a journal yet gets one. The label store and the PSI log open through this."""
    if check:
        journal.check_missing()
    with disk_errors(path, f"open the {what}"):
        db = sqlite3.connect(str(path), timeout=60.0, isolation_level=None)
        _wal(db, 60.0)
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(schema)
    if check:
        try:
            journal.check(db)
        except BaseException:
            db.close()
            raise
        if not journal.path.is_file():
            journal.note(db)
    return db


def _journal_table(journal: Path):
    """The table a CountJournal file counts (its header line), or None for any other file."""
    try:
        with open(journal, encoding="utf-8") as fh:
            head = json.loads(fh.readline() or "{}")
    except (OSError, ValueError):
        return None
    table = head.get("table") if isinstance(head, dict) and "flower-vfl-count-journal" in head else None
    return table if isinstance(table, str) and table.isidentifier() else None


def count_journal_losses(folder) -> list[dict]:
    """Read-only: the CountJournals in ``folder`` whose file holds fewer rows than recorded (or is
    missing): ``{"file", "journal", "recorded", "held"}`` each (``flower-vfl ledger``)."""
    out = []
    folder = Path(folder)
    for journal in sorted(folder.glob("*.journal")) if folder.is_dir() else []:
        table = _journal_table(journal)
        if table is None:
            continue
        cj = CountJournal(journal.with_suffix(".sqlite"), table, "file")
        held = 0
        if cj.db_path.is_file():
            db = sqlite3.connect(str(cj.db_path), timeout=30.0)
            try:
                held = _while_locked(lambda: cj.count(db), 30.0)
            except sqlite3.DatabaseError as exc:
                if "locked" in str(exc):
                    raise                   # still locked after 30 s: not a file that lost its rows
                held = 0
            finally:
                db.close()
        if held < cj.last():
            out.append({"file": str(cj.db_path), "journal": str(journal), "recorded": cj.last(), "held": held})
    return out


def _reset_count_journals(folder: Path) -> list:
    """accept_reset's part for the CountJournals in ``folder``: archive each and restart it at the
    count its file holds now. Returns the archived journals."""
    archived = []
    for journal in sorted(folder.glob("*.journal")):
        table = _journal_table(journal)
        if table is None:
            continue
        db_path = journal.with_suffix(".sqlite")
        cj = CountJournal(db_path, table, "file")
        if db_path.is_file():
            db = sqlite3.connect(str(db_path), timeout=30.0)
            try:
                ok = cj.count(db) >= cj.last()
            finally:
                db.close()
            if ok:
                continue
        target = journal.with_name(f"{journal.name}.reset-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        journal.rename(target)
        archived.append(str(target))
        if db_path.is_file():
            db = sqlite3.connect(str(db_path), timeout=30.0)
            try:
                cj.note(db)
            finally:
                db.close()
    return archived


class StateDirRequired(StoreError):
    """A deployed SuperNode's ClientApp without node config ``state-dir`` (nor
    ``$FLOWER_VFL_STATE_DIR``): the per-user default would be shared by every SuperNode this
    account runs, and their ledgers, PSI logs and caches with it."""


#: the processes that run a deployed SuperNode's ClientApp: Flower's (``--isolation subprocess``
#: starts ``flwr-clientapp``; in-process isolation runs it in ``flower-supernode``) and the warm
#: executor's forks (``python -m flower_vfl.deploy.warm_exec``)
DEPLOYED_PROCESSES = ("flwr-clientapp", "flower-supernode", "warm_exec.py")


def deployed_supernode() -> bool:
    """Whether this process runs a deployed SuperNode's ClientApp (not a simulation, not in-process)."""
    import sys
    return Path(sys.argv[0] if sys.argv else "").name in DEPLOYED_PROCESSES


def default_state_dir() -> Path:
    """The party's state folder when its node config names none: ``$FLOWER_VFL_STATE_DIR``, else
    the per-user ``~/.flower-vfl/party-state`` (in-process, the CLI, Flower's simulation: one
    operator plays every party). A deployed SuperNode must name its own folder (node config
    ``state-dir``): raises :class:`StateDirRequired` there, before the party reads anything."""
    env = os.environ.get("FLOWER_VFL_STATE_DIR")
    if env:
        return Path(env)
    if deployed_supernode():
        raise StateDirRequired(
            "this SuperNode's node config has no state-dir: a deployed party keeps its privacy ledger, PSI "
            "log and block cache in a folder of its own (the per-user default ~/.flower-vfl/party-state would "
            "be shared by every SuperNode of this account). Start the SuperNode with --node-config "
            "\"partition-id=<m> ... state-dir=/path/to/party-<m>-state\" (one folder per SuperNode, kept "
            "across runs), or set FLOWER_VFL_STATE_DIR for its process")
    return Path.home() / ".flower-vfl" / "party-state"


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


@dataclass(frozen=True)
class Plan:
    """A private party's plan: the releases one run (and every resume of it) may make, reserved
    on the party's disk when the run is admitted (:meth:`PartyStore.admit_plan`).

    ``plan`` is the ledger run of its releases (the Flower run that opened it), ``ticket`` the
    random half of the token a resume must present (:attr:`token`), ``status`` 'open' (its unmade
    releases are reserved), 'closed' (its model is out), 'lapsed' (idle past the party's
    ``dp-plan-expiry``) or 'released' (by the party's operator); ``runs`` the Flower runs admitted
    to it; ``made_train`` / ``made_eval`` its releases so far."""

    plan: str
    ticket: str
    mechanism: str
    noise_multiplier: float
    train: int
    eval: int
    status: str
    created: float
    updated: float
    runs: tuple
    made_train: int
    made_eval: int

    @property
    def token(self) -> str:
        return f"{self.plan}#{self.ticket}"

    @property
    def made(self) -> int:
        return self.made_train + self.made_eval

    @property
    def complete(self) -> bool:
        """Its model is out (or, a plan without one, every training release made)."""
        return self.made_eval >= self.eval and (self.eval > 0 or self.made_train >= self.train)

    def reserved_events(self) -> list[tuple[str, float]]:
        """(mechanism, z) of each planned release not made yet (none unless open)."""
        if self.status != "open" or self.complete:
            return []
        n = max(0, self.train - self.made_train) + max(0, self.eval - self.made_eval)
        return [(self.mechanism, self.noise_multiplier)] * n


class PartyStore:
    """A party's releases and answers in ``<state_dir>/party.sqlite`` (or a given file).

    Parameters
    ----------
    path : str or Path
        A directory (the file ``party.sqlite`` is created in it), a ``.sqlite`` file, or
        ``":memory:"`` (the in-process engine: nothing outlives the process).
    check : bool, default=True
        Refuse (:class:`LedgerMissing`) a ledger that holds fewer releases than its journal
        names; False opens it anyway (``flower-vfl ledger``, to show the loss).
    """

    def __init__(self, path, check: bool = True):
        self.journal = None
        if str(path) == ":memory:":                    # the in-process engine: one user, one process
            self.path = ":memory:"
            self._db = sqlite3.connect(":memory:", isolation_level=None)
            self._db.executescript(_SCHEMA)
            return
        path = Path(path).expanduser()
        if path.suffix != ".sqlite":
            path = path / "party.sqlite"
        if path.parent.exists() and not path.parent.is_dir():
            raise StoreDiskError(f"the party's state-dir {path.parent} is a file, not a folder. Set the node-config "
                                 "key state-dir to a folder on this party's disk (it is created if missing)")
        with disk_errors(path.parent, "create the party's state-dir"):
            path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.journal = _journal_path(path)
        if check and self.journal.is_file() and not path.is_file():
            n = len(_journaled(self.journal))
            raise LedgerMissing(
                f"the party's ledger {path} is missing, but its journal {self.journal} names {n} release(s) "
                f"charged there: this state folder was in use, and starting from an empty ledger would "
                f"hand the spent budget back. Refused. {_reset_hint(path.parent)}")
        with disk_errors(path, "open the party's ledger"):
            self._open(path, check)

    def _open(self, path, check):
        self._db = sqlite3.connect(str(path), timeout=30.0, isolation_level=None)
        _wal(self._db, 30.0)
        self._db.execute("PRAGMA synchronous=FULL")     # a commit is on disk before we go on
        # the version check, the tables and the version number in one write transaction: parties that
        # share a folder (simulation, one operator) open it at once, and another process must never
        # see the tables of a new file before its version (it took them for another version's file)
        self._db.execute("BEGIN IMMEDIATE")
        try:
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if tables and version != SCHEMA_VERSION:
                raise StoreError(f"the party store {path} was written by another flower-vfl version (schema "
                                 f"{version}, this one reads {SCHEMA_VERSION}); its releases were keyed by a hash "
                                 "of the aligned block, not by the declared data source, so they cannot be "
                                 "carried over. Keep the file for your records, move it out of state-dir and "
                                 "account for what it spent by hand")
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._db.execute(statement)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            self._db.close()
            raise
        held = _ledger_lines(self._db)
        journaled = _journaled(self.journal) if self.journal.is_file() else set()
        missing = journaled - held
        if check and missing:
            self._db.close()
            raise LedgerMissing(
                f"the party's ledger {path} holds {len(held)} release(s) but its journal {self.journal} names "
                f"{len(journaled)}; {len(missing)} charged release(s) are gone (the file was replaced or its "
                f"write-ahead log {path.name}-wal lost), and starting from them would hand that budget back. "
                f"Refused. {_reset_hint(path.parent)}")
        if held - journaled or not self.journal.is_file():
            # a crash between a commit and its journal line (or a folder from before the journal)
            _append(self.journal, sorted(held - journaled))
        st = path.stat()
        self._ident = (st.st_dev, st.st_ino)

    def still_there(self) -> bool:
        """False when the file this store opened was deleted or replaced since (reopen it:
        the journal check then runs again)."""
        if self.path == ":memory:":
            return True
        try:
            st = Path(self.path).stat()
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._ident

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
        with disk_errors(self.path, "charge a release in the party's ledger"):
            return self._commit_release(source, run, round, kind, inputs_hash, unit=unit, mechanism=mechanism,
                                        noise_multiplier=noise_multiplier, sigma=sigma, sensitivity=sensitivity,
                                        payload=payload, check=check, state=state)

    def _commit_release(self, source, run, round, kind, inputs_hash, *, unit, mechanism, noise_multiplier,
                        sigma, sensitivity, payload, check, state) -> Answer:
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
            self._plan_made(source, str(run), now)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        if self.journal is not None:     # durable in the ledger, then in the journal, then released
            _append(self.journal, [_journal_line(source, run, round, kind)])
        if _after_commit_hook is not None:
            _after_commit_hook()
        return Answer(str(run), int(round), kind, str(unit), str(mechanism), inputs_hash, float(noise_multiplier),
                      float(sigma), float(sensitivity), payload, now)

    def put_state(self, source, run, arrays: dict):
        with disk_errors(self.path, "write the party's state to"):
            self._db.execute("INSERT OR REPLACE INTO state VALUES (?,?,?,?)",
                             (source, str(run), pack_arrays(arrays), time.time()))

    def get_state(self, source, run) -> dict | None:
        row = self._db.execute("SELECT payload FROM state WHERE source=? AND run=?", (source, str(run))).fetchone()
        return None if row is None else unpack_arrays(row[0])

    def prune_states(self, source, keep_rows: int, prefix: str, keep_sources: int) -> None:
        """Keep the ``keep_rows`` most recently written state rows of ``source`` and, of the
        sources starting with ``prefix``, the ``keep_sources`` most recently written (a non-private
        party's resume states under secure aggregation, :mod:`flower_vfl.clients.party_secagg`)."""
        with disk_errors(self.path, "prune the party's kept states in"):
            self._db.execute("DELETE FROM state WHERE source=? AND run NOT IN (SELECT run FROM state WHERE source=? "
                             "ORDER BY updated DESC LIMIT ?)", (source, source, int(keep_rows)))
            self._db.execute("DELETE FROM state WHERE substr(source, 1, ?)=? AND source NOT IN (SELECT source FROM "
                             "state WHERE substr(source, 1, ?)=? GROUP BY source ORDER BY MAX(updated) DESC LIMIT ?)",
                             (len(prefix), prefix, len(prefix), prefix, int(keep_sources)))

    # ------------------------------------------------------------------ secure aggregation
    def secagg_sums(self, party, run) -> dict:
        """{'<kind>/<round>': 'name,name,...'}: the set of names each (kind, round) of ``run`` was
        answered in a sum over, by the party ``party``."""
        rows = self._db.execute("SELECT slot, names FROM secagg_sums WHERE party=? AND run=?", (str(party), str(run)))
        return {slot: names for slot, names in rows}

    def secagg_answer(self, party, run, kind) -> tuple[str, bytes] | None:
        """(replay key, broadcast digest) of the last masked answer of ``kind`` in ``run``."""
        row = self._db.execute("SELECT key, digest FROM secagg_answers WHERE party=? AND run=? AND kind=?",
                               (str(party), str(run), str(kind))).fetchone()
        return None if row is None else (str(row[0]), bytes(row[1]))

    def secagg_masked(self, party, run, kind, key) -> np.ndarray | None:
        """The stored masked answer of ``kind`` in ``run`` under the replay key ``key`` (uint64)."""
        row = self._db.execute("SELECT masked FROM secagg_answers WHERE party=? AND run=? AND kind=? AND key=?",
                               (str(party), str(run), str(kind), str(key))).fetchone()
        return None if row is None else np.frombuffer(row[0], dtype="<u8").astype(np.uint64)

    def secagg_plain(self, party, run, kind) -> tuple[int, np.ndarray] | None:
        """(round, value before masking) of the last masked answer of ``kind`` in ``run``."""
        row = self._db.execute("SELECT round, plain FROM secagg_answers WHERE party=? AND run=? AND kind=?",
                               (str(party), str(run), str(kind))).fetchone()
        return None if row is None else (int(row[0]), unpack_arrays(row[1])["value"])

    def secagg_roster(self, party) -> str | None:
        """The roster ``party`` answers secure sums over (``'name,name,...'``), None before its first
        masked answer (read only: :meth:`claim_secagg_roster` records it)."""
        row = self._db.execute("SELECT names FROM secagg_rosters WHERE party=?", (str(party),)).fetchone()
        return None if row is None else str(row[0])

    def claim_secagg_roster(self, party, names: str) -> str:
        """The one roster (``'name,name,...'``) ``party`` answers secure sums over, ever: the
        recorded one, else ``names``, recorded now (durable, one transaction) and returned. Keyed
        by the party alone (its node config's identity), not by the run."""
        row = self._db.execute("SELECT names FROM secagg_rosters WHERE party=?", (str(party),)).fetchone()
        if row is not None:                 # recorded once, never changed: no write lock needed
            return str(row[0])
        with disk_errors(self.path, "record the secure-aggregation roster in the party's store"):
            db, party = self._db, str(party)
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("INSERT OR IGNORE INTO secagg_rosters VALUES (?,?,?)", (party, str(names), time.time()))
                row = db.execute("SELECT names FROM secagg_rosters WHERE party=?", (party,)).fetchone()
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        return str(row[0])

    def commit_secagg(self, party, run, kind, key, digest: bytes, masked, slots: dict, check,
                      plain: tuple[int, np.ndarray]) -> np.ndarray:
        """Record a masked answer before it leaves, in one durable transaction.

        Under the write lock, ``check(recorded, prior)`` gets the sums record of (``party``,
        ``run``) and the (key, digest) of the stored answer of ``kind`` (None); it raises to
        refuse (nothing written), or returns True when the stored answer is this very request's
        (another process answered it first): that answer is returned and nothing is written.
        Otherwise ``slots`` ({slot: names}) are added to the sums record (a slot already there
        keeps its names) and ``masked`` replaces the answer of ``kind``, with ``plain`` (its round
        and the value it masks: :meth:`secagg_plain`); the answers of runs other than the
        :data:`SECAGG_KEEP_RUNS` most recent are deleted. Returns the answer to send."""
        with disk_errors(self.path, "record a secure-aggregation answer in the party's store"):
            db, party, run = self._db, str(party), str(run)
            db.execute("BEGIN IMMEDIATE")
            try:
                prior = self.secagg_answer(party, run, kind)
                if check(self.secagg_sums(party, run), prior):
                    db.execute("ROLLBACK")
                    return self.secagg_masked(party, run, kind, prior[0])
                now = time.time()
                db.executemany("INSERT OR IGNORE INTO secagg_sums VALUES (?,?,?,?,?)",
                               [(party, run, str(k), str(v), now) for k, v in slots.items()])
                db.execute("INSERT OR REPLACE INTO secagg_answers VALUES (?,?,?,?,?,?,?,?,?)",
                           (party, run, str(kind), str(key), bytes(digest),
                            np.ascontiguousarray(masked, dtype="<u8").tobytes(), int(plain[0]),
                            pack_arrays({"value": np.asarray(plain[1])}), now))
                db.execute("DELETE FROM secagg_answers WHERE party=? AND run NOT IN (SELECT run FROM secagg_answers "
                           "WHERE party=? GROUP BY run ORDER BY MAX(updated) DESC LIMIT ?)",
                           (party, party, SECAGG_KEEP_RUNS))
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        return np.asarray(masked, dtype=np.uint64)

    # ------------------------------------------------------------------ plans (reservations)
    def _plan_rows(self, source, where: str = "", args: tuple = ()) -> list[Plan]:
        rows = self._db.execute("SELECT plan, ticket, mechanism, noise_multiplier, train, eval, status, created, updated "
                                f"FROM plans WHERE source=? {where} ORDER BY created, plan", (source, *args)).fetchall()
        out = []
        for r in rows:
            made = dict(self._db.execute("SELECT kind, COUNT(*) FROM releases WHERE source=? AND run=? GROUP BY kind",
                                         (source, r[0])))
            runs = tuple(x[0] for x in self._db.execute("SELECT run FROM plan_runs WHERE source=? AND plan=? "
                                                        "ORDER BY created, rowid", (source, r[0])))
            out.append(Plan(r[0], r[1], r[2], float(r[3]), int(r[4]), int(r[5]), r[6], float(r[7]), float(r[8]),
                            runs, int(made.get("train", 0)), int(made.get("eval", 0))))
        return out

    def plans(self, source) -> list[Plan]:
        """Every plan on ``source``, oldest first."""
        return self._plan_rows(source)

    def plan_of(self, source, run) -> Plan | None:
        """The plan the Flower run ``run`` was admitted to (None: not admitted)."""
        row = self._db.execute("SELECT plan FROM plan_runs WHERE source=? AND run=?", (source, str(run))).fetchone()
        if row is None:
            return None
        plans = self._plan_rows(source, "AND plan=?", (row[0],))
        return plans[0] if plans else None

    def reserved_events(self, source, exclude_plan=None) -> list[tuple[str, float]]:
        """The releases the open plans on ``source`` (other than ``exclude_plan``) reserved and have
        not made yet, as (mechanism, z) events: what no other plan may spend."""
        return [e for p in self._plan_rows(source, "AND status='open'") if p.plan != str(exclude_plan)
                for e in p.reserved_events()]

    def _plan_made(self, source, plan, now):
        """After a release of ``plan`` (inside the commit's transaction): note the activity, and
        close the plan once its model is out (its reservation is then released)."""
        self._db.execute("UPDATE plans SET updated=? WHERE source=? AND plan=?", (now, source, plan))
        for p in self._plan_rows(source, "AND plan=? AND status='open'", (plan,)):
            if p.complete:
                self._db.execute("UPDATE plans SET status='closed' WHERE source=? AND plan=?", (source, plan))

    def admit_plan(self, source, run, *, mechanism, noise_multiplier, train, eval, token=None, decide=None,
                   expiry=None) -> tuple[Plan, str]:
        """Admit the Flower run ``run`` to a plan, in one durable transaction; returns (plan, how).

        ``how`` is ``'attached'`` (the run was admitted before: identify re-sent, a later message),
        ``'continued'`` (``token`` names one of this source's plans, ``'<plan>#<ticket>'``, as its
        identify reply gave it: a resume continues that plan, its releases and its allowance; an open
        plan is not re-checked, since a plan can never release more than it planned; a lapsed one
        gave up its reservation, so ``decide(entries, blocking, reopen=plan)`` must accept its unmade
        releases again before it reopens) or ``'new'`` (a plan of
        ``train`` + ``eval`` releases at ``noise_multiplier``, reserved now). Before a new plan,
        ``decide(entries, blocking)`` gets every release on the source and the open plans, and raises
        to refuse (no plan written). Open plans without a release (nor a first resume since) for ``expiry`` seconds
        lapse first (their unmade releases are no longer reserved), and that lapse stands when
        ``decide`` refuses: the ledger then lists them as 'lapsed', as ``decide`` saw them."""
        with disk_errors(self.path, "reserve a plan in the party's ledger"):
            db, run = self._db, str(run)
            db.execute("BEGIN IMMEDIATE")
            try:
                now = time.time()
                if expiry is not None:
                    db.execute("UPDATE plans SET status='lapsed' WHERE source=? AND status='open' AND updated < ?",
                               (source, now - float(expiry)))
                how, plan = "attached", self.plan_of(source, run)
                renew = False         # a message of a run admitted before renews nothing (only a release does)
                if plan is not None and plan.status in ("lapsed", "released") and not plan.complete \
                        and decide is not None:
                    # the run of a lapsed (or operator-released) plan goes on (its own next message, or a run
                    # id the server reused): its unmade releases must fit again before it continues, as for a
                    # resume (else it would stop part-way, its releases spent without a model)
                    lapsed = plan
                    self._decide_keeping_lapses(db, lambda e, o: decide(e, o, reopen=lapsed), source)
                    db.execute("UPDATE plans SET status='open' WHERE source=? AND plan=?", (source, plan.plan))
                if plan is None and token:
                    name, _, ticket = str(token).rpartition("#")
                    found = self._plan_rows(source, "AND plan=? AND ticket=?", (name, ticket)) if name else []
                    if found:
                        how, plan = "continued", found[0]
                        renew = self._first_resume_since_release(source, plan)
                        if plan.status in ("lapsed", "released"):
                            # its reservation was given up (it lapsed, or the operator released it): other
                            # plans may have taken that budget since, so its unmade releases must fit again
                            # (else its resume would stop part-way, its releases spent without a model)
                            if decide is not None and not plan.complete:
                                lapsed = plan
                                self._decide_keeping_lapses(db, lambda e, o: decide(e, o, reopen=lapsed), source)
                            db.execute("UPDATE plans SET status='open' WHERE source=? AND plan=?", (source, plan.plan))
                        db.execute("INSERT INTO plan_runs VALUES (?,?,?,?)", (source, run, plan.plan, now))
                if plan is None:
                    how = "new"
                    if decide is not None:
                        self._decide_keeping_lapses(db, decide, source)
                    db.execute("INSERT INTO plans VALUES (?,?,?,?,?,?,?,?,?,?)",
                               (source, run, secrets.token_hex(8), str(mechanism), float(noise_multiplier), int(train),
                                int(eval), "open", now, now))
                    db.execute("INSERT INTO plan_runs VALUES (?,?,?,?)", (source, run, run, now))
                if renew:
                    db.execute("UPDATE plans SET updated=? WHERE source=? AND plan=?", (now, source, plan.plan))
                plan = self.plan_of(source, run)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        return plan, how

    def _first_resume_since_release(self, source, plan: Plan) -> bool:
        """Whether a resume of ``plan`` now renews its activity: only the first resume after its
        opening or its last release does (a crashed run's honest resume). Every other message
        (identify re-sent, later resumes, refused or re-sent requests) renews nothing, so without a
        release a plan is renewed once at most: a central node that never releases holds a
        reservation 2 x ``dp-plan-expiry`` at most when its one resume comes in time (docs/privacy.md,
        "Never stuck")."""
        last = self._db.execute("SELECT MAX(created) FROM releases WHERE source=? AND run=?",
                                (source, plan.plan)).fetchone()[0]
        since = max(plan.created, float(last) if last is not None else plan.created)
        resumed = self._db.execute("SELECT COUNT(*) FROM plan_runs WHERE source=? AND plan=? AND run<>? AND created>?",
                                   (source, plan.plan, plan.plan, since)).fetchone()[0]
        return int(resumed) == 0

    def _decide_keeping_lapses(self, db, decide, source):
        """``decide`` on a new plan, inside :meth:`admit_plan`'s transaction; on its refusal, only the
        new plan is rolled back (nothing of it is written yet: the savepoint says so) and the lapses
        made before it are committed, then the refusal is raised.

        Crash safety: this transaction writes no release, so none can be lost here (a release and its
        plan's activity are charged in :meth:`commit_release`'s own transaction). SQLite commits the
        lapse, with or without the new plan, atomically (WAL, synchronous=FULL): a crash leaves either
        the plans before this call (the next admit lapses them again: the lapse depends only on the
        clock and each plan's last activity) or after it, never half. A plan's unmade releases count as
        reserved only while it is 'open', and one UPDATE moves it to 'lapsed', so no reservation is
        counted twice nor counted by a lapsed plan, and the refused plan reserves nothing."""
        db.execute("SAVEPOINT new_plan")
        try:
            decide(self.entries(source), self._plan_rows(source, "AND status='open'"))
        except Exception:
            db.execute("ROLLBACK TO new_plan")
            db.execute("COMMIT")        # the lapses stand on their own; a failed COMMIT rolls back in the caller
            raise
        db.execute("RELEASE new_plan")

    def release_plan(self, source, plan) -> bool:
        """The party's operator gives up the reservation of ``plan`` (its releases stay charged)."""
        with disk_errors(self.path, "release a plan in the party's ledger"):
            cur = self._db.execute("UPDATE plans SET status='released' WHERE source=? AND plan=? AND status='open'",
                                   (source, str(plan)))
        return cur.rowcount > 0

    def alias(self, source, run, plan) -> None:
        """Admit the (ledger) run ``run`` to the stored release of ``plan`` (a one-release route's
        re-run that asked for the same release): nothing charged, nothing reserved."""
        with disk_errors(self.path, "note a re-served release in the party's ledger"):
            self._db.execute("INSERT OR IGNORE INTO plan_runs VALUES (?,?,?,?)", (source, str(run), str(plan),
                                                                                   time.time()))

    def aliased(self, source, run) -> str | None:
        """The ledger run whose stored release ``run`` was admitted to (:meth:`alias`), or None."""
        row = self._db.execute("SELECT plan FROM plan_runs WHERE source=? AND run=?", (source, str(run))).fetchone()
        return None if row is None else str(row[0])

    def note_source(self, source, info: dict):
        """Remember what the source is and the budget last configured for it (``flower-vfl ledger``)."""
        with disk_errors(self.path, "note the data source in"):
            self._db.execute("INSERT OR REPLACE INTO sources VALUES (?,?)", (source, json.dumps(info, sort_keys=True)))

    def source_info(self, source) -> dict | None:
        row = self._db.execute("SELECT info FROM sources WHERE source=?", (source,)).fetchone()
        return None if row is None else json.loads(row[0])


#: open party stores by state-dir (one SQLite connection per process)
OPEN_STORES: dict = {}


def party_store(state_dir):
    """The party's store in ``state_dir`` (default :func:`~flower_vfl.privacy.store.default_state_dir`),
    opened once per process, and opened again (its journal re-checked) when the file was deleted
    or replaced since."""
    key = str(state_dir or default_state_dir())
    if key not in OPEN_STORES or not OPEN_STORES[key].still_there():
        old = OPEN_STORES.pop(key, None)
        if old is not None:
            old.close()
        OPEN_STORES[key] = PartyStore(key)
    return OPEN_STORES[key]
