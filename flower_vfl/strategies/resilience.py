"""Identify, exchange and checkpoint for the central node: the parts of a round that must
survive faults (a SuperNode that dies and restarts, a slow party, a ServerApp crash).

Used by :class:`~flower_vfl.strategies.vertical_admm.VerticalADMMStrategy` as a mixin; the
ADMM math stays in :mod:`flower_vfl.core.central`.

- identify waits (``party-wait`` seconds) until every party has a node, and checks each node's
  claim against its SuperNode authentication key when ``party-keys`` binds keys to parties;
- a round matches replies by ``reply_to_message_id`` and checks every release
  (:mod:`.replies`); a party whose node went away is waited for (``party-wait``) and its
  restarted SuperNode (a new node id) is re-identified and asked again; with
  ``stragglers='stale'`` the round goes on with the party's last release (at most
  ``max-staleness`` rounds in a row);
- the label owner's state is checkpointed atomically after every round
  (:mod:`flower_vfl.io.checkpoint`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from logging import INFO, WARNING

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.logger import log

from flower_vfl.strategies.replies import LOST_CODES, PartyFailed, PartyLost, ReplyError, claim, match_replies, message_key

__all__ = ["ResilientRounds", "key_fingerprint", "load_party_keys", "send_and_receive"]

POLL_S = 1.0
#: pull intervals: from 20 ms, growing x1.5 up to 0.25 s (Flower 1.41's HTTP grid sleeps 3 s
#: between pulls in its own send_and_receive, up to 3 s of idle time per exchange)
PULL_FIRST_S, PULL_MAX_S = 0.02, 0.25


def send_and_receive(grid, messages, timeout) -> list:
    """Push ``messages`` and pull their replies until all came or ``timeout`` s passed, polling
    from 20 ms up to every 0.25 s. A Grid without push/pull (the in-process LocalGrid) is
    asked through its own ``send_and_receive``."""
    if os.environ.get("FLOWER_VFL_GRID_PULL") == "flower":      # Flower's own loop (benchmarks)
        return list(grid.send_and_receive(messages, timeout=timeout))
    try:
        ids = {i for i in grid.push_messages(messages) if i}
    except NotImplementedError:
        return list(grid.send_and_receive(messages, timeout=timeout))
    end, wait, out = time.monotonic() + timeout, PULL_FIRST_S, []
    while ids:
        got = list(grid.pull_messages(ids))
        out += got
        ids -= {m.metadata.reply_to_message_id for m in got}
        if not ids or time.monotonic() >= end:
            break
        time.sleep(wait)
        wait = min(wait * 1.5, PULL_MAX_S)
    return out


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


class ResilientRounds:
    """Mixin: needs ``num_parties``, ``central.n``, ``round_timeout``, ``party_wait``,
    ``stragglers``, ``max_staleness``, ``party_keys``, ``node_to_party``, ``private_parties``."""

    # ---------------------------------------------------------------- identify
    def _node_keys(self, grid) -> dict[int, str]:
        """node id -> fingerprint of its authentication key ('' when the SuperLink has none)."""
        try:
            return {int(n.node_id): key_fingerprint(n.public_key) if n.public_key else ""
                    for n in grid.get_nodes()}
        except Exception as exc:          # pragma: no cover - a Grid without node info
            raise RuntimeError(f"party-keys is set but the SuperLink gives no node keys: {exc}") from None

    def _ask_identity(self, grid, nodes, timeout) -> dict[int, dict]:
        """Send the identify query to ``nodes``; node id -> its checked identity."""
        msgs = {nid: Message(RecordDict({"config": ConfigRecord({"want": "party"})}), dst_node_id=nid,
                             message_type="query.identify") for nid in nodes}
        replies = send_and_receive(grid, list(msgs.values()), timeout)
        by_id = {message_key(m): nid for nid, m in msgs.items()}    # ids are set on push
        ok = {}
        for rep in replies:
            nid = by_id.get(rep.metadata.reply_to_message_id)
            if nid is None:
                continue
            if nid in ok:
                raise ReplyError(f"node {nid}: a second reply to the identify query")
            if rep.has_error():
                if rep.error.code in LOST_CODES:
                    log(WARNING, "node %s went away before identifying itself: %s", nid, rep.error.reason)
                    continue
                raise PartyFailed(f"node {nid} failed to identify itself: {rep.error.reason}")
            ok[nid] = rep
        out = {}
        for nid, rep in ok.items():
            if "identity" not in rep.content.config_records:
                raise ReplyError(f"node {nid}: the identify reply has no 'identity' record")
            info = rep.content.config_records["identity"]
            for field in ("party", "n_rows"):
                if field not in info or isinstance(info[field], bool) or not isinstance(info[field], int):
                    raise ReplyError(f"node {nid}: identity[{field!r}]={info.get(field)!r}; expected an integer")
            party = int(info["party"])
            if not 0 <= party < self.num_parties:
                raise ReplyError(f"node {nid} claims party {party}, outside 0..{self.num_parties - 1} "
                                 f"(num-parties={self.num_parties}); fix its partition-id")
            if int(info["n_rows"]) != self.central.n:
                raise ValueError(f"party {party} (node {nid}) holds {info['n_rows']} rows but the labels have "
                                 f"{self.central.n}; the parties' samples are not aligned")
            if bool(info.get("private", False)) and info.get("affordable", True) is False:
                raise ReplyError(
                    f"party {party} (node {nid}) is private and its remaining budget cannot cover its plan: it "
                    f"has spent epsilon={float(info.get('spent_before_run', float('nan'))):.4g} of "
                    f"{float(info.get('epsilon', float('nan'))):g} on this data in earlier runs, so every release "
                    "of this run would be refused. The party can see its spend with `flower-vfl ledger "
                    "--state-dir <its state-dir>`; only its operator can grant a new budget")
            last = info.get("last_train", -1)
            out[nid] = {"party": party, "private": bool(info.get("private", False)),
                        "train_rounds": int(info.get("train_rounds", 0)),
                        "restored": isinstance(last, int) and not isinstance(last, bool) and last >= 0}
        return out

    def _check_key(self, grid, nid, party):
        if not self.party_keys:
            return
        fp = self._node_keys(grid).get(nid, "")
        if fp != self.party_keys[party]:
            raise PermissionError(
                f"node {nid} claims party {party} but its SuperNode key "
                f"{'fingerprint ' + fp[:16] + '...' if fp else 'is unknown (is --enable-supernode-auth on?)'}"
                f" is not the one party-keys binds to party {party} ({self.party_keys[party][:16]}...); refused")

    def _note_state(self, party, info) -> None:
        """A non-private party that answers identify without its state (``last_train`` absent or
        < 0: a restarted SuperNode, or a new run after resume) is re-synchronized: its next
        train message folds the last release the server holds into q (see ``_round_content``).
        A party that restored its own state (``last_train`` >= 0) is left as it is."""
        resync = self.__dict__.setdefault("_resync", set())
        if info["private"] or info["restored"]:
            resync.discard(party)
            return
        if float(getattr(self.central, "alpha", 1.0)) != 1.0:
            log(WARNING, "party %s restarts from x = 0: re-synchronizing a stateless party needs alpha = 1", party)
            return
        resync.add(party)

    def identify(self, grid) -> dict[int, int]:
        """Map node id -> party. Waits up to ``party_wait`` s for every party to have a node."""
        deadline = time.monotonic() + self.party_wait
        mapping, seen, asked = {}, {}, set()
        while True:
            nodes = [n for n in grid.get_node_ids() if n not in asked]
            if nodes and (len(asked) + len(nodes) >= self.num_parties or time.monotonic() >= deadline):
                answers = self._ask_identity(grid, nodes, max(self.round_timeout, 1.0))
                asked.update(answers)          # a node that did not answer in time is asked again
                for nid, info in answers.items():
                    party = info["party"]
                    claim(seen, "party", party, nid)
                    self._check_key(grid, nid, party)
                    mapping[nid] = party
                    self._note_state(party, info)
                    if info["private"]:
                        self.private_parties[party] = info["train_rounds"]
            missing = sorted(set(range(self.num_parties)) - set(seen))
            if not missing or time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        if missing:
            raise PartyLost(f"parties {missing} did not answer the identify query within party-wait="
                            f"{self.party_wait:g} s (nodes seen: {sorted(grid.get_node_ids())}): num-parties={self.num_parties} "
                            f"but {len(asked)} SuperNodes answered. Start one SuperNode per party (simulation: "
                            f"--federation-config \"num-supernodes={self.num_parties}\") or set num-parties="
                            f"{len(asked)}")
        self.node_to_party = mapping
        log(INFO, "parties: %s", ", ".join(f"{p} -> node {n}" for n, p in sorted(mapping.items(), key=lambda t: t[1])))
        return mapping

    def _rejoin(self, grid, missing: set, wait: float) -> set:
        """Identify nodes that appeared since (restarted SuperNodes); re-map those that serve a
        missing party. Polls up to ``wait`` s; returns the parties still missing."""
        deadline = time.monotonic() + wait
        missing = set(missing)
        while missing:
            known = set(self.node_to_party) | self._ignored_nodes
            new = [n for n in grid.get_node_ids() if n not in known]
            if new:
                for nid, info in self._ask_identity(grid, new, min(self.round_timeout, max(wait, 1.0))).items():
                    party = info["party"]
                    if party not in missing:
                        log(WARNING, "node %s claims party %s, which is not missing; ignored", nid, party)
                        self._ignored_nodes.add(nid)
                        continue
                    self._check_key(grid, nid, party)
                    old = [n for n, p in self.node_to_party.items() if p == party]
                    for n in old:
                        del self.node_to_party[n]
                        self._ignored_nodes.add(n)
                    self.node_to_party[nid] = party
                    self._note_state(party, info)
                    missing.discard(party)
                    log(INFO, "party %s is back on node %s (was %s)", party, nid, old)
                self._ignored_nodes.update(n for n in new if n not in self.node_to_party)
            if not missing or time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        return missing

    # ---------------------------------------------------------------- exchange
    def _exchange(self, grid, build, parties, what: str, stale_ok: bool = False):
        """Send ``build(party, node)`` to every party in ``parties``; party -> reply.

        A lost party is waited for up to ``party_wait`` s (a restarted SuperNode is
        re-identified and asked again). With ``stale_ok`` the missing parties are returned
        instead (the caller uses their last release). Raises :class:`PartyLost` naming the party.
        """
        if not hasattr(self, "_ignored_nodes"):
            self._ignored_nodes = set()
        got, pending = {}, set(parties)
        unserved = {p for p in pending if p not in self.node_to_party.values()}
        if stale_ok and unserved:        # a restarted node may be back: take it without waiting
            self._rejoin(grid, unserved, 0.0)
        while pending:
            node_of = {p: n for n, p in self.node_to_party.items()}
            requests = {p: build(p, node_of[p]) for p in sorted(pending) if p in node_of}
            replies = send_and_receive(grid, list(requests.values()), self.round_timeout) \
                if requests else []
            ok, lost, gone = match_replies(requests, replies, what)
            lost.update({p: "no node serves it" for p in pending if p not in node_of})
            got.update(ok)
            if not lost:
                break
            for p, why in sorted(lost.items()):
                log(WARNING, "party %s missing in %s: %s", p, what, why)
                for n in [n for n, q in self.node_to_party.items() if q == p and p in gone]:
                    del self.node_to_party[n]                     # its node is gone for good
                    self._ignored_nodes.add(n)
            if stale_ok:
                return got, lost
            if self.party_wait > 0:
                log(INFO, "waiting up to party-wait=%g s for parties %s to come back", self.party_wait, sorted(lost))
            still = self._rejoin(grid, set(lost), self.party_wait)
            if still:
                raise PartyLost("; ".join(f"party {p} did not come back within party-wait={self.party_wait:g} s "
                                          f"({lost[p]})" for p in sorted(still)))
            pending = set(lost)
        return (got, {}) if stale_ok else got
