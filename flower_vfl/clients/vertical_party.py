"""The vertical party as Flower message handlers (glue only: the math is in flower_vfl.core).

A party owns its column block D_m and x_m. Every message first passes the party's trust
boundary (:mod:`flower_vfl.privacy.boundary`): fields, dtypes, shapes, finiteness, scalar
ranges and round order are checked before anything touches state or budget, and a bad
message gets a refusal naming the field. A private party's ledger and every answer it gave
live in its :class:`~flower_vfl.privacy.store.PartyStore` on its own disk (``state-dir``),
in one :class:`~flower_vfl.privacy.ledger.Ledger` keyed by the data source its node config
declares (:mod:`flower_vfl.clients.source`), shared by every run and every view of that data;
its iterate is kept there too, so a restarted node resumes. A non-private party keeps x_m,
s_m and z_loc in ``context.state``. Replies carry only N-vectors and scalar metadata: never
x_m, never anything about the noise's origin.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict

import numpy as np
import scipy.sparse as sp
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from flower_vfl.core.constraints import make_constraint
from flower_vfl.core.party import PartyUpdate
from flower_vfl.core.penalties import get_penalty
from flower_vfl.privacy.boundary import InvalidMessage, Refused, inputs_hash, parse_round
from flower_vfl.core.scoring import party_scores


__all__ = ["VerticalPartyClient"]

STATE_ARRAYS = "vfl.party"
STATE_META = "vfl.meta"
STATE_LAST = "vfl.last"


#: x-update solvers (they hold the factorization of lam I + rho D^T D) kept across messages
#: while the process lives, keyed by a hash of the block and the solver parameters. A
#: simulation actor or an in-process grid serves many messages from one process: without
#: this cache every message re-factorized (about 60% of a non-private a9a party's handler
#: time, benchmarks/bench_flower.py). On real SuperNodes each message is a fresh process
#: and the cache is simply empty.
_SOLVERS: OrderedDict = OrderedDict()
_SOLVERS_MAX = 8
#: open party stores by state-dir (one SQLite connection per process)
_STORES: dict = {}


def _fingerprint(D) -> tuple:
    """Type, shape and a SHA-256 of the block's content: the solver cache's key (never the
    privacy ledger's: that is the declared source, flower_vfl.clients.source)."""
    h = hashlib.sha256()
    M = D.tocsr() if sp.issparse(D) else None
    parts = (M.indptr, M.indices, M.data) if M is not None else (np.asarray(D),)
    for a in parts:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype}|{a.shape}|".encode())
        h.update(memoryview(a).cast("B"))
    return type(D).__name__, tuple(D.shape), h.hexdigest()


