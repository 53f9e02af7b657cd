"""The vertical party as Flower message handlers (glue only: the math is in flower_vfl.core).

A party owns its column block D_m and x_m. On real SuperNodes every message runs in a
fresh process, so everything the party must remember (x_m, its last release s_m, its
share z_loc, and when private its ledger, seed and last answers) lives in
``context.state``. Replies carry only N-vectors and scalar metadata.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict

import numpy as np
import scipy.sparse as sp
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from ..core.engine import make_constraint
from ..core.party import PartyUpdate
from ..core.penalties import get_penalty

__all__ = ["VerticalPartyClient"]

STATE_ARRAYS = "vfl.party"
STATE_PRIVACY = "vfl.privacy"
STATE_ANSWERS = "vfl.answers"


#: x-update solvers (they hold the factorization of lam I + rho D^T D) kept across messages
#: while the process lives, keyed by a hash of the block and the solver parameters. A
#: simulation actor or an in-process grid serves many messages from one process: without
#: this cache every message re-factorized (about 60% of a non-private a9a party's handler
#: time, benchmarks/bench_flower.py). On real SuperNodes each message is a fresh process
#: and the cache is simply empty.
_SOLVERS: OrderedDict = OrderedDict()
_SOLVERS_MAX = 8


def _fingerprint(D) -> tuple:
    """Type, shape and a SHA-256 of the block's content."""
    kind, shape = type(D).__name__, tuple(D.shape)
    if sp.issparse(D):
        D = D.tocsr()                 # no copy when already CSR
        parts = (D.indptr, D.indices, D.data)
    else:
        parts = (np.asarray(D),)
    h = hashlib.sha256()
    for a in parts:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode())
        h.update(memoryview(a).cast("B"))
    return kind, shape, h.hexdigest()


