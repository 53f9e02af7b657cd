"""A private party of the moment route (issue 21 item 3): one label-moment release per run, then
ADMM sharing on the unlabelled pool, through Flower.

The label owner (:class:`~flower_vfl.strategies.moment.MomentStrategy`) asks four things:

``query.moment_identify``
    which party this node serves, its row counts, whether it is private, its target clip ``c_v``
    (node config ``dp-clip``), whether its remaining budget covers the one release and whether its
    node config lets its held-out rows serve as the pool (``moment-pool``). Nothing charged.
``query.moment_release``
    ``vectors['v']`` (the target, one value per training row) and ``config['round']``. The party
    makes its one release g~ = D^T clip(v) + N(0, sigma^2 I)
    (:class:`~flower_vfl.privacy.label_moments.MomentParty`), charged in its own ledger under the
    ledger run ``"<run_id>/moment"``, and replies with an acknowledgement and its privacy report:
    never g~ (it stays in the party's store, which later messages read).
``train.moment``
    one ADMM sharing round on the pool (:mod:`flower_vfl.core.moment_sharing`): ``config`` round,
    fit (0 or 1: which half of the held-out rows is the pool, by a fixed public permutation), rho,
    lam, kappa and ``vectors['c']`` (the completed-square target, one value per pool row). The
    party solves (lam I + rho P^T P) x = rho P^T c + g~ / (N kappa) and replies with its pool
    scores P x only: x and g~ never leave it. It keeps no iterate (x is a function of the message
    and of its stored release), so every message may run in a fresh process.
``evaluate.moment``
    the same inputs; the reply is the scores of the evaluation rows: the held-out rows of the
    other half (each half is scored by the model fitted on the other half's pool).

Never a training-row score: given x, a training row's score is a noiseless function of that row.
Pool rows are not protected by DP (their scores go to the label owner, many times): a party uses
its held-out rows as the pool only when its node config says so (``moment-pool='test'``); the
server cannot choose it. Everything privacy-relevant (data, budget, clip, pool, rho limits) comes
from the node config, never from the run config. Every scalar and vector received is range-checked
before use (:data:`LIMITS`; rho also against the node config's ``min-rho`` / ``max-rho``). A
training message before this run's release is refused. A non-private party refuses (as
:mod:`flower_vfl.clients.party_ssp`; both build on
:class:`~flower_vfl.clients.party_one_release.OneReleasePartyClient`). Glue only: the math is in
:mod:`flower_vfl.core.moment_sharing` and :mod:`flower_vfl.privacy.label_moments`.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict

from flower_vfl.clients.party_one_release import OneReleasePartyClient
from flower_vfl.clients.party_private import party_store
from flower_vfl.core.scoring import normalize_rows
from flower_vfl.privacy.boundary import InvalidMessage, Refused
from flower_vfl.privacy.ssp import cross_fit_halves

__all__ = ["MomentPartyClient", "MOMENT_RUN_SUFFIX", "MOMENT_ROUND", "LIMITS", "POOL_SEED", "MAX_MOMENT_ROUND"]

#: the ledger run of a Flower run's moment release: "<run_id>/moment"
MOMENT_RUN_SUFFIX = "/moment"
#: the round number of the one release
MOMENT_ROUND = 1
#: the largest ADMM round number a request may carry
MAX_MOMENT_ROUND = 100_000
#: the fixed public permutation splitting the held-out rows into the two pool halves (no data)
POOL_SEED = 12345
#: the ranges of what the party accepts (inclusive; rho is narrowed by the node config's
#: min-rho / max-rho). None of them protects a training row (every reply is post-processing of g~
#: and of the pool): they keep the arithmetic finite and the model meaningful
LIMITS = {"rho": (1e-12, 1e6), "lam": (1e-12, 1e3), "c": 1e6}


def _scalar(cfg, key, lo, hi, who):
    v = None if cfg is None else cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (math.isfinite(float(v)) and lo <= v <= hi):
        raise InvalidMessage(f"{who}: config[{key!r}]={v!r} is outside the range this party accepts "
                             f"[{lo:g}, {hi:g}]; refused", field=f"config.{key}")
    return float(v)


class MomentPartyClient(OneReleasePartyClient):
    """Party ``party_id`` with training block ``D`` and held-out block ``D_test``; ``privacy``: its
    PrivacyConfig from its node config (None: not private, refuses); ``pool``: its node config's
    ``moment-pool`` ('test': its held-out rows may serve as the pool; 'none': refuses the route);
    ``rho_range``: its node config's (min-rho, max-rho) or None; ``state_dir``, ``source``: its
    store and declared source (the ledger key), as :class:`~flower_vfl.clients.party_ssp.SSPPartyClient`'s.
    Identify, the release handler, the build, the refusals and the boundary's vector checks:
    :class:`~flower_vfl.clients.party_one_release.OneReleasePartyClient`."""

    ROUTE, A_RELEASE, RELEASE = "moment", "a moment release", "moment"
    RUN_SUFFIX, ROUND = MOMENT_RUN_SUFFIX, MOMENT_ROUND

    def __init__(self, party_id, D, D_test, privacy, pool="none", rho_range=None, state_dir=None, source=None):
        super().__init__(party_id, D, D_test, privacy, state_dir=state_dir, source=source)
        self.pool, self.rho_range = str(pool), rho_range

    # ------------------------------------------------------------------ the party
    def _party_class(self):
        from flower_vfl.privacy.label_moments import MomentParty
        return MomentParty

    def _refuse_if_unfit(self):
        self._refuse_if_public()
        if self.pool != "test":
            raise Refused(f"{self.who}: its node config does not let its held-out rows serve as the unlabelled pool "
                          f"(moment-pool={self.pool!r}); pool rows are not protected by DP (their scores go to the "
                          "label owner in every round). Its operator may set moment-pool='test' in its node config")
        if self.D_test is None or self.D_test.shape[0] < 20:
            raise Refused(f"{self.who} holds {0 if self.D_test is None else self.D_test.shape[0]} held-out rows; the "
                          "pool needs at least 20 (two halves of 10)")

    # ------------------------------------------------------------------ handlers
    def _identity_extra(self) -> dict:
        return {"pool": self.pool == "test"}

    def _release_reply(self, rnd, v) -> RecordDict:
        """The one moment release, kept in the party's store (never sent): an acknowledgement."""
        self.party.release(rnd, v)          # checks v (length, finite) before any charge
        return RecordDict({"meta": MetricRecord({"party": self.party_id, "round": int(rnd), "released": 1})})

    def train(self, msg: Message, context: Context) -> Message:
        """One ADMM round: the pool scores P_c x of this fit's pool half."""
        try:
            rnd, fit, x, upd = self._solve(msg, context)
        except Refused as exc:
            return self._refusal(msg, exc)
        return self._reply(msg, "s_pool", upd.scores(x), rnd, fit)

    def evaluate(self, msg: Message, context: Context) -> Message:
        """The evaluation rows' scores: the other half of the held-out rows, centred as the pool."""
        try:
            rnd, fit, x, upd = self._solve(msg, context)
        except Refused as exc:
            return self._refusal(msg, exc)
        rows = normalize_rows(self.D_test[self._halves()[1 - fit]])     # held-out rows only, never training rows
        return self._reply(msg, "s_eval", upd.scores(x, rows), rnd, fit)

    # ------------------------------------------------------------------ the x-update
    def _halves(self):
        return cross_fit_halves(self.D_test.shape[0], POOL_SEED)

    def _solve(self, msg, context):
        from flower_vfl.core.moment_sharing import MomentXUpdate
        self._refuse_if_unfit()
        rnd, fit, rho, lam, kappa, c = self._parse_round(msg)
        g = self._stored_release(context)
        if g is None:
            raise Refused(f"{self.who} has not made its moment release in run {context.run_id}; send "
                          "query.moment_release first (nothing is computed before it)")
        upd = MomentXUpdate(normalize_rows(self.D_test[self._halves()[fit]]), g / (kappa * self.D.shape[0]), lam)
        return rnd, fit, upd.solve(c, rho), upd

    def _stored_release(self, context):
        """This run's g~ from the party's own store (what :meth:`release` committed), or None. Read
        only: the ledger itself is not touched (no charge, no new entry)."""
        ans = party_store(self.state_dir).last_answer(self._source_key(), self._ledger_run(context), "eval")
        return None if ans is None else np.asarray(ans.payload["g_tilde"], dtype=float)

    # ------------------------------------------------------------------ boundary and replies
    def _check_release_round(self, rnd) -> None:
        """= MOMENT_ROUND (one release per run)"""
        if isinstance(rnd, bool) or not isinstance(rnd, int) or rnd != MOMENT_ROUND:
            raise InvalidMessage(f"{self.who}: config['round']={rnd!r}; expected {MOMENT_ROUND} (one release per "
                                 "run)", field="config.round")

    def _parse_round(self, msg: Message):
        """round 1..MAX_MOMENT_ROUND, fit 0 or 1, rho in LIMITS and the node config's range, lam in
        LIMITS, kappa in (c_v, 2 c_v] (kappa = c_v / max(pi, 1 - pi)), and ``vectors['c']``: one
        finite value per pool row, each within +-LIMITS['c']."""
        who = self.who
        cfg = msg.content.config_records.get("config")
        rnd = None if cfg is None else cfg.get("round")
        if isinstance(rnd, bool) or not isinstance(rnd, int) or not 1 <= rnd <= MAX_MOMENT_ROUND:
            raise InvalidMessage(f"{who}: config['round']={rnd!r}; expected an integer 1..{MAX_MOMENT_ROUND}",
                                 field="config.round")
        fit = cfg.get("fit")
        if isinstance(fit, bool) or fit not in (0, 1):
            raise InvalidMessage(f"{who}: config['fit']={fit!r}; expected 0 or 1 (which half of the held-out rows "
                                 "is the pool)", field="config.fit")
        lo, hi = LIMITS["rho"]
        if self.rho_range is not None:
            lo = lo if self.rho_range[0] is None else max(lo, self.rho_range[0])
            hi = hi if self.rho_range[1] is None else min(hi, self.rho_range[1])
        rho = _scalar(cfg, "rho", lo, hi, who)
        lam = _scalar(cfg, "lam", *LIMITS["lam"], who)
        c_v = float(self.privacy.c_v)
        kappa = cfg.get("kappa")
        if isinstance(kappa, bool) or not isinstance(kappa, numbers.Real) or not (
                math.isfinite(float(kappa)) and c_v < kappa <= 2 * c_v):
            raise InvalidMessage(f"{who}: config['kappa']={kappa!r}; expected c_v / max(pi, 1 - pi), in "
                                 f"({c_v:g}, {2 * c_v:g}] for this party's clip c_v={c_v:g}", field="config.kappa")
        n_pool = int(self._halves()[int(fit)].size)
        c = self._vector(msg, "c", n_pool, "pool row", LIMITS["c"])
        return int(rnd), int(fit), rho, lam, float(kappa), c

    def _reply(self, msg, key, values, rnd, fit):
        content = RecordDict({"release": ArrayRecord({key: Array(np.asarray(values, dtype=float))}),
                              "meta": MetricRecord({"party": self.party_id, "round": int(rnd), "fit": int(fit)})})
        return Message(content, reply_to=msg)
