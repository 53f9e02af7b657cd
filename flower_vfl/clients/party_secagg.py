"""A party's side of secure aggregation in the Flower path (glue only: the crypto is
:mod:`flower_vfl.secagg`, the protocol is docs/secagg.md).

- ``query.secagg_keys``: the party answers with its signed key advert for this run. Its X25519
  key is drawn once per run and kept in ``context.state`` (a re-sent query gets the same advert;
  a restarted party draws a new one, so the central node must relay a new roster).
- A train / evaluate message with ``config['secagg.adverts']`` (the relayed roster) and
  ``config['secagg.parties']`` (the names summed in this message) gets a masked reply: the party
  verifies the roster (pins, ``secagg-min-parties``, ``secagg-require``), encodes its release in
  fixed point (a private party clips its noisy release to its bound, post-processing; a
  non-private one refuses a value outside it) and masks it against the SHA-256 of the broadcast
  it received (every array and config value). The masked answer is kept in the party's own store
  (:meth:`~flower_vfl.privacy.store.PartyStore.commit_secagg`, node config ``state-dir``) before
  it is sent: the same message again gets the same bytes; another broadcast for the same round is
  refused.
- What guards privacy is on the party's own disk, not in ``context.state``: Flower may drop a
  large context at the end of a message (a masked answer is 8 N bytes), and the central node may
  be malicious. The sums record (the one set of names each (kind, round) was answered in a sum
  over) and the last masked answer per kind are rows of the party's SQLite store, keyed by the run
  (``context.run_id``) and the party (its node config's ``partition-id`` and ``secagg-name``:
  nothing the server sends), committed (``synchronous=FULL``) before the reply leaves. The answers
  of the last :data:`~flower_vfl.privacy.store.SECAGG_KEEP_RUNS` runs are kept; every run's sums
  record is kept. A run whose ``context.state`` still holds such entries from an earlier version
  (``vfl.secagg.sums``, ``vfl.secagg.answer.<kind>``, ``vfl.secagg.masked.<kind>``) reads them
  too: its sums are checked and copied to the store with the next answer, which then deletes them
  from the context. The X25519 key stays in ``context.state`` (:data:`STATE_KEYS`): a party that
  lost it refuses with ``secagg-rekey`` and the sums record still binds every round it answered.
- One roster per party, ever: whatever the round, the kind or the run, the party's masked answers
  are all sums over one set of names. With ``secagg-pins`` every pinned party is required
  (``secagg-require-all``, default true; false is a documented weakening); in every setting the
  names of its first masked answer are recorded in its store
  (:meth:`~flower_vfl.privacy.store.PartyStore.claim_secagg_roster`, keyed by ``partition-id`` and
  ``secagg-name``, never by the run), durably before any value is computed, and any other set is
  refused (:class:`~flower_vfl.secagg.RosterConflict`, code ``secagg-roster``). A plain release is a
  sum over the party alone: with pinned keys, a party that answered a secure sum refuses every plain
  release (:meth:`PartySecAgg.check_plain`), and one that released in the clear records itself as its
  roster and refuses every secure sum (:meth:`PartySecAgg.claim_plain`): its values could be had again
  in the clear and subtracted from a sum, reading the other parties' values.
- Resume (:func:`resume_identify`, :func:`keep_for_resume`): the central node never sees a
  non-private party's release, so it cannot re-synchronize it; the party gives each run a random
  resume token at identify (checkpointed by the central node) and keeps its state after each masked
  training answer in its store, keyed by ``partition-id``, ``secagg-name`` and the token, before the
  reply leaves; a resumed run presents the token and its checkpoint's round (a restarted node, the
  last round summed), and the party restores that round's state. Its roster stays the one on its disk.
- A deployed SuperNode without ``secagg-pins`` gives no advert and answers no masked request
  unless its node config says ``secagg-trust = 'honest-but-curious'``
  (:class:`~flower_vfl.secagg.TrustRefused`, code ``secagg-trust``).
- Node config (trusted): ``secagg-name``, ``secagg-signing-key``, ``secagg-pins``,
  ``secagg-min-parties``, ``secagg-require``, ``secagg-require-all``, ``secagg-trust``,
  ``secagg-bound``, ``secagg-only`` (refuse to release unmasked), and a private party's
  ``dp-distributed-max-colluders`` = k (distributed noise,
  :mod:`flower_vfl.privacy.distributed`): its advert then carries its noise profile (signed), its
  training release is an integer vector with its share of the noise
  (:meth:`FixedPoint.encode_integer`, then masked), and it counts as adders only the parties of
  the sum whose adverts verify under its pins and carry the same profile (no pins: itself only,
  so it adds the whole noise).
"""

