"""The label owner of the moment route as a Flower strategy (issue 21 item 3).

Both private near the non-private model, through Flower (docs/privacy_parties.md, "the moment route"):

1. identify (``query.moment_identify``): which node serves which party, its row counts, whether
   it is private (every party must be), its target clip c_v, whether its budget covers one
   release and whether its node config lets its held-out rows serve as the pool;
2. one release (``query.moment_release``): party m gets v_m = kappa_m (t - pi),
   kappa_m = c_v,m / max(pi, 1 - pi), and releases g~_m = D_m^T v_m + noise, kept in its own store
   (:class:`~flower_vfl.clients.party_moment.MomentPartyClient`); the reply is an acknowledgement
   and its privacy report, never g~;
3. two fits of the pool objective F by ADMM sharing (``train.moment``), cross-fitted: fit k pools
   on half k of the held-out rows (a fixed public permutation), the central node's loss logistic
   with the soft label pi on every pool row (:class:`~flower_vfl.core.central.CentralUpdate` with
   :class:`~flower_vfl.core.losses.SoftLabelLogisticLoss`, the intercept here), each party's
   x-update with its moment as a linear term (:mod:`flower_vfl.core.moment_sharing`); the rounds
   are the one round driver's (:class:`~flower_vfl.core.rounds.RoundDriver` from
   :func:`~flower_vfl.core.moment_sharing.pool_driver`: Anderson acceleration, the rounds being
   deterministic once g~ is drawn, and the stopping rule 'change'), the same as the in-process
   :func:`~flower_vfl.core.moment_sharing.moment_sharing_admm`. Each round a party gets its
   completed-square target c_m and replies with its pool scores only;
4. evaluation (``evaluate.moment``): each half of the held-out rows is scored by the model fitted
   on the other half; with ``y_test`` the test metrics.

Flower's contract, written once in :class:`~flower_vfl.strategies.base.CentralBase`; every message
goes through :mod:`flower_vfl.strategies.exchange`. Steps 1 and 2 (the identity checks, the release
request), the stop rule and the run report are the one-release routes' shared part
(:class:`~flower_vfl.strategies.one_release.OneReleaseStrategy`); the pool check and the rounds are
here. Glue only: the math is in :mod:`flower_vfl.core.moment_sharing` and :mod:`flower_vfl.core.central`.
"""

from __future__ import annotations

import dataclasses
from logging import INFO

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.common.logger import log

from flower_vfl.core.moment_sharing import PoolExchange, default_rho, pool_driver
from flower_vfl.privacy.ssp import cross_fit_halves
from flower_vfl.strategies.config import MomentConfig
from flower_vfl.strategies.exchange import PartyRefused, ReplyError, check_release, keep_report
from flower_vfl.strategies.one_release import OneReleaseState, OneReleaseStrategy

__all__ = ["MomentStrategy", "MomentState", "MOMENT_ROUND", "POOL_SEED"]

#: the round number of the one release (the party keeps it under its ledger run "<run>/moment")
MOMENT_ROUND = 1
#: the fixed public permutation splitting the held-out rows into the two pool halves (the party's
#: flower_vfl.clients.party_moment.POOL_SEED; tests check they agree)
POOL_SEED = 12345


@dataclasses.dataclass
class MomentState(OneReleaseState):
    """A moment run: the two pool halves and, per fit, its intercept, rounds, last targets and rho."""

    halves: tuple | None = None
    intercepts: list = dataclasses.field(default_factory=list)
    rounds: list = dataclasses.field(default_factory=list)
    #: per fit: party -> the last c_m sent
    targets: list = dataclasses.field(default_factory=list)
    rho: list = dataclasses.field(default_factory=list)


