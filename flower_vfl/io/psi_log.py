"""A party's PSI log: every item it was ever asked about, per declared source, on its own disk.

PSI answers whatever it is asked: a requester that asks about 10,000 guessed IDs learns which
of them a party holds, and a cap per request is not a cap (five requests of 2,000 learn a
3,000-ID set). So the party keeps, in a SQLite file of its state folder (``psi-log.sqlite``),
the distinct items of every request and every agreed order it ever answered, per source (the
file its node config names, with its ID column), across all runs, and refuses an answer that
would take the count past its cap, ``psi-max-asked`` × (its own number of IDs in that file).

What the party can count (:mod:`flower_vfl.io.psi`: the party is the PSI *server*):

* ``request``: the label owner's items arrive blinded, H(x)^a under the label owner's key a.
  The party cannot see the IDs; it counts the distinct blinded items. Under one key a, one ID
  gives one item, so this count is the number of distinct IDs asked when the label owner keeps
  its key (:func:`flower_vfl.io.psi.label_owner_key`), and more than it otherwise (a fresh key
  makes every ID new): never fewer.
* ``order``: the agreed order arrives in plaintext; the party counts its distinct IDs (held or
  not: accepting an order tells the requester that the party holds every ID in it).

Both count against **one cap** per source, the party's *membership tests*: every distinct
request item, plus every distinct ID named in an agreed order that the party does not hold
(kind ``absent``; such an order is refused, but its refusal tells the requester that some ID in
it is not held). An order whose IDs the party all holds costs nothing more: an honest order is
the intersection of an answered request, whose items were already counted, so an honest
alignment spends its request's items and nothing else, and the default cap (1.0 x the party's
own IDs) still lets an honest label owner realign as often as it likes. Once the tests have gone
past the cap, every order naming an ID never named in an accepted order before is refused up front,
before it is compared with the party's IDs (so a refusal then says nothing about membership).
An ID counts as named before only when an order the party accepted named it: a refused order
(it holds an ID the party does not) confirms no single ID, so its IDs stay new.
What stays outside the cap is what a requester confirms by naming IDs the party does hold (at
most the party's own IDs, and only IDs the requester already had); what it learns about any
other ID is bounded by the cap, across requests and orders together (before: a cap per kind, so
twice the cap).

Items are stored as keyed digests (HMAC-SHA-256 under a random key of this file, 16 bytes):
the log never holds an ID that the party does not hold itself. Each answer is written and
synced before the party replies (a crash may lose an answer, never an entry).
No Flower imports.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import time
from pathlib import Path

from flower_vfl.errors import UserError

__all__ = ["PsiLog", "PsiBoundError", "psi_log_rows", "source_key", "FILE", "KINDS"]

FILE = "psi-log.sqlite"
KINDS = ("request", "order", "absent")
#: the kinds whose distinct items are membership tests, counted against the one cap
TESTS = ("request", "absent")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS asked (source TEXT NOT NULL, kind TEXT NOT NULL, item BLOB NOT NULL,
                                  PRIMARY KEY (source, kind, item)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS answers (id INTEGER PRIMARY KEY, time REAL NOT NULL, source TEXT NOT NULL,
                                    kind TEXT NOT NULL, run TEXT, split TEXT, n_items INTEGER NOT NULL,
                                    n_new INTEGER NOT NULL, distinct_after INTEGER NOT NULL,
                                    own_size INTEGER NOT NULL, cap INTEGER NOT NULL, refused INTEGER NOT NULL);
"""


class PsiBoundError(UserError, RuntimeError):
    """A PSI answer refused: it would take the distinct items asked past the party's cap."""


def source_key(path: str, id_column: str) -> str:
    """The source a PSI log counts against: the resolved file its node config names and the ID
    column (a view of it, an order or a subset is the same source)."""
    return f"{Path(path).expanduser().resolve()}#id={id_column}"