from __future__ import annotations

import hashlib
import json
import secrets

import numpy as np
from flwr.app import ConfigRecord, Context

from flower_vfl.privacy.boundary import Refused
from flower_vfl.privacy.store import StateDirRequired, deployed_supernode, party_store
from flower_vfl.secagg import (KeyAgreement, KeyRefused, MaskContext, Rekey, ReplayConflict, ReplayStore, Roster,
                               RosterConflict, SecAggError, Session, TrustRefused, broadcast_digest,
                               load_signing_key, parse_pins)
from flower_vfl.secagg.masking import ADVERTS, PARTIES

__all__ = ["PartySecAgg", "ADVERTS", "PARTIES", "STATE_KEYS", "DEFAULT_BOUND", "secagg_fields", "resume_identify",
           "keep_for_resume", "history_digest"]

STATE_KEYS = "vfl.secagg.keys"
#: (read only: an earlier version kept these in context.state; now in the party's store)
STATE_ANSWER = "vfl.secagg.answer."
STATE_MASKED = "vfl.secagg.masked."
STATE_SUMS = "vfl.secagg.sums"
#: a stored answer not read yet (ReplayStore checks its key and digest first)
_STORED = object()
#: default entry-wise bound on a release (secagg-bound): 2^53 / (16 * 1e4) leaves a scale of 2^35
DEFAULT_BOUND = 1e4


def history_digest(history: str | None, digest: bytes) -> bytes:
    """The digest a masked answer is bound to: the broadcast's own ``digest`` when the party's state has
    no history (``history`` None or ""), else SHA-256 of the history (hex) and the broadcast's digest.
    Parties whose states come from different broadcasts (or views) mask against different digests, so
    their masks do not cancel: no sum mixes them (docs/secagg.md, "One history per sum")."""
    if not history:
        return digest
    return hashlib.sha256(b"flower-vfl/secagg/history|" + bytes.fromhex(history) + b"|" + digest).digest()


def secagg_fields(content) -> tuple[list, list] | None:
    """(adverts, names) of a message that asks for a masked reply, None for a plain one."""
    cfg = content["config"] if "config" in content else {}
    if ADVERTS not in cfg:
        return None
    adverts, names = cfg.get(ADVERTS), cfg.get(PARTIES)
    if not isinstance(adverts, list) or not all(isinstance(a, bytes) for a in adverts):
        raise KeyRefused(f"config[{ADVERTS!r}] must be a list of key adverts (bytes); refused")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or not names:
        raise KeyRefused(f"config[{PARTIES!r}] must be a non-empty list of party names; refused")
    return adverts, names