def _vec(record: ArrayRecord, key: str) -> np.ndarray:
    return record[key].numpy()


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
    """

    def __init__(self, party_id, D, D_test, penalty="l2", lam=1e-4, constraint=None, l1_ratio=0.5,
                 privacy=None, n_parties=2):
        self.party_id = int(party_id)
        self.D, self.D_test = D, D_test
        self.penalty, self.lam, self.constraint, self.l1_ratio = penalty, lam, constraint, l1_ratio
        self.privacy = privacy
        self.n_parties = n_parties
        self.party = None

    # ----------------------------------------------------------------- state
    def _build(self, n_outputs: int):
        if self.privacy is not None:
            from ..privacy.party import PrivateParty
            return PrivateParty(self.D, self.D_test, self.lam, self.privacy, self.party_id, self.n_parties)
        party = PartyUpdate(self.D, get_penalty(self.penalty, self.l1_ratio), self.lam,
                            make_constraint(self.constraint), n_outputs=n_outputs)
        key = (_fingerprint(self.D), str(self.penalty), float(self.l1_ratio), float(self.lam), repr(self.constraint))
        if key in _SOLVERS:
            party.solver = _SOLVERS[key]       # same block and parameters: reuse its factorization
            _SOLVERS.move_to_end(key)
        else:
            _SOLVERS[key] = party.solver
            while len(_SOLVERS) > _SOLVERS_MAX:
                _SOLVERS.popitem(last=False)
        return party

    def _load(self, context: Context, n_outputs: int = 1):
        self.party = self._build(n_outputs)
        update = self.party.update if self.privacy is not None else self.party
        if STATE_ARRAYS in context.state:
            rec = context.state[STATE_ARRAYS]
            update.set_state({k: rec[k].numpy() for k in rec})
        if self.privacy is not None and STATE_PRIVACY in context.state:
            from ..privacy.ledger import PrivacyLedger
            from ..privacy.mechanism import GaussianOutputMechanism
            cfg = context.state[STATE_PRIVACY]
            self.party.ledger = PrivacyLedger.from_json(str(cfg["ledger"]))
            self.party.mechanism = GaussianOutputMechanism.from_dict(json.loads(str(cfg["mechanism"])))
            if STATE_ANSWERS in context.state:
                ans = context.state[STATE_ANSWERS]
                for key in ans:
                    rnd, kind = key.split(":")
                    self.party.answered[(int(rnd), kind)] = ans[key].numpy()

    def _save(self, context: Context):
        update = self.party.update if self.privacy is not None else self.party
        context.state[STATE_ARRAYS] = ArrayRecord({k: Array(np.asarray(v)) for k, v in update.get_state().items()})
        if self.privacy is not None:
            context.state[STATE_PRIVACY] = ConfigRecord({
                "ledger": self.party.ledger.to_json(),
                "mechanism": json.dumps(self.party.mechanism.to_dict())})
            # keep the latest answer of each kind: a re-sent request gets the same vector
            latest = {}
            for (rnd, kind), vec in self.party.answered.items():
                if kind not in latest or rnd > latest[kind][0]:
                    latest[kind] = (rnd, vec)
            context.state[STATE_ANSWERS] = ArrayRecord(
                {f"{rnd}:{kind}": Array(np.asarray(vec)) for kind, (rnd, vec) in latest.items()})

    # -------------------------------------------------------------- handlers
    def identify(self, msg: Message, context: Context) -> Message:
        """Tell the central node which party this node is, and the row counts to align."""
        info = ConfigRecord({"party": self.party_id, "n_rows": int(self.D.shape[0]),
                             "n_test": int(self.D_test.shape[0]) if self.D_test is not None else 0,
                             "private": self.privacy is not None,
                             "train_rounds": int(self.privacy.train_rounds) if self.privacy is not None else 0})
        return Message(RecordDict({"identity": info}), reply_to=msg)

    def train(self, msg: Message, context: Context) -> Message:
        """One x-update (eq. 6); replies with s_m = D_m x_m (noisy when private)."""
        vec, cfg = msg.content["vectors"], msg.content["config"]
        q, y = _vec(vec, "q"), _vec(vec, "y")
        if q.shape[0] != self.D.shape[0]:
            raise ValueError(f"party {self.party_id}: the server sent vectors of {q.shape[0]} rows but this "
                             f"party holds {self.D.shape[0]} rows; the parties' samples are not aligned")
        self._load(context, n_outputs=1 if q.ndim == 1 else q.shape[1])
        rnd = int(cfg["round"])
        try:
            s = self.party.train_release(rnd, q, y, float(cfg["rho"]), float(cfg["alpha"]), float(cfg["theta"]))
        except Exception as exc:  # a refusal is an answer, not a crash
            from ..privacy.ledger import BudgetExceeded
            if isinstance(exc, BudgetExceeded):
                return self._refusal(msg, str(exc))
            raise
        self._save(context)
        return self._reply(msg, {"s": s}, rnd)

    def evaluate(self, msg: Message, context: Context) -> Message:
        """Held-out release D_test x_m (for private parties: a ledgered evaluation release).

        The final evaluation carries q, y: a private party first makes its last x-update
        (kept inside the party, never released on training rows)."""
        cfg = msg.content["config"]
        self._load(context, n_outputs=int(cfg.get("n_outputs", 1)))
        rnd = int(cfg["round"])
        final = self.privacy is not None and bool(cfg.get("final_update", False))
        if final and (rnd, "eval") not in self.party.answered:   # a re-sent request is a replay
            vec = msg.content["vectors"]
            self.party.final_update(_vec(vec, "q"), _vec(vec, "y"), float(cfg["rho"]),
                                    float(cfg["alpha"]), float(cfg["theta"]))
        try:
            s_test = self.party.eval_release(rnd, float(cfg["rho"]), float(cfg["theta"]), D_eval=self.D_test)
        except Exception as exc:
            from ..privacy.ledger import BudgetExceeded
            if isinstance(exc, BudgetExceeded):
                return self._refusal(msg, str(exc))
            raise
        self._save(context)
        return self._reply(msg, {"s_test": s_test}, rnd)

    def _reply(self, msg, vectors, rnd):
        content = RecordDict({
            "release": ArrayRecord({k: Array(np.asarray(v, dtype=float)) for k, v in vectors.items()}),
            "meta": MetricRecord({"party": self.party_id, "round": rnd}),
        })
        if self.privacy is not None:
            rep = self.party.report()
            content["privacy"] = ConfigRecord({"report": json.dumps(_jsonable(rep))})
        else:
            content["meta"]["penalty"] = float(self.lam * self.party.penalty_value())
        return Message(content, reply_to=msg)

    def _refusal(self, msg, reason):
        content = RecordDict({"refusal": ConfigRecord({"party": self.party_id, "reason": reason})})
        if self.privacy is not None:
            content["privacy"] = ConfigRecord({"report": json.dumps(_jsonable(self.party.report()))})
        return Message(content, reply_to=msg)


def _jsonable(obj):
    from ..report import to_jsonable
    return to_jsonable(obj)