class PsiLog:
    """The party's PSI log in ``<state_dir>/psi-log.sqlite``.

    Parameters
    ----------
    state_dir : str or Path
        The party's own state folder (node config ``state-dir``).
    """

    def __init__(self, state_dir, check: bool = True):
        from flower_vfl.privacy.store import CountJournal, disk_errors, open_journaled
        folder = Path(state_dir)
        with disk_errors(folder, "create the party's state-dir"):
            folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / FILE
        # a deleted or older psi-log.sqlite would forget what was asked: loud, as the ledger
        self._journal = CountJournal(self.path, "asked", "party's PSI log")
        self._db = open_journaled(self.path, self._journal, _SCHEMA, "party's PSI log", check)
        self._db.execute("BEGIN IMMEDIATE")
        try:
            row = self._db.execute("SELECT value FROM meta WHERE key='digest-key'").fetchone()
            if row is None:
                self._db.execute("INSERT INTO meta VALUES ('digest-key', ?)", (os.urandom(32),))
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._key = bytes(self._db.execute("SELECT value FROM meta WHERE key='digest-key'").fetchone()[0])

    def close(self):
        self._db.close()

    def _digest(self, kind: str, item) -> bytes:
        raw = item if isinstance(item, (bytes, bytearray)) else str(item).encode("utf-8")
        return hmac.new(self._key, kind.encode() + b"|" + bytes(raw), hashlib.sha256).digest()[:16]

    def distinct(self, source: str, kind: str) -> int:
        return int(self._db.execute("SELECT count(*) FROM asked WHERE source=? AND kind=?",
                                    (source, kind)).fetchone()[0])

    def tests(self, source: str) -> tuple[int, int]:
        """(distinct request items, distinct order IDs not held) of ``source``: its membership tests."""
        return self.distinct(source, "request"), self.distinct(source, "absent")

    def record(self, source: str, kind: str, items, own_size: int, factor: float, run=None,
               split: str = "", held=None) -> dict:
        """Add ``items`` to what ``source`` was asked (``kind`` 'request' or 'order'), or refuse.

        One cap for both kinds, ``floor(factor × own_size)`` membership tests (the module doc).
        A request is refused when its new items would take the tests past the cap; an order
        (``held``: per item, whether the party holds that ID) is refused up front, before
        ``held`` is read, when it names an ID never named in an order the party accepted and the
        tests are already past the cap; otherwise its IDs not held count as tests (the caller refuses
        the order itself) and, when it holds them all, its IDs are named. A refusal adds nothing and is logged too (:class:`PsiBoundError`).
        Returns the answer's row (``n_items``, ``n_new``, ``distinct_after``: the tests after
        it, ``cap``)."""
        if kind not in KINDS[:2]:
            raise ValueError(f"kind={kind!r}; choose one of {KINDS[:2]}")
        if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
            raise ValueError(f"psi-max-asked={factor!r} must be a number > 0 (a multiple of the party's own "
                             "number of IDs)")
        items = list(items)
        if kind == "order" and (held is None or len(held) != len(items)):
            raise ValueError("an order is recorded with held=, one flag per ID")
        cap = int(math.floor(float(factor) * int(own_size)))
        digests = [(source, kind, self._digest(kind, it)) for it in items]
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            req, absent = self.tests(source)
            before = req + absent
            if kind == "request":
                t0 = db.total_changes
                db.executemany("INSERT OR IGNORE INTO asked VALUES (?, ?, ?)", digests)
                n_new = db.total_changes - t0
                after = before + n_new
                refused = after > cap
            else:
                # an ID is "named before" only if an order the party accepted (every ID held) named it: a
                # refused order tells only that some of its IDs are not held, so re-naming its IDs one per
                # order past the cap would test each of them for free
                n_new = sum(db.execute("SELECT 1 FROM asked WHERE source=? AND kind=? AND item=?", d).fetchone()
                            is None for d in digests)
                refused = n_new > 0 and before > cap         # decided before membership is read
                t1 = db.total_changes
                if not refused:
                    db.executemany("INSERT OR IGNORE INTO asked VALUES (?, ?, ?)",
                                   [(source, "absent", self._digest("absent", it))
                                    for it, h in zip(items, held) if not h])
                after = before + (db.total_changes - t1)
                if not refused and all(held):
                    db.executemany("INSERT OR IGNORE INTO asked VALUES (?, ?, ?)", digests)
            if refused:
                db.execute("ROLLBACK")
                db.execute("BEGIN IMMEDIATE")
            row = {"time": time.time(), "source": source, "kind": kind, "run": None if run is None else str(run),
                   "split": str(split), "n_items": len(digests), "n_new": int(n_new),
                   "distinct_after": int(before if refused else after), "own_size": int(own_size),
                   "cap": cap, "refused": int(refused)}
            db.execute("INSERT INTO answers (time, source, kind, run, split, n_items, n_new, distinct_after, "
                       "own_size, cap, refused) VALUES (:time, :source, :kind, :run, :split, :n_items, :n_new, "
                       ":distinct_after, :own_size, :cap, :refused)", row)
            db.execute("COMMIT")          # synchronous=FULL: on disk before the party answers
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        self._journal.note(db)            # then its count in the journal, before the party answers
        if refused:
            so_far = (f"the {before} membership tests already answered for {source} ({req} encrypted IDs in PSI "
                      f"requests, {absent} IDs of agreed orders it does not hold)")
            if kind == "request":
                head = (f"this request holds {len(digests)} items, {n_new} of them never asked before; with {so_far} "
                        f"that would pass this party's cap of {cap}")
            else:
                head = (f"this order names {n_new} IDs never named in an accepted order before, and {so_far} are already "
                        f"past this party's cap of {cap}")
            raise PsiBoundError(
                f"PSI bound: {head} (psi-max-asked={factor:g} × its {own_size} IDs; one cap for PSI requests and "
                "agreed orders). Refused, across all runs: raise the node-config key psi-max-asked if the label "
                "owner really holds that many rows")
        return row

    def rows(self) -> list[dict]:
        """Per (source, kind): distinct items asked, answers, refusals, the last cap, and the
        source's membership tests (``tests``, against that one cap); kind ``absent`` (order IDs
        the party does not hold) follows its source's ``order`` row."""
        out = []
        q = ("SELECT source, kind, count(*), sum(refused), sum(n_items), max(time) FROM answers "
             "GROUP BY source, kind ORDER BY source, kind")
        for source, kind, n, refused, items, last in self._db.execute(q).fetchall():
            cap, own = self._db.execute("SELECT cap, own_size FROM answers WHERE source=? AND kind=? "
                                        "ORDER BY id DESC LIMIT 1", (source, kind)).fetchone()
            tests = sum(self.tests(source))
            out.append({"source": source, "kind": kind, "distinct_asked": self.distinct(source, kind),
                        "answers": int(n) - int(refused or 0), "refused": int(refused or 0),
                        "items_received": int(items or 0), "own_size": int(own), "cap": int(cap),
                        "last": float(last), "tests": tests})
            absent = self.distinct(source, "absent")
            if kind == "order" and absent:
                out.append(dict(out[-1], kind="absent", distinct_asked=absent, answers=0, refused=0,
                                items_received=absent))
        return out


def psi_log_rows(state_dir) -> list[dict]:
    """What ``flower-vfl ledger`` shows of a party's PSI log (empty when it has none)."""
    if not (Path(state_dir) / FILE).is_file():
        return []
    log = PsiLog(state_dir, check=False)          # shown as it is, even when short of its journal
    try:
        return log.rows()
    finally:
        log.close()