class PartySecAgg:
    """The party's secure-aggregation settings from its node config (``nc``)."""

    def __init__(self, party_id: int, nc: dict, private: bool):
        self.name = str(nc.get("secagg-name") or f"party{int(party_id)}")
        self.party_id = int(party_id)
        #: the party's own folder (node config state-dir; None: default_state_dir())
        self.state_dir = nc.get("state-dir") or None
        key_path = str(nc.get("secagg-signing-key") or "")
        pins = str(nc.get("secagg-pins") or "")
        self.signing_key = load_signing_key(key_path) if key_path else None
        self.pins = parse_pins(pins) if pins else None
        if self.pins is not None and self.signing_key is None:
            raise KeyRefused(f"party {self.name!r}: node config secagg-pins is set but secagg-signing-key is not: "
                             "the other parties pin this party's key too; give its Ed25519 PEM file")
        self.min_parties = int(nc.get("secagg-min-parties", 2))
        #: node config secagg-require-all (default true): with pins, every pinned party is in every sum
        self.require_all = _flag(nc.get("secagg-require-all", True), "secagg-require-all")
        #: node config secagg-trust: 'honest-but-curious' accepts unpinned adverts on a deployed node
        self.trust = str(nc.get("secagg-trust") or "malicious")
        if self.trust not in TRUST:
            from flower_vfl.config.schema import ConfigError
            raise ConfigError(f"party {int(party_id)}: node config secagg-trust={self.trust!r}; use one of "
                              f"{list(TRUST)} (docs/secagg.md)")
        explicit = tuple(n.strip() for n in str(nc.get("secagg-require") or "").split(",") if n.strip())
        pinned = tuple(sorted(self.pins)) if self.pins is not None and self.require_all else ()
        #: the names every sum must hold: secagg-require, and every pinned party unless secagg-require-all=false
        self.required = tuple(sorted(set(explicit) | set(pinned)))
        self.bound = float(nc.get("secagg-bound", DEFAULT_BOUND))
        self.only = bool(nc.get("secagg-only", False))
        self.on_overflow = "clip" if private else "refuse"
        from flower_vfl.privacy.distributed import NODE_KEY
        k = int(nc.get(NODE_KEY, -1))
        if k >= 0 and not private:
            from flower_vfl.config.schema import ConfigError
            raise ConfigError(f"party {int(party_id)}: node config {NODE_KEY}={k} is for a private party (it sets "
                              "how much of its noise the party adds inside the secure sum); this party is not "
                              "private. Remove it, or make the party private (dp=true dp-epsilon=...)")
        #: k of the node config (None: the party adds its whole noise, no distributed noise)
        self.colluders = k if k >= 0 else None
        #: the distributed-noise profile of the advert (set by the private party client)
        self.noise = b""
        #: the digest the last masked answer was masked against (:meth:`masked_answer`)
        self.mask_digest = None

    def settings(self) -> tuple:
        """What this party's node config set (public keys as hex): equal settings, equal objects."""
        from flower_vfl.secagg import public_key_hex
        return (self.name, None if self.signing_key is None else public_key_hex(self.signing_key),
                None if self.pins is None else tuple(sorted((n, public_key_hex(k)) for n, k in self.pins.items())),
                self.min_parties, self.required, self.bound, self.only, self.on_overflow, self.colluders, self.noise,
                self.require_all, self.trust)

    def __eq__(self, other):
        return isinstance(other, PartySecAgg) and self.settings() == other.settings()

    def __hash__(self):
        return hash(self.settings())

    def __repr__(self):
        return f"PartySecAgg{self.settings()!r}"

    # ------------------------------------------------------------------ keys
    def _agreement(self, context: Context, create: bool) -> KeyAgreement | None:
        run = str(context.run_id)
        st = context.state.get(STATE_KEYS) if STATE_KEYS in context.state else None
        if st is not None and st["run"] == run and st["name"] == self.name and float(st["bound"]) == self.bound:
            return KeyAgreement(self.name, run, self.bound, self.signing_key, dh_private=bytes(st["dh"]),
                                noise=self.noise)
        if not create:
            return None
        ka = KeyAgreement(self.name, run, self.bound, self.signing_key, noise=self.noise)
        context.state[STATE_KEYS] = ConfigRecord({"run": run, "name": self.name, "bound": self.bound,
                                                  "dh": ka.private_state()})
        return ka

    def check_trust(self):
        """A deployed SuperNode without pinned keys takes part in a secure sum only if its node
        config accepts an honest-but-curious central node (``secagg-trust``): unpinned, the central
        node can relay its own key in another party's name and read this party's release."""
        if self.pins is None and self.trust != "honest-but-curious" and deployed_supernode():
            raise TrustRefused(
                f"party {self.name!r}: secagg=true on a deployed SuperNode without secagg-pins: the central node "
                "could relay its own key in another party's name (a sybil) and read this party's release. Pin the "
                "other parties' Ed25519 keys (node config secagg-signing-key and secagg-pins), or accept an "
                "honest-but-curious central node explicitly (node config secagg-trust='honest-but-curious', "
                "docs/secagg.md); refused")

    def advert(self, context: Context) -> bytes:
        """This run's signed advert (the key drawn at the first query, kept in the state)."""
        self.check_trust()
        return self._agreement(context, create=True).advert.to_bytes()

    def session(self, context: Context, adverts: list, names: list) -> Session:
        """The session over the parties ``names`` of the relayed roster ``adverts``, verified."""
        self.check_trust()
        ka = self._agreement(context, create=False)
        if ka is None:
            raise Rekey(f"party {self.name!r} holds no secure-aggregation key for run {context.run_id} (a "
                        "restarted node): the central node must ask for its advert again "
                        "(query.secagg_keys) and relay a new roster; refused")
        full = Session.establish(ka, adverts, self.pins, self.min_parties)
        absent = sorted(set(self.required) - set(full.roster.names))
        if absent:
            raise KeyRefused(f"party {self.name!r}: the roster lacks parties {absent} that this party requires "
                             f"({self._why_required()}); refused")
        if list(names) == list(full.roster.names):
            return full
        unknown = sorted(set(names) - set(full.roster.names))
        if unknown or len(set(names)) != len(names) or self.name not in names:
            raise KeyRefused(f"party {self.name!r}: the parties summed ({list(names)}) must be distinct names of "
                             f"the roster {list(full.roster.names)} including this party; refused")
        sub = Roster([a for a in full.roster.adverts if a.name in names])
        if len(sub) < max(2, self.min_parties):
            raise KeyRefused(f"party {self.name!r}: a secure sum of {len(sub)} parties ({list(sub.names)}) is "
                             f"below this party's minimum of {max(2, self.min_parties)} (node config "
                             "secagg-min-parties); refused")
        absent = sorted(set(self.required) - set(sub.names))
        if absent:
            raise KeyRefused(f"party {self.name!r}: the parties summed lack {absent}, which this party requires "
                             f"({self._why_required()}); refused")
        return Session(self.name, sub, {n: s for n, s in full._seeds.items() if n in sub.names})

    def _why_required(self) -> str:
        if self.pins is not None and self.require_all:
            return ("every party pinned in its node config, secagg-pins, unless secagg-require-all=false, a "
                    "weakening; and secagg-require")
        return "node config secagg-require"

    def adders(self, session: Session) -> int:
        """A: the parties of this sum that add a noise share under this party's profile, this
        party included. Counted only from adverts verified under this party's pins (the session
        verified every signature); without pins the central node could invent adders, so 1."""
        if not self.noise:
            raise KeyRefused(f"party {self.name!r} declares no distributed-noise profile")
        if self.pins is None:
            return 1
        return sum(1 for a in session.roster.adverts if a.noise == self.noise)

    # ------------------------------------------------------------------ answers
    def masked_answer(self, content, context: Context, kind: str, rnd: int, compute,
                      integer: bool = False, history: str | None = None) -> np.ndarray:
        """The masked reply to ``content`` (``compute()`` -> the float release, called only for a
        new request); the stored answer for a replay, :class:`ReplayConflict` for another
        broadcast of the same round. ``integer``: a distributed-noise release,
        ``compute(adders, max_bits)`` -> (int64 vector, j), encoded exactly at scale 2^j
        (:meth:`~flower_vfl.secagg.quantize.FixedPoint.encode_integer`). ``history``: the history of
        broadcasts the party's state comes from (hex, :meth:`~flower_vfl.clients.party_base.PartyClient._history`),
        masked against with the broadcast (:func:`history_digest`); the digest masked against is kept
        in :attr:`mask_digest`."""
        adverts, names = secagg_fields(content)
        session = self.session(context, adverts, names)
        arrays = {}
        if "vectors" in content:
            rec = content["vectors"]
            arrays = {k: rec[k].numpy() for k in rec}
        cfg = content["config"]
        digest = history_digest(history, broadcast_digest(arrays, {k: cfg[k] for k in cfg}))
        self.mask_digest = digest
        ctx = MaskContext(int(rnd), kind, digest)
        store, owner, run = self._store(), self.owner, str(context.run_id)
        prior = self._replay(store, owner, run, context, kind, session.roster, ctx)
        if prior is not None:
            return prior
        # each (round, kind) goes into sums over one set of names only, whatever the keys: the
        # same answer in sums over {A, B, C} and {A, B} would give the central node C's release
        legacy = dict(context.state[STATE_SUMS]) if STATE_SUMS in context.state else {}
        slot, over = f"{kind}/{int(rnd)}", ",".join(sorted(names))
        # read once before the answer is computed; check() below reads it again under the store's
        # write lock and repeats both guards there (another process may answer meanwhile)
        sums = store.secagg_sums(owner, run)
        self._one_set(slot, over, rnd, kind, sums, legacy)
        # one roster, ever: whatever the round, kind or run, this party's values go into sums over one
        # set of names (recorded on its own disk, durable before any value is computed or sent)
        self._one_roster(store, owner, over)
        def kept():           # read only for a round answered before (an N-vector)
            return store.secagg_plain(owner, run, kind)
        if integer:
            fp = session.roster.fixed_point
            r, bits = compute(self.adders(session), fp.k)
            value = fp.encode_integer(np.asarray(r, dtype=np.int64), int(bits))
            self._same_value(slot, rnd, kind, value, True, sums, legacy, kept)
            masked = session.mask(value, ctx)
        else:
            value = np.asarray(compute(), dtype=np.float64)
            self._same_value(slot, rnd, kind, value, False, sums, legacy, kept)
            masked = session.release(value, ctx, self.on_overflow)
        key = ReplayStore.key(session.roster, ctx)

        def check(recorded, stored):
            # under the store's write lock: another process may have answered meanwhile
            self._one_set(slot, over, rnd, kind, recorded, legacy)
            if stored is not None and ReplayStore({stored[0]: (stored[1], _STORED)}).lookup(
                    session.roster, ctx) is _STORED:
                return True
            self._same_value(slot, rnd, kind, value, integer, recorded, legacy, kept)
            return False
        # durable in the party's store (sums, answer and the value it masks, one transaction)
        # before the reply leaves
        masked = store.commit_secagg(owner, run, kind, key, digest, masked, {**legacy, slot: over}, check,
                                     plain=(int(rnd), value))
        for k in (STATE_SUMS, STATE_ANSWER + kind, STATE_MASKED + kind):
            if k in context.state:              # an earlier version's entries: now in the store
                del context.state[k]
        return masked

    @property
    def owner(self) -> str:
        """The party's key in its store's secure-aggregation tables: its node config's
        ``partition-id`` and ``secagg-name`` (a state folder shared by simulated parties holds
        each apart; nothing the central node sends changes it)."""
        return f"partition:{self.party_id}/name:{self.name}"

    def check_plain(self) -> None:
        """Refuse a plain (unmasked) release once this party answered a secure sum (its store records
        its roster). A plain release is a sum over this party alone, a second roster: a non-private
        party's value is a function of its block and broadcasts (a private party's, of its plan's stored
        draws), so the central node can have it again in the clear, subtract it from the sums it entered
        and read the other parties' values. No store is created to find out (none: never masked). Only with
        pinned keys (``secagg-pins``: the setting against a malicious central node); unpinned, the party
        already trusts the central node to follow the protocol (``secagg-trust``, or a simulation, where
        one operator plays every party and compares plain and secure runs on one state folder)."""
        if self.pins is None:
            return
        from pathlib import Path
        from flower_vfl.privacy.store import OPEN_STORES, default_state_dir
        try:
            key = str(self.state_dir or default_state_dir())
        except StateDirRequired:             # a deployed node without state-dir answers no masked request
            return
        path = Path(key).expanduser()
        if key not in OPEN_STORES and not (path if path.suffix == ".sqlite" else path / "party.sqlite").exists():
            return
        recorded = party_store(key).secagg_roster(self.owner)
        if recorded is None or recorded == self.name:
            return
        self._refuse_plain(recorded)

    def claim_plain(self) -> None:
        """Before a plain training or evaluation release is computed (a private party's: charged), and before
        a predict's plain scores leave: with pinned keys, record in the store
        that this party released in the clear (the roster of itself alone, :meth:`_one_roster`), so that
        no later secure sum, in any run, holds a value the central node can have again in the clear
        (a non-private party's from the same broadcasts, a private party's stored draw from a resumed
        plan) and subtract. Unpinned: nothing (as :meth:`check_plain`)."""
        if self.pins is None:
            return
        recorded = self._store().claim_secagg_roster(self.owner, self.name)
        if recorded != self.name:
            self._refuse_plain(recorded)

    def _refuse_plain(self, recorded: str):
        r = Refused(f"party {self.name!r} answers secure sums over one roster only, [{recorded}] (recorded in its "
                    "state folder at its first masked answer); a plain release is a sum over this party alone: the "
                    "central node could subtract it from those sums and read the other parties' values. Refused; "
                    "run with secagg=true (docs/secagg.md). A plain run of this party's data is its operator's "
                    "decision only (a new secagg-name in its node config)", field=f"config.{ADVERTS}")
        r.code = RosterConflict.code
        raise r

    def _store(self):
        try:
            return party_store(self.state_dir)
        except StateDirRequired as exc:
            raise StateDirRequired(f"party {self.name!r}: under secure aggregation a party records, in its own "
                                   "state folder and before its reply leaves, which parties each of its answers "
                                   "was summed with and the answer itself (the central node must never get one "
                                   f"round in sums over two sets of parties); {exc}") from None

    def _same_value(self, slot, rnd, kind, value, integer, recorded, legacy, kept):
        """A (kind, round) this party answered before is answered again (under new keys: it
        restarted, or the central node re-keyed) only with the same value: the one its store kept
        for its last answer of ``kind`` (exactly for an integer release, to 1e-9 of its scale for a
        float one, the re-synchronization's tolerance). Otherwise :class:`ReplayConflict`: the
        difference of the two sums would be the difference of two of its releases (a party that
        lost its iterate computes the round afresh). ``kept()``: the store's (round, value) of its
        last answer of ``kind``, read only here."""
        if slot not in recorded and slot not in legacy:
            return
        kept = kept()
        if kept is None or kept[0] != int(rnd):
            raise ReplayConflict(f"party {self.name!r}: round {int(rnd)} ({kind}) was already answered, and the value "
                                 "it answered is no longer kept (this party answered a later round since, or lost its "
                                 "store); refused (another value in a second sum would give the central node the "
                                 "difference of two of its releases)")
        prev = np.asarray(kept[1])
        if prev.shape == value.shape and (np.array_equal(prev, value) if integer else bool(np.all(
                np.abs(value - prev) <= 1e-9 * max(1.0, float(np.max(np.abs(prev), initial=0.0)))))):
            return
        diff = (f"max |difference| {float(np.max(np.abs(value.astype(float) - prev.astype(float)))):.3g}"
                if prev.shape == value.shape else f"shape {value.shape} against {prev.shape}")
        raise ReplayConflict(f"party {self.name!r}: round {int(rnd)} ({kind}) was already answered with another value "
                             f"({diff}); refused (the difference of the two sums would be the difference of two of "
                             "its releases)")

    def _one_roster(self, store, owner, over):
        """:class:`RosterConflict` unless ``over`` (the names of this sum, sorted, comma-joined) is
        the one roster this party answers sums over: recorded in its store at its first masked
        answer (keyed by its node config's ``partition-id`` and ``secagg-name``, never by the run),
        compared at every later one. The difference of two sums over rosters that differ is the
        release of the parties in one and not the other (a non-private party's release is
        deterministic: the same round in another run, or the same model in another round or kind,
        is the same value)."""
        hint = ("" if self.pins is not None and self.require_all else
                ", or drop the weakening secagg-require-all=false (every pinned party is then required)"
                if self.pins is not None else
                ", or pin the parties' keys (secagg-pins: every pinned party is then required)")
        recorded = store.claim_secagg_roster(owner, over)
        if recorded == over:
            return
        if recorded == self.name:           # claim_plain: it released in the clear before
            raise RosterConflict(
                f"party {self.name!r} released in the clear before (a plain release is a sum over this party alone, "
                f"recorded in its state folder); refused in a secure sum over [{over}]: the central node could have "
                "the same values again in the clear (the same broadcasts, or a resumed plan's stored draws), subtract "
                "them from the sum and read the other parties' values. A secure run of this party's data is its "
                "operator's decision only (a new secagg-name in its node config, pinned by the others)")
        raise RosterConflict(
            f"party {self.name!r} answers secure sums over one roster only, [{recorded}] (recorded in its state "
            f"folder at its first masked answer); refused in a sum over [{over}]: the central node could subtract "
            "two sums over different parties and read the releases of the parties in one and not the other. Run "
            f"with the same parties{hint}; a new roster for this party's data is its operator's decision only (a "
            "new secagg-name, pinned by the others), knowing the central node can then difference the two rosters' "
            "sums (docs/secagg.md)")

    def _one_set(self, slot, over, rnd, kind, *records):
        for sums in records:
            if slot in sums and sums[slot] != over:
                raise ReplayConflict(f"party {self.name!r}: round {int(rnd)} ({kind}) was already answered in a sum "
                                     f"over [{sums[slot]}]; refused in a sum over [{over}] (the central node could "
                                     "subtract the two sums)")

    def _replay(self, store, owner, run, context, kind, roster, ctx):
        """The stored answer to this very request (the store's, else an earlier version's in
        context.state), None if new; :class:`ReplayConflict` for another broadcast."""
        row = store.secagg_answer(owner, run, kind)
        if row is not None and ReplayStore({row[0]: (row[1], _STORED)}).lookup(roster, ctx) is _STORED:
            return store.secagg_masked(owner, run, kind, row[0])
        return ReplayStore(self._stored(context, kind)).lookup(roster, ctx)

    @staticmethod
    def _stored(context: Context, kind: str) -> dict:
        """An earlier version's answer of ``kind`` in context.state (read during the transition)."""
        if STATE_ANSWER + kind not in context.state or STATE_MASKED + kind not in context.state:
            return {}
        rec = context.state[STATE_ANSWER + kind]
        return {str(rec["key"]): (bytes(rec["digest"]), context.state[STATE_MASKED + kind]["masked"].numpy())}


