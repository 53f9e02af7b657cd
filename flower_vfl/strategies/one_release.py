"""What the label owner of a one-release private route shares (issue 21 items 2 and 3).

:class:`~flower_vfl.strategies.stacked_ssp.StackedSSPStrategy` (route='stacked-ssp') and
:class:`~flower_vfl.strategies.moment.MomentStrategy` (route='moment') both ask every party one
identify query (``query.<q>_identify``), refuse unless every party is private and can afford its
one release, then send each party its target v_m = kappa_m (t - pi) once (``query.<q>_release``).
This module holds that part: the label fields, the identity-reply checks (a route adds its own
through :meth:`OneReleaseStrategy._check_identity`), the release request, ``start``'s stop rule,
the run report and the per-party protection statement, on the one central base
(:class:`~flower_vfl.strategies.base.CentralBase`: Flower's ``start`` contract, identify, the run
state :class:`OneReleaseState`). What each route does with the release
(the SSP calibration, the moment route's ADMM rounds) stays in its own module. Glue only: the
target is :func:`~flower_vfl.privacy.ssp.stacking_target`.
"""

from __future__ import annotations

import dataclasses
from logging import INFO

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.logger import log

from flower_vfl.core.losses import get_loss
from flower_vfl.privacy.ssp import stacking_target
from flower_vfl.strategies import vertical_outcome
from flower_vfl.strategies.base import CentralBase, RunState
from flower_vfl.strategies.exchange import PartyFailed, PartyLost, PartyRefused, ReplyError, party_keys_from

__all__ = ["OneReleaseStrategy", "OneReleaseState"]


def _int(info, key, nid, lo=0):
    v = info.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ReplyError(f"node {nid}: identity[{key!r}]={v!r}; expected an integer >= {lo}")
    return int(v)


@dataclasses.dataclass
class OneReleaseState(RunState):
    """A one-release run: each party's kappa (its target's scale), the held-out decisions and metrics."""

    kappa: dict = dataclasses.field(default_factory=dict)
    decision_test: np.ndarray | None = None
    metrics: dict = dataclasses.field(default_factory=dict)


