"""What the central node accepts from the network: replies matched to requests and checked.

Replies are matched to the request they answer by ``reply.metadata.reply_to_message_id``
(never by ``src_node_id``: when a SuperNode dies the SuperLink itself answers with an error
reply). Every release is checked (record, key, dtype, shape, finiteness) before it can touch
z, and a duplicate reply stops the run instead of silently winning.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Message
from flwr.common.constant import ErrorCode

__all__ = ["ReplyError", "PartyFailed", "PartyLost", "LOST_CODES", "match_replies", "check_release", "claim"]

#: error codes meaning "the node or its message went away" (a restarted SuperNode can take over);
#: any other error reply (the party's handler raised, e.g. it refused an invalid message) is final
LOST_CODES = {ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE, ErrorCode.NODE_UNAVAILABLE,
              ErrorCode.CLIENT_APP_CRASHED}


class ReplyError(RuntimeError):
    """A reply the central node refuses (malformed, duplicate, from the wrong node)."""


class PartyFailed(RuntimeError):
    """A party answered with an error (its handler raised)."""


class PartyLost(RuntimeError):
    """A party did not answer and did not come back within ``party-wait``."""


def message_key(msg: Message) -> str:
    """The id a reply to ``msg`` carries in ``reply_to_message_id`` (set by the Grid on push)."""
    return msg.metadata.message_id or msg.object_id


def match_replies(requests: dict[int, Message], replies, what: str):
    """Pair replies with ``requests`` (party -> sent message).

    Returns ``(ok, lost, gone)``: party -> reply for valid, non-error replies; party -> reason for
    parties whose node went away or that sent nothing; the set of parties whose node is gone
    (the SuperLink said so) rather than silent. Raises :class:`PartyFailed` for an error
    reply of the party's own handler and :class:`ReplyError` for a duplicate reply or a reply
    from another node than the one asked.
    """
    by_id = {message_key(m): p for p, m in requests.items()}
    ok, lost, gone = {}, {}, set()
    for rep in replies:
        party = by_id.get(rep.metadata.reply_to_message_id)
        src = rep.metadata.src_node_id
        if party is None:
            continue                      # a late reply to an earlier request: never used
        node = requests[party].metadata.dst_node_id
        if party in ok or party in lost:
            raise ReplyError(f"party {party} (node {node}): a second reply to the {what} request; one reply "
                             "per party is accepted")
        if rep.has_error():
            code, reason = rep.error.code, rep.error.reason
            if code in LOST_CODES:
                lost[party] = f"node {node} is gone (Flower error {code}: {reason})"
                gone.add(party)
                continue
            raise PartyFailed(f"party {party} (node {node}) failed in the {what} request (Flower error "
                              f"{code}): {reason}")
        if src != node:
            raise ReplyError(f"party {party}: the reply to the {what} request came from node {src}, not from "
                             f"node {node} that serves party {party}")
        ok[party] = rep
    for party in requests:
        if party not in ok and party not in lost:
            lost[party] = f"no reply from node {requests[party].metadata.dst_node_id}"
    return ok, lost, gone


def check_release(rep: Message, party: int, key: str, shape: tuple, what: str) -> np.ndarray:
    """The vector ``release[key]`` of a reply, checked: present, floating, of ``shape``, finite."""
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
    if v.dtype.kind != "f":
        raise ReplyError(f"{where} has dtype {v.dtype}; expected float64")
    if v.shape != tuple(shape):
        raise ReplyError(f"{where} has shape {v.shape}; expected {tuple(shape)} (one value per aligned row)")
    if not np.all(np.isfinite(v)):
        raise ReplyError(f"{where} holds {int(np.size(v) - np.isfinite(v).sum())} NaN/inf values; refused "
                         "(it would poison z for every later round)")
    return np.asarray(v, dtype=np.float64)


def claim(seen: dict, role: str, index: int, nid: int, error: type = ValueError) -> None:
    """Record that node ``nid`` serves ``role`` ``index`` (``seen``: index -> node id); a second
    node claiming the same index stops the run, naming both nodes and the fix."""
    if index in seen and seen[index] != nid:
        raise error(f"nodes {seen[index]} and {nid} both claim {role} {index}; give each SuperNode a distinct "
                    "partition-id in its node config")
    seen[index] = nid