#: the values of node config secagg-trust
TRUST = ("malicious", "honest-but-curious")


def _flag(value, key: str) -> bool:
    """A node-config boolean (TOML true/false, or the strings)."""
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ("true", "false"):
        return str(value).strip().lower() == "true"
    from flower_vfl.config.schema import ConfigError
    raise ConfigError(f"node config {key}={value!r}: use true or false")


# ------------------------------------------------------------------ resume (a non-private party)
#: context.state record of this run's resume token (``token``, ``run``)
STATE_RESUME = "vfl.secagg.resume"
#: the store's ``state`` rows of a non-private party's resume states: ``<prefix><owner>/<token>``
RESUME_PREFIX = "secagg-resume:"
#: train rounds kept per token: the central node's durable checkpoint lags the party's last
#: answer by at most two rounds (one written in a thread, one in flight)
RESUME_KEEP_ROUNDS = 4
#: tokens (runs) kept per party, the most recently written
RESUME_KEEP_TOKENS = 4
#: the identify query's field naming the checkpoint's round a resumed run continues from
RESUME_ROUND = "resume-round"


def _settings(client) -> PartySecAgg:
    return client.secagg if client.secagg is not None else \
        PartySecAgg(client.party_id, {"state-dir": client.state_dir}, client.private)


def _resume_source(sa: PartySecAgg, token: str) -> str:
    return f"{RESUME_PREFIX}{sa.owner}/{token}"


