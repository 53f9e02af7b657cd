"""A vertical party of the FDML-style SGD baseline as Flower message handlers (glue only:
the math is :class:`~flower_vfl.routes.vertical_sgd.reference.SGDParty`).

Each training message carries the (epoch, batch) to predict on and, pipelined, the
gradient g of the previous batch: the party first steps its block with it (once: a
re-sent message with an already applied step is not applied again), then replies with
s_m = D_m[B] x_m for the new batch. The evaluation message carries the last pending
gradient and asks for D_m x_m on the training and the held-out rows, plus lam/2 ||x_m||^2.
x_m and the last applied step live in ``context.state`` (every message may be a fresh
process on real SuperNodes). The party's data loading is the ADMM party's
(:func:`flower_vfl.io.data.party_block`).
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from flower_vfl.config.settings import run_setting
from flower_vfl.io.data import party_block
from flower_vfl.routes.vertical_sgd.reference import SGDParty, batch_indices, init_coef

__all__ = ["VerticalSGDPartyClient", "make_sgd_client", "SGD_HANDLERS"]

STATE = "vfl.sgd"


class VerticalSGDPartyClient:
    """Party m of vertical SGD.

    Parameters
    ----------
    party_id : int
    D, D_test : array or sparse matrix
        The party's own training and held-out column blocks.
    lam : float, default=1e-4
        Its L2 coefficient (lam/2 ||x_m||^2).
    """

    def __init__(self, party_id, D, D_test, lam=1e-4):
        self.party_id, self.D, self.D_test, self.lam = int(party_id), D, D_test, float(lam)

    def _load(self, context: Context, cfg) -> tuple[SGDParty, int]:
        if STATE in context.state:
            rec = context.state[STATE]
            return SGDParty(self.D, self.lam, rec["x"].numpy()), int(rec["applied"].numpy()[0])
        x0 = init_coef(self.D.shape[1], self.party_id, int(cfg["seed"]), float(cfg["init_scale"]))
        return SGDParty(self.D, self.lam, x0), -1

    def _save(self, context: Context, party: SGDParty, applied: int):
        context.state[STATE] = ArrayRecord({"x": Array(party.x), "applied": Array(np.array([applied]))})

    def _apply_pending(self, msg: Message, party: SGDParty, applied: int) -> int:
        """Step 3 of the previous batch with the gradient the label owner sent."""
        if "pending" not in msg.content.config_records:
            return applied
        pc = msg.content.config_records["pending"]
        step = int(pc["step"])
        if step <= applied:          # a re-sent message: already applied
            return applied
        g = msg.content.array_records["grad"]["g"].numpy()
        idx = batch_indices(self.D.shape[0], int(pc["batch_size"]), int(pc["epoch"]), int(pc["batch"]),
                            int(pc["seed"]))
        if g.shape != (idx.size,):
            raise ValueError(f"party {self.party_id}: gradient of shape {g.shape} for a batch of {idx.size} rows")
        party.step(idx, g, float(pc["lr"]))
        return step

    def identify(self, msg: Message, context: Context) -> Message:
        info = ConfigRecord({"party": self.party_id, "n_rows": int(self.D.shape[0]),
                             "n_test": int(self.D_test.shape[0]) if self.D_test is not None else 0,
                             "private": False, "algorithm": "sgd"})
        return Message(RecordDict({"identity": info}), reply_to=msg)

    def train(self, msg: Message, context: Context) -> Message:
        """Apply the pending gradient, then s_m = D_m[B] x_m on the requested batch."""
        cfg = msg.content.config_records["config"]
        if int(cfg["n_rows"]) != self.D.shape[0]:
            raise ValueError(f"party {self.party_id}: the server has {int(cfg['n_rows'])} rows but this party "
                             f"holds {self.D.shape[0]}; the parties' samples are not aligned")
        party, applied = self._load(context, cfg)
        applied = self._apply_pending(msg, party, applied)
        idx = batch_indices(self.D.shape[0], int(cfg["batch_size"]), int(cfg["epoch"]), int(cfg["batch"]),
                            int(cfg["seed"]))
        s = party.predict(idx)
        self._save(context, party, applied)
        return self._reply(msg, {"s": s})

    def evaluate(self, msg: Message, context: Context) -> Message:
        """Apply the pending gradient, then D_m x_m on the training and held-out rows."""
        cfg = msg.content.config_records["config"]
        party, applied = self._load(context, cfg)
        applied = self._apply_pending(msg, party, applied)
        self._save(context, party, applied)
        out = {"s_train": np.asarray(self.D @ party.x, dtype=float).ravel()}
        if self.D_test is not None:
            out["s_test"] = np.asarray(self.D_test @ party.x, dtype=float).ravel()
        return self._reply(msg, out, penalty=party.penalty())

    def _reply(self, msg, vectors, penalty=None):
        meta = MetricRecord({"party": self.party_id})
        if penalty is not None:
            meta["penalty"] = float(penalty)
        return Message(RecordDict({"release": ArrayRecord({k: Array(np.asarray(v, dtype=float))
                                                           for k, v in vectors.items()}),
                                   "meta": meta}), reply_to=msg)


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


def _handler(name):
    def handle(msg: Message, context: Context) -> Message:
        return getattr(make_sgd_client(context), name)(msg, context)
    handle.__name__ = name
    return handle


#: message type -> handler, for a ClientApp (``app.train()(SGD_HANDLERS['train'])``) or LocalGrid
SGD_HANDLERS = {"query.identify": _handler("identify"), "train": _handler("train"),
                "evaluate": _handler("evaluate")}
