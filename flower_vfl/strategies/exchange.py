"""The central node's one channel to the parties: identify, send, collect, check.

Every central-node path uses it: vertical ADMM training and evaluation
(:mod:`.vertical_admm`), the SGD baseline (:mod:`.vertical_sgd`), horizontal DP-IADMM
(:mod:`.dpiadmm`), PSI alignment (:mod:`.psi_align`) and the own-data save / predict jobs
(:mod:`.own_data`). One set of rules:

- **Identify.** A party is the index its node *claims* in a reply (``identity['party']``,
  ``psi['party']``, ...), bound to the node's SuperNode authentication key when ``party_keys``
  maps each index to a key fingerprint. Two nodes claiming one index stop the run
  (:func:`claim`). Identify waits up to ``party_wait`` seconds until every index has a node.
- **Match.** A reply belongs to the request whose id it carries in
  ``reply.metadata.reply_to_message_id``; nothing else (never ``src_node_id``: when a SuperNode
  dies the SuperLink itself answers with an error reply). A reply to no request of this exchange
  (a late reply to an earlier one) is never used; a second reply to one request, or a reply whose
  sender is not the node asked, is a :class:`ReplyError`.
- **Did not answer.** A Flower error reply with a code in :data:`LOST_CODES` (the node or its
  message went away) or no reply within ``timeout`` means the party is lost: it is waited for up
  to ``party_wait`` seconds (a restarted SuperNode -- a new node id -- is identified again by the
  same query and asked again), then :class:`PartyLost` names it. Any other error reply (the
  party's handler raised) is final: :class:`PartyFailed`.
- **Check.** A release is read with :func:`check_release` (record, key, dtype, shape, finite)
  before it can touch the central node's state.
- **Wire dtype.** With :attr:`Exchange.wire_dtype` = ``'float32'`` (run config ``wire-dtype``) every
  request's ``vectors`` travel as float32 and its ``config`` asks the party to reply in float32
  (:func:`wire_content`); a release arrives float32 or float64 and is upcast to float64 by
  :func:`check_release`. ``'float64'`` (the default) sends every message unchanged.

API, for a new path (e.g. secure aggregation): build an :class:`Exchange` over the Grid, call
:meth:`Exchange.identify` once with the query that makes a node claim its index, then
:meth:`Exchange.send` (a ``build(party, node_id) -> RecordDict`` per party) or
:meth:`Exchange.send_messages` (ready Messages) for each request; both return
``{party: reply Message}``; :meth:`Exchange.party_of` maps any reply of the last exchange back to
its party.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable
from logging import INFO, WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.common.logger import log

from flower_vfl.errors import UserError
from flower_vfl.io.wire import PACK_REPLY_INTO, PACK_REQUEST_INTO, PACKED_FIELD, is_packed, pack, packed_types, unpack
from flower_vfl.privacy.boundary import WIRE_DTYPES, WIRE_FIELD, to_wire
from flower_vfl.strategies import sim_delivery

__all__ = ["Exchange", "ReplyError", "PartyFailed", "PartyLost", "PartyRefused", "keep_report", "LOST_CODES", "check_release", "claim", "identity_record",
           "key_fingerprint", "load_party_keys", "message_key", "send_and_receive", "wire_content", "WIRE_DTYPES"]

#: error codes meaning "the node or its message went away" (a restarted SuperNode can take over);
#: any other error reply (the party's handler raised, e.g. it refused an invalid message) is final
LOST_CODES = {ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE, ErrorCode.NODE_UNAVAILABLE,
              ErrorCode.CLIENT_APP_CRASHED}

POLL_S = 1.0
#: how often a wait for replies asks the SuperLink whether the nodes asked restarted (seconds)
RESTART_CHECK_S = 2.0
#: the most times one request is sent again to a party whose node was lost and came back
MAX_LOSSES = 5
#: pull intervals from a remote grid (a request to the SuperLink each): from 10 ms, growing x1.5
#: up to 0.1 s (Flower 1.42's HTTP grid sleeps 3 s between pulls in its own send_and_receive)
PULL_FIRST_S, PULL_MAX_S = 0.01, 0.1
#: from Flower's in-memory grid (simulation: a pull is a look-up in the same process's state):
#: every 2-10 ms, so a round's replies are seen before the simulation's next 0.1 s delivery tick
#: (Flower's own InMemoryGrid.send_and_receive pulls every 0.1 s)
PULL_FIRST_LOCAL_S, PULL_MAX_LOCAL_S = 0.002, 0.01
#: benchmarks only: a file that each exchange appends one JSON line of timings to
TIMING_ENV = "FLOWER_VFL_TIMING"


class ReplyError(UserError, RuntimeError):
    """A reply the central node refuses (malformed, duplicate, from the wrong node)."""


class PartyFailed(UserError, RuntimeError):
    """A party answered with an error (its handler raised)."""


class PartyLost(UserError, RuntimeError):
    """A party did not answer and did not come back within ``party-wait``."""



class PartyRefused(UserError, RuntimeError):
    """A party refused to release (its privacy budget is spent)."""

def message_key(msg: Message) -> str:
    """The id a reply to ``msg`` carries in ``reply_to_message_id`` (set by the Grid on push)."""
    return msg.metadata.message_id or msg.object_id


def send_and_receive(grid, messages, timeout, stop=None) -> list:
    """Push ``messages`` and pull their replies until all came or ``timeout`` s passed, polling
    a remote grid from 10 ms up to every 0.1 s, Flower's in-memory grid (simulation) every 2-10 ms,
    waking the simulation's delivery thread after the push (:mod:`.sim_delivery`).
    A Grid without push/pull (the in-process LocalGrid) is asked through its own
    ``send_and_receive``. ``stop(ids)``: stop waiting early when it returns True for the ids
    still unanswered (the exchange's check that their nodes restarted)."""
    messages = list(messages)
    if not messages:
        return []
    if os.environ.get("FLOWER_VFL_GRID_PULL") == "flower":      # Flower's own loop (benchmarks)
        return list(grid.send_and_receive(messages, timeout=timeout))
    t0 = time.time()
    try:
        ids = {i for i in grid.push_messages(messages) if i}
    except NotImplementedError:
        return list(grid.send_and_receive(messages, timeout=timeout))
    t_pushed = time.time()
    local = type(grid).__name__ == "InMemoryGrid"
    if local:                          # the simulation's delivery thread: scan now, not at its next tick
        sim_delivery.wake_delivery()
    wait, cap = (PULL_FIRST_LOCAL_S, PULL_MAX_LOCAL_S) if local else (PULL_FIRST_S, PULL_MAX_S)
    end, out, pulls, n = time.monotonic() + timeout, [], 0, len(ids)
    t_pull = t_pushed
    while ids:
        t_pull = time.time()
        began = time.monotonic()
        got = list(grid.pull_messages(ids))
        pulls += 1
        out += got
        ids -= {m.metadata.reply_to_message_id for m in got}
        if ids and began < end <= time.monotonic():
            # the deadline passed during this pull: Flower's pull retries a reply whose objects
            # are missing (a SuperNode killed while uploading it) until the SuperLink gives up,
            # minutes later, and the other replies that came meanwhile were not in that pull.
            # One more pull takes them, so an answering party is not counted lost
            got = list(grid.pull_messages(ids))
            pulls += 1
            out += got
            ids -= {m.metadata.reply_to_message_id for m in got}
        if not ids or time.monotonic() >= end or (stop is not None and stop(ids)):
            break
        time.sleep(wait)
        wait = min(wait * 1.5, cap)
        if local and not out and time.time() - t_pushed < sim_delivery.TICK_S:
            sim_delivery.wake_delivery()   # a wake that came while the thread was scanning is lost
    if local and out:
        sim_delivery.warn_if_absent()
    if os.environ.get(TIMING_ENV):
        _timing_line({"who": "server", "t_push": t0, "t_pushed": t_pushed, "t_pull_last0": t_pull, "t_done": time.time(),
                      "messages": n, "replies": len(out), "pulls": pulls, **_sizes(messages, out)})
    return out


def _sizes(messages, replies) -> dict:
    """For the timing line (benchmarks): the message types and the serialized array bytes
    (``Array.data``: the values and a ~128-byte header each) sent to / received from each node."""
    def nbytes(msg) -> int:
        try:                       # ArrayRecords, and the .npy bytes a packed message carries in a ConfigRecord
            return sum(len(rec[k].data) for rec in msg.content.array_records.values() for k in rec) + \
                sum(len(v) for rec in msg.content.config_records.values() for v in rec.values()
                    if isinstance(v, bytes))
        except Exception:          # an error reply has no content
            return 0
    try:
        return {"type": sorted({m.metadata.message_type for m in messages}),
                "array_bytes_out": {str(m.metadata.dst_node_id): nbytes(m) for m in messages},
                "array_bytes_in": {str(m.metadata.src_node_id): nbytes(m) for m in replies}}
    except AttributeError:         # not Flower messages (a test's stand-ins)
        return {}


def _timing_line(rec: dict) -> None:
    """Append ``rec`` as one JSON line to the file named by ``$FLOWER_VFL_TIMING`` (benchmarks)."""
    try:
        with open(os.environ[TIMING_ENV], "a") as fh:
            fh.write(json.dumps(rec) + "\n")
    except OSError:
        pass


def check_release(rep: Message, party: int, key: str, shape: tuple, what: str,
                  bound: float | None = None, cause: str | None = None) -> np.ndarray:
    """The vector ``release[key]`` of a reply, checked: present, floating, of ``shape``, finite,
    and (``bound``: the run config's ``max-release``) every entry within +-``bound``.

    ``cause``: what most likely drove a value out of range (a private party's noise at these
    settings, :func:`~flower_vfl.privacy.outcome.noise_divergence_cause`); a NaN/inf or
    out-of-range release then names it and what to change, instead of the bound alone."""
    node = rep.metadata.src_node_id
    where = f"party {party} (node {node}), {what}: release[{key!r}]"
    if "release" not in rep.content.array_records:
        raise ReplyError(f"party {party} (node {node}), {what}: the reply has no 'release' record "
                         f"(records: {sorted(rep.content.keys())})")
    rec = rep.content.array_records["release"]
    if key not in rec:
        raise ReplyError(f"{where} is missing (keys: {sorted(rec.keys())})")
    try:
        v = rec[key].numpy()
    except Exception as exc:          # a record that does not deserialize
        raise ReplyError(f"{where} is not a readable array: {exc}") from None
    if v.dtype not in (np.float64, np.float32):
        raise ReplyError(f"{where} has dtype {v.dtype}; expected float64 or float32 (the wire dtypes)")
    if v.shape != tuple(shape):
        raise ReplyError(f"{where} has shape {v.shape}; expected {tuple(shape)} (one value per aligned row)")
    if not np.all(np.isfinite(v)):
        raise ReplyError(f"{where} holds {int(np.size(v) - np.isfinite(v).sum())} NaN/inf values; refused "
                         "(it would poison z for every later round)"
                         + ("" if cause is None else f". The run diverged; the likely cause is {cause}"))
    if bound is not None:
        big = np.abs(v) > bound
        if big.any():
            at = np.unravel_index(int(np.flatnonzero(big)[0]), v.shape)
            head = (f"{where} holds {int(big.sum())} value(s) beyond +-{bound:g} (e.g. {float(v[at])!r} at "
                    f"row {at[0]}); refused")
            if cause is not None:
                raise ReplyError(f"{head}: the run diverged (max-release={bound:g}, run config, bounds every "
                                 f"released value); the likely cause is {cause}")
            raise ReplyError(f"{head}: the central node's max-release={bound:g} (run config) bounds "
                             "every released value; raise it only if the parties' values can be that large")
    return np.asarray(v, dtype=np.float64)



def wire_content(content: RecordDict, wire: str) -> RecordDict:
    """``content`` as it travels in wire dtype ``wire``: ``float64`` returns it unchanged; ``float32``
    a new RecordDict whose ``vectors`` floating arrays are float32 (one rounding of the float64
    values the central node holds) and whose ``config`` tells the party to reply in float32
    (``config['wire_dtype']``). Every other record is the same object."""
    if wire not in WIRE_DTYPES:
        raise ValueError(f"run config key 'wire-dtype'={wire!r}: expected one of {WIRE_DTYPES}")
    if wire == "float64" or "config" not in content.config_records:
        return content
    out = {}
    for name, rec in content.items():
        if name == "vectors" and name in content.array_records:
            arrays = {}
            for key in rec:
                a = rec[key].numpy()
                arrays[key] = Array(to_wire(a, wire)) if a.dtype.kind == "f" else rec[key]
            rec = ArrayRecord(arrays)
        elif name == "config" and name in content.config_records:
            rec = ConfigRecord({**dict(rec), WIRE_FIELD: wire})
        out[name] = rec
    return RecordDict(out)


def keep_report(rep: Message, party: int, reports: dict, what: str = "") -> None:
    """Keep a private party's privacy report (``reports[party]``) from its reply; its refusal
    stops the run (:class:`PartyRefused`, naming the party and its reason)."""
    records = rep.content.config_records
    if "privacy" in records:
        try:
            reports[party] = json.loads(str(records["privacy"]["report"]))
        except (KeyError, TypeError, ValueError) as exc:
            where = f"party {party}, {what}" if what else f"party {party}"
            raise ReplyError(f"{where}: unreadable privacy report ({exc})") from None
    if "refusal" in records:
        raise PartyRefused(f"party {party} refused: {records['refusal'].get('reason', '')}")

def identity_record(nid: int, rep: Message):
    """The 'identity' config record of node ``nid``'s identify reply, or a :class:`ReplyError`."""
    if "identity" not in rep.content.config_records:
        raise ReplyError(f"node {nid}: the identify reply has no 'identity' record")
    return rep.content.config_records["identity"]

def claim(seen: dict, role: str, index: int, nid: int, error: type = ValueError) -> None:
    """Record that node ``nid`` serves ``role`` ``index`` (``seen``: index -> node id); a second
    node claiming the same index stops the run, naming both nodes and the fix."""
    if index in seen and seen[index] != nid:
        raise error(f"nodes {seen[index]} and {nid} both claim {role} {index}; give each SuperNode a distinct "
                    "partition-id in its node config")
    seen[index] = nid


def key_fingerprint(public_key: bytes) -> str:
    """SHA-256 (hex) of a SuperNode's public key as the SuperLink stores it
    (``NodeInfo.public_key``, i.e. the PEM SubjectPublicKeyInfo bytes)."""
    return hashlib.sha256(bytes(public_key)).hexdigest()


def load_party_keys(path: str, num_parties: int) -> dict[int, str]:
    """``party-keys``: a JSON file ``{"0": "<sha256 hex>", ...}`` binding each party to the
    fingerprint of the one registered SuperNode key allowed to serve it."""
    try:
        raw = json.loads(open(path).read())
    except (OSError, ValueError) as exc:
        raise ValueError(f"party-keys={path!r}: cannot read a JSON object of party -> key fingerprint "
                         f"({exc})") from None
    if not isinstance(raw, dict) or sorted(map(str, raw)) != sorted(str(m) for m in range(num_parties)):
        raise ValueError(f"party-keys={path!r} must map every party 0..{num_parties - 1} (as strings) to a "
                         f"SHA-256 fingerprint; got keys {sorted(raw) if isinstance(raw, dict) else raw!r}")
    out = {}
    for m, fp in raw.items():
        fp = str(fp).lower().removeprefix("sha256:")
        if len(fp) != 64 or any(c not in "0123456789abcdef" for c in fp):
            raise ValueError(f"party-keys={path!r}: party {m} has {fp!r}, not a SHA-256 hex fingerprint")
        out[int(m)] = fp
    return out


def party_keys_from(party_keys, num_parties: int) -> dict[int, str]:
    """``party_keys`` as given to a strategy (a JSON path, a dict or None) -> party -> fingerprint."""
    if isinstance(party_keys, str):
        return load_party_keys(party_keys, num_parties) if party_keys else {}
    return {int(m): str(v) for m, v in (party_keys or {}).items()}


#: ``read(node_id, reply) -> (index, info)``: the index a node claims in its identify reply (raise
#: :class:`ReplyError` for a malformed one) and whatever the caller wants to keep of the reply
Reader = Callable[[int, Message], tuple]


class Exchange:
    """Identify the parties behind a Grid and exchange messages with them (see the module doc).

    Parameters
    ----------
    grid : flwr.serverapp.Grid
    num_parties : int
        Indices 0..num_parties-1 must each be served by one node.
    role : str, default='party'
        What an index is called in messages ('party', 'agent').
    count_key : str, default='num-parties'
        The run-config key that sets ``num_parties`` (named in the "did not answer" error).
    timeout : float, default=600
        Seconds to wait for the replies to one request.
    party_wait : float, default=0
        Seconds to wait for a missing party: at identify until every index has a node, and for a
        lost node to come back (a new node claiming the index is identified and asked again).
    party_keys : dict or None
        index -> SHA-256 fingerprint of the SuperNode key allowed to serve it.
    claim_error : exception type, default=ValueError
        Raised when two nodes claim one index.
    on_join : callable(index, info, first) or None
        Called for every node that identifies (``first``: at :meth:`identify`, not a rejoin).
    wire_dtype : str, default='float64'
        The dtype N-vectors travel in (:attr:`wire_dtype`).
    """

    #: False: no request is packed (every request travels as Flower's ArrayRecords; tests compare)
    pack_requests = True

    def __init__(self, grid, num_parties: int, *, role: str = "party", count_key: str = "num-parties",
                 timeout: float = 600.0, party_wait: float = 0.0, party_keys=None, claim_error: type = ValueError,
                 on_join: Callable | None = None, wire_dtype: str = "float64"):
        self.grid, self.num_parties = grid, int(num_parties)
        self.role, self.count_key = role, count_key
        self.roles = "parties" if role == "party" else role + "s"
        self.timeout, self.party_wait = float(timeout), float(party_wait)
        self.party_keys = dict(party_keys or {})
        self.claim_error, self.on_join = claim_error, on_join
        self.node_to_party: dict[int, int] = {}
        self._ignored: set[int] = set()      # nodes not to ask again (gone, or not needed) ...
        #: ... unless the SuperLink activated them again since: node id -> its activation time
        #: (``NodeInfo.last_activated_at``) when this exchange identified or ignored it. A
        #: SuperNode restarted with its registered key keeps its node id; only this tells the
        #: new session (empty ``context.state``) from the old one
        self._session: dict[int, str] = {}
        #: while ``on_join`` runs for a rejoin: True when the node kept its node id (a SuperNode
        #: restarted with its registered key), so its ``context.state`` began empty in this session
        self.same_id_restart = False
        self._query = None                   # (message_type, content, read, what) of identify
        self._sent: dict[str, int] = {}      # message id -> party, of the last exchange
        self._losses: tuple[str, dict[int, int]] = ("", {})   # (request, party -> times lost on it)
        #: the dtype N-vectors travel in (:func:`wire_content`; run config ``wire-dtype``)
        self.wire_dtype = wire_dtype
        #: node id -> the message types its party reads packed (its identify reply;
        #: :mod:`flower_vfl.io.wire`); a request of such a type is packed for it
        self._packed_of: dict[int, frozenset] = {}

    # ------------------------------------------------------------------ identify
    def node_of(self) -> dict[int, int]:
        """party -> node id serving it."""
        return {p: n for n, p in self.node_to_party.items()}

    def _node_keys(self) -> dict[int, str]:
        """node id -> fingerprint of its authentication key ('' when the SuperLink has none)."""
        try:
            return {int(n.node_id): key_fingerprint(n.public_key) if n.public_key else ""
                    for n in self.grid.get_nodes()}
        except Exception as exc:          # pragma: no cover - a Grid without node info
            raise RuntimeError(f"party-keys is set but the SuperLink gives no node keys: {exc}") from None

    def _sessions(self) -> dict[int, str]:
        """node id -> activation time of its current session, for the nodes online now
        ('' where the Grid does not say: the in-process grid, Flower's default ``get_nodes``)."""
        return {int(n.node_id): str(getattr(n, "last_activated_at", "") or "") for n in self.grid.get_nodes()}

    def _restarted(self, nodes) -> set[int]:
        """Those of ``nodes`` that are online in another session than the one this exchange
        knew: restarted with the same registered key (hence the same node id). Empty when the
        Grid gives no activation times."""
        if not any(self._session.get(n) for n in nodes):
            return set()
        now = self._sessions()
        return {n for n in nodes if self._session.get(n) and now.get(n, self._session[n]) != self._session[n]}

    def _stop_if_restarted(self, requests: dict[int, Message]):
        """For :func:`send_and_receive`: stop waiting when every request still unanswered went to
        a node that restarted meanwhile (checked every :data:`RESTART_CHECK_S` s): a SuperNode
        killed after it took its message and restarted with its registered key (the same node id)
        never answers it, and the SuperLink, which sees the node online again, never says so."""
        if not any(self._session.get(m.metadata.dst_node_id) for m in requests.values()):
            return None
        last = [time.monotonic()]

        def stop(ids) -> bool:
            if time.monotonic() - last[0] < RESTART_CHECK_S:
                return False
            last[0] = time.monotonic()
            nodes = {m.metadata.dst_node_id for m in requests.values() if message_key(m) in ids}
            return bool(nodes) and nodes <= self._restarted(nodes)
        return stop

    def _check_key(self, nid: int, index: int) -> None:
        if not self.party_keys:
            return
        fp = self._node_keys().get(nid, "")
        if fp != self.party_keys[index]:
            raise PermissionError(
                f"node {nid} claims {self.role} {index} but its SuperNode key "
                f"{'fingerprint ' + fp[:16] + '...' if fp else 'is unknown (is --enable-supernode-auth on?)'}"
                f" is not the one party-keys binds to {self.role} {index} ({self.party_keys[index][:16]}...); "
                "refused")

    def _ask(self, nodes, timeout) -> dict[int, tuple]:
        """Send the identify query to ``nodes``; node id -> (index, info) of those that answered."""
        message_type, content, read, what = self._query
        msgs = {nid: Message(content, dst_node_id=nid, message_type=message_type) for nid in nodes}
        replies = send_and_receive(self.grid, list(msgs.values()), timeout)
        by_id = {message_key(m): nid for nid, m in msgs.items()}      # ids are set on push
        ok = {}
        for rep in replies:
            nid = by_id.get(rep.metadata.reply_to_message_id)
            if nid is None:
                continue                      # a late reply to an earlier request: never used
            if nid in ok:
                raise ReplyError(f"node {nid}: a second reply to {what}")
            if rep.has_error():
                if rep.error.code in LOST_CODES:
                    log(WARNING, "node %s went away before answering %s: %s", nid, what, rep.error.reason)
                    continue
                raise PartyFailed(f"node {nid} failed in {what}: {rep.error.reason}")
            if rep.metadata.src_node_id != nid:
                raise ReplyError(f"the reply to {what} sent to node {nid} came from node {rep.metadata.src_node_id}")
            ok[nid] = rep
        out = {}
        for nid, rep in ok.items():
            self._packed_of[nid] = next((packed_types(rec) for rec in rep.content.config_records.values()
                                         if PACKED_FIELD in rec), frozenset())
            index, info = read(nid, rep)
            if not 0 <= index < self.num_parties:
                raise ReplyError(f"node {nid} claims {self.role} {index}, outside 0..{self.num_parties - 1} "
                                 f"({self.count_key}={self.num_parties}); fix its partition-id")
            out[nid] = (index, info)
        return out

    def identify(self, message_type: str, content: RecordDict, read: Reader,
                 what: str = "the identify query") -> dict[int, object]:
        """Ask every node the query until every index has a node (up to ``party_wait`` s);
        returns index -> info and sets :attr:`node_to_party`. ``read(nid, reply)`` gives the
        claimed index and the info to keep. The same query identifies a restarted node later."""
        self._query = (message_type, content, read, what)
        deadline = time.monotonic() + self.party_wait
        mapping, seen, asked, infos = {}, {}, set(), {}
        while True:
            nodes = [n for n in self.grid.get_node_ids() if n not in asked]
            if nodes and (len(asked) + len(nodes) >= self.num_parties or time.monotonic() >= deadline):
                answers = self._ask(nodes, max(self.timeout, 1.0))
                asked.update(answers)          # a node that did not answer in time is asked again
                for nid, (index, info) in answers.items():
                    claim(seen, self.role, index, nid, self.claim_error)
                    self._check_key(nid, index)
                    mapping[nid], infos[index] = index, info
                    if self.on_join is not None:
                        self.on_join(index, info, True)
            missing = sorted(set(range(self.num_parties)) - set(seen))
            if not missing or time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        if missing:
            raise PartyLost(
                f"{self.roles} {missing} did not answer {what} within party-wait={self.party_wait:g} s (nodes "
                f"seen: {sorted(self.grid.get_node_ids())}): {self.count_key}={self.num_parties} but {len(asked)} "
                f"SuperNodes answered. Start one SuperNode per {self.role} (simulation: --federation-config "
                f"\"num-supernodes={self.num_parties}\") or set {self.count_key}={len(asked)}")
        self.node_to_party = mapping
        now = self._sessions()
        self._session = {n: now.get(n, "") for n in mapping}
        log(INFO, "%s: %s", self.roles, ", ".join(f"{p} -> node {n}" for n, p in sorted(mapping.items(),
                                                                                          key=lambda t: t[1])))
        return infos

    def rejoin(self, missing: set, wait: float) -> set:
        """Identify nodes that appeared since (restarted SuperNodes); re-map those that serve a
        missing index. Polls up to ``wait`` s; returns the indices still missing."""
        deadline = time.monotonic() + wait
        missing = set(missing)
        while missing and self._query is not None:
            known = set(self.node_to_party) | self._ignored
            online = self._sessions()
            # a node not seen yet, or an ignored one the SuperLink activated again since (a
            # SuperNode restarted with its registered key keeps its node id: its key-bound
            # claim at identify, checked against party-keys, says which party it serves)
            new = [n for n, when in online.items() if n not in known
                   or (n in self._ignored and when and self._session.get(n, when) != when)]
            if new:
                reactivated = set(new) & self._ignored
                self._ignored.difference_update(new)
                self._session.update({n: online[n] for n in new})
                for nid, (index, info) in self._ask(new, min(self.timeout, max(wait, 1.0))).items():
                    if index not in missing:
                        log(WARNING, "node %s claims %s %s, which is not missing; ignored", nid, self.role, index)
                        self._ignored.add(nid)
                        continue
                    self._check_key(nid, index)
                    old = [n for n, p in self.node_to_party.items() if p == index]
                    for n in old:
                        del self.node_to_party[n]
                        self._ignored.add(n)
                    self.node_to_party[nid] = index
                    if self.on_join is not None:
                        self.same_id_restart = nid in reactivated
                        try:
                            self.on_join(index, info, False)
                        finally:
                            self.same_id_restart = False
                    missing.discard(index)
                    log(INFO, "%s %s is back on node %s (was %s)", self.role, index, nid, old)
                self._ignored.update(n for n in new if n not in self.node_to_party)
            if not missing or time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        return missing

    # ------------------------------------------------------------------ exchange
    def collect(self, requests: dict[int, Message], what: str):
        """Send ``requests`` (party -> Message) and pair the replies with them.

        Returns ``(ok, lost, gone)``: party -> reply for valid, non-error replies; party -> reason
        for parties whose node went away or that sent nothing; the set of parties whose node is
        gone (the SuperLink said so) rather than silent. Raises :class:`PartyFailed` for an error
        reply of the party's own handler and :class:`ReplyError` for a duplicate reply or a reply
        from another node than the one asked."""
        replies = send_and_receive(self.grid, list(requests.values()), self.timeout,
                                   self._stop_if_restarted(requests)) if requests else []
        by_id = {message_key(m): p for p, m in requests.items()}
        self._sent.update(by_id)
        ok, lost, gone = {}, {}, set()
        asked = {requests[p].metadata.dst_node_id: p for p in requests}
        # a node whose SuperNode restarted (same key, same node id) since it was identified: what
        # it answered may come from an empty state; it is identified again, then asked again
        restarted = self._restarted(asked)
        for node in sorted(restarted):
            lost[asked[node]] = (f"node {node} restarted (its SuperNode came back with the same key: a new session "
                                 "since it was identified); its reply, if any, is not used")
            gone.add(asked[node])
        for rep in replies:
            party = by_id.get(rep.metadata.reply_to_message_id)
            if party is None:
                continue                      # a late reply to an earlier request: never used
            node = requests[party].metadata.dst_node_id
            if node in restarted:
                continue
            if party in ok or party in lost:
                raise ReplyError(f"{self.role} {party} (node {node}): a second reply to the {what} request; one "
                                 f"reply per {self.role} is accepted")
            if rep.has_error():
                code, reason = rep.error.code, rep.error.reason
                if code in LOST_CODES:
                    lost[party] = f"node {node} is gone (Flower error {code}: {reason})"
                    gone.add(party)
                    continue
                raise PartyFailed(f"{self.role} {party} (node {node}) failed in the {what} request (Flower error "
                                  f"{code}): {reason}")
            src = rep.metadata.src_node_id
            if src != node:
                raise ReplyError(f"{self.role} {party}: the reply to the {what} request came from node {src}, not "
                                 f"from node {node} that serves {self.role} {party}")
            if is_packed(requests[party].content, PACK_REQUEST_INTO):    # its reply's arrays, unpacked
                rep.content = unpack(rep.content, PACK_REPLY_INTO, ReplyError,
                                     f"{self.role} {party} (node {node}), the reply to the {what} request")
            ok[party] = rep
        for party in requests:
            if party not in ok and party not in lost:
                lost[party] = f"no reply from node {requests[party].metadata.dst_node_id}"
        return ok, lost, gone

    def send(self, build: Callable[[int, int], RecordDict], message_type: str, parties: Iterable[int], what: str,
             stale_ok: bool = False):
        """Send ``build(party, node_id)`` to every party in ``parties``; party -> reply.

        A lost party is waited for up to ``party_wait`` s (a restarted SuperNode is identified
        again and asked again, with a message built for its new node). With ``stale_ok`` the
        lost parties are returned instead, ``(got, lost)``, without waiting. Raises
        :class:`PartyLost` naming the party."""
        make = lambda p, nid: Message(build(p, nid), dst_node_id=nid, message_type=message_type)  # noqa: E731
        return self._send(make, set(parties), what, stale_ok)

    def send_messages(self, messages: Iterable[Message], what: str, rebuild: Callable | None = None,
                      stale_ok: bool = False, parties: Iterable[int] | None = None):
        """As :meth:`send` for ready Messages (each to the node serving its party).
        ``rebuild(party, node_id) -> Message`` makes the message again for a rejoined node
        (default: the same content, re-addressed). ``parties``: the parties that must answer
        (default: those with a message); one without a message (its node is gone) gets
        ``rebuild``'s once a node serves it again."""
        first = {}
        for msg in messages:
            nid = msg.metadata.dst_node_id
            if nid not in self.node_to_party:
                raise ValueError(f"a message for node {nid}, which serves no {self.role}")
            first[self.node_to_party[nid]] = msg

        used = set()

        def make(p, nid):
            # the ready message only once: a party asked again (its node restarted, possibly with
            # the same node id) gets a message built for it now
            if p in first and p not in used and first[p].metadata.dst_node_id == nid:
                used.add(p)
                return first[p]
            used.add(p)
            if rebuild is not None:
                return rebuild(p, nid)
            old = first.get(p)
            if old is None:
                raise ValueError(f"no message for {self.role} {p} and no rebuild to make one")
            return Message(old.content, dst_node_id=nid, message_type=old.metadata.message_type)
        return self._send(make, set(first) if parties is None else set(parties) | set(first), what, stale_ok)

    def _send(self, make, pending: set, what: str, stale_ok: bool):
        got = {}
        unserved = {p for p in pending if p not in self.node_to_party.values()}
        if stale_ok and unserved:        # a restarted node may be back: take it without waiting
            self.rejoin(unserved, 0.0)
        self._sent = {}
        # losses per party of this request, kept across consecutive calls with the same ``what``
        # (a party re-synchronized after a loss is sent the request again in a new call)
        if self._losses[0] != what:
            self._losses = (what, {})
        losses = self._losses[1]
        while pending:
            node_of = self.node_of()
            requests = self._wired({p: make(p, node_of[p]) for p in sorted(pending) if p in node_of})
            ok, lost, gone = self.collect(requests, what)
            lost.update({p: "no node serves it" for p in pending if p not in node_of})
            got.update(ok)
            if not lost:
                break
            for p, why in sorted(lost.items()):
                log(WARNING, "%s %s missing in %s: %s", self.role, p, what, why)
                for n in [n for n, q in self.node_to_party.items() if q == p and p in gone]:
                    del self.node_to_party[n]                     # its node is gone for good
                    self._ignored.add(n)
            if stale_ok:
                return got, lost
            for p in lost:
                losses[p] = losses.get(p, 0) + 1
            again = sorted(p for p in lost if losses[p] > MAX_LOSSES)
            if again:      # a node that fails on this very request every time: never an endless loop
                raise PartyLost("; ".join(f"{self.role} {p} was lost {losses[p]} times on {what} (last: {lost[p]}): its "
                                          "SuperNode keeps failing on this request; see its log" for p in again))
            if self.party_wait > 0:
                log(INFO, "waiting up to party-wait=%g s for %s %s to come back", self.party_wait, self.roles,
                    sorted(lost))
            still = self.rejoin(set(lost), self.party_wait)
            if still:
                raise PartyLost("; ".join(f"{self.role} {p} did not come back within party-wait="
                                          f"{self.party_wait:g} s ({lost[p]})" for p in sorted(still)))
            pending = set(lost)
        return (got, {}) if stale_ok else got

    def _wired(self, requests: dict[int, Message]) -> dict[int, Message]:
        """``requests`` in :attr:`wire_dtype` (:func:`wire_content`), packed for a node whose party
        reads that message type packed (:mod:`flower_vfl.io.wire`; at most
        :data:`~flower_vfl.io.wire.PACK_MAX_BYTES` of arrays); a content shared by several parties
        is converted once."""
        done: dict[tuple, tuple] = {}
        out = {}
        for p, msg in requests.items():
            packed = self.pack_requests and msg.metadata.message_type in self._packed_of.get(
                msg.metadata.dst_node_id, ())
            key = (id(msg.content), packed)
            if key not in done:
                content = wire_content(msg.content, self.wire_dtype)
                done[key] = (msg.content, pack(content, PACK_REQUEST_INTO) if packed else content)
            content = done[key][1]
            out[p] = msg if content is msg.content else Message(
                content, dst_node_id=msg.metadata.dst_node_id, message_type=msg.metadata.message_type)
        return out

    def party_of(self, reply: Message) -> int:
        """The party a reply of the last exchange answers (by ``reply_to_message_id``)."""
        try:
            return self._sent[reply.metadata.reply_to_message_id]
        except KeyError:
            raise ReplyError(f"a reply to message {reply.metadata.reply_to_message_id!r}, which the last "
                             "exchange did not send") from None
