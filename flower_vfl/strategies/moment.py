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

Flower's contract as :class:`~flower_vfl.strategies.stacked_ssp.StackedSSPStrategy`; every message
goes through :mod:`flower_vfl.strategies.exchange`. Steps 1 and 2 (the identity checks, the release
request), the stop rule and the run report are the one-release routes' shared part
(:class:`~flower_vfl.strategies.one_release.OneReleaseStrategy`); the pool check and the rounds are
here. Glue only: the math is in :mod:`flower_vfl.core.moment_sharing` and :mod:`flower_vfl.core.central`.
"""

from __future__ import annotations

from logging import INFO

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from flower_vfl.core.moment_sharing import PoolExchange, default_rho, pool_driver
from flower_vfl.privacy.ssp import cross_fit_halves
from flower_vfl.strategies.exchange import PartyRefused, ReplyError, check_release, keep_report
from flower_vfl.strategies.one_release import OneReleaseStrategy
from flower_vfl.strategies.vertical_admm import DEFAULT_MAX_RELEASE

__all__ = ["MomentStrategy", "MOMENT_ROUND", "POOL_SEED"]

#: the round number of the one release (the party keeps it under its ledger run "<run>/moment")
MOMENT_ROUND = 1
#: the fixed public permutation splitting the held-out rows into the two pool halves (the party's
#: flower_vfl.clients.party_moment.POOL_SEED; tests check they agree)
POOL_SEED = 12345


class MomentStrategy(OneReleaseStrategy):
    """Label owner of the moment route over ``num_parties`` private parties.

    Parameters
    ----------
    y_train, y_test, num_parties, timeout, party_wait, party_keys, max_release, progress :
        As for :class:`~flower_vfl.strategies.stacked_ssp.StackedSSPStrategy` (``y_test``: for the
        test metrics only; no label of a pool row enters the fit).
    lam : float, default=3e-4
        The L2 coefficient of F (``lam``; 3e-4 is the in-process route's choice at epsilon = 1).
    rho : float or None, default=None
        The ADMM penalty (``rho``; None or 0: :func:`~flower_vfl.core.moment_sharing.default_rho`).
    max_rounds : int, default=50
        ADMM rounds per fit (``max-rounds``).
    tol : float, default=0
        Stop a fit when max |s^{k+1} - s^k| over the parties' pool scores and |b^{k+1} - b^k| are
        below ``tol`` (``tol``; 0 runs every round).
    """

    ROUTE, ROUTE_KEY, QUERY, RELEASE, ROUND = "moment", "moment", "moment", "moment", MOMENT_ROUND
    RELEASE_DESC = "one Gaussian release of its label moment"
    EXPOSED_ROWS = ("pool_rows", "not protected: the held-out rows are the pool; their scores reach the label owner "
                                 "every round")

    def __init__(self, y_train, y_test=None, num_parties=2, lam=3e-4, rho=None, max_rounds=50, tol=0.0,
                 timeout=600.0, party_wait=120.0, party_keys=None, max_release=DEFAULT_MAX_RELEASE, progress=None):
        from flower_vfl.config.schema import check_params      # the one parameter table (schema.PARAMS)
        check_params("MomentStrategy", dict(num_parties=num_parties, rho=rho, max_rounds=max_rounds, tol=tol,
                                            timeout=timeout, party_wait=party_wait, max_release=max_release))
        self._init_labels(y_train, y_test, num_parties, timeout, party_wait, party_keys, max_release, progress)
        self.lam = float(lam)
        if not (np.isfinite(self.lam) and self.lam > 0):
            raise ValueError(f"lam={lam!r}: the moment route needs lam > 0 (the pool objective must be bounded)")
        self.rho = None if not rho else float(rho)
        self.max_rounds, self.tol = int(max_rounds), float(tol)
        self.intercepts_: list[float] = []
        self.rounds_: list[int] = []
        self.targets_: list[dict[int, np.ndarray]] = []       # per fit: party -> the last c_m sent
        self.rho_: list[float] = []

    def summary(self) -> None:
        log(INFO, "\t└── MomentStrategy: %d private parties, one moment release each, N=%d, lam=%g",
            self.num_parties, self.n_train, self.lam)

    # ------------------------------------------------------------------ identify
    def _check_identity(self, party, nid, info) -> None:
        if info.get("pool") is not True:
            raise PartyRefused(f"party {party} (node {nid}) does not let its held-out rows serve as the unlabelled "
                               "pool (its node config's moment-pool is not 'test'); only its operator can allow it")

    # ------------------------------------------------------------------ the release
    def release(self) -> None:
        """Each party's one release; its reply holds an acknowledgement and its privacy report."""
        got = self.exchange.send(self._release_content, "query.moment_release", range(self.num_parties),
                                 "moment release")
        for m, rep in got.items():
            keep_report(rep, m, self.privacy_, "the moment release")
            if "meta" not in rep.content.metric_records:
                raise ReplyError(f"party {m}: the moment release reply has no 'meta' record")

    # ------------------------------------------------------------------ the fits
    def _send(self, fit, rnd, rho_x, targets, kind):
        key = "s_pool" if kind == "train" else "s_eval"

        def build(p, nid):
            return RecordDict({"vectors": ArrayRecord({"c": Array(targets[p])}),
                               "config": ConfigRecord({"round": int(rnd), "fit": int(fit), "rho": float(rho_x),
                                                       "lam": self.lam, "kappa": float(self.kappa_[p])})})
        got = self.exchange.send(build, f"{kind}.moment", range(self.num_parties), f"moment {kind} (fit {fit})")
        n = self.halves_[fit if kind == "train" else 1 - fit].size
        out = []
        for m in range(self.num_parties):
            keep_report(got[m], m, self.privacy_, f"moment {kind}")
            out.append(check_release(got[m], m, key, (n,), f"moment {kind}", bound=self.max_release))
        return out

    def fit_half(self, fit) -> np.ndarray:
        """ADMM sharing on pool half ``fit`` (the one round driver); returns the other half's
        decision values."""
        n = self.halves_[fit].size
        rho = self.rho or default_rho(n)
        driver = pool_driver(n, self.pi, rho, self.num_parties, self.max_rounds, self.tol)
        pool = _FlowerPool(self, fit, driver.central)

        def on_round(k, row, phase, j, stopped):
            row = {"round": len(self.history_) + 1, "fit": fit, "fit_round": k,
                   **{key: val for key, val in row.items() if key != "round"}}
            self.history_.append(row)
            if self.progress is not None:
                self.progress(row["round"], row)

        k = driver.run(pool, on_round=on_round)
        self.rounds_.append(k)
        self.rho_.append(rho)
        self.targets_.append(pool.targets)
        self.intercepts_.append(float(driver.central.b))
        s_eval = self._send(fit, k, pool.rho_x, pool.targets, "evaluate")
        return sum(s_eval) + float(driver.central.b)

    def fit(self, grid) -> np.ndarray:
        """Identify, one release per party, the two cross-fitted fits: the held-out decisions."""
        self.identify(grid)
        n_test = self.identity_[0]["n_test"]
        self.halves_ = cross_fit_halves(n_test, POOL_SEED)
        self.release()
        f = np.empty(n_test)
        for fit in (0, 1):
            f[self.halves_[1 - fit]] = self.fit_half(fit)
        self.decision_test_ = f
        self.metrics_ = {}
        if self.t_test is not None:
            self.metrics_ = {"test_loss": float(self.loss.mean(f, self.t_test)),
                             "test_accuracy": float(np.mean(self.loss.predict(f) == self.loss.predict(self.t_test)))}
        return f

    # ------------------------------------------------------------ Flower's 4 hooks
    def configure_train(self, server_round, arrays, config, grid):
        """Not used: :meth:`start` drives the rounds (each party's target is its own message)."""
        return []

    def aggregate_train(self, server_round, replies):
        return None, MetricRecord({})

    def configure_evaluate(self, server_round, arrays, config, grid):
        return []

    def aggregate_evaluate(self, server_round, replies):
        return MetricRecord(dict(getattr(self, "metrics_", {})))

    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = 1,
              timeout: float | None = None, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None, evaluate_fn=None) -> Result:
        """Run the route (``num_rounds`` is accepted for Flower's contract; the rounds per fit are
        ``max_rounds``). A refusal, a lost or failed party or an invalid reply stops the run and is
        raised again: the run fails."""
        t0 = self._start(grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config, evaluate_fn)
        if self.history_:
            self.history_[-1].update(self.metrics_)
        self._finish(t0)
        res = Result(arrays=ArrayRecord({"intercepts": Array(np.array(self.intercepts_, dtype=float))}))
        if self.metrics_:
            res.evaluate_metrics_clientapp[len(self.history_)] = MetricRecord(dict(self.metrics_))
        return res

    def _rounds_report(self) -> dict:
        return {"rounds": len(self.history_), "rounds_per_fit": list(self.rounds_)}


class _FlowerPool(PoolExchange):
    """A fit's rounds through the exchange: party m's target as ``train.moment``, its pool scores back."""

    def __init__(self, strategy: MomentStrategy, fit: int, central):
        super().__init__(central)
        self.strategy, self.fit = strategy, fit

    def release(self, k, targets):
        return dict(enumerate(self.strategy._send(self.fit, k, self.rho_x, targets, "train")))