class VerticalPartyClient:
    """Party m of vertical ADMM sharing, usable from any Flower ``ClientApp``.

    Parameters
    ----------
    party_id : int
        The party this node serves (``partition-id`` in the node config).
    D, D_test : array or sparse matrix
        The party's own training and held-out column blocks (same columns).
    penalty : str, default='l2'
    lam : float, default=1e-4
    constraint : None, ('ball', r) or ('box', lo, hi)
    l1_ratio : float, default=0.5
    privacy : flower_vfl.privacy.PrivacyConfig or None
        The party's own privacy settings and budget; None releases exact values.
    n_parties : int, default=2
        M (only used by the paper's Lemma 1 calibration).
    x_solver : {'auto', 'gram', 'cg', 'dual', 'chol'}, default='auto'
        The x-update method (:mod:`flower_vfl.core.xsolve`).
    source : flower_vfl.clients.source.DeclaredSource or None
        The data the node config declares: a private party's ledger key. None: the
        ``partition-id`` only (direct use from Python; a ClientApp always passes one).
    rho_range : (float, float) or None
        The party's own bounds on the ρ it accepts (node config ``min-rho``/``max-rho``).
    """

    def __init__(self, party_id, D, D_test, penalty="l2", lam=1e-4, constraint=None, l1_ratio=0.5,
                 privacy=None, n_parties=2, state_dir=None, max_answers=0, x_solver="auto", source=None,
                 rho_range=None):
        self.party_id = int(party_id)
        self.x_solver = x_solver          # the x-update method (core/xsolve.py; run config x-solver)
        self.D, self.D_test = D, D_test
        self.penalty, self.lam, self.constraint, self.l1_ratio = penalty, lam, constraint, l1_ratio
        self.privacy = privacy
        self.n_parties = n_parties
        self.state_dir = state_dir
        self.max_answers = int(max_answers or 0)
        self.source = source
        self.rho_range = rho_range
        self.party = None

    # ----------------------------------------------------------------- state
    def _store(self):
        from flower_vfl.privacy.store import PartyStore, default_state_dir
        key = str(self.state_dir or default_state_dir())
        if key not in _STORES:
            _STORES[key] = PartyStore(key)
        return _STORES[key]

    def _build(self, context: Context, n_outputs: int):
        if self.privacy is not None:
            from flower_vfl.privacy.party import PrivateParty
            src = self.source
            party = PrivateParty(self.D, self.D_test, self.lam, self.privacy, self.party_id, self.n_parties,
                                 store=self._store(), run=str(context.run_id),
                                 source=src.key if src is not None else f"partition:{self.party_id}",
                                 about=src.about if src is not None else None)
            party.restore()                # the iterate is in the store (a restarted node resumes)
            return party
        party = PartyUpdate(self.D, get_penalty(self.penalty, self.l1_ratio), self.lam,
                            make_constraint(self.constraint), n_outputs=n_outputs, x_solver=self.x_solver)
        key = (_fingerprint(self.D), str(self.penalty), float(self.l1_ratio), float(self.lam), repr(self.constraint),
               str(self.x_solver))
        if key in _SOLVERS:
            party.solver = _SOLVERS[key]       # same block and parameters: reuse its factorization
            _SOLVERS.move_to_end(key)
        else:
            _SOLVERS[key] = party.solver
            while len(_SOLVERS) > _SOLVERS_MAX:
                _SOLVERS.popitem(last=False)
        if STATE_ARRAYS in context.state:
            rec = context.state[STATE_ARRAYS]
            party.set_state({k: rec[k].numpy() for k in rec})
        return party

    def _meta(self, context: Context) -> dict:
        if STATE_META in context.state:
            return dict(context.state[STATE_META])
        return {"n_outputs": 0, "last_train": -1, "answers": 0, "last_hash": ""}

    def _n_outputs(self, msg, meta, context) -> int:
        """1 for scalar losses; K for multinomial, pinned by the run's first training message
        (a later change of shape is refused)."""
        if meta["n_outputs"]:
            return int(meta["n_outputs"])
        if str(context.run_config.get("loss", "logistic")) != "multinomial":
            return 1
        try:
            shape = msg.content["vectors"]["q"].shape
        except Exception:
            raise InvalidMessage(f"party {self.party_id}: message field vectors['q'] is missing",
                                 field="vectors.q") from None
        k = 1 if len(shape) == 1 else int(shape[1]) if len(shape) == 2 else -1
        if not (k == 1 or 2 <= k <= 1000) or (self.privacy is not None and k != 1):
            raise InvalidMessage(f"party {self.party_id}: vectors['q'] has shape {tuple(shape)}; expected "
                                 f"({self.D.shape[0]},){'' if self.privacy else ' or (N, K) with 2 <= K <= 1000'}",
                                 field="vectors.q")
        return k

    # -------------------------------------------------------------- handlers
    def identify(self, msg: Message, context: Context) -> Message:
        """Tell the central node which party this node is, the row counts to align, and (a
        private party) whether its remaining budget covers its plan."""
        info = {"party": self.party_id, "n_rows": int(self.D.shape[0]),
                "n_test": int(self.D_test.shape[0]) if self.D_test is not None else 0,
                "private": self.privacy is not None,
                "train_rounds": int(self.privacy.train_rounds) if self.privacy is not None else 0}
        if self.privacy is not None:
            party = self._build(context, 1)
            info.update(party.affordability())
        else:   # the round this party's state in this run has reached (-1: none), for resume
            info["last_train"] = int(self._meta(context)["last_train"])
        return Message(RecordDict({"identity": ConfigRecord(info)}), reply_to=msg)

    def train(self, msg: Message, context: Context) -> Message:
        """One x-update (eq. 6); replies with s_m = D_m x_m (noisy when private)."""
        meta = self._meta(context)
        try:
            n_out = self._n_outputs(msg, meta, context)
            inputs = parse_round(msg.content, n_rows=self.D.shape[0], party=self.party_id,
                                 needs_vectors=True, n_outputs=n_out, rho_range=self.rho_range)
            self.party = self._build(context, n_out)
            if self.privacy is not None:
                s = self.party.train_release(inputs.round, None, None, inputs.rho, inputs=inputs)
            else:
                s = self._public_train(inputs, meta, context)
        except Refused as exc:
            return self._refusal(msg, exc)
        meta["n_outputs"] = n_out
        if self.privacy is None:
            context.state[STATE_ARRAYS] = ArrayRecord(
                {k: Array(np.asarray(v)) for k, v in self.party.get_state().items()})
        context.state[STATE_META] = ConfigRecord(meta)
        return self._reply(msg, {"s": s}, inputs.round)

    def _public_train(self, inputs, meta, context):
        """A non-private release: rounds must increase, an identical re-send gets the same
        vector, and the party's own cap on answers per run (node config max-answers) holds."""
        h = inputs_hash(context.run_id, "train", inputs)
        if inputs.round == meta["last_train"] and h == meta["last_hash"] and STATE_LAST in context.state:
            return context.state[STATE_LAST]["s"].numpy()
        if inputs.round <= meta["last_train"]:
            raise Refused(f"party {self.party_id}: train round {inputs.round} is not after the last answered "
                          f"round {meta['last_train']}; round numbers must increase", field="config.round")
        if self.max_answers and meta["answers"] >= self.max_answers:
            raise Refused(f"party {self.party_id} has given the {self.max_answers} answers its node config "
                          "allows per run (max-answers); refused", field="config.round")
        s = self.party.train_release(inputs.round, inputs.q, inputs.y, inputs.rho, inputs.alpha, inputs.theta)
        if not np.all(np.isfinite(s)):      # refused before context.state is written: nothing changes
            raise InvalidMessage(f"party {self.party_id}: the train release at rho={inputs.rho!r} is not finite; "
                                 "refused (the party's node config can narrow the accepted rho with min-rho / "
                                 "max-rho)", field="config.rho")
        meta.update(last_train=inputs.round, answers=meta["answers"] + 1, last_hash=h)
        context.state[STATE_LAST] = ArrayRecord({"s": Array(np.asarray(s, dtype=float))})
        return s

    def evaluate(self, msg: Message, context: Context) -> Message:
        """Held-out scores D_test x_m. A private party scores from its released x~: the first
        request carrying ``final_update`` makes its last x-update (kept inside the party) and
        draws x~ once (charged once); every later request is post-processing, free."""
        meta = self._meta(context)
        try:
            cfg = msg.content["config"] if "config" in msg.content else {}
            final = self.privacy is not None and bool(cfg.get("final_update", False))
            n_out = meta["n_outputs"] or int(cfg.get("n_outputs", 1))
            inputs = parse_round(msg.content, n_rows=self.D.shape[0], party=self.party_id,
                                 needs_vectors=final, n_outputs=n_out, rho_range=self.rho_range)
            self.party = self._build(context, n_out)
            if self.privacy is None:      # flower_vfl.core.scoring: the predict job's code on the held-out rows
                s_test = party_scores(self.D_test, self.party.x)
            else:
                if self.party.x_released is None:
                    if not final:
                        raise Refused(f"party {self.party_id} is private and releases its model once, after its "
                                      "final update; evaluation before that is refused (no budget spent)")
                    self.party.final_update(inputs.q, inputs.y, inputs.rho, inputs.alpha, inputs.theta)
                    self.party.release_model(inputs.round, inputs_hash(context.run_id, "eval", inputs))
                s_test = party_scores(self.D_test, self.party.x_released, private=True)   # x~: free
        except Refused as exc:
            return self._refusal(msg, exc)
        return self._reply(msg, {"s_test": s_test}, inputs.round)

    def _reply(self, msg, vectors, rnd):
        content = RecordDict({
            "release": ArrayRecord({k: Array(np.asarray(v, dtype=float)) for k, v in vectors.items()}),
            "meta": MetricRecord({"party": self.party_id, "round": rnd}),
        })
        if self.privacy is not None:
            content["privacy"] = ConfigRecord({"report": json.dumps(_jsonable(self.party.report()))})
        else:
            content["meta"]["penalty"] = float(self.lam * self.party.penalty_value())
        return Message(content, reply_to=msg)

    def _refusal(self, msg, exc):
        code = getattr(exc, "code", "refused")
        info = {"party": self.party_id, "reason": str(exc), "code": code}
        if getattr(exc, "field", None):
            info["field"] = exc.field
        content = RecordDict({"refusal": ConfigRecord(info)})
        if self.privacy is not None and self.party is not None:
            content["privacy"] = ConfigRecord({"report": json.dumps(_jsonable(self.party.report()))})
        return Message(content, reply_to=msg)


def _jsonable(obj):
    from flower_vfl.reporting.report import to_jsonable
    return to_jsonable(obj)
