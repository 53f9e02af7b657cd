"""What every party of every route shares: the one party base.

A party (a vertical ADMM party, a one-release party of the stacked-SSP or moment route, the
horizontal DP-IADMM agent, a vertical SGD party) is built per message from what its node config
declares (:meth:`PartyBase.from_context`, or the ClientApp's factory in :mod:`flower_vfl.apps.client`
and :mod:`flower_vfl.apps.horizontal`; :meth:`PartyBase.handler` makes a ClientApp handler of
either); the server's messages never choose its data, its privacy settings or its budget.
:class:`PartyBase` holds the handlers' shared skeleton:

- :meth:`PartyBase.identify`: the identity reply (``{"identity": ConfigRecord}``), its fields
  from the route's :meth:`PartyBase._identity_fields` (:meth:`PartyBase._rows_identity` for a vertical
  party: its id, row counts, whether it is private);
- :meth:`PartyBase._handle`: the one entry of every other message. The request's content (a
  packed request decoded first: :meth:`PartyBase._content`, :mod:`flower_vfl.io.wire`) is parsed by
  the route's reader, built on :mod:`flower_vfl.privacy.boundary` (fields, dtypes, shapes, every
  scalar and count in its range), before any math, state or budget sees it; then the route's
  answer runs on what was parsed. A :class:`~flower_vfl.privacy.boundary.Refused` (or the
  route's other :attr:`PartyBase.REFUSALS`) becomes the one-line refusal reply
  (:meth:`PartyBase._refusal`: party, reason, code, field); a party whose ClientApp turns user errors
  into error replies (:attr:`PartyBase.REPLY_INVALID` False: the agent, the SGD party) lets a
  malformed message's :class:`~flower_vfl.privacy.boundary.InvalidMessage` raise instead;
- :meth:`PartyBase._reply`: a release reply (``release`` ArrayRecord and ``meta``), packed when
  the request was.

What a party computes and releases stays its route's: :mod:`flower_vfl.clients.party_base`
(ADMM), :mod:`flower_vfl.clients.party_one_release` (stacked SSP, moment),
:mod:`flower_vfl.clients.dpiadmm` (horizontal), :mod:`flower_vfl.routes.vertical_sgd.party`.
Glue only: no math here.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from flower_vfl.io.wire import PACK_REPLY_INTO, PACK_REQUEST_INTO, is_packed, pack, unpack
from flower_vfl.privacy.boundary import InvalidMessage, Refused, to_wire

__all__ = ["PartyBase", "STATE_META"]

#: the ``context.state`` record of a vertical ADMM party's round meta (its outputs, last round, answers):
#: here, below every route's party, so the secure-aggregation wrapper reads it without importing its party
STATE_META = "vfl.meta"


class PartyBase:
    """The shared skeleton of a party's handlers; a route's party sets the class attributes and
    :meth:`_identity_fields`, and answers each message through :meth:`_handle`."""

    #: what the party calls itself in replies and refusals ("party 3", "agent 0")
    ROLE = "party"
    #: whether the party reads requests with their arrays packed into the config record
    #: (:mod:`flower_vfl.io.wire`; told to the central node at identify); the reply is packed then
    READS_PACKED = False
    #: the exceptions :meth:`_handle` turns into a refusal reply
    REFUSALS: tuple = (Refused,)
    #: whether a malformed message gets a refusal reply (True) or raises its InvalidMessage (False:
    #: the ClientApp's ``reply_user_errors`` makes it an error reply naming the field)
    REPLY_INVALID = True
    #: True for a party that releases noisy values and keeps a ledger
    private = False

    party_id: int
    #: whether the request being answered came packed (its reply is packed then)
    _packed = False

    @property
    def who(self) -> str:
        return f"{self.ROLE} {self.party_id}"

    # ------------------------------------------------------------------ the node config
    @classmethod
    def from_context(cls, context: Context) -> "PartyBase":
        """This node's party, built per message from what its node config declares (its data, its
        privacy settings, its budget: the only config it trusts; the run config only for public
        settings). A route whose ClientApp factory lives in ``apps/`` passes it to :meth:`handler`."""
        raise NotImplementedError

    @classmethod
    def handler(cls, method: str, make=None, name: str | None = None, doc: str | None = None):
        """A ClientApp handler: the party ``make(context)`` builds (default :meth:`from_context`) answers
        with its ``method``."""
        build = make or cls.from_context

        def handle(msg: Message, context: Context) -> Message:
            return getattr(build(context), method)(msg, context)
        handle.__name__ = handle.__qualname__ = name or method
        handle.__doc__ = doc
        return handle

    # ------------------------------------------------------------------ identify
    def _identity_fields(self, msg: Message, context: Context) -> dict:
        """The identity reply's fields."""
        raise NotImplementedError

    def _rows_identity(self) -> dict:
        """A vertical party's identity: its id, its row counts to align, whether it is private."""
        return {self.ROLE: self.party_id, "n_rows": int(self.D.shape[0]),
                "n_test": int(self.D_test.shape[0]) if self.D_test is not None else 0,
                "private": bool(self.private)}

    def identify(self, msg: Message, context: Context) -> Message:
        """Which party this node serves and what the central node needs to know first (nothing charged)."""
        return Message(RecordDict({"identity": ConfigRecord(self._identity_fields(msg, context))}), reply_to=msg)

    # ------------------------------------------------------------------ the one entry
    def _content(self, msg: Message) -> RecordDict:
        """The request's content, with a packed request's arrays back in their ArrayRecords
        (:func:`flower_vfl.io.wire.unpack`; ``msg`` itself is not changed), before anything reads
        it; what does not decode is refused. A party that does not read packed requests gets the
        content as sent."""
        self._packed = self.READS_PACKED and is_packed(msg.content, PACK_REQUEST_INTO)
        if not self._packed:
            return msg.content
        return unpack(msg.content, PACK_REQUEST_INTO, InvalidMessage, self.who)

    def _handle(self, msg: Message, parse, answer, reply=None) -> Message:
        """Every message's one path: ``parse(content)`` (the route's reader on
        :mod:`flower_vfl.privacy.boundary`) before any math, then ``answer(parsed)`` -> the reply
        Message (or, with ``reply``, what ``reply(answer(parsed))`` makes of it: what the party keeps
        after its release and the reply, outside the refusal's reach). A refusal (:attr:`REFUSALS`)
        in ``parse`` or ``answer`` is the refusal reply; a malformed message raises when
        :attr:`REPLY_INVALID` is False."""
        try:
            parsed = parse(self._content(msg))
        except InvalidMessage as exc:
            if not self.REPLY_INVALID:
                raise
            return self._refusal(msg, exc)
        except self.REFUSALS as exc:
            return self._refusal(msg, exc)
        try:
            out = answer(parsed)
        except self.REFUSALS as exc:
            return self._refusal(msg, exc)
        return out if reply is None else reply(out)

    # ------------------------------------------------------------------ replies
    def _reply_extra(self, content: RecordDict, refusal: bool):
        """Add to a reply what the party tells the server besides the vectors (a privacy report)."""

    def _finish(self, msg: Message, content: RecordDict) -> Message:
        """The reply with ``content`` (packed when the request was)."""
        if self._packed:
            content = pack(content, PACK_REPLY_INTO)
        return Message(content, reply_to=msg)

    def _reply(self, msg: Message, vectors: dict, rnd, wire: str = "float64", **meta) -> Message:
        """A release reply: ``vectors`` (float64, or ``wire``; a masked uint64 one as it is) and
        the meta record (party, round unless None, ``meta``), then :meth:`_reply_extra`."""
        content = RecordDict({
            # a masked release (secure aggregation) stays uint64 in Z_2^64; a plain one travels in
            # the message's wire dtype (float64, or float32: rounded after any noise was added)
            "release": ArrayRecord({k: Array(v if isinstance(v, np.ndarray) and v.dtype == np.uint64
                                             else to_wire(v, wire)) for k, v in vectors.items()}),
            "meta": MetricRecord({self.ROLE: self.party_id, **({} if rnd is None else {"round": rnd}), **meta}),
        })
        self._reply_extra(content, refusal=False)
        return self._finish(msg, content)

    def _refusal(self, msg: Message, exc: Exception) -> Message:
        """The refusal reply: one line (the error's message), its code and the field at fault."""
        info = {self.ROLE: self.party_id, "reason": str(exc), "code": getattr(exc, "code", "refused")}
        if getattr(exc, "field", None):
            info["field"] = exc.field
        content = RecordDict({"refusal": ConfigRecord(info)})
        self._reply_extra(content, refusal=True)
        return Message(content, reply_to=msg)

