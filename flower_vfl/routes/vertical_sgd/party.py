"""A vertical party of the FDML-style SGD baseline as Flower message handlers (glue only:
the math is :class:`~flower_vfl.routes.vertical_sgd.reference.SGDParty`).

Each training message carries the (epoch, batch) to predict on and, pipelined, the
gradient g of the previous batch: the party first steps its block with it (once: a
re-sent message with an already applied step is not applied again), then replies with
s_m = D_m[B] x_m for the new batch. The evaluation message carries the last pending
gradient and asks for D_m x_m on the training and the held-out rows, plus lam/2 ||x_m||^2.
x_m and the last applied step live in ``context.state`` (every message may be a fresh
process on real SuperNodes). The party's data loading is the ADMM party's
(:func:`flower_vfl.io.data.party_block`). Every message enters through the one entry every party
shares (:class:`~flower_vfl.clients.base.PartyBase`): its fields are parsed by the trust boundary's
readers (:mod:`flower_vfl.privacy.boundary`: counts, finite scalars, the gradient's shape and
finiteness) before any math; a malformed one raises its
:class:`~flower_vfl.privacy.boundary.InvalidMessage` naming the field.
"""

from __future__ import annotations

import numpy as np
import math

from flwr.app import Array, ArrayRecord, Context, Message

from flower_vfl.clients.base import PartyBase
from flower_vfl.config.settings import run_setting
from flower_vfl.io.data import party_block
from flower_vfl.privacy.boundary import InvalidMessage, parse_count, parse_field, parse_scalar
from flower_vfl.routes.vertical_sgd.reference import SGDParty, batch_indices, init_coef

__all__ = ["VerticalSGDPartyClient", "make_sgd_client", "SGD_HANDLERS"]

STATE = "vfl.sgd"


#: the largest count (rows, batch size, epoch, batch, step) a message may carry
MAX_COUNT = 10**12


def _count(cfg, key, who):
    return parse_count(cfg, key, who, default=None, lo=1 if key == "batch_size" else 0, hi=MAX_COUNT)