def resume_identify(client, msg, context: Context) -> dict:
    """A non-private party's identify under secure aggregation (run config ``secagg``): the run's
    resume token (``{"plan": token}``, checkpointed by the central node), and in a resumed run the
    party's own state after the checkpoint's round, restored from its store.

    Under secure aggregation the central node never sees this party's release, so it cannot
    re-synchronize it (``q - s_m/theta``); the party keeps its state after each masked training
    answer on its own disk instead (:func:`keep_for_resume`), keyed by its node config's
    ``partition-id`` and ``secagg-name`` and the token, written (``synchronous=FULL``) before the
    reply leaves. A resumed run presents the token (identify query ``plans``) and the round its
    checkpoint reached (``resume-round``); the party restores its state after that round, exactly
    what its ``context.state`` held then, and reports it (``last_train``). A token or round it does not
    hold gets a new token and no state (the central node then refuses the resume, naming the
    party). A node restarted within the run (its context.state lost) is identified again with its
    run's token and the last round summed, and restores that round's state the same way. The server
    learns nothing new: every later answer is masked as before, a (round, kind) answered before is
    answered again only with the same value (its sums record), and the party's one-roster rule (its
    disk, not the token) still binds every sum it enters."""
    if client.private or str(context.run_config.get("secagg", False)).strip().lower() not in ("true", "1"):
        return {}
    rec = context.state[STATE_RESUME] if STATE_RESUME in context.state else None
    if rec is not None and str(rec["run"]) == str(context.run_id):
        return {"plan": str(rec["token"])}                # identify re-sent in this run
    cfg = msg.content["config"] if "config" in msg.content else {}
    token, rnd = None, cfg.get(RESUME_ROUND)
    try:
        plans = json.loads(str(cfg["plans"])) if "plans" in cfg else {}
        token = plans.get(str(client.party_id)) if isinstance(plans, dict) else None
    except ValueError:
        token = None
    ok = (isinstance(token, str) and 0 < len(token) <= 64 and all(c in "0123456789abcdef" for c in token)
          and isinstance(rnd, int) and not isinstance(rnd, bool) and rnd >= 1)
    saved = None
    if ok:
        sa = _settings(client)
        try:
            saved = sa._store().get_state(_resume_source(sa, token), str(rnd))
        except StateDirRequired:      # a deployed node without state-dir kept nothing (it answers no masked request)
            saved = None
    if saved is not None and json.loads(bytes(saved["_meta"]).decode()).get("last_train") != rnd:
        saved = None                                      # (not this round's: never restored)
    if saved is None:
        token = secrets.token_hex(16)
    else:
        _restore(client, context, saved, rnd)
    context.state[STATE_RESUME] = ConfigRecord({"token": token, "run": str(context.run_id)})
    return {"plan": token}