class OneReleaseStrategy(CentralBase):
    """The label owner of a route where each private party makes one release (a base: a route
    sets the class attributes below and its own rounds, :meth:`run`)."""

    State = OneReleaseState
    #: the route in prose ("the <ROUTE> route needs every party private")
    ROUTE = ""
    #: the route's name in the run report (``final_['route']``)
    ROUTE_KEY = ""
    #: the messages' prefix: ``query.<QUERY>_identify``, ``query.<QUERY>_release``
    QUERY = ""
    #: the release in prose ("its one <RELEASE> release")
    RELEASE = ""
    #: the round number of the one release
    ROUND = 1
    #: what stops the run (raised again by :meth:`start`)
    STOPS: tuple = (PartyRefused, PartyLost, PartyFailed, ReplyError)
    #: the protection statement: what the release is, and the rows it does not protect
    RELEASE_DESC = ""
    EXPOSED_ROWS: tuple = ("", "")

    def _init_labels(self, y_train, y_test, num_parties, timeout, party_wait, party_keys, max_release, progress):
        """The fields every one-release label owner has (the labels never leave it)."""
        y = np.asarray(y_train)
        self.loss = get_loss("logistic")
        self.classes_ = np.unique(y)
        if self.classes_.size != 2:
            raise ValueError(f"y_train has {self.classes_.size} classes; the {self.ROUTE} route is binary")
        self.t = self.loss.encode_labels(y)            # +-1 for the test metrics' loss
        self.t01 = (y == self.classes_[1]).astype(float)
        self.t_test = None if y_test is None else self.loss.encode_labels(np.asarray(y_test))
        self.n_train = int(self.t01.size)
        self.pi = float(self.t01.mean())
        self.num_parties = int(num_parties)
        self.timeout, self.party_wait = float(timeout), float(party_wait)
        self.party_keys = party_keys_from(party_keys, self.num_parties)
        self.max_release = float(max_release)
        self.progress = progress
        self.label_privacy_ = None

    @property
    def round_timeout(self) -> float:
        """Seconds to wait for the replies to one request (the constructor's ``timeout``)."""
        return self.timeout

    @property
    def identity_(self) -> dict:
        return self.state_.identity

    # ------------------------------------------------------------------ identify
    def _check_identity(self, party, nid, info) -> None:
        """A route's own identity checks (after 'private', before 'c_v'); none by default."""

    def identify_query(self, state):
        return (f"query.{self.QUERY}_identify", RecordDict({"config": ConfigRecord({"want": self.QUERY})}),
                f"the {self.QUERY}_identify query")

    def read_identity(self, nid, rep):
        if "identity" not in rep.content.config_records:
            raise ReplyError(f"node {nid}: the {self.QUERY}_identify reply has no 'identity' record")
        info = rep.content.config_records["identity"]
        party = _int(info, "party", nid)
        n_rows = _int(info, "n_rows", nid)
        if 0 <= party < self.num_parties and n_rows != self.n_train:
            raise ValueError(f"party {party} (node {nid}) holds {n_rows} rows but the labels have {self.n_train}; "
                             "the parties' samples are not aligned")
        n_test = _int(info, "n_test", nid)
        if self.t_test is not None and n_test != self.t_test.shape[0]:
            raise ValueError(f"party {party} (node {nid}) holds {n_test} held-out rows but the held-out labels have "
                             f"{self.t_test.shape[0]}; the parties' test samples are not aligned")
        if info.get("private") is not True:
            raise PartyRefused(f"party {party} (node {nid}) is not private: the {self.ROUTE} route needs every party "
                               "private (dp=true dp-epsilon=<ε> in its node config); run route='admm' otherwise")
        self._check_identity(party, nid, info)
        c_v = info.get("c_v")
        if isinstance(c_v, bool) or not isinstance(c_v, float) or not (np.isfinite(c_v) and 0 < c_v <= 1e6):
            raise ReplyError(f"node {nid}: identity['c_v']={c_v!r}; expected a finite number in (0, 1e6]")
        stored = info.get("stored", 0)
        if info.get("affordable", True) is False and stored:
            # its budget is spent, but a stored release may be the one this run asks for (a re-run after
            # a crash): the party serves it again, free, or refuses another target before any charge
            log(INFO, "party %s (node %s): budget spent, %s stored %s release(s); asking for the same one",
                party, nid, stored, self.RELEASE)
        elif info.get("affordable", True) is False:
            raise PartyRefused(
                f"party {party} (node {nid}) is private and its remaining budget cannot cover its one {self.RELEASE} "
                f"release: it has spent epsilon={float(info.get('spent_before_run', float('nan'))):.4g} of its "
                f"budget epsilon={float(info.get('epsilon', float('nan'))):g} on this data in earlier runs. The "
                "party can see its spend with `flower-vfl ledger --state-dir <its state-dir>`; only its operator "
                "can grant a new budget")
        return party, {"n_rows": n_rows, "n_test": n_test, "c_v": float(c_v)}

    # ------------------------------------------------------------------ the release
    def release_content(self, state: OneReleaseState, party: int) -> RecordDict:
        """Party ``party``'s one release request: its target v = kappa (t - pi) (kappa kept in the
        state) and the round."""
        v, state.kappa[party] = stacking_target(self.t01, state.identity[party]["c_v"])
        return RecordDict({"vectors": ArrayRecord({"v": Array(v)}),
                           "config": ConfigRecord({"round": self.ROUND})})

    def release_message(self, state: OneReleaseState, party: int, nid: int) -> Message:
        return Message(self.release_content(state, party), dst_node_id=nid,
                       message_type=f"query.{self.QUERY}_release")

    # ------------------------------------------------------------ the run
    def check_start(self, initial_arrays, num_rounds, train_config, evaluate_config, evaluate_fn):
        """Flower's arguments a one-release route cannot honour (``num_rounds`` is accepted and means
        nothing here: each party makes exactly one release)."""
        vertical_outcome.check_start(initial_arrays, num_rounds, train_config, evaluate_config, evaluate_fn)

    def report(self, state: OneReleaseState) -> dict:
        return {**state.metrics, "rounds": len(state.history), "route": self.ROUTE_KEY,
                "protection": self.protection(state)}

    def protection(self, state: OneReleaseState | None = None) -> dict:
        """What this run protects, per party (the run report's plain statement)."""
        privacy = (state or self.state_).privacy
        out = {}
        rows_key, rows_text = self.EXPOSED_ROWS
        for m in range(self.num_parties):
            rep = privacy.get(m)
            feats = (f"row-level DP of this party's training rows: {self.RELEASE_DESC} (budget "
                     f"epsilon={rep['config']['epsilon']:g}, delta={rep['config']['delta']:g}; spent "
                     f"{rep['totals'].get('exact', float('nan')):.4g} by its own ledger)" if rep else "no release")
            out[str(m)] = {"features": feats,
                           "labels": "not protected from the parties: the target v = kappa (t - pi) reveals them",
                           rows_key: rows_text}
        return out
