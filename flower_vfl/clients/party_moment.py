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
before use, in :func:`flower_vfl.privacy.boundary.parse_moment_round` (:data:`LIMITS`; rho also
against the node config's ``min-rho`` / ``max-rho``), through the one entry every party shares
(:class:`~flower_vfl.clients.base.PartyBase`). A
training message before this run's release is refused. A non-private party refuses (as
:mod:`flower_vfl.clients.party_ssp`; both build on
:class:`~flower_vfl.clients.party_one_release.OneReleasePartyClient`). Glue only: the math is in
:mod:`flower_vfl.core.moment_sharing` and :mod:`flower_vfl.privacy.label_moments`.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict

from flower_vfl.clients.party_one_release import OneReleasePartyClient
from flower_vfl.clients.party_private import party_store
from flower_vfl.core.scoring import normalize_rows
from flower_vfl.privacy.boundary import MAX_MOMENT_ROUND, MOMENT_LIMITS, Refused, parse_moment_round
from flower_vfl.privacy.ssp import cross_fit_halves

__all__ = ["MomentPartyClient", "MOMENT_RUN_SUFFIX", "MOMENT_ROUND", "LIMITS", "POOL_SEED", "MAX_MOMENT_ROUND"]

#: the ledger run of a Flower run's moment release: "<run_id>/moment"
MOMENT_RUN_SUFFIX = "/moment"
#: the round number of the one release
MOMENT_ROUND = 1
#: the fixed public permutation splitting the held-out rows into the two pool halves (no data)
POOL_SEED = 12345
#: the ranges of what the party accepts in its ADMM rounds (inclusive; rho is narrowed by the node
#: config's min-rho / max-rho): the trust boundary's (flower_vfl.privacy.boundary.MOMENT_LIMITS)
LIMITS = MOMENT_LIMITS


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
    RELEASE_ROUNDS = (MOMENT_ROUND, MOMENT_ROUND, f"{MOMENT_ROUND} (one release per run)")

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
        def answer(r):
            x, upd = self._solve(r, context)
            return self._scores_reply(msg, "s_pool", upd.scores(x), r)
        return self._handle(msg, self._parse_round, answer)

    def evaluate(self, msg: Message, context: Context) -> Message:
        """The evaluation rows' scores: the other half of the held-out rows, centred as the pool."""
        def answer(r):
            x, upd = self._solve(r, context)
            rows = normalize_rows(self.D_test[self._halves()[1 - r.fit]])  # held-out rows only, never training rows
            return self._scores_reply(msg, "s_eval", upd.scores(x, rows), r)
        return self._handle(msg, self._parse_round, answer)

    # ------------------------------------------------------------------ the x-update
    def _halves(self):
        return cross_fit_halves(self.D_test.shape[0], POOL_SEED)

    def _solve(self, r, context):
        """x for the parsed round ``r`` (:class:`~flower_vfl.privacy.boundary.MomentRound`), from this
        run's stored release (refused before it)."""
        from flower_vfl.core.moment_sharing import MomentXUpdate
        g = self._stored_release(context)
        if g is None:
            raise Refused(f"{self.who} has not made its moment release in run {context.run_id}; send "
                          "query.moment_release first (nothing is computed before it)")
        upd = MomentXUpdate(normalize_rows(self.D_test[self._halves()[r.fit]]), g / (r.kappa * self.D.shape[0]), r.lam)
        return upd.solve(r.c, r.rho), upd

    def _stored_release(self, context):
        """This run's g~ from the party's own store (what :meth:`release` committed), or None. Read
        only: the ledger itself is not touched (no charge, no new entry)."""
        ans = party_store(self.state_dir).last_answer(self._source_key(), self._ledger_run(context), "eval")
        return None if ans is None else np.asarray(ans.payload["g_tilde"], dtype=float)

    # ------------------------------------------------------------------ boundary and replies
    def _parse_round(self, content):
        """Refused when the route does not fit this party; then the round's fields, each range-checked
        by the trust boundary (:func:`~flower_vfl.privacy.boundary.parse_moment_round`: round, fit, rho
        in LIMITS and the node config's range, lam, kappa against this party's clip, ``vectors['c']``)."""
        self._refuse_if_unfit()
        halves = self._halves()
        return parse_moment_round(content, self.party_id, c_v=self.privacy.c_v,
                                  pool_sizes=(halves[0].size, halves[1].size), rho_range=self.rho_range)

    def _scores_reply(self, msg, key, values, r):
        content = RecordDict({"release": ArrayRecord({key: Array(np.asarray(values, dtype=float))}),
                              "meta": MetricRecord({"party": self.party_id, "round": r.round, "fit": r.fit})})
        return self._finish(msg, content)