def _restore(client, context: Context, saved: dict, rnd: int) -> None:
    """Put the state kept after round ``rnd`` into this run's context.state, as the party's own
    :meth:`_after_train` left it then (the same arrays, dropped and kept by the same rules)."""
    from flower_vfl.clients.base import STATE_META
    meta = json.loads(bytes(saved.pop("_meta")).decode())
    alpha = meta.pop("_alpha")
    client.party = client._build(context, int(meta["n_outputs"]) or 1, bool(meta.get("plain_rounds", False)))
    arrays = dict(saved)
    if "x" in arrays and "s" not in arrays:     # as _build: CG's carried D x, else D @ x
        arrays["s"] = arrays["Dx"] if "Dx" in arrays else client.D @ arrays["x"]
    client.party.set_state(arrays)
    client._kept, client._alpha = set(arrays), alpha
    client._after_train(context)
    context.state[STATE_META] = ConfigRecord(meta)


def keep_for_resume(client, content, context: Context, meta: dict) -> None:
    """After a non-private party's masked training answer (before the reply leaves): its state
    (its iterate and what its solver carries, without the release) and ``meta`` under its run's
    resume token, one row per round, the last :data:`RESUME_KEEP_ROUNDS` kept, durable
    (``synchronous=FULL``). Nothing for a plain request, a private party (its plan keeps its
    iterate), a run whose identify gave no token, or a stored answer sent again (no new state)."""
    if client.private or getattr(client, "_alpha", None) is None or secagg_fields(content) is None:
        return
    rec = context.state[STATE_RESUME] if STATE_RESUME in context.state else None
    if rec is None or str(rec["run"]) != str(context.run_id):
        return
    sa = _settings(client)
    state = {k: np.asarray(v) for k, v in client.party.get_state().items() if k != "s"}
    blob = json.dumps({**meta, "_alpha": client._alpha}).encode()
    source = _resume_source(sa, str(rec["token"]))
    store = sa._store()
    store.put_state(source, str(int(meta["last_train"])), {**state, "_meta": np.frombuffer(blob, dtype=np.uint8)})
    store.prune_states(source, RESUME_KEEP_ROUNDS, f"{RESUME_PREFIX}{sa.owner}/", RESUME_KEEP_TOKENS)


def as_refusal(exc: SecAggError) -> Refused:
    """A secure-aggregation refusal as the party's boundary refusal (its code kept)."""
    r = Refused(str(exc))
    r.code = getattr(exc, "code", "secagg")
    return r