class VerticalSGDPartyClient(PartyBase):
    """Party m of vertical SGD.

    Parameters
    ----------
    party_id : int
    D, D_test : array or sparse matrix
        The party's own training and held-out column blocks.
    lam : float, default=1e-4
        Its L2 coefficient (lam/2 ||x_m||^2).
    """

    #: a malformed message raises (the ClientApp's error reply names it)
    REPLY_INVALID = False

    def __init__(self, party_id, D, D_test, lam=1e-4):
        self.party_id, self.D, self.D_test, self.lam = int(party_id), D, D_test, float(lam)

    @classmethod
    def from_context(cls, context: Context) -> "VerticalSGDPartyClient":
        """This node's party (:func:`make_sgd_client`)."""
        return make_sgd_client(context)

    # ------------------------------------------------------------------ the boundary
    def _parse(self, content, train: bool) -> dict:
        """The message's fields, each typed and range-checked before any math: ``config`` (n_rows,
        batch_size, epoch, batch for a train request; seed, init_scale) and, when present, the
        ``pending`` step (step, batch_size, epoch, batch, seed, lr) with its gradient ``grad['g']``:
        one finite value per row of that batch (its rows ``idx``)."""
        who = self.party_id
        cfg = parse_field(content, "config", "message")
        out = {"seed": parse_count(cfg, "seed", who, default=None, lo=0, hi=2**63 - 1),
               "init_scale": parse_scalar(cfg, "init_scale", -math.inf, math.inf, who)}
        if train:
            n = _count(cfg, "n_rows", who)
            if n != self.D.shape[0]:
                raise InvalidMessage(f"party {self.party_id}: the server has {n} rows but this party holds "
                                     f"{self.D.shape[0]}; the parties' samples are not aligned", field="config.n_rows")
            out.update({k: _count(cfg, k, who) for k in ("batch_size", "epoch", "batch")})
            out["idx"] = self._rows(out, "config")
        out["pending"] = None
        if "pending" in content.config_records:
            pc = content.config_records["pending"]
            pend = {k: _count(pc, k, who) for k in ("step", "batch_size", "epoch", "batch")}
            pend["seed"] = parse_count(pc, "seed", who, default=None, lo=0, hi=2**63 - 1)
            pend["lr"] = parse_scalar(pc, "lr", -math.inf, math.inf, who)
            g = parse_field(parse_field(content, "grad", "message"), "g", "grad")
            g = g.numpy() if hasattr(g, "numpy") else np.asarray(g)
            pend["idx"] = idx = self._rows(pend, "pending")
            if g.shape != (idx.size,):
                raise InvalidMessage(f"party {self.party_id}: gradient of shape {g.shape} for a batch of {idx.size} "
                                     "rows", field="grad.g")
            if g.dtype.kind != "f" or not np.isfinite(g).all():
                raise InvalidMessage(f"party {self.party_id}: grad['g'] ({g.dtype}) must be finite float values",
                                     field="grad.g")
            pend["g"] = g
            out["pending"] = pend
        return out

    def _rows(self, d, where):
        """The rows of batch ``d['batch']`` of epoch ``d['epoch']`` (a batch past the epoch's last is refused)."""
        try:
            return batch_indices(self.D.shape[0], d["batch_size"], d["epoch"], d["batch"], d["seed"])
        except ValueError as exc:
            raise InvalidMessage(f"party {self.party_id}: {where}['batch']: {exc}", field=f"{where}.batch") from None

    # ------------------------------------------------------------------ state
    def _load(self, context: Context, cfg) -> tuple[SGDParty, int]:
        if STATE in context.state:
            rec = context.state[STATE]
            return SGDParty(self.D, self.lam, rec["x"].numpy()), int(rec["applied"].numpy()[0])
        x0 = init_coef(self.D.shape[1], self.party_id, cfg["seed"], cfg["init_scale"])
        return SGDParty(self.D, self.lam, x0), -1

    def _save(self, context: Context, party: SGDParty, applied: int):
        context.state[STATE] = ArrayRecord({"x": Array(party.x), "applied": Array(np.array([applied]))})

    def _apply_pending(self, cfg, party: SGDParty, applied: int) -> int:
        """Step 3 of the previous batch with the gradient the label owner sent."""
        pc = cfg["pending"]
        if pc is None:
            return applied
        step = pc["step"]
        if step <= applied:          # a re-sent message: already applied
            return applied
        party.step(pc["idx"], pc["g"], pc["lr"])
        return step

    # ------------------------------------------------------------------ handlers
    def _identity_fields(self, msg: Message, context: Context) -> dict:
        return {**self._rows_identity(), "algorithm": "sgd"}

    def train(self, msg: Message, context: Context) -> Message:
        """Apply the pending gradient, then s_m = D_m[B] x_m on the requested batch."""
        def answer(cfg):
            party, applied = self._load(context, cfg)
            applied = self._apply_pending(cfg, party, applied)
            s = party.predict(cfg["idx"])
            self._save(context, party, applied)
            return self._reply(msg, {"s": s}, None)
        return self._handle(msg, lambda content: self._parse(content, train=True), answer)

    def evaluate(self, msg: Message, context: Context) -> Message:
        """Apply the pending gradient, then D_m x_m on the training and held-out rows."""
        def answer(cfg):
            party, applied = self._load(context, cfg)
            applied = self._apply_pending(cfg, party, applied)
            self._save(context, party, applied)
            out = {"s_train": np.asarray(self.D @ party.x, dtype=float).ravel()}
            if self.D_test is not None:
                out["s_test"] = np.asarray(self.D_test @ party.x, dtype=float).ravel()
            return self._reply(msg, out, None, penalty=float(party.penalty()))
        return self._handle(msg, lambda content: self._parse(content, train=False), answer)


def make_sgd_client(context: Context) -> VerticalSGDPartyClient:
    """The party of this node, loading its block as the ADMM ClientApp does."""
    rc, nc = context.run_config, context.node_config
    if "partition-id" not in nc:
        raise ValueError("this SuperNode's node config has no partition-id: start it with "
                         "--node-config \"partition-id=<m> ...\" (the party it serves, 0..num-parties-1)")
    party = int(nc["partition-id"])
    D, D_test = party_block(str(run_setting("dataset", rc, nc)), party, int(run_setting("num-parties", rc, nc)),
                            run_setting("data-dir", rc, nc) or None)
    return VerticalSGDPartyClient(party, D, D_test, lam=float(run_setting("lam", rc, nc)))


#: message type -> handler, for a ClientApp (``app.train()(SGD_HANDLERS['train'])``) or LocalGrid
SGD_HANDLERS = {"query.identify": VerticalSGDPartyClient.handler("identify"),
                "train": VerticalSGDPartyClient.handler("train"),
                "evaluate": VerticalSGDPartyClient.handler("evaluate")}