class MomentStrategy(OneReleaseStrategy):
    """Label owner of the moment route over ``num_parties`` private parties.

    Parameters
    ----------
    y_train, y_test : arrays
        As for :class:`~flower_vfl.strategies.stacked_ssp.StackedSSPStrategy` (``y_test``: for the
        test metrics only; no label of a pool row enters the fit).
    config : MomentConfig, optional
        The settings (:class:`~flower_vfl.strategies.config.MomentConfig`: ``num_parties``, ``lam``,
        ``rho``, ``max_rounds``, ``tol``, ``timeout``, ``party_wait``, ``party_keys``,
        ``max_release``), checked by the parameter table when made.
    progress : callable, optional
        ``progress(k, row)`` after each round.
    **settings :
        The same settings by name (as before the config object), over ``config``; a name that is
        not a field of MomentConfig is refused naming the closest one.

    After :meth:`start`: ``state_`` (:class:`MomentState`) and its read-outs ``history_``, ``final_``,
    ``privacy_``, ``decision_test_``, ``metrics_``, ``halves_``, ``intercepts_``, ``rounds_``,
    ``targets_``, ``rho_``.
    """

    State = MomentState
    ROUTE, ROUTE_KEY, QUERY, RELEASE, ROUND = "moment", "moment", "moment", "moment", MOMENT_ROUND
    RELEASE_DESC = "one Gaussian release of its label moment"
    EXPOSED_ROWS = ("pool_rows", "not protected: the held-out rows are the pool; their scores reach the label owner "
                                 "every round")

    def __init__(self, y_train, y_test=None, config: MomentConfig | None = None, *, progress=None, **settings):
        # every setting checked by the parameter table (config/schema.py, PARAMS) before any work;
        # the former keyword arguments (num_parties=..., lam=...) still build the config
        self.config = cfg = MomentConfig.build(config, **settings)
        self._init_labels(y_train, y_test, cfg.num_parties, cfg.timeout, cfg.party_wait, cfg.party_keys,
                          cfg.max_release, progress)
        self.lam = cfg.lam
        self.rho = None if cfg.rho in (None, "auto", 0) else float(cfg.rho)
        self.max_rounds, self.tol = int(cfg.max_rounds), float(cfg.tol)
        super().__init__()

    def summary(self) -> None:
        log(INFO, "\t└── MomentStrategy: %d private parties, one moment release each, N=%d, lam=%g",
            self.num_parties, self.n_train, self.lam)

    # ------------------------------------------------------------------ identify
    def _check_identity(self, party, nid, info) -> None:
        if info.get("pool") is not True:
            raise PartyRefused(f"party {party} (node {nid}) does not let its held-out rows serve as the unlabelled "
                               "pool (its node config's moment-pool is not 'test'); only its operator can allow it")

    # ------------------------------------------------------------------ the release
    def release(self, state: MomentState) -> MomentState:
        """Each party's one release; its reply holds an acknowledgement and its privacy report."""
        got = state.exchange.send(lambda p, nid: self.release_content(state, p), "query.moment_release",
                                  range(self.num_parties), "moment release")
        for m, rep in got.items():
            keep_report(rep, m, state.privacy, "the moment release")
            if "meta" not in rep.content.metric_records:
                raise ReplyError(f"party {m}: the moment release reply has no 'meta' record")
        return state

    # ------------------------------------------------------------------ the fits
    def send(self, state: MomentState, fit, rnd, rho_x, targets, kind) -> list:
        """Party m's target c_m as ``<kind>.moment``; the parties' pool (train) or held-out (evaluate) scores."""
        key = "s_pool" if kind == "train" else "s_eval"

        def build(p, nid):
            return RecordDict({"vectors": ArrayRecord({"c": Array(targets[p])}),
                               "config": ConfigRecord({"round": int(rnd), "fit": int(fit), "rho": float(rho_x),
                                                       "lam": self.lam, "kappa": float(state.kappa[p])})})
        got = state.exchange.send(build, f"{kind}.moment", range(self.num_parties), f"moment {kind} (fit {fit})")
        n = state.halves[fit if kind == "train" else 1 - fit].size
        out = []
        for m in range(self.num_parties):
            keep_report(got[m], m, state.privacy, f"moment {kind}")
            out.append(check_release(got[m], m, key, (n,), f"moment {kind}", bound=self.max_release))
        return out

    def fit_half(self, state: MomentState, fit) -> tuple[MomentState, np.ndarray]:
        """ADMM sharing on pool half ``fit`` (the one round driver); the other half's decision values."""
        n = state.halves[fit].size
        rho = self.rho or default_rho(n)
        driver = pool_driver(n, self.pi, rho, self.num_parties, self.max_rounds, self.tol)
        pool = _FlowerPool(self, state, fit, driver.central)

        def on_round(k, row, phase, j, stopped):
            row = {"round": len(state.history) + 1, "fit": fit, "fit_round": k,
                   **{key: val for key, val in row.items() if key != "round"}}
            state.history.append(row)
            self.progress_row(row["round"], row)

        k = driver.run(pool, on_round=on_round)
        state.rounds.append(k)
        state.rho.append(rho)
        state.targets.append(pool.targets)
        state.intercepts.append(float(driver.central.b))
        s_eval = self.send(state, fit, k, pool.rho_x, pool.targets, "evaluate")
        return state, sum(s_eval) + float(driver.central.b)

    def run(self, grid, state: MomentState) -> MomentState:
        """One release per party, the two cross-fitted fits: the held-out decisions. A refusal, a
        lost or failed party or an invalid reply stops the run and is raised again: the run fails."""
        n_test = state.identity[0]["n_test"]
        state.halves = cross_fit_halves(n_test, POOL_SEED)
        state = self.release(state)
        f = np.empty(n_test)
        for fit in (0, 1):
            state, f[state.halves[1 - fit]] = self.fit_half(state, fit)
        state.decision_test = f
        state.metrics = {}
        if self.t_test is not None:
            state.metrics = {"test_loss": float(self.loss.mean(f, self.t_test)),
                             "test_accuracy": float(np.mean(self.loss.predict(f) == self.loss.predict(self.t_test)))}
        if state.history:
            state.history[-1].update(state.metrics)
        return state

    # ------------------------------------------------------------ Flower's 4 hooks
    def configure_train(self, server_round, arrays, config, grid):
        """Not used: :meth:`run` drives the rounds (each party's target is its own message)."""
        return []

    def aggregate_train(self, server_round, replies):
        return None, MetricRecord({})

    def configure_evaluate(self, server_round, arrays, config, grid):
        return []

    def aggregate_evaluate(self, server_round, replies):
        return MetricRecord(dict(self.state_.metrics))

    # ------------------------------------------------------------ the outcome
    def report(self, state: MomentState) -> dict:
        return {**super().report(state), "rounds_per_fit": list(state.rounds)}

    def model(self, state: MomentState) -> dict:
        """The two fits' intercepts (each x_m stays on its party)."""
        return {"intercepts": np.array(state.intercepts, dtype=float)}

    def round_metrics(self, state: MomentState) -> tuple[dict, dict]:
        return {}, ({len(state.history): dict(state.metrics)} if state.metrics else {})


class _FlowerPool(PoolExchange):
    """A fit's rounds through the exchange: party m's target as ``train.moment``, its pool scores back."""

    def __init__(self, strategy: MomentStrategy, state: MomentState, fit: int, central):
        super().__init__(central)
        self.strategy, self.state, self.fit = strategy, state, fit

    def release(self, k, targets):
        return dict(enumerate(self.strategy.send(self.state, self.fit, k, self.rho_x, targets, "train")))
